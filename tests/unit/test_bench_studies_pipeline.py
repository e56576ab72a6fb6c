"""bench.studies.pipeline's arithmetic: stage times per request and their shares from Triton's counters."""

import pytest

from backend.image_format import sniff
from bench.studies.pipeline import STAGES, jpeg_files, stage_rows


def counters(requests, inferences, executions, request_ns, *stage_ns):
    return {"requests": requests, "failures": 0, "inferences": inferences, "executions": executions,
            "request_ns": request_ns, **dict(zip(STAGES, stage_ns, strict=True))}  # fmt: skip


def test_stage_rows_per_request_and_shares_of_the_steps_only():
    zero = counters(0, 0, 0, 0, 0, 0, 0, 0)
    before = {"m_image": zero, "image_preprocess": zero, "m": zero}
    after = {
        "m_image": counters(10, 10, 10, 500e6, 1, 1, 400e6, 1),  # the ensemble's stages repeat its steps'
        "image_preprocess": counters(10, 10, 4, 150e6, 10e6, 0, 90e6, 0),
        "m": counters(10, 10, 2, 300e6, 50e6, 0, 250e6, 0),
    }
    rows = stage_rows(before, after, "m_image")
    assert rows["m_image"] == {"requests": 10, "failures": 0, "average_batch": 1.0, "request_ms": 50.0}
    assert rows["image_preprocess"]["average_batch"] == 2.5 and rows["m"]["average_batch"] == 5.0
    assert rows["image_preprocess"]["queue_ms"] == 1.0 and rows["m"]["compute_infer_ms"] == 25.0
    shares = [rows[m][f"{s}_share"] for m in ("image_preprocess", "m") for s in STAGES]
    assert sum(shares) == pytest.approx(1.0)
    assert rows["m"]["compute_infer_share"] == pytest.approx(250 / 400)


def test_the_files_are_distinct_jpegs_of_the_size_asked():
    files = jpeg_files(3, 64, 48)
    assert len(set(files)) == 3 and all(sniff(f) == "JPEG" for f in files)
