"""`python -m taskdsl.bench conv`: ResNet-50 convolutions (batch 1) against the best local peer.

cpu target: stdlib_ops.conv's lowering (im2col columns + the register-tile matmul), weights
packed once outside the timing as onnxruntime packs them at session creation, against
onnxruntime running the same single-Conv ONNX model, f32 (`--layout NHWC`: taskdsl's input
and output NHWC; onnxruntime's model stays NCHW). cuda target: the fused
kernel (implicit im2col in the template's loads; with split-k, the kernel summing its partials
too) on td.DeviceArrays against torch.nn.functional.conv2d (cuDNN), f16, both timed as CUDA-graph
replays ('call ms': a call with its host cost and output allocation).

`--layers depthwise` (cpu): MobileNet-V2's depthwise 3x3 layers with their bias and ReLU6, as the
graph runs them (one direct kernel with the epilogue fused), against Conv + Clip in onnxruntime.

`--int8`: uint8 inputs by int8 weights into exact int32. cpu: the float convolutions' GEMMs, whose k blocks sum the
8-bit products exactly in f32 (`gemm.exact_k`), against onnxruntime's ConvInteger; cuda: the 8-bit tensor-core
template (mma m16n8k32, implicit im2col) against cuDNN's f16 convolution (torch has no 8-bit one to time).

`--bf16`: bf16 inputs and weights, products summed in f32, rounded to bf16 once. cpu: against onnxruntime's f32
Conv of the same values (its CPU kernels have no bf16 one); cuda: the tensor-core template (mma m16n8k16 of bf16)
against cuDNN's bf16 convolution.
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from .accuracy import rel_err, shown
from .onnx_peer import session_of
from .timing import RATIO_LEGEND, time_cpu

# (channels, height/width, out channels, kernel, stride, padding): ResNet-50's distinct conv shapes
RESNET50 = [
    (3, 224, 64, 7, 2, 3), (64, 56, 64, 1, 1, 0), (64, 56, 64, 3, 1, 1), (64, 56, 256, 1, 1, 0),
    (256, 56, 128, 1, 1, 0), (128, 28, 128, 3, 1, 1), (128, 28, 512, 1, 1, 0), (512, 28, 256, 1, 1, 0),
    (256, 14, 256, 3, 1, 1), (256, 14, 1024, 1, 1, 0), (1024, 14, 512, 1, 1, 0), (512, 7, 512, 3, 1, 1),
    (512, 7, 2048, 1, 1, 0),
]
CPU_DEFAULT = [RESNET50[2], RESNET50[5], RESNET50[8], RESNET50[11]]
# MobileNet-V2's distinct depthwise layers (channels = out channels = groups), same fields
DEPTHWISE = [
    (32, 112, 32, 3, 1, 1), (96, 112, 96, 3, 2, 1), (144, 56, 144, 3, 1, 1), (144, 56, 144, 3, 2, 1),
    (192, 28, 192, 3, 1, 1), (192, 28, 192, 3, 2, 1), (384, 14, 384, 3, 1, 1), (576, 14, 576, 3, 1, 1),
    (576, 14, 576, 3, 2, 1), (960, 7, 960, 3, 1, 1),
]
LAYERS = {"resnet50": RESNET50, "depthwise": DEPTHWISE}


def _onnx_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, groups: int = 1, bias=None):
    """A session running Conv (and with `bias`, Clip to [0, 6] after it) on `x`; ConvInteger for 8-bit x and w."""
    import onnx
    from onnx import TensorProto, helper
    inputs, initializers, nodes = ["x", "w"], [onnx.numpy_helper.from_array(w, "w")], []
    if bias is not None:
        inputs.append("b")
        initializers += [onnx.numpy_helper.from_array(bias, "b"), onnx.numpy_helper.from_array(np.float32(0), "lo"),
                         onnx.numpy_helper.from_array(np.float32(6), "hi")]
        nodes.append(helper.make_node("Clip", ["conv", "lo", "hi"], ["y"]))
    integer = x.dtype == np.uint8
    conv_out = "conv" if bias is not None else "y"
    nodes.insert(0, helper.make_node("ConvInteger" if integer else "Conv", inputs, [conv_out], strides=[stride] * 2,
                                     pads=[pad] * 4, group=groups))
    types = (TensorProto.UINT8, TensorProto.INT32) if integer else (TensorProto.FLOAT, TensorProto.FLOAT)
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", types[0], x.shape)],
                              [helper.make_tensor_value_info("y", types[1], None)], initializers)
    session = session_of(graph)
    return lambda: session.run(None, {"x": x})[0]


def _operands(rng, c: int, hw: int, oc: int, k: int, groups: int, kind: str) -> tuple:
    """A batch-1 input and OIHW weights: f32 (the weights scaled by 1 / sqrt(fan-in)), those values rounded to
    bf16 (`kind` "bf16", still as f32 arrays: each side converts them itself), or (`kind` "int8") uint8 and int8
    over their whole ranges."""
    if kind == "int8":
        return (rng.integers(0, 256, (1, c, hw, hw)).astype(np.uint8),
                rng.integers(-128, 128, (oc, c // groups, k, k)).astype(np.int8))
    x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
    w = (rng.standard_normal((oc, c // groups, k, k)) / np.sqrt(c // groups * k * k)).astype(np.float32)
    return (x, w) if kind == "float" else tuple(a.astype(ml_dtypes.bfloat16).astype(np.float32) for a in (x, w))


def _operand_types(kind: str, target: str) -> tuple:
    """(x's DSL type, w's where it is another) of a row of `kind`: u8 by s8, bf16, or the target's float type (f32 on
    the cpu, f16 on cuda)."""
    import taskdsl as td
    return {"int8": (td.u8, td.i8), "bf16": (td.bf16, None)}.get(kind, (td.f16 if target == "cuda" else td.f32, None))


def _as_operand(a: np.ndarray, dtype) -> np.ndarray:
    """Host operand `a` (f32 values, or 8-bit integers as they are) in DSL type `dtype`."""
    from taskdsl.ir.types import numpy_dtype
    return a if a.dtype.kind in "iu" else a.astype(numpy_dtype(dtype), copy=False)


def _cpu_rows(layers, layout: str, depthwise: bool, kind: str) -> list:
    import taskdsl as td
    from stdlib_ops import conv
    from stdlib_ops.conv_geometry import geometry
    rng = np.random.default_rng(0)
    rows = []
    for c, hw, oc, k, s, p in layers:
        groups = c if depthwise else 1
        x, w = _operands(rng, c, hw, oc, k, groups, kind)
        bias = rng.standard_normal(oc).astype(np.float32) if depthwise else None
        x_in = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        g = geometry(x_in.shape, w.shape, s, p, groups=groups, layout=layout)
        types = _operand_types(kind, "cpu")
        plan = conv.plan(g, types[0], "cpu", depthwise, "relu6" if depthwise else None, types[1])
        x_td, w_td = _as_operand(x_in, types[0]), _as_operand(w, types[0])
        packed = plan.lowered.weight_operand(w_td)   # once, as onnxruntime prepacks at session creation
        call = lambda: plan.run(x_td, w_td, bias, packed=packed)
        y = call()                                # compiles outside the timing
        y = y.astype(np.float32) if kind == "bf16" else y
        t_td = time_cpu(call, warmup=3, repeat=10)
        y = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
        # onnxruntime after taskdsl: its pool threads spin for a while after each run, which on a
        # small machine takes the cores from whatever runs next
        peer = _onnx_conv(x, w, s, p, groups, bias)
        want = peer()
        t_peer = time_cpu(peer, warmup=3, repeat=10)
        time.sleep(0.2)
        rows.append(dict(layer=(c, hw, oc, k, s), taskdsl=t_td, peer=t_peer, err=rel_err(y, want),
                         flops=2.0 * oc * c // groups * k * k * y.shape[2] * y.shape[3]))
    return rows


def _cuda_rows(layers, layout: str, kind: str) -> list:
    import torch
    import taskdsl as td
    from stdlib_ops import conv
    from stdlib_ops.conv_geometry import geometry
    from .cuda_timing import time_cuda, time_cuda_replayed, time_torch_replayed
    rng = np.random.default_rng(0)
    rows = []
    for c, hw, oc, k, s, p in layers:
        int8 = kind == "int8"
        x_host, w_host = _operands(rng, c, hw, oc, k, 1, kind)
        peer_type = torch.bfloat16 if kind == "bf16" else torch.float16     # (8-bit: cuDNN's f16)
        x, w = (torch.from_numpy(a.astype(np.float32)).cuda().to(peer_type) for a in (x_host, w_host))
        x_in = x_host if layout == "NCHW" else np.ascontiguousarray(x_host.transpose(0, 2, 3, 1))
        g = geometry(x_in.shape, w_host.shape, s, p, layout=layout)
        dtype, b_dtype = _operand_types(kind, "cuda")
        plan = conv.plan(g, dtype, "cuda", False, None, b_dtype)
        x_dev = td.to_device(_as_operand(x_in, dtype))          # the prepared launch path
        packed = td.to_device(plan.lowered.weight_operand(_as_operand(w_host, dtype)))  # once
        run = lambda: plan.run(x_dev, None, packed=packed)    # the fused kernel (and split-k's sum, if it splits)
        t_td, t_call = time_cuda_replayed(run), time_cuda(run)
        t_peer = time_torch_replayed(lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=p))
        exact = torch.float64 if int8 else torch.float32        # 8-bit products sum exactly in f64
        want = torch.nn.functional.conv2d(x.to(exact), w.to(exact), stride=s, padding=p).cpu().numpy()
        y = run().numpy().astype(np.float64 if int8 else np.float32)
        got = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
        rows.append(dict(layer=(c, hw, oc, k, s), taskdsl=t_td, call=t_call, peer=t_peer, err=rel_err(got, want),
                         flops=2.0 * oc * c * k * k * got.shape[2] * got.shape[3], schedule=_schedule(plan)))
        print(f"  layer {rows[-1]['layer']}: {t_peer / t_td:.3f}x cuDNN", flush=True)
        for line in conv.tuning_report(g, dtype) if not int8 else ():     # when tuned: the fastest points
            print("   ", line, flush=True)
    return rows


def _schedule(plan) -> str:
    """The GEMM schedule a conv plan runs: its block tile, k tile and split-k, and whether the GEMM reads the
    input itself as an operand, with no im2col (`128x64 bk32 split 2`, `128x64 bk32, input as A`; an NCHW
    convolution as weights @ input on the cpu: `input as B`)."""
    matmul = getattr(plan.lowered, "matmul", None)
    if matmul is None:
        return "direct"
    bm, bn, _ = matmul.template.tile_shape(matmul.point)
    plain = plan.lowered.on_columns and plan.lowered.columns is None
    return (f"{bm}x{bn} bk{matmul.point.bk}" + (f" split {matmul.split}" if matmul.split > 1 else "")
            + ((", input as B" if plan.lowered.weights_first else ", input as A") if plain else ""))


def _tolerance_key(target: str, kind: str) -> str:
    """The accuracy.TOLERANCE entry of a row: exact for 8-bit integers, else its float type's."""
    return "i8" if kind == "int8" else _operand_types(kind, target)[0].name


