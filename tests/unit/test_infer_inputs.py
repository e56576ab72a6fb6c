"""client/infer_inputs.py: the request triton_infer builds from a model's metadata: shapes, generated inputs,
.npy files."""

from __future__ import annotations

import numpy as np
import pytest

from tritonnx.client import infer_inputs
from tritonnx.client.infer_inputs import InputError
from tritonnx.client.model_control import normalize_metadata

# --- shapes and generated inputs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "max_batch_size", "expected"),
    [
        ([-1, 3, 224, 224], 8, [4, 3, 224, 224]),  # batch dim only
        ([-1, -1], 8, [4, 16]),  # batch dim + sequence dim
        ([-1, -1, 3], 8, [4, 16, 3]),
        ([2, -1], 0, [2, 16]),  # no batching: every -1 is a variable dim
        ([-1], 0, [16]),
        ([1, 1000], 0, [1, 1000]),
    ],
)
def test_concrete_shape(shape, max_batch_size, expected):
    assert infer_inputs.concrete_shape(shape, max_batch_size, batch_size=4, seq_len=16) == expected


@pytest.mark.parametrize(
    ("datatype", "dtype"),
    [
        ("FP32", np.float32),
        ("FP16", np.float16),
        ("FP64", np.float64),
        ("INT64", np.int64),
        ("INT32", np.int32),
        ("UINT8", np.uint8),
        ("BOOL", np.bool_),
    ],
)
def test_generated_inputs_have_the_model_datatype(datatype, dtype):
    rng = np.random.default_rng(0)
    for source in ("random", "zeros"):
        array = infer_inputs.generate_input("x", datatype, [2, 3], source, rng)
        assert array.dtype == dtype and array.shape == (2, 3)


def test_random_float_inputs_are_standard_normal():
    array = infer_inputs.generate_input("pixels", "FP32", [100_000], "random", np.random.default_rng(0))
    assert abs(array.mean()) < 0.02 and abs(array.std() - 1.0) < 0.02


def test_random_int_inputs_are_ids_below_1000_and_masks_are_ones():
    rng = np.random.default_rng(0)
    ids = infer_inputs.generate_input("input_ids", "INT64", [4, 64], "random", rng)
    assert ids.min() >= 0 and ids.max() < 1000 and len(np.unique(ids)) > 100
    mask = infer_inputs.generate_input("attention_mask", "INT64", [4, 64], "random", rng)
    assert (mask == 1).all()
    assert (infer_inputs.generate_input("Input_Mask", "INT32", [3], "random", rng) == 1).all()


def test_random_small_int_types_stay_in_range():
    array = infer_inputs.generate_input("x", "INT8", [10_000], "random", np.random.default_rng(0))
    assert array.min() >= 0 and array.max() <= 127


def test_zeros_source_gives_zeros_even_for_masks():
    mask = infer_inputs.generate_input("attention_mask", "INT64", [2, 4], "zeros", np.random.default_rng(0))
    assert (mask == 0).all()


@pytest.mark.parametrize("datatype", ["BYTES", "NOT_A_TYPE"])
def test_inputs_that_cannot_be_generated_are_input_errors(datatype):
    with pytest.raises(InputError):
        infer_inputs.generate_input("text", datatype, [1], "random", np.random.default_rng(0))


BERT_METADATA = normalize_metadata(
    {
        "name": "bert",
        "inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
            {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]},
        ],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
    }
)


def test_build_inputs_from_metadata_is_seeded():
    def build(seed):
        return infer_inputs.build_inputs(BERT_METADATA, 8, "random", {}, 2, 7, seed)

    inputs = build(0)
    assert list(inputs) == ["input_ids", "attention_mask"]
    assert inputs["input_ids"].shape == (2, 7) and inputs["attention_mask"].shape == (2, 7)
    np.testing.assert_array_equal(inputs["input_ids"], build(0)["input_ids"])
    assert not np.array_equal(inputs["input_ids"], build(1)["input_ids"])


