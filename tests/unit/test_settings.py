import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.settings import SessionSettings, cpu_instance_count, single_instance_queue_stall


def config(instances: int = 1, level: int | None = None, **params: str) -> dict:
    cfg = {
        "instance_group": [{"kind": "KIND_CPU", "count": instances}],
        "parameters": {k.replace("__", "."): {"string_value": v} for k, v in params.items()},
    }
    if level is not None:
        cfg["optimization"] = {"graph": {"level": level}}
    return cfg


@pytest.mark.parametrize(("cores", "instances", "threads"), [(2, 1, 2), (2, 2, 1), (8, 3, 2), (1, 4, 1)])
def test_unset_threads_share_the_cores_between_instances(cores, instances, threads):
    settings = SessionSettings.from_model_config(config(instances), cores=cores)
    assert settings.intra_op_threads == threads
    assert settings.inter_op_threads == 1
    assert settings.parallel_execution is False


def test_explicit_thread_counts_win():
    settings = SessionSettings.from_model_config(
        config(2, intra_op_thread_count="3", inter_op_thread_count="2", execution_mode="1"), cores=2
    )
    assert (settings.intra_op_threads, settings.inter_op_threads, settings.parallel_execution) == (3, 2, True)
    options = settings.session_options()
    assert options.intra_op_num_threads == 3
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL


def test_the_servers_global_threadpool_thread_counts_replace_the_models_as_the_onnxruntime_backend_documents():
    model = config(2, intra_op_thread_count="3", inter_op_thread_count="2")
    server = {"enable-global-threadpool": "1", "intra_op_thread_count": "1", "default-max-batch-size": "8"}
    settings = SessionSettings.from_model_config(model, cores=2, server=server)
    assert (settings.intra_op_threads, settings.inter_op_threads) == (1, 1)  # unset inter: the default, 1
    off = SessionSettings.from_model_config(model, cores=2, server={**server, "enable-global-threadpool": "0"})
    assert (off.intra_op_threads, off.inter_op_threads) == (3, 2)  # without the global pool the model's own
    with pytest.raises(ModelConfigError, match="enable-global-threadpool"):
        SessionSettings.from_model_config(model, cores=2, server={"enable-global-threadpool": "maybe"})


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (None, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        (0, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        (-1, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
        (1, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
        (2, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    ],
)
def test_graph_level_follows_the_onnxruntime_backend(level, expected):
    assert SessionSettings.from_model_config(config(level=level), cores=2).graph_level == expected


def test_memory_flags_and_session_entries_reach_onnxruntime():
    settings = SessionSettings.from_model_config(
        config(enable_mem_arena="0", enable_mem_pattern="false", session__intra_op__allow_spinning="0",
               session__use_device_allocator_for_initializers="1"),
        cores=2,
    )  # fmt: skip
    options = settings.session_options()
    assert options.enable_cpu_mem_arena is False
    assert options.enable_mem_pattern is False
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    # The one session entry the onnxruntime backend's README names.
    assert options.get_session_config_entry("session.use_device_allocator_for_initializers") == "1"


@pytest.mark.parametrize(
    ("value", "devices"), [("cpu:0", "cpu:0"), ("cpu:0;cpu:1", "cpu:0;cpu:1"), ("1", "cpu:0"), ("0", "")]
)
def test_arena_shrinkage_takes_onnx_runtimes_string(value, devices):
    settings = SessionSettings.from_model_config(config(memory__enable_memory_arena_shrinkage=value), cores=2)
    options = settings.run_options()
    assert settings.arena_shrinkage == devices
    if devices:
        assert options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == devices


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"memory__enable_memory_arena_shrinkage": "gpu:0"}, "names a GPU arena; these instances run on CPU"),
        ({"memory__enable_memory_arena_shrinkage": "yes please"}, "takes ONNX Runtime's devices, e.g. 'cpu:0'"),
        ({"intra_op_thread_count": "two"}, "must be an integer"),
        ({"execution_mode": "2"}, "0 (sequential) or 1 (parallel)"),
        ({"enable_mem_arena": "maybe"}, "0/1 or true/false"),
        ({"nice": "-5"}, "may lower its own CPU priority, not raise it"),
        ({"nice": "20"}, "must be 0 (the server's priority) to 19"),
    ],
)
def test_bad_parameters_are_named(params, message):
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SessionSettings.from_model_config(config(**params), cores=2)


def test_instance_count_adds_cpu_groups():
    cfg = {"instance_group": [{"kind": "KIND_CPU", "count": 2}, {"kind": "KIND_CPU", "count": 3}]}
    assert cpu_instance_count(cfg) == 5
    assert cpu_instance_count({}) == 1


