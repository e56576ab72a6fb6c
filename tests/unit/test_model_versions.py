"""Model versions without a server: the version folders (staging, retired, failed, numbering), and publish /
retire / rollback against a recording stand-in for Triton's model control, a publish interrupted at each step and
what a restart sets aside. The command line is tests/unit/test_models_command.py's; Triton itself swaps versions in
tests/slow/test_model_versions.py, and serves the previous version after killed publishes in
tests/slow/test_publish_crashes.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.unit.graphs import CONFIG, RecordingControl, identity_graph, make_model, onnx_model
from tritonnx.client.model_control import READY
from tritonnx.server import model_folder
from tritonnx.server.model_folder import STAGING_PREFIX, external_data_files
from tritonnx.server.repository import STOCK_MODEL_PY
from tritonnx.server.signature import check_onnx
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

# --- folders and policies ---------------------------------------------------------------------------


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
