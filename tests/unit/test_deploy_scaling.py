"""deploy/k8s's Services, replicas, HPA on Triton's queue (with the prometheus-adapter rules) and PDB
(the NetworkPolicies: test_deploy_network.py)."""

from __future__ import annotations

import re

import pytest

from tests.manifests import (
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


@pytest.mark.parametrize("where", POD_IDS)
def test_container_ports_are_named_by_protocol(where):
    pod, _, _ = pod_case(where)
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
