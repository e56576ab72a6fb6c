"""The baseline tritonnx is measured against: the FastAPI + ONNX Runtime server users would write."""
