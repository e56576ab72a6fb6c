"""Triton Python model: image files to the classifiers' input tensor (see backend/triton_model.py)."""

from tritonnx.backend.triton_model import ImagePreprocessModel


class TritonPythonModel(ImagePreprocessModel):
    pass
