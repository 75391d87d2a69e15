"""Dead-code elimination: drop the operators no graph output depends on."""
from __future__ import annotations

from ..graph import Graph


def eliminate_dead_code(graph: Graph) -> Graph:
    """The graph without operators whose outputs are never used (directly or indirectly) by an output."""
    return Graph(graph.inputs, graph.outputs, name=graph.name)
