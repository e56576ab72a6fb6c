"""Every server's answers against in-process ONNX Runtime, before any of its figures is kept.

A few random images go through the server under test, each answer compared with what the same
model.onnx gives in this process (`close_enough`: float noise only). The targets that carry the
images then keep comparing every answer under load (`wrong`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.load import loops
from bench.load.targets import IMAGE_SHAPE, Target, VerificationError

SAMPLES = 4
SEQUENCE_LENGTHS = (8, 16, 32, 64, 128)  # the text models take up to 128 positions


def sample_images(count: int = SAMPLES, seed: int = 1) -> list[np.ndarray]:
    """`count` single-image batches [1, 3, 224, 224] of float32 noise."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, *IMAGE_SHAPE), dtype=np.float32) for _ in range(count)]


def sample_sequences(count: int = SAMPLES, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """`count` single-sequence requests for the text models, of mixed lengths (SEQUENCE_LENGTHS in turn).

    Ids in [1, 1000) (the demo models' vocabulary), the mask all ones: the server batches sequences of different
    lengths, padding them, and each answer must still be the sequence's own.
    """
    rng = np.random.default_rng(seed)
    lengths = [SEQUENCE_LENGTHS[index % len(SEQUENCE_LENGTHS)] for index in range(count)]
    return [
        {
            "input_ids": rng.integers(1, 1000, size=(1, length), dtype=np.int64),
            "attention_mask": np.ones((1, length), dtype=np.int64),
        }
        for length in lengths
    ]


def reference_outputs(onnx_file: Path, requests: Sequence[np.ndarray | dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The first output of each request, flat, from ONNX Runtime in this process.

    A request is a batch of the first input (an image batch) or its arrays by input name.
    """
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return [
        session.run(None, request if isinstance(request, dict) else {name: request})[0].ravel() for request in requests
    ]


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
