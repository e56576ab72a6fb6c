import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tritonnx.backend.errors import InvalidInputError, ModelConfigError
from tritonnx.backend.tensors import TensorSpec, tensor_spec
from tritonnx.backend.validation import ModelSignature, prepare_request

IMAGE = ModelSignature(
    name="vision",
    inputs=(TensorSpec("input", np.dtype(np.float32), (3, 8, 8)),),
    outputs=(TensorSpec("output", np.dtype(np.float32), (10,)),),
    max_batch_size=4,
)
TEXT = ModelSignature(
    name="text",
    inputs=(TensorSpec("ids", np.dtype(np.int64), (-1,)), TensorSpec("mask", np.dtype(np.int64), (-1,))),
    outputs=(TensorSpec("total", np.dtype(np.int64), (1,)),),
    max_batch_size=8,
    ragged_inputs=frozenset({"ids", "mask"}),
)


def test_a_valid_request_reports_its_batch_size_and_keeps_its_arrays():
    image = np.zeros((3, 3, 8, 8), np.float32)
    prepared = prepare_request({"input": image}, IMAGE)
    assert prepared.batch_size == 3 and prepared.feeds["input"] is image  # no copy on the hot path
    ids = np.ones((2, 5), np.int64)
    assert prepare_request({"ids": ids, "mask": ids}, TEXT).batch_size == 2


def test_a_model_without_batching_counts_one():
    flat = ModelSignature("flat", (TensorSpec("x", np.dtype(np.float32), (4,)),), (), max_batch_size=0)
    assert prepare_request({"x": np.zeros(4, np.float32)}, flat).batch_size == 1


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({}, "missing input(s) 'input'"),
        ({"input": np.zeros((1, 3, 8, 8), np.float32), "extra": np.zeros(1)}, "unknown input(s) 'extra'"),
        ({"input": np.zeros((1, 3, 8, 8), np.float64)}, "datatype FP64, expected FP32"),
        ({"input": np.zeros((3, 8, 8), np.float32)}, "expected rank 4"),
        ({"input": np.zeros((1, 3, 8, 9), np.float32)}, "does not fit [3, 8, 8] after the batch dim"),
        ({"input": np.zeros((5, 3, 8, 8), np.float32)}, "batch size 5 is outside 1..4"),
        ({"input": np.zeros((0, 3, 8, 8), np.float32)}, "batch size 0 is outside 1..4"),
    ],
)
def test_bad_requests_say_what_is_wrong_and_what_is_expected(inputs, message):
    with pytest.raises(InvalidInputError) as caught:
        prepare_request(inputs, IMAGE)
    assert message in str(caught.value)
    assert "model 'vision' expects [batch] + input (FP32 [3, 8, 8])" in str(caught.value) or "batch size" in message


def test_empty_variable_dims_pass_and_disagreeing_batches_are_rejected():
    # Whether an empty tensor is valid is the model's business: ONNX Runtime decides.
    empty = np.zeros((1, 0), np.int64)
    assert prepare_request({"ids": empty, "mask": empty}, TEXT).dim_sizes == {}
    with pytest.raises(InvalidInputError, match=r"disagree on the batch size \(ids=1, mask=2\)"):
        prepare_request({"ids": np.zeros((1, 3), np.int64), "mask": np.zeros((2, 3), np.int64)}, TEXT)


def test_a_missing_batch_dim_is_named_as_such():
    # Triton hands a request of batch size 0 to the model without its batch dim.
    with pytest.raises(InvalidInputError) as caught:
        prepare_request({"input": np.zeros((3, 8, 8), np.float32)}, IMAGE)
    assert "expected rank 4: the first dim is the batch size, 1..4, and it is missing" in str(caught.value)
    assert "batch size of 0" in str(caught.value) and "expects [batch] + input (FP32 [3, 8, 8])" in str(caught.value)
    # A rank that is wrong otherwise says nothing about the batch dim.
    with pytest.raises(InvalidInputError) as caught:
        prepare_request({"input": np.zeros((1, 1, 3, 8, 8), np.float32)}, IMAGE)
    assert "expected rank 4: model 'vision'" in str(caught.value) and "missing" not in str(caught.value)


FLAT = ModelSignature(
    "flat",
    inputs=(
        TensorSpec("scale", np.dtype(np.float32), ()),
        TensorSpec("axes", np.dtype(np.int64), (0,)),
        TensorSpec("words", np.dtype(np.object_), (-1,), ("n",)),
        TensorSpec("bias", np.dtype(np.float32), (2,), optional=True),
    ),
    outputs=(),
    max_batch_size=0,
)


