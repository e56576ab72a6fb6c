"""python -m tritonnx.commands.serve: tritonserver and the facade together, as `make serve` runs them.

Starts the serving stack (tritonnx/server/stack.py): tritonserver with the model repository on
ports 8000-8002, a supervisor (its metrics on 8003) that reloads a model whose stub process died and restarts
tritonserver if it exits, all on loopback unless --host (gRPC), --http-host and --metrics-host say otherwise, and the facade on 50051 (gRPC) and 3000 (HTTP) unless flags after `--` say otherwise,
ready once a real inference went through; it prints the ports the facade bound. Ctrl-C or SIGTERM drains the facade
first, then stops Triton.

Triton's restricted APIs (model control, repository index, shared memory, trace, logging) need the admin key:
$TRITONNX_ADMIN_KEY when set, else a new random key written to <build>/admin-key (mode 600).
Paths come from $TRITONNX_MODEL_REPOSITORY and $TRITONNX_BUILD_DIR (tritonnx/common/paths.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tritonnx.client.facade.settings import FacadeSettings
from tritonnx.common.admin import GRPC_ADMIN_HEADER, share_admin_key
from tritonnx.common.paths import REPOSITORY_ENV, Paths
from tritonnx.common.ports import SUPERVISOR_METRICS, TRITON_GRPC, TRITON_HTTP, TRITON_METRICS
from tritonnx.common.settings import add_flags, setting, settings_from
from tritonnx.server.process import ServerError, StopRequest
from tritonnx.server.shm import check_shared_memory
from tritonnx.server.stack import ServingStack
from tritonnx.server.supervisor import DEFAULT_WATCHDOG_SECONDS
from tritonnx.server.triton import Ports, format_model_states


# KServe's spellings (--model_dir, --http_port, --grpc_port, --model_name, --workers) are taken too: a
# ServingRuntime's container gets an InferenceService's `model.args` appended to its own.
@dataclass(frozen=True)
class ServeSettings:
    model_repository: Path = setting(
        factory=lambda: Paths.from_environment().model_repository,
        help="the model repository; --model_dir is KServe's name for it",
        env=REPOSITORY_ENV,
        flags=("--model-repository", "--model_dir"),
    )
    log_dir: str = setting(
        factory=lambda: str(Paths.from_environment().build),
        help="where tritonserver.log and facade.log go; '-' for this process's output (a container's log)",
        env=False,
    )
    host: str = setting(
        "127.0.0.1",
        "where Triton's gRPC listens; any address but loopback lets callers past the facade (its token, limits and "
        "checks), so keep it unless they are meant to reach Triton",
        env="TRITONNX_TRITON_HOST",
    )
    http_host: str = setting(
        "127.0.0.1",
        "where Triton's HTTP listens, whatever --host says: one JSON request aborts tritonserver 2.51 there "
        "(docs/operations.md, Security), so it leaves loopback only when asked",
        env="TRITONNX_TRITON_HTTP_HOST",
    )
    metrics_host: str = setting(
        "",
        "where Triton's and the supervisor's metrics listen (a pod's IP, 0.0.0.0, for Prometheus); empty: --host",
        env="TRITONNX_TRITON_METRICS_HOST",
    )
    http_port: int = setting(
        TRITON_HTTP, "Triton's HTTP port", env="TRITONNX_TRITON_HTTP_PORT", flags=("--http-port", "--http_port")
    )
    grpc_port: int = setting(
        TRITON_GRPC, "Triton's gRPC port", env="TRITONNX_TRITON_GRPC_PORT", flags=("--grpc-port", "--grpc_port")
    )
    metrics_port: int = setting(TRITON_METRICS, "Triton's metrics port", env="TRITONNX_TRITON_METRICS_PORT")
    supervisor_metrics_port: int = setting(
        SUPERVISOR_METRICS,
        "the supervisor's Prometheus metrics (models healed, server restarts, models ready), on --metrics-host; -1 "
        "turns them off",
    )
    log_verbose: int = setting(0, "tritonserver's --log-verbose level", env="TRITONNX_TRITON_LOG_VERBOSE")
    otlp_endpoint: str = setting(
        "",
        "OpenTelemetry tracing: tritonserver and the facade send spans to this OTLP/HTTP receiver (e.g. "
        "http://127.0.0.1:4318; `python -m tritonnx.commands.traces` is one), one trace per call from the facade through "
        "Triton's queue and compute; empty: off",
    )
    trace_ratio: float = setting(
        0.1,
        "share of the facade's calls traced, 0..1; Triton traces the requests that carry a trace context: those "
        "calls, and direct requests sent with a traceparent",
    )
    watchdog_seconds: float = setting(
        DEFAULT_WATCHDOG_SECONDS,
        "the supervisor kills the stubs of a model that keeps requests waiting this long without finishing an "
        "execution, and reloads it; a model's config.pbtxt parameter tritonnx.watchdog_seconds overrides it; 0: off",
    )
    load_model: tuple[str, ...] = setting(
        ("*",),
        "a model to load at start, repeatable; * loads every model of the repository",
        env="TRITONNX_TRITON_LOAD_MODELS",
    )
    triton_http: bool = setting(
        True, "serve Triton's HTTP endpoint (the facade needs only gRPC; --no-triton-http turns it off)", env=False
    )
    facade: bool = setting(
        True, "run the facade in front of Triton (--no-facade: tritonserver alone, as the container does)", env=False
    )
    # Taken and ignored: Triton serves every model of the repository whatever the InferenceService is called,
    # and the models' instance groups, not a worker count, set the parallelism.
    model_name: str = setting("", argparse.SUPPRESS, env=False, flags=("--model_name",))
    workers: str = setting("", argparse.SUPPRESS, env=False, flags=("--workers",))


def arguments() -> argparse.ArgumentParser:
    """The command's flags: ServeSettings', then the facade's after `--`."""
    parser = argparse.ArgumentParser(
        prog="tritonnx-serve",
        description="Run tritonserver with the model repository, its supervisor and the gRPC facade in front of it, "
        "until Ctrl-C or SIGTERM (`python -m tritonnx.commands.serve` is the same command).",
        epilog="Facade flags (e.g. --max-in-flight, --default-model, --http-port) go after `--`; see tritonnx-facade "
        "--help. Each flag's environment variable is in its help; the build folder comes from TRITONNX_BUILD_DIR, "
        "the admin key from TRITONNX_ADMIN_KEY.",
    )
    add_flags(parser, ServeSettings)
    parser.add_argument("facade_args", nargs="*", help="extra flags for the facade, after `--`")
    return parser


