"""python -m bench.studies.images: size, start-up and idle memory of the images, beside seed 003's table.

tritonnx:demo and tritonnx:ngc serving every demo model they carry, and tritonnx:cpu (no models of its own) serving
one model mounted from the checkout's repository, as a deployment of it does. For each: its size; `docker run` to
READY in a new container, whose optimized-model cache is empty, and again in one that reuses the first's cache through
a named volume; and the idle PSS of the container's processes. Gates: tritonnx:cpu under 400 MB, and one model READY
within 3 s of `docker run` on its first start. The images come from `make images`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from bench import REPOSITORY
from bench.output import Gate, finish, gates_section, head, run_folder, say
from tritonnx.server.process import free_ports

IMAGES = ("tritonnx:demo", "tritonnx:ngc")  # each serving every model it carries
SLIM = "tritonnx:cpu"  # no models of its own: serving one, mounted
SIZE_GOAL_MB = 400
ONE_MODEL_READY_GOAL_S = 3.0
# Seed 003's deployment table: image size and application start time of the servers it compares.
SEED_003 = {"torch-serving": (650, 4.342), "onnx-serving": (296, 1.396), "rust-onnx-serving": (48.3, 0.348)}
NGC_LISTED_GB = 15  # nvcr.io/nvidia/tritonserver:24.10-py3, as NVIDIA lists it (not pullable here)
# The container's PSS, summed over its processes, read from inside it (psutil is in the image).
_PSS = (
    "import psutil; print(sum(p.memory_full_info().pss for p in psutil.process_iter() "
    "if p.pid != psutil.Process().pid) / 2**20)"
)


def docker(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} ...: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def run_to_ready(
    image: str, cache_volume: str, models: str = "*", repository: Path | None = None, timeout: float = 120
) -> tuple[float, float]:
    """Seconds from `docker run` to READY serving `models` ("*": all) of /models, and its idle PSS in MiB."""
    http, grpc, metrics, supervisor = free_ports(4)
    name = f"tritonnx-startup-{http}"
    env = {
        "TRITONNX_ADMIN_KEY": "startup-measurement",
        "TRITONNX_TRITON_HOST": "127.0.0.1",
        "TRITONNX_TRITON_HTTP_PORT": str(http),
        "TRITONNX_TRITON_GRPC_PORT": str(grpc),
        "TRITONNX_TRITON_METRICS_PORT": str(metrics),
        "TRITONNX_SUPERVISOR_METRICS_PORT": str(supervisor),
        "TRITONNX_TRITON_LOAD_MODELS": models,
    }
    started = time.perf_counter()
    volumes = [f"{cache_volume}:/tmp/tritonnx/ort-cache"]
    if repository:
        volumes.append(f"{repository.resolve()}:/models:ro")  # docker takes absolute paths only
    options = [f"--name={name}", "--network=host", "--shm-size=512m", *(f"--volume={v}" for v in volumes)]
    docker("run", "-d", *options, *(f"--env={k}={v}" for k, v in env.items()), image)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{image} not ready after {timeout:.0f} s:\n{docker('logs', name)[-2000:]}")
            time.sleep(0.02)
        ready = time.perf_counter() - started
        time.sleep(2)  # the stubs settle after their warm-up
        return ready, float(docker("exec", name, "python3", "-c", _PSS))
    finally:
        docker("rm", "-f", name)


def mounted(model: str, folder: Path) -> Path:
    """A repository of the checkout's `model` in `folder`, readable by the containers' user (uid 1000)."""
    shutil.copytree(REPOSITORY / model, folder / model, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def measure(image: str, runs: int, models: str = "*", repository: Path | None = None) -> dict:
    """Size; first start (empty cache) and `runs` warm starts (the cache volume kept) to READY."""
    volume = f"tritonnx-ort-cache-{free_ports(1)[0]}"
    docker("volume", "create", volume)
    try:
        first, memory = run_to_ready(image, volume, models, repository)
        warm = [run_to_ready(image, volume, models, repository)[0] for _ in range(runs)]
    finally:
        docker("volume", "rm", "-f", volume)
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6
    return {
        "image": image,
        "models": models,
        "size_mb": round(size, 1),
        "ready_first_s": round(first, 2),
        "ready_warm_s": [round(s, 2) for s in warm],
        "idle_pss_mib": round(memory, 1),
    }


def report(results: list[dict], judged: list[Gate]) -> str:
    lines = [
        f"# Images: size, docker run to READY, idle memory ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
        "",
        "Start-up is `docker run` until Triton's HTTP readiness (every model it serves loaded), on this machine. "
        "First: a new container, its optimized-model cache empty. Warm: a new container reusing that cache "
        "through a named volume. Memory: the container's processes' PSS, idle after start-up.",
        "",
        *head("image | serving | size (MB) | first start (s) | warm start (s) | idle PSS (MiB)"),
    ]
    for r in results:
        warm = ", ".join(f"{s:.2f}" for s in r["ready_warm_s"])
        serving = "every demo model it carries" if r["models"] == "*" else f"{r['models']}, mounted"
        figures = f"{r['size_mb']:.0f} | {r['ready_first_s']:.2f} | {warm} | {r['idle_pss_mib']:.0f}"
        lines.append(f"| `{r['image']}` | {serving} | {figures} |")
    lines += [
        f"| `nvcr.io/nvidia/tritonserver:24.10-py3` (NVIDIA's listing) | | about {NGC_LISTED_GB} GB | | | |",
        "",
        "Seed 003's deployment table (one MobileNetV3-Small, Apple M2 Max, 4 cores per container):",
        "",
        *head("server | image size (MB) | application start (s)"),
        *(f"| {name} | {size} | {start} |" for name, (size, start) in SEED_003.items()),
        "",
    ]
    return "\n".join(lines) + "\n" + gates_section(judged)


def gates(results: list[dict]) -> list[Gate]:
    """The slim image's size and one model's start-up against their goals; missing rows fail their gate."""
    slim = [r for r in results if r["image"] == SLIM]
    size = slim[0]["size_mb"] if slim else None
    first = slim[0]["ready_first_s"] if slim else None
    warm = statistics.median(slim[0]["ready_warm_s"]) if slim and slim[0]["ready_warm_s"] else None
    return [
        Gate(f"{SLIM} under {SIZE_GOAL_MB} MB", size is not None and size < SIZE_GOAL_MB, f"{size} MB"),
        Gate(
            f"{SLIM} serving one model READY within {ONE_MODEL_READY_GOAL_S:g} s of docker run (first start)",
            first is not None and first <= ONE_MODEL_READY_GOAL_S,
            f"first {first} s, warm median {warm} s",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.images",
        description="Measure the images of `make images`: size, docker run to READY (first and warm) and idle memory.",
    )
    add = parser.add_argument
    add("--images", nargs="+", default=list(IMAGES), help="serving every model they carry; default: %(default)s")
    add("--warm-runs", type=int, default=3, help="warm starts per image; default: %(default)s")
    add("--one-model", default="mobilenet_v3_small", help=f"also {SLIM} serving only this model, mounted ('' to skip)")
    add("--out", type=Path, help="default: bench/results/<UTC time>-images")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "images")
    results = []
    runs: list[tuple[str, str, Path | None]] = [(image, "*", None) for image in args.images]
    if args.one_model:
        runs.append((SLIM, args.one_model, mounted(args.one_model, out / "repository")))
    for image, models, repository in runs:
        say(f"{image} serving {models}: size, first start, {args.warm_runs} warm start(s) ...")
        results.append(measure(image, args.warm_runs, models, repository))
        r = results[-1]
        say(
            f"  {r['size_mb']:.0f} MB, READY after {r['ready_first_s']:.2f} s first, {r['ready_warm_s']} warm, "
            f"idle PSS {r['idle_pss_mib']:.0f} MiB"
        )
    shutil.rmtree(out / "repository", ignore_errors=True)  # the mounted copy
    judged = gates(results)
    return finish(out, report(results, judged), judged, {"results": results})


if __name__ == "__main__":
    sys.exit(main())
