"""python -m bench.loadgen: closed-loop load on one target, from the command line.

The engine is bench.load (targets, loops, statistics); this runs its closed loop once per
concurrency and prints one line (or one JSON object) per run.

    python -m bench.loadgen --target kserve --url 127.0.0.1:8001 --model resnet50 --concurrency 1 4 16
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.load.http import HttpTarget
from bench.load.loops import run
from bench.load.targets import FacadeTarget, KServeTarget, Target, VerificationError


def make_target(kind: str, url: str, model: str, batch: int, seed: int = 0) -> Target:
    if kind == "kserve":
        return KServeTarget(url, model, batch, seed=seed)
    if kind == "facade":
        return FacadeTarget(url, model, batch, raw=True, seed=seed)
    if kind == "facade-floats":
        return FacadeTarget(url, model, batch, raw=False, seed=seed)
    if kind == "http":
        return HttpTarget(url, batch, model=model, seed=seed)
    raise ValueError(f"unknown target {kind!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description=(
            "Closed-loop load on one target: N workers each send the same pre-serialized request, await "
            "the answer and send again. A warm-up (not recorded) comes first, then a measured window that "
            "ends at --duration or after --max-requests calls. The first response is decoded and checked; "
            "later ones only count status. Prints one line per concurrency: throughput, latency "
            "percentiles, the generator's own CPU (100% = one full core) and errors by status."
        ),
        epilog=(
            "targets: kserve = Triton's KServe v2 gRPC ModelInfer (inputs from the model's metadata); "
            "facade = inference.InferenceService/Predict with raw_data; facade-floats = the same with the "
            "float list of the simple contract; http = POST {url}/predict with raw float32 bytes (FastAPI "
            "baseline).  Examples:  python -m bench.loadgen --target kserve --url 127.0.0.1:8001 "
            "--model resnet50 --concurrency 1 4 16 --duration 10   |   python -m bench.loadgen --target "
            "http --url http://127.0.0.1:8080 --concurrency 1 8 --json"
        ),
    )
    parser.add_argument(
        "--target",
        required=True,
        choices=("kserve", "facade", "facade-floats", "http"),
        help="what to load (see below)",
    )
    parser.add_argument("--url", required=True, help="HOST:PORT for gRPC targets, http://HOST:PORT for http")
    parser.add_argument("--model", default="resnet50", help="model name (a label only for http); default: resnet50")
    parser.add_argument("--batch", type=int, default=1, help="images (or sequences) per request; default: 1")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1], metavar="N", help="one run per value, e.g. 1 2 4; default: 1"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run; default: 10")
    parser.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds before each run; default: 1")
    parser.add_argument(
        "--max-requests",
        type=int,
        default=100_000,
        help="end a run after this many measured calls if the duration has not passed; default: 100000",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input data; default: 0")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run instead of a text line")
    args = parser.parse_args(argv)
    if any(c < 1 for c in args.concurrency) or args.batch < 1:
        parser.error("--concurrency and --batch must be at least 1")

    target = make_target(args.target, args.url, args.model, args.batch, args.seed)
    for concurrency in args.concurrency:
        try:
            result = run(target, concurrency, args.duration, args.warmup, args.max_requests)
        except VerificationError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(json.dumps(result.as_dict()) if args.json else result.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
