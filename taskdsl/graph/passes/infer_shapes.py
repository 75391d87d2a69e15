"""Shape and dtype inference: every operator rebuilt on its inputs, in topological order.

Each tensor then has the shape and dtype its producer's definitions give. Run it after a
rewrite that changed an operator's inputs; a graph output whose type would change is an
error (the graph's callers rely on it).
"""
from __future__ import annotations

from ..graph import Graph


def infer_shapes(graph: Graph) -> Graph:
    """The graph with every operator's outputs inferred again from its inputs."""
    inferred = graph.rewrite({}, rebuild=True)
    for old, new in zip(graph.outputs, inferred.outputs):
        if (old.shape, old.dtype) != (new.shape, new.dtype):
            raise ValueError(f"output {old.name or '?'} was {old.type_str()} but its producer now gives "
                             f"{new.type_str()}")
    return inferred