def run(sizes=None, layout: str = "NCHW", layers: str = "resnet50", int8: bool = False, bf16: bool = False) -> list:
    """Print and return per-layer times of taskdsl's conv2d (input and output in `layout`) and the peer
    (onnxruntime / cuDNN, NCHW) on the `layers` set ('resnet50' or 'depthwise'), or those of its
    indices in `sizes`; `int8`: of uint8 inputs by int8 weights (exact int32); `bf16`: of bf16 operands."""
    import taskdsl as td
    target = td.get_target()
    depthwise = layers == "depthwise"
    if depthwise and target == "cuda":
        raise ValueError("the depthwise layer set runs on the cpu target only (td.set_target('cpu'))")
    if sizes:
        chosen = [LAYERS[layers][i] for i in sizes]
    else:
        chosen = CPU_DEFAULT if target == "cpu" and not depthwise else LAYERS[layers]
    if int8 and bf16:
        raise ValueError("int8 and bf16 are two benchmarks: choose one")
    kind = "int8" if int8 else "bf16" if bf16 else "float"
    if depthwise and kind != "float":
        raise ValueError(f"the depthwise layer set is f32 only: leave out {kind}")
    rows = _cuda_rows(chosen, layout, kind) if target == "cuda" else _cpu_rows(chosen, layout, depthwise, kind)
    if target == "cuda":
        peer = f"cuDNN (torch, {'bf16' if bf16 else 'f16'})"
    else:
        peer = "onnxruntime (%s)" % ("ConvInteger" if int8 else "f32")
    what = "MobileNet-V2 depthwise layers + bias + ReLU6" if depthwise else "ResNet-50 conv layers"
    what += {"int8": ", u8 x s8 into int32", "bf16": ", bf16"}.get(kind, "")
    print(f"{what}, batch 1, on {target}: taskdsl ({layout}) vs {peer} (NCHW); {RATIO_LEGEND}")
    if target == "cuda":
        print("(GPU times of each side's kernels replayed as a CUDA graph; 'call ms': a taskdsl call with its host "
              "launch cost)")
    print(f"{'C,HW,OC,K,S':>22} {'taskdsl ms':>11} {'peer ms':>9} {'ratio':>7} {'GFLOP/s':>8} {'rel err':>8}"
          + (f" {'call ms':>8}  schedule" if target == "cuda" else ""))
    for r in rows:
        r["ratio"] = r["peer"] / r["taskdsl"]
        print(f"{','.join(map(str, r['layer'])):>22} {r['taskdsl'] * 1e3:>11.3f} {r['peer'] * 1e3:>9.3f} "
              f"{r['ratio']:>7.3f} {r['flops'] / r['taskdsl'] / 1e9:>8.1f} "
              f"{shown(r['err'], _tolerance_key(target, kind), 'conv layer %s' % (r['layer'],), 8)}"
              + (f" {r['call'] * 1e3:>8.3f}  {r['schedule']}" if "call" in r else ""))
    if rows:
        print(f"mean ratio {np.mean([r['ratio'] for r in rows]):.3f}")
    return rows
