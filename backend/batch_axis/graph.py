"""What the batch-axis rule reads of a graph: its nodes, small integer constants and known dims, and its verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Ints = tuple[int, ...]
Dims = tuple[int | None, ...]  # a tensor's dims where its rank is known; None for a dim not known
Axes = list[int | None]  # the batch axis of each output of a node, None where it holds no batch
HUGE = 1 << 30  # a Slice end at least this large runs to the end of its axis


@dataclass(frozen=True)
class Graph:
    """A graph (the model's, a subgraph, or a local function's body): its nodes and what is known of its tensors.

    `inputs` and `outputs` are the formal ones of a subgraph or function; `constants` the small integer tensors
    (initializers and Constant nodes) by name; `dims` the dims of the graph inputs and initializers whose rank is
    known.
    """

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    constants: Mapping[str, Ints] = field(default_factory=dict)
    dims: Mapping[str, Dims] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    """An operator as the graph writes it: its inputs and outputs by name, and its attributes.

    Integer and string attributes, subgraphs (If's branches, Loop's and Scan's bodies), and in a function body the
    attributes it takes from the call (`refs`: its attribute name -> the caller's).
    """

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ints: Mapping[str, Ints] = field(default_factory=dict)  # `i` and `ints` attributes, and small int tensors
    domain: str = ""
    strings: Mapping[str, str] = field(default_factory=dict)
    graphs: Mapping[str, Graph] = field(default_factory=dict)
    refs: Mapping[str, str] = field(default_factory=dict)
    value_dims: Dims | None = None  # a Constant's value, where its dims are known

    def axes(self, constants: Mapping[str, Ints], attribute: str, position: int) -> Ints | None:
        """An axes argument: the attribute (older opsets) or the constant input at `position` (newer ones)."""
        if attribute in self.ints:
            return self.ints[attribute]
        if len(self.inputs) > position and self.inputs[position]:
            return constants.get(self.inputs[position])
        return ()

    def attr(self, name: str, default: int) -> int:
        return self.ints.get(name, (default,))[0]

    def input(self, position: int) -> str:
        """The name of input `position`, "" where it is left out."""
        return self.inputs[position] if len(self.inputs) > position else ""


@dataclass(frozen=True)
class Verdict:
    """What the rule shows to mix rows (`coupled`) and what it cannot judge (`undecided`), one phrase per node."""

    coupled: tuple[str, ...] = ()
    undecided: tuple[str, ...] = ()


def resolve(axis: int | None, rank: int | None) -> int | None:
    """A non-negative axis, or None when it is negative and the rank is not known."""
    if axis is None or axis >= 0:
        return axis
    return axis + rank if rank is not None else None
