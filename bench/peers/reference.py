"""Every server's answers against in-process ONNX Runtime, before any of its figures is kept.

A few requests go through the server under test, each answer compared with what the same model.onnx gives in this
process (`close_enough`: float noise only). The targets that carry them then keep comparing every answer under load.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.load import loops
from bench.load.targets import IMAGE_SHAPE, Request, Target, VerificationError

SEQUENCE_LENGTHS = (8, 16, 32, 64, 128)  # the text models take up to 128 positions


def sample_images(count: int = 4, seed: int = 1) -> list[np.ndarray]:
    """`count` single-image batches [1, 3, 224, 224] of float32 noise."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, *IMAGE_SHAPE), dtype=np.float32) for _ in range(count)]


def sample_sequences(count: int = 4, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """`count` single-sequence requests for the text models, of mixed lengths (SEQUENCE_LENGTHS in turn).

    Ids in [1, 1000) (the demo models' vocabulary), the mask all ones: a server may batch sequences of different
    lengths, and each answer must still be the sequence's own.
    """
    rng = np.random.default_rng(seed)
    return [
        {"input_ids": rng.integers(1, 1000, size=(1, length)), "attention_mask": np.ones((1, length), np.int64)}
        for length in (SEQUENCE_LENGTHS[index % len(SEQUENCE_LENGTHS)] for index in range(count))
    ]


def reference_outputs(onnx_file: Path, requests: Sequence[Request]) -> list[np.ndarray]:
    """The first output of each request (an image batch, or arrays by input name), flat, from ONNX Runtime here."""
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return [session.run(None, r if isinstance(r, dict) else {name: r})[0].ravel() for r in requests]


def check_answers(target: Target, samples: int) -> None:
    """Send each of a checking target's `samples` requests once; VerificationError unless all are right."""
    result = loops.run(target, 1, duration_s=60.0, warmup_s=0.0, max_requests=samples)
    if result.errors or result.requests != samples or target.wrong:
        raise VerificationError(
            f"{target.name}: {result.requests} of {samples} answers came back, {target.wrong} of them unlike "
            f"in-process ONNX Runtime; errors {result.errors or 'none'}"
        )
