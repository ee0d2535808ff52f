"""Why a request stopped is data on the request (`stop_reason`: the stop string or stop
token id, as vLLM's CompletionOutput has it), recorded where the stop is detected; the
text an ended request reports is cut at that match, and only there."""

from __future__ import annotations

import pytest

from stepserve import LLM, SamplingParams

PROMPT = {"prompt_token_ids": [5, 6]}
MAX = 16


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=256, max_num_seqs=4)


@pytest.fixture(scope="module")
def plain(llm):
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX,
                                                ignore_eos=True), use_tqdm=False)[0]
    text = out.outputs[0].text
    assert len(text) >= 4, "the test needs some text"
    return out.outputs[0]


def _run(llm, **params):
    return llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX,
                                                 ignore_eos=True, **params),
                        use_tqdm=False)[0].outputs[0]


def test_a_stop_string_is_the_stop_reason_and_the_cut(llm, plain):
    stop = plain.text[1:3]
    k = plain.text.find(stop)
    cut = _run(llm, stop=["\x00never", stop])
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == plain.text[:k]
    kept = _run(llm, stop=[stop], include_stop_str_in_output=True)
    assert kept.stop_reason == stop and kept.text == plain.text[:k + len(stop)]


def test_a_stop_token_is_the_stop_reason(llm, plain):
    token = plain.token_ids[3]
    out = _run(llm, stop_token_ids=[token])
    assert out.finish_reason == "stop" and out.stop_reason == token
    assert out.token_ids == plain.token_ids[:plain.token_ids.index(token) + 1]


def test_a_length_end_has_no_stop_reason(plain):
    assert plain.finish_reason == "length" and plain.stop_reason is None


def test_a_stop_string_seen_before_min_tokens_neither_stops_nor_cuts(llm, plain):
    # the stop string is in the text from the start, but min_tokens holds every check
    # back until the last token, which ends the request by its length first
    stop = plain.text[:2]
    out = _run(llm, stop=[stop], min_tokens=MAX - 1)
    assert out.finish_reason == "length" and out.stop_reason is None
    assert out.text == plain.text  # not cut where the stop string did not stop it
