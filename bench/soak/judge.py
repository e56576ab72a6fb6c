"""The soak's gates (docs/operations.md#overload-bursts-and-soak lists them).

Memory needs both slopes above the limit (bench.trend): one step, such as an arena grown once, moves only the
least-squares one. A process started during the run (a published version's stubs) gets a warm-up of its own.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Sequence

from bench.output import Gate
from bench.soak.load import PATHS
from bench.soak.report import series, series_name
from bench.trend import level, trend

# Statuses the facade and Triton document as load shedding: allowed, up to MAX_REJECTED of the calls.
DOCUMENTED_REJECTIONS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
MAX_REJECTED = 0.01


def columns(rows: Sequence[dict], kinds: Sequence[str]) -> list[str]:
    """Every column `<kind>.<label>` of the rows, in order of appearance (the PSS total left out)."""
    found: list[str] = []
    for row in rows:
        found += [k for k in row if k.partition(".")[0] in kinds and k != "pss_mib.total" and k not in found]
    return found


def fitted(rows: Sequence[dict], key: str, warmup: float) -> tuple[list[float], list[float], float]:
    """A series' times and values, and the end of its warm-up: `warmup` seconds after its first sample."""
    times, values = series(list(rows), key)
    return times, values, (times[0] if times else 0.0) + warmup


def memory_gates(rows: Sequence[dict], warmup: float, limit: float, results: dict) -> list[Gate]:
    trends = []
    for key in [*columns(rows, ("rss_mib", "pss_mib")), "shm_mib"]:
        times, values, since = fitted(rows, key, warmup)
        trends.append((key, trend(series_name(key), times, values, limit=limit, since=since)))
    results["trends"] = [{**t.as_dict(), "column": k} for k, t in trends]
    servers = [t for k, t in trends if k.partition(".")[2] in ("tritonserver", "facade", "supervisor")]
    gates = [
        Gate(
            "the servers' memory was judged (enough samples after the warm-up)",
            bool(servers) and all(math.isfinite(t.growth_per_10min) for t in servers),
            f"{min((t.samples for t in servers), default=0)} samples after {warmup:.0f} s of warm-up",
        )
    ]
    for name, prefix in (("RSS", "rss_mib."), ("PSS", "pss_mib."), ("/dev/shm bytes", "shm_mib")):
        mine = [t for k, t in trends if k.startswith(prefix)]
        flagged = [t for t in mine if t.flagged]
        judged = [t for t in mine if math.isfinite(t.growth_per_10min)]
        worst = max(judged, key=lambda t: min(t.growth_per_10min, t.robust_growth_per_10min), default=None)
        if flagged:
            detail = "; ".join(
                f"{t.series} {t.growth_per_10min:+.2f}/{t.robust_growth_per_10min:+.2f}" for t in flagged
            )
        elif worst is None:
            detail = "no series judged"
        else:
            detail = (
                f"{len(judged)} series judged; steepest {worst.series}: {worst.growth_per_10min:+.2f} (least squares), "
                f"{worst.robust_growth_per_10min:+.2f} (Theil-Sen) MiB per 10 min"
            )
        gates.append(
            Gate(f"{name} of every process grows at most {limit:g} MiB per 10 min after warm-up", not flagged, detail)
        )
    return gates


def count_gates(rows: Sequence[dict], warmup: float, tolerance: float, results: dict) -> list[Gate]:
    found = []
    for key in [*columns(rows, ("fds", "threads")), "shm_files"]:
        times, values, since = fitted(rows, key, warmup)
        found.append((key, level(series_name(key), times, values, since=since, tolerance=tolerance)))
    results["levels"] = [{**lv.as_dict(), "column": k} for k, lv in found]
    gates = []
    for name, prefix in (("open fds", "fds."), ("threads", "threads."), ("/dev/shm regions", "shm_files")):
        mine = [lv for k, lv in found if k.startswith(prefix)]
        risen = [lv for lv in mine if not lv.flat]
        judged = [lv for lv in mine if math.isfinite(lv.rise)]
        detail = (
            "; ".join(f"{lv.series} {lv.first:g} -> {lv.last:g}" for lv in risen)
            if risen
            else f"{len(judged)} series judged, largest rise {max((lv.rise for lv in judged), default=0):+g}"
        )
        gates.append(Gate(f"{name} flat after warm-up (end at most {tolerance:g} above start)", not risen, detail))
    return gates


def load_gates(totals: dict, wrong_before: dict[str, int] | None = None) -> list[Gate]:
    """Answers (those of the capacity runs too), failures and rejections."""
    paths = [totals.get("paths", {}).get(p, {}) for p in PATHS]
    wrong, ok = [p.get("wrong", 0) for p in paths], [p.get("ok", 0) for p in paths]
    sent = sum(p.get("sent", 0) for p in paths)
    errors = sum((Counter(p.get("errors", {})) for p in paths), Counter[str]())
    unexpected = {k: v for k, v in errors.items() if k not in DOCUMENTED_REJECTIONS}
    rejected = sum(v for k, v in errors.items() if k in DOCUMENTED_REJECTIONS)
    share = rejected / sent if sent else 0.0
    return [
        Gate(
            "every answer right (each output against in-process ONNX Runtime)",
            all(ok) and not any(wrong) and not wrong_before,
            ", ".join(f"{path}: {o} OK, {w} wrong" for path, o, w in zip(PATHS, ok, wrong, strict=True))
            + (f"; wrong before the paced load: {wrong_before}" if wrong_before else ""),
        ),
        Gate(
            "no call failed but the documented rejections",
            not unexpected,
            ", ".join(f"{k} {v}" for k, v in sorted(unexpected.items())) or f"none of {sent} sent",
        ),
        Gate(
            f"documented rejections (RESOURCE_EXHAUSTED, UNAVAILABLE) at most {MAX_REJECTED:.1%} of calls",
            share <= MAX_REJECTED,
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
            if not streams.get(f"{path}.{p['model']}", {}).get("versions", {}).get(str(p["version"]), 0):
                missing.append(f"no {path} answer from {p['model']} version {p['version']}")
    done = ", ".join(f"{p['model']} v{p['version']} at {p['t_s']:.0f} s" for p in publishes) or "none"
    return Gate(
        f"every version publish ({expected} due) served, both paths answered by the new version",
        len(publishes) == expected and not missing,
        "; ".join(missing) if missing else f"{len(publishes)} published: {done}",
    )


def judge(rows: list[dict], results: dict, args: argparse.Namespace, incidents: list[str]) -> list[Gate]:
    """Every gate of the run; trends and levels into `results`."""
    totals = results.get("totals", {})
    return [
        *memory_gates(rows, args.warmup, args.max_growth_mib_per_10min, results),
        *count_gates(rows, args.warmup, args.max_count_rise, results),
        *load_gates(totals, results.get("wrong_before_paced")),
        publish_gate(results.get("publishes", []), totals.get("streams", {}), results.get("publishes_due", 0)),
        Gate(
            "no process died or restarted; nothing left behind after the stop",
            not incidents,
            "; ".join(incidents) or "none",
        ),
    ]
