"""The graph executor on the cuda target, run on a simulated GPU (tests/simulated_gpu.py): activations stay
on the device, constants are copied once, and a call replays one CUDA graph with new inputs.

The oracle is the graph's numpy reference evaluator (Graph.reference). On a real GPU the same
checks run in tests/test_gpu.py."""
import numpy as np
import pytest

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops

from . import assert_close, rand

LARGEST_HOST_ARGUMENT = 1024   # bytes: index tables and slice bounds, never an activation


def small_net():
    """A conv + batch norm + relu, a pooled matmul with bias and gelu, softmax and layer norm, views."""
    x = tg.input("x", (2, 3, 9, 9))
    w = tg.constant(rand((8, 3, 3, 3), 1, low=-0.5, high=0.5))
    y = ops.relu(ops.batch_norm(ops.conv2d(x, w, padding=1), rand((8,), 2), rand((8,), 3, low=0.5, high=1.5),
                                rand((8,), 4), rand((8,), 5)))
    y = ops.reshape(ops.max_pool2d(y, 3, 3), (2, 8 * 3 * 3))                  # (2, 72)
    h = ops.gelu(ops.add(ops.matmul(y, tg.constant(rand((72, 40), 6, low=-0.2, high=0.2))), rand((40,), 7)))
    t = ops.transpose(ops.reshape(h, (2, 5, 8)), (0, 2, 1))                   # (2, 8, 5)
    s = ops.softmax(ops.concat([t, ops.slice(t, [0], [2], axes=[2])], axis=2), axis=-1)
    n = ops.layer_norm(ops.reshape(s, (2, 8 * 7)), rand((56,), 8), rand((56,), 9))
    return tg.Graph([x], [n, ops.sum(h, 1)], name="small_net")


def test_activations_stay_on_the_device(simulated_gpu):
    g = small_net()
    cg = g.compile(target="cuda", cuda_graph=False)
    simulated_gpu.launches.clear()
    x = rand((2, 3, 9, 9), 10)
    outputs = cg(x)
    for got, want in zip(outputs, g.reference(x)):
        assert isinstance(got, np.ndarray)
        assert_close(got, want, rtol=2e-4)
    assert len(simulated_gpu.launches) == len(cg.kernels) >= 6
    for kernel, values in simulated_gpu.launches:
        host = [v.nbytes for v in values if isinstance(v, np.ndarray)]
        assert max(host, default=0) <= LARGEST_HOST_ARGUMENT, (kernel.name, host)
        assert any(isinstance(v, td.DeviceArray) for v in values), kernel.name
    assert cg.cuda_graph == "off (cuda_graph=False)"


def test_constants_are_copied_once(simulated_gpu, monkeypatch):
    from taskdsl.graph import executor
    uploads = []
    real = executor.to_device
    monkeypatch.setattr(executor, "to_device", lambda a: uploads.append(np.shape(a)) or real(a))
    g = small_net()
    cg = g.compile(target="cuda", cuda_graph=False)
    compiled = len(uploads)
    cg(rand((2, 3, 9, 9), 11))
    cg(rand((2, 3, 9, 9), 12))
    assert len(uploads) == compiled + 2        # one input per call, no constant again
    assert len(cg._constants) == compiled - 1  # the warm-up uploaded its input and every constant once


def test_calls_replay_one_cuda_graph(simulated_gpu):
    g = small_net()
    cg = g.compile(target="cuda")
    assert cg.cuda_graph.startswith("on (") and f"{len(cg.kernels)} kernels" in cg.cuda_graph
    assert simulated_gpu.replays == 2           # compile checked two replays of probe inputs against a run
    launches = len(simulated_gpu.launches)
    for seed in (20, 21, 22):                  # new inputs each time: the graph must read them
        x = rand((2, 3, 9, 9), seed)
        for got, want in zip(cg(x), g.reference(x)):
            assert_close(got, want, rtol=2e-4)
    assert simulated_gpu.replays == 2 + 3 and len(simulated_gpu.launches) == launches   # no eager launch
    assert "CUDA graph replay: on" in cg.summary()


def test_run_on_device_leaves_outputs_on_the_gpu(simulated_gpu):
    x = tg.input("x", (4, 6))
    g = tg.Graph([x], [ops.tanh(x), ops.max(x, 1)])
    for replay in (False, True):
        cg = g.compile(target="cuda", cuda_graph=replay)
        xa = rand((4, 6), 5)
        outputs = cg.run_on_device(td.to_device(xa))
        assert all(isinstance(a, td.DeviceArray) for a in outputs)
        for got, want in zip(outputs, g.reference(xa)):
            assert_close(got.numpy(), want, rtol=1e-5)
    with pytest.raises(ValueError, match="compiled for the cuda target"):
        g.compile(target="cpu").run_on_device(xa)


def test_run_on_device_never_hands_out_the_callers_input(simulated_gpu):
    """An output that is an input, or a view of one, comes back as a copy: writing the input later leaves it."""
    x = tg.input("x", (2, 3))
    g = tg.Graph([x], [x, ops.reshape(x, (6,)), ops.relu(x)])
    cg = g.compile(target="cuda", cuda_graph=False)
    xa = rand((2, 3), 4)
    dx = td.to_device(xa)
    outputs = cg.run_on_device(dx)
    assert all(isinstance(a, td.DeviceArray) and a.ptr != dx.ptr for a in outputs)
    dx.copy_from_host(np.full((2, 3), 7, np.float32))
    np.testing.assert_array_equal(outputs[0].numpy(), xa)
    np.testing.assert_array_equal(outputs[1].numpy(), xa.reshape(6))


