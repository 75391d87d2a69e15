"""The index of built CUDA kernels by frontend IR: a kernel built before skips lowering and code generation."""
import json
import runpy
import textwrap

import numpy as np
import pytest

import taskdsl as td
from taskdsl import ir
from taskdsl.backend.cuda import codegen


def _kernel(factor: float):
    @td.kernel(grid=lambda N: td.cdiv(N, 64), block=32)
    def scaled(X: td.f32["N"], Y: td.f32["N"]):  # noqa: F821 - N: the DSL's size symbol
        for i, in (td.spatial(32) * td.repeat(2))(td.threadIdx.x):
            j = td.blockIdx.x * 64 + i
            if j < N:  # noqa: F821
                Y[j] = X[j] * factor

    return scaled


def _compile(kernel, n: int = 77):
    x = np.zeros(n, np.float32)
    return kernel.compile(x, x, target="cuda", arch="sm_90")


@pytest.fixture
def builds(monkeypatch, tmp_path):
    """A fresh cache directory; counts the CUDA code generations (`emit_cuda` calls) made from now on."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    calls = []
    real = codegen.emit_cuda
    monkeypatch.setattr(codegen, "emit_cuda", lambda fn: calls.append(fn.name) or real(fn))
    return calls


def _index(tmp_path) -> list:
    return sorted((tmp_path / "cuda" / "index").glob("*.json"))


def test_a_kernel_built_again_is_found_by_its_ir(builds, tmp_path):
    first = _compile(_kernel(2.0))
    assert len(builds) == 1 and len(_index(tmp_path)) == 1
    again = _kernel(2.0)                 # a new kernel object, as in a new process: nothing in memory
    found = _compile(again)
    assert len(builds) == 1 and again._lowered == {}    # neither lowered nor generated
    assert found == first and f" scaled(" in found.source and found.symbol == "scaled"
    _compile(_kernel(3.0))               # another program
    _compile(_kernel(2.0), n=300)        # another size: CUDA kernels are specialized to their sizes
    assert len(builds) == 3 and len(_index(tmp_path)) == 3


def test_the_record_holds_what_a_launch_needs(builds, tmp_path):
    compiled = _compile(_kernel(2.0))
    record = json.loads(_index(tmp_path)[0].read_text())
    assert record["source"] == compiled.source and record["symbol"] == compiled.symbol
    assert (tmp_path / "cuda" / f"{record['cubin']}.cubin").read_bytes() == compiled.binary
    assert record["dynamic_shared_bytes"] == 0 and record["unused_params"] == []


def test_source_locations_are_part_of_the_key(builds, tmp_path):
    """The source's #line directives point into the user's file: the same kernel one line lower is another."""
    body = textwrap.dedent("""
        import taskdsl as td

        @td.kernel(grid=1, block=32)
        def shifted(X: td.f32[32]):
            X[td.threadIdx.x] = X[td.threadIdx.x] + 1.0
    """)
    path = tmp_path / "user" / "kernels_in_a_file.py"
    path.parent.mkdir()
    sources = []
    for blank_lines in (0, 1):
        path.write_text("\n" * blank_lines + body)
        kernel = runpy.run_path(str(path))["shifted"]
        sources.append(kernel.compile(np.zeros(32, np.float32), target="cuda").source)
    assert len(builds) == 2
    assert f'#line 6 "{path}"' in sources[0] and f'#line 7 "{path}"' in sources[1]


def test_fast_compile_and_optimized_cubins_are_indexed_apart(builds):
    td.fast_compile(True)
    fast = _compile(_kernel(2.0))
    td.fast_compile(False)
    optimized = _compile(_kernel(2.0))
    assert len(builds) == 2 and fast.source == optimized.source and fast.binary != optimized.binary


@pytest.mark.parametrize("damage", ["garbage", "missing field", "other source", "cubin gone"])
def test_a_damaged_entry_is_rebuilt(builds, tmp_path, damage):
    first = _compile(_kernel(2.0))
    index, = _index(tmp_path)
    record = json.loads(index.read_text())
    if damage == "garbage":
        index.write_text("{not json")
    elif damage == "missing field":
        index.write_text(json.dumps({k: v for k, v in record.items() if k != "symbol"}))
    elif damage == "other source":     # would launch the cubin of another source
        index.write_text(json.dumps({**record, "source": record["source"].replace("2.0f", "5.0f")}))
    else:
        (tmp_path / "cuda" / f"{record['cubin']}.cubin").unlink()
    assert _compile(_kernel(2.0)) == first
    assert len(builds) == 2
    assert json.loads(index.read_text()) == record


def test_a_custom_task_mapping_cannot_be_spelled_so_its_kernel_is_not_indexed(builds, tmp_path):
    backwards = td.TaskMapping((32,), 32, lambda w: [(31 - w,)])

    @td.kernel(grid=1, block=32)
    def reversed_copy(X: td.f32[32], Y: td.f32[32]):
        for i, in backwards(td.threadIdx.x):
            Y[i] = X[i]

    x = np.zeros(32, np.float32)
    with pytest.raises(ir.Unspellable):
        ir.structural_text(reversed_copy._frontend_ir((32, 1, 1)))
    with pytest.raises(ir.Unspellable):
        (td.repeat(2) * backwards).structural_key()
    assert reversed_copy.compile(x, x, target="cuda").symbol == "reversed_copy"
    assert len(builds) == 1 and _index(tmp_path) == []


def test_built_in_mappings_spell_as_their_structure():
    """Composition is associative: its grouping is not part of the mapping, nor of the text."""
    left = (td.spatial(2) * td.repeat(3)) * td.spatial(4)
    right = td.spatial(2) * (td.repeat(3) * td.spatial(4))
    assert ir.structural_text(left) == ir.structural_text(right)
    assert ir.structural_text(left) != ir.structural_text(td.spatial(2) * td.spatial(3) * td.spatial(4))
    assert ir.structural_text(td.spatial(2, 3, ranks=[1, 0])) != ir.structural_text(td.spatial(2, 3))


def test_the_symbol_a_launch_looks_up_is_the_sources_kernel(builds):
    """A kernel named like a C++ keyword gets a suffix in CUDA: the symbol comes with the source, built or found."""
    @td.kernel(grid=1, block=32)
    def double(X: td.f32[32]):
        X[td.threadIdx.x] = X[td.threadIdx.x] * 2.0

    x = np.zeros(32, np.float32)
    built = double.compile(x, target="cuda")
    double._cuda.clear()
    found = double.compile(x, target="cuda")
    assert built.symbol == found.symbol == "double_kernel" and " double_kernel(" in found.source
    assert len(builds) == 1
