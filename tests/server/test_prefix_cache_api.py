"""Prefix caching as a client and an operator see it, through a real server and the
official openai client: `usage.prompt_tokens_details.cached_tokens` (plain, streamed, chat,
n > 1; with --enable-prompt-tokens-details, as vLLM: null without it), the `cache_salt` field, the prefix cache counters that move by exactly what usage
reports, `cache_config_info` labelled with the flags, and bad salts refused by name."""

from __future__ import annotations

import httpx
import pytest
from server_harness import MODEL, serve, serve_process

from stepserve.core.request import SamplingParams
from stepserve.core.request_limits import CACHE_SALT_MAX_CHARS

BLOCK = 16  # the default block size
PREFIX_BLOCKS = 4


def prefix(tag: int) -> list[int]:
    """A 64-token prefix no other test shares (its first token differs, so every block's
    name differs)."""
    return [300 + tag] + [(7 * i + tag) % 250 + 20 for i in range(PREFIX_BLOCKS * BLOCK - 1)]


def tail(k: int) -> list[int]:
    return [280 + k, 11, 12, 13, 14]


@pytest.fixture(scope="module")
def served():
    with serve(enable_prompt_tokens_details=True) as s:
        yield s


def test_without_the_flag_usage_has_no_details_as_vllms():
    with serve() as plain:
        resp = plain.client().completions.create(model=MODEL, prompt=prefix(7), max_tokens=2)
        assert resp.usage.prompt_tokens_details is None
        body = {"model": MODEL, "prompt": prefix(7), "max_tokens": 2}
        usage = httpx.post(plain.url + "/v1/completions", json=body, timeout=60).json()["usage"]
        assert usage["prompt_tokens_details"] is None and usage["completion_tokens_details"] is None


def complete(served, ids: list[int], **extra):
    return served.client().completions.create(model=MODEL, prompt=ids, max_tokens=3,
                                              temperature=0.0, extra_body=extra or None)


def cached(resp) -> int:
    return resp.usage.prompt_tokens_details.cached_tokens


def counters(served) -> tuple[float, float]:
    m = served.metrics()
    return m["stepserve:prefix_cache_queries_total"], m["stepserve:prefix_cache_hits_total"]


def test_a_shared_prefix_is_reported_cached_and_counted(served):
    first = complete(served, prefix(1) + tail(0))
    assert cached(first) == 0  # nothing before it shared its blocks
    queries, hits = counters(served)
    second = complete(served, prefix(1) + tail(1))
    # the prefix's full blocks, and not the 5-token tail's partial one
    assert cached(second) == PREFIX_BLOCKS * BLOCK
    assert cached(second) % BLOCK == 0
    after = counters(served)
    assert after == (queries + second.usage.prompt_tokens, hits + cached(second))


