"""Our answers in vLLM 0.32's shapes, field for field against answers vLLM itself gave
(tests/fixtures/vllm-0.32.0, captured with the same bodies): the unstreamed bodies and
each kind of streamed chunk (opening, piece, finishing, usage) carry the same fields, null
where vLLM's are; list prompts get one choice per prompt and sequence, numbered
prompt-major; the system_fingerprint; the chosen token first among the top logprobs.
A list prompt's prompts end together: one refused or a client gone, none left running."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from server_harness import MODEL, make_engine, serve

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0"
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
GREEDY = {"model": MODEL, "temperature": 0.0}


# maps keyed by data (a token's text, a token id), not by field names
DATA_KEYED = ("logprobs.top_logprobs[]", "prompt_logprobs[]")


def fields(value, path: str = "") -> dict[str, str]:
    """Every field's path and kind (null, or the value's type); a list's items merged,
    and a map keyed by data as one key `*`."""
    out: dict[str, str] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            key = "*" if path.endswith(DATA_KEYED) else key
            out.update(fields(item, f"{path}.{key}" if path else key))
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        for item in value:
            out.update(fields(item, path + "[]"))
    else:
        out[path] = "null" if value is None else type(value).__name__
    return out


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def vllm(name: str):
    text = (FIXTURES / name).read_text()
    return events(text) if name.endswith(".txt") else json.loads(text)


def post(served, path: str, body: dict) -> dict:
    r = httpx.post(served.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def stream(served, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", served.url + path, json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        return events(r.read().decode())


def kinds_of_chunks(chunks: list[dict]) -> dict[str, dict[str, str]]:
    """A stream's chunks by kind, each kind's fields (merged over its chunks)."""
    out: dict[str, dict[str, str]] = {}
    for k, chunk in enumerate(chunks):
        if not chunk["choices"]:
            kind = "usage"
        elif chunk["choices"][0]["finish_reason"] is not None:
            kind = "finishing"
        elif k == 0 and "role" in chunk["choices"][0].get("delta", {}):
            kind = "opening"
        else:
            kind = "piece"
        out.setdefault(kind, {}).update(fields(chunk))
    return out


@pytest.fixture(scope="module")
def served():
    with serve() as s:
        yield s


# (fixture, endpoint, the body vLLM got, with `model` ours)
UNSTREAMED = [
    ("completion.json", COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 8}),
    ("completion_list_token_prompts.json", COMPLETIONS,
     {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3}),
    ("completion_echo_logprobs.json", COMPLETIONS,
     {"prompt": "Hello there", "max_tokens": 3, "echo": True, "logprobs": 2}),
    ("chat_logprobs.json", CHAT, {"messages": [{"role": "user", "content": "Say hi"}],
                                  "max_tokens": 5, "logprobs": True, "top_logprobs": 2}),
]
STREAMED = [
    ("completion_list_prompts_stream.txt", COMPLETIONS,
     {"prompt": ["Hello", "The sky is"], "max_tokens": 3}),
    ("chat_stream.txt", CHAT, {"messages": [{"role": "user", "content": "Say hi"}],
                               "max_tokens": 5, "stream_options": {"include_usage": True}}),
]


@pytest.mark.parametrize("name, path, body", UNSTREAMED, ids=[u[0] for u in UNSTREAMED])
def test_an_answer_has_vllms_fields(served, name, path, body):
    ours = post(served, path, {**GREEDY, **body, "ignore_eos": True})
    assert fields(ours) == fields(vllm(name))


@pytest.mark.parametrize("name, path, body", STREAMED, ids=[s[0] for s in STREAMED])
def test_each_kind_of_chunk_has_vllms_fields(served, name, path, body):
    assert_chunks_like(stream(served, path, {**GREEDY, **body, "ignore_eos": True}),
                       vllm(name))


def assert_chunks_like(ours: list[dict], theirs: list[dict]) -> None:
    """Each kind of chunk we sent has the fields of vLLM's of that kind. A fast engine
    may hand a short choice over in one finishing chunk: no piece then."""
    mine, its = kinds_of_chunks(ours), kinds_of_chunks(theirs)
    assert "finishing" in mine and set(mine) <= set(its)
    assert mine == {kind: its[kind] for kind in mine}


def test_prompt_tokens_details_as_vllm_sends_them_with_the_flag():
    # vLLM's two answers here came from a server run with --enable-prompt-tokens-details
    body = {**GREEDY, "prompt": "Hello there " * 20, "max_tokens": 3, "ignore_eos": True}
    with serve(enable_prompt_tokens_details=True) as details:
        ours = post(details, COMPLETIONS, body)
        streamed = stream(details, COMPLETIONS,
                          {**body, "stream_options": {"include_usage": True}})
    assert fields(ours["usage"]) == fields(vllm("completion_prompt_tokens_details.json")["usage"])
    assert_chunks_like(streamed, vllm("completion_stream_usage.txt"))
    assert ours["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert streamed[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_each_prompt_of_a_list_is_answered_as_alone_numbered_prompt_major(served):
    check_list_prompt(served, ["Hello", "The sky is", "Once"])
    check_list_prompt(served, [[5, 6, 7], [8, 9]])


def check_list_prompt(served, prompts: list) -> None:
    alone = [post(served, COMPLETIONS, {**GREEDY, "prompt": p, "max_tokens": 4,
                                        "ignore_eos": True}) for p in prompts]
    body = {**GREEDY, "prompt": prompts, "max_tokens": 4, "ignore_eos": True, "n": 2}
    n = 2 * len(prompts)
    together = post(served, COMPLETIONS, body)
    assert [c["index"] for c in together["choices"]] == list(range(n))
    assert [c["text"] for c in together["choices"]] == \
        [a["choices"][0]["text"] for a in alone for _ in range(2)]
    usage = together["usage"]
    assert usage["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert usage["completion_tokens"] == n * 4
    chunks = stream(served, COMPLETIONS, body)
    texts: dict[int, str] = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {c["index"]: c["text"] for c in together["choices"]}
    finishing = [c for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert sorted(c["choices"][0]["index"] for c in finishing) == list(range(n))
    assert all("system_fingerprint" in c for c in finishing)
    served.wait_idle()


def test_a_list_prompt_with_echo_and_best_of_keeps_each_prompt_its_own(served):
    prompts = ["Hello", "The sky is"]
    body = {**GREEDY, "prompt": prompts, "max_tokens": 2, "echo": True, "ignore_eos": True,
            "best_of": 3, "n": 2, "temperature": 1.0, "seed": 3}
    answer = post(served, COMPLETIONS, body)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    for c in answer["choices"]:
        assert c["text"].startswith(prompts[c["index"] // 2])
    served.wait_idle()


def test_a_refused_prompt_of_a_list_leaves_none_running():
    # one waiting slot: the list's later prompts overflow the queue and are refused
    with serve(make_engine(max_num_seqs=1, max_waiting=1)) as small:
        r = httpx.post(small.url + COMPLETIONS, json={
            **GREEDY, "prompt": ["a b c"] * 4, "max_tokens": 50, "ignore_eos": True},
            timeout=60)
        assert r.status_code == 429, r.text
        small.wait_idle()  # the admitted prompts were aborted: no block held, none queued
        assert small.app.state.async_engine.num_live == 0


def test_a_client_gone_ends_every_prompt_of_its_list(served):
    body = {**GREEDY, "prompt": ["Hello"] * 3, "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", served.url + COMPLETIONS, json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then the client goes away
    served.wait_idle()
    assert served.app.state.async_engine.num_live == 0


def test_system_fingerprint_and_its_modes():
    body = {**GREEDY, "prompt": "Hi", "max_tokens": 2}
    with serve() as s:
        first = post(s, COMPLETIONS, body)["system_fingerprint"]
    assert re.fullmatch(r"stepserve-\d+\.\d+\.\d+-[0-9a-f]{8}", first)
    with serve(make_engine(max_num_seqs=3)) as other:  # other settings: another hash
        assert post(other, COMPLETIONS, body)["system_fingerprint"] != first
    with serve(fingerprint_mode="none") as none:
        assert post(none, COMPLETIONS, body)["system_fingerprint"] is None
    with serve(fingerprint_mode="custom", fingerprint_value="ours-1") as custom:
        assert post(custom, CHAT, {**GREEDY, "messages": [{"role": "user", "content": "x"}],
                                   "max_tokens": 2})["system_fingerprint"] == "ours-1"
    with pytest.raises(ValueError, match="needs a fingerprint value"):
        with serve(fingerprint_mode="custom"):
            pass


def test_the_chosen_token_leads_its_top_logprobs_as_in_vllms(served):
    theirs = vllm("completion_echo_logprobs.json")["choices"][0]["logprobs"]
    for token, top in zip(theirs["tokens"][1:], theirs["top_logprobs"][1:], strict=True):
        assert next(iter(top)) == token  # vLLM's own order
    ours = post(served, COMPLETIONS, {**GREEDY, "prompt": "Hello there", "max_tokens": 6,
                                      "logprobs": 3, "echo": True, "temperature": 1.0,
                                      "seed": 5})["choices"][0]["logprobs"]
    for token, top in zip(ours["tokens"][1:], ours["top_logprobs"][1:], strict=True):
        assert next(iter(top)) == token


def test_chat_lists_the_chosen_token_first_and_top_logprobs_entries(served):
    theirs = vllm("chat_logprobs.json")["choices"][0]["logprobs"]["content"]
    assert all(t["top_logprobs"][0]["token"] == t["token"] for t in theirs)  # vLLM's order
    body = {**GREEDY, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8,
            "logprobs": True, "top_logprobs": 2, "temperature": 1.5, "seed": 11}
    ours = post(served, CHAT, body)["choices"][0]["logprobs"]["content"]
    for t in ours:
        assert t["top_logprobs"][0] == {k: t[k] for k in ("token", "logprob", "bytes")}
        assert len(t["top_logprobs"]) == 2
    zero = post(served, CHAT, {**body, "top_logprobs": 0})["choices"][0]["logprobs"]
    assert all(t["top_logprobs"] == [] for t in zero["content"])
