"""The images, built by `deploy/docker/images.sh` (make images) and run by a real Docker engine.

Every container runs on the host's network with its ports on 127.0.0.1 (this engine has no bridge).
The NGC image is built on the stand-in with NGC's layout, since NVIDIA's registry is not reachable.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from tests.containers.conftest import DEMO_IMAGES
from tests.containers.docker import Container, docker, listening_addresses, run, run_triton, wait_http
from tests.graphs import small_classifier
from tests.helpers import judged, wait_until
from tests.images import image_file, reference_pixels
from tests.kserve import assert_close
from tests.onnxruntime_style import REPOSITORY, assert_served_as_in_process, write_repository
from tests.serving import CHECKOUT, IMAGE_CLASSIFIERS, MODEL_REPOSITORY, MODELS, demo_stubs
from tests.unit.test_image_requirements import pins
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.server.process import free_ports

ADMIN_KEY = "container-tests"


@pytest.fixture(scope="module", params=DEMO_IMAGES)
def triton(request, images):
    container = run_triton(images[request.param], ADMIN_KEY, options=("--ipc", "shareable"))
    try:
        wait_http(f"http://127.0.0.1:{container.ports['http']}/v2/health/ready", container)
        yield container
    finally:
        container.remove()


def demo_inputs(model: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if model in ("resnet50", "mobilenet_v3_small"):
        return {"input": rng.standard_normal((2, 3, 224, 224), dtype=np.float32)}
    ids = rng.integers(1, 1000, size=(2, 9), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def infer(protocol: str, container: Container, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(f"127.0.0.1:{container.ports[protocol]}")
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer(model, tensors)
    outputs = result.get_response()["outputs"] if protocol == "http" else result.get_response().outputs
    names = [o["name"] if protocol == "http" else o.name for o in outputs]
    return {name: result.as_numpy(name) for name in names}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_every_demo_model_answers_as_onnxruntime_does_on_the_images_own_file(triton, protocol, tmp_path):
    for seed, model in enumerate(MODELS):
        onnx_file = triton.copy_out(f"/models/{model}/1/model.onnx", tmp_path / f"{model}.onnx")
        inputs = demo_inputs(model, seed)
        served = infer(protocol, triton, model, inputs)
        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        assert sorted(served) == sorted(names), model
        for name, expected in zip(names, session.run(names, inputs), strict=True):
            assert served[name].shape == expected.shape, (model, name)
            assert_close(served[name], expected)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_image_pipelines_classify_a_jpeg_as_in_process(triton, protocol, tmp_path):
    """Pillow in the image's stub: a JPEG through each ensemble scores as the same steps in-process do."""
    data = image_file(500, 375, seed=3)
    for model in IMAGE_CLASSIFIERS:
        onnx_file = triton.copy_out(f"/models/{model}/1/model.onnx", tmp_path / f"{model}.onnx")
        served = infer(protocol, triton, f"{model}_image", {"image": np.frombuffer(data, np.uint8)[None]})
        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        assert_close(served["scores"], session.run(["output"], {"input": reference_pixels(data)[None]})[0])


def test_its_command_keeps_every_triton_port_on_loopback(triton):
    """No TRITONNX_TRITON_HOST given: Triton, its metrics and the supervisor's listen on the container's loopback (the
    host's here: it runs on the host's network), so only the facade beside it takes callers."""
    for endpoint, port in triton.ports.items():
        assert listening_addresses(port) == {"127.0.0.1"}, endpoint


def test_it_runs_as_uid_1000_with_the_packages_the_venv_runs(triton):
    assert triton.exec("id", "-u").strip() == "1000"
    names = sorted(pins(CHECKOUT / "deploy/docker/requirements-image.txt"))
    in_image = json.loads(triton.python(
        f"import importlib.metadata as m, json; print(json.dumps({{n: m.version(n) for n in {names!r}}}))"
    ))  # fmt: skip
    assert in_image == {name: importlib.metadata.version(name) for name in names}
    assert triton.python("import tritonnx; print(tritonnx.__file__)").startswith(("/usr/local/lib", "/opt/tritonnx"))
    # The stub's path to model.py files published before the namespace: the Python backend's folder only.
    legacy = "import sys; sys.path.append('/opt/tritonserver/backends/python'); import backend.varint as v; print(v.__name__)"
    assert triton.python(legacy).strip() == "tritonnx.backend.varint"
    assert (
        "No module named 'backend'"
        in docker("exec", triton.name, "python3", "-c", "import backend", check=False).stderr
    )


