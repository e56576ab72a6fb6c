"""Rendered NetworkPolicies evaluated as Kubernetes does: `admits` says whether a connection from a pod with given
labels reaches a port of a pod."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.manifests import ManifestError


@dataclasses.dataclass(frozen=True)
class Peer:
    """A pod opening a connection: its namespace and labels (its namespace's labels: the name label Kubernetes sets)."""

    namespace: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, namespace: str, **labels: str) -> Peer:
        return cls(namespace, tuple(sorted(labels.items())))

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against labels; the empty selector selects everything."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        held = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}  # fmt: skip
        if not held[operator]:
            return False
    return True


def _namespace(obj: dict[str, Any]) -> str:
    return obj["metadata"].get("namespace", "default")


def _policy_types(policy: dict[str, Any]) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])]


def _port_matches(ports: list[dict[str, Any]] | None, port: int, containers: list[dict[str, Any]]) -> bool:
    if not ports:
        return True  # no ports: every port
    for entry in ports:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, str):  # a named port: the target pod's container port of that name
            numbers = [p["containerPort"] for c in containers for p in c.get("ports", []) if p.get("name") == wanted]
            if port in numbers:
                return True
        elif wanted <= port <= entry.get("endPort", wanted):
            return True
    return False


def _peer_matches(peers: list[dict[str, Any]] | None, policy_namespace: str, source: Peer) -> bool:
    if not peers:
        return True  # no `from`: every source
    for peer in peers:
        if "ipBlock" in peer:
            raise ManifestError("ipBlock peers are not evaluated: the policies here select pods")
        pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
        in_namespace = (
            selects(namespaces, source.namespace_labels) if namespaces is not None
            else source.namespace == policy_namespace
        )  # fmt: skip
        if in_namespace and (pods is None or selects(pods, dict(source.labels))):
            return True
    return False


def admits(objects: list[dict[str, Any]], target: dict[str, Any], source: Peer, port: int) -> bool:
    """Whether the NetworkPolicies among `objects` let `source` open TCP `port` on the pod of template `target`.

    As Kubernetes decides it: a pod no Ingress policy selects takes every connection; one that some select takes a
    connection any rule of those policies admits (ports, and the peers of `from`). Traffic inside a pod (loopback)
    and the kubelet's probes are never filtered, so they are not asked about here.
    """
    namespace, labels = _namespace(target), target["metadata"].get("labels", {})
    containers = target["spec"]["containers"]
    policies = [
        p for p in objects
        if p["kind"] == "NetworkPolicy" and _namespace(p) == namespace and "Ingress" in _policy_types(p)
        and selects(p["spec"]["podSelector"], labels)
    ]  # fmt: skip
    if not policies:
        return True
    return any(
        _port_matches(rule.get("ports"), port, containers) and _peer_matches(rule.get("from"), _namespace(p), source)
        for p in policies
        for rule in p["spec"].get("ingress", [])
    )
