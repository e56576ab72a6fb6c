"""deploy/k8s's Services, replicas, HPA on Triton's queue (with the prometheus-adapter rules), PDB and NetworkPolicy."""

from __future__ import annotations

import re

import pytest

from tests.manifests import (
    K8S_OVERLAYS,
    POD_IDS,
    TRITON_METRICS,
    _selects,
    adapter_rules,
    container,
    deployment_pod,
    environment,
    one,
    pod_case,
    port_number,
    rendered,
)

# --- kustomize: Services, replicas, HPA, PDB -------------------------------------------------


@pytest.mark.parametrize("where", POD_IDS)
def test_facade_service_is_headless_grpc_and_reaches_the_pods(where):
    pod, labels, objects = pod_case(where)
    service = one(objects, "Service", "tritonnx-facade")
    assert service["spec"]["clusterIP"] == "None"
    assert _selects(service["spec"]["selector"], labels)
    grpc = [p for p in service["spec"]["ports"] if p["port"] == 50051]
    assert len(grpc) == 1 and grpc[0]["name"].startswith("grpc-")
    assert port_number(container(pod, "facade"), grpc[0]["targetPort"]) == 50051


@pytest.mark.parametrize("overlay", K8S_OVERLAYS)
def test_triton_service_exposes_triton_and_facade_metrics_named_by_protocol(overlay):
    objects = rendered(overlay)
    pod = deployment_pod(objects)
    labels = one(objects, "Deployment", "tritonnx")["spec"]["template"]["metadata"]["labels"]
    service = one(objects, "Service", "tritonnx-triton")
    assert service["spec"].get("clusterIP") != "None"
    assert _selects(service["spec"]["selector"], labels)
    ports = {p["port"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {8000, 8001, 8002, 8003, 3000}
    by_container = {p["containerPort"]: c for c in pod["containers"] for p in c["ports"]}
    for number, port in ports.items():
        assert port["name"].split("-")[0] in ("grpc", "http"), port["name"]
        assert port_number(by_container[number], port["targetPort"]) == number
    for c in pod["containers"]:
        for p in c["ports"]:
            assert p["name"].split("-")[0] in ("grpc", "http"), p["name"]


def test_dev_runs_one_small_pod():
    objects = rendered("k8s/overlays/dev")
    assert one(objects, "Deployment", "tritonnx")["spec"]["replicas"] == 1
    assert not [o for o in objects if o["kind"] in ("HorizontalPodAutoscaler", "PodDisruptionBudget")]
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {"tritonnx-dev"}


def test_production_scales_on_tritons_queue_with_a_disruption_budget():
    objects = rendered("k8s/overlays/production")
    deployment = one(objects, "Deployment", "tritonnx")
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {"tritonnx"}
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tritonnx"}
    assert hpa["spec"]["minReplicas"] >= 3
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable") == hpa["spec"]["minReplicas"] - 1
    assert _selects(pdb["spec"]["selector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"])
    assert deployment["spec"]["selector"]["matchLabels"] == pdb["spec"]["selector"]["matchLabels"]
    facade_env = environment(container(deployment_pod(objects), "facade"), objects)
    assert facade_env["TRITONNX_REFLECTION"] == "0"


def test_production_keeps_tritons_ports_to_its_namespace():
    """Triton's inference APIs need no key: only the facade's port is open to every namespace."""
    objects = rendered("k8s/overlays/production")
    labels = one(objects, "Deployment", "tritonnx")["spec"]["template"]["metadata"]["labels"]
    policy = one(objects, "NetworkPolicy")
    assert _selects(policy["spec"]["podSelector"]["matchLabels"], labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        sources = rule.get("from", [])
        if not sources:
            assert ports == {50051}, "only the facade's gRPC port is open to all"
        else:
            assert all(s.get("namespaceSelector") is None or ports <= {8002, 8003, 3000} for s in sources)
    open_ports = {p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]}
    assert open_ports == {50051, 8000, 8001, 8002, 8003, 3000}


def test_prometheus_adapter_rules_expose_per_pod_metrics_of_triton():
    rules = adapter_rules()
    names = [rule["name"]["as"] for rule in rules]
    assert len(names) == len(set(names)) and all(n.startswith("tritonnx_") for n in names)
    for rule in rules:
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        used = set(re.findall(r"\bnv_[a-z_]+", rule["seriesQuery"] + rule["metricsQuery"]))
        assert used and used <= TRITON_METRICS, used - TRITON_METRICS
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]
        assert re.search(rule["name"]["matches"], re.search(r"nv_[a-z_]+", rule["seriesQuery"])[0])


@pytest.mark.parametrize("where", ["k8s/overlays/production", "kserve"])
def test_hpa_uses_metrics_the_adapter_serves_and_targets_the_pods_deployment(where):
    objects = rendered(where)
    hpa = one(objects, "HorizontalPodAutoscaler")
    served = {rule["name"]["as"] for rule in adapter_rules()}
    metrics = hpa["spec"]["metrics"]
    assert metrics and all(m["type"] == "Pods" for m in metrics)
    assert {m["pods"]["metric"]["name"] for m in metrics} <= served
    assert "tritonnx_pending_requests" in {m["pods"]["metric"]["name"] for m in metrics}
    target = hpa["spec"]["scaleTargetRef"]
    assert target["kind"] == "Deployment" and target["apiVersion"] == "apps/v1"
    if where == "kserve":
        isvc = one(objects, "InferenceService")
        assert target["name"] == f"{isvc['metadata']['name']}-predictor"  # KServe's name in Standard mode
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    else:
        one(objects, "Deployment", target["name"])
