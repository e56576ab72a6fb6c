"""The batch-axis rule of backend/batch_axis.py, each case proven by in-process ONNX Runtime: a graph the rule names
gives a row another answer beside other rows than alone, a graph it passes gives the same. The corpus of
tests/batch_corpus.py is judged here too, each graph with the verdict it expects (coupled, independent, or left
undecided to the check at load)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.batch_corpus import CORPUS
from tests.batch_corpus import rows as corpus_rows
from tests.graphs import batch_centred
from tritonnx.backend.onnx_io import read_graph_io
from tritonnx.backend.runner import rows_agree

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])


def ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def graph(nodes, opset=13, initializers=(), inputs=(X,), outputs=(Y,)) -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(nodes, "g", list(inputs), list(outputs), list(initializers)),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = 9
    return model


def add_to_x(node: onnx.NodeProto, cast: bool = False) -> list[onnx.NodeProto]:
    """The node's output 'z' broadcast back onto x, so y keeps one row per row of x."""
    if cast:
        return [
            node,
            helper.make_node("Cast", ["z"], ["zf"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["x", "zf"], ["y"]),
        ]
    return [node, helper.make_node("Add", ["x", "z"], ["y"])]


MIXING = {
    "ReduceMean axes attribute 0": (batch_centred(), "ReduceMean over axis 0, the batch axis"),
    "ReduceSum axes input 0": (
        graph(add_to_x(helper.make_node("ReduceSum", ["x", "axes"], ["z"])), initializers=[ints("axes", [0])]),
        "ReduceSum over axis 0",
    ),
    "ReduceMax axes from a Constant node, opset 18": (
        graph(
            [helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([0], np.int64))),
             *add_to_x(helper.make_node("ReduceMax", ["x", "axes"], ["z"]))],
            opset=18,
        ),
        "ReduceMax over axis 0",
    ),
    "ReduceMean over every axis": (graph(add_to_x(helper.make_node("ReduceMean", ["x"], ["z"]))), "over every axis"),
    "Softmax axis 0": (graph([helper.make_node("Softmax", ["x"], ["y"], axis=0)]), "Softmax over axis 0"),
    "ArgMax at its default axis": (graph(add_to_x(helper.make_node("ArgMax", ["x"], ["z"]), cast=True)), "ArgMax over axis 0"),
    "CumSum axis input 0": (
        graph([helper.make_node("CumSum", ["x", "axis"], ["y"])], initializers=[numpy_helper.from_array(np.array(0, np.int64), "axis")]),
        "CumSum over axis 0",
    ),
    "MeanVarianceNormalization at its default axes": (
        graph(
            [helper.make_node("MeanVarianceNormalization", ["x"], ["y"])],
            inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 2])],
            outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 2])],
        ),
        "MeanVarianceNormalization over axis 0",
    ),
    # Stateful in ONNX Runtime too (its running statistics move with each run): kept out of the served corpus.
    "BatchNormalization in training mode": (
        graph(
            [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1)],
            opset=15,
            initializers=[numpy_helper.from_array(np.full(3, v, np.float32), n) for n, v in zip("sbmv", (1, 0, 0, 1), strict=True)],
        ),
        "BatchNormalization in training mode normalises over the batch axis",
    ),
    "Gather of row 0": (
        graph(add_to_x(helper.make_node("Gather", ["x", "row"], ["z"], axis=0)), initializers=[ints("row", [0])]),
        "Gather picking rows of the batch",
    ),
    "ReduceSum over axis 1 after a Transpose": (
        graph(
            [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("ReduceSum", ["t", "axes"], ["s"], keepdims=1),
             helper.make_node("Transpose", ["s"], ["z"], perm=[1, 0]),
             helper.make_node("Add", ["x", "z"], ["y"])],
            initializers=[ints("axes", [1])],
        ),
        "ReduceSum over axis 1, the batch axis",
    ),
}  # fmt: skip

INDEPENDENT = {
    "ReduceMean over the last axis (a layer norm's)": graph(
        add_to_x(helper.make_node("ReduceMean", ["x"], ["z"], axes=[-1]))
    ),
    "ReduceSum over axis 0 after a Transpose": graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
         helper.make_node("ReduceSum", ["t", "axes"], ["s"], keepdims=1),
         helper.make_node("Transpose", ["s"], ["z"], perm=[1, 0]),
         helper.make_node("Add", ["x", "z"], ["y"])],
        initializers=[ints("axes", [0])],
    ),
    "ReduceProd over a Shape's axis 0": graph(
        [helper.make_node("Shape", ["x"], ["shape"], start=1),
         helper.make_node("ReduceProd", ["shape"], ["n"], axes=[0]),
         *add_to_x(helper.make_node("Identity", ["n"], ["z"]), cast=True)],
        opset=15,
    ),
    "ReduceSum with empty axes and noop_with_empty_axes": graph(
        add_to_x(helper.make_node("ReduceSum", ["x", "axes"], ["z"], noop_with_empty_axes=1)),
        initializers=[ints("axes", [])],
    ),
    "Softmax at its default axis": graph([helper.make_node("Softmax", ["x"], ["y"])]),
    "ReduceSum over axis 0 after an Unsqueeze at 0": graph(
        [helper.make_node("Unsqueeze", ["x", "zero"], ["u"]),
         helper.make_node("ReduceSum", ["u", "zero"], ["y"], keepdims=0)],
        initializers=[ints("zero", [0])],
    ),
    "a one-hot of batched ids, summed over tokens": graph(
        [helper.make_node("OneHot", ["ids", "depth", "values"], ["h"]),
         helper.make_node("ReduceSum", ["h"], ["y"], axes=[-2], keepdims=0)],
        initializers=[numpy_helper.from_array(np.array(10, np.int64), "depth"),
                      numpy_helper.from_array(np.array([0, 1], np.float32), "values")],
        inputs=[helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 4])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        opset=11,
    ),
    "position ids: a Range over the length of a row, added to each row": graph(
        [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Gather", ["shape", "one"], ["length"]),
         helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
         *add_to_x(helper.make_node("Identity", ["positions"], ["z"]), cast=True)],
        initializers=[numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", 0), ("one", 1))],
    ),
    "an embedding table gathered by batched ids, then a mean over tokens": graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]),
         helper.make_node("ReduceMean", ["e"], ["y"], axes=[1], keepdims=0)],
        initializers=[numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(10, 3), "table")],
        inputs=[helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 4])],
    ),
}  # fmt: skip


