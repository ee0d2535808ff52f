"""Prefill-heavy steps that stall decoding or first tokens (a wave of prompts prefilled
in one multi-second step while every running sequence and every new prompt waits), with
the step times as evidence and a smaller step budget, computed from them, as the action.

What a slow step costs depends on who waits it out. Where prefill goes first (or decode
was skipped in some steps), a running sequence gets no token until the prefill step
ends: a step over 5 decode steps is a stall. Where decode goes first and no step skipped
it, every running sequence rides in each step, a bounded chunk included, and its pace
(TPOT) already pays for the chunk steps: a stall is then a step the pace does not absorb,
over 20x the TPOT P50. The mixed-pool incident's fix (budget 8192, chunk cap 2048, decode
first) accepts a 2,048-token chunk step of about 0.4 s on an engine whose TPOT P50 was
58 ms, about 7x, and simulated its P99 step is about 10x (the cap is per request: a
summary's chunk and the chats that arrived with it fill the 8,192-token step): a 5x
line over the bare decode step flags that fix itself, and 20x is twice the fix's own
figure. A wave of prompts prefilled in one step is far past it (65x on a CPU-like engine
at a budget of 8,192).
"""

from __future__ import annotations

from stepserve.metrics.finding import Finding
from stepserve.metrics.rule import RuleSettings, S, pct, rule
from stepserve.metrics.run_summary import RunSummary

STALL_RATIO = 5.0  # the slow steps (or token gaps) over this many decode steps: a stall
RIDE_ALONG_RATIO = 20.0  # decode first: the slow steps over this many TPOT P50s
DECODE_SKIPPED_MAX = 0.01  # a zero-decode share under 1%: decode was not skipped
STALL_PREFILL_SHARE_MIN = 0.2  # below it prompts are too small a share to stall anything
STALL_TARGET_RATIO = 3.0  # advice: a budget whose fullest step costs ~3 decode steps


def _prefill_share(s: RunSummary) -> float | None:
    """Prefill's share of the computed tokens; from a client's token counts (prompts /
    prompts + outputs) where no engine or scrape measured it."""
    if s.prefill_token_share is not None:
        return s.prefill_token_share
    if s.prompt_tokens and s.output_tokens is not None:
        return s.prompt_tokens / (s.prompt_tokens + s.output_tokens)
    return None


def _stall_budget(budget: int, pace: float, stall: float) -> int:
    """A step budget whose fullest step costs about STALL_TARGET_RATIO decode steps, if
    a prefill-heavy step's time grows with its tokens: a power of two, at least 64."""
    want = budget * STALL_TARGET_RATIO * pace / stall
    power = 64
    while power * 2 <= want:
        power *= 2
    return min(power, budget)


def _decoders_ride_along(s: RunSummary, cfg: RuleSettings) -> bool:
    """Decode goes first and no step skipped it: running sequences are never held back
    by a prefill step, only slowed by the ones they share."""
    skipped = s.zero_decode_step_share
    return cfg.budget_order == "decode_first" and (skipped is None
                                                   or skipped < DECODE_SKIPPED_MAX)


@rule((S.step_p99_s, S.itl_p99_s), (S.decode_step_p50_s, S.tpot_p50_s),
      (S.prefill_token_share, S.prompt_tokens))
def prefill_stalls_decode(s: RunSummary, cfg: RuleSettings) -> Finding | None:
    stall, stall_name = ((s.step_p99_s, "step time P99") if s.step_p99_s is not None
                         else (s.itl_p99_s, "ITL P99"))
    pace, pace_name = ((s.decode_step_p50_s, "median decode step")
                       if s.decode_step_p50_s is not None else (s.tpot_p50_s, "TPOT P50"))
    share = _prefill_share(s)
    if stall is None or not pace or share is None or stall <= STALL_RATIO * pace:
        return None
    if share < STALL_PREFILL_SHARE_MIN:
        return None  # prompts are a small share of the work: long steps come from elsewhere
    seen = [f"{stall_name} {stall:.3g} s is {stall / pace:.0f}x the {pace_name} "
            f"({pace:.3g} s; alert over {STALL_RATIO:g}x)"]
    if _decoders_ride_along(s, cfg) and s.tpot_p50_s:
        tpot = s.tpot_p50_s
        if stall <= RIDE_ALONG_RATIO * tpot:
            return None  # a bounded step every running sequence rode in: its pace paid
        seen.append(f"{stall / tpot:.0f}x the TPOT P50 ({tpot:.3g} s), which with decode "
                    f"first pays for the prefill steps it rides in (alert over "
                    f"{RIDE_ALONG_RATIO:g}x)")
    seen.append(f"prefill is {pct(share)} of the tokens")
    if s.step_max_s is not None:
        seen.append(f"the longest step took {s.step_max_s:.3g} s")
    if s.ttft_p50_s is not None:
        seen.append(f"TTFT P50 {s.ttft_p50_s:.3g} s")
    budget = cfg.max_num_batched_tokens
    if budget is not None:
        new = _stall_budget(budget, pace, stall)
        change = (f"lower max_num_batched_tokens from {budget} toward {new} (where a step's "
                  f"time grows with its tokens, that makes the fullest step ~"
                  f"{STALL_TARGET_RATIO:g} decode steps) and long_prefill_token_threshold "
                  f"to {max(new // 2, 1)}")
    else:
        change = ("lower max_num_batched_tokens (the step budget) to what this machine "
                  "prefills in a few decode steps, and cap each request's chunk "
                  "(long_prefill_token_threshold)")
    return Finding(
        "prefill_stalls_decode", "warning",
        "; ".join(seen) + ": prefill-heavy steps stall decoding",
        f"{change}, budget_order decode_first; check the choice on this machine's step "
        "times first: `stepserve profile --out cost.json`, then `stepserve sweep --cost "
        "cost.json --vary max_num_batched_tokens=...` on this workload")
