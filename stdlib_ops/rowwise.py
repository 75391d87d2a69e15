"""Row-wise kernels written in the DSL: softmax, log-softmax and layer norm over the last axis.

Each comes in two schedules of the same computation:
  - 'block': a block of 256 threads per row, threads striding over the row, warp shuffles
    and shared memory for the row's max / sum (what a GPU wants: coalesced, parallel). A row of
    up to 256 x 32 elements is read from memory once, into registers (up to 32 a thread, all
    loads issued before the first is used), and every later pass over it reads those;
    longer rows are streamed again for each pass;
  - 'thread': a block of one thread per row, streaming through it (what the cpu target wants: a block's
    threads run one after another there, so per-row parallelism only costs; and the cpu's workers share a
    launch's blocks, so a block per row keeps both cores busy on a few long rows: with 64 rows a block, the
    softmax of (2, 50257) ran on one core, 0.075 ms against 0.046-0.053).
`schedule_for_target()` picks one; both run, and compile to CUDA, on either target. Rows of f16 / bf16
are computed in f32 (their statistics and every intermediate) and rounded once, at the store.
The block softmax reads its row twice (an online max and sum, then the outputs), writing it once: it
read the row three times and wrote it twice (0.64 of an H200's peak bandwidth at (16384, 4096)).
"""

import functools
import math

import numpy as np

import taskdsl as td
from taskdsl import bf16, blockIdx, f16, f32, f64, threadIdx
from taskdsl.runtime.arrays import contiguous, empty_like_operands, on_device
from taskdsl.runtime.device_array import to_device

BLOCK = 256
CACHED = (1, 2, 4, 8, 16, 32)    # elements per thread a 'block' kernel can keep of its row in registers
LANES = 16              # 'thread' schedule: partial sums or maxima per row (see `lane_sum`, `lane_max`)
HALVES = tuple(LANES >> i for i in range(1, LANES.bit_length()))     # (8, 4, 2, 1): lanes combined by halves


ROW_DTYPES = (f16, bf16, f32, f64)


def applies(dtype) -> bool:
    """Whether the row kernels take elements of `dtype` (a DSL or numpy dtype): the float types."""
    if not isinstance(dtype, td.ir.types.DataType):
        try:
            dtype = td.ir.types.from_numpy(dtype)
        except TypeError:
            return False
    return dtype in ROW_DTYPES


def schedule_for_target() -> str:
    """'thread' on the cpu target, 'block' on a GPU."""
    return "thread" if td.get_target() == "cpu" else "block"


def cached_per_thread(columns: int, schedule: str) -> int:
    """Elements per thread a kernel of `schedule` keeps of a row of `columns` in registers: the least of CACHED
    covering the row on the 'block' schedule; 0 (each pass reads the row from memory) past BLOCK * CACHED[-1]
    or on the 'thread' schedule."""
    if schedule != "block":
        return 0
    return next((n for n in CACHED if n * BLOCK >= columns), 0)


