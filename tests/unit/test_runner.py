import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tritonnx.backend.errors import InvalidInputError, ModelConfigError, ModelExecutionError
from tritonnx.backend.onnx_io import read_file_io
from tritonnx.backend.runner import OnnxModelRunner
from tritonnx.backend.settings import SessionSettings

SETTINGS = SessionSettings.from_model_config({}, cores=1)


@pytest.fixture
def double(double_onnx):
    return OnnxModelRunner.load(double_onnx, "double", SETTINGS, max_batch_size=8)


@pytest.fixture
def masked_sum(masked_sum_onnx):
    return OnnxModelRunner.load(masked_sum_onnx, "masked_sum", SETTINGS, 8, frozenset({"ids", "mask"}))


def test_signature_comes_from_the_graph(double_onnx):
    inputs, outputs = read_file_io(double_onnx, batched=True)
    assert [(s.name, s.config_type, s.dims) for s in inputs] == [("x", "TYPE_FP32", (4,))]
    assert [(s.name, s.config_type, s.dims) for s in outputs] == [("y", "TYPE_FP32", (4,))]
    inputs, _ = read_file_io(double_onnx, batched=False)
    assert inputs[0].dims == (-1, 4)


def test_a_batch_is_one_run_and_each_request_gets_its_own_rows(double):
    calls = []
    real_run = double.session.run
    double.session = type("Counting", (), {"run": lambda _, *a: calls.append(a[1]["x"].shape) or real_run(*a)})()
    requests = [{"x": np.full((n, 4), n, np.float32)} for n in (1, 3, 2)]
    results = double.infer(requests)
    assert calls == [(6, 4)]
    for n, result in zip((1, 3, 2), results, strict=False):
        np.testing.assert_array_equal(result["y"], np.full((n, 4), 2 * n, np.float32))


def test_a_bad_request_fails_alone(double):
    good = {"x": np.ones((1, 4), np.float32)}
    results = double.infer([good, {"x": np.ones((1, 4), np.int32)}, good, {}])
    assert isinstance(results[1], InvalidInputError) and "datatype INT32, expected FP32" in str(results[1])
    assert isinstance(results[3], InvalidInputError) and "missing input(s) 'x'" in str(results[3])
    for index in (0, 2):
        np.testing.assert_array_equal(results[index]["y"], [[2, 2, 2, 2]])


def test_ragged_requests_batched_equal_requests_alone(masked_sum):
    rng = np.random.default_rng(0)
    requests = []
    for length in (3, 7, 1, 5):
        ids = rng.integers(1, 100, size=(1, length), dtype=np.int64)
        requests.append({"ids": ids, "mask": np.ones_like(ids)})
    together = masked_sum.infer(requests)
    for request, result in zip(requests, together, strict=False):
        alone = masked_sum.infer([request])[0]
        assert result["total"][0, 0] == request["ids"].sum() == alone["total"][0, 0]
        assert result["length"][0, 0] == request["ids"].shape[1]


