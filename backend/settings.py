"""ONNX Runtime session settings, read from a Triton model configuration.

The keys are those of Triton's onnxruntime backend, so a `config.pbtxt` written for it keeps
its meaning here: `intra_op_thread_count`, `inter_op_thread_count`, `execution_mode`,
`enable_mem_arena`, `enable_mem_pattern`, `memory.enable_memory_arena_shrinkage` (ONNX Runtime's
own string, e.g. "cpu:0"), `optimization { graph { level } }` and the custom operator libraries of
`model_operations { op_library_filename }` (registered with every session). The CPU execution
accelerator `openvino` (`optimization { execution_accelerators { cpu_execution_accelerator } }`)
puts ONNX Runtime's OpenVINO execution provider first, on CPU with the instance's intra-op threads,
and the CPU provider after it for what OpenVINO does not take, where the installed ONNX Runtime has
that provider (the `onnxruntime-openvino` wheel); elsewhere it is refused at load, naming what to
install. Any other name is refused, as by the onnxruntime backend. `KIND_GPU` instances are refused at
load by name: tritonnx runs ONNX Runtime on the CPU only. The GPU-only settings (`gpu_execution_accelerator`,
`optimization { cuda }`, the CUDA and TensorRT `parameters`) are ignored on KIND_CPU instances, as the
onnxruntime backend ignores them there; the instance's log names them. tritonnx adds any `session.*`
ONNX Runtime session config entry (the onnxruntime backend reads none), `optimized_model_cache`,
`warm_up` (off, or replaced by Triton's own `model_warmup`) and `nice` (the instance's process and
its ONNX Runtime threads at a lower CPU priority: a model's instances niced beside a latency lane's). When the instances' threads add
up to more than the cores, intra-op threads do not spin-wait unless the config says so.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnxruntime as ort

from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.session_cache import CPU_PROVIDER, KeyedSessionOptions, Providers

# Triton's onnxruntime backend levels: -1 basic, 1 basic + extended, 2 none, anything else all.
_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


SPINNING = "session.intra_op.allow_spinning"
SPINNING_STOP = "session.force_spinning_stop"
_THREAD_COUNTS = ("intra_op_thread_count", "inter_op_thread_count")
ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"
# Triton's name for the accelerator, ONNX Runtime's for its provider, and the wheel that has it.
OPENVINO = "openvino"
OPENVINO_PROVIDER = "OpenVINOExecutionProvider"
OPENVINO_WHEEL = "onnxruntime-openvino"
# ONNX Runtime's value for it: the devices whose arenas shrink after each run, "cpu:0" (";"-separated).
_SHRINKAGE = re.compile(r"^cpu:\d+(;cpu:\d+)*$")


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0))


def cpu_instance_count(model_config: dict) -> int:
    """How many KIND_CPU instances Triton creates for the model (each a stub process)."""
    groups = model_config.get("instance_group") or [{"count": 1}]
    return max(1, sum(int(g.get("count", 1)) for g in groups if g.get("kind", "KIND_CPU") == "KIND_CPU"))


def single_instance_queue_stall(model_config: dict) -> str | None:
    """Why the model's queue in front of a single instance is a latency trap, or None.

    Measured with tritonserver 2.51 (bench/reports/2026-11-26-lone-request): with priority levels or a queue policy
    in the dynamic batcher and one instance, one caller sending its next request as soon as an answer comes finds it
    waiting about 500 ms in Triton's queue now and then (p99 504 ms), since it arrives while the instance is still
    finishing the last; with two instances, or a batcher with neither, p99 stays at a few ms.
    """
    batcher = model_config.get("dynamic_batching") or {}
    levels = int(batcher.get("priority_levels", 0) or 0)
    policy = bool(batcher.get("default_queue_policy") or batcher.get("priority_queue_policy"))
    if not (levels or policy) or cpu_instance_count(model_config) > 1:
        return None
    what = " and ".join(
        part for part, present in ((f"{levels} priority levels", levels), ("a queue policy", policy)) if present
    )
    return (
        f"a dynamic batcher with {what} in front of one instance: tritonserver 2.51 can hold a request about 500 ms "
        "in its queue when it arrives while the instance finishes the one before; give the model 2 instances "
        "(instance_group count), or a batcher with neither"
    )


def _parameters(model_config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}


def _as_int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ModelConfigError(f"parameter '{key}' must be an integer, got '{value}'") from None


def _arena_shrinkage(value: str) -> str:
    """ONNX Runtime's string for the run option; "" when off. 1/true, this project's earlier form, mean "cpu:0"."""
    value = value.strip()
    if value.lower() in ("", "0", "false", "off"):
        return ""
    if value.lower() in ("1", "true", "on"):
        return "cpu:0"
    if value.startswith("gpu"):
        raise ModelConfigError(
            f"parameter '{ARENA_SHRINKAGE}': '{value}' names a GPU arena; these instances run on CPU"
        )
    if not _SHRINKAGE.match(value):
        raise ModelConfigError(
            f"parameter '{ARENA_SHRINKAGE}' takes ONNX Runtime's devices, e.g. 'cpu:0', not '{value}'"
        )
    return value


def _cpu_accelerators(model_config: dict) -> tuple[str, ...]:
    """The execution providers the config's CPU accelerators ask for, in order; refused by name when not here."""
    accelerators = ((model_config.get("optimization") or {}).get("execution_accelerators") or {}).get(
        "cpu_execution_accelerator"
    ) or []
    providers: list[str] = []
    for accelerator in accelerators:
        name = accelerator.get("name", "")
        if name != OPENVINO:
            raise ModelConfigError(f"execution_accelerators: unknown Execution Accelerator '{name}' is requested")
        available = ort.get_available_providers()
        if OPENVINO_PROVIDER not in available:
            raise ModelConfigError(
                f"execution_accelerators: cpu_execution_accelerator '{OPENVINO}' needs ONNX Runtime's OpenVINO "
                f"execution provider, which this build (onnxruntime {ort.__version__}: {', '.join(available)}) does "
                f"not have: install {OPENVINO_WHEEL} in place of onnxruntime where tritonserver's Python stub runs, "
                "or remove the accelerator to serve with the CPU provider (served on this project's CPU it did not beat "
                "the CPU provider: bench/reports/2026-11-25-openvino)"
            )
        if OPENVINO_PROVIDER not in providers:
            providers.append(OPENVINO_PROVIDER)
    return tuple(providers)


