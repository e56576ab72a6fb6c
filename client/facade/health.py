"""Health from a real inference.

Triton 2.51 keeps reporting READY after a Python stub died, so the facade is healthy only while the probed model
(default_model.py says which) answers an actual request of zeros (a refusal of the zeros, INVALID_ARGUMENT, is an
answer: a model that decodes images refuses them) and no request failed on Triton's side lately (a dead stub
fails only the requests sent to its instance, which a single probe may miss). While unhealthy it probes often, to
report recovery quickly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2

from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.client.facade.current_metadata import with_current_metadata
from tritonnx.client.facade.default_model import DefaultModel
from tritonnx.client.facade.errors import FacadeError, InvalidArgument
from tritonnx.client.facade.gateway import Gateway
from tritonnx.client.facade.translate import InferCall, ModelInfo

log = logging.getLogger("tritonnx.facade")
# The request id of the health probe's inferences (Triton's log and traces tell them from callers').
PROBE_ID = "tritonnx-health"
_RECOVERY_PROBE_SECONDS = 0.25


class HealthStatusSink(Protocol):
    """What the monitor publishes to: grpc_health's aio HealthServicer."""

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None: ...

    async def enter_graceful_shutdown(self) -> None: ...


@dataclass(frozen=True)
class HealthReport:
    serving: bool
    model: str
    checked_at: float  # time.monotonic()
    seconds: float  # how long the probe took
    detail: str

    def as_json(self) -> dict:
        return {
            "status": "SERVING" if self.serving else "NOT_SERVING",
            "model": self.model,
            "probe_ms": round(self.seconds * 1000, 2),
            "checked_ms_ago": round((time.monotonic() - self.checked_at) * 1000, 1),
            "detail": self.detail,
        }


class HealthMonitor:
    """Probes the default model (else a model served) with a batch-1 zeros request and publishes the result.

    The result goes to grpc.health.v1 (overall and per service) and to /health.
    """

    def __init__(
        self,
        gateway: Gateway,
        model: DefaultModel,
        timeout: float,
        interval: float,
        services: list[str],
        servicer: HealthStatusSink,
    ) -> None:
        self.gateway = gateway
        self.model = model
        self.timeout = timeout
        self.interval = interval
        self.failure_window = 2 * interval  # unhealthy until two intervals pass without a failure
        self.services = ["", *services]
        self.servicer = servicer
        self.draining = False
        self.report = HealthReport(False, model.name, time.monotonic(), 0.0, "not probed yet")
        self._probe_lock = asyncio.Lock()

    async def _probe(self, name: str) -> tuple[ModelInfo, service_pb2.ModelInferResponse]:
        info = await self.gateway.model_info(name, "", self.timeout)
        call = InferCall(service_pb2.ModelInferRequest(model_name=info.name, id=PROBE_ID), [])
        for tensor in info.inputs:
            # -1 dims (batch, sequence) become 1: the smallest real request.
            shape = [1 if d < 0 else d for d in tensor.shape]
            call.header.inputs.append(
                service_pb2.ModelInferRequest.InferInputTensor(name=tensor.name, datatype=tensor.datatype, shape=shape)
            )
            call.payloads.append(memoryview(np.zeros(shape, RAW_DTYPES[tensor.datatype]).tobytes()))
        return info, await self.gateway.infer(call, self.timeout)

    async def probe(self) -> HealthReport:
        started = time.monotonic()
        name = self.model.name
        try:
            name = await self.model.to_probe(self.timeout)
            await with_current_metadata(self.gateway, name, "", lambda: self._probe(name))
            serving, detail = not self.draining, "draining" if self.draining else "real inference answered"
        except InvalidArgument as error:
            # The model ran and refused zeros (an image decoder, say): Triton, its instance and the path answer.
            serving = not self.draining
            detail = "draining" if self.draining else f"real inference answered, refusing zeros: {error.message}"
        except FacadeError as error:
            serving, detail = False, f"{error.code.name}: {error.message}"
        failure = self.gateway.last_failure
        if serving and failure is not None and time.monotonic() - failure[0] < self.failure_window:
            serving, detail = (
                False,
                f"a request failed in Triton {time.monotonic() - failure[0]:.1f}s ago ({failure[1]})",
            )
        report = HealthReport(serving, name, time.monotonic(), time.monotonic() - started, detail)
        if report.serving != self.report.serving:
            log.log(
                logging.INFO if report.serving else logging.WARNING,
                "health: %s (%s)",
                "SERVING" if report.serving else "NOT_SERVING",
                detail,
            )
        self.report = report
        await self._publish()
        return report

    async def current(self, max_age: float) -> HealthReport:
        """The last report if it is fresh enough, else a new probe (one at a time)."""
        async with self._probe_lock:
            failure = self.gateway.last_failure
            news = failure is not None and failure[0] > self.report.checked_at  # a failure since the last probe
            fresh = time.monotonic() - self.report.checked_at <= max_age and self.report.detail != "not probed yet"
            if fresh and not news:
                return self.report
            return await self.probe()

    async def _publish(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.report.serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in self.services:
            await self.servicer.set(service, status)

    async def run(self) -> None:
        while not self.draining:
            await self.current(max_age=self.interval / 2)
            await asyncio.sleep(self.interval if self.report.serving else min(self.interval, _RECOVERY_PROBE_SECONDS))

    async def drain(self) -> None:
        """NOT_SERVING everywhere from now on: load balancers stop sending before the server stops."""
        self.draining = True
        self.report = HealthReport(False, self.model.name, time.monotonic(), 0.0, "draining")
        await self.servicer.enter_graceful_shutdown()
