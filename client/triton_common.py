"""What the scripts that talk to Triton share: its address (flags, environment, defaults).

The client itself, for both protocols, is `tritonnx.client.model_control.TritonControl`.
"""

from __future__ import annotations

import argparse
import os

from tritonnx.client.facade.settings import FacadeSettings
from tritonnx.client.model_control import PROTOCOLS
from tritonnx.common.ports import TRITON_HTTP, local
from tritonnx.common.settings import env_name

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
