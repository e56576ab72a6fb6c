"""The server a user would write instead of tritonnx: FastAPI + uvicorn + ONNX Runtime, no batching.

Each uvicorn worker process holds one InferenceSession and runs every request on its own,
in Starlette's default thread pool. Run it with

    python -m bench.baseline.app --model model.onnx --port 8080 --workers 2 --intra-op-threads 1

or, with the same settings in BASELINE_* environment variables, `uvicorn bench.baseline.app:app`.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool

# uvicorn workers import this module by name in fresh processes, so the settings they need
# travel in the environment rather than as arguments.
ENV_MODEL = "BASELINE_MODEL"
ENV_INTRA_OP_THREADS = "BASELINE_INTRA_OP_THREADS"
SHAPE_HEADER = "x-shape"


def create_session(model_path: str, intra_op_threads: int) -> ort.InferenceSession:
    """One CPU session: `intra_op_threads` threads per run, sequential execution, all graph optimizations."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    if session.get_inputs()[0].type != "tensor(float)":
        raise ValueError(f"{model_path}: the first input must be float32, got {session.get_inputs()[0].type}")
    return session


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Load the model once per worker, before the worker accepts requests."""
    app.state.session = create_session(os.environ[ENV_MODEL], int(os.environ.get(ENV_INTRA_OP_THREADS, "1")))
    yield


app = FastAPI(title="ONNX baseline", lifespan=lifespan)


def parse_shape(header: str | None, expected: list[int | str | None]) -> tuple[int, ...]:
    """The request's `x-shape` as ints, checked against the model input's rank and fixed dimensions."""
    if header is None:
        raise HTTPException(400, f"missing {SHAPE_HEADER} header")
    try:
        shape = tuple(int(dim) for dim in header.split(","))
    except ValueError:
        raise HTTPException(400, f"{SHAPE_HEADER} must be comma-separated integers, got {header!r}") from None
    if any(dim <= 0 for dim in shape):
        raise HTTPException(400, f"{SHAPE_HEADER} dimensions must be positive, got {header!r}")
    # Symbolic dimensions come back from ORT as strings (or None); only fixed ones are checked.
    if len(shape) != len(expected) or any(isinstance(e, int) and e != d for d, e in zip(shape, expected, strict=False)):
        raise HTTPException(400, f"{SHAPE_HEADER} {header!r} does not fit the model input shape {expected}")
    return shape


@app.get("/health")
def health() -> dict[str, str]:
    """Liveness: uvicorn only serves once the lifespan (model load) has finished."""
    return {"status": "ok"}


@app.post("/predict")
async def predict(request: Request) -> Response:
    """Raw little-endian float32 in (shape in `x-shape`), the first output's raw float32 out."""
    session: ort.InferenceSession = request.app.state.session
    model_input, model_output = session.get_inputs()[0], session.get_outputs()[0]
    shape = parse_shape(request.headers.get(SHAPE_HEADER), model_input.shape)
    body = await request.body()
    expected_bytes = math.prod(shape) * 4
    if len(body) != expected_bytes:
        raise HTTPException(400, f"body has {len(body)} bytes, shape {list(shape)} needs {expected_bytes}")
    array = np.frombuffer(body, dtype="<f4").reshape(shape)
    # The ORT call blocks, so it goes to the default thread pool as the FastAPI docs suggest;
    # concurrent requests then share the session's intra-op threads.
    (output,) = await run_in_threadpool(session.run, [model_output.name], {model_input.name: array})
    output = np.ascontiguousarray(output, dtype="<f4")
    return Response(
        content=output.tobytes(),
        media_type="application/octet-stream",
        headers={SHAPE_HEADER: ",".join(str(dim) for dim in output.shape)},
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line, each option defaulting to its BASELINE_* environment variable."""
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m bench.baseline.app", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=env(ENV_MODEL), required=env(ENV_MODEL) is None, help="ONNX file")
    parser.add_argument("--host", default=env("BASELINE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("BASELINE_PORT", "8080")))
    parser.add_argument("--workers", type=int, default=int(env("BASELINE_WORKERS", "1")), help="uvicorn processes")
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=int(env(ENV_INTRA_OP_THREADS, "1")),
        help="ONNX Runtime intra-op threads per worker",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Serve with uvicorn; the workers read the model path and thread count from the environment."""
    args = parse_args(argv)
    os.environ[ENV_MODEL] = os.path.abspath(args.model)
    os.environ[ENV_INTRA_OP_THREADS] = str(args.intra_op_threads)
    # The access log is off: a line per request would grow the log with the benchmark's load.
    uvicorn.run(
        "bench.baseline.app:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level="info",
        access_log=False,
    )


if __name__ == "__main__":
    main()
