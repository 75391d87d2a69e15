"""NVRTC checks of the kernels the tests launch: their CUDA C++, compiled for sm_90 in one program per test module.

Every kernel specialization a test runs (on the cpu target too) also has its CUDA source generated, at the call,
and queued here; when the module's tests end, the queued sources are compiled as one NVRTC program per
optimization mode (`td.fast_compile` or not). One program parses the headers once: about 15 ms a small kernel
instead of 95 ms compiled alone. A source an earlier module of the process built (a rule-based kernel many
modules launch) is not compiled again. A failure is reported at the teardown of the module's last test, naming the
tests and kernels whose sources fail (each compiled alone then, to tell which).

Sources with inline PTX (`asm volatile`: tensor-core fragments, async copies, prefetches) become a cubin, so that
ptxas assembles their PTX; the others stop at PTX (`compile_ptx`), NVRTC's whole C++ compile without ptxas, which
in fast mode took three quarters of a cubin's time and rejects nothing in code NVVM generated itself.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from taskdsl.backend.cuda.nvrtc import combine_sources, compile_cubin, compile_ptx

ARCH = "sm_90"
_DECLARATION = re.compile(r'(extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?\w+)\(')


@dataclass
class Queued:
    """A kernel's CUDA source, and the test that launched it first."""

    test: str       # the node id of the test that launched it
    kernel: str
    source: str


@dataclass
class CudaChecks:
    """Queued CUDA sources, by optimization mode (fast: NVRTC's least optimization)."""

    queued: dict = field(default_factory=lambda: {True: {}, False: {}})     # fast -> {source: Queued}
    built: set = field(default_factory=set)     # digests of (fast, source) compiled by earlier modules

    def add(self, test: str, kernel: str, source: str, fast: bool) -> None:
        """Queue `source` (the same text queued twice, or built by an earlier module, is compiled once)."""
        if _digest(source, fast) not in self.built:
            self.queued[fast].setdefault(source, Queued(test, kernel, source))

    def compile_all(self) -> None:
        """Compile what is queued (one program per mode) and empty the queue; an
        AssertionError names each test whose kernel does not compile."""
        failures = []
        for fast, queued in self.queued.items():
            for assembled in (True, False):
                group = [q for source, q in queued.items() if _has_inline_ptx(source) == assembled]
                failed = _compile(group, fast, compile_cubin if assembled else compile_ptx) if group else []
                if not failed:
                    self.built.update(_digest(q.source, fast) for q in group)
                failures += failed
            queued.clear()
        assert not failures, "NVRTC could not compile these kernels:\n" + "\n".join(failures)


def _digest(source: str, fast: bool) -> bytes:
    return hashlib.blake2b(f"{fast}\n{source}".encode(), digest_size=16).digest()


def _renamed(q: Queued, k: int) -> str:
    """q's source with its kernel renamed apart: `extern "C"` names must differ within a program."""
    return _DECLARATION.sub(rf"\g<1>__q{k}(", q.source, count=1)


def _has_inline_ptx(source: str) -> bool:
    return "asm volatile(" in source


def _compile(queued: list, fast: bool, compile_to) -> list:
    """The failures ('test: kernel: error') of one program holding `queued`, compiled by `compile_to`
    (`compile_cubin` or `compile_ptx`)."""
    try:
        compile_to(combine_sources([_renamed(q, k) for k, q in enumerate(queued)]), ARCH, "test_module", fast)
    except Exception:   # noqa: BLE001 - find which kernels fail, each compiled alone
        failures = []
        for q in queued:
            try:
                compile_to(q.source, ARCH, q.kernel, fast)
            except Exception as e:  # noqa: BLE001 - a DSLError naming the kernel's line, or NVRTC's own
                failures.append(f"{q.test}: {q.kernel}: {type(e).__name__}: {e}")
        return failures or [f"{queued[0].test} and others: the combined program fails, each kernel alone builds"]
    return []


def assert_builds_for_sm80_and_sm90(sources: list, names, label: str) -> None:
    """Every kernel named in `names` builds from `sources` (generated kernels, combined into one program per build)
    in fast mode: all of them into sm_80 PTX; for sm_90 those with inline PTX into a cubin, so that ptxas assembles
    their PTX and checks the resources, the others into PTX, as `CudaChecks` builds a module's kernels (ptxas
    would check nothing NVVM did not generate itself: the dot4 space, whose only inline PTX is eight kernels'
    prefetches, took 18.3 s as one cubin, 4.2 s as PTX). The inline PTX is the same text for both archs, and the
    instructions it uses (mma.sync, ldmatrix, cp.async, prefetch) exist on sm_80."""
    ptx80 = compile_ptx(combine_sources(sources), "sm_80", label, fast=True)
    assert [name for name in names if f".entry {name}(" not in ptx80] == []
    assembled = [source for source in sources if _has_inline_ptx(source)]
    plain = [source for source in sources if not _has_inline_ptx(source)]
    cubin = compile_cubin(combine_sources(assembled), "sm_90", label, fast=True) if assembled else b""
    ptx90 = compile_ptx(combine_sources(plain), "sm_90", label, fast=True) if plain else ""
    assert [name for name in names if name.encode() not in cubin and f".entry {name}(" not in ptx90] == []
