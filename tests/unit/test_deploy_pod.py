"""The Triton + facade pod of deploy/k8s and deploy/kserve: security, /dev/shm, probes, stopping order, settings, resources."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests.manifests import (
    DEMO_IMAGE,
    IDLE_PSS_MIB,
    IMAGE,
    K8S_OVERLAYS,
    MODEL_REPOSITORY,
    POD_IDS,
    ROOT,
    TRITON,
    TRITON_EXIT_TIMEOUT,
    UID,
    container,
    environment,
    facade_settings_from,
    is_loopback,
    one,
    pod_case,
    port_number,
    prestop_sleep,
    probe_url,
    quantity,
    rendered,
    triton_settings,
)
from tritonnx.client.facade import settings as facade_settings
from tritonnx.common import settings as common_settings
from tritonnx.server.shm import needed_bytes

# --- the pod ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", POD_IDS)
def test_pod_runs_non_root_read_only_without_privileges(where):
    pod, _, _ = pod_case(where)
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == security["runAsGroup"] == security["fsGroup"] == UID
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["enableServiceLinks"] is False  # a Service `tritonnx` would set TRITONNX_PORT=tcp://...
    assert pod["automountServiceAccountToken"] is False
    for key in ("hostIPC", "hostPID", "hostNetwork", "shareProcessNamespace"):
        assert not pod.get(key), key
    assert sorted(c["name"] for c in pod["containers"]) == sorted([TRITON[where], "facade"])
    for c in pod["containers"]:
        assert c["image"] == (IMAGE if where == "kserve" else DEMO_IMAGE)  # KServe brings the models
        assert "command" not in c, "the image's ENTRYPOINT (tini) must stay PID 1"
        s = c["securityContext"]
        assert s["readOnlyRootFilesystem"] is True
        assert s["allowPrivilegeEscalation"] is False
        assert s["capabilities"] == {"drop": ["ALL"]}
        assert not s.get("privileged")
        assert s.get("runAsUser", UID) == UID and s.get("runAsNonRoot", True) is True


def test_pod_annotations_point_kubectl_at_triton_and_prometheus_at_its_metrics():
    for overlay in K8S_OVERLAYS:
        annotations = one(rendered(overlay), "Deployment", "tritonnx")["spec"]["template"]["metadata"]["annotations"]
        assert annotations["kubectl.kubernetes.io/default-container"] == "triton"
        assert annotations["prometheus.io/port"] == "8002"
    annotations = one(rendered("kserve"), "ServingRuntime")["spec"]["annotations"]  # KServe copies them to the pods
    assert annotations["kubectl.kubernetes.io/default-container"] == "kserve-container"
    assert annotations["prometheus.kserve.io/port"] == "8002"


@pytest.mark.parametrize("where", POD_IDS)
def test_both_containers_share_a_memory_dev_shm_big_enough_for_the_models(where, monkeypatch):
    pod, _, objects = pod_case(where)
    volumes = {v["name"]: v for v in pod["volumes"]}
    for c in pod["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert "/dev/shm" in mounts and "/tmp" in mounts, c["name"]
        shm = volumes[mounts["/dev/shm"]]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert "emptyDir" in volumes[mounts["/tmp"]]
    (shm_name,) = {m["name"] for c in pod["containers"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"}
    size = quantity(volumes[shm_name]["emptyDir"]["sizeLimit"])

    triton_env = environment(container(pod, TRITON[where]), objects)
    models = tuple(triton_env.get("TRITONNX_TRITON_LOAD_MODELS", "*").split(","))
    facade = facade_settings_from(environment(container(pod, "facade"), objects), monkeypatch)
    needed = needed_bytes(MODEL_REPOSITORY, models) + facade.shm_slots * facade.shm_slot_bytes
    assert size >= needed * 1.5, f"/dev/shm {size / 2**20:.0f} MiB for {needed / 2**20:.0f} MiB of regions"
    for c in pod["containers"]:  # tmpfs pages count against the memory of the container writing them
        assert quantity(c["resources"]["limits"]["memory"]) > 0


@pytest.mark.parametrize("where", POD_IDS)
def test_probes_follow_real_inference_and_never_kill_a_busy_pod(where, monkeypatch):
    pod, _, objects = pod_case(where)
    facade, triton = container(pod, "facade"), container(pod, TRITON[where])
    for kind in ("startupProbe", "readinessProbe"):
        probe = facade[kind]["httpGet"]
        assert probe["path"] == "/health" and port_number(facade, probe["port"]) == 3000, kind
        # /health may run a real inference of up to TRITONNX_HEALTH_TIMEOUT (5 s)
        assert facade[kind]["timeoutSeconds"] > 5
    startup = facade["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 180  # the supervisor's ready timeout
    # Liveness never on /health (an overloaded or Triton-less facade is not dead) and generous.
    liveness = facade["livenessProbe"]
    assert liveness["httpGet"]["path"] != "/health" and "grpc" not in liveness
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    # Triton's: its HTTP /v2/health/live, where the probe can reach it.
    settings = triton_settings(pod, where, objects, monkeypatch)
    for kind in ("startupProbe", "livenessProbe"):
        host, port, path = probe_url(triton[kind], environment(triton, objects), triton)
        assert (path, port) == ("/v2/health/live", settings.http_port), kind
        if host is None:  # the kubelet's httpGet comes in on the pod IP
            assert not is_loopback(settings.http_host), kind
        else:  # an exec probe runs in the pod's network namespace
            assert is_loopback(host) and (is_loopback(settings.http_host) or settings.http_host == "0.0.0.0"), kind
            assert triton[kind]["timeoutSeconds"] > 4  # the command's own timeout, and Python's start
    assert triton["livenessProbe"]["periodSeconds"] * triton["livenessProbe"]["failureThreshold"] >= 60
    for c in (facade, triton):
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            if kind in c and "httpGet" in c[kind]:
                port = port_number(c, c[kind]["httpGet"]["port"])
                assert port in {p["containerPort"] for p in c["ports"]}, (c["name"], kind)


@pytest.mark.parametrize("where", POD_IDS)
def test_facade_drains_before_triton_stops_within_the_grace_period(where, monkeypatch):
    pod, _, objects = pod_case(where)
    facade, triton = container(pod, "facade"), container(pod, TRITON[where])
    drain = facade_settings_from(environment(facade, objects), monkeypatch).drain_seconds
    assert prestop_sleep(triton) >= prestop_sleep(facade) + drain + 3
    assert pod["terminationGracePeriodSeconds"] >= prestop_sleep(triton) + TRITON_EXIT_TIMEOUT + 5


@pytest.mark.parametrize("where", POD_IDS)
def test_admin_key_comes_from_the_same_secret_in_both_containers(where):
    pod, _, objects = pod_case(where)
    refs = []
    for c in pod["containers"]:
        key = environment(c, objects).get("TRITONNX_ADMIN_KEY")
        assert isinstance(key, dict) and "secretKeyRef" in key, f"{c['name']}: TRITONNX_ADMIN_KEY not from a Secret"
        assert not key["secretKeyRef"].get("optional"), "without the key the facade cannot register shared memory"
        refs.append((key["secretKeyRef"]["name"], key["secretKeyRef"]["key"]))
    assert refs[0] == refs[1]
    for obj in objects:  # no key committed anywhere
        assert obj["kind"] != "Secret"
        assert "TRITONNX_ADMIN_KEY" not in obj.get("data", {})


@pytest.mark.parametrize("where", POD_IDS)
def test_settings_are_ones_the_processes_read_with_values_they_take(where, monkeypatch):
    pod, _, objects = pod_case(where)
    facade = container(pod, "facade")
    facade_env = environment(facade, objects)
    names = {common_settings.env_name(f.name) for f in dataclasses.fields(facade_settings.FacadeSettings)}
    unknown = {n for n in facade_env if n.startswith("TRITONNX_")} - names
    assert not unknown, f"the facade reads no {sorted(unknown)}"
    assert facade.get("args") == ["tritonnx-facade"]
    settings = facade_settings_from(facade_env, monkeypatch)  # every value parses
    assert settings.host == "0.0.0.0"  # the kubelet's probes and the Services come in on the pod IP
    assert {settings.port, settings.http_port} == {p["containerPort"] for p in facade["ports"]}

    triton = container(pod, TRITON[where])
    triton_env = environment(triton, objects)
    read = set()
    for source in [
        *(ROOT / "backend").rglob("*.py"),
        *(ROOT / "tritonnx" / "server").rglob("*.py"),
        ROOT / "tritonnx" / "commands" / "serve.py",
    ]:
        read |= set(re.findall(r"TRITONNX_[A-Z_]+", source.read_text()))
    unknown = {n for n in triton_env if n.startswith("TRITONNX_")} - read
    assert not unknown, f"tritonnx-serve reads no {sorted(unknown)}"
    serve = triton_settings(pod, where, objects, monkeypatch)  # every value parses
    # A port is a container port of the pod exactly when its endpoint listens beyond the pod's loopback.
    metrics_host = serve.metrics_host or serve.host
    endpoints = {serve.http_port: serve.http_host, serve.grpc_port: serve.host, serve.metrics_port: metrics_host,
                 serve.supervisor_metrics_port: metrics_host}  # fmt: skip
    declared = {p["containerPort"] for p in triton["ports"]}
    assert declared == {port for port, host in endpoints.items() if not is_loopback(host)}
    # The facade talks to this pod's Triton on loopback: one fixed server, so shared memory is used.
    host, port = settings.triton_url.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == serve.grpc_port
    # /health probes the default model: when one is set, it must be loaded (unset, the facade follows what is served).
    models = serve.load_model
    assert not settings.default_model or "*" in models or settings.default_model in models


@pytest.mark.parametrize("where", POD_IDS)
def test_resources_match_the_model_configs(where):
    pod, _, objects = pod_case(where)
    triton = container(pod, TRITON[where])
    models = tuple(environment(triton, objects).get("TRITONNX_TRITON_LOAD_MODELS", "*").split(","))
    threads = {}
    for config in MODEL_REPOSITORY.glob("*/config.pbtxt"):
        if "*" in models or config.parent.name in models:
            text = config.read_text()
            group = re.search(r"instance_group.*?count:\s*(\d+)", text, re.S)
            if group is None:
                continue  # an ensemble: it runs in tritonserver, with no instances of its own
            intra = re.search(r'"intra_op_thread_count".*?string_value:\s*"(\d+)"', text)
            # Pillow's pre-processing runs on one thread per instance.
            threads[config.parent.name] = int(group[1]) * (int(intra[1]) if intra else 1)
    assert threads, models
    requests, limits = triton["resources"]["requests"], triton["resources"]["limits"]
    # The heaviest model at full tilt is never throttled by the CPU quota.
    assert quantity(limits["cpu"]) >= max(threads.values())
    assert quantity(requests["cpu"]) <= quantity(limits["cpu"])
    # Memory: at least the measured idle PSS requested, and room above it.
    idle = IDLE_PSS_MIB[models] * 2**20
    assert quantity(requests["memory"]) >= idle * 1.4
    assert quantity(limits["memory"]) >= idle * 2.5 or quantity(limits["memory"]) >= idle + 2**30
    for c in pod["containers"]:
        for kind in ("cpu", "memory"):
            assert quantity(c["resources"]["requests"][kind]) <= quantity(c["resources"]["limits"][kind])
