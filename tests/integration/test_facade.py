"""The gRPC facade in front of the real tritonserver: contract, translation, errors, limits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers import metrics, wait_until
from tests.kserve import assert_close, infer, reference_session
from tests.netfaults.stack import facade_regions as facade_regions_in_dev_shm
from tests.serving import (
    CHECKOUT,
    FACADE_MAX_IN_FLIGHT,
    SERVED_MODELS,
    onnx_file,
    start_facade,
)
from tritonnx.client.facade.shm import region_prefix
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.server.prometheus import scrape

IMAGE_SHAPE = [1, 3, 224, 224]
PROTO_DIR = CHECKOUT / "client" / "proto"


@pytest.fixture(scope="module")
def stub(facade):
    channel = grpc.insecure_channel(facade.grpc_url, options=[("grpc.max_send_message_length", 64 << 20)])
    yield inference_pb2_grpc.InferenceServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def triton_client(triton):
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        yield client


def image(seed: int, batch: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 224, 224), dtype=np.float32)


def call_error(call, request, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, **kwargs)
    return caught.value


SNIPPET = """
import grpc
import inference_pb2
import inference_pb2_grpc

stub = inference_pb2_grpc.InferenceServiceStub(grpc.insecure_channel("localhost:PORT"))
res = stub.Predict(inference_pb2.PredictRequest(data=[0.0] * (1*3*224*224), shape=[1,3,224,224]))
print(res.shape, res.predictions[:10])   # [1, 1000] and the first 10 scores of resnet50
"""


def test_the_documented_client_snippet_works_unchanged(facade, triton_client, tmp_path):
    # A client of its own, with stubs generated from the proto file as the snippet's comment says.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(PROTO_DIR),
            "--python_out=.",
            "--grpc_python_out=.",
            str(PROTO_DIR / "inference.proto"),
        ],
        check=True,
        cwd=tmp_path,
    )
    (tmp_path / "snippet.py").write_text(SNIPPET.replace("PORT", str(facade.grpc_port)))
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    shape_text, predictions_text = done.stdout.strip().split("] [")
    assert shape_text == "[1, 1000"
    printed = np.array([float(v) for v in predictions_text.rstrip("]").split(",")], np.float32)
    direct = infer(triton_client, "resnet50", {"input": np.zeros(IMAGE_SHAPE, np.float32)}, ["output"])
    assert_close(printed, direct.outputs["output"][0, :10])


@pytest.mark.parametrize("model", ["resnet50", "mobilenet_v3_small"])
def test_float_and_raw_requests_equal_direct_triton(stub, triton_client, model):
    data = image(seed=21, batch=2)
    direct = infer(triton_client, model, {"input": data}, ["output"]).outputs["output"]
    floats = stub.Predict(inference_pb2.PredictRequest(data=data.ravel(), shape=data.shape, model_name=model))
    raw = stub.Predict(
        inference_pb2.PredictRequest(
            raw_data=data.tobytes(), dtype=inference_pb2.FP32, shape=data.shape, model_name=model
        )
    )
    for response in (floats, raw):
        assert list(response.shape) == [2, 1000] and response.model_name == model
        np.testing.assert_array_equal(np.array(response.predictions, np.float32).reshape(2, 1000), direct)
    assert np.frombuffer(raw.outputs[0].raw_data, np.float32).reshape(2, 1000).tolist() == direct.tolist()


def test_named_inputs_and_outputs_for_the_text_classifier(stub, triton_client):
    ids = np.random.default_rng(5).integers(1, 1000, size=(1, 11), dtype=np.int64)
    mask = np.ones_like(ids)
    response = stub.Predict(
        inference_pb2.PredictRequest(
            model_name="text_classifier",
            request_id="txt-1",
            inputs=[
                inference_pb2.Tensor(name=n, dtype=inference_pb2.INT64, shape=list(a.shape), raw_data=a.tobytes())
                for n, a in (("input_ids", ids), ("attention_mask", mask))
            ],
        )
    )
    direct = infer(
        triton_client, "text_classifier", {"input_ids": ids, "attention_mask": mask}, ["logits", "embedding"]
    )
    assert response.request_id == "txt-1" and list(response.shape) == [1, 2]
    outputs = {t.name: np.frombuffer(t.raw_data, np.float32).reshape(t.shape) for t in response.outputs}
    np.testing.assert_array_equal(outputs["logits"], direct.outputs["logits"])
    np.testing.assert_array_equal(outputs["embedding"], direct.outputs["embedding"])
    np.testing.assert_array_equal(np.array(response.predictions, np.float32), direct.outputs["logits"].ravel())


def zeros(shape, **fields) -> inference_pb2.PredictRequest:
    return inference_pb2.PredictRequest(data=np.zeros(int(np.prod(shape)), np.float32), shape=shape, **fields)


def test_a_flood_above_the_cap_gets_resource_exhausted_and_everything_else_is_right(facade, stub):
    # resnet50: slow enough that accepted calls hold their slots while the flood arrives.
    model, count = "resnet50", 6 * FACADE_MAX_IN_FLIGHT
    data = image(seed=9, batch=count)
    refusals = ("tritonnx_facade_rejections_total", "tritonnx_facade_rejection_duration_seconds_count")
    reasons = ("overloaded", "priority_reserve")  # at the call's start; once the body showed a default priority
    before = metrics(facade.http_url)
    futures = [
        stub.Predict.future(
            inference_pb2.PredictRequest(
                raw_data=data[index].tobytes(), shape=IMAGE_SHAPE, model_name=model, request_id=str(index)
            )
        )
        for index in range(count)
    ]
    outcomes = []
    for future in futures:
        try:
            outcomes.append(("OK", future.result(timeout=60)))
        except grpc.RpcError as error:
            outcomes.append((error.code().name, error))

    rejected = [o for o in outcomes if o[0] != "OK"]
    accepted = [(i, o) for i, o in enumerate(outcomes) if o[0] == "OK"]
    assert rejected and len(accepted) >= FACADE_MAX_IN_FLIGHT - FACADE_MAX_IN_FLIGHT // 4  # the rest: high priority
    assert {o[0] for o in rejected} == {"RESOURCE_EXHAUSTED"}
    for _, error in rejected:
        assert dict(error.trailing_metadata()).get("grpc-retry-pushback-ms") == "100"
    expected = reference_session(onnx_file(model)).run(["output"], {"input": data})[0]
    for index, (_, response) in accepted:
        assert response.request_id == str(index)
        assert_close(np.array(response.predictions, np.float32), expected[index])
    # Refused by the facade's own cap (counted and timed from the call's start, every slot given back), not by Triton.
    page = metrics(facade.http_url)
    for name in refusals:
        assert sum(page.value(name, reason=r) - before.value(name, reason=r) for r in reasons) == len(rejected)
    assert page.value("tritonnx_facade_in_flight_requests") == 0


def in_flight(facade) -> float:
    """The calls the facade holds (its in-flight gauge)."""
    return metrics(facade.http_url).value("tritonnx_facade_in_flight_requests")


def answered(facade, code: str) -> float:
    """The calls the facade answered with `code`, of every model (one that ended before its body arrived names
    none)."""
    return metrics(facade.http_url).value("tritonnx_facade_requests_total", code=code)


def ended(facade) -> float:
    """The calls that ended at their caller's deadline: DEADLINE_EXCEEDED when the facade's own deadline for
    Triton fired first, CANCELLED when gRPC's cancellation of the call did."""
    return answered(facade, "DEADLINE_EXCEEDED") + answered(facade, "CANCELLED")


