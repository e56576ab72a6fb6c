"""Send inference requests to a model on Triton and show what comes back.

The inputs are built from the model's own metadata, so any model can be tried without writing
code: random or zero tensors of the right names, datatypes and shapes, or arrays from .npy files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tritonnx.client.infer_inputs import GENERATED_SOURCES, InputError, build_inputs
from tritonnx.client.model_control import ControlError, TritonControl, TritonUnreachable
from tritonnx.client.triton_common import URL_HELP_EPILOG, add_connection_args, resolve_url

# How many leading values to show of an output that gets no top-k listing.
FIRST_VALUES = 8

EPILOG = f"""\
Input sources (--input for every input, --input-name NAME=SOURCE for one):
  random    FP16/FP32/FP64: standard normal; integer inputs whose name contains "mask": ones;
            other integer inputs: uniform ints in [0, 1000); BOOL: random
  zeros     zeros of the input's datatype
  PATH.npy  the array as stored, converted to the input's datatype where numpy's "same_kind"
            casting allows it (float64 -> FP32, int64 -> INT32, not float -> INT); a missing
            batch dim is added, repeating the array --batch-size times

Dims of -1 take --batch-size (the batch dim of a model with max_batch_size > 0) or --seq-len
(any other variable dim). Outputs: FP32 outputs of shape [batch, N] with N >= 10 show the top-k
(index, score) per row, others their first {FIRST_VALUES} values.

Exit codes: 0 success, 1 inference or input error, 2 bad arguments or server unreachable.

Examples:
  python -m tritonnx.client.triton_infer --model resnet50
  python -m tritonnx.client.triton_infer --model resnet50 --batch-size 4 --requests 50 --json
  python -m tritonnx.client.triton_infer --model resnet50 --protocol http --input image.npy
  python -m tritonnx.client.triton_infer --model bert --seq-len 128 --input-name attention_mask=zeros

{URL_HELP_EPILOG}
"""


def _source(value: str) -> str:
    if value in GENERATED_SOURCES or value.endswith(".npy"):
        return value
    raise argparse.ArgumentTypeError(f"expected random, zeros or a .npy path, not {value!r}")


def _named_source(value: str) -> tuple[str, str]:
    name, sep, source = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=SOURCE, not {value!r}")
    return name, _source(source)


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {number}")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tritonnx.client.triton_infer",
        description="Build inputs from a model's metadata, send inference requests to Triton\n"
        "(tensors as binary data), and print the outputs and the client-side latency.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="model name in the repository")
    add_connection_args(parser)
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1,
        metavar="N",
        help="batch dim of generated inputs and of .npy files without one (default: 1)",
    )
    parser.add_argument(
        "--input",
        type=_source,
        default="random",
        metavar="random|zeros|PATH.npy",
        help="source of every input not named by --input-name (default: random)",
    )
    parser.add_argument(
        "--input-name",
        type=_named_source,
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=SOURCE",
        help="source of one input, e.g. attention_mask=zeros or pixels=img.npy (repeatable)",
    )
    parser.add_argument(
        "--seq-len",
        type=_positive_int,
        default=16,
        help="size of variable (-1) dims other than the batch dim (default: 16)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for random inputs (default: 0)")
    parser.add_argument(
        "--requests",
        type=_positive_int,
        default=1,
        metavar="K",
        help="send the same request K times, one after another (default: 1)",
    )
    parser.add_argument("--top-k", type=_positive_int, default=5, help="classes shown per row (default: 5)")
    parser.add_argument(
        "--timeout-ms",
        type=_positive_float,
        metavar="T",
        help="client-side limit for each call to the server (default: none)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [name for name, _ in args.input_name]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        parser.error(f"--input-name given more than once for: {', '.join(duplicates)}")
    return args


def _plain(value: Any) -> Any:
    """A JSON-ready Python value of one array element.

    float32/float16 go through their own shortest repr, so 0.101 is reported as 0.101 and not as 0.10100000351667404.
    """
    if isinstance(value, (np.float32, np.float16)):
        return float(str(value))
    if isinstance(value, np.generic):
        return value.item()
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def top_k(scores: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """Per row of a 2-D array, the k highest (index, score) pairs, highest first.

    Ties keep the lower index first so the listing is reproducible.
    """
    k = min(k, scores.shape[-1])
    order = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    return [[(int(i), _plain(row[i])) for i in row_order] for row, row_order in zip(scores, order, strict=False)]


def describe_output(name: str, datatype: str, array: np.ndarray, k: int) -> dict:
    """What is shown of one output.

    Top-k per row for classifier-like outputs (FP32 [batch, N] with N >= 10), the first values otherwise.
    """
    described: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if datatype == "FP32" and array.ndim == 2 and array.shape[-1] >= 10:
        described["top_k"] = [[{"index": index, "score": score} for index, score in row] for row in top_k(array, k)]
    else:
        described["first_values"] = [_plain(v) for v in array.reshape(-1)[:FIRST_VALUES]]
    return described


def latency_stats(latencies_ms: Sequence[float]) -> dict[str, Any]:
    """Per-request latencies and their p50/p90/p99/mean (percentiles linearly interpolated), rounded to the microsecond.

    Finer digits are timer noise.
    """
    values = np.asarray(latencies_ms, dtype=np.float64)
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "per_request": [round(float(v), 3) for v in values],
        "p50": round(float(p50), 3),
        "p90": round(float(p90), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(values.mean()), 3),
    }


def run(client: TritonControl, args: argparse.Namespace) -> dict[str, Any]:
    """Fetch the model's metadata and config, send the requests, and return the report."""
    # First contact goes through the liveness probe, so that a server that cannot be reached (or
    # never answers) is reported as such (exit 2) rather than as a failed metadata request.
    client.server_live()
    metadata = client.metadata(args.model)
    max_batch_size = int(client.config(args.model).get("max_batch_size", 0))
    named_sources = dict(args.input_name)
    inputs = build_inputs(metadata, max_batch_size, args.input, named_sources, args.batch_size, args.seq_len, args.seed)
    input_datatypes = {spec["name"]: spec["datatype"] for spec in metadata["inputs"]}
    output_datatypes = {spec["name"]: spec["datatype"] for spec in metadata["outputs"]}

    latencies_ms = []
    for _ in range(args.requests):
        start = time.perf_counter()
        outputs, model_version = client.infer(args.model, inputs, input_datatypes, list(output_datatypes))
        latencies_ms.append((time.perf_counter() - start) * 1000.0)

    return {
        "model": args.model,
        "model_version": model_version,
        "url": client.url,
        "protocol": client.protocol,
        "inputs": [
            {
                "name": spec["name"],
                "datatype": spec["datatype"],
                "shape": list(inputs[spec["name"]].shape),
                "source": named_sources.get(spec["name"], args.input),
            }
            for spec in metadata["inputs"]
        ],
        # Every request carries the same inputs, so the last response stands for all of them.
        "outputs": [
            describe_output(name, datatype, outputs[name], args.top_k) for name, datatype in output_datatypes.items()
        ],
        "latency_ms": latency_stats(latencies_ms),
    }


