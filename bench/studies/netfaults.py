"""python -m bench.studies.netfaults: network faults between the facade and Triton, longer than the tests hold them.

Triton runs in a network namespace of the study's own, the facades outside it (bench/netfaults/stack.py). For each
fault: a calm window, the fault held for `--seconds` under `--concurrency` callers whose calls carry a 2 s deadline,
then the fault is lifted, the time to the first right answer is measured, and a window after it. The kernel drops
5% of the packets, resets the connections, or partitions the link (nftables); the 50 ms delay is added by a
user-space proxy, this kernel having no netem. Gates (exit 1 when one fails, named in the report): every answer
right, failures only of the statuses the fault explains, every call ended within its deadline (+0.5 s), each fault
acted, traffic back within 2 s of the fault's end, nothing left behind (calls in flight, shared-memory slots,
regions in Triton or /dev/shm). Needs root, iproute2 and nftables. Writes report.md and results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.load.loops import LoadResult, run_load
from bench.load.stats import OK
from bench.netfaults.link import unavailable
from bench.netfaults.stack import DEADLINE_S, FAULTS, Fault, NetStack, left_in_dev_shm
from bench.output import Gate, finish, gates_section, run_folder, say, settings, write_json

RECOVERY_GOAL_S = 2.0
DEADLINE_SLACK_S = 0.5
MAX_CALLS = 100_000  # per window: a reset fails calls in microseconds, the window's seconds bound it first


@dataclass
class FaultRun:
    fault: str
    how: str
    facade: str
    seconds: float
    statuses: dict[str, int]  # the calls made under the fault, by final status
    wrong: int  # answers unlike in-process ONNX Runtime's, in every window
    slowest_s: float  # the longest call under the fault, answered or failed
    acted: int  # chunks delayed or packets dropped / reset by the fault
    recovery_s: float | None  # fault lifted -> first right answer (None: none within 60 s)
    calm: LoadResult
    during: LoadResult
    after: LoadResult
    left_behind: list[str] = field(default_factory=list)

    def summary(self) -> str:
        failures = ", ".join(f"{s} {n}" for s, n in self.statuses.items() if s != OK) or "none"
        recovery = "never" if self.recovery_s is None else f"{self.recovery_s:.2f} s"
        return (
            f"{self.fault}: {self.statuses.get(OK, 0)} ok, failures {failures}, slowest {self.slowest_s:.2f} s, "
            f"acted on {self.acted}, recovered in {recovery}"
        )


def window(stack: NetStack, facade: str, concurrency: int, seconds: float) -> tuple[LoadResult, int, float, dict]:
    """A closed-loop window on `facade`'s path: its result, wrong answers, slowest call and statuses."""
    target = stack.target(facade)
    result = asyncio.run(run_load(target, concurrency, seconds, warmup_s=0, max_requests=MAX_CALLS, verify=False))
    return result, target.wrong, target.slowest_s, target.tally.statuses


def one_fault(stack: NetStack, fault: Fault, args: argparse.Namespace) -> FaultRun:
    calm, wrong_calm, _, _ = window(stack, fault.facade, args.concurrency, args.calm_seconds)
    stack.inject(fault)
    try:
        during, wrong, slowest, statuses = window(stack, fault.facade, args.concurrency, args.seconds)
        acted = stack.acted(fault)
    finally:
        stack.heal()
    recovery = stack.recovery(fault.facade, timeout=60.0)
    after, wrong_after, _, _ = window(stack, fault.facade, args.concurrency, args.calm_seconds)
    run = FaultRun(fault.name, fault.how, fault.facade, args.seconds, statuses, wrong_calm + wrong + wrong_after,
                   slowest, acted, recovery, calm, during, after, stack.settled())  # fmt: skip
    say(run.summary())
    return run


