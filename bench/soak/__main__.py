"""python -m bench.soak: an hour at a steady share of capacity, every model through both paths (make soak).

Serves a scratch copy of the model repository as `make serve` does (`python -m tritonnx.commands.serve`: tritonserver, the
supervisor and the facade; bench/soak/serve.py), then:

1. opens a stream per model and path (the facade's Predict, Triton's KServe ModelInfer; bench/soak/load.py), each
   answer checked against in-process ONNX Runtime (bench/soak/checked.py), and measures each stream's capacity
   alone (bench/soak/run.py runs these phases);
2. runs every stream at once in a closed loop for `--burst-seconds`, so that buffers sized by the peak grow now;
3. offers each of the N streams `--load-fraction` / N of its capacity, open loop, for `--duration` seconds: the
   streams together keep the machine busy `--load-fraction` of its time, in equal shares;
4. every `--publish-every` seconds publishes the next model of the rotation again as a new version
   (bench/soak/publish.py): Triton swaps it in under the load, the answers stay checked;
5. every `--interval` seconds samples RSS, PSS, open fds and threads of tritonserver, each stub, the facade and
   the supervisor's process, the /dev/shm regions of these processes, and each path's throughput and latency
   (bench/usage.py);
6. stops the stack, checks nothing is left, and judges the run (bench/soak/judge.py): memory slopes after the
   warm-up, flat counts, right answers, no failures beyond the documented rejections, every publish served, no
   process died.

Writes <out>/{report.md,results.json,samples.csv,memory.png,counts.png,shm.png,latency.png} and the servers' logs in
<out>/logs/. Exit code 0 when every gate passed; 1 when one failed; 2 when the stack could not be started or
measured; 130 when interrupted (the report is written all the same).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path

from bench import REPOSITORY
from bench.load.targets import VerificationError
from bench.output import Gate, machine, run_folder, say, settings, verdict
from bench.soak.judge import DOCUMENTED_REJECTIONS, judge
from bench.soak.load import make_streams
from bench.soak.publish import Publisher
from bench.soak.report import write_outputs
from bench.soak.run import load_phases
from bench.soak.serve import ServeProcess
from bench.usage import SHM_DIR, Watcher
from tritonnx.offline.demo_models import MODELS
from tritonnx.server.process import ServerError, StopRequest
from tritonnx.server.repository import CONFIG_FILE, link_models

DEMO_MODELS = tuple(MODELS)  # resnet50, mobilenet_v3_small, text_classifier, token_classifier


def check_shutdown(watcher: Watcher, results: dict, incidents: list[str]) -> None:
    """After the stop: no process of ours alive, no /dev/shm region of theirs left, no stub restarted."""
    deadline = time.monotonic() + 10  # our processes are gone within it, or the check says so
    while watcher.alive_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    lingering = watcher.alive_pids()
    if lingering:
        incidents.append(f"processes still alive after the stop: {lingering}")
    leftover = sorted(name for name in watcher.shm_names if (SHM_DIR / name).exists())
    results["shm_files_seen"] = sorted(watcher.shm_names)
    results["leftover_shm"] = leftover
    results["stub_pids"] = watcher.stub_pids
    if leftover:
        incidents.append(f"{len(leftover)} /dev/shm region(s) left after the stop: {', '.join(leftover)}")
    restarted = {name: pids for name, pids in watcher.stub_pids.items() if len(pids) > 1}
    if restarted:
        incidents.append("stubs restarted: " + ", ".join(f"{n} {p}" for n, p in sorted(restarted.items())))


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=(
            "Soak: serve a scratch copy of the model repository as `make serve` does, load every model through the "
            "facade and Triton direct at once at --load-fraction of the measured capacity (split in equal shares of "
            "the machine's time), publish a model again as a new version every --publish-every seconds, sample "
            "RSS/PSS, open fds and threads of every process and the /dev/shm regions every --interval seconds, and "
            "judge growth after the warm-up, flat counts, right answers and failures."
        ),
        epilog=(
            "Writes report.md (with its Gates), results.json, samples.csv and memory.png, counts.png, shm.png, "
            "latency.png (server logs in logs/). Exit code: 0 every gate passed; 1 a gate failed; 2 the stack could "
            "not start or be measured; 130 interrupted.  A quick check: python -m bench.soak --duration 60 "
            "--interval 5 --publish-every 30"
        ),
    )
    add = parser.add_argument
    add("--duration", type=float, default=3600.0, help="seconds of paced load; default: %(default)s")
    add("--interval", type=float, default=10.0, help="seconds between samples; default: %(default)s")
    add(
        "--models",
        nargs="+",
        default=list(DEMO_MODELS),
        help="models loaded, each through both paths; default: %(default)s",
    )
    add(
        "--load-fraction", type=float, default=0.7, help="share of the machine's capacity offered; default: %(default)s"
    )
    add("--rate", type=float, help="offer this many requests/s per stream instead, and skip the capacity measurement")
    add("--capacity-concurrency", type=int, default=16, help="concurrency of each capacity run; default: %(default)s")
    add(
        "--capacity-seconds",
        type=float,
        default=10.0,
        help="measured seconds of each stream's capacity run (after up to 2 s of warm-up); default: %(default)s",
    )
    add(
        "--burst-seconds",
        type=float,
        default=10.0,
        help="before the paced load, every stream at once in a closed "
        "loop so that buffers sized by the peak grow before the samples (0: none); default: %(default)s",
    )
    add(
        "--burst-concurrency",
        type=int,
        default=8,
        help="concurrent calls of each stream in the burst; default: %(default)s",
    )
    add("--deadline", type=float, default=10.0, help="deadline of every call, seconds; default: %(default)s")
    add(
        "--max-outstanding",
        type=int,
        default=32,
        help="calls in flight per stream at most; a call due beyond it is skipped and counted; default: %(default)s",
    )
    add("--publish-every", type=float, default=600.0, help="seconds between version publishes; default: %(default)s")
    add("--publish-models", nargs="+", help="the publish rotation; default: --models")
    add(
        "--warmup",
        type=float,
        help="seconds of each process's samples left out of the fits; default: 600, or a "
        "third of --duration when that is shorter",
    )
    add(
        "--max-growth-mib-per-10min",
        type=float,
        default=1.0,
        help="a memory series fails when both its slopes after the warm-up exceed this; default: %(default)s",
    )
    add(
        "--max-count-rise",
        type=float,
        default=2.0,
        help="a count (fds, threads, /dev/shm regions) fails when it "
        "ends more than this above where it started after the warm-up; default: %(default)s",
    )
    add(
        "--max-rejected",
        type=float,
        default=0.01,
        help="most RESOURCE_EXHAUSTED + UNAVAILABLE, as a share of calls; default: %(default)s",
    )
    add("--out", type=Path, help="default: bench/results/<UTC timestamp>-soak/")
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = arguments()
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = min(600.0, args.duration / 3)
    args.publish_models = args.publish_models or list(args.models)
    if not (
        args.duration > 0
        and args.interval > 0
        and 0 < args.load_fraction <= 1.5
        and args.deadline > 0
        and min(args.max_outstanding, args.capacity_concurrency, args.burst_concurrency) >= 1
        and args.capacity_seconds > 0
        and args.burst_seconds >= 0
        and args.publish_every > 0
        and 0 <= args.warmup < args.duration
        and args.max_growth_mib_per_10min > 0
        and args.max_count_rise >= 0
        and (args.rate is None or args.rate > 0)
    ):
        parser.error(
            "durations, the interval, the deadline, --load-fraction (0-1.5), the counts and the limits must "
            "be positive, --warmup shorter than --duration"
        )
    if args.interval > args.duration:
        parser.error("--interval must not exceed --duration")
    for model in {*args.models, *args.publish_models}:
        if not (REPOSITORY / model / "1" / "model.onnx").exists():
            parser.error(f"{REPOSITORY / model / '1' / 'model.onnx'} is missing: run `make models`")
    if set(args.publish_models) - set(args.models):
        parser.error("--publish-models must be among --models (the answers across a swap are checked by the load)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started, out = run_folder(args.out, "soak")
    results: dict = {
        "started": started,
        "command": " ".join(["python -m bench.soak", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "settings": settings(args),
        "documented_rejections": list(DOCUMENTED_REJECTIONS),
        "publishes_due": sum(
            1 for k in range(1, int(args.duration // args.publish_every) + 1) if k * args.publish_every < args.duration
        ),
    }
    rows: list[dict] = []
    incidents: list[str] = []
    stop = StopRequest()
    watcher: Watcher | None = None
    problem = ""
    scratch = out / "repository"
    shutil.rmtree(scratch, ignore_errors=True)
    served = {p.parent.name: p.parent for p in REPOSITORY.glob(f"*/{CONFIG_FILE}")}  # every model, as make serve
    link_models(scratch, served)
    serve = ServeProcess(scratch, out / "logs", [])  # the facade with make serve's defaults (its probe: resnet50)
    publisher = Publisher(scratch, REPOSITORY, args.publish_models, serve.triton_grpc_url, serve.admin_key)
    say(
        f"starting python -m tritonnx.commands.serve ({', '.join(sorted(served))} from a scratch copy); logs in {out / 'logs'}"
    )
    try:
        serve.start()
        triton_pid, facade_pid = serve.children()
        watcher = Watcher(triton_pid, facade_pid, serve.pid, versioned=True, counts_all=True)
        say(
            f"serving: supervisor (tritonnx.commands.serve) pid {serve.pid}, tritonserver pid {triton_pid} "
            f"({serve.triton_grpc_url}), facade pid {facade_pid} ({serve.facade_url})"
        )
        streams = make_streams(args.models, REPOSITORY, serve.facade_url, serve.triton_grpc_url, args.deadline)
        asyncio.run(load_phases(args, streams, watcher, publisher, stop, rows, results, incidents))
    except (ServerError, VerificationError, OSError) as error:
        problem = f"{type(error).__name__}: {error}"
        say(f"error: {problem}")
    finally:
        say("stopping python -m tritonnx.commands.serve (the facade drains, then tritonserver stops) ...")
        results["serve_exit_code"] = serve.stop()
        results["publishes"] = [p.as_dict() for p in publisher.done]
    if watcher is not None:
        check_shutdown(watcher, results, incidents)
    if results["serve_exit_code"] not in (0, None):
        incidents.append(f"python -m tritonnx.commands.serve exited with code {results['serve_exit_code']}")
    shutil.rmtree(scratch, ignore_errors=True)  # the published copies (resnet50's are 100 MB each)
    gates = judge(rows, results, args, incidents) if rows else []
    if problem:
        gates.append(Gate("the stack started and was measured", False, problem))
    if stop.requested:
        gates.append(Gate("the run was not interrupted", False, "SIGINT/SIGTERM"))
    results["samples"] = rows
    text = write_outputs(out, results, rows, gates)
    say(f"report: {out / 'report.md'} ({len(text.splitlines())} lines)")
    code = verdict(gates)
    if stop.requested:
        return 130
    return 2 if problem else code


if __name__ == "__main__":
    sys.exit(main())
