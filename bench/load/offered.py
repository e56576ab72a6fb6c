"""A rate offered for a fixed time, whatever the answers do, and what came of it: the open-loop goodput steps.

The open loop (`loops.OpenLoop`) sends on a seeded Poisson schedule and times every call from the moment it was due,
so a slow server cannot slow the load down and hide its queue (no coordinated omission). Calls beyond the bound on
calls in flight are not sent: they are the generator's own refusals, counted as errors. Every call carries the
target's deadline (`timeout_s`). How each call ended is sorted into answered, refused by the server (a documented
overload status), timed out, other errors and wrong answers (when the target checks them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from bench.load.loops import OpenLoop
from bench.load.stats import OK, percentiles
from bench.load.targets import Target

# How servers say "too busy": gRPC (Triton's queue, the facade, KServe peers) and HTTP (the others).
REFUSED = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "429", "503"})
# A call past its deadline: gRPC's status, aiohttp's total timeout (asyncio.TimeoutError) or read timeout.
TIMED_OUT = frozenset({"DEADLINE_EXCEEDED", "TimeoutError", "ServerTimeoutError"})
MAX_OUTSTANDING = 1024


@dataclass
class OfferedResult:
    """One offered rate: counts by outcome, the answered calls' latency from schedule, and the generator's lag."""

    target: str
    model: str
    offered_rps: float
    seconds: float
    scheduled: int = 0  # calls the schedule held: sent + generator_refused
    answered: int = 0  # OK and (when checked) right
    refused: int = 0  # the server's overload statuses (REFUSED)
    timed_out: int = 0  # past the deadline (TIMED_OUT)
    generator_refused: int = 0  # not sent: the bound on calls in flight was reached
    wrong: int = 0  # answered, unlike in-process ONNX Runtime
    other_errors: dict[str, int] = field(default_factory=dict)
    p50_ms: float = math.nan  # answered calls, from their scheduled send time
    p99_ms: float = math.nan
    lag_p99_ms: float = 0.0  # actual send - scheduled send
    lag_max_ms: float = 0.0

    @property
    def errors(self) -> int:
        """Every scheduled call that did not end with a right answer."""
        return self.scheduled - self.answered

    def share(self, count: int) -> float:
        return count / self.scheduled if self.scheduled else 0.0

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "answered_rps": self.answered / self.seconds if self.seconds else 0.0,
            "error_share": self.share(self.errors),
            "refused_share": self.share(self.refused),
            "timed_out_share": self.share(self.timed_out),
        }


async def offer(target: Target, rate: float, seconds: float, *, seed: int = 0) -> OfferedResult:
    """Offer `rate` calls a second, Poisson arrivals, for `seconds` to an open `target`; all of them awaited."""
    wrong_before = target.wrong
    bound = max(1, math.ceil(rate * seconds * 2) + 100)  # only a bound: the schedule's span ends it
    loop = OpenLoop(target, rate, MAX_OUTSTANDING, bound, poisson=True, seed=seed, from_schedule=True)
    await loop.run(seconds)
    tally, wrong = loop.total, target.wrong - wrong_before
    result = OfferedResult(target.name, target.model, rate, seconds, wrong=wrong)
    result.generator_refused, result.scheduled = tally.skipped, loop.sent + tally.skipped
    for status, count in tally.statuses.items():
        if status == OK:
            result.answered = count - wrong
        elif status in REFUSED:
            result.refused += count
        elif status in TIMED_OUT:
            result.timed_out += count
        else:
            result.other_errors[status] = count
    # A call never ended (cancelled past the deadline + margin) counts as timed out.
    result.timed_out += loop.sent - sum(tally.statuses.values())
    result.p50_ms, result.p99_ms = percentiles(tally.ms(), [50, 99])
    result.lag_p99_ms, result.lag_max_ms = loop.lag_ms([99, 100])
    return result


def summary(result: OfferedResult) -> str:
    others = sum(result.other_errors.values())
    return (
        f"{result.offered_rps:7.1f} req/s offered: {result.answered} answered, p50 {result.p50_ms:7.1f} "
        f"p99 {result.p99_ms:7.1f} ms; refused {result.share(result.refused):.1%}, timed out "
        f"{result.share(result.timed_out):.1%}, not sent (over {MAX_OUTSTANDING} in flight) "
        f"{result.generator_refused}, wrong {result.wrong}, other {others}; lag p99 {result.lag_p99_ms:.1f} ms"
    )
