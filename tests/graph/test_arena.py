"""The executor's arena: activations placed by the memory plan, on the cpu and on a simulated GPU.

The oracle is the graph's numpy reference evaluator (Graph.reference): a misplaced
activation (two live values sharing memory) changes the outputs.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl.graph as tg
from taskdsl.graph import ops, runners
from taskdsl.graph.ops import Elementwise
from taskdsl.runtime.arrays import address, empty_like_operands

from . import UNFUSED, assert_close, rand

UNARY = {"exp": lambda t: ops.exp(ops.mul(t, 0.25)), "tanh": ops.tanh, "relu": ops.relu, "neg": ops.neg}


def chain(n: int, shape=(64, 33)) -> tg.Graph:
    """x -> n unary ops in a row: two activations are live at a time (compiled with the UNFUSED passes, which
    keep the operators apart)."""
    x = tg.input("x", shape)
    y = x
    for k in range(n):
        y = list(UNARY.values())[k % len(UNARY)](y)
    return tg.Graph([x], [y], name="chain")


def in_arena(cg, array) -> bool:
    start = address(cg._arena.memory)
    return start <= address(array) < start + cg._arena.nbytes


def test_a_chain_reuses_two_slots_and_outputs_survive_the_next_call():
    g = chain(8)
    cg = g.compile(target="cpu", passes=UNFUSED)
    assert cg.arena.startswith("on (")
    slot = 64 * 33 * 4
    assert cg._arena.nbytes <= 2 * (slot + 64) < cg.memory.unshared_bytes
    x1, x2 = rand((64, 33), 1), rand((64, 33), 2)
    y1, = cg(x1)
    assert not in_arena(cg, y1)                  # outputs are the caller's: never arena memory
    y2, = cg(x2)
    assert_close(y1, g.reference(x1)[0])         # the second call did not overwrite the first's output
    assert_close(y2, g.reference(x2)[0])


def test_the_arena_leaves_out_the_outputs_room():
    """A language model's logits (here: a large last output) are the caller's, so the arena does not
    reserve memory for them: it is the plan without the outputs, far below the plan's peak."""
    x = tg.input("x", (8, 16))
    h = ops.tanh(ops.exp(ops.mul(x, 0.25)))
    big = ops.matmul(h, tg.constant(rand((16, 4096), 4)))          # 128 KiB, the graph's output
    g = tg.Graph([x], [big])
    cg = g.compile(target="cpu", passes=UNFUSED)
    small = 8 * 16 * 4
    assert cg.memory.peak_bytes >= 8 * 4096 * 4                   # the plan reports every activation
    assert 0 < cg._arena.nbytes <= 2 * (small + 64)               # the arena holds only the small ones
    y1, = cg(rand((8, 16), 1))
    y2, = cg(rand((8, 16), 2))
    assert_close(y1, g.reference(rand((8, 16), 1))[0])
    assert_close(y2, g.reference(rand((8, 16), 2))[0])


def test_activations_live_in_the_arena(monkeypatch):
    g = chain(4)
    cg = g.compile(target="cpu", passes=UNFUSED, replay=False)     # a replayed call runs no runners to spy on
    seen = []
    run = runners.run

    def spy(op, arrays):
        outs, kernels = run(op, arrays)
        seen.extend(outs)
        return outs, kernels

    monkeypatch.setattr(runners, "run", spy)
    cg(rand((64, 33), 3))
    assert len(seen) == len(cg.graph.nodes) > 2
    assert [in_arena(cg, a) for a in seen] == [True] * (len(seen) - 1) + [False]   # the last: the graph output


@st.composite
def dags(draw):
    """Random graphs over one (rows, cols) input: unary ops, binary ops on any two earlier values
    (long live ranges), row sums broadcast back, reshapes (views) and matmuls; up to three outputs."""
    rows, cols = draw(st.integers(1, 9)), draw(st.integers(1, 17))
    x = tg.input("x", (rows, cols))
    values = [x]
    for _ in range(draw(st.integers(1, 12))):
        a = draw(st.sampled_from(values))
        kind = draw(st.sampled_from(["unary", "binary", "rowsum", "view", "matmul"]))
        if kind == "unary":
            y = UNARY[draw(st.sampled_from(sorted(UNARY)))](a)
        elif kind == "binary":
            y = draw(st.sampled_from([ops.add, ops.mul, ops.sub]))(a, draw(st.sampled_from(values)))
        elif kind == "rowsum":
            y = ops.add(a, ops.sum(a, 1, keepdims=True))
        elif kind == "view":
            y = ops.reshape(ops.reshape(a, (rows * cols,)), (rows, cols))
        else:
            w = tg.constant(rand((cols, cols), len(values), low=-0.3, high=0.3))
            y = ops.matmul(a, w)
        values.append(y)
    outputs = draw(st.lists(st.sampled_from(values[1:]), min_size=1, max_size=3, unique_by=id))
    return tg.Graph([x], outputs, name="dag"), (rows, cols)


