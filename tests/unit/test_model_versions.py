"""Model versions without a server: the signature check of a new file, the version folders (staging,
retired, failed, numbering), and publish / retire / rollback against a recording stand-in for Triton's
model control, a publish interrupted at each step and what a restart sets aside; the command line
(tritonnx/commands/models.py) and triton_health's view of several versions. Triton itself swaps versions in
tests/slow/test_model_versions.py, and serves the previous version after killed publishes in
tests/slow/test_publish_crashes.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tritonnx.backend.onnx_io import read_graph_io
from tritonnx.client import triton_health
from tritonnx.client.model_control import READY, ControlError, States, triton_message
from tritonnx.commands import models as models_cli
from tritonnx.server import model_folder
from tritonnx.server.model_folder import STAGING_PREFIX, external_data_files
from tritonnx.server.process import free_ports
from tritonnx.server.repository import STOCK_MODEL_PY
from tritonnx.server.signature import (
    Signature,
    SignatureError,
    Tensor,
    auto_completed_max_batch_size,
    check_onnx,
    check_signature,
    incompatibilities,
)
from tritonnx.server.versions import (
    FAILED,
    RETIRED,
    ModelFolder,
    VersionError,
    list_versions,
    publish,
    recover_repository,
    retire,
    rollback,
    selected_versions,
)

CONFIG = 'backend: "python"\nmax_batch_size: 8\n'
# What Triton's get_model_config gives for a graph `x` FP32 [batch, 4] -> `y` FP32 [batch, 4] with max_batch_size 8.
SERVED = {
    "name": "m",
    "max_batch_size": 8,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["4"]}],
}


def identity_graph(path: Path, inputs=(("x", TensorProto.FLOAT, ["batch", 4]),), outputs=("y",)) -> Path:
    """A graph whose outputs copy its first input (an Identity each)."""
    source = inputs[0][0]
    graph = helper.make_graph(
        [helper.make_node("Identity", [source], [name]) for name in outputs],
        "g",
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in inputs],
        [helper.make_tensor_value_info(name, inputs[0][1], inputs[0][2]) for name in outputs],
    )
    onnx.save(onnx_model(graph), path)
    return path


def onnx_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def signature_of(path: Path, max_batch_size: int = 8) -> Signature:
    return Signature.from_graph(read_graph_io(path), max_batch_size)


# --- the signature check ------------------------------------------------------------------------


def test_the_same_graph_fits_the_served_config(tmp_path):
    served = Signature.from_config(SERVED)
    assert served == signature_of(identity_graph(tmp_path / "m.onnx"))
    assert incompatibilities(served, signature_of(identity_graph(tmp_path / "m.onnx"))) == []
    assert served.describe() == "inputs x (FP32 [-1, 4]); outputs y (FP32 [-1, 4]); max_batch_size 8"


def test_a_fixed_input_dim_may_become_dynamic_not_the_other_way():
    served = Signature((Tensor("x", "FP32", (4,)),), (Tensor("y", "FP32", (-1,)),), 8)
    wider = Signature((Tensor("x", "FP32", (-1,)),), (Tensor("y", "FP32", (4,)),), 8)
    assert incompatibilities(served, wider) == []
    narrower = incompatibilities(wider, served)
    assert narrower == [
        "input 'x' takes dims [4] in the new file, not every shape of the served [-1]",
        "output 'y' has dims [-1] in the new file, clients of the served model get [4]",
    ]


@pytest.mark.parametrize(
    ("new", "problem"),
    [
        (Signature((Tensor("x", "FP16", (4,)),), (Tensor("y", "FP32", (4,)),), 8), "input 'x' is FP16 in the new file"),
        (Signature((Tensor("x", "FP32", (4, 1)),), (Tensor("y", "FP32", (4,)),), 8), "input 'x' takes dims [4, 1]"),
        (Signature((Tensor("pixels", "FP32", (4,)),), (Tensor("y", "FP32", (4,)),), 8), "input 'x' is gone"),
        (
            Signature((Tensor("x", "FP32", (4,)), Tensor("z", "FP32", (1,))), (Tensor("y", "FP32", (4,)),), 8),
            "the new file needs input 'z', which clients of the served model do not send",
        ),
        (Signature((Tensor("x", "FP32", (4,)),), (Tensor("scores", "FP32", (4,)),), 8), "output 'y' is gone"),
        (
            Signature((Tensor("x", "FP32", (4,)),), (Tensor("extra", "FP32", (1,)), Tensor("y", "FP32", (4,))), 8),
            "output 'y' is not output 1 of the new file any more (['extra', 'y'])",
        ),
        (Signature((Tensor("x", "FP32", (4,)),), (Tensor("y", "INT64", (4,)),), 8), "output 'y' is INT64"),
        (
            Signature((Tensor("x", "FP32", (4,)),), (Tensor("y", "FP32", (4,)),), 0),
            "the served model batches up to 8, the new file does not batch",
        ),
    ],
)
def test_what_breaks_a_client_is_named(new, problem):
    served = Signature.from_config(SERVED)
    found = incompatibilities(served, new)
    assert any(p.startswith(problem) for p in found), found


def test_added_optional_inputs_and_trailing_outputs_fit():
    served = Signature.from_config(SERVED)
    new = Signature(
        (Tensor("x", "FP32", (4,)), Tensor("temperature", "FP32", (1,), optional=True)),
        (Tensor("y", "FP32", (4,)), Tensor("logits", "FP32", (4,))),
        8,
    )
    assert incompatibilities(served, new) == []
    assert incompatibilities(
        Signature((Tensor("x", "FP32", (4,), optional=True),), (), 8), Signature((Tensor("x", "FP32", (4,)),), (), 8)
    ) == ["input 'x' may be left out of requests to the served model, the new file needs it"]


def test_batching_is_predicted_as_auto_complete_decides_it(tmp_path):
    dynamic = read_graph_io(identity_graph(tmp_path / "d.onnx"))
    fixed = read_graph_io(identity_graph(tmp_path / "f.onnx", inputs=(("x", TensorProto.FLOAT, [3, 4]),)))
    assert auto_completed_max_batch_size(dynamic, written=None) == 4  # Triton's default
    assert auto_completed_max_batch_size(dynamic, written=None, default=8) == 8  # the server's --backend-config
    assert auto_completed_max_batch_size(fixed, written=None) == 0
    assert auto_completed_max_batch_size(dynamic, written=16) == 16
    assert auto_completed_max_batch_size(dynamic, written=0) == 0


def test_a_config_writing_inputs_and_outputs_is_predicted_not_to_batch(tmp_path):
    """Tutorial style: every dim written and no max_batch_size; auto-complete completes nothing, so it serves with 0."""
    (tmp_path / "1").mkdir()
    onnx_file = identity_graph(tmp_path / "1" / "model.onnx")
    (tmp_path / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [-1, 4] }]\n'
        'output [{ name: "y", data_type: TYPE_FP32, dims: [-1, 4] }]\n'
    )
    served = {"max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["-1", "4"]}],
              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["-1", "4"]}]}  # fmt: skip
    new = check_signature("m", tmp_path / "config.pbtxt", read_graph_io(onnx_file), served, False, lambda _: None)
    assert new.max_batch_size == 0
    assert [t.dims for t in new.inputs] == [(-1, 4)]


def test_a_file_onnx_runtime_cannot_load_is_refused_with_its_reason(tmp_path):
    (tmp_path / "garbage.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(SignatureError, match="not an ONNX model that can be served"):
        check_onnx(tmp_path / "garbage.onnx")
    # The graph reads, but an operator that does not exist cannot load.
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    onnx.save(onnx_model(graph), tmp_path / "bad_op.onnx")
    with pytest.raises(SignatureError, match="ONNX Runtime cannot load .*NoSuchOp"):
        check_onnx(tmp_path / "bad_op.onnx")
    with pytest.raises(SignatureError, match="is not a file"):
        check_onnx(tmp_path / "missing.onnx")


# --- folders and policies ---------------------------------------------------------------------------


def make_model(repository: Path, versions=(1,), config: str = CONFIG) -> ModelFolder:
    folder = repository / "m"
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    for version in versions:
        (folder / str(version)).mkdir()
        identity_graph(folder / str(version) / "model.onnx")
        (folder / str(version) / "model.py").write_text(f"# model.py of version {version}\n")
    return ModelFolder.find(repository, "m")


def test_version_numbers_are_never_reused(tmp_path):
    folder = make_model(tmp_path, versions=(1, 2))
    (folder.path / RETIRED / "5").mkdir(parents=True)
    (folder.path / ".staging-9").mkdir()  # not a version
    assert folder.versions() == [1, 2] and folder.retired() == [5]
    assert folder.next_version() == 6
    (folder.path / FAILED / "6").mkdir(parents=True)
    assert folder.failed() == [6] and folder.next_version() == 7
    # A publish under way holds its number; one published stays recorded, even if its folder is deleted by hand.
    folder.record_intent(7, tmp_path / "new.onnx")
    assert folder.intents() == [7] and folder.next_version() == 8
    folder.record_published(8)
    assert folder.published() == [8] and folder.next_version() == 9
    assert folder.records_file == tmp_path / ".m.publish.json"  # beside the model folders, not in one


def test_an_unknown_model_names_the_ones_there(tmp_path):
    make_model(tmp_path)
    with pytest.raises(VersionError, match=r"no model 'resnet' in .* \(models there: m\)"):
        ModelFolder.find(tmp_path, "resnet")


@pytest.mark.parametrize(
    ("policy", "selected"),
    [
        ({}, [3]),
        ({"latest": {"num_versions": 2}}, [2, 3]),
        ({"all": {}}, [1, 2, 3]),
        ({"specific": {"versions": ["1", "3"]}}, [1, 3]),
    ],
)
def test_the_version_policy_selects_as_triton_does(policy, selected):
    assert selected_versions(policy, [1, 2, 3]) == selected


def test_the_first_version_of_a_new_model_gets_the_stock_model_py_in_any_repository(tmp_path, monkeypatch):
    # A repository of the user's own, named by the environment as tritonnx-serve takes it: no demo model in it.
    monkeypatch.setenv("TRITONNX_MODEL_REPOSITORY", str(tmp_path))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG)
    written = ModelFolder.find(tmp_path, "m").stage(1, identity_graph(tmp_path / "new.onnx"))
    assert (written / "model.py").read_bytes() == STOCK_MODEL_PY.read_bytes()


@pytest.mark.parametrize(
    ("config", "served"),
    [
        ('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', "model.onnx"),
        ('backend: "tritonnx"\ndefault_model_filename: "int8.onnx"\n', "int8.onnx"),
    ],
)
def test_a_model_of_a_named_backend_gets_its_graph_under_the_configs_name_and_no_model_py(tmp_path, config, served):
    folder = make_model(tmp_path, versions=(), config=config)
    source = identity_graph(tmp_path / "new.onnx")
    written = folder.stage(1, source)
    assert sorted(p.name for p in written.iterdir()) == [served]
    assert (written / served).read_bytes() == source.read_bytes()


def test_staging_leaves_nothing_behind_when_a_copy_fails(tmp_path):
    folder = make_model(tmp_path)
    source = identity_graph(tmp_path / "new.onnx")
    with pytest.raises(FileNotFoundError):
        folder.stage(2, tmp_path / "missing.onnx")
    assert sorted(p.name for p in folder.path.iterdir()) == ["1", "config.pbtxt"]
    written = folder.stage(2, source)
    assert written == folder.path / "2"
    assert (written / "model.py").read_text() == "# model.py of version 1\n"  # the newest version's
    assert (written / "model.onnx").read_bytes() == source.read_bytes()
    assert not any(p.name.startswith(STAGING_PREFIX) for p in folder.path.iterdir())


def test_external_data_travels_with_the_model(tmp_path):
    weights = numpy_helper.from_array(np.arange(1024, dtype=np.float32).reshape(256, 4), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [weights],
    )
    onnx.save(
        onnx_model(graph), tmp_path / "big.onnx", save_as_external_data=True, location="big.weights", size_threshold=0
    )
    assert external_data_files(tmp_path / "big.onnx") == ["big.weights"]
    folder = make_model(tmp_path / "repo")
    written = folder.stage(2, tmp_path / "big.onnx")
    assert (written / "big.weights").read_bytes() == (tmp_path / "big.weights").read_bytes()
    assert check_onnx(written / "model.onnx").inputs[0].name == "x"  # loads from its new place


# --- publish, retire, rollback against a recording model control -----------------------------------


class RecordingControl:
    """Triton's model control as the folder decides it: a load serves what the policy selects from the
    folder, unless a version's model.onnx is in `refuse` (its load fails and nothing changes)."""

    def __init__(self, folder: ModelFolder) -> None:
        self.folder = folder
        self.loads = 0
        self.refuse: set[bytes] = set()
        self.served: list[int] = list(folder.versions()[-1:])
        self.known: States = {v: (READY, "") for v in self.served}

    def states(self, model: str) -> States:
        return dict(self.known)

    def served_config(self, model: str) -> dict | None:
        return SERVED if self.served else None

    def load(self, model: str) -> None:
        self.loads += 1
        selected = selected_versions(self.folder.version_policy(), self.folder.versions())
        for version in selected:
            if (self.folder.path / str(version) / "model.onnx").read_bytes() in self.refuse:
                self.known[version] = ("UNAVAILABLE", "Internal: ModelConfigError: no\n\nAt:\n  x.py(1): f\n")
                raise ControlError(f"load failed for model 'm': version {version} is at UNAVAILABLE state")
        for version in self.served:
            if version not in selected:
                self.known[version] = ("UNAVAILABLE", "unloaded")
        self.served = selected
        self.known.update({v: (READY, "") for v in selected})


