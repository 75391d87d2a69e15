"""Export a traced taskdsl Graph as an ONNX model (onnx.helper): one ONNX node, or a few, per graph operator.

    proto = export_onnx(graph)                 # an onnx.ModelProto, checked
    same = taskdsl.graph.from_onnx(proto)      # reads back as the same operators

Constants become initializers; each operator class has one exporter in `EXPORTERS`, which
receives the operator, the names of its inputs and outputs, and the model being built.

    weights = {}
    proto = export_onnx(graph, weights=weights)     # large constants left out, as numpy arrays in `weights`
    session = models.inference.onnxruntime_session(proto, weights)

protobuf copies bytes slowly here (about 230 MB/s: 425 MB took 1.9 s a copy), and building, checking and
handing BERT-base's 440 MB of weights to onnxruntime copied them several times (9 s of a warm 17.5 s
`python -m models run bert`, profiled), so a model exported only to be run by onnxruntime leaves its weights
out: onnxruntime takes them as external initializers, from the arrays.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from taskdsl.graph import Graph, ops
from taskdsl.graph.printer import Namer

OPSET = 20          # Gelu is an operator from 20 on; reductions take their axes as an input from 18
IR_VERSION = 9      # the oldest IR version opset 20 allows, for the widest runtime support


class OnnxExportError(ValueError):
    """A graph holds an operator (or an attribute value) that has no ONNX equivalent here."""


class ModelBuilder:
    """The nodes and initializers of the ONNX graph being written; tensor names come from one Namer."""

    def __init__(self):
        self.nodes: list = []
        self.initializers: dict = {}     # name -> numpy array
        self.names = Namer()

    def name(self, t) -> str:
        """The ONNX name of graph tensor `t` (constants become initializers the first time they are named)."""
        name = self.names(t)
        if t.is_constant and name not in self.initializers:
            self.initializers[name] = np.asarray(t.value)
        return name

    def fresh(self, hint: str) -> str:
        """A tensor name no other tensor of the model has (for initializers and intermediates the export adds)."""
        k = 0
        while f"{hint}_{k}" in self.names.used:
            k += 1
        self.names.used.add(f"{hint}_{k}")
        return f"{hint}_{k}"

    def array(self, value, dtype=np.int64, hint: str = "const") -> str:
        """A new initializer holding `value` (a shape, axes, pads, a bound), by name."""
        name = self.fresh(hint)
        self.initializers[name] = np.asarray(value, dtype=dtype)
        return name

    def add(self, op_type: str, inputs: list, outputs: list, **attrs) -> None:
        """Append one ONNX node."""
        self.nodes.append(helper.make_node(op_type, inputs, outputs, **attrs))


EXPORTERS: dict = {}      # Operator class -> fn(op, inputs, outputs, builder)


def exports(*classes) -> Callable:
    """Register the decorated function as the exporter of these Operator classes."""
    def register(fn):
        for cls in classes:
            EXPORTERS[cls] = fn
        return fn
    return register


def elem_type(dtype) -> int:
    """The ONNX element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


# ---------------------------------------------------------------- elementwise
ELEMENTWISE = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "maximum": "Max",
               "minimum": "Min", "equal": "Equal", "less": "Less", "less_equal": "LessOrEqual", "greater": "Greater",
               "greater_equal": "GreaterOrEqual", "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
               "logical_not": "Not", "neg": "Neg", "abs": "Abs", "relu": "Relu", "sigmoid": "Sigmoid",
               "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "erf": "Erf", "sin": "Sin", "cos": "Cos",
               "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh",
               "acosh": "Acosh", "atanh": "Atanh", "floor": "Floor", "ceil": "Ceil", "reciprocal": "Reciprocal",
               "where": "Where"}
BINARY_ONLY = {"Add": "Sum", "Mul": None}     # ONNX Add / Mul take two operands: more add up with Sum, or chain


