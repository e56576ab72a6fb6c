"""Triton's model control as the version operations (versions.py) use it: load a model, read its versions' states.

Model control and the repository index are restricted APIs: every call carries the admin key. A
failed load's message comes without the Python traceback Triton appends to it.
"""

from __future__ import annotations

import re
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
    """ModelControl over Triton's gRPC API, model control and the repository index sent with the admin key."""

    def __init__(self, url: str, admin_key: str, load_timeout_s: float = 600.0) -> None:
        self.url = url
        self._headers = {GRPC_ADMIN_HEADER: admin_key} if admin_key else None
        self._load_timeout_s = load_timeout_s
        self._client = grpcclient.InferenceServerClient(url)

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, *args: object, **kwargs: object) -> Any:
        try:
            return getattr(self._client, method)(*args, **kwargs)
        except InferenceServerException as error:
            message = triton_message(error.message() or str(error))
            if error.status() == "StatusCode.UNAVAILABLE" and not message.startswith("load failed"):
                raise TritonUnreachable(f"cannot reach Triton at {self.url}: {message}") from None
            if "restricted" in message:
                message += " (the admin key comes from $TRITONNX_ADMIN_KEY, else from build/admin-key)"
            raise ControlError(message) from None

    def states(self, model: str) -> States:
        index = self._call("get_model_repository_index", headers=self._headers, as_json=True, client_timeout=30)
        return {
            int(entry["version"]): (entry.get("state", ""), triton_message(entry.get("reason", "")))
            for entry in index.get("models", [])
            if entry.get("name") == model and entry.get("version", "").isdigit()
        }

    def served_config(self, model: str) -> dict | None:
        if not self._call("is_model_ready", model, client_timeout=30):
            return None
        return self._call("get_model_config", model, as_json=True, client_timeout=30)["config"]

    def load(self, model: str) -> None:
        self._call("load_model", model, headers=self._headers, client_timeout=self._load_timeout_s)


def triton_message(message: str) -> str:
    return _TRACEBACK.sub("", message).strip().rstrip(";").strip()


def ready_versions(states: States) -> list[int]:
    return sorted(v for v, (state, _) in states.items() if state == READY)
