"""tritonnx: serve any ONNX model on CPU through Triton Inference Server's Python backend.

Subpackages, named by where their code runs:

- `tritonnx.backend`: inside Triton's Python stub (the model adapter and what it calls); the
  repository's top-level `backend/`.
- `tritonnx.client`: what talks to Triton from outside it: the gRPC facade, the tritonclient
  scripts, the one Triton admin client; the repository's top-level `client/`.
- `tritonnx.server`: server operations: tritonserver, its supervisor and the facade as child
  processes, model versions, the serving stack.
- `tritonnx.commands`: the operator commands (`tritonnx-serve`, `tritonnx-models`, `make monitor`,
  `make traces`).
- `tritonnx.offline`: offline tools: INT8 quantization and its calibration, the demo models.
- `tritonnx.common`: what several processes share: the settings mechanism, the ports, the admin
  key's header, tracing's settings.
"""
