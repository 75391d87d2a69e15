"""The SIMT matmul template, its schedule spaces, the tuner and stdlib matmul / batch_matmul / linear.

Oracle: numpy's matmul in float64. Sizes are symbolic on the cpu target, so one compiled
kernel per schedule point serves every shape hypothesis draws.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import taskdsl as td
import stdlib_ops as ops
from stdlib_ops import gemm
from stdlib_ops import matmul_simt as simt
from taskdsl.backend.cuda.nvrtc import combine_sources, resource_usage
from taskdsl.schedule import tuner
from taskdsl.schedule.space import Space

from ..cuda_checks import assert_builds_for_sm80_and_sm90
from . import pairwise_covering

OPTIMIZED = True   # the optimized cpu path (unrolled register tiles in locals), not td.fast_compile
DIMS = st.sampled_from([1, 2, 3, 7, 13, 31, 64, 65, 97, 130])

# points run on the cpu target: the cpu default, and a GPU point with warp repeats, another thread tile,
# bk 16 and register prefetching. Over drawn shapes they run in fast mode (3-4 s of numba each; optimized,
# 30-47 s): the optimized path of the first is test_prime_sizes_and_split_k's.
CPU_POINTS = [
    simt.default_point("cpu"),
    simt.gpu_space().point(warps=(1, 2), repeat=(2, 1), lanes=(8, 4), tile=(4, 8), bk=16, prefetch=True),
]


def _run_point(p, a, b, split=1, dtype=td.f32):
    """C = a @ b for 2-D operands through the template kernel at point `p`."""
    out_dtype = td.f32 if split > 1 else dtype
    k = simt.simt_matmul_kernel(p, dtype, out_dtype)
    c = np.empty((split, a.shape[0], b.shape[1]), out_dtype.numpy)
    k(a[None], b[None], c, simt.batch_index((), (), (), split), split)
    return c.sum(axis=0, dtype=np.float64)


def _ref(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def test_space_sizes_and_pruning_match_the_docs():
    space = simt.gpu_space()
    assert (space.raw_size, len(space.points())) == (320, 172)
    assert space.pruned() == {"more than 64 accumulators per thread": 100, "block tile above 256": 4,
                              "block tile below 4096 outputs (too little reuse per load)": 44}
    assert len(simt.gpu_space(itemsize=2).points()) == 172
    cpu = simt.space_for("cpu")
    assert (cpu.raw_size, len(cpu.points())) == (48, 48)
    for p in space.points():        # every valid point fits the resources it was checked against
        bm, bn, threads = simt.tile_shape(p)
        assert threads <= 256 and bm <= 256 and bn <= 256
        assert 2 * (bm + bn) * p.bk * 4 <= simt.MAX_SMEM
    with pytest.raises(ValueError, match="accumulators"):
        space.point(warps=(2, 2), repeat=(2, 2), lanes=(4, 8), tile=(8, 8), bk=8, prefetch=True)


def _sources(points: list) -> tuple[list, set]:
    """(the CUDA sources of the template's kernels at `points`, their names)."""
    a = np.zeros((1, 64, 64), np.float32)
    index = np.zeros((1, 2), np.int32)
    kernels = [simt.simt_matmul_kernel(p, td.f32, td.f32) for p in points]
    names = {k.name for k in kernels}
    assert len(names) == len(kernels)
    return [k.source(a, a, a, index, 1, target="cuda") for k in kernels], names


def test_every_point_compiles_with_nvrtc():
    """Both spaces build for sm_80 and sm_90, in fast mode (the check is that they build); the optimized build is
    test_the_gpu_space_keeps_its_tiles_in_registers's."""
    points = simt.gpu_space().points() + simt.space_for("cpu").points()
    sources, names = _sources(points)
    assert_builds_for_sm80_and_sm90(sources, names, "simt_space")


def test_the_gpu_space_keeps_its_tiles_in_registers():
    """ptxas, optimizing for sm_90, gives no point a stack frame: accumulators and fragments indexed only by
    unrolled loops (a run-time index would put them in local memory, several times slower). Checked on points
    that hold every pair of axis values between them, the largest register tiles first (`pairwise_covering`:
    23 of the 172; all of them took 97 s of NVRTC here)."""
    points = pairwise_covering(simt.gpu_space().points(), _register_tile)
    sources, names = _sources(points)
    report = resource_usage(combine_sources(sources))
    assert set(report) == names
    # a few points spill a word or two (ptxas's choice under register pressure): stack beyond that is an array
    assert {name: r for name, r in report.items() if r["stack_bytes"] >= r["spill_store_bytes"] + 8} == {}


def _register_tile(p) -> tuple:
    """(accumulators per thread, bk): what decides a point's register pressure and unrolled loop lengths."""
    return math.prod(p.tile) * math.prod(p.repeat), p.bk


@pytest.mark.fast_compile
@pytest.mark.parametrize("point", CPU_POINTS, ids=lambda p: "x".join(map(str, simt.tile_shape(p))))
@settings(max_examples=6, deadline=None)
@given(m=DIMS, n=DIMS, k=DIMS, seed=st.integers(0, 2**16))
def test_template_points_on_cpu(point, m, n, k, seed):
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    np.testing.assert_allclose(_run_point(point, a, b), _ref(a, b), rtol=1e-4, atol=1e-4)


def test_prime_sizes_and_split_k():
    td.set_target("cpu")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 2039)).astype(np.float32)
    b = rng.standard_normal((2039, 41)).astype(np.float32)
    for split in (1, 3, 8):
        np.testing.assert_allclose(_run_point(CPU_POINTS[0], a, b, split), _ref(a, b), rtol=1e-4, atol=1e-3)


