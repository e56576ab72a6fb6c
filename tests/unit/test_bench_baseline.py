"""The FastAPI baseline server (bench/baseline) started as a subprocess on a tiny ONNX model."""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.baseline.process import FastApiBaseline

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    """output = flatten(input) @ W: input FP32 [batch, 3, 4, 4], output [batch, 10]."""
    weights = np.random.default_rng(0).standard_normal((48, 10)).astype(np.float32)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 4, 4])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "weights"], ["output"]),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [numpy_helper.from_array(weights, "weights")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = tmp_path_factory.mktemp("tiny") / "model.onnx"
    onnx.save(model, path)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"workers={n}")
def server(request, tiny_onnx) -> FastApiBaseline:
    with FastApiBaseline(tiny_onnx, port=free_port(), workers=request.param, intra_op_threads=1) as baseline:
        yield baseline


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """POST without raising on 4xx: (status, headers, body)."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_health(server):
    with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
        assert response.status == 200 and response.read() == b'{"status":"ok"}'
    assert server.startup_seconds is not None and server.startup_seconds > 0


def test_predict_matches_onnxruntime(server, tiny_onnx):
    x = np.random.default_rng(1).standard_normal((3, 3, 4, 4)).astype(np.float32)
    status, headers, body = post(f"{server.url}/predict", x.tobytes(), {"x-shape": "3,3,4,4"})
    assert status == 200
    assert headers["x-shape"] == "3,10"
    (expected,) = ort.InferenceSession(str(tiny_onnx), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    np.testing.assert_allclose(np.frombuffer(body, dtype="<f4").reshape(3, 10), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-shape": "1,3,four,4"}, {"x-shape": "1,3,4"}, {"x-shape": "1,3,4,5"}, {"x-shape": "0,3,4,4"}],
    ids=["missing", "not-ints", "wrong-rank", "wrong-fixed-dim", "zero-batch"],
)
def test_bad_shape_is_400(server, headers):
    status, _, body = post(f"{server.url}/predict", np.zeros(48, np.float32).tobytes(), headers)
    assert status == 400 and b"x-shape" in body


def test_wrong_byte_count_is_400(server):
    status, _, body = post(f"{server.url}/predict", np.zeros(47, np.float32).tobytes(), {"x-shape": "1,3,4,4"})
    assert status == 400 and b"188 bytes" in body


def group_alive(pgid: int) -> list[psutil.Process]:
    """Non-zombie processes in group `pgid`, found independently of bench.baseline.process
    (an orphan re-parented to a PID 1 that does not reap stays a zombie, which is not alive)."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def test_stop_ends_the_whole_group(tiny_onnx):
    baseline = FastApiBaseline(tiny_onnx, port=free_port(), workers=2, intra_op_threads=1)
    with baseline:
        pgid = baseline.pid
        assert pgid is not None and os.getpgid(pgid) == pgid  # its own session, apart from pytest's group
        workers = psutil.Process(pgid).children(recursive=True)
        assert len(workers) >= 2
        log_file = baseline.log_file
    assert group_alive(pgid) == []
    assert not any(worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE for worker in workers)
    assert baseline.pid is None and not log_file.exists()  # the temporary log is removed


def test_startup_failure_raises_with_the_log(tmp_path):
    baseline = FastApiBaseline(tmp_path / "missing.onnx", port=free_port(), workers=1, intra_op_threads=1)
    with pytest.raises(RuntimeError, match="missing.onnx"):
        with baseline:
            pass
    assert baseline.pid is None
