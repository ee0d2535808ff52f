"""The sampler's vLLM features against hand-built references on logits: repetition,
frequency and presence penalties, min_p, min_tokens, raw logprobs; and the bounds of
every new SamplingParams field."""

from __future__ import annotations

import math

import pytest
import torch

from stepserve.core.request import Request, SamplingParams, child_params
from stepserve.core.request_limits import LOGPROBS_MAX
from stepserve.model.sampler import apply_min_p, apply_penalties, sample, token_logprobs

V = 50


def make(params: SamplingParams, prompt: list[int], output: list[int]) -> Request:
    return Request("r", list(prompt), params, 0.0, eos_token_id=2,
                   output_token_ids=list(output))


def reference_penalties(row: list[float], prompt: list[int], output: list[int],
                        rep: float, freq: float, pres: float) -> list[float]:
    """vLLM's penalties written out token by token: repetition over prompt + output
    (positive / rep, negative * rep), then frequency x count and presence x [count > 0]
    over the output."""
    out = list(row)
    seen = set(prompt) | set(output)
    for t in range(len(out)):
        if t in seen:
            out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
        count = output.count(t)
        out[t] -= freq * count
        out[t] -= pres * (1.0 if count else 0.0)
    return out


@pytest.mark.parametrize("rep,freq,pres", [(1.3, 0.0, 0.0), (1.0, 0.7, 0.0),
                                           (1.0, 0.0, 1.5), (0.8, -0.5, 0.4),
                                           (2.0, 2.0, -2.0)])
def test_penalties_equal_the_reference(rep, freq, pres):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, V, generator=g) * 4
    prompts = [[1, 5, 5, 9], [7], [3, 4, 40, 41, 42]]
    outputs = [[5, 6, 6, 6, 11], [], [40, 13, 13, 49]]
    params = SamplingParams(repetition_penalty=rep, frequency_penalty=freq,
                            presence_penalty=pres, temperature=0.0)
    reqs = [make(params, p, o) for p, o in zip(prompts, outputs, strict=True)]
    got = logits.clone()
    apply_penalties(got, reqs)
    for b in range(3):
        want = reference_penalties(logits[b].tolist(), prompts[b], outputs[b], rep, freq,
                                   pres)
        assert got[b].tolist() == pytest.approx(want, abs=1e-5)
    # greedy picks the argmax of the penalised logits, so the penalty changes the choice
    # exactly where the reference says it does
    tokens = sample(logits.clone(), reqs).token_ids
    assert tokens == [max(range(V), key=lambda t, b=b: reference_penalties(
        logits[b].tolist(), prompts[b], outputs[b], rep, freq, pres)[t]) for b in range(3)]


def test_a_penalty_changes_the_greedy_choice():
    logits = torch.full((1, V), -5.0)
    logits[0, 7], logits[0, 8] = 3.0, 2.0  # 7 wins unpenalised
    plain = make(SamplingParams(temperature=0.0), [1], [7])
    penalised = make(SamplingParams(temperature=0.0, repetition_penalty=2.0), [1], [7])
    assert sample(logits.clone(), [plain]).token_ids == [7]
    assert sample(logits.clone(), [penalised]).token_ids == [8]  # 3 / 2 = 1.5 < 2
    freq = make(SamplingParams(temperature=0.0, frequency_penalty=0.6), [1], [7, 7])
    assert sample(logits.clone(), [freq]).token_ids == [8]  # 3 - 1.2 = 1.8 < 2


def test_min_p_keeps_tokens_above_the_scaled_top_probability():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    x = apply_min_p(probs.log(), torch.tensor([0.35]))  # floor 0.175: keeps 0.5 and 0.3
    assert torch.isfinite(x).tolist() == [[True, True, False, False]]
    params = [SamplingParams(temperature=1.0, min_p=0.35, seed=s) for s in range(300)]
    reqs = [make(p, [1], []) for p in params]
    got = sample(probs.log().repeat(300, 1), reqs).token_ids
    assert set(got) == {0, 1}


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = torch.zeros(1, V)
    logits[0, 2] = 10.0  # EOS (id 2) is by far the likeliest
    logits[0, 9] = 9.0  # then a stop token
    logits[0, 4] = 1.0
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(9,))
    assert sample(logits.clone(), [make(params, [1], [4, 4])]).token_ids == [4]
    assert sample(logits.clone(), [make(params, [1], [4, 4, 4])]).token_ids == [2]
    ignore = SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True)
    assert sample(logits.clone(), [make(ignore, [1], [])]).token_ids == [9]


def test_logprobs_are_the_raw_distributions():
    """vLLM's default logprobs_mode (raw_logprobs): log_softmax of the model's output,
    whatever temperature and penalties did to the draw."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, V, generator=g) * 3
    params = [SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=1.7),
              SamplingParams(temperature=1.5, logprobs=0, seed=4)]
    reqs = [make(params[0], [1, 2], [5]), make(params[1], [1], [])]
    out = sample(logits.clone(), reqs)
    raw = torch.log_softmax(logits, dim=-1)
    for b, lp in enumerate(out.logprobs):
        tok = out.token_ids[b]
        assert lp.token_id == tok
        assert lp.logprob == pytest.approx(raw[b, tok].item(), abs=1e-6)
        assert lp.rank == int((raw[b] >= raw[b, tok]).sum())
        k = params[b].logprobs
        top = raw[b].topk(k) if k else None
        assert [t for t, _ in lp.top] == ([] if top is None else top.indices.tolist())
    assert out.logprobs[0].top[0][1] == pytest.approx(raw[0].max().item(), abs=1e-6)


def test_no_logprobs_unless_asked():
    out = sample(torch.randn(2, V), [make(SamplingParams(temperature=0.0), [1], [])] * 2)
    assert out.logprobs == [None, None]


def test_token_logprobs_of_given_targets():
    x = torch.tensor([[0.0, 1.0, 2.0]])
    (lp,) = token_logprobs(x, [0], [2])
    assert lp.logprob == pytest.approx(-math.log(1 + math.e + math.e ** 2), abs=1e-6)
    assert lp.rank == 3 and [t for t, _ in lp.top] == [2, 1]


def test_child_params_seed_each_child_like_vllm():
    p = SamplingParams(n=3, seed=10, temperature=1.0)
    assert [child_params(p, i).seed for i in range(3)] == [10, 11, 12]
    assert all(child_params(p, i).n == 1 for i in range(3))
    assert child_params(SamplingParams(n=2), 1).seed is None
    top = SamplingParams(n=2, seed=(1 << 63) - 1)
    assert child_params(top, 1).seed == -(1 << 63)  # wrapped into int64


@pytest.mark.parametrize("field,bad", [
    ("n", 0), ("n", 129), ("min_p", -0.1), ("min_p", 1.5), ("min_tokens", -1),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0),
    ("repetition_penalty", 1e9), ("repetition_penalty", float("nan")),
    ("logprobs", LOGPROBS_MAX + 1), ("logprobs", -1), ("prompt_logprobs", LOGPROBS_MAX + 1),
    ("max_tokens", 0), ("n", True)])
def test_every_new_field_is_bounded(field, bad):
    # logprobs over an engine's --max-logprobs (20 unless told) are the engine's refusal
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: bad})


def test_vllm_defaults_and_spellings():
    p = SamplingParams(max_tokens=None, top_k=-1)
    assert p.max_tokens is None and p.top_k == 0
    assert (p.n, p.min_p, p.min_tokens, p.repetition_penalty, p.logprobs,
            p.skip_special_tokens, p.include_stop_str_in_output) == \
        (1, 0.0, 0, 1.0, None, True, False)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