# Parameters the onnxruntime backend reads for its CUDA provider only (its README's deprecated ones), and the CUDA and
# TensorRT provider options its README names, should they be written as parameters.
GPU_PARAMETERS = frozenset(
    {
        "cudnn_conv_algo_search",
        "gpu_mem_limit",
        "arena_extend_strategy",
        "do_copy_in_default_stream",
        "cudnn_conv_use_max_workspace",
        "use_ep_level_unified_stream",
        "enable_cuda_graph",
        "precision_mode",
        "max_workspace_size_bytes",
        "int8_calibration_table_name",
        "int8_use_native_calibration_table",
    }
)
GPU_PARAMETER_PREFIX = "trt_"


def _gpu_groups(model_config: dict) -> list[str]:
    return [
        f"instance_group '{group.get('name') or index}' kind KIND_GPU"
        for index, group in enumerate(model_config.get("instance_group") or [])
        if group.get("kind") == "KIND_GPU"
    ]


def gpu_settings(model_config: dict) -> list[str]:
    """The config's GPU-only settings by name: GPU accelerators, `optimization { cuda }`, the GPU parameters.

    Triton's onnxruntime backend reads them for KIND_GPU instances only; on KIND_CPU ones it ignores them.
    """
    optimization = model_config.get("optimization") or {}
    accelerators = (optimization.get("execution_accelerators") or {}).get("gpu_execution_accelerator") or []
    found = [f"gpu_execution_accelerator '{accelerator.get('name', '')}'" for accelerator in accelerators]
    cuda = optimization.get("cuda") or {}
    found += [f"optimization {{ cuda {{ {key} }} }}" for key, value in cuda.items() if value]
    params = _parameters(model_config)
    return found + [
        f"parameter '{key}'" for key in params if key in GPU_PARAMETERS or key.startswith(GPU_PARAMETER_PREFIX)
    ]


def _refuse_gpu_instances(model_config: dict) -> tuple[str, ...]:
    """Refuse KIND_GPU instances by name; the GPU settings a KIND_CPU instance ignores, as the native backend does.

    Triton's core refuses KIND_GPU itself where it finds no GPU; on a machine with one it would start the instances,
    which would then compute on the CPU and each take a share of its cores: refused here as well.
    """
    groups = _gpu_groups(model_config)
    if groups:
        raise ModelConfigError(
            f"{', '.join(groups + gpu_settings(model_config))}: GPU setting(s), and tritonnx runs ONNX Runtime on the "
            f"CPU only (onnxruntime {ort.__version__} here has {', '.join(ort.get_available_providers())}); use "
            "KIND_CPU instances, or serve the model with Triton's own onnxruntime backend on a GPU"
        )
    return tuple(gpu_settings(model_config))


