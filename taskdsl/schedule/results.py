"""The tuner's check of a candidate's results against the default schedule's, before it may win.

A point the space's checks let through can still compute a wrong result: on a GPU, a race between warps the
cpu cannot show (it runs every thread to each barrier or warp operation before any passes it), or a tile a
grid leaves unwritten. Timing alone would store such a point as the winner and every later call would run it.
So a candidate that would become the best is run once more on outputs filled with NaN (an element it leaves
unwritten stays NaN) and must agree with the default's values there. A kernel that also reads its output
(`y += ...`) reads that NaN: where the default's poisoned run gives NaN, every check starts from the outputs'
given values instead (`Start`).
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.types import DataType, numpy_dtype

# differences allowed, over the largest magnitude of the default's output: rounding differences only (another
# summation order, split-k's f32 partials, one rounding of a 16-bit output), never a missing or stale tile
FLOOR = 1e-3
ULPS = 4


def tolerance(dtype: DataType) -> float:
    """The largest disagreement, relative to the output's largest magnitude, allowed in an output of `dtype`."""
    if not dtype.is_float:
        return 0.0
    import ml_dtypes
    return max(FLOOR, ULPS * float(ml_dtypes.finfo(numpy_dtype(dtype)).eps))


def _host(array) -> np.ndarray:
    """A numpy array's own memory, or a device array's values copied to the host."""
    return array if isinstance(array, np.ndarray) else array.numpy()


def values(args: tuple, outputs: dict) -> dict:
    """{index: the output's values as float64} of `args` at the `outputs` ({index: DSL type}) positions."""
    return {i: _host(args[i]).view(numpy_dtype(dtype)).astype(np.float64) for i, dtype in outputs.items()}


def _store(args: tuple, i: int, host: np.ndarray) -> None:
    if isinstance(args[i], np.ndarray):
        args[i][...] = host
    else:
        args[i].copy_from_host(host)


class Start:
    """The values a checking run starts from: NaN (`given` None, see `poison`) or the outputs' given values."""

    def __init__(self, args: tuple, outputs: dict, given: bool):
        self.given = {i: _host(args[i]).copy() for i in outputs} if given else None

    def set(self, args: tuple, outputs: dict) -> None:
        """Put the start values in the outputs."""
        if self.given is None:
            poison(args, outputs)
        else:
            for i, host in self.given.items():
                _store(args, i, host)


def poison(args: tuple, outputs: dict) -> None:
    """Fill the outputs with NaN (integer outputs with their type's largest value, bools with True): an element a
    run leaves unwritten keeps it."""
    for i, dtype in outputs.items():
        fill = math.nan if dtype.is_float else dtype.limits[1] if dtype.is_integer else True
        _store(args, i, np.full(args[i].shape, fill, numpy_dtype(dtype)).view(args[i].dtype))


def disagreement(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over max |want| (over 1 where `want` is all zeros); inf unless each NaN or infinity of
    `want` is in `got` too, and `got` has no other."""
    finite = np.isfinite(want)
    if not (np.array_equal(got[~finite], want[~finite], equal_nan=True) and np.isfinite(got[finite]).all()):
        return math.inf
    if not finite.any():
        return 0.0
    scale = float(np.abs(want[finite]).max()) or 1.0
    return float(np.abs(got[finite] - want[finite]).max()) / scale


class WrongResult(Exception):
    """A candidate whose output disagrees with the default schedule's."""


def check(run, args: tuple, outputs: dict, reference: dict, start: Start) -> None:
    """Run `run` once from `start`; WrongResult unless each output agrees with `reference` (`values` of the
    default's run from there) within its `tolerance`."""
    start.set(args, outputs)
    run()
    for i, got in values(args, outputs).items():
        error, allowed = disagreement(got, reference[i]), tolerance(outputs[i])
        if error > allowed:
            raise WrongResult(f"output {i} disagrees with the default schedule's: max difference {error:.3g} of its "
                              f"largest magnitude (allowed {allowed:.3g})")
