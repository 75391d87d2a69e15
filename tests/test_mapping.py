"""Tests for taskdsl.mapping against an independent reference of the paper's definitions."""
import itertools
import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdsl import threadIdx
from taskdsl.mapping import (
    ComposedMapping,
    MappingLoop,
    RepeatMapping,
    SpatialMapping,
    TaskMapping,
    repeat,
    spatial,
    unravel,
)

SETTINGS = settings(max_examples=60, deadline=None)


# --- independent reference: a mapping is (num_workers, task_shape, fn) ---------------------------


def _order(dims, ranks):
    """Dimensions from most significant (rank 0) to least significant."""
    ranks = range(len(dims)) if ranks is None else ranks
    return sorted(range(len(dims)), key=lambda i: ranks[i])


def ref_spatial(dims, ranks=None):
    order = _order(dims, ranks)

    def fn(w):
        coords = np.unravel_index(w, [dims[i] for i in order])
        task = [0] * len(dims)
        for i, c in zip(order, coords):
            task[i] = int(c)
        return [tuple(task)]

    return math.prod(dims), tuple(dims), fn


def ref_repeat(dims, ranks=None):
    order = _order(dims, ranks)
    tasks = []
    for combo in itertools.product(*[range(dims[i]) for i in order]):
        task = [0] * len(dims)
        for i, c in zip(order, combo):
            task[i] = c
        tasks.append(tuple(task))
    return 1, tuple(dims), lambda w: list(tasks)


