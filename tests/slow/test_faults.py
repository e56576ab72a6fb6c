"""Faults, healed without a person: a stub killed with -9, tritonserver killed or terminated, a
model that hangs, a stub that hangs or is stopped (the watchdog). These break the server on
purpose, so they run against a tritonserver of their own (mobilenet_v3_small and the sleeping
test model, twice: once with a queue timeout, once as `stalling` with none and a 2 s watchdog),
supervised as `make serve` supervises it, with a facade in front."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers import process_gone, time_of, wait_until
from tests.kserve import assert_close, reference_session
from tests.serving import FACADE_TEST_ARGS, MODEL_REPOSITORY, demo_config, onnx_file, start_facade
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.server.prometheus import scrape
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack
from tritonnx.server.supervisor import Stub, TritonSupervisor, live_stubs
from tritonnx.server.triton import TritonServer
from tritonnx.server.watchdog import WATCHDOG_PARAMETER

MODEL = "mobilenet_v3_small"
IMAGE_SHAPE = [1, 3, 224, 224]
TEST_MODELS = Path(__file__).parents[1] / "models"
# The sleeping model without its queue timeout (requests wait behind a hung instance for as long as it hangs), and a
# watchdog of 2 s: the supervisor kills its stubs once requests waited that long without an execution finishing.
STALLING = "stalling"
WATCHDOG_SECONDS = 2
STALLING_CONFIG = (
    "\n".join(
        line for line in (TEST_MODELS / "slow" / "config.pbtxt").read_text().splitlines() if "queue_policy" not in line
    )
    + f'\nparameters {{ key: "{WATCHDOG_PARAMETER}" value: {{ string_value: "{WATCHDOG_SECONDS}" }} }}\n'
)
# The same with two instances: one can hang while the other serves.
STALLING_PAIR = "stalling_pair"
STALLING_PAIR_CONFIG = STALLING_CONFIG.replace("count: 1", "count: 2")
# The demo model with two instances, whatever its tuned count: a killed stub's sibling serves on.
MODEL_CONFIG = demo_config(MODEL, 2)


@dataclass
class Stack:
    triton: TritonServer
    supervisor: TritonSupervisor
    facade: object
    stub: inference_pb2_grpc.InferenceServiceStub


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("faults")
    repository = link_models(
        workdir / "repository",
        {
            "slow": TEST_MODELS / "slow",
            STALLING: TEST_MODELS / "slow",
            STALLING_PAIR: TEST_MODELS / "slow",
            MODEL: MODEL_REPOSITORY / MODEL,
        },
        {STALLING: STALLING_CONFIG, STALLING_PAIR: STALLING_PAIR_CONFIG, MODEL: MODEL_CONFIG},
    )
    serving = ServingStack(
        repository,
        workdir,
        supervised=True,
        supervisor_interval=0.1,
        facade_args=[*FACADE_TEST_ARGS, "--default-model", MODEL, "--health-interval", "0.5", "--health-timeout", "2"],
    )
    with serving, grpc.insecure_channel(serving.facade.grpc_url) as channel:
        yield Stack(
            serving.triton, serving.supervisor, serving.facade, inference_pb2_grpc.InferenceServiceStub(channel)
        )


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(IMAGE_SHAPE, dtype=np.float32)


def predict(stack: Stack, data: np.ndarray, timeout: float = 10.0, model: str = MODEL):
    """The facade's answer: a PredictResponse or the grpc.RpcError, and when it came."""
    try:
        answer = stack.stub.Predict(
            inference_pb2.PredictRequest(raw_data=data.tobytes(), shape=list(data.shape), model_name=model),
            timeout=timeout,
        )
    except grpc.RpcError as error:
        answer = error
    return answer, time.monotonic()


def expected_scores(data: np.ndarray) -> np.ndarray:
    return reference_session(onnx_file(MODEL)).run(["output"], {"input": data})[0][0]


def model_stubs(triton: TritonServer, model: str) -> list[Stub]:
    """The model's live stub processes (the supervisor's own reading of tritonserver's children)."""
    return [stub for stub in live_stubs(triton.process.pid).values() if stub.model == model]


def facade_health(stack: Stack) -> int:
    return stack.facade.health()[0]


