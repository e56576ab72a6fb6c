"""The first run of each instance, done at load so that no caller pays for it.

ONNX Runtime allocates its buffers on a session's first run. Warm-up feeds ones (True, "1"),
because zeros are not valid input for every model: an integer division that traps (by zero on ONNX
Runtime 1.23, the smallest integer by -1 on every release) raises SIGFPE, which kills the Python stub
before any Python code can catch it, and the model never becomes ready. Where the graph divides at all (ops in `TRAPPING_OPS`), the warm-up first runs in a forked
child process: if the child dies, the instance logs it and serves without warm-up.

The shapes tried, in turn until one runs (`warm_up_candidates`): every dynamic dim of one size,
first the smallest request (1), then longer (16, 512) for kernels and windows a single step does
not fill (an audio model's first convolution). Dims of one name get one size, a dim named for past
keys and values is 0 (an empty cache), and a dim named by an expression of such names
(`past_sequence_length + sequence_length`, an attention mask) is that sum.

The batch-independence check at load (tritonnx.backend.runner) takes the same shapes with a few rows of
pseudo-random values (`random_rows`).
"""

from __future__ import annotations

import ast
import faulthandler
import math
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np

from tritonnx.backend.tensors import TensorSpec

# Integer Div and Mod trap on a zero divisor; their element type is not known without type
# inference, so any use of them makes the warm-up run in a child first.
TRAPPING_OPS = frozenset({"Div", "Mod"})
_CHILD_POLL_SECONDS = 0.01


WARM_UP_LENGTHS = (1, 16, 512)
_MOST_ELEMENTS = 1 << 22  # per input: a try that would need more is skipped


def warm_up_candidates(inputs: tuple[TensorSpec, ...], batched: bool) -> Iterator[dict[str, np.ndarray]]:
    """Feeds of ones to try in turn, one per length of WARM_UP_LENGTHS; optional inputs keep their defaults."""
    for length in WARM_UP_LENGTHS:
        feeds = {}
        for spec in inputs:
            if spec.optional:
                continue
            names = spec.dim_names or (None,) * len(spec.dims)
            shape = (1,) * batched + tuple(
                d if d >= 0 else _dynamic_size(name, length) for d, name in zip(spec.dims, names, strict=True)
            )
            if math.prod(shape) > _MOST_ELEMENTS:
                break
            feeds[spec.name] = np.full(shape, "1", dtype=np.object_) if spec.is_string else np.ones(shape, spec.dtype)
        else:
            yield feeds


def random_rows(feeds: dict[str, np.ndarray], rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """`feeds` (of one row each) as `rows` rows of deterministic pseudo-random values, each row unlike the others.

    Floats are normal values, row i scaled by 1 + 3i (a quantizer's scale, a batch mean, move with the loudest row);
    integers are small and non-negative (ids, counts, masks), booleans random, strings single letters.
    """
    rng = np.random.default_rng(seed)
    stacked = {}
    for name, one in feeds.items():
        shape = (rows, *one.shape[1:])
        if one.dtype == np.object_:
            stacked[name] = rng.choice(np.array(list("abcdefgh"), dtype=np.object_), shape)
        elif one.dtype == np.bool_:
            stacked[name] = rng.integers(0, 2, shape).astype(np.bool_)
        elif np.issubdtype(one.dtype, np.integer):
            stacked[name] = rng.integers(0, 4, shape).astype(one.dtype)
        else:
            scale = (1 + 3 * np.arange(rows)).reshape(rows, *[1] * (len(shape) - 1))
            stacked[name] = (rng.standard_normal(shape) * scale).astype(one.dtype)
    return stacked


def _dynamic_size(name: str | None, length: int) -> int:
    if name is None:
        return length
    try:
        size = _evaluate(ast.parse(name, mode="eval").body, length)
    except SyntaxError:
        return length
    return length if size is None or size < 0 else size


def _evaluate(node: ast.expr, length: int) -> int | None:
    """A dim name's size: a past-keys name 0, any other name `length`, + - * of them; None for anything else."""
    if isinstance(node, ast.Name):
        return 0 if "past" in node.id.lower() else length
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        left, right = _evaluate(node.left, length), _evaluate(node.right, length)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        return left - right if isinstance(node.op, ast.Sub) else left * right
    return None


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