def test_the_seed_client_predicts_through_a_facade_container(triton):
    grpc_port, http_port = free_ports(2)
    env = {
        "TRITONNX_ADMIN_KEY": ADMIN_KEY, "TRITONNX_HOST": "127.0.0.1", "TRITONNX_PORT": str(grpc_port),
        "TRITONNX_HTTP_PORT": str(http_port), "TRITONNX_TRITON_URL": f"127.0.0.1:{triton.ports['grpc']}",
    }  # fmt: skip
    facade = run(triton.image, "tritonnx-facade", env=env, options=("--ipc", f"container:{triton.name}"))
    try:
        wait_http(f"http://127.0.0.1:{http_port}/health", facade, timeout=60)
        # The seed client's call, as the README shows it: a flat float list and a shape.
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            data = np.random.default_rng(3).standard_normal((1, 3, 224, 224), dtype=np.float32)
            reply = stub.Predict(inference_pb2.PredictRequest(data=data.ravel().tolist(), shape=[1, 3, 224, 224]))
        assert list(reply.shape) == [1, 1000]
        session = ort.InferenceSession(
            str(MODEL_REPOSITORY / "resnet50/1/model.onnx"), providers=["CPUExecutionProvider"]
        )
        assert_close(np.array(reply.predictions, np.float32).reshape(1, 1000), session.run(None, {"input": data})[0])
        assert "inputs go to Triton through shared memory" in facade.logs()  # the two containers share IPC
    finally:
        facade.remove()


def test_a_stub_killed_inside_the_container_is_healed_by_the_supervisor(triton):
    kill = (
        "import os, psutil, signal\n"
        "stubs = [p for p in psutil.process_iter(['cmdline']) if p.info['cmdline'] and "
        "p.info['cmdline'][0].endswith('triton_python_backend_stub') and '/mobilenet_v3_small/' in p.info['cmdline'][1]]\n"
        "os.kill(stubs[0].pid, signal.SIGKILL); print(stubs[0].pid)"
    )
    killed = int(triton.python(kill))
    assert killed > 1
    wait_until(lambda: "supervisor: mobilenet_v3_small reloaded" in triton.logs(), 60, "the reload", interval=0.5)
    inputs = demo_inputs("mobilenet_v3_small", 9)
    for _ in range(6):  # every instance answers again (the scheduler spreads the requests)
        assert infer("grpc", triton, "mobilenet_v3_small", inputs)["output"].shape == (2, 1000)


@pytest.mark.parametrize("image", DEMO_IMAGES)
def test_docker_stop_ends_it_cleanly_within_its_grace_period_leaving_no_shared_memory(images, image):
    # /dev/shm is a host folder here, so what the container leaves in it can be seen after it is gone.
    shm = Path("/dev/shm") / f"tritonnx-test-{uuid.uuid4().hex[:8]}"
    shm.mkdir(mode=0o1777)
    shm.chmod(0o1777)
    container = run_triton(images[image], ADMIN_KEY, options=("-v", f"{shm}:/dev/shm"))
    try:
        wait_http(f"http://127.0.0.1:{container.ports['http']}/v2/health/ready", container)
        assert len(list(shm.iterdir())) >= demo_stubs()  # one region per stub: the mount is the one used
        seconds, code = container.stop(grace=30)
        assert code == 0, container.logs()[-3000:]
        assert seconds < 30
        assert list(shm.iterdir()) == []
        assert "tritonserver stopped (exit code 0)" in container.logs()
    finally:
        container.remove()
        shutil.rmtree(shm, ignore_errors=True)


def test_the_cpu_image_has_no_models_and_says_what_to_mount(images):
    container = run_triton(images["cpu"], ADMIN_KEY)
    try:
        wait_http(f"http://127.0.0.1:{container.ports['http']}/v2/health/ready", container)
        assert container.exec("ls", "-A", "/models").strip() == ""
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{container.ports['grpc']}")
        assert (
            client.get_model_repository_index(headers={"triton-grpc-protocol-tritonnx-admin-key": ADMIN_KEY}).models
            == []
        )
        assert "no models in /models: mount a model repository there" in container.logs()
    finally:
        container.remove()


