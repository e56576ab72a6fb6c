import numpy as np

from tritonnx.backend.batching import group_compatible, split, stack
from tritonnx.backend.tensors import TensorSpec
from tritonnx.backend.validation import ModelSignature, PreparedRequest, prepare_request

FIXED = ModelSignature("fixed", (TensorSpec("x", np.dtype(np.float32), (-1,)),), (), max_batch_size=8)
RAGGED = ModelSignature(
    "ragged",
    (
        TensorSpec("ids", np.dtype(np.int64), (-1,), ("sequence",)),
        TensorSpec("mask", np.dtype(np.int64), (-1,), ("sequence",)),
    ),
    (
        TensorSpec("tokens", np.dtype(np.float32), (-1, 3), ("sequence", None)),
        TensorSpec("pooled", np.dtype(np.float32), (3,)),
    ),
    max_batch_size=8,
    ragged_inputs=frozenset({"ids", "mask"}),
)
OPTIONAL = ModelSignature(
    "optional",
    (TensorSpec("x", np.dtype(np.float32), (2,)), TensorSpec("bias", np.dtype(np.float32), (2,), optional=True)),
    (),
    max_batch_size=8,
)


def prepared(signature: ModelSignature, **arrays: np.ndarray) -> PreparedRequest:
    return prepare_request(arrays, signature)


def tokens(length: int, fill: int = 0) -> PreparedRequest:
    ids = np.full((1, length), fill, np.int64)
    return prepared(RAGGED, ids=ids, mask=np.ones_like(ids))


def test_requests_with_different_shapes_run_apart_unless_ragged():
    requests = [prepared(FIXED, x=np.zeros((1, n), np.float32)) for n in (3, 4, 3, 4, 5)]
    assert group_compatible(requests, FIXED) == [[0, 2], [1, 3], [4]]
    assert group_compatible([tokens(n) for n in (3, 4, 5)], RAGGED) == [[0, 1, 2]]


def test_ragged_requests_run_in_runs_of_similar_length_so_padding_stays_small():
    # Sorted by length; a run is cut where its padding would pass PADDING_ALLOWANCE (25%) of its own elements:
    # 16 beside the two 8s pads 48 cells for 32 real ones, 120 beside 128 pads 256 for 248.
    assert group_compatible([tokens(n) for n in (8, 128, 8, 120, 16)], RAGGED) == [[0, 2], [4], [3, 1]]
    assert group_compatible([tokens(n) for n in (5, 100, 5, 5)], RAGGED) == [[0, 2, 3], [1]]


def test_a_request_of_several_rows_counts_each_row_in_the_padding():
    two_long = prepared(RAGGED, ids=np.zeros((2, 10), np.int64), mask=np.ones((2, 10), np.int64))
    # With 2 rows of 10, one row of 4 adds 6 padded cells to 24 real ones (25%); a row of 3 would add 7.
    assert group_compatible([tokens(4), two_long], RAGGED) == [[0, 1]]
    assert group_compatible([tokens(3), two_long], RAGGED) == [[0], [1]]


def test_requests_that_leave_out_an_optional_input_run_apart_from_those_that_give_it():
    x = np.zeros((1, 2), np.float32)
    requests = [prepared(OPTIONAL, x=x), prepared(OPTIONAL, x=x, bias=x), prepared(OPTIONAL, x=x)]
    assert group_compatible(requests, OPTIONAL) == [[0, 2], [1]]
    assert set(stack([requests[0], requests[2]], OPTIONAL)) == {"x"}


def test_stack_concatenates_along_the_batch_dim():
    a, b = np.arange(4, dtype=np.float32).reshape(2, 2), np.full((1, 2), 9, np.float32)
    stacked = stack([prepared(FIXED, x=a), prepared(FIXED, x=b)], FIXED)
    np.testing.assert_array_equal(stacked["x"], [[0, 1], [2, 3], [9, 9]])


def test_a_lone_request_is_not_copied():
    a = np.ones((2, 3), np.float32)
    assert stack([prepared(FIXED, x=a)], FIXED)["x"] is a


def test_ragged_inputs_are_zero_padded_at_the_end():
    short, long = tokens(2, fill=7), tokens(4, fill=8)
    stacked = stack([short, long], RAGGED)
    np.testing.assert_array_equal(stacked["ids"], [[7, 7, 0, 0], [8, 8, 8, 8]])
    np.testing.assert_array_equal(stacked["mask"], [[1, 1, 0, 0], [1, 1, 1, 1]])


def test_split_gives_each_request_its_rows_as_views():
    output = np.arange(12, dtype=np.float32).reshape(6, 2)
    requests = [prepared(FIXED, x=np.zeros((n, 2), np.float32)) for n in (1, 3, 2)]
    parts = split({"y": output}, requests, FIXED)
    assert [p["y"].shape for p in parts] == [(1, 2), (3, 2), (2, 2)]
    np.testing.assert_array_equal(parts[1]["y"], output[1:4])
    assert all(np.shares_memory(p["y"], output) for p in parts)


def test_an_output_dim_named_like_a_padded_input_dim_is_cut_to_each_request():
    requests = [tokens(2), tokens(5), tokens(3)]
    outputs = {
        "tokens": np.arange(3 * 5 * 3, dtype=np.float32).reshape(3, 5, 3),
        "pooled": np.ones((3, 3), np.float32),
    }
    parts = split(outputs, requests, RAGGED)
    assert [p["tokens"].shape for p in parts] == [(1, 2, 3), (1, 5, 3), (1, 3, 3)]
    np.testing.assert_array_equal(parts[2]["tokens"], outputs["tokens"][2:3, :3])
    assert [p["pooled"].shape for p in parts] == [(1, 3)] * 3
