"""How each operator runs: through the operator library (stdlib_ops) where it has the operator, else
as `td.op` on the operator's own compute definitions.

A runner takes the operator and its input arrays and returns (output arrays, kernels launched).
`RUNNERS` maps Operator classes to runners; a new kind of node (a fused sub-graph, say)
registers its own with `@runs(NodeClass)`. The stdlib ops canonicalize shapes into size
symbols, so one compiled kernel serves every operator of the same structure; `td.op`s built
from definitions (concrete shapes) are shared by operators with the same signature.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from stdlib_ops import (conv, elementwise, gemm, grid_sample, norm, pool, reduce, rowwise, scan, scatter, topk,
                        transform)
from stdlib_ops.conv_geometry import ConvGeometry, geometry, input_shape

from .. import schedule
from ..ir import types as T
from ..runtime.arrays import contiguous, empty_like_operands, note_host_work, on_device, on_host, unplanned
from ..runtime.config import get_target
from ..runtime.device_array import DeviceArray, carve
from ..runtime.kernel import remember
from .operator import Operator
from .ops import (BatchNorm, Concat, Conv, Cumulative, Elementwise, Expand, FusedElementwise, Gather, GridSample,
                  IntegerConv, IntegerMatMul, LayerNorm, MatMul, Pad, Pool, Reduce, Reshape, ScatterElements, ScatterND,
                  Slice, Softmax, TopK, Transpose)
from .replay import record_check

RUNNERS: dict = {}
_DEFINITION_OPS: dict = {}      # Operator.signature() -> td.Op
TEMPLATE_FLOATS = (T.f32, T.f16, T.bf16)    # the float types the matmul and conv templates compute in


def runs(*classes) -> Callable:
    """Register the decorated function as the runner of these Operator classes."""
    def register(fn):
        for cls in classes:
            RUNNERS[cls] = fn
        return fn
    return register


def run(op: Operator, arrays: list) -> tuple:
    """(outputs, kernels) of one operator on its input arrays."""
    if not on_device(*arrays):     # values in GPU memory are not read back to be checked
        op.check_values(arrays)
        record_check(op, arrays)   # a cpu replay checks them again
    if any(t.size == 0 for t in op.outputs) or any(a.size == 0 for a in arrays):
        # nothing to compute: empty outputs, or identities of empty reductions
        note_host_work(f"{op.kind}'s empty operands were handled on the host")
        return op.reference(*[on_host(a) for a in arrays]), []
    return RUNNERS.get(type(op), run_definitions)(op, arrays)


def run_definitions(op: Operator, arrays: list) -> tuple:
    """The operator's compute definitions scheduled by td.op: over symbolic sizes for generic operators (one
    kernel serves every size), else over the operator's shapes; td.ops are shared by equal signatures."""
    key = op.generic_signature() if op.generic else op.signature()
    td_op = _DEFINITION_OPS.get(key)
    if td_op is None:
        holders, definitions = op.generic_definitions() if op.generic else (op.placeholders, op.definitions)
        td_op = schedule.op(holders, definitions, name=op.kind)
        remember(_DEFINITION_OPS, key, td_op, elementwise.OPS_KEPT)     # keys of non-generic operators hold shapes
    outputs = td_op(*arrays, *(op.size_carriers() if op.generic else ()))
    return outputs, td_op.kernels


def _plan(plan) -> tuple:
    out = plan.run()
    return [out], list(plan.op.kernels)


# ---------------------------------------------------------------- the anchors (one call site each)
@runs(MatMul)
def run_matmul(op: MatMul, arrays: list) -> tuple:
    """matmul on the matmul templates (stdlib_ops.gemm) for f32, f16 and bf16; other dtypes by definitions (a bf16
    128x768 @ 768x768 took 4.8 ms by them on the cpu, a rule-based reduce)."""
    if op.inputs[0].dtype not in TEMPLATE_FLOATS:
        return run_definitions(op, arrays)
    return _on_matmul_plan(op, arrays)


