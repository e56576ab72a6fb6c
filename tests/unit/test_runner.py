import numpy as np
import onnxruntime as ort
import pytest

from backend.errors import InvalidInputError, ModelExecutionError
from backend.onnx_io import read_file_io
from backend.runner import OnnxModelRunner
from backend.settings import SessionSettings

SETTINGS = SessionSettings.from_model_config({}, cores=1)


@pytest.fixture
def double(double_onnx):
    return OnnxModelRunner.load(double_onnx, "double", SETTINGS, max_batch_size=8)


@pytest.fixture
def masked_sum(masked_sum_onnx):
    return OnnxModelRunner.load(masked_sum_onnx, "masked_sum", SETTINGS, 8, frozenset({"ids", "mask"}))


def test_signature_comes_from_the_graph(double_onnx):
    inputs, outputs = read_file_io(double_onnx, batched=True)
    assert [(s.name, s.triton_type, s.dims) for s in inputs] == [("x", "TYPE_FP32", (4,))]
    assert [(s.name, s.triton_type, s.dims) for s in outputs] == [("y", "TYPE_FP32", (4,))]
    inputs, _ = read_file_io(double_onnx, batched=False)
    assert inputs[0].dims == (-1, 4)


def test_a_batch_is_one_run_and_each_request_gets_its_own_rows(double):
    calls = []
    real_run = double.session.run
    double.session = type("Counting", (), {"run": lambda _, *a: calls.append(a[1]["x"].shape) or real_run(*a)})()
    requests = [{"x": np.full((n, 4), n, np.float32)} for n in (1, 3, 2)]
    results = double.infer(requests)
    assert calls == [(6, 4)]
    for n, result in zip((1, 3, 2), results):
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
    for request, result in zip(requests, together):
        alone = masked_sum.infer([request])[0]
        assert result["total"][0, 0] == request["ids"].sum() == alone["total"][0, 0]
        assert result["length"][0, 0] == request["ids"].shape[1]


class FailsOnNegative:
    """Wraps a session: any negative value in `x` fails the whole run, as a bad row would."""

    def __init__(self, session):
        self.session = session

    def run(self, names, feeds, options=None):
        if (feeds["x"] < 0).any():
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned "
                               "while running Mul node. Status Message: /onnxruntime_src/onnxruntime/core/"
                               "providers/cpu/math/element_wise_ops.h:540 void onnxruntime::Init(ptrdiff_t) "
                               "cannot take negative values")
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
        [{"ids": np.ones((1, 6), np.int64), "mask": np.ones((1, 5), np.int64)},
         {"ids": np.ones((1, 2), np.int64), "mask": np.ones((1, 2), np.int64)}]
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
