"""Whether a new ONNX file can take the place of the served version of a model without its clients noticing.

A new version keeps the served contract when every request valid for the served version is valid
for it and its answers have the shapes clients read:

- the same batching (max_batch_size);
- every served input, with the same datatype and rank; a fixed dim may become dynamic (-1), not the
  other way round; no new input a client would have to send;
- the served outputs first, in their order (the facade's simple contract answers with the first),
  with the same datatypes and dims; new outputs may follow.

The served side is Triton's config of the version serving by default; the new side is what the
backend's auto-complete (backend/autocomplete.py) will make of the file: the same graph reading and
the same batching rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from tritonnx.backend.autocomplete import DEFAULT_MAX_BATCH_SIZE, writes_inputs_and_outputs, writes_max_batch_size
from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.onnx_io import GraphIO, read_graph_io
from tritonnx.backend.runner import _caller_message  # ONNX Runtime's message without its C++ source locations
from tritonnx.backend.tensors import TensorSpec, datatype_name
from tritonnx.server.repository import read_config


class SignatureError(Exception):
    """The new file cannot take the served version's place; the message says why and what is served."""


def _datatype_of_config(config_type: str) -> str:
    """Triton's config type (TYPE_FP32, TYPE_STRING) as clients see it (FP32, BYTES)."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


@dataclass(frozen=True)
class Tensor:
    """An input or output as clients see it; `dims` exclude the batch dim, -1 takes any size."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False

    @classmethod
    def from_config(cls, entry: dict) -> Tensor:
        # gRPC's JSON writes 64-bit numbers as strings and leaves out false flags.
        dims = tuple(int(d) for d in entry.get("dims", []))
        return cls(entry["name"], _datatype_of_config(entry.get("data_type", "")), dims, bool(entry.get("optional")))

    @classmethod
    def from_spec(cls, spec: TensorSpec) -> Tensor:
        return cls(spec.name, datatype_name(spec.dtype), tuple(spec.config_dims), spec.optional)

    def describe(self, batched: bool) -> str:
        shape = [-1, *self.dims] if batched else list(self.dims)
        return f"{self.name} ({self.datatype} {shape}{', optional' if self.optional else ''})"


@dataclass(frozen=True)
class Signature:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int

    @classmethod
    def from_config(cls, config: dict) -> Signature:
        """From Triton's model config (get_model_config as JSON)."""
        return cls(
            tuple(Tensor.from_config(entry) for entry in config.get("input", [])),
            tuple(Tensor.from_config(entry) for entry in config.get("output", [])),
            int(config.get("max_batch_size", 0)),
        )

    @classmethod
    def from_graph(cls, graph: GraphIO, max_batch_size: int) -> Signature:
        """As auto-complete will serve the graph with this max_batch_size; ModelConfigError if it cannot."""
        inputs, outputs = graph.specs(max_batch_size > 0)
        return cls(
            tuple(Tensor.from_spec(s) for s in inputs), tuple(Tensor.from_spec(s) for s in outputs), max_batch_size
        )

    def describe(self) -> str:
        batched = self.max_batch_size > 0
        return (
            f"inputs {', '.join(t.describe(batched) for t in self.inputs)}; "
            f"outputs {', '.join(t.describe(batched) for t in self.outputs)}; "
            + (f"max_batch_size {self.max_batch_size}" if batched else "no batching (max_batch_size 0)")
        )


def auto_completed_max_batch_size(graph: GraphIO, written: int | None, default: int = DEFAULT_MAX_BATCH_SIZE) -> int:
    """The max_batch_size auto-complete will give the graph.

    One written in config.pbtxt stays; otherwise the server's default (`default`: the served version's, which the same
    server gave it) when every input and output has a dynamic first dim, else 0.
    """
    if written is not None:
        return written
    return 0 if graph.cannot_batch() else default


def _batching(max_batch_size: int) -> str:
    return f"batches up to {max_batch_size}" if max_batch_size > 0 else "does not batch"