def addresses(stack: ServingStack, args: ServeSettings, supervisor_port: int | None, key_place: str) -> str:
    """Where each part of a started stack answers (the facade's ports: the ones it bound), and how to stop it."""
    triton, facade = stack.triton, stack.facade
    return (
        f"  Triton   {'HTTP ' + triton.http_url if triton.http else 'HTTP off'}  gRPC {triton.grpc_url}  "
        f"metrics {triton.metrics_url}\n"
        + (
            f"  supervisor  http://{triton.metrics_address}:{supervisor_port}/metrics\n"
            if supervisor_port is not None
            else ""
        )
        + (
            f"  facade   gRPC {facade.grpc_url} (inference.InferenceService)  "
            f"{facade.http_url}/metrics  {facade.http_url}/health\n"
            if facade
            else ""
        )
        + (
            f"  tracing  {args.trace_ratio:.0%} of calls, OpenTelemetry (OTLP/HTTP) to {args.otlp_endpoint}\n"
            if args.otlp_endpoint
            else ""
        )
        + f"  admin    Triton's restricted APIs want header {GRPC_ADMIN_HEADER} (gRPC) with the key in {key_place}\n"
        "Ctrl-C stops it."
    )


def main(argv: list[str] | None = None) -> int:
    paths = Paths.from_environment()
    parsed = arguments().parse_args(argv)
    args = settings_from(parsed, ServeSettings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.model_name or args.workers:
        logging.info("ignoring --model_name/--workers: every model of the repository is served as configured")
    to_terminal = args.log_dir == "-"
    log_dir = paths.build if to_terminal else Path(args.log_dir)
    repository = args.model_repository.resolve()
    startup_models = args.load_model
    try:
        check_shared_memory(repository, startup_models)
    except (ServerError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    try:
        stack = ServingStack(
            repository=repository,
            workdir=log_dir,
            triton_ports=Ports(args.http_port, args.grpc_port, args.metrics_port),
            facade_ports=(FacadeSettings.port, FacadeSettings.http_port),  # the facade's defaults; `--` flags win
            with_facade=args.facade,
            facade_args=parsed.facade_args,
            supervised=True,
            triton_http=args.triton_http,
            all_models_ready=False,  # a model that failed is listed with its reason
            startup_models=startup_models,
            backend_dir=paths.backends,
            log_files=not to_terminal,
            host=args.host,
            http_host=args.http_host,
            metrics_host=args.metrics_host or None,
            watchdog_seconds=args.watchdog_seconds,
            supervisor_metrics_port=args.supervisor_metrics_port if args.supervisor_metrics_port >= 0 else None,
            log_verbose=args.log_verbose,
            otlp_endpoint=args.otlp_endpoint,
            trace_ratio=args.trace_ratio,
        )
    except ValueError as error:  # a tracing endpoint or ratio out of range
        print(f"error: {error}", file=sys.stderr)
        return 2
    triton = stack.triton
    key_place = share_admin_key(stack.admin_key, paths)
    stop = StopRequest()
    started = time.monotonic()
    try:
        print(
            f"starting tritonserver with {triton.model_repository} (log: {triton.log_file or 'here'}) ...", flush=True
        )
        stack.start_triton()
        supervisor_port = stack.supervisor_metrics_port
        print(f"tritonserver up after {time.monotonic() - started:.1f}s", flush=True)
        print(format_model_states(triton.model_states(), repository), flush=True)
        if args.facade:
            print(f"starting the facade (log: {'here' if to_terminal else log_dir / 'facade.log'}) ...", flush=True)
            stack.start_facade()
        print(
            f"ready after {time.monotonic() - started:.1f}s\n{addresses(stack, args, supervisor_port, key_place)}",
            flush=True,
        )
        # tritonserver exiting is the supervisor's to heal; the facade exiting ends the run.
        if not stop.wait(*([stack.facade] if stack.facade else [])):
            print("error: the facade exited on its own; stopping tritonserver", file=sys.stderr)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        codes = stack.stop()
        if args.facade:
            print(f"facade stopped (exit code {codes['facade']})", flush=True)
        print(f"tritonserver stopped (exit code {codes['tritonserver']})", flush=True)
    return 0 if stop.requested else 1


if __name__ == "__main__":
    sys.exit(main())
