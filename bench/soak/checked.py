"""Load targets that check every answer: each output of each answer against in-process ONNX Runtime.

bench.load's facade and KServe targets, with four requests each (seeded images, or token sequences for a model
whose inputs are INT64), whose inputs are decoded back from the prepared bytes and run through ONNX Runtime in
this process once; every answer is then decoded, compared output by output by name, and counted by the model
version that answered (a publish swaps versions under the load).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import service_pb2

from bench.load.targets import FacadeTarget, KServeTarget, close_enough
from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.client.proto import inference_pb2

IMAGE_SEEDS = range(4)  # four different images (or token sequences) per stream, in turn


def reference_session(onnx_file: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])


def graph_inputs(session: ort.InferenceSession) -> list[tuple[str, str]]:
    """(name, ONNX type) of each input of the graph."""
    return [(i.name, i.type) for i in session.get_inputs()]


class Checked:
    """Mixed into a target: every answer decoded, compared with ONNX Runtime's outputs, counted by version."""

    session: ort.InferenceSession
    payloads: list[bytes]
    wrong: int

    def setup_check(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.reference: list[dict[str, np.ndarray]] = []
        self.versions: Counter[str] = Counter()  # model version -> answers
        self.wrong_examples: list[str] = []

    def learn_reference(self) -> None:
        """Run each prepared request's inputs through ONNX Runtime in this process (after open())."""
        names = [o.name for o in self.session.get_outputs()]
        self.reference = [
            dict(zip(names, self.session.run(None, self.request_arrays(p)), strict=True)) for p in self.payloads
        ]

    def request_arrays(self, payload: bytes) -> dict[str, np.ndarray]:
        raise NotImplementedError

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

    def __init__(self, url: str, model: str, session: ort.InferenceSession, **options: Any) -> None:
        inputs = graph_inputs(session)
        text = [name for name, kind in inputs if kind == "tensor(int64)"]
        images = None if text else [_image(seed) for seed in IMAGE_SEEDS]
        super().__init__(url, model, 1, text_inputs=text, images=images, **options)
        self.setup_check(session)

    async def _build(self) -> list[bytes]:
        if self.images is not None:
            return await super()._build()
        built = []  # one request per seed: FacadeTarget makes one of text
        for seed in IMAGE_SEEDS:
            self.seed = seed
            built += await super()._build()
        return built

    def request_arrays(self, payload: bytes) -> dict[str, np.ndarray]:
        request = inference_pb2.PredictRequest.FromString(payload)
        if request.inputs:
            return {
                t.name: _array(t.raw_data, inference_pb2.ElementType.Name(t.dtype), t.shape) for t in request.inputs
            }
        [name] = [n for n, _ in graph_inputs(self.session)]
        return {name: _array(request.raw_data, "FP32", request.shape)}

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        response = inference_pb2.PredictResponse.FromString(body)
        outputs = {
            t.name: _array(t.raw_data, inference_pb2.ElementType.Name(t.dtype), t.shape) for t in response.outputs
        }
        return response.model_version, outputs


class CheckedTriton(Checked, KServeTarget):
    """Triton's KServe ModelInfer, every output of the answer compared by name."""

    name = "triton"

    def __init__(self, url: str, model: str, session: ort.InferenceSession, **options: Any) -> None:
        text = any(kind == "tensor(int64)" for _, kind in graph_inputs(session))
        super().__init__(url, model, 1, images=None if text else [_image(seed) for seed in IMAGE_SEEDS], **options)
        self.setup_check(session)

    async def _build(self) -> list[bytes]:
        if self.images is not None:
            return await super()._build()
        built = []
        for seed in IMAGE_SEEDS:
            self.seed = seed
            built += await super()._build()
        return built

    def request_arrays(self, payload: bytes) -> dict[str, np.ndarray]:
        request = service_pb2.ModelInferRequest.FromString(payload)
        return {
            spec.name: _array(raw, spec.datatype, spec.shape)
            for spec, raw in zip(request.inputs, request.raw_input_contents, strict=True)
        }

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        response = service_pb2.ModelInferResponse.FromString(body)
        outputs = {
            o.name: _array(raw, o.datatype, o.shape)
            for o, raw in zip(response.outputs, response.raw_output_contents, strict=False)
        }
        return response.model_version, outputs


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32)


def _array(raw: bytes, datatype: str, shape: Sequence[int]) -> np.ndarray:
    return np.frombuffer(raw, dtype=RAW_DTYPES[datatype]).reshape(list(shape))


StreamTarget = CheckedFacade | CheckedTriton
