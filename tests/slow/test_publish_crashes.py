"""A `tritonnx-models publish` killed (SIGKILL) at each of its steps, then a tritonserver started over the same
repository: it serves the version that served before, the unfinished one is in `failed/`, and the next publish
takes a number above it. Once through a restart of the serving stack, once through the supervisor's restart of a
killed tritonserver.

The publish runs as a real process (`tritonnx.commands.models.main`, what the console script runs) that kills itself at the
step under test, so the kill lands exactly there: after staging (its folder written, not renamed into place),
after the rename (Triton not asked yet), during the load (Triton loading the version the publish will never hear
of) and before its published record (Triton has it READY). The model is a one-instance `y = x + k` graph whose
answer names the version that computed it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import wait_until
from tests.serving import CHECKOUT
from tritonnx.client.model_control import TritonControl
from tritonnx.commands import models as models_cli
from tritonnx.common.admin import ADMIN_KEY_ENV
from tritonnx.common.paths import REPOSITORY_ENV
from tritonnx.server import model_folder
from tritonnx.server.model_folder import FAILED, STAGING_PREFIX, ModelFolder
from tritonnx.server.stack import ServingStack

M = "m"
CONFIG = 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n'
STEPS = ("staged", "renamed", "loading", "loaded")
X = np.ones((1, 4), np.float32)


def add_graph(path: Path, k: float) -> Path:
    """y = x + k: version k answers k + 1 for X."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "k"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.full(4, k, np.float32), "k")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def repository_with_version_1(root: Path) -> Path:
    """Version 1 put there by hand: no publish records."""
    (root / M / "1").mkdir(parents=True)
    (root / M / "config.pbtxt").write_text(CONFIG)
    add_graph(root / M / "1" / "model.onnx", 1)
    return root


def answer(stack: ServingStack) -> tuple[str, float]:
    """(the version that answered, its y[0]) for a request naming no version."""
    tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        result = client.infer(M, [tensor], client_timeout=30)
    return result.get_response().model_version, float(result.as_numpy("y")[0, 0])


def ready_versions(stack: ServingStack) -> list[str]:
    return sorted(s["version"] for s in stack.triton.model_states() if s["name"] == M and s.get("state") == "READY")


