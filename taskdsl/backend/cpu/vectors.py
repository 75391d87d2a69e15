"""The host's vector unit as the cpu target uses it: how wide LLVM's SLP vectorizer may go, and how many
vector registers a register tile may fill (the cpu matmul template's budget).

LLVM tunes Intel's AVX-512 parts to prefer 256-bit vectors (its `prefer-256-bit`), so by default the
SLP vectorizer builds ymm code there and half of each 512-bit FMA unit idles. Where the host has
AVX-512, the generated kernels are compiled with the SLP vectorizer's register size raised to 512
bits (LLVM's `-slp-max-reg-size`): a 6x32 register tile of zmm accumulators ran the cpu matmul at
~330 GFLOP/s where the AVX2-sized 6x16 tile ran at ~215 (docs/benchmarks.md, session 22).
$TASKDSL_CPU_VECTOR_BITS (128, 256 or 512) caps the width, e.g. on parts that slow their clock
under 512-bit code.
"""
from __future__ import annotations

import dataclasses
import functools
import os

from ...errors import ConfigError


@dataclasses.dataclass(frozen=True)
class VectorUnit:
    """A vector instruction set: its widest vector in bits and its number of vector registers."""

    bits: int
    registers: int

    @property
    def floats(self) -> int:
        """f32 lanes in one vector."""
        return self.bits // 32


SSE = VectorUnit(128, 16)
AVX2 = VectorUnit(256, 16)
AVX512 = VectorUnit(512, 32)


@functools.cache
def host() -> VectorUnit:
    """The vector unit numba compiles for (its $NUMBA_CPU_FEATURES if set, else the host's), capped
    by $TASKDSL_CPU_VECTOR_BITS."""
    features = set(_cpu_features().split(","))
    unit = AVX512 if "+avx512f" in features else AVX2 if "+avx2" in features else SSE
    cap = os.environ.get("TASKDSL_CPU_VECTOR_BITS")
    if cap:
        if cap not in ("128", "256", "512"):
            raise ConfigError(f"TASKDSL_CPU_VECTOR_BITS={cap!r}: use 128, 256 or 512")
        unit = dataclasses.replace(unit, bits=min(unit.bits, int(cap)))
    return unit


@functools.cache
def dot4_lanes() -> frozenset:
    """The lane counts of `td.dot4` the host computes by one instruction (x86's vpdpbusd): 16 with AVX-512 VNNI,
    8 and 4 with its 256- and 128-bit forms (AVX-512 VL, or AVX-VNNI), within $TASKDSL_CPU_VECTOR_BITS."""
    features = set(_cpu_features().split(","))
    lanes = {16} if "+avx512vnni" in features else set()
    if {"+avx512vnni", "+avx512vl"} <= features or "+avxvnni" in features:
        lanes |= {4, 8}
    return frozenset(n for n in lanes if 32 * n <= host().bits)


def _cpu_features() -> str:
    from numba.core import config
    if config.CPU_NAME or config.CPU_FEATURES:     # numba compiles for the CPU these name, not the host
        return config.CPU_FEATURES or ""
    import llvmlite.binding as llvm
    return llvm.get_host_cpu_features().flatten()


@functools.cache
def widen_slp_vectors() -> None:
    """Let LLVM's SLP vectorizer build vectors as wide as `host()` has (once per process: an LLVM option)."""
    import llvmlite.binding as llvm
    llvm.set_option("taskdsl", f"-slp-max-reg-size={host().bits}")


__all__ = ["VectorUnit", "SSE", "AVX2", "AVX512", "host", "widen_slp_vectors"]
