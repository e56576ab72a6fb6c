"""make conformance: ONNX's own test models served through tritonserver, every output checked."""