@settings(max_examples=25, deadline=None)
@given(dags(), st.integers(0, 2**16))
def test_random_graphs_match_the_reference_with_the_arena(case, seed):
    g, shape = case
    cg = g.compile(target="cpu")
    x1, x2 = rand(shape, seed, low=-1, high=1), rand(shape, seed + 1, low=-1, high=1)
    first = cg(x1)
    second = cg(x2)
    for got, want in zip(first + second, g.reference(x1) + g.reference(x2)):
        assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert cg.arena.startswith("on ("), cg.arena       # every runner put its results where the plan said


def test_an_output_aliasing_its_input_turns_the_arena_off(monkeypatch):
    """relu of exp(...) is its input: a runner that returns the input array itself would, with the arena,
    let the next operator overwrite a value still needed. The check catches it and the call is redone."""
    x = tg.input("x", (16, 16))
    e = ops.exp(ops.mul(x, 0.5))
    r = ops.relu(e)
    g = tg.Graph([x], [ops.add(ops.tanh(ops.neg(r)), r)], name="aliasing")
    run_elementwise = runners.RUNNERS[Elementwise]

    def lazy_relu(op, arrays):
        return ([arrays[0]], []) if op.kind == "relu" else run_elementwise(op, arrays)

    monkeypatch.setitem(runners.RUNNERS, Elementwise, lazy_relu)
    cg = g.compile(target="cpu", passes=UNFUSED)
    assert cg.arena.startswith("off (output 0 of relu") and "did not give it" in cg.arena
    xa = rand((16, 16), 4)
    assert_close(cg(xa)[0], g.reference(xa)[0])


def test_a_temporary_in_the_output_slot_turns_the_arena_off(monkeypatch):
    x = tg.input("x", (8, 8))
    g = tg.Graph([x], [ops.exp(ops.tanh(ops.neg(x)))], name="temporary")
    run_elementwise = runners.RUNNERS[Elementwise]

    def with_scratch(op, arrays):
        scratch = empty_like_operands(op.outputs[0].shape, np.float32, *arrays)   # takes the output's slot
        scratch.fill(0)
        return run_elementwise(op, arrays)

    monkeypatch.setitem(runners.RUNNERS, Elementwise, with_scratch)
    cg = g.compile(target="cpu", passes=UNFUSED)
    assert "other than its output" in cg.arena
    xa = rand((8, 8), 5)
    assert_close(cg(xa)[0], g.reference(xa)[0])


def test_arena_false_allocates_every_activation():
    g = chain(3)
    cg = g.compile(target="cpu", passes=UNFUSED, arena=False)
    assert cg.arena == "off (arena=False)" and "arena off (arena=False)" in cg.summary()
    xa = rand((64, 33), 6)
    assert_close(cg(xa)[0], g.reference(xa)[0])


def test_calls_from_threads_wait_for_each_other():
    g = chain(6, (32, 32))
    cg = g.compile(target="cpu", passes=UNFUSED)
    inputs = [rand((32, 32), s) for s in range(8)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda a: cg(a)[0], inputs))
    for a, y in zip(inputs, results):
        assert_close(y, g.reference(a)[0])


def test_the_arena_is_in_gpu_memory_on_cuda(simulated_gpu):
    g = chain(6, (16, 24))
    cg = g.compile(target="cuda", passes=UNFUSED)
    assert "of GPU memory" in cg.arena and cg.cuda_graph.startswith("on")
    start = address(cg._arena.memory)
    written = {address(v) for _, values in simulated_gpu.launches for v in values if hasattr(v, "ptr")}
    assert sum(start <= p < start + cg._arena.nbytes for p in written) >= 2
    for seed in (7, 8):                          # replays of the captured graph, on new inputs
        xa = rand((16, 24), seed)
        assert_close(cg(xa)[0], g.reference(xa)[0])
