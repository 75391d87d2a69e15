"""One compile for kernels that differ only in their shapes' constants (a graph's fused convolutions)."""
from __future__ import annotations

from ..passes.generalize import generalize


def share_code(launched: list) -> int:
    """Make the shareable kernels (`Kernel.shareable`) among `launched`, (kernel, block) pairs, that differ only in
    constants run as one IR over size symbols (`passes.generalize`): one generated module and one numba compile
    serve them all. Returns how many kernels now run shared code."""
    kernels = list({id(k): (k, block) for k, block in launched if k.shareable}.values())
    forms = generalize([k._frontend_ir(block) for k, block in kernels])
    shared = 0
    for (kernel, _), (fn, sizes) in zip(kernels, forms):
        if sizes:
            kernel.share(fn, sizes)
            shared += 1
    return shared
