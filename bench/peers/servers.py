"""Every server the benchmarks measure, started the same way, checked and driven by the same load engine.

Before any figure of a server is kept, a few requests go through it, each answer compared with what the same
model.onnx gives in this process; the targets that carry them keep comparing every answer under load.
"""

from __future__ import annotations

import re
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.baseline.server import FastApiBaseline
from bench.baseline.workers import Setup, measured_split
from bench.load import loops
from bench.load.http import HttpTarget
from bench.load.targets import IMAGE_SHAPE, FacadeTarget, KServeTarget, Request, Target, VerificationError
from bench.output import say
from bench.peers import venvs
from bench.usage import tree_memory
from tritonnx.server.process import ManagedProcess, ServerError, free_ports
from tritonnx.server.repository import CONFIG_FILE, link_models, read_config
from tritonnx.server.stack import ServingStack

READY_TIMEOUT_S = 240.0  # Ray takes tens of seconds to start on 2 busy cores
SEQUENCE_LENGTHS = (8, 16, 32, 64, 128)  # the text models take up to 128 positions


def sample_images(count: int = 4, seed: int = 1) -> list[np.ndarray]:
    """`count` single-image batches [1, 3, 224, 224] of float32 noise."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, *IMAGE_SHAPE), dtype=np.float32) for _ in range(count)]


def sample_sequences(count: int = 4, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """`count` text requests of mixed lengths: a server may batch them, each answer must still be its own."""
    rng = np.random.default_rng(seed)
    return [
        {"input_ids": rng.integers(1, 1000, size=(1, length)), "attention_mask": np.ones((1, length), np.int64)}
        for length in (SEQUENCE_LENGTHS[index % len(SEQUENCE_LENGTHS)] for index in range(count))
    ]


def reference_outputs(onnx_file: Path, requests: Sequence[Request]) -> list[np.ndarray]:
    """The first output of each request (an image batch, or arrays by input name), flat, from ONNX Runtime here."""
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return [session.run(None, r if isinstance(r, dict) else {name: r})[0].ravel() for r in requests]


def check_answers(target: Target, samples: int) -> None:
    """Send each of a checking target's `samples` requests once; VerificationError unless all are right."""
    result = loops.run(target, 1, duration_s=60.0, warmup_s=0.0, max_requests=samples)
    if result.errors or result.requests != samples or target.wrong:
        raise VerificationError(
            f"{target.name}: {result.requests} of {samples} answers came back, {target.wrong} of them unlike "
            f"in-process ONNX Runtime; errors {result.errors or 'none'}"
        )


@dataclass(frozen=True)
class Policy:
    """How the servers batch and run workers: the model's config.pbtxt (PyTriton too), else a core each, as advised."""

    max_batch_size: int
    triton_instances: int
    triton_delay_ms: float
    workers: int
    triton_threads: int = 1  # intra-op threads per instance

    @classmethod
    def of(cls, model_dir: Path, cores: int) -> Policy:
        config = read_config(model_dir)
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        delay_us = int(config.get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0))
        threads = int(config.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value", "1"))
        return cls(int(config.get("max_batch_size", 1)) or 1, instances, delay_us / 1000, cores, threads)


class Server(ABC):
    """One server under test: `start` it, ask it for load `target`s, `stop` it."""

    name: str
    description: str  # its configuration and payload, for the report
    process: ManagedProcess | None = None  # the one whose tree holds the whole server, once started

    @abstractmethod
    def start(self) -> None: ...

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=30)
        self.process = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "start() first"
        return self.process.pid

    @property
    def pids(self) -> list[int]:
        """The processes whose trees make the server (for its CPU): `pid`'s, unless a process runs beside it."""
        return [self.pid]

    @abstractmethod
    def target(self, images: Sequence[Request] | None = None, expected: Sequence[np.ndarray] | None = None) -> Target:
        """A load target; with `images` (requests) and `expected`, one that checks every answer."""