@td.func
def block_reduce(v, op, partials):
    """The `op` ('sum' or 'max') of `v` over the block's 256 threads, returned to every thread."""
    for offset in (16, 8, 4, 2, 1):
        other = td.shfl_xor(v, offset)
        v = v + other if op == "sum" else td.max(v, other)
    if threadIdx.x % 32 == 0:
        partials[threadIdx.x // 32] = v
    td.syncthreads()
    w = partials[threadIdx.x % 8]      # every warp combines the 8 warp results itself
    for offset in (4, 2, 1):
        other = td.shfl_xor(w, offset)
        w = w + other if op == "sum" else td.max(w, other)
    td.syncthreads()                  # the partials may be reused by the next reduction
    return w


@td.func
def row_extreme(X, row, start, n, first, is_max):
    """max (is_max) or min of X[row, start : start + n] and `first` (whose type the result has), a NaN kept: one
    running `td.max`, whose chain the cpu's LLVM vectorizes itself (`backend/cpu/support.fmax`). Lanes of plain
    compares with their NaNs noted beside them, which this replaced, stayed scalar."""
    m = first
    for j in range(n):
        m = td.max(m, X[row, start + j]) if is_max else td.min(m, X[row, start + j])
    return m


@td.func
def lane_max(X, row, n, lanes):
    """The max of X[row, :n] (-inf for n = 0), NaNs dropped, by LANES interleaved lanes of plain compares, combined
    by halves. A softmax needs no NaN from it: a NaN element's exp makes the sum, so every output, NaN. One running
    IEEE maximum (`row_extreme`: LLVM's `llvm.maximum`, which the cpu vectorizes itself) took 27 us of a softmax of
    1536 rows of 128 on two threads against 8.6 for 96 rows of 2048: its vector reduction fixes NaNs and zeros'
    signs at every step of the combine, about 80 cycles a row. These lanes took the softmax from 93 to 77 us there,
    and rows of 7 from 130 to 82."""
    for k in td.unroll(LANES):
        lanes[k] = -math.inf
    body = n - n % LANES
    for j in range(0, body, LANES):
        for k in td.unroll(LANES):
            v = X[row, j + k]
            lanes[k] = v if v > lanes[k] else lanes[k]
    for half in HALVES:
        for k in td.unroll(half):
            lanes[k] = lanes[k + half] if lanes[k + half] > lanes[k] else lanes[k]
    m = lanes[0]
    for j in range(body, n):
        v = X[row, j]
        m = v if v > m else m
    return m


@td.func
def lane_sum(Y, row, n, center, term, lanes):
    """The sum of the terms d = Y[row, :n] - center ('plain'), of their squares ('square') or of exp(d) ('exp') in
    `lanes`' type, by LANES interleaved partial sums: independent chains the cpu's SLP vectorizer packs, where one
    running sum waits on the previous addition at every element (and LLVM keeps a float sum's order)."""
    for k in td.unroll(LANES):
        lanes[k] = 0.0
    body = n - n % LANES
    for j in range(0, body, LANES):
        for k in td.unroll(LANES):
            d = Y[row, j + k] - center
            lanes[k] += d * d if term == "square" else td.exp(d) if term == "exp" else d
    s = lanes[0]
    for k in td.unroll(LANES - 1):
        s += lanes[k + 1]
    for j in range(body, n):
        d = Y[row, j] - center
        s += d * d if term == "square" else td.exp(d) if term == "exp" else d
    return s


def statistics_dtype(dtype):
    """The type of a row's statistics (max, sum, mean, ...) and shared partials: f64 for f64 rows, else f32."""
    return f64 if dtype == f64 else f32


def softmax_kernel_for(dtype, log: bool, columns: int, schedule: str | None = None):
    """The softmax (or log-softmax) kernel for rows of `columns` elements of `dtype` on `schedule` (default: the
    target's)."""
    schedule = schedule or schedule_for_target()
    return softmax_kernel(dtype, log, schedule, cached_per_thread(columns, schedule))


@functools.cache
def softmax_kernel(dtype, log: bool, schedule: str, cached: int = 0):
    """The softmax (or log-softmax) kernel over the last axis of an (R, C) array; with `cached` ('block'), rows of
    up to BLOCK * cached elements, kept in registers."""
    acc = statistics_dtype(dtype)
    if schedule == "block" and cached:
        @td.kernel(grid=lambda R: R, block=BLOCK, name=f"{'log_' if log else ''}softmax_block_r{cached}")
        def softmax(X: dtype["R", "C"], Y: dtype["R", "C"]):
            partials = td.shared(acc, (8,))
            values = td.registers(acc, (cached,))
            row = blockIdx.x
            m = -math.inf
            for k in td.unroll(cached):        # every load issued before any is used: one read of the row
                j = threadIdx.x + k * BLOCK
                values[k] = X[row, j] if j < C else -math.inf
                m = td.max(m, values[k])       # (a NaN sticks: the row's result is NaN)
            row_max = block_reduce(m, "max", partials)
            s = 0.0
            for k in td.unroll(cached):        # the -inf padding adds exp(-inf) = 0
                s += td.exp(values[k] - row_max)
            s = block_reduce(s, "sum", partials)
            inv, log_s = 1.0 / s, td.log(s)
            for k in td.unroll(cached):
                j = threadIdx.x + k * BLOCK
                if j < C:
                    Y[row, j] = values[k] - row_max - log_s if log else td.exp(values[k] - row_max) * inv
        return softmax

    if schedule == "block":
        @td.kernel(grid=lambda R: R, block=BLOCK, name=f"{'log_' if log else ''}softmax_block")
        def softmax(X: dtype["R", "C"], Y: dtype["R", "C"]):
            partials = td.shared(acc, (8,))
            row = blockIdx.x
            m = -math.inf       # this thread's running max and its sum of exp(x - m), in one pass
            s = 0.0
            for j in range(threadIdx.x, C, BLOCK):
                x = X[row, j]
                if x > m or x != x:         # a new max (a NaN sticks: the row's result is NaN)
                    s = s * td.exp(m - x) + 1.0
                    m = x
                elif m > -math.inf:         # (-inf elements before any other add nothing)
                    s += td.exp(x - m)
            row_max = block_reduce(m, "max", partials)
            s = block_reduce(s * td.exp(m - row_max) if m > -math.inf else 0.0, "sum", partials)
            inv, log_s = 1.0 / s, td.log(s)
            for j in range(threadIdx.x, C, BLOCK):
                Y[row, j] = X[row, j] - row_max - log_s if log else td.exp(X[row, j] - row_max) * inv
        return softmax

    exact = dtype in (f32, f64)     # Y holds an exp exactly: the exps go there first, then are summed

    @td.kernel(grid=lambda R: R, block=1, name=f"{'log_' if log else ''}softmax_thread")
    def softmax(X: dtype["R", "C"], Y: dtype["R", "C"]):
        sums = td.registers(f64, (LANES,))
        maxes = td.registers(acc, (LANES,))
        row = blockIdx.x
        m = lane_max(X, row, C, maxes)
        s: f64 = 0.0
        if exact:
            for j in range(C):          # no reduction in the loop: it vectorizes, exps included
                Y[row, j] = td.exp(X[row, j] - m)
            s = lane_sum(Y, row, C, 0.0, "plain", sums)
        else:                           # a 16-bit Y would round each exp: they are computed again below
            s = lane_sum(X, row, C, m, "exp", sums)
        inv: acc = 1.0 / s              # scale in f32 for f32: s is f64 only to add up exactly
        log_s: acc = td.log(s)
        for j in range(C):
            if log:
                Y[row, j] = X[row, j] - m - log_s
            elif exact:
                Y[row, j] = Y[row, j] * inv
            else:                       # rounded once, at the store
                Y[row, j] = td.exp(X[row, j] - m) * inv
    return softmax


def layer_norm_kernel_for(dtype, columns: int, schedule: str | None = None, rms: bool = False):
    """The layer norm (or, `rms`, RMS norm) kernel for rows of `columns` elements of `dtype` on `schedule`
    (default: the target's)."""
    schedule = schedule or schedule_for_target()
    return layer_norm_kernel(dtype, schedule, cached_per_thread(columns, schedule), rms)


@functools.cache
def layer_norm_kernel(dtype, schedule: str, cached: int = 0, rms: bool = False):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis of an (R, C) array; `rms`: y = x / sqrt(mean(x^2)
    + eps) * w + b (the mean taken as 0: one pass less). With `cached` ('block'), rows of up to BLOCK * cached
    elements, kept in registers."""
    acc = statistics_dtype(dtype)
    name = "rms_norm" if rms else "layer_norm"
    if schedule == "block" and cached:
        @td.kernel(grid=lambda R: R, block=BLOCK, name=f"{name}_block_r{cached}")
        def layer_norm(X: dtype["R", "C"], W: dtype["C"], B: dtype["C"], Y: dtype["R", "C"], eps: acc):
            partials = td.shared(acc, (8,))
            values = td.registers(acc, (cached,))
            row = blockIdx.x
            s = 0.0
            for k in td.unroll(cached):
                j = threadIdx.x + k * BLOCK
                values[k] = X[row, j] if j < C else 0.0
                s += values[k]
            mean: acc = 0.0
            if not rms:
                mean = block_reduce(s, "sum", partials) / C
            q = 0.0
            for k in td.unroll(cached):        # the variance about the mean, from the registers: no cancellation
                j = threadIdx.x + k * BLOCK
                d = values[k] - mean if j < C else 0.0
                q += d * d
            rstd = td.rsqrt(block_reduce(q, "sum", partials) / C + eps)
            for k in td.unroll(cached):
                j = threadIdx.x + k * BLOCK
                if j < C:
                    Y[row, j] = (values[k] - mean) * rstd * W[j] + B[j]
        return layer_norm

    if schedule == "block":
        @td.kernel(grid=lambda R: R, block=BLOCK, name=f"{name}_block")
        def layer_norm(X: dtype["R", "C"], W: dtype["C"], B: dtype["C"], Y: dtype["R", "C"], eps: acc):
            partials = td.shared(acc, (8,))
            row = blockIdx.x
            mean: acc = 0.0
            if not rms:
                s = 0.0
                for j in range(threadIdx.x, C, BLOCK):
                    s += X[row, j]
                mean = block_reduce(s, "sum", partials) / C
            q = 0.0
            for j in range(threadIdx.x, C, BLOCK):
                d = X[row, j] - mean
                q += d * d
            rstd = td.rsqrt(block_reduce(q, "sum", partials) / C + eps)
            for j in range(threadIdx.x, C, BLOCK):
                Y[row, j] = (X[row, j] - mean) * rstd * W[j] + B[j]
        return layer_norm

    @td.kernel(grid=lambda R: R, block=1, name=f"{name}_thread")
    def layer_norm(X: dtype["R", "C"], W: dtype["C"], B: dtype["C"], Y: dtype["R", "C"], eps: acc):
        sums = td.registers(f64, (LANES,))
        row = blockIdx.x
        mean: acc = 0.0
        if not rms:
            mean = lane_sum(X, row, C, 0.0, "plain", sums) / C
        rstd: acc = td.rsqrt(lane_sum(X, row, C, mean, "square", sums) / C + eps)
        for j in range(C):
            Y[row, j] = (X[row, j] - mean) * rstd * W[j] + B[j]
    return layer_norm


def _rows(x: np.ndarray) -> np.ndarray:
    """`x` as a contiguous (rows, last axis) array; a TypeError for anything but a float array (`ROW_DTYPES`)."""
    x = contiguous(x)
    if x.ndim == 0:
        raise ValueError("row-wise ops need at least one axis")
    if not applies(x.dtype):    # the kernels would compute in the integer type and return integers
        raise TypeError(f"row-wise ops need a float array (float16, bfloat16, float32, float64), got {x.dtype}")
    # the row count explicitly: -1 cannot be inferred beside a last axis of length 0
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def softmax_rows(x: np.ndarray, log: bool = False, schedule: str | None = None) -> np.ndarray:
    """Softmax (or log-softmax) of `x` over its last axis (a float array: `ROW_DTYPES`)."""
    rows = _rows(x)
    out = empty_like_operands(rows.shape, rows.dtype, rows)
    if rows.size:
        softmax_kernel_for(td.ir.types.from_numpy(rows.dtype), log, rows.shape[1], schedule)(rows, out)
    return out.reshape(np.shape(x))


@functools.cache
def _filled(shape: tuple, dtype: np.dtype, value: int, gpu: bool):
    """A read-only array of `shape` holding `value` (an absent weight's ones, an absent bias's zeros), on the GPU if
    `gpu`: made once and kept, so a recorded or captured launch that reads it can be replayed."""
    host = np.full(shape, value, dtype)
    host.flags.writeable = False
    return to_device(host) if gpu else host


def layer_norm_rows(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
                    eps: float = 1e-5, schedule: str | None = None, rms: bool = False) -> np.ndarray:
    """Layer norm (or, `rms`, RMS norm) of `x` over its last axis, scaled by `weight` and shifted by `bias` (each
    optional: ones and zeros, which leave every value as it is)."""
    rows = _rows(x)
    columns = rows.shape[1:]
    gpu = on_device(rows)
    weight = _filled(columns, rows.dtype, 1, gpu) if weight is None else contiguous(weight, rows.dtype)
    bias = _filled(columns, rows.dtype, 0, gpu) if bias is None else contiguous(bias, rows.dtype)
    if not weight.shape == bias.shape == columns:
        raise ValueError(f"{'rms_norm' if rms else 'layer_norm'}: weight and bias must have shape {columns} (the "
                         f"last axis), got {weight.shape} and {bias.shape}")
    out = empty_like_operands(rows.shape, rows.dtype, rows)
    if rows.size:
        kernel = layer_norm_kernel_for(td.ir.types.from_numpy(rows.dtype), rows.shape[1], schedule, rms)
        kernel(rows, weight, bias, out, eps)
    return out.reshape(np.shape(x))
