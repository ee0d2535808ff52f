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
    from stepserve.cli.engine_flags import config_from_args

    args = _parser().parse_args(["serve", "--model", "tiny", "--max-num-seqs", "40",
                                 "--max-waiting", "24", "--port", "9001",
                                 "--no-enable-chunked-prefill", "--max-model-len", "512",
                                 "--max-num-batched-tokens", "1024"])
    config = config_from_args(args)
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