def _matmul_plan(op, target: str, b_dtype=None) -> gemm.MatmulPlan:
    """The stdlib_ops.gemm plan of a graph matmul (1-D operands promoted as numpy does)."""
    a, b = op.inputs
    return gemm.plan(a.shape if a.ndim > 1 else (1,) + a.shape, b.shape if b.ndim > 1 else b.shape + (1,), a.dtype,
                     target, b_dtype=b_dtype)


def _on_matmul_plan(op, arrays: list, b_dtype=None) -> tuple:
    """A graph matmul by stdlib_ops.matmul, a constant B packed once for the cpu template (`packed_b`)."""
    p = _matmul_plan(op, get_target(), b_dtype)
    packed = packed_b(p, op.inputs[1], arrays[1])
    out = gemm.matmul(*arrays, packed=packed).reshape(op.outputs[0].shape)
    return [out], [p.kernel(packed_b=packed is not None)]


@runs(IntegerMatMul)
def run_integer_matmul(op: IntegerMatMul, arrays: list) -> tuple:
    """The product of 8-bit integers on the matmul templates (stdlib_ops.gemm): on a GPU the 8-bit tensor-core
    template, which takes B transposed: a constant B (quantized weights) is transposed once and kept with the
    constant, where a call of stdlib_ops.matmul transposes B every time; on the cpu the register-tile template's
    exact f32 k blocks, a constant B packed once."""
    a, b = op.inputs
    if get_target() != "cuda":
        return _on_matmul_plan(op, arrays, b.dtype)
    p = _matmul_plan(op, "cuda", b.dtype)
    if not b.is_constant:
        return [gemm.matmul(*arrays).reshape(op.outputs[0].shape)], [p.kernel()]
    a_shape, bt_shape, _ = p.operand_shapes()
    bt = _kept_with(b, "_k_major", p, lambda: p.kernel_b(arrays[1].reshape(bt_shape[0], p.k, p.n)))
    return [p(arrays[0].reshape(a_shape), bt, b_k_major=True).reshape(op.outputs[0].shape)], [p.kernel()]


def packed_b(plan: gemm.MatmulPlan, tensor, b: np.ndarray) -> np.ndarray | None:
    """A matmul's B operand as its plan's packed panels, made once and kept with the constant, when B is a
    constant of the graph and the plan's template takes packed operands (the cpu's, but not for small matrices,
    whose kernel reads B as it is: `MatmulPlan.small`); else None. Every matmul of one constant by one plan
    reads the same panels: an LSTM's 32 steps packed R each, 32 MiB of panels that left no step's in cache
    (45 us a step against 15)."""
    if not (tensor.is_constant and plan.packs_b) or plan.small:
        return None
    return _kept_with(tensor, "_packed_b", plan, lambda: plan.pack_b(b))


def _kept_with(tensor, what: str, plan, make):
    """make(), made once for `plan` and kept with the constant `tensor` (under its attribute `what`)."""
    return _made_once(tensor.__dict__.setdefault(what, {}).setdefault(id(plan), {}), plan, make)


def _made_once(cache: dict, owner, make):
    """make(), kept in `cache` as long as `owner` (the plan or lowering it was made for) stays the same."""
    if cache.get("owner") is not owner:
        cache.update(owner=owner, value=make())
    return cache["value"]


def conv_geometry(op: Conv | IntegerConv) -> ConvGeometry:
    """The stdlib_ops.conv geometry of a graph convolution: 2-D; 1-D as 2-D over an image of one row; 3-D as the 2-D
    convolution of its depth-stacked input (`conv.depth_stacked`)."""
    x, w = op.inputs
    a = op.attrs
    layout = "NHWC" if a["channels_last"] else "NCHW"
    if x.ndim == 5:
        n, (h, width), kd, od = x.shape[0], op.spatial_dims(x.shape)[1:], w.shape[2], a["out"][0]
        channels = op.channels(x.shape) * kd
        x_shape = (n * od, h, width, channels) if a["channels_last"] else (n * od, channels, h, width)
        pads = (a["pads"][1], a["pads"][2], a["pads"][4], a["pads"][5])
        return geometry(x_shape, (w.shape[0], w.shape[1] * kd) + w.shape[3:], a["strides"][1:], pads,
                        a["dilations"][1:], a["groups"], layout)
    if x.ndim == 3:
        x_shape = (x.shape[0], 1) + x.shape[1:] if a["channels_last"] else x.shape[:2] + (1, x.shape[2])
        return geometry(x_shape, w.shape[:2] + (1, w.shape[2]), (1, a["strides"][0]),
                        (0, a["pads"][0], 0, a["pads"][1]), (1, a["dilations"][0]), a["groups"], layout)
    pads = (a["pads"][0], a["pads"][1], a["pads"][2], a["pads"][3])
    return geometry(x.shape, w.shape, a["strides"], pads, a["dilations"], a["groups"], layout)