def publish_killed_at(step: str, version: int, argv: list[str]) -> None:
    """`tritonnx-models publish` in this process, which kills itself with SIGKILL at `step` of publishing `version`."""

    def killed(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if step == "staged":
        rename = os.rename

        def rename_unless_staged(source: Path, target: Path) -> None:
            if Path(source).name.startswith(STAGING_PREFIX):
                killed()
            rename(source, target)

        model_folder.os.rename = rename_unless_staged  # type: ignore[assignment]
    elif step == "renamed":
        TritonControl.load = killed  # type: ignore[method-assign]
    elif step == "loading":
        load = TritonControl.load

        def killed_while_loading(self: TritonControl, model: str, config: dict | None = None) -> None:
            threading.Thread(target=load, args=(self, model, config), daemon=True).start()
            with TritonControl(self.url, os.environ[ADMIN_KEY_ENV]) as watcher:
                state = wait_until(lambda: watcher.states(model).get(version, ("", ""))[0], 60, "Triton loading it")
            print(f"killed while Triton has version {version} {state}", flush=True)
            killed()

        TritonControl.load = killed_while_loading  # type: ignore[method-assign]
    else:
        ModelFolder.record_published = killed  # type: ignore[method-assign]
    sys.exit(models_cli.main(argv))


def killed_publish(stack: ServingStack, repository: Path, step: str, version: int, onnx_file: Path) -> str:
    """Run a publish of `onnx_file` that is killed at `step`; its output."""
    code = "import sys; from tests.slow.test_publish_crashes import publish_killed_at as p; " + (
        "p(sys.argv[1], int(sys.argv[2]), sys.argv[3:])"
    )
    env = {
        **os.environ,
        REPOSITORY_ENV: str(repository),
        "TRITONNX_TRITON_URL": stack.triton.grpc_url,
        ADMIN_KEY_ENV: stack.triton.admin_key,
    }
    command = [sys.executable, "-c", code, step, str(version), "publish", M, str(onnx_file)]
    done = subprocess.run(command, env=env, cwd=CHECKOUT, capture_output=True, text=True, timeout=180)
    print(f"publish killed at {step} (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout


def set_aside_lines(caplog) -> list[str]:
    """What the serving stack or the supervisor logged of the versions they set aside."""
    return [r.getMessage() for r in caplog.records if "never finished" in r.getMessage()]


def test_a_publish_killed_at_each_step_leaves_the_previous_version_serving_after_a_restart(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tritonnx.versions")
    repository = repository_with_version_1(tmp_path / "repository")
    folder = ModelFolder(repository / M)
    for version, step in enumerate(STEPS, start=2):
        with ServingStack(repository, tmp_path / f"before-{step}", with_facade=False) as stack:
            assert answer(stack) == ("1", 2.0)
            output = killed_publish(stack, repository, step, version, add_graph(tmp_path / f"{version}.onnx", version))
            assert f"written as version {version}" in output or step == "staged"
            assert folder.intents() == [version] and folder.published() == []
            left = folder.path / (f"{STAGING_PREFIX}{version}" if step == "staged" else str(version))
            assert left.is_dir()
            if step == "loaded":
                assert ready_versions(stack) == [str(version)]  # the killed publish's version serves until a restart
        caplog.clear()
        with ServingStack(repository, tmp_path / f"after-{step}", with_facade=False) as stack:
            assert answer(stack) == ("1", 2.0), f"killed at {step}"
            assert ready_versions(stack) == ["1"]
        assert folder.versions() == [1] and folder.intents() == []
        assert version in folder.failed() and (folder.path / FAILED / str(version) / "model.onnx").is_file()
        [line] = set_aside_lines(caplog)
        assert line.startswith(f"{M}: the publish of version {version} never finished (started ")
        assert line.endswith(f"moved it to {M}/{FAILED}/{version}, out of Triton's sight")
    assert folder.failed() == [2, 3, 4, 5]
    # The next publish takes the number above every failed one, and serves.
    with ServingStack(repository, tmp_path / "after", with_facade=False) as stack:
        done = subprocess.run(
            [sys.executable, "-m", "tritonnx.commands.models", "publish", M, str(add_graph(tmp_path / "6.onnx", 6))],
            env={
                **os.environ,
                REPOSITORY_ENV: str(repository),
                "TRITONNX_TRITON_URL": stack.triton.grpc_url,
                ADMIN_KEY_ENV: stack.triton.admin_key,
            },
            cwd=CHECKOUT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert f"as version 6 of {M}" in done.stdout
        assert answer(stack) == ("6", 7.0)
    assert folder.published() == [6] and folder.intents() == []


def test_the_supervisor_sets_aside_an_unfinished_publish_before_it_restarts_a_killed_tritonserver(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tritonnx.supervisor")
    repository = repository_with_version_1(tmp_path / "repository")
    folder = ModelFolder(repository / M)
    with ServingStack(repository, tmp_path / "stack", with_facade=False, supervised=True) as stack:
        killed_publish(stack, repository, "loaded", 2, add_graph(tmp_path / "2.onnx", 2))
        assert answer(stack) == ("2", 3.0)  # READY in the running server, never recorded as published
        restarts = len(stack.supervisor.restarts)
        os.kill(stack.triton.pid, signal.SIGKILL)
        wait_until(lambda: len(stack.supervisor.restarts) > restarts, 120, "the supervisor's restart")
        assert answer(stack) == ("1", 2.0)
        assert ready_versions(stack) == ["1"]
    assert folder.versions() == [1] and folder.failed() == [2] and folder.intents() == []
    [line] = set_aside_lines(caplog)
    assert line.startswith(f"{M}: the publish of version 2 never finished")