def test_a_scalar_arrives_as_shape_1_and_runs_at_rank_0():
    prepared = prepare_request(
        {"scale": np.array([2.0], np.float32), "axes": np.zeros(0, np.int64), "words": np.array([b"a"], object)}, FLAT
    )
    assert prepared.feeds["scale"].shape == () and prepared.feeds["scale"] == 2.0
    assert prepared.feeds["axes"].shape == (0,)
    assert "bias" not in prepared.feeds  # optional: the graph's default applies
    assert prepared.dim_sizes == {"n": 1}


def test_a_fixed_zero_dim_is_held_to_zero():
    with pytest.raises(InvalidInputError, match=r"input 'axes' has shape \[2\], which does not fit \[0\]"):
        prepare_request(
            {"scale": np.ones(1, np.float32), "axes": np.ones(2, np.int64), "words": np.array([b""], object)}, FLAT
        )


def test_strings_become_str_with_nul_and_non_ascii_bytes_kept():
    words = np.array([b"", "caf\u00e9".encode(), b"a\x00b"], dtype=object)
    prepared = prepare_request({"scale": np.ones(1, np.float32), "axes": np.zeros(0, np.int64), "words": words}, FLAT)
    assert prepared.feeds["words"].tolist() == ["", "caf\u00e9", "a\x00b"]


def test_bytes_that_are_not_utf8_are_refused_with_their_place():
    words = np.array([b"ok", b"\xff\xfe"], dtype=object)
    with pytest.raises(InvalidInputError, match=r"input 'words' element 1 is not valid UTF-8 .*at byte 0") as refused:
        prepare_request({"scale": np.ones(1, np.float32), "axes": np.zeros(0, np.int64), "words": words}, FLAT)
    assert "ONNX Runtime's Python API, which serves the model, takes string tensors as UTF-8 text only" in str(
        refused.value
    )


def test_onnx_runtimes_python_api_cannot_carry_bytes_that_are_not_utf8_either_way():
    # Why the bytes are refused above rather than passed on: in, ONNX Runtime turns a bytes object into its repr and
    # refuses a str holding them as surrogates; out, it fails decoding a string that is not UTF-8.
    words = helper.make_tensor_value_info("words", TensorProto.STRING, ["n"])
    same = helper.make_tensor_value_info("same", TensorProto.STRING, ["n"])
    stored = helper.make_tensor_value_info("stored", TensorProto.STRING, [1])
    constant = helper.make_tensor("constant", TensorProto.STRING, [1], [b"\xff\xfe"])
    nodes = [helper.make_node("Identity", ["words"], ["same"]), helper.make_node("Identity", ["constant"], ["stored"])]
    graph = helper.make_graph(nodes, "strings", [words], [same, stored], [constant])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(["same"], {"words": np.array([b"\xff"], object)})[0].tolist() == ["b'\\xff'"]
    with pytest.raises(UnicodeEncodeError):
        session.run(["same"], {"words": np.array([b"\xff".decode(errors="surrogateescape")], object)})
    with pytest.raises(UnicodeDecodeError):
        session.run(["stored"], {"words": np.array(["ok"], object)})


def test_a_tensor_of_unknown_rank_reaches_onnx_runtime_at_the_shape_it_came_with():
    spec = tensor_spec("free", TensorProto.FLOAT, None, batched=False)
    assert spec.any_rank and spec.as_config()["dims"] == [1]  # as Triton's onnxruntime backend declares it
    assert spec.describe() == "free (FP32 unknown rank, sent as [1])"
    signature = ModelSignature("free", (spec,), (spec,), max_batch_size=0)
    for shape in [(1,), (), (2, 3)]:
        array = np.ones(shape, np.float32)
        assert prepare_request({"free": array}, signature).feeds["free"].shape == shape
    with pytest.raises(InvalidInputError, match="has datatype INT64, expected FP32"):
        prepare_request({"free": np.ones(1, np.int64)}, signature)
    with pytest.raises(
        ModelConfigError, match=r"'free' has no shape in the graph \(unknown rank\), so it has no batch dim"
    ):
        tensor_spec("free", TensorProto.FLOAT, None, batched=True, role="input")


def test_an_optional_input_may_be_given_and_a_required_one_may_not_be_left_out():
    given = prepare_request(
        {
            "scale": np.ones(1, np.float32),
            "axes": np.zeros(0, np.int64),
            "words": np.array([b"x"], object),
            "bias": np.ones(2, np.float32),
        },
        FLAT,
    )
    assert given.feeds["bias"].shape == (2,)
    with pytest.raises(InvalidInputError, match=r"missing input\(s\) 'scale'"):
        prepare_request({"axes": np.zeros(0, np.int64), "words": np.array([b"x"], object)}, FLAT)
