"""The Triton adapter, with Triton's real auto-complete code and fakes of the stub's C++ types."""

import importlib
import json
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.graphs import LOUD_ID, batch_centred, quantized_encoder
from tritonnx.backend.onnx_io import read_graph_io


def model_folder(onnx_file, config_text: str | None = None):
    """A model folder `m` beside `onnx_file`: version 1 holds a copy of it, `config_text` is its config.pbtxt (None:
    there is none)."""
    folder = onnx_file.parent / "repository" / "m"
    shutil.rmtree(folder, ignore_errors=True)  # a fresh one for each test
    (folder / "1").mkdir(parents=True)
    shutil.copyfile(onnx_file, folder / "1" / "model.onnx")
    if config_text is not None:
        (folder / "config.pbtxt").write_text(config_text)
    return folder


def model_class(pb_utils, onnx_file, config_text: str | None = None):
    """The class a model.py of the earlier form defines: it names the ONNX file beside it."""
    from tritonnx.backend.triton_model import OnnxRuntimeModel

    served = model_folder(onnx_file, config_text) / "1" / "model.onnx"
    return type("TritonPythonModel", (OnnxRuntimeModel,), {"onnx_file": served})


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
    model_class(pb_utils, double_onnx, 'backend: "python"\nmax_batch_size: 0  # written: wins\n').auto_complete_config(
        config
    )
    assert config.as_dict()["max_batch_size"] == 0 and "dynamic_batching" not in config.as_dict()
    assert config.as_dict()["input"][0]["dims"] == [-1, 4]


def test_auto_complete_batches_a_graph_with_dynamic_first_dims_unless_told(pb_utils, double_onnx):
    pb_utils.Logger.lines.clear()
    config = pb_utils.ModelConfig(json.dumps(empty_config("double", 0)))
    model_class(
        pb_utils, double_onnx, 'backend: "python"\n# max_batch_size: 0 is only a comment\n'
    ).auto_complete_config(config)
    completed = config.as_dict()
    assert completed["max_batch_size"] == 4 and completed["dynamic_batching"] == {}
    assert completed["input"][0]["dims"] == [4]
    assert any("every input and output has a dynamic first dim" in line for line in pb_utils.Logger.lines)


def test_auto_complete_says_why_a_model_does_not_batch(pb_utils, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 5])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    onnx.save(model, tmp_path / "model.onnx")
    pb_utils.Logger.lines.clear()
    config = pb_utils.ModelConfig(json.dumps(empty_config("neg", 0)))
    model_class(pb_utils, tmp_path / "model.onnx").auto_complete_config(config)  # no config.pbtxt at all
    assert config.as_dict()["max_batch_size"] == 0
    assert config.as_dict()["input"][0]["dims"] == [3, 4, 5]
    assert (
        "model 'neg': max_batch_size 0, the model cannot batch: input 'x' has a fixed first dim 3"
        in pb_utils.Logger.lines
    )


