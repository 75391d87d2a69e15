"""sin and cos of float32 as arithmetic the cpu's loops vectorize (`sin_f32`, `cos_f32`), where math.sin is a libm
call per element (a numba loop over a million floats: 6.7 ms by libm, 2.5 ms so, on one core of a 2-core EPYC).

x = (n + f) pi/2 with n an integer and |f| <= 1/2; sin x and cos x are then +-sin or +-cos of r = f pi/2, by Taylor
polynomials in float64 (|r| <= pi/4; to r^11 and r^10, whose truncation is below 2e-10 relative). Every float32 comes
out within 0.502 ulp of the exact value (every positive one checked against float64 numpy: 0.50191 at most; the
negative ones by symmetry), with no branch: both ways of reducing x are computed and a select keeps one.

- |x| < 2^18: in float64, n = rint(x 2/pi) and r = (x - n P1) - n P2, pi/2 split into P1 of 33 bits (n P1 and the
  difference are exact) and the float64 P2 of the rest.
- larger (up to 2^128 and inf): Payne and Hanek's, in integers. x = m 2^q (m of 24 bits); the bits of 2/pi whose
  products with x are multiples of 4 drop out (they add whole turns), so x 2/pi mod 4 is m times a 96-bit window of
  2/pi's bits starting where they stop dropping out, a table row per q (`WINDOWS`): two 64-bit products give it in
  fixed point with 62 fraction bits, 2 bits of quadrant above.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from numba import njit

from .bitcasts import bits_of_f32


def _pi_times(scale_bits: int) -> int:
    """pi * 2^scale_bits, within a few units, by Machin's formula pi = 16 atan(1/5) - 4 atan(1/239) in integers."""
    one = 1 << (scale_bits + 16)

    def atan_of_inverse(k: int) -> int:
        total, power, n, sign = 0, one // k, 1, 1
        while power:
            total += sign * (power // n)
            power, n, sign = power // (k * k), n + 2, -sign
        return total

    return (16 * atan_of_inverse(5) - 4 * atan_of_inverse(239)) >> 16


PI_BITS = 300
_PI = _pi_times(PI_BITS)    # pi 2^300: the float constants below and 2/pi's bits, exact to well past what they use
SMALL = 2.0 ** 18       # below, the float64 reduction; n < 2^18 keeps n P1 exact (P1 has 33 bits)
P1 = float(Fraction(_PI >> (PI_BITS - 31), 2 ** 32))       # pi/2 to 33 bits
P2 = float(Fraction(_PI, 2 ** (PI_BITS + 1)) - Fraction(P1))  # the rest, nearest
TWO_OVER_PI = float(Fraction(2 ** (PI_BITS + 1), _PI))
PI_OVER_2_FIXED = float(Fraction(_PI, 2 ** (PI_BITS + 1))) * 2.0 ** -62    # r = f pi/2, f with 62 fraction bits

FIRST_WINDOW = -6       # the table's first row: q - 1 for the smallest q the integer reduction is kept for (2^18)
LAST_WINDOW = 104       # q - 1 for inf and NaN (an exponent field of 255), whose lanes select x - x instead


def _windows() -> np.ndarray:
    """Row k - FIRST_WINDOW: 2/pi's bits b_k .. b_(k+95) (b_1 the first after the binary point, b_k = 0 for k < 1),
    as a uint64 of the first 64 and one of the last 32."""
    precision = LAST_WINDOW + 95
    two_over_pi = (1 << (precision + 1 + PI_BITS)) // _PI     # floor(2/pi 2^precision)
    rows = []
    for k in range(FIRST_WINDOW, LAST_WINDOW + 1):
        window = (two_over_pi >> (precision - (k + 95))) % (1 << 96)
        rows.append([window >> 32, window & 0xFFFFFFFF])
    return np.array(rows, np.uint64)


WINDOWS = _windows()


@njit(cache=True, inline="always")
def _reduced(x):
    """(r, n mod 4) with |x| = (n + r / (pi/2)) pi/2, |r| <= pi/4 (a hair more at the float64 way's rounding)."""
    a = abs(x)
    # float64: small arguments
    ad = np.float64(a)
    nd = np.rint(ad * TWO_OVER_PI)
    r_small = (ad - nd * P1) - nd * P2
    n_small = np.uint64(np.int64(nd) & 3)
    # integers: x = m 2^q, the window of 2/pi from bit q - 1 (b_k with k < q - 1 add multiples of 4)
    bits = np.uint64(bits_of_f32(a))
    m = (bits & np.uint64(0x7FFFFF)) | np.uint64(0x800000)
    row = min(max(np.int64(bits >> np.uint64(23)) - 151, FIRST_WINDOW), LAST_WINDOW) - FIRST_WINDOW
    # the top 64 bits of m * window mod 2^96 (x 2/pi mod 4 with 94 fraction bits): m times the window's first 64
    # bits mod 2^64, plus the carry from its last 32
    z = m * WINDOWS[row, 0] + ((m * WINDOWS[row, 1]) >> np.uint64(32))
    n_large = (z + np.uint64(1 << 61)) >> np.uint64(62)
    r_large = np.float64(np.int64(z - (n_large << np.uint64(62)))) * PI_OVER_2_FIXED
    small = a < np.float32(SMALL)
    return (r_small if small else r_large), (n_small if small else n_large & np.uint64(3))


@njit(cache=True, inline="always")
def _sin_or_cos(r, quadrant):
    """sin(r + quadrant pi/2) in float64 for |r| <= pi/4: +-sin r or +-cos r."""
    r2 = r * r
    s = r + r * r2 * (-1 / 6 + r2 * (1 / 120 + r2 * (-1 / 5040 + r2 * (1 / 362880 - r2 / 39916800))))
    c = 1.0 + r2 * (-1 / 2 + r2 * (1 / 24 + r2 * (-1 / 720 + r2 * (1 / 40320 - r2 / 3628800))))
    v = c if quadrant & np.uint64(1) else s
    return -v if quadrant & np.uint64(2) else v


@njit(cache=True, inline="always")
def sin_f32(x):
    """sin of a float32 (NaN at +-inf and NaN)."""
    r, n = _reduced(x)
    v = np.float32(_sin_or_cos(r, n))
    v = -v if bits_of_f32(x) >> np.uint32(31) else v      # sin is odd: -0 gives -0
    return v if abs(x) < np.float32(np.inf) else x - x


@njit(cache=True, inline="always")
def cos_f32(x):
    """cos of a float32 (NaN at +-inf and NaN)."""
    r, n = _reduced(x)
    v = np.float32(_sin_or_cos(r, n + np.uint64(1)))
    return v if abs(x) < np.float32(np.inf) else x - x