def _value(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def format_report(report: dict[str, Any], seed: int) -> str:
    version = f" version {report['model_version']}" if report["model_version"] else ""
    lines = [f"model {report['model']}{version} at {report['url']} ({report['protocol']})", "inputs:"]
    for spec in report["inputs"]:
        source = f"random (seed {seed})" if spec["source"] == "random" else spec["source"]
        lines.append(f"  {spec['name']}: {spec['datatype']} {spec['shape']} <- {source}")
    lines.append("outputs:")
    for output in report["outputs"]:
        lines.append(f"  {output['name']}: {output['datatype']} {output['shape']}")
        if "top_k" in output:
            for row_index, row in enumerate(output["top_k"]):
                pairs = "  ".join(f"{p['index']}: {p['score']:.4f}" for p in row)
                lines.append(f"    row {row_index} top-{len(row)}: {pairs}")
        else:
            total = int(np.prod(output["shape"]))
            more = f" ... ({total} values)" if total > len(output["first_values"]) else ""
            lines.append(f"    values: {', '.join(_value(v) for v in output['first_values'])}{more}")
    latency = report["latency_ms"]
    if len(latency["per_request"]) == 1:
        lines.append(f"latency: {latency['mean']:.2f} ms")
    else:
        lines.append(
            f"latency over {len(latency['per_request'])} requests: p50 {latency['p50']:.2f} ms, "
            f"p90 {latency['p90']:.2f} ms, p99 {latency['p99']:.2f} ms, mean {latency['mean']:.2f} ms"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    timeout_s = args.timeout_ms / 1000.0 if args.timeout_ms else None
    try:
        with TritonControl(resolve_url(args), timeout_s=timeout_s, protocol=args.protocol) as client:
            report = run(client, args)
    except TritonUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ControlError as exc:
        print(f"error: {exc.described()}", file=sys.stderr)
        return 1
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else format_report(report, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
