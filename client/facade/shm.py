"""Inputs handed to Triton through system shared memory instead of the socket.

The facade runs next to Triton. Sending a 600 KB image over loopback gRPC a second time costs
more CPU than anything else the facade does (kernel copies on both ends, gRPC framing), so the
facade keeps one shared-memory region registered with Triton, cut into slots (one image's worth
each), writes each request's input bytes into free adjacent slots (several for a batch) and sends
Triton only their place. Requests that find no room, or a Triton that cannot see this machine's
/dev/shm, use the socket as before.

A region is named after the facade's process and a random part, and the facade holds a lock on it for its life: a
facade that crashed (SIGKILL, out of memory) leaves its region behind, and the next facade to start removes the
regions whose lock nobody holds (`remove_stale_regions`), whatever their process ids (in a container a restarted
facade often gets the same one).
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tritonnx.facade")

SHM_DIR = Path("/dev/shm")
REGION_PREFIX = "tritonnx_facade_"


def region_prefix(pid: int) -> str:
    """How the names of the regions of the facade with process id `pid` start."""
    return f"{REGION_PREFIX}{pid}_"


def remove_stale_regions() -> list[str]:
    """Unlink the regions of facades that are gone (nobody holds their lock); their names."""
    removed = []
    for path in sorted(SHM_DIR.glob(f"{REGION_PREFIX}*")):
        try:
            descriptor = os.open(path, os.O_RDWR)
        except OSError:
            continue  # gone meanwhile, or another user's
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            continue  # a running facade's
        try:
            path.unlink(missing_ok=True)
            removed.append(path.name)
        finally:
            os.close(descriptor)
    return removed


@dataclass(frozen=True)
class Slot:
    """`count` adjacent slots from `index`: one request's inputs, one after the other from `offset`."""

    index: int
    offset: int
    count: int = 1


class SharedInputPool:
    """A /dev/shm region of `slots` x `slot_bytes`; a request takes as many adjacent slots as its inputs need."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        self.byte_size = slots * slot_bytes
        while True:
            self.region = f"{region_prefix(os.getpid())}{secrets.token_hex(4)}"  # the name Triton knows it by
            self.key = f"/{self.region}"  # the POSIX shared-memory object
            path = SHM_DIR / self.region
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            # Held until the process ends: a region whose lock is free is a crashed facade's.
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            if os.fstat(descriptor).st_nlink:
                break
            os.close(descriptor)  # taken for stale by a starting facade before the lock was held: another name
        try:
            # Reserved, not just sized: a sparse region in a /dev/shm too small for it (a container's
            # 64 MB) would end the process with SIGBUS on a later write, instead of failing here.
            os.posix_fallocate(descriptor, 0, self.byte_size)
            self._map = mmap.mmap(descriptor, self.byte_size)
        except OSError:
            os.unlink(path)
            os.close(descriptor)
            raise
        self._lock = descriptor
        self._path = path
        self._taken = bytearray(slots)  # 1 where a slot is in use
        self._free = slots

    def acquire(self, nbytes: int) -> Slot | None:
        """Adjacent free slots that hold `nbytes` (the first run that fits), or None: too big, or none free."""
        count = max(1, -(-nbytes // self.slot_bytes))
        if count > self._free:
            return None
        index = self._taken.find(bytes(count))
        if index < 0:
            return None
        self._taken[index : index + count] = b"\x01" * count
        self._free -= count
        return Slot(index, index * self.slot_bytes, count)

    def write(self, slot: Slot, offset: int, payload: memoryview) -> None:
        start = slot.offset + offset
        self._map[start : start + len(payload)] = payload

    @property
    def in_use(self) -> int:
        """Slots taken now: 0 whenever no call is on its way, whatever happened to the calls before."""
        return len(self._taken) - self._free

    def release(self, slot: Slot) -> None:
        self._taken[slot.index : slot.index + slot.count] = bytes(slot.count)
        self._free += slot.count

    def close(self) -> None:
        self._map.close()
        self._path.unlink(missing_ok=True)
        os.close(self._lock)


def shared_pool(slots: int, slot_bytes: int) -> SharedInputPool | None:
    """The pool inputs travel in, or None: turned off, or no room for it in /dev/shm."""
    if not (slots and slot_bytes):
        return None
    if stale := remove_stale_regions():
        log.warning("removed %d shared-memory region(s) of facades that are gone: %s", len(stale), ", ".join(stale))
    try:
        return SharedInputPool(slots, slot_bytes)
    except OSError as error:
        log.warning(
            "inputs go over the socket: no %d MiB shared-memory region in /dev/shm (%s); give the container "
            "more (docker run --shm-size) or lower --shm-slots",
            (slots * slot_bytes) >> 20,
            error.strerror,
        )
        return None
