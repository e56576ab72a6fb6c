"""Load targets that check every answer: each output of each answer against in-process ONNX Runtime.

bench.load's facade and KServe targets, with four requests each (seeded images, or token sequences for a model whose
inputs are INT64), run through ONNX Runtime in this process once; every answer is then decoded, compared output by
output by name, and counted by the model version that answered (a publish swaps versions under the load).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import service_pb2

from bench.load.targets import (
    TEXT_SEQUENCE,
    FacadeTarget,
    GrpcTarget,
    KServeTarget,
    Request,
    close_enough,
    random_tensor,
)
from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.client.proto import inference_pb2

SEEDS = range(4)  # four different images (or token sequences) per stream, in turn


def requests_of(session: ort.InferenceSession) -> list[Request]:
    """One request per seed: an image, or (a model with INT64 inputs) a token sequence of TEXT_SEQUENCE ids."""
    inputs = session.get_inputs()
    if all(i.type != "tensor(int64)" for i in inputs):
        return [np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32) for seed in SEEDS]
    rngs = [np.random.default_rng(seed) for seed in SEEDS]
    return [{i.name: random_tensor(i.name, "INT64", [1, TEXT_SEQUENCE], rng) for i in inputs} for rng in rngs]


class Checked(GrpcTarget):
    """A target whose every answer is decoded, compared with ONNX Runtime's outputs by name, counted by version."""

    def __init__(self, url: str, model: str, session: ort.InferenceSession, **options: Any) -> None:
        requests = requests_of(session)
        super().__init__(url, model, 1, images=requests, **options)
        names, first = [o.name for o in session.get_outputs()], session.get_inputs()[0].name
        self.reference = [
            dict(zip(names, session.run(None, r if isinstance(r, dict) else {first: r}), strict=True)) for r in requests
        ]
        self.versions: Counter[str] = Counter()  # model version -> answers
        self.wrong_examples: list[str] = []

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        raise NotImplementedError

    def check(self, index: int, body: bytes) -> None:
        version, outputs = self.answer(body)
        self.versions[version] += 1
        expected = self.reference[index]
        bad = [n for n in expected if n not in outputs or not close_enough(outputs[n].ravel(), expected[n].ravel())]
        if bad:
            self.wrong += 1
            if len(self.wrong_examples) < 10:
                self.wrong_examples.append(f"request {index}, version {version}: {', '.join(bad)} differ")


class CheckedFacade(Checked, FacadeTarget):
    """The facade's Predict with raw tensors (named outputs come back for every output)."""

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        response = inference_pb2.PredictResponse.FromString(body)
        kind = inference_pb2.ElementType.Name
        return response.model_version, {t.name: _array(t.raw_data, kind(t.dtype), t.shape) for t in response.outputs}


class CheckedTriton(Checked, KServeTarget):
    """Triton's KServe ModelInfer, every output of the answer compared by name."""

    name = "triton"

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        response = service_pb2.ModelInferResponse.FromString(body)
        raw = zip(response.outputs, response.raw_output_contents, strict=False)
        return response.model_version, {o.name: _array(data, o.datatype, o.shape) for o, data in raw}


def _array(raw: bytes, datatype: str, shape: Sequence[int]) -> np.ndarray:
    return np.frombuffer(raw, dtype=RAW_DTYPES[datatype]).reshape(list(shape))


StreamTarget = CheckedFacade | CheckedTriton
