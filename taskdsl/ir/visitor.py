"""Generic traversal of IR trees.

`Visitor` walks every node; `Rewriter` rebuilds a tree bottom-up, reusing untouched nodes.
Both dispatch on the node class name: define `visit_Load(self, node)` to handle loads.
"""
from __future__ import annotations

import dataclasses
import functools
import sys

from . import stmt
from .expr import Atomic, Buffer, Expr, Load, Var
from .stmt import Stmt, Store

_CHILD_TYPES = (Expr, Stmt)
ELEMENT_ACCESSES = (Load, Store, Atomic)     # the nodes that read or write one element: `buffer[indices]`
DEEP_RECURSION = 20_000     # Python frames: expressions nesting a few thousand levels deep


def allow_deep_trees() -> None:
    """Raise Python's recursion limit to DEEP_RECURSION where it is lower. The walkers below recurse per level of
    a tree, three frames a level, so an expression of a few hundred folded terms (`acc = acc + x[k]` in a Python
    loop) passed the default limit of 1000. Raised once, never lowered: threads compile at once (the tuner), and
    restoring the limit under one of them would cut its walk short."""
    if sys.getrecursionlimit() < DEEP_RECURSION:
        sys.setrecursionlimit(DEEP_RECURSION)


SCALAR_FIELDS = {"str", "int", "bool", "float", "DataType"}    # annotations of fields that never hold a node


@functools.cache
def field_names(cls) -> tuple:
    """The fields of IR node class `cls` that may hold children, looked up once per class: all but `loc` and the
    names, types and flags (a Var has none, a Binary two of four: the walkers visit every field they list)."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.name != "loc" and getattr(f.type, "__name__", f.type) not in SCALAR_FIELDS)


class _Dispatch:
    """Each walker class's `visit_<Class>` method per node class, looked up once per pair: passes walk
    trees of 10^5 nodes, where building the method name at every node was a third of their time."""

    _handlers: dict = {}
    # True in a walker that handles statements only: it leaves expressions unvisited (as `collect(...,
    # expressions=False)`), several times faster on unrolled bodies, where expressions are most of the nodes
    statements_only = False
    _children = _CHILD_TYPES     # the node classes the walk descends into

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._handlers = {}      # per class, so a class built inside a function takes its table with it
        cls._children = Stmt if cls.statements_only else _CHILD_TYPES
        if cls.statements_only:     # a handler of expressions would never run: say so where the class is made
            missed = [name for name in dir(cls) if name.startswith("visit_") and name != "visit_buffer"
                      and not issubclass(getattr(stmt, name[len("visit_"):], Expr), Stmt)]
            if missed:
                raise TypeError(f"{cls.__qualname__} walks statements only (statements_only = True), so its "
                                f"{', '.join(missed)} would never be called: drop statements_only or the handlers")

    def _handler(self, node_cls):
        try:
            return self._handlers[node_cls]
        except KeyError:
            method = self._handlers[node_cls] = getattr(type(self), "visit_" + node_cls.__name__, None)
            return method


class Visitor(_Dispatch):
    """Walks a tree; override `visit_<Class>` and call `self.generic_visit(node)` to recurse."""

    def visit(self, node):
        if node is None:
            return None
        method = self._handler(type(node))
        return method(self, node) if method else self.generic_visit(node)

    def generic_visit(self, node):
        children = self._children
        for name in field_names(type(node)):
            value = getattr(node, name)
            if isinstance(value, children):     # (the common case without a call to `_visit_value`)
                self.visit(value)
            elif value is not None:
                self._visit_value(value)

    def _visit_value(self, value):
        if isinstance(value, self._children):
            self.visit(value)
        elif type(value) is tuple:
            for v in value:
                self._visit_value(v)


class Rewriter(_Dispatch):
    """Rebuilds a tree; override `visit_<Class>` returning a replacement node."""

    def visit(self, node):
        if node is None:
            return None
        method = self._handler(type(node))
        return method(self, node) if method else self.generic_visit(node)

    def generic_visit(self, node):
        changes, children = None, self._children
        for name in field_names(type(node)):
            value = getattr(node, name)
            if value is None:
                continue
            new = self.visit(value) if isinstance(value, children) else self._visit_value(value)
            if new is not value:
                if changes is None:
                    changes = {}
                changes[name] = new
        return dataclasses.replace(node, **changes) if changes else node

    def _visit_value(self, value):
        if isinstance(value, self._children):
            return self.visit(value)
        if isinstance(value, Buffer):
            return self.visit_buffer(value)
        if type(value) is tuple:
            new = [self._visit_value(v) for v in value]
            for before, after in zip(value, new):
                if before is not after:
                    return tuple(new)
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


def collect(node, cls, expressions: bool = True) -> list:
    """Every node of class `cls` in the tree, in visiting order; with `expressions=False` the walk stays
    on statements (several times faster on unrolled bodies, for statement classes)."""
    if node is None:
        return []
    kinds = _CHILD_TYPES if expressions else Stmt
    found = [node] if isinstance(node, cls) else []
    stack = [getattr(node, name) for name in _fields_backwards(type(node))]
    pop, push = stack.pop, stack.append
    # an explicit stack, no call per node and no recursion limit on deep trees (passes call this ~50K times a
    # model); field values go on it as they are, each node's last field first, and a tuple pops as its items
    while stack:
        n = pop()
        if isinstance(n, kinds):
            if isinstance(n, cls):
                found.append(n)
            for name in _fields_backwards(type(n)):
                push(getattr(n, name))
        elif type(n) is tuple:
            stack.extend(reversed(n))
    return found


@functools.cache
def _fields_backwards(cls) -> tuple:
    """`field_names(cls)`, last first: the order a stack walk pushes them."""
    return tuple(reversed(field_names(cls)))


def invariant(node, variables: set) -> bool:
    """Whether expression `node` reads no memory and no Var whose uid is in `variables` (its value the same wherever
    those change: it may be computed before a loop assigning them)."""
    return not any(isinstance(x, Load) or x.uid in variables for x in collect(node, (Load, Var)))


def referenced_buffers(node) -> set:
    """The uids of every buffer the tree names (loads, stores, atomics, addresses, copies)."""
    return set(named_buffers(node))


def named_buffers(node) -> dict:
    """{uid: buffer} of every buffer the tree names, in the order a walk first meets them."""
    finder = _BufferFinder()
    finder.visit(node)
    return finder.found


class _BufferFinder(Visitor):
    def __init__(self):
        self.found = {}

    def _visit_value(self, value):
        if isinstance(value, Buffer):
            self.found.setdefault(value.uid, value)
        else:
            super()._visit_value(value)
