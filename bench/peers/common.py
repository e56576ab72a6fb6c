"""What every peer's server shares, inside the peer's own venv: the ONNX session, named inputs, the command line.

Standard library, numpy and onnxruntime only (every peer venv has them), and the project's dtype table; the servers
are started by `bench.peers.servers` with the same options, so each runs the same model.onnx the same way.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tritonnx.backend.tensors import RAW_DTYPES  # numpy only: the peers' venvs import it from this checkout

HOST = "127.0.0.1"


def session(model: str | Path, intra_op_threads: int = 1) -> ort.InferenceSession:
    """One CPU session of the model, `intra_op_threads` threads per run, as tritonnx's stubs use it."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def run(onnx_session: ort.InferenceSession, images: np.ndarray) -> np.ndarray:
    """The first output for a float32 batch of the first input."""
    name = onnx_session.get_inputs()[0].name
    return onnx_session.run(None, {name: np.ascontiguousarray(images, dtype=np.float32)})[0]


def decode_named(header: str, body: bytes) -> dict[str, np.ndarray]:
    """The named inputs of an `x-inputs` request (`name:DATATYPE:d0,d1;...`, raw bytes in that order); ValueError."""
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    try:
        for part in header.split(";"):
            name, datatype, dims = part.split(":")
            shape = tuple(int(dim) for dim in dims.split(","))
            dtype = RAW_DTYPES[datatype]
            arrays[name] = np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
            offset += math.prod(shape) * dtype.itemsize
    except (KeyError, ValueError) as error:
        raise ValueError(f"x-inputs must be name:DATATYPE:d0,d1;... fitting the body, got {header!r}") from error
    if offset != len(body):
        raise ValueError(f"x-inputs {header!r} accounts for {offset} bytes, the body has {len(body)}")
    return arrays


def run_grouped(onnx_session: ort.InferenceSession, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The first output of each request's named inputs: requests of the same shapes (no padding) run as one batch."""
    groups: dict[tuple, list[int]] = {}
    for index, feed in enumerate(feeds):
        groups.setdefault(tuple((name, array.shape) for name, array in feed.items()), []).append(index)
    outputs: list[np.ndarray] = [np.empty(0)] * len(feeds)
    for members in groups.values():
        batch = {name: np.concatenate([feeds[i][name] for i in members]) for name in feeds[members[0]]}
        rows = np.cumsum([len(next(iter(feeds[i].values()))) for i in members])[:-1]
        for i, part in zip(members, np.split(onnx_session.run(None, batch)[0], rows), strict=True):
            outputs[i] = part
    return outputs


def arguments(description: str, prog: str) -> argparse.ArgumentParser:
    """The options every peer server takes (each peer adds its own)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--model", type=Path, required=True, help="ONNX file (image input [batch, 3, 224, 224])")
    parser.add_argument("--name", required=True, help="the model's name where the peer names models")
    parser.add_argument("--port", type=int, required=True, help="HTTP port (or gRPC for KServe peers), on 127.0.0.1")
    parser.add_argument("--workers", type=int, default=2, help="worker processes / replicas / instances")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads per worker")
    parser.add_argument("--max-batch-size", type=int, default=16, help="largest batch the peer may form")
    parser.add_argument("--batch-wait-ms", type=float, default=1.0, help="longest wait to fill a batch")
    parser.add_argument("--workdir", type=Path, help="where a peer writes the files it needs (MLServer's settings)")
    parser.add_argument("--http-port", type=int, help="the KServe peers' HTTP port, beside --port")
    parser.add_argument("--metrics-port", type=int, help="the KServe peers' metrics port")
    return parser
