"""conv2d as a matmul with an implicit im2col prologue (Hidet's post-scheduling fusion).

The matmul template is scheduled for the GEMM view of the convolution,

    C[g, m, o] = sum_kk A[g, m, kk] * B[g, kk, o]      m = (n, oh, ow), kk = (c, kh, kw), o = out channel

and then `td.fuse` replaces its loads of A by the im2col definition (a read of the input
with padding, stride and dilation folded into the index: nothing is materialized) and its
stores of C by the output layout (NCHW or NHWC), plus any epilogue (bias, batch norm,
activation) on top. Weights come in PyTorch/ONNX OIHW and are packed once into B.
On the cpu, convolutions of one group take another route (`on_columns`): explicit im2col
columns, then a plain GEMM (columns^T @ weights for NCHW, columns @ weights for NHWC; a pointwise NCHW one, or
one of 64 to 96 output channels, is weights @ input or its im2col, `_lower_weights_first`).
Grouped convolutions with tiny per-group reductions (depthwise; `uses_direct`) are no GEMM
(K = 9 per group has nothing to tile): on the cpu they run `conv_direct`'s kernels (outputs
accumulated in registers, epilogue fused into their stores); elsewhere a `td.reduce`
definition scheduled by the rules.
8-bit operands (E4M3 / E5M2 into f32, s8 / u8 into exact i32) take the 8-bit tensor-core
template on a GPU, its B the weights k-major; on the cpu integers take the float convolutions' GEMMs, whose
register-tile kernel sums 8-bit integers exactly (`gemm.exact_k`).
"""
import functools
import math
from dataclasses import dataclass

import numpy as np

import taskdsl as td
from taskdsl import blockIdx, ir
from taskdsl.ir.types import numpy_dtype
from taskdsl.runtime.arrays import as_array, empty_like_operands, note_host_work, on_host, placed_like
from taskdsl.runtime.config import fast_compile_enabled
from taskdsl.schedule.tuner import report, tune, tuning_enabled

from . import gemm as mm
from .conv_direct import DirectRows, lower_rows, rows_sum_exactly
from .conv_geometry import ConvGeometry, end_inside, first_inside, geometry, input_shape, uses_direct, window_scalars
from .elementwise import converted

ACTIVATIONS = {       # integer constants: an integer convolution's clamps stay exact in i32 (a float one promotes)
    None: lambda v: v,
    "relu": lambda v: td.max(v, 0),
    "relu6": lambda v: td.min(td.max(v, 0), 6),
    "sigmoid": lambda v: td.sigmoid(v),
}


def _input_at(g: ConvGeometry, x: td.Tensor, n, ci, oh, ow, kh, kw) -> ir.Expr:
    """X at the input pixel output (oh, ow) reads through kernel tap (kh, kw): zero in the padding.

    The read is at the pixel clamped into the image, so it is safe to make whatever the tap: an eager select,
    which on a GPU loads with no branch (a template's element loads of A then overlap their latencies: the
    7x7 stem's k loop had each of its 48 loads a tile wait behind a branch for the one before). An image with no
    pixels has none to clamp to: every tap is padding, and X is not read."""
    if g.h == 0 or g.w == 0:
        return ir.const(0.0, x.dtype)
    ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0]
    iw = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1]
    inside = ir.binary("and", ir.binary("and", ih >= 0, ih < g.h), ir.binary("and", iw >= 0, iw < g.w))
    ih, iw = td.max(td.min(ih, g.h - 1), 0), td.max(td.min(iw, g.w - 1), 0)
    value = x[n, ci, ih, iw] if g.layout == "NCHW" else x[n, ih, iw, ci]
    return ir.Select(inside, value, ir.const(0.0, x.dtype), x.dtype, eager=True)


def _x_placeholder(g: ConvGeometry, dtype) -> td.Tensor:
    return td.placeholder("X", dtype, (g.n, g.c, g.h, g.w) if g.layout == "NCHW" else (g.n, g.h, g.w, g.c))


def im2col(g: ConvGeometry, x: td.Tensor) -> td.Tensor:
    """The GEMM's A (G, M, K) as a compute over the input: im2col, never materialized when fused."""
    groups, m, k, _ = g.gemm
    cg = g.c // g.groups

    def fcompute(gi, mi, ki):
        n, rest = mi // (g.oh * g.ow), mi % (g.oh * g.ow)
        oh, ow = rest // g.ow, rest % g.ow
        if g.layout == "NCHW":     # kk = (c, kh, kw): matches OIHW weights
            c, kh, kw = ki // (g.kh * g.kw), ki // g.kw % g.kh, ki % g.kw
        else:                      # kk = (kh, kw, c): consecutive kk read consecutive channels
            kh, kw, c = ki // (g.kw * cg), ki // cg % g.kw, ki % cg
        return _input_at(g, x, n, gi * cg + c, oh, ow, kh, kw)

    # NHWC reading the input itself: runs of channels of one tap are runs of the input's last axis, so a
    # tensor-core GEMM's 16-byte copies of A stay copies (from X) when fused (`td.compute`'s gather_runs)
    runs = math.gcd(cg, 8) if g.layout == "NHWC" and x.kind == "placeholder" else 1
    return td.compute("A", (groups, m, k), fcompute, gather_runs=runs)


def pack_weight(g: ConvGeometry, weight: np.ndarray, k_major: bool = False) -> np.ndarray:
    """OIHW weights as the GEMM's B (G, K, N), in the K order of `im2col`; `k_major`: as B's transpose (G, N, K),
    the 8-bit tensor-core kernel's (for NCHW, the weights as they are)."""
    b = _weight_as_b(g, weight)
    return np.ascontiguousarray(b.transpose(0, 2, 1) if k_major else b)


