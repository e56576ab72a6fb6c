"""What the soak says and writes.

A progress line per sample; samples.csv, results.json, report.md and its plots (memory, latency, /dev/shm).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from bench.output import write_json


def progress_line(row: dict, stubs: list[str]) -> str:
    stub_rss = "/".join(f"{row.get(f'rss_mib.{s}', math.nan):.0f}" for s in stubs)
    errors = row.get("errors_by_status") or "0"
    return (
        f"t={row['t_s']:6.0f}s  {row.get('rps', 0):6.1f} req/s  p50 {row.get('p50_ms', math.nan):6.1f}  "
        f"p99 {row.get('p99_ms', math.nan):6.1f} ms  errors {errors}  skipped {row.get('skipped', 0)}  | RSS MiB "
        f"facade {row.get('rss_mib.facade', math.nan):.0f}  triton {row.get('rss_mib.tritonserver', math.nan):.0f}  "
        f"stubs {stub_rss}  PSS total {row.get('pss_mib.total', math.nan):.0f}  | /dev/shm {row['shm_mib']:.1f} MiB "
        f"in {row['shm_files']} files"
    )


def write_outputs(out: Path, results: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with open(out / "samples.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    write_json(out / "results.json", results)
    if rows:
        plot(out, rows, results)
    (out / "report.md").write_text(report(results, rows))


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(times, values) of one column, over the rows that have it."""
    times = [row["t_s"] for row in rows if key in row and row[key] != ""]
    values = [float(row[key]) for row in rows if key in row and row[key] != ""]
    return times, values


def plot(out: Path, rows: list[dict], results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    title = f"{results['settings']['model']} soak at {results['offered_rps']:.0f} req/s"
    since = "seconds since the paced load started"
    beside = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}  # a legend right of the plot
    figure, (axis, total) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=(3, 1))
    labels = []
    for row in rows:
        labels += [k.split(".", 1)[1] for k in row if k.startswith("rss_mib.") and k.split(".", 1)[1] not in labels]
    for label in labels:
        axis.plot(*series(rows, f"rss_mib.{label}"), marker=".", label=label)
    _axis(axis, ylabel="RSS MiB", title=f"{title}: memory of each process")
    axis.legend(**beside)
    total.plot(*series(rows, "pss_mib.total"), color="black", marker=".", label="PSS, all processes")
    _axis(total, xlabel=since, ylabel="PSS total MiB")
    total.legend(**beside)
    _save(plt, figure, out / "memory.png")

    load_rows = rows[1:]
    figure, axis = plt.subplots(figsize=(9, 5))
    axis.plot(*series(load_rows, "p50_ms"), marker=".", label="p50")
    axis.plot(*series(load_rows, "p99_ms"), marker=".", label="p99")
    _axis(axis, xlabel=since, ylabel="latency ms (per interval)", title=f"{title}: latency and throughput")
    right = axis.twinx()
    right.plot(*series(load_rows, "rps"), color="grey", linestyle=":", label="throughput (OK req/s)")
    right.set(ylabel="OK requests / s")
    right.set_ylim(bottom=0)
    handles = axis.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    axis.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="lower right")
    _save(plt, figure, out / "latency.png")

    figure, axis = plt.subplots(figsize=(9, 4))
    axis.plot(*series(rows, "shm_mib"), marker=".", label="allocated")
    axis.plot(*series(rows, "shm_size_mib"), linestyle="--", label="file sizes")
    _axis(axis, xlabel=since, ylabel="MiB", title=f"{title}: /dev/shm files of these servers")
    axis.legend(fontsize=8)
    _save(plt, figure, out / "shm.png")


def _axis(axis, **labels: str) -> None:
    """Labels, the y axis from 0 and a light grid."""
    axis.set(**labels)
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)


