"""python -m bench.studies.burst: many large calls at once on one channel, and how fast the refused learn it.

All `--calls` Predict calls (one image each, about 600 KB) start together on one gRPC channel to
the facade, far above its in-flight limit. The accepted ones must come back right (each answer is
compared with in-process ONNX Runtime); the refused ones get RESOURCE_EXHAUSTED, and what matters
for them is how long the caller waited to be told (goal: p99 within 50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from backend.server.repository import link_models
from backend.server.stack import ServingStack
from bench import REPOSITORY
from bench.load.burst import REFUSED, burst
from bench.load.stats import OK
from bench.output import run_folder, say, write_json
from bench.overload import IMAGE_SHAPE, expected_outputs, path_target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.burst",
        description="Start many ~600 KB Predict calls at once on one channel to the facade (its own tritonserver on "
        "free ports) and report how fast the refused ones are told and whether the accepted ones are right.",
    )
    parser.add_argument("--model", default="mobilenet_v3_small", help="default: %(default)s")
    parser.add_argument("--calls", type=int, default=400, help="calls started together; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=3, help="bursts, one after the other; default: %(default)s")
    parser.add_argument("--max-in-flight", type=int, default=64, help="the facade's limit; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-burst")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "burst")
    rng = np.random.default_rng(0)
    images = [rng.standard_normal(IMAGE_SHAPE, dtype=np.float32) for _ in range(4)]
    expected = expected_outputs(REPOSITORY / args.model / "1" / "model.onnx", images)
    facade_args = ["--default-model", args.model, "--max-in-flight", str(args.max_in_flight)]
    results = []
    repository = link_models(out / "repository", {args.model: REPOSITORY / args.model})
    with ServingStack(repository, out, facade_args=facade_args) as stack:
        assert stack.facade is not None
        target = path_target("facade", stack.facade.grpc_url, args.model, images, expected)

        async def rounds() -> None:
            try:
                for index in range(args.rounds):
                    result = await burst(target, args.calls)
                    say(f"burst {index + 1}: {result.summary()}")
                    results.append(result)
            finally:
                await target.close()

        asyncio.run(rounds())
    write_json(out / "results.json", [asdict(r) for r in results])
    print(f"results: {out / 'results.json'}")
    return 0 if all(r.wrong_outputs == 0 and set(r.statuses) <= {OK, REFUSED} for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
