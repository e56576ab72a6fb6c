"""The pod of deploy/k8s, run by Docker as the rendered manifests say Kubernetes runs it, with the demo models and
with a repository of one's own.

Both containers of the production overlay's pod, with the settings of their generated ConfigMaps,
the pod's user and group, each container's securityContext turned into `docker run` flags, and the
pod's two emptyDir volumes as host folders mounted into both (an emptyDir is shared by the pod's
containers). Only the ports differ: free loopback ports instead of 8000-8003/50051/3000, and the addresses
the pod IP would carry (the facade's, the metrics') are loopback too, since the containers run on the host's
network. Triton's own address is the rendered one.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from tests.containers.docker import Container, listening_addresses, run, wait_http
from tests.graphs import small_classifier
from tests.kserve import assert_close
from tests.manifests import container, deployment_pod, environment, rendered
from tests.serving import MODEL_REPOSITORY, demo_stubs
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.server.process import free_ports

ADMIN_KEY, AUTH_TOKEN = "pod-test", "pod-test-token"


def docker_flags(pod: dict[str, Any], spec: dict[str, Any], volumes: dict[str, Path]) -> tuple[str, ...]:
    """`docker run` flags for what the pod and container specs say about users, privileges and mounts."""
    pod_security, security = pod["securityContext"], spec["securityContext"]
    flags = [f"--user={pod_security['runAsUser']}:{pod_security['runAsGroup']}"]
    flags += [f"--group-add={pod_security['fsGroup']}"]
    if security["readOnlyRootFilesystem"]:
        flags.append("--read-only")
    flags += [f"--cap-drop={capability}" for capability in security["capabilities"]["drop"]]
    if security["allowPrivilegeEscalation"] is False:
        flags.append("--security-opt=no-new-privileges")
    flags += [f"--volume={volumes[m['name']]}:{m['mountPath']}" for m in spec["volumeMounts"]]
    return tuple(flags)


def plain(env: dict[str, Any]) -> dict[str, str]:
    """The container's variables with the Secrets' values given (the test's admin key and token)."""
    secrets = {"TRITONNX_ADMIN_KEY": ADMIN_KEY, "TRITONNX_AUTH_TOKEN": AUTH_TOKEN}
    values = {name: value for name, value in env.items() if isinstance(value, str)}
    return values | {name: secrets[name] for name, value in env.items() if isinstance(value, dict)}


def demo_case(images: dict[str, str], tmp_path: Path) -> tuple[str, tuple[str, ...], str, Path, int]:
    """The rendered image with its demo models: (image, extra flags, input name, graph, stubs at least)."""
    return images["demo"], (), "input", MODEL_REPOSITORY / "resnet50/1/model.onnx", demo_stubs()


def own_case(images: dict[str, str], tmp_path: Path) -> tuple[str, tuple[str, ...], str, Path, int]:
    """tritonnx:cpu with a repository of one model, none of the demo's, mounted at /models (a volume, as a
    PersistentVolumeClaim holding it would be), and no default model named."""
    repository = tmp_path / "models"
    graph = small_classifier(repository / "scorer" / "1" / "model.onnx", seed=4)
    (repository / "scorer" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    for path in [repository, *repository.rglob("*")]:  # the pod's user is uid 1000
        path.chmod(0o755 if path.is_dir() else 0o644)
    return images["cpu"], (f"--volume={repository}:/models:ro",), "image", graph, 1


@pytest.mark.parametrize("case", [demo_case, own_case], ids=["demo-models", "own-repository"])
def test_the_production_pod_serves_with_a_read_only_root_and_shared_memory_between_its_containers(
    images, tmp_path, case
):
    image, mounts, input_name, graph, stubs = case(images, tmp_path)
    objects = rendered("k8s/overlays/production")
    pod = deployment_pod(objects)
    triton_spec, facade_spec = container(pod, "triton"), container(pod, "facade")
    assert "args" not in triton_spec and facade_spec["args"] == ["tritonnx-facade"]
    assert {triton_spec["image"], facade_spec["image"]} == {images["demo"]}

    # The pod's emptyDirs: memory-backed for /dev/shm, a folder for /tmp; writable by the pod's user.
    volumes = {"dshm": Path("/dev/shm") / f"tritonnx-pod-{uuid.uuid4().hex[:8]}", "tmp": tmp_path / "tmp"}
    assert {v["name"] for v in pod["volumes"]} == set(volumes)
    for folder in volumes.values():
        folder.mkdir(mode=0o1777)
        folder.chmod(0o1777)

    http, grpc_port, metrics, supervisor, facade_grpc, facade_http = free_ports(6)
    triton_env = plain(environment(triton_spec, objects)) | {
        "TRITONNX_TRITON_METRICS_HOST": "127.0.0.1",
        "TRITONNX_TRITON_HTTP_PORT": str(http),
        "TRITONNX_TRITON_GRPC_PORT": str(grpc_port),
        "TRITONNX_TRITON_METRICS_PORT": str(metrics),
        "TRITONNX_SUPERVISOR_METRICS_PORT": str(supervisor),
    }
    facade_env = plain(environment(facade_spec, objects)) | {
        "TRITONNX_HOST": "127.0.0.1",
        "TRITONNX_PORT": str(facade_grpc),
        "TRITONNX_HTTP_PORT": str(facade_http),
        "TRITONNX_TRITON_URL": f"127.0.0.1:{grpc_port}",
    }
    assert "TRITONNX_DEFAULT_MODEL" not in facade_env  # the default follows what the repository serves
    started: list[Container] = []
    try:
        triton = run(image, env=triton_env, options=(*docker_flags(pod, triton_spec, volumes), *mounts))
        started.append(triton)
        facade = run(image, *facade_spec["args"], env=facade_env, options=docker_flags(pod, facade_spec, volumes))
        started.append(facade)
        # The startup and readiness probes' URL: 200 only once a real inference went through Triton.
        wait_http(f"http://127.0.0.1:{facade_http}/health", facade, timeout=180)
        assert triton.exec("id", "-u").strip() == "1000"
        assert "Read-only file system" in triton.exec("sh", "-c", "touch /home/tritonnx/x 2>&1 || true")

        # Triton as rendered: its inference ports on loopback only, and its exec probes pass in its container.
        assert listening_addresses(http) == listening_addresses(grpc_port) == {"127.0.0.1"}
        for kind in ("startupProbe", "livenessProbe"):
            triton.exec(*triton_spec[kind]["exec"]["command"])  # fails the test on a non-zero exit

        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        shape = [1, *session.get_inputs()[0].shape[1:]]
        data = np.random.default_rng(11).standard_normal(shape, dtype=np.float32)
        request = inference_pb2.PredictRequest(data=data.ravel().tolist(), shape=shape)  # names no model
        with grpc.insecure_channel(f"127.0.0.1:{facade_grpc}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Predict(request)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # the Secret's token is required
            reply = stub.Predict(request, metadata=[("authorization", f"Bearer {AUTH_TOKEN}")])
        expected = session.run(None, {input_name: data})[0]
        assert_close(np.array(reply.predictions, np.float32).reshape(expected.shape), expected)
        # The facade's inputs reached Triton through the shared emptyDir, not over the socket.
        assert "inputs go to Triton through shared memory" in facade.logs()
        regions = [p.name for p in volumes["dshm"].iterdir()]
        facade_regions = [name for name in regions if name.startswith("tritonnx_facade_")]
        assert len(facade_regions) == 1 and len(regions) >= 1 + stubs, regions  # + one per stub of Triton
        # Everything the processes write went to the /tmp emptyDir (the root is read-only).
        assert (volumes["tmp"] / "tritonnx").is_dir()
    finally:
        for c in reversed(started):
            c.remove()
        shutil.rmtree(volumes["dshm"], ignore_errors=True)
