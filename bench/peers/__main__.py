"""python -m bench.peers (make bench-peers): every server beside the limit, in interleaved rounds.

With --open-loop it measures goodput at a latency objective instead (goodput.py, goodput_report.py). docs/benchmarks.md says how.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench import REPOSITORY
from bench.baseline.workers import setups
from bench.limit import measure_limit
from bench.load.generators import GENERATORS
from bench.output import CORES, finish, machine, run_folder, say, settings, write_json
from bench.peers import goodput, goodput_report, peer_servers, servers, venvs
from bench.peers.claims import write_summary
from bench.report import notes, servers_table

TRITONNX = ("triton", "facade")
SERVERS = (*TRITONNX, "fastapi", *peer_servers.PEERS)
# The open loop only: Triton direct with the model's policy bounded for the objective (servers.LatencyBound).
BOUNDED = "triton-bounded"
OBJECTIVE_WHY = (
    "the floor keeps a model that runs in a millisecond or less (mobilenet_v3_small, text_classifier) from an "
    "objective that no served round trip on these 2 shared cores, with the load generator on them too, can meet"
)


def make_servers(
    names: list[str],
    model: str,
    workdir: Path,
    bound: servers.LatencyBound | None = None,
    facade_layout: servers.Layout | None = None,
) -> list[servers.Server]:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    made: list[servers.Server] = []
    for name in names:
        if name == BOUNDED:
            if bound is None:
                raise ValueError(f"{BOUNDED} needs an objective: the open loop's (--open-loop)")
            made.append(servers.Tritonnx(REPOSITORY, model, workdir, bound=bound))
        elif name == "facade":
            made.append(servers.Tritonnx(REPOSITORY, model, workdir, facade=True, layout=facade_layout))
        elif name in TRITONNX:
            made.append(servers.Tritonnx(REPOSITORY, model, workdir))
        elif name == "fastapi":
            made += [servers.FastApi(onnx_file, setup, workdir) for setup in setups(CORES)]
        else:
            made.append(
                peer_servers.peer(name, model, onnx_file, servers.Policy.of(REPOSITORY / model, CORES), workdir)
            )
    return made


def bench_model(model: str, args: argparse.Namespace, workdir: Path) -> dict:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    made = make_servers(args.servers, model, workdir / model, facade_layout=args.facade_layout)
    (workdir / model).mkdir(parents=True, exist_ok=True)
    data: dict = {"limits": [], "servers": {s.name: {"setup": s.description, "rounds": []} for s in made}}
    for round_index in range(args.rounds):
        say(f"{model}, round {round_index + 1}/{args.rounds}: limit ...")
        data["limits"].append(measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds).best[1])
        for server in made[round_index % len(made) :] + made[: round_index % len(made)]:
            say(f"{model}: {server.name} ({server.description}) ...")
            record = servers.closed_loop(server, onnx_file, args.concurrency, args.duration)
            if "error" in record:
                say(f"  {server.name}: {record['error']}")
            data["servers"][server.name]["rounds"].append(record)
        say(f"{model}, round {round_index + 1}: limit again ...")
        data["limits"].append(measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds).best[1])
        say(f"  limit {data['limits'][-2]:.0f} then {data['limits'][-1]:.0f} img/s")
    return data


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
        table = servers_table(data["limits"], data["servers"], counted_at)
        lines += [f"## {model}", "", *table, "", *notes(data["servers"])]
    lines += ["Peer venvs (pip freeze) are in results.json."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def open_loop(args: argparse.Namespace) -> int:
    """Goodput per model and server at the objective; the report, its plots and gates; 1 when a gate failed."""
    started, out = run_folder(args.out, "peers-open")
    results: dict[str, Any] = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    results["settings"]["facade_layout"] = args.facade_layout and args.facade_layout.describe()
    results["objective"] = {"factor": args.objective_factor, "floor_ms": args.objective_floor_ms, "why": OBJECTIVE_WHY}
    for model in args.models:
        onnx_file, workdir = REPOSITORY / model / "1" / "model.onnx", out / "logs" / model
        workdir.mkdir(parents=True, exist_ok=True)
        say(f"{model}: in-process single request ...")
        single_p50, single_p99 = goodput.single_request_ms(model, onnx_file, args.limit_seconds)
        objective = goodput.objective_ms(single_p50, args.objective_factor, args.objective_floor_ms)
        say(f"  p50 {single_p50:.2f} ms, p99 {single_p99:.2f} ms: objective p99 <= {objective:.1f} ms")
        data: dict = {"single_p50_ms": single_p50, "single_p99_ms": single_p99, "objective_ms": objective}
        data["servers"], data["rounds"] = {}, []
        results["models"][model] = data
        if model in goodput_report.IN_PROCESS_SHARE:
            say(f"{model}: in-process limit ...")
            limit = measure_limit(onnx_file, model, CORES, seconds=args.limit_seconds)
            data["in_process_rps"] = limit.best[1]
        max_batch = servers.Policy.of(REPOSITORY / model, CORES).max_batch_size
        bound = servers.LatencyBound.for_objective(objective, single_p50, max_batch)
        made = make_servers(args.servers, model, workdir, bound, args.facade_layout)
        for index in range(args.rounds):
            data["rounds"].append({})
            for server in made[index % len(made) :] + made[: index % len(made)]:  # the order rotates
                say(f"{model}, round {index + 1}/{args.rounds}: {server.name} ({server.description}) ...")
                common = goodput.COMMON_RPS.get(model, 0.0)
                record = goodput.measure_open(
                    server, model, onnx_file, objective, args, lone_seconds=args.capacity_seconds, common_rps=common
                )
                if "error" in record:
                    say(f"  {server.name}: {record['error']}")
                data["servers"][server.name] = {"setup": server.description, **record}  # the latest round's
                data["rounds"][-1][server.name] = goodput.figures(record)
                write_json(out / "results.json", results)  # what is done so far survives an interruption
    results["venvs"] = {p: venvs.frozen(p) for p in peer_servers.PEERS if venvs.python_of(p).exists()}
    judged = goodput_report.gates(results)
    code = finish(out, goodput_report.open_report(out, results, judged), judged, results)
    write_summary(out, results)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Every server beside the in-process limit: tritonnx, FastAPI and the peers, in interleaved rounds.",
        epilog="Example (about 25 minutes): python -m bench.peers --models mobilenet_v3_small --rounds 3 --duration 10",
    )
    add = parser.add_argument
    add("--models", nargs="+", help="default: mobilenet_v3_small; --open-loop: resnet50, it and text_classifier")
    add("--servers", nargs="+", choices=[*SERVERS, BOUNDED], help=f"default: all ({BOUNDED} with --open-loop only)")
    add("--rounds", type=int, default=3, help="default: %(default)s")
    add("--concurrency", nargs="+", type=int, default=[16, 1], help="default: %(default)s")
    add("--duration", type=float, default=10.0, help="seconds per point; default: %(default)s")
    add("--limit-seconds", type=float, default=3.0, help="per in-process point; default: %(default)s")
    add("--smoke", action="store_true", help="one round, 2 s per point: proves each server answers")
    add("--build-only", action="store_true", help="make the peers' venvs and stop")
    add("--out", type=Path, help="default: bench/results/<UTC time>-peers[-open]")
    add("--open-loop", action="store_true", help="goodput at a latency objective, Poisson arrivals up to 2x capacity")
    add("--step-seconds", type=float, default=5.0, help="open loop: per offered rate; default: %(default)s")
    add("--capacity-seconds", type=float, default=3.0, help="open loop: the closed loop at c=16; default: %(default)s")
    add("--objective-factor", type=float, default=goodput.OBJECTIVE_FACTOR, help="x in-process p50")
    add("--objective-floor-ms", type=float, default=goodput.OBJECTIVE_FLOOR_MS)
    add(
        "--generator", choices=GENERATORS, default="loadgen", help="open loop: the load generator; default: %(default)s"
    )
    add(
        "--facade-layout",
        type=servers.Layout.parse,
        metavar="INSTANCESxTHREADS",
        help="the facade's Triton runs the models with this many instances of this many intra-op threads instead of "
        "their config's, e.g. 1x1 (what `make tune --path facade` chose); default: the config's",
    )
    args = parser.parse_args(argv)
    open_models = ["resnet50", "mobilenet_v3_small", "text_classifier"]
    args.models = args.models or (open_models if args.open_loop else ["mobilenet_v3_small"])
    args.servers = args.servers or ([SERVERS[0], BOUNDED, *SERVERS[1:]] if args.open_loop else list(SERVERS))
    if args.smoke:
        args.rounds, args.duration, args.limit_seconds, args.step_seconds, args.capacity_seconds = 1, 2.0, 0.5, 1.0, 1.0
    if args.build_only:
        for name in (n for n in args.servers if n in peer_servers.PEERS):
            interpreter = peer_servers.PYTRITON_PYTHON if name == "pytriton" else venvs.DEFAULT_PYTHON
            say(f"{name}: {venvs.ensure(name, interpreter, say)}")
        return 0
    if args.open_loop:
        return open_loop(args)
    started, out = run_folder(args.out, "peers")
    results: dict[str, Any] = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    for model in args.models:
        results["models"][model] = bench_model(model, args, out / "logs")
        results["venvs"] = {p: venvs.frozen(p) for p in peer_servers.PEERS if venvs.python_of(p).exists()}
        write_report(out, results)
    say(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
