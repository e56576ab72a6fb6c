"""Batch independence at load: a graph whose rows mix runs each request alone, by the batch-axis rule or by the check
at load; the corpus of tests/batch_corpus.py, each graph with its verdict and every request its own answer."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.batch_corpus import CORPUS
from tests.batch_corpus import rows as corpus_rows
from tests.graphs import LOUD_ID, quantized_encoder
from tests.unit.conftest import save_graph
from tritonnx.backend.runner import OnnxModelRunner, rows_agree
from tritonnx.backend.settings import SessionSettings

SETTINGS = SessionSettings.from_model_config({}, cores=1)


def value(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def reference(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_graph_found_at_load_to_reduce_over_the_batch_axis_runs_each_request_alone(tmp_path):
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    path = save_graph(
        tmp_path / "colsum.onnx",
        [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), helper.make_node("Sub", ["x", "s"], ["y"])],
        [value("x", TensorProto.FLOAT, ["n", 4])],
        [value("y", TensorProto.FLOAT, ["n", 4])],
        [axes],
    )
    lines = []
    runner = OnnxModelRunner.load(path, "centred", SETTINGS, max_batch_size=8, log=lines.append)
    assert any("ReduceSum over axis 0, the batch axis" in line and "each request runs alone" in line for line in lines)
    requests = [{"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4) * n} for n in (2, 3)]
    for request, result in zip(requests, runner.infer(requests), strict=True):
        np.testing.assert_array_equal(result["y"], reference(path, request)[0])


def test_a_batch_coupled_graph_runs_each_request_alone_whatever_the_batcher_gathered(tmp_path):
    # Dynamic quantization takes one scale over the batch: stacked with a loud request, a quiet one would change.
    quantized = quantized_encoder(tmp_path)
    lines: list[str] = []
    runner = OnnxModelRunner.load(quantized, "encoder", SETTINGS, max_batch_size=8, log=lines.append)
    assert any("its rows are not independent (DynamicQuantizeLinear" in line for line in lines)
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    requests = [{"ids": np.array([[1, 2, 3, 4, 5]])}, {"ids": np.full((1, 5), LOUD_ID)}, {"ids": np.array([[7] * 5])}]
    for request, result in zip(requests, runner.infer(requests), strict=True):
        np.testing.assert_array_equal(result["logits"], session.run(["logits"], request)[0])


# --- batch independence: the corpus of tests/batch_corpus.py, and the check at load -------------------------------


@pytest.mark.parametrize("case", CORPUS)
def test_each_corpus_graph_gets_its_verdict_at_load_and_every_request_its_own_answer(case, tmp_path):
    graph_case = CORPUS[case]
    path = tmp_path / "m.onnx"
    onnx.save(graph_case.model, path)
    lines: list[str] = []
    runner = OnnxModelRunner.load(path, case, SETTINGS, max_batch_size=8, log=lines.append)
    assert runner.coupled == graph_case.coupled, lines
    if graph_case.rule == "coupled":
        assert lines and "its rows are not independent (" in lines[0] and "each request runs alone" in lines[0]
        assert runner.batching == "each request runs alone (the batch-axis rule)"
    elif graph_case.rule == "undecided":
        [line] = lines
        verdict = "disagree (output 'y' differs by up to" if graph_case.coupled else "agree: it batches"
        assert f"model '{case}': " in line and verdict in line and graph_case.phrase in line
        alone = "each request runs alone (rows checked at load differ)"
        assert runner.batching == (alone if graph_case.coupled else "batches (rows checked at load agree)")
    else:
        assert lines == []
        assert runner.batching == "batches (the batch-axis rule finds its rows independent)"
    requests = [{"x": corpus_rows(n, seed=n)} for n in (1, 2, 1)]
    for request, result in zip(requests, runner.infer(requests), strict=True):
        expected = reference(path, request)[0]
        if graph_case.coupled:
            np.testing.assert_array_equal(result["y"], expected)  # its own run, as in-process
        else:
            assert rows_agree({"y": result["y"]}, [{"y": expected}]) is None


def test_a_check_whose_values_the_model_rejects_keeps_the_rules_verdict(tmp_path):
    # A table of two rows looked up by ids: ones (the warm-up's) fit, the check's values up to 3 do not.
    table = numpy_helper.from_array(np.ones((2, 4), np.float32), "table")
    path = save_graph(
        tmp_path / "lookup.onnx",
        [helper.make_node("Gather", ["table", "ids"], ["y"])],
        [value("ids", TensorProto.INT64, ["n"])],
        [value("y", TensorProto.FLOAT, ["n", 4])],
        [table],
    )
    lines: list[str] = []
    runner = OnnxModelRunner.load(path, "lookup", SETTINGS, max_batch_size=8, log=lines.append)
    assert not runner.coupled
    [line] = lines
    assert line.startswith("model 'lookup': the batch-independence check could not run (ids [3]: ")
    assert line.endswith("the rule's verdict stands: it batches")


def test_a_graph_the_rule_cannot_judge_whose_check_cannot_run_runs_each_request_alone(tmp_path):
    # The same lookup, then an operator the rule does not know: nothing shows its rows independent.
    table = numpy_helper.from_array(np.ones((2, 2), np.float32), "table")
    path = save_graph(
        tmp_path / "lookup_trilu.onnx",
        [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Trilu", ["e"], ["y"])],
        [value("ids", TensorProto.INT64, ["n", 2])],
        [value("y", TensorProto.FLOAT, ["n", 2, 2])],
        [table],
    )
    lines: list[str] = []
    runner = OnnxModelRunner.load(path, "lookup_trilu", SETTINGS, max_batch_size=8, log=lines.append)
    assert runner.coupled
    assert runner.batching == "each request runs alone (the batch-axis rule cannot judge it, and no check at load ran)"
    [line] = lines
    assert line.startswith("model 'lookup_trilu': the batch-independence check could not run (ids [3, 2]: ")
    assert line.endswith(
        "Trilu is an operator the rule does not know (domain 'ai.onnx') (node 'y')): each request runs alone"
    )


def test_the_check_of_a_graph_that_divides_runs_in_a_child_first(tmp_path):
    # y = x * MIN / (x - 4) over int64: ones (the warm-up's) pass, the check's small values (0-3) divide the smallest
    # int64 by -1, a SIGFPE no Python code survives.
    smallest = numpy_helper.from_array(np.array(np.iinfo(np.int64).min, np.int64), "smallest")
    four = numpy_helper.from_array(np.array(4, np.int64), "four")
    path = save_graph(
        tmp_path / "fpe.onnx",
        [
            helper.make_node("Mul", ["x", "smallest"], ["n"]),
            helper.make_node("Sub", ["x", "four"], ["d"]),
            helper.make_node("Div", ["n", "d"], ["y"]),
        ],
        [value("x", TensorProto.INT64, ["n"])],
        [value("y", TensorProto.INT64, ["n"])],
        [smallest, four],
    )
    lines: list[str] = []
    runner = OnnxModelRunner.load(path, "fpe", SETTINGS, max_batch_size=8, log=lines.append)
    assert lines == [
        "model 'fpe': the batch-independence check was killed by SIGFPE in a child process; the rule's verdict "
        "stands: it batches"
    ]
    assert not runner.coupled
    request = {"x": np.array([[1], [2]], np.int64)}
    np.testing.assert_array_equal(
        runner.infer([request])[0]["y"], reference(path, {"x": request["x"].ravel()})[0][:, None]
    )
