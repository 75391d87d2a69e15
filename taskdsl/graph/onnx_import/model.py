"""from_onnx: an ONNX model (a ModelProto, a path, or serialized bytes) as a Graph.

The model is validated (`onnx.checker`), its opset checked, initializers become constants
and graph inputs become graph inputs with static shapes (symbolic dims are fixed with
`shapes=`). Each node goes through its converter (node.CONVERTERS), which builds graph ops;
anything not supported raises UnsupportedOnnxError naming the node, and a malformed model
raises OnnxImportError; no partial graph is ever returned.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import onnx.inliner
from onnx import version_converter

from ..graph import Graph, topological_nodes
from ..tensor import Tensor, as_shape, constant
from ..tensor import input as graph_input
# imported to register their converters
from . import (activations, attention, control_flow, data_dependent, deform_conv, einsum, elementwise,  # noqa: F401
               functions, grid_sample, indexing, layout, loss, lp, microsoft, nn, one_hot, quantize, recurrent,
               resize, roi_align, sequences, shape, spectral)
from .errors import OnnxImportError, UnsupportedOnnxError
from .node import CONVERTERS, DOMAIN_CONVERTERS, Node, dtype_of, imported_constant, kind_of

MIN_OPSET = 11
MAX_OPSET = 28   # 22-28 change the supported operators only by new data types (and attributes for them)
CONVERTED_OPSET = 13     # a model before MIN_OPSET is converted to this one by onnx's version converter
# operators of opsets before MIN_OPSET only, which that conversion replaces (by ScatterElements and Resize)
CONVERTED_OPERATORS = ("Scatter", "Upsample")


def load_model(model_or_path) -> onnx.ModelProto:
    """The ModelProto of a ModelProto, a file path, or serialized bytes (OnnxImportError if unreadable)."""
    if isinstance(model_or_path, onnx.ModelProto):
        return _with_data(model_or_path)
    if not isinstance(model_or_path, (str, os.PathLike, bytes, bytearray)):
        raise TypeError(f"from_onnx takes an onnx.ModelProto, a path or bytes, got {type(model_or_path).__name__}")
    try:
        if isinstance(model_or_path, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(model_or_path))
        else:
            model = onnx.load(os.fspath(model_or_path))
    except Exception as e:   # a missing file, protobuf's DecodeError on corrupt bytes, ...
        raise OnnxImportError(f"cannot read an ONNX model from {str(model_or_path)[:80]!r}: {e}") from e
    if not model.HasField("graph"):     # empty bytes parse as an empty ModelProto
        raise OnnxImportError(f"cannot read an ONNX model from {str(model_or_path)[:80]!r}: it holds no graph "
                              "(an empty or truncated file?)")
    return _with_data(model)


def _with_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, whose initializers hold their data (OnnxImportError for data left in external files: bytes, or a
    ModelProto loaded without it, do not say where they are; onnx's checker would call the model invalid)."""
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise OnnxImportError(f"the model's initializers {external[:3]} are in external data files, which it does "
                              "not locate: pass the model's path, or the ModelProto onnx.load(path) gives")
    return model


def _default_domain_opset(model: onnx.ModelProto) -> int | None:
    """The version of the default ONNX domain the model imports, or None."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return versions[0] if versions else None


def model_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset version (UnsupportedOnnxError outside MIN_OPSET..MAX_OPSET)."""
    opset = _default_domain_opset(model)
    if opset is None:
        raise OnnxImportError("the model imports no version of the default ONNX domain (opset_import)")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedOnnxError(f"opset {opset} is not supported: the importer reads opsets "
                                   f"{MIN_OPSET}-{MAX_OPSET} (and converts older ones); convert the model "
                                   f"with onnx.version_converter.convert_version(model, {MAX_OPSET})")
    return opset


