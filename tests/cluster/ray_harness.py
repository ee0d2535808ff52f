"""Helpers for the cluster tests: a local Ray (loopback only, 2 CPUs, no dashboard), pools
of tiny-model replicas deployed on it, the ingress served by uvicorn in a thread on
127.0.0.1, and the listening sockets of this process tree; requests through an ingress
(`complete`, `stream_events`), what each replica admitted (`delta`), and `settled`."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

MODEL = "tiny"
# Small KV pools: replicas start in seconds. 1024 tokens: room for a long request.
BASE = dict(num_gpu_blocks=512, max_model_len=1024, max_num_seqs=32)
CPUS_PER_REPLICA = 0.25  # five replicas fit the 2 CPUs Ray is given


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningIngress:
    url: str
    server: object
    thread: threading.Thread
    pools: list[str]

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key="none", max_retries=0,
                             **kwargs)

    def replicas(self) -> dict[int, dict]:
        """{engine index: its own health answer} of the live replicas."""
        answer = httpx.get(self.url + "/cluster/replicas", timeout=30).json()
        return {r["engine"]: r for r in answer["replicas"]}

    def admitted(self) -> dict[int, int]:
        return {e: r["requests_admitted"] for e, r in self.replicas().items()}

    def wait_replicas(self, n: int, timeout_s: float = 120.0) -> dict[int, dict]:
        """Until n replicas report ok (a restarted one reports under its old index)."""
        deadline = time.monotonic() + timeout_s
        while True:
            reps = self.replicas()
            if len(reps) == n and all(r["status"] == "ok" for r in reps.values()):
                return reps
            if time.monotonic() > deadline:
                raise AssertionError(f"not {n} live replicas after {timeout_s} s: {reps}")
            time.sleep(0.5)


@contextmanager
def ingress(pools_file: str | None = None, **settings) -> Iterator[RunningIngress]:
    """Deploy the pools (or `replicas` in one pool) with BASE + settings and serve the
    ingress on a free port; undeploy on the way out."""
    from stepserve.cluster.job import (
        ClusterServeOptions,
        build_ingress,
        plan_deployment,
        undeploy,
    )
    from stepserve.cluster.messages import ReplicaSettings
    from stepserve.config.load import ConfigOverrides
    from stepserve.model.presets import resolve_model
    from stepserve.server.http_server import make_server

    options = ClusterServeOptions(model=MODEL, pools_file=pools_file,
                                  config=ConfigOverrides(None, {**BASE, **settings}))
    base, deployment = plan_deployment(options)
    replicas = ReplicaSettings(str(resolve_model(MODEL)), MODEL,
                               cpus_per_replica=CPUS_PER_REPLICA, shutdown_timeout_s=5.0)
    pools = [p.name for p in deployment.pools]
    try:
        built = build_ingress(deployment, base, pools_file, replicas, shutdown_timeout_s=5.0)
        port = free_port()
        server = make_server(built.app, "127.0.0.1", port, log_level="warning")
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running = RunningIngress(f"http://127.0.0.1:{port}", server, thread, pools)
        running.wait_replicas(deployment.num_replicas)
        yield running
        server.should_exit = True
        thread.join(60)
    finally:
        undeploy(pools)


def descendants(root_pid: int) -> set[int]:
    """`root_pid` and every process below it."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree = {root_pid}
    grew = True
    while grew:
        new = {p for p, pp in parents.items() if pp in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def listening_addresses(root_pid: int) -> dict[str, set[int]]:
    """{address: pids} of the TCP sockets listening in `root_pid` and its descendants."""
    tree = descendants(root_pid)
    owner: dict[str, int] = {}
    for pid in tree:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    owner[target[8:-1]] = pid
        except OSError:
            pass
    out: dict[str, set[int]] = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in owner:  # 0A: LISTEN
                continue
            out.setdefault(_address(f[1].split(":")[0], width), set()).add(owner[f[9]])
    return out


def _address(hex_ip: str, width: int) -> str:
    raw = bytes.fromhex(hex_ip)
    # /proc stores each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, words)
    return socket.inet_ntop(socket.AF_INET6, words)


def complete(ing: RunningIngress, max_tokens: int = 4, **body) -> dict:
    r = httpx.post(ing.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "hello", "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(ing: RunningIngress, max_tokens: int, out: list, started: threading.Event):
    """A streamed completion; appends each SSE data payload to `out`."""
    with httpx.stream("POST", ing.url + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": "a long one", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                started.set()


def delta(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    return {e: after[e] - before.get(e, 0) for e in after}


def settled(outstanding: int, timeout_s: float = 60.0) -> None:
    """Until the ingress's routers count `outstanding` requests in flight: Ray Serve tells
    a router a request completed a moment after its answer reached us, so on a busy
    machine the next request could see the last one still counted (a tie, not the load
    the test means)."""
    from stepserve.cluster import registry

    deadline = time.monotonic() + timeout_s
    while sum(sum(r._outstanding.values()) for r in registry.ROUTERS.values()) != outstanding:
        assert time.monotonic() < deadline, "the routers never saw the request end"
        time.sleep(0.01)
