"""The one Triton client of tritonnx's own tools: administration (repository index, configs, loads) and checks.

One synchronous client, over gRPC or HTTP, for the supervisor, the version operations (versions.py),
`TritonServer`'s readiness check, `tritonnx-models`, the tritonclient scripts (`triton_health`,
`triton_infer`) and the conformance run. Model control, configs and the repository index are
restricted APIs: every call carries the admin key. Answers come as one shape of data whichever
protocol carried them (gRPC's JSON wraps the config and the index, writes int64 values as strings).
Errors come as two: `ControlError` (Triton refused or failed; its message without the Python traceback
Triton appends to a failed load's) and `TritonUnreachable` (no answer at all).
"""

from __future__ import annotations

import json
import re
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tritonnx.common.admin import ADMIN_HEADER, GRPC_ADMIN_HEADER, known_admin_key

READY = "READY"
PROTOCOLS = ("grpc", "http")
# Triton appends the Python traceback of a failed load ("\n\nAt:\n  file(line): function\n..."): not for a person.
_TRACEBACK = re.compile(r"\n+At:\n(?:\s+\S.*\n?)*")

States = dict[int, tuple[str, str]]  # version -> (state, reason), as Triton's repository index has them


class ControlError(Exception):
    """Triton refused or failed a call (its message, without tracebacks).

    `status` is the call's status as the protocol names it (`NOT_FOUND`, `404`); "" when none came.
    """

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.status = status

    def described(self) -> str:
        """`<status>: <message>`, as the scripts print it."""
        return f"{self.status}: {self}" if self.status else str(self)


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
    """tritonclient's gRPC or HTTP client with the admin key, returning plain Python data; ModelControl too.

    `timeout_s` bounds every call but loads (`load_timeout_s`); None: no bound. gRPC takes it as a
    per-call deadline, the HTTP client as connection and network timeouts. `admin_key` None: the one
    local tools find (`known_admin_key`).
    """

    def __init__(
        self,
        url: str,
        admin_key: str | None = None,
        load_timeout_s: float = 600.0,
        timeout_s: float | None = 30.0,
        protocol: str = "grpc",
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
        self.url = url
        self.protocol = protocol
        key = known_admin_key() if admin_key is None else admin_key
        self._headers = {GRPC_ADMIN_HEADER if protocol == "grpc" else ADMIN_HEADER: key} if key else None
        self._load_timeout_s = load_timeout_s
        self._timeout_s = timeout_s
        self._tensors: Any = grpcclient  # the module of the protocol's client: InferInput, InferRequestedOutput
        if protocol == "http":
            # Imported here: the HTTP client pulls gevent, which the serving processes never need.
            import tritonclient.http as httpclient

            self._tensors = httpclient
            timeouts = {} if timeout_s is None else {"connection_timeout": timeout_s, "network_timeout": timeout_s}
            self._client: Any = httpclient.InferenceServerClient(url, **timeouts)
        else:
            self._client = grpcclient.InferenceServerClient(url)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TritonControl:
        return self

    def __exit__(self, *exc_info: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _call(self, method: str, *args: object, **kwargs: object) -> Any:
        if self.protocol == "grpc":
            kwargs.setdefault("client_timeout", self._timeout_s)
        try:
            return getattr(self._client, method)(*args, **kwargs)
        except InferenceServerException as error:
            message = triton_message(error.message() or str(error))
            status = (error.status() or "").removeprefix("StatusCode.")
            if status == "UNAVAILABLE" and not message.startswith("load failed"):
                raise self._unreachable(message) from None
            if "restricted" in message:
                message += " (the admin key comes from $TRITONNX_ADMIN_KEY, else from build/admin-key)"
            raise ControlError(message, status) from None
        except TimeoutError as error:  # HTTP only; gRPC reports DEADLINE_EXCEEDED itself
            raise ControlError(f"no response within {self._timeout_s:g} s ({error})", "DEADLINE_EXCEEDED") from None
        except OSError as error:  # HTTP only: refused, unresolvable, reset
            raise self._unreachable(str(error)) from None

    def _unreachable(self, detail: str) -> TritonUnreachable:
        return TritonUnreachable(f"cannot reach Triton at {self.url} ({self.protocol}): {detail}", "UNAVAILABLE")

    def _json(self, method: str, *args: object, **kwargs: object) -> Any:
        # The gRPC client returns protobuf messages unless asked for JSON; HTTP always returns JSON.
        if self.protocol == "grpc":
            kwargs["as_json"] = True
        return self._call(method, *args, **kwargs)

    def server_live(self) -> bool:
        """Liveness; also the reachability probe, so no answer in time means unreachable."""
        try:
            return bool(self._call("is_server_live"))
        except ControlError as error:
            if error.status == "DEADLINE_EXCEEDED":
                raise self._unreachable(str(error)) from None
            raise

    def server_ready(self) -> bool:
        return bool(self._call("is_server_ready"))

    def server_metadata(self) -> dict:
        return self._json("get_server_metadata")

    def index(self) -> list[dict]:
        """The repository index: name, version, state and reason of every model Triton knows."""
        index = self._json("get_model_repository_index", headers=self._headers)
        return index.get("models", []) if self.protocol == "grpc" else index

    def states(self, model: str) -> States:
        return {
            int(entry["version"]): (entry.get("state", ""), triton_message(entry.get("reason", "")))
            for entry in self.index()
            if entry.get("name") == model and entry.get("version", "").isdigit()
        }

    def ready(self, model: str, version: str = "") -> bool:
        return bool(self._call("is_model_ready", model, version))

    def metadata(self, model: str) -> dict:
        """The model's metadata with integer shapes and every key present."""
        return normalize_metadata(self._json("get_model_metadata", model))

    def config(self, model: str, version: str = "") -> dict:
        """The config Triton serves (or loads) the model with: config.pbtxt auto-completed."""
        config = self._json("get_model_config", model, version, headers=self._headers)
        return config.get("config", {}) if self.protocol == "grpc" else config

    def served_config(self, model: str, version: str = "") -> dict | None:
        return self.config(model, version) if self.ready(model, version) else None

    def load(self, model: str, config: dict | None = None) -> None:
        """Load the model from its folder, with `config` in place of its config.pbtxt when given."""
        override = {} if config is None else {"config": json.dumps(config)}
        timeout = {"client_timeout": self._load_timeout_s} if self.protocol == "grpc" else {}
        self._call("load_model", model, headers=self._headers, **timeout, **override)

    def unload(self, model: str) -> None:
        self._call("unload_model", model, headers=self._headers)

    def infer(
        self, model: str, inputs: dict[str, np.ndarray], datatypes: dict[str, str], output_names: list[str]
    ) -> tuple[dict[str, np.ndarray], str]:
        """One request with every tensor sent as binary data; returns (outputs, model version).

        `datatypes` holds each input's Triton datatype from the model metadata: the array's dtype
        cannot tell BF16 (sent from float32 arrays) from FP32.
        """
        tensors = self._tensors
        binary = {"binary_data": True} if self.protocol == "http" else {}  # gRPC always sends raw bytes
        infer_inputs = []
        for name, array in inputs.items():
            infer_input = tensors.InferInput(name, list(array.shape), datatypes[name])
            infer_input.set_data_from_numpy(array, **binary)
            infer_inputs.append(infer_input)
        requested = [tensors.InferRequestedOutput(name, **binary) for name in output_names]
        result = self._call("infer", model, infer_inputs, outputs=requested)
        response = result.get_response(as_json=True) if self.protocol == "grpc" else result.get_response()
        outputs = {name: result.as_numpy(name) for name in output_names}
        return outputs, str(response.get("model_version", ""))


def triton_message(message: str) -> str:
    return _TRACEBACK.sub("", message).strip().rstrip(";").strip()


def ready_versions(states: States) -> list[int]:
    return sorted(v for v, (state, _) in states.items() if state == READY)


def _int_shape(shape: list) -> list[int]:
    return [int(d) for d in shape]  # gRPC's JSON renders int64 dims as strings


def normalize_metadata(metadata: dict) -> dict:
    """Model metadata with integer shapes and every key present, whichever protocol sent it."""
    return {
        "name": metadata["name"],
        "versions": list(metadata.get("versions", [])),
        "platform": metadata.get("platform", ""),
        "inputs": [
            {"name": t["name"], "datatype": t["datatype"], "shape": _int_shape(t.get("shape", []))}
            for t in metadata.get("inputs", [])
        ],
        "outputs": [
            {"name": t["name"], "datatype": t["datatype"], "shape": _int_shape(t.get("shape", []))}
            for t in metadata.get("outputs", [])
        ],
    }
