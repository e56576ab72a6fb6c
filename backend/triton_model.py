"""The Triton Python model behind every ONNX model: the `onnxruntime` and `tritonnx` backends and each `model.py`.

`backend/stock_model.py` subclasses `OnnxRuntimeModel`; the graph is found from the model's folder
(backend/model_files.py), and everything else comes from the graph (inputs, outputs, dtypes, dims:
Triton's auto-complete) and from `config.pbtxt` (batching, queue policy, instances, ONNX Runtime
settings). This module is the only one that touches `triton_python_backend_utils`, which exists
only inside Triton's Python stub.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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


class OnnxRuntimeModel:
    """Serves the model's ONNX file with ONNX Runtime on CPU, one session per Triton instance."""

    # Set by the model.py files of earlier releases (`Path(__file__).with_name("model.onnx")`): then the graph is that
    # file, whatever the config says.
    onnx_file: ClassVar[Path | None] = None

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        """Fill in inputs, outputs and batching from the ONNX graph; the rest of the config is policy."""
        config = auto_complete_model_config.as_dict()
        try:
            files = cls._files(lambda: ModelFiles.of_stub(config))
            complete_config(auto_complete_model_config, files.onnx_file, files.config_file, pb_utils.Logger.log_info)
        except ModelConfigError as error:
            raise pb_utils.TritonModelException(f"model '{config.get('name', '')}': {error}") from None
        return auto_complete_model_config

    @classmethod
    def _files(cls, located: Callable[[], ModelFiles]) -> ModelFiles:
        return ModelFiles(cls.onnx_file.parent, cls.onnx_file) if cls.onnx_file is not None else located()

    def initialize(self, args: dict) -> None:
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
        try:
            settings = SessionSettings.from_model_config(config, server=backend_config(config.get("backend", "")))
            files = self._files(lambda: ModelFiles.of_version(version_folder, config))
            # The served config, auto-completed or not (--disable-auto-complete-config), held to the graph as
            # auto-complete holds it: both modes refuse the same configs with the same messages.
            graph = read_graph_io(files.onnx_file)
            check_config(config, graph)
            self.runner = OnnxModelRunner.load(
                files.onnx_file,
                name,
                settings,
                config.get("max_batch_size", 0),
                ragged,
                pb_utils.Logger.log_warn,
                graph,
            )
        except ModelConfigError as error:
            raise pb_utils.TritonModelException(f"model '{name}': {error}") from None
        pb_utils.Logger.log_info(
            f"{name} instance {args['model_instance_name']} ready in {time.perf_counter() - started:.2f}s: "
            f"{settings.describe()} ({cpu_instance_count(config)} CPU instance(s)), "
            f"max_batch_size={config.get('max_batch_size', 0)}, ragged={sorted(ragged) or 'none'}, "
            f"providers={','.join(self.runner.session.get_providers())} (onnxruntime {ort.__version__})"
        )
        stall = single_instance_queue_stall(config)
        if stall:
            pb_utils.Logger.log_warn(f"model '{name}': {stall}")

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
