"""Three tritonserver replicas behind one facade, under load: spread, a replica killed, a rolling restart.

The facade takes `--triton-url a,b,c` and sends each call to the next replica; a call whose replica
went away goes once to another. Every answer is checked against in-process ONNX Runtime.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers import metrics, time_of, wait_until
from tests.serving import MODEL_REPOSITORY, demo_config, onnx_file
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.common.admin import new_admin_key
from tritonnx.server.facade import start_facade
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

MODEL = "mobilenet_v3_small"
# One instance each: three replicas of the committed instances would be too many stubs for two cores.
CONFIG = demo_config(MODEL, 1)
IMAGES = [np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32) for seed in range(4)]
CLIENTS = 8


@dataclass
class Load:
    """A bounded closed loop of CLIENTS callers through the facade, in a thread of its own."""

    url: str
    expected: list[np.ndarray]
    statuses: Counter = field(default_factory=Counter)
    wrong: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    async def _caller(self, stub, index: int, deadline: float) -> None:
        while not self.stop.is_set() and time.monotonic() < deadline:
            which = index % len(IMAGES)
            index += CLIENTS
            request = inference_pb2.PredictRequest(
                raw_data=IMAGES[which].tobytes(), shape=[1, 3, 224, 224], model_name=MODEL
            )
            try:
                reply = await stub.Predict(request, timeout=10)
            except grpc.aio.AioRpcError as error:
                self.statuses[error.code().name] += 1
                continue
            self.statuses["OK"] += 1
            got = np.array(reply.predictions, np.float32)
            if not np.allclose(got, self.expected[which], rtol=1e-4, atol=1e-4):
                self.wrong += 1

    async def _run(self, seconds: float) -> None:
        async with grpc.aio.insecure_channel(self.url) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            deadline = time.monotonic() + seconds
            await asyncio.gather(*(self._caller(stub, i, deadline) for i in range(CLIENTS)))

    def start(self, seconds: float = 120) -> threading.Thread:
        thread = threading.Thread(target=asyncio.run, args=(self._run(seconds),), daemon=True)
        thread.start()
        return thread

    def finish(self, thread: threading.Thread) -> None:
        self.stop.set()
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("replicas")
    repository = link_models(workdir / "repository", {MODEL: MODEL_REPOSITORY / MODEL}, {MODEL: CONFIG})
    key = new_admin_key()
    stacks = [ServingStack(repository, workdir / f"replica-{i}", with_facade=False, admin_key=key) for i in range(3)]
    for stack in stacks:
        stack.triton.start()
    facade = None
    try:
        for stack in stacks:
            stack.triton.wait_ready(180)
        urls = ",".join(stack.triton.grpc_url for stack in stacks)
        facade = start_facade(
            urls,
            key,
            workdir / "facade.log",
            # Metadata asked of Triton with every call (none held), so that many of those calls meet a replica
            # stopping in the rolling restart: it has unloaded its models and answers NOT_FOUND.
            ["--default-model", MODEL, "--health-interval", "1", "--max-in-flight", "64", "--model-info-ttl", "0"],
        )
        yield stacks, facade
    finally:
        if facade is not None:
            facade.stop()
        with ThreadPoolExecutor(len(stacks)) as pool:  # each takes seconds to unload its models
            list(pool.map(ServingStack.stop, stacks))


@pytest.fixture(scope="module")
def expected():
    session = ort.InferenceSession(str(onnx_file(MODEL)), providers=["CPUExecutionProvider"])
    return [session.run(None, {"input": image})[0][0] for image in IMAGES]


def inferences(stack: ServingStack) -> int:
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        stats = client.get_inference_statistics(MODEL, headers=stack.triton.admin_headers)
    return sum(s.inference_count for s in stats.model_stats)


def test_traffic_spreads_over_the_three_replicas(replicas, expected):
    stacks, facade = replicas
    before = [inferences(s) for s in stacks]
    load = Load(facade.grpc_url, expected)
    thread = load.start()
    try:
        wait_until(lambda: load.statuses["OK"] >= 150, 60, "150 answers through the facade")
    finally:
        load.finish(thread)
    served = [inferences(s) - b for s, b in zip(stacks, before, strict=True)]
    assert load.statuses["OK"] > 60 and set(load.statuses) == {"OK"} and load.wrong == 0, (load.statuses, load.wrong)
    assert all(n > 0.2 * sum(served) for n in served), served  # round robin: about a third each


def restart(stack: ServingStack) -> float:
    """Start the replica again on its ports; seconds until it is ready."""
    started = time.monotonic()
    stack.triton.start()
    stack.triton.wait_ready(180)
    return time.monotonic() - started


def test_a_replica_killed_under_load_costs_no_request_and_gets_traffic_again(replicas, expected):
    stacks, facade = replicas
    victim = stacks[1]
    retries_before = metrics(facade.http_url).value("tritonnx_facade_triton_retries_total")
    load = Load(facade.grpc_url, expected)
    thread = load.start()
    try:
        wait_until(lambda: inferences(victim) >= 10, 30, "traffic on the victim")
        os.killpg(victim.triton.pid, signal.SIGKILL)  # tritonserver and its stubs, at once
        victim.triton.process.wait()
        answered = load.statuses["OK"]
        wait_until(lambda: load.statuses["OK"] >= answered + 50, 30, "the two others carrying the load")
        restart(victim)
        back, ready_at = inferences(victim), time.monotonic()
        rebalance = time_of(lambda: inferences(victim) > back, 5, "traffic to the restarted replica") - ready_at
        answered = load.statuses["OK"]
        wait_until(lambda: load.statuses["OK"] >= answered + 20, 30, "answers after the rebalance")
    finally:
        load.finish(thread)
    retried = metrics(facade.http_url).value("tritonnx_facade_triton_retries_total") - retries_before
    print(f"sent {sum(load.statuses.values())}, statuses {dict(load.statuses)}, retried {retried:.0f}, "
          f"traffic again {rebalance:.2f}s after ready")  # fmt: skip
    assert set(load.statuses) == {"OK"}, load.statuses  # zero failed requests
    assert load.wrong == 0
    assert retried >= 1  # the calls in flight on the killed replica went to another


def test_a_rolling_restart_of_all_three_loses_no_request(replicas, expected):
    stacks, facade = replicas
    load = Load(facade.grpc_url, expected)
    thread = load.start()
    try:
        wait_until(lambda: load.statuses["OK"] >= 20, 30, "answers through the facade")
        for stack in stacks:
            assert stack.triton.stop() == 0  # SIGTERM: Triton finishes what it holds, then unloads
            restart(stack)
            back = inferences(stack)
            wait_until(lambda: inferences(stack) > back, 10, "traffic to the restarted replica")  # noqa: B023
    finally:
        load.finish(thread)
    print(f"rolling restart: {dict(load.statuses)}")
    assert set(load.statuses) == {"OK"} and load.statuses["OK"] > 50, load.statuses
    assert load.wrong == 0