def converted_if_old(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, or where its opset is before MIN_OPSET, the model onnx's version converter makes of it for
    CONVERTED_OPSET (with a warning saying so); UnsupportedOnnxError where the converter cannot."""
    opset = _default_domain_opset(model)
    if opset is None or opset >= MIN_OPSET:
        return model
    if opset < 9 and any(p.op_type == "Scan" for p in model.graph.node):
        # opset 8's Scan has a batch axis and a sequence_lens input, which the converter keeps as they are
        raise UnsupportedOnnxError(f"opset {opset}'s Scan (a batch axis and sequence_lens) is not supported, and "
                                   f"onnx.version_converter does not convert it to opset 9's; export the model at "
                                   f"opset {MIN_OPSET} or later")
    try:
        converted = version_converter.convert_version(model, CONVERTED_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError, ValidationError, ...
        raise UnsupportedOnnxError(
            f"opset {opset} is not supported: the importer reads opsets {MIN_OPSET}-{MAX_OPSET}, and "
            f"onnx.version_converter could not convert the model to opset {CONVERTED_OPSET}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    warnings.warn(f"from_onnx: the model's opset {opset} predates opset {MIN_OPSET}; it was converted to "
                  f"opset {CONVERTED_OPSET} with onnx.version_converter", stacklevel=3)
    _keep_old_resize_semantics(converted)
    return converted


def _keep_old_resize_semantics(converted: onnx.ModelProto) -> None:
    """Give each Resize of a model converted from before opset 11, which onnx's converter made of an Upsample
    (opsets 7-9) or an opset-10 Resize, the semantics those had, which the conversion drops (they would read as
    opset 11's half_pixel defaults): asymmetric coordinates, and their nearest rounding (resize.BEFORE_OPSET_11).
    (Every Resize is one of those: the converter renames the outputs it does not keep as graph outputs.)"""
    for p in converted.graph.node:
        if p.op_type == "Resize":
            kept = [a for a in p.attribute if a.name not in ("coordinate_transformation_mode", "nearest_mode")]
            del p.attribute[:]
            p.attribute.extend(kept + [onnx.helper.make_attribute("coordinate_transformation_mode", "asymmetric"),
                                       onnx.helper.make_attribute("nearest_mode", resize.BEFORE_OPSET_11)])


def _declared_dims(vi: onnx.ValueInfoProto) -> list | None:
    """The input's declared dims (an int, or the name of a symbolic one), or None when it declares no shape."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def _check_declared(vi: onnx.ValueInfoProto, shape: tuple, source: str) -> None:
    """A ValueError where `shape` (given by `source`) contradicts the input's declared rank or fixed dims."""
    declared = _declared_dims(vi)
    if declared is None:
        return
    if len(shape) != len(declared) or any(isinstance(d, int) and d != n for d, n in zip(declared, shape)):
        raise ValueError(f"{source} gives graph input {vi.name!r} shape {shape}, but the model declares "
                         f"{tuple(declared)}")


def _given_shape(vi: onnx.ValueInfoProto, shapes: dict) -> tuple:
    shape = as_shape(shapes[vi.name], f"from_onnx: shapes[{vi.name!r}]")
    _check_declared(vi, shape, "from_onnx: shapes")
    return shape


def _symbolic_dims(graph: onnx.GraphProto, shapes: dict, constants: dict) -> dict:
    """{dim name: size} that `shapes` and `constants` give the inputs' named symbolic dims (ValueError where two
    give one name different sizes), so that an input whose dims are all named by others needs no shape."""
    sizes, where = {}, {}
    for vi in graph.input:
        for what, given in (("shapes", shapes), ("constants", constants)):
            if vi.name not in given:
                continue
            shape = _given_shape(vi, shapes) if what == "shapes" else np.shape(given[vi.name])
            for d, n in zip(_declared_dims(vi) or (), shape):
                if isinstance(d, str) and d != "?":
                    if sizes.setdefault(d, n) != n:
                        raise ValueError(f"from_onnx: the model's dim {d!r} is {sizes[d]} in {where[d]} but {n} in "
                                         f"{what}[{vi.name!r}]; give the inputs that share it the same size")
                    where.setdefault(d, f"{what}[{vi.name!r}]")
    return sizes


def _input_shape(vi: onnx.ValueInfoProto, shapes: dict, named: dict) -> tuple:
    if vi.name in shapes:
        return _given_shape(vi, shapes)
    declared = _declared_dims(vi)
    if declared is None:
        raise UnsupportedOnnxError(f"graph input {vi.name!r} has no shape; give it with "
                                   f"from_onnx(model, shapes={{{vi.name!r}: (...)}})")
    for d in declared:
        if not isinstance(d, int) and d not in named:
            raise UnsupportedOnnxError(
                f"graph input {vi.name!r} has a symbolic dim {d!r}; shapes are static: give them "
                f"with from_onnx(model, shapes={{{vi.name!r}: (...)}}) (or give another input with that dim a shape)")
    return tuple(d if isinstance(d, int) else named[d] for d in declared)


def input_constant(vi: onnx.ValueInfoProto, value, source: str = "from_onnx: constants") -> np.ndarray:
    """The value `source` gives graph input `vi`, as an array of its type: a ValueError where the shape contradicts
    the declared one or the type cannot hold the values exactly (a float for an integer input would be truncated,
    int64's 2**31 for an int32 wrapped)."""
    dtype = dtype_of(vi.type.tensor_type.elem_type, f"graph input {vi.name!r}")
    given = np.asarray(value)
    if not np.can_cast(given.dtype, dtype, casting="same_kind"):
        raise ValueError(f"{source} gives graph input {vi.name!r} values of {given.dtype}, which do not convert to "
                         f"its type {dtype} without loss; pass {dtype} values")
    _check_declared(vi, given.shape, source)
    with np.errstate(over="ignore"):
        value = given.astype(dtype)
    if given.dtype.kind in "biu" and value.dtype.kind in "biu" and not np.array_equal(value, given):
        raise ValueError(f"{source} gives graph input {vi.name!r} values outside the range of its type {dtype} "
                         f"({np.iinfo(value.dtype).min}..{np.iinfo(value.dtype).max})")
    if given.dtype.kind in "biuf" and value.dtype.kind not in "biu" and \
            (np.isinf(value.astype(np.float64)) & np.isfinite(given.astype(np.float64))).any():
        raise ValueError(f"{source} gives graph input {vi.name!r} values past the range of its type {dtype} "
                         f"(they would be infinite); pass values it can hold")
    if given.dtype.kind in "iu" and value.dtype.kind not in "biu" and \
            not np.array_equal(value.astype(np.float64), given.astype(np.float64)):
        raise ValueError(f"{source} gives graph input {vi.name!r} integers its type {dtype} cannot hold exactly "
                         "(they would be rounded); pass values it can hold")
    return value


def _bind_inputs(graph: onnx.GraphProto, env: dict, shapes: dict, constants: dict) -> list:
    inputs = []
    names = [vi.name for vi in graph.input]
    for what, given in (("shapes", shapes), ("constants", constants)):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"from_onnx: {what} names {unknown}, which are not graph inputs ({names})")
    named = _symbolic_dims(graph, shapes, constants)
    for vi in graph.input:
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOnnxError(f"graph input {vi.name!r} is not a tensor ({vi.type.WhichOneof('value')}); "
                                       "only tensor inputs are supported")
        if vi.name in constants:
            env[vi.name] = constant(input_constant(vi, constants[vi.name]), name=vi.name)
        elif vi.name not in env:     # an input with an initializer is a constant with a default: use the default
            dtype = dtype_of(vi.type.tensor_type.elem_type, f"graph input {vi.name!r}")
            env[vi.name] = graph_input(vi.name, _input_shape(vi, shapes, named), dtype)
            inputs.append(env[vi.name])
    return inputs


def _converted(node: Node, converter) -> list:
    """The outputs of `node` by its operator's converter (whose attributes it checks first)."""
    for a in node.proto.attribute:
        if a.name not in converter.attrs:
            accepted = ", ".join(sorted(converter.attrs)) or "none"
            raise node.error(f"attribute {a.name!r} is not supported; supported attributes of {node.op_type}: "
                             f"{accepted}")
    try:
        return converter.fn(node)
    except OnnxImportError:
        raise
    except (ValueError, TypeError, IndexError) as e:    # the graph ops' checks: the model is inconsistent
        raise node.error(str(e), OnnxImportError) from e


def convert_node(proto: onnx.NodeProto, env: dict, opset: int) -> None:
    """Convert one node, adding its outputs to `env` (name -> tensor)."""
    node = Node(proto, env, opset)
    if proto.domain not in ("", "ai.onnx"):
        converters = DOMAIN_CONVERTERS.get(proto.domain)
        if converters is None:
            raise node.error(f"domain {proto.domain!r} is not supported (the default ONNX domain and "
                             f"{', '.join(sorted(DOMAIN_CONVERTERS))} are)")
        if proto.op_type not in converters:
            raise node.error(f"operator {proto.op_type} of domain {proto.domain!r} is not supported; supported "
                             f"operators of {proto.domain}: {', '.join(sorted(converters))}")
        converter = converters[proto.op_type]
    else:
        converter = CONVERTERS.get(proto.op_type)
    if converter is None:
        body = functions.function_body(node)
        if body is None:
            raise node.error(f"operator {proto.op_type} is not supported; supported operators: "
                             f"{', '.join(sorted({*CONVERTERS, *functions.EXPANDED_OPERATORS}))}")
        outputs = functions.import_function(node, body)
    else:
        outputs = _converted(node, converter)
    for k, name in enumerate(proto.output):
        if not name:
            continue
        t = outputs[k] if k < len(outputs) else None
        if t is None:
            raise node.error(f"output {k} ({name!r}) is not supported")
        if name in env:
            raise node.error(f"output {name!r} is already defined earlier in the graph", OnnxImportError)
        if isinstance(t, Tensor):
            t.name = t.name or name
        env[name] = t


def _check_output(vi: onnx.ValueInfoProto, t) -> None:
    declared = vi.type.tensor_type
    if vi.type.WhichOneof("value") is None:     # declared without a type (onnxruntime runs it): nothing to check
        return
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedOnnxError(f"graph output {vi.name!r} is not a tensor; only tensor outputs are supported")
    if declared.elem_type and dtype_of(declared.elem_type, f"graph output {vi.name!r}") != str(t.numpy_dtype):
        raise OnnxImportError(f"graph output {vi.name!r} is declared "
                              f"{onnx.TensorProto.DataType.Name(declared.elem_type)} but computes {t.dtype.name}")
    if not declared.HasField("shape"):
        return
    # as onnxruntime: a warning, and the computed shape (exporters' shape inference can be wrong: onnx's gives a
    # ceil-mode MaxPool of 5x5 by 2 with pads of 1 a 4x4 output, where the spec, onnxruntime and taskdsl give 3x3)
    shape = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in declared.shape.dim)
    if len(shape) != len(t.shape) or any(isinstance(d, int) and d != n for d, n in zip(shape, t.shape)):
        warnings.warn(f"graph output {vi.name!r} is declared with shape {shape} but has shape {t.shape}; the "
                      "computed shape is used", stacklevel=3)