def test_priority_levels_or_a_queue_policy_in_front_of_one_instance_are_named_as_a_latency_trap():
    # Triton's JSON writes uint64 fields as strings.
    levels = {"dynamic_batching": {"priority_levels": "2", "default_priority_level": "2"}}
    stall = single_instance_queue_stall({**levels, "instance_group": [{"kind": "KIND_CPU", "count": 1}]})
    assert stall is not None and "with 2 priority levels in front of one instance" in stall and "2 instances" in stall
    assert single_instance_queue_stall(levels) is not None  # no instance group: Triton's one instance
    assert single_instance_queue_stall({**levels, "instance_group": [{"kind": "KIND_CPU", "count": 2}]}) is None
    policy = {"dynamic_batching": {"default_queue_policy": {"max_queue_size": "8"}}}
    assert "with a queue policy in front of one instance" in (single_instance_queue_stall(policy) or "")
    both = {"dynamic_batching": {**levels["dynamic_batching"], **policy["dynamic_batching"]}}
    assert "with 2 priority levels and a queue policy in" in (single_instance_queue_stall(both) or "")
    assert single_instance_queue_stall({"dynamic_batching": {}, "instance_group": [{"count": 1}]}) is None
    assert single_instance_queue_stall({}) is None


def test_oversubscribed_threads_do_not_spin_unless_the_config_says_so():
    busy = SessionSettings.from_model_config(config(2, intra_op_thread_count="2"), cores=2)
    assert busy.session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    fair = SessionSettings.from_model_config(config(2), cores=2)
    assert "session.intra_op.allow_spinning" not in fair.session_entries
    explicit = SessionSettings.from_model_config(
        config(2, intra_op_thread_count="2", session__intra_op__allow_spinning="1"), cores=2
    )
    assert explicit.session_entries["session.intra_op.allow_spinning"] == "1"


def test_threads_stop_spinning_when_a_run_ends_unless_the_config_says_so():
    default = SessionSettings.from_model_config(config(1), cores=2)
    assert default.session_options().get_session_config_entry("session.force_spinning_stop") == "1"
    assert "spinning_stop=1" in default.describe()
    kept = SessionSettings.from_model_config(config(1, session__force_spinning_stop="0"), cores=2)
    assert kept.session_options().get_session_config_entry("session.force_spinning_stop") == "0"


def accelerating(instances: int = 1, **accelerators: list) -> dict:
    return {**config(instances), "optimization": {"execution_accelerators": accelerators}}


OPENVINO = accelerating(cpu_execution_accelerator=[{"name": "openvino"}])


