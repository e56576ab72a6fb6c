"""Every server's answers against in-process ONNX Runtime, before any of its figures is kept.

A few random images go through the server under test, each answer compared with what the same
model.onnx gives in this process (`close_enough`: float noise only). The targets that carry the
images then keep comparing every answer under load (`wrong`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.load import loops
from bench.load.targets import IMAGE_SHAPE, Target, VerificationError

SAMPLES = 4


def sample_images(count: int = SAMPLES, seed: int = 1) -> list[np.ndarray]:
    """`count` single-image batches [1, 3, 224, 224] of float32 noise."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, *IMAGE_SHAPE), dtype=np.float32) for _ in range(count)]


def reference_outputs(onnx_file: Path, images: list[np.ndarray]) -> list[np.ndarray]:
    """The first output of each batch, flat, from ONNX Runtime in this process."""
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return [session.run(None, {name: image})[0].ravel() for image in images]


def check_answers(target: Target, samples: int) -> None:
    """Send each of the target's `samples` prepared requests once; VerificationError unless all are right.

    The target must compare its answers (made with `images` and `expected`).
    """
    result = loops.run(target, 1, duration_s=60.0, warmup_s=0.0, max_requests=samples)
    wrong = getattr(target, "wrong", None)
    if wrong is None:
        raise TypeError(f"{type(target).__name__} does not compare its answers")
    if result.errors or result.requests != samples or wrong:
        raise VerificationError(
            f"{target.name}: {result.requests} of {samples} answers came back, {wrong} of them unlike in-process "
            f"ONNX Runtime; errors {result.errors or 'none'}"
        )