def _shapeless(values) -> list:
    """The value infos of `values` declared without a shape (tensors), or without a type."""
    return [vi for vi in values if vi.type.WhichOneof("value") in (None, "tensor_type")
            and not vi.type.tensor_type.HasField("shape")]


def _check(model: onnx.ModelProto, what: str = "the model") -> None:
    """onnx's checker on the model (OnnxImportError with its whole message). Graph inputs and outputs declared
    without a shape, and outputs without a type, which the checker refuses and onnxruntime runs, are checked with
    what onnx infers for them (an input's shape then comes from `shapes=`)."""
    try:
        onnx.checker.check_model(model)
        return
    except onnx.checker.ValidationError as e:
        error = e
    shapeless = [vi.name for vi in _shapeless(model.graph.input) + _shapeless(model.graph.output)]
    if shapeless:
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
            for vi in _shapeless(inferred.graph.input) + _shapeless(inferred.graph.output):
                if vi.type.HasField("tensor_type"):         # one onnx cannot tell (ReduceSum's axes read from an
                    vi.type.tensor_type.shape.SetInParent()  # input): taskdsl computes it (a stand-in for the check)
            onnx.checker.check_model(inferred)
            return
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            error = e
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    named = f" (inputs and outputs declared without a shape or type: {', '.join(shapeless)})" if shapeless else ""
    raise OnnxImportError(f"{what} is not valid ONNX: {message}{named}") from error


