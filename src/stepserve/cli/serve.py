"""`stepserve serve`: the OpenAI-compatible server on a real model.

    stepserve serve --model default --config pool.yaml --max-num-seqs 40 --port 8000
    stepserve serve MODEL --max_num_seqs 40 --config vllm.yaml   (vLLM's habits too)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stepserve.cli.engine_flags import (
    add_config_arguments,
    add_dtype_argument,
    add_quantization_argument,
    config_overrides,
)
from stepserve.cli.parser import add_command, options_from
from stepserve.config.errors import UsageError, report_error
from stepserve.config.limits import MAX_SECONDS, SEED, WAIT_SECONDS, Range
from stepserve.config.load import ConfigOverrides
from stepserve.core.request_limits import (
    DEFAULT_MAX_LOGPROBS,
    DEFAULT_MAX_REQUEST_BYTES,
    LOGPROBS_MAX,
    MAX_REQUEST_BYTES_MAX,
)
from stepserve.server.connection_limits import FLAGS as LIMIT_FLAGS
from stepserve.server.connection_limits import ConnectionLimits, fit_to_descriptors
from stepserve.server.fingerprint import MODES as FINGERPRINT_MODES

if TYPE_CHECKING:
    from stepserve.model.generation_config import SamplingDefaults


def add_serve_parser(subparsers) -> None:
    p = add_command(subparsers, "serve", serve_command,
                    help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as `vllm serve MODEL` takes it (wins over --model)")
    p.add_argument("--model", default="default", help="preset (default, tiny) or HF directory")
    p.add_argument("--served-model-name", default=None, nargs="+", metavar="NAME",
                   help="the names clients may pass as `model`, as vLLM takes them; the "
                        "first is the one answers and metrics carry (default: --model)")
    p.add_argument("--config", help="engine config YAML")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8000)
    add_dtype_argument(p)
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the engine's random numbers at startup, so requests without "
                        "a seed of their own sample reproducibly (vLLM's default, 0)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--retry-after", type=int, default=1, metavar="S",
                   help="Retry-After seconds of a 429 (queue full)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGINT/SIGTERM, how long in-flight requests may finish before "
                        "they are aborted (0: at once)")
    for field, spec in LIMIT_FLAGS.items():  # connections: server/connection_limits.py
        p.add_argument(spec.flag, dest=field, type=spec.allowed.kind, default=None,
                       metavar=spec.metavar, help=spec.help)
    p.add_argument("--max-request-bytes", type=int,
                   default=DEFAULT_MAX_REQUEST_BYTES, metavar="N",
                   help="largest request body accepted; larger ones get 413 "
                        f"(default {DEFAULT_MAX_REQUEST_BYTES})")
    p.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS,
                   help="stepserve's log level (vLLM's names, in either case)")
    add_quantization_argument(p)
    p.add_argument("--api-key", action="extend", nargs="+", type=api_key, default=None,
                   metavar="KEY",
                   help="require `Authorization: Bearer KEY` on every route but /health, "
                        "/metrics and /version (several keys: any of them; default: the "
                        "VLLM_API_KEY environment variable, as vLLM)")
    p.add_argument("--metrics-require-api-key", action="store_true",
                   help="/metrics needs the API key too (it shows queue depths, KV usage "
                        "and the prefix cache's hit totals); needs --api-key or "
                        "VLLM_API_KEY")
    p.add_argument("--no-vllm-metric-names", action="store_true",
                   help="/metrics without the copies of its series under vLLM's own names "
                        "(vllm:num_requests_waiting, vllm:kv_cache_usage_perc, ...: what "
                        "vLLM's dashboards and the Gateway API endpoint picker read); "
                        "the stepserve: series stay")
    p.add_argument("--uvicorn-log-level", default=None,
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="the HTTP server's log level (default: --log-level)")
    p.add_argument("--disable-uvicorn-access-log", action=argparse.BooleanOptionalAction,
                   default=False, help="no access log line per request")
    add_model_folder_arguments(p)
    p.add_argument("--pools", metavar="FILE",
                   help="engine replicas in pools with routing rules (YAML: replicas, "
                        "router, pools, routing); runs on Ray Serve (the cluster extra)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="run the replicas on this Ray cluster (default with --replicas > 1 "
                        "or --pools: a local, loopback-only Ray instance)")
    add_config_arguments(p)


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "notset")


def add_model_folder_arguments(p: argparse.ArgumentParser) -> None:
    """vLLM's flags for what the model folder holds and how its requests are answered."""
    g = p.add_argument_group("the model folder and the answers (vLLM's flags)")
    g.add_argument("--tokenizer", metavar="DIR",
                   help="the folder of the tokenizer to use (tokenizer.json; a preset name "
                        "too); stepserve never downloads (default: the model's)")
    g.add_argument("--revision", metavar="R",
                   help="the model revision to serve: it must be what the folder holds "
                        "(a Hugging Face cache snapshot's commit or ref); stepserve never "
                        "downloads, so any other is refused")
    g.add_argument("--tokenizer-revision", metavar="R",
                   help="the tokenizer's revision, checked as --revision")
    g.add_argument("--chat-template", metavar="T",
                   help="the chat template: a file, or the template itself in one line "
                        "(default: the tokenizer's)")
    g.add_argument("--generation-config", default="auto", metavar="G",
                   help="where the sampling params a request leaves out come from: auto "
                        "(the model's generation_config.json, as vLLM), vllm (vLLM's own: "
                        "temperature 1, top_p 1, ...), or a folder holding a "
                        "generation_config.json; a request's own fields win")
    g.add_argument("--override-generation-config", type=json_object, metavar="JSON",
                   help='sampling params over --generation-config\'s, e.g. '
                        '\'{"temperature": 0.5}\'')
    g.add_argument("--max-logprobs", type=int, default=DEFAULT_MAX_LOGPROBS, metavar="N",
                   help="the most logprobs a request may ask for per token (-1: the whole "
                        "vocabulary); more is a 400, as in vLLM")
    g.add_argument("--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction,
                   default=False, help="usage carries prompt_tokens_details (the cached "
                                       "prompt tokens), as vLLM's flag")
    g.add_argument("--fingerprint-mode", choices=FINGERPRINT_MODES, default="full",
                   help="the answers' system_fingerprint: full and hash "
                        "stepserve-<version>-<hash of the settings>, custom "
                        "--fingerprint-value, none null (vLLM's flag)")
    g.add_argument("--fingerprint-value", metavar="V",
                   help="the fingerprint with --fingerprint-mode custom")


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535)")
    return port


