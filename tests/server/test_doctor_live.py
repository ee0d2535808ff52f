"""`stepserve doctor --url` against our own server on 127.0.0.1 (tiny model, two batch
slots): an idle server gives no finding, a loaded one shows its queue and the rule that
explains it, and an unreachable one a clear error."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from server_harness import MODEL, Served, free_port, make_engine, serve

from stepserve.cli import main

N_CLIENTS = 8  # four times the batch slots: most of them always wait


@pytest.fixture(scope="module")
def two_slots() -> Iterator[Served]:
    with serve(make_engine(max_num_seqs=2)) as s:
        yield s


def doctor(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["doctor", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _client(url: str, stop: threading.Event, errors: list[str]) -> None:
    body = {"model": MODEL, "prompt": "the queue grows", "max_tokens": 24, "stream": True,
            "temperature": 0.0, "ignore_eos": True}
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                with client.stream("POST", url + "/v1/completions", json=body) as resp:
                    for _ in resp.iter_lines():
                        pass
            except httpx.HTTPError as e:
                errors.append(repr(e))
                return


@contextmanager
def closed_loop(served: Served) -> Iterator[list[str]]:
    """N_CLIENTS streaming clients, each sending its next request when one ends."""
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=_client, args=(served.url, stop, errors), daemon=True)
               for _ in range(N_CLIENTS)]
    for t in threads:
        t.start()
    try:
        yield errors
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def test_idle_server_no_finding(two_slots, capsys):
    two_slots.wait_idle()
    code, out, err = doctor(capsys, "--url", two_slots.url, "--window-s", "0.5",
                            "--interval-s", "0.25")
    assert code == 0, err
    assert f"run {two_slots.url} (continuous): no rule fires" in out
    assert "of stepserve metrics; 0 requests finished" in out
    assert "no request finished in the window" in out
    assert "not evaluable for lack of data: capacity" in out


def test_loaded_server_queue_and_its_finding(two_slots, capsys):
    with closed_loop(two_slots) as errors:
        deadline = time.monotonic() + 30
        while two_slots.metric("stepserve:num_requests_waiting") == 0:
            assert time.monotonic() < deadline, "no queue formed"
            time.sleep(0.05)
        code, out, err = doctor(capsys, "--url", two_slots.url, "--window-s", "2",
                                "--interval-s", "0.25", "--json")
    assert code == 0, err
    assert not errors
    data = json.loads(out)
    s = data["summary"]
    assert s["metrics_source"] == "stepserve" and s["scrape_samples"] == 9
    assert data["config"]["max_num_seqs"] == 2 and data["config"]["batching"] == "continuous"
    assert s["waiting_max"] > 0 and 0 < s["running_max"] <= 2
    assert s["steps"] > 0 and s["mean_step_s"] > 0 and s["slot_utilization"] is not None
    # Eight clients on two slots: requests queue for the whole window while running sits
    # at max_num_seqs, which is what running_below_offered says (and why).
    found = {f["rule"]: f for f in data["findings"]}
    assert "running_below_offered" in found, data
    assert "max_num_seqs 2" in found["running_below_offered"]["evidence"]


def test_unreachable_port_exits_2(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = doctor(capsys, "--url", url, "--window-s", "0.2", "--interval-s", "0.1")
    assert code == 2 and out == ""
    assert err.startswith(f"error: cannot reach {url}/metrics")
    assert "expected a running server" in err
