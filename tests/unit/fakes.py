"""Stand-ins for Triton's gateway in the facade's in-process tests (no tritonserver).

Each satisfies tritonnx.client.facade.gateway.Gateway, which mypy checks (this module is in its `files`): a change to
the gateway's calls that a stand-in does not follow fails the type check, not a test that passes for a wrong
reason.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from tritonclient.grpc import service_pb2

from tritonnx.client.facade.errors import InvalidArgument, NotFound, Unavailable
from tritonnx.client.facade.gateway import Gateway
from tritonnx.client.facade.health import PROBE_ID
from tritonnx.client.facade.translate import InferCall, ModelInfo, TensorInfo

ModelIndex: TypeAlias = service_pb2.RepositoryIndexResponse.ModelIndex
Metadata = tuple[tuple[str, str], ...]

# y = 2 * x: FakeGateway's one model.
DOUBLE = ModelInfo("double", "", (TensorInfo("x", "FP32", (-1, 4)),), (TensorInfo("y", "FP32", (-1, 4)),), 8)


class FakeGateway:
    """One model, `double` (y = 2 * x). A request whose id starts with "boom" makes it raise what no one maps:
    a bug's exception."""

    def __init__(self) -> None:
        self.last_failure: tuple[float, str] | None = None
        self.down = False  # every call fails as when Triton is unreachable
        self.hold: asyncio.Event | None = None  # when set, inferences (not health probes) wait for it
        self.held = 0  # inferences waiting for `hold` now: their requests were read and reached "Triton"
        self.closed = False
        # Requests that reached "Triton", health probes left out: they come every 50 ms, and a
        # test counting calls across a cache hit would fail when one lands in between.
        self.inferences = 0
        self.metadata: list[Metadata] = []  # each inference's gRPC metadata (a traceparent)

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        if name != DOUBLE.name:
            raise NotFound(f"model '{name}' is not served; ready models: double")
        return DOUBLE

    def knows(self, name: str, version: str) -> bool:
        return name == DOUBLE.name

    def forget(self, name: str, older_than: float = 0.0) -> bool:
        return False  # one model, whose metadata never changes

    async def infer(
        self, call: InferCall, timeout: float | None, metadata: Metadata = ()
    ) -> service_pb2.ModelInferResponse:
        if self.down:
            raise Unavailable("model 'double' cannot take the request now: retry later")
        if self.hold is not None and call.header.id != PROBE_ID:
            self.held += 1
            try:
                await self.hold.wait()
            finally:
                self.held -= 1
        if call.header.id != PROBE_ID:
            self.inferences += 1
            self.metadata.append(metadata)
        if call.header.id.startswith("boom"):
            raise RuntimeError("lost the slot table in /opt/tritonnx/client/facade/secret.py")
        doubled = 2 * np.frombuffer(call.payloads[0], "<f4")
        output = service_pb2.ModelInferResponse.InferOutputTensor(
            name="y", datatype="FP32", shape=call.header.inputs[0].shape
        )
        return service_pb2.ModelInferResponse(
            model_name=DOUBLE.name, outputs=[output], raw_output_contents=[doubled.tobytes()]
        )

    async def repository_index(self, ready_only: bool, timeout: float | None = None) -> list[ModelIndex]:
        entries = [
            ModelIndex(name="double", version="1", state="READY"),
            ModelIndex(name="broken", version="1", state="UNAVAILABLE", reason="load failed: no model.onnx"),
        ]
        return [e for e in entries if e.state == "READY" or not ready_only]

    async def close(self) -> None:
        self.closed = True


# Version 1 doubles `x` into `y`; version 2 takes `pixels` and gives `scores`, three times its input.
V1 = ModelInfo("m", "", (TensorInfo("x", "FP32", (-1, 4)),), (TensorInfo("y", "FP32", (-1, 4)),), 8, ("1",))
V2 = ModelInfo("m", "", (TensorInfo("pixels", "FP32", (-1, 4)),), (TensorInfo("scores", "FP32", (-1, 4)),), 8, ("2",))
FACTOR = {"1": 2.0, "2": 3.0}


