"""`stepserve serve` end to end: a subprocess on 127.0.0.1, flags in vLLM's names,
a request through the openai client, then SIGINT and a graceful exit."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import pytest
from server_harness import free_port, wait_until_up

from stepserve.cli.serve import add_serve_parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepserve")
    add_serve_parser(parser.add_subparsers(dest="command"))
    return parser


def test_serve_flags_parse_into_the_config():
    from stepserve.cli.engine_flags import config_overrides

    args = _parser().parse_args(["serve", "--model", "tiny", "--max-num-seqs", "40",
                                 "--max-waiting", "24", "--port", "9001",
                                 "--no-enable-chunked-prefill", "--max-model-len", "512",
                                 "--max-num-batched-tokens", "1024"])
    config = config_overrides(args).apply()
    assert (config.scheduler.max_num_seqs, config.queue.max_waiting, args.port) == (40, 24, 9001)
    assert config.scheduler.enable_chunked_prefill is False


@pytest.mark.slow
def test_serve_subprocess(tmp_path):
    import openai

    cfg = tmp_path / "pool.yaml"
    cfg.write_text("scheduler: {max_num_seqs: 8, max_model_len: 256}\n"
                   "queue: {max_waiting: 16}\ncache: {num_gpu_blocks: 256}\n")
    port = free_port()
    code = ("import sys; from stepserve.cli.serve import add_serve_parser; "
            "import argparse; p = argparse.ArgumentParser(); "
            "add_serve_parser(p.add_subparsers()); a = p.parse_args(sys.argv[1:]); "
            "sys.exit(a.func(a))")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--model", "tiny", "--config", str(cfg),
         "--max-num-seqs", "4", "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(url, timeout_s=120, alive=lambda: proc.poll() is None, poll_s=0.2)
        except RuntimeError:
            proc.kill()
            raise AssertionError(proc.communicate()[0]) from None
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        r = client.completions.create(model="tiny", prompt="Hello", max_tokens=5,
                                      extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5
        assert client.models.list().data[0].model_extra["max_model_len"] == 256
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "graceful shutdown: 0 in-flight requests finished, 0 aborted" in out


@pytest.mark.parametrize("flags, message", [
    (["--shutdown-timeout", "nan"], "--shutdown-timeout = nan: must be a finite number"),
    (["--shutdown-timeout", "-5"], "--shutdown-timeout = -5: must be a finite number"),
    (["--shutdown-timeout", "inf"], "--shutdown-timeout = inf: must be a finite number"),
    (["--retry-after", "-1"], "--retry-after = -1: must be an integer in [0, "),
    (["--max-header-bytes", "100"], "--max-header-bytes = 100: must be an integer in "
                                    "[1024, 16777216]"),
    (["--header-timeout", "nan"], "--header-timeout = nan: must be a finite number"),
    (["--body-timeout", "0"], "--body-timeout = 0: must be a finite number in [0.001, "),
    (["--timeout-keep-alive", "-1"], "--timeout-keep-alive = -1: must be a finite number"),
    (["--max-connections", "0"], "--max-connections = 0: must be an integer in [1, "),
    (["--max-connections", "100000", "--replicas", "2"],
     "--max-connections = 100000: this process may open"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_server_setting_is_one_error_line_before_any_work(flags, message, capsys,
                                                                 monkeypatch):
    """Checked before the model loads (or Ray starts), on either path; with a fitted
    open-file limit so the cap's check does not depend on this machine's."""
    from stepserve.cli import main
    from stepserve.server import connection_limits

    monkeypatch.setattr(connection_limits, "open_file_limit", lambda: 20_000)
    assert main(["serve", "--model", "tiny", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert message in err, err


def test_server_settings_reach_the_server(monkeypatch):
    from stepserve.cli import main, serve
    from stepserve.server import connection_limits

    seen = []
    monkeypatch.setattr(serve, "run_serve", lambda options: seen.append(options) or 0)
    monkeypatch.setattr(connection_limits, "open_file_limit", lambda: 20_000)
    assert main(["serve", "--model", "tiny", "--shutdown-timeout", "0",
                 "--max-header-bytes", "8192", "--header-timeout", "2.5",
                 "--body-timeout", "7", "--timeout-keep-alive", "0",
                 "--max-connections", "300"]) == 0
    o = seen[0]
    assert o.shutdown_timeout_s == 0.0
    assert o.limits == connection_limits.ConnectionLimits(
        max_header_bytes=8192, header_timeout_s=2.5, body_timeout_s=7.0,
        keep_alive_timeout_s=0.0, max_connections=300)
    seen.clear()
    assert main(["serve", "--model", "tiny"]) == 0
    assert seen[0].limits.max_connections == connection_limits.DEFAULT_MAX_CONNECTIONS


def test_the_default_cap_fits_under_the_open_file_limit(monkeypatch, caplog):
    from stepserve.config.errors import UsageError
    from stepserve.server import connection_limits as cl

    monkeypatch.setattr(cl, "open_file_limit", lambda: 1024)
    assert cl.fit_to_descriptors(cl.ConnectionLimits()).max_connections == 1024 - cl.FD_RESERVE
    assert "at most 768 connections" in caplog.text
    assert cl.fit_to_descriptors(cl.ConnectionLimits(max_connections=700)).max_connections \
        == 700
    with pytest.raises(UsageError, match=r"may open 1024 files .* at most 768 connections"):
        cl.fit_to_descriptors(cl.ConnectionLimits(max_connections=1000))


def test_the_open_file_limit_is_raised_to_its_hard_value():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(512, hard)
    code = ("import resource; from stepserve.server.connection_limits import "
            "open_file_limit; print(open_file_limit(), "
            "resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))).stdout
    expected = "inf" if hard == resource.RLIM_INFINITY else str(hard)
    assert out.split() == [expected, str(hard)]
