"""What the serving processes use, as the benchmarks see it (not how they are run: tritonnx.server.process).

Memory (PSS, since tritonserver and its stub processes share pages), CPU time, the Python stubs (found as the supervisor
finds them) and the /dev/shm files they use.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

from tritonnx.client.facade.shm import SHM_DIR, region_prefix
from tritonnx.server.supervisor import live_stubs

MIB = 2**20
VERSION_MARK = "@v"  # a stub's label: <instance>@v<version>


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by a process and its live descendants (a server's workers or stubs)."""
    total = 0.0
    with suppress(psutil.NoSuchProcess):
        for process in _tree(pid):
            with suppress(psutil.NoSuchProcess):
                total += cpu_seconds(process)
    return total


@dataclass(frozen=True)
class Usage:
    """One process at one moment."""

    rss_mib: float
    pss_mib: float
    cpu_seconds: float
    fds: int
    threads: int


def usage(process: psutil.Process) -> Usage | None:
    """What `process` uses now; None once it is gone."""
    try:
        with process.oneshot():
            memory = process.memory_full_info()
            return Usage(
                memory.rss / MIB, memory.pss / MIB, cpu_seconds(process), process.num_fds(), process.num_threads()
            )
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@dataclass(frozen=True)
class Memory:
    rss_mib: float
    pss_mib: float
    processes: int

    def as_dict(self) -> dict:
        return {"rss_mib": round(self.rss_mib, 1), "pss_mib": round(self.pss_mib, 1), "processes": self.processes}


def tree_memory(pid: int) -> Memory:
    """RSS and PSS summed over a process and all its descendants."""
    processes = _tree(pid)
    used = [u for u in map(usage, processes) if u is not None]
    return Memory(sum(u.rss_mib for u in used), sum(u.pss_mib for u in used), len(processes))


def gone(process: psutil.Process | int) -> bool:
    """Whether the process (or pid) has exited, a zombie counting as exited."""
    try:
        return (psutil.Process(process) if isinstance(process, int) else process).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def mapped_shm_files(pid: int) -> set[str]:
    """Names of the /dev/shm files a process has mapped (from /proc/<pid>/maps)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            lines = [line.rstrip("\n") for line in maps if " /dev/shm/" in line]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return set()
    return {line.split(" /dev/shm/", 1)[1].removesuffix(" (deleted)") for line in lines}


def shm_usage(names: set[str], directory: Path = SHM_DIR) -> tuple[int, int, int]:
    """(files present, bytes allocated, apparent bytes) of the named files in /dev/shm."""
    present = allocated = apparent = 0
    for name in names:
        try:
            stat = (directory / name).stat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        present += 1
        allocated += stat.st_blocks * 512
        apparent += stat.st_size
    return present, allocated, apparent


class Watcher:
    """The serving processes sampled: memory, CPU, fds, threads, and the /dev/shm files they use.

    Stubs are named `<instance>@v<version>`: a published version's stubs are new processes, not restarted ones.
    """

    def __init__(self, triton_pid: int, facade_pid: int, supervisor_pid: int | None = None) -> None:
        self.triton, self.facade = psutil.Process(triton_pid), psutil.Process(facade_pid)
        self.supervisor = psutil.Process(supervisor_pid) if supervisor_pid is not None else None
        self.shm_names: set[str] = {path.name for path in SHM_DIR.glob(f"{region_prefix(facade_pid)}*")}
        self.stub_pids: dict[str, list[int]] = {}  # label -> every pid seen, in order
        self.stub_versions: dict[str, tuple[str, str]] = {}  # label -> (model, version)
        self.all_pids: set[int] = {triton_pid, facade_pid, *([supervisor_pid] if supervisor_pid is not None else [])}
        self.missing: set[str] = set()  # stub labels seen before and absent from the last look
        self._cpu: dict[str, float] = {}
        self._previous_elapsed: float | None = None

    def processes(self) -> dict[str, psutil.Process]:
        found = {"facade": self.facade, "tritonserver": self.triton}
        if self.supervisor is not None:
            found["supervisor"] = self.supervisor
        for stub in sorted(live_stubs(self.triton.pid).values(), key=lambda stub: stub.instance):
            self.shm_names.add(stub.shm_region)
            label = f"{stub.instance}{VERSION_MARK}{stub.version}"
            self.stub_versions[label] = stub.key
            pids = self.stub_pids.setdefault(label, [])
            if not pids or pids[-1] != stub.pid:
                pids.append(stub.pid)
            self.all_pids.add(stub.pid)
            try:
                found[label] = psutil.Process(stub.pid)
            except psutil.NoSuchProcess:
                continue  # died since the look: missing
        self.missing = set(self.stub_pids) - set(found)
        return found

    def died(self) -> set[str]:
        """The missing stubs not replaced on purpose."""
        # On purpose: by a publish's newer version, or a version's auto-complete stub (it exits once the version loads).
        live = [self.stub_versions[label] for label in set(self.stub_pids) - self.missing]
        died = set()
        for label in self.missing:
            model, version = self.stub_versions.get(label, ("", ""))
            auto_complete = label.partition(VERSION_MARK)[0] == model
            newer = any(m == model and _number(v) > _number(version) for m, v in live)
            if not (auto_complete or newer):
                died.add(label)
        return died

    def sample(self, elapsed: float) -> dict:
        """One row: memory, fds, threads, cpu (cores since the last sample) of each label; PSS total; /dev/shm."""
        row: dict = {}
        pss_total = 0.0
        for label, process in self.processes().items():
            used = usage(process)
            if used is None:
                continue
            row[f"fds.{label}"], row[f"threads.{label}"] = used.fds, used.threads
            row[f"rss_mib.{label}"], row[f"pss_mib.{label}"] = round(used.rss_mib, 2), round(used.pss_mib, 2)
            pss_total += used.pss_mib
            if label in self._cpu and self._previous_elapsed is not None and elapsed > self._previous_elapsed:
                row[f"cpu.{label}"] = round(
                    (used.cpu_seconds - self._cpu[label]) / (elapsed - self._previous_elapsed), 3
                )
            self._cpu[label] = used.cpu_seconds
            self.shm_names |= mapped_shm_files(process.pid)
        self._previous_elapsed = elapsed
        present, allocated, apparent = shm_usage(self.shm_names)
        row |= {"pss_mib.total": round(pss_total, 2), "shm_files": present}
        row |= {"shm_mib": round(allocated / MIB, 3), "shm_size_mib": round(apparent / MIB, 3)}
        return row

    def alive_pids(self) -> list[int]:
        return [pid for pid in sorted(self.all_pids) if not gone(pid)]


def _number(version: str) -> int:
    return int(version) if version.isdigit() else -1
