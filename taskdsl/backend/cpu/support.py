"""numba-compiled helpers the generated cpu code calls: math, shuffles, atomics, prefetches, debug checks.

Debug checks raise exceptions whose first argument is a site number; the runtime maps it
back to the kernel source line (see `backend/cpu/errors.py`).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, types
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.typed_passes import AnnotateTypes, NopythonRewrites, PreLowerStripPhis
from numba.core.untyped_passes import DeadBranchPrune, GenericRewrites, InlineClosureLikes, ReconstructSSA
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic, overload

from ...ir.types import FLOAT8_NAN, FLOAT8_VALUES, float8_bits, narrow_float_bits
from . import vectors
from .bitcasts import bits_of_f32, f32_from_bits, low_bits
from .trig import cos_f32, sin_f32  # noqa: F401 (the generated code's rt.sin_f32, rt.cos_f32)
from .parallel import call_entry, lock_compiles  # noqa: F401 (call_entry: outlined functions' calls)

WARP = 32


class KernelCompiler(CompilerBase):
    """numba's nopython pipeline less the passes generated code has no use for: the pipeline of a kernel.

    - `ReconstructSSA` rewrites the whole function once per variable assigned more than once, and an
      unrolled register tile has hundreds (each accumulator: its zero, its loads, its multiply-adds):
      a third of numba's time on a 6x32 tile matmul (9.1 s -> 6.2 s). Without it numba types each such
      variable once, unified over its assignments, and lowers it to a stack slot that LLVM's mem2reg
      promotes, as numba did before 0.50. The generated code needs nothing that wants SSA form (no
      literal unrolling, no parfors: the launchers of `parallel.py` keep numba's default pipeline).
    - `InlineClosureLikes` inlines closures and comprehensions, `NopythonRewrites` fuses array
      expressions and builds arrays of constant lists: generated code has none of them (scalar
      statements on flat arrays). Each pass recomputes the function's variable liveness; on the
      tensor-core template's cpu emulation the two took a fifth of numba's time.
    - `GenericRewrites` finds constant operands of `**`, constant indices of tuples, `print` and `raise`:
      generated code has none (the helpers that raise are compiled by numba's own pipeline), yet the pass
      recomputes the liveness of every kernel. `PreLowerStripPhis` removes the phis of SSA form, of which
      there are none without `ReconstructSSA`; `DeadBranchPrune` prunes branches on constants, which LLVM
      folds. Without the three, the 515 kernels of the onnx conformance, rowwise and rule-scheduler tests
      compiled in 197 s instead of 219 s (each compiled both ways in turn, in one process).
    - `AnnotateTypes` copies the typed function's IR for `Dispatcher.inspect_types()`, and the compiled kernel
      keeps that copy for the life of the process: a test worker compiling the graph tests held 3 million objects
      instead of 0.75 million, each full garbage collection took about 2 s instead of 0.5, and numba's cache
      renders the copy as text when it saves (the conformance tests' kernels compiled in 116 s instead of 124).
    """

    UNUSED = (ReconstructSSA, InlineClosureLikes, NopythonRewrites, GenericRewrites, PreLowerStripPhis,
              DeadBranchPrune, AnnotateTypes)

    def define_pipelines(self):
        """The one nopython pipeline, without the `UNUSED` passes."""
        pipeline = DefaultPassBuilder.define_nopython_pipeline(self.state, "taskdsl_kernel")
        pipeline.passes = [(cls, what) for cls, what in pipeline.passes if cls not in self.UNUSED]
        pipeline.finalize()
        return [pipeline]


class ApartKernelCompiler(KernelCompiler):
    """The kernel pipeline for calls whose written arrays overlap no other argument (`compile.apart_twin`):
    numba marks the arrays' pointers `noalias`, so LLVM needs no run-time overlap checks around the loops
    between them, nor keeps loads of one array behind stores to another."""

    def define_pipelines(self):
        """`KernelCompiler`'s pipeline, the arguments not aliasing each other."""
        self.state.flags.noalias = True
        return super().define_pipelines()


@njit(cache=True, inline="always")
def rsqrt(x):
    """1 / sqrt(x)."""
    return 1.0 / math.sqrt(x)


@njit(cache=True, inline="always")
def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return 1.0 / (1.0 + math.exp(-x))


@njit(cache=True, inline="always")
def fmax(a, b):
    """IEEE 754's maximum of floats, as CUDA's td_max: a NaN if either is one, -0.0 below 0.0. Selects only, so
    LLVM vectorizes it, where numba's np.maximum branches; the tests are joined by `&`, as `and` is a branch too,
    which can keep a loop scalar (Inception-V3's first max pool, 147x147x64, two threads, warm: 0.28 ms with `and`,
    0.25-0.26 with `&`). `larger + b` is the answer when b is a zero (of two zeros, their sum; else larger, exactly)
    or a NaN, so the zeros cost one test (testing both operands for zero cost a stride-2 max pool's loop another
    10%). A NaN a needs no test: no b is above it, so `larger` is a. The tests left read b alone, which LLVM hoists
    out of a loop where b is the same throughout (a quantization's clamp to [-128, 127]: QDQ BERT's first
    feed-forward epilogue, three quantizations and a GELU an element over 128 x 3072 on one thread, took 905 us
    with a test of a too, 686 without)."""
    larger = b if b > a else a
    return larger if (b == b) & (b != 0) else larger + b


@njit(cache=True, inline="always")
def fmin(a, b):
    """IEEE 754's minimum of floats, as CUDA's td_min: a NaN if either is one, -0.0 below 0.0 (where b is a zero,
    `-(-smaller - b)`: of two zeros, the negated sum of their negations; a NaN a is `smaller`, as in `fmax`)."""
    smaller = b if b < a else a
    return smaller if (b == b) & (b != 0) else -(-smaller - b)


def _nan_keeping(name):
    """An intrinsic taking two floats to LLVM's `llvm.<name>` of their common type: IEEE 754's maximum / minimum,
    as `fmax` / `fmin` compute them."""

    def typer(typingctx, a, b):
        if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
            return None
        common = a if a.bitwidth >= b.bitwidth else b

        def codegen(context, builder, signature, args):
            x, y = (context.cast(builder, v, t, common) for v, t in zip(args, signature.args))
            suffix = {"half": "f16", "float": "f32", "double": "f64"}[str(x.type)]
            signature_type = llvm_ir.FunctionType(x.type, [x.type] * 2)
            fn = builder.module.declare_intrinsic(f"llvm.{name}.{suffix}", fnty=signature_type)
            return builder.call(fn, [x, y])

        return common(a, b), codegen

    typer.__name__ = name
    return intrinsic(typer)


# A running maximum / minimum (`m = max(m, x)` in a loop) takes these: LLVM knows its intrinsics, and vectorizes the
# chain by itself (a max over rows of 1024 f32, one thread: 0.42 ms, against 0.6 ms for plain compares in 8
# interleaved lanes, which drop NaNs, and 1.3 ms for 8 lanes noting NaNs beside them). Elsewhere `fmax`: with the
# intrinsics everywhere, a stride-2 max pool took 3x the time.
running_max = _nan_keeping("maximum")
running_min = _nan_keeping("minimum")


@intrinsic
def float_to_int(typingctx, value, bits, signed):
    """`value` converted to the integer type of `bits` and `signed` (literals), truncated, saturating, NaN giving 0:
    ir.types.DataType.saturate (what PTX's cvt.rzi does). A plain fptosi of a value that does not fit is poison, and
    LLVM drops the code around one it can prove does not fit; so the value converted is one that fits (0 in place of
    one outside the range or a NaN), and selects give the bounds past it. LLVM's own fpto[su]i.sat, which means
    the same, kept its vectorizers off a loop: an exact 8-bit integer product's i32 sums of its f32 k blocks
    (`matmul_cpu`) took 12-15% of its time with it, about none so. Into 8 or 16 bits, whose bounds the float holds
    exactly, the value is clamped to them as a float and a NaN made 0 before the conversion: three compares and
    three selects where the other way takes four and three and an `and` (QDQ BERT's first feed-forward epilogue,
    three quantizations and a GELU an element: 682 -> 626 us over 128 x 3072 on one thread)."""
    if not (isinstance(value, types.Float) and value.bitwidth >= 32 and isinstance(bits, types.IntegerLiteral)
            and isinstance(signed, types.BooleanLiteral)):
        return None     # (16-bit floats reach casts as f32: `codegen.cast`)
    width, is_signed = bits.literal_value, signed.literal_value
    result = types.Integer.from_bitwidth(width, is_signed)

    def codegen(context, builder, signature, args):
        source = args[0]
        ftype, itype = source.type, llvm_ir.IntType(width)
        low = -2.0 ** (width - 1) if is_signed else 0.0     # powers of two: exact in f32 and f64
        high = 2.0 ** (width - 1 if is_signed else width)   # the first value past the range
        top, bottom = (2 ** (width - 1) - 1, -2 ** (width - 1)) if is_signed else (2 ** width - 1, 0)
        if width <= 16:
            clamped = builder.select(builder.fcmp_ordered(">", source, ftype(top)), ftype(top), source)
            clamped = builder.select(builder.fcmp_ordered("<", clamped, ftype(low)), ftype(low), clamped)
            clamped = builder.select(builder.fcmp_ordered("ord", source, source), clamped, ftype(0.0))
            return (builder.fptosi if is_signed else builder.fptoui)(clamped, itype)
        below, above = (builder.fcmp_ordered(op, source, ftype(bound)) for op, bound in (("<", low), (">=", high)))
        inside = builder.and_(builder.fcmp_ordered(">=", source, ftype(low)), builder.fcmp_ordered("<", source,
                                                                                                  ftype(high)))
        converted = (builder.fptosi if is_signed else builder.fptoui)(builder.select(inside, source, ftype(0.0)),
                                                                      itype)
        return builder.select(below, itype(bottom), builder.select(above, itype(top), converted))

    return result(value, bits, signed), codegen


@intrinsic
def select(typingctx, cond, a, b):
    """`a` if `cond` else `b`, both evaluated: LLVM's select, where numba's `a if cond else b` is a branch that keeps
    a loop scalar unless LLVM can move each side's instructions above it (a few at most). For operands that are
    safe to evaluate at every element (`codegen.speculable`)."""
    common = typingctx.unify_pairs(a, b)
    if common is None or not isinstance(common, (types.Number, types.Boolean)):
        return None

    def codegen(context, builder, signature, args):
        c, x, y = args
        truth = context.cast(builder, c, signature.args[0], types.boolean)
        return builder.select(truth, *(context.cast(builder, v, t, common) for v, t in zip((x, y),
                                                                                            signature.args[1:])))

    return common(cond, a, b), codegen


@njit(cache=True, inline="always")
def nan_to_zero(x):
    """0 for a NaN, else x + 0 (-0.0 made 0.0): an integral float converted to an integer type and back."""
    return select(x == x, x + np.float32(0.0), np.float32(0.0))


# Below TINY = 2^-12, tanh(x) = x and erf(x) = 2 x / sqrt(pi) within x^2 / 3 < 2e-8 (relative). The rational forms
# would multiply subnormal powers of x there: inaccurate, and a microcode assist per instruction (see exp_f32),
# so they run on 1 instead and the lane selects the small-x value.
TINY = np.float32(2.44140625e-4)

# erf(x) = x * P(x^2) / Q(x^2) on [-4, 4] (beyond, erf is +-1 in float32): the rational minimax
# approximation XLA and Eigen use for float32, within 4.2e-7 of math.erf. Arithmetic only, so a
# GELU epilogue vectorizes, where math.erf is a libm call per element.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


@njit(cache=True, inline="always")
def _odd_rational(x, p_coeffs, q_coeffs):
    """x * P(x^2) / Q(x^2) in float32, P and Q by Horner from their highest coefficient."""
    x2 = x * x
    p = np.float32(p_coeffs[0])
    for c in p_coeffs[1:]:
        p = p * x2 + np.float32(c)
    q = np.float32(q_coeffs[0])
    for c in q_coeffs[1:]:
        q = q * x2 + np.float32(c)
    return x * p / q


@njit(cache=True, inline="always")
def erf_f32(x):
    """erf of a float32, by the rational approximation above (bounded by +-1; NaN stays NaN); 2 x / sqrt(pi)
    below TINY."""
    small = abs(x) < TINY
    xc = np.float32(1.0) if small else min(max(x, np.float32(-4.0)), np.float32(4.0))
    r = min(max(_odd_rational(xc, _ERF_P, _ERF_Q), np.float32(-1.0)), np.float32(1.0))
    r = x * np.float32(1.12837916709551257) if small else r
    return r if x == x else x


# tanh(x) = x * P(x^2) / Q(x^2), x clamped to +-7.905 (where tanh is +-1 in float32): the rational
# minimax approximation Eigen and XLA use for float32, within 3.5e-7 (relative) of tanh. Arithmetic
# only, so a tanh-GELU epilogue (GPT-2) vectorizes, where math.tanh is a libm call per element.
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)


@njit(cache=True, inline="always")
def tanh_f32(x):
    """tanh of a float32, by the rational approximation above (+-1 from |x| = 9, where float32's tanh
    rounds to it; NaN stays NaN); x itself below TINY."""
    small = abs(x) < TINY
    xc = np.float32(1.0) if small else min(max(x, np.float32(-7.90531110763549805)), np.float32(7.90531110763549805))
    r = x if small else _odd_rational(xc, _TANH_P, _TANH_Q)
    r = np.float32(1.0) if x >= np.float32(9.0) else np.float32(-1.0) if x <= np.float32(-9.0) else r
    return r if x == x else x


# e**x = 2**n * e**r, n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, so r is exact): Cody and
# Waite's reduction with Cephes' degree-7 polynomial for e**r on [-ln2/2, ln2/2], within 2 ulp of
# libm's expf. 2**n is two exponent-field bitcasts, so overflow to inf and the subnormal results
# below e**-87.3 come out of the last multiply. Arithmetic and selects only, so a softmax's loop of
# exps vectorizes, where math.exp is a libm call per element.
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


@njit(cache=True, inline="always")
def exp_f32(x):
    """e ** x of a float32 (inf above 88.73, 0 below -103.98, NaN stays NaN).

    Below -104, where e ** x rounds to 0, the lane computes e ** 0 and selects 0: computed from x, its last
    multiply would give a subnormal, and each instruction with a subnormal result takes a microcode assist
    (a softmax row masked with -1e4, as attention masks are, ran 3x slower)."""
    under = x < np.float32(-104.0)
    xc = min(np.float32(0.0) if under else x, np.float32(89.0))
    n = np.floor(xc * np.float32(1.44269504088896341) + np.float32(0.5))
    r = xc - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(_EXP_P[0])
    for c in _EXP_P[1:]:
        p = p * r + np.float32(c)
    p = p * r * r + r + np.float32(1.0)
    k = np.int32(n)
    half = k >> 1
    y = p * f32_from_bits((half + 127) << 23) * f32_from_bits((k - half + 127) << 23)
    return np.float32(0.0) if under else (y if x == x else x)


# log x = log m + e ln 2, x = m 2^e with m in [sqrt(1/2), sqrt(2)) (m and e from the bits: exponent-field masks),
# log m = log(1 + f) by Cephes' degree-8 polynomial in f, and ln 2 in two parts: within 1 ulp of the exact logarithm
# (0.76 at most over 2.3 million floats of every exponent, subnormals included; tests/backend). Subnormals are
# scaled by 2^23 first (a select: a normal x never goes through a subnormal product). Arithmetic, bitcasts and
# selects only, so a softplus or mish (log1p of e^-|x|) vectorizes, where math.log is a libm call per element.
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
          2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)


@njit(cache=True, inline="always")
def log_f32(x):
    """The natural logarithm of a float32 (-inf at 0 and -0, NaN below 0 and for NaN, inf at inf)."""
    subnormal = x < np.float32(1.17549435e-38)
    bits = np.int32(bits_of_f32(x * np.float32(8388608.0) if subnormal else x))
    e = np.float32(((bits >> 23) & 0xff) - (149 if subnormal else 126))
    m = f32_from_bits((bits & 0x007fffff) | 0x3f000000)       # [0.5, 1)
    low = m < np.float32(0.707106781186547524)
    e = e - np.float32(1.0) if low else e
    f = (m + m if low else m) - np.float32(1.0)
    z = f * f
    p = np.float32(_LOG_P[0])
    for c in _LOG_P[1:]:
        p = p * f + np.float32(c)
    y = p * f * z + e * np.float32(-2.12194440e-4) - np.float32(0.5) * z
    r = f + y + e * np.float32(0.693359375)
    r = r if x > np.float32(0.0) else (np.float32(-np.inf) if x == np.float32(0.0) else np.float32(np.nan))
    return r if x < np.float32(np.inf) else x


@njit(cache=True, inline="always")
def sigmoid_f32(x):
    """1 / (1 + exp(-x)) of a float32 through `exp_f32` (vectorizable; 0 and 1 at -inf and inf; NaN stays NaN)."""
    return np.float32(1.0) / (np.float32(1.0) + exp_f32(-x))


@njit(cache=True, inline="always")
def floordiv_i32(a, b):
    """a // b of two i32 values, 0 for -2**31 // -1 as for every signed type (numba computes i32 arithmetic in
    int64, where that quotient is 2**31; its int64 division gives 0 only for int64's minimum)."""
    q = a // b
    return 0 if (b == -1 and a == -2147483648) else q


@njit(cache=True, inline="always")
def pow(x, y):  # noqa: A001 - the DSL's name
    """x ** y as math.pow, with y == 2 as x * x: a multiply, where math.pow is a libm call an element (a square of
    4096 x 4096 f32 took 10x numpy's time, whose power squares too). The same value: x * x is correctly rounded.
    y == 3 (the tanh-GELU of GPT-2's exports) is x * x * x, within an ulp of the power (10x faster at 1000 x 1000)."""
    if y == 2.0:
        return x * x
    return x * x * x if y == 3.0 else math.pow(x, y)


@njit(cache=True, inline="always")
def exp2(x):
    """2 ** x."""
    return math.pow(2.0, x)


@njit(cache=True, inline="always")
def fma(a, b, c):
    """a * b + c."""
    return a * b + c


# -------------------------------------------------------------- warp shuffles (CUDA semantics)
# PTX shfl.sync: a segment of `width` lanes spans [min_lane, max_lane]; a computed source lane
# beyond max_lane (below min_lane for `up`) yields the thread's own value. Each helper returns
# the block-linear thread whose value `tid` reads.
@njit(cache=True, inline="always")
def _segment(tid, width):
    lane = tid % WARP
    min_lane = lane & (WARP - width)
    return lane, min_lane, min_lane | (width - 1)


@njit(cache=True, inline="always")
def _source(tid, lane, j, nthreads):
    src = tid - lane + j
    return src if src < nthreads else tid   # a lane past the end of the block: undefined in CUDA


@njit(cache=True, inline="always")
def shfl_xor_src(tid, mask, width, nthreads):
    """The thread `__shfl_xor_sync(v, mask, width)` reads from."""
    lane, _, max_lane = _segment(tid, width)
    j = lane ^ (mask & (WARP - 1))
    return _source(tid, lane, lane if j > max_lane else j, nthreads)


@njit(cache=True, inline="always")
def shfl_down_src(tid, delta, width, nthreads):
    """The thread `__shfl_down_sync(v, delta, width)` reads from."""
    lane, _, max_lane = _segment(tid, width)
    j = lane + (delta & (WARP - 1))
    return _source(tid, lane, lane if j > max_lane else j, nthreads)


@njit(cache=True, inline="always")
def shfl_up_src(tid, delta, width, nthreads):
    """The thread `__shfl_up_sync(v, delta, width)` reads from."""
    lane, min_lane, _ = _segment(tid, width)
    j = lane - (delta & (WARP - 1))
    return _source(tid, lane, lane if j < min_lane else j, nthreads)


@njit(cache=True, inline="always")
def shfl_idx_src(tid, src_lane, width, nthreads):
    """The thread `__shfl_sync(v, src_lane, width)` reads from."""
    lane, min_lane, _ = _segment(tid, width)
    return _source(tid, lane, min_lane | (src_lane & (width - 1)), nthreads)


# -------------------------------------------------------------- atomics (blocks run serially then)
@njit(cache=True, inline="always")
def atomic_add(a, idx, v):
    """a[idx] += v; the old value."""
    old = a[idx]
    a[idx] = old + v
    return old


@njit(cache=True, inline="always")
def atomic_sub(a, idx, v):
    """a[idx] -= v; the old value."""
    old = a[idx]
    a[idx] = old - v
    return old


@njit(cache=True, inline="always")
def atomic_max(a, idx, v):
    """a[idx] = max(a[idx], v) as `td.max` (a NaN kept, -0.0 below 0.0); the old value."""
    old = a[idx]
    if v > old or v != v or (v == old and math.copysign(1.0, old) < 0):
        a[idx] = v
    return old


@njit(cache=True, inline="always")
def atomic_min(a, idx, v):
    """a[idx] = min(a[idx], v) as `td.min` (a NaN kept, -0.0 below 0.0); the old value."""
    old = a[idx]
    if v < old or v != v or (v == old and math.copysign(1.0, v) < 0):
        a[idx] = v
    return old


@njit(cache=True, inline="always")
def atomic_exch(a, idx, v):
    """a[idx] = v; the old value."""
    old = a[idx]
    a[idx] = v
    return old


@intrinsic
def prefetch(typingctx, array, index):
    """Bring the cache line of element `index` of the flat `array` into every cache level (LLVM's prefetch for a
    read: x86's prefetcht0). A hint: it neither faults nor changes a value."""
    if not (isinstance(array, types.Array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(array)(context, builder, args[0]).data
        byte_pointer, i32 = llvm_ir.IntType(8).as_pointer(), llvm_ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte_pointer], llvm_ir.FunctionType(
            llvm_ir.VoidType(), [byte_pointer, i32, i32, i32]))
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_pointer)
        builder.call(fn, [address, i32(0), i32(3), i32(1)])       # a read, kept in every level, a data line
        return context.get_dummy_value()

    return types.none(array, index), codegen


