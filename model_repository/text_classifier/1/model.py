"""Triton Python model: serves model.onnx next to this file (see backend/triton_model.py).

This file is every version's `model.py`: `tritonnx-models publish` copies it into a new model's
first version, and each demo model's version folder holds a copy (a unit test keeps them equal).
"""

from pathlib import Path

from backend.triton_model import OnnxRuntimeModel


class TritonPythonModel(OnnxRuntimeModel):
    onnx_file = Path(__file__).with_name("model.onnx")
