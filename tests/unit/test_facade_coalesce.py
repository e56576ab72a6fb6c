"""Merging concurrent calls into one Triton request (client/facade/coalesce.py), against a stand-in
gateway that answers y = 2 * x row by row and holds requests until the test lets them go."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from client.facade.coalesce import Coalescer, MergedCall, lane_of
from client.facade.errors import DeadlineExceeded, InvalidArgument, Unavailable
from client.facade.translate import InferCall, ModelInfo, TensorInfo

DOUBLE = ModelInfo(
    "double", "", (TensorInfo("x", "FP32", (-1, 4)),), (TensorInfo("y", "FP32", (-1, 4)),), 4, ("1",), True, 1
)
TEST_SECONDS = 5.0


def call(rows: int = 1, seed: int = 0, priority: int = 0, timeout_us: int = 0, width: int = 4) -> InferCall:
    x = np.random.default_rng(seed).standard_normal((rows, width), dtype=np.float32)
    header = service_pb2.ModelInferRequest(model_name="double", id=f"r{seed}")
    header.inputs.add(name="x", datatype="FP32", shape=[rows, width])
    if priority:
        header.parameters["priority"].uint64_param = priority
    if timeout_us:
        header.parameters["timeout"].int64_param = timeout_us
    return InferCall(header, [memoryview(x.tobytes())])


def rows_of(call: InferCall) -> np.ndarray:
    return np.frombuffer(call.payloads[0], "<f4").reshape(call.rows, -1)


def answer_of(response: service_pb2.ModelInferResponse) -> np.ndarray:
    return np.frombuffer(response.raw_output_contents[0], "<f4").reshape(list(response.outputs[0].shape))


def parse(request) -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest.FromString(request.serialize())


class HeldGateway:
    """Answers y = 2 * x for each row; a request waits until `release` lets it go. Rows holding a
    NaN are 'refused by the model' (INVALID_ARGUMENT), like one bad request sinking a batch."""

    def __init__(self) -> None:
        self.sent: list[service_pb2.ModelInferRequest] = []
        self.timeouts: list[float | None] = []
        self.metadata: list[tuple] = []
        self.gate = asyncio.Event()
        self.fail_with: Exception | None = None

    def release(self) -> None:
        self.gate.set()

    async def infer(self, request, timeout, metadata=()):
        parsed = parse(request)
        self.sent.append(parsed)
        self.timeouts.append(timeout)
        self.metadata.append(metadata)
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        x = np.frombuffer(parsed.raw_input_contents[0], "<f4")
        if np.isnan(x).any():
            raise InvalidArgument("model 'double' rejected the request: NaN")
        response = service_pb2.ModelInferResponse(model_name="double", model_version="1", id=parsed.id)
        response.outputs.add(name="y", datatype="FP32", shape=list(parsed.inputs[0].shape))
        response.raw_output_contents.append((2 * x).astype("<f4").tobytes())
        return response


def run(test) -> None:
    asyncio.run(asyncio.wait_for(test(), TEST_SECONDS))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_what_may_be_merged_is_what_triton_would_batch():
    assert lane_of(DOUBLE, call()) is not None
    assert lane_of(DOUBLE, call(rows=2)) == lane_of(DOUBLE, call(rows=1, seed=3))  # rows may differ
    assert lane_of(DOUBLE, call(width=5)) != lane_of(DOUBLE, call())  # another shape: another lane
    assert lane_of(DOUBLE, call(priority=1)) != lane_of(DOUBLE, call())  # priorities never mix
    assert lane_of(DOUBLE, call(rows=4)) is None  # a full batch already
    no_batcher = ModelInfo("double", "", DOUBLE.inputs, DOUBLE.outputs, 4, ("1",), False, 1)
    assert lane_of(no_batcher, call()) is None  # the config has no dynamic_batching: Triton never batches it
    not_batching = ModelInfo("double", "", DOUBLE.inputs, DOUBLE.outputs, 0, ("1",), True, 1)
    assert lane_of(not_batching, call()) is None
    strings = ModelInfo("s", "", DOUBLE.inputs, (TensorInfo("y", "BYTES", (-1, 1)),), 4, ("1",), True, 1)
    assert lane_of(strings, call()) is None  # cannot be cut by rows
    classified = call()
    classified.header.outputs.add(name="y").parameters["classification"].int64_param = 3
    assert lane_of(DOUBLE, classified) is None


def test_a_merged_request_is_the_calls_rows_in_order_and_its_answer_is_cut_back():
    calls = [call(rows=1, seed=1, timeout_us=5_000), call(rows=2, seed=2, timeout_us=9_000)]
    merged = MergedCall(calls)
    request = parse(merged)
    assert list(request.inputs[0].shape) == [3, 4] and request.parameters["timeout"].int64_param == 9_000
    sent = np.frombuffer(request.raw_input_contents[0], "<f4").reshape(3, 4)
    np.testing.assert_array_equal(sent, np.concatenate([rows_of(c) for c in calls]))
    response = service_pb2.ModelInferResponse(model_name="double", model_version="1")
    response.outputs.add(name="y", datatype="FP32", shape=[3, 4])
    response.raw_output_contents.append((2 * sent).tobytes())
    answers = merged.split(response)
    for answer, one in zip(answers, calls, strict=True):
        np.testing.assert_array_equal(answer_of(answer), 2 * rows_of(one))
        assert (answer.id, answer.model_version) == (one.header.id, "1")
    response.outputs[0].shape[0] = 1  # an output that is not one row per input row cannot be cut
    assert merged.split(response) is None
    assert "timeout" not in parse(MergedCall([call(timeout_us=5), call()])).parameters  # one call waits unbounded


def test_calls_that_find_triton_busy_go_together_and_each_gets_its_own_rows():
    async def test() -> None:
        gateway = HeldGateway()
        coalescer = Coalescer(gateway, depth=lambda info: 1)
        calls = [call(seed=i) for i in range(4)]
        first = asyncio.ensure_future(coalescer.infer(DOUBLE, calls[0], 5.0))
        await settle()
        rest = [asyncio.ensure_future(coalescer.infer(DOUBLE, c, 5.0)) for c in calls[1:]]
        await settle()
        assert [list(r.inputs[0].shape) for r in gateway.sent] == [[1, 4]]  # the others wait for it
        gateway.release()
        answers = await asyncio.gather(first, *rest)
        assert [list(r.inputs[0].shape) for r in gateway.sent] == [[1, 4], [3, 4]]
        for answer, one in zip(answers, calls, strict=True):
            np.testing.assert_array_equal(answer_of(answer), 2 * rows_of(one))
            assert answer.id == one.header.id

    run(test)


def test_a_lone_call_never_waits():
    async def test() -> None:
        gateway = HeldGateway()
        gateway.release()
        coalescer = Coalescer(gateway, depth=lambda info: 1)
        for seed in range(3):
            await coalescer.infer(DOUBLE, call(seed=seed), 5.0)
        assert [list(r.inputs[0].shape) for r in gateway.sent] == [[1, 4]] * 3

    run(test)


def test_a_batch_holds_at_most_max_batch_size_rows():
    async def test() -> None:
        gateway = HeldGateway()
        sizes: list[int] = []
        coalescer = Coalescer(gateway, depth=lambda info: 1, on_request=sizes.append)
        first = asyncio.ensure_future(coalescer.infer(DOUBLE, call(), 5.0))
        await settle()
        rest = [
            asyncio.ensure_future(coalescer.infer(DOUBLE, call(rows=r, seed=i), 5.0))
            for i, r in enumerate((2, 1, 3, 1))
        ]
        await settle()
        gateway.release()
        await asyncio.gather(first, *rest)
        assert [r.inputs[0].shape[0] for r in gateway.sent] == [1, 3, 4]  # 2+1, then 3+1: never above 4
        assert sizes == [1, 2, 2]

    run(test)


def test_a_bad_call_in_a_merged_request_fails_alone():
    async def test() -> None:
        gateway = HeldGateway()
        coalescer = Coalescer(gateway, depth=lambda info: 1)
        first = asyncio.ensure_future(coalescer.infer(DOUBLE, call(seed=9), 5.0))
        await settle()
        calls = [call(seed=i) for i in range(3)]
        calls[1].payloads[0] = memoryview(np.full((1, 4), np.nan, "<f4").tobytes())  # the call the model refuses
        rest = [asyncio.ensure_future(coalescer.infer(DOUBLE, c, 5.0)) for c in calls]
        await settle()
        gateway.release()
        await first
        outcomes = await asyncio.gather(*rest, return_exceptions=True)
        assert isinstance(outcomes[1], InvalidArgument)
        np.testing.assert_array_equal(answer_of(outcomes[0]), 2 * rows_of(calls[0]))
        np.testing.assert_array_equal(answer_of(outcomes[2]), 2 * rows_of(calls[2]))
        # The merged request, then each of its calls on its own.
        assert [r.inputs[0].shape[0] for r in gateway.sent] == [1, 3, 1, 1, 1]

    run(test)


@pytest.mark.parametrize("refusal", [Unavailable("queue full"), DeadlineExceeded("late")])
def test_a_refusal_of_the_server_is_every_merged_calls_answer(refusal):
    async def test() -> None:
        gateway = HeldGateway()
        coalescer = Coalescer(gateway, depth=lambda info: 1)
        first = asyncio.ensure_future(coalescer.infer(DOUBLE, call(), 5.0))
        await settle()
        rest = [asyncio.ensure_future(coalescer.infer(DOUBLE, call(seed=i), 5.0)) for i in range(3)]
        await settle()
        gateway.fail_with = refusal
        gateway.release()
        outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
        assert all(outcome is refusal for outcome in outcomes)
        assert len(gateway.sent) == 2  # sent once, not call by call
        assert refusal.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    run(test)


def test_a_call_whose_deadline_passes_while_it_waits_fails_and_is_never_sent():
    async def test() -> None:
        gateway = HeldGateway()
        coalescer = Coalescer(gateway, depth=lambda info: 1)
        first = asyncio.ensure_future(coalescer.infer(DOUBLE, call(), 5.0))
        await settle()
        with pytest.raises(DeadlineExceeded):
            await coalescer.infer(DOUBLE, call(seed=1), 0.05)
        cancelled = asyncio.ensure_future(coalescer.infer(DOUBLE, call(seed=2), 5.0))
        await settle()
        cancelled.cancel()
        kept = asyncio.ensure_future(coalescer.infer(DOUBLE, call(seed=3), 5.0))
        await settle()
        gateway.release()
        await first
        np.testing.assert_array_equal(answer_of(await kept), 2 * rows_of(call(seed=3)))
        assert [r.id for r in gateway.sent] == ["r0", "r3"]  # the late and the cancelled calls stayed out

    run(test)


def test_the_merged_request_waits_as_long_as_its_most_patient_call_and_carries_a_trace_context():
    async def test() -> None:
        gateway = HeldGateway()
        coalescer = Coalescer(gateway, depth=lambda info: 1)
        first = asyncio.ensure_future(coalescer.infer(DOUBLE, call(), 5.0))
        await settle()
        traced = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
        rest = [
            asyncio.ensure_future(coalescer.infer(DOUBLE, call(seed=1), 1.0)),
            asyncio.ensure_future(coalescer.infer(DOUBLE, call(seed=2), 3.0, traced)),
        ]
        await settle()
        gateway.release()
        await asyncio.gather(first, *rest)
        assert 2.9 < gateway.timeouts[1] <= 3.0 and gateway.metadata[1] == traced

    run(test)


def test_a_lane_is_forgotten_once_its_calls_are_answered():
    """Lanes follow the shapes callers send (a text model's lengths): idle ones must not pile up."""

    async def test() -> None:
        gateway = HeldGateway()
        coalescer = Coalescer(gateway, depth=lambda info: 1)
        widths = (4, 5, 6)
        first = [asyncio.ensure_future(coalescer.infer(DOUBLE, call(width=w), 5.0)) for w in widths]
        await settle()
        merged = [asyncio.ensure_future(coalescer.infer(DOUBLE, call(seed=s, width=4), 5.0)) for s in (1, 2)]
        await settle()
        assert len(coalescer._lanes) == len(widths)  # busy lanes, one waiting two calls
        gateway.release()
        for future, width in zip(first, widths, strict=True):
            assert answer_of(await future).shape == (1, width)
        await asyncio.gather(*merged)
        await settle()
        assert coalescer._lanes == {}
        assert len(gateway.sent) == len(widths) + 1  # the two waiting calls went as one request

    run(test)
