"""python -m client.serve: tritonserver and the facade together, as `make serve` runs them.

Starts the serving stack (backend/server/stack.py): tritonserver with the model repository on
ports 8000-8002, a supervisor (its metrics on 8003) that reloads a model whose stub process died and restarts
tritonserver if it exits, and the facade on 50051 (gRPC) and 3000 (HTTP), ready once a real
inference went through. Ctrl-C or SIGTERM drains the facade first, then stops Triton.

Triton's restricted APIs (model control, repository index, shared memory, trace, logging) need the admin key:
$TRITONNX_ADMIN_KEY when set, else a new random key written to <build>/admin-key (mode 600).
Paths come from $TRITONNX_MODEL_REPOSITORY and $TRITONNX_BUILD_DIR (backend/server/paths.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from backend.server.admin import GRPC_ADMIN_HEADER, share_admin_key
from backend.server.paths import Paths
from backend.server.process import ServerError, StopRequest
from backend.server.shm import check_shared_memory
from backend.server.stack import ServingStack
from backend.server.triton import Ports, format_model_states


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def main(argv: list[str] | None = None) -> int:
    paths = Paths.from_environment()
    parser = argparse.ArgumentParser(
        prog="tritonnx-serve",
        description="Run tritonserver with the model repository, its supervisor and the gRPC facade in front of it, "
        "until Ctrl-C or SIGTERM (`python -m client.serve` is the same command).",
        epilog="Facade flags (e.g. --max-in-flight, --default-model) go after `--`; see tritonnx-facade --help. "
        "Each flag's environment variable is in its help; the model repository and the build folder come from "
        "TRITONNX_MODEL_REPOSITORY and TRITONNX_BUILD_DIR, the admin key from TRITONNX_ADMIN_KEY.",
    )
    # KServe's spellings (--model_dir, --http_port, --grpc_port, --model_name, --workers) are taken
    # too: a ServingRuntime's container gets an InferenceService's `model.args` appended to its own.
    parser.add_argument(
        "--model-repository",
        "--model_dir",
        type=Path,
        default=paths.model_repository,
        help="default: %(default)s (--model_dir is KServe's name for it)",
    )
    parser.add_argument(
        "--log-dir",
        default=str(paths.build),
        help="where tritonserver.log and facade.log go; '-' for this process's output (a container's log); "
        "default: %(default)s",
    )
    parser.add_argument(
        "--host",
        default=_env("TRITONNX_TRITON_HOST", "127.0.0.1"),
        help="where Triton listens; 0.0.0.0 in a container with port mappings (env TRITONNX_TRITON_HOST; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--http-port",
        "--http_port",
        type=int,
        default=int(_env("TRITONNX_TRITON_HTTP_PORT", "8000")),
        help="Triton's HTTP port (env TRITONNX_TRITON_HTTP_PORT; default: %(default)s)",
    )
    parser.add_argument(
        "--grpc-port",
        "--grpc_port",
        type=int,
        default=int(_env("TRITONNX_TRITON_GRPC_PORT", "8001")),
        help="Triton's gRPC port (env TRITONNX_TRITON_GRPC_PORT; default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("TRITONNX_TRITON_METRICS_PORT", "8002")),
        help="Triton's metrics port (env TRITONNX_TRITON_METRICS_PORT; default: %(default)s)",
    )
    parser.add_argument(
        "--supervisor-metrics-port",
        type=int,
        default=int(_env("TRITONNX_SUPERVISOR_METRICS_PORT", "8003")),
        help="the supervisor's Prometheus metrics (models healed, server restarts, models ready), on --host; "
        "-1 turns them off (env TRITONNX_SUPERVISOR_METRICS_PORT; default: %(default)s)",
    )
    parser.add_argument(
        "--log-verbose",
        type=int,
        default=int(_env("TRITONNX_TRITON_LOG_VERBOSE", "0")),
        help="tritonserver's --log-verbose level (env TRITONNX_TRITON_LOG_VERBOSE; default: %(default)s)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=_env("TRITONNX_OTLP_ENDPOINT", ""),
        help="OpenTelemetry tracing: tritonserver and the facade send spans to this OTLP/HTTP receiver "
        "(e.g. http://127.0.0.1:4318; `python -m client.traces` is one), one trace per call from the facade "
        "through Triton's queue and compute (env TRITONNX_OTLP_ENDPOINT; default: off)",
    )
    parser.add_argument(
        "--trace-ratio",
        type=float,
        default=float(_env("TRITONNX_TRACE_RATIO", "0.1")),
        help="share of the facade's calls traced, 0..1; Triton traces the requests that carry a trace context: "
        "those calls, and direct requests sent with a traceparent (env TRITONNX_TRACE_RATIO; default: %(default)s)",
    )
    parser.add_argument(
        "--load-model",
        action="append",
        help="a model to load at start, repeatable; default: every model of the repository (env "
        "TRITONNX_TRITON_LOAD_MODELS, comma-separated)",
    )
    parser.add_argument(
        "--triton-http",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve Triton's HTTP endpoint (the facade needs only gRPC; --no-triton-http turns it off); default: on",
    )
    parser.add_argument(
        "--facade",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the facade in front of Triton (--no-facade: tritonserver alone, as the container does); default: on",
    )
    # Taken and ignored: Triton serves every model of the repository whatever the InferenceService
    # is called, and the models' instance groups, not a worker count, set the parallelism.
    parser.add_argument("--model_name", help=argparse.SUPPRESS)
    parser.add_argument("--workers", help=argparse.SUPPRESS)
    parser.add_argument("facade_args", nargs="*", help="extra flags for the facade, after `--`")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.model_name or args.workers:
        logging.info("ignoring --model_name/--workers: every model of the repository is served as configured")
    to_terminal = args.log_dir == "-"
    log_dir = paths.build if to_terminal else Path(args.log_dir)
    repository = args.model_repository.resolve()
    startup_models = tuple(args.load_model or filter(None, _env("TRITONNX_TRITON_LOAD_MODELS", "*").split(",")))
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
            facade_ports=(50051, 3000),
            with_facade=args.facade,
            facade_args=args.facade_args,
            supervised=True,
            triton_http=args.triton_http,
            all_models_ready=False,  # a model that failed is listed with its reason
            startup_models=startup_models,
            backend_dir=paths.backends,
            log_files=not to_terminal,
            host=args.host,
            log_verbose=args.log_verbose,
            supervisor_metrics_port=args.supervisor_metrics_port if args.supervisor_metrics_port >= 0 else None,
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
        print(f"tritonserver up after {time.monotonic() - started:.1f}s", flush=True)
        print(format_model_states(triton.model_states()), flush=True)
        facade = None
        if args.facade:
            print(f"starting the facade (log: {'here' if to_terminal else log_dir / 'facade.log'}) ...", flush=True)
            facade = stack.start_facade()
        print(
            f"ready after {time.monotonic() - started:.1f}s\n"
            f"  Triton   {'HTTP ' + triton.http_url if triton.http else 'HTTP off'}  gRPC {triton.grpc_url}  "
            f"metrics {triton.metrics_url}\n"
            + (
                f"  supervisor  http://{args.host}:{stack.supervisor_metrics_port}/metrics\n"
                if stack.supervisor_metrics_port is not None
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
            "Ctrl-C stops it.",
            flush=True,
        )
        # tritonserver exiting is the supervisor's to heal; the facade exiting ends the run.
        if not stop.wait(*([facade] if facade else [])):
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
