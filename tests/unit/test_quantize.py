"""INT8 versions: the gate's measures and verdict, the sample folders, the graph level check, and `publish --quantize`
against a recording model control (tests/integration/test_quantized_versions.py publishes to a real tritonserver)."""

from __future__ import annotations

import io
import json

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

import tritonnx.offline.quantize as quantize_module
from tests.graphs import small_classifier
from tests.unit.test_model_versions import RecordingControl, make_model
from tritonnx.backend.settings import SessionSettings
from tritonnx.commands import models as models_cli
from tritonnx.offline.calibration import CalibrationError, InputSpec, read_samples, split
from tritonnx.offline.quantize import (
    REPORT_FILE,
    Agreement,
    Limits,
    QuantizationRefused,
    agreement,
    graph_level_problem,
    quantize_for_publish,
    refusals,
)

IMAGE = InputSpec("image", np.dtype(np.float32), ("n", 3, 16, 16))


# --- the gate's measures ------------------------------------------------------------------------------------------


def test_identical_outputs_agree_fully():
    scores = [[np.array([[0.1, 0.9, 0.0]], np.float32)] for _ in range(3)]
    measured = agreement(["scores"], scores, scores)
    assert measured.top1 == 1.0 and measured.top1_outputs == ("scores",)
    assert measured.cosine_mean == pytest.approx(1.0) and measured.cosine_min == pytest.approx(1.0)


def test_top1_counts_rows_whose_argmax_moved_and_cosine_measures_the_direction():
    fp32 = [[np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)]]
    int8 = [[np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)]]  # the second row's class flipped
    measured = agreement(["scores"], fp32, int8)
    assert measured.top1 == 0.5
    assert measured.cosine_mean == pytest.approx(0.5)  # [1,0,0,1] . [1,0,1,0] / (sqrt2 * sqrt2)


def test_top1_is_taken_on_the_first_output_only_and_non_float_outputs_are_left_out():
    fp32 = [[np.array([[1.0, 2.0]], np.float32), np.array([[5.0, 1.0, 1.0]], np.float32), np.array([3])]]
    int8 = [[np.array([[1.0, 2.1]], np.float32), np.array([[1.0, 5.0, 1.0]], np.float32), np.array([4])]]
    measured = agreement(["logits", "embedding", "label"], fp32, int8)
    assert measured.top1 == 1.0 and measured.top1_outputs == ("logits",)  # the embedding's argmax moved: not counted
    assert measured.cosine_min < 0.5  # but its cosine counts


def test_zero_outputs_agree_only_with_zero_outputs():
    zero, one = np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32)
    assert agreement(["y"], [[zero]], [[zero]]).cosine_mean == 1.0
    assert agreement(["y"], [[zero]], [[one]]).cosine_mean == 0.0
    assert agreement(["y"], [[zero]], [[zero]]).top1 is None  # one value per row: no classes


def test_the_refusal_names_each_failed_measure_with_what_was_measured_and_required():
    measured = Agreement(samples=40, top1=0.95, top1_outputs=("scores",), cosine_mean=0.98, cosine_min=0.7)
    found = refusals(measured, Limits())
    assert found == [
        "top-1 agreement 95.00% over 40 held-out samples (scores), required >= 99.00% (--min-top1)",
        "cosine similarity of the outputs 0.9800 (mean; worst sample 0.7000), required >= 0.9900 (--min-cosine)",
    ]
    assert refusals(measured, Limits(min_top1=0.9, min_cosine=0.95)) == []


@pytest.mark.parametrize(("level", "refused"), [(-1, True), (2, True), (1, False), (0, False), (None, False)])
def test_a_graph_level_that_leaves_qdq_unfused_is_refused_by_name(level, refused):
    config = {} if level is None else {"optimization": {"graph": {"level": level}}}
    problem = graph_level_problem(SessionSettings.from_model_config(config, cores=1))
    assert (problem is not None) == refused
    if refused:
        assert "set level 1 (extended) or 0 / remove it (all)" in problem


# --- sample folders -----------------------------------------------------------------------------------------------


def test_arrays_are_cut_into_samples_of_one_row_in_file_name_order(tmp_path):
    np.save(tmp_path / "b.npy", np.full((3, 16, 16), 2, np.float64))  # one sample, no batch dim; cast to FP32
    np.save(tmp_path / "a.npy", np.ones((2, 3, 16, 16), np.float32))  # a batch of two
    samples = read_samples(tmp_path, [IMAGE])
    assert [s["image"].shape for s in samples] == [(1, 3, 16, 16)] * 3
    assert [s["image"].dtype for s in samples] == [np.float32] * 3
    assert [float(s["image"].max()) for s in samples] == [1.0, 1.0, 2.0]


