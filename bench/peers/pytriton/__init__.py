"""PyTriton 0.7 (nvidia-pytriton): Triton Inference Server around Python inference callables."""
