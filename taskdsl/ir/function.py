"""A kernel as the IR sees it: parameters, launch shape and body."""
from __future__ import annotations

from dataclasses import dataclass

from .expr import Buffer, Var
from .stmt import Stmt


@dataclass(frozen=True, eq=False)
class Function:
    """A `__global__` kernel.

    params: Buffers (global tensors) and Vars (scalars), in the user's order.
    sizes: the size-symbol Vars the tensor shapes use (bound from argument shapes).
    block: threads per block (x, y, z) as ints; the grid is computed per call on the host.
    outlined: the functions its `CallOutlined` statements call, by index (the cpu target: `passes.outline`).
    """

    name: str
    params: tuple
    sizes: tuple
    body: Stmt
    block: tuple
    source_file: str = "<unknown>"
    outlined: tuple = ()

    @property
    def buffers(self) -> tuple:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def scalars(self) -> tuple:
        return tuple(p for p in self.params if isinstance(p, Var))

    @property
    def num_threads(self) -> int:
        x, y, z = self.block
        return x * y * z
