"""Each zoo model at its small size: the compiled graph matches onnxruntime on the exported ONNX model, and the
model read back with from_onnx is the same graph (same operators, same outputs)."""
import numpy as np
import pytest
from onnx import numpy_helper as onnx_numpy

import models
import taskdsl.graph as tg
from models.inference import TOLERANCE, infer, onnxruntime_outputs, reference_outputs, relative_error, sample_inputs

pytest.importorskip("onnxruntime")


def small(name: str):
    """(graph, feeds) of a zoo model at its small size, batch 1."""
    spec = models.get(name)
    graph = spec.build(spec.small)
    return graph, sample_inputs(graph, getattr(spec.small, "vocab_size", 2))


@pytest.mark.parametrize("name", list(models.MODELS))
def test_export_round_trip(name):
    """from_onnx(export_onnx(g)) has g's operators and inputs, and its numpy reference gives g's outputs."""
    graph, feeds = small(name)
    back = tg.from_onnx(models.export_onnx(graph))
    assert [op.kind for op in back.nodes] == [op.kind for op in graph.nodes]
    assert [(t.name, t.shape, t.dtype) for t in back.inputs] == [(t.name, t.shape, t.dtype) for t in graph.inputs]
    for got, want in zip(back.reference(feeds), graph.reference(feeds)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", list(models.MODELS))
def test_small_model_matches_onnxruntime(name):
    """The traced graph and its ONNX round trip, compiled for cpu, both match onnxruntime within 1e-3."""
    graph, feeds = small(name)
    proto = models.export_onnx(graph)
    want = onnxruntime_outputs(proto, feeds)
    assert want is not None, "onnxruntime could not run the exported model"
    got = graph.compile("cpu")(feeds)
    assert [a.shape for a in got] == [b.shape for b in want]
    assert relative_error(got, want) < 1e-3
    assert relative_error(tg.from_onnx(proto).compile("cpu")(feeds), want) < 1e-3    # the same kernels: cached


@pytest.mark.parametrize("name, target", [("mobilenet_v2", "cpu"), ("mobilenet_v2", "cuda"), ("bert", "cpu")])
def test_small_model_in_bf16_matches_the_f32_model_by_onnxruntime(simulated_gpu, name, target):
    """`--dtype bf16`: the model built in bf16 (the same weights, rounded), compiled for the cpu or a (simulated)
    GPU and fed the f32 inputs rounded, is within bf16's tolerance (inference.TOLERANCE) of the f32 model by
    onnxruntime (which runs no bf16 model); its convolutions and matmuls on the templates in bf16 (a GPU's tensor
    cores), not their f32 forms between casts."""
    spec = models.get(name)
    graph, feeds = small(name)
    want = onnxruntime_outputs(models.export_onnx(graph), feeds)
    bf16 = spec.build(spec.small, dtype="bfloat16")
    compiled = bf16.compile(target)
    got = [np.asarray(a) for a in compiled({t.name: feeds[t.name].astype(t.numpy_dtype) for t in bf16.inputs})]
    assert all(a.dtype.name == "bfloat16" for a in got)
    assert relative_error([a.astype(np.float32) for a in got], want) < TOLERANCE["bfloat16"]
    names = [k.name for k in compiled.kernels]
    assert not any(n.startswith("cast") for n in names), names
    assert target == "cpu" or any(n.startswith("tc_matmul") for n in names), names


# the published parameter counts (torchvision; Hugging Face): Inception-V3 without its training-only auxiliary
# head; GPT-2 plus its tied head stored transposed (38.6M) and the causal mask (128 x 128)
PARAMETERS = {"resnet50": 25_557_032, "inception_v3": 23_834_568, "mobilenet_v2": 3_504_872, "bert": 109_482_240,
              "gpt2": 124_439_808 + 50257 * 768 + 128 * 128}
OUTPUTS = {"resnet50": (1, 1000), "inception_v3": (1, 1000), "mobilenet_v2": (1, 1000), "bert": (1, 128, 768),
           "gpt2": (1, 128, 50257)}


@pytest.mark.parametrize("name", list(models.MODELS))
def test_full_size_architecture(name):
    """The full-size graphs (traced, not compiled) have the real models' parameter counts and output shapes."""
    spec = models.get(name)
    graph = spec.build(spec.full)
    running_stats = {id(t) for op in graph.nodes if op.kind == "batch_norm" for t in op.inputs[1:3]}
    weights = sum(t.size for t in graph.constants if t.ndim and id(t) not in running_stats)
    assert weights == PARAMETERS[name]
    assert graph.outputs[0].shape == OUTPUTS[name]


def test_small_gpt2_on_a_simulated_gpu(simulated_gpu):
    """GPT-2 (small) on the cuda target's device-resident path, simulated: its GPU schedules, replayed as one
    CUDA graph, match onnxruntime on new inputs."""
    graph, feeds = small("gpt2")
    proto = models.export_onnx(graph)
    result = infer(graph, proto, feeds, "cuda", iters=2)      # times run_on_device: outputs stay on the GPU
    assert result.ok and result.reference == "onnxruntime"
    cg = result.compiled
    # replays: compile's check (two), the checked call, the warm-up, the timed calls
    assert cg.cuda_graph.startswith("on (") and simulated_gpu.replays == 2 + 1 + 1 + 2
    other = sample_inputs(graph, models.get("gpt2").small.vocab_size, seed=1)
    assert relative_error(cg(other), onnxruntime_outputs(proto, other)) < 1e-3


def test_a_model_onnxruntime_cannot_run_is_checked_against_the_numpy_reference_which_says_why():
    graph, feeds = small("mobilenet_v2")
    broken = models.export_onnx(graph)
    broken.graph.node[0].op_type = "NoSuchOperator"
    outputs, name = reference_outputs(graph, broken, feeds)
    assert name.startswith("numpy reference (onnxruntime failed: ") and "NoSuchOperator" in name
    assert relative_error(outputs, onnxruntime_outputs(models.export_onnx(graph), feeds)) < 1e-4


def test_zero_dimensional_inputs_are_sampled_as_arrays_onnxruntime_takes():
    """A 0-d bool input was sampled as a numpy.bool_ scalar: onnxruntime refused it, and `models run --onnx`
    checked the model against the numpy reference only."""
    from onnx import TensorProto, helper
    node = helper.make_node("Where", ["flag", "x", "y"], ["z"])
    inputs = [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in "xy")]
    model = helper.make_model(helper.make_graph([node], "w", inputs, [helper.make_tensor_value_info(
        "z", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    graph = tg.from_onnx(model)
    feeds = sample_inputs(graph)
    assert all(isinstance(a, np.ndarray) and a.shape == () for a in feeds.values())
    outputs, name = reference_outputs(graph, model, feeds)
    assert name == "onnxruntime"
    assert outputs[0] == (feeds["x"] if feeds["flag"] else feeds["y"])


def test_the_tolerance_follows_the_least_precise_tensor_inside_the_graph():
    """An f16 model with f32 inputs and outputs (onnxconverter's keep_io_types) was checked at f32's 1e-3: a
    correct run, as far from onnxruntime as the numpy reference is, reported MISMATCH."""
    from models.inference import tolerance
    from taskdsl.graph import ops
    x = tg.input("x", (4, 8), "float32")
    inside = ops.matmul(ops.cast(x, "float16"), np.ones((8, 3), np.float16))
    assert tolerance(tg.Graph([x], [ops.cast(inside, "float32")])) == TOLERANCE["float16"]
    assert tolerance(tg.Graph([x], [ops.relu(x)])) == 1e-3


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_weights_left_out_of_the_export_give_onnxruntime_the_same_outputs(name):
    """export_onnx(weights=...) leaves each constant of EXTERNAL_BYTES or more out of the model, as an array in the
    dict and a reference to external data in the model; onnxruntime, given the arrays, computes what it computes on
    the whole model."""
    from models.inference import onnxruntime_session
    from models.onnx_export import EXTERNAL_BYTES
    graph, feeds = small(name)
    whole = models.export_onnx(graph)
    weights: dict = {}
    slim = models.export_onnx(graph, weights=weights)
    large = {t.name: t for t in whole.graph.initializer if len(t.raw_data) >= EXTERNAL_BYTES}
    assert large and set(weights) == set(large)
    for t in slim.graph.initializer:
        if t.name in weights:
            assert t.data_location == t.EXTERNAL and not t.raw_data and tuple(t.dims) == weights[t.name].shape
            np.testing.assert_array_equal(weights[t.name], onnx_numpy.to_array(large[t.name]))
    assert [t.name for t in slim.graph.input] == [t.name for t in whole.graph.input]
    for got, want in zip(onnxruntime_session(slim, weights).run(None, feeds), onnxruntime_outputs(whole, feeds)):
        np.testing.assert_array_equal(got, want)
    assert reference_outputs(graph, slim, feeds, weights=weights)[1] == "onnxruntime"