def triton_ready(triton: TritonServer) -> bool:
    try:
        with urllib.request.urlopen(f"http://{triton.http_url}/v2/health/ready", timeout=0.5) as response:
            return response.status == 200
    except OSError:
        return False


class Load:
    """Clients calling the facade or Triton directly (`path`), in threads, for a bounded time:
    every answer is recorded with its time and checked against the expected output of its own
    input."""

    def __init__(self, stack: Stack, seconds: float, path: str, workers: int = 4) -> None:
        self.stack, self.seconds, self.path, self.workers = stack, seconds, path, workers
        self.inputs = [image(seed) for seed in range(4)]
        self.expected = [expected_scores(x) for x in self.inputs]
        self.outcomes: list[tuple[float, str, str, str]] = []  # (time, path, status, message)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers)
        self._futures = []

    def _record(self, path: str, status: str, message: str = "") -> None:
        with self._lock:
            self.outcomes.append((time.monotonic(), path, status, message))

    def _facade_worker(self, index: int) -> None:
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            which = index % len(self.inputs)
            answer, _ = predict(self.stack, self.inputs[which], timeout=5)
            if isinstance(answer, grpc.RpcError):
                self._record("facade", answer.code().name, answer.details())
            else:
                assert_close(np.array(answer.predictions, np.float32), self.expected[which])
                self._record("facade", "OK")

    def _direct_worker(self, index: int) -> None:
        end = time.monotonic() + self.seconds
        with grpcclient.InferenceServerClient(self.stack.triton.grpc_url) as client:
            while time.monotonic() < end:
                which = index % len(self.inputs)
                tensor = grpcclient.InferInput("input", IMAGE_SHAPE, "FP32")
                tensor.set_data_from_numpy(self.inputs[which])
                try:
                    result = client.infer(MODEL, [tensor], client_timeout=5)
                    assert_close(result.as_numpy("output")[0], self.expected[which])
                    self._record("direct", "OK")
                except InferenceServerException as error:
                    self._record("direct", str(error.status()), error.message())

    def __enter__(self) -> Load:
        worker = self._facade_worker if self.path == "facade" else self._direct_worker
        for index in range(self.workers):
            self._futures.append(self._pool.submit(worker, index))
        return self

    def __exit__(self, *exc_info) -> None:
        for future in self._futures:
            future.result(timeout=self.seconds + 30)  # re-raises a wrong output
        self._pool.shutdown()


# The Python backend finds a dead stub about a second after it handed it a batch, so the dead
# instance fails one batch a second until the reload replaces it.
DEAD_INSTANCE_BATCH_SECONDS = 1.0
HOLD = np.array([[-1]], np.float32)  # the slow model holds such a request until released (tests/models/slow)


