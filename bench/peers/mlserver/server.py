"""MLServer serving an ONNX file: a custom runtime running ONNX Runtime, adaptive batching, parallel workers.

Writes MLServer's settings into a folder of its own (under `--workdir`, else a new temporary one) and runs `mlserver
start` on it. The setup its docs give for throughput: `parallel_workers` processes (one per core), adaptive batching,
clients on KServe v2 gRPC (`--port`) with `raw_input_contents`. Every endpoint is on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from bench.peers.common import HOST, arguments, session

DATATYPES = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32"}  # ONNX -> KServe v2


def settings(args, folder: Path) -> None:  # noqa: ANN001 - the parsed arguments
    """settings.json (the server) and <name>/model-settings.json (the model) in `folder`."""
    onnx = session(args.model)
    tensors = lambda specs: [  # noqa: E731
        {"name": s.name, "datatype": DATATYPES[s.type], "shape": [d if isinstance(d, int) else -1 for d in s.shape]}
        for s in specs
    ]
    server = {
        "host": HOST,
        "http_port": args.http_port,
        "grpc_port": args.port,
        "metrics_port": args.metrics_port,
        "parallel_workers": args.workers,
        "debug": False,
    }
    model = {
        "name": args.name,
        "implementation": "bench.peers.mlserver.runtime.OnnxModel",
        "max_batch_size": args.max_batch_size,
        "max_batch_time": args.batch_wait_ms / 1000,
        "inputs": tensors(onnx.get_inputs()),
        "outputs": tensors(onnx.get_outputs()),
        "parameters": {"uri": str(args.model.resolve()), "extra": {"threads": args.threads}},
    }
    (folder / "settings.json").write_text(json.dumps(server, indent=2))
    (folder / args.name).mkdir()
    (folder / args.name / "model-settings.json").write_text(json.dumps(model, indent=2))


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__.splitlines()[0], "python -m bench.peers.mlserver.server").parse_args(argv)
    if args.workdir:
        folder = args.workdir / f"mlserver-{args.port}"
        folder.mkdir(parents=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="mlserver-"))
    settings(args, folder)
    # The venv's `mlserver` command (the package has no __main__).
    command = [str(Path(sys.executable).parent / "mlserver"), "start", str(folder)]
    print(" ".join(command), flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
