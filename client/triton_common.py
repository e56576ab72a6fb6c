"""What `triton_health` and `triton_infer` share: URL defaults, one client for both protocols, and error messages.

tritonclient's gRPC and HTTP clients have the same methods but answer differently (gRPC JSON
carries int64 values as strings and leaves default fields out, the config comes wrapped in
`{"config": ...}`, a refused connection is an InferenceServerException on one and an OSError on
the other). `TritonClient` hides those differences so the scripts deal with one shape of data.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from backend.server.admin import ADMIN_HEADER, GRPC_ADMIN_HEADER, known_admin_key
from backend.server.ports import TRITON_HTTP, local
from client.facade.settings import FacadeSettings, env_name

PROTOCOLS = ("grpc", "http")

# protocol -> (environment variable, fallback). The gRPC address is the facade's setting of the same name
# (TRITONNX_TRITON_URL); the ports are tritonserver's defaults.
TRITON_URL_ENV = env_name("triton_url")
TRITON_HTTP_URL_ENV = env_name("triton_http_url")
_URL_DEFAULTS = {
    "grpc": (TRITON_URL_ENV, FacadeSettings.triton_url),
    "http": (TRITON_HTTP_URL_ENV, local(TRITON_HTTP)),
}

URL_HELP_EPILOG = (
    f"Without --url the address comes from ${TRITON_URL_ENV} (gRPC, default {FacadeSettings.triton_url}) or\n"
    f"${TRITON_HTTP_URL_ENV} (HTTP, default {local(TRITON_HTTP)}). The repository index is a restricted API:\n"
    "its key comes from $TRITONNX_ADMIN_KEY, else from build/admin-key (written by make serve)."
)


class ServerUnreachable(Exception):
    """No connection to the server could be made (refused, unresolvable, no answer)."""

    def __init__(self, url: str, protocol: str, detail: str) -> None:
        super().__init__(f"cannot reach Triton at {url} ({protocol}): {detail}")


def default_url(protocol: str) -> str:
    env_var, fallback = _URL_DEFAULTS[protocol]
    return os.environ.get(env_var) or fallback


def _host_port(value: str) -> str:
    # Both clients want host:port; the HTTP client rejects a scheme and the gRPC one would try to
    # resolve it as a host name, so say so at parse time instead.
    if "://" in value:
        raise argparse.ArgumentTypeError(f"give host:port without a scheme, not {value!r}")
    return value


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=_host_port,
        metavar="HOST:PORT",
        help="server address (default: from the environment, see below)",
    )
    parser.add_argument("--protocol", choices=PROTOCOLS, default="grpc", help="protocol to talk (default: grpc)")


def resolve_url(args: argparse.Namespace) -> str:
    """The --url given, else the default for the chosen protocol."""
    return args.url or default_url(args.protocol)


def describe_error(exc: InferenceServerException) -> str:
    """The error as `<status>: <message>`.

    gRPC statuses lose their `StatusCode.` prefix so that both protocols read alike (`NOT_FOUND` / `404`).
    """
    status = exc.status()
    message = exc.message() or str(exc)
    if status is None:  # raised by the client library itself, e.g. a bad argument
        return message
    return f"{status.removeprefix('StatusCode.')}: {message}"


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


class TritonClient:
    """A tritonclient gRPC or HTTP client behind one interface returning plain Python data.

    `timeout_s` bounds every call: gRPC takes it as a per-call deadline, the HTTP client only as
    connection/network timeouts fixed at construction. Either way a call running past it raises
    InferenceServerException with status DEADLINE_EXCEEDED.
    """

    def __init__(self, url: str, protocol: str, timeout_s: float | None = None, admin_key: str | None = None) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
        self.url = url
        self.protocol = protocol
        self._timeout_s = timeout_s
        # The repository index is a restricted API behind tritonserver's key (model configs are open).
        key = known_admin_key() if admin_key is None else admin_key
        header = GRPC_ADMIN_HEADER if protocol == "grpc" else ADMIN_HEADER
        self._admin = {header: key} if key else None
        if protocol == "grpc":
            self._client = grpcclient.InferenceServerClient(url)
        elif timeout_s is None:
            self._client = httpclient.InferenceServerClient(url)
        else:
            self._client = httpclient.InferenceServerClient(
                url, connection_timeout=timeout_s, network_timeout=timeout_s
            )

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a client method, turning transport failures into the two errors callers handle."""
        if self.protocol == "grpc":
            kwargs["client_timeout"] = self._timeout_s
        try:
            return getattr(self._client, method)(*args, **kwargs)
        except InferenceServerException as exc:
            if exc.status() == "StatusCode.UNAVAILABLE":
                raise ServerUnreachable(self.url, self.protocol, exc.message()) from None
            raise
        except TimeoutError as exc:  # HTTP only; gRPC reports DEADLINE_EXCEEDED itself
            raise InferenceServerException(
                msg=f"no response within {self._timeout_s:g} s ({exc})", status="DEADLINE_EXCEEDED"
            ) from None
        except OSError as exc:  # HTTP only: refused, unresolvable, reset
            raise ServerUnreachable(self.url, self.protocol, str(exc)) from None

    def _json(self, method: str, *args: Any, **kwargs: Any) -> Any:
        # The gRPC client returns protobuf messages unless asked for JSON; HTTP always returns JSON.
        if self.protocol == "grpc":
            return self._call(method, *args, as_json=True, **kwargs)
        return self._call(method, *args, **kwargs)

    def server_live(self) -> bool:
        """Liveness; also the reachability probe, so a timeout here means unreachable."""
        try:
            return bool(self._call("is_server_live"))
        except InferenceServerException as exc:
            if exc.status() in ("StatusCode.DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED"):
                raise ServerUnreachable(self.url, self.protocol, exc.message()) from None
            raise

    def server_ready(self) -> bool:
        return bool(self._call("is_server_ready"))

    def server_metadata(self) -> dict:
        return self._json("get_server_metadata")

    def model_ready(self, model: str) -> bool:
        return bool(self._call("is_model_ready", model))

    def repository_index(self) -> list[dict]:
        """One entry per model version known to the repository: name, version, state, reason."""
        index = self._json("get_model_repository_index", headers=self._admin)
        return index.get("models", []) if self.protocol == "grpc" else index

    def model_metadata(self, model: str) -> dict:
        return normalize_metadata(self._json("get_model_metadata", model))

    def model_config(self, model: str) -> dict:
        config = self._json("get_model_config", model, headers=self._admin)
        return config.get("config", {}) if self.protocol == "grpc" else config

    def infer(
        self, model: str, inputs: dict[str, np.ndarray], datatypes: dict[str, str], output_names: list[str]
    ) -> tuple[dict[str, np.ndarray], str]:
        """One request with every tensor sent as binary data; returns (outputs, model version).

        `datatypes` holds each input's Triton datatype from the model metadata: the array's dtype
        cannot tell BF16 (sent from float32 arrays) from FP32.
        """
        module = grpcclient if self.protocol == "grpc" else httpclient
        infer_inputs = []
        for name, array in inputs.items():
            infer_input = module.InferInput(name, list(array.shape), datatypes[name])
            if self.protocol == "http":
                infer_input.set_data_from_numpy(array, binary_data=True)
            else:
                infer_input.set_data_from_numpy(array)  # gRPC always sends raw bytes
            infer_inputs.append(infer_input)
        if self.protocol == "http":
            requested = [module.InferRequestedOutput(n, binary_data=True) for n in output_names]
        else:
            requested = [module.InferRequestedOutput(n) for n in output_names]
        result = self._call("infer", model, infer_inputs, outputs=requested)
        response = result.get_response(as_json=True) if self.protocol == "grpc" else result.get_response()
        outputs = {name: result.as_numpy(name) for name in output_names}
        return outputs, str(response.get("model_version", ""))
