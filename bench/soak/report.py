"""What the soak says and writes.

A progress line per sample; samples.csv (every sample, for plotting), results.json and report.md (with its `## Gates`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict
from pathlib import Path

from bench.output import Gate, gates_section, head, write_json
from bench.soak.load import DEADLINE_S, MAX_OUTSTANDING, PATHS


def progress_line(row: dict) -> str:
    paths = "  ".join(
        f"{p} {row.get(f'{p}.rps', 0):6.1f} req/s p99 {row.get(f'{p}.p99_ms', math.nan):6.1f} ms "
        f"errors {row.get(f'{p}.errors_by_status') or 0}"
        for p in PATHS
    )
    return (
        f"t={row['t_s']:6.0f}s  {paths}  | RSS MiB triton {row.get('rss_mib.tritonserver', math.nan):.0f} facade "
        f"{row.get('rss_mib.facade', math.nan):.0f} supervisor {row.get('rss_mib.supervisor', math.nan):.0f}  "
        f"| /dev/shm {row['shm_mib']:.1f} MiB in {row['shm_files']} regions"
    )


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(times, values) of one column, over the rows that have it."""
    times = [row["t_s"] for row in rows if key in row and row[key] != ""]
    values = [float(row[key]) for row in rows if key in row and row[key] != ""]
    return times, values


def series_name(column: str) -> str:
    """`rss_mib.facade` -> `RSS facade`, `shm_mib` -> `/dev/shm allocated`."""
    if column == "shm_mib":
        return "/dev/shm allocated"
    if column == "shm_files":
        return "/dev/shm regions"
    kind, _, label = column.partition(".")
    kind = {"rss_mib": "RSS", "pss_mib": "PSS", "fds": "open fds", "threads": "threads"}.get(kind, kind)
    return f"{kind} {label}".strip()


def write_outputs(out: Path, results: dict, rows: list[dict], gates: list[Gate]) -> str:
    """Every file of the run; the report's text."""
    out.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with open(out / "samples.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    results["gates"] = [asdict(g) for g in gates]
    write_json(out / "results.json", results)
    text = report(results, gates)
    (out / "report.md").write_text(text)
    return text


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def report(results: dict, gates: list[Gate]) -> str:
    s = results["settings"]
    failed = [g.name for g in gates if not g.passed]
    lines = [
        f"# tritonnx soak {results['started']}",
        "",
        f"Machine: {results['machine']}. Command: `{results['command']}`.",
        "",
        f"**Verdict: {'PASS' if not failed else 'FAIL'}**" + (": " + "; ".join(failed) if failed else ""),
        "",
        "## Load",
        "",
        f"Served as `make serve` serves, a scratch copy of the model repository. {', '.join(s['models'])}, each through "
        f"the facade and Triton's KServe gRPC direct at once: {len(s['models']) * 2} streams, each offered "
        f"{s['load_fraction']:.0%} / {len(s['models']) * 2} of its own capacity (closed loop alone, "
        f"{s['capacity_concurrency']} concurrent, {s['capacity_seconds']:.0f} s), open loop: equal shares of the "
        f"machine's time. Every call has a {DEADLINE_S:.0f} s deadline, at most {MAX_OUTSTANDING} outstanding per "
        "stream (a call due beyond is skipped and counted); every output is compared with in-process ONNX Runtime's.",
        "",
        "| stream | capacity req/s | offered req/s | sent | OK | errors | skipped | wrong | p50 ms | p99 ms | "
        "versions answering |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    capacities, totals = results.get("capacities", {}), results.get("totals", {})
    streams = [
        (label, fmt(capacities.get(label, {}).get("throughput_rps")), fmt(t["offered_rps"], 2), t)
        for label, t in totals.get("streams", {}).items()
    ]
    streams += [(f"**{path}, all models**", "", "", t) for path, t in totals.get("paths", {}).items()]
    for label, capacity, offered, t in streams:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(t["errors"].items())) or "none"
        versions = ", ".join(f"v{k}: {v}" for k, v in t.get("versions", {}).items())
        lines.append(
            f"| {label} | {capacity} | {offered} | {t['sent']} | {t['ok']} | {errors} | {t['skipped']} | {t['wrong']} | "
            f"{fmt(t['p50_ms'])} | {fmt(t['p99_ms'])} | {versions} |"
        )
    lines += [
        "",
        "## Versions published",
        "",
        f"Every {s['publish_every']:.0f} s the next model of the rotation ({', '.join(s['publish_models'])}) was "
        "published again from its own version 1 (`tritonnx-models publish`'s code path): Triton loads the new version "
        "beside the serving one and unloads the old one (version_policy latest 1).",
        "",
        *head("t s | model | version | seconds | serving after it / error"),
    ]
    for p in results.get("publishes", []):
        lines.append(
            f"| {p['t_s']:.0f} | {p['model']} | {p['version'] or 'failed'} | {p['seconds']:.1f} | "
            f"{p['serving'] or p['error']} |"
        )
    if not results.get("publishes"):
        lines.append("| | none | | | |")
    lines += [
        "",
        "## Growth after the warm-up",
        "",
        f"Warm-up: the first {s['warmup']:.0f} s of each process's samples. Memory series fail when the least-squares "
        f"AND the Theil-Sen slopes both exceed {s['max_growth_mib_per_10min']:g} MiB per 10 min; counts when the "
        f"median of the last 3 samples ends more than {s['max_count_rise']:g} above that of the first 3. Short runs' "
        "slopes are noise. PSS moves when processes start or stop (a publish); RSS is the per-process signal.",
        "",
        *head("series | samples | start | end | peak | mean | growth / 10 min: least squares | Theil-Sen | failed"),
    ]
    for t in results.get("trends", []):
        lines.append(
            f"| {t['series']} (MiB) | {t['samples']} | {fmt(t['start'])} | {fmt(t['end'])} | "
            f"{fmt(t['peak'])} | {fmt(t['mean'])} | {fmt(t['growth_per_10min'], 2)} | "
            f"{fmt(t['robust_growth_per_10min'], 2)} | {'**yes**' if t['flagged'] else 'no'}"
            f"{' (' + t['note'] + ')' if t.get('note') else ''} |"
        )
    lines += ["", *head("count | samples | first | last | peak | rise | failed")]
    for lv in results.get("levels", []):
        lines.append(
            f"| {lv['series']} | {lv['samples']} | {fmt(lv['first'], 0)} | {fmt(lv['last'], 0)} | "
            f"{fmt(lv['peak'], 0)} | {fmt(lv['rise'], 0)} | {'no' if lv['flat'] else '**yes**'}"
            f"{' (' + lv['note'] + ')' if lv.get('note') else ''} |"
        )
    lines += [
        "",
        gates_section(gates),
        "Every sample (each process's memory, fds and threads, /dev/shm, each path's load) is in samples.csv.",
    ]
    return "\n".join(lines)
