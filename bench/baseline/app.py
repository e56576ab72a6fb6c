"""The server a user would write instead of tritonnx: FastAPI + uvicorn + ONNX Runtime, no batching.

Each worker process holds one InferenceSession and runs every request on its own, in Starlette's default thread pool.
It runs the way the uvicorn-worker package documents for production: gunicorn managing uvicorn workers, with
gunicorn's `--reuse-port`, the model path and thread count in BASELINE_* environment variables:

    python -m bench.baseline.app --model model.onnx --port 8080 --workers 2 --intra-op-threads 1

Why not `uvicorn --workers`: its workers share one listening socket, and a worker that wakes to a burst of connections
accepts all of them; keep-alive connections then stay on it for the whole run (16 opened at once landed 16/0 three
times out of three). With one SO_REUSEPORT socket per worker the kernel hashes each new connection to a socket.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool

from bench.output import flags
from bench.peers.common import decode_named, session

# gunicorn's workers import this module by name once forked, so the settings they need travel in
# the environment rather than as arguments.
ENV_MODEL = "BASELINE_MODEL"
ENV_INTRA_OP_THREADS = "BASELINE_INTRA_OP_THREADS"
SHAPE_HEADER = "x-shape"
INPUTS_HEADER = "x-inputs"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Load the model once per worker, before the worker accepts requests."""
    app.state.session = session(os.environ[ENV_MODEL], int(os.environ.get(ENV_INTRA_OP_THREADS, "1")))
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


def parse_inputs(header: str, body: bytes, session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """The named inputs of an `x-inputs` request (`decode_named`), checked against the model's inputs."""
    declared = {i.name: i for i in session.get_inputs()}
    try:
        arrays = decode_named(header, body)
    except ValueError as error:
        raise HTTPException(400, str(error)) from None
    for name, array in arrays.items():
        if name not in declared:
            raise HTTPException(400, f"{INPUTS_HEADER}: the model has no input {name!r}")
        parse_shape(",".join(map(str, array.shape)), declared[name].shape)
    if set(arrays) != set(declared):
        raise HTTPException(400, f"{INPUTS_HEADER} {header!r} does not name every input of the model")
    return arrays


@app.post("/predict")
async def predict(request: Request) -> Response:
    """Raw little-endian float32 in (shape in `x-shape`), the first output's raw float32 out.

    A model with several inputs or integer ones (the text models) takes them named in `x-inputs`
    (`name:DATATYPE:d0,d1;...`, KServe datatype names), their raw bytes one after another in that order.
    """
    session: ort.InferenceSession = request.app.state.session
    model_input, model_output = session.get_inputs()[0], session.get_outputs()[0]
    body = await request.body()
    named = request.headers.get(INPUTS_HEADER)
    if named is not None:
        feed = parse_inputs(named, body, session)
    else:
        if model_input.type != "tensor(float)":
            raise HTTPException(
                400, f"the model's first input is {model_input.type}: name the inputs in {INPUTS_HEADER}"
            )
        shape = parse_shape(request.headers.get(SHAPE_HEADER), model_input.shape)
        expected_bytes = math.prod(shape) * 4
        if len(body) != expected_bytes:
            raise HTTPException(400, f"body has {len(body)} bytes, shape {list(shape)} needs {expected_bytes}")
        feed = {model_input.name: np.frombuffer(body, dtype="<f4").reshape(shape)}
    # The ORT call blocks, so it goes to the default thread pool as the FastAPI docs suggest;
    # concurrent requests then share the session's intra-op threads.
    (output,) = await run_in_threadpool(session.run, [model_output.name], feed)
    output = np.ascontiguousarray(output, dtype="<f4")
    return Response(
        content=output.tobytes(),
        media_type="application/octet-stream",
        headers={SHAPE_HEADER: ",".join(str(dim) for dim in output.shape)},
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline.app", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="ONNX file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--intra-op-threads", type=int, default=1, help="ONNX Runtime intra-op threads per worker")
    return parser.parse_args(argv)


def gunicorn_command(args: argparse.Namespace) -> list[str]:
    """The gunicorn command line of `args`: uvicorn workers, one SO_REUSEPORT socket each, no access log."""
    options = {
        "--worker-class": "uvicorn_worker.UvicornWorker",
        "--workers": args.workers,
        "--bind": f"{args.host}:{args.port}",
        # A worker loading a large model must not be taken for a hung one (gunicorn's default is 30 s).
        "--timeout": 120,
        "--log-level": "info",
    }
    return [sys.executable, "-m", "gunicorn", "bench.baseline.app:app", "--reuse-port", *flags(options)]


def main(argv: list[str] | None = None) -> None:
    """Become gunicorn (same PID); the workers read the model path and thread count from the environment."""
    args = parse_args(argv)
    os.environ[ENV_MODEL] = os.path.abspath(args.model)
    os.environ[ENV_INTRA_OP_THREADS] = str(args.intra_op_threads)
    command = gunicorn_command(args)
    print(" ".join(command), flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
