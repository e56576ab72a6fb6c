"""MLServer's custom runtime for an ONNX file: ONNX Runtime on the request's first input (MLServer imports it)."""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from bench.peers.common import run, session


class OnnxModel(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra or {}
        self.session = session(self.settings.parameters.uri, int(extra.get("threads", 1)))
        self.output = self.session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        images = NumpyCodec.decode_input(payload.inputs[0])
        output = run(self.session, images)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self.output, output)])
