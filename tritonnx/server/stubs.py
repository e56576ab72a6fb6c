"""Tritonserver's Python stub processes, read from their command lines, and the count that tells a dead one.

Each model instance is a stub process, a child of tritonserver, whose command line names the model
version it serves: `<repo>/<model>/<version>/model.py`. The supervisor (supervisor.py) looks at them
every few tenths of a second; `InstanceWatch` turns those looks into the versions that lost one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from tritonnx.backend.model_files import STUB_EXECUTABLE

Version = tuple[str, str]  # (model, version), as a stub's command line names them


@dataclass(frozen=True)
class Stub:
    """One Python backend stub process, from its command line.

    `stub <repo>/<model>/<version>/model.py <shm region> <sizes> <parent pid> <backend dir> <ipc> <instance> <kind>`.
    """

    pid: int
    model: str
    version: str
    instance: str
    shm_region: str

    @classmethod
    def from_command_line(cls, pid: int, args: list[str]) -> Stub | None:
        if len(args) < 9 or not args[0].endswith(STUB_EXECUTABLE):
            return None
        model_py = Path(args[1])
        return cls(pid, model_py.parent.parent.name, model_py.parent.name, args[8], args[2])

    @property
    def key(self) -> Version:
        return (self.model, self.version)

    @property
    def auto_complete(self) -> bool:
        """The stub Triton runs for a version's auto-complete while it loads: named after the model, not an instance."""
        return self.instance == self.model


def live_stubs(server_pid: int) -> dict[int, Stub]:
    """Tritonserver's live stub processes by pid (zombies and other children left out)."""
    stubs: dict[int, Stub] = {}
    try:
        children = psutil.Process(server_pid).children()
    except psutil.NoSuchProcess:
        return stubs
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                stub = Stub.from_command_line(child.pid, child.cmdline())
                if stub is not None:
                    stubs[child.pid] = stub
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return stubs


def stopped(stubs: Iterable[Stub]) -> set[int]:
    """The pids of `stubs` stopped by a signal (SIGSTOP); a debugger's stop is another state, left out."""
    found = set()
    for stub in stubs:
        try:
            if psutil.Process(stub.pid).status() == psutil.STATUS_STOPPED:
                found.add(stub.pid)
        except psutil.Error:
            continue
    return found


def instance_counts(live: dict[int, Stub]) -> Counter[Version]:
    """Live instance stubs per model version (auto-complete stubs left out: they exit by themselves)."""
    return Counter(stub.key for stub in live.values() if not stub.auto_complete)


class InstanceWatch:
    """Which model versions lost an instance, from their live stub counts, look after look.

    A version is watched once it is complete: it had all its instances (the count its served config
    gives), or Triton called it READY when that count was learned (Triton marks a version READY only
    once every instance has started, so a stub killed before the first look is caught too). A
    watched version with fewer live stubs on two looks in a row is short. Whether it died or is
    being unloaded on purpose (a swap, a retired version, a shutdown) is for Triton to say: the
    caller reloads it only if it is still READY, and otherwise `forget`s it (learned again when its
    stubs come back).
    """

    def __init__(self) -> None:
        self.expected: dict[Version, int] = {}  # instances per version, from its served config
        self.complete: set[Version] = set()
        self.suspects: set[Version] = set()  # short on the last look

    def unknown(self, counts: Counter[Version]) -> set[Version]:
        """Versions with live stubs whose instance count is not known yet."""
        return set(counts) - set(self.expected)

    def learn(self, version: Version, instances: int, ready: bool) -> None:
        self.expected[version] = instances
        if ready:
            self.complete.add(version)

    def look(self, counts: Counter[Version]) -> set[Version]:
        """The versions short on this look and on the last one.

        They are no longer complete: their new generation has to come up in full (or be learned READY) again.
        """
        short = {version for version in self.complete if counts[version] < self.expected[version]}
        self.complete |= {v for v, count in counts.items() if v in self.expected and count >= self.expected[v]}
        confirmed, self.suspects = short & self.suspects, short - self.suspects
        self.complete -= confirmed
        return confirmed

    def forget(self, version: Version) -> None:
        self.expected.pop(version, None)
        self.complete.discard(version)
        self.suspects.discard(version)

    def clear(self) -> None:
        self.expected.clear()
        self.complete.clear()
        self.suspects.clear()


def instance_count(config: dict) -> int:
    return sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