def test_replay_takes_device_array_inputs(simulated_gpu):
    x = tg.input("x", (5, 7))
    g = tg.Graph([x], [ops.exp(ops.mul(x, 0.5)), x])
    cg = g.compile(target="cuda")
    xa = rand((5, 7), 3)
    y, same = cg(td.to_device(xa))
    assert_close(y, np.exp(xa * 0.5).astype(np.float32), rtol=1e-5)
    np.testing.assert_array_equal(same, xa)
    assert same is not xa


def test_host_reads_turn_replay_off(simulated_gpu):
    """Weights that are an input (not a constant) are packed on the host each run: no graph, still right."""
    x, w = tg.input("x", (1, 4, 6, 6)), tg.input("w", (5, 4, 3, 3))
    g = tg.Graph([x, w], [ops.conv2d(x, w)])
    cg = g.compile(target="cuda")
    assert cg.cuda_graph.startswith("off (") and "host" in cg.cuda_graph
    xa, wa = rand((1, 4, 6, 6), 1), rand((5, 4, 3, 3), 2)
    assert_close(cg(xa, wa)[0], g.reference(xa, wa)[0], rtol=2e-4)
    assert simulated_gpu.replays == 0


def test_device_arrays_reshape_and_refuse_numpy(simulated_gpu):
    a = td.to_device(np.arange(12, dtype=np.float32))
    b = a.reshape(3, -1)
    assert b.shape == (3, 4) and b.ptr == a.ptr
    np.testing.assert_array_equal(b.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5, -1)
    with pytest.raises(TypeError, match=r"GPU memory.*\.numpy\(\)"):
        np.asarray(a)
    np.testing.assert_array_equal(td.to_device(np.ones(3, np.float32)).zero().numpy(), np.zeros(3, np.float32))
    scalar = td.to_device(np.float32(2.5))           # 0-d stays 0-d (np.ascontiguousarray would make it 1-d)
    assert scalar.shape == () and scalar.numpy() == np.float32(2.5)


def zeroing_exp(monkeypatch):
    """exp(x) of a graph whose elementwise results are zero-filled (a memset) after their kernel."""
    from taskdsl.graph import runners
    from taskdsl.graph.ops import Elementwise
    run_elementwise = runners.RUNNERS[Elementwise]

    def then_zeroed(op, arrays):
        outs, kernels = run_elementwise(op, arrays)
        outs[0].zero()
        return outs, kernels

    monkeypatch.setitem(runners.RUNNERS, Elementwise, then_zeroed)
    x = tg.input("x", (4, 5))
    return tg.Graph([x], [ops.exp(x)])


def test_fills_outside_kernels_turn_replay_off(simulated_gpu, monkeypatch):
    """A memset between kernels is not a launch: a CUDA graph of the launches would lose it, so none is made."""
    cg = zeroing_exp(monkeypatch).compile(target="cuda")
    assert cg.cuda_graph.startswith("off (the run filled or copied GPU memory outside kernels 1 time(s)")
    np.testing.assert_array_equal(cg(rand((4, 5), 1))[0], np.zeros((4, 5), np.float32))
    assert simulated_gpu.replays == 0


def test_probe_catches_what_a_capture_lost(simulated_gpu, monkeypatch):
    """Work nobody counted (the memset, with its count switched off) is caught by replaying probe inputs."""
    from taskdsl.runtime import device_array
    monkeypatch.setattr(device_array, "_count_memory_op", lambda: None)
    cg = zeroing_exp(monkeypatch).compile(target="cuda")
    assert cg.cuda_graph.startswith("off (a replay on probe inputs gave another output 0 than a run")
    assert cg.replay == cg.cuda_graph
    np.testing.assert_array_equal(cg(rand((4, 5), 1))[0], np.zeros((4, 5), np.float32))


def test_a_split_k_matmul_alone_replays_as_a_cuda_graph(simulated_gpu, monkeypatch):
    """A matmul with nothing fused, whose small output splits K on a GPU of 132 SMs, uploaded its batch index to
    the GPU at each call: a copy outside kernels, so the graph's CUDA-graph replay was turned off. The index goes
    with the launch's arguments, as the unsplit kernel's does."""
    from ..simulated_gpu import _Device
    monkeypatch.setattr(_Device.properties, "multiprocessor_count", 132)      # an H100's or H200's SMs
    a = tg.input("a", (2, 512))
    w = rand((512, 8), 1, low=-0.5, high=0.5)
    g = tg.Graph([a], [ops.matmul(a, tg.constant(w))])
    cg = g.compile(target="cuda")
    assert cg.cuda_graph == "on (2 kernels in one CUDA graph)"      # the partials, then their sum
    for seed in (30, 31):
        x = rand((2, 512), seed)
        assert_close(cg(x)[0], x @ w, rtol=1e-4, atol=1e-5)
