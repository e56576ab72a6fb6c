"""The facade's result cache: a key that covers everything deciding an answer, and an LRU by bytes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tritonnx.client.facade.cache import ResultCache, cache_key
from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.translate import InferCall, ModelInfo, TensorInfo

INFO = ModelInfo("m", "", (TensorInfo("x", "FP32", (-1, -1)),), (TensorInfo("y", "FP32", (-1, -1)),), 0, ("1",))


def call(shape=(2, 3), datatype="FP32", name="x", payload=None, version="", outputs=("y",), class_count=0) -> InferCall:
    header = service_pb2.ModelInferRequest(model_name="m", model_version=version, id="request-1")
    header.inputs.add(name=name, datatype=datatype, shape=list(shape))
    for output in outputs:
        requested = header.outputs.add(name=output)
        if class_count:
            requested.parameters["classification"].int64_param = class_count
    data = np.arange(6, dtype=np.float32).tobytes() if payload is None else payload
    return InferCall(header, [memoryview(data)])


def response(size: int) -> service_pb2.ModelInferResponse:
    return service_pb2.ModelInferResponse(model_name="m", raw_output_contents=[b"\0" * size])


def test_the_key_changes_with_each_thing_that_decides_the_answer():
    base = cache_key(INFO, call())
    changed = {
        "shape": cache_key(INFO, call(shape=(3, 2))),
        "datatype": cache_key(INFO, call(datatype="INT32")),
        "input name": cache_key(INFO, call(name="z")),
        "bytes": cache_key(INFO, call(payload=np.ones(6, np.float32).tobytes())),
        "version asked for": cache_key(INFO, call(version="1")),
        "versions served": cache_key(replace(INFO, versions=("1", "2")), call()),
        "model": cache_key(replace(INFO, name="n"), call()),
        "outputs asked for": cache_key(INFO, call(outputs=())),
        "output parameters": cache_key(INFO, call(class_count=3)),
    }
    assert all(key != base for key in changed.values()), [n for n, k in changed.items() if k == base]
    assert len(set(changed.values())) == len(changed)


def test_the_key_ignores_what_does_not_change_the_answer():
    first, second = call(), call()
    second.header.id = "another-request"
    second.header.parameters["priority"].uint64_param = 1
    second.header.parameters["timeout"].int64_param = 5000
    assert cache_key(INFO, first) == cache_key(INFO, second)


def test_least_recently_used_results_go_first_within_the_byte_bound():
    metrics = FacadeMetrics()
    keys = [bytes([i]) * 32 for i in range(3)]
    entry = response(1000).ByteSize() + 32
    cache = ResultCache(frozenset({"m"}), max_bytes=2 * entry, metrics=metrics)
    cache.put(keys[0], response(1000))
    cache.put(keys[1], response(1000))
    assert cache.get("m", keys[0]) is not None  # 0 is now the most recently used
    cache.put(keys[2], response(1000))
    assert cache.get("m", keys[1]) is None and cache.get("m", keys[0]) is not None and len(cache) == 2
    assert cache.bytes == 2 * entry <= cache.max_bytes
    sample = metrics.registry.get_sample_value
    assert sample("tritonnx_facade_cache_evictions_total") == 1
    assert sample("tritonnx_facade_cache_requests_total", {"model": "m", "result": "hit"}) == 2
    assert sample("tritonnx_facade_cache_requests_total", {"model": "m", "result": "miss"}) == 1
    assert sample("tritonnx_facade_cache_bytes") == cache.bytes


def test_a_result_larger_than_the_whole_cache_is_not_kept():
    cache = ResultCache(frozenset({"m"}), max_bytes=100, metrics=FacadeMetrics())
    cache.put(b"k" * 32, response(1000))
    assert len(cache) == 0 and cache.bytes == 0


@pytest.mark.parametrize("models, enabled", [("", False), ("m", True), ("other", False)])
def test_only_the_models_named_are_cached(models, enabled):
    cache = ResultCache(frozenset(filter(None, models.split(","))), 1 << 20, FacadeMetrics())
    assert cache.enabled_for("m") is enabled
