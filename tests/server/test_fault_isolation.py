"""Faults injected under load end exactly the requests they touch.

32 concurrent streams; faults at random steps in the runner and in the sampler, in one
request's detokenizer, and in one request's stream rendering. The requests of a failed
step (and the sabotaged ones) end with an error; every other request finishes with the
text the offline engine gives; the KV cache empties and the server keeps serving. Then
the engine loop itself dies: every open request is answered, /health says why, and the
process exits non-zero."""

from __future__ import annotations

import asyncio
import random

import httpx
import openai
import pytest
from server_harness import MODEL, make_engine, serve, serve_process

from stepserve.core.end_reasons import Refusal, end_reason
from stepserve.core.request import SamplingParams

N = 32
DETOK_MARK = 7  # prompts starting with this token id get a detokenizer that breaks
STREAM_MARK = "break-stream"  # requests with this `user` get a stream renderer that breaks


class FaultyRunner:
    """The real runner, failing on chosen execute() calls; records the prompts of every
    request in a step that raised (whatever raised: this wrapper or the sampler)."""

    def __init__(self, runner, fail_calls: set[int]) -> None:
        self.runner = runner
        self.fail_calls = fail_calls
        self.calls = 0
        self.failed_prompts: set[tuple[int, ...]] = set()

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def execute(self, out):
        self.calls += 1
        try:
            if self.calls in self.fail_calls:
                raise RuntimeError(f"injected runner fault at call {self.calls}")
            return self.runner.execute(out)
        except Exception:
            self.failed_prompts |= {tuple(r.prompt_token_ids) for r in out.requests}
            raise


def _spaced(rng: random.Random, low: int, high: int, k: int) -> set[int]:
    """k distinct numbers in [low, high), no two adjacent (three failed steps in a row
    would rightly stop the engine)."""
    picks: set[int] = set()
    while len(picks) < k:
        n = rng.randrange(low, high)
        if not {n - 1, n, n + 1} & picks:
            picks.add(n)
    return picks


def _sabotage(monkeypatch, engine, rng: random.Random) -> FaultyRunner:
    import stepserve.model.runner as runner_mod
    from stepserve.server.answer import Answer

    runner = FaultyRunner(engine.runner, _spaced(rng, 3, 200, 3))
    engine.core.runner = runner  # the runner the engine core executes steps on
    sample_calls = {"n": 0}
    sample_fail = runner.sample_fail = _spaced(rng, 3, 200, 2)
    real_sample = runner_mod.sample

    def sample(*args, **kwargs):
        sample_calls["n"] += 1
        if sample_calls["n"] in sample_fail:
            raise ValueError("injected sampler fault")
        return real_sample(*args, **kwargs)

    monkeypatch.setattr(runner_mod, "sample", sample)

    real_detok = engine.tokenizer.detokenizer

    def detokenizer(prompt_ids=None, **kw):
        detok = real_detok(prompt_ids, **kw)
        if prompt_ids and prompt_ids[0] == DETOK_MARK:
            real_add, n = detok.add, {"k": 0}

            def add(token_id):
                n["k"] += 1
                if n["k"] == 3:
                    raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
                return real_add(token_id)

            detok.add = add
        return detok

    monkeypatch.setattr(engine.tokenizer, "detokenizer", detokenizer)

    real_init, real_token = Answer.__init__, Answer.token

    def init(self, ctx, body, *args, **kwargs):
        real_init(self, ctx, body, *args, **kwargs)
        self.sabotaged = body.user == STREAM_MARK

    def breaking(real):
        def render(self, out, last=False):
            if getattr(self, "sabotaged", False) and out.num_output_tokens >= 4:
                raise RuntimeError("injected stream renderer fault")
            return real(self, out, last)
        return render

    monkeypatch.setattr(Answer, "__init__", init)
    # both the chunks of new text and the last one (last=True): on a busy machine a short
    # request's outputs can all merge into its final output before the handler reads any
    monkeypatch.setattr(Answer, "token", breaking(real_token))
    return runner


WORDS = ["fox", "Paris", "step", "batch", "queue", "token", "cache", "Rome"]


def _jobs(rng: random.Random, tokenizer) -> list[tuple[list[int], int, str | None, float]]:
    """(prompt ids, max_tokens, user, delay before sending): staggered, so that batches
    differ and a failed step holds some requests, not all. Prompts are text (random ids
    may end inside a character, where a stream's text rightly differs from decoding the
    output alone)."""
    jobs = []
    for i in range(N):
        ids = tokenizer.encode(f"{rng.choice(WORDS)} number {i} is")
        user = None
        if i in (5, 17):
            ids = [DETOK_MARK, *ids]
        elif i in (9, 26):
            user = STREAM_MARK
        jobs.append((ids, rng.randrange(12, 48), user, rng.uniform(0.0, 1.5)))
    return jobs


