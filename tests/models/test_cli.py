"""`python -m models`: list, run (zoo model and --onnx) and bench end to end on a small model; bad input exits 2."""
import os
import subprocess
import sys

import numpy as np
import pytest

import models
import taskdsl as td
from models.cli import main, top_operators

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SMALL_RUN = ["--small", "--iters", "2", "--no-tune", "--target", "cpu"]


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in models.MODELS)


def test_run_small_model(capsys):
    """The report: build, latency, error against onnxruntime, kernels, and the slowest operators."""
    pytest.importorskip("onnxruntime")
    assert main(["run", "mobilenet_v2", *SMALL_RUN]) == 0
    out = capsys.readouterr().out
    assert "mobilenet_v2 (small): batch 1, f32" in out
    assert "latency: median" in out and "p90" in out and "over 2 iterations" in out
    assert "max error vs onnxruntime" in out and ", ok" in out
    assert "kernel launches" in out and "top operators by time" in out
    assert "peak activation memory" in out and "arena on (" in out and "of host memory)" in out
    assert "replay on (" in out and "cpu launches replayed)" in out


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_run_small_cnn_channels_last(name, capsys):
    """--channels-last: the convolutions run NHWC (the layout pass), and the outputs still match onnxruntime."""
    pytest.importorskip("onnxruntime")
    assert main(["run", name, *SMALL_RUN, "--channels-last"]) == 0
    out = capsys.readouterr().out
    assert "max error vs onnxruntime" in out and ", ok" in out


