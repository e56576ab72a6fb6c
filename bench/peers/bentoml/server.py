"""BentoML serving an ONNX file: a @bentoml.service running ONNX Runtime in worker processes.

    python -m bench.peers.bentoml.server --model model.onnx --name m --port 3000 --workers 2

runs `bentoml serve bench.peers.bentoml.server:OnnxService` on 127.0.0.1 with the settings in
BENCH_BENTOML_* environment variables (BentoML imports this module again in each worker).

The setup BentoML's docs give for a CPU model: `@bentoml.service(workers=...)`, one process per
core. The image travels as a file, the binary input BentoML documents (a `Path` parameter, sent as
multipart/form-data), holding the raw float32 bytes: BentoML's adaptive batching needs a batchable
input (an array, sent as JSON numbers), and parsing 150,528 numbers from text per image costs more
than batching gains (one short run at c=16: 97 img/s with a batched JSON array, 262 with the file).
The text models' named inputs travel the same way, their raw bytes as the file and their names, types and
shapes in an `x-inputs` header. The answer is the output array, JSON. POST /predict.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import bentoml
import numpy as np

from bench.peers.common import HOST, arguments, decode_named, run, run_grouped, session

ENV = "BENCH_BENTOML_"


@bentoml.service(workers=int(os.environ.get(f"{ENV}WORKERS", "1")), traffic={"timeout": 60})
class OnnxService:
    def __init__(self) -> None:
        self.session = session(Path(os.environ[f"{ENV}MODEL"]), int(os.environ.get(f"{ENV}THREADS", "1")))
        self.shape = [dim if isinstance(dim, int) else -1 for dim in self.session.get_inputs()[0].shape]

    @bentoml.api(route="/predict")
    def predict(self, input: Path, context: bentoml.Context) -> np.ndarray:  # noqa: A002 - the form field's name
        named = context.request.headers.get("x-inputs")
        if named is not None:  # the text models: named inputs, their raw bytes as the file
            return run_grouped(self.session, [decode_named(named, input.read_bytes())])[0]
        images = np.frombuffer(input.read_bytes(), "<f4").reshape(self.shape)
        return run(self.session, images)


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__.splitlines()[0], "python -m bench.peers.bentoml.server").parse_args(argv)
    os.environ.update({f"{ENV}MODEL": str(args.model.resolve()), f"{ENV}WORKERS": str(args.workers),
                       f"{ENV}THREADS": str(args.threads), "BENTOML_DO_NOT_TRACK": "True"})  # fmt: skip
    command = [sys.executable, "-m", "bentoml", "serve", "bench.peers.bentoml.server:OnnxService",
               "--host", HOST, "--port", str(args.port)]  # fmt: skip
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
