"""Classifiers from real exporters served through the onnxruntime backend name, no model.py, every answer compared
with in-process ONNX Runtime on the same file: scikit-learn through skl2onnx and LightGBM through onnxmltools.

Nobody wrote these graphs for this project: their shapes and types are the exporters' (labels of one dim, LightGBM's
`label` declared with a fixed dim of 1, ZipMap's sequence of maps), which is where serving meets what users bring.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient

from tests.kserve import assert_close, make_inputs, reference_session
from tritonnx.server.stack import ServingStack

FEATURES = 4
CONFIG = 'platform: "onnxruntime_onnx"\n'  # as a repository for Triton's onnxruntime backend writes it


def training_data() -> tuple[np.ndarray, np.ndarray]:
    """Three classes in four features, seeded: what a classifier learns from does not matter here, its graph does."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, FEATURES)) * 3
    labels = rng.integers(0, 3, 300)
    return (centers[labels] + rng.standard_normal((300, FEATURES))).astype(np.float32), labels


def exported_graphs() -> dict[str, onnx.ModelProto]:
    from lightgbm import LGBMClassifier
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    x, y = training_data()
    logistic = LogisticRegression(max_iter=500).fit(x, y)
    trees = LGBMClassifier(n_estimators=8, num_leaves=7, verbose=-1).fit(x, y)
    return {
        "sklearn_logistic": to_onnx(logistic, x[:1], options={"zipmap": False}, target_opset=17),
        "sklearn_zipmap": to_onnx(logistic, x[:1], target_opset=17),  # the exporter's default: ZipMap
        # onnxmltools 1.14 converts up to opset 15.
        "lightgbm": convert_lightgbm(
            trees, initial_types=[("input", FloatTensorType([None, FEATURES]))], zipmap=False, target_opset=15
        ),
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("exported")
    files = {}
    for name, graph in exported_graphs().items():
        (workdir / "repository" / name / "1").mkdir(parents=True)
        (workdir / "repository" / name / "config.pbtxt").write_text(CONFIG)
        files[name] = workdir / "repository" / name / "1" / "model.onnx"
        onnx.save(graph, files[name])
    with ServingStack(workdir / "repository", workdir, with_facade=False, triton_http=False,
                      all_models_ready=False) as stack:  # fmt: skip
        with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
            yield stack, client, files


@pytest.mark.parametrize("model", ["sklearn_logistic", "lightgbm"])
def test_an_exported_classifier_answers_as_in_process_in_any_batch(served, model):
    _, client, files = served
    x = training_data()[0][:4]  # Triton's default max_batch_size, which auto-complete gives a graph that batches
    session = reference_session(files[model])
    names = [o.name for o in session.get_outputs()]
    for rows in (x[:1], x):  # one row, then four in one request
        result = client.infer(model, make_inputs({session.get_inputs()[0].name: rows}))
        for name, expected in zip(names, session.run(names, {session.get_inputs()[0].name: rows}), strict=True):
            served_output = result.as_numpy(name)
            if expected.ndim == 1 and client.get_model_config(model).config.max_batch_size > 0:
                # Nothing after the batch dim: `dims: [1]`, served as [batch, 1], as Triton's onnxruntime backend
                # completes such an output (docs/models.md).
                expected = expected[:, None]
            assert served_output.shape == expected.shape, (model, name, len(rows))
            if expected.dtype.kind == "f":
                assert_close(served_output, expected)
            else:
                np.testing.assert_array_equal(served_output, expected)


@pytest.mark.parametrize("model", ["sklearn_logistic", "lightgbm"])
def test_the_metadata_advertises_the_shapes_that_are_served(served, model):
    _, client, files = served
    x = training_data()[0][:2]
    metadata = {o.name: list(o.shape) for o in client.get_model_metadata(model).outputs}
    result = client.infer(model, make_inputs({client.get_model_metadata(model).inputs[0].name: x}))
    for name, dims in metadata.items():
        shape = list(result.as_numpy(name).shape)
        assert len(dims) == len(shape) and all(d in (-1, s) for d, s in zip(dims, shape, strict=True)), (name, dims)


def test_a_zipmap_classifier_is_refused_naming_the_exporters_fix(served):
    stack, client, _ = served
    states = {s["name"]: s for s in stack.triton.model_states()}
    assert states["sklearn_logistic"]["state"] == states["lightgbm"]["state"] == "READY"
    assert states["sklearn_zipmap"]["state"] == "UNAVAILABLE"
    assert "zipmap=False" in states["sklearn_zipmap"]["reason"]
    assert client.is_server_live() and client.is_model_ready("lightgbm")  # the others keep serving