@pytest.mark.parametrize("path", ["facade", "direct"])
def test_a_killed_stub_is_noticed_and_its_model_reloaded_without_a_person(stack, path):
    """Under load through one path at a time: the facade can only learn of a dead stub from the
    requests it sends (its clients' and its own probes), so its health is checked when all the
    load goes through it; a client of Triton directly sees the same bounded failures."""
    before = len(stack.supervisor.reloads)
    [victim, *others] = model_stubs(stack.triton, MODEL)
    assert others, "the model serves from several instances"
    with Load(stack, seconds=14, path=path) as load:
        wait_until(lambda: len(load.outcomes) >= 8, 30, "the load under way")
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        if path == "facade":
            unhealthy_at = time_of(lambda: facade_health(stack) == 503, 5, "the facade unhealthy")
            print(f"unhealthy after {unhealthy_at - killed_at:.2f}s")
        wait_until(lambda: len(stack.supervisor.reloads) > before, 15, "the supervisor's reload")
        reloaded_at = stack.supervisor.reloads[-1][0]
        healthy_at = time_of(lambda: facade_health(stack) == 200, 15, "the facade healthy again")
    print(f"reloaded after {reloaded_at - killed_at:.2f}s, facade healthy after {healthy_at - killed_at:.2f}s")
    assert stack.supervisor.reloads[-1][1] == MODEL
    failures = [o for o in load.outcomes if o[2] != "OK"]
    assert any(o[2] == "OK" for o in load.outcomes if o[0] > reloaded_at), "served after the reload"
    for when, _, status, message in failures:
        # Only the batches the scheduler gave the dead instance before the reload finished fail,
        # with INTERNAL and a message that names the model, not the server's internals.
        assert killed_at <= when <= reloaded_at + DEAD_INSTANCE_BATCH_SECONDS + 0.5, (status, message)
        assert status in ("INTERNAL", "StatusCode.INTERNAL"), (status, message)
        assert MODEL in message and "/" not in message.replace(f"'{MODEL}'", "")
    # The old instances stop once their last requests are answered; the new ones take over.
    wait_until(lambda: len(model_stubs(stack.triton, MODEL)) == len(others) + 1, 30, "the stubs back", 0.2)
    for seed in range(8):  # every instance serves again
        answer, _ = predict(stack, image(seed))
        assert_close(np.array(answer.predictions, np.float32), expected_scores(image(seed)))


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_tritonserver_killed_or_stopped_the_facade_fails_fast_and_serves_again(stack, signum, caplog, gate):
    data = image(5)
    restarts = len(stack.supervisor.restarts)
    os.kill(stack.triton.process.pid, signum)
    wait_until(lambda: facade_health(stack) == 503, 15, "the facade unhealthy")
    # While Triton is away, no caller waits past its deadline.
    answer, answered_at = predict(stack, data, timeout=0.5)
    if isinstance(answer, grpc.RpcError):
        assert answer.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), answer.details()
    back_at = time_of(lambda: triton_ready(stack.triton), 120, "tritonserver ready again", 0.02)

    def served_at() -> float | None:
        started = time.monotonic()
        answer, answered_at = predict(stack, data, timeout=1)
        assert answered_at - started < 10, "a call hung past its deadline"
        gate(answered_at - started < 1.5, f"a 1 s call ended after {answered_at - started:.2f}s")
        if not isinstance(answer, inference_pb2.PredictResponse):
            return None
        assert_close(np.array(answer.predictions, np.float32), expected_scores(data))
        return answered_at

    first_ok = wait_until(served_at, 5, "the facade serving again", 0.02)
    gate(first_ok - back_at <= 1.0, f"first answer {first_ok - back_at:.2f}s after Triton was ready again")
    # The supervisor polls readiness more slowly than this test does: its record can come after.
    wait_until(lambda: len(stack.supervisor.restarts) == restarts + 1, 5, "the restart counted")
    # A server stopping on SIGTERM unloads its models first; that is not a fault to heal.
    assert not [
        r.getMessage()
        for r in caplog.records
        if r.name == "tritonnx.supervisor" and r.levelno >= logging.ERROR and "healing attempt failed" in r.getMessage()
    ]
    wait_until(lambda: facade_health(stack) == 200, 10, "the facade healthy again")


@contextmanager
def held(stack: Stack) -> Iterator[Future]:
    """The slow model's one instance holding a request until the block ends; yields that request's answer."""
    folder = stack.triton.model_repository / "slow"
    (folder / "hold").touch()
    with ThreadPoolExecutor(1) as pool:
        try:
            answer = pool.submit(predict, stack, HOLD, 60, "slow")
            wait_until((folder / "holding").exists, 30, "the slow model holding a request")
            yield answer
        finally:
            (folder / "hold").unlink()


def slow_model_counts(stack: Stack) -> tuple[int, int]:
    """(inferences run, requests failed) of the sleeping model, from Triton's statistics."""
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        stats = client.get_inference_statistics("slow", headers=stack.triton.admin_headers).model_stats[0]
    return stats.inference_count, stats.inference_stats.fail.count


def test_deadlines_still_end_calls_to_a_model_that_hangs(stack, gate):
    with held(stack) as hanging:
        started = time.monotonic()
        answer, answered_at = predict(stack, np.array([[1]], np.float32), timeout=0.5, model="slow")
        assert isinstance(answer, grpc.RpcError) and answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        gate(answered_at - started < 1.0, f"a 0.5 s deadline ended the call after {answered_at - started:.2f}s")
    assert isinstance(hanging.result()[0], inference_pb2.PredictResponse)


