"""`@td.kernel` and `@td.func`: the entry points from Python functions into the compiler."""
from __future__ import annotations

import functools
import inspect
from functools import cached_property

from ..errors import DSLError, SourceLoc
from ..ir import types as T
from .autoreload import follow_autoreload
from .source import ParsedSource, closure_values, parse_function, remember_text

_PY_DTYPES = {int: T.i32, float: T.f32, bool: T.boolean}


def resolve_annotations(fn) -> dict:
    """The parameter annotations of `fn`, evaluated (string annotations are evaluated in its globals)."""
    out = {}
    closure = closure_values(fn)
    for name, ann in inspect.get_annotations(fn).items():
        if isinstance(ann, str):
            try:
                ann = eval(ann, fn.__globals__, closure)  # noqa: S307 - the user's own annotation text
            except Exception as exc:  # noqa: BLE001
                raise DSLError(f"cannot evaluate the annotation of '{name}': {exc}",
                               SourceLoc(inspect.getsourcefile(fn) or "<unknown>", fn.__code__.co_firstlineno),
                               "With 'from __future__ import annotations', annotations are strings evaluated in "
                               "the module's globals: use module-level dtypes, or drop that import.") from None
        out[name] = _PY_DTYPES.get(ann, ann) if isinstance(ann, type) else ann   # int / float / bool: dtypes
    return out


def check_plain_function(fn, decorator: str) -> None:
    """TypeError unless `fn` is a function written with `def` (another decorator's wrapper is one: its own body is
    what gets translated)."""
    if not inspect.isfunction(fn):
        ours = {"Kernel": "a @td.kernel", "DeviceFunction": "a @td.func"}.get(type(fn).__name__)
        raise TypeError(f"{decorator} decorates a function written with def, got {ours or type(fn).__name__} "
                        f"({fn!r}): " + ("a function is either a @td.kernel or a @td.func, once" if ours else
                                          f"put {decorator} innermost, right above the def"))


class DeviceFunction:
    """A `@td.func`: inlined into the kernels that call it; with `outline`, the cpu target compiles a call made as a
    statement once as a function of its own and calls it (`passes.outline`)."""

    def __init__(self, fn, outline: bool = False):
        check_plain_function(fn, "@td.func")
        self.fn = fn
        self.name = fn.__name__
        self.outline = outline
        annotations = resolve_annotations(fn)
        parameters = inspect.signature(fn).parameters.values()
        for p in parameters:   # an inlined call binds its arguments one to one, by position
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not p.empty:
                raise TypeError(f"@td.func '{self.name}': parameter '{p}' is not supported; a device function's "
                                "parameters are plain names, passed by position (no defaults, *args or **kwargs)")
        names = [p.name for p in parameters]
        self.params = [(n, annotations.get(n) if isinstance(annotations.get(n), T.DataType) else None) for n in names]
        ret = annotations.get("return")
        if ret is not None and not isinstance(ret, T.DataType):
            raise TypeError(f"@td.func '{self.name}': the return annotation must be a dtype such as td.f32, got {ret!r}")
        self.return_dtype = ret
        functools.update_wrapper(self, fn)      # the function's name, docstring, module and signature
        remember_text(fn)
        follow_autoreload(DeviceFunction)

    def source(self) -> ParsedSource:
        return self._source

    @cached_property
    def _source(self) -> ParsedSource:
        return parse_function(self.fn)

    def __call__(self, *args):
        raise RuntimeError(f"@td.func '{self.name}' can only be called from a @td.kernel or another @td.func")

    def __repr__(self) -> str:
        return f"<td.func {self.name}>"


def func(fn=None, *, outline: bool = False) -> DeviceFunction:
    """Mark `fn` as a device function callable from kernels (annotate params and return with dtypes);
    `@td.func` and `@td.func()` are the same. `outline=True` asks the cpu target to compile the function's body
    once and call it, where kernels would each compile it inlined (a large unrolled body shared by many kernels);
    CUDA and debug mode inline it all the same."""
    if fn is None:
        return lambda f: DeviceFunction(f, outline)
    return DeviceFunction(fn, outline)


def is_kernel(value) -> bool:
    """Whether `value` is a `@td.kernel`."""
    from ..runtime.kernel import Kernel
    return isinstance(value, Kernel)


def kernel(fn=None, *, grid=1, block=1, name: str | None = None):
    """Make a Python function a GPU-style kernel launched on `grid` blocks of `block` threads.

    `grid` and `block` are ints, tuples, or callables whose parameter names are size symbols
    (or scalar parameters) of the kernel, evaluated per call.
    """
    from ..runtime.kernel import Kernel
    if name is not None and not isinstance(name, str):
        raise TypeError(f"@td.kernel's name must be a string, got {name!r}")

    def wrap(f):
        check_plain_function(f, "@td.kernel")
        remember_text(f)
        return Kernel(f, grid=grid, block=block, name=name or f.__name__)

    return wrap(fn) if fn is not None else wrap
