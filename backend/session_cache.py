"""An optimized copy of each model, written once, so that instances start faster.

Building an ONNX Runtime session optimizes the graph every time: 0.2-0.5 s for resnet50 on two
cores, in every instance, on every start. A session built from the already optimized copy with
optimizations off takes 0.03 s. The copy is keyed by the model file (path, size, modification
time), every session setting that can change the optimized graph (the optimization level, each
session config entry, the custom operator libraries), the ONNX Runtime version and the CPU (an
optimized graph may use layouts of this CPU's vector extensions), so a changed model or setting,
an upgrade or another machine never reads a stale copy. Thread counts, the execution mode and the
memory flags are left out: the optimized graphs of a transformer encoder had the same nodes with
each of them changed. The key can only hold what it sees: options given as `KeyedSessionOptions`,
which remember their entries (ONNX Runtime reads an entry back by its key, it cannot list them);
plain `SessionOptions` build from the model file every time. Instances write their own temporary file and rename it into place, so
instances starting together do not trip over each other. Only the most recently used copies of
each model name are kept.

Only sessions of the CPU provider alone use it: the copy is the graph as the CPU provider
optimizes it (its fused kernels, its layouts), which another provider such as OpenVINO would get
as nodes it does not know and hand back to the CPU provider piece by piece. A session with other
providers is built from the model file every time.

The cache lives in $TRITONNX_ORT_CACHE_DIR, else ~/.cache/tritonnx/ort; an unwritable
directory or a model too large to save in one file just means no cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path

import onnxruntime as ort

CACHE_DIR_ENV = "TRITONNX_ORT_CACHE_DIR"
# Protobuf's 2 GiB limit: larger models keep their weights in external files, which this cache
# does not handle.
_LARGEST_MODEL_BYTES = 1 << 30
_QUIET = 3  # ONNX Runtime log severity ERROR: saving warns that the copy is CPU-specific, which the key covers
COPIES_KEPT_PER_MODEL = 2
CPU_PROVIDER = "CPUExecutionProvider"
CPU_ONLY = (CPU_PROVIDER,)
Providers = Sequence[str | tuple[str, dict[str, str]]]  # as InferenceSession takes them


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tritonnx" / "ort"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return ""


class KeyedSessionOptions(ort.SessionOptions):
    """Session options that remember the config entries and custom operator libraries given to them."""

    def __init__(self) -> None:
        super().__init__()
        self.config_entries: dict[str, str] = {}
        self.custom_op_libraries: list[str] = []

    def add_session_config_entry(self, key: str, value: str) -> None:
        super().add_session_config_entry(key, value)
        self.config_entries[key] = value

    def register_custom_ops_library(self, library: str) -> None:
        super().register_custom_ops_library(library)
        self.custom_op_libraries.append(library)


def cache_key(onnx_file: Path, options: KeyedSessionOptions) -> str:
    stat = onnx_file.stat()
    identity = json.dumps(
        [
            str(onnx_file.resolve()),
            stat.st_size,
            stat.st_mtime_ns,
            options.graph_optimization_level.name,
            sorted(options.config_entries.items()),
            options.custom_op_libraries,
            ort.__version__,
            platform.machine(),
            _cpu_flags(),
        ]
    )
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def create_session(
    onnx_file: Path,
    options: ort.SessionOptions,
    cache_dir: Path | None,
    log: Callable[[str], None],
    providers: Providers = CPU_ONLY,
) -> ort.InferenceSession:
    """A session for `onnx_file` with `providers`.

    With the CPU provider alone and `KeyedSessionOptions`, it is built from the optimized copy when there is one (and
    makes it when not).
    """
    providers = list(providers)
    level = options.graph_optimization_level
    if (
        cache_dir is None
        or not isinstance(options, KeyedSessionOptions)
        or tuple(providers) != CPU_ONLY
        or level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        or (onnx_file.stat().st_size > _LARGEST_MODEL_BYTES)
    ):
        return ort.InferenceSession(str(onnx_file), options, providers=providers)
    model = onnx_file.parent.parent.name
    cached = cache_dir / f"{model}-{cache_key(onnx_file, options)}.onnx"
    if cached.exists():
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = ort.InferenceSession(str(cached), options, providers=providers)
        except Exception as error:  # noqa: BLE001 - a damaged copy is rebuilt below
            log(f"optimized copy {cached} unusable ({error}); optimizing the model again")
            options.graph_optimization_level = level
        else:
            with contextlib.suppress(OSError):  # a read-only cache serves as it is
                os.utime(cached)  # recently used: kept when older copies are dropped
            return session
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(cache_dir, os.W_OK):
            raise PermissionError(f"{cache_dir} is not writable")
    except OSError as error:
        log(f"no optimized-model cache ({error})")
        return ort.InferenceSession(str(onnx_file), options, providers=providers)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
    options.optimized_model_filepath = str(partial)
    options.log_severity_level = _QUIET
    try:
        session = ort.InferenceSession(str(onnx_file), options, providers=providers)
    except Exception as error:  # noqa: BLE001 - ONNX Runtime may fail writing the copy: serve without it
        partial.unlink(missing_ok=True)
        log(f"could not write an optimized copy of {onnx_file.name} ({error}); serving without it")
        options.optimized_model_filepath = ""
        return ort.InferenceSession(str(onnx_file), options, providers=providers)
    try:
        os.replace(partial, cached)
    except OSError as error:
        log(f"could not keep the optimized copy of {onnx_file.name} ({error})")
        partial.unlink(missing_ok=True)
    _drop_old_copies(cache_dir, model)
    return session


def _drop_old_copies(cache_dir: Path, model: str) -> None:
    """Keep the most recently used copies of this model name (other versions, other checkouts)."""
    used: dict[Path, float] = {}
    for copy in cache_dir.glob(f"{model}-*.onnx"):
        try:
            used[copy] = copy.stat().st_mtime
        except FileNotFoundError:  # another instance dropped it just now
            continue
    for old in sorted(used, key=lambda copy: used[copy], reverse=True)[COPIES_KEPT_PER_MODEL:]:
        old.unlink(missing_ok=True)