def test_a_non_batched_model_answers_whole_tensors(pb_utils, tmp_path):
    """The first dim of a model that does not batch is the model's own: [3, 4, 5] stays [3, 4, 5]."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 5])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    onnx.save(model, tmp_path / "model.onnx")
    served_model = served(pb_utils, tmp_path / "model.onnx", max_batch_size=0)
    data = [np.random.default_rng(n).standard_normal((n, 4, 5)).astype(np.float32) for n in (3, 1, 2)]
    responses = served_model.execute([pb_utils.InferenceRequest(x=d) for d in data])
    for d, response in zip(data, responses, strict=False):
        assert response.error is None
        np.testing.assert_array_equal(response.outputs()["y"], -d)


def test_auto_complete_refuses_dims_that_contradict_the_graph(pb_utils, double_onnx):
    wrong = {"name": "x", "data_type": "TYPE_FP32", "dims": [5]}
    config = pb_utils.ModelConfig(json.dumps(empty_config("double", 8, [wrong])))
    with pytest.raises(
        pb_utils.TritonModelException, match=r"input 'x': the config's dims \[5\] do not fit the graph's dims \[4\]"
    ):
        model_class(pb_utils, double_onnx).auto_complete_config(config)


def test_a_refusal_carries_its_reason_alone_with_no_frame_of_the_backend_in_its_traceback(pb_utils, double_onnx):
    # The stub calls the entry points from C++ and reports pybind11's text of what they raise, every Python frame
    # of its traceback included: a refusal must pass none, so that a client reads the reason and no server path.
    wrong = {"name": "x", "data_type": "TYPE_FP32", "dims": [5]}
    model = model_class(pb_utils, double_onnx)
    for entry, argument in (
        (model.auto_complete_config, pb_utils.ModelConfig(json.dumps(empty_config("double", 8, [wrong])))),
        (model().initialize, {"model_config": json.dumps({**empty_config("double", 8, [wrong]), "output": []}),
                              "model_repository": str(double_onnx.parent), "model_version": "1",
                              "model_instance_name": "double_0"}),
    ):  # fmt: skip
        with pytest.raises(pb_utils.TritonModelException) as refused:
            entry(argument)
        assert type(refused.value).__name__ == "Invalid argument"  # pybind11 writes it before the message
        assert str(refused.value).startswith("model 'double', input 'x': the config's dims [5] do not fit")
        assert refused.tb.tb_next is None  # the test's own frame, and none below it


def test_inputs_and_outputs_written_in_tritons_style_are_kept_when_the_graph_agrees(pb_utils, double_onnx):
    # As Triton's quickstart writes them: fixed dims where the graph has any size, and an output `reshape`.
    written = [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    outputs = [{"name": "y", "data_type": "TYPE_FP32", "dims": [2, 2], "reshape": {"shape": [4]}}]
    config = pb_utils.ModelConfig(json.dumps({**empty_config("double", 8, written), "output": outputs}))
    model_class(pb_utils, double_onnx).auto_complete_config(config)
    completed = config.as_dict()
    assert [(i["name"], i["dims"]) for i in completed["input"]] == [("x", [4])]
    assert [(o["name"], o["dims"], o["reshape"]["shape"]) for o in completed["output"]] == [("y", [2, 2], [4])]
    # Inputs and outputs written: the onnxruntime backend completes nothing, a dynamic batcher included.
    assert completed["max_batch_size"] == 8 and "dynamic_batching" not in completed


def test_a_written_datatype_the_graph_contradicts_is_refused(pb_utils, double_onnx):
    config = pb_utils.ModelConfig(
        json.dumps(empty_config("double", 0, [{"name": "x", "data_type": "TYPE_INT64", "dims": [-1, 4]}]))
    )
    with pytest.raises(
        pb_utils.TritonModelException, match="input 'x': the config says TYPE_INT64, the graph TYPE_FP32"
    ):
        model_class(pb_utils, double_onnx, "max_batch_size: 0\n").auto_complete_config(config)


def served(pb_utils, onnx_file, max_batch_size=8, inputs=()):
    """An instance started as Triton starts one: on the config auto-complete made."""
    model_type = model_class(pb_utils, onnx_file, f"max_batch_size: {max_batch_size}\n")
    config = pb_utils.ModelConfig(json.dumps(empty_config("m", max_batch_size, inputs)))
    model_type.auto_complete_config(config)
    model = model_type()
    model.initialize(
        instance_args(
            {**config.as_dict(), "instance_group": [{"kind": "KIND_CPU", "count": 2}]},
            onnx_file.parent / "repository" / "m",
        )
    )
    return model


def instance_args(config: dict, folder, version: str = "1") -> dict:
    """What Triton's Python backend hands `initialize`."""
    return {
        "model_config": json.dumps(config),
        "model_instance_name": "m_0_0",
        "model_repository": str(folder),
        "model_version": version,
        "model_name": config["name"],
    }


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
    # Two instances share the cores evenly, whatever the machine has.
    from tritonnx.backend.settings import available_cores

    threads = max(1, available_cores() // 2)
    assert any(f"intra_op_threads={threads} " in line for line in pb_utils.Logger.lines)
    assert any(
        f"providers=CPUExecutionProvider (onnxruntime {ort.__version__})" in line for line in pb_utils.Logger.lines
    )
    model.finalize()


def test_initialize_names_the_model_when_the_graph_cannot_batch(pb_utils, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "fixed.onnx")
    with pytest.raises(RuntimeError, match="model 'm', input 'x' has a fixed first dim 1"):
        served(pb_utils, tmp_path / "fixed.onnx")


def test_the_written_max_batch_size_is_told_from_an_absent_one(tmp_path):
    from tritonnx.backend.autocomplete import writes_max_batch_size

    config = tmp_path / "config.pbtxt"
    assert not writes_max_batch_size(config)  # no config.pbtxt at all
    config.write_text('backend: "python"\n# max_batch_size: 8 (a comment)\ninstance_group [ { count: 1 } ]\n')
    assert not writes_max_batch_size(config)
    config.write_text('backend: "python"\n  max_batch_size : 0\n')
    assert writes_max_batch_size(config)


def test_an_input_listed_by_hand_keeps_its_own_optional_flag(pb_utils, tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bias = numpy_helper.from_array(np.zeros(2, np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "model.onnx")
    written = {"name": "bias", "data_type": "TYPE_INVALID", "dims": [], "optional": False}
    config = pb_utils.ModelConfig(json.dumps(empty_config("m", 0, [written])))
    model_class(pb_utils, tmp_path / "model.onnx", "max_batch_size: 0\n").auto_complete_config(config)
    assert {i["name"]: i.get("optional", False) for i in config.as_dict()["input"]} == {"bias": False, "x": False}
    config = pb_utils.ModelConfig(json.dumps(empty_config("m", 0)))
    model_class(pb_utils, tmp_path / "model.onnx", "max_batch_size: 0\n").auto_complete_config(config)
    assert {i["name"]: i.get("optional", False) for i in config.as_dict()["input"]} == {"x": False, "bias": True}


# --- the stock model.py: the named backends onnxruntime and tritonnx, and backend "python" -----------------------


def stock_model(pb_utils) -> type:
    """backend/stock_model.py's class, imported against the `pb_utils` of this test."""
    sys.modules.pop("tritonnx.backend.stock_model", None)
    return importlib.import_module("tritonnx.backend.stock_model").TritonPythonModel


@pytest.mark.parametrize(
    ("backend", "served_file", "argv_file"),
    [
        ("onnxruntime", "model.onnx", "model.onnx"),  # platform onnxruntime_onnx, or no config: core names model.onnx
        ("tritonnx", "model.quant.onnx", "model.quant.onnx"),
        ("python", "model.onnx", "model.py"),  # a copy in the version folder, beside the graph
    ],
)
def test_the_stock_model_finds_the_graph_from_the_stubs_command_line(
    pb_utils, double_onnx, monkeypatch, backend, served_file, argv_file
):
    folder = model_folder(double_onnx, "max_batch_size: 0\n")
    (folder / "1" / "model.onnx").rename(folder / "1" / served_file)
    monkeypatch.setattr(
        "tritonnx.backend.model_files._own_command_line",
        lambda: ["/backends/python/triton_python_backend_stub", str(folder / "1" / argv_file), "region"],
    )
    config = {**empty_config("m", 0), "backend": backend}
    if backend != "python":
        config["default_model_filename"] = served_file
    completed = pb_utils.ModelConfig(json.dumps(config))
    stock_model(pb_utils).auto_complete_config(completed)
    assert [(i["name"], i["dims"]) for i in completed.as_dict()["input"]] == [("x", [-1, 4])]  # written 0 wins

    model = stock_model(pb_utils)()
    model.initialize(instance_args(completed.as_dict(), folder))
    [response] = model.execute([pb_utils.InferenceRequest(x=np.ones((2, 4), np.float32))])
    np.testing.assert_array_equal(response.outputs()["y"], np.full((2, 4), 2))
    model.finalize()


def test_a_default_model_filename_naming_a_folder_serves_the_model_onnx_in_it(pb_utils, double_onnx):
    folder = model_folder(double_onnx)
    (folder / "1" / "graph").mkdir()
    (folder / "1" / "model.onnx").rename(folder / "1" / "graph" / "model.onnx")
    config = {
        **empty_config("m", 8, [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]),
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        "backend": "onnxruntime",
        "default_model_filename": "graph",
    }
    model = stock_model(pb_utils)()
    model.initialize(instance_args(config, folder))
    [response] = model.execute([pb_utils.InferenceRequest(x=np.ones((1, 4), np.float32))])
    np.testing.assert_array_equal(response.outputs()["y"], np.full((1, 4), 2))


def test_a_missing_graph_fails_the_load_naming_the_file_it_looked_for(pb_utils, double_onnx):
    folder = model_folder(double_onnx)
    config = {**empty_config("m", 8), "backend": "onnxruntime", "default_model_filename": "model.quant.onnx"}
    with pytest.raises(RuntimeError, match=r"model 'm': unable to find .*model\.quant\.onnx \(default_model_filename"):
        stock_model(pb_utils)().initialize(instance_args(config, folder))


# --- graphs whose rows are not independent -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    return quantized_encoder(tmp_path_factory.mktemp("quantized"))


def test_a_row_of_a_dynamically_quantized_graph_depends_on_its_batch_mates(quantized):
    # Why the rule below exists: the same request, alone and beside a loud one, gets two answers.
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    quiet, loud = np.array([[1, 2, 3, 4, 5]]), np.full((1, 5), LOUD_ID)
    alone = session.run(None, {"ids": quiet})[0]
    assert not np.array_equal(session.run(None, {"ids": np.concatenate([quiet, loud])})[0][:1], alone)
    assert "DynamicQuantizeLinear" in read_graph_io(quantized).batch_coupling()


def test_a_batch_coupled_graph_runs_its_requests_one_by_one_unless_the_config_says(pb_utils, quantized):
    pb_utils.Logger.lines.clear()
    config = pb_utils.ModelConfig(json.dumps(empty_config("encoder", 0)))
    model_class(pb_utils, quantized).auto_complete_config(config)
    completed = config.as_dict()
    assert completed["max_batch_size"] == 4 and "dynamic_batching" not in completed
    assert any("its rows are not independent (DynamicQuantizeLinear" in line for line in pb_utils.Logger.lines)
    # A config that writes max_batch_size chose to batch: Triton's onnxruntime backend's rule applies.
    config = pb_utils.ModelConfig(json.dumps(empty_config("encoder", 8)))
    model_class(pb_utils, quantized, "max_batch_size: 8\n").auto_complete_config(config)
    assert config.as_dict()["dynamic_batching"] == {}


def test_a_graph_that_reduces_over_the_batch_axis_runs_its_requests_one_by_one(pb_utils, tmp_path):
    onnx.save(batch_centred(), tmp_path / "model.onnx")
    pb_utils.Logger.lines.clear()
    config = pb_utils.ModelConfig(json.dumps(empty_config("centred", 0)))
    model_class(pb_utils, tmp_path / "model.onnx").auto_complete_config(config)
    assert config.as_dict()["max_batch_size"] == 4 and "dynamic_batching" not in config.as_dict()
    assert any("ReduceMean over axis 0, the batch axis (node" in line for line in pb_utils.Logger.lines)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            {"batch_input": [{"kind": "BATCH_ELEMENT_COUNT", "target_name": ["n"], "source_input": ["x"]}]},
            "batch_input is not supported",
        ),
        (
            {"batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["y"], "source_input": ["x"]}]},
            "batch_output is not supported",
        ),
        (
            {"sequence_batching": {"state": [{"input_name": "past_in", "output_name": "past_out"}]}},
            "cannot update Triton's state",
        ),
    ],
)
def test_settings_this_backend_does_not_do_are_refused_by_name(pb_utils, double_onnx, setting, message):
    config = pb_utils.ModelConfig(json.dumps({**empty_config("double", 8), **setting}))
    with pytest.raises(pb_utils.TritonModelException, match=message):
        model_class(pb_utils, double_onnx).auto_complete_config(config)


def sequence_config(control: dict) -> dict:
    return {
        **empty_config("sequence", 4),
        "sequence_batching": {"control_input": [{"name": "START", "control": [control]}]},
    }


def test_a_sequence_control_input_is_left_to_the_sequence_batcher(pb_utils, sequence_onnx):
    config = pb_utils.ModelConfig(
        json.dumps(sequence_config({"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}))
    )
    model_class(pb_utils, sequence_onnx).auto_complete_config(config)
    completed = config.as_dict()
    assert [i["name"] for i in completed["input"]] == ["x"]  # Triton fills START in every request; clients do not
    assert "dynamic_batching" not in completed  # the sequence batcher is the scheduler


@pytest.mark.parametrize(
    ("name", "control", "message"),
    [
        ("START", {"int32_false_true": [0, 1]}, "Triton sends it as TYPE_INT32, the graph takes TYPE_FP32"),
        ("READY", {"kind": "CONTROL_SEQUENCE_READY", "fp32_false_true": [0, 1]}, "the graph has no such input"),
    ],
)
def test_a_sequence_control_input_the_graph_does_not_take_is_refused_by_name(
    pb_utils, sequence_onnx, name, control, message
):
    raw = sequence_config(control)
    raw["sequence_batching"]["control_input"][0]["name"] = name
    with pytest.raises(pb_utils.TritonModelException, match=f"control_input '{name}': {message}"):
        model_class(pb_utils, sequence_onnx).auto_complete_config(pb_utils.ModelConfig(json.dumps(raw)))
