"""A model's folder in the repository: its versions on disk, the publish records, the lock.

`<repository>/<model>/<n>/` holds version n: `model.onnx` (with its external data, if any; the config's
`default_model_filename` names it otherwise), and for a `backend: "python"` model the stock `model.py`
(the named backends `onnxruntime` and `tritonnx` need none). Triton 2.51 takes every subfolder of a
model whose name starts with a number as a version (it reads "2abc" as version 2) and ignores the
others with a warning, so:

- a new version is written in `<model>/.staging-<n>/` and renamed to `<model>/<n>/` once complete:
  one rename within one filesystem, so Triton never sees a half-written version. Its model.py is
  compiled there too: Triton reloads, at the model's next load, every version whose folder holds a
  file newer than its last load, and the stub would otherwise write `__pycache__/` into the folder;
- a retired version moves to `<model>/retired/<n>/`, out of Triton's sight and kept: publishing its
  `model.onnx` again serves it again;
- a version that Triton could not load, or whose publish never finished, moves to `<model>/failed/<n>/`
  (one rename: a failed version never lingers half-deleted where Triton would load it).

Numbers are never reused (clients and the facade's result cache remember what a number answered): the
next version is one above every number ever used, in the repository, retired, failed or recorded.

The records are a file beside the model folders, not in them: Triton 2.51 takes only folders of the
repository as models, and reloads every served version of a model at its next load when any entry of the
model's folder other than config.pbtxt and the version folders changed (mtime or ctime) since its last
load. So a publish changes nothing there but its own version folder; moving a version to `failed/` (or to
`retired/`) does, and the next load of the model starts its served versions anew beside the old ones.
Every rename and record that matters is fsynced with its folder, so the state after a power loss is one
of the states a kill leaves. One operation at a time per model: they take a lock file in its folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import py_compile
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tritonnx.backend.model_files import PYTHON_MODEL_FILE, is_python_model, onnx_file_name
from tritonnx.server.repository import CONFIG_FILE, STOCK_MODEL_PY, read_config

if TYPE_CHECKING:  # onnx is imported where a file is published: the images' serving processes do without it
    import onnx

RETIRED = "retired"
FAILED = "failed"
STAGING_PREFIX = ".staging-"
RECORDS_SUFFIX = ".publish.json"  # <repository>/.<model>.publish.json: {"intents": {n: ...}, "published": [n, ...]}
LOCK_FILE = ".versions.lock"

Log = Callable[[str], None]


class VersionError(Exception):
    """An operation refused or failed; the message says what is wrong and what to do."""


class Busy(VersionError):
    """Another operation holds the model's lock."""


