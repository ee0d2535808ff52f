"""Canned /metrics texts for the live-doctor tests: histograms, and a vLLM window."""

from stepserve.metrics.prometheus import Snapshot, parse_prometheus


def hist(name: str, bounds, counts, total: float, labels: str = 'model_name="m"') -> str:
    """A histogram's lines from per-bucket (not cumulative) counts; the last is +Inf."""
    lines, cum = [], 0
    for le, c in zip([*map(str, bounds), "+Inf"], counts, strict=True):
        cum += c
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {cum}')
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {cum}"]
    return "\n".join(lines) + "\n"


def window(*texts: str, dt: float = 1.0) -> list[Snapshot]:
    return [Snapshot(i * dt, parse_prometheus(t)) for i, t in enumerate(texts)]


LAT_BOUNDS = (0.05, 0.1, 5.0, 10.0)


def vllm_text(waiting: int, preempted: int, fast: int, slow: int, stop: int) -> str:
    return (f'vllm:num_requests_waiting{{model_name="m",engine="0"}} {waiting}\n'
            f'vllm:num_requests_running{{model_name="m",engine="0"}} 8\n'
            'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.97\n'
            'vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.97\n'
            f'vllm:num_preemptions_total{{model_name="m",engine="0"}} {preempted}\n'
            f'vllm:prompt_tokens_total{{model_name="m",engine="0"}} {stop * 100}\n'
            f'vllm:generation_tokens_total{{model_name="m",engine="0"}} {stop * 300}\n'
            f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {stop}\n'
            'vllm:request_success_total{finished_reason="abort",model_name="m"} 7\n'
            + hist("vllm:time_to_first_token_seconds", LAT_BOUNDS, [0, fast, 0, slow, 0], 1)
            + hist("vllm:e2e_request_latency_seconds", LAT_BOUNDS, [0, 0, fast, slow, 0], 9)
            + hist("vllm:request_time_per_output_token_seconds", (0.01, 0.05),
                   [0, fast + slow, 0], 1))


def rising_vllm_texts() -> list[str]:
    """Eleven scrapes: the queue climbs 0 -> 20 (2 a scrape), 7 preemptions, and of the
    20 requests that finish, 18 are fast and 2 take 5-10 s to their first token."""
    return [vllm_text(waiting=2 * i, preempted=5 + (7 if i == 10 else 0),
                      fast=18 if i == 10 else 0, slow=2 if i == 10 else 0,
                      stop=10 + (20 if i == 10 else 0)) for i in range(11)]


def rising_vllm_window() -> list[Snapshot]:
    """The same, scraped once a second."""
    return window(*rising_vllm_texts())
