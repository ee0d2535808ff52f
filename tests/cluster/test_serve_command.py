"""`stepserve serve --replicas 2` as a user runs it: its own local Ray, the ingress on
127.0.0.1; SIGTERM drains: the in-flight request finishes, the replicas are deleted, Ray
stops and the process exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")

sys.path.insert(0, str(Path(__file__).parent))

from ray_harness import MODEL, free_port  # noqa: E402

pytestmark = pytest.mark.slow


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.communicate()[0])
        time.sleep(0.5)


def test_sigterm_drains_the_replicas_and_exits_0():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepserve", "serve", "--model", MODEL, "--replicas", "2",
         "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
         "--num-gpu-blocks", "512", "--shutdown-timeout", "60", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_up(url, proc)
        events: list[str] = []
        started = threading.Event()

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/completions", timeout=120, json={
                    "model": MODEL, "prompt": "drain me", "max_tokens": 600,
                    "ignore_eos": True, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()

        client = threading.Thread(target=stream)
        client.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        client.join(120)
        output = proc.communicate(timeout=180)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert "error" not in last and last["choices"][0]["finish_reason"] == "length", last
    assert "2 replicas on Ray Serve" in output and "server stopped" in output, output
    assert "1 in-flight requests finished, 0 aborted" in output, output
