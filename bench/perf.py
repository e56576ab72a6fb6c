"""perf_analyzer (from the tritonclient 2.51 wheel) against Triton over KServe v2 gRPC: one closed-loop point.

Bounded by perf_analyzer's measurement window and trial count; the figures come from its verbose CSV (client
latencies, server-side queue and compute times) and its report of inference and execution counts (the average batch
size Triton formed).
"""

from __future__ import annotations

import csv
import io
import re
import resource
import subprocess
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.output import flags

# Its perf_analyzer is the wrapper `make venv` installs (bench/perf_analyzer.sh), which finds the libcudart it links.
VENV_BIN = Path(sysconfig.get_paths()["scripts"])


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer failed or printed something this module cannot read."""


@dataclass(frozen=True)
class PerfPoint:
    model: str
    concurrency: int
    throughput: float  # inferences (images) per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    server_queue_ms: float
    server_compute_input_ms: float
    server_compute_infer_ms: float
    server_compute_output_ms: float
    inference_count: int
    execution_count: int
    client_cpu: float = 0.0  # perf_analyzer's own CPU seconds per wall second (1.0 = one core)

    def as_dict(self) -> dict:
        batch = self.inference_count / self.execution_count if self.execution_count else 0.0
        return {**asdict(self), "avg_batch": round(batch, 2)}


def run_perf_analyzer(
    model: str,
    url: str,
    concurrency: int,
    measurement_ms: int = 4000,
    headers: dict[str, str] | None = None,
) -> PerfPoint:
    """One perf_analyzer measurement: a closed loop of `concurrency` callers, one random image each.

    Inputs and outputs travel through system shared memory, as a local client of Triton can do: the client's copies
    then cost next to nothing on the server's cores. `headers` go with every call (Triton's restricted APIs need them).
    """
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "perf.csv"
        options = {
            "-m": model,
            "-i": "grpc",
            "-u": url,
            "-b": 1,
            "--concurrency-range": f"{concurrency}:{concurrency}",
            "--measurement-interval": measurement_ms,
            # Any 3 windows are stable: a busy machine's drift must not turn a point into 3 failed trials.
            "--max-trials": 3,
            "--stability-percentage": 100,
            "-f": report,
            "--shared-memory": "system",
            "--input-data": "random",
        }
        command = [str(VENV_BIN / "perf_analyzer"), "--verbose-csv", *flags(options)]
        command += [arg for name, value in (headers or {}).items() for arg in ("-H", f"{name}:{value}")]
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - started
        if done.returncode != 0 or not report.exists():
            raise PerfAnalyzerError(
                f"perf_analyzer: exit {done.returncode}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
            )
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return parse(model, report.read_text(), done.stdout, client_cpu=cpu / wall)


def parse(model: str, csv_text: str, stdout: str, client_cpu: float = 0.0) -> PerfPoint:
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    if not rows:
        raise PerfAnalyzerError("perf_analyzer wrote no measurement")
    counts = re.findall(r"Inference count: (\d+)\s+Execution count: (\d+)", stdout)
    if not counts:
        raise PerfAnalyzerError("perf_analyzer printed no server-side inference/execution counts")
    row = rows[-1]
    ms = {key: float(row[key]) / 1000.0 for key in row if "latency" in key or key.startswith("Server ")}  # from us
    return PerfPoint(
        model=model,
        concurrency=int(row["Concurrency"]),
        throughput=float(row["Inferences/Second"]),
        p50_ms=ms["p50 latency"],
        p95_ms=ms["p95 latency"],
        p99_ms=ms["p99 latency"],
        server_queue_ms=ms["Server Queue"],
        server_compute_input_ms=ms["Server Compute Input"],
        server_compute_infer_ms=ms["Server Compute Infer"],
        server_compute_output_ms=ms["Server Compute Output"],
        inference_count=int(counts[-1][0]),
        execution_count=int(counts[-1][1]),
        client_cpu=client_cpu,
    )
