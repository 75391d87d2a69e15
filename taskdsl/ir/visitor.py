"""Generic traversal of IR trees.

`Visitor` walks every node; `Rewriter` rebuilds a tree bottom-up, reusing untouched nodes.
Both dispatch on the node class name: define `visit_Load(self, node)` to handle loads.
"""
from __future__ import annotations

import dataclasses
import functools

from .expr import Buffer, Expr
from .stmt import Stmt

_CHILD_TYPES = (Expr, Stmt)


@functools.cache
def _field_names(cls) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "loc")


def _children(node):
    for name in _field_names(type(node)):
        yield name, getattr(node, name)


class Visitor:
    """Walks a tree; override `visit_<Class>` and call `self.generic_visit(node)` to recurse."""

    def visit(self, node):
        if node is None:
            return None
        method = getattr(self, "visit_" + type(node).__name__, None)
        return method(node) if method else self.generic_visit(node)

    def generic_visit(self, node):
        for _, value in _children(node):
            self._visit_value(value)

    def _visit_value(self, value):
        if isinstance(value, _CHILD_TYPES):
            self.visit(value)
        elif isinstance(value, tuple):
            for v in value:
                self._visit_value(v)


class Rewriter:
    """Rebuilds a tree; override `visit_<Class>` returning a replacement node."""

    def visit(self, node):
        if node is None:
            return None
        method = getattr(self, "visit_" + type(node).__name__, None)
        return method(node) if method else self.generic_visit(node)

    def generic_visit(self, node):
        changes = {}
        for name, value in _children(node):
            new = self._visit_value(value)
            if new is not value:
                changes[name] = new
        return dataclasses.replace(node, **changes) if changes else node

    def _visit_value(self, value):
        if isinstance(value, _CHILD_TYPES):
            return self.visit(value)
        if isinstance(value, Buffer):
            return self.visit_buffer(value)
        if isinstance(value, tuple):
            new = tuple(self._visit_value(v) for v in value)
            return value if all(a is b for a, b in zip(new, value)) else new
        return value

    def visit_buffer(self, buffer: Buffer) -> Buffer:
        """Hook for passes that replace buffers (flattening); identity by default."""
        return buffer


class _Substitute(Rewriter):
    def __init__(self, values: dict):
        self.values = values

    def visit_Var(self, v):
        return self.values.get(v.uid, v)


def substitute(node, values: dict):
    """`node` with each Var whose uid is a key of `values` replaced by the value."""
    return _Substitute(values).visit(node) if values else node


def collect(node, cls) -> list:
    """Every node of class `cls` in the tree, in visiting order."""
    found = []

    class _Collector(Visitor):
        def generic_visit(self, n):
            if isinstance(n, cls):
                found.append(n)
            super().generic_visit(n)

    _Collector().visit(node)
    return found


def referenced_buffers(node) -> set:
    """The uids of every buffer the tree names (loads, stores, atomics, addresses, copies)."""
    found = set()

    class _Finder(Visitor):
        def _visit_value(self, value):
            if isinstance(value, Buffer):
                found.add(value.uid)
            else:
                super()._visit_value(value)

    _Finder().visit(node)
    return found