WEIGHT_BYTES = 4096     # initializers this large at least are checked as graph inputs (their data by to_array)


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose initializers of WEIGHT_BYTES or more are graph inputs of their type and shape: what
    onnx's checker checks without the weights' data, which it would serialize at some 200 MB/s (to_array reads and
    checks that data)."""
    light = onnx.ModelProto()
    _copy_fields(light, model, skip="graph")
    _copy_fields(light.graph, model.graph, skip="initializer")
    declared = {vi.name for vi in model.graph.input}
    for init in model.graph.initializer:
        if init.ByteSize() < WEIGHT_BYTES:
            light.graph.initializer.add().CopyFrom(init)
        elif init.name not in declared:     # (IR version 3 declares every initializer an input)
            light.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    return light


def _copy_fields(target, source, skip: str) -> None:
    """Copy every field set in protobuf message `source` but `skip` into the empty message `target`."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if hasattr(value, "CopyFrom"):          # a message
            getattr(target, field.name).CopyFrom(value)
        elif isinstance(value, (str, bytes, int, float)):
            setattr(target, field.name, value)
        else:                                   # a repeated field
            getattr(target, field.name).extend(value)


def from_onnx(model_or_path, shapes: dict | None = None, constants: dict | None = None) -> Graph:
    """The Graph of an ONNX model; `shapes` fixes input shapes, `constants` fixes input values (e.g. shape inputs)."""
    original = load_model(model_or_path)
    if original.functions:      # the model's own functions (onnxscript's, torch's exporter's): their bodies inlined
        original = onnx.inliner.inline_local_functions(original)
    model = converted_if_old(original)
    opset = model_opset(model)
    if model is original:
        _check(_weights_as_inputs(model))
    else:       # the user's model first: what its conversion breaks is onnx.version_converter's doing
        _check(_weights_as_inputs(original))
        _check(_weights_as_inputs(model),
               f"the model is valid ONNX, but onnx.version_converter's conversion of it from opset "
               f"{_default_domain_opset(original)} to {opset} (the importer reads opsets "
               f"{MIN_OPSET}-{MAX_OPSET}; export the model at one of them to avoid it)")
    graph = model.graph
    if graph.sparse_initializer:
        raise UnsupportedOnnxError("sparse initializers are not supported")
    env = {init.name: imported_constant(init, f"initializer {init.name!r}", init.name) for init in graph.initializer}
    inputs = _bind_inputs(graph, env, dict(shapes or {}), dict(constants or {}))
    for proto in graph.node:
        try:
            convert_node(proto, env, opset)
        except UnsupportedOnnxError as e:
            if model is original or type(e) is not UnsupportedOnnxError:
                raise
            converted = (f"the model's opset {_default_domain_opset(original)} was converted to {opset} by "
                         "onnx.version_converter")
            unknown = next((p for p in original.graph.node if p.op_type not in CONVERTERS), None)
            if unknown is not None:     # named as the user's model has it (an Upsample became a Resize)
                raise UnsupportedOnnxError(f"node {unknown.name or unknown.output[0]!r} ({unknown.op_type}): operator "
                                           f"{unknown.op_type} is not supported ({converted}, where it failed as: "
                                           f"{e})") from e
            raise UnsupportedOnnxError(f"{e} ({converted}, which may have replaced its operators)") from e
    outputs = []
    for vi in graph.output:
        if vi.name not in env:
            raise OnnxImportError(f"graph output {vi.name!r} is not produced by any node, initializer or input")
        if not isinstance(env[vi.name], Tensor):
            raise UnsupportedOnnxError(f"graph output {vi.name!r} is a {kind_of(env[vi.name])}; only tensor outputs "
                                       "are supported")
        _check_output(vi, env[vi.name])
        outputs.append(env[vi.name])
    producers = [t.producer for t in env.values() if isinstance(t, Tensor) and t.producer is not None]
    return Graph(inputs, outputs, topological_nodes(outputs, producers), name=graph.name or "onnx_model")
