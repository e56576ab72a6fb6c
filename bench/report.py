"""Write a benchmark run's results: results.json, report.md and PNG plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.output import write_json  # noqa: E402
from bench.peers.table import servers_table  # noqa: E402


def _ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if value and reference else "n/a"


def _best(points: list[dict], key: str = "images_per_s") -> dict | None:
    return max(points, key=lambda p: p[key]) if points else None


def counted(points: list[dict]) -> list[dict]:
    """The points whose figure counts: a FastAPI run whose load did not spread over its workers does not."""
    return [p for p in points if p.get("worker_cpu", {}).get("spread") is not False]


def fastapi_points(data: dict) -> list[dict]:
    return [p for setup in data["fastapi"].values() for p in setup["points"]]


def _at(points: list[dict], concurrency: int, key: str) -> list[float]:
    return [p[key] for p in points if p["concurrency"] == concurrency]


def bench_servers(data: dict, concurrency: int = 16) -> list[dict]:
    """The rows of `servers_table` for one `make bench` run of a model (one round: each range is one value)."""
    rows = [
        {"name": "tritonnx, Triton direct", "points": data["loadgen_kserve"], "setup": "the model's config.pbtxt"},
        {"name": "tritonnx facade", "points": data["facade"], "setup": "the facade in front of Triton direct"},
    ]
    pytriton = data.get("pytriton", {})
    if pytriton.get("points"):
        rows.append({"name": "PyTriton", "points": pytriton["points"], "setup": pytriton["setup"]})
    for name, setup in data["fastapi"].items():
        rows.append({"name": f"FastAPI {name}", "points": counted(setup["points"]), "setup": setup.get("why", "")})
    return [
        {
            "name": row["name"],
            "images_per_s": _at(row["points"], concurrency, "images_per_s"),
            "p50_ms": _at(row["points"], 1, "p50_ms"),
            "setup": row["setup"],
        }
        for row in rows
    ]


def summary_rows(model: str, data: dict) -> list[str]:
    limit = data["limit"]["images_per_s"]
    direct = _best(data["perf_analyzer"], "throughput")
    kserve = _best(data["loadgen_kserve"])
    facade = _best(data["facade"])
    fastapi = _best(counted(fastapi_points(data)))
    assert direct and kserve and facade, "every run measures Triton direct and the facade"
    one = next((p for p in data["perf_analyzer"] if p["concurrency"] == 1), None)
    facade_at = {p["concurrency"]: p for p in data["facade"]}
    kserve_at = {p["concurrency"]: p for p in data["loadgen_kserve"]}
    c16 = 16 if 16 in facade_at and 16 in kserve_at else None
    rows = [
        f"| limit: in-process ONNX Runtime ({data['limit']['layout']}) | {limit:.1f} img/s | 1.00x | |",
        f"| Triton direct, perf_analyzer (best, c={direct['concurrency']}) | {direct['throughput']:.1f} img/s | "
        f"{_ratio(direct['throughput'], limit)} | {_ratio(direct['throughput'], fastapi['images_per_s'] if fastapi else None)} vs FastAPI |",
        f"| Triton direct, project load generator (best, c={kserve['concurrency']}) | {kserve['images_per_s']:.1f} img/s | "
        f"{_ratio(kserve['images_per_s'], limit)} | |",
        f"| facade (best, c={facade['concurrency']}) | {facade['images_per_s']:.1f} img/s | {_ratio(facade['images_per_s'], limit)} | "
        f"{_ratio(facade['images_per_s'], kserve['images_per_s'])} vs Triton direct (same generator) |",
    ]
    if c16:
        rows.append(
            f"| facade vs Triton direct at c=16 | {facade_at[16]['images_per_s']:.1f} vs {kserve_at[16]['images_per_s']:.1f} img/s | "
            f"{_ratio(facade_at[16]['images_per_s'], kserve_at[16]['images_per_s'])} | p50 "
            f"{facade_at[16]['p50_ms'] - kserve_at[16]['p50_ms']:+.2f} ms |"
        )
    if fastapi:
        rows.append(
            f"| FastAPI + uvicorn + ONNX Runtime (best: {fastapi['setup']}, c={fastapi['concurrency']}) | "
            f"{fastapi['images_per_s']:.1f} img/s | {_ratio(fastapi['images_per_s'], limit)} | "
            "runs whose load did not spread over the workers left out |"
        )
    pytriton = _best(data.get("pytriton", {}).get("points", []))
    if pytriton:
        rows.append(
            f"| PyTriton, same load generator (best, c={pytriton['concurrency']}) | {pytriton['images_per_s']:.1f} img/s | "
            f"{_ratio(pytriton['images_per_s'], limit)} | {_ratio(kserve['images_per_s'], pytriton['images_per_s'])} "
            "Triton direct vs PyTriton |"
        )
    # The in-process reference measured just before and after the c=1 point when there is one.
    beside = data.get("single_image_beside_c1")
    single, when = (
        (beside["p50_ms"], "measured beside it") if beside else (data["limit"]["single_p50_ms"], "with the limit")
    )
    if one:
        rows.append(
            f"| c=1 p50, Triton direct vs in-process single image ({when}) | {one['p50_ms']:.2f} vs {single:.2f} ms | | "
            f"{one['p50_ms'] - single:+.2f} ms |"
        )
    floor_one = next((p for p in data.get("floor", []) if p["concurrency"] == 1), None)
    if one and floor_one:
        rows.append(
            f"| c=1 p50, serving floor: same server and config, a model that computes nothing | {floor_one['p50_ms']:.2f} ms | | "
            f"served minus floor {one['p50_ms'] - floor_one['p50_ms']:.2f} ms vs the model's {single:.2f} ms in-process |"
        )
    return rows


def worker_rows(data: dict) -> list[str]:
    """The FastAPI baseline's CPU split over its worker processes in each run: where the load went."""
    rows = [
        (name, p)
        for name, setup in data["fastapi"].items()
        for p in setup["points"]
        if p.get("worker_cpu", {}).get("shares") and len(p["worker_cpu"]["shares"]) > 1
    ]
    if not rows:
        return []
    lines = [
        "",
        "### FastAPI: CPU per worker process over each run",
        "",
        "Each worker's share of the workers' CPU time, read from the worker processes. A run counts only if every "
        "worker did at least half of an even share; one that did not is run once more with new connections. With "
        "fewer connections than workers (c=1) the question does not arise.",
        "",
        "| setup | c | shares | spread | runs |",
        "|---|---|---|---|---|",
    ]
    for name, p in rows:
        split = p["worker_cpu"]
        verdict = {True: "yes", False: "**no: not counted**", None: "n/a"}[split["spread"]]
        shares = " / ".join(f"{share:.0%}" for share in split["shares"])
        lines.append(f"| {name} | {p['concurrency']} | {shares} | {verdict} | {split['runs']} |")
    return lines


