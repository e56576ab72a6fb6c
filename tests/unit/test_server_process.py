"""ManagedProcess: children in their own process group, gone with the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.helpers import process_gone, wait_until
from tritonnx.server.process import ManagedProcess

# A child that reports the signal Linux will send it when its parent dies (prctl PR_GET_PDEATHSIG), then waits.
CHILD = """
import ctypes, time
death_signal = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(death_signal))
print(death_signal.value, flush=True)
time.sleep(60)
"""
# A parent that starts the child as the servers are started (from its main thread or another one), prints the
# child's PID, then waits to be killed.
PARENT = """
import sys, threading, time
from pathlib import Path
from tritonnx.server.process import ManagedProcess
child = ManagedProcess(log_file=Path(sys.argv[2]))
start = lambda: child.spawn([sys.executable, "-c", sys.argv[3]])
if sys.argv[1] == "thread":
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
else:
    start()
print(child.pid, flush=True)
time.sleep(60)
"""


def start_parent(where: str, log: Path) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, where, str(log), CHILD], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def death_signal(log: Path) -> int:
    return int(wait_until(lambda: log.exists() and log.read_text().strip(), 10, "the child's report"))


def test_a_child_dies_with_the_process_that_started_it_even_when_that_one_is_killed(tmp_path):
    parent, child = start_parent("main", tmp_path / "child.log")
    try:
        assert death_signal(tmp_path / "child.log") == signal.SIGTERM
        assert os.getpgid(child) == child  # a group of its own: no signal to the parent's group reaches it
        parent.kill()
        parent.wait()
        wait_until(lambda: process_gone(child), 10, "the child after its parent was killed")
    finally:
        if not process_gone(child):
            os.killpg(child, signal.SIGKILL)


def test_a_child_started_from_another_thread_is_not_tied_to_that_thread(tmp_path):
    # Linux sends the death signal when the starting thread ends: the supervisor's restarts must not get it.
    parent, child = start_parent("thread", tmp_path / "child.log")
    try:
        assert death_signal(tmp_path / "child.log") == 0
        assert not process_gone(child)
    finally:
        parent.kill()
        parent.wait()
        os.killpg(child, signal.SIGKILL)


def test_stop_ends_the_whole_group():
    process = ManagedProcess()
    grandchild = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    process.spawn([sys.executable, "-c", grandchild])
    wait_until(lambda: psutil.Process(process.pid).children(), 10, "the grandchild")
    [sleeper] = psutil.Process(process.pid).children()
    assert process.stop(timeout=5) == -signal.SIGTERM
    wait_until(lambda: process_gone(sleeper.pid), 10, "the grandchild after stop")
