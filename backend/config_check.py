"""The served config checked against the graph, by auto-complete and again by every instance at start.

Triton's onnxruntime backend checks the config when an instance starts (`ValidateInputs`, `ValidateOutputs`, the
sequence controls), whether or not the server auto-completed it: a repository served with
`--disable-auto-complete-config` is held to the same rules. tritonnx runs `check_config` at the end of auto-complete,
so a wrong config fails where it was written, and in `initialize` on the config Triton serves, so that the two modes
refuse the same configs with the same messages. Messages name the tensor, not the model: the caller adds that.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.onnx_io import GraphIO
from tritonnx.backend.tensors import TensorSpec

# The type of a sequence control's tensor, by the field its false/true values are written in.
_CONTROL_VALUE_TYPES = {
    "int32_false_true": "TYPE_INT32",
    "fp32_false_true": "TYPE_FP32",
    "bool_false_true": "TYPE_BOOL",
}


def check_config(config: dict[str, Any], graph: GraphIO) -> None:
    """Refuse a config the graph cannot be served under, naming the tensor and the graph's own names.

    Each input written must be a graph input (not a sequence control) of the graph's datatype whose dims, or
    `reshape`, fit the graph's; every input the graph cannot run without must be written (or be a sequence
    control). Each output written must be a graph output of its datatype and dims; outputs may be left out.
    """
    refuse_unsupported(config)
    batched = int(config.get("max_batch_size", 0)) > 0
    inputs, outputs = graph.specs(batched)
    by_name = {spec.name: spec for spec in inputs}
    controls = control_inputs(config)
    check_controls(controls, by_name)
    written = config.get("input", [])
    for entry in written:
        name = entry["name"]
        if name in controls:
            raise ModelConfigError(
                f"input '{name}' is a sequence_batching control_input: Triton's sequence batcher fills it in every "
                "request, so leave it out of the config's inputs"
            )
        spec = by_name.get(name)
        if spec is None:
            raise ModelConfigError(f"input '{name}': the graph has no such input (its inputs: {_names(inputs)})")
        if entry.get("optional") and not spec.optional:
            raise ModelConfigError(f"input '{name}' is optional in the config, but the graph has no default for it")
        if entry.get("allow_ragged_batch") and batched and spec.scalar:
            raise ModelConfigError(
                f"input '{name}' is ragged and the graph takes it as one flat dim, the onnxruntime backend's form "
                "(every request's elements one after another, each request's share told by batch_input); tritonnx "
                "pads a ragged input to the longest request instead, so the graph needs a batch dim before its ragged "
                "dims"
            )
        _check_entry("input", entry, spec)
    listed = {entry["name"] for entry in written} | set(controls)
    for spec in inputs:
        if not spec.optional and spec.name not in listed:
            raise ModelConfigError(
                f"input '{spec.name}': the graph needs it and the config's inputs leave it out "
                f"(the graph's inputs: {_names(inputs)})"
            )
    by_name = {spec.name: spec for spec in outputs}
    for entry in config.get("output", []):
        spec = by_name.get(entry["name"])
        if spec is None:
            raise ModelConfigError(
                f"output '{entry['name']}': the graph has no such output (its outputs: {_names(outputs)})"
            )
        _check_entry("output", entry, spec)


def refuse_unsupported(config: dict[str, Any]) -> None:
    """Refuse, by name and with the reason, what Triton's onnxruntime backend reads and this backend does not do."""
    for key in ("batch_input", "batch_output"):
        if config.get(key):
            raise ModelConfigError(
                f"{key} is not supported: tritonnx's backend does not compute Triton's batch inputs and outputs; "
                "remove it and let each request carry what the graph needs"
            )
    if (config.get("sequence_batching") or {}).get("state"):
        raise ModelConfigError(
            "sequence_batching state (implicit state) is not supported: Triton's Python backend, which runs this "
            "model, cannot update Triton's state (TRITONBACKEND_StateUpdate); send the state as inputs and outputs"
        )


def control_inputs(config: dict[str, Any]) -> dict[str, str]:
    """The sequence batcher's control inputs (START, END, READY, CORRID, as the config names them) and their types.

    A control's type is the one its values are written in (`fp32_false_true` and so on), or CORRID's `data_type`.
    """
    controls = {}
    for entry in (config.get("sequence_batching") or {}).get("control_input", []):
        for control in entry.get("control", []):
            written = [t for key, t in _CONTROL_VALUE_TYPES.items() if control.get(key)]
            controls[entry["name"]] = written[0] if written else control.get("data_type", "TYPE_INVALID")
    return controls


def check_controls(controls: dict[str, str], inputs: dict[str, TensorSpec]) -> None:
    """Refuse a control input the graph does not take, or takes as another type or shape than Triton sends it."""
    for control, data_type in controls.items():
        where = f"sequence_batching control_input '{control}'"
        spec = inputs.get(control)
        if spec is None:
            raise ModelConfigError(f"{where}: the graph has no such input (its inputs: {', '.join(inputs)})")
        if spec.config_type != data_type:
            raise ModelConfigError(f"{where}: Triton sends it as {data_type}, the graph takes {spec.config_type}")
        if spec.config_dims not in ([1], [-1]):
            raise ModelConfigError(
                f"{where}: Triton sends one value per request, the graph's dims are {spec.config_dims}"
            )


def _check_entry(kind: str, entry: dict[str, Any], spec: TensorSpec) -> None:
    """An entry must have the graph's datatype, and dims (or `reshape`, what Triton hands the model) that fit.

    A dynamic dim of the graph may be written as one fixed size; a scalar (nothing after the batch dim) takes only
    dims of 1, as Triton's onnxruntime backend checks.
    """
    where = f"{kind} '{spec.name}'"
    data_type = entry.get("data_type") or "TYPE_INVALID"
    if data_type == "TYPE_INVALID":
        raise ModelConfigError(f"{where}: the config gives no data_type (the graph's: {spec.config_type})")
    if data_type != spec.config_type:
        raise ModelConfigError(f"{where}: the config says {data_type}, the graph {spec.config_type}")
    what = "reshape" if "reshape" in entry else "dims"
    shape = [int(d) for d in (entry["reshape"].get("shape", []) if "reshape" in entry else entry.get("dims", []))]
    if spec.scalar:
        fits = all(d == 1 for d in shape)
    else:
        graph = spec.config_dims
        fits = len(shape) == len(graph) and all(g in (-1, d) for g, d in zip(graph, shape, strict=True))
    if not fits:
        raise ModelConfigError(f"{where}: the config's {what} {shape} do not fit the graph's dims {spec.config_dims}")


def _names(specs: Iterable[TensorSpec]) -> str:
    return ", ".join(spec.name for spec in specs)