@exports(ops.Elementwise)
def export_elementwise(op, ins: list, outs: list, b: ModelBuilder) -> None:
    """An elementwise operator as ONNX nodes (Sum or chained Muls past two operands; rsqrt, silu as two)."""
    fn, params = op.attrs["fn"], op.params
    if fn in ELEMENTWISE:
        op_type = ELEMENTWISE[fn]
        if len(ins) == 1 and op_type in ("Add", "Mul", "Max", "Min"):
            b.add("Identity", ins, outs)
        elif len(ins) > 2 and op_type == "Add":
            b.add("Sum", ins, outs)
        elif len(ins) > 2 and op_type == "Mul":
            acc = ins[0]
            for k, x in enumerate(ins[1:]):
                out = outs[0] if k == len(ins) - 2 else b.fresh(f"{outs[0]}_mul")
                b.add("Mul", [acc, x], [out])
                acc = out
        else:
            b.add(op_type, ins, outs)
    elif fn == "gelu":
        b.add("Gelu", ins, outs, approximate=params.get("approximate", "none"))
    elif fn == "leaky_relu":
        b.add("LeakyRelu", ins, outs, alpha=float(params.get("alpha", 0.01)))
    elif fn in ("rsqrt", "silu"):
        mid = b.fresh(f"{outs[0]}_{fn}")
        b.add("Sqrt" if fn == "rsqrt" else "Sigmoid", ins, [mid])
        b.add("Reciprocal", [mid], outs) if fn == "rsqrt" else b.add("Mul", [ins[0], mid], outs)
    elif fn == "cast":
        b.add("Cast", ins, outs, to=elem_type(op.outputs[0].numpy_dtype))
    elif fn == "clip":
        bounds = list(ins[1:])
        b.add("Clip", [ins[0], bounds.pop(0) if params["has_min"] else "", bounds.pop(0) if params["has_max"] else ""],
              outs)
    else:
        raise OnnxExportError(f"{op.name}: the elementwise function {fn!r} has no ONNX export")


# ---------------------------------------------------------------- anchors and normalizations
@exports(ops.MatMul)
def export_matmul(op, ins, outs, b):
    """MatMul."""
    b.add("MatMul", ins, outs)


def channels_first(op, ins: list, outs: list, b, add_node: Callable) -> None:
    """`add_node(inputs, outputs)`: the ONNX node of `op`, an operator ONNX has for channels-first tensors only;
    for a channels-last `op`, between a transpose of its first input to (N, C, spatial...) and transposes of
    its outputs back."""
    if not op.attrs.get("channels_last"):
        add_node(ins, outs)
        return
    rank = op.inputs[0].ndim
    first = b.fresh(f"{ins[0]}_nchw")
    b.add("Transpose", [ins[0]], [first], perm=[0, rank - 1, *range(1, rank - 1)])
    inner = [b.fresh(f"{out}_nchw") for out in outs]
    add_node([first, *ins[1:]], inner)
    for name, out in zip(inner, outs):
        b.add("Transpose", [name], [out], perm=[0, *range(2, rank), 1])


@exports(ops.Conv)
def export_conv(op, ins, outs, b):
    """Conv (between transposes where the convolution is channels-last)."""
    a = op.attrs
    channels_first(op, ins, outs, b, lambda i, o: b.add(
        "Conv", i, o, kernel_shape=list(op.inputs[1].shape[2:]), strides=list(a["strides"]), pads=list(a["pads"]),
        dilations=list(a["dilations"]), group=a["groups"]))


@exports(ops.Softmax)
def export_softmax(op, ins, outs, b):
    """Softmax or LogSoftmax along the operator's axis."""
    b.add("LogSoftmax" if op.attrs["log"] else "Softmax", ins, outs, axis=op.attrs["axis"])


@exports(ops.LayerNorm)
def export_layer_norm(op, ins, outs, b):
    """LayerNormalization (ones for a missing scale; rms_norm has no ONNX operator)."""
    a, x = op.attrs, op.inputs[0]
    if a.get("rms"):
        raise OnnxExportError(f"{op.name}: rms_norm has no ONNX operator in opset {OPSET}")
    params = list(ins[1:])
    dtype = x.numpy_dtype
    scale = params.pop(0) if a["has_weight"] else b.array(np.ones(x.shape[a["axis"]:]), dtype, "ones")
    bias = [params.pop(0)] if a.get("has_bias") else []
    b.add("LayerNormalization", [ins[0], scale] + bias, outs, axis=a["axis"], epsilon=a["eps"])


