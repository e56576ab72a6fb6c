"""The Triton Python model behind every ONNX model: the `onnxruntime` and `tritonnx` backends and each `model.py`.

`backend/stock_model.py` subclasses `OnnxRuntimeModel`; the graph is found from the model's folder
(backend/model_files.py), and everything else comes from the graph (inputs, outputs, dtypes, dims:
Triton's auto-complete) and from `config.pbtxt` (batching, queue policy, instances, ONNX Runtime
settings). This module is the only one that touches `triton_python_backend_utils`, which exists
only inside Triton's Python stub.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
import traceback
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, ClassVar

import triton_python_backend_utils as pb_utils

from tritonnx.backend.autocomplete import complete_config
from tritonnx.backend.config_check import check_config
from tritonnx.backend.errors import InvalidInputError, ModelConfigError, RequestError
from tritonnx.backend.model_files import ModelFiles, backend_config
from tritonnx.backend.onnx_io import read_graph_io


def _triton_error(error: RequestError) -> pb_utils.TritonError:
    code = pb_utils.TritonError.INVALID_ARG if isinstance(error, InvalidInputError) else pb_utils.TritonError.INTERNAL
    return pb_utils.TritonError(str(error), code)


class ModelRefused(RuntimeError):
    """Why a model cannot load: a config Triton's onnxruntime backend would refuse as an invalid argument.

    The stub reports it as pybind11 writes an exception, its class name, then its message; after python_backend's
    own status (always "Internal") it reads as the native backend's refusal: `Invalid argument: model 'm', input
    'x': ...`.
    """


ModelRefused.__name__ = ModelRefused.__qualname__ = "Invalid argument"


def _refusal(name: str, error: Exception) -> RuntimeError:
    """The refusal a client reads; a failure that is not the config's keeps its traceback, in the server's log only."""
    if not isinstance(error, ModelConfigError):
        pb_utils.Logger.log_error(f"model '{name}' failed to load:\n{traceback.format_exc()}")
        failed = type(type(error).__name__, (RuntimeError,), {})  # named as the failure's own type
        return failed(f"model '{name}': {error}")
    tensor = str(error).startswith(("input '", "output '"))
    return ModelRefused(f"model '{name}'{', ' if tensor else ': '}{error}")


def _exhausted() -> Generator[None, None, None]:
    yield from ()


_DONE = _exhausted()
next(_DONE, None)


def _apply(argument: Any, step: Callable[[Any], Any]) -> Any:
    return step(argument)


class _EntryPoint:
    """`auto_complete_config` or `initialize` as the stub calls them, refusing a model with its reason alone.

    python_backend reports an exception raised out of these with pybind11's text, which lists every Python frame it
    passed ("At: <server path>/tritonnx/backend/triton_model.py(47): auto_complete_config"), and that text is what
    a client reads in load_model's error and the repository index. So the work runs as a step of functools.reduce
    and returns normally, keeping a refusal aside; the refusal is then raised by C code alone (the throw of an
    exhausted generator, reached through map and chain), and its traceback holds no frame.
    """

    def __init__(self, method: Callable[..., Any], name_of: Callable[[Any], str]) -> None:
        self.method, self.name_of = method, name_of

    def __get__(self, instance: Any, owner: type) -> Callable[[Any], Any]:
        bound = self.method.__get__(owner if instance is None else instance, owner)
        refusals: list[RuntimeError] = []

        def step(argument: Any) -> Any:
            try:
                return bound(argument)
            except Exception as error:  # noqa: BLE001 - each becomes the load's reason, raised below
                refusals.append(_refusal(self.name_of(argument), error))
                return argument

        return functools.partial(functools.reduce, _apply, itertools.chain([step], map(_DONE.throw, refusals)))


class OnnxRuntimeModel:
    """Serves the model's ONNX file with ONNX Runtime on CPU, one session per Triton instance."""

    # Set by the model.py files of earlier releases (`Path(__file__).with_name("model.onnx")`): then the graph is that
    # file, whatever the config says.
    onnx_file: ClassVar[Path | None] = None

    @classmethod
    def _auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        """Fill in inputs, outputs and batching from the ONNX graph; the rest of the config is policy."""
        config = auto_complete_model_config.as_dict()
        files = cls._files(lambda: ModelFiles.of_stub(config))
        complete_config(auto_complete_model_config, files.onnx_file, files.config_file, pb_utils.Logger.log_info)
        return auto_complete_model_config

    auto_complete_config = _EntryPoint(_auto_complete_config, lambda config: config.as_dict().get("name", ""))

    @classmethod
    def _files(cls, located: Callable[[], ModelFiles]) -> ModelFiles:
        return ModelFiles(cls.onnx_file.parent, cls.onnx_file) if cls.onnx_file is not None else located()

    def _initialize(self, args: dict) -> None:
        # Imported here, not at the top: auto-complete runs in a stub process of its own that
        # needs none of ONNX Runtime, and loading it there (and tearing it down) slows start-up.
        import onnxruntime as ort

        from tritonnx.backend.runner import OnnxModelRunner
        from tritonnx.backend.settings import SessionSettings, cpu_instance_count, single_instance_queue_stall

        started = time.perf_counter()
        config = json.loads(args["model_config"])
        name = config["name"]
        version_folder = Path(args["model_repository"]) / args["model_version"]
        ragged = frozenset(i["name"] for i in config.get("input", []) if i.get("allow_ragged_batch"))
        settings = SessionSettings.from_model_config(config, server=backend_config(config.get("backend", "")))
        files = self._files(lambda: ModelFiles.of_version(version_folder, config))
        # The served config, auto-completed or not (--disable-auto-complete-config), held to the graph as
        # auto-complete holds it: both modes refuse the same configs with the same messages.
        graph = read_graph_io(files.onnx_file)
        check_config(config, graph)
        self.runner = OnnxModelRunner.load(
            files.onnx_file, name, settings, config.get("max_batch_size", 0), ragged, pb_utils.Logger.log_warn, graph
        )
        pb_utils.Logger.log_info(
            f"{name} instance {args['model_instance_name']} ready in {time.perf_counter() - started:.2f}s: "
            f"{settings.describe()} ({cpu_instance_count(config)} CPU instance(s)), "
            f"max_batch_size={config.get('max_batch_size', 0)} ({self.runner.batching}), ragged={sorted(ragged) or 'none'}, "
            f"providers={','.join(self.runner.session.get_providers())} (onnxruntime {ort.__version__})"
        )
        stall = single_instance_queue_stall(config)
        if stall:
            pb_utils.Logger.log_warn(f"model '{name}': {stall}")
        if settings.ignored_gpu_settings:
            pb_utils.Logger.log_warn(
                f"model '{name}': {', '.join(settings.ignored_gpu_settings)} ignored: GPU-only, and the instances are "
                "KIND_CPU (Triton's onnxruntime backend ignores them there too)"
            )

    initialize = _EntryPoint(_initialize, lambda args: json.loads(args["model_config"]).get("name", ""))

    def execute(self, requests: list) -> list:
        feeds = [{tensor.name(): tensor.as_numpy() for tensor in request.inputs()} for request in requests]
        return [self._response(result) for result in self.runner.infer(feeds)]

    @staticmethod
    def _response(result: dict | RequestError) -> pb_utils.InferenceResponse:
        if isinstance(result, RequestError):
            return pb_utils.InferenceResponse(output_tensors=[], error=_triton_error(result))
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in result.items()]
        )

    def finalize(self) -> None:
        pb_utils.Logger.log_info(f"{self.runner.signature.name}: releasing the ONNX Runtime session")
        del self.runner


class ImagePreprocessModel:
    """Image files (JPEG, PNG) to a classifier's input tensor; the first step of the image ensembles.

    Its input and output come from tritonnx.backend.image_preprocess (UINT8 [-1] bytes in, FP32 [3, 224, 224]
    out); `config.pbtxt` holds the policy. Each request is decoded on its own: a file that cannot be
    decoded fails its request, with the reason, and only it.
    """

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        from tritonnx.backend.image_preprocess import CROP, INPUT_NAME, OUTPUT_NAME

        auto_complete_model_config.add_input({"name": INPUT_NAME, "data_type": "TYPE_UINT8", "dims": [-1]})
        auto_complete_model_config.add_output({"name": OUTPUT_NAME, "data_type": "TYPE_FP32", "dims": [3, CROP, CROP]})
        return auto_complete_model_config

    def initialize(self, args: dict) -> None:
        # Pillow is loaded by the instances only, not by the auto-complete stub.
        from tritonnx.backend.image_preprocess import INPUT_NAME, OUTPUT_NAME, preprocess_requests

        self._input, self._output, self._preprocess = INPUT_NAME, OUTPUT_NAME, preprocess_requests
        pb_utils.Logger.log_info(
            f"{json.loads(args['model_config'])['name']} instance {args['model_instance_name']} ready"
        )

    def execute(self, requests: list) -> list:
        images = [pb_utils.get_input_tensor_by_name(request, self._input).as_numpy() for request in requests]
        return [
            pb_utils.InferenceResponse(output_tensors=[], error=_triton_error(result))
            if isinstance(result, RequestError)
            else pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self._output, result)])
            for result in self._preprocess(images)
        ]