def _save(plt, figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def report(results: dict, rows: list[dict]) -> str:
    s, limits = results["settings"], results["thresholds"]
    lines = [
        f"# tritonnx soak {results['started']}",
        "",
        f"Machine: {results['machine']}. Command: `{results['command']}`.",
        "",
        f"**Verdict: {results['verdict']}**" + (": " + "; ".join(results["failures"]) if results["failures"] else ""),
        "",
    ]
    if results.get("warnings"):
        lines += ["Warnings: " + "; ".join(results["warnings"]), ""]
    capacity = results.get("capacity")
    if capacity:
        lines += [
            f"Capacity through the facade (closed loop, {capacity['concurrency']} concurrent, "
            f"{capacity['seconds']:.0f} s): {capacity['throughput_rps']:.1f} req/s, p50 {capacity['p50_ms']:.1f} ms, "
            f"p99 {capacity['p99_ms']:.1f} ms, errors {capacity['errors'] or 'none'}. "
            f"Offered: {results['offered_rps']:.1f} req/s "
            f"({s['load_fraction']:.0%}) open loop for {fmt(results.get('load_seconds'), 0)} s, each call with a "
            f"{s['deadline']:.0f} s deadline, at most {s['max_outstanding']} outstanding.",
            "",
        ]
    burst = results.get("burst")
    if burst:
        lines += [
            f"Warm-up burst before it (closed loop, {burst['concurrency']} concurrent, {burst['seconds']:.0f} s): "
            f"{burst['throughput_rps']:.1f} req/s, p99 {burst['p99_ms']:.1f} ms, errors {burst['errors'] or 'none'}.",
            "",
        ]
    totals = results.get("totals")
    if totals:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(totals["errors"].items())) or "none"
        lines += [
            f"Calls: {totals['scheduled']} scheduled, {totals['sent']} sent, {totals['ok']} OK, errors by status: "
            f"{errors}; {totals['skipped']} skipped at the outstanding cap. Whole-run latency of OK calls: p50 "
            f"{fmt(totals['p50_ms'], 2)} ms, p99 {fmt(totals['p99_ms'], 2)} ms, max {fmt(totals['max_ms'], 1)} ms. "
            f"Achieved {fmt(totals['ok_rps'])} OK req/s. Generator CPU {fmt(totals['generator_cpu'], 2)} of a "
            "core.",
            "",
        ]
    lines += [
        "Growth check: the second half of the run is fitted with a least-squares line and with the Theil-Sen "
        "slope (median of the pairwise slopes, which one step such as an arena filled once barely moves), both "
        f"projected to 10 minutes; a memory series is flagged when BOTH grow more than "
        f"{limits['growth_mib_per_10min']:.0f} MiB AND more than {limits['growth_fraction']:.0%} of its mean per 10 "
        f"minutes (p99: a warning above {limits['p99_growth_ms_per_10min']:.0f} ms and "
        f"{limits['p99_growth_fraction']:.0%}; fds and threads: reported only). Short "
        "runs project a short window to 10 minutes: read their slopes as noise. PSS splits shared pages among "
        "every process mapping the same files, other servers on the machine included, so it also moves when "
        "those start or stop; RSS is the per-process signal.",
        "",
        "`idle` is after start-up, before any load; `start` is the first sample of the paced load (after the "
        "capacity run and the burst).",
        "",
        "| series | idle | start | end | peak | 2nd-half mean | growth / 10 min: least squares | Theil-Sen "
        "| % of mean | flagged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in results.get("trends", []):
        fraction = t["growth_fraction"]
        lines.append(
            f"| {t['series']} ({t['unit']}) | {fmt(t.get('idle'))} | {fmt(t['start'])} | {fmt(t['end'])} | "
            f"{fmt(t['peak'])} | "
            f"{fmt(t['mean'])} | {fmt(t['growth_per_10min'], 2)} | {fmt(t['robust_growth_per_10min'], 2)} | "
            f"{fmt(fraction * 100 if isinstance(fraction, float) else None, 1)} | "
            f"{'**yes**' if t['flagged'] else 'no'}{' (' + t['note'] + ')' if t.get('note') else ''} |"
        )
    leftover = results.get("leftover_shm")
    lines += [
        "",
        f"/dev/shm files of these processes seen during the run: {len(results.get('shm_files_seen', []))}; "
        + (
            "left after shutdown: **" + ", ".join(leftover) + "**"
            if leftover
            else "none left after shutdown"
            if leftover is not None
            else "not checked (run did not get that far)"
        )
        + ".",
        "",
        "Stub processes: "
        + (
            ", ".join(
                f"{name} pid {'→'.join(map(str, pids))}" for name, pids in sorted(results.get("stub_pids", {}).items())
            )
            or "none seen"
        ),
        "",
        "## Samples",
        "",
        "| t s | OK req/s | p50 ms | p99 ms | errors | skipped | RSS facade | RSS triton | PSS total | /dev/shm MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['t_s']:.0f} | {fmt(row.get('rps'))} | {fmt(row.get('p50_ms'), 2)} | "
            f"{fmt(row.get('p99_ms'), 2)} | "
            f"{row.get('errors_by_status') or row.get('errors', '')} | {row.get('skipped', '')} | "
            f"{fmt(row.get('rss_mib.facade'))} | {fmt(row.get('rss_mib.tritonserver'))} | "
            f"{fmt(row.get('pss_mib.total'))} | {fmt(row.get('shm_mib'), 2)} |"
        )
    lines += ["", "![memory](memory.png)", "", "![latency](latency.png)", "", "![shm](shm.png)", ""]
    return "\n".join(lines)


def series_name(column: str) -> str:
    """`rss_mib.facade` -> `RSS facade`, `shm_mib` -> `/dev/shm`."""
    if column == "shm_mib":
        return "/dev/shm allocated"
    kind, _, label = column.partition(".")
    kind = {"rss_mib": "RSS", "pss_mib": "PSS", "fds": "open fds", "threads": "threads"}.get(kind, kind)
    return f"{kind} {label}".strip()
