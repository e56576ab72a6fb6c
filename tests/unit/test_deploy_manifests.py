"""Every object deploy/ renders is valid for Kubernetes (or KServe's CRDs), and the validator refuses broken ones."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.manifests import (
    DEPLOY,
    IMAGE,
    K8S_OVERLAYS,
    KUBERNETES_VERSIONS,
    KUSTOMIZATIONS,
    POD_IDS,
    ManifestError,
    pod_case,
    render,
    rendered,
    validate_kubernetes,
    validate_object,
)

# --- every object is valid -------------------------------------------------------------------


def test_every_deploy_folder_with_a_kustomization_is_covered():
    assert set(KUSTOMIZATIONS) >= {
        "k8s/base",
        *K8S_OVERLAYS,
        "k8s/prometheus-adapter",
        "kserve",
        "kserve/models",
    }


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_rendered_objects_are_valid(folder):
    objects = rendered(folder)
    assert objects, f"{folder} renders nothing"
    for obj in objects:
        validate_object(obj)
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), f"duplicate objects in {folder}"


@pytest.mark.parametrize("where", POD_IDS)
def test_the_pod_kserve_builds_is_a_valid_pod(where):
    pod, labels, _ = pod_case(where)
    validate_kubernetes({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": labels}, "spec": pod})


# The validator itself: each of these must be refused.
GOOD_DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "d"},
    "spec": {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": IMAGE}]}},
    },
}


def _broken(change) -> dict[str, Any]:
    obj = copy.deepcopy(GOOD_DEPLOYMENT)
    change(obj)
    return obj


BROKEN = {
    "unknown container field": _broken(lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagee="x")),
    "replicas not a number": _broken(lambda d: d["spec"].update(replicas="three")),
    "missing selector": _broken(lambda d: d["spec"].pop("selector")),
    "unknown metadata field": _broken(lambda d: d["metadata"].update(label={"a": "b"})),
    "unknown kind": {"apiVersion": "v1", "kind": "Servize", "metadata": {"name": "s"}, "spec": {}},
    "unknown apiVersion": {**GOOD_DEPLOYMENT, "apiVersion": "apps/v2"},
    "Service with a bad clusterIP type": {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"clusterIP": None, "ports": [{"port": "50051"}]},
    },
    "HPA metric without a target": {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "h"},
        "spec": {
            "scaleTargetRef": {"kind": "Deployment", "name": "d"},
            "maxReplicas": 3,
            "metrics": [{"type": "Pods", "pods": {"metric": {"name": "m"}}}],
        },
    },
    "ServingRuntime with an unknown field": {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": "r"},
        "spec": {"containers": [{"name": "kserve-container", "image": IMAGE}], "multiModels": False},
    },
    "ServingRuntime container with an unknown field": {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": "r"},
        "spec": {"containers": [{"name": "kserve-container", "image": IMAGE, "argz": []}]},
    },
    "InferenceService with a string for a number": {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "i"},
        "spec": {"predictor": {"minReplicas": "two", "model": {"modelFormat": {"name": "onnx"}}}},
    },
    "InferenceService without a model format name": {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "i"},
        "spec": {"predictor": {"model": {"modelFormat": {}}}},
    },
    "InferenceService with bad metadata": {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "i", "annotations": {"a": 1}},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}}}},
    },
    "a KServe kind without a vendored CRD": {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "InferenceGraph",
        "metadata": {"name": "g"},
        "spec": {},
    },
    "not an object": {"kind": "Deployment"},
}


def test_the_validator_takes_a_good_object():
    validate_object(GOOD_DEPLOYMENT)
    validate_object(
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": "i"},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}}}},
        }
    )


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_the_validator_refuses_a_broken_object(case):
    with pytest.raises(ManifestError):
        validate_object(BROKEN[case])


def test_kubernetes_validate_command_line_only_warns_about_an_unknown_kind(tmp_path):
    """Why the validation above uses the library and fails on SchemaNotFoundError itself."""
    manifest = tmp_path / "unknown.yaml"
    manifest.write_text(yaml.safe_dump(BROKEN["unknown kind"]))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", KUBERNETES_VERSIONS[0], str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "WARN" in result.stdout, (result.returncode, result.stdout)
    with pytest.raises(ManifestError, match="Couldn't find schema"):
        validate_object(BROKEN["unknown kind"])


def test_a_broken_kustomization_fails_to_render(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(ManifestError, match="kubectl kustomize"):
        render(tmp_path)


def test_a_typo_in_the_base_fails_validation(tmp_path):
    """A copy of deploy/k8s with one misspelt field: it renders, and validation catches it."""
    shutil.copytree(DEPLOY / "k8s", tmp_path / "k8s")
    deployment = tmp_path / "k8s" / "base" / "deployment.yaml"
    text = deployment.read_text()
    assert "readOnlyRootFilesystem: true" in text
    deployment.write_text(text.replace("readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true", 1))
    objects = render(tmp_path / "k8s" / "overlays" / "production")
    with pytest.raises(ManifestError, match="Deployment/tritonnx.*readOnlyRootFileSystem"):
        for obj in objects:
            validate_object(obj)
