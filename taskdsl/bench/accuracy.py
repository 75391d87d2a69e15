"""Each benchmark checks its results against an oracle; a figure of a wrong kernel does not count.

A row whose relative error passes its dtype's tolerance is printed with its error flagged `WRONG`, and
`python -m taskdsl.bench` exits 1 after the table, naming the rows (the figures stay printed: a
wrong kernel's speed is worth seeing while it is fixed)."""
from __future__ import annotations

import numpy as np

# max |got - want| / max |want| a kernel may reach: f32 sums of up to ~10^4 terms; 16-bit outputs round to 2^-11
# an 8-bit float product's error is its f32 sums' alone (the reference multiplies the same 8-bit values, exactly);
# an 8-bit integer product is exact
TOLERANCE = {"f32": 1e-3, "f16": 2e-2, "bf16": 5e-2, "f8e4m3": 1e-3, "s8": 0.0, "i8": 0.0, "u8": 0.0}

wrong: list = []        # 'what: error' of each row past its tolerance, in this run


def rel_err(got, want) -> float:
    """max |got - want| over max |want|, in float64."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max(initial=0.0) / max(np.abs(want).max(initial=0.0), 1e-30))


def shown(err: float, dtype: str, what: str, width: int = 12) -> str:
    """The error column of a row: `err`, flagged WRONG (and remembered in `wrong`) past `dtype`'s tolerance."""
    tolerance = TOLERANCE[dtype]
    if err <= tolerance:
        return f"{err:>{width}.1e}"
    wrong.append(f"{what}: max rel err {err:.1e} (tolerance {tolerance:.0e})")
    return f"{err:>{width}.1e} WRONG"
