"""python -m bench.soak: an hour at a steady share of capacity, every model through both paths (make soak).

docs/operations.md#overload-bursts-and-soak says what it loads, samples and judges. Exit code 0 when every gate
passed; 1 when one failed; 2 when the stack could not be started or measured; 130 when interrupted (the report is
written all the same).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil

from bench import REPOSITORY
from bench.load.targets import VerificationError
from bench.output import Gate, flags, machine, run_folder, say, settings, verdict
from bench.soak.judge import judge
from bench.soak.load import make_streams
from bench.soak.report import write_outputs
from bench.soak.run import Publisher, Soak, load_phases
from bench.usage import SHM_DIR, Watcher
from tritonnx.common.admin import ADMIN_KEY_ENV, new_admin_key
from tritonnx.common.paths import BUILD_ENV
from tritonnx.offline.demo_models import MODELS
from tritonnx.server.process import ManagedProcess, ServerError, StopRequest, free_ports
from tritonnx.server.repository import CONFIG_FILE, link_models

CHECKOUT = Path(__file__).resolve().parents[2]
READY_LINE = "Ctrl-C stops it."  # tritonnx.commands.serve's last line once the facade answered a real inference


class ServeProcess(ManagedProcess):
    """`python -m tritonnx.commands.serve` on free loopback ports, its logs and Triton's backend in the run's folder.

    Its process holds the supervisor, so its memory, fds and threads are the supervisor's, sampled apart from the load
    generator's; the admin key goes in its environment (the publishes need it).
    """

    def __init__(self, repository: Path, workdir: Path, timeout: float = 300.0) -> None:
        self.workdir, self.timeout = workdir, timeout
        self.log_file = workdir / "serve.log"
        self.admin_key = new_admin_key()
        http, grpc, metrics, supervisor, facade_grpc, facade_http = free_ports(6)
        self.triton_grpc_url, self.facade_url = f"127.0.0.1:{grpc}", f"127.0.0.1:{facade_grpc}"
        serve = {
            "--model-repository": repository,
            "--log-dir": workdir,
            "--http-port": http,
            "--grpc-port": grpc,
            "--metrics-port": metrics,
            "--supervisor-metrics-port": supervisor,
        }
        self._args = [*flags(serve), "--", *flags({"--port": facade_grpc, "--http-port": facade_http})]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, BUILD_ENV: str(self.workdir / "build"), ADMIN_KEY_ENV: self.admin_key}
        self.spawn([sys.executable, "-m", "tritonnx.commands.serve", *self._args], env=env, cwd=CHECKOUT)
        self.wait_until(lambda: READY_LINE in self.log_tail(5), "python -m tritonnx.commands.serve", self.timeout)

    def children(self) -> tuple[int, int]:
        """(tritonserver's pid, the facade's pid), the serve process's children."""
        triton = facade = None
        for child in psutil.Process(self.pid).children():
            command = " ".join(child.cmdline())
            if child.name() == "tritonserver" or "/tritonserver " in command:
                triton = child.pid
            elif "tritonnx.client.facade" in command:
                facade = child.pid
        if triton is None or facade is None:
            raise ServerError(f"tritonserver or the facade is not a child of tritonnx.commands.serve (pid {self.pid})")
        return triton, facade


