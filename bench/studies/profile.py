"""python -m bench.studies.profile: where a served request's CPU goes, by process and by the code it runs.

Each model is served alone (tritonserver, its Python stubs, the facade) under a closed loop through the facade. While
the loop runs, py-spy samples the facade's and each stub's Python and native frames, and perf samples tritonserver's
native ones. Per process: its CPU ms per request, and its busy samples by where the sampled code lives: the Python
package of a Python frame, the library of a native one (the nearest frame to the leaf that is neither the interpreter
nor libc), with the leading functions. Samples whose leaf waits (epoll, futex, ...) are counted apart.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

from bench import REPOSITORY
from bench.load import loops
from bench.load.targets import FacadeTarget
from bench.output import head, machine, run_folder, say, settings, write_json
from bench.peers.servers import sample_images, sample_sequences
from bench.usage import cpu_seconds
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack
from tritonnx.server.stubs import live_stubs

RATE_HZ = 199  # samples a second: not a multiple of a timer's period
WARMUP_S = 2.0
PY_SPY = Path(sys.executable).parent / "py-spy"  # requirements-dev.txt installs it beside this interpreter
WAITING = re.compile(
    r"^(epoll_wait|epoll_pwait|__futex|futex|poll|ppoll|select|pselect|nanosleep|clock_nanosleep|sem_)"
)
GENERIC = re.compile(r"^(libc|libpython|python3|libstdc\+\+|libpthread|ld-linux|libm|\[kernel|\[unknown|\[vdso)")
# The checkout's folders that install into the tritonnx namespace (pyproject.toml's package-dir): py-spy names
# their frames by the checkout's paths.
NAMESPACE_FOLDERS = {"backend": "tritonnx", "client": "tritonnx"}
FRAME = re.compile(r"^(?P<function>.*?) \((?P<where>[^()]*?)(?::\d+)?\)$")


def owner(frame: str) -> str | None:
    """The package (Python frame) or library (native frame) of `frame`; None for the interpreter, libc and C sources."""
    match = FRAME.match(frame)
    where = re.sub(r"^/.*/(site-packages|python3\.\d+)/", "", match["where"]) if match else ""
    if where.endswith(".py"):
        top = where.split("/")[0].removesuffix(".py")
        return NAMESPACE_FOLDERS.get(top, top)
    if ".so" in where or where.startswith("["):
        name = re.sub(r"(\.cpython[^.]*|\.abi3)?\.so.*$", "", where.rsplit("/", 1)[-1])
        return None if GENERIC.match(name) else name
    return None  # a native frame of a C source (uvloop's, CPython's headers): look further from the leaf


def profile_of(stacks: Counter[tuple[str, ...]]) -> dict:
    """Busy samples by owner and by leading function; waiting samples apart. Stacks run from the root to the leaf."""
    owners: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    waiting = 0
    for frames, count in stacks.items():
        leaf = FRAME.match(frames[-1])
        if WAITING.match(leaf["function"] if leaf else frames[-1]):
            waiting += count
            continue
        found = next(
            ((o, f) for f in reversed(frames) if (o := owner(f)) is not None), ("interpreter/libc", frames[-1])
        )
        owners[found[0]] += count
        functions[FRAME.sub(r"\g<function> (\g<where>)", found[1])] += count
    return {"waiting": waiting, "busy": sum(owners.values()), "owners": owners, "functions": functions}


def py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    command = [
        str(PY_SPY),
        "record",
        "--native",
        "-r",
        str(RATE_HZ),
        "-d",
        str(int(seconds)),
        "-p",
        str(pid),
        "-f",
        "raw",
    ]
    return subprocess.Popen([*command, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def py_spy_stacks(out: Path) -> Counter[tuple[str, ...]]:
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = tuple(stack.split(";")[1:])  # the first frame names the thread
        if frames:
            stacks[frames] += int(count)
    return stacks


def perf(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    command = ["perf", "record", "-F", str(RATE_HZ), "-g", "-p", str(pid), "-o", str(out), "--", "sleep", str(seconds)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_stacks(out: Path) -> Counter[tuple[str, ...]]:
    """The samples `perf script` prints, as stacks of "symbol (library)" frames, root first."""
    text = subprocess.run(["perf", "script", "-i", str(out), "-F", "ip,sym,dso"], capture_output=True, text=True).stdout
    stacks: Counter[tuple[str, ...]] = Counter()
    for block in text.split("\n\n"):
        frames = [line.split(None, 1)[1] for line in block.strip().splitlines() if len(line.split(None, 1)) == 2]
        if frames:
            stacks[tuple(reversed(frames))] += 1
    return stacks


def profile_model(model: str, args: argparse.Namespace, out: Path) -> dict:
    """The model served alone, loaded through the facade while each process is sampled."""
    facade_args = ["--default-model", model, "--health-interval", "30", "--max-in-flight", "1024"]
    with (
        tempfile.TemporaryDirectory(prefix="tritonnx-profile-") as folder,
        ServingStack(
            link_models(Path(folder), {model: REPOSITORY / model}), out / model, facade_args=facade_args
        ) as stack,
    ):
        assert stack.facade is not None
        processes = {"facade": stack.facade.pid, "tritonserver": stack.triton.pid}
        processes |= {f"stub {stub.instance}": pid for pid, stub in live_stubs(stack.triton.pid).items()}
        samples = sample_sequences(10) if "text" in model else sample_images()  # the benchmarks' requests
        target = FacadeTarget(stack.facade.grpc_url, model, 1, images=samples)
        result: list[loops.LoadResult] = []
        load = threading.Thread(
            target=lambda: result.append(loops.run(target, args.concurrency, args.seconds, WARMUP_S))
        )
        load.start()
        time.sleep(WARMUP_S)  # the profilers sample the load's measured window, not its warm-up
        before = {name: cpu_seconds(psutil.Process(pid)) for name, pid in processes.items()}
        started = {
            name: (perf if name == "tritonserver" else py_spy)(pid, args.seconds, out / model / f"{name}.samples")
            for name, pid in processes.items()
        }
        for sampler in started.values():
            sampler.wait()
        used = {name: cpu_seconds(psutil.Process(pid)) - before[name] for name, pid in processes.items()}
        load.join()
    requests = result[0].requests
    record: dict = {"requests": requests, "throughput_rps": result[0].throughput_rps, "processes": {}}
    for name in processes:
        file = out / model / f"{name}.samples"
        stacks = (perf_stacks if name == "tritonserver" else py_spy_stacks)(file) if file.exists() else Counter()
        cpu_ms = 1000 * used[name] / requests if requests else 0.0
        record["processes"][name] = {"cpu_ms_per_request": cpu_ms, **profile_of(stacks)}
        say(f"  {name}: {cpu_ms:.3f} CPU ms per request, {sum(stacks.values())} samples")
    return record


def report(results: dict, top: int) -> str:
    lines = [
        f"# Where a served request's CPU goes ({results['started']})",
        "",
        f"Machine: {results['machine']}. Each model served alone, a closed loop of {results['settings']['concurrency']} "
        f"callers through the facade for {results['settings']['seconds']} s, sampled at {RATE_HZ} Hz: py-spy (Python "
        "and native frames) in the facade and the stubs, perf in tritonserver. Busy samples are attributed to the "
        "nearest frame to the leaf that is a Python package or a library other than the interpreter and libc.",
    ]
    for model, record in results["models"].items():
        lines += ["", f"## {model}: {record['throughput_rps']:.1f} req/s", ""]
        lines += head("process | CPU ms per request | busy samples | waiting | where the busy samples were")
        for name, p in record["processes"].items():
            busy = p["busy"] or 1
            shares = ", ".join(f"{owner} {count / busy:.0%}" for owner, count in p["owners"].most_common(top))
            lines.append(f"| {name} | {p['cpu_ms_per_request']:.3f} | {p['busy']} | {p['waiting']} | {shares} |")
        for name, p in record["processes"].items():
            busy = p["busy"] or 1
            lines += ["", f"{name}, leading functions:", ""]
            lines += [f"- {count / busy:.1%} {function}" for function, count in p["functions"].most_common(top)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.profile",
        description="Sample every process of the serving path under load (py-spy, perf) and report where the CPU goes.",
        epilog="Example: python -m bench.studies.profile --models mobilenet_v3_small resnet50 text_classifier",
    )
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_small", "resnet50", "text_classifier"])
    parser.add_argument("--concurrency", type=int, default=16, help="default: %(default)s")
    parser.add_argument("--seconds", type=float, default=10.0, help="sampled per model; default: %(default)s")
    parser.add_argument("--top", type=int, default=8, help="owners and functions listed; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-profile")
    args = parser.parse_args(argv)
    missing = [tool for tool in (str(PY_SPY), "perf") if shutil.which(tool) is None]
    if missing:
        parser.exit(2, f"error: {' and '.join(missing)} not found (py-spy: make venv; perf: Debian's linux-perf)\n")
    started, out = run_folder(args.out, "profile")
    results: dict = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    for model in args.models:
        say(f"{model}: serving and sampling ...")
        results["models"][model] = profile_model(model, args, out)
    write_json(out / "results.json", results)
    (out / "report.md").write_text(report(results, args.top))
    say(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