@intrinsic(prefer_literal=True)
def dot4(typingctx, acc, acc_index, a, a_index, b, b_index, lanes):
    """`td.dot4` on flat arrays: acc[acc_index + l] (i32) += the dot product of a[a_index : a_index + 4] (u8) and
    b[b_index + 4 * l : b_index + 4 * l + 4] (i8), for each lane l < `lanes` (a literal). One vpdpbusd where the
    host has it for `lanes` (`vectors.dot4_lanes`; the accumulators, in a stack array, stay in a vector register
    across an unrolled loop), else the same sums lane by lane."""
    if not (isinstance(lanes, types.IntegerLiteral) and all(isinstance(x, types.Array) for x in (acc, a, b))):
        return None
    count = lanes.literal_value
    vectorized = count in vectors.dot4_lanes()

    def codegen(context, builder, signature, args):
        (acc_array, acc_at, a_array, a_at, b_array, b_at, _), (acc_type, _, a_type, _, b_type, _, _) = \
            args, signature.args
        data = lambda array, kind, at: builder.gep(context.make_array(kind)(context, builder, array).data, [at])
        acc_p, a_p, b_p = data(acc_array, acc_type, acc_at), data(a_array, a_type, a_at), data(b_array, b_type, b_at)
        i32 = llvm_ir.IntType(32)
        if vectorized:
            vector = llvm_ir.VectorType(i32, count)
            fn = builder.module.declare_intrinsic(f"llvm.x86.avx512.vpdpbusd.{32 * count}", (), llvm_ir.FunctionType(
                vector, [vector] * 3))
            acc_v = builder.bitcast(acc_p, vector.as_pointer())
            word = builder.load(builder.bitcast(a_p, i32.as_pointer()), align=1)
            words = builder.shuffle_vector(builder.insert_element(llvm_ir.Constant(vector, None), word, i32(0)),
                                           llvm_ir.Constant(vector, None), llvm_ir.Constant(vector, [0] * count))
            b_v = builder.load(builder.bitcast(b_p, vector.as_pointer()), align=1)
            builder.store(builder.call(fn, [builder.load(acc_v, align=4), words, b_v]), acc_v, align=4)
            return context.get_dummy_value()
        byte = lambda pointer, k, widen: widen(builder.load(builder.gep(pointer, [i32(k)])), i32)
        a_values = [byte(a_p, q, builder.zext) for q in range(4)]
        for lane in range(count):
            slot = builder.gep(acc_p, [i32(lane)])
            total = builder.load(slot)
            for q in range(4):
                total = builder.add(total, builder.mul(a_values[q], byte(b_p, 4 * lane + q, builder.sext)))
            builder.store(total, slot)
        return context.get_dummy_value()

    return types.none(acc, acc_index, a, a_index, b, b_index, lanes), codegen


