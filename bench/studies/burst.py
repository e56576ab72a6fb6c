"""python -m bench.studies.burst: many large calls at once on one channel, and how fast the refused learn it.

All `--calls` Predict calls (one image each, about 600 KB) start together on one gRPC channel to
the facade, far above its in-flight limit. The accepted ones must come back right (each answer is
compared with in-process ONNX Runtime); the refused ones get RESOURCE_EXHAUSTED, and what matters
for them is how long the caller waited to be told (goal: p99 within 50 ms; reported, not gated: from
the client's side a refusal cannot arrive before the client has sent its share of the burst). Beside
it, the facade's own figure: its histogram tritonnx_facade_rejection_duration_seconds (call start in
the facade's handler -> RESOURCE_EXHAUSTED), read from its /metrics before and after each burst; its
p99 is the bound of the bucket holding it. Calls refused at their start (reason `overloaded`) and
those refused once their body showed a default priority while only the priority-1 quarter of the
slots was left (`priority_reserve`) are told apart. Gates (exit 1 when one fails, named in the report): every
accepted answer right, no status but OK and RESOURCE_EXHAUSTED, the burst went over the limit, the
facade took at least the default-priority share of its limit (3/4 of --max-in-flight) in every burst,
and the facade's own p99 for calls refused at their start within 5 ms in every burst. Writes report.md and results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict
from pathlib import Path

from backend.server.prometheus import MetricsPage, bucket_quantile, scrape
from backend.server.repository import link_models
from backend.server.stack import ServingStack
from bench import REPOSITORY
from bench.load.burst import REFUSED, BurstResult, burst
from bench.load.stats import OK
from bench.output import Gate, finish, gates_section, run_folder, say, settings, write_json
from bench.overload import checked_images, path_target

FACADE_REJECTION_P99_MS = 5.0
REJECTION_HISTOGRAM = "tritonnx_facade_rejection_duration_seconds"


def facade_rejection_p99_ms(before: MetricsPage, after: MetricsPage, reason: str) -> float:
    """The p99 (ms) of the refusals for `reason` the facade timed between two reads of its /metrics.

    The bound of the bucket holding it; NaN when there were none.
    """
    earlier = before.buckets(REJECTION_HISTOGRAM, reason=reason)
    later = after.buckets(REJECTION_HISTOGRAM, reason=reason)
    return bucket_quantile({bound: count - earlier.get(bound, 0.0) for bound, count in later.items()}, 0.99) * 1000


def gates(results: list[BurstResult], max_in_flight: int, facade_p99_ms: list[float]) -> list[Gate]:
    share = max_in_flight - max_in_flight // 4  # the last quarter is kept for priority 1
    return [
        Gate("every accepted answer equals in-process ONNX Runtime's", not any(r.wrong_outputs for r in results),
             f"wrong outputs {[r.wrong_outputs for r in results]}"),
        Gate(f"no status but {OK} and {REFUSED}", all(set(r.statuses) <= {OK, REFUSED} for r in results),
             f"{[r.statuses for r in results]}"),
        Gate("every burst went over the limit (calls refused)", all(r.statuses.get(REFUSED) for r in results),
             f"refused {[r.statuses.get(REFUSED, 0) for r in results]}"),
        Gate(f"at least {share} calls accepted in every burst", all(r.statuses.get(OK, 0) >= share for r in results),
             f"accepted {[r.statuses.get(OK, 0) for r in results]}"),
        Gate(f"the facade's own p99 from a call's start to its refusal within {FACADE_REJECTION_P99_MS:g} ms in every burst",
             all(p99 <= FACADE_REJECTION_P99_MS for p99 in facade_p99_ms), f"p99 (bucket bound) {facade_p99_ms} ms"),
    ]  # fmt: skip


def report(
    results: list[BurstResult], args: argparse.Namespace, judged: list[Gate], facade: list[tuple[float, float]]
) -> str:
    rows = [
        f"| {index} | {r.statuses.get(OK, 0)} | {r.statuses.get(REFUSED, 0)} | {r.rejection_p50_ms:.1f} / "
        f"{r.rejection_p99_ms:.1f} / {r.rejection_max_ms:.1f} | {at_start:g} / {reserve:g} | {r.accepted_p50_ms:.0f} / "
        f"{r.accepted_p99_ms:.0f} | {r.wrong_outputs} |"
        for index, (r, (at_start, reserve)) in enumerate(zip(results, facade, strict=True), 1)
    ]
    return "\n".join([
        f"# A burst of {args.calls} Predict calls at once on one channel, {args.model}, limit {args.max_in_flight}",
        "",
        "| burst | accepted | refused | refused, client's side: p50 / p99 / max ms | refused, the facade's own p99 ms: "
        "at the call's start / for the reserve | accepted p50 / p99 ms | wrong outputs |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "The client's side is from the call's start in the Python client to its status; the facade's own is from "
        "the call's start in the facade's handler to its RESOURCE_EXHAUSTED (its histogram "
        f"`{REJECTION_HISTOGRAM}`; the bound of the bucket holding the p99). The difference is the client "
        "sending its share of the burst, gRPC's core and the event loops' queues on both sides. A call refused at "
        "its start (`overloaded`) is told before its body is read; one that took one of the last quarter of the "
        "slots is refused only once its body shows it is not priority 1 (`priority_reserve`), so its figure "
        "includes receiving that body.",
        "",
        gates_section(judged),
    ])  # fmt: skip


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
    images, expected = checked_images(args.model)
    facade_args = ["--default-model", args.model, "--max-in-flight", str(args.max_in_flight)]
    results: list[BurstResult] = []
    facade_p99_ms: list[float] = []  # refused at the call's start
    reserve_p99_ms: list[float] = []  # refused once the body showed a default priority (the reserved quarter)
    repository = link_models(out / "repository", {args.model: REPOSITORY / args.model})
    with ServingStack(repository, out, facade_args=facade_args) as stack:
        assert stack.facade is not None
        target = path_target("facade", stack.facade.grpc_url, args.model, images, expected)
        metrics_page = f"{stack.facade.http_url}/metrics"

        async def rounds() -> None:
            try:
                for index in range(args.rounds):
                    before = await asyncio.to_thread(scrape, metrics_page)
                    result = await burst(target, args.calls)
                    after = await asyncio.to_thread(scrape, metrics_page)
                    facade_p99_ms.append(facade_rejection_p99_ms(before, after, "overloaded"))
                    reserve_p99_ms.append(facade_rejection_p99_ms(before, after, "priority_reserve"))
                    say(
                        f"burst {index + 1}: {result.summary()}; the facade's own rejection p99 {facade_p99_ms[-1]:g} "
                        f"ms at the call's start, {reserve_p99_ms[-1]:g} ms for the reserve"
                    )
                    results.append(result)
            finally:
                await target.close()

        asyncio.run(rounds())
    judged = gates(results, args.max_in_flight, facade_p99_ms)
    write_json(out / "results.json", {"settings": settings(args), "bursts": [asdict(r) for r in results],
                                      "facade_rejection_p99_ms": {"overloaded": facade_p99_ms,
                                                                  "priority_reserve": reserve_p99_ms},
                                      "gates": [asdict(g) for g in judged]})  # fmt: skip
    text = report(results, args, judged, list(zip(facade_p99_ms, reserve_p99_ms, strict=True)))
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
