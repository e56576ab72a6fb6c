"""README's and docs/benchmarks.md's speed sentence is the latest goodput rounds report's medians (bench.peers.claims)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.peers.claims import SUMMARY, latest_rounds, read_summaries, speed_sentence, write_summary
from bench.peers.goodput_report import DIRECT, FACADE

ROOT = Path(__file__).resolve().parents[2]
DOCS = {"README.md": ROOT / "README.md", "docs/benchmarks.md": ROOT / "docs" / "benchmarks.md"}


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("doc", DOCS)
def test_the_speed_sentence_states_the_latest_rounds_medians(doc):
    report = latest_rounds()
    text = flat(DOCS[doc].read_text())
    assert f"{report.relative_to(ROOT)}/" in text, f"{doc} must link the latest rounds, {report.name}"
    assert speed_sentence(read_summaries(report)) in text


def _figures(direct: float, facade: float, fastapi: float, lone: float) -> dict:
    return {
        DIRECT: {"goodput_rps": direct, "capacity_rps": 1.0, "lone_p50_ms": lone},
        FACADE: {"goodput_rps": facade, "capacity_rps": 1.0, "lone_p50_ms": lone + 1},
        "FastAPI 2x1": {"goodput_rps": fastapi, "capacity_rps": 1.0, "lone_p50_ms": 1.0},
    }


def test_the_sentence_is_the_medians_of_the_rounds_in_the_models_order(tmp_path):
    results = {
        "started": "t",
        "settings": {},
        "venvs": {"peer": "a long freeze"},
        "models": {
            "resnet50": {
                "single_p50_ms": 24.0,
                "servers": {DIRECT: {"steps": [{"offered_rps": 1.0}]}},
                "rounds": [_figures(10, 7, 10, 30.0), _figures(12, 8, 10, 31.0), _figures(9, 6, 10, 50.0)],
            },
            "mobilenet_v3_small": {
                "single_p50_ms": 1.2,
                "servers": {},
                "rounds": [_figures(300, 150, 250, 3.0), _figures(260, 160, 260, 3.2), _figures(200, 100, 250, 9.0)],
            },
        },
    }
    summary = json.loads(write_summary(tmp_path, results).read_text())
    assert "venvs" not in summary and all("servers" not in m for m in summary["models"].values())
    assert (tmp_path / SUMMARY).exists() and read_summaries(tmp_path) == summary["models"]
    assert speed_sentence(summary["models"]) == (
        "Triton direct serves 1.00x and 1.00x the goodput of the best hand-written FastAPI + uvicorn + ONNX Runtime "
        "layout on mobilenet_v3_small and resnet50 (medians of 3 rounds), the facade 0.60x and 0.70x on "
        "mobilenet_v3_small and resnet50; a lone request takes 3.2 and 31.0 ms through Triton direct, against 1.2 and "
        "24.0 ms in process."
    )


def test_a_facade_run_with_a_layout_of_its_own_says_so(tmp_path):
    small = {"single_p50_ms": 1.2, "rounds": [_figures(300, 150, 250, 3.0)]}
    results = {"started": "t", "settings": {"facade_layout": "1 instance x 1 intra-op thread"}, "models": {}}
    results["models"] = {"mobilenet_v3_small": small, "text_classifier": small | {"single_p50_ms": 0.3}}
    (tmp_path / "small").mkdir(), (tmp_path / "resnet50").mkdir()
    write_summary(tmp_path / "small", results)
    big = {"started": "t", "settings": {}, "models": {"resnet50": {"single_p50_ms": 24.0, "rounds": small["rounds"]}}}
    write_summary(tmp_path / "resnet50", big)
    said = speed_sentence(read_summaries(tmp_path))
    assert ", the facade 0.60x, 0.60x and 0.60x on mobilenet_v3_small, text_classifier and resnet50 (" in said
    assert "(mobilenet_v3_small and text_classifier with 1 instance x 1 intra-op thread behind the facade);" in said


def test_a_run_cut_short_says_how_many_rounds_each_model_kept():
    models = {
        "text_classifier": {"single_p50_ms": 0.3, "rounds": [_figures(100, 50, 100, 1.0)] * 4},
        "resnet50": {"single_p50_ms": 24.0, "rounds": [_figures(10, 7, 10, 30.0)] * 5},
    }
    assert "(medians of 4 to 5 rounds)" in speed_sentence(models)