def _weight_as_b(g: ConvGeometry, weight: np.ndarray) -> np.ndarray:
    """`pack_weight`'s B, a view of `weight` where it can be (NCHW: a transpose of it)."""
    groups, _, k, n = g.gemm
    w = weight.reshape(groups, n, g.c // groups, g.kh, g.kw)
    if g.layout == "NHWC":
        w = w.transpose(0, 1, 3, 4, 2)
    return w.reshape(groups, n, k).transpose(0, 2, 1)


def output_view(g: ConvGeometry, c: td.Tensor) -> td.Tensor:
    """The convolution output as a compute over the GEMM's C (G, M, N): a reshape/transpose of it.

    With one group it has the output's own shape; with more it has the group axis split out,
    (N, G, OCg, OH, OW) or (N, OH, OW, G, OCg), which is the same memory.
    """
    groups, _, _, ocg = g.gemm

    def m_of(n, oh, ow):
        return (n * g.oh + oh) * g.ow + ow

    if g.layout == "NCHW":
        if groups == 1:
            return td.compute("Y", g.out_shape, lambda n, o, oh, ow: c[0, m_of(n, oh, ow), o])
        return td.compute("Y", (g.n, groups, ocg, g.oh, g.ow), lambda n, gi, o, oh, ow: c[gi, m_of(n, oh, ow), o])
    if groups == 1:
        return td.compute("Y", g.out_shape, lambda n, oh, ow, o: c[0, m_of(n, oh, ow), o])
    return td.compute("Y", (g.n, g.oh, g.ow, groups, ocg), lambda n, oh, ow, gi, o: c[gi, m_of(n, oh, ow), o])


def channel_axis(g: ConvGeometry, ndim: int):
    """A function of an output_view index tuple giving the output channel (for per-channel epilogues)."""
    ocg = g.gemm[3]
    if ndim == 4:
        return (lambda idx: idx[1]) if g.layout == "NCHW" else (lambda idx: idx[3])
    return (lambda idx: idx[1] * ocg + idx[2]) if g.layout == "NCHW" else (lambda idx: idx[3] * ocg + idx[4])


def bias_activation(g: ConvGeometry, y: td.Tensor, bias: td.Tensor | None, activation) -> td.Tensor:
    """y + bias[channel], then the activation, as a compute over y (in y's dtype)."""
    act = ACTIVATIONS[activation]
    channel = channel_axis(g, len(y.shape))
    shape = tuple(int(d.value) for d in y.shape)
    if bias is None and activation is None:
        return y

    def fcompute(*idx):
        value = act(y[idx] + bias[channel(idx)] if bias is not None else y[idx])
        return ir.convert(value, y.dtype)     # an f32 constant promotes f16

    return td.compute("Z", shape, fcompute)


def on_columns(g: ConvGeometry, target: str) -> bool:
    """Whether the convolution runs as a plain GEMM over its im2col columns, materialized or read in place: on the
    cpu, all but NHWC ones whose padded input's offsets pass i32.

    The cpu's register-tile matmul reads rows of B as vectors; an im2col folded into those loads
    costs a dozen integer divisions per element, repeated for every block that reads it (the
    implicit im2col ran at 10-20 GFLOP/s on the cpu, the plain matmul at 100+). Without those divisions,
    what is left is a GEMM of the columns by the weights (K x OC), which are constant, so packed once as the
    template's B panels (`Lowered.weight_operand`):
    NHWC reads its columns (N*OH*OW x K, K = (kh, kw, c)) in place from the input inside its zero border, an
    offset per output pixel plus one per (kh, kw, c) (`_lower_indirect`), and C is the output;
    NCHW has its columns materialized as (K x OH*OW) per image, the template's transposed A, and C (OH*OW x OC) is
    the output transposed, stored column by column (`columns_output_view`); a pointwise one of one group, or one of
    WINDOW_B_CHANNELS output channels, is weights @ input (or its im2col, copied by the blocks) instead, C the
    output itself (`_lower_weights_first`, where `weights_first` says). With more groups, each
    image's columns are each group's in turn, so the GEMM is batched over (image, group), each with its
    group's weights (ResNeXt-style convolutions of 72-576 terms a group took the implicit im2col: 4-10x
    onnxruntime's time; NHWC (1, 28, 28, 256) 3x3 at 32 / 4 groups 4.1 / 7.8 ms so, 0.58 / 2.2 ms read in place).
    """
    return target == "cpu" and (g.layout == "NCHW" or _indexable(g))


def _pointwise(g: ConvGeometry) -> bool:
    """A 1x1 convolution with stride 1 and no padding: the input itself is the columns matrix."""
    return (g.kh, g.kw, g.stride, max(g.padding)) == (1, 1, (1, 1), 0)


@functools.lru_cache(maxsize=8)
def columns_kernel(dtype) -> td.Kernel:
    """im2col of an NCHW input: cols[n, (c, kh, kw), oh * OW + ow], zero in the padding.

    One block per (column-matrix row, image) copies a strided window row by row: the output
    columns whose input pixel is inside the row are found first, so the copy in between has no
    bounds checks (for stride 1 a plain, vectorized copy) and no index needs a division. The
    geometry comes in as scalars, so one compile serves every convolution.
    """
    @td.func
    def copy_run(X, cols, n, row, c, ih, base, lo, hi, offset, stride):
        """cols[n, row, base + ow] = X[n, c, ih, ow * stride + offset] for ow in [lo, hi): in whole runs of COPY_RUN
        (a constant trip count, vectorized whole: `matmul_cpu.COPY_RUN`), the last one overlapping the one before;
        a shorter row one at a time."""
        if hi - lo >= COPY_RUN:
            for step in range(lo, hi, COPY_RUN):
                start = min(step, hi - COPY_RUN)
                for r in range(COPY_RUN):
                    cols[n, row, base + start + r] = X[n, c, ih, (start + r) * stride + offset]
        else:
            for ow in range(lo, hi):
                cols[n, row, base + ow] = X[n, c, ih, ow * stride + offset]

    @td.kernel(grid=lambda K, N: (K, N), block=1, name=f"im2col_{dtype.name}")
    def im2col_rows(X: dtype["N", "C", "H", "W"], cols: dtype["N", "K", "L"], conv_kh: td.i32, conv_kw: td.i32,
                    conv_ow: td.i32, conv_sh: td.i32, conv_sw: td.i32, conv_pt: td.i32, conv_pl: td.i32,
                    conv_dh: td.i32, conv_dw: td.i32):
        row, n = blockIdx.x, blockIdx.y
        c, kh, kw = row // (conv_kh * conv_kw), row // conv_kw % conv_kh, row % conv_kw
        offset = kw * conv_dw - conv_pl                       # iw = ow * stride + offset
        first = first_inside(offset, conv_sw, conv_ow)        # the output columns with 0 <= iw < W
        end = end_inside(offset, conv_sw, conv_ow, W, first)
        for oh in range(L // conv_ow):
            ih = oh * conv_sh - conv_pt + kh * conv_dh
            base = oh * conv_ow
            inside = ih >= 0 and ih < H                      # else the whole row is padding
            lo = first if inside else conv_ow
            hi = end if inside else conv_ow
            for ow in range(lo):
                cols[n, row, base + ow] = 0.0
            # stride 2 as a literal, whose strided loads LLVM vectorizes (for stride 1 it versions the loop
            # itself): ResNet-50's 7x7 stem's columns 0.377 -> 0.250 ms (docs/benchmarks.md)
            if conv_sw == 2:
                copy_run(X, cols, n, row, c, ih, base, lo, hi, offset, 2)
            else:
                copy_run(X, cols, n, row, c, ih, base, lo, hi, offset, conv_sw)
            for ow in range(hi, conv_ow):
                cols[n, row, base + ow] = 0.0

    return im2col_rows


def pad_kernel(dtype, cols_dtype=None) -> td.Kernel:
    """An NHWC input inside a zero border: cols[n, pt + h, pl + w, c] = X[n, h, w, c] (named as the columns
    kernels' output, which `Lowered` allocates), the `indirect` GEMM's A, whose reads then need no bounds checks;
    in `cols_dtype` where given (a 16-bit input widened to f32, `_lower_indirect`). One block per (padded row,
    image); the border's widths come in as scalars (one compile for every geometry)."""
    return _pad_kernel(dtype, cols_dtype or dtype)


@functools.lru_cache(maxsize=8)
def _pad_kernel(dtype, cols_dtype) -> td.Kernel:
    name = f"pad_nhwc_{dtype.name}" + (f"_to_{cols_dtype.name}" if cols_dtype != dtype else "")

    @td.kernel(grid=lambda HP, N: (HP, N), block=1, name=name)
    def pad_rows(X: dtype["N", "H", "W", "C"], cols: cols_dtype["N", "HP", "WP", "C"], conv_pt: td.i32,
                 conv_pl: td.i32):
        hp, n = blockIdx.x, blockIdx.y
        ih = hp - conv_pt
        inside = ih >= 0 and ih < H
        left = conv_pl if inside else WP        # else the whole row is border
        for wp in range(left):
            for c in range(C):
                cols[n, hp, wp, c] = 0.0
        if inside:
            for iw in range(W):
                for c in range(C):
                    cols[n, hp, conv_pl + iw, c] = td.cast(X[n, ih, iw, c], cols_dtype)
            for wp in range(conv_pl + W, WP):
                for c in range(C):
                    cols[n, hp, wp, c] = 0.0

    return pad_rows


def _columns_shape(g: ConvGeometry) -> tuple:
    """The shape `columns_kernel` writes: (N, K, OH*OW) (K of every group)."""
    groups, _, k, _ = g.gemm
    return (g.n, groups * k, g.oh * g.ow)


def _columns_scalars(g: ConvGeometry) -> dict:
    return dict(conv_kh=g.kh, conv_kw=g.kw, conv_ow=g.ow, **window_scalars(g))


def columns_output_view(g: ConvGeometry, c: td.Tensor) -> td.Tensor:
    """The output as a compute over C of the GEMM on explicit columns, batched over (image, group): for NCHW, C
    (N * G, OH*OW, OCg) is columns^T @ weights, the output transposed; for NHWC, C is the output itself, as
    `output_view` (N * OH*OW, OC) with one group, else (N * G, OH*OW, OCg), each group's channels apart. With
    more groups the channel axis is split, as in `output_view`."""
    groups, _, _, ocg = g.gemm
    if g.layout == "NHWC" and groups == 1:
        return output_view(g, c)
    if g.layout == "NHWC":
        return td.compute("Y", _grouped_out_shape(g),
                          lambda n, oh, ow, gi, o: c[n * groups + gi, oh * g.ow + ow, o])
    if groups == 1:
        return td.compute("Y", g.out_shape, lambda n, o, oh, ow: c[n, oh * g.ow + ow, o])
    return td.compute("Y", _grouped_out_shape(g),
                      lambda n, gi, o, oh, ow: c[n * groups + gi, oh * g.ow + ow, o])


@dataclass(frozen=True)
class Lowered:
    """A convolution as a matmul: the fused template kernel, and on the cpu the im2col kernel before it.

    Call `run` with the arrays of the input definition's and the epilogue's placeholders, by name.
    """

    geometry: ConvGeometry
    matmul: object              # the gemm.MatmulPlan the kernel was scheduled from
    kernel: td.Kernel           # the template with the conv's loads (implicit im2col) and stores fused in
    columns: td.Kernel | None   # explicit im2col (cpu), fused with the input's prologue if it has one
    x_name: str | None          # the input's placeholder, when the input is one (no prologue)
    on_columns: bool            # the GEMM reads explicit columns (cpu; `columns` None: the input itself, as
                                # on a GPU for a pointwise NHWC convolution)
    batch_index: np.ndarray     # the matmul's (z-slice -> A, B matrix) table, made once (indirect: with its offsets)
    window: bool = False        # the GEMM copies the NCHW input's im2col itself (`window_kernel`, or `window_b`)
    finish: td.Kernel | None = None     # with split-k: sums the kernel's partials (`P`) into the epilogue
    indirect: bool = False      # the GEMM reads its im2col in place (`_lower_indirect`): `columns` pads the input
    weights_first: bool = False     # the weights are A and the input B (`_lower_weights_first`)

    @property
    def transposed_a(self) -> bool:
        """Whether the GEMM reads its columns as the template's transposed A (cpu, NCHW: K x OH*OW per image)."""
        return self.on_columns and self.geometry.layout == "NCHW" and not self.weights_first

    def weight_operand(self, weight: np.ndarray) -> np.ndarray:
        """The GEMM's B the OIHW weights become (made once for constant weights): (K, OC) in the order of
        `im2col`, as the cpu template's packed panels where the GEMM reads explicit columns: packed from a view
        of the weights (a transposed copy first took 33 ms of a 55 ms call of a 2048 -> 2048 1x1 convolution);
        for 8-bit operands B's transpose (`pack_weight`); weights first, A: the (OC, C*KH*KW) weights as they are."""
        if self.weights_first:
            return weight.reshape(self.matmul.operand_shapes()[0])
        if self.on_columns and self.matmul.packs_b:
            return self.matmul.pack_b(_weight_as_b(self.geometry, weight))
        return pack_weight(self.geometry, weight, self.matmul.k_major_b)

    @functools.cached_property
    def _call(self) -> tuple:
        """What `run` passes besides the arrays, made once: (the fixed arguments by name, the GEMM shape of the
        columns operand A, the columns shape and dtype (the convolution's, which an epilogue's Cast may change for
        the output), the parameter names of the columns kernel, of the GEMM kernel (but its output, unless it
        writes split-k partials) and of the finishing kernel (but its output))."""
        g = self.geometry
        split = 1 if self.finish is None else self.matmul.fusion_split
        scalars = {} if self.columns is None else _pad_scalars(g) if self.indirect else _columns_scalars(g)
        fixed = dict(batch_index=self.batch_index, split=split, **scalars)
        shape = (input_shape(g) if self.window else (1, math.prod(_padded_shape(g))) if self.indirect
                 else self.matmul.operand_shapes()[1] if self.weights_first
                 else self.matmul.operand_shapes(self.transposed_a)[0])
        columns_params = [name for name, _ in self.columns.params] if self.columns else []
        columns_dtype = dict(self.columns.params)["cols"].dtype.numpy if self.columns else None
        names = [name for name, _ in self.kernel.params]     # with split-k, C (the partials) is among them
        finish_params = [name for name, _ in self.finish.params][:-1] if self.finish else []
        columns_shape = _padded_shape(g) if self.indirect else _columns_shape(g)
        return fixed, shape, (columns_shape, columns_dtype), columns_params, \
            names[:-1] if self.finish is None else names, finish_params

    def _launches(self, arrays: dict, weight: np.ndarray, out: np.ndarray):
        """The launches `run` makes, in order, as (kernel, arguments); buffers (columns, split-k partials) are
        allocated where the operands are."""
        fixed, shape, (columns_shape, columns_dtype), columns_params, names, finish_params = self._call
        args = dict(arrays, B=weight, **fixed)
        if self.weights_first:
            args["A"], args["B"] = weight, arrays[self.x_name].reshape(shape)
        elif self.on_columns and self.x_name is not None and self.columns is None:    # the input is A
            args["A"] = arrays[self.x_name].reshape(shape)
        elif self.on_columns and self.columns is not None:
            cols = args["cols"] = empty_like_operands(columns_shape, columns_dtype, out)
            if self.x_name is not None:
                args["X"] = arrays[self.x_name]
            yield self.columns, [args[name] for name in columns_params]
            args["A"] = cols.reshape(shape)
        if len((self.finish or self.kernel).params[-1][1].dims) != out.ndim:
            # grouped, the kernel's output the convolution's with its channel axis split (an epilogue may end in
            # a tensor of five axes of its own, written as it is)
            out = out.reshape(_grouped_out_shape(self.geometry))
        if self.finish is None:
            yield self.kernel, [args[name] for name in names] + [out]
            return
        args["C"] = args["P"] = empty_like_operands(self.matmul.partials_shape, np.float32, out)
        yield self.kernel, [args[name] for name in names]
        yield self.finish, [args[name] for name in finish_params] + [out]

    def run(self, arrays: dict, weight: np.ndarray, out: np.ndarray) -> None:
        """out = the convolution (with its fused prologue and epilogue) of `arrays` and the weight operand."""
        for kernel, args in self._launches(arrays, weight, out):
            kernel(*args)

    def compile(self, arrays: dict, weight: np.ndarray, out: np.ndarray, target: str | None = None) -> None:
        """Compile the kernels `run` launches for these arguments, launching none."""
        for kernel, args in self._launches(arrays, weight, out):
            kernel.compile(*args, target=target)

    @property
    def kernels(self) -> list:
        return [k for k in (self.columns, self.kernel, self.finish) if k is not None]


def lower(g: ConvGeometry, dtype, target: str, x: td.Tensor, epilogue, b_dtype=None) -> Lowered | DirectRows:
    """Schedule convolution `g` on the matmul template (a direct kernel where `on_rows`): `x` defines the
    input (a placeholder or a prologue's compute), `epilogue(y)` the final output from the conv output `y`;
    `b_dtype`: the weights' type where it is not x's (8-bit operands of one kind).
    On a GPU the schedule is `tuned_point`'s, one per geometry whatever the prologue and epilogue."""
    if rows_sum_exactly(g, target, dtype, b_dtype):      # (the direct kernels sum in f32)
        if dtype.is_float:
            return lower_rows(g, dtype, x, epilogue)
        wide = td.compute("XF", x.shape, lambda *i: td.cast(x[i], td.f32))      # 8-bit integers: exact in f32
        return lower_rows(g, td.f32, wide, lambda y: epilogue(td.compute("YI", y.shape,
                                                                         lambda *i: td.cast(y[i], td.i32))))
    groups, m, k, n = g.gemm
    if on_columns(g, target):
        nchw = g.layout == "NCHW"
        x_name = x.name if x.kind == "placeholder" else None
        pointwise = _pointwise(g) and x_name is not None and (nchw or groups == 1)    # the input is the columns
        if nchw and groups == 1 and x_name is not None and dtype.is_float and b_dtype is None and weights_first(g):
            return _lower_weights_first(g, dtype, target, x_name, epilogue)
        # NHWC reads its input as A in place (pointwise) or through an index table (`_lower_indirect`), which the
        # dot4 template's kernels do too: 8-bit integers on byte dot products (`gemm.template_for`)
        if groups == 1 and not nchw:        # the columns of every image, one matrix
            matmul = mm.plan((1, m, k), (1, k, g.oc), dtype, target, b_dtype=b_dtype, dot4_products=True)
        else:       # per image (and group): (K x OH*OW columns)^T @ weights (NCHW), columns @ weights (NHWC)
            per = () if groups == 1 else (groups,)
            matmul = mm.plan((g.n, *per, g.oh * g.ow, k), (1, *per, k, n), dtype, target, b_dtype=b_dtype,
                              dot4_products=not nchw)
        out = matmul.out_dtype
        c = td.placeholder("C", out, matmul.operand_shapes()[2])
        y = columns_output_view(g, c)
        if not nchw and not pointwise:
            return _lower_indirect(g, dtype, matmul, x, epilogue(y))
        windowed = nchw and not pointwise and groups == 1 and g.ow >= WINDOW_ROW
        if windowed and mm.cpu.copies_a(True, matmul.m, matmul.n):
            kernel = td.fuse(window_kernel(g, matmul, dtype), np.empty(input_shape(g), dtype.numpy),
                             *matmul.examples(packed_b=True)[1:], prologues={} if x_name else {"A": x},
                             epilogues={"C": epilogue(y)})
            return Lowered(g, matmul, kernel, None, x_name, True, matmul.batch_index(1), window=True)
        kernel = td.fuse(matmul.kernel(out, packed_b=True, transposed_a=nchw),
                         *matmul.examples(packed_b=True, transposed_a=nchw), epilogues={"C": epilogue(y)})
        if pointwise:
            return Lowered(g, matmul, kernel, None, x_name, True, matmul.batch_index(1))
        columns = columns_kernel(dtype)     # generic over geometries, a fused prologue specializes it
        if x_name is None:
            columns = td.fuse(columns, np.empty(input_shape(g), dtype.numpy), np.empty(_columns_shape(g), dtype.numpy),
                              *_columns_scalars(g).values(), prologues={"X": x})
        return Lowered(g, matmul, kernel, columns, x_name, True, matmul.batch_index(1))
    return _lower_gemm(g, dtype, target, x, epilogue, tuned_point(g, dtype, target, b_dtype), b_dtype)


# output pixels from which a pointwise NCHW convolution is weights @ input (`_lower_weights_first`): with fewer,
# the images' rows fill the template's blocks poorly and the store of the transposed C is cheap (session 116, 2
# cores, weights first against columns^T @ weights: 2048 -> 1000 at 1x1 0.38 against 0.10-0.12 ms, 320 ->
# 1280 at 7x7 0.30-0.53 against 0.22-0.24, 256 -> 1024 at 14x14 0.65 against 0.53-0.54; at 28x28 512 -> 128 0.56
# against 0.54-1.0; 256 -> 64 at 56x56 0.53-0.60 against 1.04-1.14, 16 -> 96 at 112x112 0.28-0.36 against 0.89-1.02)
WEIGHTS_FIRST_PIXELS = 1024


# output channels for which an NCHW convolution with a window is weights @ input (`weights_first`): one row block of
# the template (up to 96 rows, `matmul_cpu.fitted`) whose rows share each panel's im2col, filled once. Fewer rows
# leave the copy less to share, and more make each row block copy it again (session 117, Zen 3, two cores, against
# columns^T @ weights, three runs each: 3 -> 64 3x3 at 224x224 0.69-0.76x the time, the 7x7 stem 0.77-0.90x, 64 -> 64
# 3x3 at 56x56 0.87-0.92x, 3 -> 96 11x11 0.84-0.99x; 16 -> 16 at 64x64 1.46-1.49x, 32 -> 32 at 147x147 1.2-1.5x,
# 128 -> 128 at 56x56 1.1-1.3x, 256 -> 256 at 32x32 1.25-1.3x)
WINDOW_B_CHANNELS = range(64, 97)


def weights_first(g: ConvGeometry) -> bool:
    """Whether NCHW convolution `g` (one group) runs as weights @ input on the cpu (`_lower_weights_first`): with
    WEIGHTS_FIRST_PIXELS output pixels or more, pointwise, or with a window and WINDOW_B_CHANNELS output channels."""
    return g.oh * g.ow >= WEIGHTS_FIRST_PIXELS and (_pointwise(g) or g.oc in WINDOW_B_CHANNELS)


def _lower_weights_first(g: ConvGeometry, dtype, target: str, x_name: str, epilogue) -> Lowered:
    """An NCHW convolution of one group on the cpu as weights @ input, per image (OC x C*KH*KW) @ (C*KH*KW x
    OH*OW): C is then the output itself, stored a row at a time, where columns^T @ weights gives it transposed,
    stored a column at a time from the block's sums. The input is B: a pointwise convolution's, whose panels each
    block packs, is its columns; otherwise each block copies its panels' im2col from the input (`window_b`). The
    weights, read in place as A, stay in cache."""
    k, hw = g.c * g.kh * g.kw, g.oh * g.ow
    matmul = mm.plan((1, g.oc, k), (g.n, k, hw), dtype, target, dot4_products=False)
    c = td.placeholder("C", matmul.out_dtype, matmul.operand_shapes()[2])
    y = td.compute("Y", g.out_shape, lambda n, o, oh, ow: c[n, o, oh * g.ow + ow])
    a, b, c_example, batch_index, split = matmul.examples()
    window = not _pointwise(g)
    if window:
        gemm = mm.cpu.tile_matmul_kernel(matmul.point, dtype, matmul.out_dtype, window_b=_window(g))
        b = np.empty(input_shape(g), dtype.numpy)
    else:
        gemm = matmul.kernel(matmul.out_dtype)
    kernel = td.fuse(gemm, a, b, c_example, batch_index, split, epilogues={"C": epilogue(y)})
    return Lowered(g, matmul, kernel, None, x_name, True, batch_index, window=window, weights_first=True)


def _padded_shape(g: ConvGeometry) -> tuple:
    """The NHWC input inside its padding: `pad_kernel`'s output."""
    pt, pl, pb, pr = g.padding
    return (g.n, g.h + pt + pb, g.w + pl + pr, g.c)


def _indexable(g: ConvGeometry) -> bool:
    """Whether the padded input's offsets fit the `indirect` kernel's i32 table."""
    return math.prod(_padded_shape(g)) < 2**31


def indirect_table(g: ConvGeometry, batch_index: np.ndarray) -> np.ndarray:
    """The `indirect` GEMM's table for NHWC convolution `g` (`matmul_cpu.indirect_index`): each z-slice's offset in
    the padded input (with more groups, z is (image, group): the image's and the group's first channel), each
    output pixel's (its window's first element; with one group, of every image), then each (kh, kw, c)'s."""
    _, hp, wp, c = _padded_shape(g)
    groups, cg = g.groups, g.c // g.groups
    image = hp * wp * c
    table = batch_index.copy()
    table[:, 0] = batch_index[:, 0] // groups * image + batch_index[:, 0] % groups * cg
    n, oh, ow = np.meshgrid(np.arange(g.n if groups == 1 else 1), np.arange(g.oh), np.arange(g.ow), indexing="ij")
    rows = n * image + (oh * g.stride[0] * wp + ow * g.stride[1]) * c
    kh, kw, ci = np.meshgrid(np.arange(g.kh), np.arange(g.kw), np.arange(cg), indexing="ij")
    taps = (kh * g.dilation[0] * wp + kw * g.dilation[1]) * c + ci
    return mm.cpu.indirect_index(table, rows.ravel(), taps.ravel())


def _lower_indirect(g: ConvGeometry, dtype, matmul, x: td.Tensor, out: td.Tensor) -> Lowered:
    """An NHWC convolution on the cpu as the `indirect` GEMM (batched over (image, group) with more groups), which
    reads its im2col in place from the input inside a zero border (`pad_kernel`, with the input's prologue fused;
    no copy at all for an input without either). On im2col columns, ResNet-50's 7x7 stem took 3.9 ms, 2.3 so
    (its three channels a tap made the columns kernel 1.7 ms of it); 3x3 layers 2.23 -> 2.16 ms at 56x56,
    2.29 -> 2.12 at 14x14 (one thread)."""
    table = indirect_table(g, matmul.batch_index(1))
    # a 16-bit float input is widened to f32 as it is padded (or copied): the micro-kernel then broadcasts each
    # element of A from memory, where it converted one at each load, a scalar at a time (a 64 -> 192 3x3 layer at
    # 71x71 in f16: 9.2-9.7 -> 5.6-6.6 ms, f32 5.3-6.1; ResNet-50 in f16 61.2 -> 49.9 ms, Inception-V3 99.9 ->
    # 71.8). Staging A a block at a time through the index tables instead made ResNet-50 slower (session 72).
    widen = matmul.template is not mm.DOT4 and dtype.is_float and mm.cpu.stages_a(dtype)
    a_dtype = td.f32 if widen else dtype
    flat = np.empty((1, math.prod(_padded_shape(g))), a_dtype.numpy)
    if matmul.template is mm.DOT4:      # 8-bit integers on byte dot products
        gemm = mm.dot4.dot4_matmul_kernel(matmul.point, matmul.out_dtype, True, dtype, matmul.b_type, indirect=True)
    else:
        gemm = mm.cpu.tile_matmul_kernel(matmul.point, a_dtype, matmul.out_dtype, packed_b=True, indirect=True)
    kernel = td.fuse(gemm, flat,
                     *matmul.examples(packed_b=True)[1:3], table, 1, epilogues={"C": out})
    x_name = x.name if x.kind == "placeholder" else None
    if x_name is not None and not any(g.padding) and not widen:
        return Lowered(g, matmul, kernel, None, x_name, True, table, indirect=True)
    pad = pad_kernel(dtype, a_dtype)
    if x_name is None:
        pad = td.fuse(pad, np.empty(input_shape(g), dtype.numpy), np.empty(_padded_shape(g), a_dtype.numpy),
                      *_pad_scalars(g).values(), prologues={"X": x})
    return Lowered(g, matmul, kernel, pad, x_name, True, table, indirect=True)


def _pad_scalars(g: ConvGeometry) -> dict:
    return dict(conv_pt=g.padding[0], conv_pl=g.padding[1])


def _lower_gemm(g: ConvGeometry, dtype, target: str, x: td.Tensor, epilogue, point, b_dtype=None) -> Lowered:
    """`lower` on the matmul template with its loads of A the implicit im2col (GPUs, and on the cpu NHWC
    convolutions whose offsets pass the indirect GEMM's i32), at schedule `point` (None: the template's default)."""
    groups, m, k, n = g.gemm
    matmul = mm.plan((groups, m, k), (groups, k, n), dtype, target, do_tune=False, point=point, b_dtype=b_dtype,
                     dot4_products=False)
    c = td.placeholder("C", matmul.out_dtype, matmul.operand_shapes()[2])
    out = epilogue(output_view(g, c))
    batch_index = matmul.batch_index(matmul.fusion_split)
    # with split-k (too few output tiles to fill a GPU) the GEMM writes f32 partials and the kernel that sums
    # them carries the epilogue
    if g.layout == "NHWC" and groups == 1 and _pointwise(g) and x.kind == "placeholder":
        # the input is the columns matrix itself: a plain GEMM, whose copies do none of the implicit im2col's
        # index arithmetic (a bounds check that cannot fail and divisions by the image sizes per copy: the
        # 128x64 point's k loop had 196 SASS instructions per 32 HMMA for ResNet-50's 1x1 layers, 146 so)
        kernel, finish = matmul.fused({}, out)
        return Lowered(g, matmul, kernel, None, x.name, True, batch_index, finish=finish)
    kernel, finish = matmul.fused({"A": im2col(g, x)}, out)
    return Lowered(g, matmul, kernel, None, None, False, batch_index, finish=finish)


def tuned_point(g: ConvGeometry, dtype, target: str, b_dtype=None):
    """The GEMM schedule of convolution `g` on a GPU: tuned (cached on disk, per geometry) by timing the
    convolution's own kernels at each point, as `run` launches them: the implicit im2col's loads and a split
    point's sum included, which a plain GEMM of the same sizes would leave out of the ranking (the 7x7 stem's
    element loads, say). None (the default) elsewhere, or when tuning is off."""
    if target != "cuda" or not tuning_enabled():
        return None
    template, op, default = _tuning(g, dtype, target, b_dtype)
    x, out = _x_placeholder(g, dtype), mm.product_type(dtype)
    weights = mm.random_operand((g.oc, g.c // g.groups, g.kh, g.kw), b_dtype or dtype)
    args = (mm.random_operand(input_shape(g), dtype), pack_weight(g, weights, dtype.bits == 8),
            np.empty(g.out_shape, out.numpy))
    candidate = lambda p: ConvRun(_lower_gemm(g, dtype, target, x, no_epilogue, p, b_dtype))
    return tune(template.space(target, dtype.bits // 8), candidate, args, op=op, shapes=(g,),
                dtypes=(dtype.name,) + ((b_dtype.name,) if b_dtype else ()), default=default, target=target,
                outputs={2: out})


def _tuning(g: ConvGeometry, dtype, target: str, b_dtype=None) -> tuple:
    """(template, tuning op name, default point) of convolution `g`'s GEMM schedule."""
    template = mm.template_for(dtype, target)
    groups, m, k, n = g.gemm
    default = mm.plan((groups, m, k), (groups, k, n), dtype, target, do_tune=False, b_dtype=b_dtype,
                      dot4_products=False).point
    return template, f"conv_{template.name}", default


def tuning_report(g: ConvGeometry, dtype, target: str = "cuda", top: int = 3) -> list:
    """The lines of `tuner.report` on convolution `g`'s stored tuning: its `top` points, the default's rank, the
    slowest ([] when none is stored)."""
    _, op, default = _tuning(g, dtype, target)
    return report(op, (g,), (dtype.name,), target, top=top, default=default)


def no_epilogue(y: td.Tensor) -> td.Tensor:
    """The epilogue of a convolution with neither bias nor activation: its output as it is."""
    return y


class ConvRun:
    """A tuning candidate: convolution `lowered` (input placeholder X, no epilogue), called as (x, weight operand,
    out) and compiled likewise."""

    def __init__(self, lowered: Lowered):
        self.lowered = lowered

    def compile(self, x, weight, out, target: str | None = None) -> None:
        """Compile the kernels a call launches (no launch)."""
        self.lowered.compile({"X": x}, weight, out, target)

    def __call__(self, x, weight, out) -> None:
        """out = the convolution of x by the weight operand."""
        self.lowered.run({"X": x}, weight, out)


COPY_RUN = mm.cpu.COPY_RUN   # input pixels `columns_kernel` copies at once
WINDOW_ROW = 32      # output rows at least this wide let `window_kernel` copy a block's pixels in few row segments


def window_kernel(g: ConvGeometry, matmul, dtype) -> td.Kernel:
    """The cpu matmul kernel that copies its blocks' transposed A as the im2col of the NCHW input itself
    (`matmul_cpu.window_strip`): no columns in memory. Taken where the template copies A anyway (`copies_a`:
    512+ pixels) and output rows are WINDOW_ROW or wider: Inception-V3's 32 -> 32 3x3 layer at 147x147 took
    3.49 ms as im2col and GEMM, 1.95 ms so; ResNet-50's 28x28 3x3 layers (a 48-pixel block is three row
    segments) 1.05-1.11 ms as im2col and GEMM, 1.09-1.19 ms so."""
    return mm.cpu.tile_matmul_kernel(matmul.point, dtype, matmul.out_dtype, True, True, True, _window(g))


def _window(g: ConvGeometry):
    """The window of NCHW convolution `g`, as the cpu template's kernels copy its im2col (`matmul_cpu.Window`)."""
    return mm.cpu.Window(g.kh, g.kw, *g.stride, g.padding[0], g.padding[1], *g.dilation, g.ow)


@functools.lru_cache(maxsize=32)
def _depth_stack_op(shape: tuple, dtype, kd: int, stride: int, begin: int, dilation: int, od: int,
                    channels_last: bool) -> td.Op:
    """`depth_stacked`'s op for inputs of `shape` and DSL type `dtype`."""
    n, c, d, h, w = (shape[0], shape[4], *shape[1:4]) if channels_last else shape
    x = td.placeholder("X", dtype, shape)

    def fcompute(image, channel, row, col):
        b, o = image // od, image % od
        ci, k = channel // kd, channel % kd
        depth = o * stride - begin + k * dilation
        inside = ir.binary("and", depth >= 0, depth < d)
        depth = td.max(td.min(depth, d - 1), 0)         # a read that is safe whatever the depth: an eager select
        value = x[b, depth, row, col, ci] if channels_last else x[b, ci, depth, row, col]
        return ir.Select(inside, value, ir.const(0, dtype), dtype, eager=True)

    if channels_last:
        stacked = td.compute("stacked", (n * od, h, w, c * kd), lambda i, r, q, ch: fcompute(i, ch, r, q))
    else:
        stacked = td.compute("stacked", (n * od, c * kd, h, w), fcompute)
    return td.op([x], [stacked], name="conv_depth_stack")


def depth_stacked(x, kd: int, stride: int, begin: int, dilation: int, od: int, channels_last: bool = False):
    """A 3-D convolution's input x (N, C, D, H, W), or (N, D, H, W, C), as the input of a 2-D one: (N * OD, C * KD,
    H, W), or (N * OD, H, W, C * KD), whose image n * OD + od holds as channel c * KD + kd x's channel c at depth
    od * stride - begin + kd * dilation (0 outside x). The 3-D convolution is the 2-D convolution of it by the
    weights (O, C / G * KD, KH, KW) (OIDHW reshaped), whose output image n * OD + od is output depth od."""
    op = _depth_stack_op(tuple(x.shape), td.ir.types.from_numpy(x.dtype), kd, stride, begin, dilation, od,
                         channels_last)
    return op(x)[0], op


@dataclass(frozen=True)
class ConvPlan:
    """A convolution compiled for one target: a direct reduce op, or a lowering (matmul, direct rows)."""

    geometry: ConvGeometry
    direct: td.Op | None = None
    lowered: Lowered | DirectRows | None = None
    out_dtype: np.dtype | None = None   # the output's numpy type where it is not x's (8-bit operands: i32 / f32)

    @property
    def kernels(self) -> list:
        return list(self.direct.kernels) if self.direct is not None else self.lowered.kernels

    def run(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
            packed: np.ndarray | None = None) -> np.ndarray:
        """The convolution of contiguous `x` by OIHW `weight` (or by `packed`, the lowering's weight operand
        made once by a caller that runs the same weights again), with the plan's bias and activation."""
        extra = [bias] if bias is not None else []
        if self.direct is not None:
            return self.direct(x, weight, *extra)[0]
        out = empty_like_operands(self.geometry.out_shape, self.out_dtype or x.dtype, x, weight, *extra)  # where x is
        operand = packed if packed is not None else placed_weight_operand(self.lowered, weight)
        self.lowered.run({"X": x, "bias": bias}, operand, out)
        return out


def placed_weight_operand(lowering: Lowered | DirectRows, weight, host: np.ndarray | None = None):
    """The lowering's operand of the OIHW `weight`, where `weight` lives. The layout is made on the host, from
    `host` if given (a graph constant's value), else from `weight` (GPU weights: a copy there and back)."""
    note_host_work("a convolution's weights were laid out on the host")
    return placed_like(weight, lowering.weight_operand(on_host(weight) if host is None else host))


def plan(g: ConvGeometry, dtype, target: str, has_bias: bool, activation, b_dtype=None) -> ConvPlan:
    """The conv kernels for geometry `g` (weights of `b_dtype` where it is not x's: 8-bit operands of one kind):
    where `uses_direct`, the cpu's direct kernels or elsewhere a reduce by the rules; else a matmul lowering.
    8-bit operands (into i32 or f32): on a GPU the 8-bit tensor-core template; on the cpu, integers on the float
    convolutions' GEMMs (8-bit floats compute in f32 there); where `uses_direct`, a reduce."""
    check_activation(activation, dtype)
    return _plan(g, dtype, target, has_bias, activation, fast_compile_enabled(), tuning_enabled(),
                 None if b_dtype == dtype else b_dtype)


def check_activation(activation, dtype=None) -> None:
    """A ValueError unless `activation` is one the convolution of `dtype` operands fuses (a TypeError for one that
    is no name)."""
    choices = ", ".join(map(repr, ACTIVATIONS))
    if activation is not None and not isinstance(activation, str):     # a list would reach the plan cache's hash
        raise TypeError(f"conv2d: activation must be one of {choices}, got {activation!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"conv2d: unknown activation {activation!r}; choose one of {choices}")
    if activation == "sigmoid" and dtype is not None and not mm.product_type(dtype).is_float:
        raise ValueError("conv2d: the sigmoid of an integer convolution (int32) is no integer: convert its result "
                         "to floats first, or fuse relu / relu6")


@functools.lru_cache(maxsize=128)
def _plan(g: ConvGeometry, dtype, target: str, has_bias: bool, activation, fast: bool, tuning: bool,
          b_dtype=None) -> ConvPlan:
    """`plan`, cached per fast-compile mode (the matmul's schedule depends on it) and TASKDSL_TUNE (as `gemm.plan`)."""
    x, out = _x_placeholder(g, dtype), mm.product_type(dtype)
    bias = td.placeholder("bias", out, (g.oc,)) if has_bias else None
    out_dtype = None if out == dtype else out.numpy
    if uses_direct(g) and not rows_sum_exactly(g, target, dtype, b_dtype):   # (8-bit floats: f32 on the cpu)
        return ConvPlan(g, direct=_direct_op(g, dtype, x, bias, activation, b_dtype), out_dtype=out_dtype)
    lowered = lower(g, dtype, target, x, lambda y: bias_activation(g, y, bias, activation), b_dtype)
    return ConvPlan(g, lowered=lowered, out_dtype=out_dtype)


def _direct_op(g: ConvGeometry, dtype, x: td.Tensor, bias, activation, b_dtype=None) -> td.Op:
    """The convolution as one reduce definition over (c, kh, kw) of a group (8-bit operands: their products
    summed in i32 or f32)."""
    cg, ocg = g.c // g.groups, g.oc // g.groups
    w = td.placeholder("W", b_dtype or dtype, (g.oc, cg, g.kh, g.kw))
    out = mm.product_type(dtype)
    widened = (lambda v: td.cast(v, out)) if dtype.bits == 8 else (lambda v: v)

    def fcompute(*idx):
        n, o, oh, ow, c, kh, kw = idx if g.layout == "NCHW" else (idx[0], idx[3], idx[1], idx[2], *idx[4:])
        return widened(_input_at(g, x, n, o // ocg * cg + c, oh, ow, kh, kw)) * widened(w[o, c, kh, kw])

    y = td.reduce("Y", g.out_shape, (cg, g.kh, g.kw), fcompute, op="sum")     # f16 products sum in f32...
    z = bias_activation(g, y, bias, activation)
    if z.dtype != out:     # ...rounded once, after the bias and activation, to the output's type (not left f32)
        z = td.compute("Out", g.out_shape, lambda *idx: ir.convert(z[idx], out))
    inputs = [x, w] + ([bias] if bias is not None else [])
    return td.op(inputs, [z], name=f"conv2d_direct_{g.kh}x{g.kw}")


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1, layout: str = "NCHW",
           activation: str | None = None):
    """2-D convolution of x (NCHW or NHWC) with OIHW `weight`, plus optional bias and activation: f32, f16 or
    bf16 (in their type, products summed in f32; two types in f32); E4M3 / E5M2 into f32, s8 / u8 into exact i32
    (8-bit operands of one kind in any pair; a bias in the result's type)."""
    x, weight = as_array(x), as_array(weight)
    dtype, b_dtype = mm.operand_types(x.dtype, weight.dtype, "conv2d")
    out = mm.product_type(dtype)
    g = geometry(x.shape, weight.shape, stride, padding, dilation, groups, layout)
    if bias is not None and np.shape(bias) != (g.oc,):
        raise ValueError(f"conv2d: bias must have shape ({g.oc},) (one per output channel), got {np.shape(bias)}")
    check_activation(activation, dtype)
    if g.n == 0:            # an empty batch: nothing to compute (and no plan for it)
        return empty_like_operands(g.out_shape, numpy_dtype(out), x, weight, *([bias] if bias is not None else []))
    x, weight = converted(x, numpy_dtype(dtype)), converted(weight, numpy_dtype(b_dtype or dtype))
    p = plan(g, dtype, td.get_target(), bias is not None, activation, b_dtype)
    return p.run(x, weight, mm.bias_operand(bias, numpy_dtype(out), "conv2d") if bias is not None else None)


def _grouped_out_shape(g: ConvGeometry) -> tuple:
    """The output of a grouped convolution with its channel axis split, as `output_view` defines it (the
    kernel's output; with one group, the output is whatever the epilogue ends with: a transpose, say)."""
    groups, _, _, ocg = g.gemm
    return (g.n, groups, ocg, g.oh, g.ow) if g.layout == "NCHW" else (g.n, g.oh, g.ow, groups, ocg)