def incompatibilities(served: Signature, new: Signature) -> list[str]:
    """What would break clients of the served signature if `new` replaced it; empty when nothing would."""
    problems = []
    if new.max_batch_size != served.max_batch_size:
        problems.append(
            f"the served model {_batching(served.max_batch_size)}, the new file {_batching(new.max_batch_size)}"
        )
    new_inputs = {t.name: t for t in new.inputs}
    for tensor in served.inputs:
        if tensor.name not in new_inputs:
            problems.append(f"input '{tensor.name}' is gone")
            continue
        problems += _input_problems(tensor, new_inputs[tensor.name])
    served_inputs = {t.name for t in served.inputs}
    problems += [
        f"the new file needs input '{t.name}', which clients of the served model do not send"
        for t in new.inputs
        if t.name not in served_inputs and not t.optional
    ]
    new_outputs = {t.name: t for t in new.outputs}
    for position, tensor in enumerate(served.outputs):
        if tensor.name not in new_outputs:
            problems.append(f"output '{tensor.name}' is gone")
            continue
        if position >= len(new.outputs) or new.outputs[position].name != tensor.name:
            order = [t.name for t in new.outputs]
            problems.append(f"output '{tensor.name}' is not output {position + 1} of the new file any more ({order})")
        problems += _output_problems(tensor, new_outputs[tensor.name])
    return problems


def _input_problems(served: Tensor, new: Tensor) -> list[str]:
    what = f"input '{served.name}'"
    if new.datatype != served.datatype:
        return [f"{what} is {new.datatype} in the new file, {served.datatype} in the served model"]
    if len(new.dims) != len(served.dims) or any(n not in (-1, s) for s, n in zip(served.dims, new.dims, strict=True)):
        return [
            f"{what} takes dims {list(new.dims)} in the new file, not every shape of the served {list(served.dims)}"
        ]
    if served.optional and not new.optional:
        return [f"{what} may be left out of requests to the served model, the new file needs it"]
    return []


def _output_problems(served: Tensor, new: Tensor) -> list[str]:
    what = f"output '{served.name}'"
    if new.datatype != served.datatype:
        return [f"{what} is {new.datatype} in the new file, {served.datatype} in the served model"]
    if len(new.dims) != len(served.dims) or any(s not in (-1, n) for s, n in zip(served.dims, new.dims, strict=True)):
        return [
            f"{what} has dims {list(new.dims)} in the new file, clients of the served model get {list(served.dims)}"
        ]
    return []


def check_onnx(onnx_file: Path) -> GraphIO:
    """The file's graph, once it is known to load in ONNX Runtime; SignatureError with the reason if not."""
    if not onnx_file.is_file():
        raise SignatureError(f"{onnx_file} is not a file")
    try:
        graph = read_graph_io(onnx_file)
    except ModelConfigError as error:
        raise SignatureError(f"{onnx_file} is not an ONNX model that can be served: {error}") from None
    try:
        ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    except Exception as error:  # ONNX Runtime raises its own exception types, one per failure
        reason = _caller_message(error).splitlines()[0] if str(error).strip() else type(error).__name__
        raise SignatureError(f"ONNX Runtime cannot load {onnx_file}: {reason}") from None
    return graph


def check_signature(
    model: str, config_file: Path, graph: GraphIO, served: dict | None, allow_change: bool, log: Callable[[str], None]
) -> Signature:
    """The new file's signature as it will be served; SignatureError if it cannot be, or breaks the served one."""
    served_signature = Signature.from_config(served) if served is not None else None
    # The load that follows reads config.pbtxt again: its max_batch_size, if written, is the one that applies; a config
    # that lists inputs and outputs gets nothing completed, so an unwritten one is 0.
    config = read_config(config_file.parent) if config_file.is_file() else {}
    if writes_max_batch_size(config_file):
        written: int | None = int(config.get("max_batch_size", 0))
    else:
        written = 0 if writes_inputs_and_outputs(config) else None
    # An unwritten max_batch_size is the server's --backend-config default, which the served version got too.
    server_default = int((served or {}).get("max_batch_size", 0)) or DEFAULT_MAX_BATCH_SIZE
    max_batch_size = auto_completed_max_batch_size(graph, written, server_default)
    try:
        new = Signature.from_graph(graph, max_batch_size)
    except ModelConfigError as error:
        raise SignatureError(f"the new file cannot be served by {model} with its config.pbtxt: {error}") from None
    if served_signature is None:
        log(f"{model} has no ready version in Triton: nothing to compare the new file's signature with")
        return new
    problems = incompatibilities(served_signature, new)
    if problems and not allow_change:
        raise SignatureError(
            f"the new file does not fit what clients of {model} send and read:\n  - "
            + "\n  - ".join(problems)
            + f"\nthe served model: {served_signature.describe()}\nthe new file: {new.describe()}\n"
            "(--allow-signature-change publishes it anyway: clients must follow)"
        )
    if problems:
        log("the signature changes (--allow-signature-change): " + "; ".join(problems))
    else:
        log(f"signature matches the served model: {served_signature.describe()}")
    return new
