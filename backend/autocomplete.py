"""Triton's auto-complete for a tritonnx model: the config's inputs, outputs and batching from the graph.

The rules are those of Triton's onnxruntime backend (`AutoCompleteConfig` in its `src/onnxruntime.cc`), case by case:

- inputs and outputs both written: nothing is completed. `max_batch_size` stays as written (0 when absent, as
  Triton's tutorials serve a graph whose every dim is written, batch dim included) and no scheduler is added;
- otherwise batching is decided from the graph: a model batches when every input and output has a dynamic first dim,
  with the server's `default-max-batch-size` (Triton's 4) when the config writes no `max_batch_size`, and a model
  that batches beyond 1 without a scheduler gets the dynamic batcher. The inputs or outputs left out are completed
  from the graph, batch dim removed when the model batches.

tritonnx's own extras, each where the native backend would refuse the config or serve answers that depend on the
batch: a written `max_batch_size: 0` wins over a graph that could batch; a graph whose rows are not independent
(`GraphIO.batch_coupling`) gets no dynamic batcher unless its config writes max_batch_size; entries written with a
name only (for `allow_ragged_batch`, say) and graph inputs missing from written inputs are completed when the config
leaves the outputs out (or the inputs); sequence controls are left out of the inputs. Either way a log line says what
was decided and why, and the result is checked against the graph (backend/config_check.py) as each instance checks
the config it is served with.

`config` is the `pb_utils.ModelConfig` that Triton hands to `auto_complete_config`; its class
is plain Python, so this module runs (and is tested) without Triton.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tritonnx.backend.config_check import check_config, control_inputs, refuse_unsupported
from tritonnx.backend.model_files import backend_config
from tritonnx.backend.onnx_io import GraphIO, read_graph_io

# Triton's `default-max-batch-size` when the server's command line gives none (backend_config).
DEFAULT_MAX_BATCH_SIZE = 4
_WRITTEN_MAX_BATCH = re.compile(r"^\s*max_batch_size\s*:", re.MULTILINE)
_SCHEDULERS = ("dynamic_batching", "sequence_batching", "ensemble_scheduling")


def writes_max_batch_size(config_file: Path) -> bool:
    """Whether `config.pbtxt` sets max_batch_size (Triton reports an absent one as 0)."""
    try:
        text = config_file.read_text()
    except OSError:
        return False  # no config.pbtxt: Triton infers the backend from model.py
    uncommented = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return bool(_WRITTEN_MAX_BATCH.search(uncommented))


def writes_inputs_and_outputs(config: dict[str, Any]) -> bool:
    """Whether the config lists both inputs and outputs: then Triton's onnxruntime backend completes nothing."""
    return bool(config.get("input")) and bool(config.get("output"))


def complete_config(config: Any, onnx_file: Path, config_file: Path, log: Callable[[str], None]) -> None:
    """Fill `config` (a pb_utils.ModelConfig) from the graph in `onnx_file`, then check it against the graph."""
    current = config.as_dict()
    name = current.get("name", onnx_file.parent.parent.name)
    refuse_unsupported(current)
    graph = read_graph_io(onnx_file)
    if writes_inputs_and_outputs(current):
        log(
            f"model '{name}': inputs and outputs are written, so nothing is auto-completed (as Triton's onnxruntime "
            f"backend does): max_batch_size {current.get('max_batch_size', 0)} (as written, 0 when unwritten), no scheduler "
            "added"
        )
    else:
        max_batch_size = _complete_batching(config, name, graph, config_file, log)
        _complete_io(config, graph, max_batch_size)
    check_config(config.as_dict(), graph)


def _complete_batching(config: Any, name: str, graph: GraphIO, config_file: Path, log: Callable[[str], None]) -> int:
    """Decide max_batch_size and the scheduler as Triton's onnxruntime backend does (`AutoCompleteMaxBatch`)."""
    current = config.as_dict()
    max_batch_size = int(current.get("max_batch_size", 0))
    written = writes_max_batch_size(config_file)
    if max_batch_size == 0 and not written:
        reason = graph.cannot_batch()
        if reason:
            log(f"model '{name}': max_batch_size 0, the model cannot batch: {reason}")
        else:
            max_batch_size = default_max_batch_size(current.get("backend", ""))
            config.set_max_batch_size(max_batch_size)
            log(
                f"model '{name}': every input and output has a dynamic first dim, so it batches: "
                f"max_batch_size {max_batch_size} (write max_batch_size in config.pbtxt to choose, 0 to turn "
                "batching off)"
            )
    if max_batch_size > 1 and not any(s in current for s in _SCHEDULERS):
        coupling = graph.batch_coupling()
        if coupling and not written:
            # Triton's default scheduler hands the model one request at a time: each gets what it would get alone.
            log(
                f"model '{name}': its rows are not independent ({coupling}): requests run one by one, no dynamic "
                "batching (a config that writes max_batch_size gets Triton's batcher; each request still runs alone)"
            )
        else:
            config.set_dynamic_batching()  # as Triton's onnxruntime backend does for a batching model without one
    return max_batch_size


def _complete_io(config: Any, graph: GraphIO, max_batch_size: int) -> None:
    """Add the graph's inputs and outputs the config leaves out, and complete entries written by name only.

    Entries written with a datatype and dims (Triton's style, often with `reshape`) are kept as written; check_config
    holds them to the graph.
    """
    current = config.as_dict()
    inputs, outputs = graph.specs(max_batch_size > 0)
    controls = control_inputs(current)
    for kind, specs, add in (("input", inputs, config.add_input), ("output", outputs, config.add_output)):
        written = {entry["name"]: entry for entry in current.get(kind, [])}
        for spec in specs:
            if kind == "input" and spec.name in controls:
                continue  # the sequence batcher fills it in every request
            mine = written.get(spec.name, {})
            if mine.get("dims") and mine.get("data_type", "TYPE_INVALID") != "TYPE_INVALID":
                continue
            entry = spec.as_config()
            # An entry listed by hand for its policy (allow_ragged_batch, say) keeps its own `optional`.
            if "optional" in mine:
                entry.pop("optional", None)
            add(entry)


def default_max_batch_size(backend: str) -> int:
    """`--backend-config=<backend>,default-max-batch-size=N` (or the global one), else Triton's default, 4."""
    value = backend_config(backend).get("default-max-batch-size", "")
    return int(value) if value.isdigit() else DEFAULT_MAX_BATCH_SIZE
