"""One real tritonserver for the whole test session, on free loopback ports.

Free ports let the suite run while `make serve` holds 8000-8002. The server is always stopped,
and a failing test shows the tail of the server log.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from backend.demo_models import generate
from backend.tritonserver import PROJECT_ROOT, Ports, TritonServer

MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
MODELS = ("resnet50", "mobilenet_v3_small", "text_classifier")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="session")
def triton(tmp_path_factory) -> TritonServer:
    generate(MODEL_REPOSITORY, list(MODELS), force=False)  # cached after `make models`
    workdir = tmp_path_factory.mktemp("tritonserver")
    server = TritonServer(
        model_repository=MODEL_REPOSITORY,
        ports=Ports(*free_ports(3)),
        backend_dir=workdir / "backends",
        log_file=workdir / "tritonserver.log",
    )
    server.start()
    try:
        server.wait_ready(timeout=180)
        yield server
    finally:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    server = item.funcargs.get("triton") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(server, TritonServer):
        report.sections.append(("tritonserver log (last lines)", server.log_tail(80)))


def onnx_file(model: str) -> Path:
    return MODEL_REPOSITORY / model / "1" / "model.onnx"
