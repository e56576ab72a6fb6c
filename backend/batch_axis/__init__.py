"""Which nodes of a graph mix the rows of a batch: the batch axis followed from the inputs to every operator.

Triton's batcher stacks requests along the first axis, and each request should get what it would get alone. A
graph breaks that when an operator reduces, normalises, contracts, reorders or picks over the batch axis, merges
rows into one (a Reshape whose first dim is not the batch), quantizes with one scale over the batch, or uses the
batch size as data. The batch axis starts at 0 on every batched input and is followed through the graph, the
bodies of If, Loop and Scan and the model's local functions included; ranks and dims are followed from the
inputs' shapes so that negative axes resolve. Shapes are followed symbolically too (`symbolic.py`), so that the
Shape -> Gather -> Concat -> Reshape that exporters write to keep the batch first, and the Equal/Where/Expand they
write around attention masks, are told apart from the batch size reaching an output's values.

Each operator is one entry of a table (`operators.OPERATORS`, gathered from a module per family): how the batch
axis, the dims and the symbolic shape values pass through it. The verdict has two lists: `coupled`, what the rule
shows to mix rows, and `undecided`, what it cannot judge (an axis given at run time, a negative axis of unknown
rank, an operator it does not know, the batch size reaching an output through a comparison or an index). Nothing
is guessed: an undecided graph is left to the empirical check at load (`tritonnx.backend.runner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tritonnx.backend.batch_axis.flow import judge_graph
from tritonnx.backend.batch_axis.graph import Dims, Graph, Ints, Node, Verdict

__all__ = ["Dims", "Graph", "Ints", "Node", "Verdict", "coupled_nodes", "judge"]


def judge(graph: Graph, batched_inputs: Iterable[str], functions: Mapping[tuple[str, str], Graph]) -> Verdict:
    """The verdict on `graph` whose `batched_inputs` carry the batch on axis 0; `functions` by (domain, name)."""
    flow = judge_graph(graph, list(batched_inputs), functions)
    return Verdict(tuple(dict.fromkeys(flow.coupled)), tuple(dict.fromkeys(flow.undecided)))


def coupled_nodes(nodes: Iterable[Node], batched_inputs: Iterable[str], constants: Mapping[str, Ints]) -> list[str]:
    """What in the graph makes a row's answer depend on other rows: one phrase per node, in graph order."""
    return list(judge(Graph(tuple(nodes), constants=constants), batched_inputs, {}).coupled)
