"""Where the CPU goes: CPU seconds per image of each process on the serving path.

On a machine whose cores the server saturates, throughput is the number of cores divided by the CPU all processes
spend per image. Splitting that cost by process (ONNX Runtime in the Python stubs, tritonserver itself, the facade,
the load generator) and comparing the stubs' share with in-process ONNX Runtime shows what each layer costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

import psutil
import tritonclient.grpc as grpcclient

from bench.perf import PerfPoint, run_perf_analyzer
from bench.usage import cpu_seconds
from tritonnx.server.supervisor import live_stubs
from tritonnx.server.triton import TritonServer

T = TypeVar("T")
# The roles a process on the serving path plays, in the order a report lists them.
ROLES = ("stubs", "tritonserver", "facade", "client", "idle")


@dataclass(frozen=True)
class CpuSnapshot:
    at: float  # time.perf_counter()
    seconds: dict[str, float]  # role -> CPU seconds used so far
    per_stub: dict[int, float]  # stub pid -> CPU seconds (stubs restart; only pids seen twice count)


def snapshot(triton_pid: int, others: dict[str, int] | None = None, own_role: str | None = None) -> CpuSnapshot:
    """CPU used so far by tritonserver, its stubs, the `others` (role -> pid) and this process (as `own_role`)."""
    seconds = {"tritonserver": cpu_seconds(psutil.Process(triton_pid))}
    per_stub = {}
    for pid in live_stubs(triton_pid):
        with suppress(psutil.Error):  # a stub that just exited
            per_stub[pid] = cpu_seconds(psutil.Process(pid))
    for role, pid in (others or {}).items():
        seconds[role] = cpu_seconds(psutil.Process(pid))
    if own_role:
        seconds[own_role] = time.process_time()
    return CpuSnapshot(time.perf_counter(), seconds, per_stub)


def per_image(
    before: CpuSnapshot, after: CpuSnapshot, images: int, cores: int, extra: dict[str, float] | None = None
) -> dict:
    """CPU ms per image by role between two snapshots (`idle`: the cores' unused time; `extra`: seconds of others)."""
    if images <= 0:
        return {}
    wall = after.at - before.at
    used = {role: after.seconds[role] - before.seconds.get(role, 0.0) for role in after.seconds}
    used["stubs"] = sum(after.per_stub[pid] - before.per_stub[pid] for pid in after.per_stub if pid in before.per_stub)
    for role, value in (extra or {}).items():
        used[role] = used.get(role, 0.0) + value
    used["idle"] = max(0.0, cores * wall - sum(used.values()))
    result = {role: round(1000 * used[role] / images, 3) for role in ROLES if role in used}
    result["total"] = round(sum(v for k, v in result.items() if k != "idle"), 3)
    return {**result, "seconds": round(wall, 2), "images": images}


def measured(
    run: Callable[[], T],
    triton_pid: int,
    images_served: Callable[[], int],
    cores: int,
    others: dict[str, int] | None = None,
    own_role: str | None = None,
    extra_cpu: Callable[[T, float], dict[str, float]] | None = None,
) -> tuple[T, dict]:
    """`run()`'s result and the CPU per image while it ran (`extra_cpu`: seconds of processes that ended)."""
    images_before, before = images_served(), snapshot(triton_pid, others, own_role)
    result = run()
    after, images_after = snapshot(triton_pid, others, own_role), images_served()
    extra = extra_cpu(result, after.at - before.at) if extra_cpu else None
    return result, per_image(before, after, images_after - images_before, cores, extra)


def images_inferred(server: TritonServer, model: str) -> Callable[[], int]:
    """A reader of Triton's own count of the images `model` inferred: the denominator of `measured`."""

    def count() -> int:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            stats = client.get_inference_statistics(model, headers=server.admin_headers, as_json=True)
        return sum(int(s.get("inference_count", 0)) for s in stats.get("model_stats", []))

    return count


def perf_analyzer_with_cpu(server: TritonServer, model: str, concurrency: int, measurement_ms: int, cores: int) -> dict:
    """One perf_analyzer point with the CPU per image while it ran (perf_analyzer's own from its rusage)."""

    def run() -> PerfPoint:
        return run_perf_analyzer(model, server.grpc_url, concurrency, measurement_ms, headers=server.admin_headers)

    point, cpu = measured(
        run,
        server.pid,
        images_inferred(server, model),
        cores,
        extra_cpu=lambda point, wall: {"client": point.client_cpu * wall},
    )
    return {**point.as_dict(), "cpu_ms_per_image": cpu}
