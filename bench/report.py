"""Write a `make bench` run's results: results.json, report.md and PNG plots.

Every server beside the limit, as `make bench` and `make bench-peers` report it (`servers_table`, `notes`), takes
`servers`: a server's name -> `{"setup": ..., "rounds": [record, ...]}`, a record being `servers.closed_loop`'s.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.cpu import ROLES  # noqa: E402
from bench.output import head, write_json  # noqa: E402


def value_range(values: list[float], digits: int = 0) -> str:
    """`low-high` of the values (one value alone), `n/a` for none."""
    if not values:
        return "n/a"
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def counted(points: list[dict]) -> list[dict]:
    """The points whose figure counts: no errors, and (a FastAPI run) its load spread over the workers."""
    return [p for p in points if not p["errors"] and p.get("worker_cpu", {}).get("spread") is not False]


def servers_table(limits: list[float], servers: dict, concurrency: int = 16) -> list[str]:
    """Every server's counted throughputs at `concurrency` (and vs the limit's mean), c=1 p50s: ranges over rounds."""
    limit = sum(limits) / len(limits) if limits else 0.0
    lines = [
        *head(f"server | img/s at c={concurrency} | vs limit | p50 ms at c=1 | setup"),
        f"| limit: in-process ONNX Runtime | {value_range(limits)} | 1.00x | | same .onnx, same cores, best layout |",
    ]
    for name, server in servers.items():
        points = counted([p for record in server["rounds"] for p in record.get("points", [])])
        served = [p["images_per_s"] for p in points if p["concurrency"] == concurrency]
        ratios = value_range([v / limit for v in served], 2) + "x" if limit and served else "n/a"
        lone = value_range([p["p50_ms"] for p in points if p["concurrency"] == 1], 1)
        lines.append(f"| {name} | {value_range(served)} | {ratios} | {lone} | {server['setup']} |")
    return lines


def notes(servers: dict) -> list[str]:
    """The rounds a server was not measured in, and FastAPI's CPU split over its workers in each run."""
    rounds = [(name, index + 1, record) for name, s in servers.items() for index, record in enumerate(s["rounds"])]
    problems = [f"- {name}, round {n}: {record['error']}" for name, n, record in rounds if "error" in record]
    splits = [
        f"- {name}, round {n}, c={p['concurrency']}: "
        + " / ".join(f"{share:.0%}" for share in p["worker_cpu"]["shares"])
        + ("" if p["worker_cpu"]["spread"] is not False else " (not spread: not counted)")
        for name, n, record in rounds
        for p in record.get("points", [])
        if len(p.get("worker_cpu", {}).get("shares", [])) > 1
    ]
    lines = ["Not measured:", "", *problems, ""] if problems else []
    if splits:
        lines += [
            "FastAPI's CPU per worker process (share of the workers' CPU) in each run: a run counts only if every "
            "worker did at least half of an even share; one that did not is run once more with new connections.",
            "",
            *splits,
            "",
        ]
    return lines


def _ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if value and reference else "n/a"


def _best(points: list[dict], key: str = "images_per_s") -> dict | None:
    return max(points, key=lambda p: p[key]) if points else None


def _at(points: list[dict], concurrency: int) -> dict | None:
    return next((p for p in points if p["concurrency"] == concurrency), None)


def peer_points(data: dict, prefix: str) -> list[dict]:
    """The counted points of the peers whose name starts with `prefix`, each with its server's name."""
    return [
        {**p, "server": name}
        for name, peer in data["peers"].items()
        if name.startswith(prefix)
        for p in counted(peer["rounds"][0].get("points", []))
    ]