def test_a_call_whose_deadline_passed_in_the_queue_never_runs_in_triton(stack):
    ran, failed = slow_model_counts(stack)
    with held(stack) as hanging:
        expired, _ = predict(stack, np.array([[1]], np.float32), timeout=0.3, model="slow")
        assert isinstance(expired, grpc.RpcError) and expired.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(hanging.result()[0], inference_pb2.PredictResponse)
    counted = wait_until(
        lambda: (counts := slow_model_counts(stack))[0] > ran and counts[1] > failed and counts, 10, "both counted"
    )
    assert counted[0] == ran + 1  # only the held request ran


def test_the_queue_timeout_rejects_requests_stuck_behind_a_hanging_model(stack):
    with held(stack) as hanging, ThreadPoolExecutor(2) as pool:
        # The model's queue policy rejects a request that waited 0.5 s, whatever its caller's deadline.
        queued = [pool.submit(predict, stack, np.array([[1]], np.float32), 10, "slow") for _ in range(2)]
        rejected = [f.result() for f in queued]
    for answer, _ in rejected:
        assert isinstance(answer, grpc.RpcError) and answer.code() == grpc.StatusCode.UNAVAILABLE, answer
        assert "queue" in answer.details()
    assert list(hanging.result()[0].predictions) == [float(HOLD[0, 0])]


def test_health_turns_unhealthy_while_the_default_model_hangs(stack, tmp_path):
    facade = start_facade(
        stack.triton, tmp_path, "--default-model", "slow", "--health-interval", "0.3", "--health-timeout", "0.3"
    )
    try:
        with held(stack):
            wait_until(lambda: facade.health()[0] == 503, 30, "the facade unhealthy")
            status, report = facade.health()
            assert "DEADLINE_EXCEEDED" in report["detail"] or "UNAVAILABLE" in report["detail"], report
        wait_until(lambda: facade.health()[0] == 200, 10, "the facade healthy again")
    finally:
        facade.stop()


