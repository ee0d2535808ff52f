"""`stepserve serve`: the OpenAI-compatible server on a real model.

    stepserve serve --model default --config pool.yaml --max-num-seqs 40 --port 8000
    stepserve serve MODEL --max_num_seqs 40 --config vllm.yaml   (vLLM's habits too)
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from dataclasses import dataclass

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
from stepserve.core.request_limits import DEFAULT_MAX_REQUEST_BYTES, MAX_REQUEST_BYTES_MAX
from stepserve.server.connection_limits import FLAGS as LIMIT_FLAGS
from stepserve.server.connection_limits import ConnectionLimits, fit_to_descriptors


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
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    add_quantization_argument(p)
    p.add_argument("--api-key", action="append", type=api_key, default=None, metavar="KEY",
                   help="require `Authorization: Bearer KEY` on every route but /health, "
                        "/metrics and /version (repeat for several keys; default: the "
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
    p.add_argument("--pools", metavar="FILE",
                   help="engine replicas in pools with routing rules (YAML: replicas, "
                        "router, pools, routing); runs on Ray Serve (the cluster extra)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="run the replicas on this Ray cluster (default with --replicas > 1 "
                        "or --pools: a local, loopback-only Ray instance)")
    add_config_arguments(p)


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
    quantization: str = "auto"  # weight mode (model/modes.py)
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
        from stepserve.server.api import create_app
        from stepserve.server.http_server import make_server
    except ImportError as e:
        return report_error(f"`stepserve serve` needs the server packages (fastapi, uvicorn, "
                            f"prometheus-client): {e}")
    logging.basicConfig(level=o.log_level.upper(), format="%(levelname)s %(name)s: "
                        "%(message)s")
    try:
        check_can_listen(o.host, o.port)  # before minutes of model loading
        o.config.apply()  # a bad setting fails before minutes of model loading
        dtype = resolve_dtype(o.dtype, o.model, o.device)
        seed_engine(o.seed)
        engine = LLMEngine(o.model, o.config, dtype=dtype, device=o.device,
                           strict_max_model_len=o.config.sets("max_model_len"),
                           quantization=o.quantization)
    except (ValueError, OSError) as e:  # a ConfigError is a ValueError
        return report_error(e)
    from stepserve.server.serving import served_names

    names = served_names(o.served_model_name, o.model)
    name = names[0]
    app = create_app(engine, model_name=names, retry_after_s=o.retry_after_s,
                     shutdown_timeout_s=o.shutdown_timeout_s,
                     max_request_bytes=o.max_request_bytes, api_keys=o.api_keys,
                     metrics_require_api_key=o.metrics_require_api_key,
                     vllm_metric_names=o.vllm_metric_names)
    print(f"stepserve: serving {name!r} on http://{o.host}:{o.port}/v1 "
          f"({engine.runner.describe()})", file=sys.stderr)
    server = make_server(app, o.host, o.port, log_level=o.uvicorn_log_level or o.log_level,
                         limits=o.limits)
    server.run()
    if server.exit_code:
        fault = app.state.async_engine.fault
        print(f"stepserve: server stopped: {fault}; exit status {server.exit_code}",
              file=sys.stderr)
        return server.exit_code
    print("stepserve: server stopped", file=sys.stderr)
    return 0


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


def serve_on_cluster(o: ServeOptions) -> int:
    from stepserve.cluster.job import ClusterServeOptions, run_cluster_serve
    from stepserve.engine.dtypes import resolve_dtype

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
