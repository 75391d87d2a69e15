"""Random ONNX models: hypothesis writes graphs of the operators the zoo uses, onnxruntime is the oracle.

Each example is one model (opset 19) over one or two inputs of rank 1 to 4 (sizes 1, odd
and prime), float32 or, in two models of five, int64 or int32. Up to twelve nodes each read
earlier values: elementwise operators with broadcasting (against constants and other
values), `Where` over a comparison, transposes, reshapes (with `0` and `-1`), slices
(negative steps too), squeezes, gathers (negative indices), concats, expands, reductions over
any axes with and without `keepdims`, softmax, layer normalization, matmuls (with a constant,
with batch broadcasting, and of a value with its own transpose), `Gemm`, convolutions
(groups, strides, dilations, padding), pooling, batch norm, `Pad` (all four modes) and
`Split`; integer models use the operators that apply to integers, with `Mul` only by a
constant so values stay small. One to three of the values are outputs. The model goes
through `from_onnx`, the graph passes (constant folding, fusion around anchors, memory
planning) and the cpu executor, so what this checks most is fusion: which producers become
prologues and epilogues of which kernels, through which index rewrites. No shrinking: a
failure prints the whole model and its kernels.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from onnx import helper

import taskdsl.graph as tg

from . import assert_close, make_model, run_onnxruntime

pytest.importorskip("onnxruntime")

OPSET = 19                   # Pad mode "wrap" is new in opset 19
DIMS = st.sampled_from([1, 2, 3, 5, 7])
# (continuous ones: a value a rounding away from Sign's, Round's or Shrink's step would flip the result)
UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Erf", "Sin", "Cos", "LeakyRelu", "Clip", "Sqrt", "Elu", "Selu",
         "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "PRelu"]
INTEGER_UNARY = ["Abs", "Neg", "Sign"]
ATTRIBUTES = {"LeakyRelu": {"alpha": 0.125}, "Elu": {"alpha": 0.5}, "Celu": {"alpha": 2.0},
              "HardSigmoid": {"alpha": 0.25, "beta": 0.375}}
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2"]


class ModelWriter:
    """Draws an ONNX graph node by node; `values` holds (name, shape) of everything computed so far."""

    def __init__(self, data, dtype):
        self.draw, self.dtype, self.integer = data.draw, dtype, np.dtype(dtype).kind == "i"
        self.nodes, self.constants, self.values, self.inputs = [], {}, [], []
        self.rng = np.random.default_rng(self.draw(st.integers(0, 2**16), label="constants seed"))
        self.operators = INTEGER_OPERATORS if self.integer else OPERATORS

    # ------------------------------------------------------------------ plumbing
    def fresh(self, stem: str) -> str:
        return f"{stem}{len(self.nodes) + len(self.constants) + len(self.inputs)}"

    def constant(self, array) -> str:
        name = self.fresh("c")
        self.constants[name] = np.asarray(array)
        return name

    def weights(self, shape, low=-1.0, high=1.0) -> str:
        """Random constants of the model's type (integers in [1, 3] or [-3, 3] in integer models)."""
        if self.integer:
            return self.constant(self.rng.integers(1 if low > 0 else -3, 4, shape).astype(self.dtype))
        return self.constant(self.rng.uniform(low, high, shape).astype(np.float32))

    def scalar(self, value) -> str:
        return self.constant(np.asarray(value).astype(self.dtype))

    def emit(self, op: str, inputs: list, shape, hidden=False, **attributes) -> tuple:
        """Add a node; its result joins `values` unless `hidden` (booleans, rank 0: only for the caller)."""
        name = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [name], **attributes))
        if not hidden:
            self.values.append((name, tuple(shape)))
        return name, tuple(shape)

    def shape(self) -> tuple:
        rank = self.draw(st.sampled_from([1, 2, 3, 4, 4]))       # rank 4 for convolutions and pooling
        return tuple(self.draw(DIMS) for _ in range(rank))

    def input(self, shape) -> tuple:
        name = f"x{len(self.inputs)}"
        self.inputs.append((name, list(shape)))
        self.values.append((name, tuple(shape)))
        return name, tuple(shape)

    def pick(self, accept=lambda shape: True):
        candidates = [v for v in self.values if accept(v[1])]
        return self.draw(st.sampled_from(candidates)) if candidates else None

    def axis(self, rank: int) -> int:
        return self.draw(st.integers(-rank, rank - 1))

    # ------------------------------------------------------------------ operators
    def unary(self, a):
        op = self.draw(st.sampled_from(INTEGER_UNARY if self.integer else UNARY))
        if op == "Clip":
            low = self.draw(st.floats(-1, 0, width=32))
            return self.emit(op, [a[0], self.constant(np.float32(low)), self.constant(np.float32(low + 1))], a[1])
        if op == "Sqrt":        # of |a|: no NaNs
            return self.emit(op, [self.emit("Abs", [a[0]], a[1])[0]], a[1])
        if op == "PRelu":      # a slope per element of the last axis
            return self.emit(op, [a[0], self.weights(a[1][-1:], 0.1, 0.5)], a[1])
        return self.emit(op, [a[0]], a[1], **ATTRIBUTES.get(op, {}))

    def broadcast_partner(self, shape, constant=False) -> tuple:
        """A constant or an earlier value whose shape broadcasts with `shape`."""
        partner = None if constant else self.pick(lambda s: _broadcasts(s, shape))
        if partner is not None and self.draw(st.booleans()):
            return partner[0], partner[1]
        drop = self.draw(st.integers(0, len(shape)))
        # each dimension: the same, 1 (broadcast over it), or any size where `shape` has 1
        dims = [self.draw(DIMS if d == 1 else st.sampled_from([d, 1])) for d in shape[drop:]]
        return self.weights(dims, 0.5, 2.0), tuple(dims)

    def binary(self, a):
        op = self.draw(st.sampled_from(BINARY))
        b_name, b_shape = self.broadcast_partner(a[1], constant=self.integer and op == "Mul")   # integers stay small
        if op == "Div":          # divide by 1 + |b| (integers: truncating, as ONNX divides them)
            magnitude = self.emit("Abs", [b_name], b_shape, hidden=True)[0]
            b_name = self.emit("Add", [magnitude, self.scalar(1)], b_shape, hidden=True)[0]
        # an integer Div keeps the safe divisor second (onnxruntime fails on an integer division by zero)
        in_order = self.draw(st.booleans()) or (self.integer and op == "Div")
        operands = [a[0], b_name] if in_order else [b_name, a[0]]
        return self.emit(op, operands, np.broadcast_shapes(a[1], b_shape))

    def where(self, a):
        b_name, b_shape = self.broadcast_partner(a[1])
        compare = self.draw(st.sampled_from(["Greater", "Less", "GreaterOrEqual"]))
        condition = self.emit(compare, [a[0], b_name], np.broadcast_shapes(a[1], b_shape), hidden=True)
        other = self.broadcast_partner(condition[1])
        return self.emit("Where", [condition[0], b_name, other[0]],
                         np.broadcast_shapes(condition[1], b_shape, other[1]))

    def transpose(self, a):
        perm = self.draw(st.permutations(range(len(a[1]))))
        return self.emit("Transpose", [a[0]], [a[1][p] for p in perm], perm=list(perm))

    def reshape(self, a):
        shape = list(a[1])
        kind = self.draw(st.sampled_from(["flatten", "merge", "split", "unit"]))
        if kind == "merge" and len(shape) > 1:
            i = self.draw(st.integers(0, len(shape) - 2))
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        elif kind == "split" and len(shape) < 4:
            i = self.draw(st.integers(0, len(shape) - 1))
            shape[i:i + 1] = [1, shape[i]] if self.draw(st.booleans()) else [shape[i], 1]
        elif kind == "unit" and len(shape) < 4:
            shape.insert(self.draw(st.integers(0, len(shape))), 1)
        else:
            shape = [math.prod(shape)]
        target = list(shape)
        if self.draw(st.booleans()):
            target[self.draw(st.integers(0, len(target) - 1))] = -1
        keep = [i for i, d in enumerate(target) if i < len(a[1]) and d == a[1][i] and d != -1]
        if keep and self.draw(st.booleans()):
            target[self.draw(st.sampled_from(keep))] = 0           # 0: copy the input's dimension
        return self.emit("Reshape", [a[0], self.constant(np.array(target, np.int64))], shape)

    def slice(self, a):
        axis = self.draw(st.integers(0, len(a[1]) - 1))
        n = a[1][axis]
        step = self.draw(st.sampled_from([1, 1, 2, -1, -2]))
        start = self.draw(st.integers(0, n - 1))
        end = self.draw(st.integers(start + 1, n + 2) if step > 0 else st.integers(-n - 3, start - 1 - n))
        shape = list(a[1])
        shape[axis] = len(range(n)[start:end:step])
        starts, ends = [start - n if self.draw(st.booleans()) else start], [end]
        return self.emit("Slice", [a[0], self.constant(np.array(starts, np.int64)), self.constant(np.array(ends, np.int64)),
                                   self.constant(np.array([axis - len(a[1])], np.int64)),
                                   self.constant(np.array([step], np.int64))], shape)

    def squeeze(self, a):
        ones = [i for i, d in enumerate(a[1]) if d == 1]
        if ones and len(a[1]) > 1 and self.draw(st.booleans()):
            axes = self.draw(st.lists(st.sampled_from(ones), min_size=1, max_size=len(a[1]) - 1, unique=True))
            shape = [d for i, d in enumerate(a[1]) if i not in axes]
            return self.emit("Squeeze", [a[0], self.constant(np.array(axes, np.int64))], shape)
        if len(a[1]) == 4:
            return self.unary(a)
        at = self.draw(st.integers(0, len(a[1])))
        return self.emit("Unsqueeze", [a[0], self.constant(np.array([at], np.int64))], a[1][:at] + (1,) + a[1][at:])

    def gather(self, a):
        axis = self.axis(len(a[1]))
        n = a[1][axis]
        index_shape = self.draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
        if len(a[1]) + len(index_shape) - 1 > 4:
            index_shape = ()
        if len(a[1]) + len(index_shape) == 1:
            index_shape = (1,)              # no rank-0 values
        indices = self.rng.integers(-n, n, index_shape).astype(np.int64)
        shape = a[1][:axis % len(a[1])] + index_shape + a[1][axis % len(a[1]) + 1:]
        return self.emit("Gather", [a[0], self.constant(indices)], shape, axis=axis)

    def concat(self, a):
        axis = self.draw(st.integers(0, len(a[1]) - 1))
        same = self.pick(lambda s: len(s) == len(a[1]) and all(x == y for i, (x, y) in enumerate(zip(s, a[1])) if i != axis))
        shape = list(a[1])
        shape[axis] += same[1][axis]
        return self.emit("Concat", [a[0], same[0]], shape, axis=axis - len(shape) * self.draw(st.integers(0, 1)))

    def expand(self, a):
        target = [self.draw(DIMS) if d == 1 else d for d in a[1]]
        if len(target) < 4 and self.draw(st.booleans()):
            target.insert(0, self.draw(DIMS))
        given_shape = [1 if d == a[1][i - len(target) + len(a[1])] and self.draw(st.booleans()) else d
                       for i, d in enumerate(target) if i >= len(target) - len(a[1])]
        given_shape = target[:len(target) - len(a[1])] + given_shape       # 1 where the input keeps its size
        return self.emit("Expand", [a[0], self.constant(np.array(given_shape, np.int64))], target)

    def reduce(self, a):
        op = self.draw(st.sampled_from(["ReduceSum", "ReduceMax", "ReduceMin"] if self.integer else REDUCE))
        rank = len(a[1])
        axes = self.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        keepdims = self.draw(st.booleans())
        if not keepdims and len(axes) == rank:
            keepdims = True                           # keep a rank >= 1 result
        shape = [1 if i in axes else d for i, d in enumerate(a[1]) if keepdims or i not in axes]
        signed = [x - rank if self.draw(st.booleans()) else x for x in axes]
        return self.emit(op, [a[0], self.constant(np.array(signed, np.int64))], shape, keepdims=int(keepdims))

    def softmax(self, a):
        op = self.draw(st.sampled_from(["Softmax", "LogSoftmax"]))
        return self.emit(op, [a[0]], a[1], axis=self.axis(len(a[1])))

    def layer_norm(self, a):
        axis = self.axis(len(a[1]))
        normalized = a[1][axis % len(a[1]):]
        return self.emit("LayerNormalization", [a[0], self.weights(normalized, 0.5, 1.5), self.weights(normalized, -0.5, 0.5)],
                         a[1], axis=axis, epsilon=1e-5)

    def matmul(self, a):
        if len(a[1]) >= 2 and self.draw(st.booleans()):   # a @ a^T over the last two axes
            perm = list(range(len(a[1]) - 2)) + [len(a[1]) - 1, len(a[1]) - 2]
            transposed = self.emit("Transpose", [a[0]], [a[1][p] for p in perm], perm=perm)
            operands = [a[0], transposed[0]] if self.draw(st.booleans()) else [transposed[0], a[0]]
            m = a[1][-2] if operands[0] == a[0] else a[1][-1]
            return self.emit("MatMul", operands, a[1][:-2] + (m, m))
        n = self.draw(DIMS)
        weight = self.weights((a[1][-1], n), -0.5, 0.5)
        return self.emit("MatMul", [a[0], weight], a[1][:-1] + (n,))


    def gemm(self, a):
        if len(a[1]) != 2:
            return self.matmul(a)
        trans_a, trans_b = self.draw(st.booleans()), self.draw(st.booleans())
        m, k = a[1][::-1] if trans_a else a[1]
        n = self.draw(DIMS)
        inputs = [a[0], self.weights((n, k) if trans_b else (k, n), -0.5, 0.5)]
        bias = self.draw(st.sampled_from([None, (n,), (m, 1), (1, n), (m, n)]))
        if bias is not None:
            inputs.append(self.weights(bias))
        return self.emit("Gemm", inputs, (m, n), transA=int(trans_a), transB=int(trans_b),
                         alpha=self.draw(st.sampled_from([1.0, 0.5])), beta=self.draw(st.sampled_from([1.0, 2.0])))

    def batch_matmul(self, a):
        """a @ w with a constant w whose batch dimensions broadcast against a's."""
        if len(a[1]) < 2:
            return self.matmul(a)
        batch = [self.draw(st.sampled_from([d, 1])) for d in a[1][:-2]]
        if len(a[1]) < 4 and self.draw(st.booleans()):
            batch.insert(0, self.draw(DIMS))
        n = self.draw(DIMS)
        shape = tuple(np.broadcast_shapes(a[1][:-2], tuple(batch))) + (a[1][-2], n)
        return self.emit("MatMul", [a[0], self.weights((*batch, a[1][-1], n), -0.5, 0.5)], shape)

    def conv(self, a):
        if len(a[1]) != 4:
            return self.unary(a)
        batch, channels, height, width = a[1]
        groups = self.draw(st.sampled_from(sorted({1, channels})))
        out_channels = groups * self.draw(st.integers(1, 3))
        kernel = [self.draw(st.integers(1, 3)) for _ in range(2)]
        strides, dilations = [self.draw(st.integers(1, 2)) for _ in range(2)], [self.draw(st.integers(1, 2)) for _ in range(2)]
        pads = [self.draw(st.integers(0, k - 1)) for k in kernel * 2]
        out = [(size + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
               for i, size in enumerate((height, width))]
        if min(out) < 1:
            return self.unary(a)
        inputs = [a[0], self.weights((out_channels, channels // groups, *kernel), -0.5, 0.5)]
        if self.draw(st.booleans()):
            inputs.append(self.weights((out_channels,)))
        return self.emit("Conv", inputs, (batch, out_channels, *out), kernel_shape=kernel, strides=strides,
                         pads=pads, dilations=dilations, group=groups)

    def pool(self, a):
        if len(a[1]) != 4:
            return self.unary(a)
        op = self.draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
        if op.startswith("Global"):
            return self.emit(op, [a[0]], a[1][:2] + (1, 1))
        kernel = [self.draw(st.integers(1, min(3, size))) for size in a[1][2:]]
        strides = [self.draw(st.integers(1, 2)) for _ in range(2)]
        pads = [self.draw(st.integers(0, k - 1)) for k in kernel * 2]
        out = [(size + pads[i] + pads[i + 2] - kernel[i]) // strides[i] + 1 for i, size in enumerate(a[1][2:])]
        attributes = {"count_include_pad": int(self.draw(st.booleans()))} if op == "AveragePool" else {}
        return self.emit(op, [a[0]], a[1][:2] + tuple(out), kernel_shape=kernel, strides=strides, pads=pads,
                         **attributes)

    def batch_norm(self, a):
        if len(a[1]) < 2:
            return self.unary(a)
        c = (a[1][1],)
        return self.emit("BatchNormalization", [a[0], self.weights(c, 0.5, 1.5), self.weights(c), self.weights(c),
                                                self.weights(c, 0.5, 2.0)], a[1], epsilon=1e-5)

    def pad(self, a):
        mode = self.draw(st.sampled_from(["constant", "edge", "reflect", "wrap"]))
        pads = [self.draw(st.integers(0, min(2, d - 1) if mode == "reflect" else 2)) for d in a[1] * 2]
        rank = len(a[1])
        shape = [d + pads[i] + pads[i + rank] for i, d in enumerate(a[1])]
        inputs = [a[0], self.constant(np.array(pads, np.int64))]
        if mode == "constant" and self.draw(st.booleans()):
            inputs.append(self.scalar(2 if self.integer else 0.5))
        return self.emit("Pad", inputs, shape, mode=mode)

    def split(self, a):
        axis = self.draw(st.integers(0, len(a[1]) - 1))
        if a[1][axis] < 2:
            return self.slice(a)
        first = self.draw(st.integers(1, a[1][axis] - 1))
        names = [self.fresh("split"), self.fresh("split") + "b"]
        self.nodes.append(helper.make_node("Split", [a[0], self.constant(np.array([first, a[1][axis] - first], np.int64))],
                                           names, axis=axis))
        for name, size in zip(names, (first, a[1][axis] - first)):
            self.values.append((name, a[1][:axis] + (size,) + a[1][axis + 1:]))
        return self.values[-1]

    def exp_or_pow(self, a):
        bounded = self.emit("Tanh", [a[0]], a[1])
        if self.draw(st.booleans()):
            return self.emit("Exp", [bounded[0]], a[1])
        return self.emit("Pow", [bounded[0], self.constant(np.float32(self.draw(st.sampled_from([2.0, 3.0]))))], a[1])


OPERATORS = ["unary", "binary", "where", "transpose", "reshape", "slice", "squeeze", "gather", "concat", "expand",
             "reduce", "softmax", "layer_norm", "matmul", "gemm", "batch_matmul", "conv", "pool", "batch_norm", "pad",
             "split", "exp_or_pow"]
INTEGER_OPERATORS = ["unary", "binary", "where", "transpose", "reshape", "slice", "squeeze", "gather", "concat",
                     "expand", "reduce", "pad", "split"]


def _broadcasts(a: tuple, b: tuple) -> bool:
    try:
        return len(np.broadcast_shapes(a, b)) <= 4
    except ValueError:
        return False


def write_model(data):
    """A random model and the arrays to feed it."""
    dtype = data.draw(st.sampled_from([np.float32] * 3 + [np.int64, np.int32]), label="dtype")
    writer = ModelWriter(data, dtype)
    first = writer.input(writer.shape())
    if data.draw(st.booleans(), label="second input"):
        writer.input(tuple(1 if data.draw(st.booleans()) else d for d in first[1]))
    for _ in range(data.draw(st.integers(1, 12), label="nodes")):
        a = writer.pick()
        getattr(writer, data.draw(st.sampled_from(writer.operators), label="operator"))(a)
    computed = [v for v in writer.values if v[0] not in dict(writer.inputs)]
    extra = data.draw(st.lists(st.sampled_from(computed), max_size=2, unique=True), label="more outputs")
    outputs = [computed[-1]] + [v for v in extra if v != computed[-1]]
    element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model(writer.nodes, [(name, shape, element) for name, shape in writer.inputs],
                       [(name, list(shape), element) for name, shape in outputs], writer.constants, opset=OPSET,
                       name="random")
    if writer.integer:
        feeds = {name: writer.rng.integers(-20, 21, shape).astype(dtype) for name, shape in writer.inputs}
    else:
        feeds = {name: writer.rng.uniform(-2, 2, shape).astype(dtype) for name, shape in writer.inputs}
    return model, feeds


@settings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_onnx_models_match_onnxruntime(data):
    model, feeds = write_model(data)
    expected = run_onnxruntime(model, feeds)
    compiled = tg.from_onnx(model).compile(target="cpu")
    got = compiled(feeds)
    for k, (g, want) in enumerate(zip(got, expected)):
        try:
            assert_close(g, want, rtol=1e-4, atol=1e-5)
        except AssertionError as error:
            nodes = "\n".join(f"  {n.output[0]} = {n.op_type}({', '.join(n.input)}) "
                              f"{ {a.name: helper.get_attribute_value(a) for a in n.attribute} }" for n in model.graph.node)
            raise AssertionError(f"output {k} ({model.graph.output[k].name}) differs; the model:\n{nodes}\n"
                                 f"kernels:\n{compiled.summary()}\n{error}") from None