def _custom_op_libraries(model_config: dict) -> tuple[str, ...]:
    """The config's custom operator libraries, each one ONNX Runtime will find, as it will look for it.

    ONNX Runtime hands the name to dlopen: a name with a slash is a path (a relative one from tritonserver's working
    directory); a bare name (`libfoo.so`) is looked for by the dynamic loader (LD_LIBRARY_PATH, the ldconfig cache,
    the system's library folders), as with Triton's onnxruntime backend. Loading it here is what the session would do.
    """
    libraries = tuple((model_config.get("model_operations") or {}).get("op_library_filename") or ())
    for library in libraries:
        if "/" not in library:
            try:
                ctypes.CDLL(library)
            except OSError as error:
                raise ModelConfigError(
                    f"model_operations: op_library_filename '{library}' is not a file the dynamic loader finds: a name "
                    "without a slash is looked for in LD_LIBRARY_PATH, the ldconfig cache and the system's library "
                    f"folders, not in tritonserver's working directory ({error})"
                ) from None
        elif not os.path.isfile(library):
            raise ModelConfigError(
                f"model_operations: op_library_filename '{library}' is not a file (a relative path is taken from "
                f"tritonserver's working directory, {os.getcwd()})"
            )
    return libraries


def _niceness(value: str) -> int:
    nice = _as_int("nice", value)
    if not 0 <= nice <= 19:
        raise ModelConfigError(
            f"parameter 'nice' must be 0 (the server's priority) to 19 (the lowest), got {nice}: a process may "
            "lower its own CPU priority, not raise it"
        )
    return nice


def lower_cpu_priority(nice: int) -> None:
    """Run every thread of this process, and the threads it starts later, `nice` steps below the server.

    Linux keeps a niceness per thread and a new thread takes its creator's: the stub's threads are set one by one,
    before the session starts ONNX Runtime's pools.
    """
    if nice <= 0:
        return
    base = os.getpriority(os.PRIO_PROCESS, 0)
    for task in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task), min(19, base + nice))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile


def _as_bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise ModelConfigError(f"parameter '{key}' must be 0/1 or true/false, got '{value}'")


