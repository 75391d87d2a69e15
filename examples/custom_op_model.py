"""End to end: a hand-written kernel -> a graph operator -> a model (the walk-through of docs/tutorial.md).

What it shows:

* a ``@td.kernel`` for hard-swish, ``x * clip(x + 3, 0, 6) / 6`` (MobileNet-V3's activation,
  which the graph op set does not have), 4 elements per thread with ``repeat(4) * spatial(128)``;
* a graph ``Operator`` for it: ``define`` gives its meaning as a compute definition (shape
  inference and the numpy reference come from it), and ``@runs`` makes the executor launch
  the hand-written kernel instead of a scheduled one; ``@exports`` says what it is in ONNX;
* a small model traced with it and the built-in ops, compiled, checked against the graph's
  numpy reference, and exported to ONNX.

Run it with ``python examples/custom_op_model.py``.
"""
import numpy as np

import taskdsl as td
import taskdsl.graph as tg
from models.onnx_export import export_onnx, exports
from taskdsl import blockIdx, f32, repeat, spatial, threadIdx
from taskdsl.graph import ops
from taskdsl.graph.operator import Operator, dims
from taskdsl.graph.runners import runs

# ---------------------------------------------------------------- 1. the kernel
PER_BLOCK = 512              # 128 threads x 4 elements


@td.kernel(grid=lambda N: td.cdiv(N, PER_BLOCK), block=128)
def hard_swish_kernel(X: f32["N"], Y: f32["N"]):
    for i in (repeat(4) * spatial(128))(threadIdx.x):
        g = blockIdx.x * PER_BLOCK + i
        if g < N:
            x = X[g]
            Y[g] = x * td.min(td.max(x + 3.0, 0.0), 6.0) / 6.0


# ---------------------------------------------------------------- 2. the operator
class HardSwish(Operator):
    """x * clip(x + 3, 0, 6) / 6, elementwise on f32 tensors."""

    kind = "hard_swish"

    def check(self):
        if self.inputs[0].dtype != td.f32:
            raise TypeError(f"hard_swish takes f32 tensors, got {self.inputs[0].dtype.name}")

    def define(self, x):
        return [td.compute("hard_swish", dims(x),
                           lambda *ix: x[ix] * td.min(td.max(x[ix] + 3.0, 0.0), 6.0) / 6.0)]


@runs(HardSwish)
def run_hard_swish(op: HardSwish, arrays: list) -> tuple:
    """Launch the hand-written kernel on the flattened tensor; return (outputs, kernels launched)."""
    x = arrays[0]
    y = np.empty_like(x)
    hard_swish_kernel(x.reshape(-1), y.reshape(-1))
    return [y], [hard_swish_kernel]


@exports(HardSwish)
def export_hard_swish(op: HardSwish, inputs: list, outputs: list, builder) -> None:
    """ONNX has the operator (opset 14 on): one node."""
    builder.add("HardSwish", inputs, outputs)


def hard_swish(x):
    """The traced op: adds a HardSwish node to the graph being built."""
    return HardSwish([x]).outputs[0]


# ---------------------------------------------------------------- 3. the model
def mlp(x, w1, b1, w2, b2):
    """Two dense layers with hard-swish between them."""
    return ops.softmax(hard_swish(x @ w1 + b1) @ w2 + b2)


def main():
    rng = np.random.default_rng(0)
    w1, w2 = (tg.constant(rng.standard_normal((16, 16), dtype=np.float32) / 4) for _ in range(2))
    b1, b2 = (tg.constant(rng.standard_normal(16, dtype=np.float32)) for _ in range(2))
    x = tg.input("x", (4, 16))
    graph = tg.trace(lambda x: mlp(x, w1, b1, w2, b2), x, name="mlp")
    print(graph)

    cg = graph.compile()
    data = rng.standard_normal((4, 16), dtype=np.float32) * 3
    y, = cg(data)
    want, = graph.reference(data)                  # every operator's numpy reference
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert hard_swish_kernel in cg.kernels         # the hand-written kernel ran
    print(cg.summary())

    proto = export_onnx(graph)                     # through export_hard_swish for the new node
    print(f"exported to ONNX: {len(proto.graph.node)} nodes ({', '.join(n.op_type for n in proto.graph.node)})")


if __name__ == "__main__":
    main()