def test_a_mounted_model_repository_is_served(images, tmp_path):
    repository = tmp_path / "models"
    shutil.copytree(MODEL_REPOSITORY / "text_classifier", repository / "text_classifier",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for path in [tmp_path, *repository.rglob("*")]:  # the container's user is uid 1000
        path.chmod(0o755 if path.is_dir() else 0o644)
    container = run_triton(images["cpu"], ADMIN_KEY, options=("-v", f"{repository}:/models:ro"))
    try:
        wait_http(f"http://127.0.0.1:{container.ports['http']}/v2/health/ready", container)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{container.ports['grpc']}")
        index = client.get_model_repository_index(headers={"triton-grpc-protocol-tritonnx-admin-key": ADMIN_KEY})
        assert [(m.name, m.state) for m in index.models] == [("text_classifier", "READY")]
        inputs = demo_inputs("text_classifier", 5)
        expected = ort.InferenceSession(str(repository / "text_classifier/1/model.onnx")).run(["logits"], inputs)[0]
        assert_close(infer("grpc", container, "text_classifier", inputs)["logits"], expected)
    finally:
        container.remove()


@pytest.mark.parametrize("image", ["cpu", "ngc"])
def test_a_repository_written_for_the_onnxruntime_backend_is_served_unchanged(images, image, tmp_path):
    """tritonnx:cpu serves it under the name `onnxruntime`; on NGC that name is NVIDIA's native backend, and the same
    repository names `tritonnx` to pick ours. Every model but the custom-op one (its library is the host venv's)."""
    repository = tmp_path / "models"
    names = [name for name in REPOSITORY if name != "custom_op"]
    files = write_repository(repository, names, backend="tritonnx" if image == "ngc" else None)
    assert not list(repository.rglob("*.py"))
    for path in [tmp_path, *repository.rglob("*")]:  # the container's user is uid 1000
        path.chmod(0o755 if path.is_dir() else 0o644)
    container = run_triton(images[image], ADMIN_KEY, options=("-v", f"{repository}:/models:ro"))
    try:
        wait_http(f"http://127.0.0.1:{container.ports['http']}/v2/health/ready", container)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{container.ports['grpc']}")
        backends = {name: client.get_model_config(name).config.backend for name in names}
        expected = {name: "tritonnx" if image == "ngc" or name == "named_tritonnx" else "onnxruntime" for name in names}
        assert backends == expected
        for name in names:
            assert_served_as_in_process(client, name, files[name])
    finally:
        container.remove()


def test_a_dev_shm_too_small_for_the_models_is_refused_with_what_to_give(images):
    container = run_triton(images["demo"], ADMIN_KEY, shm="64m")
    try:
        wait_until(lambda: not container.running(), 30, "the container exiting", interval=0.2)
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", container.name).stdout.strip())
        assert code == 1
        assert "/dev/shm has 64 MiB free" in container.logs() and "--shm-size=512m" in container.logs()
    finally:
        container.remove()


@contextlib.contextmanager
def composed(*files: str, env: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """deploy/compose.yaml (with `files` over it) up on free ports until both services are healthy; down after.

    Yields the variables it ran with (the ports among them)."""
    ports = dict(zip(["TRITONNX_TRITON_HTTP_PORT", "TRITONNX_TRITON_GRPC_PORT", "TRITONNX_TRITON_METRICS_PORT",
                      "TRITONNX_SUPERVISOR_METRICS_PORT", "TRITONNX_PORT", "TRITONNX_HTTP_PORT"],
                     map(str, free_ports(6)), strict=True))  # fmt: skip
    variables = {**os.environ, **ports, "TRITONNX_ADMIN_KEY": ADMIN_KEY, **(env or {})}
    compose = ["docker-compose", "-p", f"tnx{uuid.uuid4().hex[:6]}"]
    for name in ("compose.yaml", *files):
        compose += ["-f", str(CHECKOUT / "deploy" / name)]
    subprocess.run([*compose, "up", "-d"], env=variables, check=True, capture_output=True, timeout=120)
    try:

        def healthy() -> bool:
            listed = subprocess.run([*compose, "ps"], env=variables, capture_output=True, text=True, check=True)
            return listed.stdout.count("(healthy)") == 2

        wait_until(healthy, 120, "both services healthy", interval=1)
        yield variables
    finally:
        down = subprocess.run([*compose, "down", "-t", "30"], env=variables, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr


def test_compose_runs_triton_and_the_facade_healthy_on_real_inference(images):
    with composed() as env, grpc.insecure_channel(f"127.0.0.1:{env['TRITONNX_PORT']}") as channel:
        reply = inference_pb2_grpc.InferenceServiceStub(channel).Predict(
            inference_pb2.PredictRequest(data=[0.5] * 150528, shape=[1, 3, 224, 224])
        )
    assert list(reply.shape) == [1, 1000]


def predict(env: dict[str, str], image: np.ndarray) -> inference_pb2.PredictResponse:
    """A Predict naming no model through the facade Compose runs."""
    with grpc.insecure_channel(f"127.0.0.1:{env['TRITONNX_PORT']}") as channel:
        return inference_pb2_grpc.InferenceServiceStub(channel).Predict(
            inference_pb2.PredictRequest(raw_data=image.tobytes(), dtype=inference_pb2.FP32, shape=image.shape),
            timeout=30,
        )


def models_command(env: dict[str, str], repository: Path, *argv: str) -> subprocess.CompletedProcess:
    """`tritonnx-models` from the host's venv, against the mounted repository and the container's Triton."""
    variables = {**os.environ, "TRITONNX_ADMIN_KEY": ADMIN_KEY, "TRITONNX_MODEL_REPOSITORY": str(repository),
                 "TRITONNX_TRITON_URL": f"127.0.0.1:{env['TRITONNX_TRITON_GRPC_PORT']}"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "tritonnx.commands.models", *argv], env=variables, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_your_own_repository_under_compose_takes_versions_published_from_the_host(images, tmp_path):
    """None of the demo models and no default model named: Compose's pair becomes healthy, and tritonnx-models, run
    from the host's venv (the images have no onnx or quantizer), publishes FP32 and INT8 versions and rolls back."""
    repository = tmp_path / "models"
    graphs = {n: small_classifier(tmp_path / "graphs" / f"v{n}.onnx", seed=n) for n in (1, 2)}
    (repository / "scorer" / "1").mkdir(parents=True)
    shutil.copyfile(graphs[1], repository / "scorer" / "1" / "model.onnx")
    (repository / "scorer" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    np.save(calibration / "a.npy", np.random.default_rng(0).standard_normal((20, 3, 16, 16), dtype=np.float32))
    for path in [tmp_path, *tmp_path.rglob("*")]:  # the container's user is uid 1000
        path.chmod(0o755 if path.is_dir() else 0o644)
    image = np.random.default_rng(4).standard_normal((2, 3, 16, 16), dtype=np.float32)

    def in_process(graph: Path) -> np.ndarray:
        return ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"image": image})[0]

    with composed("compose.own.yaml", env={"TRITONNX_MODEL_REPOSITORY": str(repository)}) as env:
        reply = predict(env, image)
        assert (reply.model_name, reply.model_version) == ("scorer", "1")
        assert_close(np.array(reply.predictions, np.float32).reshape(2, 10), in_process(graphs[1]))

        models_command(env, repository, "publish", "scorer", str(graphs[2]))
        reply = predict(env, image)
        assert reply.model_version == "2"
        assert_close(np.array(reply.predictions, np.float32).reshape(2, 10), in_process(graphs[2]))

        models_command(env, repository, "publish", "scorer", str(graphs[2]), "--quantize", "static",
                       "--calibration", str(calibration))  # fmt: skip
        reply = predict(env, image)
        assert reply.model_version == "3"  # the INT8 version, as in-process ONNX Runtime runs its file
        int8 = repository / "scorer" / "3" / "model.onnx"
        assert_close(np.array(reply.predictions, np.float32).reshape(2, 10), in_process(int8))

        models_command(env, repository, "rollback", "scorer")
        assert predict(env, image).model_version == "2"
        assert "scorer" in models_command(env, repository, "list", "scorer").stdout


def test_compose_serves_beside_a_model_that_fails_to_load(images, tmp_path):
    """Compose gates the facade on Triton being live: one broken model leaves Triton never ready, not the stack down."""
    repository = tmp_path / "models"
    for name, config in (("scorer", ""), ("broken", 'parameters { key: "nice" value: { string_value: "30" } }\n')):
        small_classifier(repository / name / "1" / "model.onnx")
        (repository / name / "config.pbtxt").write_text(f'backend: "onnxruntime"\nmax_batch_size: 8\n{config}')
    for path in [tmp_path, *tmp_path.rglob("*")]:  # the container's user is uid 1000
        path.chmod(0o755 if path.is_dir() else 0o644)
    with composed("compose.own.yaml", env={"TRITONNX_MODEL_REPOSITORY": str(repository)}) as env:
        assert predict(env, np.zeros((1, 3, 16, 16), np.float32)).model_name == "scorer"
        ready = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                f"127.0.0.1:{env['TRITONNX_TRITON_HTTP_PORT']}/v2/health/ready"],
                               capture_output=True, text=True, check=False)  # fmt: skip
        assert ready.stdout == "400"  # Triton itself is not ready: the broken model failed to load


def test_size_and_start_up_are_measured_and_reported(images, tmp_path):
    from bench.studies.images import main

    code = main(["--out", str(tmp_path)])
    gates = judged(tmp_path, code, ["| `tritonnx:cpu` | mobilenet_v3_small, mounted |"])
    assert len(gates) == 2  # size and start-up: their figures are the study's to judge
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [(r["image"], r["models"]) for r in results] == [
        ("tritonnx:demo", "*"),
        ("tritonnx:ngc", "*"),
        ("tritonnx:cpu", "mobilenet_v3_small"),
    ]
    for r in results:
        assert r["size_mb"] > 50 and r["ready_s"] > 0 and r["idle_pss_mib"] > 100
    assert results[2]["size_mb"] < results[0]["size_mb"]  # the demo image is the slim one plus its models
    assert not (tmp_path / "repository").exists()
