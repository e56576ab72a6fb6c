"""The first run of each instance, done at load so that no caller pays for it.

ONNX Runtime allocates its buffers on a session's first run. Warm-up feeds ones (True, "1")
shaped to the smallest request (every dynamic dim 1), because zeros are not valid input for
every model: an integer division by zero raises SIGFPE, which kills the Python stub before any
Python code can catch it, and the model never becomes ready. Where the graph divides at all
(ops in `TRAPPING_OPS`), the warm-up first runs in a forked child process: if the child dies,
the instance logs it and serves without warm-up.
"""

from __future__ import annotations

import faulthandler
import os
import resource
import signal
import time
from collections.abc import Callable

import numpy as np

from backend.tensors import TensorSpec

# Integer Div and Mod trap on a zero divisor; their element type is not known without type
# inference, so any use of them makes the warm-up run in a child first.
TRAPPING_OPS = frozenset({"Div", "Mod"})
_CHILD_POLL_SECONDS = 0.01


def warm_up_feeds(inputs: tuple[TensorSpec, ...], batched: bool) -> dict[str, np.ndarray]:
    """Ones of the smallest shape for every required input; optional inputs keep their defaults."""
    batch = (1,) if batched else ()
    feeds = {}
    for spec in inputs:
        if spec.optional:
            continue
        shape = batch + tuple(1 if d < 0 else d for d in spec.dims)
        feeds[spec.name] = np.full(shape, "1", dtype=np.object_) if spec.is_string else np.ones(shape, spec.dtype)
    return feeds


def crash_in_child(run: Callable[[], object], timeout: float) -> str | None:
    """Run `run` in a forked child; say how the child died, or None if it exited by itself.

    A Python exception in the child is not reported: the same failure then shows again, and is
    caught, when the warm-up runs in this process. The child leaves through os._exit, so nothing
    of this process (Triton's shared memory, its message queues) is cleaned up or written by it.
    """
    pid = os.fork()
    if pid == 0:  # the child: run, then leave without running any exit handler
        code = 1
        try:
            # A crash here is what the probe is for: no traceback dump, no core file.
            faulthandler.disable()
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            run()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"did not finish in {timeout:g}s"
        time.sleep(_CHILD_POLL_SECONDS)
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return None