def infer(stack: Stack, model: str, value: float) -> str:
    """Triton's answer to one request of the sleeping model, sent without a deadline: "OK" or "<status>: <message>"."""
    tensor = grpcclient.InferInput("milliseconds", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        try:
            client.infer(model, [tensor])
        except InferenceServerException as error:
            return f"{error.status()}: {error.message()}"
    return "OK"


def pending(stack: Stack, model: str) -> float:
    return scrape(stack.triton.metrics_url).value("nv_inference_pending_request_count", model=model)


def kills(stack: Stack, model: str) -> float:
    return (
        stack.supervisor.metrics.registry.get_sample_value("tritonnx_supervisor_watchdog_kills_total", {"model": model})
        or 0.0
    )


def serves_again(stack: Stack) -> bool:
    return infer(stack, STALLING, 1) == "OK"


def test_the_watchdog_kills_a_hung_stub_whose_requests_wait_and_the_model_serves_again(stack):
    """The stub hangs in `execute` (it holds a request and answers Triton's health checks): without the watchdog,
    the held request and the one queued behind it would wait forever."""
    folder = stack.triton.model_repository / STALLING
    before, reloads = kills(stack, STALLING), len(stack.supervisor.reloads)
    [hung] = model_stubs(stack.triton, STALLING)
    (folder / "hold").touch()
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(infer, stack, STALLING, HOLD[0, 0])
            wait_until((folder / "holding").exists, 30, "the stub holding a request")
            queued = pool.submit(infer, stack, STALLING, 1)
            wait_until(lambda: pending(stack, STALLING) == 1, 30, "a request waiting behind it")
            wait_until(lambda: kills(stack, STALLING) > before, 30, "the watchdog's kill")
            wait_until(lambda: process_gone(hung.pid), 10, "the hung stub gone after its kill")
            # Both requests end: the held one fails with its killed stub, the queued one is answered or fails.
            held_answer, queued_answer = held.result(timeout=60), queued.result(timeout=60)
    finally:
        (folder / "hold").unlink()
    assert held_answer.startswith("StatusCode.INTERNAL: "), held_answer
    assert queued_answer == "OK" or queued_answer.startswith("StatusCode.INTERNAL: "), queued_answer
    [(_, stall)] = [k for k in stack.supervisor.watchdog_kills if k[1].version[0] == STALLING][-1:]
    assert stall.pending == 1 and stall.limit == WATCHDOG_SECONDS
    wait_until(lambda: len(stack.supervisor.reloads) > reloads, 30, "the supervisor's reload")
    assert stack.supervisor.reloads[-1][1] == STALLING
    wait_until(lambda: serves_again(stack), 60, "the model serving again", 0.2)


def test_the_watchdog_kills_a_stopped_stub_and_the_model_serves_again(stack):
    """Triton 2.51 fails each request it hands a stopped stub after a second ("Stub process ... is not healthy"),
    so nothing hangs, but the model fails every request for as long as the stub stays stopped."""
    folder = stack.triton.model_repository / STALLING
    before = kills(stack, STALLING)
    wait_until(lambda: len(model_stubs(stack.triton, STALLING)) == 1, 30, "one stub")
    [stub] = model_stubs(stack.triton, STALLING)
    (folder / "hold").touch()
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(infer, stack, STALLING, HOLD[0, 0])
            wait_until((folder / "holding").exists, 30, "the stub holding a request")
            os.kill(stub.pid, signal.SIGSTOP)
            queued = pool.submit(infer, stack, STALLING, 1)
            answers = [held.result(timeout=60), queued.result(timeout=60)]
        wait_until(lambda: kills(stack, STALLING) > before, 30, "the watchdog's kill")
    finally:
        (folder / "hold").unlink()
        kill_if_stopped(stub)
    for answer in answers:
        assert answer.startswith("StatusCode.INTERNAL: ") and "is not healthy" in answer, answer
    wait_until(lambda: serves_again(stack), 60, "the model serving again", 0.2)


def test_the_watchdog_kills_one_hung_stub_of_two_while_the_other_serves_under_load(stack):
    """One instance holds its request forever while the other serves a load: executions go on, so the model as a
    whole never looks hung. The hung stub computes nothing while requests wait behind the busy one: it alone is
    killed, and the model is reloaded."""
    folder = stack.triton.model_repository / STALLING_PAIR
    before = kills(stack, STALLING_PAIR)
    wait_until(lambda: len(model_stubs(stack.triton, STALLING_PAIR)) == 2, 30, "two stubs")
    pids = {stub.pid for stub in model_stubs(stack.triton, STALLING_PAIR)}
    stop, answers = threading.Event(), []

    def load() -> None:  # requests that sleep 0 ms, back to back on one client, until the kill: a queue forms
        tensor = grpcclient.InferInput("milliseconds", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
            while not stop.is_set():
                try:
                    client.infer(STALLING_PAIR, [tensor], client_timeout=30)
                    answers.append("OK")
                except InferenceServerException as error:
                    answers.append(f"{error.status()}: {error.message()}")

    (folder / "hold").touch()
    try:
        with ThreadPoolExecutor(9) as pool:
            held = pool.submit(infer, stack, STALLING_PAIR, HOLD[0, 0])
            wait_until((folder / "holding").exists, 30, "a stub holding a request")
            loads = [pool.submit(load) for _ in range(8)]
            try:
                wait_until(lambda: kills(stack, STALLING_PAIR) > before, 60, "the watchdog's kill")
            finally:
                stop.set()
            for running in loads:
                running.result(timeout=60)
            held_answer = held.result(timeout=60)
    finally:
        stop.set()
        (folder / "hold").unlink(missing_ok=True)
    [(_, stall)] = [k for k in stack.supervisor.watchdog_kills if k[1].version[0] == STALLING_PAIR][-1:]
    assert len(stall.pids) == 1 and stall.pids[0] in pids and stall.pending > 0, stall
    assert "OK" in answers  # the other instance served while its sibling hung
    assert held_answer.startswith("StatusCode.INTERNAL: "), held_answer
    wait_until(lambda: infer(stack, STALLING_PAIR, 1) == "OK", 60, "the model serving again", 0.2)


def kill_if_stopped(stub: Stub) -> None:
    """Never SIGCONT a stopped stub: tritonserver 2.51 crashed when one resumed."""
    try:
        if psutil.Process(stub.pid).status() == psutil.STATUS_STOPPED:
            os.kill(stub.pid, signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass
