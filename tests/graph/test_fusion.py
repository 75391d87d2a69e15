"""Fusion partitioning: anchors (matmul, conv2d) with their prologues / epilogues become one kernel.

Oracle: the graph's numpy reference (the evaluation of the operators' compute definitions),
and for the BERT layer an independent numpy implementation.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
import taskdsl.graph as tg
from taskdsl.graph import ops
from taskdsl.compute import evaluate, placeholder
from taskdsl.graph import fusion
from taskdsl.graph.fusion import FusedAnchor, _view, partition
from stdlib_ops import gemm

RNG = np.random.default_rng(0)


def _const(*shape, scale=1.0):
    return tg.constant((RNG.standard_normal(shape) * scale).astype(np.float32))


def _run(g, *arrays):
    td.set_target("cpu")
    cg = g.compile(channels_last=False)     # the NCHW kernels these tests name (test_channels_last.py: NHWC)
    out = cg(*arrays)
    for got, want in zip(out, g.reference(*arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return cg


def test_conv_bn_relu_is_one_kernel():
    """Conv-BN-ReLU is one fused node; its GEMM, batch norm and ReLU one kernel. On the cpu a conv
    with a window first copies its input into im2col columns (with the prologue, if any, fused there)."""
    x = tg.input("x", (2, 40, 9, 7))
    var = tg.constant(RNG.random(16).astype(np.float32) + 0.5)

    def conv_bn_relu(t, ks):
        y = ops.conv2d(t, _const(16, 40, ks, ks, scale=0.2), padding=ks // 2)
        return ops.relu(ops.batch_norm(y, _const(16), var, _const(16), _const(16)))

    data = RNG.standard_normal((2, 40, 9, 7)).astype(np.float32)
    pointwise = _run(tg.Graph([x], [conv_bn_relu(x, 1)]), data)
    assert [op.kind for op in pointwise.graph.nodes] == ["fused"] and len(pointwise.kernels) == 1
    window = _run(tg.Graph([x], [conv_bn_relu(x, 3)]), data)
    assert [op.kind for op in window.graph.nodes] == ["fused"]
    gemm_name = gemm.plan((2, 63, 360), (1, 360, 16), td.f32, "cpu").kernel(packed_b=True, transposed_a=True).name \
        + "_fused"
    assert [k.name for k in window.kernels] == ["im2col_f32", gemm_name]
    prologue = _run(tg.Graph([x], [conv_bn_relu(ops.sigmoid(x), 3)]), data)
    fused, = prologue.graph.nodes
    assert list(fused.prologues) == [0] and [k.name for k in prologue.kernels] == ["im2col_f32_fused", gemm_name]


def test_small_channel_and_depthwise_convs_of_a_mobilenet_block():
    """A 1x1 conv over 16 channels (a reduction of 16) fuses with its BN and ReLU6 into one GEMM kernel;
    a depthwise 3x3 (groups = channels) runs as its own direct reduce; values match the reference."""
    x = tg.input("x", (1, 16, 10, 9))
    var = tg.constant(RNG.random(24).astype(np.float32) + 0.5)
    y = ops.clip(ops.batch_norm(ops.conv2d(x, _const(24, 16, 1, 1, scale=0.3)), _const(24), var, _const(24),
                                _const(24)), 0.0, 6.0)
    z = ops.conv2d(y, _const(24, 1, 3, 3, scale=0.3), padding=1, groups=24)
    data = RNG.standard_normal((1, 16, 10, 9)).astype(np.float32)
    cg = _run(tg.Graph([x], [z]), data)
    assert [op.kind for op in cg.graph.nodes] == ["fused", "conv2d"]
    assert [k.name for k in cg.kernels][0].startswith("tile_matmul") and len(cg.kernels) == 2


@pytest.mark.parametrize("shape, stride, kernel", [((1, 6, 11, 9), 1, "conv_direct_plane_f32_fused"),
                                                  ((1, 6, 11, 9), 2, "conv_direct_plane_f32_fused"),
                                                  ((1, 6, 100, 100), 2, "conv_direct_rows_f32_fused")])
def test_a_depthwise_conv_with_prologue_and_epilogue_is_one_direct_kernel(shape, stride, kernel):
    """relu -> depthwise 3x3 (two outputs per channel) -> BN -> ReLU6: on the cpu, one direct kernel (the
    phase planes of a small input, else rows: strided, phases over STRIDED_PLANE) with the relu in its loads and the (folded) BN shift and clip
    in its stores."""
    x = tg.input("x", shape)
    var = tg.constant(RNG.random(12).astype(np.float32) + 0.5)
    y = ops.conv2d(ops.relu(x), _const(12, 1, 3, 3, scale=0.3), stride=stride, padding=1, groups=6)
    z = ops.clip(ops.batch_norm(y, _const(12), var, _const(12), _const(12)), 0.0, 6.0)
    cg = _run(tg.Graph([x], [z]), RNG.standard_normal(shape).astype(np.float32))
    fused, = cg.graph.nodes
    assert isinstance(fused, FusedAnchor) and [m.kind for m in fused.prologues.values()] == ["relu"]
    assert list(fused.attrs["epilogue"]) == ["add", "clip"]
    assert [k.name for k in cg.kernels] == [kernel]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("groups", [4, 2])
def test_a_grouped_gemm_convolution_fuses_its_prologue_and_epilogue_on_the_cpu(groups, channels_last):
    """relu -> a grouped 3x3 convolution of 4 or 6 channels a group (the cpu's GEMMs batched over the groups, not
    the direct rows) -> BN -> ReLU6 is one fused node: its GEMM's output, channels split by group, is viewed as the
    graph's (group, channel) axis for the epilogue. NCHW (the columns) and NHWC (the indirect GEMM)."""
    td.set_target("cpu")
    x = tg.input("x", (2, 8 * groups, 7, 9))
    var = tg.constant(RNG.random(6 * groups).astype(np.float32) + 0.5)
    y = ops.conv2d(ops.relu(x), _const(6 * groups, 8, 3, 3, scale=0.3), padding=(1, 2), groups=groups)
    z = ops.conv2d(ops.clip(ops.batch_norm(y, *(_const(6 * groups) for _ in range(2)), var, _const(6 * groups)),
                            0.0, 6.0), _const(5, 6 * groups, 1, 1, scale=0.3))
    g = tg.Graph([x], [z])
    data = RNG.standard_normal(x.shape).astype(np.float32)
    cg = g.compile(channels_last=channels_last)
    np.testing.assert_allclose(cg(data)[0], g.reference(data)[0], rtol=1e-4, atol=1e-4)
    grouped, = [op for op in cg.graph.nodes if isinstance(op, FusedAnchor) and op.anchor.attrs["groups"] > 1]
    assert [m.kind for m in grouped.prologues.values()] == ["relu"]
    assert list(grouped.attrs["epilogue"]) == ["batch_norm", "clip"]
    assert not any(op.kind in ("relu", "batch_norm", "clip") for op in cg.graph.nodes)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("shape", [(2, 6, 1, 7, 9), (2, 3, 2, 7, 9), (2, 7, 9, 1, 6)])
def test_a_convolution_whose_epilogue_ends_in_five_axes(shape, groups, channels_last):
    """A convolution (6 channels; one group or two) whose output is reshaped to five axes, then ReLU'd, is one fused
    node writing those five axes as they are; only the eager grouped kernel's own output splits the channel axis
    (a 5-D epilogue was taken for that split: a ValueError, or channels written in the wrong places)."""
    td.set_target("cpu")
    x = tg.input("x", (2, 4, 7, 9))
    y = ops.relu(ops.reshape(ops.conv2d(x, _const(6, 4 // groups, 3, 3, scale=0.3), padding=1, groups=groups), shape))
    g = tg.Graph([x], [y])
    data = RNG.standard_normal(x.shape).astype(np.float32)
    cg = g.compile(channels_last=channels_last)
    got, = cg(data)
    np.testing.assert_allclose(got, g.reference(data)[0], rtol=1e-4, atol=1e-4)
    assert got.shape == shape and [op.kind for op in cg.graph.nodes] == ["fused"]


def test_matmul_add_gelu_is_one_kernel_and_transposed_operands_fuse_as_prologues():
    a = tg.input("a", (2, 5, 40))
    b = tg.input("b", (24, 40))
    h = ops.gelu(ops.matmul(a, ops.transpose(b)) + _const(24))     # the transpose is a prologue of B
    cg = _run(tg.Graph([a, b], [h]), RNG.standard_normal((2, 5, 40)).astype(np.float32),
              RNG.standard_normal((24, 40)).astype(np.float32))
    fused, = cg.graph.nodes
    assert isinstance(fused, FusedAnchor) and list(fused.prologues) == [1]
    assert list(fused.attrs["epilogue"]) == ["add", "gelu"] and len(cg.kernels) == 1


@pytest.mark.parametrize("rows", [1, 5])
def test_cheap_producers_of_an_epilogues_broadcast_operands_fuse(rows):
    """An epilogue member's smaller operand made by a cheap elementwise operator read by it alone (s * 3 below,
    broadcast over the product's columns) is computed in the fused kernel; a transcendental one (exp) or one read
    elsewhere too is a kernel of its own."""
    x, s = tg.input("x", (2, rows, 40)), tg.input("s", (2, rows, 1))
    w = _const(40, 24)
    arrays = RNG.standard_normal((2, rows, 40)).astype(np.float32), RNG.standard_normal((2, rows, 1)).astype(np.float32)
    fused = _run(tg.Graph([x, s], [ops.relu(ops.matmul(x, w) - s * 3.0)]), *arrays)
    assert [op.kind for op in fused.graph.nodes] == ["fused"] and len(fused.kernels) == 1
    assert list(fused.graph.nodes[0].attrs["epilogue"]) == ["mul", "sub", "relu"]
    shared = s * 3.0
    for outputs in ([ops.matmul(x, w) - ops.exp(s)], [ops.matmul(x, w) - shared, ops.sigmoid(shared)]):
        apart = _run(tg.Graph([x, s], outputs), *arrays)
        fused_node, = (op for op in apart.graph.nodes if isinstance(op, FusedAnchor))
        assert list(fused_node.attrs["epilogue"]) == ["sub"] and len(apart.graph.nodes) == 1 + len(outputs)


def _split_k_matmul_with_epilogue():
    """A fused matmul whose output has too few tiles on a GPU: the kernel (with B's transpose as its prologue)
    writes f32 partials, the second sums them with bias, GELU and a residual input fused in; CUDA-graph
    replay or not, on new inputs. 25 k tiles of 8: split 4 on 4 SMs (simulated) and on 132 alike."""
    x = tg.input("x", (1, 9, 200))
    bt = tg.input("bt", (24, 200))
    r = tg.input("r", (1, 9, 24))
    g = tg.Graph([x, bt, r], [ops.gelu(ops.matmul(x, ops.transpose(bt)) + _const(24)) + r])
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in ((1, 9, 200), (24, 200), (1, 9, 24))]
    for replay in (False, True):
        cg = g.compile(target="cuda", cuda_graph=replay)
        fused, = cg.graph.nodes
        assert isinstance(fused, FusedAnchor) and list(fused.attrs["epilogue"]) == ["add", "gelu", "add"]
        assert fused._builds["cuda", None].plan.split == 4
        assert len(cg.kernels) == 2 and cg.kernels[1].name.startswith("split_k")
        for seed in (1, 2):
            arrays[0] = np.random.default_rng(seed).standard_normal((1, 9, 200)).astype(np.float32)
            got, = cg(*arrays)
            np.testing.assert_allclose(got, g.reference(*arrays)[0], rtol=1e-4, atol=1e-4)


def test_gpu_matmuls_with_few_tiles_split_k_and_sum_with_the_epilogue(simulated_gpu):
    _split_k_matmul_with_epilogue()


@pytest.mark.gpu
def test_split_k_fused_matmul_on_a_gpu():
    _split_k_matmul_with_epilogue()


def test_constant_weights_are_packed_once_and_computed_ones_are_not():
    """On the cpu a matmul by a constant (unfused, or fused with its epilogue) runs the kernel that reads B
    as panels packed once; a B computed by the graph keeps the kernel that packs its own panels per call. (67
    columns: the kernel for small matrices, `matmul_small`, reads any B as it is.)"""
    x = tg.input("x", (3, 7, 61))
    b = tg.input("b", (61, 67))
    w = _const(61, 67)
    outputs = [ops.matmul(x, w), ops.relu(ops.matmul(x, w) + _const(67)), ops.matmul(x, b)]
    g = tg.Graph([x, b], outputs)
    arrays = [RNG.standard_normal((3, 7, 61)).astype(np.float32), RNG.standard_normal((61, 67)).astype(np.float32)]
    cg = _run(g, *arrays)
    kinds = sorted(("packed " if "_packed" in k.name else "") + ("fused" if k.name.endswith("_fused") else "alone")
                   for k in cg.kernels)
    assert kinds == ["alone", "packed alone", "packed fused"]
    arrays[0] = arrays[0] * 2.0 - 1.0       # the packed weights stay valid for new inputs
    for got, want in zip(cg(*arrays), g.reference(*arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_what_does_not_fuse():
    x = tg.input("x", (4, 16))
    w = _const(16, 16)
    y = ops.matmul(x, w)
    twice = ops.relu(y) + ops.sigmoid(y)            # y has two readers: no epilogue
    reduced = ops.sum(ops.matmul(x, w), 1)  # a reduction is no epilogue
    g = tg.Graph([x], [twice, reduced])
    assert partition(g) is g
    out = tg.Graph([x], [ops.relu(y), y])           # y is a graph output: stored, so no epilogue
    assert not any(isinstance(op, FusedAnchor) for op in partition(out).nodes)
    _run(g, RNG.standard_normal((4, 16)).astype(np.float32))


def test_an_add_two_anchors_could_fuse_joins_the_first():
    """Both matmuls' outputs have one reader, the add; the first anchor in order takes it (and the relu),
    the second is stored for it to read."""
    x = tg.input("x", (4, 16))
    first, second = ops.matmul(x, _const(16, 16)), ops.matmul(ops.sigmoid(x), _const(16, 16))
    g = tg.Graph([x], [ops.relu(first + second)])
    fused = [op for op in partition(g).nodes if isinstance(op, FusedAnchor)]
    assert [(op.anchor.inputs[0].producer is None, list(op.attrs["epilogue"])) for op in fused] == \
        [(False, []), (True, ["add", "relu"])]
    _run(g, RNG.standard_normal((4, 16)).astype(np.float32))


def test_partitioning_builds_each_operator_a_bounded_number_of_times(monkeypatch):
    """One walk: a chain of 24 matmul + relu groups builds O(24) operators (rebuilding the rest of the graph
    after each group, as it once did, built 576 here and took 6.5 s on BERT)."""
    x = tg.input("x", (4, 16))
    t = x
    for _ in range(24):
        t = ops.relu(ops.matmul(t, _const(16, 16, scale=0.25)))
    g = tg.Graph([x], [t])
    built = []
    original = FusedAnchor.__init__
    monkeypatch.setattr(tg.Operator, "clone", lambda op, inputs: built.append(op) or type(op)(inputs, op.attrs))
    monkeypatch.setattr(FusedAnchor, "__init__", lambda op, *a: built.append(op) or original(op, *a))
    assert [op.kind for op in partition(g).nodes] == ["fused"] * 24
    assert len(built) <= 3 * 24
    monkeypatch.undo()
    _run(g, RNG.standard_normal((4, 16)).astype(np.float32))


def bert_layer(x, hidden: int, heads: int, ffn: int):
    """One BERT encoder layer (post-norm), traced with graph ops."""
    seq = x.shape[1]
    d = hidden // heads

    def split_heads(t):
        return ops.transpose(ops.reshape(t, (1, seq, heads, d)), (0, 2, 1, 3))

    q, k, v = (split_heads(ops.linear(x, _const(hidden, hidden, scale=0.2), _const(hidden))) for _ in range(3))
    scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * (1.0 / np.sqrt(d))
    context = ops.matmul(ops.softmax(scores, axis=-1), v)
    context = ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (1, seq, hidden))
    attn = ops.linear(context, _const(hidden, hidden, scale=0.2), _const(hidden))
    h = ops.layer_norm(attn + x, _const(hidden), _const(hidden))
    ff = ops.linear(ops.gelu(ops.linear(h, _const(ffn, hidden, scale=0.2), _const(ffn))),
                    _const(hidden, ffn, scale=0.2), _const(hidden))
    return ops.layer_norm(ff + h, _const(hidden), _const(hidden))


def test_bert_layer_kernel_count():
    """Eight matmuls (q, k, v, scores, context, attention output, two FFN); what fuses:

    q/k/v projections: bias add + head split (reshape, transpose; for k also the
    transpose for the scores) as epilogues                                   -> 3 kernels;
    scores: the 1/sqrt(d) scale as epilogue                                  -> 1, softmax -> 1;
    context: its transpose + reshape back to (seq, hidden)                   -> 1;
    attention output: bias + residual add                                    -> 1, layer norm -> 1;
    FFN: bias + gelu -> 1, bias + residual -> 1, layer norm -> 1.          total 11 kernels
    (unfused: 8 matmuls + 7 adds + 3 reshapes + 5 transposes + mul + gelu + softmax + 2 norms).
    """
    hidden, heads, ffn, seq = 32, 2, 64, 8
    x = tg.input("x", (1, seq, hidden))
    g = tg.Graph([x], [bert_layer(x, hidden, heads, ffn)])
    cg = _run(g, RNG.standard_normal((1, seq, hidden)).astype(np.float32))
    kinds = [op.kind for op in cg.graph.nodes]
    assert kinds.count("fused") == 8 and len(cg.kernels) == 11, kinds


@settings(max_examples=40, deadline=None)
@given(src=st.lists(st.sampled_from([1, 2, 3, 5, 6]), min_size=1, max_size=4), data=st.data())
def test_a_view_reads_its_operand_in_row_major_order(src, data):
    """The computes that read a fused operand as the matmul's 3-D shape (and C as the output's shape) agree with
    numpy's reshape for any regrouping of the axes, size-1 axes included: the oracle is np.reshape."""
    factors = [f for n in src for f in _prime_factors(n)]
    order = data.draw(st.permutations(factors))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(order)), max_size=3)))
    dst = tuple(math.prod(order[a:b]) for a, b in zip([0] + cuts, cuts + [len(order)]))
    dst = tuple(sorted(dst, key=lambda _: data.draw(st.integers(0, 3))))       # any order of the group sizes
    x = placeholder("x", td.f32, tuple(src))
    value = np.arange(math.prod(src), dtype=np.float32).reshape(src)
    got, = evaluate([x], [_view(x, dst, "v")], [value])
    np.testing.assert_array_equal(got, value.reshape(dst))


def _prime_factors(n: int) -> list:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out or [1]


def test_matmuls_of_one_constant_share_its_packed_panels(monkeypatch):
    """An unrolled recurrence multiplies every step by one constant: the matmuls of one plan pack it once and read
    the same panels (packing it per step, an LSTM's 32 steps kept 32 MiB of panels and ran 3x slower); a matmul of
    another plan (more rows) packs its own."""
    panels = []
    packed_b = fusion.packed_b
    monkeypatch.setattr(fusion, "packed_b", lambda *args: panels.append(packed_b(*args)) or panels[-1])
    w = _const(64, 96, scale=0.1)
    x, rows = tg.input("x", (1, 64)), tg.input("rows", (40, 64))
    h, outputs = x, []
    for step in range(3):           # each step's product feeds the next: (1, 96) -> tanh -> its first 64 columns
        y = ops.tanh(ops.add(ops.matmul(h, w), 0.5 * step))
        outputs.append(y)
        h = ops.slice(y, [0], [64], axes=[1])
    outputs.append(ops.relu(ops.matmul(rows, w)))
    g = tg.Graph([x, rows], outputs)
    cg = _run(g, RNG.standard_normal((1, 64)).astype(np.float32), RNG.standard_normal((40, 64)).astype(np.float32))
    assert sum(k.name.startswith(("rows_matmul", "tile_matmul")) for k in cg.kernels) == 4
    assert len(panels) == 4 and panels[0] is panels[1] is panels[2] is not panels[3]


def test_a_transcendental_prologue_fuses_only_where_each_element_is_loaded_once():
    """A fused A operand is computed by each of the N / BN column blocks that load it: sigmoid(x) fuses into a
    product of one column block, not into one of many (a GRU step's sigmoid(...) * h ran four times over); a
    cheap prologue fuses either way."""
    x = tg.input("x", (3, 64))
    data = RNG.standard_normal((3, 64)).astype(np.float32)
    for n, prologue, fuses in ((8, ops.sigmoid, True), (1024, ops.sigmoid, False), (1024, ops.relu, True)):
        w = _const(64, n, scale=0.1)
        p = gemm.plan((3, 64), (64, n), td.f32, "cpu")
        assert (p.operand_reads[0] == 1) == (n == 8)
        cg = _run(tg.Graph([x], [ops.matmul(prologue(x), w)]), data)
        assert [op.kind for op in cg.graph.nodes] == (["fused"] if fuses else [prologue.__name__, "matmul"])