def summary_rows(data: dict) -> list[str]:
    limit, direct = data["limit"]["images_per_s"], _best(data["perf_analyzer"], "throughput")
    kserve, facade = _best(data["loadgen_kserve"]), _best(data["facade"])
    fastapi, pytriton = _best(peer_points(data, "FastAPI")), _best(peer_points(data, "PyTriton"))
    assert direct and kserve and facade, "every run measures Triton direct and the facade"
    rows = [
        f"| limit: in-process ONNX Runtime ({data['limit']['layout']}) | {limit:.1f} img/s | 1.00x | |",
        f"| Triton direct, perf_analyzer (best, c={direct['concurrency']}) | {direct['throughput']:.1f} img/s | "
        f"{_ratio(direct['throughput'], limit)} | {_ratio(direct['throughput'], fastapi['images_per_s'] if fastapi else None)} vs FastAPI |",
        f"| Triton direct, project load generator (best, c={kserve['concurrency']}) | {kserve['images_per_s']:.1f} img/s | "
        f"{_ratio(kserve['images_per_s'], limit)} | |",
        f"| facade (best, c={facade['concurrency']}) | {facade['images_per_s']:.1f} img/s | {_ratio(facade['images_per_s'], limit)} | "
        f"{_ratio(facade['images_per_s'], kserve['images_per_s'])} vs Triton direct (same generator) |",
    ]
    facade16, kserve16 = _at(data["facade"], 16), _at(data["loadgen_kserve"], 16)
    if facade16 and kserve16:
        rows.append(
            f"| facade vs Triton direct at c=16 | {facade16['images_per_s']:.1f} vs {kserve16['images_per_s']:.1f} img/s | "
            f"{_ratio(facade16['images_per_s'], kserve16['images_per_s'])} | p50 "
            f"{facade16['p50_ms'] - kserve16['p50_ms']:+.2f} ms |"
        )
    if fastapi:
        rows.append(
            f"| FastAPI + uvicorn + ONNX Runtime (best: {fastapi['server']}, c={fastapi['concurrency']}) | "
            f"{fastapi['images_per_s']:.1f} img/s | {_ratio(fastapi['images_per_s'], limit)} | "
            "runs whose load did not spread over the workers left out |"
        )
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
    one, floor_one = _at(data["perf_analyzer"], 1), _at(data.get("floor", []), 1)
    if one:
        rows.append(
            f"| c=1 p50, Triton direct vs in-process single image ({when}) | {one['p50_ms']:.2f} vs {single:.2f} ms | | "
            f"{one['p50_ms'] - single:+.2f} ms |"
        )
    if one and floor_one:
        rows.append(
            f"| c=1 p50, serving floor: same server and config, a model that computes nothing | {floor_one['p50_ms']:.2f} ms | | "
            f"served minus floor {one['p50_ms'] - floor_one['p50_ms']:.2f} ms vs the model's {single:.2f} ms in-process |"
        )
    return rows


def cpu_rows(data: dict) -> list[str]:
    """The CPU each process spent per image at c=16 (else the highest), next to in-process ONNX Runtime's."""
    limit, cores = data["limit"], data["limit"].get("cores")
    measured_at = {p["concurrency"] for p in data["perf_analyzer"]}
    concurrency = 16 if 16 in measured_at else max(measured_at, default=0)

    def cpu_at(points: list[dict]) -> dict | None:
        point = _at(points, concurrency)
        return point if point and point.get("cpu_ms_per_image") else None

    paths = {
        "Triton direct, perf_analyzer": "perf_analyzer",
        "Triton direct, project load generator": "loadgen_kserve",
        "facade, project load generator": "facade",
    }
    measured = [(name, point) for name, key in paths.items() if (point := cpu_at(data[key]))]
    floor = cpu_at(data.get("floor", []))
    if not (measured or floor) or "cpu_ms_per_image" not in limit or not cores:
        return []
    lines = [
        "",
        f"### Where the CPU goes at c={concurrency} (CPU ms per image, all processes on the {cores} cores)",
        "",
        "Stubs: ONNX Runtime in Triton's Python stubs, with their round trip and this project's Python. Idle: core "
        "time nobody used. Ceiling: cores / busy CPU per image. The serving floor: the same server and config with a "
        "model that computes nothing; its ceiling adds in-process ONNX Runtime's CPU per image.",
        "",
        *head("path | stubs | tritonserver | facade | client | idle | busy total | ceiling | ceiling vs limit"),
        f"| in-process ONNX Runtime ({limit['layout']}) | {limit['cpu_ms_per_image']:.2f} | - | - | - | - | "
        f"{limit['cpu_ms_per_image']:.2f} | {cores * 1000 / limit['cpu_ms_per_image']:.0f} img/s | - |",
    ]
    rows = [(name, p, p["cpu_ms_per_image"]["total"], "img/s") for name, p in measured]
    if floor:
        name = f"serving floor, perf_analyzer (a model that computes nothing; batch {floor['avg_batch']:.2f})"
        busy = floor["cpu_ms_per_image"]["total"] + limit["cpu_ms_per_image"]
        rows.append((name, floor, busy, "img/s with in-process ONNX Runtime"))
    for name, p, busy, unit in rows:
        cpu = p["cpu_ms_per_image"]
        ceiling = cores * 1000 / busy if busy else 0.0
        cells = " | ".join(f"{cpu[role]:.2f}" if role in cpu else "-" for role in ROLES)
        ratio = _ratio(ceiling, limit["images_per_s"])
        lines.append(f"| {name} | {cells} | {cpu['total']:.2f} | {ceiling:.0f} {unit} | {ratio} |")
    return lines


