"""`stepserve bench`: its flags, `vllm bench serve`'s names and defaults (no
--request-rate: all at once; 1000 prompts; random 1024/128 when no workload is named;
text prompts; a ShareGPT run stops at EOS), plus ours (--sim, --engine, --scenario,
--workload, --duration-s, --warmup, /metrics scrapes, --json/--csv/--markdown)."""

from __future__ import annotations

import argparse
import json
import os

from stepserve.bench.client import (
    RequestShape,
    key_values,
    pick_endpoint,
    request_headers,
    sampling_fields,
)
from stepserve.bench.job import BenchOptions, run_bench
from stepserve.bench.results import SaveOptions, parse_metric_names, parse_percentiles
from stepserve.bench.workload_options import DEFAULT_NUM_PROMPTS, BenchWorkloadOptions
from stepserve.cli.engine_flags import add_config_arguments, config_overrides
from stepserve.cli.parser import add_command, options_from
from stepserve.cli.simulate import (
    add_cost_model_arguments,
    add_trace_arguments,
    cost_model_options,
)
from stepserve.config import limits
from stepserve.config.errors import UsageError
from stepserve.config.limits import LENGTH, Range
from stepserve.workload.builtin import list_workloads

BENCH_FLAGS = {
    "random_input_len": LENGTH, "random_output_len": LENGTH, "sharegpt_output_len": LENGTH,
    "num_prompts": limits.REQUESTS, "seed": limits.SEED, "max_concurrency": limits.CONCURRENCY,
    "request_rate": Range(limits.MIN_RATE, limits.MAX_RATE, float, inf_ok=True),
    "burstiness": Range(limits.MIN_BURSTINESS, limits.MAX_BURSTINESS, float, inf_ok=True),
    "duration_s": limits.SECONDS, "warmup": Range(0, limits.MAX_NUM_REQUESTS),
    "timeout_s": limits.SECONDS, "num_warmups": Range(0, limits.MAX_NUM_REQUESTS),
    "logprobs": Range(0, 20), "metrics_interval_s": Range(0.0, 3600.0, float),  # 0: never scrape
    "step_ms": limits.STEP_MS, "port": Range(1, 65535), "spread_seed": limits.SEED,
    "random_range_ratio": Range(0.0, 1.0 - 1e-9, float),
    **{f"prefix_repetition_{k}": LENGTH for k in ("prefix_len", "suffix_len",
                                                  "num_prefixes", "output_len")},
    # sampling: finite (the server bounds them); top_k -1 is vLLM's "off"
    **{k: Range(-1e6, 1e6, float) for k in ("temperature", "top_p", "min_p",
                                             "frequency_penalty", "presence_penalty",
                                             "repetition_penalty")},
    "top_k": Range(-1, 1 << 31),
}


