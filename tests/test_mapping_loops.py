"""`for i, j in m(w)` inside kernels: each worker visits the tasks `m(w)` gives in Python (the paper's definitions,
checked against an oracle of their own in test_mapping.py), in that order; `m(w)` is evaluated once."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskdsl as td
from taskdsl import TaskMapping, i32, repeat, spatial, threadIdx

FEW = settings(max_examples=8, deadline=None)


def _custom(shape, workers, shift):
    """A custom 2-d mapping: worker w visits two tasks that depend on w (and on nothing else)."""
    a, b = shape
    return TaskMapping(shape, workers, lambda w: [((w + shift + r) % a, (w * 3 + r) % b) for r in range(2)])


ATOMS = st.one_of(
    st.tuples(st.integers(1, 3), st.integers(1, 3)).map(lambda d: spatial(*d)),
    st.tuples(st.integers(1, 2), st.integers(1, 3)).map(lambda d: repeat(*d)),
    st.builds(_custom, st.tuples(st.integers(1, 3), st.integers(1, 3)), st.integers(1, 3), st.integers(0, 3)))


@functools.cache
def visits_kernel(mapping):
    """A kernel that writes, per worker, the flat index of each task it visits, in visiting order."""
    workers, width = mapping.num_workers, mapping.task_shape[1]
    count = len(mapping(0))

    @td.kernel(grid=1, block=workers)
    def visits(OUT: i32[workers, count]):
        k = 0
        for i, j in mapping(threadIdx.x):
            OUT[threadIdx.x, k] = i * width + j
            k += 1
    return visits


@FEW
@given(atoms=st.lists(ATOMS, min_size=1, max_size=3))
def test_each_worker_visits_its_python_tasks_in_order(atoms):
    """A custom atom of one worker after the first got the outer worker index (`% 1` was left out): another task."""
    mapping = functools.reduce(lambda x, y: x * y, atoms)
    if mapping.num_workers > 128:
        return
    tasks = [mapping(w) for w in range(mapping.num_workers)]
    width = mapping.task_shape[1]
    out = np.full((mapping.num_workers, len(tasks[0])), -1, np.int32)
    visits_kernel(mapping)(out)
    np.testing.assert_array_equal(out, [[i * width + j for i, j in ts] for ts in tasks])


def test_a_single_worker_custom_atom_inside_a_composition():
    """The helper's minimal case: m(1) is [(2,)], the kernel wrote task 3."""
    mapping = spatial(2) * TaskMapping((2,), 1, lambda w: [(w % 2,)])

    @td.kernel(grid=1, block=2)
    def one(OUT: i32[4]):
        for i in mapping(threadIdx.x):
            OUT[i] = threadIdx.x + 1
    out = np.zeros(4, np.int32)
    one(out)
    np.testing.assert_array_equal(out, [1, 0, 2, 0])


@td.kernel(grid=1, block=4)
def worker_from_a_variable(O: i32[4]):
    w = 3 - threadIdx.x
    for i in spatial(4)(w):
        w = 0                    # the loop's tasks were fixed by m(w) above
        O[i] = threadIdx.x + 1


@td.kernel(grid=1, block=4)
def worker_from_memory(W: i32[4], O: i32[8]):
    for i in (repeat(2) * spatial(4))(W[threadIdx.x]):
        W[threadIdx.x] = 0
        O[i] = threadIdx.x + 1


@td.kernel(grid=1, block=4)
def worker_from_an_atomic(C: i32[1], O: i32[4]):
    for i, j in spatial(2, 2)(td.atomic_add(C[0], 1)):    # one ticket per thread
        O[i * 2 + j] += 1


def test_the_worker_is_evaluated_once_before_the_loop():
    """The coordinates were expressions of the worker, re-read at each use: a body that changed what the worker
    reads moved the loop's tasks, and an atomic worker ran at each use (6 atomicAdds in the CUDA)."""
    out = np.zeros(4, np.int32)
    worker_from_a_variable(out)
    np.testing.assert_array_equal(out, [4, 3, 2, 1])
    out = np.zeros(8, np.int32)
    worker_from_memory(np.array([3, 2, 1, 0], np.int32), out)
    np.testing.assert_array_equal(out, [4, 3, 2, 1, 4, 3, 2, 1])
    count, out = np.zeros(1, np.int32), np.zeros(4, np.int32)
    worker_from_an_atomic(count, out)
    assert count[0] == 4
    np.testing.assert_array_equal(out, [1, 1, 1, 1])
    assert worker_from_an_atomic.source(count, out, target="cuda").count("atomicAdd") == 1


@pytest.mark.parametrize("tasks, message", [
    (lambda w: [(w + 5,)], r"task \(8,\) is outside task_shape \(8,\)"),
    (lambda w: [(w, 0)], "is not a tuple of rank 1"),
    (lambda w: [[w]], "is not a tuple of rank 1"),
    (lambda w: [w], "is not a tuple of rank 1"),
    (lambda w: [(w / 2,)], "is not a tuple of ints"),
])
def test_a_custom_mapping_a_kernel_uses_is_checked_as_in_python(tasks, message):
    """Tasks outside the shape ran (and wrote out of bounds), a wrong rank lost a coordinate, `w / 2` was
    truncated, a bare int task was an internal TypeError."""
    mapping = TaskMapping((8,), 4, tasks)

    @td.kernel(grid=1, block=4)
    def custom(O: i32[8]):
        for i in mapping(threadIdx.x):
            O[i] = 1
    with pytest.raises(td.DSLError, match="the custom task mapping .* is not valid: ValueError: worker .*" + message):
        custom(np.zeros(8, np.int32))


def test_a_mapping_times_an_applied_one_in_a_kernel_names_the_composition_to_write():
    """`spatial(4, 4) * repeat(2, 2)(threadIdx.x)` failed with "unsupported operand type(s) for *: 'SpatialMapping'
    and 'MappingLoop'"; the error now shows the composition applied: `(spatial(4, 4) * repeat(2, 2))(worker)`."""
    @td.kernel(grid=1, block=16)
    def applied_first(O: i32[8, 8]):
        for i, j in spatial(4, 4) * repeat(2, 2)(threadIdx.x):
            O[i, j] = 1
    with pytest.raises(td.DSLError, match=r"\(spatial\(4, 4\) \* repeat\(2, 2\)\)\(worker\)") as caught:
        applied_first(np.zeros((8, 8), np.int32))
    assert "for i, j in spatial(4, 4) * repeat(2, 2)(threadIdx.x):" in caught.value.loc.source_line()   # the user's line


def test_a_one_dimensional_mapping_on_a_constant_worker_binds_ints():
    """`for j in repeat(4)(0)` bound the 1-tuples `(0,)`, ...: 'unsupported operand tuple for +'."""
    @td.kernel(grid=1, block=32)
    def constant_worker(O: i32[32, 4]):
        for j in repeat(4)(0):
            O[threadIdx.x, j] = threadIdx.x * 4 + j
        for (k,) in spatial(4).on(2):      # a tuple target still unpacks
            O[threadIdx.x, k] += 100
    out = np.zeros((32, 4), np.int32)
    constant_worker(out)
    want = np.arange(128, dtype=np.int32).reshape(32, 4)
    want[:, 2] += 100
    np.testing.assert_array_equal(out, want)
