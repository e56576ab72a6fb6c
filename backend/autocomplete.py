"""Triton's auto-complete for a tritonnx model: the config's inputs, outputs and batching from the graph.

Batching is decided the way Triton's onnxruntime backend decides it: a `max_batch_size` written
in `config.pbtxt` wins (0 included); otherwise the model batches when every input and output has a
dynamic first dim, with Triton's default maximum of 4 and the dynamic batcher on, and does not
batch otherwise. A graph whose rows are not independent (`GraphIO.batch_coupling`: dynamic
quantization, a reduction over the batch axis) gets no dynamic batcher unless its config writes
max_batch_size (its requests run one by one in the runner all the same). Either way a log line says what was decided and why.

`config` is the `pb_utils.ModelConfig` that Triton hands to `auto_complete_config`; its class
is plain Python, so this module runs (and is tested) without Triton.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backend.errors import ModelConfigError
from backend.model_files import backend_config
from backend.onnx_io import read_graph_io

# Triton's `default-max-batch-size` when the server's command line gives none (backend_config).
DEFAULT_MAX_BATCH_SIZE = 4
_WRITTEN_MAX_BATCH = re.compile(r"^\s*max_batch_size\s*:", re.MULTILINE)
_SCHEDULERS = ("dynamic_batching", "sequence_batching", "ensemble_scheduling")
# The type of a sequence control's tensor, by the field its false/true values are written in.
_CONTROL_VALUE_TYPES = {
    "int32_false_true": "TYPE_INT32",
    "fp32_false_true": "TYPE_FP32",
    "bool_false_true": "TYPE_BOOL",
}


def writes_max_batch_size(config_file: Path) -> bool:
    """Whether `config.pbtxt` sets max_batch_size (Triton reports an absent one as 0)."""
    try:
        text = config_file.read_text()
    except OSError:
        return False  # no config.pbtxt: Triton infers the backend from model.py
    uncommented = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return bool(_WRITTEN_MAX_BATCH.search(uncommented))


def complete_config(config: Any, onnx_file: Path, config_file: Path, log: Callable[[str], None]) -> None:
    """Fill `config` (a pb_utils.ModelConfig) from the graph in `onnx_file`."""
    current = config.as_dict()
    name = current.get("name", onnx_file.parent.parent.name)
    refuse_unsupported(name, current)
    graph = read_graph_io(onnx_file)
    max_batch_size = int(current.get("max_batch_size", 0))
    if max_batch_size == 0 and not writes_max_batch_size(config_file):
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
    coupling = graph.batch_coupling() if max_batch_size > 1 else None
    if max_batch_size > 1 and not any(s in current for s in _SCHEDULERS):
        if coupling and not writes_max_batch_size(config_file):
            # Triton's default scheduler hands the model one request at a time: each gets what it would get alone.
            log(
                f"model '{name}': its rows are not independent ({coupling}): requests run one by one, no dynamic "
                "batching (a config that writes max_batch_size gets Triton's batcher; each request still runs alone)"
            )
        else:
            config.set_dynamic_batching()  # as Triton's onnxruntime backend does for a batching model without one
    inputs, outputs = graph.specs(max_batch_size > 0)
    controls = control_inputs(current)
    _check_controls(name, controls, {spec.name: spec.as_config() for spec in inputs})
    for kind, specs, add in (("input", inputs, config.add_input), ("output", outputs, config.add_output)):
        written = {entry["name"]: entry for entry in current.get(kind, [])}
        for spec in specs:
            if kind == "input" and spec.name in controls:
                continue  # the sequence batcher fills it in every request
            entry = spec.as_config()
            mine = written.get(spec.name, {})
            if _writes_type_and_dims(mine):
                # Written by hand (Triton's style, often with `reshape`): checked against the graph and kept.
                _check_written(name, kind, mine, entry)
                continue
            # An entry listed by hand for its policy (allow_ragged_batch, say) keeps its own `optional`.
            if "optional" in mine:
                entry.pop("optional", None)
            add(entry)


def default_max_batch_size(backend: str) -> int:
    """`--backend-config=<backend>,default-max-batch-size=N` (or the global one), else Triton's default, 4."""
    value = backend_config(backend).get("default-max-batch-size", "")
    return int(value) if value.isdigit() else DEFAULT_MAX_BATCH_SIZE


def control_inputs(config: dict) -> dict[str, str]:
    """The sequence batcher's control inputs (START, END, READY, CORRID, as the config names them) and their types.

    A control's type is the one its values are written in (`fp32_false_true` and so on), or CORRID's `data_type`.
    """
    controls = {}
    for entry in (config.get("sequence_batching") or {}).get("control_input", []):
        for control in entry.get("control", []):
            written = [t for key, t in _CONTROL_VALUE_TYPES.items() if control.get(key)]
            controls[entry["name"]] = written[0] if written else control.get("data_type", "TYPE_INVALID")
    return controls


def _check_controls(model: str, controls: dict[str, str], inputs: dict[str, dict[str, Any]]) -> None:
    """Refuse a control input the graph does not take, or takes as another type or shape than Triton sends it."""
    for control, data_type in controls.items():
        where = f"model '{model}', sequence_batching control_input '{control}'"
        graph = inputs.get(control)
        if graph is None:
            raise ModelConfigError(f"{where}: the graph has no such input (its inputs: {', '.join(inputs)})")
        if graph["data_type"] != data_type:
            raise ModelConfigError(f"{where}: Triton sends it as {data_type}, the graph takes {graph['data_type']}")
        if [int(d) for d in graph["dims"]] not in ([1], [-1]):
            raise ModelConfigError(f"{where}: Triton sends one value per request, the graph's dims are {graph['dims']}")


def refuse_unsupported(model: str, config: dict) -> None:
    """Refuse, by name and with the reason, what Triton's onnxruntime backend reads and this backend does not do."""
    for key in ("batch_input", "batch_output"):
        if config.get(key):
            raise ModelConfigError(
                f"model '{model}': {key} is not supported: tritonnx's backend does not compute Triton's batch inputs "
                "and outputs; remove it and let each request carry what the graph needs"
            )
    if (config.get("sequence_batching") or {}).get("state"):
        raise ModelConfigError(
            f"model '{model}': sequence_batching state (implicit state) is not supported: Triton's Python backend, "
            "which runs this model, has no state API"
        )


def _writes_type_and_dims(entry: dict) -> bool:
    return bool(entry.get("dims")) and entry.get("data_type", "TYPE_INVALID") != "TYPE_INVALID"


def _check_written(model: str, kind: str, written: dict[str, Any], graph: dict[str, Any]) -> None:
    """Refuse a hand-written entry the graph contradicts.

    It must have the graph's datatype, and dims (or `reshape`, which is what Triton hands the model) that fit the
    graph's, where a dim of any size may be written as one fixed size.
    """
    shape = [int(d) for d in written.get("reshape", {}).get("shape", written["dims"])]
    graph_dims = [int(d) for d in graph["dims"]]
    where = f"model '{model}', {kind} '{graph['name']}'"
    if written["data_type"] != graph["data_type"]:
        raise ModelConfigError(f"{where}: the config says {written['data_type']}, the graph {graph['data_type']}")
    fits = len(shape) == len(graph_dims) and all(g == -1 or g == d for g, d in zip(graph_dims, shape, strict=True))
    if not fits:
        what = "reshape" if "reshape" in written else "dims"
        raise ModelConfigError(f"{where}: the config's {what} {shape} do not fit the graph's dims {graph_dims}")
