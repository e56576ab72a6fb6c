"""One real tritonserver for the whole test session, on free loopback ports.

Free ports let the suite run while `make serve` holds 8000-8002. The server is always stopped,
and a failing test shows the tail of the server log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.demo_models import generate
from backend.tritonserver import PROJECT_ROOT, Ports, TritonServer, free_ports
from client.serve import FacadeProcess

MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
MODELS = ("resnet50", "mobilenet_v3_small", "text_classifier", "token_classifier")


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


# The facade under test: a small in-flight cap and message limit make backpressure and size
# limits testable with a few requests.
FACADE_MAX_IN_FLIGHT = 8
FACADE_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def start_facade(triton: TritonServer, workdir: Path, *extra: str) -> FacadeProcess:
    grpc_port, http_port = free_ports(2)
    facade = FacadeProcess(
        grpc_port=grpc_port, http_port=http_port, triton_url=triton.grpc_url, log_file=workdir / "facade.log",
        admin_key=triton.admin_key,
        extra_args=["--max-in-flight", str(FACADE_MAX_IN_FLIGHT), "--max-message-bytes",
                    str(FACADE_MAX_MESSAGE_BYTES), "--health-interval", "1", *extra],
    )
    facade.start()
    try:
        facade.wait_ready(timeout=60)
    except Exception:
        facade.stop()
        raise
    return facade


@pytest.fixture(scope="session")
def facade(triton, tmp_path_factory) -> FacadeProcess:
    facade = start_facade(triton, tmp_path_factory.mktemp("facade"))
    yield facade
    facade.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    if report.failed and isinstance(funcargs.get("triton"), TritonServer):
        report.sections.append(("tritonserver log (last lines)", funcargs["triton"].log_tail(80)))
    if report.failed and isinstance(funcargs.get("facade"), FacadeProcess) and funcargs["facade"].log_file:
        lines = funcargs["facade"].log_file.read_text(errors="replace").splitlines()[-40:]
        report.sections.append(("facade log (last lines)", "\n".join(lines)))


def onnx_file(model: str) -> Path:
    return MODEL_REPOSITORY / model / "1" / "model.onnx"
