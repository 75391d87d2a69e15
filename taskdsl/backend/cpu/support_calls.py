"""The helpers of `support`, for fast compilation: called instead of inlined by numba.

numba inlines an `inline="always"` helper at the level of its own IR, so the helper is typed and
lowered again at every use: that keeps the optimized kernels' loops vectorizable (erf, tanh and
gelu run 4-5x slower as calls), but it is a quarter of the compile time of a small kernel. Under
`td.fast_compile` the generated module imports this module as `rt` instead: the same helpers,
compiled once and called.
"""
from numba.core.registry import CPUDispatcher

from . import support
from .parallel import lock_compiles
from .support import njit


def _called(helper):
    """`helper` compiled on its own and called, under its cache's lock as `support`'s own called helpers are."""
    dispatcher = njit(cache=True)(helper.py_func)
    lock_compiles(dispatcher)
    return dispatcher


globals().update({name: value for name, value in vars(support).items() if not name.startswith("__")})
# a few selects or an integer division: inlined they cost numba next to nothing, while calls kept the loops using
# them scalar and their arguments' arithmetic inside (ResNet-50's max pool under fast compile: 5.0 ms, 4.1 inlined)
STAY_INLINED = ("fmax", "fmin", "floordiv_i32", "fma")

globals().update({name: _called(helper) for name, helper in vars(support).items()
                  if isinstance(helper, CPUDispatcher) and helper.targetoptions.get("inline") == "always"
                  and name not in STAY_INLINED})
