"""A model's versions in the repository: publish a new one, retire one, roll back, list them, through Triton's model control.

On disk, `<repository>/<model>/<n>/` holds version n: `model.onnx` (with its external data, if any;
the config's `default_model_filename` names it otherwise), and for a `backend: "python"` model the
stock `model.py` (the named backends `onnxruntime` and `tritonnx` need none). Triton 2.51 takes every subfolder of a model whose name starts with a
number as a version (it reads "2abc" as version 2) and ignores the others with a warning, so:

- a new version is written in `<model>/.staging-<n>/` and renamed to `<model>/<n>/` once complete:
  one rename within one filesystem, so Triton never sees a half-written version. Its model.py is
  compiled there too: Triton reloads, at the model's next load, every version whose folder holds a
  file newer than its last load, and the stub would otherwise write `__pycache__/` into the folder;
- a retired version moves to `<model>/retired/<n>/`, out of Triton's sight and kept: publishing its
  `model.onnx` again serves it again. Numbers are never reused (clients and the facade's result
  cache remember what a number answered), so the next version is one above every number on disk,
  retired ones included.

Triton, in explicit model-control mode, loads what the model's `version_policy` selects from those
folders whenever it is asked to load the model; what it did is read back from its repository index.
Measured with 2.51: a new version loads beside the serving one, which keeps answering until the
new one is READY and is then unloaded; a load that fails leaves the versions that were serving as
they were. One operation at a time per model: they take a lock file in the model's folder.
"""

from __future__ import annotations

import fcntl
import os
import py_compile
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from backend.model_files import DEFAULT_ONNX_FILE, PYTHON_MODEL_FILE, is_python_model, onnx_file_name
from backend.server.model_control import READY, ControlError, ModelControl, States, ready_versions
from backend.server.repository import CONFIG_FILE, STOCK_MODEL_PY, read_config
from backend.server.signature import Signature, SignatureError, check_onnx, check_signature

RETIRED = "retired"
STAGING_PREFIX = ".staging-"
LOCK_FILE = ".versions.lock"

Log = Callable[[str], None]


class VersionError(Exception):
    """An operation refused or failed; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class ModelFolder:
    """`<repository>/<model>`: its versions, retired versions and config.pbtxt."""

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

    def next_version(self) -> int:
        return max(self.versions() + self.retired(), default=0) + 1

    def version_policy(self) -> dict:
        return self.config().get("version_policy", {})

    @contextmanager
    def locked(self) -> Iterator[None]:
        """One operation at a time on this model (other commands wait)."""
        with open(self.path / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
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

        Written in a staging folder Triton ignores, then renamed into place.
        """
        config = self.config()
        staging = self.path / f"{STAGING_PREFIX}{number}"
        shutil.rmtree(staging, ignore_errors=True)  # left by a publish that was killed
        staging.mkdir()
        try:
            served = staging / onnx_file_name(config)
            served.parent.mkdir(parents=True, exist_ok=True)
            _copy_synced(onnx_file, served)
            for location in external_data_files(onnx_file):
                (served.parent / location).parent.mkdir(parents=True, exist_ok=True)
                _copy_synced(onnx_file.parent / location, served.parent / location)
            if is_python_model(config):
                newest = self.versions()
                model_py = self.path / str(newest[-1]) / PYTHON_MODEL_FILE if newest else STOCK_MODEL_PY
                _copy_synced(model_py if model_py.is_file() else STOCK_MODEL_PY, staging / PYTHON_MODEL_FILE)
                # The stub would write model.py's bytecode into the version folder when it first loads it, and
                # Triton reloads a version whose folder changed at the model's next load (the next publish).
                py_compile.compile(str(staging / PYTHON_MODEL_FILE), doraise=True)
            for name, text in (extra_files or {}).items():
                (staging / name).write_text(text)
            target = self.path / str(number)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return target


