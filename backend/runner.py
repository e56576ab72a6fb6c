"""Run the requests of one Triton batch through a single ONNX Runtime session.

This is the whole execution path of a served model, free of Triton: validate each request, run
compatible requests together, split the outputs back, and make sure a failure belongs only to the
request that caused it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from tritonnx.backend.batching import Tensors, group_compatible, split, stack
from tritonnx.backend.errors import InvalidInputError, ModelExecutionError, RequestError
from tritonnx.backend.onnx_io import GraphIO, read_graph_io
from tritonnx.backend.session_cache import create_session, default_cache_dir
from tritonnx.backend.settings import SessionSettings, lower_cpu_priority
from tritonnx.backend.validation import ModelSignature, PreparedRequest, prepare_request
from tritonnx.backend.warmup import TRAPPING_OPS, crash_in_child, random_rows, warm_up_candidates

Result = dict[str, np.ndarray] | RequestError

# ONNX Runtime's messages name its own source files and C++ functions; a caller needs neither.
_ORT_SOURCE = re.compile(r"\S*onnxruntime_src/\S+:\d+ (?:[^()]*\([^)]*\) )?")
_WARM_UP_CHILD_SECONDS = 120.0
# The batch-independence check at load: this many rows stacked, then one by one (a model's maximum permitting).
CHECK_ROWS = 3
FLOAT_TOLERANCE = {2: 1e-2, 4: 1e-4, 8: 1e-4}  # by bytes per element: FP16's 11-bit mantissa needs the wider one
_KEPT = "the rule's verdict stands: it batches"
# A graph the rule cannot judge whose check could not run either: nothing shows its rows independent.
_UNCHECKED = "the batch-axis rule cannot judge every node either ({}): each request runs alone"
_warn = logging.getLogger(__name__).warning  # where a runner logs when it is given no logger


def _shapes(feeds: Tensors) -> str:
    return ", ".join(f"{name} {list(array.shape)}" for name, array in feeds.items())


def _caller_message(error: Exception) -> str:
    return _ORT_SOURCE.sub("", str(error)).strip()


def rows_agree(stacked: Mapping[str, np.ndarray], alone: Sequence[Mapping[str, np.ndarray]]) -> str | None:
    """How the outputs of rows run stacked differ from those rows run one by one, or None when they agree.

    Stacking may change how a kernel blocks its float sums, which moves the last bits: floats agree within
    FLOAT_TOLERANCE of the output's largest magnitude (relative and absolute), as the served answers are compared
    with in-process ONNX Runtime elsewhere; rows that really mix (a batch mean, a shared quantization scale of 1/255
    of the range) move by far more. Integers, booleans and strings agree exactly.
    """
    for name, together in stacked.items():
        parts = [outputs[name] for outputs in alone]
        if together.ndim == 0 or any(p.ndim != together.ndim for p in parts):
            return f"output '{name}' has shape {list(together.shape)} stacked"
        apart = np.concatenate(parts)
        if together.shape != apart.shape:
            return f"output '{name}' has shape {list(together.shape)} stacked, {list(apart.shape)} row by row"
        if np.issubdtype(together.dtype, np.floating):
            tolerance = FLOAT_TOLERANCE.get(together.dtype.itemsize, 1e-4)
            scale = float(np.nanmax(np.abs(apart), initial=0.0)) or 1.0
            if not np.allclose(together, apart, rtol=tolerance, atol=tolerance * scale, equal_nan=True):
                worst = float(np.nanmax(np.abs(together.astype(np.float64) - apart)))
                return f"output '{name}' differs by up to {worst:.3g}, its values reach {scale:.3g}"
        elif not np.array_equal(together, apart):
            return f"output '{name}' differs in {int(np.sum(together != apart))} of {apart.size} elements"
    return None


class OnnxModelRunner:
    """Serves batches of requests with one session; `infer` never raises for a request's fault."""

    def __init__(
        self,
        session: ort.InferenceSession,
        signature: ModelSignature,
        run_options: ort.RunOptions | None = None,
        log: Callable[[str], None] = _warn,
        coupled: bool = False,
    ) -> None:
        self.session = session
        # A batch-coupled graph (found by tritonnx.backend.batch_axis, or by the check at load) runs each request alone,
        # whatever Triton's batcher gathered, so that an answer never depends on strangers' rows.
        self.coupled = coupled
        self.signature = signature
        self.run_options = run_options
        self._log = log
        self._output_names = [spec.name for spec in signature.outputs]
        # Outputs with no dims (after the batch dim) are served with a trailing dim of 1.
        self._scalar_outputs = frozenset(spec.name for spec in signature.outputs if spec.scalar)
        # Once the model has run (warm-up included), a lone request that passed validation but
        # fails is blamed on its input (a sequence longer than the model's position table, an id
        # outside its vocabulary). A batch whose requests all fail alone is the model's failure.
        self._has_run = False
        # How requests are run and why, in a few words (the instance's ready line, `tritonnx-models check`).
        self.batching = "each request runs alone" if coupled else "batches" if signature.batched else "no batch dim"

    @classmethod
    def load(
        cls,
        onnx_file: Path,
        name: str,
        settings: SessionSettings,
        max_batch_size: int,
        ragged_inputs: frozenset[str] = frozenset(),
        log: Callable[[str], None] = _warn,
        graph: GraphIO | None = None,
    ) -> OnnxModelRunner:
        """A runner of `onnx_file`'s session, warmed up and judged for batch independence.

        `graph` is the file's `read_graph_io`, when the caller has read it already.
        """
        graph = graph or read_graph_io(onnx_file)
        inputs, outputs = graph.specs(max_batch_size > 0)
        signature = ModelSignature(name, inputs, outputs, max_batch_size, frozenset(ragged_inputs))
        # An optimized copy would need the custom operator libraries to load too: such sessions build from the file
        # (create_session decides the same for providers other than the CPU's).
        cache = settings.optimized_model_cache and not settings.custom_op_libraries
        cache_dir = default_cache_dir() if cache else None
        lower_cpu_priority(settings.nice)  # before the session: its thread pools take the niceness
        session = create_session(onnx_file, settings.session_options(), cache_dir, log, settings.providers())
        coupling = graph.batch_coupling()
        if coupling and signature.batched:
            log(f"model '{name}': its rows are not independent ({coupling}): each request runs alone")
        runner = cls(session, signature, settings.run_options(), log, coupled=coupling is not None)
        if signature.batched:
            undecided = "cannot judge every node, and no check at load ran" if graph.batch_undecided() else ""
            why = "" if coupling else undecided or "finds its rows independent"
            runner.batching += f" (the batch-axis rule{' ' if why else ''}{why})"
        trapping = bool(graph.op_types & TRAPPING_OPS)
        if settings.warm_up:
            if trapping:
                runner.warm_up_in_child_first(onnx_file, settings, cache_dir)
            else:
                runner.warm_up()
        if signature.batched and max_batch_size > 1 and not runner.coupled:
            crash = runner.rows_check_in_child(onnx_file, settings, cache_dir) if trapping else None
            if crash is None:
                runner.check_rows(graph.batch_undecided())
            else:
                runner.unchecked(f"the batch-independence check {crash} in a child process", graph.batch_undecided())
        return runner

    def _check_candidates(self) -> Iterator[dict[str, np.ndarray]]:
        for ones in warm_up_candidates(self.signature.inputs, batched=True):
            yield random_rows(ones, min(CHECK_ROWS, self.signature.max_batch_size))

    def check_rows(self, undecided: str | None) -> None:
        """Run a few rows stacked and one by one: rows that disagree make each request run alone.

        The static rule (tritonnx.backend.batch_axis) names what it can show; this catches what it cannot judge or does not
        know. Floats compare within a tolerance (`rows_agree`), everything else exactly.
        """
        name, failures = self.signature.name, []
        for feeds in self._check_candidates():
            rows = len(next(iter(feeds.values())))
            try:
                stacked = self._run(feeds)
                alone = [self._run({n: a[i : i + 1] for n, a in feeds.items()}) for i in range(rows)]
            except Exception as error:  # noqa: BLE001 - not every model takes these values
                failures.append(f"{_shapes(feeds)}: {_caller_message(error)}")
                continue
            differs = rows_agree(stacked, alone)
            if differs or undecided:
                agree = "differ" if differs else "agree"
                self.batching = f"{'each request runs alone' if differs else 'batches'} (rows checked at load {agree})"
            if differs:
                self.coupled = True
                unjudged = f" the batch-axis rule cannot judge every node ({undecided});" if undecided else ""
                self._log(
                    f"model '{name}': its rows are not independent:{unjudged} {rows} rows run stacked and one by one "
                    f"disagree ({differs}): each request runs alone"
                )
            elif undecided:
                self._log(
                    f"model '{name}': the batch-axis rule cannot judge every node ({undecided}); {rows} rows run "
                    "stacked and one by one agree: it batches"
                )
            return
        self.unchecked(f"the batch-independence check could not run ({'; '.join(failures)})", undecided)

    def unchecked(self, why: str, undecided: str | None) -> None:
        """The check at load did not run: the rule's verdict stands where it judged every node, else rows run alone."""
        if undecided:
            self.coupled = True
            self.batching = "each request runs alone (the batch-axis rule cannot judge it, and no check at load ran)"
        self._log(f"model '{self.signature.name}': {why}; {_UNCHECKED.format(undecided) if undecided else _KEPT}")

    def rows_check_in_child(self, onnx_file: Path, settings: SessionSettings, cache_dir: Path | None) -> str | None:
        """How a forked child running the check's rows died (integer division by zero), or None."""
        candidates = list(self._check_candidates())
        options = settings.session_options()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # a fork has none of our threads
        providers = replace(settings, intra_op_threads=1).providers()
        names = [spec.name for spec in self.signature.outputs]

        def run_in_child() -> None:
            session = create_session(onnx_file, options, cache_dir, lambda _: None, providers)
            for feeds in candidates:
                try:
                    session.run(names, feeds)
                    for i in range(len(next(iter(feeds.values())))):
                        session.run(names, {n: a[i : i + 1] for n, a in feeds.items()})
                    return
                except Exception:  # noqa: BLE001 - the next shape, as check_rows tries them
                    continue

        return crash_in_child(run_in_child, _WARM_UP_CHILD_SECONDS)

    def warm_up(self) -> None:
        """Run requests of ones until one runs (tritonnx.backend.warmup says which shapes are tried).

        ONNX Runtime allocates on its first run, which would otherwise land on the first caller. When no shape runs,
        the log says so; the model serves anyway.
        """
        failures = []
        for feeds in warm_up_candidates(self.signature.inputs, self.signature.batched):
            try:
                self._run(feeds)
            except Exception as error:  # noqa: BLE001 - not every model takes ones of every shape
                failures.append(f"{_shapes(feeds)}: {_caller_message(error)}")
                continue
            if failures:
                self._log(f"model '{self.signature.name}': warmed up with {_shapes(feeds)} ({failures[0]})")
            return
        self._log(
            f"model '{self.signature.name}': warm-up skipped, no input shape tried ran ({'; '.join(failures)}); "
            "the first request pays ONNX Runtime's first-run allocation"
        )

    def warm_up_in_child_first(self, onnx_file: Path, settings: SessionSettings, cache_dir: Path | None) -> None:
        """Warm up only if a forked child survives the same runs (see tritonnx.backend.warmup)."""
        candidates = list(warm_up_candidates(self.signature.inputs, self.signature.batched))
        options = settings.session_options()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # a fork has none of our threads
        providers = replace(settings, intra_op_threads=1).providers()

        def run_in_child() -> None:
            session = create_session(onnx_file, options, cache_dir, lambda _: None, providers)
            for feeds in candidates:
                try:
                    session.run([spec.name for spec in self.signature.outputs], feeds)
                    return
                except Exception:  # noqa: BLE001 - the next shape, as warm_up tries them
                    continue

        crash = crash_in_child(run_in_child, _WARM_UP_CHILD_SECONDS)
        if crash is None:
            self.warm_up()
        else:
            self._log(
                f"model '{self.signature.name}': warm-up with ones {crash} in a child process; serving without warm-up"
            )

    def infer(self, requests: Sequence[Tensors]) -> list[Result]:
        """One result per request, in order: its outputs, or the error that ended it alone."""
        results: list[Result | None] = [None] * len(requests)
        prepared: dict[int, PreparedRequest] = {}
        for index, request in enumerate(requests):
            try:
                prepared[index] = prepare_request(request, self.signature)
            except InvalidInputError as error:
                results[index] = error

        indices = list(prepared)
        if self.signature.batched and not self.coupled:
            groups = [
                [indices[i] for i in group] for group in group_compatible(list(prepared.values()), self.signature)
            ]
        else:
            groups = [[index] for index in indices]  # no batch dim, or coupled rows: each request is one whole run
        for group in groups:
            self._run_group([prepared[i] for i in group], group, results)
        return results  # type: ignore[return-value]  # every slot is filled above

    def _run_group(self, group: list[PreparedRequest], indices: list[int], results: list[Result | None]) -> None:
        try:
            outputs = self._run(stack(group, self.signature))
        except Exception as error:  # noqa: BLE001 - ONNX Runtime raises many unrelated types
            if len(group) == 1:
                results[indices[0]] = self._request_error(error, blamed_alone=self._has_run)
                return
            # Someone in the batch broke the shared run: retry each request alone so that only
            # the request at fault fails.
            self._log(f"batch of {len(group)} requests failed ({error}); running them one by one")
            self._run_alone(group, indices, results)
            return
        if len(group) == 1:
            results[indices[0]] = outputs  # the request's own run: its outputs as they are
            return
        rows = sum(request.batch_size for request in group)
        stray = next((n for n, a in outputs.items() if a.ndim == 0 or a.shape[0] != rows), None)
        if stray is not None:
            # An output that does not follow the batch dim cannot be cut per request.
            self._log(
                f"model '{self.signature.name}': output '{stray}' has shape {list(outputs[stray].shape)} for a "
                f"batch of {rows}, so it does not follow the batch dim; running the {len(group)} requests one by one"
            )
            self._run_alone(group, indices, results)
            return
        for index, request_outputs in zip(indices, split(outputs, group, self.signature), strict=True):
            results[index] = request_outputs

    def _run_alone(self, group: list[PreparedRequest], indices: list[int], results: list[Result | None]) -> None:
        alone: dict[int, dict[str, np.ndarray] | Exception] = {}
        for request, index in zip(group, indices, strict=True):
            try:
                alone[index] = self._run(request.feeds)
            except Exception as single_error:  # noqa: BLE001
                alone[index] = single_error
        any_succeeded = any(not isinstance(v, Exception) for v in alone.values())
        for index, outcome in alone.items():
            if isinstance(outcome, Exception):
                results[index] = self._request_error(outcome, blamed_alone=any_succeeded)
            else:
                results[index] = outcome

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self.session.run(self._output_names, feeds, self.run_options)
        self._has_run = True
        rank = int(self.signature.batched)
        return {
            name: a.reshape(a.shape + (1,)) if name in self._scalar_outputs and a.ndim == rank else a
            for name, a in zip(self._output_names, arrays, strict=True)
        }

    def _request_error(self, error: Exception, blamed_alone: bool) -> RequestError:
        """Invalid input when ONNX Runtime says so, or when the model has run fine for other requests."""
        if blamed_alone or isinstance(error, InvalidArgument):
            return InvalidInputError(
                f"model '{self.signature.name}' cannot run on this input: {_caller_message(error)}"
            )
        self._log(f"model '{self.signature.name}' failed: {error}")
        return ModelExecutionError(f"model '{self.signature.name}' failed to run: {_caller_message(error)}")
