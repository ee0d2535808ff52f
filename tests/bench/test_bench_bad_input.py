"""Bad input to the client: each gives a clear message, not a traceback; server errors
mid-run are counted; an interrupted run still writes its partial result, whenever the
Ctrl-C comes (start-up included: then with nothing sent)."""

from __future__ import annotations

import _thread
import importlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_server import run_fake
from server_harness import free_port

from stepserve.bench.prompt_maker import PromptMaker
from stepserve.cli import main

SMALL = ["--random-input-len", "4", "--random-output-len", "3", "--no-progress"]


def test_unreachable_target(capsys, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["bench", "--target", url, *SMALL, "--num-prompts", "2",
                 "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot reach target {url}" in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_server_errors_are_counted(tmp_path, capsys):
    out = tmp_path / "r.json"
    with run_fake(fail_every=3) as fake:
        rc = main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "9",
                   "--max-concurrency", "3", "--json", str(out), "--csv",
                   str(tmp_path / "r.csv")])
    assert rc == 0
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert s["requests_total"] == 9 and s["requests_finished"] == 6
    assert s["requests_failed"] == 3 and s["errors"] == {"http_500": 3}
    assert s["scrape_samples"] == 0 and s["metrics_source"] is None  # no /metrics there
    assert "errors                     http_500 3" in capsys.readouterr().out
    assert "HTTP 500: boom" in (tmp_path / "r.csv").read_text()


def test_stream_errors_mid_response_are_counted(tmp_path):
    out = tmp_path / "r.json"
    with run_fake(stream_error_every=2) as fake:
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "6",
                     "--max-concurrency", "1", "--json", str(out)]) == 0
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert s["requests_finished"] == 3 and s["errors"] == {"stream_error": 3}
    assert s["error_examples"]["stream_error"] == "stream error: engine died"
    assert s["output_tokens"] == 9  # only completed requests count


