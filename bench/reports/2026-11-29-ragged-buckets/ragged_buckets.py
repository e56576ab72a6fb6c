"""ONNX Runtime's CPU per text request: alone, in one padded batch, and in runs of similar length (backend/batching.py).

Run from the checkout: PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-ragged-buckets/ragged_buckets.py [REPEATS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.peers.servers import SEQUENCE_LENGTHS
from tritonnx.backend.batching import group_compatible, stack
from tritonnx.backend.onnx_io import read_file_io
from tritonnx.backend.validation import ModelSignature, prepare_request

MODEL = Path("model_repository/text_classifier/1/model.onnx")
RAGGED = frozenset({"input_ids", "attention_mask"})
BATCHES = (2, 4, 8, 16)  # requests Triton's batcher hands over at once
DRAWS = 40  # random batches per size, lengths drawn from the benchmark's as its requests cycle through them


def cpu_ms(session: ort.InferenceSession, feeds: dict[str, np.ndarray], repeats: int) -> float:
    """The least thread CPU of one run over `repeats` (the least is the run others disturbed least).

    The three ways of a batch are measured one after the other on the same draw, so that a busy machine slows all three.
    """
    session.run(None, feeds)
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        session.run(None, feeds)
        best = min(best, time.thread_time() - started)
    return best * 1000


def main(repeats: int) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # a served instance's, and one thread's CPU
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
    inputs, outputs = read_file_io(MODEL, batched=True)
    signature = ModelSignature("text_classifier", inputs, outputs, 32, RAGGED)
    rng = np.random.default_rng(0)

    def request(length: int) -> dict[str, np.ndarray]:
        ids = rng.integers(1, 1000, size=(1, length))
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    print(
        "| requests in the batch | alone, ms a request | one padded batch, ms a request | runs of similar length, "
        "ms a request | runs per batch |"
    )
    print("|---|---|---|---|---|")
    for size in BATCHES:
        rows: dict[str, list[float]] = {"alone": [], "padded": [], "runs": [], "count": []}
        for _ in range(DRAWS):
            lengths = rng.choice(SEQUENCE_LENGTHS, size)
            prepared = [prepare_request(request(int(n)), signature) for n in lengths]
            rows["alone"].append(sum(cpu_ms(session, p.feeds, repeats) for p in prepared) / size)
            rows["padded"].append(cpu_ms(session, stack(prepared, signature), repeats) / size)
            runs = group_compatible(prepared, signature)
            rows["runs"].append(
                sum(cpu_ms(session, stack([prepared[i] for i in run], signature), repeats) for run in runs) / size
            )
            rows["count"].append(len(runs))
        mean = {k: statistics.mean(v) for k, v in rows.items()}
        print(f"| {size} | {mean['alone']:.3f} | {mean['padded']:.3f} | {mean['runs']:.3f} | {mean['count']:.1f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
