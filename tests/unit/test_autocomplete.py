"""Every config shape of Triton's onnxruntime backend, auto-completed and loaded as it completes and loads them.

Each test of a shape runs the stock model's auto-complete (Triton's real `pb_utils.ModelConfig`), starts an instance
on the completed config as Triton does, and compares an answer with in-process ONNX Runtime. A config with inputs and
outputs written is also started as it is, as tritonserver `--disable-auto-complete-config` serves it; the refusals
are the same, message for message, in both modes (docs/models.md, "What auto-complete fills in").
"""

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.unit.conftest import save_graph
from tests.unit.test_triton_model import empty_config, instance_args, model_folder

X4 = {"name": "x", "data_type": "TYPE_FP32", "dims": [4]}
Y4 = {"name": "y", "data_type": "TYPE_FP32", "dims": [4]}


@pytest.fixture(scope="module")
def fixed_onnx(tmp_path_factory) -> Path:
    """y = -x, x FP32 [3, 4]: a first dim of fixed size, so the graph cannot batch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    return save_graph(
        tmp_path_factory.mktemp("fixed") / "model.onnx", [helper.make_node("Neg", ["x"], ["y"])], [x], [y]
    )


@pytest.fixture(scope="module")
def flat_onnx(tmp_path_factory) -> Path:
    """y = -x, x FP32 [n]: one flat dim, as the onnxruntime backend hands a ragged input to its graph."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    return save_graph(tmp_path_factory.mktemp("flat") / "model.onnx", [helper.make_node("Neg", ["x"], ["y"])], [x], [y])


def config_of(written: dict | None = None, max_batch_size: int = 0) -> dict:
    """The config Triton hands auto-complete: name and backend, max_batch_size (0 when unwritten), what is written."""
    return {**empty_config("m", max_batch_size), "backend": "onnxruntime", **(written or {})}


def stock_class(onnx_file: Path, config_text: str) -> tuple[type, Path]:
    """The stock model.py's class, its stub started on the model folder's `1/model.onnx` with `config_text`."""
    folder = model_folder(onnx_file, config_text)
    sys.modules.pop("tritonnx.backend.stock_model", None)
    model_type = importlib.import_module("tritonnx.backend.stock_model").TritonPythonModel
    return model_type, folder


def load(pb_utils, monkeypatch, onnx_file: Path, config_text: str, config: dict, auto_complete: bool = True):
    """(the config served, a started instance), as tritonserver loads the model with or without auto-complete."""
    model_type, folder = stock_class(onnx_file, config_text)
    monkeypatch.setattr(
        "tritonnx.backend.model_files._own_command_line",
        lambda: ["/backends/python/triton_python_backend_stub", str(folder / "1" / "model.onnx"), "region"],
    )
    served = config
    if auto_complete:
        completed = pb_utils.ModelConfig(json.dumps(config))
        model_type.auto_complete_config(completed)
        served = completed.as_dict()
    model = model_type()
    model.initialize(instance_args(served, folder))
    return served, model


def refusal(pb_utils, monkeypatch, onnx_file: Path, config_text: str, config: dict, auto_complete: bool) -> str:
    with pytest.raises(pb_utils.TritonModelException) as raised:
        load(pb_utils, monkeypatch, onnx_file, config_text, config, auto_complete)
    return str(raised.value)


def assert_answers_as_in_process(pb_utils, model, onnx_file: Path, x: np.ndarray) -> None:
    [response] = model.execute([pb_utils.InferenceRequest(x=x)])
    assert response.error is None, response.error
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(response.outputs()["y"], session.run(["y"], {"x": x})[0])
    model.finalize()


def io_of(config: dict) -> list[tuple[str, str, list[int]]]:
    return [(e["name"], e["data_type"], [int(d) for d in e["dims"]]) for e in config["input"] + config["output"]]


# --- nothing written ---------------------------------------------------------------------------------------------


