"""A bounded closed-loop load generator that stays cheap on CPU, and measures its own CPU.

The benchmark runs on a 2-core machine where this generator shares the cores with the servers
it loads, so every cycle it spends is taken from them. It therefore does as little as possible
per request:

* each target builds its request ONCE, as serialized bytes, and sends the same bytes every time
  (gRPC methods are called with no serializer and no deserializer, so bytes go straight through);
* only the first response is decoded and checked (shape, size); later ones only count status;
* one grpc.aio channel (or one aiohttp session) is shared by all workers;
* per request the loop does two `perf_counter()` calls and one `array.append`.

`run_load` drives `concurrency` workers, each looping send -> await -> record, for a warm-up
(not recorded), then for the measured window, which ends at `duration_s` or after
`max_requests` calls, whichever comes first. Every call has a 30 s deadline, so the run always
ends. The generator's CPU time (`time.process_time()`, all of its threads, user + system) over the
measured window is reported as `client_cpu` = CPU seconds / wall seconds (1.0 = one full core).

Accounting: a call belongs to the measured window if it was SENT after the warm-up ended; no
call is sent once the window is over, and calls still in flight then are awaited and recorded.
So `requests + sum(errors)` is exactly the number of calls sent in the window, and
`warmup_requests` (which includes the one verification call) the number sent before it.

    python -m bench.loadgen --target kserve --url 127.0.0.1:8001 --model resnet50 --concurrency 1 4 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from client.proto import inference_pb2

CALL_TIMEOUT_S = 30.0
KSERVE_INFER = "/inference.GRPCInferenceService/ModelInfer"
KSERVE_METADATA = "/inference.GRPCInferenceService/ModelMetadata"
FACADE_PREDICT = "/inference.InferenceService/Predict"
IMAGE_SHAPE = (3, 224, 224)
IMAGE_CLASSES = 1000
TEXT_SEQUENCE = 16  # length of the generated INT64 inputs (and of other variable dims)
TEXT_INPUTS = ("input_ids", "attention_mask")
_GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
# KServe v2 datatype -> little-endian numpy dtype.
_NUMPY = {
    "FP32": "<f4", "FP16": "<f2", "FP64": "<f8", "INT8": "i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "UINT8": "u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "BOOL": "?",
}


class VerificationError(RuntimeError):
    """The target's first response is not what the request asks for (or the call failed)."""