def cpu_rows(data: dict) -> list[str]:
    """The CPU each process spent per image, next to in-process ONNX Runtime's.

    Read at c=16, else at the highest concurrency measured: with the cores saturated,
    cores / CPU per image is the ceiling.
    """
    cores = data["limit"].get("cores")
    measured_at = {p["concurrency"] for p in data["perf_analyzer"]}
    concurrency = 16 if 16 in measured_at else max(measured_at, default=0)
    candidates = [
        (name, next((p for p in points if p["concurrency"] == concurrency and p.get("cpu_ms_per_image")), None))
        for name, points in (
            ("Triton direct, perf_analyzer", data["perf_analyzer"]),
            ("Triton direct, project load generator", data["loadgen_kserve"]),
            ("facade, project load generator", data["facade"]),
        )
    ]
    measured = [(name, p) for name, p in candidates if p]
    floor = next(
        (p for p in data.get("floor", []) if p["concurrency"] == concurrency and p.get("cpu_ms_per_image")), None
    )
    if not (measured or floor) or "cpu_ms_per_image" not in data["limit"] or not cores:
        return []
    limit = data["limit"]["images_per_s"]
    lines = [
        "",
        f"### Where the CPU goes at c={concurrency} (CPU ms per image, all processes on the {cores} cores)",
        "",
        "Stubs: ONNX Runtime in Triton's Python stub processes, with the stub round trip and this "
        "project's Python around it. Idle: core time nobody used. Ceiling: cores / busy CPU per image, "
        "the most this path could serve with the cores fully busy. The serving floor is the same server and "
        "config with a model of the same inputs and outputs that computes nothing: the fixed cost of serving, at "
        "the batch sizes that model gets. Its ceiling adds in-process ONNX Runtime's CPU per image: the most "
        "this server could serve if ONNX Runtime ran in its stubs as cheaply as in-process.",
        "",
        "| path | stubs | tritonserver | facade | client | idle | busy total | ceiling | ceiling vs limit |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| in-process ONNX Runtime ({data['limit']['layout']}) | {data['limit']['cpu_ms_per_image']:.2f} | - | - | - | - | "
        f"{data['limit']['cpu_ms_per_image']:.2f} | {cores * 1000 / data['limit']['cpu_ms_per_image']:.0f} img/s | - |",
    ]
    for name, p in measured:
        cpu = p["cpu_ms_per_image"]
        ceiling = cores * 1000 / cpu["total"] if cpu["total"] else 0.0
        cells = " | ".join(
            f"{cpu[role]:.2f}" if role in cpu else "-" for role in ("stubs", "tritonserver", "facade", "client", "idle")
        )
        lines.append(f"| {name} | {cells} | {cpu['total']:.2f} | {ceiling:.0f} img/s | {_ratio(ceiling, limit)} |")
    if floor:
        cpu = floor["cpu_ms_per_image"]
        ceiling = cores * 1000 / (cpu["total"] + data["limit"]["cpu_ms_per_image"])
        cells = " | ".join(
            f"{cpu[role]:.2f}" if role in cpu else "-" for role in ("stubs", "tritonserver", "facade", "client", "idle")
        )
        lines.append(
            f"| serving floor, perf_analyzer (a model that computes nothing; batch {floor['avg_batch']:.2f}) | {cells} | "
            f"{cpu['total']:.2f} | {ceiling:.0f} img/s with in-process ONNX Runtime | {_ratio(ceiling, limit)} |"
        )
    return lines