@intrinsic(prefer_literal=True)
def stack_array(typingctx, size, dtype):
    """A flat array of `size` (a literal) elements of `dtype` in the calling function's stack frame, 64-byte
    aligned: LLVM knows it aliases no argument, and keeps it in registers where every index of it is a constant
    once LLVM has unrolled the loops around it (`codegen.STACK_BYTES`)."""
    if not (isinstance(size, types.IntegerLiteral) and isinstance(dtype, types.NumberClass)):
        return None
    element, count = dtype.instance_type, size.literal_value
    array = types.Array(element, 1, "C")

    def codegen(context, builder, signature, args):
        data_type = context.get_data_type(element)
        with builder.goto_entry_block():        # once per call, not per loop trip
            data = builder.alloca(data_type, size=llvm_ir.IntType(64)(count))
            data.align = 64
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(data_type))
        out = context.make_array(array)(context, builder)
        context.populate_array(out, data=data, shape=[context.get_constant(types.intp, count)], strides=[itemsize],
                               itemsize=itemsize, meminfo=None)
        return out._getvalue()

    return array(size, dtype), codegen


@intrinsic
def borrowed(typingctx, array):
    """`array` without its reference count (a null meminfo): an outlined function's call packs its arrays in a
    tuple, and numba counts a reference to each counted array in it, an atomic increment and decrement per call
    (about 10 ns of a call passing three arrays). The caller's own reference outlives the call."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        source = context.make_array(array)(context, builder, args[0])
        out = context.make_array(array)(context, builder)
        context.populate_array(out, data=source.data, shape=source.shape, strides=source.strides,
                               itemsize=source.itemsize, meminfo=None)
        return out._getvalue()

    return array(array), codegen


# -------------------------------------------------------------- debug mode
@njit(cache=True)
def check_index(a, idx, site):
    """`idx`, after raising IndexError(site, dim, index, extent) if it is outside the array."""
    for d in range(len(idx)):
        if idx[d] < 0 or idx[d] >= a.shape[d]:
            raise IndexError(site, d, idx[d], a.shape[d])
    return idx


@njit(cache=True)
def _flat(a, idx):
    flat = 0
    for d in range(len(idx)):
        flat = flat * a.shape[d] + idx[d]
    return flat


@njit(cache=True)
def new_shadow(a):
    """Per-element race bookkeeping of a shared buffer: writer epoch/thread, reader epoch/thread, atomic updater
    epoch/thread (thread -1: several, or the whole block at once)."""
    return np.zeros((6, a.size), np.int64)


@njit(cache=True)
def load_checked(a, idx, site):
    """a[idx] after a bounds check."""
    check_index(a, idx, site)
    return a[idx]


@njit(cache=True)
def store_checked(a, idx, value, site):
    """a[idx] = value after a bounds check."""
    check_index(a, idx, site)
    a[idx] = value


_WRITE, _READ, _ATOMIC = 0, 2, 4     # the shadow's rows: an access's epoch, and the next row its thread


@njit(cache=True)
def _race(shadow, row, e, tid, epoch, site, kind):
    """Raise race `kind` where another thread made element `e`'s access of shadow row `row` in this epoch."""
    if shadow[row, e] == epoch and shadow[row + 1, e] != tid:
        raise RuntimeError(site, kind, e, tid, shadow[row + 1, e])


