"""A slice of the exporters' corpus (tests/conformance/exported.py) in CI: judged, served and checked.

The transformers and timm exports the batch-axis rule once judged coupled, and torchvision's ViT, as
export_models.py wrote them (kept in tests/conformance/exports). `python -m tests.conformance --corpus exported`
exports and serves the whole corpus (make conformance).
"""

from __future__ import annotations

import shutil

import onnx
import pytest

from tests.conformance import exported as exported_module
from tests.conformance.exported import EXPORTS, SLICE, exported_in, exporters_python, serve
from tritonnx.backend.onnx_io import read_graph_io


@pytest.fixture(scope="module")
def exported():
    return exported_in(EXPORTS, list(SLICE))


def test_the_slice_is_what_torch_onnx_export_wrote(exported):
    assert [model.name for model in exported] == sorted(SLICE)
    for model in exported:
        graph = onnx.load(model.onnx_file)
        assert (graph.producer_name, graph.opset_import[0].version) == ("pytorch", 17), model.name
        assert model.batches, model.name


def test_the_rule_finds_no_exported_model_coupled(exported):
    for model in exported:
        assert read_graph_io(model.onnx_file).batch_coupling() is None, model.name


def test_each_exported_model_batches_and_every_request_gets_what_it_would_get_alone(exported, tmp_path):
    for served in serve(exported, tmp_path):
        assert served.correct, served
        assert served.verdict.startswith("batches (") and served.merged, served


def test_the_exporters_venv_is_not_started_without_the_disk_it_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(exported_module, "VENV_DISK_BYTES", shutil.disk_usage(tmp_path).free + 2**40)
    with pytest.raises(OSError, match=r"needs about \d+ GB free under .*, and [\d.]+ GB are: free some space"):
        exporters_python(tmp_path / "build", print)
    assert not (tmp_path / "build").exists()
