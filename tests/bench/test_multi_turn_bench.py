"""Multi-turn sessions in `stepserve bench` against our own server (tiny model): each later
turn sends the conversation so far (completions: the text; chat: the messages, the
answers as assistant turns) after the answer before it arrived, and the server's prefix
cache serves that history (usage's cached_tokens)."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from stepserve.bench import loadgen
from stepserve.bench.client import CHAT, COMPLETIONS, RequestShape
from stepserve.bench.loadgen import HttpTarget, LoadPlan, make_records, run_http
from stepserve.bench.prompt_maker import PromptMaker, repeated_tokens
from stepserve.config.errors import UsageError
from stepserve.metrics.request_metrics import cacheable_tokens
from stepserve.workload.loader import workload_from_dict
from stepserve.workload.sessions import next_turns

THINK_S = 0.05


def sessions(turns: int = 3, num: int = 2):
    return workload_from_dict({
        "seed": 1, "num_requests": num, "arrival": {"constant": {"rate": 20.0}},
        "classes": [{"name": "chat", "prompt": 40, "output": 6,
                     "multi_turn": {"turns": turns, "think_time_s": THINK_S,
                                    "user_len": 8}}]}).generate()


def bench(served, endpoint, specs, monkeypatch, token_ids=False):
    sent: dict[int, dict] = {}
    original = loadgen.stream_completion

    async def record_body(client, url, body, record, t0):
        sent[record.index] = body
        return await original(client, url, body, record, t0)

    monkeypatch.setattr(loadgen, "stream_completion", record_body)
    prompts = PromptMaker(token_ids=token_ids)
    prompts.fit_to_model("tiny")
    plan = LoadPlan(specs, prompts=prompts, shape=RequestShape(endpoint=endpoint))
    target = HttpTarget(served.url, "tiny", endpoint=endpoint)
    records = make_records(plan)

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            await run_http(target, plan, records, client)

    asyncio.run(go())
    return sent, records


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT], ids=["completions", "chat"])
def test_each_turn_sends_the_conversation_so_far(served, monkeypatch, endpoint):
    specs = sessions()
    sent, records = bench(served, endpoint, specs, monkeypatch)
    assert len(specs) == 6 and all(r.ok for r in records)
    links = next_turns(specs)
    assert len(links) == 4
    for k, nxt in links.items():
        before, after, answer = sent[k], sent[nxt], records[k].generated_text
        assert answer
        # sent only after the answer before it arrived, plus the user's think time
        assert records[nxt].send_s >= records[k].end_s + THINK_S
        if endpoint == CHAT:
            assert after["messages"][:-1] == [*before["messages"],
                                              {"role": "assistant", "content": answer}]
            assert after["messages"][-1]["role"] == "user"
        else:
            assert after["prompt"].startswith(before["prompt"] + answer)
            assert len(after["prompt"]) > len(before["prompt"] + answer)
        # the history comes back from the server's prefix cache, whole blocks of it
        assert records[nxt].cached_tokens > 0
        assert records[nxt].prompt_tokens > records[k].prompt_tokens


def test_a_session_ends_at_a_turn_that_failed(served, monkeypatch):
    specs = sessions()
    # the first session's first turn asks for more tokens than the model's context
    specs[0] = dataclasses.replace(specs[0], max_tokens=4096)
    sent, records = bench(served, COMPLETIONS, specs, monkeypatch)
    assert records[0].outcome == "http_400"
    assert [records[i].outcome for i in (1, 2)] == ["not_sent", "not_sent"]
    assert 1 not in sent and 2 not in sent
    assert all(records[i].ok for i in (3, 4, 5))


def test_sessions_refuse_token_id_prompts(served, monkeypatch):
    with pytest.raises(UsageError, match="--token-id-prompts"):
        bench(served, COMPLETIONS, sessions(), monkeypatch, token_ids=True)


def test_a_later_turn_repeats_the_whole_prompt_before_it():
    """The repeated share bench reports (and its --sim records) counts the history."""
    specs = sessions()
    repeated = repeated_tokens(specs)
    assert repeated[0] == repeated[3] == 0
    for k, nxt in next_turns(specs).items():
        assert repeated[nxt] == cacheable_tokens(specs[k].prompt_len, specs[nxt].prompt_len)
        assert repeated[nxt] >= 32
