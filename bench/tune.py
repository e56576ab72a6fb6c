"""python -m bench.tune: sweep a model's serving policy and keep the one with the highest open-loop goodput.

docs/benchmarks.md#tuning-a-models-policy says how. A lone request's latency is a constraint, not an afterthought: one
intra-op thread per instance and a queue delay serve more under load but make a lone request slower, so the choice is
the highest goodput among the candidates whose lone request is within its budget (by default the in-process p50 plus
the project's allowance, goodput_report.LONE_ALLOWANCE_MS), and among the fastest lone requests when none is.
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench import REPOSITORY
from bench.load.generators import GENERATORS
from bench.output import say
from bench.peers import goodput, goodput_report, servers
from tritonnx.server.repository import CONFIG_FILE, link_models

SPINNING = "session.intra_op.allow_spinning"
DEFAULT_ALLOWANCE_MS = 1.0  # a lone request's budget over in-process for a model the goals do not name
LONE_NOISE = 0.1  # lone requests' p50s this close (a share of the fastest) are one within a sweep's noise
# The path the load takes, and how the config's note says it. The facade shares the cores with Triton and its stubs,
# so a layout that gives ONNX Runtime every core can starve it (bench/reports/2026-11-29-facade-layout).
PATHS = {"triton": " to Triton direct", "facade": " through the facade"}


@dataclass(frozen=True)
class Candidate:
    instances: int
    threads: int
    delay_us: int
    preferred: tuple[int, ...]
    spinning: str = "auto"  # "0", "1", or "auto": the backend's rule (off when threads outnumber the cores)

    def describe(self) -> str:
        preferred = ",".join(map(str, self.preferred)) or "none"
        spinning = "" if self.spinning == "auto" else f" spinning={self.spinning}"
        return (
            f"instances={self.instances} threads={self.threads} delay={self.delay_us}us preferred={preferred}{spinning}"
        )


def apply(config: str, candidate: Candidate) -> str:
    """The config text with the candidate's values in place of the current ones."""

    def replace(pattern: str, value: str, text: str) -> str:
        updated, count = re.subn(pattern, value, text, count=1)
        if count != 1:
            raise ValueError(f"config.pbtxt has no field matching {pattern!r}")
        return updated

    config = servers.Layout(candidate.instances, candidate.threads).apply(config)
    config = replace(r"(max_queue_delay_microseconds:\s*)\d+", rf"\g<1>{candidate.delay_us}", config)
    config = re.sub(r"\n\s*preferred_batch_size:\s*\[[^\]]*\]", "", config)
    config = re.sub(rf'\nparameters \{{ key: "{SPINNING}"[^\n]*', "", config)
    if candidate.spinning != "auto":
        config += f'parameters {{ key: "{SPINNING}" value: {{ string_value: "{candidate.spinning}" }} }}\n'

    if candidate.preferred:
        config = replace(
            r"(\n(\s*)max_queue_delay_microseconds:[^\n]*)",
            rf"\1\n\2preferred_batch_size: [ {', '.join(map(str, candidate.preferred))} ]",
            config,
        )
    return config


def measure(args: argparse.Namespace, candidate: Candidate, objective: float) -> dict:
    """The model served alone under the candidate's policy, on the path tuned for: lone p50, capacity, goodput steps."""
    model, repository = args.model, args.repository
    with tempfile.TemporaryDirectory(prefix="tritonnx-tune-", ignore_cleanup_errors=True) as folder:
        config = apply((repository / model / CONFIG_FILE).read_text(), candidate)
        served = link_models(Path(folder) / "repository", {model: repository / model}, {model: config})
        server = servers.Tritonnx(served, model, Path(folder), facade=args.path == "facade")
        onnx_file = repository / model / "1" / "model.onnx"
        # No overloads: they say how the server degrades, not which policy serves most within the objective.
        return goodput.measure_open(server, model, onnx_file, objective, args, (), lone_seconds=args.capacity_seconds)


Result = tuple[Candidate, dict]  # a candidate and its measure_open record


def _lone(record: dict) -> float:
    return record.get("lone", {}).get("p50_ms", math.nan)


def choose(results: list[Result], objective: float, lone_p50_budget_ms: float | None = None) -> Result | None:
    """The highest goodput among the candidates whose lone request's p50 is within the budget.

    When none is within it, the highest goodput among those whose lone request is within LONE_NOISE of the fastest
    (one sweep cannot tell them apart); None if none has a goodput.
    """
    scored = [(goodput.goodput(record.get("steps", []), objective), candidate, record) for candidate, record in results]
    scored = [score for score in scored if score[0] > 0 and not math.isnan(_lone(score[2]))]
    if not scored:
        return None
    within = [score for score in scored if lone_p50_budget_ms is None or _lone(score[2]) <= lone_p50_budget_ms]
    if not within:
        fastest = min(_lone(score[2]) for score in scored)
        within = [score for score in scored if _lone(score[2]) <= fastest * (1 + LONE_NOISE)]
    return max(within, key=lambda score: score[0])[1:]


def figures(record: dict, objective: float) -> str:
    """A measured record's goodput, capacity and lone p50, or why it has none."""
    if "error" in record:
        return record["error"]
    lone = f", a lone request's p50 {record['lone']['p50_ms']:.2f} ms" if "lone" in record else ""
    return (
        f"goodput {goodput.goodput(record['steps'], objective):.1f} req/s at p99 <= {objective:.1f} ms, "
        f"capacity {record['capacity_rps']:.1f} req/s (c={goodput.CAPACITY_CONCURRENCY}){lone}"
    )