def add_bench_parser(subparsers) -> None:
    p = add_command(
        subparsers, "bench", lambda args: run_bench(bench_options(args)), BENCH_FLAGS,
        help="load an OpenAI-compatible server (or the engine, or the simulator)",
        description="Send a workload to a server (--base-url/--target URL, or --host and "
                    "--port: streaming /v1/completions or /v1/chat/completions), to the "
                    "in-process engine (--engine) or to the simulator (--sim), and report "
                    "TTFT, TPOT, ITL, E2EL, throughput and goodput with vLLM's definitions.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--target", "--base-url", dest="target", metavar="URL",
                       help="base URL, e.g. http://127.0.0.1:8000 (default: --host, --port)")
    where.add_argument("--engine", action="store_true", help="the real engine, in process")
    where.add_argument("--sim", action="store_true", help="the simulator (virtual clock)")
    p.add_argument("--host", default="127.0.0.1", help="with neither URL nor --engine/--sim")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", help="model name sent to the target (default: the first of "
                   "/v1/models); with --engine the model to load (default: tiny)")
    p.add_argument("--served-model-name", help="the body's model, if not --model")
    p.add_argument("--backend", choices=("openai", "vllm", "openai-chat"),
                   help="openai/vllm: /v1/completions; openai-chat: /v1/chat/completions")
    p.add_argument("--endpoint", help="/v1/completions (default) or /v1/chat/completions")
    p.add_argument("--header", nargs="*", action="extend", metavar="KEY=VALUE",
                   help="headers for every request (repeatable; they win over the key)")
    p.add_argument("--api-key", help="sent as Bearer (default: $OPENAI_API_KEY)")
    w = p.add_argument_group("workload")
    w.add_argument("--scenario", choices=list_workloads(), help="a built-in workload")
    w.add_argument("--workload", metavar="FILE", help="a workload YAML file")
    w.add_argument("--dataset-name", metavar="NAME",
                   help="random (the default: --random-input-len 1024, --random-output-len "
                        "128), sharegpt (with --dataset-path), prefix_repetition or "
                        "mooncake (with --dataset-path: a Mooncake trace, sent at its "
                        "times)")
    w.add_argument("--dataset-path", "--sharegpt", dest="sharegpt", metavar="FILE",
                   help="a ShareGPT-style JSON file: (prompt, output) lengths; or a "
                        "Mooncake trace")
    add_trace_arguments(w, with_format=False)
    w.add_argument("--random-input-len", type=int, metavar="N", help="prompt length")
    w.add_argument("--random-output-len", type=int, metavar="M", help="output length")
    w.add_argument("--random-range-ratio", type=float, metavar="R",
                   help="lengths uniform in [n(1-R), n(1+R)] (default 0: fixed)")
    w.add_argument("--input-len", type=int, help="as --random-input-len")
    w.add_argument("--output-len", type=int,
                   help="as --random-output-len, or --sharegpt-output-len with a ShareGPT file")
    w.add_argument("--tokenizer", metavar="MODEL",
                   help="a stepserve model name or a local HF directory: count ShareGPT "
                        "tokens with it, and send text prompts of exact token length")
    w.add_argument("--sharegpt-output-len", type=int, metavar="M",
                   help="with a ShareGPT file: every output this long instead of the answer's")
    # vLLM's prefix_repetition dataset: each prompt one of a few shared prefixes, then its
    # own tokens
    for name, default, what in (("prefix-len", 256, "tokens of each shared prefix"),
                                ("suffix-len", 256, "tokens of each prompt's own part"),
                                ("num-prefixes", 10, "distinct prefixes, dealt out evenly"),
                                ("output-len", 128, "output tokens")):
        w.add_argument(f"--prefix-repetition-{name}", type=int, metavar="N",
                       help=f"with --dataset-name prefix_repetition: {what} "
                            f"(default {default})")
    w.add_argument("--num-prompts", type=int, metavar="K",
                   help="requests to send, warm-up included (default 1000; a scenario or "
                        "workload file: its own)")
    w.add_argument("--seed", type=int, help="workload seed (default 0)")
    w.add_argument("--request-rate", type=float, metavar="R",
                   help="req/s, Poisson (default inf: all at once; a scenario or workload "
                        "file keeps its own arrivals)")
    w.add_argument("--burstiness", type=float, metavar="B",
                   help="gamma arrivals with this shape (1 = Poisson, below 1 burstier, "
                        "inf = constant rate)")
    w.add_argument("--max-concurrency", type=int, metavar="N",
                   help="at most N requests in flight (with rate inf: a closed loop)")
    w.add_argument("--duration-s", type=float, help="stop sending after this many seconds")
    w.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="the first N requests are sent but excluded from the metrics")
    w.add_argument("--num-warmups", type=int, metavar="N",
                   help="as vLLM: N more requests first, excluded (--num-prompts are measured)")
    w.add_argument("--token-id-prompts", action="store_true",
                   help="send token-id lists instead of text (/v1/completions only)")
    w.add_argument("--text-prompts", action="store_true", help=argparse.SUPPRESS)  # old
    eos = w.add_mutually_exclusive_group()
    eos.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=None,
                     help="run every output to its length (default with random lengths, "
                          "scenarios and workload files; not with ShareGPT, as vLLM)")
    eos.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                     help="let the model stop at EOS whatever the dataset")
    g = p.add_argument_group("sampling (sent in every body)")
    for name, kind in (("temperature", float), ("top-p", float), ("top-k", int),
                       ("min-p", float), ("frequency-penalty", float),
                       ("presence-penalty", float), ("repetition-penalty", float)):
        g.add_argument(f"--{name}", type=kind,
                       help="default 0.0 (greedy) with --workload or --scenario; with "
                            "vLLM's dataset flags none, as vLLM 0.32's bench (the "
                            "server's own)" if name == "temperature" else
                       "sent when given (default: none: the server's own)")
    g.add_argument("--logprobs", type=int, metavar="N", help="logprobs per token (completions)")
    g.add_argument("--extra-body", metavar="JSON", help="more body fields, as a JSON object")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM's command lines; nothing here runs remote code")
    o = p.add_argument_group("output")
    o.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLOs in ms, e.g. ttft:500 tpot:50 e2el:3000")
    o.add_argument("--percentile-metrics", metavar="LIST",
                   help="of ttft,tpot,itl,e2el (default ttft,tpot,itl), for --save-result")
    o.add_argument("--metric-percentiles", metavar="LIST",
                   help="e.g. 25,50,99 (default 99), for --save-result")
    o.add_argument("--save-result", action="store_true",
                   help="write vLLM's flat result JSON (its keys, ms)")
    o.add_argument("--save-detailed", action="store_true",
                   help="with it the per-request lists (ttfts, itls, texts, errors)")
    o.add_argument("--result-dir", metavar="DIR", help="where (default: here)")
    o.add_argument("--result-filename", metavar="NAME",
                   help="default {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json")
    o.add_argument("--label", help="the result's label (default: the backend)")
    o.add_argument("--metadata", nargs="*", action="extend", metavar="KEY=VALUE",
                   help="more keys for the --save-result file")
    o.add_argument("--metrics-interval-s", type=float, default=0.5,
                   help="how often to scrape the target's /metrics (0: never)")
    o.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout")
    o.add_argument("--json", dest="json_out", metavar="OUT", help="write our result as JSON")
    o.add_argument("--csv", dest="csv_out", metavar="OUT", help="write one row per request")
    o.add_argument("--markdown", dest="markdown_out", metavar="OUT",
                   help="write the summary table as Markdown")
    o.add_argument("--no-progress", "--disable-tqdm", dest="no_progress",
                   action="store_true", help="no progress bar")
    s = p.add_argument_group("--engine / --sim")
    s.add_argument("--config", help="engine config YAML")
    add_cost_model_arguments(s)
    add_config_arguments(p)