def test_openvino_is_refused_naming_the_wheel_where_onnx_runtime_has_no_such_provider(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(
        ModelConfigError, match="'openvino' needs ONNX Runtime's OpenVINO execution provider"
    ) as refused:
        SessionSettings.from_model_config(OPENVINO, cores=2)
    assert "install onnxruntime-openvino in place of onnxruntime" in str(refused.value)
    assert "CPUExecutionProvider" in str(refused.value)  # what this build has


def test_openvino_goes_first_on_cpu_with_the_instances_threads_and_the_cpu_provider_after_it(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["OpenVINOExecutionProvider", "CPUExecutionProvider"])
    two_instances = accelerating(2, cpu_execution_accelerator=[{"name": "openvino"}])
    settings = SessionSettings.from_model_config(two_instances, cores=4)
    assert settings.accelerators == ("OpenVINOExecutionProvider",)
    assert "accelerators=OpenVINOExecutionProvider" in settings.describe()
    [(provider, options), cpu] = settings.providers()
    assert (provider, cpu) == ("OpenVINOExecutionProvider", "CPUExecutionProvider")
    assert options["device_type"] == "CPU"
    assert json.loads(options["load_config"]) == {"CPU": {"INFERENCE_NUM_THREADS": "2"}}  # 4 cores, 2 instances
    explicit = SessionSettings.from_model_config(
        {**two_instances, "parameters": {"intra_op_thread_count": {"string_value": "3"}}}, cores=4
    )
    assert json.loads(explicit.providers()[0][1]["load_config"]) == {"CPU": {"INFERENCE_NUM_THREADS": "3"}}


def test_without_an_accelerator_the_session_has_the_cpu_provider_alone(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["OpenVINOExecutionProvider", "CPUExecutionProvider"])
    settings = SessionSettings.from_model_config(config(), cores=2)
    assert settings.accelerators == () and settings.providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize("providers", [["CPUExecutionProvider"], ["OpenVINOExecutionProvider", "CPUExecutionProvider"]])
def test_other_cpu_accelerators_are_refused_by_name(monkeypatch, providers):
    monkeypatch.setattr(ort, "get_available_providers", lambda: providers)
    with pytest.raises(ModelConfigError, match="unknown Execution Accelerator 'dnnl' is requested"):
        SessionSettings.from_model_config(accelerating(cpu_execution_accelerator=[{"name": "dnnl"}]), cores=2)


GPU_GROUP = {"instance_group": [{"name": "m_0", "kind": "KIND_GPU", "count": 1, "gpus": [0]}]}
# Triton's JSON of a config that says nothing about CUDA still carries `optimization { cuda }` with its defaults.
CUDA_DEFAULTS = {"cuda": {"graphs": False, "busy_wait_events": False, "graph_spec": [], "output_copy_stream": False}}


GPU_SETTINGS = [
    (accelerating(gpu_execution_accelerator=[{"name": "tensorrt"}]), "gpu_execution_accelerator 'tensorrt'"),
    (
        accelerating(gpu_execution_accelerator=[{"name": "cuda", "parameters": {"enable_cuda_graph": "1"}}]),
        "gpu_execution_accelerator 'cuda'",
    ),
    ({"optimization": {"cuda": {**CUDA_DEFAULTS["cuda"], "graphs": True}}}, "optimization { cuda { graphs } }"),
    (config(cudnn_conv_algo_search="1"), "parameter 'cudnn_conv_algo_search'"),
    (config(gpu_mem_limit="4294967200"), "parameter 'gpu_mem_limit'"),
    (config(arena_extend_strategy="1"), "parameter 'arena_extend_strategy'"),
    (config(do_copy_in_default_stream="0"), "parameter 'do_copy_in_default_stream'"),
    (config(enable_cuda_graph="1"), "parameter 'enable_cuda_graph'"),
    (config(trt_engine_cache_enable="1"), "parameter 'trt_engine_cache_enable'"),
]


def test_a_kind_gpu_instance_is_refused_at_load_by_name(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(ModelConfigError) as refused:
        SessionSettings.from_model_config({**config(gpu_mem_limit="1"), **GPU_GROUP}, cores=2)
    message = str(refused.value)
    assert message.startswith("instance_group 'm_0' kind KIND_GPU, parameter 'gpu_mem_limit'")
    assert "tritonnx runs ONNX Runtime on the CPU only" in message
    assert f"onnxruntime {ort.__version__} here has CPUExecutionProvider" in message


@pytest.mark.parametrize(("model_config", "named"), GPU_SETTINGS)
def test_gpu_settings_of_kind_cpu_instances_are_ignored_by_name_as_the_onnxruntime_backend_does(model_config, named):
    settings = SessionSettings.from_model_config(model_config, cores=2)
    assert settings.ignored_gpu_settings == (named,)
    assert settings.providers() == ["CPUExecutionProvider"]


def test_a_config_that_says_nothing_about_gpus_loads():
    cpu = {**config(2), "optimization": CUDA_DEFAULTS}
    cpu["instance_group"][0]["gpus"] = []
    settings = SessionSettings.from_model_config(cpu, cores=2)
    assert settings.providers() == ["CPUExecutionProvider"] and settings.ignored_gpu_settings == ()


def test_model_warmup_replaces_the_backends_own_warm_up():
    assert SessionSettings.from_model_config(config(), cores=2).warm_up
    samples = {**config(), "model_warmup": [{"name": "ones", "batch_size": 1, "inputs": {}}]}
    assert not SessionSettings.from_model_config(samples, cores=2).warm_up
    assert not SessionSettings.from_model_config(config(warm_up="0"), cores=2).warm_up


# A child process: lowers its priority with a thread already running, then starts one more, and prints the
# niceness of every thread it has.
_NICED_CHILD = """
import os, threading
from tritonnx.backend.settings import lower_cpu_priority
started, done = threading.Event(), threading.Event()
early = threading.Thread(target=lambda: (started.set(), done.wait()))
early.start(); started.wait()
lower_cpu_priority(7)
late = threading.Thread(target=done.wait)
late.start()
print(sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}))
done.set()
"""


def test_nice_lowers_every_thread_of_the_instance_and_those_it_starts_later():
    assert SessionSettings.from_model_config(config(nice="7"), cores=2).nice == 7
    assert SessionSettings.from_model_config(config(), cores=2).nice == 0
    base = os.getpriority(os.PRIO_PROCESS, 0)
    child = subprocess.run([sys.executable, "-c", _NICED_CHILD], capture_output=True, text=True, timeout=60, check=True)
    assert child.stdout.strip() == str([min(19, base + 7)])


# A child process, started with or without the library's folder on LD_LIBRARY_PATH (the dynamic loader reads it at
# start-up; a library this process has loaded would be found by its soname): the config names the library by its
# file name alone, and a session registers it.
_SONAME_CHILD = """
import sys
from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.settings import SessionSettings
config = {"model_operations": {"op_library_filename": [sys.argv[1]]}}
try:
    print(SessionSettings.from_model_config(config, cores=1).session_options().custom_op_libraries)
except ModelConfigError as error:
    print(error)
"""


def test_a_custom_operator_library_named_by_a_bare_soname_is_found_as_the_dynamic_loader_finds_it():
    from onnxruntime_extensions import get_library_path

    library = Path(get_library_path())

    def child(library_path: str) -> str:
        env = {**os.environ, "LD_LIBRARY_PATH": library_path}
        command = [sys.executable, "-c", _SONAME_CHILD, library.name]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=True).stdout

    assert child(str(library.parent)).strip() == str([library.name])
    # Elsewhere the same name is refused before any session, with the loader's reason.
    refused = child("")
    assert f"op_library_filename '{library.name}' is not a file the dynamic loader finds" in refused
    assert "LD_LIBRARY_PATH" in refused and "cannot open shared object file" in refused
