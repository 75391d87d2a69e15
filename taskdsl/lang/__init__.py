"""The kernel language: everything a `@td.kernel` body may refer to."""
from .intrinsics import (ATOMICS, MATH, TENSOR_OPS, WARP_OPS, Intrinsic, blockDim, blockIdx, cast, cdiv, gridDim,
                         prefetch, registers, shared, syncthreads, syncwarp, threadIdx, unroll, warp_size, math_expr)

globals().update(MATH)
globals().update(ATOMICS)
globals().update(WARP_OPS)
globals().update(TENSOR_OPS)