def test_npz_files_feed_inputs_by_name(tmp_path):
    ids = InputSpec("ids", np.dtype(np.int64), ("n", "s"))
    mask = InputSpec("mask", np.dtype(np.int64), ("n", "s"))
    np.savez(tmp_path / "a.npz", ids=np.arange(10).reshape(2, 5), mask=np.ones((2, 5), np.int64))
    samples = read_samples(tmp_path, [ids, mask])
    assert len(samples) == 2 and samples[1]["ids"].tolist() == [[5, 6, 7, 8, 9]]
    np.savez(tmp_path / "b.npz", ids=np.arange(5))
    with pytest.raises(CalibrationError, match=r"b\.npz: no array named mask \(it holds ids"):
        read_samples(tmp_path, [ids, mask])


def test_images_go_through_the_projects_pre_processing(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGB", (320, 240), (255, 0, 0)).save(buffer, "JPEG")
    (tmp_path / "red.jpg").write_bytes(buffer.getvalue())
    spec = InputSpec("input", np.dtype(np.float32), ("batch", 3, 224, 224))
    [sample] = read_samples(tmp_path, [spec])
    assert sample["input"].shape == (1, 3, 224, 224)
    assert sample["input"][0, 0].mean() > sample["input"][0, 1].mean()  # red


@pytest.mark.parametrize(
    ("name", "array", "message"),
    [
        ("a.npy", np.ones((2, 3, 8, 8), np.float32), r"shape \[2, 3, 8, 8\] does not fit input image float32"),
        ("a.npy", np.ones((3, 16, 16), np.complex64), "complex64 cannot feed input image"),
        ("a.txt", None, "a.txt: not one of .npy"),
    ],
)
def test_a_file_that_cannot_feed_the_model_is_named(tmp_path, name, array, message):
    if array is None:
        (tmp_path / name).write_text("x")
    else:
        np.save(tmp_path / name, array)
    with pytest.raises(CalibrationError, match=message):
        read_samples(tmp_path, [IMAGE])


def test_the_last_fraction_is_held_out():
    samples = [{"x": np.array([i])} for i in range(10)]
    calibration, held_out = split(samples, 0.2)
    assert [int(s["x"][0]) for s in held_out] == [8, 9] and len(calibration) == 8
    with pytest.raises(CalibrationError, match="give more, or a separate --holdout folder"):
        split(samples[:1], 0.2)


# --- quantizing and the gate, in-process --------------------------------------------------------------------------


@pytest.fixture
def fast_timing(monkeypatch):
    monkeypatch.setattr(quantize_module, "_SPEED_SECONDS", 0.01)


@pytest.fixture
def folders(tmp_path):
    """(the FP32 classifier, normal inputs, constant zeros, other normal inputs): each a folder of .npy files."""
    rng = np.random.default_rng(0)
    made = {}
    for name, array in (("normal", rng.standard_normal((20, 3, 16, 16), dtype=np.float32)),
                        ("zeros", np.zeros((20, 3, 16, 16), np.float32)),
                        ("holdout", rng.standard_normal((8, 3, 16, 16), dtype=np.float32))):  # fmt: skip
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "samples.npy", array)
        made[name] = tmp_path / name
    return small_classifier(tmp_path / "fp32" / "model.onnx"), made


def test_a_static_int8_version_agrees_on_held_out_samples_and_reports_its_speed(tmp_path, folders, fast_timing):
    fp32, made = folders
    int8, report = quantize_for_publish(fp32, {"max_batch_size": 8}, "static", made["normal"], None, tmp_path)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in __import__("onnx").load(int8).graph.node}
    assert report["calibration"]["samples"] == 16 and report["holdout"]["samples"] == 4
    assert report["agreement"]["top1"] >= 0.99 and report["agreement"]["cosine_mean"] >= 0.99
    assert report["quantizer"]["quant_format"] == "QDQ" and report["quantizer"]["per_channel"] is True
    assert [run["batch"] for run in report["speed"]["runs"]] == [1, 8]
    assert report["graph_level"] == "ORT_ENABLE_ALL" and report["batch_coupled"] is None
    json.dumps(report)  # written as JSON beside the version


def test_calibrating_on_constant_zeros_is_refused_with_the_measure_that_failed(tmp_path, folders, fast_timing):
    fp32, made = folders
    with pytest.raises(QuantizationRefused, match=r"cosine similarity of the outputs 0\.\d+ .*required >= 0\.9900"):
        quantize_for_publish(fp32, {"max_batch_size": 8}, "static", made["zeros"], made["holdout"], tmp_path)