async def _stream(client, ids: list[int], max_tokens: int, user: str | None,
                  delay: float = 0.0):
    """("ok", text) or ("error", message)."""
    await asyncio.sleep(delay)
    extra = {"ignore_eos": True, **({"user": user} if user else {})}
    try:
        stream = await client.completions.create(model=MODEL, prompt=ids,
                                                 max_tokens=max_tokens, temperature=0.0,
                                                 stream=True, extra_body=extra)
        text, reason = [], None
        async for chunk in stream:
            text.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        assert reason == "length", reason
        return "ok", "".join(text)
    except openai.APIError as e:
        return "error", str(e)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_faults_end_exactly_the_requests_they_touch(monkeypatch, offline_llm, seed):
    rng = random.Random(seed)
    # Four a step: a failed step ends at most four requests however the staggered
    # arrivals batch (on a busy machine more of them overlap), and 32 requests of 12-47
    # tokens take over 200 steps, so the faults' steps come.
    engine = make_engine(max_num_seqs=4)
    runner = _sabotage(monkeypatch, engine, rng)
    jobs = _jobs(rng, offline_llm.tokenizer)
    with serve(engine) as served:
        async def run_all():
            client = served.async_client(timeout=60)
            try:
                return await asyncio.gather(*(_stream(client, *job) for job in jobs))
            finally:
                await client.close()

        results = asyncio.run(run_all())
        served.wait_idle()
        assert served.metrics()["stepserve:num_gpu_blocks_used"] == 0
        # still serving (the faults disarmed)
        runner.fail_calls.clear()
        runner.sample_fail.clear()
        ok = served.client().completions.create(model=MODEL, prompt="again", max_tokens=3)
        assert ok.choices[0].finish_reason in ("stop", "length")
        assert httpx.get(served.url + "/health").status_code == 200
        errors_counted = served.metric("stepserve:request_success_total",
                                       finished_reason="error")

    assert runner.failed_prompts, "no step fault landed on a request"
    want = offline_llm.generate(
        [{"prompt_token_ids": job[0]} for job in jobs],
        [SamplingParams(max_tokens=job[1], temperature=0.0, ignore_eos=True) for job in jobs],
        use_tqdm=False)
    for (ids, _, user, _), (outcome, text), offline in zip(jobs, results, want):
        affected = tuple(ids) in runner.failed_prompts or ids[0] == DETOK_MARK or \
            user == STREAM_MARK
        if affected:
            assert outcome == "error", (ids, text)
        else:
            assert outcome == "ok", (ids, text)
            assert text == offline.outputs[0].text
    # The engine ended with "error" exactly the ones whose step or text failed (a broken
    # stream renderer aborts its request instead, unless a failed step ended it first).
    engine_failed = sum(1 for ids, *_ in jobs
                        if tuple(ids) in runner.failed_prompts or ids[0] == DETOK_MARK)
    assert errors_counted == engine_failed
    # at least 8: five faulty steps of at most four requests, four sabotaged (9-12 here)
    ok = sum(1 for outcome, _ in results if outcome == "ok")
    assert ok >= 8  # enough survivors for "the others finish correctly" to mean something


KILL_AFTER_STEPS = 12
KILL_PRELUDE = f"""
from stepserve.core.base import SchedulerBase
_real = SchedulerBase.update_from_output
_n = [0]
def _update(self, out, result):
    _n[0] += 1
    if _n[0] == {KILL_AFTER_STEPS}:
        raise AssertionError("injected scheduler fault: invariant broken")
    return _real(self, out, result)
SchedulerBase.update_from_output = _update
"""


@pytest.mark.slow
def test_a_dead_engine_loop_answers_everyone_and_exits_nonzero():
    with serve_process(prelude=KILL_PRELUDE) as server:
        async def run_all():
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none",
                                        max_retries=0, timeout=30)
            try:
                return await asyncio.gather(*(
                    _stream(client, [11 + i, 12, 13], 200, None) for i in range(8)))
            finally:
                await client.close()

        results = asyncio.run(run_all())
        assert [r[0] for r in results] == ["error"] * 8, results
        assert all("injected scheduler fault" in r[1] for r in results), results
        code = server.proc.wait(timeout=60)  # it exits by itself, without a signal
        out = server.output()
    assert code == 1, out
    assert "engine failed: AssertionError: injected scheduler fault" in out
    assert "exit status 1" in out


def test_health_says_why_once_the_engine_loop_died(monkeypatch):
    from stepserve.core.base import SchedulerBase

    def broken(self, out, result):
        raise AssertionError("injected: invariant broken")

    engine = make_engine()
    monkeypatch.setattr(SchedulerBase, "update_from_output", broken)
    with serve(engine) as served:
        exits = []
        served.app.state.request_exit = lambda: exits.append(1)  # observe, don't exit
        with pytest.raises(openai.APIError):
            served.client().completions.create(model=MODEL, prompt="hi", max_tokens=4)
        r = httpx.get(served.url + "/health")
        assert r.status_code == 503
        assert "injected: invariant broken" in r.json()["error"]["message"]
        assert exits == [1]
        # later requests are refused at once, not left hanging
        again = httpx.post(served.url + "/v1/completions",
                           json={"model": MODEL, "prompt": "hi"}, timeout=10)
        assert again.status_code == 503
        # the probe and a request name the dead engine alike: the table's row
        down = end_reason(Refusal.ENGINE_DOWN)
        for answer in (r, again):
            err = answer.json()["error"]
            assert (answer.status_code, err["type"], err["code"]) == \
                (down.http_status, down.error_type, down.error_code), answer.text
