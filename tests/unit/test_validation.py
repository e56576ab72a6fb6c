import numpy as np
import pytest

from backend.errors import InvalidInputError
from backend.tensors import TensorSpec
from backend.validation import ModelSignature, validate_request

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


def test_a_valid_request_reports_its_batch_size():
    assert validate_request({"input": np.zeros((3, 3, 8, 8), np.float32)}, IMAGE) == 3
    ids = np.ones((2, 5), np.int64)
    assert validate_request({"ids": ids, "mask": ids}, TEXT) == 2


def test_a_model_without_batching_counts_one():
    flat = ModelSignature("flat", (TensorSpec("x", np.dtype(np.float32), (4,)),), (), max_batch_size=0)
    assert validate_request({"x": np.zeros(4, np.float32)}, flat) == 1


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
        validate_request(inputs, IMAGE)
    assert message in str(caught.value)
    assert "model 'vision' expects [batch] + input (FP32 [3, 8, 8])" in str(caught.value) or "batch size" in message


def test_empty_variable_dims_and_disagreeing_batches_are_rejected():
    with pytest.raises(InvalidInputError, match=r"shape \[1, 0\]: it is empty, and every dim must be at least 1"):
        validate_request({"ids": np.zeros((1, 0), np.int64), "mask": np.zeros((1, 0), np.int64)}, TEXT)
    with pytest.raises(InvalidInputError, match=r"disagree on the batch size \(ids=1, mask=2\)"):
        validate_request({"ids": np.zeros((1, 3), np.int64), "mask": np.zeros((2, 3), np.int64)}, TEXT)


def test_a_missing_batch_dim_is_named_as_such():
    # Triton hands a request of batch size 0 to the model without its batch dim.
    with pytest.raises(InvalidInputError) as caught:
        validate_request({"input": np.zeros((3, 8, 8), np.float32)}, IMAGE)
    assert "expected rank 4: the first dim is the batch size, 1..4, and it is missing" in str(caught.value)
    assert "batch size of 0" in str(caught.value) and "expects [batch] + input (FP32 [3, 8, 8])" in str(caught.value)
    # A rank that is wrong otherwise says nothing about the batch dim.
    with pytest.raises(InvalidInputError) as caught:
        validate_request({"input": np.zeros((1, 1, 3, 8, 8), np.float32)}, IMAGE)
    assert "expected rank 4: model 'vision'" in str(caught.value) and "missing" not in str(caught.value)