def test_malformed_workload_file(tmp_path, capsys):
    bad = tmp_path / "w.yaml"
    bad.write_text("arrival: {poisson: {rate: 1}}\nnum_requests: 3\nclasses: [{name: a}]\n")
    assert main(["bench", "--sim", "--workload", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "error: workload file" in err and "classes[0]" in err and "Traceback" not in err
    bad.write_text("arrival: [unclosed\n")
    assert main(["bench", "--sim", "--workload", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


@pytest.mark.parametrize("slo, says", [("ttft:abc", "'ttft:abc': 'abc' is not a number"),
                                       ("p99:5", "unknown key 'p99' (keys: ttft, tpot, e2el)")])
def test_bad_slo(slo, says, capsys):
    assert main(["bench", "--sim", *SMALL, "--num-prompts", "2", "--goodput", slo]) == 2
    assert says in capsys.readouterr().err


def test_conflicting_workloads_and_bad_arrivals(capsys):
    assert main(["bench", "--sim", *SMALL, "--scenario", "quickstart"]) == 2
    assert "give one workload" in capsys.readouterr().err
    assert main(["bench", "--sim", *SMALL, "--dataset-name", "sonnet"]) == 2
    assert "--dataset-name 'sonnet': this bench reads random, sharegpt" in \
        capsys.readouterr().err
    assert main(["bench", "--sim", *SMALL, "--request-rate", "0"]) == 2
    assert "--request-rate = 0: must be a finite number in" in capsys.readouterr().err
    assert main(["bench", "--sim", *SMALL, "--max-concurrency", "2",
                 "--request-rate", "3"]) == 2  # a gated open loop: not on the simulator
    assert "needs --target or --engine" in capsys.readouterr().err


@pytest.fixture
def ctrl_c() -> Iterator[Callable[[], None]]:
    """Ctrl-C as a terminal sends it: SIGINT raises KeyboardInterrupt in the main thread,
    also where this process inherited SIGINT ignored (a shell's background job: there
    `_thread.interrupt_main` does nothing and the run goes on to its end)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield _thread.interrupt_main
    finally:
        signal.signal(signal.SIGINT, previous)


def _partial(path: Path) -> dict:
    summary = json.loads(path.read_text())["runs"][0]["summary"]
    assert summary["interrupted"] is True
    return summary


def test_interrupt_mid_run_writes_partial_result(tmp_path, capsys, ctrl_c):
    out, table = tmp_path / "p.json", tmp_path / "p.csv"

    def after_second(n: int) -> None:
        if n == 2:
            ctrl_c()

    with run_fake(delay_s=0.02, on_answered=after_second) as fake:
        rc = main(["bench", "--target", fake.url, "--random-input-len", "4",
                   "--random-output-len", "40", "--no-progress", "--num-prompts", "30",
                   "--max-concurrency", "2", "--json", str(out), "--csv", str(table)])
    assert rc == 130
    assert "interrupted" in capsys.readouterr().err
    s = _partial(out)
    assert 2 <= s["requests_total"] < 30 and s["requests_not_sent"] == 30 - s["requests_total"]
    cut = s["errors"].get("interrupted", 0)  # those in flight (at most 2) were cut off
    assert cut <= 2 and s["requests_finished"] + cut == s["requests_total"]
    assert len(table.read_text().splitlines()) == 31


def test_interrupt_at_model_discovery_writes_a_result_with_nothing_sent(tmp_path, ctrl_c):
    out = tmp_path / "p.json"
    with run_fake(on_models=ctrl_c) as fake:
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "5",
                     "--json", str(out)]) == 130
    s = _partial(out)
    assert s["requests_total"] == 0 and s["requests_not_sent"] == 5 and s["errors"] == {}


@pytest.mark.parametrize("where, target", [
    ("stepserve.bench.job._progress", "--target"),  # its first use imports tqdm
    ("stepserve.engine.llm_engine.LLMEngine", "--engine"),  # loads the model
    ("stepserve.bench.inprocess.run_sim", "--sim"),
])
def test_interrupt_outside_the_event_loop_writes_a_result_with_nothing_sent(
        where, target, monkeypatch, fake, tmp_path, ctrl_c):
    module, name = where.rsplit(".", 1)
    real = getattr(importlib.import_module(module), name)

    def interrupted(*args, **kwargs):
        ctrl_c()
        return real(*args, **kwargs)

    monkeypatch.setattr(where, interrupted)
    out = tmp_path / "p.json"
    where_to = [target, fake.url] if target == "--target" else [target]
    assert main(["bench", *where_to, *SMALL, "--num-prompts", "3", "--json", str(out)]) == 130
    s = _partial(out)
    assert s["requests_total"] == 0 and s["requests_finished"] == 0


def test_interrupt_during_blocking_start_up_work_is_not_held_back(monkeypatch, fake,
                                                                  tmp_path, ctrl_c):
    """The prompts' tokenizer is looked up on the event loop's thread once the model is
    known (its first load imports torch: seconds); asyncio.run's own Ctrl-C handling
    would wait for that to end."""
    finished = []

    def slow_lookup(self: PromptMaker, model: str) -> None:
        ctrl_c()
        deadline = time.monotonic() + 20  # only the old handling lets it run this long
        while time.monotonic() < deadline:
            pass
        finished.append(model)

    monkeypatch.setattr(PromptMaker, "fit_to_model", slow_lookup)
    out = tmp_path / "p.json"
    assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "3",
                 "--json", str(out)]) == 130
    assert not finished and _partial(out)["requests_total"] == 0


def test_open_loop_shapes_on_fake_server(tmp_path):
    out = tmp_path / "a.json"
    with run_fake(delay_s=0.02) as fake:
        # no stream is answered before the eighth request arrived: "all at once" holds
        # however slowly a busy machine sends them
        fake.settings["hold_until"] = lambda: len(fake.settings["seen"]) >= 8
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "8",
                     "--request-rate", "inf", "--json", str(out)]) == 0
        s = json.loads(out.read_text())["runs"][0]["summary"]
        assert s["requests_finished"] == 8 and s["peak_concurrency"] == 8  # all at once
        del fake.settings["hold_until"]
        assert main(["bench", "--target", fake.url, *SMALL, "--num-prompts", "400",
                     "--request-rate", "20", "--burstiness", "0.5", "--duration-s", "0.5",
                     "--json", str(out)]) == 0
        s = json.loads(out.read_text())["runs"][0]["summary"]
        assert 0 < s["requests_total"] < 100 and s["requests_not_sent"] > 300
