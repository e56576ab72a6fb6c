"""Where tritonserver listens: gRPC on --host, HTTP on loopback unless asked, metrics where a scraper reaches them.

The addresses a real tritonnx-serve binds are checked in tests/integration/test_serve_addresses.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonnx.commands.serve import ServeSettings, arguments
from tritonnx.common.settings import settings_from
from tritonnx.server.triton import Ports, TritonInstall, TritonServer


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ("TRITONNX_TRITON_HOST", "TRITONNX_TRITON_HTTP_HOST", "TRITONNX_TRITON_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)


def addresses(server: TritonServer) -> dict[str, str]:
    install = TritonInstall.ngc_layout(Path("/opt/tritonserver"))
    flags = [arg.removeprefix("--").split("=", 1) for arg in server.command(install, Path("/b")) if "-address=" in arg]
    return {name.removesuffix("-address"): value for name, value in flags}


def parse(argv: list[str]) -> ServeSettings:
    return settings_from(arguments().parse_args(argv), ServeSettings)


def test_every_endpoint_is_on_loopback_by_default():
    settings = parse([])
    assert (settings.host, settings.http_host, settings.metrics_host) == ("127.0.0.1", "127.0.0.1", "")


def test_a_host_for_grpc_leaves_http_on_loopback_unless_it_is_asked_for_too(monkeypatch):
    monkeypatch.setenv("TRITONNX_TRITON_HOST", "0.0.0.0")
    assert (parse([]).host, parse([]).http_host) == ("0.0.0.0", "127.0.0.1")
    monkeypatch.setenv("TRITONNX_TRITON_HTTP_HOST", "0.0.0.0")
    assert parse([]).http_host == "0.0.0.0"
    assert parse(["--http-host", "127.0.0.1"]).http_host == "127.0.0.1"  # the flag wins over its variable


def test_the_command_binds_each_endpoint_to_its_own_address():
    server = TritonServer(ports=Ports(1, 2, 3), host="127.0.0.1", http_host="127.0.0.2", metrics_host="0.0.0.0")
    assert addresses(server) == {"http": "127.0.0.2", "grpc": "127.0.0.1", "metrics": "0.0.0.0"}
    assert (server.http_url, server.grpc_url, server.metrics_url) == (
        "127.0.0.2:1",
        "127.0.0.1:2",
        "http://0.0.0.0:3/metrics",
    )


def test_without_addresses_of_their_own_http_and_metrics_follow_host():
    """What the serving stack, the benchmarks and the tests rely on: one address for every endpoint."""
    assert set(addresses(TritonServer(host="127.0.0.5")).values()) == {"127.0.0.5"}
    assert "http" not in addresses(TritonServer(host="127.0.0.5", http=False, http_host="0.0.0.0"))
