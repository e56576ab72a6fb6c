"""Triton 2.51's response cache mixes up requests whose bytes match and whose shapes differ; the
facade's result cache does not.

A model that transposes, served with `response_cache { enable: true }` on a tritonserver with a
local cache: the same six floats sent as [2, 3], [3, 2] and [6, 1]. Triton answers the second
and third from the first's cache entry, with the first's shape and values. Through the facade with
`--cache-models transpose` (Triton's cache off), each gets its own, right answer, and a repeat is
a byte-identical hit.
"""

from __future__ import annotations

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from tests.helpers import metrics
from tests.kserve import make_inputs
from tritonnx.client.proto import inference_pb2
from tritonnx.server.repository import add_model
from tritonnx.server.stack import ServingStack
from tritonnx.server.triton import TritonInstall

SHAPES = ([2, 3], [3, 2], [6, 1])
DATA = np.arange(6, dtype=np.float32)
CONFIG = 'backend: "python"\nmax_batch_size: 0\ninstance_group [ { kind: KIND_CPU, count: 1 } ]\n'


def transpose_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"])],
        "transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "a"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("response-cache")
    repository = workdir / "repository"
    for name, config in (
        ("transpose", CONFIG),
        ("transpose_triton_cache", CONFIG + "response_cache { enable: true }\n"),
    ):
        onnx.save(transpose_model(), add_model(repository, name, config) / "model.onnx")
    caches = TritonInstall.find().binary.parent.parent / "caches"  # the wheel's local cache
    with ServingStack(
        repository,
        workdir,
        triton_args=["--cache-config=local,size=1048576", f"--cache-directory={caches}"],
        # Health probes go to the other model, so the facade's cache counts only this test's calls.
        facade_args=["--default-model", "transpose_triton_cache", "--cache-models", "transpose"],
    ) as serving:
        yield serving


def test_tritons_response_cache_answers_another_shape_of_the_same_bytes_with_the_first_ones_result(stack):
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        answers = [client.infer("transpose_triton_cache", make_inputs({"x": DATA.reshape(s)})).as_numpy("y")
                   for s in SHAPES]  # fmt: skip
        hits = client.get_inference_statistics("transpose_triton_cache").model_stats[0].inference_stats.cache_hit
    assert np.array_equal(answers[0], DATA.reshape(2, 3).T)
    # Triton 2.51: the [3, 2] and [6, 1] requests are cache hits of the [2, 3] one, so they get
    # its [3, 2] answer instead of their own [2, 3] and [1, 6] transposes.
    assert hits.count == 2
    assert [a.shape for a in answers] == [(3, 2), (3, 2), (3, 2)]
    assert not np.array_equal(answers[1], DATA.reshape(3, 2).T)


def test_the_facades_cache_gives_each_shape_its_own_answer_and_repeats_byte_identically(stack):
    with grpc.insecure_channel(stack.facade.grpc_url) as channel:
        predict = channel.unary_unary("/inference.InferenceService/Predict")
        requests = [
            inference_pb2.PredictRequest(
                raw_data=DATA.tobytes(), shape=s, request_id="r", model_name="transpose"
            ).SerializeToString()
            for s in SHAPES
        ]
        computed = [predict(body, timeout=30) for body in requests]
        repeated = [predict(body, timeout=30) for body in requests]
    assert repeated == computed  # hits are byte-identical to the computed answers
    for shape, body in zip(SHAPES, computed, strict=True):
        answer = inference_pb2.PredictResponse.FromString(body)
        expected = DATA.reshape(shape).T
        assert list(answer.shape) == list(expected.shape)
        assert np.array_equal(np.array(answer.predictions, np.float32), expected.ravel())
    page = metrics(stack.facade.http_url)
    assert page.value("tritonnx_facade_cache_requests_total", model="transpose", result="miss") == 3
    assert page.value("tritonnx_facade_cache_requests_total", model="transpose", result="hit") == 3