def _numbered(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def _copy_synced(source: Path, target: Path) -> None:
    shutil.copyfile(source, target)  # follows a symlinked source: the version gets a file of its own
    with open(target, "rb+") as written:
        os.fsync(written.fileno())


def external_data_files(onnx_file: Path) -> list[str]:
    """The external data files the model's tensors name, relative to its folder."""
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


def selected_versions(policy: dict, on_disk: list[int]) -> list[int]:
    """The versions Triton's version_policy picks from those on disk (the latest one when the config names none)."""
    if "all" in policy:
        return list(on_disk)
    if "specific" in policy:
        named = {int(v) for v in policy["specific"].get("versions", [])}
        return [v for v in on_disk if v in named]
    latest = int(policy.get("latest", {}).get("num_versions", 1))
    return sorted(on_disk)[-latest:] if latest > 0 else []


def describe_policy(policy: dict) -> str:
    if "all" in policy:
        return "all"
    if "specific" in policy:
        return f"specific {[int(v) for v in policy['specific'].get('versions', [])]}"
    return f"latest {int(policy.get('latest', {}).get('num_versions', 1))}"


def _serving(model: str, states: States) -> str:
    ready = ready_versions(states)
    if not ready:
        return f"no version of {model} is ready"
    listed = ", ".join(map(str, ready))
    return f"{model} serves version{'s' if len(ready) > 1 else ''} {listed} (requests without a version: {ready[-1]})"


@dataclass(frozen=True)
class Outcome:
    """What an operation did: the version it acted on and what Triton serves afterwards."""

    model: str
    version: int
    states: States

    @property
    def serving(self) -> str:
        return _serving(self.model, self.states)


def publish(
    folder: ModelFolder,
    onnx_file: Path,
    control: ModelControl,
    allow_signature_change: bool = False,
    log: Log = print,
    extra_files: Mapping[str, str] | None = None,
) -> Outcome:
    """Check `onnx_file`, write it (and `extra_files`, name: text) as the model's next version and have Triton load it.

    A file that fails a check is refused before anything is written; one that Triton fails to load is
    removed again, and the versions that were serving keep serving.
    """
    with folder.locked():
        number = folder.next_version()
        policy = folder.version_policy()
        if number not in selected_versions(policy, [*folder.versions(), number]):
            raise VersionError(
                f"{folder.name}'s version_policy ({describe_policy(policy)}, in config.pbtxt) would not serve version "
                f"{number}: add {number} to it, then publish again"
            )
        log(f"checking {onnx_file} ...")
        served = control.served_config(folder.name)
        try:
            graph = check_onnx(onnx_file)
            log("it loads in ONNX Runtime")
            check_signature(folder.name, folder.path / CONFIG_FILE, graph, served, allow_signature_change, log)
        except SignatureError as error:
            raise VersionError(f"{onnx_file} was not published: {error}") from None
        target = folder.stage(number, onnx_file, extra_files)
        log(f"written as version {number} ({target}); loading it in Triton ...")
        try:
            control.load(folder.name)
            states = control.states(folder.name)
            if states.get(number, ("", ""))[0] != READY:
                raise ControlError(f"version {number} is not ready after its load ({states.get(number)})")
        except ControlError as error:
            shutil.rmtree(target)
            expected = f"; the served model: {Signature.from_config(served).describe()}" if served else ""
            raise VersionError(
                f"Triton could not load version {number} of {folder.name}: {error}{expected}\n"
                f"version {number} was removed from the repository; {_after_restore(folder, control)}"
            ) from None
        return Outcome(folder.name, number, states)


def _after_restore(folder: ModelFolder, control: ModelControl) -> str:
    """Load the model as its folder now stands (a no-op when the failed load changed nothing); what serves."""
    try:
        control.load(folder.name)
    except ControlError as error:
        return f"loading what remains failed too: {error}"
    return _serving(folder.name, control.states(folder.name))


def retire(folder: ModelFolder, version: int, control: ModelControl) -> Outcome:
    """Take `version` out of service and out of the repository, into `retired/`."""
    with folder.locked():
        return _retire(folder, version, control, rollback=False)


def rollback(folder: ModelFolder, control: ModelControl) -> Outcome:
    """Retire the newest version, so that the one before it serves again."""
    with folder.locked():
        versions = folder.versions()
        if len(versions) < 2:
            retired = folder.retired()
            raise VersionError(
                f"{folder.name} has no version before {versions[-1] if versions else 'none'} to roll back to"
                + (
                    f" (retired: {', '.join(map(str, retired))}; publish one's {RETIRED}/<n>/{DEFAULT_ONNX_FILE} to serve it)"
                    if retired
                    else ""
                )
            )
        return _retire(folder, versions[-1], control, rollback=True)


def _retire(folder: ModelFolder, version: int, control: ModelControl, rollback: bool) -> Outcome:
    versions = folder.versions()
    if version not in versions:
        raise VersionError(
            f"{folder.name} has no version {version} in the repository (versions: {', '.join(map(str, versions))}"
            + (f"; retired: {', '.join(map(str, folder.retired()))})" if folder.retired() else ")")
        )
    policy = folder.version_policy()
    if "specific" in policy and version in selected_versions(policy, versions):
        raise VersionError(
            f"{folder.name}'s version_policy ({describe_policy(policy)}, in config.pbtxt) names version {version}: "
            "take it out of the policy first"
        )
    remaining = [v for v in versions if v != version]
    if not selected_versions(policy, remaining):
        raise VersionError(f"retiring version {version} would leave {folder.name} no version to serve")
    states = control.states(folder.name)
    if not rollback and ready_versions(states) == [version]:
        hint = (
            f"`rollback` retires it and serves version {selected_versions(policy, remaining)[-1]}"
            if version == versions[-1]
            else "publish the version that should serve instead first"
        )
        raise VersionError(f"version {version} is the only version of {folder.name} serving: {hint}")
    retired = folder.path / RETIRED / str(version)
    retired.parent.mkdir(exist_ok=True)
    if retired.exists():
        raise VersionError(f"{retired} already exists: move it away first (version numbers are not reused)")
    os.rename(folder.path / str(version), retired)
    try:
        control.load(folder.name)
    except ControlError as error:
        os.rename(retired, folder.path / str(version))
        raise VersionError(
            f"Triton could not load {folder.name} without version {version}: {error}\n"
            f"version {version} is back in the repository; {_after_restore(folder, control)}"
        ) from None
    return Outcome(folder.name, version, control.states(folder.name))


@dataclass(frozen=True)
class VersionRow:
    """One version: where it is (`repository`, `retired`, or `gone`: known to Triton only), and Triton's state."""

    version: int
    place: str
    state: str
    reason: str
    default: bool  # serves requests that name no version


def list_versions(folder: ModelFolder, control: ModelControl) -> list[VersionRow]:
    states = control.states(folder.name)
    on_disk, retired = set(folder.versions()), set(folder.retired())
    ready = ready_versions(states)
    rows = []
    for version in sorted(on_disk | retired | set(states)):
        place = "repository" if version in on_disk else RETIRED if version in retired else "gone"
        state, reason = states.get(version, ("", ""))
        rows.append(VersionRow(version, place, state, reason, bool(ready) and version == ready[-1]))
    return rows
