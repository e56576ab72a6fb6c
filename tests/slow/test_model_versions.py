"""Model versions swapped in place under load: publish, rollback and failed publishes through
`python -m tritonnx.commands.models`, against a supervised tritonserver with a facade in front, on a scratch
copy of the repository.

The load is the project's load engine (bench.load: its targets and closed loop), 8 callers through
the facade and 8 straight to Triton, every answer checked against in-process ONNX Runtime of the
version the answer names. The versions are mobilenet_v3_small with other seeded weights (and one
with another signature).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from bench.load.loops import LoadResult, run_load
from bench.load.targets import FacadeTarget, KServeTarget, close_enough
from tests.helpers import time_of, wait_until
from tests.kserve import assert_close, reference_session
from tests.serving import MODEL_REPOSITORY, demo_config
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.common.admin import ADMIN_KEY_ENV
from tritonnx.common.paths import REPOSITORY_ENV
from tritonnx.offline.demo_models import MODELS
from tritonnx.server.facade import start_facade
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack
from tritonnx.server.stubs import live_stubs

M = "mobilenet_v3_small"
CLIENTS = 8  # per path
IMAGES = [np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32) for seed in range(4)]
# Two instances (four stubs while two versions are loaded, on 2 cores). The input listed by hand, as a
# ragged input would be, is what a new file without it cannot load with: Triton refuses it.
CONFIG = demo_config(M, 2) + ('\ninput [ { name: "input" } ]\n')
TWO_VERSIONS = "\nversion_policy: { latest: { num_versions: 2 } }\n"


def mobilenet(path: Path, seed: int, pixels: int = 224, output: str = "output") -> Path:
    """The demo architecture with the weights of `seed`; other image sizes or output names change its signature."""
    model = MODELS[M](seed)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = pixels
    if output != model.graph.output[0].name:
        old = model.graph.output[0].name
        model.graph.output[0].name = output
        for node in model.graph.node:
            node.output[:] = [output if name == old else name for name in node.output]
    onnx.save(model, path)
    return path


def renamed_input(path: Path, seed: int) -> Path:
    model = MODELS[M](seed)
    old = model.graph.input[0].name
    model.graph.input[0].name = "pixels"
    for node in model.graph.node:
        node.input[:] = ["pixels" if name == old else name for name in node.input]
    onnx.save(model, path)
    return path


def outputs_of(onnx_file: Path, images: Sequence[np.ndarray]) -> list[np.ndarray]:
    session = reference_session(onnx_file)
    return [session.run(None, {session.get_inputs()[0].name: image})[0].ravel() for image in images]


@dataclass
class Serving:
    stack: ServingStack
    repository: Path
    files: Path
    expected: dict[str, list[np.ndarray]] = field(default_factory=dict)  # version -> outputs of IMAGES

    @property
    def folder(self) -> Path:
        return self.repository / M

    def models(self, *args: str | Path) -> subprocess.CompletedProcess:
        """`python -m tritonnx.commands.models` as a user runs it, pointed at this stack by its environment."""
        env = {
            **os.environ,
            REPOSITORY_ENV: str(self.repository),
            "TRITONNX_TRITON_URL": self.stack.triton.grpc_url,
            ADMIN_KEY_ENV: self.stack.triton.admin_key,
        }
        command = [sys.executable, "-m", "tritonnx.commands.models", *map(str, args)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        print(f"$ {' '.join(command[1:])}  (exit {done.returncode})\n{done.stdout}{done.stderr}")
        return done

    def publish(self, version: str, onnx_file: Path, *flags: str) -> subprocess.CompletedProcess:
        """Publish `onnx_file`, which must become `version`; its expected outputs are learned first."""
        self.expected[version] = outputs_of(onnx_file, IMAGES)
        done = self.models("publish", M, onnx_file, *flags)
        assert done.returncode == 0, done.stderr
        assert f"as version {version} of {M}" in done.stdout
        return done

    def ready_versions(self) -> list[str]:
        return sorted(
            s["version"] for s in self.stack.triton.model_states() if s["name"] == M and s.get("state") == "READY"
        )

    def version_folders(self) -> list[str]:
        """The model's folders an operator sees (hidden ones, the publish records and staging, left out)."""
        return sorted(p.name for p in self.folder.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("versions")
    repository = link_models(workdir / "repository", {M: MODEL_REPOSITORY / M}, {M: CONFIG})
    files = workdir / "files"
    files.mkdir()
    stack = ServingStack(
        repository,
        workdir,
        supervised=True,
        supervisor_interval=0.1,
        facade_args=["--default-model", M, "--max-in-flight", "64", "--health-interval", "1"],
    )
    with stack:
        serving = Serving(
            stack, repository, files, {"1": outputs_of(MODEL_REPOSITORY / M / "1" / "model.onnx", IMAGES)}
        )
        yield serving


class VersionChecked:
    """A bench.load target whose every answer is checked against the expected outputs of the version it
    names; answers are recorded as (time, version), failures as (time, status, message)."""

    def __init__(self, *args, by_version: dict[str, list[np.ndarray]], **options) -> None:
        super().__init__(*args, images=IMAGES, **options)
        self.by_version = by_version
        self.answers: list[tuple[float, str]] = []
        self.failures: list[tuple[float, str, str]] = []
        self.wrong_answers: list[tuple[float, str]] = []

    def answer(self, body: bytes) -> tuple[str, np.ndarray]:
        raise NotImplementedError

    def failed(self, error: grpc.aio.AioRpcError) -> None:
        self.failures.append((time.monotonic(), error.code().name, error.details() or ""))

    def check(self, index: int, body: bytes) -> None:
        version, output = self.answer(body)
        self.answers.append((time.monotonic(), version))
        expected = self.by_version.get(version)
        if expected is None or not close_enough(output, expected[index]):
            self.wrong += 1
            self.wrong_answers.append((time.monotonic(), version))

    def first_and_last(self, version: str, after: float) -> tuple[float | None, float | None]:
        times = [when for when, named in self.answers if named == version and when >= after]
        return (times[0], times[-1]) if times else (None, None)


class CheckedTriton(VersionChecked, KServeTarget):
    def answer(self, body: bytes) -> tuple[str, np.ndarray]:
        response = service_pb2.ModelInferResponse.FromString(body)
        return response.model_version, np.frombuffer(response.raw_output_contents[0], "<f4")


class CheckedFacade(VersionChecked, FacadeTarget):
    def answer(self, body: bytes) -> tuple[str, np.ndarray]:
        response = inference_pb2.PredictResponse.FromString(body)
        return response.model_version, np.array(response.predictions, np.float32)


class Load:
    """CLIENTS callers through the facade and CLIENTS straight to Triton, for `seconds`, in a thread."""

    def __init__(self, serving: Serving, seconds: float) -> None:
        self.targets = [
            CheckedFacade(serving.stack.facade.grpc_url, M, 1, by_version=serving.expected),
            CheckedTriton(serving.stack.triton.grpc_url, M, 1, by_version=serving.expected),
        ]
        self.seconds = seconds
        self.results: list[LoadResult] = []
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        self.results = list(
            await asyncio.gather(
                *(
                    run_load(t, CLIENTS, self.seconds, warmup_s=0, max_requests=50_000, verify=False)
                    for t in self.targets
                )
            )
        )

    def __enter__(self) -> Load:
        self._thread.start()
        # Every caller busy before anything changes.
        wait_until(lambda: all(len(t.answers) >= CLIENTS for t in self.targets), 30, "answers to every target")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._thread.join(self.seconds + 60)
        assert not self._thread.is_alive()

    def report(self) -> dict[str, dict]:
        return {
            t.name: {
                "sent": len(t.answers) + len(t.failures),
                "failed": len(t.failures),
                "wrong": t.wrong,
                "p50_ms": round(result.p50_ms, 1),
                "p99_ms": round(result.p99_ms, 1),
            }
            for t, result in zip(self.targets, self.results, strict=True)
        }

    def assert_all_answered_right(self) -> None:
        for target in self.targets:
            assert target.failures == [], (target.name, target.failures[:5])
            assert target.wrong == 0, (target.name, target.wrong_answers[:5])
            assert len(target.answers) > 50, target.name


def swap_figures(load: Load, old: str, new: str, started: float) -> dict[str, dict[str, float | None]]:
    """Per path: seconds from the command's start to the first answer of `new` and the last answer of `old`."""
    figures = {}
    for target in load.targets:
        first_new, _ = target.first_and_last(new, started)
        _, last_old = target.first_and_last(old, started)
        figures[target.name] = {
            "first_new_s": None if first_new is None else round(first_new - started, 3),
            "last_old_s": None if last_old is None else round(last_old - started, 3),
        }
        assert first_new is not None, f"{target.name}: no answer from version {new}"
        assert all(named == new for when, named in target.answers if when > (last_old or started)), target.name
    return figures


def supervisor_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tritonnx.supervisor" and r.levelno >= logging.WARNING]


def test_publish_then_rollback_under_load_fail_no_request_and_answer_each_from_its_version(serving, caplog):
    caplog.set_level(logging.WARNING, logger="tritonnx.supervisor")
    reloads = len(serving.stack.supervisor.reloads)
    v2 = mobilenet(serving.files / "seed1.onnx", seed=1)
    serving.expected["2"] = outputs_of(v2, IMAGES)
    for a, b in (("1", "2"),):  # a mislabelled answer would be caught: the versions' outputs differ
        assert not any(close_enough(x, y) for x, y in zip(serving.expected[a], serving.expected[b], strict=True))

    with Load(serving, seconds=9) as load:
        started = time.monotonic()
        serving.publish("2", v2)
        published = time.monotonic() - started
    load.assert_all_answered_right()
    publish_figures = swap_figures(load, "1", "2", started)
    print(f"publish: command {published:.2f}s, {json.dumps(load.report())}, {json.dumps(publish_figures)}")
    assert serving.ready_versions() == ["2"]

    with Load(serving, seconds=9) as load:
        started = time.monotonic()
        done = serving.models("rollback", M)
        rolled_back = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert "version 2 retired to retired/2" in done.stdout and f"{M} serves version 1" in done.stdout
    load.assert_all_answered_right()
    rollback_figures = swap_figures(load, "2", "1", started)
    print(f"rollback: command {rolled_back:.2f}s, {json.dumps(load.report())}, {json.dumps(rollback_figures)}")
    assert serving.ready_versions() == ["1"]
    assert serving.version_folders() == ["1", "retired"] and (serving.folder / "retired" / "2" / "model.onnx").is_file()
    # The supervisor took neither swap for a death.
    assert len(serving.stack.supervisor.reloads) == reloads
    assert supervisor_warnings(caplog) == []
    # A request naming the retired version: Triton answers UNAVAILABLE ("not at ready state"), as for a
    # full queue; the facade tells them apart and answers NOT_FOUND with the versions that are ready.
    with pytest.raises(grpc.RpcError) as refused:
        predict(facade_stub(serving), IMAGES[0], "2")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert f"version '2' is not served; ready models: {M}; ready versions of '{M}': 1" in refused.value.details()


def test_refused_publishes_under_load_fail_no_request_and_leave_the_served_version(serving):
    garbage = serving.files / "garbage.onnx"
    garbage.write_bytes(b"this is not an ONNX model")
    incompatible = mobilenet(serving.files / "small160.onnx", seed=9, pixels=160)
    without_input = renamed_input(serving.files / "pixels.onnx", seed=9)
    before = serving.version_folders()
    with Load(serving, seconds=10) as load:
        refused = serving.models("publish", M, garbage)
        assert refused.returncode == 1
        assert "is not an ONNX model that can be served" in refused.stderr
        refused = serving.models("publish", M, incompatible)
        assert refused.returncode == 1
        assert (
            "input 'input' takes dims [3, 160, 160] in the new file, not every shape of the served [3, 224, 224]"
            in (refused.stderr)
        )
        assert (
            "the served model: inputs input (FP32 [-1, 3, 224, 224]); outputs output (FP32 [-1, 1000])"
            in refused.stderr
        )
        # Past the checks (the signature change is allowed) but not past Triton: config.pbtxt lists 'input'.
        failed = serving.models("publish", M, without_input, "--allow-signature-change")
        assert failed.returncode == 1
        assert failed.stderr.startswith(f"error: Triton could not load version 3 of {M}: load failed for model '{M}'")
        assert "At:" not in failed.stderr  # no Python traceback
        assert f"version 3 was moved to failed/3 (its number is not used again); {M} serves version 1" in failed.stderr
        assert serving.version_folders() == sorted([*before, "failed"])  # nothing half-made left in Triton's sight
        assert (serving.folder / "failed" / "3" / "model.onnx").is_file()
    load.assert_all_answered_right()
    print(f"refused publishes: {json.dumps(load.report())}")
    for target in load.targets:
        assert {named for _, named in target.answers} == {"1"}
    assert serving.ready_versions() == ["1"]


def instance_stubs(serving: Serving, version: str) -> list:
    stubs = live_stubs(serving.stack.triton.pid).values()
    return [s for s in stubs if s.key == (M, version) and not s.auto_complete]


def facade_stub(serving: Serving) -> inference_pb2_grpc.InferenceServiceStub:
    return inference_pb2_grpc.InferenceServiceStub(grpc.insecure_channel(serving.stack.facade.grpc_url))


def predict(stub, image: np.ndarray, version: str = "") -> inference_pb2.PredictResponse:
    request = inference_pb2.PredictRequest(
        model_name=M, model_version=version, raw_data=image.tobytes(), shape=list(image.shape)
    )
    return stub.Predict(request, timeout=30)


def test_a_stub_killed_right_after_a_swap_is_healed_and_the_same_version_serves(serving):
    reloads = len(serving.stack.supervisor.reloads)
    serving.publish("4", mobilenet(serving.files / "seed2.onnx", seed=2))
    [victim, *_] = instance_stubs(serving, "4")
    killed = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    healed = time_of(lambda: len(serving.stack.supervisor.reloads) > reloads, 15, "the supervisor's reload")
    print(f"stub of version 4 killed right after the swap: reloaded after {healed - killed:.2f}s")
    assert serving.stack.supervisor.reloads[-1][1] == M
    wait_until(
        lambda: serving.ready_versions() == ["4"] and len(instance_stubs(serving, "4")) == 2, 30, "version 4 again"
    )
    stub = facade_stub(serving)
    for index, image in enumerate(IMAGES * 2):  # every instance answers, from version 4
        answer = predict(stub, image)
        assert answer.model_version == "4"
        assert_close(np.array(answer.predictions, np.float32), serving.expected["4"][index % len(IMAGES)])


def test_the_facade_cache_names_the_version_of_every_answer_across_a_swap(serving, tmp_path):
    facade = start_facade(
        serving.stack.triton.grpc_url,
        serving.stack.triton.admin_key,
        tmp_path / "facade.log",
        ["--default-model", M, "--cache-models", M],
    )
    try:
        stub = inference_pb2_grpc.InferenceServiceStub(grpc.insecure_channel(facade.grpc_url))
        answers = [predict(stub, IMAGES[0])]  # computed by 4, then kept
        serving.publish("5", mobilenet(serving.files / "seed3.onnx", seed=3))
        answers += [predict(stub, IMAGES[0])]  # may be the kept answer of 4, named 4
        answers += [predict(stub, IMAGES[1])]  # a miss: computed by 5, and the facade learns that 5 serves
        answers += [predict(stub, IMAGES[0]) for _ in range(2)]
        for answer, image in zip(answers, [0, 0, 1, 0, 0], strict=True):
            assert_close(np.array(answer.predictions, np.float32), serving.expected[answer.model_version][image])
        print(f"cached facade across the swap: versions named {[a.model_version for a in answers]}")
        assert [a.model_version for a in answers][2:] == ["5", "5", "5"]
    finally:
        facade.stop()


def test_two_versions_side_by_side_are_listed_and_routed_by_version(serving):
    (serving.folder / "config.pbtxt").write_text(CONFIG + TWO_VERSIONS)
    serving.publish("6", mobilenet(serving.files / "seed4.onnx", seed=4))
    assert serving.ready_versions() == ["5", "6"]
    listed = facade_stub(serving).ListModels(inference_pb2.ListModelsRequest(ready_only=True), timeout=30)
    mine = [
        (m.version, m.state, [t.name for t in m.inputs], list(m.outputs[0].shape)) for m in listed.models if m.name == M
    ]
    assert mine == [("5", "READY", ["input"], [-1, 1000]), ("6", "READY", ["input"], [-1, 1000])]
    health = subprocess.run(
        [
            sys.executable,
            "-m",
            "tritonnx.client.triton_health",
            "--url",
            serving.stack.triton.grpc_url,
            "--model",
            M,
            "--json",
        ],
        env={**os.environ, ADMIN_KEY_ENV: serving.stack.triton.admin_key},
        capture_output=True,
        text=True,
        timeout=60,
    )
    [model] = json.loads(health.stdout)["models"]
    ready = sorted(v["version"] for v in model["versions"] if v.get("state") == "READY")
    assert ready == ["5", "6"] and model["default_version"] == "6", model["versions"]
    listing = serving.models("list", M)
    assert "5        repository  READY\n" in listing.stdout
    assert "6        repository  READY  <- serves requests without a version" in listing.stdout

    stub = facade_stub(serving)
    with grpcclient.InferenceServerClient(serving.stack.triton.grpc_url) as direct:
        for version in ("5", "6", ""):
            for index, image in enumerate(IMAGES):
                answer = predict(stub, image, version)
                assert answer.model_version == (version or "6")
                assert_close(np.array(answer.predictions, np.float32), serving.expected[answer.model_version][index])
                tensor = grpcclient.InferInput("input", list(image.shape), "FP32")
                tensor.set_data_from_numpy(image)
                result = direct.infer(M, [tensor], model_version=version)
                assert result.get_response().model_version == (version or "6")
                assert_close(result.as_numpy("output").ravel(), serving.expected[version or "6"][index])


def test_a_signature_change_beside_the_old_version_is_served_and_healed_per_version(serving):
    """Version 7 takes 160x160 images and answers `scores`, beside version 6 (224x224, `output`). The
    facade, holding version 6's metadata, follows at once; a stub of 6 killed afterwards is healed
    with each version keeping its own signature."""
    stub = facade_stub(serving)
    predict(stub, IMAGES[0])  # the facade holds the metadata of 6
    small = [np.random.default_rng(seed).standard_normal((1, 3, 160, 160), dtype=np.float32) for seed in range(4)]
    v7 = mobilenet(serving.files / "seed5_160.onnx", seed=5, pixels=160, output="scores")
    serving.expected["7"] = outputs_of(v7, small)
    wait_until(lambda: len(instance_stubs(serving, "6")) == 2, 30, "version 6's instances alone")
    stubs_of_6 = {s.pid for s in instance_stubs(serving, "6")}
    done = serving.models("publish", M, v7, "--allow-signature-change")
    assert done.returncode == 0, done.stderr
    assert "the signature changes (--allow-signature-change)" in done.stdout
    assert serving.ready_versions() == ["6", "7"]
    assert {s.pid for s in instance_stubs(serving, "6")} == stubs_of_6  # loading 7 left 6 alone
    for index, image in enumerate(small):
        answer = predict(stub, image)  # within the facade's 30 s metadata TTL
        assert answer.model_version == "7"
        assert_close(np.array(answer.predictions, np.float32), serving.expected["7"][index])

    reloads = len(serving.stack.supervisor.reloads)
    [victim, *_] = instance_stubs(serving, "6")
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: len(serving.stack.supervisor.reloads) > reloads, 15, "the supervisor's reload")
    wait_until(
        lambda: len(instance_stubs(serving, "6")) == 2 and len(instance_stubs(serving, "7")) == 2, 30, "both again"
    )
    assert serving.ready_versions() == ["6", "7"]
    with grpcclient.InferenceServerClient(serving.stack.triton.grpc_url) as direct:
        configs = {v: direct.get_model_config(M, v, as_json=True)["config"] for v in ("6", "7")}
    assert [(t["name"], t["dims"]) for t in configs["6"]["input"]] == [("input", ["3", "224", "224"])]
    assert [(t["name"], t["dims"]) for t in configs["7"]["input"]] == [("input", ["3", "160", "160"])]
    for index in range(len(IMAGES) * 2):  # both instances of each version answer right
        old = predict(stub, IMAGES[index % 4], "6")
        assert_close(np.array(old.predictions, np.float32), serving.expected["6"][index % 4])
        new = predict(stub, small[index % 4], "7")
        assert_close(np.array(new.predictions, np.float32), serving.expected["7"][index % 4])
