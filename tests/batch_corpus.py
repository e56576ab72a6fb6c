"""A corpus of small graphs for batch independence: each takes x FP32 [n, 4] and answers y FP32 [n, 4].

The coupled graphs give a row another answer beside other rows than alone, one or more per pattern the batch-axis
rule (backend/batch_axis.py) names, and one it does not know (left to the check at load, backend/runner.py); the
controls give every row its own answer and must keep batching. `rule` is what the static rule says ("coupled",
"independent", or "undecided" when it cannot tell), `coupled` the final verdict of a loaded runner. The unit tests
and the integration test (served by a real tritonserver) read the same corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
_FLOAT, _INT = TensorProto.FLOAT, TensorProto.INT64


@dataclass(frozen=True)
class Case:
    """One corpus graph, what the static rule says of it, and whether its requests must run alone."""

    model: onnx.ModelProto
    rule: str  # "coupled", "independent" or "undecided"
    coupled: bool
    phrase: str = ""  # in the rule's reason, where it names one


def x_in(name: str = "x", shape: Sequence[int | str] = ("n", 4)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _FLOAT, list(shape))


def ints(name: str, values: Sequence[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def floats(name: str, values: Sequence[float] | np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def model(
    nodes: Sequence[onnx.NodeProto],
    initializers: Sequence[onnx.TensorProto] = (),
    functions: Sequence[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "corpus", [x_in()], [x_in("y")], list(initializers))
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid("local", 1)] * bool(functions)
    made = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    made.ir_version = 9
    return made


def node(op: str, inputs: Sequence[str], outputs: Sequence[str], **attributes: Any) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), **attributes)


def body(
    nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[onnx.ValueInfoProto]
) -> onnx.GraphProto:
    return helper.make_graph(list(nodes), "body", list(inputs), list(outputs))


def batch_size_first(shape_tail: Sequence[int], out: str) -> list[onnx.NodeProto]:
    """Shape -> Gather -> Unsqueeze -> Concat, as exporters write a shape that keeps the batch first: `out`."""
    return [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "zero"], ["batch"]),
        node("Unsqueeze", ["batch", "zero_axis"], ["batch_1d"]),
        node("Constant", [], ["tail"], value=ints("tail", shape_tail)),
        node("Concat", ["batch_1d", "tail"], [out], axis=0),
    ]


_SHAPE_CONSTANTS = [numpy_helper.from_array(np.array(0, np.int64), "zero"), ints("zero_axis", [0])]
_W = np.arange(16, dtype=np.float32).reshape(4, 4) / 8 - 1


def _local(name: str, nodes: Sequence[onnx.NodeProto]) -> onnx.FunctionProto:
    return helper.make_function("local", name, ["a"], ["b"], list(nodes), [helper.make_opsetid("", OPSET)])


def _coupled() -> dict[str, Case]:
    scan_body = body(
        [node("Add", ["s_in", "row"], ["s_out"]), node("Identity", ["s_out"], ["row_out"])],
        [x_in("s_in", [4]), x_in("row", [4])],
        [x_in("s_out", [4]), x_in("row_out", [4])],
    )
    loop_body = body(
        [
            node("Identity", ["cond_in"], ["cond_out"]),
            node("ReduceMean", ["v_in"], ["mean"], axes=[0], keepdims=1),
            node("Sub", ["v_in", "mean"], ["v_out"]),
        ],
        [helper.make_tensor_value_info("i", _INT, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         x_in("v_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), x_in("v_out")],
    )  # fmt: skip
    then_branch = body([node("ReduceMean", ["x"], ["mean0"], axes=[0], keepdims=1), node("Sub", ["x", "mean0"], ["t"])],
                       [], [x_in("t")])  # fmt: skip
    else_branch = body([node("Identity", ["x"], ["e"])], [], [x_in("e")])
    loop_inputs = [numpy_helper.from_array(np.array(2, np.int64), "trips"),
                   numpy_helper.from_array(np.array(True), "true")]  # fmt: skip
    return {
        "reduce_negative_axis": Case(
            model([node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), node("Sub", ["x", "s"], ["y"])],
                  [ints("axes", [-2])]),
            "coupled", True, "ReduceSum over axis 0, the batch axis",
        ),
        "softmax_negative_axis": Case(
            model([node("Softmax", ["x"], ["y"], axis=-2)]), "coupled", True, "Softmax over axis 0"
        ),
        "gather_negative_axis": Case(
            model([node("Gather", ["x", "first"], ["g"], axis=-2), node("Add", ["x", "g"], ["y"])],
                  [ints("first", [0])]),
            "coupled", True, "Gather picking rows of the batch",
        ),
        "layernorm_over_batch": Case(
            model([node("Shape", ["x"], ["shape"]),
                   node("ConstantOfShape", ["shape"], ["ones"], value=floats("one", [1.0])),
                   node("LayerNormalization", ["x", "ones"], ["y"], axis=-2)]),
            "coupled", True, "LayerNormalization normalises over axes 0 and after, the batch axis 0",
        ),
        "instance_norm_over_batch": Case(
            model([node("Transpose", ["x"], ["t"], perm=[1, 0]), node("Unsqueeze", ["t", "zero_axis"], ["u"]),
                   node("InstanceNormalization", ["u", "scale", "bias"], ["n"]),
                   node("Squeeze", ["n", "zero_axis"], ["s"]), node("Transpose", ["s"], ["y"], perm=[1, 0])],
                  [ints("zero_axis", [0]), floats("scale", np.ones(4)), floats("bias", np.zeros(4))]),
            "coupled", True, "InstanceNormalization works across axis 2, where the batch is",
        ),
        "matmul_xtx": Case(
            model([node("Transpose", ["x"], ["xt"], perm=[1, 0]), node("MatMul", ["xt", "x"], ["gram"]),
                   node("MatMul", ["x", "gram"], ["y"])]),
            "coupled", True, "MatMul contracts axis 1, the batch axis, of input 'xt'",
        ),
        "gemm_trans_a": Case(
            model([node("Gemm", ["x", "x"], ["gram"], transA=1), node("MatMul", ["x", "gram"], ["y"])]),
            "coupled", True, "Gemm contracts axis 0, the batch axis, of input 'x'",
        ),
        "einsum_batch_summed": Case(
            model([node("Einsum", ["x", "x"], ["gram"], equation="bi,bj->ij"), node("MatMul", ["x", "gram"], ["y"])]),
            "coupled", True, "Einsum sums over 'b', the batch axis",
        ),
        "reshape_one_row": Case(
            model([node("Reshape", ["x", "flat"], ["r"]), node("Softmax", ["r"], ["s"], axis=-1),
                   node("Reshape", ["s", "back"], ["y"])], [ints("flat", [1, -1]), ints("back", [-1, 4])]),
            "coupled", True, "Reshape to [1, -1] merges the rows of the batch",
        ),
        "reshape_flat": Case(
            model([node("Reshape", ["x", "flat"], ["r"]), node("CumSum", ["r", "axis"], ["c"]),
                   node("Reshape", ["c", "back"], ["y"])],
                  [ints("flat", [-1]), ints("back", [-1, 4]), numpy_helper.from_array(np.array(0, np.int64), "axis")]),
            "coupled", True, "Reshape to [-1] merges the rows of the batch",
        ),
        "reshape_two_rows": Case(
            model([node("Reshape", ["x", "two"], ["r"]), node("Softmax", ["r"], ["s"], axis=0),
                   node("Reshape", ["s", "back"], ["y"])], [ints("two", [2, -1]), ints("back", [-1, 4])]),
            "coupled", True, "Reshape to [2, -1] merges the rows of the batch",
        ),
        "flatten_axis_0": Case(
            model([node("Flatten", ["x"], ["f"], axis=0), node("Softmax", ["f"], ["s"], axis=-1),
                   node("Reshape", ["s", "back"], ["y"])], [ints("back", [-1, 4])]),
            "coupled", True, "Flatten at axis 0 merges the rows of the batch into one",
        ),
        "gathernd_first_row": Case(
            model([*batch_size_first([1], "index_shape"), node("Expand", ["first", "index_shape"], ["index"]),
                   node("GatherND", ["x", "index"], ["y"])], [*_SHAPE_CONSTANTS, ints("first", [0])]),
            "coupled", True, "GatherND picks rows of the batch by index",
        ),
        "scatternd_first_row": Case(
            model([node("ScatterND", ["x", "rows", "updates"], ["y"])],
                  [numpy_helper.from_array(np.zeros((1, 1), np.int64), "rows"), floats("updates", np.ones((1, 4)))]),
            "coupled", True, "ScatterND writes at indices that start with the batch axis",
        ),
        "scatter_elements_axis_0": Case(
            model([node("ScatterElements", ["x", "rows", "updates"], ["y"], axis=0)],
                  [numpy_helper.from_array(np.zeros((1, 4), np.int64), "rows"), floats("updates", np.ones((1, 4)))]),
            "coupled", True, "ScatterElements writes across the rows of the batch",
        ),
        "slice_reversed_rows": Case(
            model([node("Slice", ["x", "start", "end", "axes", "step"], ["y"])],
                  [ints("start", [-1]), ints("end", [-(2**62)]), ints("axes", [0]), ints("step", [-1])]),
            "coupled", True, "Slice reverses the rows of the batch",
        ),
        "batch_size_as_data": Case(
            model([node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "zero"], ["batch"]),
                   node("Cast", ["batch"], ["count"], to=_FLOAT), node("Div", ["x", "count"], ["y"])],
                  _SHAPE_CONSTANTS),
            "coupled", True, "the batch size reaches output 'y' as data",
        ),
        "if_branch_sums_rows": Case(
            model([node("If", ["true"], ["y"], then_branch=then_branch, else_branch=else_branch)],
                  [numpy_helper.from_array(np.array(True), "true")]),
            "coupled", True, "ReduceMean over axis 0, the batch axis (node 'mean0' in If 'y')",
        ),
        "loop_body_centres_rows": Case(
            model([node("Loop", ["trips", "true", "x"], ["y"], body=loop_body)], loop_inputs),
            "coupled", True, "ReduceMean over axis 0, the batch axis (node 'mean' in Loop 'y')",
        ),
        "scan_over_rows": Case(
            model([node("Scan", ["start", "x"], ["total", "y"], num_scan_inputs=1, body=scan_body)],
                  [floats("start", np.zeros(4))]),
            "coupled", True, "Scan iterates over axis 0, the batch axis",
        ),
        "local_function_softmax_rows": Case(
            model([node("RowMix", ["x"], ["y"], domain="local")],
                  functions=[_local("RowMix", [node("Softmax", ["a"], ["b"], axis=0)])]),
            "coupled", True, "Softmax over axis 0, the batch axis (node 'b' in function 'RowMix')",
        ),
        "dynamic_quantization_of_rows": Case(
            model([node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zero_point"]),
                   node("DequantizeLinear", ["q", "scale", "zero_point"], ["y"])]),
            "coupled", True, "DynamicQuantizeLinear quantizes its input with one scale over the whole batch",
        ),
        # The batch size compared, as a batch of one is special-cased: a value that depends on it, added to rows.
        "batch_size_compared": Case(
            model([node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "zero"], ["batch"]),
                   node("Less", ["batch", "two"], ["one_row"]), node("Cast", ["one_row"], ["flag"], to=_FLOAT),
                   node("Add", ["x", "flag"], ["y"])],
                  [*_SHAPE_CONSTANTS, numpy_helper.from_array(np.array(2, np.int64), "two")]),
            "coupled", True, "the batch size reaches output 'y' as data (Add takes the batch size as data",
        ),
        # Each row's index in the batch added to it: a Range over the batch size, which may as well only index
        # rows; the rule leaves it to the check at load, which finds the rows disagree.
        "row_index_as_data": Case(
            model([node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "zero"], ["batch"]),
                   node("Range", ["zero", "batch", "one"], ["index"]),
                   node("Unsqueeze", ["index", "one_axis"], ["column"]), node("Cast", ["column"], ["i"], to=_FLOAT),
                   node("Add", ["x", "i"], ["y"])],
                  [*_SHAPE_CONSTANTS, numpy_helper.from_array(np.array(1, np.int64), "one"), ints("one_axis", [1])]),
            "undecided", True, "the batch size may reach output 'y' as data (Range takes the batch size as data",
        ),
        # An operator the rule does not know: a triangle of the transposed batch keeps row j's elements 0..j.
        "trilu_of_transposed_rows": Case(
            model([node("Transpose", ["x"], ["t"], perm=[1, 0]), node("Trilu", ["t"], ["u"], upper=1),
                   node("Transpose", ["u"], ["y"], perm=[1, 0])]),
            "undecided", True, "Trilu is an operator the rule does not know",
        ),
    }  # fmt: skip


def _controls() -> dict[str, Case]:
    row_body = body(
        [node("Identity", ["cond_in"], ["cond_out"]), node("Mul", ["v_in", "half"], ["h"]),
         node("Add", ["h", "x"], ["v_out"])],
        [helper.make_tensor_value_info("i", _INT, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         x_in("v_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), x_in("v_out")],
    )  # fmt: skip
    then_branch = body([node("Relu", ["x"], ["t"])], [], [x_in("t")])
    else_branch = body([node("Neg", ["x"], ["e"])], [], [x_in("e")])
    column_body = body(
        [node("Add", ["s_in", "column"], ["s_out"]), node("Identity", ["s_out"], ["column_out"])],
        [x_in("s_in", ["n"]), x_in("column", ["n"])],
        [x_in("s_out", ["n"]), x_in("column_out", ["n"])],
    )
    weight = floats("w", _W)
    return {
        "reduce_axis_1": Case(
            model([node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), node("Sub", ["x", "s"], ["y"])],
                  [ints("axes", [-1])]), "independent", False,
        ),
        "softmax_last_axis": Case(model([node("Softmax", ["x"], ["y"], axis=-1)]), "independent", False),
        "layernorm_last_axis": Case(
            model([node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1)],
                  [floats("scale", np.linspace(0.5, 2, 4)), floats("bias", np.linspace(-1, 1, 4))]),
            "independent", False,
        ),
        "reshape_batch_first_by_shape": Case(
            model([*batch_size_first([2, 2], "split"), node("Reshape", ["x", "split"], ["r"]),
                   node("Softmax", ["r"], ["s"], axis=-1), node("Shape", ["x"], ["whole"]),
                   node("Reshape", ["s", "whole"], ["y"])], _SHAPE_CONSTANTS),
            "independent", False,
        ),
        "reshape_rows_of_known_size": Case(
            model([node("Reshape", ["x", "split"], ["r"]), node("Softmax", ["r"], ["s"], axis=-1),
                   node("Reshape", ["s", "back"], ["y"])], [ints("split", [-1, 2, 2]), ints("back", [-1, 4])]),
            "independent", False,
        ),
        "batch_size_as_shape_only": Case(
            model([*batch_size_first([4], "wide"), node("Expand", ["bias", "wide"], ["b"]),
                   node("Add", ["x", "b"], ["y"])], [*_SHAPE_CONSTANTS, floats("bias", np.linspace(-1, 1, 4))]),
            "independent", False,
        ),
        "weight_only_dynamic_quantization": Case(
            model([node("DynamicQuantizeLinear", ["w"], ["q", "scale", "zero_point"]),
                   node("DequantizeLinear", ["q", "scale", "zero_point"], ["wq"]), node("MatMul", ["x", "wq"], ["y"])],
                  [weight]),
            "independent", False,
        ),
        "matmul_constant_weight": Case(model([node("MatMul", ["x", "w"], ["y"])], [weight]), "independent", False),
        "gemm_constant_weight": Case(
            model([node("Gemm", ["x", "w"], ["y"], transB=1)], [weight]), "independent", False
        ),
        "einsum_rows_kept": Case(
            model([node("Einsum", ["x", "w"], ["y"], equation="bi,ij->bj")], [weight]), "independent", False
        ),
        "slice_whole_batch": Case(
            model([node("Slice", ["x", "start", "end", "axes"], ["y"])],
                  [ints("start", [0]), ints("end", [2**62]), ints("axes", [0])]),
            "independent", False,
        ),
        "if_per_row": Case(
            model([node("If", ["true"], ["y"], then_branch=then_branch, else_branch=else_branch)],
                  [numpy_helper.from_array(np.array(True), "true")]),
            "independent", False,
        ),
        "loop_per_row": Case(
            model([node("Loop", ["trips", "true", "x"], ["y"], body=row_body)],
                  [numpy_helper.from_array(np.array(3, np.int64), "trips"),
                   numpy_helper.from_array(np.array(True), "true"), floats("half", [0.5])]),
            "independent", False,
        ),
        "scan_over_columns": Case(
            model([node("ReduceSum", ["x", "columns"], ["total"], keepdims=0),
                   node("Mul", ["total", "nought"], ["start"]),
                   node("Scan", ["start", "x"], ["last", "sums"], num_scan_inputs=1, scan_input_axes=[1],
                        body=column_body),
                   node("Transpose", ["sums"], ["y"], perm=[1, 0])],
                  [ints("columns", [1]), floats("nought", [0.0])]),
            "independent", False,
        ),
        "local_function_per_row": Case(
            model([node("RowSoftmax", ["x"], ["y"], domain="local")],
                  functions=[_local("RowSoftmax", [node("Softmax", ["a"], ["b"], axis=-1)])]),
            "independent", False,
        ),
        # Attention's (length, batch, ...) layout: rows of length x batch through a Gemm, the batch split out again
        # (torchvision's ViT); the rule cannot tell the split from a shuffle, the check at load finds rows agree.
        "attention_out_projection": Case(
            model([node("Reshape", ["x", "heads"], ["h"]), node("Transpose", ["h"], ["t"], perm=[1, 0, 2]),
                   node("Shape", ["t"], ["tshape"]), node("Gather", ["tshape", "zero"], ["length"]),
                   node("Gather", ["tshape", "one"], ["batch"]), node("Mul", ["length", "batch"], ["rows"]),
                   node("Unsqueeze", ["rows", "zero_axis"], ["rows_1d"]),
                   node("Concat", ["rows_1d", "two_1d"], ["flat_shape"], axis=0),
                   node("Reshape", ["t", "flat_shape"], ["flat"]), node("Gemm", ["flat", "w2"], ["g"]),
                   node("Unsqueeze", ["length", "zero_axis"], ["length_1d"]),
                   node("Unsqueeze", ["batch", "zero_axis"], ["batch_1d"]),
                   node("Concat", ["length_1d", "batch_1d", "two_1d"], ["split_shape"], axis=0),
                   node("Reshape", ["g", "split_shape"], ["s"]), node("Transpose", ["s"], ["back"], perm=[1, 0, 2]),
                   node("Reshape", ["back", "rows_of_4"], ["y"])],
                  [*_SHAPE_CONSTANTS, numpy_helper.from_array(np.array(1, np.int64), "one"), ints("two_1d", [2]),
                   ints("heads", [-1, 2, 2]), ints("rows_of_4", [-1, 4]), floats("w2", [[1, -2], [0.5, 3]])]),
            "undecided", False, "splits the batch out of axis 0, merged there with other dims",
        ),
        # An attention mask widened as exporters write it (Shape -> Concat -> Equal/Where -> Expand): shapes only.
        "mask_expanded_by_shape": Case(
            model([*batch_size_first([2, 4], "wanted"), node("Reshape", ["wanted", "minus_one"], ["target"]),
                   node("Shape", ["target"], ["target_length"]),
                   node("ConstantOfShape", ["target_length"], ["ones"], value=ints("one", [1])),
                   node("Mul", ["ones", "minus_one"], ["minus_ones"]),
                   node("Equal", ["target", "minus_ones"], ["unknown"]),
                   node("Where", ["unknown", "ones", "target"], ["expand_to"]),
                   node("Unsqueeze", ["x", "one_axis"], ["x3"]), node("Expand", ["x3", "expand_to"], ["wide"]),
                   node("ReduceSum", ["wide", "one_axis"], ["y"], keepdims=0)],
                  [*_SHAPE_CONSTANTS, ints("minus_one", [-1]), ints("one_axis", [1])]),
            "independent", False,
        ),
        # A Reshape to (batch, a value the rule cannot evaluate): the batch stays first.
        "reshape_batch_and_unknown_sizes": Case(
            model([node("Shape", ["x"], ["shape"]), node("Slice", ["shape", "zero_axis", "one_1d"], ["batch_1d"]),
                   node("Cast", ["sizes_f"], ["sizes"], to=_INT),
                   node("Concat", ["batch_1d", "sizes"], ["split"], axis=0), node("Reshape", ["x", "split"], ["r"]),
                   node("Softmax", ["r"], ["s"], axis=-1), node("Reshape", ["s", "shape"], ["y"])],
                  [*_SHAPE_CONSTANTS, ints("one_1d", [1]), floats("sizes_f", [2, 2])]),
            "independent", False,
        ),
        # An operator the rule does not know, over each row's own 2x2: the check at load keeps it batching.
        "trilu_of_each_row": Case(
            model([node("Reshape", ["x", "square"], ["r"]), node("Trilu", ["r"], ["u"]),
                   node("Reshape", ["u", "back"], ["y"])], [ints("square", [-1, 2, 2]), ints("back", [-1, 4])]),
            "undecided", False, "Trilu is an operator the rule does not know",
        ),
    }  # fmt: skip


COUPLED = _coupled()
CONTROLS = _controls()
CORPUS = {**COUPLED, **CONTROLS}


def rows(count: int, seed: int) -> np.ndarray:
    """`count` rows of x, the odd ones 50 times louder: a batch statistic or a shared scale moves with them."""
    rng = np.random.default_rng(seed)
    loud = (1 + 49 * (np.arange(count) % 2)).reshape(count, 1)
    return (rng.standard_normal((count, 4)) * loud).astype(np.float32)
