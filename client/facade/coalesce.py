"""Concurrent Predict calls that Triton would batch reach it as one request.

Triton and its Python backend pay a cost per request, not per image: the gRPC call on both ends,
the scheduler's hand-offs, the stub's round trip. When callers keep many calls in flight, the
facade hands several over at once. Per lane (a model and the version asked, the priority, the
inputs' names, datatypes and shapes after the batch dim, the outputs asked for), at most `depth`
requests are at Triton at a time; a call that finds them all busy waits in its lane, and as soon
as one returns, the calls waiting there go together as one request of up to max_batch_size rows.
A call that finds a request free goes at once: a lone call never waits.

Only what Triton's own dynamic batcher would put in one batch is merged: models that batch and
have dynamic_batching in their config, calls of the same shape. A merged request that Triton
refuses for a reason of the request (INVALID_ARGUMENT, a model failure) is sent again call by call,
so a bad call fails alone; a refusal of the server (its queue is full, it is unreachable) or the
deadline applies to every call in it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2

from client.facade.errors import DeadlineExceeded, FacadeError
from client.facade.translate import InferCall, ModelInfo, serialize_request
from client.facade.triton import TritonGateway

# What a whole merged request shares: the server's refusal or the deadline, not the request's fault.
_SHARED_FAILURES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.NOT_FOUND,
)


def lane_of(info: ModelInfo, call: InferCall) -> Hashable | None:
    """The lane of a call, or None when it goes to Triton as it is."""
    header = call.header
    if not (info.max_batch_size > 1 and info.dynamic_batching and header.inputs):
        return None
    rows = header.inputs[0].shape[0]
    if rows >= info.max_batch_size or any(t.shape[0] != rows or t.datatype == "BYTES" for t in header.inputs):
        return None
    asked = {o.name for o in header.outputs} or {t.name for t in info.outputs}
    if any(o.parameters for o in header.outputs) or any(t.datatype == "BYTES" for t in info.outputs if t.name in asked):
        return None  # Triton's classification and strings cannot be cut by rows
    return (
        header.model_name,
        header.model_version,
        header.parameters["priority"].uint64_param if "priority" in header.parameters else 0,
        tuple((t.name, t.datatype, tuple(t.shape[1:])) for t in header.inputs),
        tuple(o.name for o in header.outputs),
    )


@dataclass
class MergedCall:
    """Several calls of one lane as one Triton request: their rows one after the other."""

    calls: Sequence[InferCall]
    header: service_pb2.ModelInferRequest = field(init=False)

    def __post_init__(self) -> None:
        first = self.calls[0].header
        self.header = service_pb2.ModelInferRequest(model_name=first.model_name, model_version=first.model_version)
        rows = sum(call.rows for call in self.calls)
        for tensor in first.inputs:
            self.header.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=[rows, *tensor.shape[1:]])
        self.header.outputs.extend(first.outputs)
        if "priority" in first.parameters:
            self.header.parameters["priority"].CopyFrom(first.parameters["priority"])
        timeouts = [call.timeout_us for call in self.calls if call.timeout_us]
        if len(timeouts) == len(self.calls):  # a call without a timeout waits as long as Triton lets it
            self.header.parameters["timeout"].int64_param = max(timeouts)

    @property
    def sizes(self) -> list[int]:
        return [sum(call.sizes[i] for call in self.calls) for i in range(len(self.header.inputs))]

    def pieces(self, index: int) -> list[memoryview]:
        return [piece for call in self.calls for piece in call.pieces(index)]

    def serialize(self) -> bytes:
        return serialize_request(self)

    def split(self, response: service_pb2.ModelInferResponse) -> list[service_pb2.ModelInferResponse] | None:
        """Each call's rows of the merged answer; None when an output is not one row per input row."""
        rows = [call.rows for call in self.calls]
        total = sum(rows)
        cuts = []
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            if not output.shape or output.shape[0] != total or len(raw) % total:
                return None
            cuts.append(len(raw) // total)
        answers = []
        start = 0
        for call, count in zip(self.calls, rows, strict=True):
            answer = service_pb2.ModelInferResponse(
                model_name=response.model_name, model_version=response.model_version, id=call.header.id
            )
            for output, raw, row_bytes in zip(response.outputs, response.raw_output_contents, cuts, strict=True):
                answer.outputs.add(name=output.name, datatype=output.datatype, shape=[count, *output.shape[1:]])
                answer.raw_output_contents.append(raw[start * row_bytes : (start + count) * row_bytes])
            answers.append(answer)
            start += count
        return answers


@dataclass(eq=False)
class _Waiting:
    call: InferCall
    deadline: float | None  # time.monotonic(); None: no deadline
    metadata: tuple[tuple[str, str], ...]
    answer: asyncio.Future[service_pb2.ModelInferResponse]

    def left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass
class _Lane:
    busy: int = 0  # requests of this lane at Triton now
    waiting: deque[_Waiting] = field(default_factory=deque)


class Coalescer:
    """Merges the calls of each lane while `depth(info)` requests of it are at Triton already."""

    def __init__(
        self,
        gateway: TritonGateway,
        depth: Callable[[ModelInfo], int],
        on_request: Callable[[int], None] = lambda calls: None,
    ) -> None:
        self.gateway = gateway
        self.depth = depth
        self.on_request = on_request  # called with the number of calls in each request sent
        self._lanes: dict[Hashable, _Lane] = {}
        self._running: set[asyncio.Task] = set()

    async def infer(
        self, info: ModelInfo, call: InferCall, timeout: float | None, metadata: tuple[tuple[str, str], ...] = ()
    ) -> service_pb2.ModelInferResponse:
        key = lane_of(info, call)
        if key is None:
            self.on_request(1)
            return await self.gateway.infer(call, timeout, metadata)
        lane = self._lanes.setdefault(key, _Lane())
        if lane.busy < self.depth(info) and not lane.waiting:
            lane.busy += 1
            self.on_request(1)
            try:
                return await self.gateway.infer(call, timeout, metadata)
            finally:
                lane.busy -= 1
                self._send(key, lane, info)
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = _Waiting(call, deadline, metadata, asyncio.get_running_loop().create_future())
        lane.waiting.append(waiting)
        try:
            # Shielded: a caller that gives up leaves a merged request to go on for the others.
            return await asyncio.wait_for(asyncio.shield(waiting.answer), timeout)
        except TimeoutError:
            raise DeadlineExceeded(f"model '{info.name}' did not answer before the deadline") from None
        finally:
            if not waiting.answer.done():
                waiting.answer.cancel()  # still waiting: it is left out; in a request: its answer is dropped

    def _send(self, key: Hashable, lane: _Lane, info: ModelInfo) -> None:
        """Send what waits in the lane while it has room at Triton; forget the lane once it is idle."""
        while lane.busy < self.depth(info) and lane.waiting:
            batch: list[_Waiting] = []
            rows = 0
            while lane.waiting:
                head = lane.waiting[0]
                if head.answer.done():  # its caller gave up
                    lane.waiting.popleft()
                    continue
                if batch and rows + head.call.rows > info.max_batch_size:
                    break
                batch.append(lane.waiting.popleft())
                rows += head.call.rows
            if not batch:
                break
            lane.busy += 1
            task = asyncio.create_task(self._request(key, lane, info, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        # Lanes come and go with the shapes callers send (a text model's lengths): keep only busy ones.
        if not lane.busy and not lane.waiting and self._lanes.get(key) is lane:
            del self._lanes[key]

    async def _request(self, key: Hashable, lane: _Lane, info: ModelInfo, batch: list[_Waiting]) -> None:
        try:
            answers = await self._answers(batch)
        finally:
            lane.busy -= 1
        for waiting, answer in zip(batch, answers, strict=True):
            if waiting.answer.done():
                continue
            if isinstance(answer, BaseException):
                waiting.answer.set_exception(answer)
            else:
                waiting.answer.set_result(answer)
        self._send(key, lane, info)

    async def _answers(self, batch: list[_Waiting]) -> list[service_pb2.ModelInferResponse | BaseException]:
        if len(batch) == 1:
            return list(await asyncio.gather(self._alone(batch[0]), return_exceptions=True))
        self.on_request(len(batch))
        merged = MergedCall([waiting.call for waiting in batch])
        lefts = [waiting.left() for waiting in batch]
        metadata = next((waiting.metadata for waiting in batch if waiting.metadata), ())
        try:
            timeout = None if None in lefts else max(left for left in lefts if left is not None)
            response = await self.gateway.infer(merged, timeout, metadata)
        except FacadeError as error:
            if error.code in _SHARED_FAILURES:
                return [error] * len(batch)
            answers = None  # the request's fault: each call on its own finds whose
        except Exception as error:  # a bug: every caller's boundary answers INTERNAL
            return [error] * len(batch)
        else:
            answers = merged.split(response)
        if answers is None:
            return list(await asyncio.gather(*(self._alone(waiting) for waiting in batch), return_exceptions=True))
        return list(answers)

    async def _alone(self, waiting: _Waiting) -> service_pb2.ModelInferResponse:
        self.on_request(1)
        return await self.gateway.infer(waiting.call, waiting.left(), waiting.metadata)
