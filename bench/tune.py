"""python -m bench.tune: sweep a model's serving policy with perf_analyzer and keep the best.

docs/benchmarks.md#tuning-a-models-policy says how. The lone-request budget exists because one intra-op thread per
instance serves more under load but makes a lone request slower.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench import REPOSITORY
from bench.perf import PerfAnalyzerError, run_perf_analyzer
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack


@dataclass(frozen=True)
class Candidate:
    instances: int
    threads: int
    delay_us: int
    preferred: tuple[int, ...]

    def describe(self) -> str:
        preferred = ",".join(map(str, self.preferred)) or "none"
        return f"instances={self.instances} threads={self.threads} delay={self.delay_us}us preferred={preferred}"


def apply(config: str, candidate: Candidate) -> str:
    """The config text with the candidate's values in place of the current ones."""

    def replace(pattern: str, value: str, text: str) -> str:
        updated, count = re.subn(pattern, value, text, count=1)
        if count != 1:
            raise ValueError(f"config.pbtxt has no field matching {pattern!r}")
        return updated

    config = replace(r"(instance_group\s*\[\s*\{[^}]*count:\s*)\d+", rf"\g<1>{candidate.instances}", config)
    config = replace(
        r'(key:\s*"intra_op_thread_count"\s*value:\s*\{\s*string_value:\s*")\d+', rf"\g<1>{candidate.threads}", config
    )
    config = replace(r"(max_queue_delay_microseconds:\s*)\d+", rf"\g<1>{candidate.delay_us}", config)
    config = re.sub(r"\n\s*preferred_batch_size:\s*\[[^\]]*\]", "", config)
    if candidate.preferred:
        config = replace(
            r"(\n(\s*)max_queue_delay_microseconds:[^\n]*)",
            rf"\1\n\2preferred_batch_size: [ {', '.join(map(str, candidate.preferred))} ]",
            config,
        )
    return config


def measure(model: str, repository: Path, candidate: Candidate, args: argparse.Namespace) -> dict:
    """perf_analyzer at each concurrency against `model` served alone with the candidate's policy."""
    workdir = Path(tempfile.mkdtemp(prefix="tritonnx-tune-"))
    try:
        config = apply((repository / model / "config.pbtxt").read_text(), candidate)
        repo = link_models(workdir / "repo", {model: repository / model}, {model: config})
        with ServingStack(repo, workdir, with_facade=False) as stack:
            measurement_ms, shapes, server = int(args.seconds * 1000), tuple(args.shape), stack.triton
            return {
                c: run_perf_analyzer(
                    model, server.grpc_url, c, measurement_ms, shapes, args.input_data, server.admin_headers
                ).as_dict()
                for c in args.concurrency
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


Points = dict[int, dict]  # concurrency -> perf_analyzer point (PerfPoint.as_dict())


def choose(
    results: list[tuple[Candidate, Points]], p99_budget_ms: float, lone_p50_budget_ms: float | None = None
) -> tuple[Candidate, Points] | None:
    """The highest throughput at the highest concurrency, its p99 there and its lone p50 within the budgets; or None."""

    def qualifies(points: Points) -> bool:
        top, lone = points[max(points)], points[min(points)]
        return top["p99_ms"] <= p99_budget_ms and (lone_p50_budget_ms is None or lone["p50_ms"] <= lone_p50_budget_ms)

    within = [(candidate, points) for candidate, points in results if qualifies(points)]
    return max(within, key=lambda item: item[1][max(item[1])]["throughput"], default=None)


def write_choice(config_file: Path, candidate: Candidate, note: str) -> None:
    text = apply(config_file.read_text(), candidate)
    text = re.sub(r"# Tuned by `make tune`[^\n]*\n", "", text)  # the previous note, one line
    config_file.write_text(f"# Tuned by `make tune` on {note}\n" + text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tune",
        description="Sweep instances x threads x queue delay x preferred batch sizes for one model with perf_analyzer, "
        "and write the best policy under a p99 budget into its config.pbtxt.",
        epilog="Example: python -m bench.tune --model mobilenet_v3_small --instances 1 2 3 --delays 0 1000",
    )
    add = parser.add_argument
    add("--model", required=True)
    add("--repository", type=Path, default=REPOSITORY)
    add("--instances", nargs="+", type=int, default=[1, 2, 3])
    add("--threads", nargs="+", type=int, default=[0], help="intra-op threads; 0 = cores / instances")
    add("--delays", nargs="+", type=int, default=[0, 500, 2000], help="max_queue_delay_microseconds")
    add("--preferred", nargs="*", default=["none"], help="preferred batch size lists, e.g. none 4,8")
    add("--concurrency", nargs="+", type=int, default=[1, 16])
    add("--seconds", type=float, default=4.0, help="perf_analyzer measurement window")
    add("--p99-budget-ms", type=float, default=100.0, help="at the highest concurrency")
    add("--lone-p50-budget-ms", type=float, help="p50 budget at the lowest concurrency (a lone request); default: none")
    add("--shape", nargs="*", default=[], help="perf_analyzer shapes of variable inputs, e.g. input_ids:16")
    add("--input-data", default="random", help='perf_analyzer --input-data; "zero" for token ids')
    add("--dry-run", action="store_true", help="measure and report, leave config.pbtxt alone")
    args = parser.parse_args(argv)

    preferred = [() if p == "none" else tuple(int(v) for v in p.split(",")) for p in args.preferred]
    candidates = [
        Candidate(*values) for values in itertools.product(args.instances, args.threads, args.delays, preferred)
    ]
    top = max(args.concurrency)
    results = []
    for index, candidate in enumerate(candidates, 1):
        started = time.monotonic()
        print(f"[{index}/{len(candidates)}] {candidate.describe()} ...", flush=True)
        try:
            points = measure(args.model, args.repository, candidate, args)
        except PerfAnalyzerError as error:
            print(f"  failed: {error}", flush=True)
            continue
        results.append((candidate, points))
        said = [
            f"c={c}: {p['throughput']:.1f}/s p50 {p['p50_ms']:.1f} p99 {p['p99_ms']:.1f} ms batch {p['avg_batch']:.1f}"
            for c, p in points.items()
        ]
        print(f"  {'; '.join(said)} ({time.monotonic() - started:.0f}s)", flush=True)
    lone = min(args.concurrency)
    chosen = choose(results, args.p99_budget_ms, args.lone_p50_budget_ms)
    if chosen is None:
        lone_budget = f" and p50 within {args.lone_p50_budget_ms} ms at c={lone}" if args.lone_p50_budget_ms else ""
        print(f"no candidate kept p99 within {args.p99_budget_ms} ms at c={top}{lone_budget}", file=sys.stderr)
        return 1
    best, points = chosen
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    lone_budget = f", budget {args.lone_p50_budget_ms:.0f} ms" if args.lone_p50_budget_ms else ""
    note = (
        f"{stamp}: {best.describe()} gave {points[top]['throughput']:.1f} infer/s at c={top} "
        f"(p99 {points[top]['p99_ms']:.1f} ms, budget {args.p99_budget_ms:.0f} ms); c={lone} p50 "
        f"{points[lone]['p50_ms']:.2f} ms{lone_budget}. perf_analyzer, gRPC, system shared memory, "
        f"{len(results)} candidates."
    )
    print(f"best: {note}", flush=True)
    if not args.dry_run:
        write_choice(args.repository / args.model / "config.pbtxt", best, note)
        print(f"wrote {args.repository / args.model / 'config.pbtxt'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
