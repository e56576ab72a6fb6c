"""Test tiers and the serving fixtures.

Tiers follow the folders: `unit` (no server, seconds), `integration` (the functional tests
against one real tritonserver, shared by the session), `slow` (overload, faults, the
benchmark and split-cores smoke runs, each with servers of its own) and `conformance` (ONNX's own
test models served and checked, `make test-conformance`). `make test` runs the first three,
`make test-fast` the first two.

The session's tritonserver runs on free loopback ports, so the suite also runs while `make serve`
holds 8000-8002. It starts only when a test asks for it; a failing test shows the tail of the
server's and the facade's logs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.demo_models import generate
from backend.server.facade import FacadeProcess
from backend.server.stack import ServingStack
from backend.server.triton import TritonServer
from tests.serving import MODEL_REPOSITORY, MODELS, start_facade

TIERS = ("unit", "integration", "slow", "conformance", "containers")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.path)).relative_to(Path(__file__).parent).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of tests/{', tests/'.join(TIERS)}")
        item.add_marker(tier)


@pytest.fixture(scope="session")
def triton(tmp_path_factory) -> TritonServer:
    generate(MODEL_REPOSITORY, list(MODELS), force=False)  # cached after `make models`
    with ServingStack(MODEL_REPOSITORY, tmp_path_factory.mktemp("tritonserver"), with_facade=False) as stack:
        yield stack.triton


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
