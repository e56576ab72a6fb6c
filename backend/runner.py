"""Run the requests of one Triton batch through a single ONNX Runtime session.

This is the whole execution path of a served model, free of Triton: validate each request, run
compatible requests together, split the outputs back, and make sure a failure belongs only to the
request that caused it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from backend.batching import group_compatible, split, stack
from backend.errors import InvalidInputError, ModelExecutionError, RequestError
from backend.session_cache import create_session, default_cache_dir
from backend.settings import SessionSettings
from backend.tensors import TensorSpec, spec_from_ort
from backend.validation import ModelSignature, validate_request

Tensors = Mapping[str, np.ndarray]
Result = dict[str, np.ndarray] | RequestError

# ONNX Runtime's messages name its own source files and C++ functions; a caller needs neither.
_ORT_SOURCE = re.compile(r"\S*onnxruntime_src/\S+:\d+ (?:[^()]*\([^)]*\) )?")


def _caller_message(error: Exception) -> str:
    return _ORT_SOURCE.sub("", str(error)).strip()


def read_io(session: ort.InferenceSession, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs of a session's graph, batch dim removed when `batched`."""
    inputs = tuple(spec_from_ort(arg, batched) for arg in session.get_inputs())
    outputs = tuple(spec_from_ort(arg, batched) for arg in session.get_outputs())
    return inputs, outputs


class OnnxModelRunner:
    """Serves batches of requests with one session; `infer` never raises for a request's fault."""

    def __init__(
        self,
        session: ort.InferenceSession,
        signature: ModelSignature,
        run_options: ort.RunOptions | None = None,
        log: Callable[[str], None] = logging.getLogger(__name__).warning,
    ) -> None:
        self.session = session
        self.signature = signature
        self.run_options = run_options
        self._log = log
        self._output_names = [spec.name for spec in signature.outputs]
        # Once the model has run (warm-up included), a lone request that passed validation but
        # fails is blamed on its input (a sequence longer than the model's position table, an id
        # outside its vocabulary). A batch whose requests all fail alone is the model's failure.
        self._has_run = False

    @classmethod
    def load(
        cls,
        onnx_file: Path,
        name: str,
        settings: SessionSettings,
        max_batch_size: int,
        ragged_inputs: frozenset[str] = frozenset(),
        log: Callable[[str], None] = logging.getLogger(__name__).warning,
    ) -> "OnnxModelRunner":
        cache_dir = default_cache_dir() if settings.optimized_model_cache else None
        session = create_session(onnx_file, settings.session_options(), cache_dir, log)
        inputs, outputs = read_io(session, max_batch_size > 0)
        signature = ModelSignature(name, inputs, outputs, max_batch_size, frozenset(ragged_inputs))
        runner = cls(session, signature, settings.run_options(), log)
        runner.warm_up()
        return runner

    def warm_up(self) -> None:
        """Run the smallest request (zeros, every free dim 1) once: ONNX Runtime allocates on its
        first run, which would otherwise land on the first caller."""
        batch = (1,) if self.signature.batched else ()
        feeds = {
            spec.name: np.zeros(batch + tuple(1 if d < 0 else d for d in spec.dims), spec.dtype)
            for spec in self.signature.inputs
        }
        try:
            self._run(feeds)
        except Exception as error:  # noqa: BLE001 - zeros are not valid input for every model
            self._log(f"model '{self.signature.name}': warm-up with zeros failed ({error}); serving anyway")

    def infer(self, requests: Sequence[Tensors]) -> list[Result]:
        """One result per request, in order: its outputs, or the error that ended it alone."""
        results: list[Result | None] = [None] * len(requests)
        batch_sizes: dict[int, int] = {}
        for index, request in enumerate(requests):
            try:
                batch_sizes[index] = validate_request(request, self.signature)
            except InvalidInputError as error:
                results[index] = error

        if self.signature.batched:
            groups = group_compatible(requests, list(batch_sizes), self.signature)
        else:
            groups = [[index] for index in batch_sizes]
        for group in groups:
            self._run_group(requests, group, [batch_sizes[i] for i in group], results)
        return results  # type: ignore[return-value]  # every slot is filled above

    def _run_group(
        self, requests: Sequence[Tensors], group: list[int], sizes: list[int], results: list[Result | None]
    ) -> None:
        try:
            outputs = self._run(stack([requests[i] for i in group], self.signature))
        except Exception as error:  # noqa: BLE001 - ONNX Runtime raises many unrelated types
            if len(group) == 1:
                results[group[0]] = self._request_error(error, blamed_alone=self._has_run)
                return
            # Someone in the batch broke the shared run: retry each request alone so that only
            # the request at fault fails.
            self._log(f"batch of {len(group)} requests failed ({error}); running them one by one")
            alone = {}
            for index in group:
                try:
                    alone[index] = self._run(stack([requests[index]], self.signature))
                except Exception as single_error:  # noqa: BLE001
                    alone[index] = single_error
            any_succeeded = any(not isinstance(v, Exception) for v in alone.values())
            for index, outcome in alone.items():
                if isinstance(outcome, Exception):
                    results[index] = self._request_error(outcome, blamed_alone=any_succeeded)
                else:
                    results[index] = outcome
            return
        for index, request_outputs in zip(group, split(outputs, sizes)):
            results[index] = request_outputs

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self.session.run(self._output_names, feeds, self.run_options)
        self._has_run = True
        return dict(zip(self._output_names, arrays))

    def _request_error(self, error: Exception, blamed_alone: bool) -> RequestError:
        """Invalid input when ONNX Runtime says so, or when the model has run fine for other requests."""
        if blamed_alone or isinstance(error, InvalidArgument):
            return InvalidInputError(f"model '{self.signature.name}' cannot run on this input: {_caller_message(error)}")
        self._log(f"model '{self.signature.name}' failed: {error}")
        return ModelExecutionError(f"model '{self.signature.name}' failed to run: {_caller_message(error)}")