@njit(cache=True)
def _note(shadow, row, e, tid, epoch):
    """Record thread `tid`'s access of element `e` in shadow row `row` (thread -1: several, in this epoch)."""
    if shadow[row, e] != epoch:
        shadow[row, e] = epoch
        shadow[row + 1, e] = tid
    elif shadow[row + 1, e] != tid:
        shadow[row + 1, e] = -1


@njit(cache=True)
def load_shared_checked(a, idx, shadow, tid, epoch, site):
    """A bounds-checked shared load that reports a read of another thread's unsynchronized write or atomic."""
    check_index(a, idx, site)
    e = _flat(a, idx)
    _race(shadow, _WRITE, e, tid, epoch, site, 0)
    _race(shadow, _ATOMIC, e, tid, epoch, site, 5)
    _note(shadow, _READ, e, tid, epoch)
    return a[idx]


@njit(cache=True)
def store_shared_checked(a, idx, value, shadow, tid, epoch, site):
    """A bounds-checked shared store that reports a write racing another thread's access."""
    check_index(a, idx, site)
    e = _flat(a, idx)
    _race(shadow, _WRITE, e, tid, epoch, site, 1)
    _race(shadow, _READ, e, tid, epoch, site, 2)
    _race(shadow, _ATOMIC, e, tid, epoch, site, 6)
    _note(shadow, _WRITE, e, tid, epoch)
    a[idx] = value


