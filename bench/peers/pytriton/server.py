"""PyTriton serving an ONNX file: ONNX Runtime inside PyTriton's `@batch` inference callables.

The setup PyTriton documents for throughput: Triton's dynamic batcher in front and several model instances (a list of
inference callables given to `Triton.bind`, each with a session of its own). The callables run on threads of this
process; ONNX Runtime releases the GIL while it runs, so the instances compute side by side. Clients use Triton's
KServe v2 gRPC on `--port`; every address is loopback. SIGTERM or SIGINT stops Triton.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from bench.peers.common import HOST, arguments, session

# ONNX type -> numpy dtype, for the types PyTriton's Tensor takes.
_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def tensors(args: list) -> list[Tensor]:
    """PyTriton's view of ONNX inputs or outputs: the batch dimension left out, symbolic dimensions -1."""
    return [
        Tensor(name=a.name, dtype=_DTYPES[a.type], shape=tuple(d if isinstance(d, int) else -1 for d in a.shape[1:]))
        for a in args
    ]


def infer_function(onnx_session: ort.InferenceSession) -> Callable:
    """One instance's inference callable: Triton's batch in, every output of the session out."""
    names = [output.name for output in onnx_session.get_outputs()]

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(names, onnx_session.run(names, inputs), strict=True))

    return infer


def interrupt_once(signum: int, frame: object) -> None:  # noqa: ARG001 - signal handler signature
    """Triton.serve() stops Triton on KeyboardInterrupt: SIGTERM becomes one, once (the group gets it more than once)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__.splitlines()[0], "python -m bench.peers.pytriton.server").parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sessions = [session(args.model, args.threads) for _ in range(args.workers)]
    config = TritonConfig(
        http_address=HOST,
        http_port=args.http_port,
        grpc_address=HOST,
        grpc_port=args.port,
        metrics_address=HOST,
        metrics_port=args.metrics_port,
    )
    signal.signal(signal.SIGTERM, interrupt_once)
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=[infer_function(s) for s in sessions],
            inputs=tensors(sessions[0].get_inputs()),
            outputs=tensors(sessions[0].get_outputs()),
            config=ModelConfig(
                max_batch_size=args.max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=round(args.batch_wait_ms * 1000)),
            ),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    main()
