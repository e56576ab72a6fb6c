import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from backend.errors import ModelConfigError
from backend.onnx_io import read_file_io, read_graph_io


def as_ort(tensors) -> list[tuple]:
    return [(t.name, t.type, tuple(t.shape)) for t in tensors]


@pytest.mark.parametrize("fixture", ["double_onnx", "masked_sum_onnx"])
def test_graph_io_is_what_onnxruntime_reports(fixture, request):
    path = request.getfixturevalue(fixture)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs, outputs = read_graph_io(path)
    assert as_ort(inputs) == as_ort(session.get_inputs())
    assert as_ort(outputs) == as_ort(session.get_outputs())


def test_initializers_listed_as_inputs_are_not_inputs(tmp_path):
    # Older exporters list every weight among the graph inputs; ONNX Runtime leaves them out.
    weight = numpy_helper.from_array(np.ones((4, 2), np.float32), "weight")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    w = helper.make_tensor_value_info("weight", TensorProto.FLOAT, [4, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "weight"], ["y"])], "g", [x, w], [y], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    inputs, outputs = read_graph_io(tmp_path / "m.onnx")
    assert as_ort(inputs) == as_ort(session.get_inputs()) == [("x", "tensor(float)", (None, 4))]
    assert as_ort(outputs) == [("y", "tensor(float)", ("n", 2))]
    specs, _ = read_file_io(tmp_path / "m.onnx", batched=True)
    assert specs[0].dims == (4,) and specs[0].dim_names == (None,)


def test_a_file_that_is_not_onnx_is_refused(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelConfigError):
        read_graph_io(tmp_path / "junk.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"\x08\x07")  # a valid message without a graph
    with pytest.raises(ModelConfigError, match="has no graph"):
        read_graph_io(tmp_path / "empty.onnx")