def api_key(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an API key cannot be empty")
    return text


def api_keys_of(args: argparse.Namespace) -> tuple[str, ...]:
    """--api-key, else VLLM_API_KEY from the environment (vLLM reads the same one)."""
    if args.api_key:
        return tuple(args.api_key)
    env = os.environ.get("VLLM_API_KEY", "").strip()
    return (env,) if env else ()


def serve_command(args: argparse.Namespace) -> int:
    given = {field: getattr(args, field) for field in LIMIT_FLAGS
             if getattr(args, field) is not None}
    # the cap checked against the open-file limit now, not after minutes of loading
    limits = fit_to_descriptors(ConnectionLimits(**given))
    return run_serve(options_from(
        ServeOptions, args, model=args.model_tag or args.model,
        retry_after_s=args.retry_after, shutdown_timeout_s=args.shutdown_timeout,
        config=config_overrides(args), api_keys=api_keys_of(args), limits=limits,
        vllm_metric_names=not args.no_vllm_metric_names))


# ---- the job (server/ is the place for it; it lives here until that package is free) ----

@dataclass(frozen=True)
class ServeOptions:
    model: str = "default"
    served_model_name: str | list[str] | None = None  # default: the model; several: aliases
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"  # vLLM's values (engine_flags.DTYPE_CHOICES)
    quantization: str = "auto"  # weight mode (model/modes.py); see quantization_for
    tokenizer: str | None = None  # the tokenizer's folder (default: the model's)
    revision: str | None = None  # must be what the model folder holds (presets.py)
    tokenizer_revision: str | None = None  # the same for the tokenizer's folder
    chat_template: str | None = None  # a file or the template (default: the tokenizer's)
    generation_config: str = "auto"  # default sampling params (model/generation_config.py)
    override_generation_config: dict | None = None  # defaults over those
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # per token a request may ask for; -1: all
    enable_prompt_tokens_details: bool = False  # usage carries prompt_tokens_details
    fingerprint_mode: str = "full"  # the answers' system_fingerprint (fingerprint.py)
    fingerprint_value: str | None = None  # with fingerprint_mode "custom"
    disable_uvicorn_access_log: bool = False
    device: str = "cpu"
    seed: int = 0  # the engine's random numbers at startup
    retry_after_s: int = 1  # Retry-After of a 429 (queue full)
    shutdown_timeout_s: float = 30.0  # how long in-flight requests may finish on a signal
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    log_level: str = "info"
    uvicorn_log_level: str | None = None  # default: log_level
    config: ConfigOverrides = ConfigOverrides()
    pools: str | None = None  # a pools file: the replicas run on Ray Serve (cluster/)
    ray_address: str | None = None  # the Ray cluster to run them on (cluster/)
    api_keys: tuple[str, ...] = ()  # Bearer tokens every non-public route requires
    metrics_require_api_key: bool = False  # /metrics needs one of them too
    vllm_metric_names: bool = True  # /metrics carries vLLM's names too (vllm:)
    limits: ConnectionLimits = ConnectionLimits()  # what one connection may hold

    def __post_init__(self) -> None:
        WAIT_SECONDS.check("--shutdown-timeout", self.shutdown_timeout_s)  # 0: abort at once
        Range(0, MAX_SECONDS).check("--retry-after", self.retry_after_s)
        SEED.check("--seed", self.seed)
        Range(1024, MAX_REQUEST_BYTES_MAX).check("--max-request-bytes", self.max_request_bytes)
        if self.max_logprobs != -1:
            Range(0, LOGPROBS_MAX, note=" (or -1: the whole vocabulary)").check(
                "--max-logprobs", self.max_logprobs)
        if self.metrics_require_api_key and not self.api_keys:
            raise UsageError("--metrics-require-api-key needs --api-key (or the VLLM_API_KEY "
                             "environment variable): without a key /metrics would stay open")


def run_serve(options: ServeOptions) -> int:
    """Serve until a signal; the exit status (1 when the engine died)."""
    o = options
    if on_cluster(o):
        return serve_on_cluster(o)
    try:
        from stepserve.engine.dtypes import resolve_dtype
        from stepserve.engine.llm_engine import LLMEngine
        from stepserve.model.modes import quantization_for
        from stepserve.server.api import create_app
        from stepserve.server.fingerprint import system_fingerprint
        from stepserve.server.http_server import make_server
    except ImportError as e:
        return report_error(f"`stepserve serve` needs the server packages (fastapi, uvicorn, "
                            f"prometheus-client): {e}")
    logging.basicConfig(level=o.log_level.upper(), format="%(levelname)s %(name)s: "
                        "%(message)s")
    try:
        check_can_listen(o.host, o.port)  # before minutes of model loading
        system_fingerprint(None, "", o.fingerprint_mode, o.fingerprint_value)  # a bad pair
        o.config.apply()  # a bad setting fails before minutes of model loading
        folders = model_folders(o)  # what the folders hold, checked before loading too
        dtype = resolve_dtype(o.dtype, o.model, o.device)
        seed_engine(o.seed)
        engine = LLMEngine(o.model, o.config, dtype=dtype, device=o.device,
                           strict_max_model_len=o.config.sets("max_model_len"),
                           quantization=quantization_for(o.quantization, o.dtype),
                           tokenizer=folders.tokenizer, max_logprobs=o.max_logprobs)
    except (ValueError, OSError) as e:  # a ConfigError is a ValueError
        return report_error(e)
    if folders.chat_template is not None:
        engine.tokenizer.use_chat_template(folders.chat_template)
    from stepserve.server.serving import served_names

    names = served_names(o.served_model_name, o.model)
    name = names[0]
    app = create_app(engine, model_name=names, retry_after_s=o.retry_after_s,
                     shutdown_timeout_s=o.shutdown_timeout_s,
                     max_request_bytes=o.max_request_bytes, api_keys=o.api_keys,
                     metrics_require_api_key=o.metrics_require_api_key,
                     vllm_metric_names=o.vllm_metric_names,
                     sampling_defaults=folders.sampling_defaults,
                     enable_prompt_tokens_details=o.enable_prompt_tokens_details,
                     fingerprint_mode=o.fingerprint_mode,
                     fingerprint_value=o.fingerprint_value)
    print(f"stepserve: serving {name!r} on http://{o.host}:{o.port}/v1 "
          f"({engine.runner.describe()}; {folders.sampling_defaults.describe()})",
          file=sys.stderr)
    uvicorn_level = o.uvicorn_log_level or ("debug" if o.log_level == "notset" else o.log_level)
    server = make_server(app, o.host, o.port, log_level=uvicorn_level, limits=o.limits,
                         access_log=not o.disable_uvicorn_access_log)
    server.run()
    if server.exit_code:
        fault = app.state.async_engine.fault
        print(f"stepserve: server stopped: {fault}; exit status {server.exit_code}",
              file=sys.stderr)
        return server.exit_code
    print("stepserve: server stopped", file=sys.stderr)
    return 0


@dataclass(frozen=True)
class ModelFolders:
    """What --tokenizer, --revision, --chat-template and --generation-config name, read
    and checked before the model loads."""

    tokenizer: Path | None  # None: the model's own
    chat_template: str | None  # None: the tokenizer's own
    sampling_defaults: SamplingDefaults


def model_folders(o: ServeOptions) -> ModelFolders:
    """UsageError (one line) for a folder or file that does not hold what its flag says."""
    from stepserve.model.generation_config import sampling_defaults
    from stepserve.model.presets import PRESETS, resolve_model, revision_refusal
    from stepserve.model.tokenizer import chat_template_of

    model_dir = resolve_model(o.model)
    tokenizer = None
    if o.tokenizer is not None:
        tokenizer = resolve_model(o.tokenizer) if o.tokenizer in PRESETS \
            else Path(o.tokenizer).expanduser()
        if not (tokenizer / "tokenizer.json").is_file():
            raise UsageError(f"--tokenizer {o.tokenizer!r}: not a folder holding a "
                             "tokenizer.json (stepserve never downloads; give a folder on "
                             "disk or a preset name)")
    for flag, folder, revision in (("--revision", model_dir, o.revision),
                                   ("--tokenizer-revision", tokenizer or model_dir,
                                    o.tokenizer_revision)):
        if refusal := revision_refusal(folder, revision, flag):
            raise UsageError(refusal)
    try:
        template = None if o.chat_template is None else chat_template_of(o.chat_template)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return ModelFolders(tokenizer, template, sampling_defaults(
        o.generation_config, model_dir, o.override_generation_config))


def seed_engine(seed: int) -> None:
    """Seed torch's and Python's random numbers (what requests without a seed of their
    own draw from), as vLLM's --seed does at startup."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def on_cluster(o: ServeOptions) -> bool:
    """Replicas, pools or a Ray address: the engines run on Ray Serve (cluster/)."""
    try:
        replicas = o.config.apply().replicas
    except ValueError:
        replicas = 1  # the single-process path reports the mistake
    return replicas > 1 or o.pools is not None or o.ray_address is not None


# vLLM's flags that act on one engine's server; the cluster path has no place for them yet
SINGLE_ENGINE_ONLY = ("tokenizer", "revision", "tokenizer_revision", "chat_template",
                      "generation_config", "override_generation_config", "max_logprobs",
                      "enable_prompt_tokens_details", "disable_uvicorn_access_log",
                      "fingerprint_mode", "fingerprint_value")


def serve_on_cluster(o: ServeOptions) -> int:
    from stepserve.cluster.job import ClusterServeOptions, run_cluster_serve
    from stepserve.engine.dtypes import resolve_dtype

    for field in dataclasses.fields(ServeOptions):
        if field.name in SINGLE_ENGINE_ONLY and getattr(o, field.name) != field.default:
            return report_error(f"--{field.name.replace('_', '-')}: not carried to the "
                                "replicas of a Ray Serve deployment (--replicas > 1, --pools, "
                                "--ray-address) yet; serve one engine to use it")
    try:
        check_can_listen(o.host, o.port)  # before Ray starts and models load
        dtype = resolve_dtype(o.dtype, o.model, o.device)
    except (ValueError, OSError) as e:
        return report_error(e)
    return run_cluster_serve(options_from(ClusterServeOptions, o, dtype=dtype,
                                          pools_file=o.pools, connection_limits=o.limits))


def check_can_listen(host: str, port: int) -> None:
    """Raise OSError (naming the address) if host:port cannot be listened on."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