def test_publish_writes_the_next_version_and_has_triton_load_it(tmp_path):
    folder = make_model(tmp_path / "repo")
    control = RecordingControl(folder)
    log: list[str] = []
    outcome = publish(folder, identity_graph(tmp_path / "new.onnx"), control, log=log.append)
    assert outcome.version == 2 and control.loads == 1 and control.served == [2]
    assert folder.published() == [2] and folder.intents() == []  # READY, so recorded as published
    assert outcome.serving == "m serves version 2 (requests without a version: 2)"
    assert any(line.startswith("signature matches the served model") for line in log)
    rows = list_versions(folder, control)
    assert [(r.version, r.place, r.state, r.default) for r in rows] == [
        (1, "repository", "UNAVAILABLE", False),
        (2, "repository", READY, True),
    ]


def test_a_file_that_fails_a_check_is_refused_before_anything_is_written(tmp_path):
    folder = make_model(tmp_path / "repo")
    control = RecordingControl(folder)
    renamed = identity_graph(tmp_path / "renamed.onnx", inputs=(("pixels", TensorProto.FLOAT, ["batch", 4]),))
    with pytest.raises(VersionError) as refused:
        publish(folder, renamed, control, log=lambda _: None)
    message = str(refused.value)
    assert "input 'x' is gone" in message and "the served model: inputs x (FP32 [-1, 4])" in message
    assert "--allow-signature-change" in message
    assert folder.versions() == [1] and control.loads == 0
    assert publish(folder, renamed, control, allow_signature_change=True, log=lambda _: None).version == 2


