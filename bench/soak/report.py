"""What the soak says and writes.

A progress line per sample; samples.csv, results.json, report.md (with its `## Gates`) and the plots: memory of each
process, its open fds and threads, /dev/shm, latency and throughput per path; each marks the version publishes.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.output import Gate, gates_section, head, write_json
from bench.soak.load import DEADLINE_S, MAX_OUTSTANDING, PATHS

SINCE = "seconds since the paced load started"


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
    if rows:
        plot(out, rows, results)
    text = report(results, rows, gates)
    (out / "report.md").write_text(text)
    return text


def _labels(rows: list[dict], kind: str) -> list[str]:
    labels: list[str] = []
    for row in rows:
        labels += [k.split(".", 1)[1] for k in row if k.startswith(f"{kind}.") and k.split(".", 1)[1] not in labels]
    return [label for label in labels if label != "total"]


def plot(out: Path, rows: list[dict], results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    publishes, warmup = [p["t_s"] for p in results.get("publishes", [])], results["settings"].get("warmup")

    def axes_of(name: str, count: int, size: tuple[float, float]) -> list:
        figure, axes = plt.subplots(count, 1, figsize=size, sharex=True, squeeze=False)
        figures[name] = figure
        return list(axes[:, 0])

    def finish(axis: Any, legend: bool = True, **labels: str) -> None:
        """Publishes dotted, the warm-up shaded, labels, the y axis from 0, a light grid, a legend right of it."""
        for t in publishes:
            axis.axvline(t, color="grey", linestyle=":", linewidth=0.8)
        if warmup:
            axis.axvspan(0, warmup, color="grey", alpha=0.08)
        axis.set(**labels)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        if legend:
            axis.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    figures: dict = {}
    for name, kinds in (
        ("memory.png", {"rss_mib": "RSS MiB", "pss_mib": "PSS MiB"}),
        ("counts.png", {"fds": "open fds", "threads": "threads"}),
    ):
        for axis, (kind, ylabel) in zip(axes_of(name, 2, (11, 8)), kinds.items(), strict=True):
            for label in _labels(rows, kind):
                axis.plot(*series(rows, f"{kind}.{label}"), marker=".", markersize=3, label=label)
            finish(axis, ylabel=ylabel, title=f"soak: {ylabel} of each process (dotted: publishes; shaded: warm-up)")
        axis.set(xlabel=SINCE)

    [axis] = axes_of("shm.png", 1, (9, 4))
    axis.plot(*series(rows, "shm_mib"), marker=".", label="allocated MiB")
    axis.plot(*series(rows, "shm_size_mib"), linestyle="--", label="file sizes MiB")
    right = axis.twinx()
    right.plot(*series(rows, "shm_files"), color="black", linestyle=":", label="regions")
    right.set(ylabel="regions")
    right.set_ylim(bottom=0)
    finish(axis, legend=False, xlabel=SINCE, ylabel="MiB", title="soak: /dev/shm regions of these servers")
    handles, more = axis.get_legend_handles_labels(), right.get_legend_handles_labels()
    axis.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="lower right")

    load_rows = rows[1:]
    latency, each, rate = axes_of("latency.png", 3, (11, 10))
    for path in PATHS:
        latency.plot(*series(load_rows, f"{path}.p50_ms"), marker=".", label=f"{path} p50")
        latency.plot(*series(load_rows, f"{path}.p99_ms"), marker=".", label=f"{path} p99")
        rate.plot(*series(load_rows, f"{path}.rps"), marker=".", label=f"{path} OK req/s")
    for label in _labels(load_rows, "p99_ms"):
        each.plot(*series(load_rows, f"p99_ms.{label}"), marker=".", markersize=3, label=label)
    finish(latency, ylabel="ms (per interval)", title="soak: latency per path, all models")
    finish(each, ylabel="p99 ms (per interval)", title="p99 of each stream (path.model)")
    finish(rate, xlabel=SINCE, ylabel="OK requests / s", title="throughput per path, all models")

    for name, figure in figures.items():
        figure.tight_layout()
        figure.savefig(out / name, dpi=110)
        plt.close(figure)


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def report(results: dict, rows: list[dict], gates: list[Gate]) -> str:
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
        f"Generator CPU: {fmt(results.get('generator_cpu'), 2)} of a core over "
        f"{fmt(results.get('load_seconds'), 0)} s of paced load.",
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
            f"| {t['series']} ({t['unit']}) | {t['samples']} | {fmt(t['start'])} | {fmt(t['end'])} | "
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
    leftover = results.get("leftover_shm")
    lines += [
        "",
        f"/dev/shm regions of these processes seen during the run: {len(results.get('shm_files_seen', []))}; "
        + ("left after the stop: **" + ", ".join(leftover) + "**" if leftover else "none left after the stop")
        + ". Stub processes: "
        + (
            ", ".join(f"{n} pid {'→'.join(map(str, p))}" for n, p in sorted(results.get("stub_pids", {}).items()))
            or "none seen"
        )
        + ".",
        "",
        gates_section(gates),
        "## Samples",
        "",
        "| t s | facade OK req/s | facade p99 ms | triton OK req/s | triton p99 ms | errors | RSS triton | "
        "RSS facade | RSS supervisor | PSS total | /dev/shm MiB | regions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        errors = " ".join(str(row.get(f"{p}.errors_by_status") or "") for p in ("facade", "triton")).strip()
        lines.append(
            f"| {row['t_s']:.0f} | {fmt(row.get('facade.rps'))} | {fmt(row.get('facade.p99_ms'))} | "
            f"{fmt(row.get('triton.rps'))} | {fmt(row.get('triton.p99_ms'))} | {errors} | "
            f"{fmt(row.get('rss_mib.tritonserver'))} | {fmt(row.get('rss_mib.facade'))} | "
            f"{fmt(row.get('rss_mib.supervisor'))} | {fmt(row.get('pss_mib.total'))} | {fmt(row.get('shm_mib'), 2)} | "
            f"{row.get('shm_files', '')} |"
        )
    lines += ["", *(f"![{name}]({name}.png)\n" for name in ("memory", "counts", "shm", "latency"))]
    return "\n".join(lines)
