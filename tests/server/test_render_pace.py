"""A render thread rests after every WORK_S of work (so the engine thread can take the
interpreter lock back between its torch calls); any other thread never sleeps in pace()."""

from __future__ import annotations

import threading

from stepserve.server import logprobs


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _in_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def test_a_render_thread_rests_after_each_slice_of_work(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(logprobs.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(logprobs.time, "sleep", clock.sleep)

    def render() -> None:
        logprobs.render_thread()
        for _ in range(100):  # 100 pieces of 0.5 ms: 50 ms of work
            clock.now += 0.0005
            logprobs.pace()

    _in_thread(render)
    assert clock.sleeps == [logprobs.REST_S] * 25  # one rest per 2 ms of work


def test_other_threads_never_sleep(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(logprobs.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(logprobs.time, "sleep", clock.sleep)

    def unmarked() -> None:
        for _ in range(100):
            clock.now += 0.0005
            logprobs.pace()

    _in_thread(unmarked)
    assert clock.sleeps == []


def test_the_logprob_renderer_paces_a_render_thread(monkeypatch):
    from stepserve.core.request import TokenLogprobs
    from stepserve.server.logprobs import LogprobRenderer

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return f"t{ids[0]}"

    calls: list[int] = []
    monkeypatch.setattr("stepserve.server.logprobs.pace", lambda: calls.append(1))
    found = [TokenLogprobs(token_id=i, logprob=-1.0, rank=1, top=((i, -1.0), (7, -2.0)))
             for i in range(40)]
    r = LogprobRenderer(Tok(), 2)
    r.vllm_prompt(found)
    r.chat(found)
    r.completion([(lp.token_id, lp) for lp in found], 0)
    assert len(calls) == 3 * 40  # once per position, in each shape