def busy_triton(triton, facade, stub, batches: int = 4) -> list:
    """Keep both resnet50 instances busy with full batches (about a second each) so that new
    requests queue behind them; returns once one of them waits in Triton's queue."""
    batch = image(seed=2, batch=16).tobytes()
    load = [
        stub.Predict.future(inference_pb2.PredictRequest(raw_data=batch, shape=[16, 3, 224, 224]))
        for _ in range(batches)
    ]
    # A request queued in Triton: both instances are busy (10 MB each through the facade first).
    wait_until(
        lambda: scrape(triton.metrics_url).value("nv_inference_pending_request_count", model="resnet50") >= 1,
        60,
        "the load queued in Triton",
    )
    return load


def test_the_callers_deadline_ends_the_call_and_frees_its_slot(triton, facade, stub):
    load = busy_triton(triton, facade, stub)
    ended_before = ended(facade)
    error = call_error(stub.Predict, zeros(IMAGE_SHAPE), timeout=0.3)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Counted once its slot is given back, while the load still holds Triton.
    wait_until(lambda: ended(facade) > ended_before, 10, "the expired call let go")
    for future in load:
        assert list(future.result(timeout=120).shape) == [16, 1000]
    wait_until(lambda: in_flight(facade) == 0, 10, "every slot freed")


def test_a_cancelled_call_frees_its_slot(triton, facade, stub):
    load = busy_triton(triton, facade, stub)
    cancelled_before = answered(facade, "CANCELLED")
    future = stub.Predict.future(zeros(IMAGE_SHAPE))
    # Cancelled only once the facade holds it: a call cancelled on its way in never reaches the servicer.
    wait_until(lambda: in_flight(facade) >= len(load) + 1, 10, "the call reaching the facade")
    assert future.cancel()
    wait_until(lambda: answered(facade, "CANCELLED") > cancelled_before, 10, "the cancelled call let go")
    for call in load:
        call.result(timeout=120)
    wait_until(lambda: in_flight(facade) == 0, 10, "every slot freed")


