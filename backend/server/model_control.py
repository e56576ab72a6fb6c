"""Triton's administrative gRPC API, as the server operations use it: the repository index, model configs, loads.

One synchronous client for the supervisor, the version operations (versions.py), `TritonServer`'s
readiness check and the conformance run. Model control, configs and the repository index are
restricted APIs: every call carries the admin key. A failed load's message comes without the
Python traceback Triton appends to it.
"""

from __future__ import annotations

import json
import re
from types import TracebackType
from typing import Any, Protocol

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from backend.server.admin import GRPC_ADMIN_HEADER

READY = "READY"
# Triton appends the Python traceback of a failed load ("\n\nAt:\n  file(line): function\n..."): not for a person.
_TRACEBACK = re.compile(r"\n+At:\n(?:\s+\S.*\n?)*")

States = dict[int, tuple[str, str]]  # version -> (state, reason), as Triton's repository index has them


class ControlError(Exception):
    """Triton refused or failed a call (its message, without tracebacks)."""


class TritonUnreachable(ControlError):
    """No answer from Triton at all."""


class ModelControl(Protocol):
    """What the operations need of Triton."""

    def states(self, model: str) -> States:
        """Every version of the model Triton knows: version -> (state, reason)."""

    def served_config(self, model: str) -> dict | None:
        """The config of the version serving requests that name none; None when no version is ready."""

    def load(self, model: str) -> None:
        """Load the model as its folder and config.pbtxt stand; ControlError if Triton refuses or fails."""


class TritonControl:
    """Triton's administrative gRPC API with the admin key; ModelControl for the version operations.

    Triton's refusals raise ControlError, no answer at all TritonUnreachable.
    """

    def __init__(self, url: str, admin_key: str, load_timeout_s: float = 600.0, timeout_s: float = 30.0) -> None:
        self.url = url
        self._headers = {GRPC_ADMIN_HEADER: admin_key} if admin_key else None
        self._load_timeout_s = load_timeout_s
        self._timeout_s = timeout_s
        self._client = grpcclient.InferenceServerClient(url)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TritonControl:
        return self

    def __exit__(self, *exc_info: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _call(self, method: str, *args: object, **kwargs: object) -> Any:
        kwargs.setdefault("client_timeout", self._timeout_s)
        try:
            return getattr(self._client, method)(*args, **kwargs)
        except InferenceServerException as error:
            message = triton_message(error.message() or str(error))
            if error.status() == "StatusCode.UNAVAILABLE" and not message.startswith("load failed"):
                raise TritonUnreachable(f"cannot reach Triton at {self.url}: {message}") from None
            if "restricted" in message:
                message += " (the admin key comes from $TRITONNX_ADMIN_KEY, else from build/admin-key)"
            raise ControlError(message) from None

    def index(self) -> list[dict]:
        """The repository index: name, version, state and reason of every model Triton knows."""
        return self._call("get_model_repository_index", headers=self._headers, as_json=True).get("models", [])

    def states(self, model: str) -> States:
        return {
            int(entry["version"]): (entry.get("state", ""), triton_message(entry.get("reason", "")))
            for entry in self.index()
            if entry.get("name") == model and entry.get("version", "").isdigit()
        }

    def ready(self, model: str, version: str = "") -> bool:
        return bool(self._call("is_model_ready", model, version))

    def config(self, model: str, version: str = "") -> dict:
        """The config Triton serves (or loads) the model with: config.pbtxt auto-completed."""
        return self._call("get_model_config", model, version, headers=self._headers, as_json=True)["config"]

    def served_config(self, model: str, version: str = "") -> dict | None:
        return self.config(model, version) if self.ready(model, version) else None

    def load(self, model: str, config: dict | None = None) -> None:
        """Load the model from its folder, with `config` in place of its config.pbtxt when given."""
        override = {} if config is None else {"config": json.dumps(config)}
        self._call("load_model", model, headers=self._headers, client_timeout=self._load_timeout_s, **override)

    def unload(self, model: str) -> None:
        self._call("unload_model", model, headers=self._headers)


def triton_message(message: str) -> str:
    return _TRACEBACK.sub("", message).strip().rstrip(";").strip()


def ready_versions(states: States) -> list[int]:
    return sorted(v for v, (state, _) in states.items() if state == READY)