def packed_weight(lowering, tensor, weight, cache: dict):
    """A conv lowering's operand of the weights `weight` (graph tensor `tensor`, of weight's elements): made once,
    and kept in `cache`, when the weights are a constant of the graph. It is made on the host (from the constant's
    value, or a copy of GPU weights) and placed where `weight` is."""
    def make():
        host = np.asarray(tensor.value, weight.dtype).reshape(weight.shape) if tensor.is_constant else None
        return conv.placed_weight_operand(lowering, weight, host)
    return _made_once(cache, lowering, make) if tensor.is_constant else make()


@runs(Conv)
def run_conv(op: Conv, arrays: list) -> tuple:
    """Convolutions of f32 / f16 / bf16 by stdlib_ops.conv (a matmul lowering or a direct reduce; 1-D and 3-D ones
    through 2-D ones, `conv_geometry`); others by definitions."""
    x = op.inputs[0]
    if x.dtype not in TEMPLATE_FLOATS:
        return run_definitions(op, arrays)
    return _on_conv_plan(op, conv.plan(conv_geometry(op), x.dtype, get_target(), False, None), arrays)


def _on_conv_plan(op, p: conv.ConvPlan, arrays: list) -> tuple:
    """(outputs, kernels) of graph convolution `op` by stdlib_ops.conv's plan `p` of its 2-D geometry
    (`conv_geometry`), the weights' operand made once where they are a constant."""
    g = p.geometry
    weight = arrays[1].reshape(g.oc, g.c // g.groups, g.kh, g.kw)
    packed = None if p.lowered is None else packed_weight(p.lowered, op.inputs[1], weight,
                                                            op.__dict__.setdefault("_packed", {}))
    if op.inputs[0].ndim == 5:
        return _depth_stacked_conv(op, p, contiguous(arrays[0]), weight, packed)
    x = contiguous(arrays[0]).reshape(input_shape(g))
    return [p.run(x, weight, packed=packed).reshape(op.outputs[0].shape)], p.kernels


def _depth_stacked_conv(op, p: conv.ConvPlan, x, weight, packed) -> tuple:
    """A 3-D convolution as the 2-D one of its depth-stacked input, whose output images are the output's depths:
    channels-last, the output itself; else transposed into it (the last copy is the result, the others
    intermediates). By its definitions a 64 -> 64 3x3x3 convolution over 8x28x28 took 13.8 s on the cpu."""
    a = op.attrs
    last = a["channels_last"]
    with unplanned():
        stacked, stack = conv.depth_stacked(x, op.inputs[1].shape[2], a["strides"][0], a["pads"][0],
                                            a["dilations"][0], a["out"][0], last)
    if last:
        y = p.run(stacked, weight, packed=packed)
        return [y.reshape(op.outputs[0].shape)], list(stack.kernels) + list(p.kernels)
    with unplanned():
        y = p.run(stacked, weight, packed=packed)       # (N * OD, O, OH, OW)
    n, o, od = op.outputs[0].shape[:2] + (a["out"][0],)
    out, moved = _plan(transform.op_for("transpose", y.reshape((n, od, o) + y.shape[2:]), (0, 2, 1, 3, 4)))
    return out, list(stack.kernels) + list(p.kernels) + moved


@runs(IntegerConv)
def run_integer_conv(op: IntegerConv, arrays: list) -> tuple:
    """Convolutions of 8-bit integers by stdlib_ops.conv (on a GPU the 8-bit tensor-core template, on the cpu the
    float convolutions' GEMMs, exact in i32; a reduce for tiny grouped reductions; 1-D and 3-D ones through 2-D
    ones, `conv_geometry`), the weights laid out once where constant."""
    x, w = op.inputs
    return _on_conv_plan(op, conv.plan(conv_geometry(op), x.dtype, get_target(), False, None, w.dtype), arrays)


@runs(Pool)
def run_pool(op: Pool, arrays: list) -> tuple:
    """2-d NCHW max and average pooling by stdlib_ops.pool's row kernel where it runs (f32 on the cpu, no
    indices), else by definitions."""
    if not op.on_rows:
        return run_definitions(op, arrays)
    a = op.attrs
    y, kernel = pool.pool_rows(contiguous(arrays[0]), op.outputs[0].shape[2:], a["kernel"], a["strides"],
                              a["pads"], a["dilations"], a["mode"], a["mode"] == "max" or a["count_include_pad"])
    return [y], [kernel]


# ---------------------------------------------------------------- through stdlib_ops
@runs(Elementwise, FusedElementwise)
def run_elementwise(op: Elementwise, arrays: list) -> tuple:
    """Any elementwise function, or fused group of them, through stdlib_ops' canonical broadcast kernels."""
    plan = elementwise.custom_plan(f"graph.{op.kind}", arrays, op.body, op.outputs[0].numpy_dtype,
                                   params=tuple(sorted(op.params.items())))
    return _plan(plan)


@runs(Reduce)
def run_reduce(op: Reduce, arrays: list) -> tuple:
    """sum / mean / max / min through stdlib_ops.reduce; bool, prod and integer means by definitions."""
    dtype = op.inputs[0].dtype
    if op.attrs["op"] in ("sum", "max", "min", "mean") and (dtype.is_float or (dtype.is_integer and
                                                                                op.attrs["op"] != "mean")):
        return _plan(reduce.op_for(op.attrs["op"], arrays[0], op.attrs["axes"], op.attrs["keepdims"],
                                   op.attrs.get("dtype")))
    return run_definitions(op, arrays)


@runs(TopK)
def run_topk(op: TopK, arrays: list) -> tuple:
    """On the cpu, `topk_rows` (a few of a long row by about n comparisons, more by a quickselect and a merge sort:
    the 50 best of 50257 took 466 ms by the definitions, which rank every pair, and 0.05-0.1 ms so); elsewhere by
    definitions."""
    if not _on_host_cpu(arrays):
        return run_definitions(op, arrays)
    x = contiguous(arrays[0])
    values = empty_like_operands(op.outputs[0].shape, x.dtype, x)
    indices = empty_like_operands(op.outputs[1].shape, np.int64, x)
    return [values, indices], [topk.topk_rows(x, values, indices, op.attrs["largest"])]


def _on_host_cpu(arrays: list) -> bool:
    """Whether the cpu target runs this operator on host arrays (the cpu's own kernels apply)."""
    return get_target() == "cpu" and not on_device(*arrays)


def _axis_view(array, axis: int):
    """The array, contiguous, viewed as (outer, its size along `axis`, inner): the cpu kernels' view of an axis."""
    array = contiguous(array)
    shape = array.shape
    return array.reshape(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))