@exports(ops.BatchNorm)
def export_batch_norm(op, ins, outs, b):
    """BatchNormalization (ones and zeros for a missing scale and bias)."""
    a, channels = op.attrs, op.inputs[0].shape[1]
    x, mean, var, *params = ins
    dtype = op.inputs[1].numpy_dtype
    scale = params.pop(0) if a["has_weight"] else b.array(np.ones(channels), dtype, "ones")
    bias = params.pop(0) if a["has_bias"] else b.array(np.zeros(channels), dtype, "zeros")
    b.add("BatchNormalization", [x, scale, bias, mean, var], outs, epsilon=a["eps"])


@exports(ops.Pool)
def export_pool(op, ins, outs, b):
    """MaxPool or AveragePool (between transposes where the pool is channels-last)."""
    a = op.attrs
    window = {"kernel_shape": list(a["kernel"]), "strides": list(a["strides"]), "pads": list(a["pads"]),
              "dilations": list(a["dilations"]), "ceil_mode": int(a["ceil_mode"])}
    if a["mode"] == "max":       # indices 2: column-major spatial indices, ONNX's storage_order 1
        window.update({"storage_order": 1} if a.get("indices") == 2 else {})
        channels_first(op, ins, outs, b, lambda i, o: b.add("MaxPool", i, o, **window))
    else:
        channels_first(op, ins, outs, b, lambda i, o: b.add(
            "AveragePool", i, o, count_include_pad=int(a["count_include_pad"]), **window))


@exports(ops.LRN)
def export_lrn(op, ins, outs, b):
    """LRN."""
    a = op.attrs
    b.add("LRN", ins, outs, size=a["size"], alpha=a["alpha"], beta=a["beta"], bias=a["bias"])


@exports(ops.ArgReduce)
def export_arg_reduce(op, ins, outs, b):
    """ArgMax or ArgMin."""
    a = op.attrs
    b.add("ArgMax" if a["op"] == "argmax" else "ArgMin", ins, outs, axis=a["axis"], keepdims=int(a["keepdims"]),
          select_last_index=int(a["select_last_index"]))


REDUCTIONS = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd"}


@exports(ops.Reduce)
def export_reduce(op, ins, outs, b):
    """ReduceSum / Mean / Max / Min / Prod over the operator's axes, given as an input."""
    if op.inputs[0].dtype.is_bool:
        raise OnnxExportError(f"{op.name}: ONNX reductions do not take bool tensors")
    b.add(REDUCTIONS[op.attrs["op"]], [ins[0], b.array(op.attrs["axes"], hint="axes")], outs,
          keepdims=int(op.attrs["keepdims"]))


# ---------------------------------------------------------------- data movement
@exports(ops.Reshape)
def export_reshape(op, ins, outs, b):
    """Reshape to the operator's shape, given as an input."""
    b.add("Reshape", [ins[0], b.array(op.attrs["shape"], hint="shape")], outs)


@exports(ops.Transpose)
def export_transpose(op, ins, outs, b):
    """Transpose."""
    b.add("Transpose", ins, outs, perm=list(op.attrs["perm"]))


@exports(ops.Concat)
def export_concat(op, ins, outs, b):
    """Concat."""
    b.add("Concat", ins, outs, axis=op.attrs["axis"])


@exports(ops.Slice)
def export_slice(op, ins, outs, b):
    """Slice from starts, sizes and steps (an end past index 0 of a negative step: int64's minimum)."""
    a = op.attrs
    lowest = np.iinfo(np.int64).min      # a negative step running past index 0
    ends = [s + n * d if s + n * d >= 0 else lowest for s, n, d in zip(a["starts"], a["sizes"], a["steps"])]
    axes = list(range(len(ends)))
    b.add("Slice", [ins[0], b.array(a["starts"], hint="starts"), b.array(ends, hint="ends"),
                    b.array(axes, hint="axes"), b.array(a["steps"], hint="steps")], outs)


@exports(ops.Gather)
def export_gather(op, ins, outs, b):
    """Gather."""
    b.add("Gather", ins, outs, axis=op.attrs["axis"])


@exports(ops.Expand)
def export_expand(op, ins, outs, b):
    """Expand to the output's shape."""
    b.add("Expand", [ins[0], b.array(op.outputs[0].shape, hint="shape")], outs)