def gates(runs: list[FaultRun], stopped_regions: list[str]) -> list[Gate]:
    def each(check: object) -> str:
        return ", ".join(f"{r.fault} {check(r)}" for r in runs)  # type: ignore[operator]

    return [
        Gate("every answer equals in-process ONNX Runtime's", not any(r.wrong for r in runs), each(lambda r: r.wrong)),
        Gate("failures only of the statuses each fault explains",
             all(set(r.statuses) - {OK} <= FAULTS[r.fault].allowed for r in runs), each(lambda r: r.statuses)),
        Gate(f"every call ended within its {DEADLINE_S:g} s deadline (+{DEADLINE_SLACK_S} s)",
             all(r.slowest_s <= DEADLINE_S + DEADLINE_SLACK_S for r in runs), each(lambda r: f"{r.slowest_s:.2f} s")),
        Gate("each fault acted (delayed chunks, dropped or reset packets)", all(r.acted for r in runs),
             each(lambda r: r.acted)),
        Gate("calls went through the delay and the loss", all(r.statuses.get(OK) for r in runs
                                                             if r.fault in ("delay", "loss")),
             each(lambda r: r.statuses.get(OK, 0))),
        Gate(f"traffic back within {RECOVERY_GOAL_S:g} s of each fault's end",
             all(r.recovery_s is not None and r.recovery_s <= RECOVERY_GOAL_S for r in runs),
             each(lambda r: "never" if r.recovery_s is None else f"{r.recovery_s:.2f} s")),
        Gate("nothing left behind: calls in flight, shared-memory slots, regions in Triton or /dev/shm",
             not any(r.left_behind for r in runs) and not stopped_regions,
             "; ".join([*(f"{r.fault}: {r.left_behind}" for r in runs if r.left_behind), *stopped_regions])
             or "none"),
    ]  # fmt: skip


def report(runs: list[FaultRun], args: argparse.Namespace, judged: list[Gate]) -> str:
    def ms(result: LoadResult) -> str:
        return f"{result.p50_ms:.0f}"

    rows = []
    for r in runs:
        failures = ", ".join(f"{s} {n}" for s, n in r.statuses.items() if s != OK) or "none"
        recovery = "never" if r.recovery_s is None else f"{r.recovery_s:.2f}"
        rows.append(f"| {r.fault} | {r.how} | {r.statuses.get(OK, 0)} | {failures} | {r.slowest_s:.2f} | {r.acted} "
                    f"| {ms(r.calm)} / {ms(r.during)} / {ms(r.after)} | {recovery} |")  # fmt: skip
    return "\n".join([
        f"# Network faults between the facade and Triton ({args.seconds:g} s each, {args.concurrency} callers, "
        f"{DEADLINE_S:g} s deadline)",
        "",
        "Triton in a network namespace of its own, the facades outside. Loss, reset and partition are the kernel's "
        "(nftables on the namespace's end of a veth pair), on the direct facade's path; the delay is a user-space "
        "proxy's (no netem in this kernel), on the proxied facade's path. Recovery: the fault lifted -> the first "
        "right answer to a call with a 2 s deadline (calls still in flight when the window ended finished first, "
        "under the fault).",
        "",
        "| fault | what | ok | failures by status | slowest call s | acted on | p50 ms calm / fault / after | "
        "recovery s |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        gates_section(judged),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.netfaults",
        description="Hold each network fault between the facade and Triton (in a namespace of its own) under load "
        "and report failures by status, the slowest call and the recovery.",
    )
    parser.add_argument("--faults", nargs="+", choices=list(FAULTS), default=list(FAULTS), help="default: all")
    parser.add_argument("--seconds", type=float, default=10.0, help="each fault held; default: %(default)s")
    parser.add_argument("--calm-seconds", type=float, default=2.0, help="windows before and after; default: 2")
    parser.add_argument("--concurrency", type=int, default=4, help="callers; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-netfaults")
    args = parser.parse_args(argv)
    if reason := unavailable():
        print(f"netfaults: {reason}", file=sys.stderr)
        return 2
    _, out = run_folder(args.out, "netfaults")
    runs: list[FaultRun] = []
    with NetStack(out) as stack:
        pids = [facade.pid for facade in stack.facades.values()]
        for name in args.faults:
            say(f"{name}: {FAULTS[name].how}, {args.seconds:g} s")
            runs.append(one_fault(stack, FAULTS[name], args))
    stopped = [f"left in /dev/shm after the stop: {name}" for name in left_in_dev_shm(pids)]
    judged = gates(runs, stopped)
    write_json(out / "results.json", {"settings": settings(args), "faults": [asdict(r) for r in runs],
                                      "gates": [asdict(g) for g in judged]})  # fmt: skip
    return finish(out, report(runs, args, judged), judged)


if __name__ == "__main__":
    sys.exit(main())
