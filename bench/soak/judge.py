"""The soak's gates: growth after the warm-up, flat counts, right answers, no failures, every publish served.

Memory (RSS and PSS of each process, the bytes of the /dev/shm regions): after the warm-up, a series fails when
its least-squares AND its Theil-Sen slopes both exceed `--max-growth-mib-per-10min` (bench.trend; one step, such
as an arena grown once, moves only the first). Counts (open fds and threads of each process, /dev/shm regions):
flat when the median of the last 3 samples after the warm-up is at most `--max-count-rise` above the median of
the first 3 (bench.trend.level): a publish raises them for a moment, a leak for good. A process started during the
run (a published version's stubs) gets a warm-up of its own from its first sample; one that lived too briefly
after it is listed, not judged.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from bench.output import Gate
from bench.soak.load import PATHS
from bench.soak.report import series, series_name
from bench.trend import Level, Trend, level, trend

# Statuses the facade and Triton document as load shedding: allowed, up to --max-rejected.
DOCUMENTED_REJECTIONS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
MEMORY_KINDS = ("rss_mib", "pss_mib")
COUNT_KINDS = ("fds", "threads")


def columns(rows: Sequence[dict], kinds: Sequence[str]) -> list[str]:
    """Every column `<kind>.<label>` of the rows, in order of appearance (the PSS total left out)."""
    found: list[str] = []
    for row in rows:
        found += [k for k in row if k.partition(".")[0] in kinds and k != "pss_mib.total" and k not in found]
    return found


def own_warmup(rows: Sequence[dict], key: str, warmup: float) -> float:
    """The end of a series' warm-up: `warmup` seconds after its first sample."""
    times, _ = series(list(rows), key)
    return (times[0] if times else 0.0) + warmup


def growth(rows: Sequence[dict], warmup: float, limit: float) -> list[tuple[str, Trend]]:
    """A trend of every memory series after its warm-up, flagged above `limit` MiB per 10 minutes."""
    return [
        (
            key,
            trend(
                series_name(key),
                *series(list(rows), key),
                abs_threshold=limit,
                fraction_threshold=0.0,
                since=own_warmup(rows, key, warmup),
            ),
        )
        for key in [*columns(rows, MEMORY_KINDS), "shm_mib"]
    ]


def levels(rows: Sequence[dict], warmup: float, tolerance: float) -> list[tuple[str, Level]]:
    """Where each count ends against where it started after its warm-up."""
    return [
        (
            key,
            level(series_name(key), *series(list(rows), key), since=own_warmup(rows, key, warmup), tolerance=tolerance),
        )
        for key in [*columns(rows, COUNT_KINDS), "shm_files"]
    ]


def _worst(trends: list[tuple[str, Trend]]) -> str:
    judged = [t for _, t in trends if math.isfinite(t.growth_per_10min)]
    if not judged:
        return "no series judged"
    worst = max(judged, key=lambda t: min(t.growth_per_10min, t.robust_growth_per_10min))
    return (
        f"{len(judged)} series judged; steepest {worst.series}: {worst.growth_per_10min:+.2f} (least squares), "
        f"{worst.robust_growth_per_10min:+.2f} (Theil-Sen) MiB per 10 min"
    )


def memory_gates(trends: list[tuple[str, Trend]], limit: float) -> list[Gate]:
    gates = []
    for name, keep in (
        ("RSS", lambda key: key.startswith("rss_mib.")),
        ("PSS", lambda key: key.startswith("pss_mib.")),
        ("/dev/shm bytes", lambda key: key == "shm_mib"),
    ):
        mine = [(k, t) for k, t in trends if keep(k)]
        flagged = [t for _, t in mine if t.flagged]
        detail = (
            "; ".join(f"{t.series} {t.growth_per_10min:+.2f}/{t.robust_growth_per_10min:+.2f}" for t in flagged)
            if flagged
            else _worst(mine)
        )
        gates.append(
            Gate(f"{name} of every process grows at most {limit:g} MiB per 10 min after warm-up", not flagged, detail)
        )
    return gates


def count_gates(found: list[tuple[str, Level]], tolerance: float) -> list[Gate]:
    gates = []
    for name, keep in (
        ("open fds", lambda key: key.startswith("fds.")),
        ("threads", lambda key: key.startswith("threads.")),
        ("/dev/shm regions", lambda key: key == "shm_files"),
    ):
        mine = [lv for k, lv in found if keep(k)]
        risen = [lv for lv in mine if not lv.flat]
        judged = [lv for lv in mine if math.isfinite(lv.rise)]
        detail = (
            "; ".join(f"{lv.series} {lv.first:g} -> {lv.last:g}" for lv in risen)
            if risen
            else f"{len(judged)} series judged, largest rise {max((lv.rise for lv in judged), default=0):+g}"
        )
        gates.append(Gate(f"{name} flat after warm-up (end at most {tolerance:g} above start)", not risen, detail))
    return gates


