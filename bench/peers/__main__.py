"""python -m bench.peers (make bench-peers): every server beside the limit, in interleaved rounds.

Each round measures the in-process limit, then every server in turn (started, its answers checked
against in-process ONNX Runtime, measured at each concurrency with the project's load generator,
stopped), then the limit again; the servers' order rotates from round to round, so none is always
measured first or last. The servers: tritonnx (Triton direct and the facade), the FastAPI baseline
in its documented layouts, and the peers PyTriton, LitServe, Ray Serve, MLServer and BentoML,
each from a venv of its own under build/peers/ (made on first use from
bench/peers/<peer>/requirements.txt). Writes bench/results/<UTC time>-peers/{report.md,results.json}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from backend.server.process import ServerError
from bench import REPOSITORY
from bench.baseline.workers import measured_split, setups
from bench.limit import measure_limit
from bench.load import loops
from bench.load.targets import VerificationError
from bench.output import CORES, machine, run_folder, say, settings, write_json
from bench.peers import servers, venvs
from bench.peers.reference import check_answers, reference_outputs, sample_images
from bench.peers.table import servers_table
from bench.usage import tree_memory
from bench.venvs import VenvError

TRITONNX = ("triton", "facade")
SERVERS = (*TRITONNX, "fastapi", *servers.PEERS)


def make_servers(names: list[str], model: str, workdir: Path) -> list[servers.Server]:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    policy = servers.Policy.of(REPOSITORY / model, CORES)
    made: list[servers.Server] = []
    for name in names:
        if name in TRITONNX:
            made.append(servers.Tritonnx(REPOSITORY, model, workdir, facade=name == "facade"))
        elif name == "fastapi":
            made += [servers.FastApi(onnx_file, setup, workdir) for setup in setups(CORES)]
        else:
            made.append(servers.peer(name, model, onnx_file, policy, workdir))
    return made


def measure(server: servers.Server, onnx_file: Path, args: argparse.Namespace) -> dict:
    """Start the server, check its answers, run each concurrency, stop it; what went wrong is recorded, not raised."""
    started = time.monotonic()
    try:
        server.start()
    except (ServerError, VenvError) as error:
        return {"error": f"did not start: {error}"}
    record: dict = {"ready_seconds": round(time.monotonic() - started, 2), "points": []}
    try:
        images = sample_images()
        try:
            check_answers(server.target(images, reference_outputs(onnx_file, images)), len(images))
        except VerificationError as error:
            return {**record, "error": f"wrong answers, not measured: {error}"}
        for concurrency in args.concurrency:

            def run(concurrency: int = concurrency) -> loops.LoadResult:
                return loops.run(server.target(), concurrency, args.duration, warmup_s=min(1.0, args.duration / 4))

            if isinstance(server, servers.FastApi):
                result, split = measured_split(run, server.worker_pids, concurrency)
                point = {**result.as_dict(), "worker_cpu": split}
            else:
                point = run().as_dict()
            record["points"].append(point)
            say(
                f"  {server.name} c={concurrency}: {point['images_per_s']:.1f} img/s, p50 {point['p50_ms']:.1f} ms, "
                f"errors {sum(point['errors'].values())}"
                + (f", worker CPU {point['worker_cpu']['shares']}" if "worker_cpu" in point else "")
            )
        record["memory"] = tree_memory(server.pid).as_dict()
    finally:
        server.stop()
    return record


def bench_model(model: str, args: argparse.Namespace, workdir: Path) -> dict:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    made = make_servers(args.servers, model, workdir / model)
    (workdir / model).mkdir(parents=True, exist_ok=True)
    data: dict = {"limits": [], "servers": {s.name: {"setup": s.description, "rounds": []} for s in made}}
    for round_index in range(args.rounds):
        order = made[round_index % len(made) :] + made[: round_index % len(made)]
        say(f"{model}, round {round_index + 1}/{args.rounds}: limit ...")
        data["limits"].append(measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds).best[1])
        for server in order:
            say(f"{model}: {server.name} ({server.description}) ...")
            record = measure(server, onnx_file, args)
            if "error" in record:
                say(f"  {server.name}: {record['error']}")
            data["servers"][server.name]["rounds"].append(record)
        say(f"{model}, round {round_index + 1}: limit again ...")
        data["limits"].append(measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds).best[1])
        say(f"  limit {data['limits'][-2]:.0f} then {data['limits'][-1]:.0f} img/s")
    return data


def table_rows(data: dict, counted_at: int) -> list[dict]:
    """One row per server: its figures over the rounds whose answers were right and whose load spread."""
    rows = []
    for name, server in data["servers"].items():
        points = [
            p
            for record in server["rounds"]
            for p in record.get("points", [])
            if not p["errors"] and p.get("worker_cpu", {}).get("spread") is not False
        ]
        rows.append(
            {
                "name": name,
                "images_per_s": [p["images_per_s"] for p in points if p["concurrency"] == counted_at],
                "p50_ms": [p["p50_ms"] for p in points if p["concurrency"] == 1],
                "setup": server["setup"],
            }
        )
    return rows


def write_report(out: Path, results: dict) -> None:
    write_json(out / "results.json", results)
    counted_at = max(results["settings"]["concurrency"])
    lines = [
        f"# Servers beside the limit {results['started']}",
        "",
        f"Machine: {results['machine']}. {results['settings']['rounds']} interleaved round(s) of "
        f"{results['settings']['duration']} s per point; each cell is the range over the rounds. Every server was "
        "driven by the same asyncio load generator (bench/load), one image per request, and its answers were checked "
        "against in-process ONNX Runtime before it was measured. A FastAPI run whose load did not spread over its "
        "workers is not counted, nor a run with errors.",
        "",
    ]
    for model, data in results["models"].items():
        lines += [f"## {model}", "", *servers_table(data["limits"], table_rows(data, counted_at), counted_at), ""]
        problems = [
            f"- {name}, round {index + 1}: {record['error']}"
            for name, server in data["servers"].items()
            for index, record in enumerate(server["rounds"])
            if "error" in record
        ]
        if problems:
            lines += ["Not measured:", "", *problems, ""]
        splits = [
            f"- {name}, round {index + 1}, c={p['concurrency']}: "
            + " / ".join(f"{share:.0%}" for share in p["worker_cpu"]["shares"])
            + ("" if p["worker_cpu"]["spread"] is not False else " (not spread: not counted)")
            for name, server in data["servers"].items()
            for index, record in enumerate(server["rounds"])
            for p in record.get("points", [])
            if len(p.get("worker_cpu", {}).get("shares", [])) > 1
        ]
        if splits:
            lines += ["FastAPI's CPU per worker process (share of the workers' CPU) in each run:", "", *splits, ""]
    lines += ["Peer venvs (pip freeze) are in results.json."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Every server beside the in-process limit: tritonnx, FastAPI and the peers, in interleaved rounds.",
        epilog="Example (about 25 minutes): python -m bench.peers --models mobilenet_v3_small --rounds 3 --duration 10",
    )
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_small"])
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS), help="default: all")
    parser.add_argument("--rounds", type=int, default=3, help="default: %(default)s")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[16, 1], help="default: %(default)s")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per point; default: %(default)s")
    parser.add_argument("--limit-seconds", type=float, default=3.0, help="per in-process point; default: %(default)s")
    parser.add_argument("--smoke", action="store_true", help="one round, 2 s per point: proves each server answers")
    parser.add_argument("--build-only", action="store_true", help="make the peers' venvs and stop")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-peers")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.duration, args.limit_seconds = 1, 2.0, 0.5
    if args.build_only:
        for name in (n for n in args.servers if n in servers.PEERS):
            interpreter = servers.PYTRITON_PYTHON if name == "pytriton" else venvs.DEFAULT_PYTHON
            say(f"{name}: {venvs.ensure(name, interpreter, say)}")
        return 0
    started, out = run_folder(args.out, "peers")
    workdir = out / "logs"
    workdir.mkdir(exist_ok=True)
    results: dict[str, Any] = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    for model in args.models:
        results["models"][model] = bench_model(model, args, workdir)
        results["venvs"] = {p: venvs.frozen(p) for p in servers.PEERS if venvs.python_of(p).exists()}
        write_report(out, results)
    say(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
