"""Triton Python model: serves the model folder's ONNX file with ONNX Runtime (see backend/triton_model.py).

This file is the `onnxruntime` and `tritonnx` backends' model.py in the backend directory, and every
`backend: "python"` version's model.py: `tritonnx-models publish` copies it into such a model's new
version, and each demo model's version folder holds a copy (a unit test keeps them equal).
"""

from tritonnx.backend.triton_model import OnnxRuntimeModel


class TritonPythonModel(OnnxRuntimeModel):
    """The graph: `<version>/model.onnx`, or the config's `default_model_filename` under the named backends."""