@njit(cache=True)
def atomic_shared_checked(a, idx, shadow, tid, epoch, site):
    """`idx` after a bounds check of a shared atomic, which races another thread's plain access (atomics of
    several threads do not race each other)."""
    check_index(a, idx, site)
    e = _flat(a, idx)
    _race(shadow, _WRITE, e, tid, epoch, site, 3)
    _race(shadow, _READ, e, tid, epoch, site, 4)
    _note(shadow, _ATOMIC, e, tid, epoch)
    return idx


# -------------------------------------------------------------- 16-bit floats (held as uint16 bits)
# numba has no float16; f16/bf16 values travel as their bit patterns and are computed in f32.
# The conversions are not inline="always": LLVM inlines them anyway, while numba's own inlining
# costs compile time at every use, growing with the size of the kernel.
def _host_converts_halves() -> bool:
    """Whether numba compiles for this host (not a named cpu) and it has F16C, so LLVM rounds an f32 to f16 with
    one `vcvtps2ph`, vectorized; elsewhere LLVM would call a runtime library function the JIT may not have."""
    from llvmlite import binding
    from numba.core import config
    return config.CPU_NAME in (None, "host") and bool(binding.get_host_cpu_features().get("f16c"))


HARDWARE_HALVES = _host_converts_halves()


