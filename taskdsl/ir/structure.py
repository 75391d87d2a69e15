"""A complete text of an IR tree, for keys: equal texts mean the same program.

The printer's text is for people: it shows a variable by its name (two variables may share one)
and an integer constant without its type. `structural_text` spells out every field of every node
instead, except the uids of variables and buffers, which it numbers in order of first appearance
(so two builds of one kernel get one text), and source locations unless asked for. A node object that
appears twice is spelled once and referred to after that, so shared subtrees cost nothing. An object
that is not a dataclass spells itself by its `structural_key()`, a tuple of plain values (a built-in
task mapping of the frontend's IR does; a custom one, which maps by a Python function, cannot).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .expr import Buffer, Var

_PLAIN = (int, float, str, bool, type(None))


class Unspellable(TypeError):
    """The tree holds a value whose text could not stand for it."""


def structural_text(node, locations: bool = False) -> str:
    """The text of `node` (a Function, statement or expression), with its statements' source locations if
    `locations`; raises Unspellable for values of types it does not know."""
    out: list = []
    _Speller(out, ("uid",) if locations else ("uid", "loc")).spell(node)
    return "".join(out)


class _Speller:
    def __init__(self, out: list, skipped: tuple):
        self.out = out
        self.skipped = skipped
        self.named: dict = {}       # uid of a Var / Buffer -> its number
        self.seen: dict = {}        # id of another node -> its number (the node is kept alive by the tree)

    def spell(self, x) -> None:
        out = self.out
        if isinstance(x, _PLAIN) or isinstance(x, np.generic):
            out.append(f"{type(x).__name__}:{x!r},")
        elif isinstance(x, (tuple, list)):
            out.append("(")
            for item in x:
                self.spell(item)
            out.append("),")
        elif isinstance(x, (Var, Buffer)):
            number = self.named.get(x.uid)
            if number is not None:
                out.append(f"${number},")
                return
            self.named[x.uid] = len(self.named)
            out.append(f"${len(self.named) - 1}=")
            self.fields(x)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            number = self.seen.get(id(x))
            if number is not None:
                out.append(f"@{number},")
                return
            self.seen[id(x)] = len(self.seen)
            self.fields(x)
        elif hasattr(x, "structural_key"):
            out.append(type(x).__name__)
            self.spell(x.structural_key())
        else:
            raise Unspellable(f"structural_text: cannot spell a {type(x).__name__}")

    def fields(self, x) -> None:
        self.out.append(f"{type(x).__name__}{{")
        for f in dataclasses.fields(x):
            if f.name not in self.skipped:
                self.spell(getattr(x, f.name))
        self.out.append("},")
