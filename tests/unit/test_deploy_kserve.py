"""deploy/kserve: the ServingRuntime runs tritonnx-serve on what KServe mounts and takes the flags KServe adds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.manifests import (
    DEMO_IMAGE,
    DEPLOY,
    IMAGE,
    UID,
    ManifestError,
    _selects,
    container,
    kserve_pod,
    one,
    rendered,
    serve_arguments,
)

# --- KServe ----------------------------------------------------------------------------------


def test_kserve_runtime_runs_the_supervisor_on_the_models_kserve_mounts(monkeypatch):
    objects = rendered("kserve")
    runtime = one(objects, "ServingRuntime")
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    assert spec.get("multiModel") is False
    main = container({"containers": spec["containers"]}, "kserve-container")
    assert main["image"] == IMAGE  # no demo models baked in: the runtime serves what KServe mounts
    assert "transformer-container" not in [c["name"] for c in spec["containers"]], "KServe would append flags to it"
    pod, _ = kserve_pod(objects)
    args = container(pod, "kserve-container")["args"]  # the runtime's, then the model's
    assert args[0] == "tritonnx-serve" and "--no-facade" in args
    repository, models = serve_arguments(args[1:], monkeypatch)
    assert repository == Path("/mnt/models")  # where KServe puts storageUri
    assert models == ("*",)
    assert main["ports"][0]["containerPort"] == 8000  # the predictor Service's port 80: KServe v2 REST


def test_image_default_command_is_accepted_by_tritonnx_serve(monkeypatch):
    dockerfile = (DEPLOY / "docker" / "Dockerfile.cpu").read_text()
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M)[1])
    assert cmd[0] == "tritonnx-serve"
    monkeypatch.setenv("TRITONNX_MODEL_REPOSITORY", "/models")
    repository, _ = serve_arguments(cmd[1:], monkeypatch)
    assert repository == Path("/models")


def test_kserve_style_model_args_after_the_runtimes_are_taken(monkeypatch):
    """KServe appends an InferenceService's `model.args` to the runtime's: its usual spellings work."""
    pod, _ = kserve_pod(rendered("kserve"))
    runtime_args = container(pod, "kserve-container")["args"][1:]
    kserve_args = ["--model_name", "tritonnx", "--model_dir", "/mnt/other", "--http_port", "8000"]
    repository, models = serve_arguments(
        [*runtime_args, *kserve_args, "--grpc_port=8001", "--workers", "2"], monkeypatch
    )
    assert repository == Path("/mnt/other")  # the last one given wins, as argparse does
    assert models == ("*",)


def test_tritonnx_serve_check_refuses_an_unknown_flag(monkeypatch):
    with pytest.raises(ManifestError, match="refuses"):
        serve_arguments(["--no-facade", "--no-such-flag"], monkeypatch)


def test_inference_service_uses_the_runtime_and_a_model_repository_pvc():
    objects = rendered("kserve")
    runtime = one(objects, "ServingRuntime")
    isvc = one(objects, "InferenceService")
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] in ("Standard", "RawDeployment")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert "args" not in model, "KServe appends a model's args to tritonnx-serve's"
    match = re.fullmatch(r"pvc://([^/]+)/(.+)", model["storageUri"])
    assert match, model["storageUri"]
    models = rendered("kserve/models")
    one(models, "PersistentVolumeClaim", match[1])
    job = one(models, "Job")
    copy_pod = job["spec"]["template"]["spec"]
    assert copy_pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == match[1]
    assert f"/pvc/{match[2]}" in " ".join(copy_pod["containers"][0]["args"])
    assert copy_pod["containers"][0]["image"] == DEMO_IMAGE
    assert copy_pod["securityContext"]["runAsUser"] == UID


def test_kserve_pdb_selects_the_predictor_pods():
    objects = rendered("kserve")
    _, labels = kserve_pod(objects)
    pdb = one(objects, "PodDisruptionBudget")
    assert _selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["maxUnavailable"] == 1
