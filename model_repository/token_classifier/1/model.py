"""Triton Python model: serves model.onnx next to this file (see backend/triton_model.py)."""

from pathlib import Path

from backend.triton_model import OnnxRuntimeModel


class TritonPythonModel(OnnxRuntimeModel):
    onnx_file = Path(__file__).with_name("model.onnx")
