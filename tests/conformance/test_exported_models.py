"""A slice of the exporters' corpus (tests/conformance/exported.py) in CI: exported, judged, served and checked.

The transformers and timm exports the batch-axis rule once judged coupled, torchvision's ViT, and a detector that
has no batch dim. `python -m tests.conformance --corpus exported` runs all of them (make conformance).
"""

from __future__ import annotations

import pytest

from tests.conformance.exported import SLICE, export, exporters_python, serve
from tritonnx.backend.onnx_io import read_graph_io
from tritonnx.common.paths import Paths


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    python = exporters_python(Paths.from_environment().build, print)
    return export(python, list(SLICE), tmp_path_factory.mktemp("exported"))


def test_the_rule_finds_no_exported_model_coupled(exported):
    assert [model.name for model in exported] == sorted(SLICE)
    for model in exported:
        assert read_graph_io(model.onnx_file).batch_coupling() is None, model.name


def test_each_exported_model_batches_and_every_request_gets_what_it_would_get_alone(exported, tmp_path):
    for served in serve(exported, tmp_path):
        assert served.correct, served
        if served.batches:
            assert served.verdict.startswith("batches (") and served.merged, served
        else:
            assert served.verdict == "no batch dim", served