def check_shutdown(watcher: Watcher, results: dict, incidents: list[str]) -> None:
    """After the stop: no process of ours alive, no /dev/shm region of theirs left, no stub restarted."""
    deadline = time.monotonic() + 10  # our processes are gone within it, or the check says so
    while watcher.alive_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    if lingering := watcher.alive_pids():
        incidents.append(f"processes still alive after the stop: {lingering}")
    leftover = sorted(name for name in watcher.shm_names if (SHM_DIR / name).exists())
    results.update(shm_files_seen=sorted(watcher.shm_names), leftover_shm=leftover, stub_pids=watcher.stub_pids)
    if leftover:
        incidents.append(f"{len(leftover)} /dev/shm region(s) left after the stop: {', '.join(leftover)}")
    if restarted := {name: pids for name, pids in watcher.stub_pids.items() if len(pids) > 1}:
        incidents.append("stubs restarted: " + ", ".join(f"{n} {p}" for n, p in sorted(restarted.items())))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Soak: every model through the facade and Triton direct at --load-fraction of the measured "
        "capacity, a version published every --publish-every seconds, every process sampled every --interval "
        "seconds; growth after the warm-up, flat counts, right answers and failures judged.",
        epilog="Writes report.md (with its Gates), results.json and samples.csv. Exit code: 0 every gate passed; "
        "1 a gate failed; 2 the stack could not start or be measured; 130 interrupted. A quick check: "
        "python -m bench.soak --duration 60 --interval 5 --publish-every 30",
    )
    add = parser.add_argument
    add("--duration", type=float, default=3600.0, help="seconds of paced load; default: %(default)s")
    add("--interval", type=float, default=10.0, help="seconds between samples; default: %(default)s")
    add("--models", nargs="+", default=list(MODELS), help="each loaded through both paths; default: %(default)s")
    add("--load-fraction", type=float, default=0.7, help="of the machine's capacity, offered; default: %(default)s")
    add("--capacity-concurrency", type=int, default=16, help="of each capacity run; default: %(default)s")
    add("--capacity-seconds", type=float, default=10.0, help="of each capacity run; default: %(default)s")
    add("--publish-every", type=float, default=600.0, help="seconds between version publishes; default: %(default)s")
    add("--publish-models", nargs="+", help="the publish rotation; default: --models")
    add("--warmup", type=float, help="seconds of each process's samples not judged; default: min(600, --duration / 3)")
    add("--max-growth-mib-per-10min", type=float, default=1.0, help="the memory gate; default: %(default)s")
    add("--max-count-rise", type=float, default=2.0, help="the gate of fds, threads, regions; default: %(default)s")
    add("--out", type=Path, help="default: bench/results/<UTC timestamp>-soak/")
    args = parser.parse_args(argv)
    args.warmup = min(600.0, args.duration / 3) if args.warmup is None else args.warmup
    args.publish_models = args.publish_models or list(args.models)
    if not (0 < args.interval <= args.duration and 0 < args.load_fraction <= 1.5 and 0 <= args.warmup < args.duration):
        parser.error("--interval must be in (0, --duration], --load-fraction in (0, 1.5], --warmup below --duration")
    for model in {*args.models, *args.publish_models}:
        if not (REPOSITORY / model / "1" / "model.onnx").exists():
            parser.error(f"{REPOSITORY / model / '1' / 'model.onnx'} is missing: run `make models`")
    if set(args.publish_models) - set(args.models):
        parser.error("--publish-models must be among --models (the answers across a swap are checked by the load)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started, out = run_folder(args.out, "soak")
    command = " ".join(["python -m bench.soak", *(sys.argv[1:] if argv is None else argv)])
    results: dict = {
        "started": started,
        "command": command,
        "machine": machine(),
        "settings": settings(args),
        "publishes_due": math.ceil(args.duration / args.publish_every) - 1,
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
    serve = ServeProcess(scratch, out / "logs")  # the facade with make serve's defaults (its probe: resnet50)
    publisher = Publisher(scratch, REPOSITORY, args.publish_models, serve.triton_grpc_url, serve.admin_key)
    say(f"starting python -m tritonnx.commands.serve ({', '.join(sorted(served))}); logs in {out / 'logs'}")
    try:
        serve.start()
        triton_pid, facade_pid = serve.children()
        watcher = Watcher(triton_pid, facade_pid, serve.pid)
        say(f"serving: supervisor pid {serve.pid}, tritonserver pid {triton_pid}, facade pid {facade_pid}")
        streams = make_streams(args.models, REPOSITORY, serve.facade_url, serve.triton_grpc_url)
        asyncio.run(load_phases(Soak(args, streams, watcher, publisher, stop, rows, results, incidents)))
    except (ServerError, VerificationError, OSError) as error:
        problem = f"{type(error).__name__}: {error}"
        say(f"error: {problem}")
    finally:
        say("stopping python -m tritonnx.commands.serve (the facade drains, then tritonserver stops) ...")
        results["serve_exit_code"] = serve.stop()
        results["publishes"] = [asdict(p) for p in publisher.done]
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
    text = write_outputs(out, results, rows, gates)
    say(f"report: {out / 'report.md'} ({len(text.splitlines())} lines)")
    code = verdict(gates)
    return 130 if stop.requested else 2 if problem else code


if __name__ == "__main__":
    sys.exit(main())
