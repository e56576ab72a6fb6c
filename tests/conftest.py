"""Test tiers and the serving fixtures.

Tiers follow the folders: `unit` (no server, seconds), `integration` (behaviour against real
tritonservers: one shared by the session for the demo models, and a few modules with a
repository of their own), `slow` (faults, overload, replicas, versions under load, benchmark
smoke runs), `conformance` (ONNX's own test models served and checked) and `containers` (the
images in a real Docker engine). The session's server serves the demo models alone, whatever else
model_repository/ holds. `make test` runs the first two; `make test-slow`,
`make test-conformance` and `make test-containers` the others; CI runs all of them.

The servers run on free loopback ports, so the suite also runs while `make serve` holds
8000-8002. The session's tritonserver starts only when a test asks for it; a failing test shows
the tail of the server's and the facade's logs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.serving import MODEL_REPOSITORY, MODELS, SERVED_MODELS, start_facade
from tritonnx.offline.demo_models import generate
from tritonnx.server.facade import FacadeProcess
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack
from tritonnx.server.triton import TritonServer

TIERS = ("unit", "integration", "slow", "conformance", "containers")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gates",
        action="store_true",
        help="fail on the timing gates of the slow tier (recovery within 1 s, quick rejections); `make chaos` sets "
        "it, `make test-slow` only prints them: a busy machine must not fail CI on speed",
    )
    parser.addoption(
        "--probe-slack-ms",
        type=float,
        help="the attack campaign's probe gate: its slowest call during an attack within this of its slowest before "
        "them; default: the campaign's own (make chaos's bound). CI sets one a loaded 2-core machine meets",
    )


# onnxruntime_extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python when it is imported (collecting the tests
# that use it): every server a test started afterwards parsed protobuf in pure Python, unlike a deployed one.
_PROTOBUF_IMPLEMENTATION = os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")


def pytest_collection_finish(session: pytest.Session) -> None:
    if _PROTOBUF_IMPLEMENTATION is None:
        os.environ.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    else:
        os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = _PROTOBUF_IMPLEMENTATION


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.path)).relative_to(Path(__file__).parent).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of tests/{', tests/'.join(TIERS)}")
        item.add_marker(tier)


@pytest.fixture
def gate(request: pytest.FixtureRequest) -> Callable[[bool, str], None]:
    """Check a timing outcome: always printed, an assertion only under --gates (make chaos)."""
    enforced = request.config.getoption("--gates")

    def check(passed: bool, what: str) -> None:
        print(f"gate {'passed' if passed else 'FAILED'}: {what}")
        if enforced:
            assert passed, what

    return check


@pytest.fixture(scope="session")
def triton(tmp_path_factory) -> TritonServer:
    generate(MODEL_REPOSITORY, list(MODELS), force=False)  # cached after `make models`
    # The demo models only, linked: a model a user added to model_repository/ (a recipe's) is not the tests'.
    demo = {model: MODEL_REPOSITORY / model for model in SERVED_MODELS}
    repository = link_models(tmp_path_factory.mktemp("repository") / "model_repository", demo)
    with ServingStack(repository, tmp_path_factory.mktemp("tritonserver"), with_facade=False) as stack:
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
