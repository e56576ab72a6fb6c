"""The facade across a version swap, without a server: the Predictor with a stand-in gateway that holds
model metadata the way TritonGateway does (until `forget`) while "Triton" behind it swaps versions.

The same swaps through a real tritonserver and facade are in tests/slow/test_model_versions.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.unit.fakes import V1, V2, SwappingGateway
from tritonnx.client.facade.cache import ResultCache
from tritonnx.client.facade.default_model import DefaultModel
from tritonnx.client.facade.errors import InvalidArgument
from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.predictor import Predictor
from tritonnx.client.facade.translate import ModelInfo
from tritonnx.client.facade.wire import decode_predict_request
from tritonnx.client.proto import inference_pb2


def request(**fields) -> bytes:
    data = np.arange(4, dtype="<f4")
    return inference_pb2.PredictRequest(
        model_name="m", shape=[1, 4], raw_data=data.tobytes(), **fields
    ).SerializeToString()


def predict(predictor: Predictor, body: bytes):
    return asyncio.run(predictor.run(decode_predict_request(body), 10.0))[1]


def test_a_swap_to_another_signature_is_followed_by_the_simple_contract_at_once():
    gateway = SwappingGateway()
    predictor = Predictor(gateway, DefaultModel(gateway, "m"))
    assert predict(predictor, request()).message.model_version == "1"
    gateway.serving = V2  # version 2 goes live; the facade still holds version 1's metadata
    # The facade names the input after the metadata it holds ('x'); Triton refuses it; the facade asks
    # Triton's metadata again and sends 'pixels'.
    answer = predict(predictor, request())
    assert answer.message.model_version == "2"
    assert answer.predictions.tolist() == [0.0, 3.0, 6.0, 9.0]  # version 2's own computation
    assert gateway.metadata_calls == 2


def test_a_request_for_the_new_signature_is_not_refused_by_old_metadata():
    gateway = SwappingGateway()
    predictor = Predictor(gateway, DefaultModel(gateway, "m"))
    predict(predictor, request())
    gateway.serving = V2
    named = inference_pb2.PredictRequest(model_name="m")
    named.inputs.add(name="pixels", dtype=inference_pb2.FP32, shape=[1, 4], raw_data=np.ones(4, "<f4").tobytes())
    answer = predict(predictor, named.SerializeToString())
    assert answer.message.model_version == "2"
    assert [(t.name, np.frombuffer(t.raw_data, "<f4").tolist()) for t in answer.message.outputs] == [
        ("scores", [3.0, 3.0, 3.0, 3.0])
    ]


def test_a_wrong_request_is_checked_again_at_most_once_a_second():
    gateway = SwappingGateway()
    predictor = Predictor(gateway, DefaultModel(gateway, "m"))
    wrong = inference_pb2.PredictRequest(model_name="m", shape=[1, 5], raw_data=np.ones(5, "<f4").tobytes())
    with pytest.raises(InvalidArgument, match="does not fit"):
        predict(predictor, wrong.SerializeToString())
    assert gateway.metadata_calls == 2  # the metadata held was old: asked again once
    gateway.fetched_long_ago = False
    with pytest.raises(InvalidArgument, match="does not fit"):
        predict(predictor, wrong.SerializeToString())
    assert gateway.metadata_calls == 2  # fetched within the second: not asked again


def test_an_answer_from_a_version_the_metadata_does_not_list_makes_the_next_request_ask_triton():
    gateway = SwappingGateway()
    gateway.serving = ModelInfo("m", "", V1.inputs, V1.outputs, 8, ("2",))  # the same signature, a new version
    gateway.held = V1  # held from before the swap: versions ('1',)
    predictor = Predictor(gateway, DefaultModel(gateway, "m"))
    assert predict(predictor, request()).message.model_version == "2"
    assert gateway.held is None  # forgotten: the next request learns version 2


def test_the_result_cache_answers_with_the_version_that_computed_it():
    gateway = SwappingGateway()
    cache = ResultCache(frozenset({"m"}), 1 << 20, FacadeMetrics())
    predictor = Predictor(gateway, DefaultModel(gateway, "m"), cache)
    first = predict(predictor, request())
    assert (first.message.model_version, first.predictions.tolist()) == ("1", [0.0, 2.0, 4.0, 6.0])
    gateway.serving = ModelInfo("m", "", V1.inputs, V1.outputs, 8, ("2",))
    # Until the metadata held is renewed, a hit may still answer version 1's result, and says so.
    hit = predict(predictor, request())
    assert (hit.message.model_version, hit.predictions.tolist()) == ("1", [0.0, 2.0, 4.0, 6.0])
    gateway.forget("m")
    fresh = predict(predictor, request())
    assert (fresh.message.model_version, fresh.predictions.tolist()) == ("2", [0.0, 3.0, 6.0, 9.0])
