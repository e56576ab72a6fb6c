"""tritonnx backend: serve any ONNX model on CPU through Triton's Python backend.

The modules here hold all the logic of a Triton Python model; each `model.py` in the model
repository only names its `.onnx` file. Everything except `triton_model` runs without Triton.
"""
