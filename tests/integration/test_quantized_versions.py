"""INT8 versions published with `tritonnx-models publish --quantize` to a real tritonserver.

Every served answer is compared with in-process ONNX Runtime on the version's own file: the INT8 graph for the
published versions, the FP32 graph for a refused one. The models are a small convolutional classifier
(tests/graphs.py), quantized statically, and the demo text_classifier (a small BERT-style encoder), quantized
dynamically, each behind a config with Triton's dynamic batcher, which gathers concurrent requests into one execute.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.graphs import small_classifier
from tests.kserve import infer_concurrently, make_inputs, reference_session
from tests.serving import onnx_file
from tritonnx.commands import models as models_cli
from tritonnx.common.admin import ADMIN_KEY_ENV
from tritonnx.offline.quantize import REPORT_FILE
from tritonnx.server.stack import ServingStack
from tritonnx.server.versions import ModelFolder

# A queue delay long enough for concurrent requests to reach the model in one execute.
CONFIG = 'backend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n'
MODELS = ("classifier", "refused", "encoder")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(stack, repository, sample folders), each model at version 1, its FP32 graph."""
    workdir = tmp_path_factory.mktemp("quantized-versions")
    repository = workdir / "repository"
    for name in MODELS:
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(CONFIG)
    small_classifier(repository / "classifier" / "1" / "model.onnx", seed=0)
    small_classifier(repository / "refused" / "1" / "model.onnx", seed=1)
    (repository / "encoder" / "1" / "model.onnx").write_bytes(onnx_file("text_classifier").read_bytes())
    rng = np.random.default_rng(0)
    samples = {name: workdir / name for name in ("images", "zeros", "holdout", "ids")}
    for folder in samples.values():
        folder.mkdir()
    np.save(samples["images"] / "a.npy", rng.standard_normal((20, 3, 16, 16), dtype=np.float32))
    np.save(samples["zeros"] / "a.npy", np.zeros((20, 3, 16, 16), np.float32))
    np.save(samples["holdout"] / "a.npy", rng.standard_normal((8, 3, 16, 16), dtype=np.float32))
    np.savez(
        samples["ids"] / "a.npz", input_ids=rng.integers(1, 1000, (8, 16)), attention_mask=np.ones((8, 16), np.int64)
    )
    with ServingStack(repository, workdir, with_facade=False, triton_http=False) as stack:
        yield stack, repository, samples


@pytest.fixture(scope="module")
def client(served):
    with grpcclient.InferenceServerClient(served[0].triton.grpc_url) as client:
        yield client


def publish(served, monkeypatch, *argv: str) -> int:
    stack, repository, _ = served
    monkeypatch.setenv(ADMIN_KEY_ENV, stack.triton.admin_key)
    return models_cli.main(["publish", *argv, "--url", stack.triton.grpc_url, "--repository", str(repository)])


def test_a_static_int8_version_serves_what_in_process_onnx_runtime_computes_on_its_file(served, client, monkeypatch):
    stack, repository, samples = served
    fp32 = repository / "classifier" / "1" / "model.onnx"
    assert publish(served, monkeypatch, "classifier", str(fp32), "--quantize", "static",
                   "--calibration", str(samples["images"])) == 0  # fmt: skip
    version = repository / "classifier" / "2"
    assert sorted(p.name for p in version.iterdir()) == ["model.onnx", REPORT_FILE]  # Triton loads it beside the report
    report = json.loads((version / REPORT_FILE).read_text())
    assert report["quantizer"]["quant_format"] == "QDQ" and report["holdout"]["samples"] == 4
    assert [run["batch"] for run in report["speed"]["runs"]] == [1, 8]  # the served config's max_batch_size
    states = {s["version"]: s["state"] for s in stack.triton.model_states() if s["name"] == "classifier"}
    assert states["2"] == "READY"  # version 1 unloads (UNLOADING, then UNAVAILABLE) once its requests are answered
    int8 = reference_session(version / "model.onnx")
    images = [np.random.default_rng(i).standard_normal((1, 3, 16, 16), dtype=np.float32) for i in range(8)]
    answers = infer_concurrently(client, "classifier", [{"image": image} for image in images], ["scores"])
    for image, answer in zip(images, answers, strict=True):
        assert answer.error is None
        np.testing.assert_allclose(answer.outputs["scores"], int8.run(["scores"], {"image": image})[0], rtol=1e-5)
    assert client.infer("classifier", make_inputs({"image": images[0]})).get_response().model_version == "2"


def test_a_dynamic_int8_version_runs_each_request_alone_though_the_config_batches(served, client, monkeypatch):
    stack, repository, samples = served
    fp32 = repository / "encoder" / "1" / "model.onnx"
    assert publish(served, monkeypatch, "encoder", str(fp32), "--quantize", "dynamic", "--holdout",
                   str(samples["ids"])) == 0  # fmt: skip
    version = repository / "encoder" / "2"
    report = json.loads((version / REPORT_FILE).read_text())
    assert "DynamicQuantizeLinear" in report["batch_coupled"]
    assert client.get_model_config("encoder").config.HasField("dynamic_batching")
    int8 = reference_session(version / "model.onnx")
    rng = np.random.default_rng(3)
    requests = [{"input_ids": rng.integers(1, 1000, (1, 16)), "attention_mask": np.ones((1, 16), np.int64)}
                for _ in range(16)]  # fmt: skip
    # Stacked, a request gets another answer (one scale over both rows): what serving them together would return.
    stacked = {name: np.concatenate([r[name] for r in requests[:2]]) for name in requests[0]}
    assert not np.array_equal(int8.run(["logits"], stacked)[0][:1], int8.run(["logits"], requests[0])[0])
    answers = infer_concurrently(client, "encoder", requests, ["logits"])
    for request, answer in zip(requests, answers, strict=True):
        assert answer.error is None
        np.testing.assert_array_equal(answer.outputs["logits"], int8.run(["logits"], request)[0])
    [stats] = client.get_inference_statistics("encoder", "2").model_stats
    assert stats.execution_count < stats.inference_count  # Triton did gather requests into one execute
    assert stack.triton.log_file is not None
    assert "model 'encoder': its rows are not independent" in stack.triton.log_file.read_text(errors="replace")


def test_a_refused_quantization_publishes_nothing_and_the_fp32_version_keeps_serving(served, client, monkeypatch,
                                                                                   capsys):  # fmt: skip
    stack, repository, samples = served
    fp32 = repository / "refused" / "1" / "model.onnx"
    code = publish(served, monkeypatch, "refused", str(fp32), "--quantize", "static", "--calibration",
                   str(samples["zeros"]), "--holdout", str(samples["holdout"]))  # fmt: skip
    error = capsys.readouterr().err
    assert code == 1
    assert "was refused: " in error and "cosine similarity of the outputs 0." in error
    assert "required >= 0.9900 (--min-cosine)" in error
    assert "nothing was published, refused serves version 1 as before" in error
    assert ModelFolder.find(repository, "refused").versions() == [1]
    assert sorted(p.name for p in (repository / "refused").iterdir()) == ["1", "config.pbtxt"]  # no staging left
    states = {s["version"]: s["state"] for s in stack.triton.model_states() if s["name"] == "refused"}
    assert states == {"1": "READY"}
    image = np.random.default_rng(9).standard_normal((1, 3, 16, 16), dtype=np.float32)
    result = client.infer("refused", make_inputs({"image": image}))
    np.testing.assert_allclose(result.as_numpy("scores"), reference_session(fp32).run(["scores"], {"image": image})[0],
                               rtol=1e-5)  # fmt: skip
    assert result.get_response().model_version == "1"