@dataclass(frozen=True)
class SessionSettings:
    """Everything needed to build one instance's ONNX Runtime session."""

    intra_op_threads: int
    inter_op_threads: int
    parallel_execution: bool
    graph_level: ort.GraphOptimizationLevel
    enable_mem_arena: bool = True
    enable_mem_pattern: bool = True
    arena_shrinkage: str = ""  # the devices of ONNX Runtime's run option; "": the arena keeps its memory
    session_entries: dict[str, str] = field(default_factory=dict)
    optimized_model_cache: bool = True
    warm_up: bool = True
    custom_op_libraries: tuple[str, ...] = ()  # as written: a relative path is the server's working directory's
    accelerators: tuple[str, ...] = ()  # execution providers put before the CPU provider, e.g. OpenVINO's
    nice: int = 0  # the niceness the instance's process and threads run at (0: the server's own)
    ignored_gpu_settings: tuple[str, ...] = ()  # GPU-only settings of the config, which KIND_CPU instances ignore

    @classmethod
    def from_model_config(
        cls, model_config: dict, cores: int | None = None, server: Mapping[str, str] | None = None
    ) -> SessionSettings:
        """Read the settings; unset thread counts share the cores evenly between the model's own instances.

        Each Triton CPU instance is its own process with its own session: letting every session
        take all cores (ONNX Runtime's default) oversubscribes the machine as soon as two
        instances run at once. Other models on the server are not counted: which of them are loaded,
        and which take load at the same time, is not the backend's to know (docs/models.md says how
        to set the counts then). `server` is tritonserver's `--backend-config` for the model's backend:
        with `enable-global-threadpool=1` its `intra_op_thread_count` and `inter_op_thread_count` replace
        the model's, as the onnxruntime backend documents. (Its one pool per server process is here one
        pool per instance process, which holds one session: the same counts, no sharing to gain.)
        """
        params = _parameters(model_config)
        ignored = _refuse_gpu_instances(model_config)
        accelerators = _cpu_accelerators(model_config)
        if _as_bool("enable-global-threadpool", (server or {}).get("enable-global-threadpool", "0")):
            params = {k: v for k, v in params.items() if k not in _THREAD_COUNTS}
            params |= {k: v for k, v in (server or {}).items() if k in _THREAD_COUNTS}
        cores = cores or available_cores()
        instances = cpu_instance_count(model_config)
        fair_share = max(1, cores // instances)
        intra = _as_int("intra_op_thread_count", params.get("intra_op_thread_count", "0")) or fair_share
        entries = {k: v for k, v in params.items() if k.startswith("session.")}
        if intra * instances > cores:
            # More threads than cores: a thread that spin-waits for work steals the core another
            # instance is computing on. Measured on resnet50 (2 instances x 2 threads, 2 cores):
            # single-request latency 76 ms with spinning, 45 ms without.
            entries.setdefault(SPINNING, "0")
        # Threads that spin on after a run ends burn the cores tritonserver, the stub and the next request's
        # transport need between requests; spinning within a run, where it pays, is kept.
        entries.setdefault(SPINNING_STOP, "1")
        inter = _as_int("inter_op_thread_count", params.get("inter_op_thread_count", "0")) or 1
        mode = _as_int("execution_mode", params.get("execution_mode", "0"))
        if mode not in (0, 1):
            raise ModelConfigError(f"parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got {mode}")
        level = int(((model_config.get("optimization") or {}).get("graph") or {}).get("level", 0))
        return cls(
            intra_op_threads=intra,
            inter_op_threads=inter,
            parallel_execution=mode == 1,
            graph_level=_GRAPH_LEVELS.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
            enable_mem_arena=_as_bool("enable_mem_arena", params.get("enable_mem_arena", "1")),
            enable_mem_pattern=_as_bool("enable_mem_pattern", params.get("enable_mem_pattern", "1")),
            arena_shrinkage=_arena_shrinkage(params.get(ARENA_SHRINKAGE, "")),
            session_entries=entries,
            optimized_model_cache=_as_bool("optimized_model_cache", params.get("optimized_model_cache", "1")),
            # Samples in Triton's own `model_warmup` replace the backend's warm-up.
            warm_up=_as_bool("warm_up", params.get("warm_up", "1")) and not model_config.get("model_warmup"),
            custom_op_libraries=_custom_op_libraries(model_config),
            accelerators=accelerators,
            nice=_niceness(params.get("nice", "0")),
            ignored_gpu_settings=ignored,
        )

    def session_options(self) -> KeyedSessionOptions:
        options = KeyedSessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        options.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if self.parallel_execution else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        options.graph_optimization_level = self.graph_level
        options.enable_cpu_mem_arena = self.enable_mem_arena
        options.enable_mem_pattern = self.enable_mem_pattern
        for key, value in self.session_entries.items():
            options.add_session_config_entry(key, value)
        for library in self.custom_op_libraries:
            options.register_custom_ops_library(library)
        return options

    def providers(self) -> Providers:
        """The session's execution providers, each with its options: the accelerators first, the CPU provider last.

        OpenVINO runs on CPU with the instance's intra-op threads (the share of the cores set above), as the CPU
        provider would; its own default takes every core in every instance. `load_config` is how ONNX Runtime
        1.23 and later take OpenVINO's properties (its `num_of_threads` option is deprecated there).
        """
        providers: list[str | tuple[str, dict[str, str]]] = []
        for provider in self.accelerators:
            if provider == OPENVINO_PROVIDER:
                threads = json.dumps({"CPU": {"INFERENCE_NUM_THREADS": str(self.intra_op_threads)}})
                providers.append((OPENVINO_PROVIDER, {"device_type": "CPU", "load_config": threads}))
        return [*providers, CPU_PROVIDER]

    def run_options(self) -> ort.RunOptions:
        options = ort.RunOptions()
        if self.arena_shrinkage:
            options.add_run_config_entry(ARENA_SHRINKAGE, self.arena_shrinkage)
        return options

    def describe(self) -> str:
        return (
            f"intra_op_threads={self.intra_op_threads} inter_op_threads={self.inter_op_threads} "
            f"execution_mode={'parallel' if self.parallel_execution else 'sequential'} "
            f"graph_level={self.graph_level.name} mem_arena={int(self.enable_mem_arena)} "
            f"spinning={self.session_entries.get(SPINNING, '1')} "
            f"spinning_stop={self.session_entries.get(SPINNING_STOP, '0')} warm_up={int(self.warm_up)}"
            + (f" custom_op_libraries={','.join(self.custom_op_libraries)}" if self.custom_op_libraries else "")
            + (f" accelerators={','.join(self.accelerators)}" if self.accelerators else "")
            + (f" nice={self.nice}" if self.nice else "")
        )