def test_streamed_usage_carries_cached_tokens(served):
    complete(served, prefix(2) + tail(0))
    chunks = list(served.client().completions.create(
        model=MODEL, prompt=prefix(2) + tail(1), max_tokens=3, temperature=0.0, stream=True,
        stream_options={"include_usage": True}))
    assert not chunks[-1].choices
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == PREFIX_BLOCKS * BLOCK
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_with_a_shared_system_prompt(served):
    system = {"role": "system", "content": "You answer in one word. " * 12}
    client = served.client()

    def ask(question: str, **kw):
        return client.chat.completions.create(
            model=MODEL, messages=[system, {"role": "user", "content": question}],
            max_tokens=2, temperature=0.0, **kw)

    first = ask("Name a colour.")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = ask("Name a fruit.")
    got = second.usage.prompt_tokens_details.cached_tokens
    assert got > 0 and got % BLOCK == 0 and got < second.usage.prompt_tokens
    chunks = list(ask("Name a tree.", stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == got


def test_every_usage_has_the_details_even_when_nothing_was_cached(served):
    body = {"model": MODEL, "prompt": prefix(3) + tail(0), "max_tokens": 2}
    usage = httpx.post(served.url + "/v1/completions", json=body, timeout=60).json()["usage"]
    # vLLM's three fields, its two others null here
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": None,
                                              "multimodal_tokens": None}


def test_cache_salt_separates_namespaces(served):
    ids = prefix(4)
    assert cached(complete(served, ids + tail(0))) == 0
    # the same prefix under a salt: another chain, nothing shared with the unsalted one
    assert cached(complete(served, ids + tail(1), cache_salt="tenant-a")) == 0
    assert cached(complete(served, ids + tail(2), cache_salt="tenant-a")) == 64
    assert cached(complete(served, ids + tail(3), cache_salt="tenant-b")) == 0
    assert cached(complete(served, ids + tail(4))) == 64


def test_n_counts_the_prompts_cached_tokens_once(served):
    # cold: the siblings computed the prefix for this very request, which is no hit
    client = served.client()
    cold = client.completions.create(model=MODEL, prompt=prefix(5) + tail(0), max_tokens=3,
                                     n=2, temperature=1.0, seed=1)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    warm = client.completions.create(model=MODEL, prompt=prefix(5) + tail(1), max_tokens=3,
                                     n=3, temperature=1.0, seed=2)
    assert len(warm.choices) == 3
    assert warm.usage.prompt_tokens_details.cached_tokens == 64  # not 3 x 64


def test_cache_config_info_by_default(served):
    (labels,) = [dict(ls) for (name, ls) in served.samples()
                 if name == "stepserve:cache_config_info"]
    assert {k: labels[k] for k in ("block_size", "num_gpu_blocks", "num_cpu_blocks",
                                   "enable_prefix_caching")} == \
        {"block_size": "16", "num_gpu_blocks": "512", "num_cpu_blocks": "0",
         "enable_prefix_caching": "True"}
    assert labels["model_name"] == MODEL and labels["engine"] == "0"
    assert served.metric("stepserve:cache_config_info") == 1


@pytest.mark.parametrize("salt, why", [
    (123, "string"), (["a"], "string"), ("", "at least 1"),
    ("x" * (CACHE_SALT_MAX_CHARS + 1), f"at most {CACHE_SALT_MAX_CHARS}")])
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_bad_cache_salt_is_a_400_naming_the_field(served, salt, why, endpoint):
    body = {"model": MODEL, "max_tokens": 2, "cache_salt": salt}
    if endpoint == "completions":
        body["prompt"] = "hello"
    else:
        body["messages"] = [{"role": "user", "content": "hello"}]
    r = httpx.post(f"{served.url}/v1/{endpoint}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "cache_salt"
    assert why in error["message"]


def test_flags_switch_caching_off_and_label_the_info_series():
    with serve_process("--no-enable-prefix-caching", "--block-size", "8",
                       "--num-cpu-blocks", "16", "--enable-prompt-tokens-details") as server:
        client = httpx.Client(base_url=server.url, timeout=60)
        body = {"model": MODEL, "prompt": prefix(6) + tail(0), "max_tokens": 2}
        for k in range(2):
            body["prompt"] = prefix(6) + tail(k)
            usage = client.post("/v1/completions", json=body).json()["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        m = server.metrics()
        assert m["stepserve:prefix_cache_queries_total"] == 0  # no request looked it up
        assert m["stepserve:prefix_cache_hits_total"] == 0
        (labels,) = [dict(ls) for (name, ls) in server.samples()
                     if name == "stepserve:cache_config_info"]
        assert (labels["block_size"], labels["num_gpu_blocks"], labels["num_cpu_blocks"],
                labels["enable_prefix_caching"]) == ("8", "512", "16", "False")


def test_offline_generate_takes_cache_salt_on_the_prompt_dict(offline_llm):
    kv = offline_llm.scheduler.kv
    params = SamplingParams(max_tokens=2, temperature=0.0)

    def hits_of(prompt: dict) -> int:
        before = kv.prefix_cache_hits
        offline_llm.generate(prompt, params, use_tqdm=False)
        return kv.prefix_cache_hits - before

    ids = prefix(7)
    assert hits_of({"prompt_token_ids": ids + tail(0), "cache_salt": "a"}) == 0
    assert hits_of({"prompt_token_ids": ids + tail(1), "cache_salt": "a"}) == 64
    assert hits_of({"prompt_token_ids": ids + tail(2), "cache_salt": "b"}) == 0
    with pytest.raises(ValueError, match="cache_salt"):
        offline_llm.generate([{"prompt_token_ids": ids}, {"prompt": "x", "cache_salt": 5}],
                             params, use_tqdm=False)
    assert not offline_llm.engine.has_unfinished()  # refused before anything was queued


def test_a_preempted_request_is_counted_once():
    """The counters count a request's first admission only: one preempted (recompute) and
    admitted again looks the cache up again, but usage and the counters keep its first."""
    from server_harness import make_engine

    engine = make_engine(num_gpu_blocks=14, max_model_len=160, max_num_seqs=4)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    reqs = [engine.add_request(prefix(8) + tail(k), params) for k in range(4)]
    engine.run_until_done(lambda result: None)
    assert any(r.num_preemptions for r in reqs)
    kv = engine.scheduler.kv
    assert kv.prefix_cache_queries == sum(r.num_prompt_tokens for r in reqs)
    assert kv.prefix_cache_hits == sum(r.num_cached_tokens for r in reqs) > 0
