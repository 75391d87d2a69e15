"""matmul, batch_matmul and linear on the matmul templates, with schedules picked per problem.

A `MatmulPlan` is the scheduled anchor for one problem: the template (on a GPU tensor cores for f16/bf16
and 8-bit types, the SIMT template otherwise; on the cpu the register-tile template), its
kernel at the chosen schedule point (tuned on cuda, the measured default on the cpu unless
tuning is asked for), the 3-D operand shapes it runs on, and split-k when the output has too
few tiles to fill the machine (tuned as such: a point that splits is timed as the split call,
`SplitRun`). Fusion (conv2d's im2col, the graph layer's prologues and
epilogues) goes through `plan.fused`: with split-k the epilogue fuses into the kernel that sums
the partials (`split_sum_kernel`), as no partial is the output yet.

8-bit operands run on the tensor-core template's m16n8k32 kernel on a GPU, which takes B transposed (a call
copies it so); the two operands may differ within a kind. 8-bit floats (E4M3, E5M2) give an f32 product (on the
cpu from their f32 values: the same exact products, summed in f32); 8-bit integers (s8, u8) an exact i32 one. On
the cpu, 8-bit integers run on byte dot products (`matmul_dot4`, x86's vpdpbusd) where the host has them: u8 by
s8 128x768 @ 768x768 in 0.21 ms. On a cpu without them integers run on the register-tile template in f32,
exactly: its k blocks hold at most `exact_k` products, whose f32 sums are integers below 2^24 whatever the order,
and the blocks' sums add in i32 (the small kernel's z-slices are split so, their sums added by
`split_sum_kernel`). A rule-based i32 reduction ran 128x768 @ 768x768 (u8 by s8) in 1.5 ms, the f32 template
0.87 ms.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

import taskdsl as td
from taskdsl.backend.cpu.launch import num_threads
from taskdsl.ir.types import numpy_dtype
from taskdsl.runtime import config
from taskdsl.runtime.config import fast_compile_enabled
from taskdsl.runtime.arrays import as_array, empty_like_operands, note_host_work, zeros_like_operands
from taskdsl.schedule.tuner import tune, tuning_enabled

from . import gemv
from . import matmul_cpu as cpu
from . import matmul_dot4 as dot4
from . import matmul_small as small
from .elementwise import converted, int_tuple
from . import matmul_simt as simt
from . import matmul_tc as tc

# the operand types each op computes in
OPERAND_TYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8")
SUPPORTED = {"matmul": OPERAND_TYPES, "conv2d": OPERAND_TYPES}
MIN_K_TILES_PER_SPLIT = 4
# From this many multiply-adds, a cpu matmul packs B once per call (`pack_b`, numpy) rather than have its row
# blocks each pack the panels they read: 1024^3 11.4 -> 9.4 ms, 2039^3 81 -> 63 ms, 128x768x3072 3.9 -> 3.6
# ms; at 512^3 (2^27) the two were equal, and small products lose the ~20 us of the extra numpy pass
PACK_PER_CALL_MACS = 1 << 28
# From this many multiply-adds, a tensor-core call whose rows are not multiples of 8 elements first copies A and B
# into zero-padded rows (`MatmulPlan.pads`): the element-load kernel ran 2039^3 f16 at 35 TFLOP/s (H200, session
# 26) where the 16-byte-copy kernel ran 4096^3 at 222; the two copies read and write each operand once more
ALIGN = 8
PAD_FROM_MACS = 1 << 27
ALIGN_8_BIT = 16        # 8-bit operands: 16-byte copies need K a multiple of 16 (B is read k-major: N is free)


@functools.lru_cache(maxsize=64)
def tdtype(dtype, op: str = "matmul") -> td.ir.types.DataType:
    """The DSL type of an operand dtype of `op` (its SUPPORTED types; a TypeError naming `op` otherwise)."""
    # big-endian floats (arrays read from files) are their native type: `contiguous` swaps their bytes
    dtype = np.dtype(dtype).newbyteorder("=")
    if dtype.name not in SUPPORTED[op]:
        raise TypeError(f"{op} supports {', '.join(SUPPORTED[op][:-1])} and {SUPPORTED[op][-1]} operands, got "
                        f"{dtype}; convert with np.asarray(x, np.float32), or stdlib_ops.cast(x, np.float32) for a "
                        "td.DeviceArray")
    return td.ir.types.from_numpy(dtype)


# the 8-bit types one tensor-core instruction takes as its two operands, in any pair within a kind
EIGHT_BIT_KINDS = (frozenset({"i8", "u8"}), frozenset({"f8e4m3", "f8e5m2"}))


def operand_types(a_dtype, b_dtype, op: str = "matmul") -> tuple:
    """(A's DSL type, B's, or None where it is A's) that two operands of `op` compute in: 8-bit operands of one kind
    as they are (integers on either target, 8-bit floats on a GPU), other pairs in `operands_tdtype`'s one type."""
    a, b = tdtype(a_dtype, op), tdtype(b_dtype, op)
    if any({a.name, b.name} <= kind for kind in EIGHT_BIT_KINDS) and (not a.is_float or td.get_target() == "cuda"):
        return a, (None if b == a else b)
    return operands_tdtype(a_dtype, b_dtype, op), None


def operands_tdtype(a_dtype, b_dtype, op: str = "matmul") -> td.ir.types.DataType:
    """The DSL type two operands compute in: theirs, or f32 for two types (f16 with f32, bf16 with f16, which
    numpy cannot promote) and for 8-bit floats off a GPU (no tensor cores to take them); a TypeError naming the
    unsupported operand's dtype, not the pair's promotion."""
    a, b = tdtype(a_dtype, op), tdtype(b_dtype, op)
    return a if a == b and (a.bits > 8 or td.get_target() == "cuda") else td.f32


def exact_k(dtype, b_dtype=None) -> int:
    """The most products of 8-bit integers of these types whose f32 sum is exact in any order: 2^24 over the largest
    |a * b| (s8 by s8: 1024, u8 by s8: 514, u8 by u8: 258)."""
    largest = lambda t: 255 if t.kind == "uint" else 128
    return (1 << 24) // (largest(dtype) * largest(b_dtype or dtype))


def product_type(dtype) -> td.ir.types.DataType:
    """The type a product of `dtype` operands comes out in: theirs, or for 8-bit ones the tensor cores'
    accumulators' (f32, or i32 for integers)."""
    if dtype.bits != 8:
        return dtype
    return td.f32 if dtype.is_float else td.i32


@dataclass(frozen=True)
class Template:
    """A matmul template as the planner sees it: its space, default, kernel and tile shape."""

    name: str
    space: object          # (target, itemsize) -> Space
    default: object        # (target, itemsize, M, N) -> Point
    build: object          # (point, dtype, out_dtype, vec, packed_b, transposed_a, M, N) -> Kernel
    tile_shape: object     # point -> (BM, BN, threads)
    pack_b: object = None  # (point, B (batch, K, N)) -> B as the packed_b kernel reads it; None: the template has
                           # no packed_b / transposed_a kernels
    packed_b_shape: object = None   # (point, B's shape) -> the shape pack_b gives
    packed_dtype: object = np.float32    # the element type of pack_b's panels
    packs_large_calls: bool = True      # whether a call from PACK_PER_CALL_MACS packs B first (the dot4 template's
                                        # blocks pack their panels faster than numpy's pass: 1024^3 2.9 ms against 3.9)


SIMT = Template("simt_matmul", simt.space_for, lambda target, itemsize, m, n: simt.default_point(target, itemsize),
                lambda p, dtype, out, vec, *forms: simt.simt_matmul_kernel(p, dtype, out), simt.tile_shape)
CPU_TILE = Template("tile_matmul", lambda target, itemsize: cpu.space(itemsize),
                    lambda target, itemsize, m, n: cpu.default_point(itemsize, m=m, n=n),
                    lambda p, dtype, out, vec, packed_b, transposed_a, m, n, b_dtype=None, k=None, staged_a=False:
                    _cpu_kernel(p, dtype, out, packed_b, transposed_a, m, n, b_dtype, k, staged_a),
                    cpu.tile_shape, cpu.pack_b, cpu.packed_b_shape)
DOT4 = Template("dot4_matmul", lambda target, itemsize: dot4.space(),
                lambda target, itemsize, m, n: dot4.default_point(m, n),
                lambda p, dtype, out, vec, packed_b, transposed_a, m, n, b_dtype=None, columns_outer=False:
                _dot4_kernel(p, out, packed_b, transposed_a, dtype, b_dtype or dtype, columns_outer), dot4.tile_shape,
                dot4.pack_b, dot4.packed_b_shape, np.int8, packs_large_calls=False)
TENSOR_CORE = Template("tc_matmul", lambda target, itemsize: tc.space(_block_shared_limit(target) or tc.MAX_SMEM,
                                                                      8 * itemsize),
                       lambda target, itemsize, m, n: tc.default_point(m, n),
                       lambda p, dtype, out, vec, *forms, b_dtype=None: tc.tc_matmul_kernel(p, dtype, out, vec,
                                                                                            b_dtype=b_dtype),
                       tc.tile_shape)


def _cpu_kernel(p, dtype, out, packed_b: bool, transposed_a: bool, m: int | None, n: int | None,
                b_dtype=None, k: int | None = None, staged_a: bool = False) -> td.Kernel:
    """The cpu template's kernel: for packed B and at most `gemv.MAX_ROWS` rows of A, one streaming B's panels
    (`gemv.packed_rows_kernel`, with `staged_a` the one copying A's rows first: `MatmulPlan.stages_a_rows`); else
    the register-tile kernel (its block order by `matmul_cpu.rows_first`)."""
    if packed_b and not transposed_a and m is not None and 1 <= m <= gemv.MAX_ROWS:
        return gemv.packed_rows_kernel(p, dtype, out, m, staged_a)
    return cpu.tile_matmul_kernel(p, dtype, out, packed_b, transposed_a, cpu.copies_a(transposed_a, m, n),
                                  b_dtype=b_dtype, rows_first=cpu.rows_first(p, m, k, n))


def _dot4_kernel(p, out, packed_b: bool, transposed_a: bool, a_dtype, b_dtype, columns_outer: bool) -> td.Kernel:
    """The dot4 template's kernel (A as it is: a convolution's forms are the register-tile template's)."""
    if transposed_a:
        raise ValueError("the dot4_matmul template reads A as it is, not transposed: plan with dot4_products=False")
    return dot4.dot4_matmul_kernel(p, out, packed_b, a_dtype, b_dtype, columns_outer=columns_outer)


def template_for(dtype, target: str, b_dtype=None, dot4_products: bool = True) -> Template:
    """On a GPU: tensor cores for 16-bit floats and 8-bit types, the SIMT template otherwise. On the cpu: for 8-bit
    integers (B of `b_dtype`, or of `dtype`) with `dot4_products`, byte dot products where the host has them
    (`matmul_dot4`); else the register-tile template (one thread per block; the SIMT template's barriers cost more
    than they save when a block's threads run in turn)."""
    if target != "cuda":
        integers = dtype.bits == 8 and not dtype.is_float
        return DOT4 if integers and dot4_products and dot4.available() else CPU_TILE
    return TENSOR_CORE if dtype.bits == 8 or (dtype.is_float and dtype.bits == 16) else SIMT


def _block_shared_limit(target: str) -> int | None:
    """The shared memory a block of this thread's GPU may have, in bytes; None off a GPU, or where not known."""
    if target != "cuda" or not config.gpu_status()[0]:
        return None
    from taskdsl.backend.cuda.launch import device_state
    return device_state().limits.max_shared


def _workers(target: str) -> int:
    if target == "cuda":
        from taskdsl.backend.cuda.launch import device_state
        return device_state().device.properties.multiprocessor_count
    return num_threads()


def choose_split(p, batch: int, m: int, n: int, k: int, target: str, template: Template = SIMT) -> int:
    """Split-k factor: enough z-slices to give every SM (cpu thread) a block, each >= 4 k tiles."""
    bm, bn, _ = template.tile_shape(p)
    blocks = batch * math.ceil(m / bm) * math.ceil(n / bn)
    workers = _workers(target)
    k_tiles = math.ceil(k / p.bk)
    split = 1
    while blocks * split * 2 <= workers and k_tiles // (split * 2) >= MIN_K_TILES_PER_SPLIT:
        split *= 2
    return split


@dataclass(frozen=True)
class MatmulPlan:
    """One scheduled problem: C (out_batch, M, N) = A (BA, M, K) @ B (BB, K, N)."""

    point: object
    dtype: object
    out_batch: tuple
    a_batch: tuple
    b_batch: tuple
    m: int
    n: int
    k: int
    split: int
    template: Template = SIMT
    small: bool = False     # the cpu runs it on `matmul_small`'s kernel (given B as it is: not packed)
    b_dtype: object = None  # B's type where it is not A's (8-bit operands of one kind)

    @property
    def b_type(self):
        """B's DSL type."""
        return self.b_dtype or self.dtype

    @property
    def out_dtype(self):
        """The type of C (`product_type`)."""
        return product_type(self.dtype)

    @property
    def k_major_b(self) -> bool:
        """Whether the kernel takes B as its transpose (batch, N, K): the 8-bit tensor-core kernel's."""
        return self.dtype.bits == 8 and self.template is TENSOR_CORE

    @property
    def align(self) -> int:
        """The multiple of elements that rows must hold for 16-byte copies."""
        return ALIGN_8_BIT if self.k_major_b else ALIGN

    @property
    def vec(self) -> int:
        """Elements per global->shared copy for the operands as given: 16-byte copies need rows of a multiple of 8
        elements (8-bit operands: K a multiple of 16)."""
        aligned = self.k % self.align == 0 and (self.k_major_b or self.n % self.align == 0)
        return self.align if aligned else 1

    @property
    def pads(self) -> bool:
        """Whether a call first copies A and B into zero-padded rows of a multiple of 8 elements, so the tensor-core
        kernel moves its tiles with 16-byte copies (large products of unaligned sizes)."""
        return self.template is TENSOR_CORE and self.vec == 1 and self.batch * self.m * self.n * self.k >= PAD_FROM_MACS

    @property
    def batch(self) -> int:
        return math.prod(self.out_batch)

    @property
    def operand_reads(self) -> tuple:
        """How many blocks load each element of A and of B: the column blocks (N / BN) for A, the row blocks for
        B (a small product's one block reads each once). What a prologue fused into an operand's loads costs."""
        if self.small:
            return 1, 1
        bm, bn, _ = self.template.tile_shape(self.point)
        return -(-self.n // bn), -(-self.m // bm)

    @property
    def stages_a_rows(self) -> bool:
        """Whether its fused kernel for packed B copies A's rows to f32 a k block at a time before the multiply-adds
        read them, where a prologue is fused into A (`gemv.packed_rows_kernel`: the cpu's, A of at most
        gemv.MAX_ROWS rows): the prologue is computed there once a block, in a loop that vectorizes."""
        return self.template is CPU_TILE and not self.small and 1 <= self.m <= gemv.MAX_ROWS and self.dtype.is_float

    def kernel(self, out_dtype=None, packed_b: bool = False, transposed_a: bool = False,
               padded: bool = False, columns_outer: bool = False, staged_a: bool = False) -> td.Kernel:
        """The template kernel of this plan (output type: the operands', or f32 for split-k partials); with
        `packed_b`, the kernel that takes B as `pack_b` gives it; with `transposed_a`, the one that takes A
        as (batch, K, M) (the cpu template's forms, `matmul_cpu.tile_matmul_kernel`); with `padded`, the one
        for operands copied into rows of a multiple of 8 elements (`pads`); with `columns_outer`, the dot4
        template's that stores its blocks a column at a time, and with `staged_a` the cpu's that copies A's rows
        first (`stages_a_rows`; other templates ignore both)."""
        if (packed_b or transposed_a) and not self.packs_b:
            raise ValueError(f"the {self.template.name} template has no kernel for packed B or transposed A operands")
        out = out_dtype or (td.f32 if self.split > 1 else self.out_dtype)
        if self.small and not (packed_b or transposed_a or padded):
            return small.small_matmul_kernel(self.dtype, out, self.m, self.n, self.b_dtype)
        vec = self.align if padded else self.vec
        mixed = {"b_dtype": self.b_dtype} if self.b_dtype else {}
        if columns_outer and self.template is DOT4:
            mixed["columns_outer"] = True
        if self.template is CPU_TILE:
            mixed.update(k=self.k, staged_a=staged_a)
        return self.template.build(self.point, self.dtype, out, vec, packed_b, transposed_a, self.m, self.n, **mixed)

    @property
    def packs_b(self) -> bool:
        """Whether the template can take B packed once (`pack_b`), as is worth it for constant weights: the
        cpu's, whose blocks otherwise pack their panels of B on every call."""
        return self.template.pack_b is not None

    @property
    def packs_per_call(self) -> bool:
        """Whether a call given B as a numpy array packs it first: products of PACK_PER_CALL_MACS or more, where
        the template can and gains by it (`Template.packs_large_calls`; its blocks otherwise pack their panels of B
        on every call)."""
        return (self.packs_b and self.template.packs_large_calls and not self.small
                and self.batch * self.m * self.n * self.k >= PACK_PER_CALL_MACS)

    def pack_b(self, b) -> np.ndarray:
        """B (any shape with the elements of the 3-D operand) as the `packed_b` kernel reads it."""
        note_host_work("a matmul's B operand was packed on the host")
        return self.template.pack_b(self.point, np.asarray(b).reshape(self.operand_shapes()[1]))

    def check_packed(self, panels) -> None:
        """A ValueError unless `panels` is a float32 numpy array of the shape this plan's `pack_b` gives (the kernel
        trusts its rows)."""
        if not self.packs_b:
            raise ValueError(f"the {self.template.name} template takes no packed B: call matmul without packed=")
        want = self.template.packed_b_shape(self.point, self.operand_shapes()[1])
        how = ("pack it with gemm.plan(a.shape, b.shape, ...).pack_b(b) for the b it multiplies (a plan tuned as this "
               "call is: a tuned plan's panels need tune=True)")
        if tuple(np.shape(panels)) != want:
            raise ValueError(f"matmul: packed B must have shape {want} for these operands, got {np.shape(panels)}; "
                             + how)
        # pack_b's panels are numpy arrays of the template's type whatever the operands' (f32 but for dot4's);
        # anything else was not made by it
        want_dtype = np.dtype(self.template.packed_dtype)
        if not isinstance(panels, np.ndarray) or panels.dtype != want_dtype:
            got = panels.dtype if isinstance(panels, np.ndarray) else type(panels).__name__
            raise ValueError(f"matmul: packed B must be a numpy array of {want_dtype}, got {got}; " + how)

    def batch_index(self, split: int | None = None) -> np.ndarray:
        """The kernel's (z-slice -> A, B matrix) table."""
        return simt.batch_index(self.out_batch, self.a_batch, self.b_batch, self.split if split is None else split)

    @property
    def anchor(self) -> td.Kernel:
        """The kernel for fusion: called with split 1, it stores each output element once, in the operands' type."""
        return self.kernel(self.out_dtype)

    def operand_shapes(self, transposed_a: bool = False, padded: bool = False) -> tuple:
        """The 3-D shapes of A (or, `transposed_a`, of A's transpose), B (k-major: B's transpose) and C the kernels
        take (C without split-k); `padded`: of A and B copied into rows of a multiple of `align` elements
        (`pads`)."""
        k, n = self.k, self.n
        if padded:
            k, n = _aligned(k, self.align), (n if self.k_major_b else _aligned(n, self.align))
        a_shape = (k, self.m) if transposed_a else (self.m, k)
        b_shape = (n, k) if self.k_major_b else (k, n)
        c_shape = (self.batch, self.m, self.n)
        return (math.prod(self.a_batch),) + a_shape, (math.prod(self.b_batch),) + b_shape, c_shape

    def kernel_b(self, b3):
        """B (batch, K, N) as the kernel takes it: B itself, or its transpose copied (k-major: `k_major_b`)."""
        if not self.k_major_b:
            return b3
        if isinstance(b3, np.ndarray):
            note_host_work("an 8-bit matmul's B operand was transposed on the host")
            return np.ascontiguousarray(b3.transpose(0, 2, 1))
        from .transform import transpose
        return transpose(b3, (0, 2, 1))

    def padded_operands(self, a3, b3) -> tuple:
        """A and B copied on the target into zero-padded rows of a multiple of `align` elements (`pads`)."""
        padded = []
        for x, shape, dtype in zip((a3, b3), self.operand_shapes(padded=True), (self.dtype, self.b_type)):
            y = empty_like_operands(shape, numpy_dtype(dtype), a3, b3)
            tc.padded_copy_kernel(dtype)(x, y)
            padded.append(y)
        return tuple(padded)

    def __call__(self, a3, b3, packed_b: bool = False, b_k_major: bool = False):
        """C (batch, M, N) for 3-D operands (`b3`: B (batch, K, N), or B's `pack_b` panels with `packed_b`, or
        with `b_k_major` B's transpose (batch, N, K), as a `k_major_b` plan's kernel takes it), allocated where
        the operands are (numpy arrays or td.DeviceArrays)."""
        if b_k_major and not self.k_major_b:
            raise ValueError("b_k_major: this plan's kernel takes B (batch, K, N), not its transpose")
        b3 = b3 if packed_b or b_k_major else self.kernel_b(b3)
        if self.pads:
            a3, b3 = self.padded_operands(a3, b3)
        kernel = self.kernel(packed_b=packed_b, padded=self.pads)
        c = empty_like_operands((self.batch, self.m, self.n), numpy_dtype(self.out_dtype), a3, b3)
        if self.split == 1:
            kernel(a3, b3, c, self.batch_index(), 1)
        else:
            SplitRun(self, kernel)(a3, b3, c)
        return c

    @property
    def partials_shape(self) -> tuple:
        """The f32 partial outputs of split-k: (batch * split, M, N), z-slice b * split + s for chunk s."""
        return (self.batch * self.split, self.m, self.n)

    def examples(self, packed_b: bool = False, transposed_a: bool = False) -> tuple:
        """Example arguments (A, B, C, batch index, split 1) that specialize this plan's anchor for fusion (or its
        kernel for packed B panels, for a transposed A: `kernel`)."""
        a, b, c = (np.empty(s, numpy_dtype(t)) for s, t in zip(self.operand_shapes(transposed_a),
                                                                 (self.dtype, self.b_type, self.out_dtype)))
        return (a, self.pack_b(b) if packed_b else b, c, self.batch_index(1), 1)

    @property
    def fusion_split(self) -> int:
        """The split-k of this plan's fused kernels (`fused`): the plan's on the GPU templates and for integers (the
        small kernel's exact z-slices); 1 for floats on the cpu's register-tile template, whose fused kernels are
        measured unsplit."""
        return 1 if self.template is CPU_TILE and self.dtype.is_float else self.split

    def fused(self, prologues: dict, out: td.Tensor, packed_b: bool = False, columns_outer: bool = False,
              staged_a: bool = False) -> tuple:
        """(kernel, finish) with `prologues` ({"A" or "B": a compute defining it}) fused into the kernel's loads and
        `out` (a compute over a placeholder "C" of the output): without split-k (`fusion_split`) into its stores,
        and finish is None; with split-k the kernel writes f32 partials instead (its "C") and finish,
        `split_sum_kernel` with `out` fused in, adds them (parameters: P, split, out's other inputs, out).
        `columns_outer`: `out` lays C's rows together and its columns apart (`kernel`); `staged_a`: the kernel that
        copies A's rows first, where the cpu's has one (`stages_a_rows`: for a costly prologue of A)."""
        a, b, c, _, _ = self.examples(packed_b)
        split = self.fusion_split
        if split == 1:
            kernel = self.kernel(self.out_dtype, packed_b=packed_b, columns_outer=columns_outer,
                                 staged_a=staged_a)
            return td.fuse(kernel, a, b, c, self.batch_index(1), 1, prologues=prologues, epilogues={"C": out}), None
        partials = np.empty(self.partials_shape, np.float32)
        kernel = td.fuse(self.kernel(td.f32, packed_b=packed_b), a, b, partials, self.batch_index(), split,
                         prologues=prologues)
        return kernel, td.fuse(split_sum_kernel(self.out_dtype), partials, c, split, epilogues={"C": out})


SUM_BLOCK = 256


@functools.cache
def split_sum_kernel(out_dtype) -> td.Kernel:
    """C (batch, M, N) = the sum over s of split-k partials P[b * split + s] (f32), in C's type: the kernel that
    finishes a split-k product, and the anchor a split-k convolution's epilogue fuses into. Integer partials (the
    cpu's exact f32 sums of 8-bit products) add in i32: f32 would round past 2^24."""
    acc = td.f32 if out_dtype.is_float else out_dtype
    @td.kernel(grid=lambda M, N, BZ: simt.batch_grid(td.cdiv(M * N, SUM_BLOCK), BZ), block=SUM_BLOCK,
               name=f"split_k_sum_{out_dtype.name}")
    def split_k_sum(P: td.f32["BP", "M", "N"], C: out_dtype["BZ", "M", "N"], split: td.i32):
        zs, block = simt.batch_block(td.blockIdx.x, td.cdiv(M * N, SUM_BLOCK))
        i = block * SUM_BLOCK + td.threadIdx.x
        if i < M * N:
            row, col = i // N, i % N
            total = td.cast(P[zs * split, row, col], acc)
            for s in range(1, split):
                total += td.cast(P[zs * split + s, row, col], acc)
            C[zs, row, col] = td.cast(total, out_dtype)

    return split_k_sum


def _aligned(size: int, align: int = ALIGN) -> int:
    return -(-size // align) * align


def random_operand(shape: tuple, dtype) -> np.ndarray:
    """Seeded normal values of DSL type `dtype` (bf16 as its bits): the operands candidates are timed on."""
    return np.random.default_rng(0).standard_normal(shape).astype(numpy_dtype(dtype)).view(dtype.numpy)


def plan(a_shape: tuple, b_shape: tuple, dtype, target: str, do_tune: bool | None = None,
         point=None, b_dtype=None, dot4_products: bool = True) -> MatmulPlan:
    """The plan for (..., M, K) @ (..., K, N) operands of DSL type `dtype` (B of `b_dtype`, where it differs:
    8-bit operands of one kind) on `target`; `dot4_products=False` keeps 8-bit integers on the cpu's register-tile
    template (`template_for`), whose kernels also read a convolution's forms of A.

    The schedule: `point` if given; else tuned (cuda, or `do_tune=True`) with the winner
    cached on disk; else the target's default (on the cpu, for small matrices, `matmul_small`'s kernel). Batch
    dims broadcast as in numpy.
    """
    _check_tune(do_tune)
    # Python ints: numpy ones would key their tuning records apart (`repr`) and tune the same product again
    return _plan(int_tuple(a_shape, "matmul: shapes"), int_tuple(b_shape, "matmul: shapes"), dtype, target, do_tune,
                 point, fast_compile_enabled(), tuning_enabled(), None if b_dtype == dtype else b_dtype, dot4_products)


def _check_tune(do_tune) -> None:
    """A TypeError unless `do_tune` is True, False or None ("no" would tune the whole space)."""
    if do_tune is not None and not isinstance(do_tune, (bool, np.bool_)):
        raise TypeError(f"matmul: tune takes True, False or None (the target's default), got {do_tune!r}")


@functools.lru_cache(maxsize=256)
def _plan(a_shape: tuple, b_shape: tuple, dtype, target: str, do_tune, point, fast: bool, tuning: bool,
          b_dtype, dot4_products: bool) -> MatmulPlan:
    """`plan`, cached per fast-compile mode (the cpu default point depends on it) and TASKDSL_TUNE (read at each
    call: a plan made with tuning off is not kept once it is on) too."""
    *a_batch, m, k = a_shape
    *b_batch, k2, n = b_shape
    if k != k2:
        raise ValueError(f"matmul: inner dimensions differ, (..., {m}, {k}) @ (..., {k2}, {n})")
    try:
        out_batch = tuple(np.broadcast_shapes(tuple(a_batch), tuple(b_batch)))
    except ValueError:
        raise ValueError(f"matmul: batch dimensions {tuple(a_batch)} and {tuple(b_batch)} do not broadcast") from None
    if dtype.bits == 8 and dtype.is_float and target != "cuda":
        raise ValueError(f"matmul: {dtype.name} operands run on tensor cores (the cuda target); on the {target}, "
                         "stdlib_ops.matmul multiplies them as their f32 values")
    if b_dtype is not None and not any({dtype.name, b_dtype.name} <= kind for kind in EIGHT_BIT_KINDS):
        raise TypeError(f"matmul: operands of two types plan in one ({dtype.name} and {b_dtype.name}: convert one); "
                        "only 8-bit operands of one kind (s8 / u8, E4M3 / E5M2) mix")
    itemsize = dtype.bits // 8
    template = template_for(dtype, target, b_dtype, dot4_products)
    # integers on the cpu: k blocks of at most `exact_k` products, each summed in f32 exactly
    exact = exact_k(dtype, b_dtype) if template is CPU_TILE and not dtype.is_float else None
    space = cpu.space(itemsize, k_block_at_most=exact) if exact else template.space(target, itemsize)

    def at(p, split: int = 1, on_small: bool = False) -> MatmulPlan:
        if exact and on_small:      # the small kernel sums its k in f32: z-slices of at most `exact` products
            split = max(1, -(-k // exact))
        return MatmulPlan(p, dtype, out_batch, tuple(a_batch), tuple(b_batch), m, n, k, split, template, on_small,
                          b_dtype)

    def split_for(p) -> int:     # integer partials would need a sum kernel of their own (in i32): not split
        return choose_split(p, math.prod(out_batch), m, n, k, target, template) if dtype.is_float else 1

    if point is not None and {name for name, _ in point.values} != set(space.axes):
        raise ValueError(f"matmul: the point {point} is not of the {template.name} template's space, which "
                         f"this {dtype.name} matmul on {target} uses: take one from its space() or default()")
    # every template's points (a float point that failed its space's check ran, and crashed the process)
    if point is not None and space.check and (reason := space.check(point)):
        raise ValueError(f"matmul: the point {point} cannot run this {dtype.name} matmul: {reason}")
    if point is None:
        point = template.default(target, itemsize, m, n)
        if template is CPU_TILE and not do_tune and small.applies(math.prod(out_batch), m, n, k):
            return at(point, on_small=True)
        if do_tune or (do_tune is None and target == "cuda"):
            proto = at(point)
            pads = proto.pads           # tuned as called: on padded operands where a call pads them
            operands = tuple(random_operand(s, t) for s, t in zip(proto.operand_shapes(padded=pads),
                                                                  (dtype, proto.b_type, proto.out_dtype)))
            args = operands + (proto.batch_index(1), 1)
            packs = proto.packs_per_call        # ...and on B's panels where a call packs them
            candidate = lambda p: _candidate(at(p, split_for(p)), pads, packs)
            point = tune(space, candidate, args,
                         op=template.name, shapes=(tuple(a_shape), tuple(b_shape)),
                         dtypes=(dtype.name,) + ((b_dtype.name,) if b_dtype else ()),
                         default=point, target=target, outputs={2: proto.out_dtype})
    return at(point, split_for(point))


def _candidate(plan: MatmulPlan, padded: bool, packed_b: bool):
    """What the tuner times for a point: its kernel, or with split-k the pair of kernels a call runs; with
    `packed_b`, those taking B's panels for the point (`PackedB`)."""
    kernel = plan.kernel(packed_b=packed_b, padded=padded)  # in the operands' type, or f32 partials with split-k
    run = kernel if plan.split == 1 else SplitRun(plan, kernel)
    return PackedB(plan, run) if packed_b else run


class PackedB:
    """A candidate for products whose calls pack B (`packs_per_call`): `run` (a point's kernel or split call,
    for packed B) on B's panels for that point, packed at the first call. The tuner timed the kernel for B as
    given, which such calls never run: a winner for other code."""

    def __init__(self, plan: MatmulPlan, run):
        self.plan, self.run, self.panels = plan, run, None

    def _packed(self, b) -> np.ndarray:
        if self.panels is None:
            self.panels = self.plan.pack_b(b)
        return self.panels

    def compile(self, a, b, c, *rest, target: str | None = None) -> None:
        """Compile the kernels for B's panels (no launch)."""
        self.run.compile(a, self._packed(b), c, *rest, target=target)

    def __call__(self, a, b, c, *rest) -> None:
        """C = A @ B, from B's panels (the B of the first call: the tuner's operands do not change)."""
        self.run(a, self._packed(b), c, *rest)


class SplitRun:
    """A split-k call: `kernel` (one of the plan's) writing f32 partials, and the kernel summing them. Called like
    the unsplit kernel (A, B, C, and a batch index and split it ignores for the plan's own), so the tuner times
    a split point as calls run it: timed unsplit, a point would be ranked by a launch no call makes, without
    the sum."""

    def __init__(self, plan: MatmulPlan, kernel: td.Kernel):
        self.plan, self.kernel = plan, kernel
        self.sum = split_sum_kernel(plan.out_dtype)
        self.partials = None    # where the operands are, made at the first call

    def compile(self, a, b, c, *_, target: str | None = None) -> None:
        """Compile both kernels for these operands (no launch)."""
        partials = np.empty(self.plan.partials_shape, np.float32)
        self.kernel.compile(a, b, partials, self.plan.batch_index(), self.plan.split, target=target)
        self.sum.compile(partials, c, self.plan.split, target=target)

    def __call__(self, a, b, c, *_) -> None:
        """C = A @ B as a call with this plan's split runs it."""
        if self.partials is None:
            self.partials = empty_like_operands(self.plan.partials_shape, np.float32, a, b)
        # the batch index as a host array, as the unsplit call passes it: the launch takes it with the arguments,
        # where a copy to the GPU of its own was a memory operation a CUDA-graph replay would not redo
        self.kernel(a, b, self.partials, self.plan.batch_index(), self.plan.split)
        self.sum(self.partials, c, self.plan.split)


def _operands(a, b) -> tuple:
    """(a, b, A's DSL type, B's or None where it is A's): contiguous arrays of the types they compute in
    (`operand_types`)."""
    a, b = as_array(a), as_array(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul needs operands with at least one dimension (use mul for scalars)")
    _check_inner(a.shape, b.shape)
    dtype, b_dtype = operand_types(a.dtype, b.dtype)
    return converted(a, numpy_dtype(dtype)), converted(b, numpy_dtype(b_dtype or dtype)), dtype, b_dtype


def _check_inner(a_shape: tuple, b_shape: tuple) -> None:
    """A ValueError naming the shapes as given (not as 1-D operands are promoted) when a's K is not b's."""
    k, k2 = a_shape[-1], b_shape[0 if len(b_shape) == 1 else -2]
    if k != k2:
        which = "length" if len(b_shape) == 1 else "second-to-last dimension"
        raise ValueError(f"matmul: inner dimensions differ: {tuple(a_shape)} @ {tuple(b_shape)}; a's last dimension "
                         f"({k}) must equal b's {which} ({k2})")


def matmul(a, b, *, tune: bool | None = None, packed: np.ndarray | None = None):
    """`a @ b` with numpy's rules (1-D operands promoted, batch dims broadcast); f32, f16, bf16, E4M3 / E5M2 into
    an f32 result, or s8 / u8 into an exact i32 one (8-bit operands may differ within their kind; other operands
    of two types compute in f32); numpy arrays or td.DeviceArrays (the result is where the operands are).
    `packed`: b's panels from the plan's `pack_b`, made once by a caller that multiplies by the same b again (the
    cpu's products; large ones pack b per call)."""
    _check_tune(tune)
    a, b, dtype, b_dtype = _operands(a, b)
    a2 = a.reshape((1,) + a.shape) if a.ndim == 1 else a
    b2 = b.reshape(b.shape + (1,)) if b.ndim == 1 else b
    empty = 0 in a2.shape or 0 in b2.shape       # nothing to multiply: no schedule to tune
    batched = max(a2.ndim, b2.ndim) > 2
    # (gemv's reductions sum all of k in f32: not for integers)
    if dtype.is_float and not (empty or tune or packed is not None) and gemv.applies(a2.shape[-2], b2.shape[-1],
                                                                                    batched):
        out = gemv.product(a2, b2, dtype)
    else:
        out = _on_template(a2, b2, dtype, False if empty else tune, packed, b_dtype)
    shape = out.shape
    if a.ndim == 1:      # drop the promoted axes again
        shape = shape[:-2] + shape[-1:]
    if b.ndim == 1:
        shape = shape[:-1]
    return out.reshape(shape)


def _on_template(a2, b2, dtype, tune: bool | None, packed: np.ndarray | None, b_dtype=None):
    """a2 (..., M, K) @ b2 (..., K, N) on the matmul template (b2's panels `packed`, or packed here where large)."""
    p = plan(a2.shape, b2.shape, dtype, td.get_target(), tune, b_dtype=b_dtype)
    shape_a = p.operand_shapes()[0]
    shape = p.out_batch + (p.m, p.n)
    if math.prod(shape) == 0 or p.k == 0:
        return zeros_like_operands(shape, numpy_dtype(p.out_dtype), a2, b2)
    if packed is None and p.packs_per_call and isinstance(b2, np.ndarray):
        packed = p.pack_b(b2)
    elif packed is not None:
        p.check_packed(packed)
    operand = b2.reshape(math.prod(p.b_batch), p.k, p.n) if packed is None else packed
    return p(a2.reshape(shape_a), operand, packed is not None).reshape(shape)


def batch_matmul(a, b, *, tune: bool | None = None):
    """Batched `a @ b` for (B..., M, K) and (B..., K, N) operands (batch dims broadcast)."""
    a, b = as_array(a), as_array(b)
    if a.ndim < 3 and b.ndim < 3:
        raise ValueError(f"batch_matmul needs a batch dimension, got shapes {a.shape} and {b.shape}; use matmul")
    return matmul(a, b, tune=tune)


def linear(x, weight, bias=None, *, tune: bool | None = None):
    """`x @ weight.T + bias` with PyTorch's layout: x (..., K), weight (N, K), bias (N,), converted to the type of
    x @ weight.T (matmul's)."""
    from .elementwise import add
    x, weight = as_array(x), as_array(weight)
    if weight.ndim != 2 or x.shape[-1:] != weight.shape[1:]:
        hint = ""
        if weight.ndim == 2 and x.shape[-1:] == weight.shape[:1]:
            hint = " (weight is (out_features, in_features) as in PyTorch: for a (K, N) weight, use matmul(x, weight))"
        raise ValueError(f"linear needs x (..., K) and weight (N, K), got {x.shape} and {weight.shape}" + hint)
    if bias is not None and np.shape(bias) != weight.shape[:1]:
        raise ValueError(f"linear: bias must have shape ({weight.shape[0]},) (one per output feature), got "
                         f"{np.shape(bias)}")
    y = _times_transposed(x, weight, tune)
    return y if bias is None else add(y, bias_operand(bias, y.dtype, "linear"))


def bias_operand(bias, dtype, op: str):
    """`bias` as a contiguous array of the result's numpy `dtype`; a TypeError for a float bias of an integer
    result, which converting would truncate."""
    bias = as_array(bias)
    if np.dtype(dtype).kind in "iu" and bias.dtype.kind not in "iub":
        raise TypeError(f"{op}: the bias of an integer result must be integers (it adds to the exact int32 sums), "
                        f"got {bias.dtype}; round it to integers first, or convert the result to floats")
    if np.dtype(dtype).kind in "iu" and isinstance(bias, np.ndarray) and bias.size and bias.dtype.kind in "iu":
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
        if int(bias.min()) < low or int(bias.max()) > high:     # (converting would wrap it: 2**40 added 0)
            raise ValueError(f"{op}: the bias holds values outside the result's type {np.dtype(dtype)} "
                             f"({low}..{high}); convert the operands to floats for such a bias")
    return converted(bias, dtype)


def _times_transposed(x, weight, tune: bool | None):
    """x @ weight.T; on the cpu without a transposed copy of the weight: a product of few rows reads its rows
    (`gemv`), the template packs its panels from them (a transpose of a (3072, 768) weight took 6-14 ms, the
    panels from the rows 2.7 ms; x (1, 768) took 8-16 ms in all, 59-135x numpy's time); but a small product
    (`MatmulPlan.small`) copies its few columns transposed for the small kernel (a (16, 16) one: 60 -> 30 us).
    On a GPU 8-bit operands go as they are: the weight is the B operand the 8-bit kernel takes (k-major)."""
    from .transform import transpose
    _check_tune(tune)
    (n, k), m = weight.shape, math.prod(x.shape[:-1])
    dtype, b_dtype = operand_types(x.dtype, weight.dtype)
    if td.get_target() != "cpu" and dtype.bits == 8 and m * n * k:
        p = plan((m, k), (k, n), dtype, "cuda", tune, b_dtype=b_dtype)
        return p(x.reshape(p.operand_shapes()[0]), weight.reshape(p.operand_shapes()[1]), b_k_major=True).reshape(
            x.shape[:-1] + (n,))
    if td.get_target() != "cpu" or m * n * k == 0:
        return matmul(x, transpose(weight), tune=tune)
    x2, w = converted(x, numpy_dtype(dtype)).reshape(m, k), converted(weight, numpy_dtype(b_dtype or dtype))
    if not tune and dtype.is_float and gemv.applies(m, n, False):
        y = gemv.product(x2, w, dtype, rows_b=True)
    else:
        p = plan((m, k), (k, n), dtype, "cpu", tune, b_dtype=b_dtype)
        a_shape, b_shape, _ = p.operand_shapes()
        if p.small:     # a few columns: their transposed copy is cheap, and the small kernel reads it as it is
            y = p(x2.reshape(a_shape), np.ascontiguousarray(w.T).reshape(b_shape))
        else:
            y = p(x2.reshape(a_shape), p.pack_b(w.T), packed_b=True)
    return y.reshape(x.shape[:-1] + (n,))