def test_run_and_bench_in_bf16_check_against_the_model_in_f32(capsys):
    """--dtype bf16: onnxruntime, whose CPU kernels take next to no bf16 (it refused the bf16 export, and bench
    stopped on the error), checks and times the model in f32, fed the bf16 inputs widened; the report says so."""
    pytest.importorskip("onnxruntime")
    assert main(["run", "resnet50", *SMALL_RUN, "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "resnet50 (small): batch 1, bf16" in out
    assert "max error vs onnxruntime (the model in f32)" in out and ", ok" in out
    assert main(["bench", "bert", *SMALL_RUN, "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "bf16: taskdsl cpu" in out and "onnxruntime cpu (f32)" in out


def test_run_onnx_file(tmp_path, capsys):
    """--onnx runs any model file: here the exported small MobileNet-V2."""
    pytest.importorskip("onnxruntime")
    import onnx
    spec = models.get("mobilenet_v2")
    path = tmp_path / "mobilenet.onnx"
    onnx.save(models.export_onnx(spec.build(spec.small)), str(path))
    assert main(["run", "--onnx", str(path), "--iters", "1", "--no-tune", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert str(path) in out and "vs onnxruntime" in out and ", ok" in out     # onnxruntime read the file itself


def test_run_onnx_file_quantized_by_onnxruntime(tmp_path, capsys):
    """A model onnxruntime's dynamic quantization made (MatMulInteger, DynamicQuantizeLinear: the small BERT) runs
    on the integer products, checked within the tolerance of a graph that rounds its activations to 8 bits, which
    the report names."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from models.inference import tolerance
    spec = models.get("bert")
    graph = spec.build(spec.small)
    assert tolerance(graph) == 1e-3
    onnx.save(models.export_onnx(graph), str(tmp_path / "bert.onnx"))
    quantize_dynamic(str(tmp_path / "bert.onnx"), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    assert main(["run", "--onnx", str(tmp_path / "int8.onnx"), "--iters", "1", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert ", ok (tolerance 2e-01, activations rounded to 8 bits)" in out, out


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_run_onnx_file_quantized_statically_by_onnxruntime(tmp_path, capsys, quant_format):
    """A model onnxruntime's static quantization made (the small MobileNet-V2), QDQ (QuantizeLinear and
    DequantizeLinear around f32 convolutions) or QOperator (QLinearConv, and com.microsoft's QLinearAdd), is checked
    within the same tolerance: onnxruntime runs its own integer kernels, whose roundings differ from the f32
    convolutions' (the QDQ model failed at 1e-3 by 1.5e-2 at full size)."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from models.inference import rounds_to_8_bits, tolerance
    from taskdsl.graph import from_onnx
    spec = models.get("mobilenet_v2")
    graph = spec.build(spec.small)
    assert not rounds_to_8_bits(graph)
    onnx.save(models.export_onnx(graph), str(tmp_path / "f32.onnx"))
    shape, name = graph.inputs[0].shape, graph.inputs[0].name

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{name: np.random.default_rng(k).standard_normal(shape).astype(np.float32)}
                                 for k in range(2)])

        def get_next(self):
            return next(self.batches, None)
    quantize_static(str(tmp_path / "f32.onnx"), str(tmp_path / "qdq.onnx"), Calibration(),
                    quant_format=QuantFormat[quant_format], activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    contrib = {n.op_type for n in onnx.load(str(tmp_path / "qdq.onnx")).graph.node if n.domain == "com.microsoft"}
    assert contrib == (set() if quant_format == "QDQ" else {"QLinearAdd"})
    assert tolerance(from_onnx(str(tmp_path / "qdq.onnx"))) == 2e-1
    assert main(["run", "--onnx", str(tmp_path / "qdq.onnx"), "--iters", "1", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert ", ok (tolerance 2e-01, activations rounded to 8 bits)" in out, out


def test_run_onnx_file_fused_by_onnxruntimes_transformer_optimizer(tmp_path, capsys):
    """The small BERT after onnxruntime's transformer optimizer (its fusions only, opt_level 0): com.microsoft's
    SkipLayerNormalization and BiasGelu in it, run and checked against onnxruntime at f32's tolerance."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model
    spec = models.get("bert")
    onnx.save(models.export_onnx(spec.build(spec.small)), str(tmp_path / "bert.onnx"))
    optimize_model(str(tmp_path / "bert.onnx"), model_type="bert", opt_level=0).save_model_to_file(
        str(tmp_path / "fused.onnx"))
    contrib = {n.op_type for n in onnx.load(str(tmp_path / "fused.onnx")).graph.node if n.domain == "com.microsoft"}
    assert contrib == {"SkipLayerNormalization", "BiasGelu"}
    assert main(["run", "--onnx", str(tmp_path / "fused.onnx"), "--iters", "1", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "vs onnxruntime" in out and ", ok" in out and "tolerance" not in out, out


def _reshape_model(path):
    """An ONNX model whose Reshape takes its shape from a graph input: fixed only by --constant."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "cols"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_run_onnx_file_with_a_shape_input_fixed_by_constant(tmp_path, capsys):
    """--constant fixes a shape input; onnxruntime, the reference, is fed the same value."""
    pytest.importorskip("onnxruntime")
    path = tmp_path / "reshape.onnx"
    _reshape_model(path)
    assert main(["run", "--onnx", str(path), "--iters", "1", "--target", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "must be a constant" in err and "--constant shape=V,V,..." in err and len(err.splitlines()) == 1
    assert main(["run", "--onnx", str(path), "--iters", "1", "--target", "cpu", "--constant", "shape=3,-1"]) == 0
    out = capsys.readouterr().out
    assert "f32[3, 4]" in out and "max error vs onnxruntime" in out and ", ok" in out


@pytest.mark.parametrize("spec, message", [
    ("shape", "give NAME=V or NAME=V,V,..."),
    ("size=3,4", "the model has no input 'size' (inputs: x, shape)"),
    ("shape=3,four", "the values must be int64 numbers, as input 'shape' takes"),
    ("shape=1.5,8", "'shape=1.5,8' gives graph input 'shape' values of float64, which do not convert to its "
                    "type int64 without loss"),     # not truncated to 1
    ("shape=3,99999999999999999999", "the values must be int64 numbers"),      # not an OverflowError
    ("shape=3,4,1", "--constant 'shape=3,4,1' gives graph input 'shape' shape (3,), but the model declares (2,)"),
    ("x=1,2", "--constant 'x=1,2' gives graph input 'x' shape (2,), but the model declares (2, 6)"),
    ("shape=3,4 --constant shape=4,3", "'shape' is given twice"),
])
def test_bad_constant_exits_2(tmp_path, spec, message, capsys):
    path = tmp_path / "reshape.onnx"
    _reshape_model(path)
    flags = [f for part in spec.split(" --constant ") for f in ("--constant", part)]
    assert main(["run", "--onnx", str(path), "--target", "cpu", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert main(["run", "resnet50", "--small", "--constant", "shape=1"]) == 2
    assert "--constant applies to --onnx models" in capsys.readouterr().err


def test_constant_gives_bool_inputs_and_refuses_integers_out_of_range(tmp_path, capsys):
    """A bool input (Dropout's training_mode) takes 0 / 1 / false / true; an int32 input refuses 2**31 and 2**32 + 1,
    which it would wrap to other values. Each refusal is one line, exit 2."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper
    value = helper.make_tensor_value_info
    dropout, add = tmp_path / "dropout.onnx", tmp_path / "add.onnx"
    _save(dropout, [helper.make_node("Dropout", ["x", "", "training_mode"], ["y"])],
                [value("x", T.FLOAT, [2, 3]), value("training_mode", T.BOOL, [])], [value("y", T.FLOAT, [2, 3])])
    _save(add, [helper.make_node("Add", ["x", "c"], ["y"])], [value("x", T.INT32, [3]), value("c", T.INT32, [])],
                [value("y", T.INT32, [3])])
    for truth in ("0", "false", "False"):
        assert main(["run", "--onnx", str(dropout), "--iters", "1", "--constant", f"training_mode={truth}"]) == 0
        assert ", ok" in capsys.readouterr().out
    for spec, message in (("training_mode=2", "the values must be 0 or 1 (false or true), as input 'training_mode'"),
                          ("training_mode=yes", "the values must be 0 or 1")):
        assert main(["run", "--onnx", str(dropout), "--constant", spec]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    for big in (2**31, 2**32 + 1):
        assert main(["run", "--onnx", str(add), "--constant", f"c={big}"]) == 2
        assert "values outside the range of its type int32 (-2147483648..2147483647)" in capsys.readouterr().err
    assert main(["run", "--onnx", str(add), "--iters", "1", "--constant", "c=-2147483648"]) == 0


def test_an_input_constant_fixes_needs_no_shape_and_takes_no_batch(tmp_path, capsys):
    """A shape input declared without a shape, or with a symbolic one, is sized by its --constant value: no --shape
    asked for, and a --batch nothing else takes is refused, not ignored."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper
    value = helper.make_tensor_value_info
    for name, dims in (("noshape", None), ("symbolic", ["rank"])):
        path = tmp_path / f"{name}.onnx"
        _save(path, [helper.make_node("Reshape", ["x", "shape"], ["y"])],
                    [value("x", T.FLOAT, [2, 16]), value("shape", T.INT64, dims)], [value("y", T.FLOAT, None)])
        assert main(["run", "--onnx", str(path), "--iters", "1", "--constant", "shape=4,8"]) == 0
        assert "f32[4, 8]" in capsys.readouterr().out
        assert main(["run", "--onnx", str(path), "--constant", "shape=4,8", "--batch", "3"]) == 2
        assert "--batch and --seq size the symbolic dims" in capsys.readouterr().err


def test_an_empty_mask_input_is_sampled_and_checked(tmp_path, capsys):
    """An integer input named *mask* of no elements (a --shape of a 0 dim) runs as other empty inputs do."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper
    path = tmp_path / "mask.onnx"
    _save(path, [helper.make_node("Cast", ["attention_mask"], ["y"], to=T.FLOAT)],
                [helper.make_tensor_value_info("attention_mask", T.INT64, ["b", "s"])],
                [helper.make_tensor_value_info("y", T.FLOAT, ["b", "s"])])
    for shape in ("2,0", "0,3"):
        assert main(["run", "--onnx", str(path), "--iters", "1", "--shape", f"attention_mask={shape}"]) == 0
        assert ", ok" in capsys.readouterr().out


def test_constant_fixes_an_input_of_several_dims(tmp_path, capsys):
    """`--constant` values fill the shape --shape gives the input, or the one it declares where every dim is
    fixed: a 2-d input was refused ("shape (6,), but the model declares ...")."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper
    value = helper.make_tensor_value_info
    for declared, flags in ((["a", "b"], ["--shape", "c=2,3"]), ([2, 3], [])):
        path = tmp_path / "add.onnx"
        _save(path, [helper.make_node("Add", ["x", "c"], ["y"])], [value("x", T.FLOAT, [2, 3]),
                                                                   value("c", T.FLOAT, declared)],
              [value("y", T.FLOAT, [2, 3])])
        assert main(["run", "--onnx", str(path), "--iters", "1", "--constant", "c=1,2,3,4,5,6", *flags]) == 0
        assert ", ok" in capsys.readouterr().out
    assert main(["run", "--onnx", str(path), "--constant", "c=1,2,3,4"]) == 2
    assert "gives graph input 'c' shape (4,), but the model declares (2, 3)" in capsys.readouterr().err


def test_an_error_names_only_the_sizes_batch_and_seq_gave(tmp_path, capsys):
    """A --shape contradicting a static input is reported without a note on --batch (which sized nothing), and an
    unsupported operator without one either."""
    from onnx import TensorProto as T, helper
    value = helper.make_tensor_value_info
    static, coin = tmp_path / "static.onnx", tmp_path / "coin.onnx"
    _save(static, [helper.make_node("Relu", ["x"], ["y"])], [value("x", T.FLOAT, [2, 3])],
                [value("y", T.FLOAT, [2, 3])])
    _save(coin, [helper.make_node("Bernoulli", ["x"], ["y"])], [value("x", T.FLOAT, ["n", 4])],
          [value("y", T.FLOAT, ["n", 4])])
    for argv in (["--onnx", str(static), "--shape", "x=2,4"], ["--onnx", str(coin)]):
        assert main(["run", *argv]) == 2
        err = capsys.readouterr().err
        assert "error" in err and "sized by --batch" not in err


def test_bench_small_model(capsys):
    pytest.importorskip("onnxruntime")
    assert main(["bench", "mobilenet_v2", *SMALL_RUN]) == 0
    out = capsys.readouterr().out
    assert "taskdsl cpu" in out and "onnxruntime cpu" in out


def test_bench_of_every_model_takes_seq_for_the_text_models(monkeypatch, capsys):
    """`bench --seq 8` with no names stopped at resnet50 ("a sequence length applies to the text models"); named
    image models still refuse it (test_bad_input_exits_2). Each model is built (not compiled or run)."""
    import types

    import models.cli
    from models import MODELS, bench
    built, zoo_model = {}, models.cli.zoo_model

    def recorded(args):
        title, graph, vocab = zoo_model(args)
        built[args.name] = graph.inputs[0].shape
        return title, graph, vocab

    result = types.SimpleNamespace(ok=True, median_ms=1.0, max_error=0.0, compiled=types.SimpleNamespace(target="cpu"))
    monkeypatch.setattr(models.cli, "zoo_model", recorded)
    monkeypatch.setattr(models.cli, "export_if_checkable", lambda graph: (None, {}))
    monkeypatch.setattr(bench, "infer", lambda *args, **kwargs: result)
    assert main(["bench", "--small", "--seq", "8"]) == 0
    assert set(built) == set(MODELS)
    for name, spec in MODELS.items():
        assert (built[name][-1] == 8) == spec.takes_seq, (name, built[name])     # token ids: (batch, seq)


@pytest.mark.parametrize("argv, message", [
    (["run", "resnet51"], "unknown model 'resnet51'"),
    (["run"], "run takes a model name or --onnx PATH"),
    (["run", "resnet50", "--onnx", "x.onnx"], "run takes a model name or --onnx PATH"),
    (["run", "resnet50", "--seq", "64"], "a sequence length applies to the text models"),
    (["run", "bert", "--small", "--seq", "100000"], "sequence length 100000 is outside"),
    (["run", "resnet50", "--batch", "0"], "must be positive"),
    (["bench", "nosuch", "--small"], "unknown model 'nosuch'"),
    (["bench", "mobilenet_v2", "nosuch", "--small"], "unknown model 'nosuch'"),    # before mobilenet_v2 runs
    (["bench", "bert", "resnet50", "--small", "--seq", "16"], "resnet50: a sequence length applies"),   # before bert
    (["bench", "--small", "--seq", "100"], "bert: sequence length 100 is outside 1..64"),  # before the image models
])
def test_bad_input_exits_2(argv, message, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and out == ""     # refused before any model ran


def test_unreadable_onnx_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    for path in (bad, tmp_path / "missing.onnx"):
        assert main(["run", "--onnx", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert "cannot read an ONNX model" in err and len(err.splitlines()) == 1


def test_cuda_without_gpu_exits_2(capsys):
    if td.gpu_status()[0]:
        pytest.skip("a GPU is usable here")
    assert main(["run", "resnet50", "--small", "--target", "cuda"]) == 2
    assert "--target cuda needs a usable GPU" in capsys.readouterr().err


def test_bad_flag_exits_2_in_a_process():
    """argparse's own errors (bad flag, bad choice) exit 2 too, from the real command line."""
    for argv in (["run", "resnet50", "--bogus"], ["run", "resnet50", "--dtype", "f64"]):
        done = subprocess.run([sys.executable, "-m", "models", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 2 and "error:" in done.stderr


def test_top_operators_sorts_rows_by_time():
    summary = "\n".join(["CompiledGraph g: 3 operators", "memory", "  #  operator  output  kernels  ms",
                         "  0  conv2d  t0: f32[1, 2]  k0  1.500", "  1  relu  t1: f32[1, 2]  k1  0.100",
                         "  2  add  t2: f32[1, 2]  k2  2.000", "  total 3.600 ms"])
    lines = top_operators(summary, 2)
    assert lines[0].split()[0] == "#" and [line.split()[1] for line in lines[1:]] == ["add", "conv2d"]


def test_batch_and_seq_size_symbolic_onnx_dims_only(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper
    path = tmp_path / "relu.onnx"
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    for flags in (["--batch", "3"], ["--seq", "5"]):
        assert main(["run", "--onnx", str(path), "--target", "cpu", *flags]) == 2
        assert "this model's inputs have static shapes" in capsys.readouterr().err


def _relu_model(path, dims):
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_a_size_no_symbolic_dim_takes_exits_2(tmp_path, capsys):
    """--seq for a model symbolic in its batch only, --batch for one symbolic past axis 0: no silent ignoring."""
    _relu_model(tmp_path / "batch.onnx", ["n", 8])
    _relu_model(tmp_path / "seq.onnx", [2, "s", 8])
    assert main(["run", "--onnx", str(tmp_path / "batch.onnx"), "--target", "cpu", "--seq", "5"]) == 2
    assert "--seq sizes the symbolic dims at an axis past 0" in capsys.readouterr().err
    assert main(["run", "--onnx", str(tmp_path / "seq.onnx"), "--target", "cpu", "--seq", "3", "--batch", "4"]) == 2
    assert "--batch sizes the symbolic dims at axis 0" in capsys.readouterr().err


def _save(path, nodes, inputs, outputs, initializers=()):
    import onnx
    from onnx import helper
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_a_named_dim_takes_one_size_in_every_input_that_names_it(tmp_path, capsys):
    """Dims were sized by their axis: `seq` at axis 0 of b took --batch, at axis 1 of a --seq, and no flags could
    run the model ("the model's dim 'seq' is 5 in shapes['a'] but 2 in shapes['b']"); also a matmul's `k`."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper
    vi = helper.make_tensor_value_info
    _save(tmp_path / "bias.onnx", [helper.make_node("Add", ["a", "b"], ["y"])],
          [vi("a", T.FLOAT, ["batch", "seq"]), vi("b", T.FLOAT, ["seq"])], [vi("y", T.FLOAT, ["batch", "seq"])])
    _save(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["a", "b"], ["y"])],
          [vi("a", T.FLOAT, ["n", "k"]), vi("b", T.FLOAT, ["k", "m"])], [vi("y", T.FLOAT, ["n", "m"])])
    for name in ("bias", "mm"):
        assert main(["run", "--onnx", str(tmp_path / f"{name}.onnx"), "--target", "cpu", "--iters", "1",
                     "--batch", "2", "--seq", "5"]) == 0
        out = capsys.readouterr().out
        assert ", ok" in out and ("y: f32[2, 5]" in out), out


def test_shape_gives_the_shape_of_an_input_the_model_leaves_without_one(tmp_path, capsys):
    """Such an input was sent to the Python API (`from_onnx(model, shapes=...)`), and with --batch called
    "static"; --shape sizes it (or any input) on the command line."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper
    vi = helper.make_tensor_value_info
    path = tmp_path / "noshape.onnx"
    _save(path, [helper.make_node("Relu", ["x"], ["y"])], [vi("x", T.FLOAT, None)], [vi("y", T.FLOAT, None)])
    for flags in ([], ["--batch", "2"]):
        assert main(["run", "--onnx", str(path), "--target", "cpu", *flags]) == 2
        assert "input 'x' has no shape in the model; give it with --shape x=D,D,..." in capsys.readouterr().err
    assert main(["run", "--onnx", str(path), "--target", "cpu", "--iters", "1", "--shape", "x=3,7"]) == 0
    out = capsys.readouterr().out
    assert "y: f32[3, 7]" in out and ", ok" in out
    for flags, message in ((["--shape", "z=2"], "the model has no input 'z'"),
                           (["--shape", "x=2,a"], "give NAME=D,D,... of sizes >= 0"),
                           (["--shape", "x=2", "--shape", "x=3"], "'x' is given twice")):
        assert main(["run", "--onnx", str(path), "--target", "cpu", *flags]) == 2
        assert message in capsys.readouterr().err
    assert main(["run", "mobilenet_v2", "--shape", "x=1"]) == 2
    assert "--shape applies to --onnx models" in capsys.readouterr().err


def test_a_dim_a_given_shape_names_sizes_the_other_inputs_naming_it(tmp_path, capsys):
    """--shape a=2,5 for a[n, k] left k of b[k, m] to --batch (1): the two disagreed and the run failed."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as T, helper
    vi = helper.make_tensor_value_info
    path = tmp_path / "mm.onnx"
    _save(path, [helper.make_node("MatMul", ["a", "b"], ["y"])],
          [vi("a", T.FLOAT, ["n", "k"]), vi("b", T.FLOAT, ["k", "m"])], [vi("y", T.FLOAT, ["n", "m"])])
    assert main(["run", "--onnx", str(path), "--target", "cpu", "--iters", "1", "--shape", "a=2,5", "--seq", "3"]) == 0
    out = capsys.readouterr().out
    assert "y: f32[2, 3]" in out and ", ok" in out, out


def test_sample_ids_fit_the_tables_they_index(tmp_path, capsys):
    """Ids in [0, 2) for a one-row table (a RoBERTa's token types): onnxruntime refused them and the numpy
    reference died with an internal traceback."""
    pytest.importorskip("onnxruntime")
    import numpy as np
    from onnx import TensorProto as T, helper, numpy_helper
    vi = helper.make_tensor_value_info
    path = tmp_path / "types.onnx"
    nodes = [helper.make_node("Cast", ["ids"], ["i32"], to=T.INT32),
             helper.make_node("Gather", ["table", "i32"], ["y"])]
    _save(path, nodes, [vi("ids", T.INT64, [1, 4])], [vi("y", T.FLOAT, [1, 4, 2])],
          [numpy_helper.from_array(np.arange(2, dtype=np.float32).reshape(1, 2), "table")])
    assert main(["run", "--onnx", str(path), "--target", "cpu", "--iters", "1"]) == 0
    assert ", ok" in capsys.readouterr().out


def test_a_model_the_default_batch_contradicts_says_where_its_sizes_came_from(tmp_path, capsys):
    """A reshape of a batch-symbolic input to 4x8 failed with "cannot reshape a tensor of shape (1, 16)": the 1
    was --batch's default, which the command never showed."""
    import onnx
    from onnx import TensorProto, helper
    path = tmp_path / "reshape.onnx"
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    assert main(["run", "--onnx", str(path), "--target", "cpu", "--constant", "shape=4,8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the inputs' symbolic dims were sized by --batch 1: x (1, 16)" in err and len(err.splitlines()) == 1


def test_errors_not_about_sizes_get_no_sizing_hint_and_constants_must_fill_their_shape(tmp_path, capsys):
    """A type error was told the sizes --batch gave ("declared FLOAT but computes i64 (the inputs' symbolic dims
    were sized by --batch 1 ...)"); --constant s=2,2,3 with --shape s=2 ran with a 1-d s of 3 values."""
    from onnx import TensorProto as T, helper
    vi = helper.make_tensor_value_info
    _save(tmp_path / "argmax.onnx", [helper.make_node("ArgMax", ["x"], ["y"], axis=1)], [vi("x", T.FLOAT, ["b", 5])],
          [vi("y", T.FLOAT, None)])
    assert main(["run", "--onnx", str(tmp_path / "argmax.onnx"), "--target", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "declared FLOAT but computes i64" in err and "sized by" not in err
    _save(tmp_path / "reshape.onnx", [helper.make_node("Reshape", ["x", "s"], ["y"])],
          [vi("x", T.FLOAT, ["n", 6]), vi("s", T.INT64, None)], [vi("y", T.FLOAT, None)])
    assert main(["run", "--onnx", str(tmp_path / "reshape.onnx"), "--target", "cpu", "--constant", "s=2,2,3",
                 "--shape", "s=2"]) == 2
    assert "--constant 's=2,2,3' gives 3 values, but --shape gives 's' the shape (2,)" in capsys.readouterr().err


def test_a_batch_beyond_the_machines_memory_exits_2_before_anything_runs(tmp_path, capsys):
    """A zoo model and an ONNX file whose --batch needs terabytes: refused up front (the system would kill the
    run, with no message), with what it needs and what is available."""
    _relu_model(tmp_path / "batch.onnx", ["n", 1 << 20])
    for argv in (["resnet50", *SMALL_RUN], ["--onnx", str(tmp_path / "batch.onnx"), "--target", "cpu"]):
        assert main(["run", *argv, "--batch", str(1 << 30)]) == 2
        err = capsys.readouterr().err
        assert "not enough memory for this run: it needs about" in err and "GiB are available" in err, err
        assert "use a smaller --batch" in err


def test_check_memory_counts_the_inputs_and_the_activations_twice():
    from models.inference import check_memory
    from taskdsl.graph import Graph, input, ops
    x = input("x", (1000,))
    graph = Graph([x], [ops.exp(ops.relu(x))])
    needed = 4000 + 2 * (2 * 4032)     # x; relu's and exp's outputs live at once, 64-byte aligned, on each side
    check_memory(graph, available=needed)
    with pytest.raises(MemoryError, match=r"inputs 3.9 KiB, activations 7.9 KiB"):
        check_memory(graph, available=needed - 1)


def test_settings_taskdsl_cannot_use_exit_2_and_an_explicit_target_wins(tmp_path, monkeypatch, capsys):
    """TASKDSL_TARGET naming no target (or cuda without a GPU) and an unusable TASKDSL_CACHE_DIR are usage errors,
    not tracebacks; `--target cpu` runs whatever TASKDSL_TARGET says."""
    from taskdsl.runtime import config
    _relu_model(tmp_path / "relu.onnx", [2, 3])
    monkeypatch.setitem(config._state, "target", None)
    monkeypatch.setenv("TASKDSL_TARGET", "gpu")
    config.environment.cache_clear()        # read once per process: read it again under this test's value
    try:
        assert main(["run", "--onnx", str(tmp_path / "relu.onnx")]) == 2
        assert "TASKDSL_TARGET='gpu' is no target" in capsys.readouterr().err
        assert main(["run", "--onnx", str(tmp_path / "relu.onnx"), "--target", "cpu", "--iters", "1"]) == 0
        capsys.readouterr()
    finally:
        monkeypatch.undo()
        config.environment.cache_clear()
    # a fresh process (this one keeps its kernels in memory): the cache folder under a file cannot be made
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path / "relu.onnx" / "cache"))
    done = subprocess.run([sys.executable, "-m", "models", "run", "--onnx", str(tmp_path / "relu.onnx"), "--target",
                           "cpu", "--iters", "1"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "the compile cache folder" in done.stderr and "Traceback" not in done.stderr


def test_relative_error_sees_nans_and_infinities():
    """A NaN or an infinity on one side only is an infinite error (a check that compares nothing must fail);
    the same NaNs and infinities on both sides are equal, and the scale is the largest finite reference."""
    import numpy as np

    from models.inference import relative_error
    nan, inf = np.nan, np.inf
    assert relative_error([np.array([nan, 5.0])], [np.array([nan, 1.0])]) == 4.0
    assert relative_error([np.array([nan, 1.0])], [np.array([2.0, 1.0])]) == inf
    assert relative_error([np.array([inf, 1.0])], [np.array([-inf, 1.0])]) == inf
    assert relative_error([np.array([inf, -inf, 2.0])], [np.array([inf, -inf, 2.0])]) == 0.0
    assert relative_error([np.array([inf, 1.5])], [np.array([inf, 2.0])]) == 0.25


def test_no_tune_holds_for_its_command_only(tmp_path, monkeypatch, capsys):
    """`--no-tune` set TASKDSL_TUNE=0 for the rest of the process: a program calling `main` then tuned nothing."""
    _relu_model(tmp_path / "relu.onnx", [2, 3])
    monkeypatch.delenv("TASKDSL_TUNE", raising=False)
    assert main(["run", "--onnx", str(tmp_path / "relu.onnx"), "--no-tune", "--target", "cpu", "--iters", "1"]) == 0
    assert "TASKDSL_TUNE" not in os.environ
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    assert main(["run", "--onnx", str(tmp_path / "relu.onnx"), "--no-tune", "--target", "cpu", "--iters", "1"]) == 0
    assert os.environ["TASKDSL_TUNE"] == "1"
    capsys.readouterr()
