"""Offline tools: INT8 versions with ONNX Runtime's quantizers and their calibration data, the demo models.

They need `onnx`, which the serving images leave out: run them beside a server, not in it.
"""
