"""ONNX import errors: unsupported operators, attributes, types and opsets are named clearly; malformed models
raise OnnxImportError (a ValueError), never a crash or a partial graph; inputs that fix shapes can be given."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import taskdsl.graph as tg
from taskdsl.graph import OnnxImportError, UnsupportedOnnxError
from taskdsl.graph.onnx_import import ConstantRequiredError
from taskdsl.graph.onnx_import.node import CONVERTERS

from . import make_model, rand

n = helper.make_node


def test_unsupported_operator_names_node_op_and_alternatives():
    model = make_model([n("Relu", ["x"], ["r"]), n("Bernoulli", ["r"], ["y"], name="my_coin")], [("x", [3])],
                       [("y", [3])], opset=15)
    with pytest.raises(UnsupportedOnnxError) as info:
        tg.from_onnx(model)
    message = str(info.value)
    assert "node 'my_coin' (Bernoulli): operator Bernoulli is not supported" in message
    assert "supported operators:" in message and "Conv" in message and "SwiGLU" in message     # (a function body)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("node, inputs, what", [
    (n("Pad", ["x", "pads"], ["y"], mode="symmetric"), {"pads": np.array([1, 1], np.int64)}, "mode='symmetric'"),
    (n("LayerNormalization", ["x", "s"], ["y"], stash_type=0), {"s": np.ones(3, np.float32)}, "stash_type=0"),
    (n("Gelu", ["x"], ["y"], approximate="erf"), {}, "approximate='erf'"),
    (n("Dropout", ["x", "ratio", "training"], ["y"]), {"ratio": np.array(0.5, np.float32), "training": np.array(True)},
     "random dropout"),
])
def test_unsupported_attribute_values(node, inputs, what):
    opset = 20 if node.op_type == "Gelu" else 17
    model = make_model([node], [("x", [3])], [("y", [3])], inputs, opset=opset)
    with pytest.raises(UnsupportedOnnxError, match=f"\\({node.op_type}\\): .*{what}"):
        tg.from_onnx(model)


@pytest.mark.parametrize("op_type, attr, out_shape", [("ReduceSum", "keepdims", [1, 1]), ("Gemm", "transB", [2, 2]),
                                                      ("MaxPool", "ceil_mode", [1, 1, 2, 2]),
                                                      ("Reshape", "allowzero", [4])])
def test_flag_attributes_must_be_0_or_1(op_type, attr, out_shape):
    """onnxruntime reads keepdims=2 as 1 but ceil_mode=-1 as 0: a value that is neither is refused, not guessed."""
    inputs = {"Gemm": ["x", "x"], "Reshape": ["x", "shape"]}.get(op_type, ["x"])
    extra = {"MaxPool": {"kernel_shape": [1, 1]}}.get(op_type, {})
    node = n(op_type, inputs, ["y"], **{attr: 2}, **extra)
    model = make_model([node], [("x", [1, 1, 2, 2] if op_type == "MaxPool" else [2, 2])], [("y", out_shape)],
                       {"shape": np.array([4], np.int64)})
    with pytest.raises(OnnxImportError, match=f"\\({op_type}\\): attribute '{attr}' must be 0 or 1, got 2"):
        tg.from_onnx(model)


def test_unsupported_dtype_and_opset():
    with pytest.raises(UnsupportedOnnxError, match="data type FLOAT8E4M3FNUZ is not supported"):
        tg.from_onnx(make_model([n("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
                                [("x", [2], TensorProto.FLOAT8E4M3FNUZ)], [("y", [2])]))
    with pytest.raises(UnsupportedOnnxError, match="opset 29 is not supported.*version_converter"):
        tg.from_onnx(unchecked_model(n("Relu", ["x"], ["y"]), opset=29))


def unchecked_model(node, opset: int):
    """A one-node model over a float vector x -> y, not run through onnx's checker (which would refuse it)."""
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_models_before_opset_11_are_converted(monkeypatch):
    """An opset-9 model goes through onnx's version converter (with a warning) and computes what it says; a model
    the converter cannot take is refused with the converter's reason."""
    with pytest.warns(UserWarning, match="opset 9 predates opset 11; it was converted to opset 13"):
        g = tg.from_onnx(make_model([n("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])], opset=9))
    x = np.array([[-1.5, 2.0, 0.0], [3.0, -0.25, 1.0]], np.float32)
    np.testing.assert_array_equal(g(x)[0], np.maximum(x, 0))
    with pytest.raises(UnsupportedOnnxError, match="opset 9 is not supported.*could not convert"):
        tg.from_onnx(unchecked_model(n("NoSuchOp", ["x"], ["y"]), opset=9))
    scatter = make_model([n("Scatter", ["x", "i", "u"], ["y"], axis=0)],
                         [("x", [3, 3]), ("i", [1, 3], TensorProto.INT64), ("u", [1, 3])], [("y", [3, 3])], opset=9)
    scatter.graph.node[0].name = "sc1"
    with pytest.warns(UserWarning):
        g = tg.from_onnx(scatter)      # (a ScatterElements after the conversion)
    x, u = np.zeros((3, 3), np.float32), np.array([[1, 2, 3]], np.float32)
    np.testing.assert_array_equal(g(x, np.array([[2, 0, 1]], np.int64), u)[0], [[0, 2, 0], [0, 0, 3], [1, 0, 0]])
    # the converter made its Scatter a ScatterElements, and dropped its name: the message named a node and an
    # operator the model does not have (ScatterElements taken out of the converters to see it)
    monkeypatch.delitem(CONVERTERS, "ScatterElements")
    with pytest.warns(UserWarning), pytest.raises(UnsupportedOnnxError, match=r"^node 'sc1' \(Scatter\): operator "
                                                  r"Scatter is not supported \(the model's opset 9 was converted to "
                                                  r"13 by onnx.version_converter, where .*ScatterElements is not "
                                                  r"supported"):
        tg.from_onnx(scatter)


def test_malformed_models():
    good = make_model([n("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    data = good.SerializeToString()
    with pytest.raises(OnnxImportError, match="cannot read"):
        tg.from_onnx(data[: len(data) // 2])                       # truncated bytes
    with pytest.raises(OnnxImportError, match="cannot read"):
        tg.from_onnx("/nonexistent/model.onnx")
    with pytest.raises(TypeError, match="ModelProto, a path or bytes"):
        tg.from_onnx(42)
    with pytest.raises(OnnxImportError, match="holds no graph"):
        tg.from_onnx(b"")                                          # an empty file's bytes
    undefined = helper.make_model(helper.make_graph([n("Relu", ["nowhere"], ["y"])], "g",
                                                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
                                  opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError, match="not valid ONNX"):
        tg.from_onnx(undefined)
    unsorted = helper.make_model(helper.make_graph([n("Exp", ["a"], ["y"]), n("Relu", ["x"], ["a"])], "g",
                                                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
                                 opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError, match="topologically sorted.*input 'a' of node: .*OpType: Exp"):
        tg.from_onnx(unsorted)                                     # the checker's whole message, not its first line
    mismatched = make_model([n("MatMul", ["x", "w"], ["y"])], [("x", [2, 3])], [("y", [2, 5])],
                            {"w": np.ones((4, 5), np.float32)})
    with pytest.raises(OnnxImportError, match=r"node 'y' \(MatMul\): matmul: shapes \(2, 3\) and \(4, 5\)"):
        tg.from_onnx(mismatched)



def test_an_output_declared_with_another_shape_is_a_warning():
    """As onnxruntime: the computed shape, with a warning (it was an error). Exporters' shape inference can be
    wrong: onnx's gives this ceil-mode MaxPool a 4x4 output where the spec, onnxruntime and taskdsl give 3x3."""
    from . import run_onnxruntime
    pool = make_model([n("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)],
                      [("x", [1, 1, 5, 5])], [("y", [1, 1, 4, 4])])        # as onnx.shape_inference declares it
    x = rand((1, 1, 5, 5), 1)
    relu = make_model([n("Relu", ["x"], ["y"])], [("x", [2])], [("y", [3, 1])])
    for model, declared in ((pool, r"\(1, 1, 4, 4\)"), (relu, r"\(3, 1\)")):
        with pytest.warns(UserWarning, match=rf"graph output 'y' is declared with shape {declared} but has shape"):
            tg.from_onnx(model)
    got, = graph_of(pool).compile(target="cpu")(x)
    want, = run_onnxruntime(pool, {"x": x})
    assert got.shape == want.shape == (1, 1, 3, 3)
    np.testing.assert_array_equal(got, want)


def graph_of(model):
    """The model's graph, its import's warnings silenced."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tg.from_onnx(model)


def test_symbolic_dims_need_shapes():
    model = make_model([n("Relu", ["x"], ["y"])], [("x", ["batch", 4])], [("y", ["batch", 4])])
    with pytest.raises(UnsupportedOnnxError, match=r"symbolic dim 'batch'.*shapes=\{'x': \(...\)\}"):
        tg.from_onnx(model)
    g = tg.from_onnx(model, shapes={"x": (3, 4)})
    x = rand((3, 4), 1)
    np.testing.assert_array_equal(g(x)[0], np.maximum(x, 0))
    with pytest.raises(ValueError, match="not graph inputs"):
        tg.from_onnx(model, shapes={"z": (1,)})
    for shape in ((3, 4, 1), (3, 5)):       # another rank, or another size of a fixed dim
        declared = r"declares \('batch', 4\)"
        with pytest.raises(ValueError, match=rf"shapes gives graph input 'x' shape \({shape[0]}, .* {declared}"):
            tg.from_onnx(model, shapes={"x": shape})
    for bad in (None, "abc"):
        with pytest.raises(TypeError, match="input 'x' must be an array of shape \\(3, 4\\) and dtype float32"):
            g(bad)


def test_shape_inputs_must_be_constants():
    model = make_model([n("Reshape", ["x", "shape"], ["y"])], [("x", [2, 6]), ("shape", [2], TensorProto.INT64)],
                       [("y", [3, 4])])
    with pytest.raises(ConstantRequiredError, match=r"input 'shape' must be a constant.*constants=\{'shape'") as info:
        tg.from_onnx(model)
    assert info.value.inputs == ["shape"] and isinstance(info.value, UnsupportedOnnxError)
    with pytest.raises(ValueError, match="values of float64, which do not convert to its type int64"):
        tg.from_onnx(model, constants={"shape": [3.7, 4]})
    with pytest.raises(ValueError, match=r"constants gives graph input 'shape' shape \(2, 1\)"):
        tg.from_onnx(model, constants={"shape": [[3], [4]]})
    narrow = make_model([n("Reshape", ["x", "shape32"], ["y"])], [("x", [2, 6]), ("shape32", [2], TensorProto.INT32)],
                        [("y", [3, 4])])
    for wraps in ([3, 2**32 + 4], np.array([3, 2**31], np.int64)):    # would be 4 and -2**31 in int32
        with pytest.raises(ValueError, match=r"'shape32' values outside the range of its type int32 "
                                             r"\(-2147483648\.\.2147483647\)"):
            tg.from_onnx(narrow, constants={"shape32": wraps})
    unshaped = make_model([n("Reshape", ["x", "shape"], ["y"])],
                          [("x", [2, 6]), ("shape", ["r", "c"], TensorProto.INT64)], [("y", [3, 4])])
    with pytest.raises(ValueError, match=r"the shape input must be 1-d, got an array of shape \(1, 2\)"):
        tg.from_onnx(unshaped, constants={"shape": [[3, 4]]})     # onnxruntime refuses it too
    g = tg.from_onnx(model, constants={"shape": np.array([3, 4], np.int64)})
    assert [t.name for t in g.inputs] == ["x"]
    x = rand((2, 6), 2)
    np.testing.assert_array_equal(g(x)[0], x.reshape(3, 4))


def test_a_constant_past_a_float_inputs_range_is_refused():
    """1e40 for an f32 input ran as inf (numpy's overflow warning the only sign), where an int32 input refuses
    2**31; an integer for a float input converts (70000 for an f16 one would be inf: refused too)."""
    for elem, dtype in ((TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)):
        model = make_model([n("Mul", ["x", "s"], ["y"])], [("x", [3], elem), ("s", [], elem)], [("y", [3], elem)])
        for big in (1e40, -1e40, *([70000] if dtype is np.float16 else [])):
            with pytest.raises(ValueError, match=rf"'s' values past the range of its type {dtype.__name__}"):
                tg.from_onnx(model, constants={"s": big})
        with pytest.raises(ValueError, match=rf"'s' integers its type {dtype.__name__} cannot hold exactly"):
            tg.from_onnx(model, constants={"s": 2**24 + 1 if dtype is np.float32 else 2049})
        g = tg.from_onnx(model, constants={"s": 3})
        x = np.array([1, -2, np.inf], dtype)
        np.testing.assert_array_equal(g(x)[0], x * 3)
        np.testing.assert_array_equal(tg.from_onnx(model, constants={"s": np.inf})(x)[0], x * np.inf)


def test_an_input_with_an_initializer_is_a_constant_that_constants_overrides():
    """Given at the call, such an input was only 'unknown ['w']': the error says it is a constant of the graph and
    how to give it another value."""
    w = rand((2, 3), 3)
    model = make_model([n("Add", ["a", "w"], ["y"])], [("a", [2, 3]), ("w", [2, 3])], [("y", [2, 3])], {"w": w})
    a = rand((2, 3), 4)
    compiled = tg.from_onnx(model).compile()
    np.testing.assert_array_equal(compiled({"a": a})[0], a + w)
    with pytest.raises(ValueError, match=r"unknown \['w'\], \['w'\] are constants of the graph .* give other values "
                                         r"when importing: from_onnx\(model, constants=\{name: array\}\)"):
        compiled({"a": a, "w": w})
    np.testing.assert_array_equal(tg.from_onnx(model, constants={"w": 2 * w}).compile()({"a": a})[0], a + 2 * w)


def test_saved_model_path(tmp_path):
    model = make_model([n("Tanh", ["x"], ["y"])], [("x", [4])], [("y", [4])])
    path = tmp_path / "tanh.onnx"
    onnx.save(model, str(path))
    x = rand((4,), 1)
    np.testing.assert_allclose(tg.from_onnx(path)(x)[0], np.tanh(x), rtol=1e-6)


def test_weights_in_external_data_load_from_a_path_and_bytes_say_they_cannot(tmp_path):
    """A model's weights saved apart (onnx's external data) load from its path; from its bytes, or a ModelProto
    loaded without them, the import said 'the model is not valid ONNX' (onnx's checker's words)."""
    w = rand((4,), 5)
    model = make_model([n("Add", ["x", "w"], ["y"])], [("x", [4])], [("y", [4])], {"w": w})
    path = tmp_path / "apart.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)
    x = rand((4,), 6)
    np.testing.assert_array_equal(tg.from_onnx(path)(x)[0], x + w)
    np.testing.assert_array_equal(tg.from_onnx(onnx.load(str(path)))(x)[0], x + w)
    for unlocated in (path.read_bytes(), onnx.load(str(path), load_external_data=False)):
        with pytest.raises(OnnxImportError, match=r"initializers \['w'\] are in external data files, which it does "
                                                  r"not locate: pass the model's path"):
            tg.from_onnx(unlocated)


@pytest.mark.parametrize("size, parts, num_outputs, message", [
    (5, 4, 4, "num_outputs=4 cannot split axis 0 of size 5: parts of 2 .* leave -1 for the last"),
    (4, 2, 0, "num_outputs=0 but the node has 2 outputs"),
])
def test_split_num_outputs_errors(size, parts, num_outputs, message):
    outputs = [f"y{k}" for k in range(parts)]
    model = make_model([n("Split", ["x"], outputs, num_outputs=num_outputs)], [("x", [size])],
                       [(o, [f"d{k}"]) for k, o in enumerate(outputs)], opset=18)
    with pytest.raises(OnnxImportError, match=message):
        tg.from_onnx(model)


def test_gather_indices_out_of_range():
    """Indices known at import are checked there, indices given at run time on each call (onnxruntime raises too;
    the kernels would clamp them); any index into an empty axis is out of range."""
    def gather_model(data_shape, initializers=None):
        inputs = [("x", data_shape)] + ([] if initializers else [("i", [2], TensorProto.INT64)])
        return make_model([n("Gather", ["x", "i"], ["y"])], inputs, [("y", [2] + data_shape[1:])], initializers)

    with pytest.raises(OnnxImportError, match=r"\(Gather\): gather: index -4 is out of range for axis 0 of size 3"):
        tg.from_onnx(gather_model([3, 2], {"i": np.array([0, -4], np.int64)}))
    with pytest.raises(OnnxImportError, match=r"indices of shape \(2,\) into axis 0 of size 0"):
        tg.from_onnx(gather_model([0, 2]))
    compiled = tg.from_onnx(gather_model([3, 2])).compile()
    x = rand((3, 2), 1)
    np.testing.assert_array_equal(compiled(x, np.array([2, -3]))[0], x[[2, -3]])
    graph = tg.from_onnx(gather_model([3, 2]))
    for bad in ([0, 3], [-4, 0]):
        with pytest.raises(IndexError, match="out of range for axis 0 of size 3"):
            compiled(x, np.array(bad))
        with pytest.raises(IndexError, match="out of range for axis 0 of size 3"):    # the oracle says the same
            graph.reference(x, np.array(bad))   # (was "a definition reads in0[3, 0], outside its shape")


@pytest.mark.parametrize("pads", [[-4, 0, 5, 0], [2, 0, -4, 0], [-3, 1, 2, -1], [0, -5, -3, 7], [-2, -1, -1, 1]])
def test_pad_cropping_past_an_axis_in_constant_mode_leaves_padding_alone(pads):
    """onnxruntime reads pads that crop more than an axis has, with padding on it, as an axis of the padding value
    alone (its length the input's plus the pads); taskdsl refused them."""
    from . import run_onnxruntime
    model = make_model([n("Pad", ["x", "pads", "value"], ["y"])], [("x", [3, 4])], [("y", ["a", "b"])],
                       {"pads": np.array(pads, np.int64), "value": np.array(9.0, np.float32)})
    x = rand((3, 4), 1)
    got, = tg.from_onnx(model).compile(target="cpu")(x)
    want, = run_onnxruntime(model, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_pad_cropping_more_than_the_axis():
    node = n("Pad", ["x", "pads"], ["y"])
    model = make_model([node], [("x", [3])], [("y", [0])], {"pads": np.array([-2, -2], np.int64)})
    with pytest.raises(OnnxImportError, match=r"\(Pad\): pads \[-2, -2\] crop more than the shape \(3,\) has"):
        tg.from_onnx(model)


@pytest.mark.parametrize("pads", [[-1, 1], [1, 1]])
def test_pads_of_the_wrong_length_are_named(pads):
    """A negative pad of a list too short raised 'list index out of range' (the crop read past it)."""
    model = make_model([n("Pad", ["x", "pads"], ["y"])], [("x", [1, 2, 4, 4])], [("y", ["a", "b", "c", "d"])],
                       {"pads": np.array(pads, np.int64)})
    with pytest.raises(OnnxImportError, match=r"\(Pad\): pads must have 8 values \(begin..., end...\) for a 4-d "
                                              r"input, got \[" + str(pads[0])):
        tg.from_onnx(model)


@pytest.mark.parametrize("node, inputs, outputs, consts, message", [
    (n("Where", ["c", "x", "x"], ["y"]), [("c", [3]), ("x", [3])], [("y", [3])], {},
     r"\(Where\): the condition must be a bool tensor, got f32"),
    (n("Split", ["x", "s"], ["a", "b"], num_outputs=2), [("x", [4])], [("a", [2]), ("b", [2])],
     {"s": np.array([2, 2], np.int64)}, r"\(Split\): give either the split sizes or num_outputs, not both"),
    (n("Slice", ["x", "s", "e"], ["y"]), [("x", [4])], [("y", [2])],
     {"s": np.array([1.0], np.float32), "e": np.array([3], np.int64)},
     r"\(Slice\): input 1 \(starts\) must hold integers, got float32"),
    (n("ConstantOfShape", ["s"], ["y"], value=onnx.numpy_helper.from_array(np.array([1.0, 2.0], np.float32))), [],
     [("y", [2])], {"s": np.array([2], np.int64)}, r"\(ConstantOfShape\): value must hold one element, got 2"),
    (n("LayerNormalization", ["x", "s"], ["y"]), [("x", [3])], [("y", [2, 3])], {"s": np.ones((2, 3), np.float32)},
     r"\(LayerNormalization\): Scale has 2 axes, more than X's 1"),
    (n("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", pads=[1, 1, 1, 1]), [("x", [1, 1, 4, 4])],
     [("y", [1, 1, 4, 4])], {"w": np.ones((1, 1, 3, 3), np.float32)},
     r"\(Conv\): pads \(1, 1, 1, 1\) and auto_pad='SAME_UPPER' are both given; the operator takes one of them"),
])
def test_models_onnxruntime_refuses_are_refused(node, inputs, outputs, consts, message):
    """Each ran before, on a reading of its own (a float condition's truth, float starts truncated, the first
    of two fill values); onnxruntime refuses them, and so does the ONNX spec."""
    model = make_model([node], inputs, outputs, consts, opset=18)
    with pytest.raises(OnnxImportError, match=message):
        tg.from_onnx(model)


def test_an_output_declared_without_a_shape_is_checked_with_the_inferred_one():
    """onnx's checker refuses it and onnxruntime runs it."""
    model = helper.make_model(helper.make_graph([n("Relu", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
                              opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(tg.from_onnx(model)(x)[0], np.maximum(x, 0))


def test_an_input_without_a_shape_takes_it_from_shapes_and_an_output_without_a_type_is_inferred():
    """Both run in onnxruntime. The input was refused as invalid ONNX even with `shapes=` giving its shape (the
    importer's own message, which asks for `shapes=`, was never reached); the typeless output (an empty value
    info) was called "not a tensor"."""
    model = helper.make_model(helper.make_graph([n("Relu", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                                [helper.make_empty_tensor_value_info("y")]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOnnxError, match=r"graph input 'x' has no shape; give it with from_onnx\(model, "
                                                   r"shapes=\{'x': \(\.\.\.\)\}\)"):
        tg.from_onnx(model)
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    (y,) = tg.from_onnx(model, shapes={"x": (2, 3)})(x)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_a_valid_old_model_the_converter_breaks_is_not_called_invalid():
    """An opset-2 Pad(mode='edge', value=0.0) is valid ONNX (onnxruntime runs it); onnx 1.2x's version converter
    keeps its `value` attribute in Pad-13, which the checker refuses, and the error blamed the user's model. Where
    a later converter gets it right, the model must import and pad as numpy does."""
    model = helper.make_model(helper.make_graph([n("Pad", ["x"], ["y"], pads=[1, 1, 1, 1], mode="edge", value=0.0)],
                                                "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 6])]),
                              opset_imports=[helper.make_opsetid("", 2)])
    onnx.checker.check_model(model)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    try:
        with pytest.warns(UserWarning, match="converted to opset 13"):
            graph = tg.from_onnx(model)
    except OnnxImportError as e:
        assert str(e).startswith("the model is valid ONNX, but onnx.version_converter's conversion of it from opset 2 "
                                 "to 13 (the importer reads opsets 11-"), e
    else:
        np.testing.assert_array_equal(graph(x)[0], np.pad(x, 1, mode="edge"))


def test_an_output_without_a_shape_onnx_cannot_infer_takes_the_computed_one():
    """A ReduceSum whose axes are a graph input: onnx infers no shape, and the model was refused as invalid ONNX
    even with `constants=` fixing the axes (onnxruntime runs it)."""
    model = helper.make_model(helper.make_graph([n("ReduceSum", ["x", "axes"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5]),
                                                 helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
                              opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ConstantRequiredError, match="constants=.*'axes'"):
        tg.from_onnx(model)
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    np.testing.assert_array_equal(tg.from_onnx(model, constants={"axes": [1]})(x)[0], x.sum(1, keepdims=True))


@pytest.mark.parametrize("dims", [(2.5, 3), (True, 3), (2.0, 3), "2,3", (-2, 3), None])
def test_shapes_take_non_negative_int_dims(dims):
    """A float dim was truncated (2.5 -> 2) and a bool taken as 1 without a word; a string gave int()'s message."""
    model = helper.make_model(helper.make_graph([n("Relu", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"from_onnx: shapes\['x'\] must be a tuple of non-negative ints"):
        tg.from_onnx(model, shapes={"x": dims})
    assert tg.from_onnx(model, shapes={"x": np.array([2, 3])}).inputs[0].shape == (2, 3)


def test_a_named_dim_given_by_one_input_fixes_it_in_the_others():
    """Inputs sharing a symbolic dim ('batch') each needed a shape; contradicting sizes gave an Add's broadcast
    error."""
    model = helper.make_model(helper.make_graph([n("Add", ["x", "y"], ["z"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
                                                 helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
                                                 helper.make_tensor_value_info("m", TensorProto.FLOAT, ["?", 2])],
                                                [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    x, y = rand((2, 3)), rand((2, 3), seed=1)
    g = tg.from_onnx(model, shapes={"x": (2, 3), "m": (1, 2)})
    assert [t.shape for t in g.inputs] == [(2, 3), (2, 3), (1, 2)]
    np.testing.assert_array_equal(g(x, y, np.zeros((1, 2), np.float32))[0], x + y)
    with pytest.raises(ValueError, match=r"dim 'batch' is 2 in shapes\['x'\] but 4 in shapes\['y'\]"):
        tg.from_onnx(model, shapes={"x": (2, 3), "y": (4, 3), "m": (1, 2)})
    with pytest.raises(UnsupportedOnnxError, match="graph input 'm' has a symbolic dim '\\?'"):
        tg.from_onnx(model, shapes={"x": (2, 3)})     # an unnamed dim is no one's


def test_integer_gemm_scales_by_whole_alpha_and_beta():
    """Gemm-13 on int32 with alpha=2.0 was refused ('cannot combine the number 2.0 with a i32 tensor'); numpy is the
    oracle (onnxruntime's cpu provider has no integer Gemm)."""
    a, b, c = (np.arange(n, dtype=np.int32).reshape(shape) - 3 for n, shape in ((6, (2, 3)), (12, (3, 4)), (4, (4,))))
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=2.0, beta=3.0)
    model = make_model([node], [("a", [2, 3], TensorProto.INT32)], [("y", [2, 4], TensorProto.INT32)],
                       {"b": b, "c": c}, opset=13)
    got, = tg.from_onnx(model).compile(target="cpu")(a)
    np.testing.assert_array_equal(got, 2 * a @ b + 3 * c)
    half = make_model([helper.make_node("Gemm", ["a", "b"], ["y"], alpha=0.5)], [("a", [2, 3], TensorProto.INT32)],
                      [("y", [2, 4], TensorProto.INT32)], {"b": b}, opset=13)
    with pytest.raises(OnnxImportError, match="an integer Gemm needs whole alpha and beta, got 0.5"):
        tg.from_onnx(half)


def test_weights_are_checked_apart_from_the_model():
    """onnx's checker sees large initializers as graph inputs (it would serialize their data): a model is still
    refused for what the checker finds elsewhere, or for an initializer's broken data (to_array), and the weights
    are used whether or not (IR version 3) the model also declares them as inputs."""
    weight = rand((64, 33), 5)
    for ir_version, declared in ((8, []), (3, [("w", [64, 33])])):
        model = make_model([n("MatMul", ["x", "w"], ["y"])], [("x", [2, 64])] + declared, [("y", [2, 33])],
                           {"w": weight})
        model.ir_version = ir_version
        x = rand((2, 64), 6)
        np.testing.assert_allclose(tg.from_onnx(model)(x)[0], x @ weight, rtol=1e-5, atol=1e-5)
    model.graph.node[0].op_type = "Matmul"      # no such operator: the checker's error
    with pytest.raises(OnnxImportError, match="is not valid ONNX: .*Matmul"):
        tg.from_onnx(model)
    model.graph.node[0].op_type = "MatMul"
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    with pytest.raises(OnnxImportError, match="initializer 'w'"):
        tg.from_onnx(model)
