"""LitServe serving an ONNX file: a LitAPI running ONNX Runtime, batched, on CPU worker processes.

    python -m bench.peers.litserve.server --model model.onnx --name m --port 8000 --workers 2 \
        --max-batch-size 16 --batch-wait-ms 1

The setup LitServe's docs give for throughput: batching on the LitAPI (`max_batch_size`,
`batch_timeout`, with `batch`/`unbatch` to join and split arrays), `accelerator="cpu"` with
`workers_per_device` inference processes, and `fast_queue=True` (ZeroMQ between the front end and
the workers). The payload is JSON with the raw float32 bytes in base64 (the way LitServe's
examples carry images), so no number is parsed from text: `{"input": ..., "shape": [...]}` in,
`{"output": ...}` out; the text models' named inputs as `{"inputs": <x-inputs>, "data": ...}`. POST /predict on
127.0.0.1.
"""

from __future__ import annotations

import base64

import litserve as ls
import numpy as np

from bench.peers.common import HOST, arguments, decode_named, run, run_grouped, session


class OnnxApi(ls.LitAPI):
    def __init__(self, model: str, threads: int, **batching: float) -> None:
        super().__init__(**batching)
        self.model, self.threads = model, threads

    def setup(self, device: str) -> None:
        self.session = session(self.model, self.threads)

    def decode_request(self, request: dict) -> np.ndarray | dict[str, np.ndarray]:
        if "inputs" in request:  # the text models: named inputs (bench.load.http.Base64Json.encode_named)
            return decode_named(request["inputs"], base64.b64decode(request["data"]))
        data = np.frombuffer(base64.b64decode(request["input"]), "<f4")
        return data.reshape(request["shape"])

    def batch(self, inputs: list) -> np.ndarray | list[dict[str, np.ndarray]]:
        return inputs if isinstance(inputs[0], dict) else np.concatenate(inputs)

    def predict(self, batch: np.ndarray | list[dict[str, np.ndarray]]) -> np.ndarray | list[np.ndarray]:
        # Named inputs: requests of the same shapes run together (sequences of different lengths cannot).
        return run_grouped(self.session, batch) if isinstance(batch, list) else run(self.session, batch)

    def unbatch(self, output: np.ndarray | list[np.ndarray]) -> list[np.ndarray]:
        return output if isinstance(output, list) else [row[None] for row in output]

    def encode_response(self, output: np.ndarray) -> dict[str, str]:
        return {"output": base64.b64encode(np.ascontiguousarray(output, "<f4").tobytes()).decode("ascii")}


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__.splitlines()[0], "python -m bench.peers.litserve.server").parse_args(argv)
    api = OnnxApi(
        str(args.model), args.threads, max_batch_size=args.max_batch_size, batch_timeout=args.batch_wait_ms / 1000
    )
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=args.workers, fast_queue=True)
    server.run(host=HOST, port=args.port, generate_client_file=False)


if __name__ == "__main__":
    main()
