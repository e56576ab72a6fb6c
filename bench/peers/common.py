"""What every peer's server shares, inside the peer's own venv: the ONNX session and the command line.

Standard library, numpy and onnxruntime only (every peer venv has them); the servers are started
by `bench.peers.servers` with the same options, so each runs the same model.onnx the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnxruntime as ort

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
    return parser