def test_a_dynamic_int8_version_is_batch_coupled_and_checked_on_every_sample(tmp_path, fast_timing):
    from tests.graphs import quantized_encoder

    fp32 = quantized_encoder(tmp_path / "encoder").with_name("float.onnx")
    (tmp_path / "ids").mkdir()
    np.savez(tmp_path / "ids" / "a.npz", ids=np.random.default_rng(1).integers(0, 99, (6, 5)))
    # The encoder's random weights quantize with a cosine near 0.98: the limits are lowered to what it reaches.
    limits = Limits(min_top1=0.9, min_cosine=0.95)
    int8, report = quantize_for_publish(
        fp32, {"max_batch_size": 4}, "dynamic", None, tmp_path / "ids", tmp_path, limits
    )
    assert "DynamicQuantizeLinear" in report["batch_coupled"]
    assert report["holdout"]["samples"] == 6 and report["quantizer"]["function"] == "quantize_dynamic"
    ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"])


def test_a_config_that_leaves_qdq_unfused_is_refused_before_quantizing(tmp_path, folders):
    fp32, made = folders
    config = {"optimization": {"graph": {"level": -1}}}
    with pytest.raises(QuantizationRefused, match="ORT_ENABLE_BASIC, which leaves the INT8 graph"):
        quantize_for_publish(fp32, config, "static", made["normal"], None, tmp_path)
    assert not list(tmp_path.glob("*.onnx"))


# --- the command line ---------------------------------------------------------------------------------------------

CLASSIFIER_CONFIG = 'backend: "onnxruntime"\nmax_batch_size: 8\n'


def classifier_folder(repository, seed: int = 0):
    folder = make_model(repository, versions=(), config=CLASSIFIER_CONFIG)
    (folder.path / "1").mkdir()
    small_classifier(folder.path / "1" / "model.onnx", seed)
    return folder


class ClassifierControl(RecordingControl):
    def close(self) -> None:
        pass

    def served_config(self, model: str) -> dict | None:
        return {"name": model, "max_batch_size": 8, "input": [{"name": "image", "data_type": "TYPE_FP32",
                "dims": ["3", "16", "16"]}], "output": [{"name": "scores", "data_type": "TYPE_FP32", "dims": ["10"]}]}  # fmt: skip


def test_publish_quantize_writes_the_int8_version_and_its_report(tmp_path, folders, fast_timing):
    _, made = folders
    folder = classifier_folder(tmp_path / "repo")
    control, printed = ClassifierControl(folder), []
    argv = ["publish", "m", str(folder.path / "1" / "model.onnx"), "--quantize", "static", "--calibration",
            str(made["normal"])]  # fmt: skip
    models_cli.run(models_cli.build_parser().parse_args(argv), control, tmp_path / "repo", printed.append)
    assert sorted(p.name for p in (folder.path / "2").iterdir()) == ["model.onnx", REPORT_FILE]
    report = json.loads((folder.path / "2" / REPORT_FILE).read_text())
    assert report["source"] == str(folder.path / "1" / "model.onnx") and report["agreement"]["samples"] == 4
    assert printed[-1].startswith(
        f"published the static INT8 version of {folder.path / '1' / 'model.onnx'} as version 2"
    )
    assert control.served == [2]


def test_a_refused_quantization_exits_1_publishes_nothing_and_says_why(tmp_path, folders, monkeypatch, capsys):
    _, made = folders
    folder = classifier_folder(tmp_path / "repo")
    control = ClassifierControl(folder)
    monkeypatch.setattr(models_cli, "TritonControl", lambda url, key: control)
    code = models_cli.main(["publish", "m", str(folder.path / "1" / "model.onnx"), "--quantize", "static",
                            "--calibration", str(made["zeros"]), "--holdout", str(made["holdout"]),
                            "--repository", str(tmp_path / "repo")])  # fmt: skip
    error = capsys.readouterr().err
    assert code == 1
    assert "refused: cosine similarity of the outputs" in error and "required >= 0.9900 (--min-cosine)" in error
    assert "nothing was published, m serves version 1 as before" in error
    assert folder.versions() == [1] and not list(folder.path.glob(".staging-*")) and control.loads == 0


def test_calibration_without_quantize_is_refused(tmp_path):
    folder = classifier_folder(tmp_path / "repo")
    args = models_cli.build_parser().parse_args(["publish", "m", "x.onnx", "--calibration", str(tmp_path)])
    with pytest.raises(models_cli.VersionError, match="--calibration and --holdout feed --quantize"):
        models_cli.run(args, ClassifierControl(folder), tmp_path / "repo", print)
