"""vLLM's `prompt_logprobs` on /v1/completions, streamed or not: per choice a list with
None for the first prompt token, then {token id: {logprob, rank, decoded_token}} equal
to the offline engine's for the same prompt; streamed, on each choice's first chunk
only; and no `logprobs` block unless `logprobs` was asked for."""

from __future__ import annotations

import json

import httpx
import pytest
from server_harness import MODEL

from stepserve import SamplingParams
from stepserve.core.request import TokenLogprobs
from stepserve.server.logprobs import LogprobRenderer
from stepserve.server.protocol import (
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    RawBlocks,
)

PROMPT = "The quick brown fox jumps over"
COMPLETIONS = "/v1/completions"


def offline_prompt_logprobs(llm, prompt: str | list[int], k: int) -> list:
    """The offline engine's prompt logprobs in the server's JSON shape."""
    out = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0,
                                              prompt_logprobs=k), use_tqdm=False)[0]
    return [None if pos is None else
            {str(tid): {"logprob": lp.logprob, "rank": lp.rank,
                        "decoded_token": lp.decoded_token} for tid, lp in pos.items()}
            for pos in out.prompt_logprobs]


def assert_same(found: list, expected: list) -> None:
    assert len(found) == len(expected) and found[0] is None and expected[0] is None
    for got, want in zip(found[1:], expected[1:], strict=True):
        assert set(got) == set(want)
        for tid, entry in want.items():
            assert got[tid]["rank"] == entry["rank"]
            assert got[tid]["decoded_token"] == entry["decoded_token"]
            assert got[tid]["logprob"] == pytest.approx(entry["logprob"], abs=1e-4)


def sse_chunks(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + COMPLETIONS, json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("echo", [False, True])
def test_prompt_logprobs_unstreamed_per_choice(served, offline_llm, echo):
    expected = offline_prompt_logprobs(offline_llm, PROMPT, 3)
    r = httpx.post(served.url + COMPLETIONS, timeout=60, json={
        "model": MODEL, "prompt": PROMPT, "max_tokens": 4, "n": 2, "echo": echo,
        "prompt_logprobs": 3, "ignore_eos": True})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2
    for choice in choices:
        assert_same(choice["prompt_logprobs"], expected)
        assert choice["logprobs"] is None  # not asked for
    served.wait_idle()


def test_prompt_logprobs_on_each_choices_first_chunk(served, offline_llm):
    expected = offline_prompt_logprobs(offline_llm, PROMPT, 2)
    chunks = sse_chunks(served.url, {"model": MODEL, "prompt": PROMPT, "max_tokens": 5,
                                     "n": 3, "prompt_logprobs": 2, "ignore_eos": True})
    seen: dict[int, int] = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        assert choice["logprobs"] is None  # not asked for: no block, not even empty
        k = choice["index"]
        if k not in seen:
            assert_same(choice["prompt_logprobs"], expected)
        else:
            assert "prompt_logprobs" not in choice  # once per choice (a chunk: no field)
        seen[k] = seen.get(k, 0) + 1
    assert set(seen) == {0, 1, 2}
    served.wait_idle()


def test_streamed_echo_with_logprobs_and_prompt_logprobs(served, offline_llm):
    ids = served.engine.tokenizer.encode(PROMPT)
    expected = offline_prompt_logprobs(offline_llm, ids, 1)
    chunks = sse_chunks(served.url, {"model": MODEL, "prompt": ids, "max_tokens": 3,
                                     "echo": True, "logprobs": 1, "prompt_logprobs": 1,
                                     "ignore_eos": True})
    first = chunks[0]["choices"][0]
    assert_same(first["prompt_logprobs"], expected)
    # echo's logprobs block starts with the prompt's tokens, then the generated ones
    values = [v for c in chunks for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert values[0] is None and len(values) == len(ids) + 3
    for p in range(1, len(ids)):
        assert values[p] == pytest.approx(expected[p][str(ids[p])]["logprob"], abs=1e-4)
    served.wait_idle()


def test_chat_prompt_logprobs_still_whole(served, offline_llm):
    messages = [{"role": "user", "content": "Name a capital city."}]
    ids = served.engine.tokenizer.encode_chat(messages, True)
    expected = offline_prompt_logprobs(offline_llm, ids, 2)
    r = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": messages, "max_tokens": 3, "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    assert_same(r.json()["prompt_logprobs"], expected)
    assert r.json()["choices"][0]["logprobs"] is None
    served.wait_idle()


class _Tokenizer:
    TEXTS = {1: "a", 2: "é", 3: "\ufffd", 4: "\ufffd", 5: '"q"'}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.TEXTS[ids[0]]


def test_rendered_blocks_are_the_models_json():
    inf = float("inf")
    found = [TokenLogprobs(2, -0.5, 2, ((1, -0.25), (2, -0.5), (3, -1.0), (4, -2.0))),
             TokenLogprobs(5, -inf, 5, ((1, -0.1), (3, float("nan"))))]
    r = LogprobRenderer(_Tokenizer(), top=3)
    chat = ChoiceLogprobs.model_validate_json(r.chat(found))
    assert [(t.token, t.logprob, t.bytes) for t in chat.content] == [
        ("é", -0.5, list("é".encode())), ('"q"', -9999.0, list(b'"q"'))]
    # the chosen token first, then the likeliest others (vLLM's order)
    assert [t.token for t in chat.content[0].top_logprobs] == ["é", "a", "\ufffd"]
    # -inf and NaN: the floor (the chosen token first, then the likeliest of the others)
    assert [t.logprob for t in chat.content[1].top_logprobs] == [-9999.0, -0.1, -9999.0]
    block, end = r.completion([(1, None), *((lp.token_id, lp) for lp in found)], 4)
    legacy = CompletionLogprobs.model_validate_json(block)
    assert legacy.tokens == ["a", "é", '"q"'] and legacy.text_offset == [4, 5, 6]
    assert end == 9 and legacy.token_logprobs == [None, -0.5, -9999.0]
    # the two byte pieces decode alike: the likelier keeps the key
    assert legacy.top_logprobs[1] == {"a": -0.25, "é": -0.5, "\ufffd": -1.0}
    assert list(legacy.top_logprobs[1]) == ["é", "a", "\ufffd"]  # the chosen token first
    prompt = json.loads(r.vllm_prompt(found))
    assert prompt[0] is None and list(prompt[1]) == ["2", "1", "3", "4"]
    assert prompt[1]["2"] == {"logprob": -0.5, "rank": 2, "decoded_token": "é"}
    assert prompt[2]["5"]["logprob"] == -9999.0


def test_raw_blocks_go_where_their_markers_are():
    raw = RawBlocks()
    lookalike = "stepserve-raw-0123456789abcdef0123456789abcdef-0"  # not this answer's
    answer = CompletionResponse(id="x", model=MODEL, choices=[
        CompletionChoice(index=k, text=lookalike, logprobs=raw.put(f'{{"tokens":["{k}"]}}'),
                         prompt_logprobs=raw.put(None)) for k in range(2)])
    data = json.loads(raw.dump(answer))
    assert [c["logprobs"] for c in data["choices"]] == [{"tokens": ["0"]}, {"tokens": ["1"]}]
    assert all(c["text"] == lookalike and c["prompt_logprobs"] is None
               for c in data["choices"])