def test_a_version_triton_cannot_load_is_moved_to_failed_and_the_served_one_stays(tmp_path):
    folder = make_model(tmp_path / "repo")
    control = RecordingControl(folder)
    new = identity_graph(tmp_path / "new.onnx", outputs=("y", "z"))
    control.refuse.add(new.read_bytes())
    with pytest.raises(VersionError) as refused:
        publish(folder, new, control, log=lambda _: None)
    message = str(refused.value)
    assert message.startswith("Triton could not load version 2 of m: load failed for model 'm'")
    assert "the served model: inputs x (FP32 [-1, 4])" in message
    assert "version 2 was moved to failed/2 (its number is not used again); m serves version 1" in message
    assert folder.versions() == [1] and control.served == [1] and control.loads == 2  # the load, then the restore
    assert folder.failed() == [2] and (folder.path / FAILED / "2" / "model.onnx").read_bytes() == new.read_bytes()
    assert not any(p.name.startswith(STAGING_PREFIX) for p in folder.path.iterdir())
    assert folder.intents() == [] and folder.published() == []
    assert [(r.version, r.place) for r in list_versions(folder, control)] == [(1, "repository"), (2, FAILED)]
    # The next publish takes the next number: 2 failed.
    outcome = publish(folder, identity_graph(tmp_path / "good.onnx"), control, log=lambda _: None)
    assert outcome.version == 3 and folder.published() == [3]