def rows_alone_and_batched(model: onnx.ModelProto, tmp_path) -> tuple[np.ndarray, np.ndarray]:
    """Two rows (the second 50 times louder) run one by one, and run as one batch."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    rng = np.random.default_rng(0)
    if name == "ids":
        rows = rng.integers(0, 10, (2, 4))
    else:
        shape = [2, *(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:])]
        rows = rng.standard_normal(shape).astype(np.float32) * np.array([1, 50], np.float32).reshape(
            2, *[1] * (len(shape) - 1)
        )
    alone = np.concatenate([session.run(None, {name: rows[i : i + 1]})[0] for i in range(2)])
    return alone, session.run(None, {name: rows})[0]


@pytest.mark.parametrize("case", MIXING)
def test_a_graph_that_mixes_rows_is_named_with_its_node(case, tmp_path):
    model, phrase = MIXING[case]
    alone, batched = rows_alone_and_batched(model, tmp_path)
    assert not np.allclose(alone, batched), "the case does not mix rows: it proves nothing"
    path = tmp_path / "m.onnx"
    reason = read_graph_io(path).batch_coupling()
    assert reason and phrase in reason and "(node '" in reason


@pytest.mark.parametrize("case", INDEPENDENT)
def test_a_graph_whose_rows_are_independent_is_not_named(case, tmp_path):
    alone, batched = rows_alone_and_batched(INDEPENDENT[case], tmp_path)
    np.testing.assert_array_equal(alone, batched)
    graph_io = read_graph_io(tmp_path / "m.onnx")
    assert graph_io.batch_coupling() is None and graph_io.batch_undecided() is None


# --- the corpus of tests/batch_corpus.py --------------------------------------------------------------------------


def stacked_and_alone(path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    alone = np.concatenate([session.run(None, {"x": rows[i : i + 1]})[0] for i in range(len(rows))])
    return session.run(None, {"x": rows})[0], alone


@pytest.mark.parametrize("case", CORPUS)
def test_the_rule_judges_each_corpus_graph_and_in_process_onnx_runtime_agrees(case, tmp_path):
    graph_case = CORPUS[case]
    path = tmp_path / "m.onnx"
    onnx.save(graph_case.model, path)
    stacked, alone = stacked_and_alone(path, corpus_rows(3, seed=0))
    assert (rows_agree({"y": stacked}, [{"y": row[None]} for row in alone]) is not None) == graph_case.coupled
    graph = read_graph_io(path)
    coupling, undecided = graph.batch_coupling(), graph.batch_undecided()
    verdict = "coupled" if coupling else "undecided" if undecided else "independent"
    assert verdict == graph_case.rule, (coupling, undecided)
    assert graph_case.phrase in (coupling or undecided or "")


UNDECIDED = {
    "axes given at run time": (
        graph(add_to_x(helper.make_node("ReduceSum", ["x", "axes"], ["z"])),
              inputs=[X, helper.make_tensor_value_info("axes", TensorProto.INT64, [1])]),
        "ReduceSum takes its axes at run time",
    ),
    "a Squeeze with no axes": (
        graph([helper.make_node("Squeeze", ["x"], ["s"]), helper.make_node("Identity", ["s"], ["y"])]),
        "Squeeze with no axes drops the batch axis of a batch of one",
    ),
    "a Reshape to [-1, 4] of rows of unknown size": (
        graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], initializers=[ints("shape", [-1, 4])],
              inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])]),
        "Reshape to [-1, 4] keeps the rows apart only if each holds 4 elements",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", UNDECIDED)
def test_what_the_rule_cannot_judge_is_named_and_left_to_the_check_at_load(case, tmp_path):
    model, phrase = UNDECIDED[case]
    onnx.save(model, tmp_path / "m.onnx")
    graph_io = read_graph_io(tmp_path / "m.onnx")
    assert graph_io.batch_coupling() is None
    assert phrase in (graph_io.batch_undecided() or "")


def test_each_operator_is_one_entry_of_the_table_and_each_module_of_the_rule_is_short():
    from tritonnx.backend.batch_axis import operators

    assert {"MatMul", "Reshape", "Equal", "Where", "Range", "ConstantOfShape", "Softmax"} <= set(operators.OPERATORS)
    assert operators.OPERATORS["Trilu"].axis is None  # known for its dims only: the check at load judges it
    folder = Path(operators.__file__).parent
    long = {f.name: n for f in folder.glob("*.py") if (n := len(f.read_text().splitlines())) > 400}
    assert not long, long
