"""Every flag of `vllm serve` (vLLM 0.32), so that a vLLM command line starts
`stepserve serve` unchanged; each flag is one of three kinds:

* applies: it sets one of our settings, and is defined where that setting lives
  (serve.py, engine_flags.py, a config field); it is only listed here;
* no effect: parsed, and when given, one warning line says what stepserve does instead;
* some values: the values that mean what stepserve does are taken silently; any other is
  refused, one line and exit 2, with the reason.

A flag is written as vLLM's help writes it (`--tensor-parallel-size N, -tp N`,
`--enforce-eager, --no-enforce-eager`, `--api-key KEY [KEY ...]`, `--hf-token [TOKEN]`):
the usage gives its names and how many values it takes. `add_vllm_serve_flags` adds the
flags of the other two kinds to a command (engine_flags.add_config_arguments calls it),
and `check_vllm_flags` reads them once parsed (parser.add_command's wrapper calls it).
A vLLM-style `--config` file's keys reach them too (parser.config_file_flags turns the
keys into these flags). tests/test_vllm_serve_flags.py holds the table against vLLM's
own `serve --help=all`.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from enum import Enum

from stepserve.config.errors import UsageError


class Kind(Enum):
    APPLIES = "applies"
    NO_EFFECT = "no effect"
    SOME_VALUES = "some values"


@dataclass(frozen=True)
class Usage:
    """A flag as its help writes it: its names and how many values it takes."""

    names: tuple[str, ...]
    arity: str  # "switch" (--x), "pair" (--x / --no-x), "value", "values" (1+), "optional"

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


_NAME = re.compile(r"(?:^|, )(--?[A-Za-z0-9][\w.-]*)")


def parse_usage(text: str) -> Usage:
    """`--tensor-parallel-size N, -tp N` as a Usage. What follows the first name tells
    the arity: nothing (a switch; a pair when a `--no-` name follows), `[X]` in capitals
    (an optional value), `X [X ...]` (one or more), anything else one value (a metavar,
    `{a,b}`, or `['a', 'b']`)."""
    names = tuple(_NAME.findall(text))
    if not names:
        raise ValueError(f"not a flag's usage: {text!r}")
    metavar = text[len(names[0]):].split(", -")[0].strip()
    if not metavar:
        arity = "pair" if any(n.startswith("--no-") for n in names) else "switch"
    elif re.fullmatch(r"\[[A-Z0-9_]+\]", metavar):
        arity = "optional"
    elif metavar.endswith("...]"):
        arity = "values"
    else:
        arity = "value"
    return Usage(names, arity)


@dataclass(frozen=True)
class VllmFlag:
    usage: Usage
    kind: Kind
    # applies: where it acts; no effect: what stepserve does instead; some values: why
    # the other values are refused
    reason: str
    # values taken silently (no effect: what we do anyway; some values: all it takes);
    # a switch's values are "true" and "false"
    takes: tuple[str, ...] = ()


def _group(kind: Kind, reason: str, *usages: str, takes: tuple[str, ...] = ()
           ) -> list[VllmFlag]:
    return [VllmFlag(parse_usage(u), kind, reason, takes) for u in usages]


def _applies(where: str, *usages: str) -> list[VllmFlag]:
    return _group(Kind.APPLIES, where, *usages)


def _no_effect(reason: str, *usages: str, takes: tuple[str, ...] = ()) -> list[VllmFlag]:
    return _group(Kind.NO_EFFECT, reason, *usages, takes=takes)


def _only(takes: tuple[str, ...], reason: str, *usages: str) -> list[VllmFlag]:
    return _group(Kind.SOME_VALUES, reason, *usages, takes=takes)


OFF = ("false",)  # a switch refused when on
NOT_GIVEN = ()  # refused whenever given

TABLE: tuple[VllmFlag, ...] = (
    # ---- applies ----
    *_applies("the command's help", "-h, --help"),
    *_applies("serve.py: the model, its names, the process", "--model MODEL",
              "--served-model-name NAME [NAME ...]", "--config FILE", "--host HOST",
              "--port PORT", "--seed SEED", "--shutdown-timeout S", "--uvicorn-log-level L",
              "--log-level L", "--api-key KEY [KEY ...]",
              "--disable-uvicorn-access-log, --no-disable-uvicorn-access-log"),
    *_applies("serve.py: what the model folder holds and how requests are answered",
              "--tokenizer DIR", "--revision R", "--tokenizer-revision R",
              "--chat-template T", "--generation-config G", "--override-generation-config JSON",
              "--max-logprobs N",
              "--enable-prompt-tokens-details, --no-enable-prompt-tokens-details",
              "--fingerprint-mode {custom,full,hash,none}", "--fingerprint-value V"),
    *_applies("engine_flags.py: the weights (model/modes.py)", "--dtype D",
              "--quantization Q, -q Q"),
    *_applies("the engine settings (config/settings.py)", "--max-model-len N",
              "--max-num-seqs N", "--max-num-batched-tokens N", "--long-prefill-token-threshold N",
              "--enable-chunked-prefill, --no-enable-chunked-prefill", "--scheduling-policy P",
              "--watermark W", "--block-size N", "--num-gpu-blocks-override N",
              "--kv-cache-memory-bytes B", "--gpu-memory-utilization U, --device-memory-utilization U",
              "--enable-prefix-caching, --no-enable-prefix-caching",
              "--prefix-caching-hash-algo A"),

    # ---- some values: the others would change answers, or cannot be honoured ----
    *_only(("1",), "stepserve runs one unsharded engine in one process; for several "
           "engines behind one endpoint use --replicas N (Ray Serve)",
           "--tensor-parallel-size N, -tp N", "--pipeline-parallel-size N, -pp N",
           "--data-parallel-size N, -dp N", "--decode-context-parallel-size N, -dcp N",
           "--prefill-context-parallel-size N, -pcp N", "--nnodes N, -n N"),
    *_only(("0",), "stepserve runs on one machine", "--node-rank N, -r N"),
    *_only(("auto",), "the KV cache is kept in the weights' dtype (--dtype); stepserve "
           "has no quantised KV cache", "--kv-cache-dtype D"),
    *_only(("auto", "safetensors", "gguf"), "stepserve loads the model folder's "
           "safetensors, and for --quantization q4_1 the groups of its GGUF",
           "--load-format F"),
    *_only(("auto", "hf"), "stepserve reads the model folder's config.json (Hugging Face "
           "format)", "--config-format F"),
    *_only(("auto", "hf"), "stepserve reads the model folder's tokenizer.json (a Hugging "
           "Face fast tokenizer)", "--tokenizer-mode M"),
    *_only(("auto", "none"), "stepserve runs text generation only", "--convert C"),
    *_only(("auto", "generate"), "stepserve runs text generation only", "--runner R"),
    *_only(("auto", "string"), "message content is rendered into the chat template as "
           "a string", "--chat-template-content-format F"),
    *_only(("assistant",), "chat answers carry the role assistant", "--response-role R"),
    *_only(("raw_logprobs",), "logprobs are of the raw logits, before penalties and "
           "temperature (vLLM's default)", "--logprobs-mode M"),
    *_only(OFF, "stepserve serves the base model only, without LoRA adapters",
           "--enable-lora, --no-enable-lora"),
    *_only(NOT_GIVEN, "stepserve serves the base model only, without LoRA adapters",
           "--lora-modules M [M ...]"),
    *_only(("none",), "stepserve has no speculative decoding", "--spec-method M"),
    *_only(NOT_GIVEN, "stepserve has no speculative decoding",
           "--speculative-config JSON, -sc JSON", "--spec-model M", "--spec-tokens N"),
    *_only(OFF, "stepserve does not parse tool calls (a request with tools is refused)",
           "--enable-auto-tool-choice, --no-enable-auto-tool-choice"),
    *_only(NOT_GIVEN, "stepserve does not parse tool calls (a request with tools is "
           "refused)", "--tool-call-parser P", "--tool-server S"),
    *_only(("",), "stepserve does not parse tool calls (a request with tools is refused)",
           "--tool-parser-plugin P"),
    *_only(("",), "answers carry no separate reasoning content", "--reasoning-parser P",
           "--reasoning-parser-plugin P"),
    *_only(NOT_GIVEN, "answers carry no separate reasoning content", "--reasoning-config JSON"),
    *_only(("{}",), "the model is run as its folder's config.json describes it",
           "--hf-overrides JSON", "--model-class-overrides JSON"),
    *_only(NOT_GIVEN, "the model is run as its folder's config.json describes it",
           "--hf-config-path P", "--quantization-config JSON"),
    *_only(NOT_GIVEN, "stepserve samples with its own sampler; no logits processors are "
           "loaded", "--logits-processors P [P ...]"),
    *_only(OFF, "stepserve tokenizes and detokenizes every request",
           "--skip-tokenizer-init, --no-skip-tokenizer-init"),
    *_only(OFF, "answers keep the fields of vLLM's defaults",
           "--return-tokens-as-token-ids, --no-return-tokens-as-token-ids",
           "--tokens-only, --no-tokens-only",
           "--enable-force-include-usage, --no-enable-force-include-usage",
           "--enable-per-request-metrics, --no-enable-per-request-metrics",
           "--return-sampling-mask, --no-return-sampling-mask"),
    *_only(NOT_GIVEN, "answers are not watermarked", "--watermark-config JSON"),
    *_only(NOT_GIVEN, "the chat template is rendered with the messages and the "
           "tokenizer's special tokens only", "--default-chat-template-kwargs JSON"),
    *_only(NOT_GIVEN, "stepserve serves plain HTTP; put TLS in front of it (a proxy)",
           "--ssl-keyfile F", "--ssl-certfile F", "--ssl-ca-certs F", "--ssl-ciphers C"),
    *_only(("0",), "stepserve serves plain HTTP; put TLS in front of it (a proxy)",
           "--ssl-cert-reqs N"),
    *_only(OFF, "stepserve serves plain HTTP; put TLS in front of it (a proxy)",
           "--enable-ssl-refresh, --no-enable-ssl-refresh"),
    *_only(NOT_GIVEN, "stepserve listens on TCP only (--host, --port)", "--uds PATH"),
    *_only(NOT_GIVEN, "stepserve serves the OpenAI-compatible HTTP API only",
           "--grpc", "--grpc-port PORT", "--headless"),
    *_only(NOT_GIVEN, "stepserve loads no extra ASGI middleware", "--middleware M"),
    *_only(NOT_GIVEN, "stepserve has no disaggregated prefill and decode",
           "--kv-transfer-config JSON", "--ec-transfer-config JSON"),

    # ---- no effect: one warning line when given ----
    *_no_effect("stepserve never compiles graphs or captures CUDA graphs: every step "
                "runs eagerly", "--enforce-eager, --no-enforce-eager",
                "--compilation-config JSON, -cc JSON", "--cudagraph-capture-sizes N [N ...]",
                "--max-cudagraph-capture-size N", "--optimization-level N",
                "--performance-mode M"),
    *_no_effect("stepserve's engine loop schedules each step once the one before ends",
                "--async-scheduling, --no-async-scheduling"),
    *_no_effect("stepserve runs its own CPU kernels (model/ggml_kernels.py and its "
                "paged attention)", "--attention-backend B", "--attention-config JSON, -ac JSON",
                "--gdn-prefill-backend B", "--kda-decode-backend B", "--kda-prefill-backend B",
                "--kernel-config JSON", "--linear-backend B", "--moe-backend B",
                "--sparse-indexer-topk-backend B", "--ir-op-priority JSON",
                "--enable-flashinfer-autotune, --no-enable-flashinfer-autotune",
                "--disable-cascade-attn, --no-disable-cascade-attn",
                "--use-fp64-gumbel, --no-use-fp64-gumbel"),
    *_no_effect("stepserve runs its own model code (model/llama.py), never code from the "
                "model folder", "--trust-remote-code, --no-trust-remote-code",
                "--code-revision R"),
    *_no_effect("stepserve's own Llama implementation runs every model",
                "--model-impl I", takes=("auto",)),
    *_no_effect("stepserve loads the model folder on disk and never downloads",
                "--download-dir DIR", "--hf-token [TOKEN]", "--ignore-patterns P [P ...]",
                "--model-loader-extra-config JSON", "--pt-load-map-location L",
                "--safetensors-load-strategy S", "--safetensors-prefetch-block-size N",
                "--safetensors-prefetch-num-threads N", "--max-parallel-loading-workers N",
                "--use-tqdm-on-load, --no-use-tqdm-on-load",
                "--allow-deprecated-quantization, --no-allow-deprecated-quantization"),
    *_no_effect("one engine process: there are no distributed workers to configure",
                "--api-server-count N, -asc N", "--data-parallel-size-local N, -dpl N",
                "--data-parallel-address A, -dpa A", "--data-parallel-rpc-port P, -dpp P",
                "--data-parallel-rank N, -dpn N", "--data-parallel-start-rank N, -dpr N",
                "--data-parallel-backend B, -dpb B",
                "--data-parallel-external-lb, --no-data-parallel-external-lb, -dpe",
                "--data-parallel-hybrid-lb, --no-data-parallel-hybrid-lb, -dph",
                "--data-parallel-multi-port-external-lb, -dpm",
                "--data-parallel-supervisor-port P", "--dp-supervisor-probe-failure-threshold N",
                "--dp-supervisor-probe-interval-s S", "--dp-supervisor-probe-timeout-s S",
                "--aggregate-engine-logging", "--all2all-backend B",
                "--cp-kv-cache-interleave-size N", "--cpu-distributed-timeout-seconds S",
                "--dbo-decode-token-threshold N", "--dbo-prefill-token-threshold N",
                "--dcp-comm-backend B", "--dcp-kv-cache-interleave-size N",
                "--dcp-q-replicate, --no-dcp-q-replicate", "--device-ids IDS",
                "--disable-custom-all-reduce, --no-disable-custom-all-reduce",
                "--disable-nccl-for-dp-synchronization, "
                "--no-disable-nccl-for-dp-synchronization",
                "--distributed-executor-backend B", "--distributed-timeout-seconds S",
                "--dp-sync-interval N", "--elastic-ep-max-dp-size N",
                "--enable-batch-sharded-sampling, --no-enable-batch-sharded-sampling",
                "--enable-dbo, --no-enable-dbo", "--enable-elastic-ep, --no-enable-elastic-ep",
                "--enable-ep-weight-filter, --no-enable-ep-weight-filter",
                "--enable-eplb, --no-enable-eplb",
                "--enable-expert-parallel, --no-enable-expert-parallel, -ep",
                "--enable-fault-tolerance, --no-enable-fault-tolerance",
                "--enable-hc-sp, --no-enable-hc-sp",
                "--enable-shm-tensor-arena, --no-enable-shm-tensor-arena",
                "--eplb-config JSON", "--expert-placement-strategy S",
                "--fault-tolerance-config JSON", "--master-addr A", "--master-port P",
                "--numa-bind, --no-numa-bind", "--numa-bind-cpus C [C ...]",
                "--numa-bind-nodes N [N ...]",
                "--ray-workers-use-nsight, --no-ray-workers-use-nsight", "--ubatch-size N",
                "--worker-cls C", "--worker-extension-cls C",
                "--enable-cumem-allocator, --no-enable-cumem-allocator",
                "--enable-nccl-comm-suspend, --no-enable-nccl-comm-suspend",
                "--weight-transfer-config JSON"),
    *_no_effect("stepserve serves text-only models", "--enable-mm-embeds, --no-enable-mm-embeds",
                "--interleave-mm-strings, --no-interleave-mm-strings",
                "--language-model-only, --no-language-model-only", "--limit-mm-per-prompt JSON",
                "--media-io-kwargs JSON", "--mm-device-do-normalize, --no-mm-device-do-normalize",
                "--mm-encoder-attn-backend B", "--mm-encoder-attn-dtype D",
                "--mm-encoder-fp8-scale-path P", "--mm-encoder-fp8-scale-save-margin M",
                "--mm-encoder-fp8-scale-save-path P", "--mm-encoder-only, --no-mm-encoder-only",
                "--mm-encoder-tp-mode M", "--mm-hasher-algorithm A", "--mm-ipc-gpu-memory-gb G",
                "--mm-processor-cache-gb G", "--mm-processor-cache-type T",
                "--mm-processor-device D", "--mm-processor-kwargs JSON",
                "--mm-shm-cache-max-object-size-mb N", "--mm-tensor-ipc T",
                "--skip-mm-profiling, --no-skip-mm-profiling", "--video-pruning-method M",
                "--video-pruning-rate R", "--allowed-local-media-path P",
                "--allowed-media-domains D [D ...]", "--disable-chunked-mm-input, "
                "--no-disable-chunked-mm-input", "--trust-request-mm-kwargs, "
                "--no-trust-request-mm-kwargs", "--ec-manager-config JSON",
                "--enable-prompt-embeds, --no-enable-prompt-embeds",
                "--default-mm-loras JSON", "--enable-tower-connector-lora, "
                "--no-enable-tower-connector-lora"),
    *_no_effect("stepserve's models are plain decoder transformers (Llama): no Mamba, "
                "MoE, sliding-window or hybrid layers", "--enable-mamba-cache-stochastic-"
                "rounding, --no-enable-mamba-cache-stochastic-rounding", "--mamba-backend B",
                "--mamba-cache-philox-rounds N", "--mamba-ssu-algorithm A",
                "--enable-mamba-shared-prefix-checkpoint, "
                "--no-enable-mamba-shared-prefix-checkpoint", "--mamba-block-size N",
                "--mamba-cache-dtype D", "--mamba-cache-mode M", "--mamba-ssm-cache-dtype D",
                "--replayssm-buffer-len N", "--swa-bounded-replay, --no-swa-bounded-replay",
                "--use-replayssm, --no-use-replayssm",
                "--disable-sliding-window, --no-disable-sliding-window",
                "--disable-hybrid-kv-cache-manager, --no-disable-hybrid-kv-cache-manager",
                "--kv-sharing-fast-prefill, --no-kv-sharing-fast-prefill",
                "--kv-cache-dtype-skip-layers L [L ...]",
                "--enable-return-routed-experts, --no-enable-return-routed-experts",
                "--aux-output-config JSON", "--engram-config JSON", "--diffusion-config JSON, "
                "-dc JSON", "--enable-mixed-moe-lora-format, --no-enable-mixed-moe-lora-format",
                "--enable-moe-shared-loras, --no-enable-moe-shared-loras"),
    *_no_effect("LoRA is off (stepserve serves the base model only)",
                "--fully-sharded-loras, --no-fully-sharded-loras", "--lora-dtype D",
                "--lora-target-modules M [M ...]", "--max-cpu-loras N", "--max-lora-cls-labels N",
                "--max-lora-rank N", "--max-loras N",
                "--specialize-active-lora, --no-specialize-active-lora"),
    *_no_effect("weights and KV cache already live in host memory",
                "--cpu-offload-gb G", "--cpu-offload-params P [P ...]", "--offload-backend B",
                "--offload-group-size N", "--offload-num-in-group N",
                "--offload-params P [P ...]", "--offload-prefetch-step N",
                "--kv-offloading-backend B", "--kv-offloading-size G"),
    *_no_effect("stepserve writes no periodic stats lines: /metrics has the numbers",
                "--disable-log-stats", "--enable-logging-iteration-details, "
                "--no-enable-logging-iteration-details"),
    *_no_effect("stepserve logs no requests or outputs; uvicorn's access log "
                "(--uvicorn-log-level info) lists each request",
                "--enable-log-requests, --no-enable-log-requests",
                "--enable-log-outputs, --no-enable-log-outputs",
                "--enable-log-deltas, --no-enable-log-deltas", "--max-log-len N",
                "--log-error-stack, --no-log-error-stack",
                "--disable-access-log-for-endpoints E"),
    *_no_effect("stepserve configures logging from --log-level only",
                "--log-config-file F", "--logging-config JSON",
                "--fail-on-environ-validation, --no-fail-on-environ-validation"),
    *_no_effect("stepserve's /metrics has a fixed set of series; it exports no traces "
                "and runs no profiler", "--collect-detailed-traces T [T ...]",
                "--otlp-traces-endpoint URL", "--cudagraph-metrics, --no-cudagraph-metrics",
                "--custom-histogram-buckets JSON", "--enable-layerwise-nvtx-tracing, "
                "--no-enable-layerwise-nvtx-tracing", "--enable-mfu-metrics, "
                "--no-enable-mfu-metrics", "--jit-monitor-mode M", "--jit-monitor-verbose, "
                "--no-jit-monitor-verbose", "--kv-cache-metrics, --no-kv-cache-metrics",
                "--kv-cache-metrics-sample R", "--per-request-spec-decode-metrics M",
                "--show-hidden-metrics-for-version V", "--profiler-config JSON",
                "--enable-trace-replay, --no-enable-trace-replay", "--kv-events-config JSON"),
    *_no_effect("stepserve serves the OpenAI completions and chat routes, /tokenize, "
                "/detokenize, /v1/models, /health, /metrics and /version only",
                "--anthropic-disabled-thinking-effort E", "--cohere-format F",
                "--cohere-is-reasoning-model, --no-cohere-is-reasoning-model",
                "--enable-tokenizer-info-endpoint, --no-enable-tokenizer-info-endpoint",
                "--enable-server-load-tracking, --no-enable-server-load-tracking",
                "--enable-scale-out, --no-enable-scale-out",
                "--enable-sleep-mode, --no-enable-sleep-mode",
                "--sleep-mode-offload-cudagraph, --no-sleep-mode-offload-cudagraph",
                "--sleep-preserve-parameter-names P [P ...]",
                "--enable-offline-docs, --no-enable-offline-docs",
                "--disable-fastapi-docs, --no-disable-fastapi-docs",
                "--pooler-config JSON", "--io-processor-plugin P",
                "--enable-flash-late-interaction, --no-enable-flash-late-interaction"),
    *_no_effect("stepserve sends no CORS headers, so browsers on other origins are "
                "refused (as by vLLM's default)", "--allow-credentials, --no-allow-credentials",
                "--allowed-headers H", "--allowed-methods M", "--allowed-origins O"),
    *_no_effect("stepserve's HTTP front end has its own bounds (--max-header-bytes, "
                "--header-timeout, ...) and answer format", "--h11-max-header-count N",
                "--h11-max-incomplete-event-size N", "--root-path P",
                "--sse-keep-alive-interval S",
                "--enable-request-id-headers, --no-enable-request-id-headers",
                "--renderer-num-workers N", "--stream-interval N",
                "--trust-request-chat-template, --no-trust-request-chat-template",
                "--exclude-tools-when-tool-choice-none, "
                "--no-exclude-tools-when-tool-choice-none", "--tool-strict-level L",
                "--structured-outputs-config JSON", "--additional-config JSON"),
    *_no_effect("stepserve's scheduler (core/scheduler.py) has no such knob; its own are "
                "--max-num-seqs, --max-num-batched-tokens, --max-waiting and "
                "--max-queue-time-s", "--max-num-active-seqs N", "--max-num-queued-reqs N",
                "--max-num-queued-tokens N", "--max-num-scheduled-tokens N",
                "--long-prefill-token-threshold-adaptive, "
                "--no-long-prefill-token-threshold-adaptive",
                "--prefill-schedule-interval N",
                "--scheduler-reserve-full-isl, --no-scheduler-reserve-full-isl",
                "--prefix-cache-retention-interval S", "--prefix-match-unit N",
                "--scheduler-cls C"),
)

BY_NAME = {name: flag for flag in TABLE for name in flag.usage.names}
ADDED_DEST = "vllm_serve_flags_added"  # the names of the table's flags a command has


class _Pair(argparse.Action):
    """`--x` and `--no-x` as one flag, as vLLM's BooleanOptionalAction: True, False."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, const=True, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


