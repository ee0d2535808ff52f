"""Helpers for the server tests: a real uvicorn server on 127.0.0.1 in a thread, over
the tiny model, the official openai client pointed at it, and /metrics parsing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from stepserve.config.settings import EngineConfig
from stepserve.server.http_server import StepServeServer, make_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "tiny"
# Small KV pool: startup in seconds, and "every block free" is cheap to check.
BASE_SETTINGS = dict(num_gpu_blocks=512, max_model_len=256, max_num_seqs=64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, path: str = "/health", timeout_s: float = 60.0,
                  alive=lambda: True, poll_s: float = 0.05) -> None:
    """Poll url + path until it answers 200; fail if `alive()` turns false or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"{url} did not come up")
        time.sleep(poll_s)


class MetricsReader:
    """/metrics of a server at `self.url`."""

    url: str

    def metrics(self) -> dict[str, float]:
        """/metrics as {name: value}, summed over label sets."""
        out: dict[str, float] = {}
        for (name, _labels), value in self.samples().items():
            out[name] = out.get(name, 0.0) + value
        return out

    def samples(self) -> dict[tuple[str, frozenset], float]:
        """/metrics as {(name, frozenset of (label, value)): value}."""
        text = httpx.get(self.url + "/metrics").text
        out: dict[tuple[str, frozenset], float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            name, _, rest = key.partition("{")
            labels = frozenset(tuple(part.split("=", 1)) for part in
                               rest.rstrip("}").replace('"', "").split(",") if part)
            out[(name, labels)] = float(value)
        return out

    def metric(self, name: str, **labels: str) -> float:
        """The sum of `name` over the series that carry these labels."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples().items() if n == name and want <= ls)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until the engine holds no request and /metrics shows no KV block in use."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.metrics()
            if (m["stepserve:num_gpu_blocks_used"] == 0 and m["stepserve:num_requests_running"]
                    == 0 and m["stepserve:num_requests_waiting"] == 0):
                return
            time.sleep(0.05)
        raise AssertionError(f"server not idle after {timeout} s: {self.metrics()}")



@dataclass
class Served(MetricsReader):
    url: str
    app: object
    server: StepServeServer
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def engine(self):
        return self.app.state.async_engine.engine

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key="none", max_retries=0, **kwargs)

    def async_client(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key="none", max_retries=0,
                                  **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@contextmanager
def serve(engine=None, *, model_name: str = MODEL, **app_kwargs) -> Iterator[Served]:
    from stepserve.engine.llm_engine import LLMEngine
    from stepserve.server.api import create_app

    if engine is None:
        engine = LLMEngine(MODEL, EngineConfig().replace(**BASE_SETTINGS))
    app = create_app(engine, model_name=model_name, **app_kwargs)
    port = free_port()
    server = make_server(app, "127.0.0.1", port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, alive=thread.is_alive)
    served = Served(url, app, server, thread)
    try:
        yield served
    finally:
        served.stop()


def make_engine(**settings):
    from stepserve.engine.llm_engine import LLMEngine

    return LLMEngine(MODEL, EngineConfig().replace(**{**BASE_SETTINGS, **settings}))


@dataclass
class ServerProcess(MetricsReader):
    """`stepserve serve` in its own process (its own GIL: a client in the test process
    cannot slow it down)."""

    url: str
    proc: subprocess.Popen

    def output(self, timeout: float = 60.0) -> str:
        """Everything it printed, once it has exited."""
        return self.proc.communicate(timeout=timeout)[0]


SERVE_FLAGS = ("--model", MODEL, "--num-gpu-blocks", "512", "--max-model-len", "256",
               "--max-num-seqs", "64", "--log-level", "warning")


@contextmanager
def serve_process(*flags: str, prelude: str = "") -> Iterator[ServerProcess]:
    """`stepserve serve` on a free port with SERVE_FLAGS plus `flags`; `prelude`: Python run
    first in the server process (e.g. a fault to inject). Killed on the way out if still
    running."""
    port = free_port()
    code = f"{prelude}\nimport sys\nfrom stepserve.cli import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", *SERVE_FLAGS, *flags,
                             "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_up(url, timeout_s=120, alive=lambda: proc.poll() is None, poll_s=0.1)
        except RuntimeError:
            proc.kill()
            raise AssertionError(proc.communicate()[0]) from None
        yield ServerProcess(url, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
