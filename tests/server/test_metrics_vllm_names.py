"""/metrics under vLLM's own names (`vllm:`), against vLLM 0.32.0's own page
(tests/fixtures/vllm-0.32.0/metrics_*.txt): every family we claim is there with vLLM's
type, label names, enumerated label values and buckets; each copy agrees with its
`stepserve:` original on the same page; the series only vLLM had count what the
requests did; `--no-vllm-metric-names` takes them away; and the queries of vLLM's
example Grafana dashboard and of the Gateway API endpoint picker are answered."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from server_harness import MODEL, make_engine, serve

from stepserve.cluster.metrics_merge import merge_metrics
from stepserve.config.settings import SchedulerConfig
from stepserve.core.end_reasons import AS_VLLM_FINISHED, FinishReason, RejectReason
from stepserve.core.request import Request, SamplingParams
from stepserve.server.metrics import ServerMetrics
from stepserve.server.vllm_metrics import COPIES, VllmMetrics

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0"
VLLM_PAGES = ("metrics_idle.txt", "metrics_load_6.txt", "metrics_after_load.txt")
VLLM_MAX_MODEL_LEN = 8192  # the captured server's (smollm2's max_position_embeddings)
MAX_MODEL_LEN = 2048
# what vLLM has that we leave out (server/vllm_metrics.py says why)
LEFT_OUT = {"vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
            "vllm:estimated_write_bytes_per_gpu", "vllm:mm_cache_queries",
            "vllm:mm_cache_hits"}
# labels whose values vLLM enumerates: ours must be the same set
ENUMERATED = ("finished_reason", "reason", "source", "sleep_state")
# histograms vLLM buckets 1, 2, 5, 10, ... up to max_model_len
TOKEN_COUNTS = {"vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                "vllm:request_max_num_generation_tokens", "vllm:request_params_max_tokens",
                "vllm:request_prefill_kv_computed_tokens"}


def families(text: str) -> dict[str, Metric]:
    """The page's families by name (the strict parser: a malformed page fails here)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def vllm_reference() -> dict[str, Metric]:
    """vLLM's families over the captured pages, without prometheus_client's *_created."""
    out: dict[str, Metric] = {}
    for page in VLLM_PAGES:
        for name, f in families((FIXTURES / page).read_text()).items():
            if name.startswith("vllm:") and not name.endswith("_created"):
                out.setdefault(name, f)
    return out


def value(fams: dict[str, Metric], sample: str, **labels: str) -> float:
    """The sum of the samples named `sample` that carry `labels`."""
    family = fams[sample.removesuffix("_total").removesuffix("_sum").removesuffix("_count")]
    return sum(s.value for s in family.samples
               if s.name == sample and labels.items() <= s.labels.items())


def label_names(f: Metric) -> set[tuple[str, ...]]:
    return {tuple(sorted(k for k in s.labels if k != "le")) for s in f.samples}


def bucket_bounds(f: Metric) -> list[str]:
    first = next(s.labels for s in f.samples if s.name.endswith("_bucket"))
    same = {k: v for k, v in first.items() if k != "le"}
    return [s.labels["le"] for s in f.samples if s.name.endswith("_bucket")
            and {k: v for k, v in s.labels.items() if k != "le"} == same]


# ---- the requests, through a real server ----

PROMPT = list(range(10, 58))  # 48 ids: a repeat hits 2 full blocks of 16 in the cache
OTHER = list(range(100, 120))
SEQUENCES = (  # (prompt, max_tokens, n) of the completed requests
    (PROMPT, 5, 1), (PROMPT, 5, 1), (OTHER, 3, 1), (list(range(200, 230)), 4, 2))
HOLD_TOKENS = MAX_MODEL_LEN - 64  # a stream this long holds the only slot for seconds


@dataclass
class Pages:
    """/metrics before any request, after the completed ones, while the slot was held and
    the queue full, and at the end."""

    before: str
    completed: str
    during: str
    after: str
    stop_tokens: int  # what the request that ended with "stop" generated
    held_aborted: int


