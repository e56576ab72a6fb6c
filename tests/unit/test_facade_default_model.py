"""The model of a request that names none, unset: it follows what Triton serves (client/facade/default_model.py)."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest

from tests.unit.fakes import DOUBLE, FakeGateway, ModelIndex
from tests.unit.test_facade_server import request, run, serving, until
from tritonnx.client.facade.default_model import DEMO_MODEL, DefaultModel
from tritonnx.client.facade.errors import InvalidArgument, NotFound, Unavailable
from tritonnx.client.facade.translate import ModelInfo, TensorInfo
from tritonnx.client.proto import inference_pb2_grpc

TEXT = ModelInfo("a_text", "", (TensorInfo("text", "BYTES", (-1, 1)),), (TensorInfo("y", "FP32", (-1, 2)),), 8)


class Served(FakeGateway):
    """FakeGateway serving `double` beside the models named (their metadata: TEXT's signature)."""

    def __init__(self, *others: str) -> None:
        super().__init__()
        self.others = others

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        if name in self.others:
            return ModelInfo(name, "", TEXT.inputs, TEXT.outputs, 8)
        return await super().model_info(name, version, timeout)

    async def repository_index(self, ready_only: bool, timeout: float | None = None) -> list[ModelIndex]:
        served = [ModelIndex(name=name, version="1", state="READY") for name in self.others]
        return [*served, *await super().repository_index(ready_only, timeout)]


def resolve(default: DefaultModel) -> tuple[str, str]:
    async def both() -> tuple[str, str]:
        return await default.for_request(1.0), await default.to_probe(1.0)

    return asyncio.run(both())


def test_a_model_set_is_the_default_whatever_triton_serves():
    assert resolve(DefaultModel(FakeGateway(), "elsewhere")) == ("elsewhere", "elsewhere")


def test_unset_the_one_model_triton_serves_is_the_default():
    default = DefaultModel(FakeGateway(), "")
    assert resolve(default) == ("double", "double")
    assert default.name == "double"


def test_unset_the_demo_model_is_the_default_while_triton_serves_it():
    assert resolve(DefaultModel(Served(DEMO_MODEL), "")) == (DEMO_MODEL, DEMO_MODEL)


def test_unset_with_several_models_a_request_names_its_own_and_health_probes_a_numeric_one():
    default = DefaultModel(Served("a_text"), "")
    with pytest.raises(InvalidArgument, match="no default model .* name one of a_text, double"):
        asyncio.run(default.for_request(1.0))
    assert asyncio.run(default.to_probe(1.0)) == "double"  # a_text comes first by name, but takes strings
    assert default.name == ""


def test_unset_a_triton_serving_nothing_has_no_default_and_nothing_to_probe():
    class Empty(FakeGateway):
        async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
            raise NotFound(f"model '{name}' is not served")

        async def repository_index(self, ready_only: bool, timeout: float | None = None) -> list[ModelIndex]:
            return []

    default = DefaultModel(Empty(), "")
    with pytest.raises(NotFound, match="names no model, and Triton serves none"):
        asyncio.run(default.for_request(1.0))
    with pytest.raises(Unavailable, match="no model to probe: Triton serves none"):
        asyncio.run(default.to_probe(1.0))


def test_unset_a_triton_that_cannot_list_its_models_is_said_so():
    class Unlisted(FakeGateway):
        async def repository_index(self, ready_only: bool, timeout: float | None = None) -> list[ModelIndex]:
            raise NotFound("no index")

    with pytest.raises(NotFound, match="cannot list Triton's models to follow what it serves: no index"):
        asyncio.run(DefaultModel(Unlisted(), "").for_request(1.0))


def test_a_facade_with_no_default_set_is_healthy_and_answers_on_the_one_model_served():
    async def test() -> None:
        async with serving(FakeGateway(), default_model="") as (facade, channel):
            url = f"http://127.0.0.1:{facade.http_port}/health"
            async with aiohttp.ClientSession() as session:

                async def health() -> tuple[int, dict]:
                    async with session.get(url) as answer:
                        return answer.status, await answer.json()

                await until(lambda: facade.monitor.report.serving)
                status, body = await health()
                assert (status, body["model"]) == (200, DOUBLE.name)
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            response = await stub.Predict(request("r1", [1, 2, 3, 4]))
            assert response.model_name == DOUBLE.name and list(response.predictions) == [2, 4, 6, 8]

    run(test)


def test_a_facade_with_no_default_set_refuses_an_unnamed_request_among_several_models_naming_them():
    async def test() -> None:
        async with serving(Served("other"), default_model="") as (facade, channel):
            await until(lambda: facade.monitor.report.serving)  # probing `double`, the numeric one
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Predict(request("r1", [1, 2, 3, 4]))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "name one of double, other" in (refused.value.details() or "")
            named = request("r2", [1, 2, 3, 4])
            named.model_name = DOUBLE.name
            assert list((await stub.Predict(named)).predictions) == [2, 4, 6, 8]

    run(test)


def test_a_probed_model_that_refuses_zeros_still_answers_so_the_facade_is_healthy():
    """A repository whose first numeric model decodes images: its answer to zeros is a refusal, and it did answer."""

    class Decoder(Served):
        async def infer(self, call, timeout=None):
            if call.header.model_name == "a_decoder":
                raise InvalidArgument("model 'a_decoder': not an image")
            return await super().infer(call, timeout)

        async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
            if name == "a_decoder":
                return ModelInfo(name, "", (TensorInfo("image", "UINT8", (-1,)),), TEXT.outputs, 0)
            return await super().model_info(name, version, timeout)

    async def test() -> None:
        async with serving(Decoder("a_decoder"), default_model="") as (facade, _):
            await until(lambda: facade.monitor.report.serving)
            assert facade.monitor.report.model == "a_decoder"
            assert "refusing zeros: model 'a_decoder': not an image" in facade.monitor.report.detail

    run(test)