@pytest.mark.fast_compile     # the plan's partials and their sum; test_prime_sizes_and_split_k runs the optimized kernel
@settings(max_examples=4, deadline=None)
@given(split=st.sampled_from([2, 3, 8]), batch=st.sampled_from([(1,), (2,)]), dtype=st.sampled_from([td.f32, td.f16]),
       seed=st.integers(0, 2**16))
def test_a_split_plan_sums_its_partials_in_one_kernel(split, batch, dtype, seed):
    """MatmulPlan with split-k: f32 partials per chunk of K, then `split_sum_kernel` adds them in the operands' type."""
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    m, k, n = 19, 131, 23
    a = rng.standard_normal(batch + (m, k)).astype(dtype.numpy)
    b = rng.standard_normal((1, k, n)).astype(dtype.numpy)
    p = gemm.MatmulPlan(simt.space_for("cpu").points()[0], dtype, batch, batch, (1,), m, n, k, split, gemm.SIMT)
    assert p.partials_shape == (batch[0] * split, m, n)
    c = p(a, b)
    assert c.dtype == dtype.numpy and c.shape == batch + (m, n)
    tol = 1e-4 if dtype == td.f32 else 2e-2
    np.testing.assert_allclose(c.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.fast_compile     # what the tuner times, not the code: the optimized kernel is a 30 s compile
def test_the_tuner_times_a_split_point_as_calls_run_it(simulated_gpu, monkeypatch):
    """Where a plan splits K (one 64x64+ tile on the simulated GPU's 4 SMs), the tuner's candidate for a point
    is the split call, partials then their sum, not the unsplit kernel a call never launches."""
    seen = {}

    def record(space, build, args, **options):
        seen.update(space=space, build=build, args=args, **options)
        return options["default"]
    monkeypatch.setattr(gemm, "tune", record)
    m, k, n = 19, 600, 23
    plan = gemm.plan((m, k), (k, n), td.f32, "cuda", do_tune=True)
    assert plan.split > 1 and seen["outputs"] == {2: td.f32}     # C, checked against the default's
    point = seen["space"].points()[0]
    candidate = seen["build"](point)
    assert isinstance(candidate, gemm.SplitRun) and candidate.plan.point == point
    assert candidate.plan.split == gemm.choose_split(point, 1, m, n, k, "cuda") > 1
    a, b, c, index, one = seen["args"]
    on_gpu = [td.to_device(np.full_like(x, np.nan) if x is c else x) for x in (a, b, c, index)] + [one]
    candidate.compile(*on_gpu, target="cuda")       # both kernels, as the tuner compiles candidates
    candidate(*on_gpu)
    np.testing.assert_allclose(on_gpu[2].numpy()[0], _ref(a[0], b[0]), rtol=1e-4, atol=1e-3)
    monkeypatch.setattr(gemm, "choose_split", lambda *_args, **_kw: 1)
    gemm._plan.cache_clear()
    gemm.plan((m, k), (k, n), td.f32, "cuda", do_tune=True)
    assert isinstance(seen["build"](point), td.Kernel)          # unsplit plans time the kernel itself


@pytest.mark.fast_compile     # the op's batch broadcasting; the optimized cpu kernels are test_matmul_cpu's
@settings(max_examples=8, deadline=None)
@given(batch_a=st.sampled_from([(), (1,), (3,), (2, 1), (2, 3)]), batch_b=st.sampled_from([(), (1,), (3,), (1, 3)]),
       m=DIMS, n=DIMS, k=DIMS, seed=st.integers(0, 2**16))
def test_matmul_broadcasts_batch_dims_like_numpy(batch_a, batch_b, m, n, k, seed):
    td.set_target("cpu")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch_a + (m, k)).astype(np.float32)
    b = rng.standard_normal(batch_b + (k, n)).astype(np.float32)
    out = ops.matmul(a, b)
    np.testing.assert_allclose(out, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)