@runs(Cumulative)
def run_cumulative(op: Cumulative, arrays: list) -> tuple:
    """On the cpu, `stdlib_ops.scan.scan` (the axis walked once: the running sums along rows of (512, 4096) took
    19 ms by the definitions, about 64 block terms an element); elsewhere, by definitions."""
    if not _on_host_cpu(arrays):
        return run_definitions(op, arrays)
    x = _axis_view(arrays[0], op.attrs["axis"])
    y = empty_like_operands(op.inputs[0].shape, x.dtype, x)
    kernel = scan.scan(x, y.reshape(x.shape), op.attrs["op"], op.attrs["exclusive"], op.attrs["reverse"])
    return [y], [kernel]


@runs(GridSample)
def run_grid_sample(op: GridSample, arrays: list) -> tuple:
    """On the cpu, sampling of images of 1-3 spatial axes by `stdlib_ops.grid_sample` (a chunk of points' corners
    found once for every channel: (1, 16, 64, 64) at 4096 points took 0.16-0.23 ms bilinearly and 2.4 ms bicubically
    by the definitions, 0.09-0.16 and 0.29-0.42 ms so); elsewhere by definitions."""
    x, coordinates = op.inputs
    if not (_on_host_cpu(arrays) and grid_sample.applies(x.numpy_dtype, x.ndim - 2, op.attrs["mode"],
                                                         coordinates.numpy_dtype)):
        return run_definitions(op, arrays)
    x, coordinates = contiguous(arrays[0]), contiguous(arrays[1])
    y = empty_like_operands(op.outputs[0].shape, op.outputs[0].numpy_dtype, x)
    return [y], [grid_sample.sample(x, coordinates, y, *(op.attrs[a] for a in ("mode", "padding", "align_corners")))]


