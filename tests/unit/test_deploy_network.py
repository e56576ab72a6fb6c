"""Triton is reachable only through the facade: loopback inside the pod, no Service, NetworkPolicies that keep out
every pod but the metrics scraper, and a facade that wants its token; KServe publishes Triton to its ingress only."""

from __future__ import annotations

from typing import Any

import pytest

from tests.manifests import (
    K8S_OVERLAYS,
    TRITON,
    container,
    environment,
    facade_settings_from,
    is_loopback,
    kserve_pod,
    one,
    pod_case,
    rendered,
    triton_settings,
)
from tests.network_policies import Peer, admits, selects

K8S = ["k8s/base", *K8S_OVERLAYS]
FACADE_GRPC, METRICS = 50051, (8002, 8003, 3000)


def template(where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pod template (metadata with the namespace, and spec) of `where`, and the objects rendered with it."""
    objects = rendered(where)
    if where == "kserve":
        pod, labels = kserve_pod(objects)
        return {"metadata": {"labels": labels}, "spec": pod}, objects
    deployment = one(objects, "Deployment", "tritonnx")
    pod = deployment["spec"]["template"]
    namespace = deployment["metadata"].get("namespace", "default")
    return {"metadata": {**pod["metadata"], "namespace": namespace}, "spec": pod["spec"]}, objects


def sources(target: dict[str, Any]) -> dict[str, Peer]:
    namespace = target["metadata"].get("namespace", "default")
    return {
        "a pod of the namespace": Peer.of(namespace, app="client"),
        "another tritonnx pod": Peer.of(namespace, **target["metadata"]["labels"]),
        "a pod of the namespace labelled as Prometheus": Peer.of(namespace, **{"app.kubernetes.io/name": "prometheus"}),
        "Prometheus": Peer.of("monitoring", **{"app.kubernetes.io/name": "prometheus"}),
        "another pod of monitoring": Peer.of("monitoring", **{"app.kubernetes.io/name": "grafana"}),
        "a pod of another namespace": Peer.of("elsewhere", app="client"),
        "the ingress gateway": Peer.of("istio-system", istio="ingressgateway"),
    }


def who_reaches(where: str, monkeypatch: pytest.MonkeyPatch) -> dict[int, set[str]]:
    """Each port of the pod that matters (Triton's HTTP and gRPC, metrics, the facade's) -> the sources admitted."""
    target, objects = template(where)
    triton = triton_settings(target["spec"], where, objects, monkeypatch)
    ports = [triton.http_port, triton.grpc_port, FACADE_GRPC, *METRICS]
    peers = sources(target)
    return {port: {name for name, peer in peers.items() if admits(objects, target, peer, port)} for port in ports}


@pytest.mark.parametrize("where", K8S)
def test_no_pod_reaches_tritons_ports_and_only_prometheus_its_metrics(where, monkeypatch):
    reach = who_reaches(where, monkeypatch)
    everyone = set(sources(template(where)[0]))
    assert reach == {8000: set(), 8001: set(), FACADE_GRPC: everyone, **dict.fromkeys(METRICS, {"Prometheus"})}


def test_kserve_publishes_triton_to_its_ingress_gateway_only(monkeypatch):
    reach = who_reaches("kserve", monkeypatch)
    everyone = set(sources(template("kserve")[0]))
    assert reach == {
        8000: {"the ingress gateway"},
        8001: {"the ingress gateway"},
        FACADE_GRPC: everyone,
        **dict.fromkeys(METRICS, {"Prometheus"}),
    }


@pytest.mark.parametrize("where", K8S)
def test_triton_listens_on_the_pods_loopback_and_its_metrics_on_the_pod_ip(where, monkeypatch):
    target, objects = template(where)
    pod = target["spec"]
    settings = triton_settings(pod, where, objects, monkeypatch)
    assert is_loopback(settings.host) and is_loopback(settings.http_host)
    assert settings.metrics_host and not is_loopback(settings.metrics_host)  # Prometheus scrapes the pod IP
    # The facade reaches it over the pod's loopback; the pod declares no port for Triton's inference endpoints.
    facade = facade_settings_from(environment(container(pod, "facade"), objects), monkeypatch)
    host, port = facade.triton_url.rsplit(":", 1)
    assert is_loopback(host) and int(port) == settings.grpc_port
    declared = {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
    assert declared.isdisjoint({settings.http_port, settings.grpc_port})


@pytest.mark.parametrize("where", [*K8S, "kserve"])
def test_no_service_of_the_manifests_carries_tritons_ports(where, monkeypatch):
    target, objects = template(where)
    settings = triton_settings(target["spec"], where, objects, monkeypatch)
    triton = container(target["spec"], TRITON[where])
    named = {p["name"]: p["containerPort"] for p in triton.get("ports", [])}
    services = [
        s for s in objects if s["kind"] == "Service" and selects(s["spec"]["selector"], target["metadata"]["labels"])
    ]
    assert services, "no Service selects the pods"
    for service in services:
        for port in service["spec"]["ports"]:
            number = named.get(port["targetPort"], port["targetPort"])
            assert number not in (settings.http_port, settings.grpc_port), (service["metadata"]["name"], port)


def test_kserve_publishes_tritons_endpoints_only_because_its_runtime_says_so(monkeypatch):
    """KServe's predictor Service takes kserve-container's ports: Triton listens on the pod IP there, asked for."""
    target, objects = template("kserve")
    env = environment(container(target["spec"], "kserve-container"), objects)
    assert not is_loopback(env["TRITONNX_TRITON_HOST"]) and not is_loopback(env["TRITONNX_TRITON_HTTP_HOST"])
    settings = triton_settings(target["spec"], "kserve", objects, monkeypatch)
    assert (settings.host, settings.http_host) == (env["TRITONNX_TRITON_HOST"], env["TRITONNX_TRITON_HTTP_HOST"])


@pytest.mark.parametrize("where", ["k8s/overlays/production", "k8s/overlays/production-tls", "kserve"])
def test_the_facade_requires_its_token(where, monkeypatch):
    pod, _, objects = pod_case(where)
    env = environment(container(pod, "facade"), objects)
    token = env["TRITONNX_AUTH_TOKEN"]
    assert isinstance(token, dict) and not token["secretKeyRef"].get("optional"), "without the Secret the pod waits"
    settings = facade_settings_from(env, monkeypatch)
    assert not is_loopback(settings.host) and not settings.allow_unauthenticated


def test_dev_serves_without_a_token_only_because_it_says_so(monkeypatch):
    pod, _, objects = pod_case("k8s/overlays/dev")
    env = environment(container(pod, "facade"), objects)
    assert env["TRITONNX_AUTH_TOKEN"]["secretKeyRef"]["optional"] is True  # a token when the Secret exists
    assert facade_settings_from(env, monkeypatch).allow_unauthenticated


def test_production_tls_serves_the_facade_with_the_certificate_of_a_mounted_secret(monkeypatch):
    pod, _, objects = pod_case("k8s/overlays/production-tls")
    facade = container(pod, "facade")
    settings = facade_settings_from(environment(facade, objects), monkeypatch)
    volumes = {v["name"]: v for v in pod["volumes"]}
    files: dict[str, str] = {}
    for mount in facade["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is not None:
            assert mount["readOnly"] is True
            assert secret["defaultMode"] & 0o077 == 0o040, "readable by the pod's group (fsGroup), by no one else"
            files |= {f"{mount['mountPath']}/{key}": secret["secretName"] for key in ("tls.crt", "tls.key")}
    assert files.get(settings.tls_cert) == files.get(settings.tls_key) == "tritonnx-tls"  # keys of a kubernetes.io/tls
    triton = container(pod, "triton")
    assert "tls" not in {m["name"] for m in triton["volumeMounts"]}  # the key stays out of Triton's container


# --- the evaluator itself --------------------------------------------------------------------

POD = {
    "metadata": {"namespace": "ns", "labels": {"app": "tritonnx"}},
    "spec": {"containers": [{"name": "c", "ports": [{"name": "grpc-triton", "containerPort": 8001}]}]},
}


def policy(ingress: list[dict[str, Any]], selector: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = {"podSelector": {"matchLabels": {"app": "tritonnx"}} if selector is None else selector, "ingress": ingress}
    return {"kind": "NetworkPolicy", "metadata": {"namespace": "ns"}, "spec": spec}


NEIGHBOUR, OUTSIDER = Peer.of("ns", app="client"), Peer.of("other", app="client")


def test_the_evaluator_admits_what_kubernetes_admits():
    # The policy production had: Triton's ports open to every pod of the namespace.
    old = policy([{"from": [{"podSelector": {}}], "ports": [{"port": 8000}, {"port": 8001}]}])
    assert admits([old], POD, NEIGHBOUR, 8001) and not admits([old], POD, OUTSIDER, 8001)
    assert not admits([old], POD, NEIGHBOUR, 8002)
    assert admits([], POD, OUTSIDER, 8001), "a pod no policy selects takes every connection"
    other_pods = policy([], selector={"matchLabels": {"app": "else"}})
    assert admits([other_pods], POD, OUTSIDER, 8001)
    deny_all = policy([], selector={})
    assert not admits([deny_all], POD, NEIGHBOUR, 8001)
    named = policy([{"ports": [{"port": "grpc-triton"}]}])
    assert admits([named], POD, OUTSIDER, 8001) and not admits([named], POD, OUTSIDER, 8000)
    ranged = policy([{"ports": [{"port": 8000, "endPort": 8003}, {"port": 50051, "protocol": "UDP"}]}])
    assert admits([ranged], POD, OUTSIDER, 8003) and not admits([ranged], POD, OUTSIDER, 50051)
    both = policy([{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}},
                              "podSelector": {"matchExpressions": [{"key": "app", "operator": "In",
                                                                    "values": ["client"]}]}}]}])  # fmt: skip
    assert admits([both], POD, OUTSIDER, 8001)
    assert not admits([both], POD, NEIGHBOUR, 8001) and not admits([both], POD, Peer.of("other", app="x"), 8001)
    assert admits([deny_all, old], POD, NEIGHBOUR, 8000), "policies add up"