def test_nothing_written_batches_a_graph_with_dynamic_first_dims(pb_utils, monkeypatch, double_onnx):
    served, model = load(pb_utils, monkeypatch, double_onnx, 'platform: "onnxruntime_onnx"\n', config_of())
    assert served["max_batch_size"] == 4 and served["dynamic_batching"] == {}
    assert io_of(served) == [("x", "TYPE_FP32", [4]), ("y", "TYPE_FP32", [4])]
    assert_answers_as_in_process(pb_utils, model, double_onnx, np.arange(8, dtype=np.float32).reshape(2, 4))


def test_nothing_written_does_not_batch_a_graph_with_a_fixed_first_dim(pb_utils, monkeypatch, fixed_onnx):
    served, model = load(pb_utils, monkeypatch, fixed_onnx, 'platform: "onnxruntime_onnx"\n', config_of())
    assert served["max_batch_size"] == 0 and "dynamic_batching" not in served
    assert io_of(served) == [("x", "TYPE_FP32", [3, 4]), ("y", "TYPE_FP32", [3, 4])]
    assert_answers_as_in_process(pb_utils, model, fixed_onnx, np.arange(12, dtype=np.float32).reshape(3, 4))


def test_a_written_max_batch_size_is_kept_and_gets_the_dynamic_batcher(pb_utils, monkeypatch, double_onnx):
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    served, model = load(pb_utils, monkeypatch, double_onnx, text, config_of(max_batch_size=8))
    assert served["max_batch_size"] == 8 and served["dynamic_batching"] == {}
    assert io_of(served) == [("x", "TYPE_FP32", [4]), ("y", "TYPE_FP32", [4])]
    assert_answers_as_in_process(pb_utils, model, double_onnx, np.ones((3, 4), np.float32))


def test_a_written_max_batch_size_of_0_wins_over_a_graph_that_could_batch(pb_utils, monkeypatch, double_onnx):
    # tritonnx's one difference: the native backend cannot tell a written 0 from none and batches.
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
    served, model = load(pb_utils, monkeypatch, double_onnx, text, config_of())
    assert served["max_batch_size"] == 0 and "dynamic_batching" not in served
    assert io_of(served) == [("x", "TYPE_FP32", [-1, 4]), ("y", "TYPE_FP32", [-1, 4])]
    assert_answers_as_in_process(pb_utils, model, double_onnx, np.ones((3, 4), np.float32))


def test_a_written_scheduler_is_kept(pb_utils, monkeypatch, double_onnx):
    batcher = {"max_queue_delay_microseconds": 100}
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 100 }\n'
    served, _ = load(pb_utils, monkeypatch, double_onnx, text, config_of({"dynamic_batching": batcher}, 8))
    assert served["dynamic_batching"] == batcher


# --- inputs only, or outputs only --------------------------------------------------------------------------------


def test_inputs_written_and_outputs_left_out_completes_the_outputs_and_batching(pb_utils, monkeypatch, double_onnx):
    config = config_of({"input": [X4]})
    served, model = load(pb_utils, monkeypatch, double_onnx, 'platform: "onnxruntime_onnx"\n', config)
    assert served["max_batch_size"] == 4 and served["dynamic_batching"] == {}
    assert io_of(served) == [("x", "TYPE_FP32", [4]), ("y", "TYPE_FP32", [4])]
    assert_answers_as_in_process(pb_utils, model, double_onnx, np.ones((2, 4), np.float32))


def test_outputs_written_and_inputs_left_out_completes_the_inputs_and_batching(pb_utils, monkeypatch, double_onnx):
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 2\n'
    served, model = load(pb_utils, monkeypatch, double_onnx, text, config_of({"output": [Y4]}, 2))
    assert served["max_batch_size"] == 2 and served["dynamic_batching"] == {}
    assert io_of(served) == [("x", "TYPE_FP32", [4]), ("y", "TYPE_FP32", [4])]
    assert_answers_as_in_process(pb_utils, model, double_onnx, np.ones((2, 4), np.float32))


# --- inputs and outputs written ----------------------------------------------------------------------------------


