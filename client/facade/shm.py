"""Inputs handed to Triton through system shared memory instead of the socket.

The facade runs next to Triton. Sending a 600 KB image over loopback gRPC a second time costs
more CPU than anything else the facade does (kernel copies on both ends, gRPC framing), so the
facade keeps one shared-memory region registered with Triton, cut into one slot per request it
may have in flight, writes each request's input bytes into a free slot and sends Triton only the
slot's place. Requests that do not fit a slot, or a Triton that cannot see this machine's
/dev/shm, use the socket as before.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    index: int
    offset: int


class SharedInputPool:
    """A /dev/shm region of `slots` x `slot_bytes`, with a free list of slots."""

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
        self._free = [Slot(i, i * slot_bytes) for i in reversed(range(slots))]

    def acquire(self, nbytes: int) -> Slot | None:
        """A free slot that holds `nbytes`, or None (too big, or all slots in use)."""
        if nbytes > self.slot_bytes or not self._free:
            return None
        return self._free.pop()

    def write(self, slot: Slot, offset: int, payload: memoryview) -> None:
        start = slot.offset + offset
        self._map[start : start + len(payload)] = payload

    def release(self, slot: Slot) -> None:
        self._free.append(slot)

    def close(self) -> None:
        self._map.close()
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