def _f32_of_f16_bits(bits):
    """The f32 value of f16 bits (typed by the overload below)."""


@intrinsic
def _f32_of_f16_bits_by_hardware(typingctx, bits):
    """The f32 value of f16 bits (an integer's low 16), by LLVM's fpext: exact, one `vcvtph2ps`."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        half = builder.bitcast(low_bits(builder, args[0], bits.bitwidth, 16), llvm_ir.HalfType())
        return builder.fpext(half, llvm_ir.FloatType())

    return types.float32(bits), codegen


def _f32_of_f16_bits_in_software(bits):
    b = np.int64(bits)
    sign, exp, mant = (b & 0x8000) << 16, (b >> 10) & 0x1f, b & 0x3ff
    if exp == 0:   # zero or subnormal: mant * 2**-24, exact in f32
        value = np.float32(mant) * np.float32(5.960464477539063e-08)
        return -value if sign else value
    return f32_from_bits(sign | ((exp + 112 if exp < 31 else 255) << 23) | (mant << 13))


@overload(_f32_of_f16_bits)
def _f32_of_f16_bits_typed(bits):
    if HARDWARE_HALVES:
        return lambda bits: _f32_of_f16_bits_by_hardware(bits)
    return _f32_of_f16_bits_in_software


@njit(cache=True)
def f16_to_f32(bits):
    """The f32 value of f16 bits."""
    return _f32_of_f16_bits(bits)


@njit(cache=True)
def bf16_to_f32(bits):
    """The f32 value of bf16 bits."""
    return f32_from_bits((np.int64(bits) & 0xffff) << 16)


# The rounding is plain Python that numba also compiles: constant folding rounds with the same code.
_round_to_bits = njit(cache=True, inline="always")(narrow_float_bits)


@intrinsic
def _f16_bits_by_hardware(typingctx, x):
    """The f16 bits nearest to the f32 x, by LLVM's fptrunc (round to nearest even; a NaN keeps its sign)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], llvm_ir.HalfType()), llvm_ir.IntType(16))

    return types.uint16(x), codegen


