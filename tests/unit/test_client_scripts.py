"""The server-independent parts of the client scripts: argument parsing, input building from
metadata, .npy loading, output summaries, latency statistics, and exit codes (with a fake client
standing in for tritonclient)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client import triton_common, triton_health, triton_infer
from client.triton_common import ServerUnreachable, describe_error, normalize_metadata
from client.triton_infer import InputError

# --- triton_common ----------------------------------------------------------------------------


def test_default_url_comes_from_the_environment_per_protocol(monkeypatch):
    monkeypatch.delenv("TRITONNX_TRITON_URL", raising=False)
    monkeypatch.delenv("TRITONNX_TRITON_HTTP_URL", raising=False)
    assert triton_common.default_url("grpc") == "127.0.0.1:8001"
    assert triton_common.default_url("http") == "127.0.0.1:8000"
    monkeypatch.setenv("TRITONNX_TRITON_URL", "triton:9001")
    monkeypatch.setenv("TRITONNX_TRITON_HTTP_URL", "triton:9000")
    assert triton_infer.parse_args(["--model", "m"]).url is None
    assert triton_common.resolve_url(triton_infer.parse_args(["--model", "m"])) == "triton:9001"
    http_args = triton_infer.parse_args(["--model", "m", "--protocol", "http"])
    assert triton_common.resolve_url(http_args) == "triton:9000"
    explicit = triton_infer.parse_args(["--model", "m", "--url", "10.0.0.1:8001"])
    assert triton_common.resolve_url(explicit) == "10.0.0.1:8001"


def test_url_with_a_scheme_is_refused_at_parse_time():
    with pytest.raises(SystemExit) as exit_info:
        triton_health.parse_args(["--url", "http://127.0.0.1:8000"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("StatusCode.NOT_FOUND", "NOT_FOUND: no such model"),  # gRPC
        ("404", "404: no such model"),  # HTTP
        (None, "no such model"),  # raised by tritonclient itself
    ],
)
def test_describe_error(status, expected):
    assert describe_error(InferenceServerException("no such model", status=status)) == expected


def test_normalize_metadata_turns_grpc_string_dims_into_ints_and_fills_missing_keys():
    grpc_style = {
        "name": "bert",
        "versions": ["1"],
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": ["-1", "-1"]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": ["-1", "2"]}],
    }
    assert normalize_metadata(grpc_style) == {
        "name": "bert",
        "versions": ["1"],
        "platform": "",
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
    }


# --- triton_infer: arguments ------------------------------------------------------------------


def test_infer_defaults():
    args = triton_infer.parse_args(["--model", "resnet50"])
    assert (args.protocol, args.batch_size, args.input, args.input_name) == ("grpc", 1, "random", [])
    assert (args.seq_len, args.seed, args.requests, args.top_k) == (16, 0, 1, 5)
    assert args.timeout_ms is None and args.json is False


def test_input_name_takes_several_values_and_repeats():
    args = triton_infer.parse_args(["--model", "m", "--input-name", "a=zeros", "b=x.npy", "--input-name", "c=random"])
    assert args.input_name == [("a", "zeros"), ("b", "x.npy"), ("c", "random")]


@pytest.mark.parametrize(
    "argv",
    [
        ["--input", "image.png"],
        ["--input-name", "no_equals_sign"],
        ["--input-name", "=zeros"],
        ["--input-name", "a=zeros", "a=random"],
        ["--batch-size", "0"],
        ["--requests", "0"],
        ["--timeout-ms", "0"],
        ["--protocol", "ws"],
    ],
)
def test_bad_infer_arguments_exit_with_usage_error(argv):
    with pytest.raises(SystemExit) as exit_info:
        triton_infer.parse_args(["--model", "m", *argv])
    assert exit_info.value.code == 2


def test_model_is_required():
    with pytest.raises(SystemExit):
        triton_infer.parse_args([])


# --- triton_infer: shapes and generated inputs ------------------------------------------------


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
    assert triton_infer.concrete_shape(shape, max_batch_size, batch_size=4, seq_len=16) == expected


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
        array = triton_infer.generate_input("x", datatype, [2, 3], source, rng)
        assert array.dtype == dtype and array.shape == (2, 3)


def test_random_float_inputs_are_standard_normal():
    array = triton_infer.generate_input("pixels", "FP32", [100_000], "random", np.random.default_rng(0))
    assert abs(array.mean()) < 0.02 and abs(array.std() - 1.0) < 0.02


def test_random_int_inputs_are_ids_below_1000_and_masks_are_ones():
    rng = np.random.default_rng(0)
    ids = triton_infer.generate_input("input_ids", "INT64", [4, 64], "random", rng)
    assert ids.min() >= 0 and ids.max() < 1000 and len(np.unique(ids)) > 100
    mask = triton_infer.generate_input("attention_mask", "INT64", [4, 64], "random", rng)
    assert (mask == 1).all()
    assert (triton_infer.generate_input("Input_Mask", "INT32", [3], "random", rng) == 1).all()


def test_random_small_int_types_stay_in_range():
    array = triton_infer.generate_input("x", "INT8", [10_000], "random", np.random.default_rng(0))
    assert array.min() >= 0 and array.max() <= 127


def test_zeros_source_gives_zeros_even_for_masks():
    mask = triton_infer.generate_input("attention_mask", "INT64", [2, 4], "zeros", np.random.default_rng(0))
    assert (mask == 0).all()


@pytest.mark.parametrize("datatype", ["BYTES", "NOT_A_TYPE"])
def test_inputs_that_cannot_be_generated_are_input_errors(datatype):
    with pytest.raises(InputError):
        triton_infer.generate_input("text", datatype, [1], "random", np.random.default_rng(0))


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
        return triton_infer.build_inputs(BERT_METADATA, 8, "random", {}, 2, 7, seed)

    inputs = build(0)
    assert list(inputs) == ["input_ids", "attention_mask"]
    assert inputs["input_ids"].shape == (2, 7) and inputs["attention_mask"].shape == (2, 7)
    np.testing.assert_array_equal(inputs["input_ids"], build(0)["input_ids"])
    assert not np.array_equal(inputs["input_ids"], build(1)["input_ids"])


def test_build_inputs_named_source_overrides_the_default():
    inputs = triton_infer.build_inputs(BERT_METADATA, 8, "random", {"input_ids": "zeros"}, 1, 4, 0)
    assert (inputs["input_ids"] == 0).all() and (inputs["attention_mask"] == 1).all()


def test_build_inputs_rejects_unknown_input_names():
    with pytest.raises(InputError, match="input_ids, attention_mask"):
        triton_infer.build_inputs(BERT_METADATA, 8, "random", {"token_ids": "zeros"}, 1, 4, 0)


def test_build_inputs_rejects_a_batch_size_for_a_model_that_does_not_batch():
    metadata = normalize_metadata(
        {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, -1]}], "outputs": []}
    )
    assert triton_infer.build_inputs(metadata, 0, "zeros", {}, 1, 5, 0)["x"].shape == (2, 5)
    with pytest.raises(InputError, match="does not batch"):
        triton_infer.build_inputs(metadata, 0, "zeros", {}, 2, 5, 0)


# --- triton_infer: .npy files -----------------------------------------------------------------


def test_npy_without_batch_dim_gets_one_repeated_to_the_batch_size(tmp_path):
    path = tmp_path / "image.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    one = triton_infer.load_npy(str(path), "x", "FP32", [-1, 3, 4], 8, batch_size=1)
    assert one.shape == (1, 3, 4)
    three = triton_infer.load_npy(str(path), "x", "FP32", [-1, 3, 4], 8, batch_size=3)
    assert three.shape == (3, 3, 4)
    np.testing.assert_array_equal(three[2], np.arange(12).reshape(3, 4))


def test_npy_with_batch_dim_is_used_as_is(tmp_path):
    path = tmp_path / "batch.npy"
    data = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(path, data)
    # The file's own batch wins over --batch-size.
    loaded = triton_infer.load_npy(str(path), "x", "FP32", [-1, 4], 8, batch_size=2)
    np.testing.assert_array_equal(loaded, data)


def test_npy_for_a_non_batching_model_must_match_the_rank(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((2, 9), dtype=np.float32))
    assert triton_infer.load_npy(str(path), "x", "FP32", [2, -1], 0, 1).shape == (2, 9)
    with pytest.raises(InputError, match="shape"):
        triton_infer.load_npy(str(path), "x", "FP32", [-1], 0, 1)


def test_npy_is_cast_within_its_kind_only(tmp_path):
    floats = tmp_path / "floats.npy"
    np.save(floats, np.array([0.5, 1.5, 2.5, 3.5]))  # numpy's default float64
    cast = triton_infer.load_npy(str(floats), "x", "FP32", [-1, 4], 8, 1)
    assert cast.dtype == np.float32 and cast.shape == (1, 4)
    with pytest.raises(InputError, match="float64"):
        triton_infer.load_npy(str(floats), "ids", "INT64", [-1, 4], 8, 1)


def test_npy_strings_become_bytes_objects(tmp_path):
    path = tmp_path / "text.npy"
    np.save(path, np.array(["hello", "world"]))
    loaded = triton_infer.load_npy(str(path), "text", "BYTES", [-1, 2], 8, 1)
    assert loaded.dtype == object and loaded.shape == (1, 2) and loaded[0, 0] == "hello"


def test_npy_rank_mismatch_and_missing_file_are_input_errors(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1, 2, 3, 4), dtype=np.float32))
    with pytest.raises(InputError, match=r"\[1, 2, 3, 4\]"):
        triton_infer.load_npy(str(path), "x", "FP32", [-1, 4], 8, 1)
    with pytest.raises(InputError, match="cannot load"):
        triton_infer.load_npy(str(tmp_path / "missing.npy"), "x", "FP32", [-1, 4], 8, 1)


def test_build_inputs_mixes_files_and_generated_inputs(tmp_path):
    path = tmp_path / "ids.npy"
    np.save(path, np.array([101, 2023, 102]))
    inputs = triton_infer.build_inputs(BERT_METADATA, 8, "random", {"input_ids": str(path)}, 1, 3, 0)
    np.testing.assert_array_equal(inputs["input_ids"], [[101, 2023, 102]])
    assert inputs["attention_mask"].shape == (1, 3)


# --- triton_infer: outputs and latency --------------------------------------------------------


def test_top_k_per_row_highest_first_ties_by_lower_index():
    scores = np.array([[0.1, 0.9, 0.5, 0.9], [3.0, 2.0, 1.0, 0.0]], dtype=np.float32)
    assert triton_infer.top_k(scores, 2) == [[(1, 0.9), (3, 0.9)], [(0, 3.0), (1, 2.0)]]
    assert len(triton_infer.top_k(scores, 10)[0]) == 4  # k is capped at the row width


def test_describe_output_shows_top_k_for_classifier_like_outputs():
    logits = np.zeros((2, 1000), dtype=np.float32)
    logits[0, 7], logits[1, 42] = 5.0, 3.0
    described = triton_infer.describe_output("logits", "FP32", logits, 3)
    assert described["shape"] == [2, 1000]
    assert [row[0] for row in described["top_k"]] == [{"index": 7, "score": 5.0}, {"index": 42, "score": 3.0}]
    assert all(len(row) == 3 for row in described["top_k"])
    json.dumps(described)  # plain Python types only


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP32", np.arange(18, dtype=np.float32).reshape(2, 9)),  # fewer than 10 classes
        ("FP32", np.zeros((1, 4, 10), dtype=np.float32)),  # not 2-D
        ("FP16", np.zeros((1, 10), dtype=np.float16)),  # not FP32
        ("INT64", np.arange(20, dtype=np.int64).reshape(1, 20)),
    ],
)
def test_describe_output_shows_first_values_otherwise(datatype, array):
    described = triton_infer.describe_output("y", datatype, array, 5)
    assert "top_k" not in described
    assert described["first_values"] == array.reshape(-1)[: triton_infer.FIRST_VALUES].tolist()
    json.dumps(described)


def test_float32_values_are_reported_at_float32_precision():
    described = triton_infer.describe_output("y", "FP32", np.array([[0.101, 2.003]], dtype=np.float32), 5)
    assert described["first_values"] == [0.101, 2.003]
    assert json.dumps(described["first_values"]) == "[0.101, 2.003]"


def test_describe_output_decodes_bytes_values():
    described = triton_infer.describe_output("text", "BYTES", np.array([b"hello", b"w\xffrld"], dtype=object), 5)
    assert described["first_values"] == ["hello", "w\ufffdrld"]


def test_latency_stats_percentiles_are_linearly_interpolated():
    stats = triton_infer.latency_stats([float(v) for v in range(1, 11)])
    assert stats["per_request"] == [float(v) for v in range(1, 11)]
    assert stats["p50"] == pytest.approx(5.5)
    assert stats["p90"] == pytest.approx(9.1)
    assert stats["p99"] == pytest.approx(9.91)
    assert stats["mean"] == pytest.approx(5.5)


def test_latency_stats_are_rounded_to_the_microsecond():
    assert triton_infer.latency_stats([1.23456789])["per_request"] == [1.235]


def test_latency_stats_of_one_request():
    stats = triton_infer.latency_stats([3.25])
    assert stats["p50"] == stats["p99"] == stats["mean"] == 3.25


# --- exit codes, with a fake client -----------------------------------------------------------


class FakeClient:
    """Stands in for TritonClient: a live server with one batching model `demo`."""

    error: Exception | None = None  # raised by every server call when set

    def __init__(self, url, protocol, timeout_s=None):
        self.url, self.protocol = url, protocol

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def _maybe_fail(self):
        if FakeClient.error is not None:
            raise FakeClient.error

    def server_live(self):
        self._maybe_fail()
        return True

    def server_ready(self):
        return True

    def server_metadata(self):
        return {"name": "triton", "version": "2.51.0", "extensions": ["binary_tensor_data"]}

    def repository_index(self):
        return [{"name": "demo", "version": "1", "state": "READY"}]

    def model_ready(self, name):
        return name == "demo"

    def model_metadata(self, name):
        if name != "demo":
            raise InferenceServerException(f"Request for unknown model: '{name}'", "StatusCode.NOT_FOUND")
        return normalize_metadata(
            {
                "name": "demo",
                "versions": ["1"],
                "platform": "python",
                "inputs": [{"name": "input", "datatype": "FP32", "shape": ["-1", "4"]}],
                "outputs": [{"name": "output", "datatype": "FP32", "shape": ["-1", "10"]}],
            }
        )

    def model_config(self, name):
        return {
            "max_batch_size": 8,
            "dynamic_batching": {"max_queue_delay_microseconds": "100"},
            "instance_group": [{"name": "demo_0", "count": 2, "kind": "KIND_CPU"}],
        }

    def infer(self, model, inputs, datatypes, output_names):
        assert datatypes == {"input": "FP32"}
        batch = inputs["input"].shape[0]
        return {"output": np.tile(np.arange(10, dtype=np.float32), (batch, 1))}, "1"


@pytest.fixture
def fake_client(monkeypatch):
    FakeClient.error = None
    monkeypatch.setattr(triton_infer, "TritonClient", FakeClient)
    monkeypatch.setattr(triton_health, "TritonClient", FakeClient)
    yield FakeClient
    FakeClient.error = None


def test_infer_main_prints_top_k_and_latency_stats(fake_client, capsys):
    assert triton_infer.main(["--model", "demo", "--batch-size", "2", "--requests", "3", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "input: FP32 [2, 4] <- random (seed 0)" in out
    assert "row 1 top-2: 9: 9.0000  8: 8.0000" in out
    assert "latency over 3 requests: p50" in out


def test_infer_main_json(fake_client, capsys):
    assert triton_infer.main(["--model", "demo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_version"] == "1"
    assert report["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 4], "source": "random"}]
    assert report["outputs"][0]["top_k"][0][0] == {"index": 9, "score": 9.0}
    assert len(report["latency_ms"]["per_request"]) == 1


def test_infer_main_server_error_is_one_line_and_exit_1(fake_client, capsys):
    assert triton_infer.main(["--model", "nope"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "error: NOT_FOUND: Request for unknown model: 'nope'\n"
    assert captured.out == ""


def test_infer_main_input_error_exit_1(fake_client, capsys):
    assert triton_infer.main(["--model", "demo", "--input-name", "pixels=zeros"]) == 1
    assert capsys.readouterr().err.startswith("error: model 'demo' has no input pixels")


def test_infer_main_unreachable_exit_2(fake_client, capsys):
    fake_client.error = ServerUnreachable("127.0.0.1:1", "grpc", "connection refused")
    assert triton_infer.main(["--model", "demo", "--url", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == "error: cannot reach Triton at 127.0.0.1:1 (grpc): connection refused\n"


# --- triton_health ----------------------------------------------------------------------------


def test_health_models_option_takes_several_values_and_repeats():
    args = triton_health.parse_args(["--model", "a", "b", "--model", "c", "--json"])
    assert args.models == ["a", "b", "c"] and args.json


def test_summarize_config_reads_grpc_and_http_configs_alike():
    # gRPC's JSON leaves defaults out and writes 64-bit numbers as strings; HTTP's has everything.
    grpc_config = {
        "max_batch_size": 8,
        "dynamic_batching": {
            "preferred_batch_size": [4, 8],
            "max_queue_delay_microseconds": "200",
            "default_queue_policy": {"default_timeout_microseconds": "2000000", "max_queue_size": 32},
        },
        "instance_group": [{"name": "m_0", "count": 2, "kind": "KIND_CPU"}],
    }
    http_config = {
        "max_batch_size": 8,
        "dynamic_batching": {
            "preferred_batch_size": [4, 8],
            "max_queue_delay_microseconds": 200,
            "preserve_ordering": False,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": 2000000,
                "allow_timeout_override": False,
                "max_queue_size": 32,
            },
        },
        "instance_group": [{"name": "m_0", "kind": "KIND_CPU", "count": 2, "gpus": []}],
    }
    expected = {
        "max_batch_size": 8,
        "dynamic_batching": {
            "preferred_batch_size": [4, 8],
            "max_queue_delay_microseconds": 200,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": 2000000,
                "allow_timeout_override": False,
                "max_queue_size": 32,
            },
        },
        "instance_groups": [{"name": "m_0", "kind": "KIND_CPU", "count": 2}],
    }
    assert triton_health.summarize_config(grpc_config) == expected
    assert triton_health.summarize_config(http_config) == expected


def test_summarize_config_without_batching():
    # gRPC omits max_batch_size 0 altogether.
    assert triton_health.summarize_config({"instance_group": []}) == {
        "max_batch_size": 0,
        "dynamic_batching": None,
        "instance_groups": [],
    }


def test_health_main_all_ready_exit_0(fake_client, capsys):
    assert triton_health.main([]) == 0
    out = capsys.readouterr().out
    assert "live yes, ready yes" in out
    assert "dynamic_batching: preferred_batch_size [], max_queue_delay_microseconds 100" in out
    assert "instance_groups: demo_0 2 x KIND_CPU" in out
    assert "input: FP32 [-1, 4]" in out
    assert out.rstrip().endswith("OK: server ready, 1 model(s) ready")


def test_health_main_missing_model_exit_1(fake_client, capsys):
    assert triton_health.main(["--model", "demo", "nope", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert [m["ready"] for m in report["models"]] == [True, False]
    assert report["models"][1]["error"] == "NOT_FOUND: Request for unknown model: 'nope'"


def test_health_main_unreachable_exit_2(fake_client, capsys):
    fake_client.error = ServerUnreachable("127.0.0.1:1", "http", "[Errno 111] Connection refused")
    assert triton_health.main(["--protocol", "http", "--url", "127.0.0.1:1"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: cannot reach Triton at 127.0.0.1:1 (http): [Errno 111] Connection refused\n"
    assert captured.out == ""