@runs(ScatterElements)
def run_scatter_elements(op: ScatterElements, arrays: list) -> tuple:
    """On the cpu, where indices span data on every axis but the scattered one, `stdlib_ops.scatter.scatter_rows`
    (the updates applied in order: a thousand into each of 64 rows of 1024 took 11.6 ms by the definitions, which
    search every update for each element, and 0.10 ms so); others by definitions."""
    data, indices, _ = op.inputs
    axis = op.attrs["axis"]
    spans = all(m == n for a, (m, n) in enumerate(zip(indices.shape, data.shape)) if a != axis)
    if not (_on_host_cpu(arrays) and spans and not data.dtype.is_bool):
        return run_definitions(op, arrays)
    x, i, u = (_axis_view(a, axis) for a in arrays)
    y = empty_like_operands(data.shape, x.dtype, x)
    return [y], [scatter.scatter_rows(x, i, u, y.reshape(x.shape), op.attrs["reduction"])]


@runs(ScatterND)
def run_scatter_nd(op: ScatterND, arrays: list) -> tuple:
    """On the cpu, `stdlib_ops.scatter.scatter_slices` (the updates applied in order); elsewhere, and for bool
    data, by definitions."""
    if not _on_host_cpu(arrays) or op.inputs[0].dtype.is_bool:
        return run_definitions(op, arrays)
    x, i, u = (contiguous(a) for a in arrays)
    y = empty_like_operands(x.shape, x.dtype, x)
    return [y], [scatter.scatter_slices(x, i, u, y, op.attrs["reduction"])]


def _rows(op: Operator, axis: int) -> bool:
    """Whether the row kernels of stdlib_ops.rowwise apply: the last axis of a float tensor."""
    x = op.inputs[0]
    return axis == x.ndim - 1 and rowwise.applies(x.dtype)


@runs(Softmax)
def run_softmax(op: Softmax, arrays: list) -> tuple:
    """One kernel per row over the last axis (stdlib_ops.rowwise), else the reductions of stdlib_ops.norm."""
    if _rows(op, op.attrs["axis"]):
        kernel = rowwise.softmax_kernel_for(op.inputs[0].dtype, op.attrs["log"], op.inputs[0].shape[-1])
        return [rowwise.softmax_rows(arrays[0], log=op.attrs["log"])], [kernel]
    return _plan(norm.op_for(op.kind, arrays[0], op.attrs["axis"]))


@runs(LayerNorm)
def run_layer_norm(op: LayerNorm, arrays: list) -> tuple:
    """Layer / RMS norm through stdlib_ops (row kernels over the last axis), with statistics by definitions."""
    x, a = op.inputs[0], op.attrs
    ndim = x.ndim - a["axis"]
    params = op.inputs[1:]
    exact = all(p.shape == x.shape[a["axis"]:] for p in params) and len({p.dtype for p in params}) <= 1
    if a.get("stats") or not exact:
        return run_definitions(op, arrays)
    weight = arrays[1] if a["has_weight"] else None
    bias = arrays[-1] if a.get("has_bias") else None
    rms = bool(a.get("rms"))
    if _rows(op, a["axis"]) and all(p.dtype == x.dtype for p in params):     # one kernel per row
        kernel = rowwise.layer_norm_kernel_for(x.dtype, x.shape[-1], rms=rms)
        return [rowwise.layer_norm_rows(arrays[0], weight, bias, a["eps"], rms=rms)], [kernel]
    if rms:
        return _plan(norm.op_for("rms_norm", arrays[0], weight, a["eps"], ndim))
    return _plan(norm.op_for("layer_norm", arrays[0], weight, bias, a["eps"], ndim))