def _f16_bits(x):
    """The f16 bits nearest to x (typed by the overload below)."""


@overload(_f16_bits)
def _f16_bits_typed(x):
    # An f32 by the host's instruction where it has one: the bit manipulations of `narrow_float_bits` do not
    # vectorize (40 ms against 0.8 for 4M values), and 16-bit kernels round every store (f16 ResNet-50 on the cpu:
    # 13x its f32 time). An f64 rounds once, in software: through f32 it would round twice.
    if HARDWARE_HALVES and x == types.float32:
        return lambda x: _f16_bits_by_hardware(x)
    return lambda x: np.uint16(_round_to_bits(x, 10, 15, 31))


@njit(cache=True)
def f32_to_f16(x):
    """The f16 bits nearest to x, an f32 or f64 (ties to even)."""
    return _f16_bits(x)


def _bf16_bits(x):
    """The bf16 bits nearest to x (typed by the overload below)."""


def _bf16_bits_of_f32(x):
    # bf16 is f32's upper half: add half a unit of the kept bits, less one unless the kept part is odd (ties to
    # even), and drop the lower half; a carry rounds into the exponent, up to inf. Integer arithmetic only, so it
    # vectorizes, where the general rounding calls frexp and rint per value.
    b = np.int64(bits_of_f32(x))
    if x != x:      # a quiet NaN of x's sign
        return np.uint16(((b >> 16) & 0x8000) | 0x7fc0)
    return np.uint16((b + 0x7fff + ((b >> 16) & 1)) >> 16)