def write_report(out: Path, results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    lines = [
        f"# tritonnx benchmark {results['started']}",
        "",
        f"Machine: {results['machine']}. Every figure below comes from this one run; the machine's speed drifts, "
        "so compare ratios, not absolute numbers. The limit is the mean of the in-process measurement taken before "
        "and after the servers of each model.",
        "",
    ]
    for model, data in results["models"].items():
        lines += [
            f"## {model}",
            "",
            "| what | throughput | vs limit | other |",
            "|---|---|---|---|",
            *summary_rows(model, data),
            "",
            f"Limit before / after the servers: {data['limit']['before']:.1f} / {data['limit']['after']:.1f} img/s "
            f"(single image p50 {data['limit']['single_p50_ms']:.2f} ms).",
            "",
            "### Triton direct (perf_analyzer, KServe gRPC, inputs in system shared memory)",
            "",
            "| c | img/s | p50 ms | p95 ms | p99 ms | queue ms | compute in/infer/out ms | avg batch | client CPU |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in data["perf_analyzer"]:
            lines.append(
                f"| {p['concurrency']} | {p['throughput']:.1f} | {p['p50_ms']:.2f} | {p['p95_ms']:.2f} | {p['p99_ms']:.2f} | "
                f"{p['server_queue_ms']:.2f} | {p['server_compute_input_ms']:.2f} / {p['server_compute_infer_ms']:.2f} / "
                f"{p['server_compute_output_ms']:.2f} | {p['avg_batch']:.2f} | {p['client_cpu']:.2f} |"
            )
        lines += [
            "",
            "### Project load generator: Triton direct vs the facade, and the FastAPI baseline",
            "",
            "Client CPU is the load generator's own share of one core (it runs on the same 2 cores).",
            "",
            "| target | c | img/s | p50 ms | p95 ms | p99 ms | client CPU | errors |",
            "|---|---|---|---|---|---|---|---|",
        ]
        sweeps = [("Triton direct", data["loadgen_kserve"]), ("facade", data["facade"])]
        sweeps += [("PyTriton", data.get("pytriton", {}).get("points", []))]
        sweeps += [(f"FastAPI {name}", setup["points"]) for name, setup in data["fastapi"].items()]
        for name, points in sweeps:
            for p in points:
                lines.append(
                    f"| {name} | {p['concurrency']} | {p['images_per_s']:.1f} | {p['p50_ms']:.2f} | {p['p95_ms']:.2f} | "
                    f"{p['p99_ms']:.2f} | {p['client_cpu']:.2f} | {sum(p['errors'].values()) or ''} |"
                )
        lines += worker_rows(data)
        lines += [
            "",
            "### Every server beside the limit (this run)",
            "",
            "The same load generator against each server, every server's answers checked against in-process ONNX "
            "Runtime first. The limit's range is its measurement before and after the servers; `make bench-peers` "
            "adds LitServe, Ray Serve, MLServer and BentoML, over several rounds.",
            "",
            *servers_table([data["limit"]["before"], data["limit"]["after"]], bench_servers(data)),
        ]
        pytriton = data.get("pytriton", {})
        if "skipped" in pytriton or "failed" in pytriton:
            lines += ["", f"PyTriton was not measured: {pytriton.get('skipped') or pytriton.get('failed')}"]
        lines += cpu_rows(data)
        lines += [
            "",
            "### Start-up and memory",
            "",
            "tritonserver starts twice: first with the model files wherever the kernel's page cache left them, then "
            "warm; memory is the warm start's, idle after warm-up.",
            "",
            "| server | ready s | first start, ready s | RSS MiB | PSS MiB | processes |",
            "|---|---|---|---|---|---|",
        ]
        for name, item in data["servers"].items():
            lines.append(
                f"| {name} | {item.get('ready_seconds', 'n/a')} | {item.get('first_ready_seconds', 'n/a')} | "
                f"{item['rss_mib']} | {item['pss_mib']} | {item['processes']} |"
            )
        lines += ["", f"![throughput]({model}_throughput.png)", f"![latency]({model}_latency.png)", ""]
        plot_model(out, model, data)
    (out / "report.md").write_text("\n".join(lines))


def plot_model(out: Path, model: str, data: dict) -> None:
    series = {
        "Triton direct (perf_analyzer, shm)": [
            (p["concurrency"], p["throughput"], p["p50_ms"], p["p99_ms"]) for p in data["perf_analyzer"]
        ],
        "Triton direct (project generator)": [
            (p["concurrency"], p["images_per_s"], p["p50_ms"], p["p99_ms"]) for p in data["loadgen_kserve"]
        ],
        "facade": [(p["concurrency"], p["images_per_s"], p["p50_ms"], p["p99_ms"]) for p in data["facade"]],
    }
    if data.get("pytriton", {}).get("points"):
        series["PyTriton"] = [
            (p["concurrency"], p["images_per_s"], p["p50_ms"], p["p99_ms"]) for p in data["pytriton"]["points"]
        ]
    for name, setup in data["fastapi"].items():
        series[f"FastAPI {name}"] = [
            (p["concurrency"], p["images_per_s"], p["p50_ms"], p["p99_ms"]) for p in setup["points"]
        ]

    figure, axis = plt.subplots(figsize=(8, 5))
    for name, points in series.items():
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    axis.axhline(data["limit"]["images_per_s"], color="black", linestyle="--", label="limit (in-process ORT)")
    axis.set(xscale="log", xlabel="concurrency", ylabel="images / s", title=f"{model}: throughput")
    axis.set_xticks([p[0] for p in series["facade"]], [str(p[0]) for p in series["facade"]])
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / f"{model}_throughput.png", dpi=110)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(8, 5))
    for name, points in series.items():
        line = axis.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=f"{name} p50")[0]
        axis.plot(
            [p[0] for p in points],
            [p[3] for p in points],
            marker="x",
            linestyle=":",
            color=line.get_color(),
            label=f"{name} p99",
        )
    axis.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="latency ms", title=f"{model}: latency")
    axis.set_xticks([p[0] for p in series["facade"]], [str(p[0]) for p in series["facade"]])
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(out / f"{model}_latency.png", dpi=110)
    plt.close(figure)