def write_report(out: Path, results: dict) -> None:
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
        sweeps = {"Triton direct": data["loadgen_kserve"], "facade": data["facade"]}
        sweeps |= {name: peer["rounds"][0].get("points", []) for name, peer in data["peers"].items()}
        tritonnx = {
            name: {"setup": setup, "rounds": [{"points": data[key]}]}
            for name, setup, key in (
                ("tritonnx, Triton direct", "the model's config.pbtxt", "loadgen_kserve"),
                ("tritonnx facade", "the facade in front of Triton direct", "facade"),
            )
        }
        servers = dict(data["servers"])
        for name, peer in data["peers"].items():
            record = peer["rounds"][0]
            if "memory" in record:
                servers[f"{name} (after load)"] = {"ready_seconds": record["ready_seconds"], **record["memory"]}
        lines += [
            f"## {model}",
            "",
            *head("what | throughput | vs limit | other"),
            *summary_rows(data),
            "",
            f"Limit before / after the servers: {data['limit']['before']:.1f} / {data['limit']['after']:.1f} img/s "
            f"(single image p50 {data['limit']['single_p50_ms']:.2f} ms).",
            "",
            "### Triton direct (perf_analyzer, KServe gRPC, inputs in system shared memory)",
            "",
            *head("c | img/s | p50 ms | p95 ms | p99 ms | queue ms | compute in/infer/out ms | avg batch | client CPU"),
            *(
                f"| {p['concurrency']} | {p['throughput']:.1f} | {p['p50_ms']:.2f} | {p['p95_ms']:.2f} | {p['p99_ms']:.2f} | "
                f"{p['server_queue_ms']:.2f} | {p['server_compute_input_ms']:.2f} / {p['server_compute_infer_ms']:.2f} / "
                f"{p['server_compute_output_ms']:.2f} | {p['avg_batch']:.2f} | {p['client_cpu']:.2f} |"
                for p in data["perf_analyzer"]
            ),
            "",
            "### Project load generator: Triton direct, the facade and the other servers",
            "",
            "Client CPU is the load generator's own share of one core (it runs on the same cores).",
            "",
            *head("target | c | img/s | p50 ms | p95 ms | p99 ms | client CPU | errors"),
            *(
                f"| {name} | {p['concurrency']} | {p['images_per_s']:.1f} | {p['p50_ms']:.2f} | {p['p95_ms']:.2f} | "
                f"{p['p99_ms']:.2f} | {p['client_cpu']:.2f} | {sum(p['errors'].values()) or ''} |"
                for name, points in sweeps.items()
                for p in points
            ),
            "",
            "### Every server beside the limit (this run)",
            "",
            "The same load generator against each server, every server's answers checked against in-process ONNX "
            "Runtime first. The limit's range is its measurement before and after the servers; `make bench-peers` "
            "adds Ray Serve and MLServer, over several rounds.",
            "",
            *servers_table([data["limit"]["before"], data["limit"]["after"]], {**tritonnx, **data["peers"]}),
            "",
            *notes(data["peers"]),
            *cpu_rows(data),
            "",
            "### Start-up and memory",
            "",
            "tritonserver starts twice: first with the model files wherever the kernel's page cache left them, then "
            "warm; memory is the warm start's, idle after warm-up.",
            "",
            *head("server | ready s | first start, ready s | RSS MiB | PSS MiB | processes"),
            *(
                f"| {name} | {item.get('ready_seconds', 'n/a')} | {item.get('first_ready_seconds', 'n/a')} | "
                f"{item['rss_mib']} | {item['pss_mib']} | {item['processes']} |"
                for name, item in servers.items()
            ),
            "",
            f"![throughput]({model}_throughput.png)",
            f"![latency]({model}_latency.png)",
            "",
        ]
        perf_analyzer = {
            "Triton direct (perf_analyzer, shm)": [
                {**p, "images_per_s": p["throughput"]} for p in data["perf_analyzer"]
            ]
        }
        plot_model(out, model, data["limit"]["images_per_s"], {**perf_analyzer, **sweeps})
    (out / "report.md").write_text("\n".join(lines))


def plot_model(out: Path, model: str, limit: float, series: dict[str, list[dict]]) -> None:
    """Throughput, and p50 and p99, against the concurrency, each server a line."""
    ticks = sorted({p["concurrency"] for points in series.values() for p in points})
    for kind in ("throughput", "latency"):
        figure, axis = plt.subplots(figsize=(8, 5))
        for name, points in series.items():
            x = [p["concurrency"] for p in points]
            if kind == "throughput":
                axis.plot(x, [p["images_per_s"] for p in points], marker="o", label=name)
                continue
            line = axis.plot(x, [p["p50_ms"] for p in points], marker="o", label=f"{name} p50")[0]
            axis.plot(
                x, [p["p99_ms"] for p in points], marker="x", linestyle=":", color=line.get_color(), label=f"{name} p99"
            )
        if kind == "throughput":
            axis.axhline(limit, color="black", linestyle="--", label="limit (in-process ORT)")
            axis.set(xscale="log", xlabel="concurrency", ylabel="images / s", title=f"{model}: throughput")
        else:
            axis.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="latency ms", title=f"{model}: latency")
        axis.set_xticks(ticks, [str(c) for c in ticks])
        axis.legend(fontsize=7, ncol=2 if kind == "latency" else 1)
        figure.tight_layout()
        figure.savefig(out / f"{model}_{kind}.png", dpi=110)
        plt.close(figure)