@pytest.mark.fast_compile     # the op's edge cases and errors, on the kernels of the test above
def test_matmul_vectors_empty_and_errors():
    td.set_target("cpu")
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(7).astype(np.float32), rng.standard_normal((7, 5)).astype(np.float32)
    np.testing.assert_allclose(ops.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ops.matmul(b.T.copy(), a), b.T @ a, rtol=1e-5, atol=1e-5)
    assert ops.matmul(np.zeros((0, 3), np.float32), np.ones((3, 4), np.float32)).shape == (0, 4)
    np.testing.assert_array_equal(ops.matmul(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)), 0)
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.matmul(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="do not broadcast"):
        ops.matmul(np.ones((2, 2, 3), np.float32), np.ones((3, 3, 2), np.float32))
    with pytest.raises(TypeError, match="float32"):
        ops.matmul(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32))
    with pytest.raises(TypeError, match="got int32"):       # the operand's dtype, not the pair's promotion
        ops.matmul(np.ones((2, 2), np.int32), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="batch dimension"):
        ops.batch_matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"linear: bias must have shape \(5,\)"):
        ops.linear(np.ones((4, 7), np.float32), b.T.copy(), np.ones((4, 5), np.float32))
    p = gemm.plan((3, 7), b.shape, td.f32, "cpu")
    with pytest.raises(ValueError, match="packed B must have shape"):     # the kernel would read past its rows
        ops.matmul(np.ones((3, 7), np.float32), b, packed=p.pack_b(b)[:3].copy())


def test_empty_products_tune_nothing(monkeypatch):
    """An operand with a zero dimension gives zeros (or an empty result) without timing the space."""
    monkeypatch.setattr(gemm, "tune", lambda *a, **k: pytest.fail("an empty product was tuned"))
    td.set_target("cpu")
    assert ops.matmul(np.ones((0, 3), np.float32), np.ones((3, 4), np.float32), tune=True).shape == (0, 4)
    np.testing.assert_array_equal(ops.matmul(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32), tune=True),
                                  np.zeros((2, 3)))


def test_tune_takes_a_bool_and_a_point_of_the_plans_own_space(monkeypatch):
    """tune="no" tuned the whole space (171 compiles); a point of another template's space gave
    `AttributeError: block`."""
    monkeypatch.setattr(gemm, "tune", lambda *a, **k: pytest.fail("tuned"))
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    for flag in ("no", 0, 1.0):
        with pytest.raises(TypeError, match="matmul: tune takes True, False or None"):
            ops.matmul(a, b, tune=flag)
    for foreign in (simt.default_point("cpu"), simt.default_point("cuda")):
        with pytest.raises(ValueError, match="is not of the tile_matmul template's space, which this f32 matmul on "
                                             "cpu uses"):
            gemm.plan((2, 3), (3, 2), td.f32, "cpu", point=foreign)
    own = gemm.template_for(td.f32, "cpu").space("cpu", 4).points()[0]
    np.testing.assert_array_equal(gemm.plan((1, 2, 3), (1, 3, 2), td.f32, "cpu", point=own)(a[None], b[None]),
                                  (a @ b)[None])


