"""Powers by a constant 2 or 3 as products: `x ** 2 => x * x`, `x ** 3 => x * x * x` (f32 and f64).

A fused elementwise kernel reads a constant operand from memory (one kernel serves every value), so the cpu's
`pow` chooses at each element between a multiply (exponents 2 and 3) and libm's pow. LLVM moves that choice out of
the loop in a small kernel, but not in one as large as a tanh-GELU's, whose loop then keeps the pow call and does
not vectorize: the GELU of GPT-2's ONNX exports (Pow by an initializer of 3, then tanh) took 2.4 ms for a
(128, 3072) f32 array, 0.37 ms as products. The products are the values the cpu's `pow` gives (x * x is correctly
rounded; x * x * x is how it computes a cube). A base and exponent of other types keep `pow`: 16-bit floats would
round the square before the cube's last multiply, and an integer exponent makes an f32 power in f64.
"""
from __future__ import annotations

import numpy as np

from ...ir import types as T
from ..graph import Graph
from ..ops import Elementwise, mul
from .fold_constants import constant_value


def _small_exponent(op) -> int | None:
    """2 or 3 where `op` is a pow of an f32 / f64 base by a constant of its type that is that number everywhere and
    leaves the base's shape; else None."""
    if not (isinstance(op, Elementwise) and op.kind == "pow"):
        return None
    base, exponent = op.inputs
    value = constant_value(exponent)
    if base.dtype not in (T.f32, T.f64) or exponent.dtype != base.dtype or value is None or not value.size or \
            op.outputs[0].shape != base.shape:
        return None
    first = value.flat[0]
    return int(first) if first in (2, 3) and np.all(value == first) else None


def expand_powers(graph: Graph) -> Graph:
    """The graph with each pow by a constant 2 or 3 as products of its base (see the module docstring)."""
    def rewritten(op, inputs):
        n = _small_exponent(op)
        if n is None:
            return None
        square = mul(inputs[0], inputs[0])
        return [square if n == 2 else mul(square, inputs[0])]

    return graph.transform(rewritten)
