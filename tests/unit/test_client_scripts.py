"""The server-independent parts of the client scripts: argument parsing, output summaries, latency
statistics, and exit codes (with a fake client standing in for tritonclient); the inputs they build are
tests/unit/test_infer_inputs.py's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tritonnx.client import triton_common, triton_health, triton_infer
from tritonnx.client.model_control import ControlError, TritonUnreachable, normalize_metadata

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
        ("NOT_FOUND", "NOT_FOUND: no such model"),  # gRPC
        ("404", "404: no such model"),  # HTTP
        ("", "no such model"),  # raised by tritonclient itself
    ],
)
def test_an_error_is_described_with_its_status(status, expected):
    assert ControlError("no such model", status).described() == expected


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
    """Stands in for TritonControl: a live server with one batching model `demo`."""

    error: Exception | None = None  # raised by every server call when set

    def __init__(self, url, timeout_s=None, protocol="grpc"):
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

    def index(self):
        return [{"name": "demo", "version": "1", "state": "READY"}]

    def ready(self, name):
        return name == "demo"

    def metadata(self, name):
        if name != "demo":
            raise ControlError(f"Request for unknown model: '{name}'", "NOT_FOUND")
        return normalize_metadata(
            {
                "name": "demo",
                "versions": ["1"],
                "platform": "python",
                "inputs": [{"name": "input", "datatype": "FP32", "shape": ["-1", "4"]}],
                "outputs": [{"name": "output", "datatype": "FP32", "shape": ["-1", "10"]}],
            }
        )

    def config(self, name):
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
    monkeypatch.setattr(triton_infer, "TritonControl", FakeClient)
    monkeypatch.setattr(triton_health, "TritonControl", FakeClient)
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
    fake_client.error = TritonUnreachable("cannot reach Triton at 127.0.0.1:1 (grpc): connection refused")
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
    fake_client.error = TritonUnreachable("cannot reach Triton at 127.0.0.1:1 (http): [Errno 111] Connection refused")
    assert triton_health.main(["--protocol", "http", "--url", "127.0.0.1:1"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: cannot reach Triton at 127.0.0.1:1 (http): [Errno 111] Connection refused\n"
    assert captured.out == ""


def test_the_scripts_load_no_onnx_runtime_and_the_supervisor_no_http_client():
    """The one Triton client serves both: the scripts stay light, gevent stays out of the serving processes."""
    code = (
        "import json, sys\n"
        "import tritonnx.client.triton_health, tritonnx.client.triton_infer\n"
        "scripts = sorted(m for m in ('onnxruntime', 'onnx') if m in sys.modules)\n"
        "import tritonnx.server.supervisor, tritonnx.server.stack\n"
        "print(json.dumps([scripts, sorted(m for m in ('tritonclient.http', 'gevent') if m in sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == [[], []]
