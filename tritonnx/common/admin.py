"""The key of Triton's administrative APIs.

tritonserver's restricted-protocol options make model control, the repository index, shared
memory, trace and logging answer only requests carrying a header with this key; inference,
health, metadata, model configs and statistics stay open: they are read-only, and what
perf_analyzer and every Triton tutorial call first. The key is `$TRITONNX_ADMIN_KEY`, else a
random one that `make serve` writes to `<build>/admin-key`, readable by its user only, for local
tools (perf_analyzer -H, the client scripts).
"""

from __future__ import annotations

import os
import secrets

from tritonnx.common.paths import Paths

ADMIN_HEADER = "tritonnx-admin-key"
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"  # Triton's gRPC server adds the prefix
ADMIN_KEY_ENV = "TRITONNX_ADMIN_KEY"
RESTRICTED_PROTOCOLS = "model-repository,shared-memory,trace,logging"


def new_admin_key() -> str:
    """$TRITONNX_ADMIN_KEY, else a new random key."""
    return os.environ.get(ADMIN_KEY_ENV) or secrets.token_urlsafe(24)


def known_admin_key(paths: Paths | None = None) -> str:
    """The key for local tools: $TRITONNX_ADMIN_KEY, else the one `make serve` wrote, else ""."""
    if os.environ.get(ADMIN_KEY_ENV):
        return os.environ[ADMIN_KEY_ENV]
    try:
        return (paths or Paths.from_environment()).admin_key_file.read_text().strip()
    except OSError:
        return ""


def share_admin_key(key: str, paths: Paths | None = None) -> str:
    """Where local tools find the key.

    $TRITONNX_ADMIN_KEY when it came from there, else the file written here, readable by this user only. Returns that
    place, to print.
    """
    if os.environ.get(ADMIN_KEY_ENV):
        return "$" + ADMIN_KEY_ENV
    key_file = (paths or Paths.from_environment()).admin_key_file
    key_file.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(key + "\n")
    return str(key_file)
