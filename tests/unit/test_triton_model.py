"""The Triton adapter, with Triton's real auto-complete code and fakes of the stub's C++ types."""

import json

import numpy as np
import pytest


def model_class(pb_utils, onnx_file):
    from backend.triton_model import OnnxRuntimeModel

    return type("TritonPythonModel", (OnnxRuntimeModel,), {"onnx_file": onnx_file})


def empty_config(name: str, max_batch_size: int, inputs=()) -> dict:
    return {"name": name, "max_batch_size": max_batch_size, "input": list(inputs), "output": []}


def test_auto_complete_fills_inputs_and_outputs_from_the_graph(pb_utils, masked_sum_onnx):
    ragged = {"name": "ids", "data_type": "TYPE_INVALID", "dims": [], "allow_ragged_batch": True, "optional": False}
    config = pb_utils.ModelConfig(json.dumps(empty_config("text", 8, [ragged])))
    model_class(pb_utils, masked_sum_onnx).auto_complete_config(config)
    completed = config.as_dict()
    assert [(i["name"], i["data_type"], i["dims"]) for i in completed["input"]] == [
        ("ids", "TYPE_INT64", [-1]),
        ("mask", "TYPE_INT64", [-1]),
    ]
    assert completed["input"][0]["allow_ragged_batch"] is True  # policy written by hand survives
    assert [(o["name"], o["dims"]) for o in completed["output"]] == [("total", [1]), ("length", [1])]


def test_auto_complete_without_batching_keeps_the_first_dim(pb_utils, double_onnx):
    config = pb_utils.ModelConfig(json.dumps(empty_config("double", 0)))
    model_class(pb_utils, double_onnx).auto_complete_config(config)
    assert config.as_dict()["input"][0]["dims"] == [-1, 4]


def test_auto_complete_refuses_dims_that_contradict_the_graph(pb_utils, double_onnx):
    wrong = {"name": "x", "data_type": "TYPE_FP32", "dims": [5]}
    config = pb_utils.ModelConfig(json.dumps(empty_config("double", 8, [wrong])))
    with pytest.raises(ValueError, match="expects dims"):
        model_class(pb_utils, double_onnx).auto_complete_config(config)


def served(pb_utils, onnx_file, max_batch_size=8, inputs=()):
    model = model_class(pb_utils, onnx_file)()
    config = empty_config("m", max_batch_size, inputs)
    config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
    model.initialize({"model_config": json.dumps(config), "model_instance_name": "m_0_0"})
    return model


def test_execute_answers_every_request_and_maps_errors_to_invalid_arg(pb_utils, double_onnx):
    model = served(pb_utils, double_onnx)
    responses = model.execute(
        [
            pb_utils.InferenceRequest(x=np.ones((2, 4), np.float32)),
            pb_utils.InferenceRequest(x=np.ones((1, 5), np.float32)),
            pb_utils.InferenceRequest(x=np.full((1, 4), 3, np.float32)),
        ]
    )
    assert len(responses) == 3
    np.testing.assert_array_equal(responses[0].outputs()["y"], np.full((2, 4), 2))
    assert responses[1].error.code == pb_utils.TritonError.INVALID_ARG
    assert "does not fit [4]" in responses[1].error.message()
    assert responses[1].output_tensors == []
    np.testing.assert_array_equal(responses[2].outputs()["y"], np.full((1, 4), 6))
    assert any("intra_op_threads=1" in line for line in pb_utils.Logger.lines)  # 2 instances share 2 cores
    model.finalize()


def test_initialize_names_the_model_when_the_graph_cannot_batch(pb_utils, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    ])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "fixed.onnx")
    with pytest.raises(RuntimeError, match="model 'm': tensor 'x' has a fixed first dim 1"):
        served(pb_utils, tmp_path / "fixed.onnx")
