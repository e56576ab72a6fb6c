"""python -m bench.studies.images: size, start-up and idle memory of the images.

tritonnx:demo and tritonnx:ngc serving every demo model they carry, and tritonnx:cpu (no models of its own) serving
one model mounted from the checkout's repository, as a deployment of it does. For each: its size; `docker run` to
READY in a new container, whose optimized-model cache is empty; and the idle PSS of the container's processes. Gates:
tritonnx:cpu under 400 MB, and one model READY within 3 s of `docker run`. The images come from `make images`.
"""

from __future__ import annotations

import argparse
import shutil
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
ONE_MODEL = "mobilenet_v3_small"
SIZE_GOAL_MB = 400
ONE_MODEL_READY_GOAL_S = 3.0
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
    image: str, models: str = "*", repository: Path | None = None, timeout: float = 120
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
    options = [f"--name={name}", "--network=host", "--shm-size=512m"]
    if repository:
        options.append(f"--volume={repository.resolve()}:/models:ro")  # docker takes absolute paths only
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


def measure(image: str, models: str = "*", repository: Path | None = None) -> dict:
    """Size; `docker run` to READY in a new container (its optimized-model cache empty) and the idle PSS."""
    ready, memory = run_to_ready(image, models, repository)
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6
    return {
        "image": image,
        "models": models,
        "size_mb": round(size, 1),
        "ready_s": round(ready, 2),
        "idle_pss_mib": round(memory, 1),
    }


def report(results: list[dict], judged: list[Gate]) -> str:
    lines = [
        f"# Images: size, docker run to READY, idle memory ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
        "",
        "Start-up is `docker run` until Triton's HTTP readiness (every model it serves loaded), on this machine, in a "
        "new container: its optimized-model cache empty. Memory: the container's processes' PSS, idle after start-up.",
        "",
        *head("image | serving | size (MB) | start (s) | idle PSS (MiB)"),
    ]
    for r in results:
        serving = "every demo model it carries" if r["models"] == "*" else f"{r['models']}, mounted"
        figures = f"{r['size_mb']:.0f} | {r['ready_s']:.2f} | {r['idle_pss_mib']:.0f}"
        lines.append(f"| `{r['image']}` | {serving} | {figures} |")
    return "\n".join(lines) + "\n\n" + gates_section(judged)


def gates(results: list[dict]) -> list[Gate]:
    """The slim image's size and one model's start-up against their goals; missing rows fail their gate."""
    slim = [r for r in results if r["image"] == SLIM]
    size = slim[0]["size_mb"] if slim else None
    ready = slim[0]["ready_s"] if slim else None
    return [
        Gate(f"{SLIM} under {SIZE_GOAL_MB} MB", size is not None and size < SIZE_GOAL_MB, f"{size} MB"),
        Gate(
            f"{SLIM} serving one model READY within {ONE_MODEL_READY_GOAL_S:g} s of docker run",
            ready is not None and ready <= ONE_MODEL_READY_GOAL_S,
            f"{ready} s",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.images",
        description="Measure the images of `make images`: size, docker run to READY and idle memory.",
    )
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-images")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "images")
    runs: list[tuple[str, str, Path | None]] = [(image, "*", None) for image in IMAGES]
    runs.append((SLIM, ONE_MODEL, mounted(ONE_MODEL, out / "repository")))
    results = []
    for image, models, repository in runs:
        say(f"{image} serving {models}: size, start-up, idle memory ...")
        results.append(measure(image, models, repository))
        r = results[-1]
        say(f"  {r['size_mb']:.0f} MB, READY after {r['ready_s']:.2f} s, idle PSS {r['idle_pss_mib']:.0f} MiB")
    shutil.rmtree(out / "repository", ignore_errors=True)  # the mounted copy
    judged = gates(results)
    return finish(out, report(results, judged), judged, {"results": results})


if __name__ == "__main__":
    sys.exit(main())
