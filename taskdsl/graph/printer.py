"""The text of a graph: one line per operator, tensors with their types.

    graph cnn(x: f32[1, 3, 8, 8]) -> (y: f32[1, 10])
      constants: 6 (1.2 KiB)
      t0: f32[1, 4, 8, 8] = conv2d(x, w0, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=1)
      ...
"""
from __future__ import annotations


def format_bytes(n: int) -> str:
    """`n` bytes in B / KiB / MiB / GiB."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Namer:
    """Readable, unique names for a graph's tensors (their own names where they have one)."""

    def __init__(self):
        self.names: dict = {}
        self.used: set = set()

    def __call__(self, t) -> str:
        if id(t) not in self.names:
            base = t.name or ("c" if t.is_constant else "t")
            name = base if t.name and base not in self.used else self._fresh(base)
            self.names[id(t)] = name
            self.used.add(name)
        return self.names[id(t)]

    def _fresh(self, base: str) -> str:
        k = 0
        while f"{base}{k}" in self.used:
            k += 1
        return f"{base}{k}"


def graph_str(graph) -> str:
    """The printed form of `graph`."""
    name = Namer()
    ins = ", ".join(f"{name(t)}: {t.type_str()}" for t in graph.inputs)
    lines = [f"graph {graph.name}({ins})"]
    consts = graph.constants
    if consts:
        lines.append(f"  constants: {len(consts)} ({format_bytes(sum(t.nbytes for t in consts))})")
    for op in graph.nodes:
        outs = ", ".join(f"{name(t)}: {t.type_str()}" for t in op.outputs)
        args = [name(t) for t in op.inputs] + [f"{k}={v!r}" for k, v in op.shown_attrs().items()]
        lines.append(f"  {outs} = {op.kind}({', '.join(args)})")
    lines.append(f"  return {', '.join(name(t) for t in graph.outputs)}")
    return "\n".join(lines)