# ---------------------------------------------------------------------------------------------
# Payloads


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _tensor(name: str, datatype: str, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random data for one input: FP32 normal, integer ids in [1, 1000), names with "mask" all ones."""
    dtype = np.dtype(_NUMPY[datatype])
    if "mask" in name.lower():
        return np.ones(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
    if dtype.kind in "iu":
        return rng.integers(1, 1000, size=shape).astype(dtype)
    if dtype.kind == "b":
        return np.ones(shape, dtype=dtype)
    raise ValueError(f"cannot generate data for input '{name}' of type {datatype}")


def _concrete(dims: Sequence[int], batch: int, batched: bool) -> list[int]:
    """Metadata dims with the batch dim set to `batch` and other variable dims to TEXT_SEQUENCE."""
    shape = [int(d) for d in dims]
    if batched:
        shape[0] = batch
    return [TEXT_SEQUENCE if d < 0 else d for d in shape]


def _strip_scheme(url: str) -> str:
    for prefix in ("grpc://", "http://", "dns:///"):
        if url.startswith(prefix):
            return url[len(prefix):].rstrip("/")
    return url


# ---------------------------------------------------------------------------------------------
# Targets. Each has `name`, `model`, `batch`, `is_open`; async `open(concurrency)`, `verify()`,
# `call() -> None | error label`, `close()`.


class _GrpcTarget:
    name = "grpc"

    def __init__(self, url: str, model: str, batch: int, timeout_s: float) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.url, self.model, self.batch, self.timeout_s = _strip_scheme(url), model, batch, timeout_s
        self.payload: bytes | None = None
        self._channel: grpc.aio.Channel | None = None
        self._method = None

    @property
    def is_open(self) -> bool:
        return self._channel is not None

    async def open(self, concurrency: int = 1) -> None:
        self._channel = grpc.aio.insecure_channel(self.url, options=_GRPC_OPTIONS)
        self._method = self._channel.unary_unary(self.method_path, request_serializer=None, response_deserializer=None)
        if self.payload is None:
            try:
                self.payload = await self._build()
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._method = None

    async def _build(self) -> bytes:
        raise NotImplementedError

    async def call(self) -> str | None:
        """One call with the prepared bytes: None on success, else the gRPC status name."""
        try:
            await self._method(self.payload, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            return error.code().name
        return None

    async def _first(self, message_type):
        """The first call, its response decoded as `message_type`."""
        try:
            body = await self._method(self.payload, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            raise VerificationError(f"{self.name} {self.url} model '{self.model}': first call failed: "
                                    f"{error.code().name}: {error.details()}") from None
        try:
            return message_type.FromString(body)
        except DecodeError:
            raise VerificationError(f"{self.name} {self.url} model '{self.model}': the first response "
                                    f"({len(body)} bytes) is not a {message_type.DESCRIPTOR.full_name}") from None


class KServeTarget(_GrpcTarget):
    """Triton's KServe v2 gRPC `ModelInfer`, inputs from the model's metadata as raw bytes."""

    name = "triton-grpc"
    method_path = KSERVE_INFER

    def __init__(self, url: str, model: str = "resnet50", batch: int = 1, *, seed: int = 0,
                 timeout_s: float = CALL_TIMEOUT_S) -> None:
        super().__init__(url, model, batch, timeout_s)
        self.seed = seed
        self.metadata: service_pb2.ModelMetadataResponse | None = None

    async def _build(self) -> bytes:
        metadata_call = self._channel.unary_unary(
            KSERVE_METADATA,
            request_serializer=service_pb2.ModelMetadataRequest.SerializeToString,
            response_deserializer=service_pb2.ModelMetadataResponse.FromString,
        )
        try:
            self.metadata = await metadata_call(service_pb2.ModelMetadataRequest(name=self.model), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            raise VerificationError(f"ModelMetadata of '{self.model}' at {self.url} failed: "
                                    f"{error.code().name}: {error.details()}") from None
        if not self.metadata.inputs:
            raise VerificationError(f"model '{self.model}' at {self.url} has no inputs in its metadata")
        rng = _rng(self.seed)
        request = service_pb2.ModelInferRequest(model_name=self.model)
        for spec in self.metadata.inputs:
            # Triton lists the batch dim as -1 for batching models: [-1, 3, 224, 224].
            batched = len(spec.shape) > 0 and spec.shape[0] == -1
            shape = _concrete(spec.shape, self.batch, batched)
            request.inputs.append(
                service_pb2.ModelInferRequest.InferInputTensor(name=spec.name, datatype=spec.datatype, shape=shape)
            )
            request.raw_input_contents.append(_tensor(spec.name, spec.datatype, shape, rng).tobytes())
        return request.SerializeToString()

    async def verify(self) -> None:
        """Decode the first response: every output of the metadata, batch-first, with its bytes."""
        response = await self._first(service_pb2.ModelInferResponse)
        where = f"triton-grpc {self.url} model '{self.model}' batch {self.batch}"
        expected = {o.name: o for o in self.metadata.outputs}
        got = [o.name for o in response.outputs]
        if sorted(got) != sorted(expected):
            raise VerificationError(f"{where}: response has outputs {got}, the model's metadata lists {sorted(expected)}")
        if len(response.raw_output_contents) != len(response.outputs):
            raise VerificationError(f"{where}: {len(response.outputs)} outputs but "
                                    f"{len(response.raw_output_contents)} raw_output_contents")
        for output, raw in zip(response.outputs, response.raw_output_contents):
            shape = list(output.shape)
            dims = list(expected[output.name].shape)
            fits = len(shape) == len(dims) and all(d < 0 or d == s for d, s in zip(dims, shape))
            if not fits or (dims and dims[0] == -1 and shape[0] != self.batch):
                raise VerificationError(f"{where}: output '{output.name}' has shape {shape}, expected "
                                        f"{[self.batch, *dims[1:]] if dims else dims}")
            itemsize = np.dtype(_NUMPY.get(output.datatype, "u1")).itemsize
            if len(raw) != math.prod(shape) * itemsize:
                raise VerificationError(f"{where}: output '{output.name}' carries {len(raw)} bytes, "
                                        f"shape {shape} of {output.datatype} needs {math.prod(shape) * itemsize}")


class FacadeTarget(_GrpcTarget):
    """The project's `inference.InferenceService/Predict`.

    `raw=True` sends the image as `raw_data` (compact bytes); `raw=False` as the `data` float list
    of the simple contract (serialized once all the same). Text models (`text_inputs`, by default
    for model names containing "text") are sent as named INT64 `inputs` of shape [batch, 16].
    """

    def __init__(self, url: str, model: str = "resnet50", batch: int = 1, raw: bool = True, *,
                 text_inputs: Sequence[str] | None = None, image_shape: Sequence[int] = IMAGE_SHAPE,
                 seed: int = 0, timeout_s: float = CALL_TIMEOUT_S) -> None:
        super().__init__(url, model, batch, timeout_s)
        self.raw, self.seed = raw, seed
        self.name = "facade" if raw else "facade-floats"
        self.text_inputs = tuple(text_inputs) if text_inputs is not None else (
            TEXT_INPUTS if "text" in model.lower() else ())
        if self.text_inputs and not raw:
            raise ValueError("the float-list contract carries one FP32 input: text models need raw=True")
        self.image_shape = tuple(image_shape)
        self.method_path = FACADE_PREDICT

    async def _build(self) -> bytes:
        rng = _rng(self.seed)
        request = inference_pb2.PredictRequest(model_name=self.model)
        if self.text_inputs:
            shape = [self.batch, TEXT_SEQUENCE]
            for name in self.text_inputs:
                request.inputs.append(inference_pb2.Tensor(
                    name=name, dtype=inference_pb2.INT64, shape=shape,
                    raw_data=_tensor(name, "INT64", shape, rng).tobytes(),
                ))
            return request.SerializeToString()
        shape = [self.batch, *self.image_shape]
        image = _tensor("input", "FP32", shape, rng)
        request.shape.extend(shape)
        if self.raw:
            request.raw_data = image.tobytes()
            request.dtype = inference_pb2.FP32
        else:
            request.data.extend(image.ravel().tolist())
        return request.SerializeToString()

    async def verify(self) -> None:
        """Decode the first response: a PredictResponse whose shape starts with the batch."""
        where = f"{self.name} {self.url} model '{self.model}' batch {self.batch}"
        response = await self._first(inference_pb2.PredictResponse)
        shape = list(response.shape)
        if not shape or shape[0] != self.batch:
            raise VerificationError(f"{where}: response shape {shape}, expected the batch {self.batch} first")
        if len(response.predictions) != math.prod(shape):
            raise VerificationError(f"{where}: {len(response.predictions)} predictions for shape {shape}")
        for output in response.outputs:
            if not output.shape or output.shape[0] != self.batch:
                raise VerificationError(f"{where}: output '{output.name}' has shape {list(output.shape)}, "
                                        f"expected the batch {self.batch} first")
        if (self.raw or self.text_inputs) and not response.outputs:
            raise VerificationError(f"{where}: an extended (raw/named) request got no named outputs")


class HttpTarget:
    """The FastAPI baseline: POST {url}/predict, body the raw little-endian float32 bytes of a
    [batch, 3, 224, 224] array, header `x-shape`; expects 200 and batch * 1000 float32 bytes."""

    name = "fastapi"

    def __init__(self, url: str, batch: int = 1, *, model: str = "resnet50", seed: int = 0,
                 timeout_s: float = CALL_TIMEOUT_S) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        url = url.rstrip("/")
        self.url = url if "://" in url else f"http://{url}"
        self.endpoint = f"{self.url}/predict"
        self.model, self.batch, self.seed, self.timeout_s = model, batch, seed, timeout_s
        shape = [batch, *IMAGE_SHAPE]
        self.payload = _tensor("input", "FP32", shape, _rng(seed)).tobytes()
        self.headers = {"x-shape": ",".join(map(str, shape)), "content-type": "application/octet-stream"}
        self.expected_bytes = batch * IMAGE_CLASSES * 4
        self._session = None
        self._post = None

    @property
    def is_open(self) -> bool:
        return self._session is not None

    async def open(self, concurrency: int = 1) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        connector = aiohttp.TCPConnector(limit=max(concurrency, 1), limit_per_host=max(concurrency, 1))
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            skip_auto_headers=("User-Agent",),
        )
        self._post = self._session.post

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = self._post = None

    async def call(self) -> str | None:
        """One POST: None on a 200, else the HTTP status (or the exception's class name)."""
        try:
            async with self._post(self.endpoint, data=self.payload, headers=self.headers) as response:
                await response.read()
                return None if response.status == 200 else str(response.status)
        except (self._aiohttp.ClientError, asyncio.TimeoutError) as error:
            return type(error).__name__

    async def verify(self) -> None:
        where = f"fastapi {self.endpoint} batch {self.batch}"
        try:
            async with self._post(self.endpoint, data=self.payload, headers=self.headers) as response:
                body = await response.read()
                status = response.status
        except (self._aiohttp.ClientError, asyncio.TimeoutError) as error:
            raise VerificationError(f"{where}: first call failed: {type(error).__name__}: {error}") from None
        if status != 200:
            raise VerificationError(f"{where}: first call answered HTTP {status}: {body[:200]!r}")
        if len(body) != self.expected_bytes:
            raise VerificationError(f"{where}: body of {len(body)} bytes, expected {self.expected_bytes} "
                                    f"({self.batch} x {IMAGE_CLASSES} float32)")


# ---------------------------------------------------------------------------------------------
# Results and the load loop


@dataclass
class LoadResult:
    target: str  # "triton-grpc", "facade", "facade-floats", "fastapi"
    model: str
    batch: int
    concurrency: int
    requests: int  # successful calls in the measured window
    errors: dict[str, int] = field(default_factory=dict)  # status (gRPC code name / HTTP status) -> count
    seconds: float = 0.0  # the measured window
    throughput_rps: float = 0.0
    images_per_s: float = 0.0  # throughput_rps * batch
    p50_ms: float = math.nan
    p95_ms: float = math.nan
    p99_ms: float = math.nan
    mean_ms: float = math.nan
    client_cpu: float = 0.0  # the generator's CPU seconds / wall seconds over the window; 1.0 = one core
    warmup_requests: int = 0  # calls sent before the window (verification call included), not recorded

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        errors = ", ".join(f"{code} {count}" for code, count in sorted(self.errors.items())) or "none"
        return (
            f"{self.target:<13} {self.model:<18} batch {self.batch:<2} conc {self.concurrency:>3}: "
            f"{self.throughput_rps:8.1f} req/s {self.images_per_s:8.1f} img/s | "
            f"p50 {self.p50_ms:8.1f}  p95 {self.p95_ms:8.1f}  p99 {self.p99_ms:8.1f}  mean {self.mean_ms:8.1f} ms | "
            f"client CPU {self.client_cpu * 100:5.1f}% of a core | errors: {errors} | "
            f"{self.requests} ok in {self.seconds:.2f} s"
        )


async def run_load(target, concurrency: int, duration_s: float, warmup_s: float = 1.0,
                   max_requests: int = 100_000) -> LoadResult:
    """Closed-loop load: `concurrency` workers, each send -> await -> record.

    Opens the target (channel / session, in this loop) unless it is already open, and closes what
    it opened. The first call is verified (decoded) and raises `VerificationError` if wrong.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if max_requests < 1:
        raise ValueError(f"max_requests must be at least 1, got {max_requests}")
    if not duration_s > 0 or warmup_s < 0:
        raise ValueError(f"duration_s must be > 0 and warmup_s >= 0, got {duration_s} and {warmup_s}")
    opened_here = not target.is_open
    if opened_here:
        await target.open(concurrency)
    try:
        await target.verify()
        return await _drive(target, concurrency, duration_s, warmup_s, max_requests)
    finally:
        if opened_here:
            await target.close()


async def _drive(target, concurrency: int, duration_s: float, warmup_s: float, max_requests: int) -> LoadResult:
    call = target.call
    perf = time.perf_counter
    latencies = array("d")
    record = latencies.append
    errors: dict[str, int] = {}
    measuring = stopping = False
    sent = 0  # calls sent in the window
    warm = 1  # calls sent before it; the verification call is the first
    stop = asyncio.Event()

    async def worker() -> None:
        nonlocal sent, warm, stopping
        try:
            while not stopping:
                if not measuring:
                    warm += 1
                    await call()
                    continue
                sent += 1
                if sent >= max_requests:
                    stopping = True
                    stop.set()
                started = perf()
                error = await call()
                if error is None:
                    record(perf() - started)
                else:
                    errors[error] = errors.get(error, 0) + 1
        except BaseException:
            stopping = True
            stop.set()
            raise

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    try:
        if warmup_s > 0:
            try:
                await asyncio.wait_for(stop.wait(), warmup_s)  # only a crashed worker sets it this early
            except asyncio.TimeoutError:
                pass
        cpu_start, window_start = time.process_time(), perf()
        measuring = True
        by_duration = False
        if not stopping:
            try:
                await asyncio.wait_for(stop.wait(), duration_s)
            except asyncio.TimeoutError:
                by_duration = True
        stopping = True
        window_end = perf()
        # In-flight calls finish within their own deadline; the margin only guards against a hang.
        await asyncio.wait_for(asyncio.gather(*workers), target.timeout_s + 10)
        done, cpu_end = perf(), time.process_time()
    finally:
        for task in workers:
            task.cancel()

    # A duration-bounded window is its nominal span: the calls counted are those SENT in it, which
    # in a closed loop is unbiased. A window cut by max_requests lasts until its last response.
    seconds = (window_end if by_duration else done) - window_start
    requests = len(latencies)
    result = LoadResult(
        target=target.name, model=target.model, batch=target.batch, concurrency=concurrency,
        requests=requests, errors=dict(sorted(errors.items())), seconds=seconds,
        client_cpu=(cpu_end - cpu_start) / (done - window_start) if done > window_start else 0.0,
        warmup_requests=warm,
    )
    if seconds > 0:
        result.throughput_rps = requests / seconds
        result.images_per_s = result.throughput_rps * target.batch
    if requests:
        values = np.frombuffer(latencies, dtype=np.float64) * 1000.0
        result.p50_ms, result.p95_ms, result.p99_ms = (float(v) for v in np.percentile(values, [50, 95, 99]))
        result.mean_ms = float(values.mean())
    return result


def run(target, concurrency: int, duration_s: float, warmup_s: float = 1.0, max_requests: int = 100_000) -> LoadResult:
    """`run_load` in a fresh event loop; the channel / session is created in it and closed."""
    return asyncio.run(run_load(target, concurrency, duration_s, warmup_s, max_requests))


# ---------------------------------------------------------------------------------------------
# CLI


def make_target(kind: str, url: str, model: str, batch: int, seed: int = 0):
    if kind == "kserve":
        return KServeTarget(url, model, batch, seed=seed)
    if kind == "facade":
        return FacadeTarget(url, model, batch, raw=True, seed=seed)
    if kind == "facade-floats":
        return FacadeTarget(url, model, batch, raw=False, seed=seed)
    if kind == "http":
        return HttpTarget(url, batch, model=model, seed=seed)
    raise ValueError(f"unknown target {kind!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description=(
            "Closed-loop load on one target: N workers each send the same pre-serialized request, await "
            "the answer and send again. A warm-up (not recorded) comes first, then a measured window that "
            "ends at --duration or after --max-requests calls. The first response is decoded and checked; "
            "later ones only count status. Prints one line per concurrency: throughput, latency "
            "percentiles, the generator's own CPU (100% = one full core) and errors by status."
        ),
        epilog=(
            "targets: kserve = Triton's KServe v2 gRPC ModelInfer (inputs from the model's metadata); "
            "facade = inference.InferenceService/Predict with raw_data; facade-floats = the same with the "
            "float list of the simple contract; http = POST {url}/predict with raw float32 bytes (FastAPI "
            "baseline).  Examples:  python -m bench.loadgen --target kserve --url 127.0.0.1:8001 "
            "--model resnet50 --concurrency 1 4 16 --duration 10   |   python -m bench.loadgen --target "
            "http --url http://127.0.0.1:8080 --concurrency 1 8 --json"
        ),
    )
    parser.add_argument("--target", required=True, choices=("kserve", "facade", "facade-floats", "http"),
                        help="what to load (see below)")
    parser.add_argument("--url", required=True, help="HOST:PORT for gRPC targets, http://HOST:PORT for http")
    parser.add_argument("--model", default="resnet50", help="model name (a label only for http); default: resnet50")
    parser.add_argument("--batch", type=int, default=1, help="images (or sequences) per request; default: 1")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1], metavar="N",
                        help="one run per value, e.g. 1 2 4; default: 1")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run; default: 10")
    parser.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds before each run; default: 1")
    parser.add_argument("--max-requests", type=int, default=100_000,
                        help="end a run after this many measured calls if the duration has not passed; default: 100000")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input data; default: 0")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run instead of a text line")
    args = parser.parse_args(argv)
    if any(c < 1 for c in args.concurrency) or args.batch < 1:
        parser.error("--concurrency and --batch must be at least 1")

    target = make_target(args.target, args.url, args.model, args.batch, args.seed)
    for concurrency in args.concurrency:
        try:
            result = run(target, concurrency, args.duration, args.warmup, args.max_requests)
        except VerificationError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(json.dumps(result.as_dict()) if args.json else result.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
