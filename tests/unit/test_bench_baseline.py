"""The FastAPI baseline server (bench/baseline) started as a subprocess on a tiny ONNX model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.baseline.server import FastApiBaseline
from tritonnx.server.process import ServerError

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


def baseline(onnx_file: Path, log_dir: Path, workers: int) -> FastApiBaseline:
    return FastApiBaseline(
        onnx_file=onnx_file, port=free_port(), workers=workers, intra_op_threads=1, log_file=log_dir / "baseline.log"
    )


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"workers={n}")
def server(request, tiny_onnx, tmp_path_factory) -> FastApiBaseline:
    with baseline(tiny_onnx, tmp_path_factory.mktemp("baseline"), request.param) as running:
        yield running


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
    assert server.startup_seconds > 0


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
    """Non-zombie processes in group `pgid`, found independently of tritonnx.server.process
    (an orphan re-parented to a PID 1 that does not reap stays a zombie, which is not alive)."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def test_stop_returns_once_the_whole_group_is_gone(tiny_onnx, tmp_path):
    with baseline(tiny_onnx, tmp_path, 2) as server:
        pgid = server.pid
        assert os.getpgid(pgid) == pgid  # its own session, apart from pytest's group
        workers = psutil.Process(pgid).children(recursive=True)
        assert len(workers) >= 2
    assert group_alive(pgid) == []  # no wait here: stop() returned only once every member had exited
    assert not any(worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE for worker in workers)
    assert server.process is not None and server.process.returncode is not None


def test_a_restart_on_the_same_log_waits_for_its_own_workers(tiny_onnx, tmp_path):
    """The log is appended to: a second start is ready once its own workers have all logged their start-up."""
    with baseline(tiny_onnx, tmp_path, 2):
        pass
    first_run = (tmp_path / "baseline.log").read_text()
    with baseline(tiny_onnx, tmp_path, 2):
        second_run = (tmp_path / "baseline.log").read_text()[len(first_run) :]
        assert second_run.count("Application startup complete.") == 2


def test_startup_failure_raises_with_the_log(tmp_path):
    server = baseline(tmp_path / "missing.onnx", tmp_path, 1)
    with pytest.raises(ServerError, match="missing.onnx"):
        with server:
            pass
    assert server.process is not None and server.process.returncode is not None
    assert group_alive(server.pid) == []


def test_gunicorn_runs_uvicorn_workers_each_on_its_own_reuse_port_socket():
    from bench.baseline.app import gunicorn_command, parse_args

    command = gunicorn_command(parse_args(["--model", "m.onnx", "--port", "8123", "--workers", "3"]))
    assert command[1:4] == ["-m", "gunicorn", "bench.baseline.app:app"]
    assert "--reuse-port" in command
    assert command[command.index("--worker-class") + 1] == "uvicorn_worker.UvicornWorker"
    assert command[command.index("--workers") + 1] == "3"
    assert command[command.index("--bind") + 1] == "127.0.0.1:8123"


def connections_per_worker(server: FastApiBaseline) -> list[int]:
    counts = []
    for pid in server.worker_pids():
        connections = psutil.Process(pid).net_connections("tcp")
        counts.append(
            sum(1 for c in connections if c.laddr and c.laddr.port == server.port and c.status == "ESTABLISHED")
        )
    return counts


def test_a_burst_of_connections_spreads_over_the_workers(tiny_onnx, tmp_path):
    """16 connections opened at once, as the load generator's pool opens them.

    With uvicorn's --workers (one shared socket) such a burst landed 16/0 three times out of three here; with one
    SO_REUSEPORT socket per worker the kernel hashes each connection to a worker (all 16 on one: p = 2^-15).
    """
    with baseline(tiny_onnx, tmp_path, 2) as server:
        assert len(server.worker_pids()) == 2
        sockets = []
        try:
            for _ in range(16):
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", server.port))
                sockets.append(sock)
            deadline = time.monotonic() + 10
            while sum(counts := connections_per_worker(server)) < 16 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sum(counts) == 16 and min(counts) > 0, counts
        finally:
            for sock in sockets:
                sock.close()


def test_the_documented_layouts():
    from bench.baseline.workers import setups

    assert [(s.workers, s.threads) for s in setups(2)] == [(1, 2), (2, 1)]
    assert [(s.workers, s.threads) for s in setups(4)] == [(1, 4), (4, 1)]
    assert [(s.workers, s.threads) for s in setups(1)] == [(1, 1)]
    assert all(s.why for s in setups(2)) and setups(2)[1].name == "2 worker(s) x 1 thread(s)"


