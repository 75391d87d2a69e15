"""Operator-library tests: shared hypothesis strategies and the two-oracle check.

Every operator is checked against (1) its op's `.reference` (the numpy evaluation of its
compute definitions, reached through the module's `op_for`) and (2) an independent numpy
formula written in the test. Shapes cover size 1, odd and prime sizes, a large last axis
(1031) and broadcasting; examples are few (kernels compile once per structure, not per
size, so many draws reuse one kernel).
"""
import itertools

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def examples(n: int):
    """Hypothesis settings for `n` examples (kernels compile once per structure: keep `n` small)."""
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.data_too_large])


FEW, FEWER, TWO = examples(5), examples(3), examples(2)

LEAD = (1, 2, 3, 5, 7, 13)
LAST = (1, 3, 17, 31, 1031)
SEEDS = st.integers(0, 2**16)


@st.composite
def shapes(draw, min_ndim: int = 1, max_ndim: int = 4, max_size: int = 40_000, last=LAST):
    """A shape whose leading dims come from LEAD and last dim from `last`, at most `max_size` elements."""
    lead = draw(st.lists(st.sampled_from(LEAD), min_size=min_ndim - 1, max_size=max_ndim - 1))
    room = max_size // max(1, int(np.prod(lead)))
    fits = [n for n in last if n <= room] or [1]
    return tuple(lead) + (draw(st.sampled_from(fits)),)


@st.composite
def broadcast_shapes(draw, count: int = 2, max_ndim: int = 4, max_size: int = 20_000):
    """`count` operand shapes that broadcast together: suffixes of one shape with some dims set to 1."""
    full = draw(shapes(1, max_ndim, max_size))
    out = []
    for _ in range(count):
        nd = draw(st.integers(0, len(full)))
        sub = full[len(full) - nd:]
        ones = draw(st.lists(st.booleans(), min_size=nd, max_size=nd))
        out.append(tuple(1 if one else n for one, n in zip(ones, sub)))
    return out


def rand(shape, seed: int, dtype=np.float32, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def check(got, plan, expected, rtol: float = 1e-5, atol: float = 1e-6, dtype=None):
    """`got` (the public function's result) matches the plan's numpy reference and `expected` (numpy)."""
    ref = plan.reference()
    expected = np.asarray(expected)
    dtype = np.dtype(dtype) if dtype is not None else expected.dtype
    assert isinstance(got, np.ndarray)
    assert got.shape == ref.shape == expected.shape, (got.shape, ref.shape, expected.shape)
    assert got.dtype == ref.dtype == dtype, (got.dtype, ref.dtype, dtype)
    if dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, expected.astype(dtype))
    else:
        g = got.astype(np.float64)
        np.testing.assert_allclose(g, ref.astype(np.float64), rtol=rtol, atol=atol)
        np.testing.assert_allclose(g, expected.astype(np.float64), rtol=rtol, atol=atol)
    return got


def pairwise_covering(points: list, weight) -> list:
    """A few of a schedule space's `points` that between them hold every pair of axis values the points hold
    (greedy: at each step the point with the most pairs not yet held, the heaviest by `weight` among equals).
    Code generation differs by axis value and by their interplay, so a fault of the template at some point
    shows at a point holding the same values in pairs; ptxas spills first at the heaviest points."""
    def pairs(p):
        return set(itertools.combinations(p.values, 2))

    missing = set().union(*(pairs(p) for p in points))
    chosen = []
    while missing:
        best = max(points, key=lambda p: (len(pairs(p) & missing), weight(p)))
        chosen.append(best)
        missing -= pairs(best)
    return chosen


# ---------------------------------------------------------------- cpu / cuda twins (GPU_TWINS = True modules)
def put(a):
    """`a` as the operators get it on this target: a numpy array on the cpu, a (contiguous) DeviceArray on cuda."""
    import taskdsl as td
    return td.to_device(np.ascontiguousarray(a) if a.ndim else a) if td.get_target() == "cuda" else a


def host(y) -> np.ndarray:
    """An operator's result as a numpy array."""
    import taskdsl as td
    return y.numpy() if isinstance(y, td.DeviceArray) else np.asarray(y)


def same(got, want, rtol: float = 0.0, atol: float = 0.0):
    """`got` has `want`'s shape and dtype and its values (NaNs where it has NaNs)."""
    got, want = host(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
