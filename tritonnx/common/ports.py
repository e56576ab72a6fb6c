"""The ports users rely on, in one place: tritonserver's, the supervisor's metrics and the facade's.

Every default elsewhere (tritonnx-serve's flags, the facade's settings, the client scripts, the monitor, the serving
stack) is one of these; tests/unit/test_docs.py checks that the README's table of addresses says them.
"""

from __future__ import annotations

import ipaddress

TRITON_HTTP = 8000
TRITON_GRPC = 8001
TRITON_METRICS = 8002
SUPERVISOR_METRICS = 8003
FACADE_GRPC = 50051
FACADE_HTTP = 3000  # /metrics and /health


def local(port: int) -> str:
    """host:port of `port` on the loopback address, where every default listens."""
    return f"127.0.0.1:{port}"


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to may be reachable from elsewhere