def test_streaming_answers_every_request_by_id_and_survives_bad_ones(stub):
    # Six requests at once: within the facade's share for default-priority requests (3/4 of 8).
    data = image(seed=4, batch=5)
    requests = [
        inference_pb2.PredictRequest(
            raw_data=data[i].tobytes(), shape=IMAGE_SHAPE, request_id=f"s{i}", model_name="mobilenet_v3_small"
        )
        for i in range(5)
    ]
    requests.insert(
        3,
        inference_pb2.PredictRequest(
            data=[1.0] * 5, shape=IMAGE_SHAPE, request_id="bad", model_name="mobilenet_v3_small"
        ),
    )
    responses = {r.request_id: r for r in stub.PredictStream(iter(requests), timeout=60)}
    assert set(responses) == {f"s{i}" for i in range(5)} | {"bad"}
    assert responses["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "carries 5 values" in responses["bad"].error.message
    expected = reference_session(onnx_file("mobilenet_v3_small")).run(["output"], {"input": data})[0]
    for i in range(5):
        assert not responses[f"s{i}"].HasField("error")
        assert_close(np.array(responses[f"s{i}"].predictions, np.float32), expected[i])


def test_health_reflection_and_metrics(facade, stub):
    channel = grpc.insecure_channel(facade.grpc_url)
    health = health_pb2_grpc.HealthStub(channel)

    def serving(service: str) -> bool:
        return (
            health.Check(health_pb2.HealthCheckRequest(service=service)).status
            == health_pb2.HealthCheckResponse.SERVING
        )

    # The probe is a real inference of the default model: right after a flood of earlier tests it may have met a
    # full queue, and it says SERVING again at its next success.
    for service in ("", "inference.InferenceService"):
        wait_until(lambda service=service: serving(service), 60, f"health of '{service}' SERVING")
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    answer = next(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    services = {s.name for s in answer.list_services_response.service}
    assert {"inference.InferenceService", "grpc.health.v1.Health"} <= services
    channel.close()

    status, body = facade.health()
    assert status == 200 and body["status"] == "SERVING" and body["model"] == "resnet50"
    stub.Predict(zeros(IMAGE_SHAPE, model_name="mobilenet_v3_small"))
    page = metrics(facade.http_url)
    assert page.value("tritonnx_facade_requests_total", model="mobilenet_v3_small", code="OK") >= 1
    assert page.value("tritonnx_facade_request_duration_seconds_count", model="mobilenet_v3_small") >= 1
    assert page.value("tritonnx_facade_request_payload_bytes_sum", model="mobilenet_v3_small") >= 602112


def facade_regions(triton_client, triton, facade) -> list[str]:
    regions = triton_client.get_system_shared_memory_status(headers=triton.admin_headers, as_json=True).get(
        "regions", {}
    )
    return [name for name in regions if name.startswith(region_prefix(facade.process.pid))]


def test_inputs_travel_through_shared_memory_and_a_lost_region_comes_back(facade, stub, triton, triton_client):
    assert len(facade_regions(triton_client, triton, facade)) == 1
    # As after a Triton restart: the region is gone from Triton, the facade does not know yet. Triton keeps it
    # while requests of earlier tests that read it are still queued.
    region = facade_regions(triton_client, triton, facade)[0]

    def unregistered() -> bool:
        try:
            triton_client.unregister_system_shared_memory(region, headers=triton.admin_headers)
        except InferenceServerException as error:
            if "currently in use" not in str(error):
                raise
            return False
        return True

    wait_until(unregistered, 60, "the facade's region unregistered")
    data = image(seed=12)
    outcomes = []
    for _ in range(5):
        try:
            outcomes.append(
                stub.Predict(
                    inference_pb2.PredictRequest(
                        raw_data=data.tobytes(), shape=IMAGE_SHAPE, model_name="mobilenet_v3_small"
                    )
                )
            )
        except grpc.RpcError as error:
            outcomes.append(error)
    failures = [o for o in outcomes if isinstance(o, grpc.RpcError)]
    assert len(failures) <= 1  # at most the call that found the region gone (or the health probe did)
    for error in failures:
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "restarted" in error.details()
        assert "tritonnx_facade" not in error.details() and "shared memory" not in error.details()
    assert isinstance(outcomes[-1], inference_pb2.PredictResponse)
    expected = reference_session(onnx_file("mobilenet_v3_small")).run(["output"], {"input": data})[0]
    assert_close(np.array(outcomes[-1].predictions, np.float32), expected[0])
    assert len(facade_regions(triton_client, triton, facade)) == 1
    wait_until(lambda: facade.health()[0] == 200, 10, "the facade healthy again")


def test_a_second_facade_on_a_taken_port_refuses_to_start(facade):
    refused = subprocess.Popen(
        [sys.executable, "-m", "tritonnx.client.facade", "--port", str(facade.grpc_port), "--http-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert f"cannot listen on 127.0.0.1:{facade.grpc_port}" in stderr
    assert not facade_regions_in_dev_shm(refused.pid), "the refused facade left its shared memory"


def test_sigterm_turns_health_off_and_drains_in_flight_calls(triton, tmp_path):
    own = start_facade(triton, tmp_path, "--drain-seconds", "30")
    channel = grpc.insecure_channel(own.grpc_url)
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    batch = image(seed=3, batch=16)
    # timeout_ms overrides resnet50's 10 s queue timeout: on a busy machine the third batch may wait longer than that.
    request = inference_pb2.PredictRequest(raw_data=batch.tobytes(), shape=batch.shape, timeout_ms=120_000)
    calls = [stub.Predict.future(request) for _ in range(3)]
    # Calls still on their way in when it stops would be refused.
    wait_until(lambda: in_flight(own) >= len(calls), 10, "the calls reaching the facade")
    os.kill(own.process.pid, signal.SIGTERM)
    # Health goes off while the calls are still running.
    wait_until(lambda: _health_code(own) != 200, 10, "health off after SIGTERM")
    assert not all(call.done() for call in calls), "the calls ended before health went off: nothing was drained"
    for call in calls:
        assert list(call.result(timeout=120).shape) == [16, 1000]
    assert own.process.wait(timeout=60) == 0
    channel.close()


def _health_code(facade) -> int | None:
    try:
        return facade.health()[0]
    except OSError:
        return None


def test_list_models_shows_every_demo_model_as_triton_describes_it(stub, triton_client):
    listed = stub.ListModels(inference_pb2.ListModelsRequest(), timeout=30)
    by_name = {m.name: m for m in listed.models}
    assert set(SERVED_MODELS) <= set(by_name)
    for name in SERVED_MODELS:
        entry = by_name[name]
        assert (entry.version, entry.state) == ("1", "READY"), entry
        metadata = triton_client.get_model_metadata(name)
        assert [(t.name, t.datatype, list(t.shape)) for t in entry.inputs] == [
            (t.name, t.datatype, list(t.shape)) for t in metadata.inputs
        ]
        assert [(t.name, t.datatype, list(t.shape)) for t in entry.outputs] == [
            (t.name, t.datatype, list(t.shape)) for t in metadata.outputs
        ]
        assert entry.max_batch_size == triton_client.get_model_config(name).config.max_batch_size


def test_a_facade_killed_by_sigkill_leaves_nothing_once_another_starts(triton, triton_client, tmp_path):
    """A crashed facade cannot unlink its region nor unregister it from Triton: the next facade does both, and
    sends its inputs through a region of its own (in a container it often gets the crashed one's process id)."""
    data = image(seed=21)
    request = inference_pb2.PredictRequest(raw_data=data.tobytes(), shape=IMAGE_SHAPE, model_name="mobilenet_v3_small")

    def predict(facade) -> None:
        with grpc.insecure_channel(facade.grpc_url) as channel:
            response = inference_pb2_grpc.InferenceServiceStub(channel).Predict(request, timeout=60)
        assert list(response.shape) == [1, 1000]

    (tmp_path / "crashed").mkdir()
    (tmp_path / "restarted").mkdir()
    crashed = start_facade(triton, tmp_path / "crashed")
    predict(crashed)  # its region is registered with Triton by its first call
    (left,) = facade_regions(triton_client, triton, crashed)
    crashed.process.send_signal(signal.SIGKILL)
    crashed.process.wait(30)
    assert os.path.exists(f"/dev/shm/{left}")  # what a SIGKILL leaves behind

    restarted = start_facade(triton, tmp_path / "restarted")
    try:
        predict(restarted)
        assert not os.path.exists(f"/dev/shm/{left}")
        registered = triton_client.get_system_shared_memory_status(headers=triton.admin_headers, as_json=True)
        assert left not in registered.get("regions", {})
        (ours,) = facade_regions(triton_client, triton, restarted)
        assert os.path.exists(f"/dev/shm/{ours}")
        page = metrics(restarted.http_url)
        assert page.value("tritonnx_facade_shm_slots_in_use") == 0
    finally:
        restarted.stop()
