import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tritonnx.client.facade.shm import SHM_DIR, SharedInputPool, region_prefix, remove_stale_regions


@pytest.fixture
def pool():
    pool = SharedInputPool(slots=3, slot_bytes=1024)
    yield pool
    pool.close()


def test_slots_hold_what_fits_and_come_back(pool):
    slots = [pool.acquire(1024), pool.acquire(10), pool.acquire(1)]
    assert all(slots) and len({s.offset for s in slots}) == 3
    assert pool.acquire(1) is None  # all in use: the caller uses the socket
    pool.release(slots[1])
    assert pool.acquire(1024).offset == slots[1].offset
    assert pool.acquire(1) is None


def test_a_batch_takes_adjacent_slots_and_waits_for_a_free_run(pool):
    batch = pool.acquire(2 * 1024 + 1)  # three slots' worth: the whole region
    assert (batch.offset, batch.count) == (0, 3)
    assert pool.acquire(1) is None
    assert pool.in_use == 3
    pool.release(batch)
    assert pool.in_use == 0  # the facade's gauge of slots held: 0 with no call on its way
    one, pair = pool.acquire(1), pool.acquire(2048)
    assert (one.offset, pair.offset, pair.count) == (0, 1024, 2)
    pool.release(one)
    assert pool.in_use == 2
    assert pool.acquire(1025) is None  # one slot free, not two adjacent
    assert pool.acquire(4 * 1024) is None  # larger than the region
    pool.release(pair)
    assert pool.acquire(3 * 1024).count == 3


def test_bytes_written_are_what_another_process_maps(pool):
    slot = pool.acquire(800)
    payload = np.arange(200, dtype=np.float32)
    pool.write(slot, 0, memoryview(payload).cast("B"))
    pool.write(slot, 800 - 4, memoryview(np.float32([7.0])).cast("B"))
    with open(f"/dev/shm{pool.key}", "rb") as mapped:  # what Triton opens by the registered key
        mapped.seek(slot.offset)
        seen = np.frombuffer(mapped.read(800), np.float32)
    np.testing.assert_array_equal(seen[:199], payload[:199])
    assert seen[-1] == 7.0
    assert pool.byte_size == 3 * 1024 and os.path.getsize(f"/dev/shm{pool.key}") == 3 * 1024


def test_close_removes_the_region():
    pool = SharedInputPool(slots=1, slot_bytes=64)
    path = f"/dev/shm{pool.key}"
    assert os.path.exists(path)
    pool.close()
    assert not os.path.exists(path)


def test_a_region_that_does_not_fit_in_dev_shm_is_refused_at_once_and_the_gateway_uses_the_socket(monkeypatch, caplog):
    import errno
    import os

    from tritonnx.client.facade import shm

    def full(descriptor, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(OSError):
        shm.SharedInputPool(4, 1 << 20)
    assert set(os.listdir("/dev/shm")) == before  # nothing left behind
    with caplog.at_level("WARNING", logger="tritonnx.facade"):
        assert shm.shared_pool(4, 1 << 20) is None
    assert "inputs go over the socket: no 4 MiB shared-memory region" in caplog.text


CRASHING_FACADE = """
import os, signal
from tritonnx.client.facade.shm import SharedInputPool
pool = SharedInputPool(slots=1, slot_bytes=64)
print(pool.region, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_crashed_facades_region_is_removed_and_a_running_ones_kept(pool):
    crashed = subprocess.run([sys.executable, "-c", CRASHING_FACADE], capture_output=True, text=True)
    assert crashed.returncode == -signal.SIGKILL
    left = crashed.stdout.strip()
    assert left.startswith("tritonnx_facade_")
    assert (SHM_DIR / left).exists()  # what a SIGKILL leaves
    removed = remove_stale_regions()
    assert left in removed and not (SHM_DIR / left).exists()
    assert pool.region not in removed and (SHM_DIR / pool.region).exists()


def test_every_region_has_a_name_of_its_own_even_in_one_process(pool):
    other = SharedInputPool(slots=1, slot_bytes=64)
    try:
        assert pool.region != other.region
        assert pool.region.startswith(region_prefix(os.getpid())) and other.region.startswith(
            region_prefix(os.getpid())
        )
    finally:
        other.close()