def note(
    chosen: Result, objective: float, candidates: int, budget_ms: float | None = None, path: str = "triton"
) -> str:
    """The date, the choice and what it was chosen on, for config.pbtxt's first line."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    budget = ""
    if budget_ms is not None:
        kept = _lone(chosen[1]) <= budget_ms
        budget = (
            f" within a lone budget of {budget_ms:.2f} ms"
            if kept
            else f"; none kept a lone budget of {budget_ms:.2f} ms"
        )
    return (
        f"{stamp}: {chosen[0].describe()} gave {figures(chosen[1], objective)}{budget}. "
        f"Open-loop Poisson{PATHS[path]}, answers checked; candidates: {candidates}."
    )


def write_choice(config_file: Path, candidate: Candidate, note: str) -> None:
    text = apply(config_file.read_text(), candidate)
    text = re.sub(r"# Tuned by `make tune`[^\n]*\n", "", text)  # the previous note, one line
    config_file.write_text(f"# Tuned by `make tune` on {note}\n" + text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tune",
        description="Serve a model alone under each policy (instances x threads x queue delay x preferred batch sizes), "
        "measure its open-loop goodput at the latency objective, answers checked, and write the best into config.pbtxt.",
        epilog="Example (about a minute a candidate): python -m bench.tune --model mobilenet_v3_small "
        "--instances 2 3 --threads 1 --delays 0 --lone-p50-budget-ms 6 --dry-run",
    )
    add = parser.add_argument
    add("--model", required=True, help="a model of the repository, e.g. mobilenet_v3_small")
    add("--repository", type=Path, default=REPOSITORY, help="default: %(default)s")
    add("--instances", nargs="+", type=int, default=[1, 2, 3], help="instance counts; default: 1 2 3")
    add("--threads", nargs="+", type=int, default=[0], help="intra-op threads, 0 = cores / instances; default: 0")
    add("--delays", nargs="+", type=int, default=[0, 500, 2000], help="queue delays (us); default: 0 500 2000")
    add("--preferred", nargs="*", default=["none"], help="preferred batch size lists, e.g. none 4,8; default: none")
    add(
        "--spinning",
        nargs="+",
        choices=["auto", "0", "1"],
        default=["auto"],
        help="intra-op spin-waiting; default: auto",
    )
    add("--objective-ms", type=float, help="answered p99 objective; default: 5x the in-process p50, at least 25 ms")
    add("--step-seconds", type=float, default=3.0, help="per offered rate; default: %(default)s")
    add("--capacity-seconds", type=float, default=3.0, help="per closed loop (in-process, c=1, c=16); default: 3.0")
    add(
        "--lone-p50-budget-ms",
        type=float,
        help="a lone request's served p50 budget; default: in-process p50 + allowance",
    )
    add("--generator", choices=GENERATORS, default="loadgen", help="the load generator; default: %(default)s")
    add(
        "--path",
        choices=list(PATHS),
        default="triton",
        help="where the load goes: Triton's gRPC port, or the facade in front of it on the same cores (then no lone "
        "budget unless --lone-p50-budget-ms gives one: the facade's own cost holds its lone request); "
        "default: %(default)s",
    )
    add("--dry-run", action="store_true", help="measure and report, leave config.pbtxt alone")
    args = parser.parse_args(argv)

    objective, budget = args.objective_ms, args.lone_p50_budget_ms
    default_budget = budget is None and args.path == "triton"  # through the facade: none unless given
    if objective is None or default_budget:
        onnx_file = args.repository / args.model / "1" / "model.onnx"
        single_p50, _ = goodput.single_request_ms(args.model, onnx_file, args.capacity_seconds)
        say(f"{args.model}: in-process single request p50 {single_p50:.2f} ms")
        objective = objective or goodput.objective_ms(single_p50)
        if default_budget:
            budget = single_p50 + goodput_report.LONE_ALLOWANCE_MS.get(args.model, DEFAULT_ALLOWANCE_MS)
    lone = "no lone budget" if budget is None else f"a lone request's p50 within {budget:.2f} ms"
    say(f"objective: answered p99 <= {objective:.1f} ms{PATHS[args.path]}; {lone}")
    preferred = [() if p == "none" else tuple(int(v) for v in p.split(",")) for p in args.preferred]
    dimensions = (args.instances, args.threads, args.delays, preferred, args.spinning)
    candidates = [Candidate(*each) for each in itertools.product(*dimensions)]
    results = []
    for index, candidate in enumerate(candidates, 1):
        started = time.monotonic()
        say(f"[{index}/{len(candidates)}] {candidate.describe()}: lone request, capacity, open-loop steps ...")
        results.append((candidate, measure(args, candidate, objective)))
        say(f"  {figures(results[-1][1], objective)} ({time.monotonic() - started:.0f} s)")
    chosen = choose(results, objective, budget)
    if chosen is None:
        parser.exit(1, f"no candidate had a goodput at p99 <= {objective:.1f} ms\n")
    said = note(chosen, objective, len(candidates), budget, args.path)
    say(f"best: {said}")
    if not args.dry_run:
        write_choice(config_file := args.repository / args.model / CONFIG_FILE, chosen[0], said)
        say(f"wrote {config_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
