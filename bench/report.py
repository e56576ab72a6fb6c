"""Write a `make bench` run's results: results.json and report.md.

Every server beside the limit, as `make bench` and `make bench-peers` report it (`servers_table`, `notes`), takes
`servers`: a server's name -> `{"setup": ..., "rounds": [record, ...]}`, a record being `servers.closed_loop`'s.
"""

from __future__ import annotations

from pathlib import Path

from bench.output import head, write_json


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


def facade_line(data: dict, concurrency: int) -> str:
    """The facade against Triton direct at `concurrency`, both driven by the same load generator: its cost."""
    facade, direct = (
        next(p for p in data[key] if p["concurrency"] == concurrency) for key in ("facade", "loadgen_kserve")
    )
    ratio = f"{facade['images_per_s'] / direct['images_per_s']:.2f}x" if direct["images_per_s"] else "n/a"
    return (
        f"The facade against Triton direct at c={concurrency}, the same load generator: {ratio} the throughput, "
        f"p50 {facade['p50_ms'] - direct['p50_ms']:+.2f} ms."
    )


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
        limit = data["limit"]
        measured_at = {p["concurrency"] for p in data["facade"]}
        concurrency = 16 if 16 in measured_at else max(measured_at)
        perf_analyzer = [{**p, "images_per_s": p["throughput"], "errors": {}} for p in data["perf_analyzer"]]
        tritonnx = {
            name: {"setup": setup, "rounds": [{"points": points}]}
            for name, setup, points in (
                (
                    "tritonnx, Triton direct, perf_analyzer",
                    "the model's config.pbtxt; inputs in shared memory",
                    perf_analyzer,
                ),
                ("tritonnx, Triton direct", "the model's config.pbtxt", data["loadgen_kserve"]),
                ("tritonnx facade", "the facade in front of Triton direct", data["facade"]),
            )
        }
        sweeps = {"Triton direct": data["loadgen_kserve"], "facade": data["facade"]}
        sweeps |= {name: peer["rounds"][0].get("points", []) for name, peer in data["peers"].items()}
        servers = dict(data["servers"])
        for name, peer in data["peers"].items():
            record = peer["rounds"][0]
            if "memory" in record:
                servers[f"{name} (after load)"] = {"ready_seconds": record["ready_seconds"], **record["memory"]}
        lines += [
            f"## {model}",
            "",
            f"Limit, in-process ONNX Runtime ({limit['layout']}): {limit['before']:.1f} img/s before the servers, "
            f"{limit['after']:.1f} after; single image p50 {limit['single_p50_ms']:.2f} ms.",
            "",
            "### Every server beside the limit",
            "",
            "The project's load generator against each server (perf_analyzer's row: its C++ client), every peer's "
            "answers checked against in-process ONNX Runtime first. The limit's range is its measurement before and "
            "after the servers; `make bench-peers` adds Ray Serve and MLServer, over several rounds.",
            "",
            *servers_table([limit["before"], limit["after"]], {**tritonnx, **data["peers"]}, concurrency),
            "",
            facade_line(data, concurrency),
            "",
            *notes(data["peers"]),
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
            "### Memory after load",
            "",
            "PSS counts each shared page once, among the processes sharing it (tritonserver and its stubs share "
            "many); ready s: from a peer's start until it answered.",
            "",
            *head("server | ready s | RSS MiB | PSS MiB | processes"),
            *(
                f"| {name} | {item.get('ready_seconds', 'n/a')} | {item['rss_mib']} | {item['pss_mib']} | "
                f"{item['processes']} |"
                for name, item in servers.items()
            ),
            "",
        ]
    (out / "report.md").write_text("\n".join(lines))