def test_the_split_check():
    from bench.baseline.workers import cpu_split, shares, spread

    split = cpu_split({10: 1.0, 11: 2.0, 12: 5.0}, {10: 3.0, 11: 2.5, 13: 9.0})  # 12 gone, 13 new: left out
    assert split == {10: 2.0, 11: 0.5}
    assert shares(split) == [0.8, 0.2]
    assert spread(split, concurrency=16) is False  # 0.5 < half of an even 1.25
    assert spread({10: 1.3, 11: 1.2}, concurrency=16) is True
    assert spread({10: 0.7, 11: 0.3}, concurrency=16) is True  # 0.3 >= 0.25, at the bound's side
    assert spread({10: 1.0, 11: 0.0}, concurrency=1) is None  # a lone connection runs on one worker by design
    assert spread({10: 1.0}, concurrency=16) is None
    assert spread({10: 0.0, 11: 0.0}, concurrency=16) is False
    assert shares({10: 0.0, 11: 0.0}) == [0.0, 0.0]


def test_an_unspread_run_is_run_once_more_and_reported():
    """Two real processes, one spinning and one asleep: the run is unspread both times."""
    from bench.baseline.workers import measured_split
    from bench.usage import cpu_seconds

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    # Asleep once it has said so: its start-up CPU falls before any run.
    idle = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE)  # fmt: skip
    assert idle.stdout is not None and idle.stdout.readline() == b"\n"
    runs = []

    def run() -> int:
        """Until the busy worker has spent 0.3 s of CPU more, however long a busy machine takes to give it that."""
        start, deadline = cpu_seconds(psutil.Process(busy.pid)), time.monotonic() + 60
        while cpu_seconds(psutil.Process(busy.pid)) < start + 0.3:
            assert time.monotonic() < deadline, "the busy process got no CPU for a minute"
            time.sleep(0.02)
        runs.append(1)
        return len(runs)

    try:
        result, split = measured_split(run, lambda: [busy.pid, idle.pid], 16)
        assert result == 2 and split["runs"] == 2 and split["spread"] is False
        assert max(split["shares"]) > 0.9 and len(split["cpu_seconds"]) == 2
        result, split = measured_split(run, lambda: [busy.pid, idle.pid], 1)
        assert result == 3 and split["runs"] == 1 and split["spread"] is None
    finally:
        for process in (busy, idle):
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def two_int_inputs_onnx(tmp_path_factory) -> Path:
    """output = sum over the sequence of float(ids * mask): INT64 input_ids, attention_mask [batch, seq] -> [batch, 1]."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1])
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
        helper.make_node("Cast", ["kept"], ["floats"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["floats", "axes"], ["output"], keepdims=1),
    ]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph(nodes, "two_ints", [ids, mask], [out], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path_factory.mktemp("two_ints") / "model.onnx"
    onnx.save(model, path)
    return path


def test_named_inputs_of_any_type_travel_in_x_inputs(two_int_inputs_onnx, tmp_path):
    """The text models' way into the baseline: both INT64 inputs named, sequences of any length."""
    from bench.load.http import named_raw

    with baseline(two_int_inputs_onnx, tmp_path, workers=1) as running:
        for length in (3, 8):
            ids = np.arange(1, length + 1, dtype=np.int64).reshape(1, length)
            mask = np.ones((1, length), np.int64)
            mask[0, -1] = 0  # padding: its id drops out
            body, headers = named_raw({"input_ids": ids, "attention_mask": mask})
            status, answer_headers, answer = post(f"{running.url}/predict", body, headers)
            assert status == 200 and answer_headers["x-shape"] == "1,1"
            assert np.frombuffer(answer, "<f4").tolist() == [float(ids[0, :-1].sum())]
        # Every input and byte accounted for, or 400; an integer model cannot be called the float32 way.
        status, _, answer = post(f"{running.url}/predict", body[:-8], headers)
        assert status == 400 and b"x-inputs" in answer
        only_ids = {"x-inputs": headers["x-inputs"].split(";")[0]}
        assert post(f"{running.url}/predict", body[: len(body) // 2], only_ids)[0] == 400
        status, _, answer = post(f"{running.url}/predict", body, {"x-shape": "1,8"})
        assert status == 400 and b"x-inputs" in answer