def load_gates(
    totals: dict, max_rejected: float, wrong_before: dict[str, int] | None = None, burst_failures: dict | None = None
) -> list[Gate]:
    """Answers (those of the capacity runs and the burst too), failures (the burst's too) and rejections."""
    paths = totals.get("paths", {})
    wrong = {p: paths.get(p, {}).get("wrong", 0) for p in PATHS}
    ok = {p: paths.get(p, {}).get("ok", 0) for p in PATHS}
    errors: dict[str, int] = {}
    sent = 0
    for p in PATHS:
        sent += paths.get(p, {}).get("sent", 0)
        for status, count in paths.get(p, {}).get("errors", {}).items():
            errors[status] = errors.get(status, 0) + count
    unexpected = {k: v for k, v in errors.items() if k not in DOCUMENTED_REJECTIONS}
    rejected = sum(v for k, v in errors.items() if k in DOCUMENTED_REJECTIONS)
    share = rejected / sent if sent else 0.0
    return [
        Gate(
            "every answer right (each output against in-process ONNX Runtime)",
            all(ok.values()) and not any(wrong.values()) and not wrong_before,
            ", ".join(f"{p}: {ok[p]} OK, {wrong[p]} wrong" for p in PATHS)
            + (f"; wrong before the paced load: {wrong_before}" if wrong_before else ""),
        ),
        Gate(
            "no call failed but the documented rejections",
            not unexpected and not burst_failures,
            (", ".join(f"{k} {v}" for k, v in sorted(unexpected.items())) or f"none of {sent} sent")
            + (f"; in the burst: {burst_failures}" if burst_failures else ""),
        ),
        Gate(
            f"documented rejections (RESOURCE_EXHAUSTED, UNAVAILABLE) at most {max_rejected:.1%} of calls",
            share <= max_rejected,
            f"{rejected} of {sent} ({share:.3%})",
        ),
    ]


def publish_gate(publishes: list[dict], streams: dict[str, dict], expected: int) -> Gate:
    """Every publish loaded its version, and both paths' answers came from it afterwards."""
    missing = []
    for p in publishes:
        if p["version"] is None:
            missing.append(f"{p['model']} at {p['t_s']:.0f} s failed: {p['error']}")
            continue
        for path in PATHS:
            answered = streams.get(f"{path}.{p['model']}", {}).get("versions", {})
            if answered.get(str(p["version"]), 0) == 0:
                missing.append(f"no {path} answer from {p['model']} version {p['version']}")
    done = ", ".join(f"{p['model']} v{p['version']} at {p['t_s']:.0f} s" for p in publishes) or "none"
    return Gate(
        f"every version publish ({expected} due) served, both paths answered by the new version",
        len(publishes) == expected and not missing,
        "; ".join(missing) if missing else f"{len(publishes)} published: {done}",
    )


def judge(rows: list[dict], results: dict, args: argparse.Namespace, incidents: list[str]) -> list[Gate]:
    """Every gate of the run; trends and levels into `results`."""
    trends = growth(rows, args.warmup, args.max_growth_mib_per_10min)
    found = levels(rows, args.warmup, args.max_count_rise)
    results["trends"] = [{**t.as_dict(), "column": k} for k, t in trends]
    results["levels"] = [{**lv.as_dict(), "column": k} for k, lv in found]
    servers = [t for k, t in trends if k.partition(".")[2] in ("tritonserver", "facade", "supervisor")]
    gates = [
        Gate(
            "the servers' memory was judged (enough samples after the warm-up)",
            bool(servers) and all(math.isfinite(t.growth_per_10min) for t in servers),
            f"{min((t.samples for t in servers), default=0)} samples after {args.warmup:.0f} s of warm-up",
        ),
        *memory_gates(trends, args.max_growth_mib_per_10min),
        *count_gates(found, args.max_count_rise),
        *load_gates(
            results.get("totals", {}),
            args.max_rejected,
            results.get("wrong_before_paced"),
            results.get("burst_failures"),
        ),
        publish_gate(
            results.get("publishes", []), results.get("totals", {}).get("streams", {}), results.get("publishes_due", 0)
        ),
        Gate(
            "no process died or restarted; nothing left behind after the stop",
            not incidents,
            "; ".join(incidents) or "none",
        ),
    ]
    return gates