def completion(client: httpx.Client, url: str, **body) -> dict:
    r = client.post(url + "/v1/completions", json={"model": MODEL, "temperature": 0.0,
                                                   "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


async def hold_the_slot(url: str, served) -> str:
    """One stream takes the only slot; two more requests wait (max_waiting 2); a third is
    refused (429). Returns the page scraped then."""
    async with httpx.AsyncClient(timeout=120) as client:
        body = {"model": MODEL, "prompt": OTHER, "max_tokens": HOLD_TOKENS, "stream": True,
                "ignore_eos": True, "temperature": 0.0}
        async with client.stream("POST", url + "/v1/completions", json=body) as held:
            lines = held.aiter_lines()
            while not (await anext(lines)).startswith("data: "):
                pass  # its first token is out: it runs
            short = {**body, "stream": False, "max_tokens": 2}
            waiting = [asyncio.ensure_future(client.post(url + "/v1/completions", json=short))
                       for _ in range(2)]
            while served.metric("stepserve:num_requests_waiting") < 2:
                await asyncio.sleep(0.01)
            refused = await client.post(url + "/v1/completions", json=short)
            page = (await client.get(url + "/metrics")).text
        # leaving the block closed the held stream: the server aborts it
        answers = await asyncio.gather(*waiting)
    assert [r.status_code for r in answers] == [200, 200]
    assert refused.status_code == 429, refused.text
    return page


@pytest.fixture(scope="module")
def pages() -> Pages:
    engine = make_engine(max_num_seqs=1, max_waiting=2, max_model_len=MAX_MODEL_LEN)
    with serve(engine) as s, httpx.Client(timeout=120) as client:
        before = httpx.get(s.url + "/metrics").text
        for prompt, max_tokens, n in SEQUENCES:
            completion(client, s.url, prompt=prompt, max_tokens=max_tokens, n=n,
                       **({"temperature": 1.0, "seed": 7} if n > 1 else {}))
        # a stop string greedy decoding is sure to write: a letter of its own 3 tokens
        text = completion(client, s.url, prompt=OTHER, max_tokens=3)["choices"][0]["text"]
        letters = [c for c in text if c.isalnum()]
        assert letters, f"nothing to stop on in {text!r}"
        out = completion(client, s.url, prompt=OTHER, max_tokens=8, stop=[letters[0]])
        assert out["choices"][0]["finish_reason"] == "stop"
        s.wait_idle()
        completed = httpx.get(s.url + "/metrics").text
        during = asyncio.run(hold_the_slot(s.url, s))
        s.wait_idle()
        after = httpx.get(s.url + "/metrics").text
        aborted = s.metric("stepserve:request_success_total", finished_reason="abort")
    return Pages(before, completed, during, after, out["usage"]["completion_tokens"],
                 int(aborted))


# ---- vLLM's families, as vLLM has them ----

def test_every_vllm_family_we_claim_is_there_as_vllm_has_it(pages):
    reference = vllm_reference()
    assert set(reference) - LEFT_OUT, "no vLLM family read from the fixtures"
    for page in (pages.before, pages.during, pages.after):
        ours = {n: f for n, f in families(page).items() if n.startswith("vllm:")}
        assert set(ours) == set(reference) - LEFT_OUT
        for name, theirs in reference.items():
            if name in LEFT_OUT:
                continue
            mine = ours[name]
            assert mine.type == theirs.type, name
            assert label_names(mine) == label_names(theirs), name
            for label in ENUMERATED:
                want = {s.labels[label] for s in theirs.samples if label in s.labels}
                assert {s.labels[label] for s in mine.samples if label in s.labels} == want, \
                    (name, label)
            if theirs.type == "histogram":
                want = bucket_bounds(theirs)
                if name in TOKEN_COUNTS:  # vLLM's rule, up to our max_model_len
                    assert MAX_MODEL_LEN <= VLLM_MAX_MODEL_LEN
                    want = [b for b in want if b == "+Inf" or float(b) <= MAX_MODEL_LEN]
                assert bucket_bounds(mine) == want, name


def test_cache_config_info_says_what_the_engine_is(pages):
    fams = families(pages.after)
    (vllm,) = fams["vllm:cache_config_info"].samples
    (ours,) = fams["stepserve:cache_config_info"].samples
    labels = vllm.labels
    for name in ("block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching"):
        assert labels[name] == ours.labels[name], name
    block_size, blocks = int(labels["block_size"]), int(labels["num_gpu_blocks"])
    assert int(labels["kv_cache_size_tokens"]) == blocks * block_size
    assert float(labels["kv_cache_max_concurrency"]) == blocks / math.ceil(
        MAX_MODEL_LEN / block_size)
    assert labels["num_gpu_blocks_override"] == str(blocks)  # the harness configures it
    assert labels["prefix_caching_hash_algo"] == "builtin"  # the engine's default
    assert (labels["cache_dtype"], labels["sliding_window"]) == ("auto", "None")


# ---- the copies agree with ours ----

def test_each_copy_agrees_with_its_original_on_the_same_page(pages):
    for page in (pages.during, pages.after):
        fams = families(page)
        for c in COPIES:
            ours, theirs = fams["stepserve:" + c.ours], fams["vllm:" + c.name]
            mine = {(s.name.removeprefix("stepserve:"), frozenset(s.labels.items())): s.value
                    for s in ours.samples}
            copied = {(s.name.removeprefix("vllm:"), frozenset(s.labels.items())): s.value
                      for s in theirs.samples}
            assert copied and copied.items() <= mine.items(), c.name  # kept buckets alike
            assert all(k[0].endswith("_bucket") for k in mine.keys() - copied.keys()), c.name
        assert value(fams, "vllm:num_requests_waiting") == (
            value(fams, "stepserve:num_requests_waiting")
            + value(fams, "stepserve:num_requests_swapped"))
        assert value(fams, "vllm:num_requests_waiting_by_reason", reason="capacity") == \
            value(fams, "vllm:num_requests_waiting")
    during = families(pages.during)
    assert value(during, "vllm:num_requests_waiting") == 2
    assert value(during, "vllm:num_requests_running") == 1


def test_request_success_in_vllms_finish_reasons(pages):
    fams = families(pages.after)
    for reason in ("stop", "length", "abort", "error", "repetition"):
        ours = sum(value(fams, "stepserve:request_success_total", finished_reason=r)
                   for r, theirs in AS_VLLM_FINISHED.items() if theirs == reason)
        assert value(fams, "vllm:request_success_total", finished_reason=reason) == ours
    assert value(fams, "vllm:request_success_total", finished_reason="stop") >= 1
    assert value(fams, "vllm:request_success_total", finished_reason="abort") == \
        pages.held_aborted == 1


def test_a_full_queue_is_vllms_max_num_queued_reqs(pages):
    fams = families(pages.after)
    refused = value(fams, "stepserve:request_rejected_total",
                    reason=RejectReason.QUEUE_FULL.value)
    assert refused == 1 == value(fams, "vllm:admission_rejections_total",
                                 reason="max_num_queued_reqs")
    assert value(fams, "vllm:admission_rejections_total", reason="max_num_queued_tokens") == 0


# ---- the series only vLLM had ----

def test_the_vllm_only_series_count_the_completed_requests(pages):
    before, after = families(pages.before), families(pages.completed)

    def delta(sample: str, **labels: str) -> float:
        return value(after, sample, **labels) - value(before, sample, **labels)

    requests = len(SEQUENCES) + 2  # and the one whose text gave the stop string
    sequences = sum(n for *_, n in SEQUENCES) + 2
    max_tokens = [m for _, m, n in SEQUENCES for _ in range(n)] + [3, 8]
    assert delta("vllm:request_params_n_count") == requests
    assert delta("vllm:request_params_n_sum") == sequences
    assert delta("vllm:request_params_max_tokens_count") == sequences
    assert delta("vllm:request_params_max_tokens_sum") == sum(max_tokens)
    # ignore_eos: each sequence wrote its max_tokens, but the one that stopped
    most = [m for _, m, _ in SEQUENCES] + [3, pages.stop_tokens]
    assert delta("vllm:request_max_num_generation_tokens_count") == requests
    assert delta("vllm:request_max_num_generation_tokens_sum") == sum(most)
    assert delta("vllm:request_num_preemptions_count") == sequences
    assert delta("vllm:request_num_preemptions_sum") == delta("vllm:num_preemptions_total")
    hits = delta("vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    assert hits > 0  # the repeated prompt
    assert hits == delta("vllm:prompt_tokens_cached_total") == \
        delta("vllm:prompt_tokens_cached_by_source_total", source="device") == \
        delta("stepserve:prefix_cache_hits_total")
    assert delta("vllm:prompt_tokens_by_source_total", source="local_compute") + hits == \
        delta("stepserve:prompt_tokens_total")
    assert delta("vllm:request_prefill_kv_computed_tokens_count") == sequences
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == \
        delta("stepserve:request_prompt_tokens_sum") - hits
    fams = families(pages.after)
    assert value(fams, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert value(fams, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    assert value(fams, "vllm:external_prefix_cache_hits_total") == 0


def _ended(req_id: str, reason: FinishReason, preemptions: int = 0) -> Request:
    req = Request(req_id, [1, 2, 3], SamplingParams(max_tokens=2), arrival_time=0.0)
    req.output_token_ids = [4, 5]
    req.first_scheduled_time, req.token_times, req.finish_time = 0.1, [0.2, 0.3], 0.3
    req.finish_reason, req.num_preemptions = reason, preemptions
    return req


def test_a_queue_timeout_is_vllms_abort_and_preemptions_are_counted_per_request():
    m = ServerMetrics("m", SchedulerConfig())
    m.on_finished(_ended("a", FinishReason.TIMED_OUT))
    m.on_finished(_ended("b", FinishReason.ABORT))
    m.on_finished(_ended("c", FinishReason.LENGTH, preemptions=3))
    fams = families(m.render().decode())
    assert value(fams, "vllm:request_success_total", finished_reason="abort") == 2
    assert value(fams, "vllm:request_num_preemptions_sum") == 3
    assert value(fams, "vllm:request_num_preemptions_count") == 1  # completed ones only


def test_vllms_buckets_must_be_a_subset_of_ours():
    ours = {c.ours: c.buckets or (1.0,) for c in COPIES}
    ours["inter_token_latency_seconds"] = (0.001, 0.01)  # lacks most of vLLM's
    with pytest.raises(ValueError, match="inter_token_latency_seconds"):
        VllmMetrics(["model_name", "engine"], ["m", "0"], (1.0,), ours)


# ---- the flag ----

def test_without_vllm_names_the_page_is_ours_alone(pages):
    with serve(make_engine(), vllm_metric_names=False) as s:
        page = families(httpx.get(s.url + "/metrics").text)
    assert not [n for n in page if n.startswith("vllm:")]
    assert {n for n in page if n.startswith("stepserve:")} == \
        {n for n in families(pages.before) if n.startswith("stepserve:")}


def test_serve_flag_and_config_key_reach_the_app(monkeypatch, tmp_path):
    from stepserve.cli import build_parser
    from stepserve.cli import serve as serve_cli
    from stepserve.cli.parser import options_from
    from stepserve.cluster.job import ClusterServeOptions

    seen = []
    monkeypatch.setattr(serve_cli, "run_serve", lambda o: seen.append(o) or 0)
    config = tmp_path / "serve.yaml"
    config.write_text("no-vllm-metric-names: true\n")
    for argv in (["serve"], ["serve", "--no-vllm-metric-names"],
                 ["serve", "--config", str(config)]):
        args = build_parser().parse_args(argv)
        assert args.func(args) == 0
    assert [o.vllm_metric_names for o in seen] == [True, False, False]
    assert options_from(ClusterServeOptions, seen[1]).vllm_metric_names is False


# ---- a cluster's merged page ----

@pytest.mark.parametrize("vllm_names", [True, False])
def test_the_cluster_merge_keeps_both_name_sets(vllm_names):
    replicas = [ServerMetrics("m", SchedulerConfig(), engine=str(i), vllm_names=vllm_names)
                for i in range(2)]
    merged = families(merge_metrics([(i, "p", m.render().decode())
                                     for i, m in enumerate(replicas)]))
    running = merged["vllm:num_requests_running" if vllm_names
                     else "stepserve:num_requests_running"]
    assert sorted(s.labels["engine"] for s in running.samples) == ["0", "1"]
    assert any(n.startswith("vllm:") for n in merged) is vllm_names


# ---- what dashboards and the endpoint picker read ----

GRAFANA = "vllm-project/vllm examples/observability/prometheus_grafana/grafana.json"
EPP = ("kubernetes-sigs/gateway-api-inference-extension "
       "pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go (vLLM's "
       "defaults; at 1748e829, before the endpoint picker left that repository)")


@dataclass(frozen=True)
class Query:
    """A family a consumer reads: its type, the labels its queries select or group by
    (`le`: it reads the buckets), and who reads it."""

    name: str
    type: str
    labels: tuple[str, ...]
    source: str


QUERIES = (
    Query("vllm:e2e_request_latency_seconds", "histogram", ("model_name", "le"), GRAFANA),
    Query("vllm:time_to_first_token_seconds", "histogram", ("model_name", "le"), GRAFANA),
    Query("vllm:inter_token_latency_seconds", "histogram", ("model_name", "le"), GRAFANA),
    Query("vllm:request_prompt_tokens", "histogram", ("model_name", "le"), GRAFANA),
    Query("vllm:request_generation_tokens", "histogram", ("model_name", "le"), GRAFANA),
    Query("vllm:request_queue_time_seconds", "histogram", ("model_name",), GRAFANA),
    Query("vllm:request_prefill_time_seconds", "histogram", ("model_name",), GRAFANA),
    Query("vllm:request_decode_time_seconds", "histogram", ("model_name",), GRAFANA),
    Query("vllm:request_max_num_generation_tokens", "histogram", ("model_name",), GRAFANA),
    Query("vllm:prompt_tokens", "counter", ("model_name",), GRAFANA),
    Query("vllm:generation_tokens", "counter", ("model_name",), GRAFANA),
    Query("vllm:request_success", "counter", ("model_name", "finished_reason"), GRAFANA),
    Query("vllm:num_requests_running", "gauge", ("model_name",), f"{GRAFANA}; {EPP}"),
    Query("vllm:num_requests_waiting", "gauge", ("model_name",), f"{GRAFANA}; {EPP}"),
    Query("vllm:kv_cache_usage_perc", "gauge", ("model_name",), f"{GRAFANA}; {EPP}"),
    Query("vllm:cache_config_info", "gauge", ("block_size", "num_gpu_blocks"), EPP),
)
# Not answered: vllm:lora_requests_info (gauge; max_lora, running_lora_adapters,
# waiting_lora_adapters; EPP's LoRA affinity): we serve no LoRA adapters, and vLLM
# itself has no such series without them.
UNANSWERED = ("vllm:lora_requests_info",)


def test_the_dashboard_and_endpoint_picker_queries_are_answered(pages):
    fams = families(pages.after)
    for q in QUERIES:
        assert q.name in fams, (q.name, q.source)
        f = fams[q.name]
        assert f.type == q.type, q.name
        read = [s for s in f.samples if "le" not in q.labels or s.name.endswith("_bucket")]
        assert read and all(set(q.labels) <= s.labels.keys() for s in read), q.name
        if q.type == "histogram":  # rate(_sum) / rate(_count)
            assert {s.name for s in f.samples} >= {q.name + "_sum", q.name + "_count"}
        assert all(s.labels.get("model_name", MODEL) == MODEL for s in f.samples)
    (info,) = fams["vllm:cache_config_info"].samples  # the picker reads them as ints
    assert int(info.labels["block_size"]) > 0 and int(info.labels["num_gpu_blocks"]) > 0
    assert not set(UNANSWERED) & set(fams)