def test_a_specific_policy_that_would_not_serve_the_new_version_refuses_it(tmp_path):
    folder = make_model(tmp_path / "repo", config=CONFIG + "version_policy: { specific: { versions: [1] } }\n")
    with pytest.raises(
        VersionError, match=r"version_policy \(specific \[1\], in config.pbtxt\) would not serve version 2"
    ):
        publish(folder, identity_graph(tmp_path / "new.onnx"), RecordingControl(folder), log=lambda _: None)
    assert folder.versions() == [1]


def test_rollback_retires_the_newest_and_the_previous_serves(tmp_path):
    folder = make_model(tmp_path / "repo", versions=(1, 2))
    control = RecordingControl(folder)
    outcome = rollback(folder, control)
    assert outcome.version == 2 and control.served == [1]
    assert folder.versions() == [1] and folder.retired() == [2]
    assert (folder.path / RETIRED / "2" / "model.py").read_text() == "# model.py of version 2\n"
    with pytest.raises(VersionError, match="no version before 1 to roll back to .*retired: 2"):
        rollback(folder, control)
    assert folder.next_version() == 3


def test_retire_refuses_the_only_serving_version_and_retires_others(tmp_path):
    folder = make_model(tmp_path / "repo", versions=(1, 2, 3))
    control = RecordingControl(folder)
    with pytest.raises(VersionError, match="version 3 is the only version of m serving: `rollback` retires it"):
        retire(folder, 3, control)
    with pytest.raises(VersionError, match=r"no version 7 in the repository \(versions: 1, 2, 3\)"):
        retire(folder, 7, control)
    retire(folder, 1, control)
    assert folder.versions() == [2, 3] and folder.retired() == [1] and control.served == [3]