@runs(BatchNorm)
def run_batch_norm(op: BatchNorm, arrays: list) -> tuple:
    """Inference batch norm through stdlib_ops.norm."""
    if len({t.dtype for t in op.inputs[1:]}) > 1:
        return run_definitions(op, arrays)
    x, mean, var, *params = arrays
    weight = params.pop(0) if op.attrs["has_weight"] else None
    bias = params.pop(0) if op.attrs["has_bias"] else None
    return _plan(norm.op_for("batch_norm", x, mean, var, weight, bias, op.attrs["eps"]))


@runs(Reshape)
def run_reshape(op: Reshape, arrays: list) -> tuple:
    """A view: no kernel (the executor's arrays are contiguous)."""
    return [contiguous(arrays[0]).reshape(op.attrs["shape"])], []


@runs(Transpose)
def run_transpose(op: Transpose, arrays: list) -> tuple:
    """Transpose through stdlib_ops.transform: on the cpu by a kernel of its own where it swaps two axes or
    interleaves rows (`transposes_by_kernel`)."""
    x, perm = arrays[0], op.attrs["perm"]
    if transform.transposes_by_kernel(x, perm):
        y = empty_like_operands(op.outputs[0].shape, x.dtype, x)
        return [y], [transform.transpose_by_kernel(x, perm, y)]
    return _plan(transform.op_for("transpose", x, perm))


@runs(Concat)
def run_concat(op: Concat, arrays: list) -> tuple:
    """Concat through stdlib_ops.transform."""
    return _plan(transform.op_for("concat", arrays, op.attrs["axis"]))


SPECIALIZED_SLICE = 1 << 14     # output elements from which a slice gets its own kernel


@runs(Slice)
def run_slice(op: Slice, arrays: list) -> tuple:
    """A contiguous slice (`Slice.view_offset`) as a view of its input, without a kernel; others through
    stdlib_ops.transform's kernel (starts and steps as arguments: one compile serves every
    slice), or for large outputs by the operator's definitions, starts and steps built in: the copy then
    vectorizes (GPT-2's q/k/v slices of 128 x 768: 0.29 -> 0.13 ms)."""
    offset, x = op.view_offset, arrays[0]
    if offset is not None and isinstance(x, (np.ndarray, DeviceArray)):
        shape = op.outputs[0].shape
        if isinstance(x, DeviceArray):
            return [carve(x, offset * x.dtype.itemsize, shape, x.dtype)], []
        return [contiguous(x).reshape(-1)[offset:offset + op.outputs[0].size].reshape(shape)], []
    if op.outputs[0].size >= SPECIALIZED_SLICE:
        return run_definitions(op, arrays)
    a = op.attrs
    stops = [s + n * d if s + n * d >= 0 else None for s, n, d in zip(a["starts"], a["sizes"], a["steps"])]
    return _plan(transform.op_for("slice", arrays[0], list(a["starts"]), stops, list(a["steps"])))


@runs(Gather)
def run_gather(op: Gather, arrays: list) -> tuple:
    """Gather through stdlib_ops.transform."""
    return _plan(transform.op_for("gather", arrays[0], arrays[1], op.attrs["axis"]))


@runs(Expand)
def run_expand(op: Expand, arrays: list) -> tuple:
    """Expand through stdlib_ops.transform."""
    return _plan(transform.op_for("expand", arrays[0], op.outputs[0].shape))


@runs(Pad)
def run_pad(op: Pad, arrays: list) -> tuple:
    """Constant padding through stdlib_ops.transform (by a number, or by the value of a one-element input); the
    other modes by their definitions."""
    if op.attrs["mode"] != "constant":
        return run_definitions(op, arrays)
    pads, n = op.attrs["pads"], op.inputs[0].ndim
    value = arrays[1] if len(arrays) == 2 else op.attrs["value"]
    return _plan(transform.op_for("pad", arrays[0], [(pads[k], pads[n + k]) for k in range(n)], value))