@pytest.mark.fast_compile     # the ops' semantics; test_matmul_cpu checks the optimized f16 and f32 kernels
def test_batch_matmul_and_linear_f16_and_f32_bias():
    td.set_target("cpu")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 9, 33)).astype(np.float32)
    b = rng.standard_normal((4, 33, 17)).astype(np.float32)
    np.testing.assert_allclose(ops.batch_matmul(a, b), np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((3, 5, 40)).astype(np.float16)
    w = rng.standard_normal((11, 40)).astype(np.float16)
    y = ops.linear(x, w)
    assert y.dtype == np.float16 and y.shape == (3, 5, 11)
    expected = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=2e-2, atol=2e-2)
    x32, w32, bias = x.astype(np.float32), w.astype(np.float32), rng.standard_normal(11).astype(np.float32)
    np.testing.assert_allclose(ops.linear(x32, w32, bias), x32.astype(np.float64) @ w32.T + bias, rtol=1e-4, atol=1e-4)


def test_tuner_picks_the_fastest_point_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    space = Space("toy", {"delay": (3, 1, 4)})
    calls = []

    class Fake:     # a "kernel" whose measured time is its point's delay (the timer is replaced below)
        def __init__(self, p):
            self.p = p

        def __call__(self):
            calls.append(self.p.delay)

    fully_timed = []

    def timer(target):
        def full(fn):
            fn()
            fully_timed.append(calls[-1])
            return calls[-1]
        return lambda fn: (fn(), calls[-1])[1], full

    monkeypatch.setattr(tuner, "_timer", timer)

    default = space.point(delay=3)
    best = tuner.tune(space, Fake, (), op="toy", shapes=(1,), dtypes=("f32",), default=default, target="cpu",
                      show=False)
    assert best.delay == 1 and set(calls) == {1, 3, 4}
    assert fully_timed == [3, 1]        # 4 ran once: more than SLOW_CUT times the best so far (1) is not timed on
    fully_timed.clear()
    lines = tuner.report("toy", (1,), ("f32",), "cpu", top=1, default=default)
    assert lines[0] == "toy (1,): 3 timed of 3 (0 failed)" and len(lines) == 4
    assert "#1" in lines[1] and "{'delay': 1}" in lines[1]
    assert "#2" in lines[2] and "(default)" in lines[2] and "{'delay': 3}" in lines[2]
    assert "#3" in lines[3] and "(1 run)" in lines[3] and "{'delay': 4}" in lines[3]
    assert tuner.report("toy", (9,), ("f32",), "cpu") == []     # nothing stored for that shape
    calls.clear()
    again = tuner.tune(space, Fake, (), op="toy", shapes=(1,), dtypes=("f32",), default=default, target="cpu",
                       show=False)
    assert again == best and not calls                     # from the disk cache: nothing re-timed
    record = next((tmp_path / "tune").glob("*.json"))
    for damage in ("{not json", "[" * 100000):     # a damaged record is ignored and re-tuned (the second nests past
        record.write_text(damage)                    # the JSON parser's depth: a RecursionError escaped)
        assert tuner.tune(space, Fake, (), op="toy", shapes=(1,), dtypes=("f32",), default=default, target="cpu",
                          show=False).delay == 1
    monkeypatch.setenv("TASKDSL_TUNE", "0")
    assert tuner.tune(space, Fake, (), op="toy", shapes=(2,), dtypes=("f32",), default=default,
                      target="cpu") == default


