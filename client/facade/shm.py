"""Inputs handed to Triton through system shared memory instead of the socket.

The facade runs next to Triton. Sending a 600 KB image over loopback gRPC a second time costs
more CPU than anything else the facade does (kernel copies on both ends, gRPC framing), so the
facade keeps one shared-memory region registered with Triton, cut into slots (one image's worth
each), writes each request's input bytes into free adjacent slots (several for a batch) and sends
Triton only their place. Requests that find no room, or a Triton that cannot see this machine's
/dev/shm, use the socket as before.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass


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
        self.region = f"tritonnx_facade_{os.getpid()}"  # the name Triton knows it by
        self.key = f"/{self.region}"  # the POSIX shared-memory object
        self.byte_size = slots * slot_bytes
        path = f"/dev/shm{self.key}"
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # Reserved, not just sized: a sparse region in a /dev/shm too small for it (a container's
            # 64 MB) would end the process with SIGBUS on a later write, instead of failing here.
            os.posix_fallocate(descriptor, 0, self.byte_size)
            self._map = mmap.mmap(descriptor, self.byte_size)
        except OSError:
            os.unlink(path)
            raise
        finally:
            os.close(descriptor)
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
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