_ARGUMENTS = {  # arity: how argparse reads it
    "switch": dict(action="store_const", const=True),
    "pair": dict(action=_Pair),
    "value": {},
    "values": dict(nargs="+"),
    "optional": dict(nargs="?", const=True),
}


def add_vllm_serve_flags(parser: argparse.ArgumentParser) -> None:
    """The table's flags that are no setting of ours, in one group whose help is a
    pointer; a name the command already has (its own flag) is left to it."""
    taken = parser._option_string_actions  # noqa: SLF001 (argparse has no public map)
    group = parser.add_argument_group(
        "vLLM's other serve flags",
        "accepted so that a `vllm serve` command line runs unchanged: each one has no "
        "effect here (a warning says what stepserve does instead) or takes only the "
        "values that mean what stepserve does; see docs/guide.md, \"vLLM's serve flags\"")
    added = []
    for flag in TABLE:
        names = [n for n in flag.usage.names if n not in taken]
        if flag.kind is Kind.APPLIES or len(names) < len(flag.usage.names):
            continue  # defined where it acts, or the command's own meaning of the name
        group.add_argument(*names, dest=flag.usage.dest, default=None, help=argparse.SUPPRESS,
                           **_ARGUMENTS[flag.usage.arity])
        added.append(flag.usage.name)
    parser.set_defaults(**{ADDED_DEST: tuple(added)})


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value).strip()


def check_vllm_flags(args: argparse.Namespace) -> list[str]:
    """The warnings for the no-effect flags given (one line each); a UsageError for the
    first value a some-values flag does not take (values compare without case)."""
    warnings = []
    for name in getattr(args, ADDED_DEST, ()):
        flag = BY_NAME[name]
        value = getattr(args, flag.usage.dest)
        if value is None:
            continue
        given = [_text(v) for v in value] if isinstance(value, list) else [_text(value)]
        if all(v.lower() in flag.takes for v in given):
            continue
        shown = " ".join(given)
        if flag.kind is Kind.SOME_VALUES:
            allowed = ", ".join(repr(v) for v in flag.takes) if flag.takes else \
                "none (leave the flag out)"
            raise UsageError(f"{flag.usage.name} = {shown!r}: {flag.reason}; allowed: "
                             f"{allowed}")
        warnings.append(f"warning: {flag.usage.name} has no effect here: {flag.reason}")
    return warnings
