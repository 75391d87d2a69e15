"""Builds the IR Function of one kernel specialization from its Python function."""
from __future__ import annotations

from .. import ir
from ..errors import DSLError
from ..ir import types as T
from .decorators import resolve_annotations
from .global_reads import GlobalReads
from .source import parse_function
from .translator import translate_body


def kernel_params(fn) -> list:
    """(name, TensorSpec | DataType) for each parameter of a kernel function, validated."""
    import inspect
    annotations = resolve_annotations(fn)
    params = []
    for name, p in inspect.signature(fn).parameters.items():
        ann = annotations.get(name)
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"kernel '{fn.__name__}': parameter '{name}' must be a plain positional parameter")
        if not isinstance(ann, (T.TensorSpec, T.DataType)):
            raise TypeError(f"kernel '{fn.__name__}': annotate parameter '{name}' with a tensor type such as "
                            f"f32['M', 'N'] or a scalar dtype such as f32 (got {ann!r})")
        if isinstance(ann, T.TensorSpec) and p.default is not p.empty:
            raise TypeError(f"kernel '{fn.__name__}': tensor parameter '{name}' cannot have a default value "
                            "(scalar parameters can: alpha: f32 = 1.0)")
        params.append((name, ann))
    return params


def build_function(fn, name: str, params: list, block: tuple, reads: GlobalReads | None = None) -> ir.Function:
    """The typed IR of `fn` for a launch with `block` threads; tensor sizes stay symbolic. The module-level names
    its body reads are noted in `reads`."""
    source = parse_function(fn)
    env, ir_params, sizes = {}, [], {}
    for pname, spec in params:
        if isinstance(spec, T.TensorSpec):
            shape = []
            for d in spec.dims:
                if isinstance(d, str):
                    if d not in sizes:
                        sizes[d] = ir.Var(d, T.i32, kind="size")
                    shape.append(sizes[d])
                else:
                    shape.append(ir.const(d))
            buf = ir.Buffer(pname, spec.dtype, tuple(shape), "global")
            ir_params.append(buf)
            env[pname] = buf
        else:
            var = ir.Var(pname, spec, kind="param")
            ir_params.append(var)
            env[pname] = var
    for sname, var in sizes.items():
        if sname in env:
            raise DSLError(f"size symbol '{sname}' has the same name as a parameter", source.loc(source.tree))
        env[sname] = var
    body = translate_body(source, fn, env, reads)
    return ir.Function(name, tuple(ir_params), tuple(sizes.values()), body, block, source.file)