def test_build_inputs_named_source_overrides_the_default():
    inputs = infer_inputs.build_inputs(BERT_METADATA, 8, "random", {"input_ids": "zeros"}, 1, 4, 0)
    assert (inputs["input_ids"] == 0).all() and (inputs["attention_mask"] == 1).all()


def test_build_inputs_rejects_unknown_input_names():
    with pytest.raises(InputError, match="input_ids, attention_mask"):
        infer_inputs.build_inputs(BERT_METADATA, 8, "random", {"token_ids": "zeros"}, 1, 4, 0)


def test_build_inputs_rejects_a_batch_size_for_a_model_that_does_not_batch():
    metadata = normalize_metadata(
        {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, -1]}], "outputs": []}
    )
    assert infer_inputs.build_inputs(metadata, 0, "zeros", {}, 1, 5, 0)["x"].shape == (2, 5)
    with pytest.raises(InputError, match="does not batch"):
        infer_inputs.build_inputs(metadata, 0, "zeros", {}, 2, 5, 0)


# --- .npy files -----------------------------------------------------------------------------------


def test_npy_without_batch_dim_gets_one_repeated_to_the_batch_size(tmp_path):
    path = tmp_path / "image.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    one = infer_inputs.load_npy(str(path), "x", "FP32", [-1, 3, 4], 8, batch_size=1)
    assert one.shape == (1, 3, 4)
    three = infer_inputs.load_npy(str(path), "x", "FP32", [-1, 3, 4], 8, batch_size=3)
    assert three.shape == (3, 3, 4)
    np.testing.assert_array_equal(three[2], np.arange(12).reshape(3, 4))


def test_npy_with_batch_dim_is_used_as_is(tmp_path):
    path = tmp_path / "batch.npy"
    data = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(path, data)
    # The file's own batch wins over --batch-size.
    loaded = infer_inputs.load_npy(str(path), "x", "FP32", [-1, 4], 8, batch_size=2)
    np.testing.assert_array_equal(loaded, data)


def test_npy_for_a_non_batching_model_must_match_the_rank(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((2, 9), dtype=np.float32))
    assert infer_inputs.load_npy(str(path), "x", "FP32", [2, -1], 0, 1).shape == (2, 9)
    with pytest.raises(InputError, match="shape"):
        infer_inputs.load_npy(str(path), "x", "FP32", [-1], 0, 1)


def test_npy_is_cast_within_its_kind_only(tmp_path):
    floats = tmp_path / "floats.npy"
    np.save(floats, np.array([0.5, 1.5, 2.5, 3.5]))  # numpy's default float64
    cast = infer_inputs.load_npy(str(floats), "x", "FP32", [-1, 4], 8, 1)
    assert cast.dtype == np.float32 and cast.shape == (1, 4)
    with pytest.raises(InputError, match="float64"):
        infer_inputs.load_npy(str(floats), "ids", "INT64", [-1, 4], 8, 1)


def test_npy_strings_become_bytes_objects(tmp_path):
    path = tmp_path / "text.npy"
    np.save(path, np.array(["hello", "world"]))
    loaded = infer_inputs.load_npy(str(path), "text", "BYTES", [-1, 2], 8, 1)
    assert loaded.dtype == object and loaded.shape == (1, 2) and loaded[0, 0] == "hello"


def test_npy_rank_mismatch_and_missing_file_are_input_errors(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1, 2, 3, 4), dtype=np.float32))
    with pytest.raises(InputError, match=r"\[1, 2, 3, 4\]"):
        infer_inputs.load_npy(str(path), "x", "FP32", [-1, 4], 8, 1)
    with pytest.raises(InputError, match="cannot load"):
        infer_inputs.load_npy(str(tmp_path / "missing.npy"), "x", "FP32", [-1, 4], 8, 1)


def test_build_inputs_mixes_files_and_generated_inputs(tmp_path):
    path = tmp_path / "ids.npy"
    np.save(path, np.array([101, 2023, 102]))
    inputs = infer_inputs.build_inputs(BERT_METADATA, 8, "random", {"input_ids": str(path)}, 1, 3, 0)
    np.testing.assert_array_equal(inputs["input_ids"], [[101, 2023, 102]])
    assert inputs["attention_mask"].shape == (1, 3)
