"""One operator's entry in the rule's table: how the batch axis, the dims and the symbolic shape values pass it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.graph import Axes, Dims, Node
from tritonnx.backend.batch_axis.symbolic import Evaluator

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow

# (flow, node, {input position: its batch axis}, the rank of input 0, where) -> the batch axis of each output; the
# rule records there what the node does to the rows (flow.couple, flow.unsure).
AxisRule = Callable[["Flow", Node, dict[int, int], int | None, str], Axes]
DimsRule = Callable[["Flow", Node], Dims | None]  # the dims of the node's first output, where its rank follows


@dataclass(frozen=True)
class Operator:
    """An operator as the rule knows it; an operator with no `axis` rule is one the rule does not know.

    `shapes`: the inputs that give a shape, axes, a count or a range, where the batch size is not data;
    `arithmetic`: the batch size fed to its other inputs certainly reaches its values (a division by it), where
    another operator (a comparison, an index) may only build masks and shapes from it.
    """

    axis: AxisRule | None = None
    dims: DimsRule | None = None
    symbolic: Evaluator | None = None
    shapes: frozenset[int] = frozenset()
    arithmetic: bool = False


def entries(names: Iterable[str], **fields: object) -> dict[str, Operator]:
    """The same entry for each of `names`."""
    entry = Operator(**fields)  # type: ignore[arg-type]
    return dict.fromkeys(names, entry)
