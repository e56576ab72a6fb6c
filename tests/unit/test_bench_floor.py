"""The serving floor's model: the served model's inputs and outputs, zeros out, no compute."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from bench.floor import floor_graph, floor_repository


def two_output_model() -> onnx.ModelProto:
    """ids [batch, seq] int64 and a float mask -> logits [batch, 2] and a fixed-shape float [3]."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["ids"], ["ids_float"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["ids_float", "axes"], ["summed"], keepdims=0),
            helper.make_node("Unsqueeze", ["summed", "axes"], ["column"]),
            helper.make_node("Concat", ["column", "column"], ["logits"], axis=1),
            helper.make_node("Identity", ["bias"], ["bias_out"]),
        ],
        "two_outputs",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("bias_out", TensorProto.FLOAT, [3]),
        ],
        initializer=[
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
            helper.make_tensor("bias", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]),
        ],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9
    )  # what ONNX Runtime reads


def signature(session: ort.InferenceSession) -> tuple:
    return (
        [(i.name, i.type, i.shape) for i in session.get_inputs()],
        [(o.name, o.type, o.shape) for o in session.get_outputs()],
    )


def test_the_floor_has_the_models_signature_and_answers_zeros_of_the_batch():
    model = two_output_model()
    floor = floor_graph(model)
    onnx.checker.check_model(floor, full_check=True)
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    served = ort.InferenceSession(floor.SerializeToString(), providers=["CPUExecutionProvider"])
    assert signature(served) == signature(original)
    feeds = {"ids": np.ones((5, 7), np.int64), "mask": np.ones((5, 7), np.float32)}
    logits, bias = served.run(None, feeds)
    assert logits.shape == (5, 2) and logits.dtype == np.float32 and not logits.any()
    assert bias.shape == (3,) and not bias.any()
    assert len(floor.graph.initializer) < 10 and not any(
        n.op_type in ("Conv", "MatMul", "Gemm") for n in floor.graph.node
    )


def test_the_floor_repository_serves_it_under_the_models_own_config(tmp_path):
    repository = tmp_path / "repository"
    (repository / "m" / "1").mkdir(parents=True)
    (repository / "m" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 8\n')
    (repository / "m" / "1" / "model.py").write_text("# the model's own model.py\n")
    onnx.save(two_output_model(), repository / "m" / "1" / "model.onnx")
    floor = floor_repository("m", repository, tmp_path / "work")
    config = (floor / "m" / "config.pbtxt").read_text()
    assert config.startswith((repository / "m" / "config.pbtxt").read_text())
    assert 'key: "optimized_model_cache" value: { string_value: "0" }' in config
    assert (floor / "m" / "1" / "model.py").read_text() == "# the model's own model.py\n"
    written = onnx.load(floor / "m" / "1" / "model.onnx")
    assert [o.name for o in written.graph.output] == ["logits", "bias_out"]
    with pytest.raises(FileExistsError):  # never written over
        floor_repository("m", repository, tmp_path / "work")
