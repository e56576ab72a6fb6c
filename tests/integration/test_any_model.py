"""Models unlike the demo models, served by the stock model.py through a real tritonserver.

The server runs from a scratch directory, not the checkout, so the Python stub must find the
`tritonnx` package installed. Every served output is compared with in-process ONNX Runtime on
the same file; every config comes from auto-complete (policy-only config.pbtxt).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.integration.any_models import (
    CARRIED_TYPES,
    EXTENSIONS_LIBRARY,
    MODELS,
    REFUSED,
    SERVER_ARGS,
    negate,
    write_repository,
)
from tritonnx.server import legacy_backend
from tritonnx.server.repository import add_model
from tritonnx.server.stack import ServingStack

# A version's model.py as releases before the `tritonnx` namespace published it.
LEGACY_MODEL_PY = """from backend.triton_model import OnnxRuntimeModel


class TritonPythonModel(OnnxRuntimeModel):
    \"\"\"The graph: `<version>/model.onnx`.\"\"\"
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, {model: onnx file}): every model of any_models, loaded at start-up."""
    workdir = tmp_path_factory.mktemp("any-models")
    files = write_repository(workdir / "repository")
    legacy = add_model(workdir / "repository", "legacy_import", 'backend: "python"\n')
    (legacy / "model.py").write_text(LEGACY_MODEL_PY)
    onnx.save(negate(), legacy / "model.onnx")
    stack = ServingStack(
        workdir / "repository",
        workdir,
        with_facade=False,
        triton_http=False,
        all_models_ready=False,  # two models are meant to fail
        triton_cwd=workdir,  # not the checkout: '' on the stub's sys.path finds no `backend` folder here
        triton_env={
            "TRITONNX_ORT_CACHE_DIR": str(workdir / "ort-cache"),
            "LD_LIBRARY_PATH": str(EXTENSIONS_LIBRARY.parent),  # tritonserver's own libraries go first
        },
        triton_args=SERVER_ARGS,
    )
    with stack:
        yield stack.triton, files


@pytest.fixture(scope="module")
def client(served):
    with grpcclient.InferenceServerClient(served[0].grpc_url) as client:
        yield client


def infer(client, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    tensors = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
    return {name: result.as_numpy(name) for name in outputs}


def in_process(onnx_file: Path, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    return dict(zip(outputs, session.run(outputs, feeds), strict=False))


def config(served, client, model: str):
    return client.get_model_config(model, headers=served[0].admin_headers).config


def test_every_servable_model_is_ready_and_the_others_are_refused_by_name(served):
    server, _ = served
    states = {m["name"]: m for m in server.model_states()}
    for name in MODELS:
        if name in REFUSED:
            assert states[name]["state"] == "UNAVAILABLE"
            assert REFUSED[name] in states[name]["reason"], states[name]["reason"]
        else:
            assert states[name]["state"] == "READY", states[name].get("reason")


def test_gpu_settings_of_kind_cpu_instances_are_ignored_with_a_warning_as_the_onnxruntime_backend_does(served, client):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(infer(client, "gpu_settings_on_cpu", {"x": x}, ["y"])["y"], -x)
    log = served[0].log_file.read_text(errors="replace")
    assert (
        "model 'gpu_settings_on_cpu': gpu_execution_accelerator 'tensorrt', parameter 'cudnn_conv_algo_search' "
        "ignored: GPU-only, and the instances are KIND_CPU"
    ) in log


def strings(rows: int) -> np.ndarray:
    """Empty, non-ASCII (UTF-8) and embedded-NUL strings, as the bytes Triton carries."""
    words = [b"", "na\u00efve \u2603".encode(), b"nul\x00inside", b"plain"]
    return np.array([[words[(r + c) % 4] for c in range(2)] for r in range(rows)], dtype=object)


def typed_inputs(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, (_, dtype) in CARRIED_TYPES.items():
        if name == "string":
            inputs[f"x_{name}"] = strings(rows)
        elif name == "bool":
            inputs[f"x_{name}"] = rng.integers(0, 2, (rows, 2)).astype(bool)
        else:
            inputs[f"x_{name}"] = (rng.standard_normal((rows, 2)) * 50).astype(dtype)
    return inputs


@pytest.mark.parametrize("model", ["every_type", "every_type_unbatched"])
def test_every_element_type_triton_carries_comes_back_as_onnx_runtime_gives_it(served, client, model):
    _, files = served
    outputs = [f"y_{name}" for name in CARRIED_TYPES]
    for rows in (1, 3):
        inputs = typed_inputs(rows, seed=rows)
        got = infer(client, model, inputs, outputs)
        feeds = {
            k: np.vectorize(bytes.decode, otypes=[object])(v) if v.dtype == object else v for k, v in inputs.items()
        }
        expected = in_process(files[model], feeds, outputs)
        for name in outputs:
            want = expected[name]
            if want.dtype == object:  # ONNX Runtime gives str; Triton carries their UTF-8 bytes
                want = np.vectorize(str.encode, otypes=[object])(want)
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            np.testing.assert_array_equal(got[name], want, err_msg=name)
    assert got["y_string"][2].tolist() == [b"nul\x00inside", b"plain"]


def test_batching_is_decided_from_the_graph_unless_the_config_says(served, client):
    auto = config(served, client, "every_type")
    assert auto.max_batch_size == 4 and auto.HasField("dynamic_batching")
    assert list(auto.input[0].dims) == [2]
    assert config(served, client, "every_type_unbatched").max_batch_size == 0
    assert config(served, client, "not_batched").max_batch_size == 0
    assert config(served, client, "external_weights").max_batch_size == 8


def test_a_model_that_does_not_batch_answers_whole_tensors(served, client):
    _, files = served
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    got = infer(client, "not_batched", {"x": x}, ["y"])["y"]
    assert got.shape == (3, 4, 5)
    np.testing.assert_array_equal(got, in_process(files["not_batched"], {"x": x}, ["y"])["y"])

    # A dynamic first dim that is the model's own, not a batch: all rows are summed together.
    for rows in (1, 5):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        total = infer(client, "first_dim_not_batch", {"x": x}, ["total"])["total"]
        np.testing.assert_array_equal(total, in_process(files["first_dim_not_batch"], {"x": x}, ["total"])["total"])
        assert total.shape == (1, 4)


def test_scalars_travel_as_shape_1(served, client):
    _, files = served
    model_config = config(served, client, "scalars")
    assert [(t.name, list(t.dims)) for t in model_config.input] == [("x", [1]), ("k", [1]), ("v", [-1])]
    got = infer(client, "scalars", {"x": np.array([2.5]), "k": np.array([4.0]), "v": np.arange(7)}, ["y", "count"])
    expected = in_process(files["scalars"], {"x": np.array(2.5), "k": np.array(4.0), "v": np.arange(7)}, ["y", "count"])
    assert got["y"].shape == (1,) and got["y"][0] == expected["y"] == 11.0
    assert got["count"].shape == (1,) and got["count"][0] == expected["count"] == 7


def test_zero_size_dims_load_and_empty_tensors_are_served(served, client):
    _, files = served
    assert [list(t.dims) for t in config(served, client, "zero_dims").input] == [[-1, 3], [-1]]
    for rows in (0, 2):
        x = -np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        feeds = {"x": x, "axes": np.zeros(0, np.int64)}
        got = infer(client, "zero_dims", feeds, ["y", "absolute"])
        expected = in_process(files["zero_dims"], feeds, ["y", "absolute"])
        assert got["absolute"].shape == (rows, 3)
        for name in ("y", "absolute"):  # whatever ONNX Runtime makes of an empty reduction, served alike
            assert got[name].shape == expected[name].shape
            np.testing.assert_array_equal(got[name], expected[name])
    # The graph's fixed 0 still holds: a non-empty `axes` is refused, naming the input.
    with pytest.raises(InferenceServerException, match=r"input 'axes' has shape \[1\], which does not fit \[0\]"):
        infer(client, "zero_dims", {"x": np.ones((1, 3), np.float32), "axes": np.zeros(1, np.int64)}, ["y"])


@pytest.mark.parametrize("model", ["divides", "divides_no_warm_up"])
def test_a_model_whose_warm_up_would_divide_by_zero_is_ready_and_correct(served, client, model):
    x = np.array([7, -9], np.int64)
    got = infer(client, model, {"x": x}, ["y"])["y"]
    np.testing.assert_array_equal(got, in_process(served[1][model], {"x": x}, ["y"])["y"])
    log = served[0].log_file.read_text(errors="replace")
    if model == "divides":
        assert "model 'divides': warm-up with ones was killed by SIGFPE in a child process" in log
    else:
        assert "warm_up=0" in log


def test_an_input_with_a_default_may_be_left_out(served, client):
    _, files = served
    assert [(t.name, t.optional) for t in config(served, client, "with_default").input] == [
        ("x", False),
        ("bias", True),
    ]
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(infer(client, "with_default", {"x": x}, ["y"])["y"], [11.0, 22.0])
    bias = np.array([-1.0, -2.0], np.float32)
    got = infer(client, "with_default", {"x": x, "bias": bias}, ["y"])["y"]
    np.testing.assert_array_equal(got, in_process(files["with_default"], {"x": x, "bias": bias}, ["y"])["y"])


def test_outputs_of_other_and_data_dependent_shapes_and_an_input_returned(served, client):
    _, files = served
    names = ["where", "top_values", "top_indices", "peak", "x"]
    x = np.array([[0, 3, 0, 1, 5, 0], [2, 0, 0, 0, 4, 6]], np.float32)
    for k in (1, 4):
        feeds = {"x": x, "k": np.array([k], np.int64)}
        got = infer(client, "data_dependent", feeds, names)
        expected = in_process(files["data_dependent"], feeds, names)
        assert got["where"].shape == (2, 6) and got["top_values"].shape == (2, k)
        assert got["peak"].shape == (1,) and got["peak"][0] == expected["peak"] == 6.0
        for name in ("where", "top_values", "top_indices", "x"):
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_model_with_external_weights_loads_and_batches(served, client):
    _, files = served
    assert (files["external_weights"].parent / "model.onnx.data").stat().st_size == 64 * 8 * 4
    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    got = infer(client, "external_weights", {"x": x}, ["y"])["y"]
    np.testing.assert_allclose(got, in_process(files["external_weights"], {"x": x}, ["y"])["y"], rtol=1e-6, atol=1e-6)


def test_an_unknown_rank_input_and_output_are_served_as_the_onnxruntime_backend_serves_them(served, client):
    _, files = served
    model_config = config(served, client, "unknown_rank")
    # ONNX Runtime reports no dims for an unknown rank: [1] in the config, and no batching.
    assert model_config.max_batch_size == 0
    assert [(t.name, list(t.dims)) for t in model_config.input] == [("x", [1]), ("w", [2, 3])]
    assert [(t.name, list(t.dims)) for t in model_config.output] == [("y", [1]), ("z", [1])]
    feeds = {"x": np.array([1.5], np.float32), "w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    got = infer(client, "unknown_rank", feeds, ["y", "z"])
    expected = in_process(files["unknown_rank"], feeds, ["y", "z"])
    assert got["y"].tolist() == expected["y"].tolist() == [3.0]
    # An output of unknown rank comes back at the shape ONNX Runtime gives it, whatever the config says.
    assert got["z"].shape == expected["z"].shape == (2, 3)
    np.testing.assert_array_equal(got["z"], expected["z"])


def test_string_bytes_that_are_not_utf8_fail_their_request_with_the_reason(served, client):
    # Out: ONNX Runtime's Python API cannot decode the graph's string, so the request fails saying so.
    assert infer(client, "string_not_utf8", {"i": np.array([0])}, ["word"])["word"].tolist() == [b"ok"]
    with pytest.raises(InferenceServerException, match="'utf-8' codec can't decode byte 0xff in position 0"):
        infer(client, "string_not_utf8", {"i": np.array([1])}, ["word"])
    # In: refused before ONNX Runtime, naming the element.
    inputs = typed_inputs(1, seed=7)
    inputs["x_string"] = np.array([[b"ok", b"\xff\xfe"]], dtype=object)
    with pytest.raises(InferenceServerException, match="input 'x_string' element 1 is not valid UTF-8") as refused:
        infer(client, "every_type", inputs, ["y_string"])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert infer(client, "string_not_utf8", {"i": np.array([0])}, ["word"])["word"].tolist() == [b"ok"]


def test_a_custom_operator_library_named_by_its_soname_is_found_on_the_servers_library_path(served, client):
    text = np.array([[b"tritonnx"], ["w\u00f6rld".encode()]], dtype=object)  # [batch, 1]: one string per row
    got = infer(client, "custom_op_by_soname", {"text": text}, ["upper"])["upper"]
    assert got.tolist() == [[b"TRITONNX"], ["W\u00f6RLD".encode()]]


def test_a_backend_config_written_with_a_space_reaches_the_onnxruntime_backend(served, client):
    assert SERVER_ARGS == ["--backend-config", "onnxruntime,default-max-batch-size=6"]
    assert config(served, client, "space_form_backend_config").max_batch_size == 6


def test_a_version_whose_model_py_imports_the_old_module_path_loads_and_the_log_says_what_to_change(served, client):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(infer(client, "legacy_import", {"x": x}, ["y"])["y"], -x)
    log = served[0].log_file.read_text(errors="replace")
    assert legacy_backend.WARNING in log