def ref_compose(f1, f2):
    (n1, d1, fn1), (n2, d2, fn2) = f1, f2

    def fn(w):
        return [
            tuple(a * d + b for a, b, d in zip(t1, t2, d2)) for t1 in fn1(w // n2) for t2 in fn2(w % n2)
        ]

    return n1 * n2, tuple(a * b for a, b in zip(d1, d2)), fn


# --- strategies ----------------------------------------------------------------------------------

# cap on each composed dimension so that task domains stay small
DIM_CAP = {1: 125, 2: 30, 3: 10}


@st.composite
def atom_lists(draw, rank=None, depth=None):
    """A list of (kind, dims, ranks) atoms of one rank whose composition stays small."""
    rank = draw(st.integers(1, 3)) if rank is None else rank
    depth = draw(st.integers(1, 3)) if depth is None else depth
    totals = [1] * rank
    atoms = []
    for _ in range(depth):
        dims = []
        for k in range(rank):
            d = draw(st.integers(1, min(5, DIM_CAP[rank] // totals[k])))
            totals[k] *= d
            dims.append(d)
        ranks = draw(st.none() | st.permutations(range(rank)).map(list))
        atoms.append((draw(st.sampled_from(["spatial", "repeat"])), tuple(dims), ranks))
    return atoms


def build(atom):
    kind, dims, ranks = atom
    factory, ref = (spatial, ref_spatial) if kind == "spatial" else (repeat, ref_repeat)
    return factory(*dims, ranks=ranks), ref(dims, ranks)


@st.composite
def mappings(draw):
    """A (mapping, reference) pair with a random grouping of the composition."""
    atoms = draw(atom_lists())

    def group(items):
        if len(items) == 1:
            return build(items[0])
        k = draw(st.integers(1, len(items) - 1))
        (m1, r1), (m2, r2) = group(items[:k]), group(items[k:])
        return m1 * m2, ref_compose(r1, r2)

    return group(atoms)


# --- properties ----------------------------------------------------------------------------------


@SETTINGS
@given(mappings())
def test_matches_reference(pair):
    m, (n, d, fn) = pair
    assert m.num_workers == n
    assert m.task_shape == d
    for w in range(n):
        assert m(w) == fn(w)
        tasks = m.on(np.int64(w))
        assert tasks == fn(w)
        assert all(type(t) is tuple and all(type(x) is int for x in t) for t in tasks)


@SETTINGS
@given(atom_lists(depth=3))
def test_associative(atoms):
    a, b, c = (build(atom)[0] for atom in atoms)
    left, right = (a * b) * c, a * (b * c)
    assert left == right and hash(left) == hash(right)
    assert left.atoms() == right.atoms() == [a, b, c]
    assert repr(left) == repr(right)
    assert left.num_workers == right.num_workers and left.task_shape == right.task_shape
    for w in range(left.num_workers):
        assert left(w) == right(w)


@SETTINGS
@given(mappings())
def test_builtins_cover_each_task_once(pair):
    m, _ = pair
    owner = m.worker_of()
    assert owner.shape == m.task_shape and owner.dtype == np.int64
    all_tasks = [t for w in range(m.num_workers) for t in m(w)]
    assert len(all_tasks) == len(set(all_tasks)) == math.prod(m.task_shape)
    for w in range(m.num_workers):
        for t in m(w):
            assert owner[t] == w


@SETTINGS
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=4).flatmap(
        lambda dims: st.tuples(st.just(dims), st.permutations(range(len(dims))), st.integers(0, math.prod(dims) - 1))
    )
)
def test_unravel_matches_numpy(args):
    dims, ranks, index = args
    assert unravel(index, dims) == tuple(int(c) for c in np.unravel_index(index, dims))
    assert unravel(index, dims, ranks) == ref_spatial(dims, ranks)[2](index)[0]


# --- ranks ---------------------------------------------------------------------------------------


def test_spatial_ranks():
    m = spatial(2, 3, ranks=[1, 0])
    assert m(1) == [(1, 0)]
    assert [m(w)[0] for w in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert spatial(2, 3)(1) == [(0, 1)]


def test_repeat_ranks():
    assert repeat(2, 2, ranks=[1, 0])(0) == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert repeat(2, 2)(0) == [(0, 0), (0, 1), (1, 0), (1, 1)]


# --- custom mappings and symbolic use -----------------------------------------------------------


def test_custom_strided_mapping():
    calls = []

    def strided(w):
        calls.append(w)
        return [(w,), (w + 2,)]

    m = TaskMapping((4,), 2, strided)
    assert m.worker_to_tasks is strided
    assert m(0) == [(0,), (2,)] and m(1) == [(1,), (3,)]
    assert calls == [0, 1]
    assert m(np.int64(1)) == [(1,), (3,)] and all(type(t) is int for t in m(np.int64(1))[0])
    assert m.worker_of().tolist() == [0, 1, 0, 1]
    composed = spatial(2) * m
    assert composed.task_shape == (8,) and composed.num_workers == 4
    assert composed(3) == [(5,), (7,)]  # outer task 1, inner worker 1 -> 4 + (1, 3)
    assert composed.atoms() == [spatial(2), m]
    assert repr(m) == "TaskMapping(task_shape=(4,), num_workers=2)"


def test_custom_column_major_mapping():
    m = TaskMapping((2, 3), 6, lambda w: [(w % 2, w // 2)])
    assert m.worker_of().tolist() == [[0, 2, 4], [1, 3, 5]]
    assert m.worker_of().tolist() == spatial(2, 3, ranks=[1, 0]).worker_of().tolist()


def test_custom_equality_is_identity():
    def fn(w):
        return [(w,)]

    a, b = TaskMapping((2,), 2, fn), TaskMapping((2,), 2, fn)
    assert a == a and a != b
    assert len({a, b, a}) == 2


def test_builtin_equality_is_structural():
    assert spatial(2, 3) == spatial(2, 3, ranks=[0, 1])
    assert spatial(2, 3) != spatial(2, 3, ranks=[1, 0])
    assert spatial(2) != repeat(2)
    assert hash(spatial(4) * repeat(2)) == hash(spatial(4) * repeat(2))
    assert {spatial(2, 2) * repeat(1, 2), spatial(2, 2) * repeat(1, 2)} == {spatial(2, 2) * repeat(1, 2)}


def test_classes_and_attributes():
    s, r = spatial(2, 3, ranks=(1, 0)), repeat(np.int64(4))
    assert isinstance(s, SpatialMapping) and s.dims == (2, 3) and s.ranks == (1, 0)
    assert isinstance(r, RepeatMapping) and r.dims == (4,) and r.ranks == (0,)
    c = spatial(2) * repeat(4)
    assert isinstance(c, ComposedMapping) and c.outer == spatial(2) and c.inner == repeat(4)
    assert repr(spatial(16, 16) * repeat(4, 4)) == "spatial(16, 16) * repeat(4, 4)"
    assert repr(s) == "spatial(2, 3, ranks=[1, 0])"


class Sym:
    """A symbolic stand-in that supports only + * // % and records the operations."""

    def __init__(self, text, log):
        self.text, self.log = text, log

    def _op(self, op, other):
        self.log.append(op)
        return Sym(f"({self.text} {op} {other})", self.log)

    def __floordiv__(self, other):
        return self._op("//", other)

    def __mod__(self, other):
        return self._op("%", other)


def test_unravel_symbolic():
    log = []
    coords = unravel(Sym("w", log), (2, 1, 3, 4))
    assert coords[1] == 0
    assert set(log) == {"//", "%"}
    for w in range(24):
        values = [c if isinstance(c, int) else eval(c.text, {"w": w}) for c in coords]
        assert tuple(values) == tuple(int(v) for v in np.unravel_index(w, (2, 1, 3, 4)))
    assert [c.text for c in unravel(Sym("w", []), (2, 3), ranks=[1, 0])] == ["(w % 2)", "((w // 2) % 3)"]


def test_symbolic_call_returns_mapping_loop():
    def fn(w):
        raise AssertionError("custom function must not be called on a symbolic worker")

    custom = TaskMapping((4,), 4, fn)
    for m in (spatial(4), spatial(2) * repeat(2), custom):
        w = threadIdx.x // 2
        loop = m(w)
        assert isinstance(loop, MappingLoop)
        assert loop.mapping is m and loop.worker is w
        assert isinstance(m.on(w), MappingLoop)


@pytest.mark.parametrize("worker", ["1", None, [1], np.array(1), 1 + 0j, True, 1.0])
def test_a_worker_that_is_neither_an_int_nor_a_kernel_value_is_a_type_error(worker):
    """A str, None, list, array or complex worker gave a MappingLoop, which failed later as 'not iterable'."""
    with pytest.raises(TypeError, match="worker index must be an int"):
        spatial(4)(worker)


def test_a_custom_task_must_hold_ints():
    with pytest.raises(ValueError, match="not a tuple of ints"):
        TaskMapping((4,), 2, lambda w: [(w == 1,)])(0)
    with pytest.raises(ValueError, match="use // for division"):
        TaskMapping((4,), 2, lambda w: [(w / 2,)])(1)


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3"])
def test_bad_dims(bad):
    for factory in (spatial, repeat):
        with pytest.raises(ValueError, match="dims"):
            factory(2, bad)


def test_no_dims():
    with pytest.raises(ValueError, match="at least one"):
        spatial()
    with pytest.raises(ValueError, match="at least one"):
        repeat()


@pytest.mark.parametrize("ranks", [[0], [0, 0], [1, 2], [0, 1, 2], 3, [0.0, 1.0], [True, False]])
def test_bad_ranks(ranks):
    with pytest.raises(ValueError, match="permutation"):
        spatial(2, 3, ranks=ranks)
    with pytest.raises(ValueError, match="permutation"):
        repeat(2, 3, ranks=ranks)


def test_compose_rank_mismatch():
    with pytest.raises(ValueError, match=r"different rank.*\(2, 3\).*\(4,\)"):
        spatial(2, 3) * repeat(4)


def test_composing_with_an_applied_mapping_says_to_compose_first():
    """`spatial(2) * repeat(3)(0)` applies repeat(3) alone (a call binds tighter than `*`): it multiplied a mapping
    by a list of tasks, "can't multiply sequence by non-int of type 'SpatialMapping'"."""
    for product in (lambda: spatial(2) * repeat(3)(0), lambda: repeat(3)(0) * spatial(2)):
        with pytest.raises(TypeError, match=r"compose first, then apply the composition: \(.* \* .*\)\(worker\)"):
            product()


def test_compose_non_mapping():
    with pytest.raises(TypeError):
        spatial(2) * 3
    with pytest.raises(TypeError):
        3 * spatial(2)


def test_bad_custom():
    with pytest.raises(ValueError, match="num_workers"):
        TaskMapping((4,), 0, lambda w: [])
    with pytest.raises(ValueError, match="task_shape"):
        TaskMapping((4, 0), 1, lambda w: [])
    with pytest.raises(ValueError, match="at least one"):
        TaskMapping((), 1, lambda w: [])
    with pytest.raises(ValueError, match="task_shape must be a sequence"):
        TaskMapping(4, 1, lambda w: [])
    with pytest.raises(TypeError, match="callable"):
        TaskMapping((4,), 1, None)


@pytest.mark.parametrize("result", [[(0, 0)], [0], [(4,)], [(-1,)]])
def test_custom_bad_tasks(result):
    m = TaskMapping((4,), 1, lambda w: result)
    with pytest.raises(ValueError, match="worker 0: task"):
        m(0)


def test_worker_out_of_range():
    for m in (spatial(4), spatial(2) * spatial(2), TaskMapping((4,), 4, lambda w: [(w,)])):
        with pytest.raises(ValueError, match=r"valid workers are 0\.\.3"):
            m(4)
        with pytest.raises(ValueError, match="out of range"):
            m(-1)


@pytest.mark.parametrize("w", [True, np.bool_(False), 1.0])
def test_worker_bad_type(w):
    with pytest.raises(TypeError, match="worker index"):
        spatial(4)(w)


def test_worker_of_duplicate_task():
    m = TaskMapping((4,), 2, lambda w: [(0,), (w + 1,)])
    with pytest.raises(ValueError, match=r"task \(0,\) is run by both worker 0 and worker 1"):
        m.worker_of()


def test_worker_of_uncovered():
    assert TaskMapping((3,), 1, lambda w: [(1,)]).worker_of().tolist() == [-1, 0, -1]


# --- table / show --------------------------------------------------------------------------------


def test_table_rank2():
    m = spatial(2, 2) * repeat(1, 2)
    assert m.worker_of().tolist() == [[0, 0, 1, 1], [2, 2, 3, 3]]
    lines = m.table().splitlines()
    assert lines[0].split() == ["0", "1", "2", "3"]
    assert [line.split("|")[0].strip() for line in lines[1:]] == ["0", "1"]
    assert [line.split("|")[1].split() for line in lines[1:]] == [["0", "0", "1", "1"], ["2", "2", "3", "3"]]


def test_table_rank1_and_rank3():
    assert spatial(3).table().split() == ["0", "1", "2"]
    assert TaskMapping((3,), 1, lambda w: [(1,)]).table().split() == [".", "0", "."]
    text = (spatial(2, 1, 2) * repeat(1, 2, 1)).table()
    blocks = text.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["[0, :, :]", "[1, :, :]"]
    assert [line.split("|")[1].split() for line in blocks[1].splitlines()[2:]] == [["2", "3"], ["2", "3"]]


def test_show_prints(capsys):
    m = spatial(2, 2) * repeat(1, 2)
    assert m.show() is None
    assert capsys.readouterr().out == m.table() + "\n"


def test_show_png_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        spatial(2, 2).show(tmp_path / "m.png")


@pytest.mark.parametrize("m", [spatial(2, 2) * repeat(1, 2), spatial(4), spatial(2, 2, 2), spatial(40, 40)])
def test_show_png(m, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "m.png"
    assert m.show(path) == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
