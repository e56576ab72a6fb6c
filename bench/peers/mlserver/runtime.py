"""MLServer's custom runtime for an ONNX file: ONNX Runtime on the request's inputs, by name (MLServer imports it)."""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from bench.peers.common import session


class OnnxModel(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra or {}
        self.session = session(self.settings.parameters.uri, int(extra.get("threads", 1)))
        self.output_names = [output.name for output in self.session.get_outputs()]  # MLModel has `outputs`
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        arrays = self.session.run(self.output_names, feeds)
        outputs = [NumpyCodec.encode_output(name, array) for name, array in zip(self.output_names, arrays, strict=True)]
        return InferenceResponse(model_name=self.name, outputs=outputs)
