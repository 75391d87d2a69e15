"""Names the cpu generator derives (per-thread arrays, register elements, shuffle and shadow arrays)
never collide with a user's variables spelled the same way."""
import numpy as np
import pytest

import taskdsl as td
from taskdsl import f32, threadIdx


@td.kernel(grid=1, block=32)
def look_alikes(X: f32[32], Y: f32[32]):
    s = td.shared(f32, (32,))
    acc = td.registers(f32, (2,))
    v = X[threadIdx.x]
    v_t = v * 2.0             # `v` crosses the barrier, so the generator keeps it in an array named after it
    acc[0] = v + 1.0
    acc_0 = v * 4.0           # a register element kept in a local is named the same way
    shfl_0 = td.shfl_xor(v, 1)
    shadow_s = v * 8.0        # debug mode shadows shared buffers
    s[threadIdx.x] = v_t
    td.syncthreads()
    Y[threadIdx.x] = v + v_t + acc[0] + acc_0 + shfl_0 + shadow_s + s[31 - threadIdx.x]


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_derived_names_do_not_capture_user_variables(debug):
    x = np.random.rand(32).astype(np.float32)
    y = np.empty_like(x)
    td.debug(debug)
    try:
        look_alikes(x, y)
    finally:
        td.debug(False)
    neighbour = x[np.arange(32) ^ 1]
    np.testing.assert_allclose(y, x + 2 * x + (x + 1) + 4 * x + neighbour + 8 * x + 2 * x[::-1], rtol=1e-6)
