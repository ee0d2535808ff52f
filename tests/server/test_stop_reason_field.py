"""Each choice says what stopped it, as vLLM's `stop_reason`: the stop string that
matched, the stop token id (an int) when a token in stop_token_ids ended it, and null for
a length end and for EOS. Unstreamed: on every choice; streamed: on the chunk carrying
the choice's finish_reason, null on every other chunk. n > 1 choices each carry their own."""

from __future__ import annotations

import json

import httpx
import pytest
from server_harness import MODEL

from stepserve import SamplingParams

PROMPT = [5, 6]
CHAT = [{"role": "user", "content": "Tell me a story"}]
MAX = 16
GREEDY = dict(temperature=0.0, max_tokens=MAX)


@pytest.fixture(scope="module")
def plain(offline_llm):
    """The greedy completion of PROMPT offline (the server's engine gives the same)."""
    out = offline_llm.generate([{"prompt_token_ids": PROMPT}],
                               SamplingParams(**GREEDY, ignore_eos=True), use_tqdm=False)
    return out[0].outputs[0]


@pytest.fixture(scope="module")
def plain_chat(offline_llm):
    out = offline_llm.chat(CHAT, SamplingParams(**GREEDY, ignore_eos=True), use_tqdm=False)
    return out[0].outputs[0]


def _stop_string(text: str) -> str:
    assert len(text) >= 4, "the test needs some text"
    return text[1:3]


def _ends(plain, plain_chat):
    """(extra body, expected stop_reason, expected finish_reason) for each way to end,
    with the completion's and the chat's own stop string and token."""
    return {
        "stop string": ({"stop": ["\x00never", _stop_string(plain.text)]},
                        {"stop": ["\x00never", _stop_string(plain_chat.text)]},
                        (_stop_string(plain.text), _stop_string(plain_chat.text)), "stop"),
        "stop token": ({"stop_token_ids": [plain.token_ids[3]]},
                       {"stop_token_ids": [plain_chat.token_ids[3]]},
                       (plain.token_ids[3], plain_chat.token_ids[3]), "stop"),
        "length": ({"ignore_eos": True}, {"ignore_eos": True}, (None, None), "length"),
    }


@pytest.mark.parametrize("end", ["stop string", "stop token", "length"])
def test_every_unstreamed_choice_carries_its_stop_reason(served, plain, plain_chat, end):
    extra, chat_extra, (want, want_chat), finish = _ends(plain, plain_chat)[end]
    client = served.client()
    done = client.completions.create(model=MODEL, prompt=PROMPT, n=2, **GREEDY,
                                     extra_body=extra)
    assert [c.finish_reason for c in done.choices] == [finish, finish]
    assert [c.model_extra["stop_reason"] for c in done.choices] == [want, want]
    assert all(type(c.model_extra["stop_reason"]) is type(want) for c in done.choices)
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, n=2, **GREEDY,
                                          extra_body=chat_extra)
    assert [c.finish_reason for c in chat.choices] == [finish, finish]
    assert [c.model_extra["stop_reason"] for c in chat.choices] == [want_chat, want_chat]


def _events(served, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{served.base_url}{path}", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _check_stream(events: list[dict], n: int, finish: str, want, on_every: bool) -> None:
    """`on_every`: the field is on every chunk (completions: null until the last), else
    only on each choice's finishing chunk (chat), as vLLM 0.32 sends them."""
    last = {}
    for event in events:
        for choice in event["choices"]:
            if choice["finish_reason"] is None:
                assert ("stop_reason" in choice) == on_every
                assert choice.get("stop_reason") is None
            else:
                assert choice["index"] not in last, "one finishing chunk per choice"
                last[choice["index"]] = (choice["finish_reason"], choice["stop_reason"])
    assert last == {i: (finish, want) for i in range(n)}
    assert all(type(reason) is type(want) for _, reason in last.values())


@pytest.mark.parametrize("end", ["stop string", "stop token", "length"])
def test_a_streamed_choice_carries_its_stop_reason_on_its_finishing_chunk(
        served, plain, plain_chat, end):
    extra, chat_extra, (want, want_chat), finish = _ends(plain, plain_chat)[end]
    body = {"model": MODEL, "n": 2, "stream": True, **GREEDY}
    _check_stream(_events(served, "/completions", {**body, "prompt": PROMPT, **extra}),
                  2, finish, want, on_every=True)
    _check_stream(_events(served, "/chat/completions",
                          {**body, "messages": CHAT, **chat_extra}), 2, finish, want_chat,
                  on_every=False)


def test_eos_has_no_stop_reason(served, plain, monkeypatch):
    # The random-weight model seldom samples its EOS: make its greedy fourth token the
    # EOS, named in stop_token_ids too (vLLM checks EOS first: still no stop_reason).
    eos = plain.token_ids[3]
    runner = served.engine.runner
    monkeypatch.setattr(type(runner), "eos_token_id", property(lambda self: eos))
    body = {"model": MODEL, "prompt": PROMPT, **GREEDY}
    done = served.client().completions.create(**body, extra_body={"stop_token_ids": [eos]})
    (choice,) = done.choices
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] is None
    assert done.usage.completion_tokens == plain.token_ids.index(eos) + 1
    _check_stream(_events(served, "/completions", {**body, "stream": True}), 1, "stop", None,
                  on_every=True)
    plain_eos = served.client().completions.create(**body)
    assert plain_eos.choices[0].model_extra["stop_reason"] is None
