"""A real local Ray cluster (2 CPUs, loopback only, no dashboard), shared by this module:
tiny-model replicas behind the ingress, driven by the official openai client and httpx.

* the openai client streams through the ingress; streamed text = unstreamed text;
* requests are spread as the router says: round-robin alternates, least-outstanding
  sends short requests away from the replica busy with a long one (prefix_affinity:
  test_prefix_routing_on_ray.py);
* pool rules: long prompts and a header go to `offline`, chat to `online`;
* /metrics merges every replica (engine and pool labels); /health and /health/{engine}
  say only ok, each replica's detail is /cluster/replicas;
* /tokenize, /detokenize, /version; bodies the parser refuses are a 400;
* nothing listens outside 127.0.0.1;
* a replica killed mid-run: its in-flight requests end with an error naming it, the
  others complete, new requests go to the live replica, Ray Serve restarts it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")
pytest.importorskip("openai")

sys.path.insert(0, str(Path(__file__).parent))

import httpx  # noqa: E402
from ray_harness import (  # noqa: E402
    MODEL,
    RunningIngress,
    complete,
    delta,
    descendants,
    ingress,
    listening_addresses,
    settled,
    stream_events,
)

pytestmark = pytest.mark.slow

POOLS = """
router: least_outstanding
pools:
  online:  {replicas: 2, scheduler: {max_num_seqs: 16}}
  offline: {replicas: 1, scheduler: {max_num_seqs: 32}}
routing:
  default: online
  rules:
    - {prompt_tokens_over: 300, pool: offline}
    - {max_tokens_over: 950, pool: offline}
    - {header: {x-pool: offline}, pool: offline}