def test_with_two_versions_served_either_may_be_retired(tmp_path):
    folder = make_model(
        tmp_path / "repo", versions=(1, 2), config=CONFIG + "version_policy: { latest: { num_versions: 2 } }\n"
    )
    control = RecordingControl(folder)
    control.load("m")
    assert control.served == [1, 2]
    retire(folder, 2, control)
    assert control.served == [1] and folder.retired() == [2]
    with pytest.raises(VersionError, match="would leave m no version to serve"):
        retire(folder, 1, control)


def test_a_retirement_triton_cannot_follow_is_undone(tmp_path):
    folder = make_model(tmp_path / "repo", versions=(1, 2))
    control = RecordingControl(folder)
    control.refuse.add((folder.path / "1" / "model.onnx").read_bytes())
    with pytest.raises(VersionError, match="version 2 is back in the repository"):
        rollback(folder, control)
    assert folder.versions() == [1, 2] and folder.retired() == []


def test_a_version_named_by_a_specific_policy_is_not_retired(tmp_path):
    folder = make_model(
        tmp_path / "repo", versions=(1, 2), config=CONFIG + "version_policy: { specific: { versions: [1, 2] } }\n"
    )
    with pytest.raises(VersionError, match="names version 2: take it out of the policy first"):
        rollback(folder, RecordingControl(folder))


# --- a publish interrupted at each step ------------------------------------------------------------------


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, not even the publish's own error handling."""


def kill_at(step: str, folder: ModelFolder, control: RecordingControl, monkeypatch) -> None:
    """Make the publish of version 2 stop dead at `step` (tests/slow/test_publish_crashes.py kills a real one)."""
    real_rename, real_load = model_folder.os.rename, control.load

    def killed(*args: object) -> None:
        raise Killed

    def rename(source, target) -> None:
        if Path(source).name.startswith(STAGING_PREFIX):
            raise Killed
        real_rename(source, target)

    def load_unheard(model: str) -> None:
        real_load(model)
        raise Killed

    if step == "staged":  # its folder written, not renamed into place
        monkeypatch.setattr(model_folder.os, "rename", rename)
    elif step == "renamed":  # in place, Triton not asked yet
        monkeypatch.setattr(control, "load", killed)
    elif step == "loading":  # Triton loads it; the publish never hears back
        monkeypatch.setattr(control, "load", load_unheard)
    else:  # "loaded": READY in Triton, not recorded as published
        monkeypatch.setattr(ModelFolder, "record_published", killed)


