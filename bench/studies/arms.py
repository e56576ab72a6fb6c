"""What the A/B studies (int8, openvino) share: one measured run of an arm, and the ratios of two arms over rounds."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Run:
    arm: str
    round: int
    model: str
    concurrency: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    answers_checked: int
    wrong: int
    errors: dict[str, int]


def ratios(runs: list[Run], base: str, candidate: str) -> dict[tuple[str, int], dict[str, float]]:
    """Per model and concurrency, `candidate` against `base`: the medians over rounds of each round's ratio.

    Rounds interleave the arms, so a ratio within a round compares runs made under the same conditions.
    """
    found: dict[tuple[str, int], dict[str, float]] = {}
    for model, concurrency in sorted({(r.model, r.concurrency) for r in runs}):
        throughput, p50 = [], []
        for round_ in sorted({r.round for r in runs}):
            pair = {r.arm: r for r in runs if (r.model, r.concurrency, r.round) == (model, concurrency, round_)}
            if base in pair and candidate in pair and pair[base].throughput_rps and pair[candidate].p50_ms:
                throughput.append(pair[candidate].throughput_rps / pair[base].throughput_rps)
                p50.append(pair[base].p50_ms / pair[candidate].p50_ms)
        if throughput:
            found[(model, concurrency)] = {"throughput": statistics.median(throughput), "p50": statistics.median(p50)}
    return found