def test_text_requests_cut_by_length_answer_as_one_padded_batch_and_as_alone(tmp_path):
    from tritonnx.offline.demo_models.text_classifier import build_text_classifier

    path = tmp_path / "model.onnx"
    onnx.save(build_text_classifier(), path)
    runner = OnnxModelRunner.load(path, "text", SETTINGS, 8, frozenset({"input_ids", "attention_mask"}))
    calls = []
    real_run = runner.session.run
    runner.session = type(
        "Counting", (), {"run": lambda _, *a: calls.append(a[1]["input_ids"].shape) or real_run(*a)}
    )()
    rng = np.random.default_rng(0)
    requests = []
    for length in (8, 128, 16, 120, 8, 64):
        ids = rng.integers(1, 1000, size=(1, length))
        requests.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    results = runner.infer(requests)
    assert sorted(calls) == [(1, 16), (1, 64), (2, 8), (2, 128)]  # similar lengths share a run, no more
    padded = np.zeros((len(requests), 128), np.int64)
    for row, request in enumerate(requests):
        padded[row, : request["input_ids"].shape[1]] = request["input_ids"][0]
    one_padded_batch = real_run(None, {"input_ids": padded, "attention_mask": (padded > 0).astype(np.int64)})[0]
    for row, (request, result) in enumerate(zip(requests, results, strict=True)):
        alone = real_run(None, request)[0]
        np.testing.assert_allclose(result["logits"], alone, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(result["logits"], one_padded_batch[row : row + 1], rtol=1e-5, atol=1e-5)


class FailsOnNegative:
    """Wraps a session: any negative value in `x` fails the whole run, as a bad row would."""

    def __init__(self, session):
        self.session = session

    def run(self, names, feeds, options=None):
        if (feeds["x"] < 0).any():
            raise RuntimeError(
                "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned "
                "while running Mul node. Status Message: /onnxruntime_src/onnxruntime/core/"
                "providers/cpu/math/element_wise_ops.h:540 void onnxruntime::Init(ptrdiff_t) "
                "cannot take negative values"
            )
        return self.session.run(names, feeds, options)


def test_a_request_that_breaks_the_shared_run_is_retried_alone_and_fails_alone(double):
    double.session = FailsOnNegative(double.session)
    good, bad = {"x": np.ones((1, 4), np.float32)}, {"x": -np.ones((2, 4), np.float32)}
    results = double.infer([good, bad, good])
    assert isinstance(results[1], InvalidInputError)
    assert "cannot run on this input" in str(results[1]) and "cannot take negative values" in str(results[1])
    assert "onnxruntime_src" not in str(results[1]) and "ptrdiff_t" not in str(results[1])
    np.testing.assert_array_equal(results[0]["y"], [[2, 2, 2, 2]])
    np.testing.assert_array_equal(results[2]["y"], [[2, 2, 2, 2]])


def test_a_model_that_fails_for_everyone_reports_an_execution_error(double):
    class Broken:
        def run(self, *args):
            raise RuntimeError("out of memory")

    double.session = Broken()
    results = double.infer([{"x": np.ones((1, 4), np.float32)}, {"x": np.ones((1, 4), np.float32)}])
    assert all(isinstance(r, ModelExecutionError) and "out of memory" in str(r) for r in results)


def test_inputs_sharing_a_symbolic_dim_must_agree(masked_sum):
    results = masked_sum.infer(
        [
            {"ids": np.ones((1, 6), np.int64), "mask": np.ones((1, 5), np.int64)},
            {"ids": np.ones((1, 2), np.int64), "mask": np.ones((1, 2), np.int64)},
        ]
    )
    assert isinstance(results[0], InvalidInputError)
    assert "inputs 'ids' and 'mask' disagree on the size of dim 'sequence' (6 and 5)" in str(results[0])
    assert results[1]["total"][0, 0] == 2


def test_the_session_uses_the_configured_threads(double_onnx):
    settings = SessionSettings.from_model_config(
        {"parameters": {"intra_op_thread_count": {"string_value": "1"}}}, cores=2
    )
    runner = OnnxModelRunner.load(double_onnx, "double", settings, 8)
    assert isinstance(runner.session, ort.InferenceSession)
    assert runner.signature.max_batch_size == 8 and runner.signature.batched


def test_a_lone_failure_after_the_model_has_run_blames_the_input(double):
    assert "y" in double.infer([{"x": np.ones((1, 4), np.float32)}])[0]
    double.session = FailsOnNegative(double.session)
    result = double.infer([{"x": -np.ones((1, 4), np.float32)}])[0]
    assert isinstance(result, InvalidInputError) and "cannot take negative values" in str(result)


# Shapes that only a model which does not batch (or a graph unlike the demo models) has.
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.graphs import string_upper  # noqa: E402
from tests.unit.conftest import save_graph  # noqa: E402


def value(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def reference(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_model_that_does_not_batch_answers_its_whole_first_dim(tmp_path):
    path = save_graph(
        tmp_path / "neg.onnx",
        [helper.make_node("Neg", ["x"], ["y"])],
        [value("x", TensorProto.FLOAT, ["n", 4, 5])],
        [value("y", TensorProto.FLOAT, ["n", 4, 5])],
    )
    runner = OnnxModelRunner.load(path, "neg", SETTINGS, max_batch_size=0)
    data = [np.full((n, 4, 5), n, np.float32) for n in (3, 1, 2)]
    for array, result in zip(data, runner.infer([{"x": a} for a in data]), strict=False):
        assert result["y"].shape == array.shape
        np.testing.assert_array_equal(result["y"], -array)


def test_scalars_are_taken_and_given_as_shape_1(tmp_path):
    path = save_graph(
        tmp_path / "scale.onnx",
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        [value("x", TensorProto.FLOAT, []), value("k", TensorProto.FLOAT, [])],
        [value("y", TensorProto.FLOAT, [])],
    )
    runner = OnnxModelRunner.load(path, "scale", SETTINGS, max_batch_size=0)
    result = runner.infer([{"x": np.array([3.0], np.float32), "k": np.array([2.0], np.float32)}])[0]
    assert result["y"].shape == (1,) and result["y"][0] == 6.0


def test_a_batched_output_that_does_not_follow_the_batch_dim_runs_each_request_alone(tmp_path):
    # Every first dim is dynamic, yet the output sums over it: stacking requests would mix them. The runner is built
    # without the load's verdicts (as for a graph whose check could not run): the run-time check on shapes catches it.
    axes = numpy_helper.from_array(np.array([-2], np.int64), "axes")
    path = save_graph(
        tmp_path / "colsum.onnx",
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        [value("x", TensorProto.FLOAT, ["n", 4])],
        [value("y", TensorProto.FLOAT, ["m", 4])],
        [axes],
    )
    lines = []
    loaded = OnnxModelRunner.load(path, "colsum", SETTINGS, max_batch_size=8, log=lines.append)
    assert loaded.coupled and "ReduceSum over axis 0, the batch axis" in lines[0]  # -2 of a rank-2 input
    runner = OnnxModelRunner(loaded.session, loaded.signature, log=lines.append)
    requests = [{"x": np.full((n, 4), n, np.float32)} for n in (2, 3)]
    results = runner.infer(requests)
    for request, result in zip(requests, results, strict=False):
        np.testing.assert_array_equal(result["y"], reference(path, request)[0])
    assert any("output 'y' has shape [1, 4] for a batch of 5" in line for line in lines)


def test_a_warm_up_that_would_kill_the_process_is_caught_in_a_child(tmp_path):
    # y = x * MIN / (x - 2) over int64: ones divide the smallest int64 by -1, a SIGFPE no Python code survives
    # (ONNX Runtime refuses a division by zero with an error, not this overflow).
    smallest = numpy_helper.from_array(np.array(np.iinfo(np.int64).min, np.int64), "smallest")
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    path = save_graph(
        tmp_path / "fpe.onnx",
        [
            helper.make_node("Mul", ["x", "smallest"], ["n"]),
            helper.make_node("Sub", ["x", "two"], ["d"]),
            helper.make_node("Div", ["n", "d"], ["y"]),
        ],
        [value("x", TensorProto.INT64, ["n"])],
        [value("y", TensorProto.INT64, ["n"])],
        [smallest, two],
    )
    lines = []
    runner = OnnxModelRunner.load(path, "fpe", SETTINGS, max_batch_size=0, log=lines.append)
    assert lines == ["model 'fpe': warm-up with ones was killed by SIGFPE in a child process; serving without warm-up"]
    request = {"x": np.array([3, 5], np.int64)}
    np.testing.assert_array_equal(runner.infer([request])[0]["y"], reference(path, request)[0])


def test_a_warm_up_no_shape_fits_is_skipped_with_a_log_line(tmp_path):
    # Reshape to [2, 2]: only 4 elements fit, no warm-up length gives 4. ONNX Runtime raises, nothing dies.
    shape = numpy_helper.from_array(np.array([2, 2], np.int64), "shape")
    path = save_graph(
        tmp_path / "square.onnx",
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [value("x", TensorProto.FLOAT, ["n"])],
        [value("y", TensorProto.FLOAT, [2, 2])],
        [shape],
    )
    lines = []
    runner = OnnxModelRunner.load(path, "square", SETTINGS, max_batch_size=0, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith("model 'square': warm-up skipped, no input shape tried ran (x [1]: ")
    assert "x [16]: " in lines[0] and "x [512]: " in lines[0] and lines[0].endswith("first-run allocation")
    assert runner.infer([{"x": np.arange(4, dtype=np.float32)}])[0]["y"].shape == (2, 2)


def test_an_audio_model_whose_first_convolution_needs_more_samples_warms_up_longer(tmp_path):
    # wav2vec2's feature encoder in small: three strided convolutions, which one sample (or 16) cannot pass.
    weights = [numpy_helper.from_array(np.ones((1, 1, k), np.float32), f"w{k}") for k in (10, 3)]
    path = save_graph(
        tmp_path / "audio.onnx",
        [
            helper.make_node("Unsqueeze", ["samples", "axes"], ["wave"]),
            helper.make_node("Conv", ["wave", "w10"], ["c1"], strides=[5]),
            helper.make_node("Conv", ["c1", "w3"], ["c2"], strides=[2]),
            helper.make_node("Conv", ["c2", "w3"], ["features"], strides=[2]),
        ],
        [value("samples", TensorProto.FLOAT, ["batch", "sequence"])],
        [value("features", TensorProto.FLOAT, ["batch", 1, "frames"])],
        [*weights, numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    lines = []
    OnnxModelRunner.load(path, "audio", SETTINGS, max_batch_size=4, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith("model 'audio': warmed up with samples [1, 512] (samples [1, 1]: ")


def test_a_decoder_with_past_warms_up_with_an_empty_past_and_a_mask_as_long_as_both(tmp_path):
    # GPT-2 exported with past keys and values: the mask spans past + new tokens, and ones everywhere do not fit.
    embedding = numpy_helper.from_array(np.ones((100, 4), np.float32), "embedding")
    path = save_graph(
        tmp_path / "decoder.onnx",
        [
            helper.make_node("Gather", ["embedding", "input_ids"], ["new"]),
            helper.make_node("Concat", ["past", "new"], ["keys"], axis=1),
            helper.make_node("Cast", ["attention_mask"], ["weights"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["weights", "axes"], ["row"]),
            helper.make_node("MatMul", ["row", "keys"], ["attended"]),
        ],
        [
            value("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
            value("attention_mask", TensorProto.INT64, ["batch", "past_sequence_length + sequence_length"]),
            value("past", TensorProto.FLOAT, ["batch", "past_sequence_length", 4]),
        ],
        [value("attended", TensorProto.FLOAT, ["batch", 1, 4])],
        [embedding, numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    lines = []
    OnnxModelRunner.load(path, "decoder", SETTINGS, max_batch_size=4, log=lines.append)
    assert lines == []  # the first shape tried ran: past 0, sequence 1, mask 1


def test_strings_booleans_and_empty_tensors_run_as_in_process(tmp_path):
    path = save_graph(
        tmp_path / "mixed.onnx",
        [
            helper.make_node("Identity", ["text"], ["text_out"]),
            helper.make_node("Not", ["flag"], ["flag_out"]),
            helper.make_node("Abs", ["values"], ["values_out"]),
        ],
        [
            value("text", TensorProto.STRING, ["n"]),
            value("flag", TensorProto.BOOL, [2]),
            value("values", TensorProto.FLOAT, ["m"]),
        ],
        [
            value("text_out", TensorProto.STRING, ["n"]),
            value("flag_out", TensorProto.BOOL, [2]),
            value("values_out", TensorProto.FLOAT, ["m"]),
        ],
    )
    runner = OnnxModelRunner.load(path, "mixed", SETTINGS, max_batch_size=0)
    text = np.array([b"", "\u00e9t\u00e9".encode(), b"a\x00b"], dtype=object)
    result = runner.infer([{"text": text, "flag": np.array([True, False]), "values": np.zeros(0, np.float32)}])[0]
    assert result["text_out"].tolist() == ["", "\u00e9t\u00e9", "a\x00b"]
    assert result["flag_out"].tolist() == [False, True]
    assert result["values_out"].shape == (0,)


def test_a_custom_operator_library_of_the_config_is_registered_with_the_session(tmp_path):
    from onnxruntime_extensions import get_library_path

    path = string_upper(tmp_path / "upper.onnx")
    config = {"model_operations": {"op_library_filename": [get_library_path()]}}
    settings = SessionSettings.from_model_config(config, cores=1)
    runner = OnnxModelRunner.load(path, "upper", settings, max_batch_size=0)
    [result] = runner.infer([{"text": np.array(["tritonnx", "wörld"], dtype=object)}])
    assert result["upper"].tolist() == ["TRITONNX", "WöRLD"]
    with pytest.raises(ModelConfigError, match="model_operations: op_library_filename 'missing.so' is not a file"):
        SessionSettings.from_model_config({"model_operations": {"op_library_filename": ["missing.so"]}}, cores=1)


def test_an_openvino_session_gets_its_providers_and_never_the_optimized_copy(double_onnx, ort_cache_dir, monkeypatch):
    import tritonnx.backend.session_cache

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["OpenVINOExecutionProvider", "CPUExecutionProvider"])
    built = []
    real = ort.InferenceSession

    def recording(path, options, providers):
        built.append((path, providers))
        return real(path, options, providers=["CPUExecutionProvider"])  # this venv has no OpenVINO to run

    monkeypatch.setattr(tritonnx.backend.session_cache.ort, "InferenceSession", recording)
    config = {"optimization": {"execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino"}]}}}
    settings = SessionSettings.from_model_config(config, cores=1)
    runner = OnnxModelRunner.load(double_onnx, "double", settings, max_batch_size=8)
    np.testing.assert_array_equal(runner.infer([{"x": np.ones((1, 4), np.float32)}])[0]["y"], [[2, 2, 2, 2]])
    [(path, providers)] = built
    assert path == str(double_onnx)  # the model file itself
    assert providers == [
        ("OpenVINOExecutionProvider", {"device_type": "CPU", "load_config": '{"CPU": {"INFERENCE_NUM_THREADS": "1"}}'}),
        "CPUExecutionProvider",
    ]
    assert not ort_cache_dir.exists() or not any(ort_cache_dir.iterdir())  # no copy written for either provider