@exports(ops.Pad)
def export_pad(op, ins, outs, b):
    """Pad with the operator's value and mode."""
    value = b.array(op.attrs["value"], op.inputs[0].numpy_dtype, "pad_value")
    b.add("Pad", [ins[0], b.array(op.attrs["pads"], hint="pads"), value], outs, mode=op.attrs["mode"])


# ---------------------------------------------------------------- the model
def _value_info(name: str, t) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type(t.numpy_dtype), list(t.shape))


def export_onnx(graph: Graph, opset: int = OPSET, weights: dict | None = None) -> onnx.ModelProto:
    """`graph` as a checked ONNX ModelProto (OnnxExportError for an operator without an ONNX equivalent).

    With a `weights` dict, each constant of at least EXTERNAL_BYTES (numbers: numpy's own dtypes) goes into it, by
    its initializer's name, and the model holds only a reference to external data for it (`onnxruntime_session`
    passes the arrays to onnxruntime); the rest of the model is checked with those constants as graph inputs."""
    b = ModelBuilder()
    inputs = [_value_info(b.name(t), t) for t in graph.inputs]
    for op in graph.nodes:
        exporter = EXPORTERS.get(type(op))
        if exporter is None:
            raise OnnxExportError(f"{op.name}: operators of type {type(op).__name__} have no ONNX export; "
                                  f"exportable: {', '.join(sorted(c.__name__ for c in EXPORTERS))}")
        exporter(op, [b.name(t) for t in op.inputs], [b.name(t) for t in op.outputs], b)
    outputs, named = [], set()
    for t in graph.outputs:
        name = b.name(t)
        if t.producer is None or name in named:      # an input, a constant or a repeated output: copy it out
            name, source = b.fresh(t.name or "output"), name
            b.add("Identity", [source], [name])
        named.add(name)
        outputs.append(_value_info(name, t))
    apart = {} if weights is None else {name: a for name, a in b.initializers.items() if _stays_apart(a)}
    # built in place: helper.make_graph and make_model copy every initializer (`weights` above)
    model = onnx.ModelProto(ir_version=IR_VERSION, producer_name="taskdsl.models",
                            opset_import=[helper.make_opsetid("", opset)])
    model.graph.name = graph.name
    model.graph.node.extend(b.nodes)
    model.graph.input.extend(inputs + [helper.make_tensor_value_info(name, elem_type(a.dtype), a.shape)
                                       for name, a in apart.items()])
    model.graph.output.extend(outputs)
    for name, a in b.initializers.items():
        if name not in apart:
            _fill_tensor(model.graph.initializer.add(), a, name)
    onnx.checker.check_model(model)
    if apart:       # the constants checked as inputs become initializers whose data is elsewhere
        del model.graph.input[len(inputs):]
        for name, a in apart.items():
            _external_tensor(model.graph.initializer.add(), a, name)
        weights.update(apart)
    return model


EXTERNAL_BYTES = 4096       # constants this large at least stay apart from the model (weights, not shapes or axes)
EXTERNAL_LOCATION = "taskdsl-weights-in-memory"    # the file named by a constant left out: none (onnxruntime_session)


def _stays_apart(a: np.ndarray) -> bool:
    return a.nbytes >= EXTERNAL_BYTES and a.dtype.kind in "fiu" and a.dtype.isnative


def _fill_tensor(t: onnx.TensorProto, a: np.ndarray, name: str) -> None:
    """Set TensorProto `t` (a new element of the model) to array `a`: numbers as raw bytes, one copy of them."""
    if a.dtype.kind in "biuf" and a.dtype.isnative:
        t.name, t.data_type, t.raw_data = name, elem_type(a.dtype), np.ascontiguousarray(a).tobytes()
        t.dims.extend(a.shape)
    else:           # bfloat16, strings, ...: numpy_helper's conversions
        t.CopyFrom(numpy_helper.from_array(a, name))


def _external_tensor(t: onnx.TensorProto, a: np.ndarray, name: str) -> None:
    """Set TensorProto `t` to a reference to external data of `a`'s name, type and shape."""
    t.name, t.data_type, t.data_location = name, elem_type(a.dtype), onnx.TensorProto.EXTERNAL
    t.dims.extend(a.shape)
    for key, value in (("location", EXTERNAL_LOCATION), ("offset", "0"), ("length", str(a.nbytes))):
        t.external_data.add(key=key, value=value)
