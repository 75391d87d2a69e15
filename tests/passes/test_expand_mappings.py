"""expand_mappings: task-mapping loops -> plain loops and index arithmetic (IR in, IR out)."""
import numpy as np
from hypothesis import given, settings, strategies as st

import taskdsl as td
from taskdsl import ir, repeat, spatial
from taskdsl.ir import types as T
from taskdsl.passes import expand_mappings, simplify

from .ir_eval import run


def _mapping_kernel(mapping, block: int):
    """IR of: for t in mapping(threadIdx.x): out[t] = threadIdx.x."""
    rank = len(mapping.task_shape)
    out = ir.Buffer("out", T.i32, tuple(ir.const(d) for d in mapping.task_shape))
    loop_vars = tuple(ir.Var(f"t{d}", T.i32, kind="loop") for d in range(rank))
    tid = td.threadIdx.x
    body = ir.Store(out, loop_vars, tid)
    fn = ir.Function("k", (out,), (), ir.ForMapping(loop_vars, mapping, tid, body), (block, 1, 1))
    return simplify(expand_mappings(fn))


def _tasks_per_worker(fn, block: int) -> dict:
    tasks = {}
    for w in range(block):
        trace = []
        run(fn.body, {}, (w, 0, 0), trace)
        tasks[w] = [idx for _, idx, _ in trace]
    return tasks


@st.composite
def mappings(draw):
    rank = draw(st.integers(1, 3))
    atoms = []
    for _ in range(draw(st.integers(1, 3))):
        dims = tuple(draw(st.integers(1, 4)) for _ in range(rank))
        ranks = draw(st.permutations(range(rank))) if draw(st.booleans()) else None
        atoms.append((spatial if draw(st.booleans()) else repeat)(*dims, ranks=ranks))
    m = atoms[0]
    for a in atoms[1:]:
        m = m * a
    return m


@settings(max_examples=60, deadline=None)
@given(m=mappings(), extra=st.integers(0, 3))
def test_lowered_loops_run_exactly_the_tasks_of_each_worker(m, extra):
    block = m.num_workers + extra          # threads beyond the mapping's workers must do nothing
    fn = _mapping_kernel(m, block)
    assert not ir.collect(fn.body, ir.ForMapping)
    tasks = _tasks_per_worker(fn, block)
    for w in range(block):
        expected = m(w) if w < m.num_workers else []
        assert tasks[w] == expected, (repr(m), w)


def test_exact_worker_count_needs_no_guard():
    fn = _mapping_kernel(spatial(4, 8) * repeat(2, 2), 32)
    assert not ir.collect(fn.body, ir.If)
    guarded = _mapping_kernel(spatial(4, 8) * repeat(2, 2), 64)
    assert len(ir.collect(guarded.body, ir.If)) == 1


def test_register_index_arithmetic_simplifies_to_the_repeat_loop_variable():
    acc = ir.Buffer("acc", T.f32, (ir.const(4), ir.const(4)), "register")
    i, j = ir.Var("i", T.i32, kind="loop"), ir.Var("j", T.i32, kind="loop")
    body = ir.Store(acc, (i % 4, j % 4), ir.const(0.0))
    m = spatial(16, 16) * repeat(4, 4)
    fn = ir.Function("k", (), (), ir.ForMapping((i, j), m, td.threadIdx.x, body), (256, 1, 1))
    text = ir.stmt_str(simplify(expand_mappings(fn)).body)
    assert "acc[i_r1, j_r1] = 0.0" in text, text


def test_custom_mapping_lowers_through_its_function():
    m = td.TaskMapping((8,), 2, lambda w: [(w * 4 + k,) for k in range(4)])
    fn = _mapping_kernel(m, 2)
    assert _tasks_per_worker(fn, 2) == {0: [(0,), (1,), (2,), (3,)], 1: [(4,), (5,), (6,), (7,)]}


def test_end_to_end_kernel_uses_the_lowered_mapping():
    m = spatial(2, 4, ranks=[1, 0]) * repeat(3, 1)

    @td.kernel(grid=1, block=8)
    def owner(Out: td.i32[6, 4]):
        for a, b in m(td.threadIdx.x):
            Out[a, b] = td.threadIdx.x

    out = np.full((6, 4), -1, np.int32)
    owner(out)
    np.testing.assert_array_equal(out, m.worker_of())
