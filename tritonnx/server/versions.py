"""A model's versions: publish a new one, retire one, roll back, list them, through Triton's model control.

Where versions live and how they move is model_folder.py's. A publish survives being killed at any step.
Before anything appears in the model's folder it records its intent in `<repository>/.<model>.publish.json`,
and only once Triton has reported the version READY does it record it as published there (and drop the
intent). A version with an intent and no published record was never confirmed: a server started over the
repository (`recover_repository`, before tritonserver starts), the supervisor before it restarts or reloads
a model, and the next publish move it to `failed/<n>/` and clear its intent, so that Triton's
`--load-model=*` never serves it unchecked. A version without an intent (put there by hand) is never touched.

Triton, in explicit model-control mode, loads what the model's `version_policy` selects from those
folders whenever it is asked to load the model; what it did is read back from its repository index.
Measured with 2.51: a new version loads beside the serving one, which keeps answering until the
new one is READY and is then unloaded; a load that fails leaves the versions that were serving as
they were.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tritonnx.backend.model_files import DEFAULT_ONNX_FILE
from tritonnx.client.model_control import READY, ControlError, ModelControl, States, ready_versions
from tritonnx.server.model_folder import FAILED, RECORDS_SUFFIX, RETIRED, Busy, Log, ModelFolder, VersionError
from tritonnx.server.repository import CONFIG_FILE
from tritonnx.server.signature import Signature, SignatureError, check_onnx, check_signature

# `list`'s place of a version in the repository whose publish has not finished (under way, or killed).
UNFINISHED = "unfinished"

logger = logging.getLogger("tritonnx.versions")


def recover_repository(repository: Path, log: Log = logger.warning) -> list[tuple[str, int]]:
    """Before a tritonserver starts over `repository`: set aside each version whose publish never finished.

    A model whose lock another operation holds is left to that operation; a model that cannot be settled (its
    folder not writable) is named and left as it is. Nothing is written where no publish was interrupted, so a
    read-only repository is fine. Returns the (model, version) pairs set aside.
    """
    set_aside: list[tuple[str, int]] = []
    for records in sorted(repository.glob(f".*{RECORDS_SUFFIX}")):
        folder = ModelFolder(repository / records.name[1 : -len(RECORDS_SUFFIX)])
        if folder.path.is_dir():
            set_aside += [(folder.name, n) for n in recover_model(folder, log)]
    return set_aside


def recover_model(folder: ModelFolder, log: Log = logger.warning) -> list[int]:
    """`ModelFolder.recover` under the model's lock, when it is free and there is something to settle."""
    try:
        if not folder.intents():
            return []
        with folder.locked(wait=False):
            return folder.recover(log)
    except Busy:
        log(f"{folder.name}: a version operation is under way; it settles its own version")
    except (OSError, VersionError) as error:
        log(f"{folder.name}: cannot set aside unfinished publishes ({error}); Triton may load them")
    return []


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
    moved to `failed/`, and the versions that were serving keep serving. What an earlier publish that was
    killed left is set aside once the file has passed the checks.
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
        folder.recover(log)  # this publish's load then unloads what Triton may serve of a killed one
        folder.record_intent(number, onnx_file)
        try:
            target = folder.stage(number, onnx_file, extra_files)
        except Exception:
            folder.set_aside(number)  # stage removed its staging folder: this clears the intent
            raise
        log(f"written as version {number} ({target}); loading it in Triton ...")
        try:
            control.load(folder.name)
            states = control.states(folder.name)
            if states.get(number, ("", ""))[0] != READY:
                raise ControlError(f"version {number} is not ready after its load ({states.get(number)})")
        except ControlError as error:
            moved = folder.set_aside(number)
            expected = f"; the served model: {Signature.from_config(served).describe()}" if served else ""
            raise VersionError(
                f"Triton could not load version {number} of {folder.name}: {error}{expected}\n"
                f"version {number} was moved to {moved.relative_to(folder.path) if moved else FAILED} (its number is "
                f"not used again); {_after_restore(folder, control)}"
            ) from None
        folder.record_published(number)
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
    folder.move_to_retired(version)
    try:
        control.load(folder.name)
    except ControlError as error:
        folder.restore_retired(version)
        raise VersionError(
            f"Triton could not load {folder.name} without version {version}: {error}\n"
            f"version {version} is back in the repository; {_after_restore(folder, control)}"
        ) from None
    return Outcome(folder.name, version, control.states(folder.name))


@dataclass(frozen=True)
class VersionRow:
    """One version: where it is and Triton's state.

    Where: `repository`, `unfinished` (in the repository, its publish under way or killed), `retired`, `failed`, or
    `gone` (known to Triton only).
    """

    version: int
    place: str
    state: str
    reason: str
    default: bool  # serves requests that name no version


def list_versions(folder: ModelFolder, control: ModelControl) -> list[VersionRow]:
    states = control.states(folder.name)
    on_disk, retired, failed = set(folder.versions()), set(folder.retired()), set(folder.failed())
    unfinished = set(folder.intents()) - set(folder.published())
    ready = ready_versions(states)
    rows = []
    for version in sorted(on_disk | retired | failed | set(states)):
        if version in on_disk:
            place = UNFINISHED if version in unfinished else "repository"
        else:
            place = RETIRED if version in retired else FAILED if version in failed else "gone"
        state, reason = states.get(version, ("", ""))
        rows.append(VersionRow(version, place, state, reason, bool(ready) and version == ready[-1]))
    return rows