@pytest.mark.parametrize("auto_complete", [True, False], ids=["auto-complete", "disabled"])
def test_every_dim_written_and_no_max_batch_size_serves_whole_tensors(
    pb_utils, monkeypatch, double_onnx, auto_complete
):
    # Triton's tutorials: the batch dim written as -1, no max_batch_size. Nothing is completed.
    written = {"input": [{**X4, "dims": [-1, 4]}], "output": [{**Y4, "dims": [-1, 4]}]}
    text = 'platform: "onnxruntime_onnx"\n'
    served, model = load(pb_utils, monkeypatch, double_onnx, text, config_of(written), auto_complete)
    assert served["max_batch_size"] == 0 and "dynamic_batching" not in served
    assert io_of(served) == [("x", "TYPE_FP32", [-1, 4]), ("y", "TYPE_FP32", [-1, 4])]
    assert_answers_as_in_process(pb_utils, model, double_onnx, np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize("auto_complete", [True, False], ids=["auto-complete", "disabled"])
def test_explicit_dims_and_max_batch_size_get_no_dynamic_batcher(pb_utils, monkeypatch, double_onnx, auto_complete):
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    served, model = load(
        pb_utils, monkeypatch, double_onnx, text, config_of({"input": [X4], "output": [Y4]}, 8), auto_complete
    )
    assert served["max_batch_size"] == 8 and "dynamic_batching" not in served  # Triton's default scheduler
    assert_answers_as_in_process(pb_utils, model, double_onnx, np.ones((5, 4), np.float32))


def test_every_dim_written_with_a_max_batch_size_is_refused_naming_the_dims(pb_utils, monkeypatch, double_onnx):
    written = {"input": [{**X4, "dims": [-1, 4]}], "output": [{**Y4, "dims": [-1, 4]}]}
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    message = refusal(pb_utils, monkeypatch, double_onnx, text, config_of(written, 8), auto_complete=True)
    assert message == "model 'm', input 'x': the config's dims [-1, 4] do not fit the graph's dims [4]"


# --- the same refusals, with and without auto-complete -----------------------------------------------------------


def sequence_batching(name: str, control: dict) -> dict:
    return {"sequence_batching": {"control_input": [{"name": name, "control": [control]}]}}


REFUSALS = {
    "misspelt input": (
        "double_onnx",
        8,
        {"input": [{**X4, "name": "X"}], "output": [Y4]},
        "input 'X': the graph has no such input (its inputs: x)",
    ),
    "input datatype": (
        "double_onnx",
        8,
        {"input": [{**X4, "data_type": "TYPE_INT64"}], "output": [Y4]},
        "input 'x': the config says TYPE_INT64, the graph TYPE_FP32",
    ),
    "input dims": (
        "double_onnx",
        8,
        {"input": [{**X4, "dims": [5]}], "output": [Y4]},
        r"input 'x': the config's dims [5] do not fit the graph's dims [4]",
    ),
    "reshape": (
        "double_onnx",
        8,
        {"input": [{**X4, "dims": [2, 2], "reshape": {"shape": [2, 2]}}], "output": [Y4]},
        "input 'x': the config's reshape [2, 2] do not fit the graph's dims [4]",
    ),
    "a required input left out": (
        "masked_sum_onnx",
        8,
        {
            "input": [{"name": "ids", "data_type": "TYPE_INT64", "dims": [-1]}],
            "output": [{"name": "total", "data_type": "TYPE_INT64", "dims": [1]}],
        },
        "input 'mask': the graph needs it and the config's inputs leave it out (the graph's inputs: ids, mask)",
    ),
    "misspelt output": (
        "double_onnx",
        8,
        {"input": [X4], "output": [{**Y4, "name": "Y"}]},
        "output 'Y': the graph has no such output (its outputs: y)",
    ),
    "output datatype": (
        "double_onnx",
        8,
        {"input": [X4], "output": [{**Y4, "data_type": "TYPE_FP16"}]},
        "output 'y': the config says TYPE_FP16, the graph TYPE_FP32",
    ),
    "batching a graph with a fixed first dim": (
        "fixed_onnx",
        8,
        {"input": [X4], "output": [Y4]},
        "input 'x' has a fixed first dim 3, so it cannot be a batch dim",
    ),
    "a ragged input the graph takes flat": (
        "flat_onnx",
        8,
        {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1], "allow_ragged_batch": True}], "output": [Y4]},
        "input 'x' is ragged and the graph takes it as one flat dim",
    ),
    "batch_input": (
        "double_onnx",
        8,
        {"batch_input": [{"kind": "BATCH_ELEMENT_COUNT", "target_name": ["n"], "source_input": ["x"]}]},
        "batch_input is not supported",
    ),
    "batch_output": (
        "double_onnx",
        8,
        {"batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["y"], "source_input": ["x"]}]},
        "batch_output is not supported",
    ),
    "implicit state": (
        "double_onnx",
        8,
        {"sequence_batching": {"state": [{"input_name": "past_in", "output_name": "past_out"}]}},
        "sequence_batching state (implicit state) is not supported",
    ),
    "a control the graph does not take": (
        "sequence_onnx",
        4,
        {"input": [X4], "output": [Y4], **sequence_batching("READY", {"fp32_false_true": [0, 1]})},
        "sequence_batching control_input 'READY': the graph has no such input (its inputs: x, START)",
    ),
    "a control of another type": (
        "sequence_onnx",
        4,
        {"input": [X4], "output": [Y4], **sequence_batching("START", {"int32_false_true": [0, 1]})},
        "sequence_batching control_input 'START': Triton sends it as TYPE_INT32, the graph takes TYPE_FP32",
    ),
    "a control written among the inputs": (
        "sequence_onnx",
        4,
        {
            "input": [X4, {"name": "START", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [Y4],
            **sequence_batching("START", {"fp32_false_true": [0, 1]}),
        },
        "input 'START' is a sequence_batching control_input",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_initialize_refuses_what_auto_complete_refuses_with_the_same_message(pb_utils, monkeypatch, request, case):
    fixture, max_batch_size, written, expected = REFUSALS[case]
    onnx_file = request.getfixturevalue(fixture)
    config = config_of(written, max_batch_size)
    text = f'platform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
    completing = refusal(pb_utils, monkeypatch, onnx_file, text, config, auto_complete=True)
    starting = refusal(pb_utils, monkeypatch, onnx_file, text, config, auto_complete=False)
    named = ", " if expected.startswith(("input '", "output '")) else ": "  # Triton's "model 'm', tensor 'x': ..."
    assert completing.startswith(f"model 'm'{named}{expected}"), completing
    assert starting == completing


def test_a_misspelt_input_beside_unwritten_outputs_is_refused_naming_the_graphs_inputs(
    pb_utils, monkeypatch, masked_sum_onnx
):
    # Auto-complete adds the graph's inputs and outputs; the misspelt entry is still not the graph's.
    config = config_of(
        {
            "input": [
                {"name": "ids", "data_type": "TYPE_INVALID", "dims": []},
                {"name": "maks", "data_type": "TYPE_INT64", "dims": [-1]},
            ]
        }
    )
    message = refusal(pb_utils, monkeypatch, masked_sum_onnx, 'platform: "onnxruntime_onnx"\n', config, True)
    assert message == "model 'm', input 'maks': the graph has no such input (its inputs: ids, mask)"


def test_a_config_without_inputs_is_refused_at_start_naming_the_first_the_graph_needs(
    pb_utils, monkeypatch, masked_sum_onnx
):
    # --disable-auto-complete-config and a one-line config: the native backend refuses it too (0 inputs expected).
    message = refusal(pb_utils, monkeypatch, masked_sum_onnx, 'platform: "onnxruntime_onnx"\n', config_of(), False)
    assert message.startswith("model 'm', input 'ids': the graph needs it and the config's inputs leave it out")