@dataclass(frozen=True)
class LatencyBound:
    """A policy for a latency objective: wait at most half of it, run batches that fit the rest (docs/benchmarks.md)."""

    queue_timeout_ms: float
    max_batch_size: int

    @classmethod
    def for_objective(cls, objective_ms: float, single_ms: float, max_batch_size: int) -> LatencyBound:
        half = objective_ms / 2
        return cls(half, max(1, min(max_batch_size, int(half // single_ms))))

    def describe(self) -> str:
        return f"queue timeout {self.queue_timeout_ms:.0f} ms, batches <= {self.max_batch_size}"

    def apply(self, config: str) -> str:
        """The config with the bound's queue timeout (its queue policy's, or a policy added) and batch size."""
        timeout = f"default_timeout_microseconds: {round(self.queue_timeout_ms * 1000)}"
        config, timeouts = re.subn(r"default_timeout_microseconds:\s*\d+", timeout, config)
        if not timeouts:
            policy = f"  default_queue_policy {{ timeout_action: REJECT {timeout} allow_timeout_override: true }}\n"
            config, timeouts = re.subn(r"(?m)^dynamic_batching \{\n", lambda m: m[0] + policy, config, count=1)
        config, batches = re.subn(r"(?m)^max_batch_size:\s*\d+", f"max_batch_size: {self.max_batch_size}", config)
        if not timeouts or batches != 1:
            raise ServerError("the model's config.pbtxt has no dynamic batcher or no max_batch_size to rewrite")
        return config


@dataclass(frozen=True)
class Layout:
    """A model's instances and intra-op threads per instance, written over its config's (`make tune`'s candidates)."""

    instances: int
    threads: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        """`2x1`: two instances of one intra-op thread each."""
        match = re.fullmatch(r"([1-9]\d*)x([1-9]\d*)", text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not INSTANCESxTHREADS, e.g. 1x1")
        return cls(int(match[1]), int(match[2]))

    def describe(self) -> str:
        instances, threads = ("s" if n > 1 else "" for n in (self.instances, self.threads))
        return f"{self.instances} instance{instances} x {self.threads} intra-op thread{threads}"

    def apply(self, config: str) -> str:
        """The config with this layout's instance count and intra-op threads."""
        fields = (
            (r"(instance_group\s*\[\s*\{[^}]*count:\s*)\d+", self.instances),
            (r'(key:\s*"intra_op_thread_count"\s*value:\s*\{\s*string_value:\s*")\d+', self.threads),
        )
        for pattern, value in fields:
            config, count = re.subn(pattern, rf"\g<1>{value}", config, count=1)
            if count != 1:
                raise ValueError(f"config.pbtxt has no field matching {pattern!r}")
        return config


@dataclass(eq=False)
class Tritonnx(Server):
    """tritonnx: Triton direct (KServe v2 gRPC) or through the facade (`facade=True`)."""

    repository: Path
    model: str
    workdir: Path
    facade: bool = False
    bound: LatencyBound | None = None  # the model's policy rewritten for a latency objective
    layout: Layout | None = None  # the model's instances and threads rewritten (a path tuned on its own)
    _stack: ServingStack | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = "tritonnx facade" if self.facade else "tritonnx, Triton direct"
        self.description = (
            "the facade's Predict (gRPC, raw_data) in front of Triton"
            if self.facade
            else "Triton 2.51 + the project's Python backend, the model's config.pbtxt; KServe v2 gRPC, raw tensors"
        )
        if self.bound is not None:
            self.name += f", {self.bound.describe()}"
            self.description += f"; {self.bound.describe()} (the config's, rewritten for the objective)"
        if self.layout is not None:
            self.description += f"; {self.layout.describe()} in place of the config's"

    def _served_repository(self) -> Path:
        """The repository, or a copy of the model with the bound's policy and the layout."""
        if self.bound is None and self.layout is None:
            return self.repository
        config = (self.repository / self.model / CONFIG_FILE).read_text()
        for rewrite in (self.bound, self.layout):
            config = config if rewrite is None else rewrite.apply(config)
        folder = self.workdir / f"repository-{'facade' if self.facade else 'direct'}"
        shutil.rmtree(folder, ignore_errors=True)
        return link_models(folder, {self.model: self.repository / self.model}, {self.model: config})

    def start(self) -> None:
        self._stack = ServingStack(
            self._served_repository(),
            self.workdir / self.name.replace(" ", "_").replace(",", ""),
            backend_dir=self.workdir / "backends",
            # The health probe runs real inferences: keep it rare and on the model under test.
            facade_args=["--default-model", self.model, "--health-interval", "30", "--max-in-flight", "1024"],
        )
        self.process = self._stack.start_triton()
        if self.facade:
            self._stack.start_facade()

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.stop()
        self._stack = self.process = None

    @property
    def stack(self) -> ServingStack:
        assert self._stack is not None, "start() first"
        return self._stack

    @property
    def pids(self) -> list[int]:
        """Triton's, and the facade's beside it."""
        return [self.pid] + ([self.stack.facade.pid] if self.stack.facade is not None else [])

    def target(self, images: Sequence[Request] | None = None, expected: Sequence[np.ndarray] | None = None) -> Target:
        if self.facade:
            assert self.stack.facade is not None
            return FacadeTarget(self.stack.facade.grpc_url, self.model, 1, images=images, expected=expected)
        return KServeTarget(self.stack.triton.grpc_url, self.model, 1, images=images, expected=expected)


@dataclass(eq=False)
class FastApi(Server):
    """The FastAPI baseline (bench/baseline): gunicorn + uvicorn workers, one SO_REUSEPORT socket each."""

    onnx_file: Path
    setup: Setup
    workdir: Path

    def __post_init__(self) -> None:
        self.name = f"FastAPI {self.setup.workers}x{self.setup.threads}"
        self.description = (
            f"FastAPI + uvicorn + ONNX Runtime, {self.setup.name} ({self.setup.why}); gunicorn --reuse-port; "
            "raw float32 body (text models: named raw inputs, x-inputs), no batching"
        )

    def start(self) -> None:
        self.process = FastApiBaseline(
            onnx_file=self.onnx_file,
            port=free_ports(1)[0],
            workers=self.setup.workers,
            intra_op_threads=self.setup.threads,
            log_file=self.workdir / f"{self.name.replace(' ', '_')}.log",
        )
        self.process.start(READY_TIMEOUT_S)

    @property
    def baseline(self) -> FastApiBaseline:
        assert isinstance(self.process, FastApiBaseline), "start() first"
        return self.process

    def worker_pids(self) -> list[int]:
        return self.baseline.worker_pids()

    def target(self, images: Sequence[Request] | None = None, expected: Sequence[np.ndarray] | None = None) -> Target:
        return HttpTarget(self.baseline.url, 1, name=self.name, images=images, expected=expected)


def measured(
    server: Server, requests: Sequence[Request], expected: Sequence[np.ndarray], measure: Callable[[], dict]
) -> dict:
    """Start the server, check its answers, `measure()` it, read its memory, stop it; failures recorded (`error`)."""
    started = time.monotonic()
    try:
        server.start()
    except (ServerError, venvs.VenvError) as error:
        return {"error": f"did not start: {error}"}
    record: dict = {"ready_seconds": round(time.monotonic() - started, 2)}
    try:
        check_answers(server.target(requests, expected), len(requests))
        record.update(measure())
        record["memory"] = tree_memory(server.pid).as_dict()
    except VerificationError as error:
        record["error"] = f"wrong answers, not measured: {error}"
    finally:
        server.stop()
    return record


def said(label: str, point: dict) -> dict:
    """`point` (a LoadResult's dict), after saying it."""
    split = f", worker CPU {point['worker_cpu']['shares']}" if "worker_cpu" in point else ""
    say(
        f"  {label} c={point['concurrency']}: {point['images_per_s']:.1f} img/s, p50 {point['p50_ms']:.2f} ms, "
        f"p99 {point['p99_ms']:.2f} ms, client CPU {point['client_cpu']:.2f}, errors {sum(point['errors'].values())}"
        f"{split}"
    )
    return point


def closed_loop(server: Server, onnx_file: Path, concurrencies: Sequence[int], duration: float) -> dict:
    """`measured`: the load generator at each concurrency, a FastAPI run with its CPU split over the workers."""
    images = sample_images()

    def points() -> dict:
        found = []
        for concurrency in concurrencies:

            def run(concurrency: int = concurrency) -> loops.LoadResult:
                return loops.run(server.target(), concurrency, duration, warmup_s=min(1.0, duration / 4))

            if isinstance(server, FastApi):
                result, split = measured_split(run, server.worker_pids, concurrency)
                found.append(said(server.name, {**result.as_dict(), "worker_cpu": split}))
            else:
                found.append(said(server.name, run().as_dict()))
        return {"points": found}

    return measured(server, images, reference_outputs(onnx_file, images), points)