@pytest.mark.parametrize("step", ["staged", "renamed", "loading", "loaded"])
def test_a_publish_killed_at_any_step_is_set_aside_at_the_next_start_and_the_previous_version_serves(
    tmp_path, monkeypatch, step
):
    repository = tmp_path / "repo"
    folder = make_model(repository)
    control = RecordingControl(folder)
    with monkeypatch.context() as patched:
        kill_at(step, folder, control, patched)
        with pytest.raises(Killed):
            publish(folder, identity_graph(tmp_path / "new.onnx"), control, log=lambda _: None)
    assert folder.intents() == [2] and folder.published() == []
    left = (folder.path / "2") if step != "staged" else (folder.path / f"{STAGING_PREFIX}2")
    assert left.is_dir()
    if step != "staged":
        assert [r.place for r in list_versions(folder, control) if r.version == 2] == ["unfinished"]

    logged: list[str] = []
    assert recover_repository(repository, logged.append) == [("m", 2)]  # as a server starting over it does
    assert folder.versions() == [1] and folder.failed() == [2] and folder.intents() == []
    assert (folder.path / FAILED / "2" / "model.onnx").is_file()
    [line] = logged
    assert line.startswith("m: the publish of version 2 never finished (started ")
    assert f"from {tmp_path / 'new.onnx'}" in line and line.endswith("moved it to m/failed/2, out of Triton's sight")
    restarted = RecordingControl(folder)  # the new server loads what is on disk
    restarted.load("m")
    assert restarted.served == [1]
    assert recover_repository(repository, logged.append) == [] and len(logged) == 1  # settled once
    assert publish(folder, identity_graph(tmp_path / "next.onnx"), control, log=lambda _: None).version == 3


def test_the_next_publish_sets_aside_what_a_killed_one_left_before_it_loads_its_own(tmp_path, monkeypatch):
    folder = make_model(tmp_path / "repo")
    control = RecordingControl(folder)
    with monkeypatch.context() as patched:
        kill_at("loading", folder, control, patched)
        with pytest.raises(Killed):
            publish(folder, identity_graph(tmp_path / "new.onnx"), control, log=lambda _: None)
    assert control.served == [2]  # Triton finished the load the publish never heard of
    logged: list[str] = []
    outcome = publish(folder, identity_graph(tmp_path / "next.onnx"), control, log=logged.append)
    assert outcome.version == 3 and control.served == [3]
    assert folder.versions() == [1, 3] and folder.failed() == [2]
    assert any(line.startswith("m: the publish of version 2 never finished") for line in logged)


def test_versions_put_there_by_hand_and_models_without_records_are_never_touched(tmp_path):
    repository = tmp_path / "repo"
    folder = make_model(repository, versions=(1, 2))
    before = sorted(p.name for p in folder.path.iterdir())
    assert recover_repository(repository, print) == []
    # Nothing written either (a read-only repository starts too): not even the lock file.
    assert sorted(p.name for p in folder.path.iterdir()) == before == ["1", "2", "config.pbtxt"]


def test_a_model_whose_lock_is_held_is_left_to_the_operation_holding_it(tmp_path):
    repository = tmp_path / "repo"
    folder = make_model(repository)
    folder.record_intent(2, tmp_path / "new.onnx")
    (folder.path / "2").mkdir()
    logged: list[str] = []
    with folder.locked():  # a publish under way
        assert recover_repository(repository, logged.append) == []
    assert logged == ["m: a version operation is under way; it settles its own version"]
    assert folder.versions() == [1, 2] and folder.intents() == [2]


def model_level_change(folder: ModelFolder) -> int:
    """What Triton 2.51 compares at a model's load to decide whether every served version reloads (its ModelTimestamp):
    the newest mtime or ctime under the entries of the model's folder other than config.pbtxt and the versions."""
    entries = [e for e in folder.path.iterdir() if not e.name.isdigit() and e.name != "config.pbtxt"]
    paths = [p for e in entries for p in [e, *(e.rglob("*") if e.is_dir() else [])]]
    return max((max(p.lstat().st_mtime_ns, p.lstat().st_ctime_ns) for p in paths), default=0)


def test_a_publish_changes_nothing_in_the_model_folder_that_makes_triton_reload_the_served_versions(tmp_path):
    folder = make_model(tmp_path / "repo")
    control = RecordingControl(folder)
    publish(folder, identity_graph(tmp_path / "2.onnx"), control, log=lambda _: None)
    before = model_level_change(folder)  # the lock file's, from the first operation
    publish(folder, identity_graph(tmp_path / "3.onnx"), control, log=lambda _: None)
    assert folder.published() == [2, 3]
    assert model_level_change(folder) == before


def test_tritons_tracebacks_are_cut_from_its_messages():
    reason = "Internal: ModelConfigError: unexpected protobuf wire type 6\n\nAt:\n  /b/onnx_io.py(153): _fields\n;"
    assert triton_message(f"load failed for model 'm': version 3 is at UNAVAILABLE state: {reason}") == (
        "load failed for model 'm': version 3 is at UNAVAILABLE state: Internal: ModelConfigError: unexpected "
        "protobuf wire type 6"
    )