def _extra_body(text: str | None) -> dict:
    if text is None:
        return {}
    try:
        body = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--extra-body: not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise UsageError("--extra-body: expected a JSON object, e.g. '{\"min_tokens\": 4}'")
    return body


def request_shape(args: argparse.Namespace) -> RequestShape:
    key = args.api_key if args.api_key is not None else os.environ.get("OPENAI_API_KEY")
    extra = _extra_body(args.extra_body)
    if args.logprobs is not None:
        extra = {"logprobs": args.logprobs, **extra}
    return RequestShape(
        endpoint=pick_endpoint(args.backend, args.endpoint),
        sampling=sampling_fields(vars(args), greedy=bool(args.scenario or args.workload)),
        extra_body=extra,
        headers=request_headers(key, key_values("--header", args.header)),
        served_model_name=args.served_model_name)


def workload_options(args: argparse.Namespace) -> BenchWorkloadOptions:
    """The workload flags; vLLM's general --input-len/--output-len mapped onto the
    dataset's own."""
    input_len = args.input_len if args.input_len is not None else args.random_input_len
    output_len, sharegpt_output_len = args.random_output_len, args.sharegpt_output_len
    if args.output_len is not None:
        if args.sharegpt:
            sharegpt_output_len = args.output_len
        else:
            output_len = args.output_len
    num_prompts, warmup = args.num_prompts, args.warmup
    if args.num_warmups:  # vLLM's warm-ups come on top of the measured prompts
        if warmup:
            raise UsageError("give --warmup N (the first N of --num-prompts) or "
                             "--num-warmups N (N more), not both")
        if num_prompts is None and (args.scenario or args.workload):
            raise UsageError("--num-warmups with a scenario or workload file needs "
                             "--num-prompts")
        num_prompts = (num_prompts or DEFAULT_NUM_PROMPTS) + args.num_warmups
        warmup = args.num_warmups
    return options_from(BenchWorkloadOptions, args, random_input_len=input_len,
                        random_output_len=output_len, sharegpt_output_len=sharegpt_output_len,
                        num_prompts=num_prompts, warmup=warmup)


def bench_options(args: argparse.Namespace) -> BenchOptions:
    target = args.target
    if target is None and not (args.engine or args.sim):
        target = f"http://{args.host}:{args.port}"  # vLLM's default target
    save = SaveOptions(
        save=args.save_result, detailed=args.save_detailed, result_dir=args.result_dir,
        result_filename=args.result_filename, label=args.label,
        metadata=key_values("--metadata", args.metadata),
        percentile_metrics=parse_metric_names(args.percentile_metrics),
        metric_percentiles=parse_percentiles(args.metric_percentiles))
    return options_from(
        BenchOptions, args, target=target, workload=workload_options(args),
        shape=request_shape(args), backend=args.backend or "openai",
        goodput=tuple(args.goodput) if args.goodput is not None else None,
        progress=not args.no_progress, config=config_overrides(args),
        cost=cost_model_options(args), save=save)
