import numpy as np

from backend.batching import group_compatible, split, stack
from backend.tensors import TensorSpec
from backend.validation import ModelSignature

FIXED = ModelSignature("fixed", (TensorSpec("x", np.dtype(np.float32), (-1,)),), (), max_batch_size=8)
RAGGED = ModelSignature(
    "ragged",
    (TensorSpec("ids", np.dtype(np.int64), (-1,)), TensorSpec("mask", np.dtype(np.int64), (-1,))),
    (),
    max_batch_size=8,
    ragged_inputs=frozenset({"ids", "mask"}),
)


def test_requests_with_different_shapes_run_apart_unless_ragged():
    requests = [{"x": np.zeros((1, n), np.float32)} for n in (3, 4, 3, 4, 5)]
    assert group_compatible(requests, range(5), FIXED) == [[0, 2], [1, 3], [4]]
    ragged = [{"ids": np.zeros((1, n), np.int64), "mask": np.zeros((1, n), np.int64)} for n in (3, 4, 5)]
    assert group_compatible(ragged, range(3), RAGGED) == [[0, 1, 2]]


def test_stack_concatenates_along_the_batch_dim():
    a, b = np.arange(4, dtype=np.float32).reshape(2, 2), np.full((1, 2), 9, np.float32)
    stacked = stack([{"x": a}, {"x": b}], FIXED)
    np.testing.assert_array_equal(stacked["x"], [[0, 1], [2, 3], [9, 9]])


def test_a_lone_request_is_not_copied():
    a = np.ones((2, 3), np.float32)
    assert stack([{"x": a}], FIXED)["x"] is a


def test_ragged_inputs_are_zero_padded_at_the_end():
    short = {"ids": np.array([[1, 2]], np.int64), "mask": np.array([[1, 1]], np.int64)}
    long = {"ids": np.array([[3, 4, 5, 6]], np.int64), "mask": np.array([[1, 1, 1, 1]], np.int64)}
    stacked = stack([short, long], RAGGED)
    np.testing.assert_array_equal(stacked["ids"], [[1, 2, 0, 0], [3, 4, 5, 6]])
    np.testing.assert_array_equal(stacked["mask"], [[1, 1, 0, 0], [1, 1, 1, 1]])


def test_split_gives_each_request_its_rows_as_views():
    output = np.arange(12, dtype=np.float32).reshape(6, 2)
    parts = split({"y": output}, [1, 3, 2])
    assert [p["y"].shape for p in parts] == [(1, 2), (3, 2), (2, 2)]
    np.testing.assert_array_equal(parts[1]["y"], output[1:4])
    assert all(np.shares_memory(p["y"], output) for p in parts)
