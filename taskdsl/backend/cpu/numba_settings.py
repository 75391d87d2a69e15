"""Settings numba reads once, when it is imported: made here, before taskdsl imports numba.

numba's type inference raises and catches thousands of exceptions while it types a generated kernel (a failed
literal typing for each of its constants, a failed `typeof` for each operator it looks up), and with error
highlighting on (numba's default where colorama is installed), numba wraps each one's message in terminal escapes,
starting and stopping colorama for it.
Off, ResNet-50's fused convolutions compile about 8% faster (docs/benchmarks.md, session 64); the messages keep
their text. A process that imported numba before taskdsl keeps numba's setting, as does one whose environment
sets NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING already (empty: highlighting on).

On a host with AVX512-FP16 (Sapphire Rapids and later), LLVM computes `fptrunc(fpext(a) * fpext(b))` as an f16
multiply (exact alone) and then contracts an f16 product and sum into one FMA, so a fused 16-bit kernel skipped
the rounding to f16 between its steps that each operator alone stores (1 ulp of f16 apart, not bit-equal to the
unfused graph). numba compiles for the host's features without AVX512-FP16 instead (NUMBA_CPU_FEATURES): f16
values are still converted by F16C's instructions and computed in f32, as on other hosts. A process that compiled
numba code before importing taskdsl, or that sets NUMBA_CPU_NAME or NUMBA_CPU_FEATURES, keeps its own.
"""
import os
import sys

os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")


def _host_features_without_f16_arithmetic() -> str | None:
    """The host's LLVM feature string with AVX512-FP16 turned off, or None where it has no AVX512-FP16."""
    from llvmlite import binding
    features = binding.get_host_cpu_features()
    if not features.get("avx512fp16"):
        return None
    features["avx512fp16"] = False
    return features.flatten()


if os.environ.get("NUMBA_CPU_NAME", "host") in ("", "host") and not os.environ.get("NUMBA_CPU_FEATURES"):
    _features = _host_features_without_f16_arithmetic()
    if _features:
        os.environ["NUMBA_CPU_FEATURES"] = _features
        if "numba.core.config" in sys.modules:      # imported already: its codegen, made at the first compile, reads it
            sys.modules["numba.core.config"].CPU_FEATURES = _features
