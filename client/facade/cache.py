"""The facade's result cache: Triton's answers kept by everything that decides them.

Triton 2.51's own response cache keys on the input bytes but not on their shapes: the same bytes
sent as [2, 3] and as [3, 2] to a model that transposes get one cached answer, the wrong one for
the second (tests/integration/test_response_cache.py shows it). Here the key covers the model, the
version asked for and the versions Triton serves, every input's name, datatype, shape and bytes,
and the outputs requested with their parameters. The value is Triton's response, so a hit goes
through the same translation as a computed answer and comes out byte-identical to it.

Opt-in per model (`--cache-models`), bounded by the bytes of the responses it keeps (LRU).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from tritonclient.grpc import service_pb2

from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.translate import InferCall, ModelInfo


def cache_key(info: ModelInfo, call: InferCall) -> bytes:
    """A digest of everything that decides Triton's answer to `call` (not its id, priority or timeout)."""
    digest = hashlib.blake2b(digest_size=32)

    def field(value: bytes | memoryview) -> None:  # length-prefixed: no two sequences of fields hash alike
        digest.update(len(value).to_bytes(8, "little"))
        digest.update(value)

    header = call.header
    for text in (info.name, header.model_version, ",".join(info.versions)):
        field(text.encode())
    inputs = sorted(zip(header.inputs, call.payloads, strict=True), key=lambda pair: pair[0].name)
    field(len(inputs).to_bytes(8, "little"))
    for tensor, payload in inputs:
        field(tensor.name.encode())
        field(tensor.datatype.encode())
        field(b"".join(int(d).to_bytes(8, "little", signed=True) for d in tensor.shape))
        field(payload.cast("B"))
    for output in sorted(header.outputs, key=lambda o: o.name):
        field(output.SerializeToString(deterministic=True))
    return digest.digest()


class ResultCache:
    """Triton's responses by `cache_key`, least recently used dropped beyond `max_bytes`."""

    def __init__(self, models: frozenset[str], max_bytes: int, metrics: FacadeMetrics) -> None:
        self.models = models
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, tuple[service_pb2.ModelInferResponse, int]] = OrderedDict()
        self._metrics = metrics

    def enabled_for(self, model: str) -> bool:
        return model in self.models

    def get(self, model: str, key: bytes) -> service_pb2.ModelInferResponse | None:
        entry = self._entries.get(key)
        self._metrics.cache_requests.labels(model, "hit" if entry else "miss").inc()
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, response: service_pb2.ModelInferResponse) -> None:
        size = response.ByteSize() + len(key)
        if size > self.max_bytes or key in self._entries:
            return
        self._entries[key] = (response, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            self._metrics.cache_evictions.inc()
        self._metrics.cache_bytes.set(self.bytes)

    def __len__(self) -> int:
        return len(self._entries)
