"""`python -m taskdsl.bench written-out`: ONNX models whose activations and norms are written out in
elementwise operators and reductions, as exports before opset 17 (and torch's GELU before opset 20) write
them, through `from_onnx` and the default compile, against onnxruntime in the same run (cpu target).

- `bert-ffn`: two BERT-base layers' feed-forward halves, sequence 128: MatMul, bias, GELU as Div, Erf,
  Add, Mul, Mul, MatMul, bias, the residual Add, and the layer norm as ReduceMean, Sub, Pow, ReduceMean,
  Add, Sqrt, Div, Mul, Add. Graph passes: `recognize_norms` makes each norm one LayerNorm,
  `fuse_elementwise` the GELU one operator, which fuses into its matmul's epilogue.
- `conv-swish` / `conv-softsign`: four 3x3 convolutions, 64 channels, 56x56, each followed by Swish
  (Sigmoid, Mul) or Softsign (Abs, Add, Div), which read the convolution's output twice.
"""
from __future__ import annotations

import numpy as np

from .accuracy import rel_err, shown
from .timing import time_cpu

FULL = {"seq": 128, "hidden": 768, "inner": 3072, "layers": 2, "channels": 64, "side": 56, "blocks": 4}
SMALL = {"seq": 8, "hidden": 32, "inner": 64, "layers": 1, "channels": 8, "side": 9, "blocks": 2}


def _init(name: str, value):
    from onnx import numpy_helper
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def bert_ffn(seq: int, hidden: int, inner: int, layers: int, **_):
    """(the ONNX model, its input) of `layers` feed-forward halves with GELU and layer norm written out."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    node, nodes, inits, x = helper.make_node, [], [], "x"
    for layer in range(layers):
        p = f"l{layer}_"
        weights = {"w1": rng.standard_normal((hidden, inner)) * 0.02, "b1": rng.standard_normal(inner) * 0.02,
                   "w2": rng.standard_normal((inner, hidden)) * 0.02, "b2": rng.standard_normal(hidden) * 0.02,
                   "g": 1 + rng.standard_normal(hidden) * 0.1, "be": rng.standard_normal(hidden) * 0.1,
                   "sq2": 1.4142135, "one": 1.0, "half": 0.5, "two": 2.0, "eps": 1e-12}
        inits += [_init(p + k, v) for k, v in weights.items()]
        steps = [("MatMul", [x, "w1"], "m1"), ("Add", ["m1", "b1"], "a1"), ("Div", ["a1", "sq2"], "d"),
                 ("Erf", ["d"], "e"), ("Add", ["e", "one"], "e1"), ("Mul", ["a1", "e1"], "ge"),
                 ("Mul", ["ge", "half"], "gelu"), ("MatMul", ["gelu", "w2"], "m2"), ("Add", ["m2", "b2"], "a2"),
                 ("Add", ["a2", x], "r"), ("ReduceMean", ["r"], "mu"), ("Sub", ["r", "mu"], "c"),
                 ("Pow", ["c", "two"], "c2"), ("ReduceMean", ["c2"], "var"), ("Add", ["var", "eps"], "ve"),
                 ("Sqrt", ["ve"], "sd"), ("Div", ["c", "sd"], "n"), ("Mul", ["n", "g"], "ng"),
                 ("Add", ["ng", "be"], "y")]
        for op, ins, out in steps:
            ins = [t if t == x else p + t for t in ins]
            nodes.append(node(op, ins, [p + out], axes=[-1]) if op == "ReduceMean" else node(op, ins, [p + out]))
        x = p + "y"
    info = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, seq, hidden]) for name in ("x", x)]
    graph = helper.make_graph(nodes, "bert_ffn", info[:1], info[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, rng.standard_normal((1, seq, hidden)).astype(np.float32)


def conv_activation(activation: str, channels: int, side: int, blocks: int, **_):
    """(the ONNX model, its input) of `blocks` 3x3 convolutions, each followed by written-out `activation`."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    node, nodes, inits, x = helper.make_node, [], [], "x"
    for block in range(blocks):
        p = f"b{block}_"
        inits += [_init(p + "w", rng.standard_normal((channels, channels, 3, 3)) * 0.05),
                  _init(p + "b", rng.standard_normal(channels) * 0.05)]
        nodes.append(node("Conv", [x, p + "w", p + "b"], [p + "c"], pads=[1, 1, 1, 1]))
        if activation == "swish":
            nodes += [node("Sigmoid", [p + "c"], [p + "s"]), node("Mul", [p + "c", p + "s"], [p + "y"])]
        else:
            inits.append(_init(p + "one", 1.0))
            nodes += [node("Abs", [p + "c"], [p + "a"]), node("Add", [p + "a", p + "one"], [p + "a1"]),
                      node("Div", [p + "c", p + "a1"], [p + "y"])]
        x = p + "y"
    shape = [1, channels, side, side]
    info = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in ("x", x)]
    graph = helper.make_graph(nodes, f"conv_{activation}", info[:1], info[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, rng.standard_normal(shape).astype(np.float32)


MODELS = {"bert-ffn": bert_ffn, "conv-swish": lambda **s: conv_activation("swish", **s),
          "conv-softsign": lambda **s: conv_activation("softsign", **s)}


def rows(sizes: dict) -> list:
    """(model, kernels, operators in the ONNX model, taskdsl ms, onnxruntime ms, ratio, max rel err) per model."""
    import onnxruntime as ort

    import taskdsl.graph as tg
    out = []
    for name, build in MODELS.items():
        model, x = build(**sizes)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        compiled = tg.from_onnx(model).compile()
        got, want = compiled(x)[0], session.run(None, {"x": x})[0]
        ours = time_cpu(lambda: compiled(x), repeat=15)
        peer = time_cpu(lambda: session.run(None, {"x": x}), repeat=15)
        out.append((name, len(compiled.kernels), len(model.graph.node), ours * 1e3, peer * 1e3, ours / peer,
                    rel_err(got, want)))
    return out


def run() -> list:
    """Print and return the rows for the full-size models (cpu target)."""
    import taskdsl as td
    print(f"target: {td.get_target()}, batch 1, f32; ratio: taskdsl time / onnxruntime time")
    print(f"{'model':>14} {'kernels':>8} {'ONNX ops':>9} {'taskdsl ms':>11} {'onnxruntime ms':>15} {'ratio':>6} "
          f"{'max rel err':>12}")
    table = rows(FULL)
    for name, kernels, nodes, ours, peer, ratio, err in table:
        print(f"{name:>14} {kernels:>8} {nodes:>9} {ours:>11.3f} {peer:>15.3f} {ratio:>5.2f}x "
              f"{shown(err, 'f32', name)}")
    return table