class SwappingGateway:
    """Metadata held until forgotten (as TritonGateway holds it for its TTL); Triton serves `serving`, model `m`."""

    def __init__(self) -> None:
        self.serving = V1
        self.held: ModelInfo | None = None
        self.fetched_long_ago = True  # whether `forget(older_than=1 s)` finds the held metadata stale
        self.metadata_calls = 0
        self.last_failure: tuple[float, str] | None = None

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        if self.held is None:
            self.metadata_calls += 1
            self.held = self.serving
        return self.held

    def forget(self, name: str, older_than: float = 0.0) -> bool:
        if self.held is None or (older_than and not self.fetched_long_ago):
            return False
        self.held = None
        return True

    def knows(self, name: str, version: str) -> bool:
        return self.held is not None

    async def infer(
        self, call: InferCall, timeout: float | None, metadata: Metadata = ()
    ) -> service_pb2.ModelInferResponse:
        version = self.serving.versions[0]
        if [t.name for t in call.header.inputs] != [self.serving.inputs[0].name]:
            self.forget("m", older_than=1.0)  # as gateway.with_current_metadata does on Triton's refusal
            raise InvalidArgument(
                f"model 'm' rejected the request: unexpected inference input '{call.header.inputs[0].name}'"
            )
        result = FACTOR[version] * np.frombuffer(call.payloads[0], "<f4")
        output = service_pb2.ModelInferResponse.InferOutputTensor(
            name=self.serving.outputs[0].name, datatype="FP32", shape=call.header.inputs[0].shape
        )
        return service_pb2.ModelInferResponse(
            model_name="m", model_version=version, outputs=[output], raw_output_contents=[result.tobytes()]
        )

    async def repository_index(self, ready_only: bool, timeout: float | None = None) -> list[ModelIndex]:
        return [ModelIndex(name="m", version=self.serving.versions[0], state="READY")]

    async def close(self) -> None:
        pass


# The image pipeline StandInGateway serves: JPEG/PNG bytes in, the top classes as strings out.
PIPELINE = ModelInfo(
    "resnet50_image",
    "",
    (TensorInfo("image", "UINT8", (-1, -1)),),
    (TensorInfo("scores", "FP32", (-1, 1000)),),
    16,
)


def strings_tensor(*items: bytes) -> bytes:
    """A BYTES tensor's raw contents: each item after its 4-byte little-endian length."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


class StandInGateway:
    """One served pipeline, PIPELINE; records the calls that reach 'Triton'."""

    def __init__(self) -> None:
        self.calls: list[tuple[InferCall, float | None]] = []
        self.last_failure: tuple[float, str] | None = None

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        if name != PIPELINE.name:
            raise NotFound(f"model '{name}' is not served")
        return PIPELINE

    async def repository_index(self, ready_only: bool, timeout: float | None = None) -> list[ModelIndex]:
        return [ModelIndex(name=n) for n in ("resnet50", "resnet50_image")]

    def knows(self, name: str, version: str) -> bool:
        return name == PIPELINE.name

    def forget(self, name: str, older_than: float = 0.0) -> bool:
        return False  # one model, whose metadata never changes

    async def infer(
        self, call: InferCall, timeout: float | None, metadata: Metadata = ()
    ) -> service_pb2.ModelInferResponse:
        self.calls.append((call, timeout))
        response = service_pb2.ModelInferResponse(model_name=PIPELINE.name, model_version="1")
        response.outputs.add(name="scores", datatype="BYTES", shape=[1, 1])
        response.raw_output_contents.append(strings_tensor(b"1.000000:3:class_003"))
        return response

    async def close(self) -> None:
        pass


if TYPE_CHECKING:  # mypy holds each stand-in to the protocol here, and names the members that drifted
    _fake: Gateway = FakeGateway()
    _swapping: Gateway = SwappingGateway()
    _stand_in: Gateway = StandInGateway()