def test_cuda_tuning_times_kernels_on_device_arrays(simulated_gpu, tmp_path, monkeypatch):
    """On cuda the candidates are compiled and timed on arguments copied to the GPU once (numpy arrays would be
    copied in and out at every timed launch, and the copies would be what is timed)."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_TUNE", "1")
    monkeypatch.setattr(tuner, "_timer", lambda target: (lambda fn: (fn(), 1.0)[1],) * 2)
    seen = []

    class Fake:
        def __init__(self, p):
            self.p = p

        def compile(self, *args, target):
            seen.append(args)

        def __call__(self, *args):
            seen.append(args)

    space = Space("toy_cuda", {"x": (1, 2)})
    a = np.ones((4, 4), np.float32)
    tuner.tune(space, Fake, (a, 3), op="toy_cuda", shapes=(4,), dtypes=("f32",), default=space.point(x=1),
               target="cuda", show=False)
    assert len(seen) == 6 and all(isinstance(args[0], td.DeviceArray) and args[1] == 3 for args in seen)
    np.testing.assert_array_equal(seen[0][0].numpy(), a)


@pytest.mark.fast_compile     # how candidates are timed, not their code (as the split test above)
def test_cuda_candidates_are_timed_as_replays_of_one_capture(simulated_gpu, monkeypatch):
    """The cuda timer replays a CUDA graph of the candidate's launches, as compiled graphs run them (a split
    point's two kernels with no host gap between them), and its probe and full timing share one capture."""
    from taskdsl.bench import cuda_timing
    replayed = []
    monkeypatch.setattr(cuda_timing, "time_cuda", lambda fn, **options: (replayed.append(options["repeat"]), fn(),
                                                                         1.0)[-1])
    a = td.to_device(np.arange(6, dtype=np.float32).reshape(1, 2, 3))
    b = td.to_device(np.ones((1, 3, 2), np.float32))
    c = td.to_device(np.zeros((1, 2, 2), np.float32))
    plan = gemm.MatmulPlan(simt.space_for("cuda").points()[0], td.f32, (1,), (1,), (1,), 2, 2, 3, 3, gemm.SIMT)
    candidate = gemm.SplitRun(plan, plan.kernel())
    probe, full = tuner._timer("cuda")
    calls = []
    run = lambda: (calls.append(1), candidate(a, b, c))
    assert probe(run) == full(run) == 1.0
    assert len(calls) == 2 and replayed == [1, 10]      # one capture: a call that compiles, then a recorded one
    assert simulated_gpu.replays == 2
    np.testing.assert_allclose(c.numpy()[0], np.arange(6).reshape(2, 3) @ np.ones((3, 2)))
    c.zero()
    other = td.to_device(np.zeros((1, 2, 2), np.float32))
    probe(lambda: candidate(a, b, other))               # the next candidate is captured anew: the old graph,
    np.testing.assert_allclose(c.numpy(), 0)            # which writes c, is not replayed
    np.testing.assert_allclose(other.numpy()[0], np.arange(6).reshape(2, 3) @ np.ones((3, 2)))


def test_tuner_skips_failing_candidates(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    space = Space("toy", {"ok": (False, True)})

    def build(p):
        if not p.ok:
            raise RuntimeError("does not compile")
        return lambda: None

    with pytest.warns(UserWarning, match="1 of 2 candidates failed"):
        best = tuner.tune(space, build, (), op="fails", shapes=(), dtypes=(), default=space.point(ok=False),
                          target="cpu", show=False)
    assert best.ok


@pytest.mark.fast_compile     # the tuner end to end, on the kernels test_template_points_on_cpu compiled
def test_tuning_the_real_template_on_cpu(tmp_path, monkeypatch):
    """The cpu space, restricted to points compiled above, tuned end to end on a small problem."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    td.set_target("cpu")
    space = Space("simt_matmul_cpu_subset", {"i": (0, 1)})
    rng = np.random.default_rng(6)
    a = rng.standard_normal((1, 64, 64)).astype(np.float32)
    c = np.empty((1, 64, 64), np.float32)
    index = simt.batch_index((), (), ())
    best = tuner.tune(space, lambda q: simt.simt_matmul_kernel(CPU_POINTS[q.i], td.f32, td.f32), (a, a, c, index, 1),
                      op="simt", shapes=(64,), dtypes=("f32",), default=space.points()[0], target="cpu", show=False)
    assert best in space.points()
    np.testing.assert_allclose(c[0], _ref(a[0], a[0]), rtol=1e-4, atol=1e-4)