"""


@pytest.fixture(scope="module")
def rr(ray_local):
    with ingress(replicas=2, router="round_robin") as running:
        yield running


@pytest.fixture(scope="module")
def pooled(ray_local, tmp_path_factory):
    path = tmp_path_factory.mktemp("pools") / "pools.yaml"
    path.write_text(POOLS)
    with ingress(str(path)) as running:
        yield running


# ---- the API through the ingress ----

def test_openai_client_streams_through_the_ingress(rr):
    client = rr.client()
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=12,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    streamed = "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    whole = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=12,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert whole.choices[0].text == streamed and whole.usage.completion_tokens == 12
    chat = client.chat.completions.create(model=MODEL, max_tokens=5, stream=True,
                                          messages=[{"role": "user", "content": "hi"}])
    parts = list(chat)
    assert parts[-1].choices[0].finish_reason in ("stop", "length")
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_n_choices_are_refused_clearly_through_the_ingress(rr):
    import openai

    with pytest.raises(openai.BadRequestError, match="not supported through `serve "
                                                      "--replicas`"):
        rr.client().completions.create(model=MODEL, prompt="Once upon", max_tokens=4, n=3)


def test_errors_keep_the_single_server_shape(rr):
    import openai

    client = rr.client()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=MODEL, prompt=[1] * 1000, max_tokens=100)


# ---- routers ----

def _skewed(ing: RunningIngress, shorts: int = 6) -> tuple[int, dict[int, int]]:
    """A long streamed request, then short ones one after another while it runs.
    Returns (the engine running the long one, admitted per engine during the shorts)."""
    events: list[str] = []
    started = threading.Event()
    long_one = threading.Thread(target=stream_events, args=(ing, 900, events, started))
    long_one.start()
    assert started.wait(60)
    busy = [e for e, r in ing.replicas().items() if r["running"] + r["waiting"] > 0]
    assert len(busy) == 1, ing.replicas()
    before = ing.admitted()
    for _ in range(shorts):
        complete(ing, max_tokens=2)
        settled(outstanding=1)
    after = ing.admitted()
    still_running = long_one.is_alive()
    long_one.join(120)
    assert still_running, "the long request ended before the short ones: make it longer"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    return busy[0], delta(before, after)


def test_round_robin_takes_turns(rr):
    before = rr.admitted()
    for _ in range(6):
        complete(rr)
    assert sorted(delta(before, rr.admitted()).values()) == [3, 3]
    busy, shorts = _skewed(rr)
    assert shorts == {0: 3, 1: 3}  # in turn, whatever the long request holds


def test_least_outstanding_avoids_the_busy_replica(pooled):
    busy, shorts = _skewed(pooled)
    online = {e for e, r in pooled.replicas().items() if r["pool"] == "online"}
    assert busy in online
    (idle,) = online - {busy}
    assert shorts[idle] == 6 and shorts[busy] == 0


def test_pool_rules_send_long_prompts_and_headers_offline_and_chat_online(pooled):
    pools = {e: r["pool"] for e, r in pooled.replicas().items()}
    assert sorted(pools.values()) == ["offline", "online", "online"]

    def sent_to() -> dict[str, int]:
        d = delta(before, pooled.admitted())
        return {p: sum(n for e, n in d.items() if pools[e] == p) for p in ("online", "offline")}

    before = pooled.admitted()
    pooled.client().chat.completions.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert sent_to() == {"online": 1, "offline": 0}
    before = pooled.admitted()
    complete(pooled, prompt=list(range(3, 403)))  # 400 prompt tokens > 300
    assert sent_to() == {"online": 0, "offline": 1}
    before = pooled.admitted()
    pooled.client(default_headers={"X-Pool": "offline"}).completions.create(
        model=MODEL, prompt="short", max_tokens=2)
    assert sent_to() == {"online": 0, "offline": 1}


# ---- observability ----

def test_metrics_merge_every_replica_with_engine_and_pool_labels(pooled):
    complete(pooled, prompt=list(range(3, 403)))
    text = httpx.get(pooled.url + "/metrics").text
    for engine, pool in ((0, "online"), (1, "online"), (2, "offline")):
        assert f'stepserve:num_requests_running{{engine="{engine}",pool="{pool}",' in text
    assert text.count("# TYPE stepserve:num_requests_running gauge") == 1
    done = [line for line in text.splitlines() if line.startswith(
        'stepserve:request_success_total{engine="2",pool="offline",finished_reason="length"')]
    assert done and float(done[0].split()[-1]) >= 1
    assert 'stepserve:cluster_replicas_live{pool="online"} 2' in text


def test_public_health_says_only_ok_and_the_replicas_are_behind_the_api(pooled):
    for path in ("/health", "/health/2"):
        got = httpx.get(pooled.url + path)
        assert (got.status_code, got.json()) == (200, {"status": "ok"}), path
        assert httpx.head(pooled.url + path).status_code == 200, path
    missing = httpx.get(pooled.url + "/health/9")
    assert missing.status_code == 404 and "pid" not in missing.text
    detail = httpx.get(pooled.url + "/cluster/replicas").json()
    assert detail["status"] == "ok" and {r["engine"] for r in detail["replicas"]} == {0, 1, 2}
    assert pooled.replicas()[2]["pool"] == "offline" and pooled.replicas()[2]["pid"] > 0


def test_utility_routes_and_refused_bodies_through_the_ingress(rr):
    got = httpx.post(rr.url + "/tokenize", json={"prompt": "hello"}).json()
    back = httpx.post(rr.url + "/detokenize", json={"tokens": got["tokens"]}).json()
    assert got["count"] == len(got["tokens"]) > 0 and back == {"prompt": "hello"}
    assert "version" in httpx.get(rr.url + "/version").json()
    for raw in (b'{"prompt": "ab\\ud800cd", "max_tokens": 4}',
                b'{"prompt": "ab", "max_tokens": ' + b"9" * 5000 + b"}"):
        r = httpx.post(rr.url + "/v1/completions", content=raw,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and set(r.json()["error"]) == {
            "message", "type", "param", "code"}, r.text


def test_nothing_listens_outside_the_loopback(rr, pooled):
    addresses = listening_addresses(os.getpid())
    assert addresses, "found no listening socket at all"
    outside = {a: p for a, p in addresses.items()
               if a not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")}
    assert not outside, outside


# ---- faults (last: it kills a replica) ----

def test_a_killed_replica_fails_only_its_requests_and_is_restarted(rr):
    old = rr.wait_replicas(2)
    results: list[list[str]] = [[] for _ in range(6)]
    started = [threading.Event() for _ in results]
    threads = [threading.Thread(target=stream_events, args=(rr, 900, out, ev))
               for out, ev in zip(results, started)]
    for t in threads:
        t.start()
    assert all(ev.wait(60) for ev in started)
    victim = 0
    os.kill(old[victim]["pid"], signal.SIGKILL)
    # new requests meanwhile go to the live replica
    for _ in range(3):
        assert complete(rr)["choices"][0]["finish_reason"] == "length"
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a request hung after its replica died"
    ends = [json.loads(r[-2]) for r in results]  # the event before [DONE]
    errors = [e for e in ends if "error" in e]
    assert len(errors) == 3 and all(r[-1] == "[DONE]" for r in results)
    assert all(f"engine={victim}" in e["error"]["message"] for e in errors), errors
    assert all(e["choices"][0]["finish_reason"] == "length" for e in ends if "error" not in e)
    deadline = time.monotonic() + 120
    while True:  # Ray Serve restarts it under the same index, in a new process
        reps = rr.wait_replicas(2, timeout_s=120)
        if reps[victim]["pid"] != old[victim]["pid"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert reps[victim]["pid"] != old[victim]["pid"]
    before = rr.admitted()
    for _ in range(4):
        complete(rr)
    assert sorted(delta(before, rr.admitted()).values()) == [2, 2]


def test_replicas_run_at_this_process_priority(rr):
    """Ray's default puts workers at nice 15: a serving replica would lose its cores to
    any process at normal priority."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    replicas = {}
    for pid in descendants(os.getpid()):
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if name.startswith(b"ray::ServeReplica"):
            replicas[pid] = os.getpriority(os.PRIO_PROCESS, pid)
    assert len(replicas) >= 2 and set(replicas.values()) == {own}, replicas