@dataclass(frozen=True)
class ModelFolder:
    """`<repository>/<model>`: its versions, retired and failed versions, publish records and config.pbtxt."""

    path: Path

    @classmethod
    def find(cls, repository: Path, model: str) -> ModelFolder:
        folder = cls(repository / model)
        if not (folder.path / CONFIG_FILE).is_file():
            models = sorted(p.parent.name for p in repository.glob(f"*/{CONFIG_FILE}"))
            raise VersionError(
                f"no model '{model}' in {repository} (models there: {', '.join(models) or 'none'}); a new model "
                "starts as described in the README's 'Serving your own ONNX model'"
            )
        return folder

    @property
    def name(self) -> str:
        return self.path.name

    def versions(self) -> list[int]:
        return _numbered(self.path)

    def retired(self) -> list[int]:
        return _numbered(self.path / RETIRED)

    def failed(self) -> list[int]:
        return _numbered(self.path / FAILED)

    @property
    def records_file(self) -> Path:
        return self.path.parent / f".{self.name}{RECORDS_SUFFIX}"

    def records(self) -> dict:
        """The publish records: `intents` (version -> who started it, when, from which file) and `published`."""
        try:
            records = json.loads(self.records_file.read_text())
        except FileNotFoundError:
            records = {}
        except (OSError, ValueError) as error:
            raise VersionError(f"cannot read {self.records_file}: {error}") from None
        return {"intents": records.get("intents", {}), "published": records.get("published", [])}

    def intents(self) -> list[int]:
        """Versions whose publish started and has not been settled (published, failed or set aside)."""
        return sorted(int(n) for n in self.records()["intents"])

    def published(self) -> list[int]:
        """Versions Triton reported READY when they were published."""
        return sorted(int(n) for n in self.records()["published"])

    def next_version(self) -> int:
        used = self.versions() + self.retired() + self.failed() + self.intents() + self.published()
        return max(used, default=0) + 1

    def version_policy(self) -> dict:
        return self.config().get("version_policy", {})

    @contextmanager
    def locked(self, wait: bool = True) -> Iterator[None]:
        """One operation at a time on this model: others wait, or with `wait=False` get Busy."""
        with open(self.path / LOCK_FILE, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise Busy(f"another operation on {self.name} is under way") from None
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def config(self) -> dict:
        try:
            return read_config(self.path)
        except (OSError, ValueError) as error:
            raise VersionError(f"cannot read {self.path / CONFIG_FILE}: {error}") from None

    def stage(self, number: int, onnx_file: Path, extra_files: Mapping[str, str] | None = None) -> Path:
        """Write version `number` from `onnx_file` (and its external data), with model.py for a Python model; its folder.

        `extra_files` (name: text) are written beside the model file, e.g. a quantization report: Triton loads only
        the model file and the backend's model.py from a version folder.

        Written in a staging folder Triton ignores, synced, then renamed into place. A failure removes the staging
        folder; a kill leaves it to `recover`.
        """
        config = self.config()
        staging = self.path / f"{STAGING_PREFIX}{number}"
        staging.mkdir()
        try:
            # copyfile follows a symlinked source: the version gets files of its own.
            served = staging / onnx_file_name(config)
            served.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(onnx_file, served)
            for location in external_data_files(onnx_file):
                (served.parent / location).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(onnx_file.parent / location, served.parent / location)
            if is_python_model(config):
                newest = self.versions()
                model_py = self.path / str(newest[-1]) / PYTHON_MODEL_FILE if newest else STOCK_MODEL_PY
                shutil.copyfile(model_py if model_py.is_file() else STOCK_MODEL_PY, staging / PYTHON_MODEL_FILE)
                # The stub would write model.py's bytecode into the version folder when it first loads it, and
                # Triton reloads a version whose folder changed at the model's next load (the next publish).
                py_compile.compile(str(staging / PYTHON_MODEL_FILE), doraise=True)
            for name, text in (extra_files or {}).items():
                (staging / name).write_text(text)
            for folder, _, files in os.walk(staging, topdown=False):
                for name in files:
                    _fsync_file(Path(folder) / name)
                _fsync_dir(Path(folder))
            target = self.path / str(number)
            os.rename(staging, target)
            _fsync_dir(self.path)
        except Exception:
            shutil.rmtree(staging, ignore_errors=True)  # hidden from Triton: no need for one rename here
            raise
        return target

    def record_intent(self, number: int, source: Path) -> None:
        """Record that version `number` is being published, before anything of it appears in the folder."""
        records = self.records()
        records["intents"][str(number)] = {"source": str(source), "pid": os.getpid(), "started": _now()}
        self._write_records(records)

    def record_published(self, number: int) -> None:
        """Record that Triton reported version `number` READY, and drop its intent (one write: both or neither)."""
        records = self.records()
        records["intents"].pop(str(number), None)
        records["published"] = sorted({*records["published"], number})
        self._write_records(records)

    def _clear_intent(self, number: int) -> None:
        records = self.records()
        if records["intents"].pop(str(number), None) is not None:
            self._write_records(records)

    def _write_records(self, records: dict) -> None:
        _write_synced(self.records_file, json.dumps(records, indent=1, sort_keys=True) + "\n")

    def set_aside(self, number: int) -> Path | None:
        """Move version `number` (or its staging folder) to `failed/<n>/` in one rename and clear its intent.

        Returns where it went; None when nothing of it had been written yet.
        """
        moved = None
        for source in (self.path / str(number), self.path / f"{STAGING_PREFIX}{number}"):
            if source.is_dir():
                failed = self.path / FAILED
                if not failed.is_dir():
                    failed.mkdir()
                    _fsync_dir(self.path)
                moved = failed / str(number)
                if moved.exists():
                    raise VersionError(f"{moved} already exists: move it away first (version numbers are not reused)")
                os.rename(source, moved)
                _fsync_dir(failed)
                _fsync_dir(self.path)
        self._clear_intent(number)
        return moved

    def recover(self, log: Log) -> list[int]:
        """Settle what killed publishes left: set aside every version with an intent and no published record.

        The caller holds the lock, so no publish is under way. Returns the versions set aside.
        """
        set_aside = []
        for number in self.intents():
            started = _intent_text(self.records()["intents"][str(number)])
            moved = self.set_aside(number)
            set_aside.append(number)
            log(
                f"{self.name}: the publish of version {number} never finished ({started}); "
                + (
                    f"moved it to {moved.relative_to(self.path.parent)}, out of Triton's sight"
                    if moved is not None
                    else "nothing of it had been written"
                )
            )
        return set_aside

    def move_to_retired(self, version: int) -> None:
        """Move version `version` to `retired/<n>/`, out of Triton's sight, in one rename."""
        retired = self.path / RETIRED / str(version)
        if not retired.parent.is_dir():
            retired.parent.mkdir()
            _fsync_dir(self.path)
        if retired.exists():
            raise VersionError(f"{retired} already exists: move it away first (version numbers are not reused)")
        os.rename(self.path / str(version), retired)
        _fsync_dir(retired.parent)
        _fsync_dir(self.path)

    def restore_retired(self, version: int) -> None:
        os.rename(self.path / RETIRED / str(version), self.path / str(version))
        _fsync_dir(self.path)


def _intent_text(intent: dict) -> str:
    return f"started {intent.get('started')} by process {intent.get('pid')} from {intent.get('source')}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _fsync_dir(path: Path) -> None:
    """Make the entries of `path` (a creation, a rename) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as written:
        os.fsync(written.fileno())


def _write_synced(path: Path, text: str) -> None:
    """`text` at `path`, whole or not at all: written beside it, synced, renamed, the folder synced."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    _fsync_file(partial)
    os.replace(partial, path)
    _fsync_dir(path.parent)


def _numbered(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def external_data_files(onnx_file: Path) -> list[str]:
    """The external data files the model's tensors name, relative to its folder."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    model = onnx.load(str(onnx_file), load_external_data=False)
    return sorted({ExternalDataInfo(t).location for t in _tensors(model.graph) if uses_external_data(t)})


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for subgraph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                yield from _tensors(subgraph)