@overload(_bf16_bits)
def _bf16_bits_typed(x):
    if x == types.float32:
        return _bf16_bits_of_f32
    return lambda x: np.uint16(_round_to_bits(x, 7, 127, 255))     # an f64 rounds once


@njit(cache=True)
def f32_to_bf16(x):
    """The bf16 bits nearest to x, an f32 or f64 (ties to even)."""
    return _bf16_bits(x)


# -------------------------------------------------------------- 8-bit floats (held as uint8 bits)
# A table gives the 256 values (numba freezes a global array into the module). An f64 rounds by `float8_bits`, the
# code constant folding rounds with, an f32 by integer arithmetic on its bits; their arguments are those of
# `FLOAT8_FORMATS` (a test compares them).
_F8E4M3_VALUES, _F8E5M2_VALUES = FLOAT8_VALUES["f8e4m3"], FLOAT8_VALUES["f8e5m2"]
_round_to_float8 = njit(cache=True, inline="always")(float8_bits)


@njit(cache=True)
def f8e4m3_to_f32(bits):
    """The f32 value of f8e4m3 bits."""
    return _F8E4M3_VALUES[np.int64(bits) & 0xff]


@njit(cache=True)
def f8e5m2_to_f32(bits):
    """The f32 value of f8e5m2 bits."""
    return _F8E5M2_VALUES[np.int64(bits) & 0xff]


def _float8_bits(x, mant_bits, exp_bias, largest):
    """The 8-bit float bits nearest to x (typed by the overload below)."""


def _float8_bits_of_f32(x, mant_bits, exp_bias, largest):
    # Integer arithmetic on x's bits but for a subnormal's rounding (rint of an exact scaling), so it vectorizes,
    # where `float8_bits` calls frexp and rint per value (4M f32 values to f8e4m3: 43-46 ms with it, 3-4 ms now).
    b = np.int64(bits_of_f32(x))
    sign = (b >> 24) & 0x80
    magnitude = min(b & 0x7fffffff, np.int64(bits_of_f32(np.float32(largest))))   # saturated (a NaN: below)
    shift = 23 - mant_bits
    # a normal result: the dropped bits rounded to even (a carry rounds up into the exponent), the exponent's bias
    # moved from f32's 127 to the format's
    rounded = (magnitude + (1 << (shift - 1)) - 1 + ((magnitude >> shift) & 1)) >> shift
    normal = rounded - ((127 - exp_bias) << mant_bits)
    # a subnormal result (below 2**(1 - bias)): units of the format's least value, rounded to even (2**mant_bits,
    # reached by rounding up, is the least normal's pattern)
    units = np.int64(np.rint(f32_from_bits(magnitude) * np.float32(2.0 ** (exp_bias - 1 + mant_bits))))
    code = normal if magnitude >= ((128 - exp_bias) << 23) else units
    return np.uint8(FLOAT8_NAN if x != x else sign | code)


@overload(_float8_bits)
def _float8_bits_typed(x, mant_bits, exp_bias, largest):
    if x == types.float32:
        return _float8_bits_of_f32
    return lambda x, mant_bits, exp_bias, largest: np.uint8(_round_to_float8(x, mant_bits, exp_bias, largest))


@njit(cache=True)
def f32_to_f8e4m3(x):
    """The f8e4m3 bits nearest to x, an f32 or f64 (ties to even; saturated to +-448, as CUDA's __NV_SATFINITE)."""
    return _float8_bits(x, 3, 7, 448.0)


@njit(cache=True)
def f32_to_f8e5m2(x):
    """The f8e5m2 bits nearest to x, an f32 or f64 (ties to even; saturated to +-57344, inf included)."""
    return _float8_bits(x, 2, 15, 57344.0)


# numba compiles a called (not inlined) helper for each kernel's argument types into the disk cache that the processes
# of a parallel build share: under the cache's lock (see `parallel.compiled`)
for _helper in [value for value in globals().values() if isinstance(value, CPUDispatcher)]:
    lock_compiles(_helper)
