import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.onnx_io import read_file_io, read_graph_io
from tritonnx.backend.tensors import ELEMENT_TYPES


def as_ort(tensors) -> list[tuple]:
    return [(t.name, ELEMENT_TYPES[t.elem_type].onnx_name, tuple(t.shape)) for t in tensors]


def ort_view(args) -> list[tuple]:
    return [(a.name, a.type, tuple(a.shape)) for a in args]


def save(tmp_path, nodes, inputs, outputs, initializers=(), name="m.onnx", opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.save(model, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("fixture", ["double_onnx", "masked_sum_onnx"])
def test_graph_io_is_what_onnxruntime_reports(fixture, request):
    path = request.getfixturevalue(fixture)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graph = read_graph_io(path)
    assert as_ort(graph.inputs) == ort_view(session.get_inputs())
    assert as_ort(graph.outputs) == ort_view(session.get_outputs())


def test_an_initializer_listed_as_an_input_is_an_input_with_a_default(tmp_path):
    # Older exporters list every weight among the graph inputs; a caller may override or leave it out.
    weight = numpy_helper.from_array(np.ones((4, 2), np.float32), "weight")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    w = helper.make_tensor_value_info("weight", TensorProto.FLOAT, [4, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    path = save(tmp_path, [helper.make_node("MatMul", ["x", "weight"], ["y"])], [x, w], [y], [weight])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graph = read_graph_io(path)
    assert [(t.name, t.has_default) for t in graph.inputs] == [("x", False), ("weight", True)]
    assert as_ort(graph.inputs[:1]) == ort_view(session.get_inputs()) == [("x", "tensor(float)", (None, 4))]
    assert [i.name for i in session.get_overridable_initializers()] == ["weight"]
    specs, _ = read_file_io(path, batched=False)
    assert specs[1].dims == (4, 2) and specs[1].optional and specs[1].as_config()["optional"] is True
    # A weight has no batch dim: a batched model keeps its default, and it does not stop batching.
    specs, outputs = read_file_io(path, batched=True)
    assert [(s.name, s.dims, s.dim_names, s.optional) for s in specs] == [("x", (4,), (None,), False)]
    assert outputs[0].dim_names == (None,)  # the batch dim's name goes with it
    assert graph.cannot_batch() is None


def test_scalars_zero_dims_and_unknown_rank_are_told_apart(tmp_path):
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [])
    axes = helper.make_tensor_value_info("axes", TensorProto.INT64, [0])
    free = helper.make_tensor_value_info("free", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    path = save(tmp_path, [helper.make_node("Identity", ["s"], ["y"])], [s, axes, free], [y])
    graph = read_graph_io(path)
    assert [t.shape for t in graph.inputs] == [(), (0,), None]
    free_spec = graph.specs(batched=False)[0][2]  # served as Triton's onnxruntime backend serves it: [1], any shape
    assert free_spec.any_rank and free_spec.as_config()["dims"] == [1]
    with pytest.raises(ModelConfigError, match="input 'free' has no shape in the graph"):
        graph.inputs[2].spec(True, "input")
    scalar, zero = graph.inputs[0].spec(False, "input"), graph.inputs[1].spec(False, "input")
    assert scalar.as_config() == {"name": "s", "data_type": "TYPE_FP32", "dims": [1]}
    assert zero.dims == (0,) and zero.as_config()["dims"] == [-1]
    assert graph.cannot_batch() == "input 's' is a scalar"


def test_types_triton_cannot_carry_are_refused_by_name(tmp_path):
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    c = helper.make_tensor_value_info("c", TensorProto.COMPLEX64, [2])
    b = helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [2])
    path = save(
        tmp_path,
        [helper.make_node("SequenceLength", ["seq"], ["n"])],
        [seq, c, b],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    graph = read_graph_io(path)
    assert graph.inputs[0].kind == "sequence"
    with pytest.raises(ModelConfigError, match="input 'seq' is a sequence, not a tensor: Triton carries tensors only"):
        graph.inputs[0].spec(False, "input")
    with pytest.raises(
        ModelConfigError, match=r"input 'c' is a tensor\(complex64\) tensor, which Triton has no datatype"
    ):
        graph.inputs[1].spec(False, "input")
    with pytest.raises(ModelConfigError, match="BF16 tensors to numpy"):
        graph.inputs[2].spec(False, "input")


def test_strings_and_booleans_are_served_as_bytes_and_bool(tmp_path):
    text = helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, ["n"])
    path = save(
        tmp_path,
        [helper.make_node("Identity", ["flag"], ["out"])],
        [text, flag],
        [helper.make_tensor_value_info("out", TensorProto.BOOL, ["n"])],
    )
    inputs, _ = read_file_io(path, batched=True)
    assert [s.as_config() for s in inputs] == [
        {"name": "text", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "flag", "data_type": "TYPE_BOOL", "dims": [1]},
    ]
    assert inputs[0].describe() == "text (BYTES scalar, sent as [1])"


def test_batching_needs_a_dynamic_first_dim_everywhere(tmp_path, double_onnx):
    assert read_graph_io(double_onnx).cannot_batch() is None
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    total = helper.make_tensor_value_info("total", TensorProto.FLOAT, [4])
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    path = save(tmp_path, [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0)], [x], [total], [axes])
    assert read_graph_io(path).cannot_batch() == "output 'total' has a fixed first dim 4"


def test_operator_types_include_subgraphs(tmp_path):
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2])
    then = helper.make_graph(
        [helper.make_node("Div", ["x", "x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.INT64, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.INT64, [2])],
    )
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    path = save(tmp_path, [node], [cond, x], [y])
    assert read_graph_io(path).op_types == {"If", "Div", "Identity"}


def test_a_file_that_is_not_onnx_is_refused(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelConfigError):
        read_graph_io(tmp_path / "junk.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"\x08\x07")  # a valid message without a graph
    with pytest.raises(ModelConfigError, match="has no graph"):
        read_graph_io(tmp_path / "empty.onnx")


def test_a_zipmap_output_is_refused_with_the_export_that_avoids_it(tmp_path):
    x = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["n", 3])
    per_class = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    zipped = helper.make_value_info("output_probability", helper.make_sequence_type_proto(per_class))
    zipmap = helper.make_node(
        "ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]
    )
    graph = helper.make_graph([zipmap], "g", [x], [zipped])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(
        ModelConfigError, match=r"output 'output_probability' is a sequence.*options=\{'zipmap': False\}"
    ):
        read_graph_io(tmp_path / "m.onnx").specs(batched=False)


def test_an_output_declared_one_row_long_that_follows_the_rows_is_served_with_a_dynamic_first_dim(tmp_path):
    # onnxmltools' LightGBM classifier declares `label` [1] and returns one label per row.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [1])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 3])
    nodes = [
        helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0),
        helper.make_node("Softmax", ["x"], ["scores"]),
    ]
    path = save(tmp_path, nodes, [x], [label, scores])
    rows = np.zeros((2, 3), np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # ONNX Runtime warns that [2] is not the declared [1]
    assert ort.InferenceSession(str(path), options).run(["label"], {"x": rows})[0].shape == (2,)
    graph = read_graph_io(path)
    assert graph.cannot_batch() == "output 'label' has a fixed first dim 1"
    _, outputs = graph.specs(batched=False)
    assert [o.as_config()["dims"] for o in outputs] == [[-1], [-1, 3]]


def test_a_graph_the_batch_axis_rule_trips_on_is_left_undecided_not_refused(double_onnx, monkeypatch):
    import tritonnx.backend.onnx_io

    def trips(*args):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(tritonnx.backend.onnx_io, "judge", trips)
    graph = read_graph_io(double_onnx)
    assert graph.batch_coupling() is None
    assert graph.batch_undecided() == "the batch-axis rule failed on this graph (IndexError: tuple index out of range)"