# --- the command line -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["publish", "list", "rollback", "retire"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exited:
        models_cli.main([command, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert f"python -m tritonnx.commands.models {command}" in shown and "Example" in shown
    assert "TRITONNX_MODEL_REPOSITORY" in shown and "TRITONNX_TRITON_URL" in shown and "TRITONNX_ADMIN_KEY" in shown


@pytest.mark.parametrize(
    "argv", [["retire", "m", "two"], ["retire", "m", "0"], ["list", "--url", "grpc://127.0.0.1:8001"], ["publish", "m"]]
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        models_cli.main(argv)
    assert exited.value.code == 2


def test_an_unreachable_triton_exits_2_and_changes_nothing(tmp_path, capsys):
    folder = make_model(tmp_path / "repo", versions=(1, 2))
    [port] = free_ports(1)
    code = models_cli.main(["rollback", "m", "--url", f"127.0.0.1:{port}", "--repository", str(tmp_path / "repo")])
    assert code == 2
    assert "cannot reach Triton at 127.0.0.1" in capsys.readouterr().err
    assert folder.versions() == [1, 2] and folder.retired() == []


def test_the_commands_print_what_they_did_and_what_serves(tmp_path):
    folder = make_model(tmp_path / "repo")
    control = RecordingControl(folder)
    printed: list[str] = []
    parser = models_cli.build_parser()
    new = identity_graph(tmp_path / "new.onnx")
    models_cli.run(parser.parse_args(["publish", "m", str(new)]), control, tmp_path / "repo", printed.append)
    assert printed[-1] == f"published {new} as version 2 of m; m serves version 2 (requests without a version: 2)"
    models_cli.run(parser.parse_args(["list"]), control, tmp_path / "repo", printed.append)
    assert printed[-1].splitlines() == [
        f"m: version_policy latest 1 ({folder.path})",
        "  version  where       Triton",
        "  1        repository  UNAVAILABLE: unloaded",
        "  2        repository  READY  <- serves requests without a version",
    ]
    models_cli.run(parser.parse_args(["rollback", "m"]), control, tmp_path / "repo", printed.append)
    assert (
        printed[-1] == "rolled back: version 2 retired to retired/2; m serves version 1 (requests without a version: 1)"
    )
    models_cli.run(parser.parse_args(["list", "--json"]), control, tmp_path / "repo", printed.append)
    listed = json.loads(printed[-1])["models"][0]
    assert listed["version_policy"] == "latest 1"
    assert [(v["version"], v["place"], v["state"], v["default"]) for v in listed["versions"]] == [
        (1, "repository", READY, True),
        (2, "retired", "UNAVAILABLE", False),
    ]


# --- discovery: triton_health with two versions side by side ------------------------------------------


class TwoVersionsClient:
    """TritonControl's interface over a model served as versions 4 and 5, after 1 to 3 were swapped out."""

    url, protocol = "127.0.0.1:8001", "grpc"

    def server_live(self) -> bool:
        return True

    server_ready = server_live

    def server_metadata(self) -> dict:
        return {"name": "triton", "version": "2.51.0", "extensions": []}

    def index(self) -> list[dict]:
        return [
            {"name": "m", "version": "3", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "m", "version": "4", "state": "READY"},
            {"name": "m", "version": "5", "state": "READY"},
            {"name": "m", "version": "6", "state": "UNAVAILABLE", "reason": "Internal: ModelConfigError: no graph"},
        ]

    def ready(self, name: str) -> bool:
        return True

    def metadata(self, name: str) -> dict:
        tensors = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []}
        return {"name": name, "versions": ["4", "5"], "platform": "python", **tensors}

    def config(self, name: str) -> dict:
        return {"max_batch_size": 8}


def test_triton_health_lists_versions_side_by_side_with_the_one_serving_by_default():
    report = triton_health.check(TwoVersionsClient(), [])
    [model] = report["models"]
    assert model["default_version"] == "5"
    assert [(v["version"], v["state"]) for v in model["versions"]] == [
        ("3", "UNAVAILABLE"),
        ("4", "READY"),
        ("5", "READY"),
        ("6", "UNAVAILABLE"),
    ]
    text = triton_health.format_report(report)
    assert "  versions: 3 UNAVAILABLE, 4 READY, 5 READY, 6 UNAVAILABLE (requests without a version: 5)" in text
    assert "  reason (6): Internal: ModelConfigError: no graph" in text
    assert "unloaded" not in text  # a version swapped out needs no explaining
