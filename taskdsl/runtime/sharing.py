"""One compile for kernels that differ only in their shapes' constants (fused convolutions at many sizes).

A graph compile knows every kernel before it generates any (`share_code`); a kernel launched on its own (an
eager `stdlib_ops.conv2d` at a new image size) joins the kernels of its form launched before it
(`share_with_earlier`): the second shape compiles their shared form, later ones mostly find it compiled.
TASKDSL_SHARE_CODE=0 turns both off.
"""
from __future__ import annotations

import threading

from ..passes.generalize import generalize, holes, shared_form
from .config import share_code_enabled

_alone: dict = {}       # holes' text -> (the first kernel's IR, the hole values of each kernel launched alone)
_alone_lock = threading.Lock()
ALONE_MEMBERS = 64      # hole values kept per form (past it, the oldest go: their kernels keep what they run)
ALONE_FORMS = 256       # forms kept (past it, all are forgotten at once, as `cpu_modules` forgets generated modules)


def share_code(launched: list) -> int:
    """Make the shareable kernels (`Kernel.shareable`) among `launched`, (kernel, block) pairs, that differ only in
    constants run as one IR over size symbols (`passes.generalize`): one generated module and one numba compile
    serve them all. Returns how many kernels now run shared code."""
    kernels = list({id(k): (k, block) for k, block in launched if k.shareable}.values())
    for kernel, _ in kernels:
        kernel.share_checked = True     # (not again at its first launch)
    if not share_code_enabled():
        return 0
    forms = generalize([k._frontend_ir(block) for k, block in kernels])
    shared = 0
    for (kernel, _), (fn, sizes) in zip(kernels, forms):
        if sizes:
            kernel.share(fn, sizes)
            shared += 1
    return shared


def share_with_earlier(kernel, block: tuple) -> None:
    """Where shareable `kernel`, launched outside a graph compile, differs only in constants from kernels launched
    before it, make it run their group's IR over size symbols (theirs keep what they run). Once per kernel, under a
    lock: a thread that finds it checked finds it shared, if it is."""
    with _alone_lock:
        if kernel.share_checked:
            return
        found = holes(kernel._frontend_ir(block)) if share_code_enabled() else None
        if found is not None:
            text, values = found
            if text not in _alone and len(_alone) >= ALONE_FORMS:
                _alone.clear()
            first, seen = _alone.setdefault(text, (kernel._frontend_ir(block), []))
            if values not in seen:
                seen.append(values)
                del seen[:-ALONE_MEMBERS]
            shared, sizes = shared_form(first, seen)
            own = sizes[seen.index(values)]
            if own:
                kernel.share(shared, own)
        kernel.share_checked = True
