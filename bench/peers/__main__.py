"""python -m bench.peers (make bench-peers): every server beside the limit, in interleaved rounds.

Each round measures the in-process limit, then every server in turn (started, its answers checked
against in-process ONNX Runtime, measured at each concurrency with the project's load generator,
stopped), then the limit again; the servers' order rotates from round to round, so none is always
measured first or last. The servers: tritonnx (Triton direct and the facade), the FastAPI baseline
in its documented layouts, and the peers PyTriton, LitServe, Ray Serve, MLServer and BentoML,
each from a venv of its own under build/peers/ (made on first use from
bench/peers/<peer>/requirements.txt). Writes bench/results/<UTC time>-peers/{report.md,results.json}.

With --open-loop it measures goodput at a latency objective instead (bench/peers/goodput.py): Poisson arrivals at
rates stepped up to 2x each server's capacity; bench/results/<UTC time>-peers-open/, with plots and gates.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import REPOSITORY
from bench.baseline.workers import measured_split, setups
from bench.limit import measure_limit
from bench.load import loops
from bench.load.targets import VerificationError
from bench.output import CORES, machine, run_folder, say, settings, verdict, write_json
from bench.peers import goodput, servers, venvs
from bench.peers.open_report import write_open_report
from bench.peers.reference import check_answers, reference_outputs, sample_images
from bench.peers.table import servers_table
from bench.peers.venvs import VenvError
from bench.usage import tree_memory
from tritonnx.server.process import ServerError

TRITONNX = ("triton", "facade")
SERVERS = (*TRITONNX, "fastapi", *servers.PEERS)
# The open loop only: Triton direct with the model's policy bounded for the objective (servers.LatencyBound).
BOUNDED = "triton-bounded"


def make_servers(
    names: list[str], model: str, workdir: Path, bound: servers.LatencyBound | None = None
) -> list[servers.Server]:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    policy = servers.Policy.of(REPOSITORY / model, CORES)
    made: list[servers.Server] = []
    for name in names:
        if name == BOUNDED:
            if bound is None:
                raise ValueError(f"{BOUNDED} needs an objective: the open loop's (--open-loop)")
            made.append(servers.Tritonnx(REPOSITORY, model, workdir, bound=bound))
        elif name in TRITONNX:
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


def open_loop(args: argparse.Namespace) -> int:
    """Goodput per model and server at the objective; the report, its plots and gates; 1 when a gate failed."""
    started, out = run_folder(args.out, "peers-open")
    workdir = out / "logs"
    workdir.mkdir(exist_ok=True)
    results: dict[str, Any] = {
        "started": started,
        "machine": machine(),
        "settings": settings(args),
        "objective": {"factor": args.objective_factor, "floor_ms": args.objective_floor_ms, "why": OBJECTIVE_WHY},
        "models": {},
    }
    for model in args.models:
        onnx_file = REPOSITORY / model / "1" / "model.onnx"
        say(f"{model}: in-process single request ...")
        single_p50, single_p99 = goodput.single_request_ms(model, onnx_file, args.limit_seconds)
        objective = goodput.objective_ms(single_p50, args.objective_factor, args.objective_floor_ms)
        say(f"  p50 {single_p50:.2f} ms, p99 {single_p99:.2f} ms: objective p99 <= {objective:.1f} ms")
        data: dict = {"single_p50_ms": single_p50, "single_p99_ms": single_p99, "objective_ms": objective}
        data["servers"] = {}
        names = args.servers
        results["models"][model] = data
        bound = servers.LatencyBound.for_objective(
            objective, single_p50, servers.Policy.of(REPOSITORY / model, CORES).max_batch_size
        )
        for server in make_servers(names, model, workdir / model, bound):
            (workdir / model).mkdir(parents=True, exist_ok=True)
            say(f"{model}: {server.name} ({server.description}) ...")
            record = goodput.measure_open(server, model, onnx_file, objective, args)
            if "error" in record:
                say(f"  {server.name}: {record['error']}")
            data["servers"][server.name] = {"setup": server.description, **record}
            write_json(out / "results.json", results)  # what is done so far survives an interruption
    results["venvs"] = {p: venvs.frozen(p) for p in servers.PEERS if venvs.python_of(p).exists()}
    judged = goodput.gates(results)
    results["gates"] = [asdict(gate) for gate in judged]
    text = write_open_report(out, results, judged)
    print(text)
    say(f"report: {out / 'report.md'}")
    return verdict(judged)


OBJECTIVE_WHY = (
    "the floor keeps a model that runs in a millisecond or less (mobilenet_v3_small, text_classifier) from an "
    "objective that no served round trip on these 2 shared cores, with the load generator on them too, can meet"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Every server beside the in-process limit: tritonnx, FastAPI and the peers, in interleaved rounds.",
        epilog="Example (about 25 minutes): python -m bench.peers --models mobilenet_v3_small --rounds 3 --duration 10",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        help="default: mobilenet_v3_small; with --open-loop resnet50 mobilenet_v3_small text_classifier",
    )
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=[*SERVERS, BOUNDED],
        help=f"default: all ({BOUNDED}: Triton direct with its policy bounded for the objective, with --open-loop)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="default: %(default)s")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[16, 1], help="default: %(default)s")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per point; default: %(default)s")
    parser.add_argument("--limit-seconds", type=float, default=3.0, help="per in-process point; default: %(default)s")
    parser.add_argument("--smoke", action="store_true", help="one round, 2 s per point: proves each server answers")
    parser.add_argument("--build-only", action="store_true", help="make the peers' venvs and stop")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-peers[-open]")
    parser.add_argument(
        "--open-loop",
        action="store_true",
        help="goodput at a latency objective: Poisson arrivals stepped to 2x capacity",
    )
    parser.add_argument(
        "--step-seconds", type=float, default=5.0, help="open loop: per offered rate; default: %(default)s"
    )
    parser.add_argument(
        "--capacity-seconds", type=float, default=3.0, help="open loop: the closed loop at c=16; default: %(default)s"
    )
    parser.add_argument("--objective-factor", type=float, default=goodput.OBJECTIVE_FACTOR, help="x in-process p50")
    parser.add_argument("--objective-floor-ms", type=float, default=goodput.OBJECTIVE_FLOOR_MS)
    args = parser.parse_args(argv)
    if args.models is None:
        args.models = (
            ["resnet50", "mobilenet_v3_small", "text_classifier"] if args.open_loop else ["mobilenet_v3_small"]
        )
    if args.servers is None:
        args.servers = [*SERVERS[:1], BOUNDED, *SERVERS[1:]] if args.open_loop else list(SERVERS)
    if args.smoke:
        args.rounds, args.duration, args.limit_seconds = 1, 2.0, 0.5
        args.step_seconds, args.capacity_seconds = 1.0, 1.0
    if args.build_only:
        for name in (n for n in args.servers if n in servers.PEERS):
            interpreter = servers.PYTRITON_PYTHON if name == "pytriton" else venvs.DEFAULT_PYTHON
            say(f"{name}: {venvs.ensure(name, interpreter, say)}")
        return 0
    if args.open_loop:
        return open_loop(args)
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
