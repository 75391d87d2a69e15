"""`python -m taskdsl.bench`: the command line refuses options that do not apply."""
import os
import subprocess
import sys

import pytest

from taskdsl.bench.__main__ import main
from taskdsl.bench.timing import RATIO_LEGEND


def test_layout_is_a_conv_option_only(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["matmul", "--layout", "NHWC"])
    assert exit_info.value.code == 2
    assert "--layout applies to the conv benchmark only" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["conv", "--sizes", "13"], "conv: --sizes picks layers by index, 0 to 12"),
    (["conv", "--sizes", "-1"], "conv: --sizes picks layers by index"),
    (["ops", "--sizes", "64"], "ops: --sizes takes ROWS COLS"),
    (["ops", "--sizes", "0", "32"], "ops: --sizes must be positive"),
    (["matmul", "--sizes", "-8"], "matmul: --sizes must be positive"),
    (["launch", "--sizes", "0"], "launch: --sizes must be positive"),
    (["launch", "--sizes", "100", "200"], "launch: --sizes takes one number"),
    (["launch", "--sizes", "99999999999999999999"], "launches to time (at most 100,000,000)"),     # ran forever
    (["written-out", "--sizes", "8"], "written-out takes no --sizes"),
])
def test_sizes_a_benchmark_cannot_take(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_layers_is_a_conv_option_only(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ops", "--layers", "depthwise"])
    assert exit_info.value.code == 2
    assert "--layers applies to the conv benchmark only" in capsys.readouterr().err


def test_tune_is_a_matmul_option_and_reaches_it(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["conv", "--tune"])
    assert exit_info.value.code == 2 and "--tune applies to the matmul benchmark only" in capsys.readouterr().err
    from taskdsl.bench import matmul
    calls = []
    monkeypatch.setattr(matmul, "run", lambda **options: calls.append(options))
    main(["matmul", "--tune", "--sizes", "8"])
    main(["matmul"])
    assert calls == [{"sizes": (8,), "tune": True}, {}]


def test_the_depthwise_layers_match_onnxruntime(capsys):
    """One MobileNet-V2 depthwise layer (7x7x960) with bias and ReLU6, timed against and checked with onnxruntime."""
    pytest.importorskip("onnxruntime")
    from taskdsl.bench import conv
    row, = conv.run(sizes=(9,), layers="depthwise")
    assert row["layer"] == (960, 7, 960, 3, 1) and row["err"] < 1e-5
    assert row["taskdsl"] > 0 and row["peer"] > 0
    out = capsys.readouterr().out
    assert "MobileNet-V2 depthwise layers" in out and RATIO_LEGEND in out      # which way the ratio goes


def test_the_int8_conv_rows_match_onnxruntime_exactly(capsys):
    """`bench conv --int8` on the cpu: u8 by s8 ResNet-50 layers (a 1x1 and the 7x7 stem, NHWC) through the
    integer columns, against onnxruntime's ConvInteger, exactly; --int8 is a conv option, f32-only layers refuse
    it."""
    pytest.importorskip("onnxruntime")
    from taskdsl.bench import conv
    rows = conv.run(sizes=(1, 0), layout="NHWC", int8=True)
    assert [r["layer"] for r in rows] == [(64, 56, 64, 1, 1), (3, 224, 64, 7, 2)]
    assert all(r["err"] == 0 and r["taskdsl"] > 0 and r["peer"] > 0 for r in rows)
    assert "u8 x s8 into int32" in capsys.readouterr().out
    for argv, message in ((["matmul", "--int8"], "--int8 applies to the conv benchmark only"),
                          (["conv", "--int8", "--layers", "depthwise"], "depthwise is f32 only")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_bf16_conv_rows_match_onnxruntime_within_bf16s_rounding(capsys):
    """`bench conv --bf16` on the cpu: bf16 ResNet-50 layers (a 1x1, NHWC, and a 3x3) against onnxruntime's f32 Conv
    of the same values, within a bf16 rounding of the output; --bf16 is a conv option, apart from --int8 and the
    f32-only layers."""
    pytest.importorskip("onnxruntime")
    from taskdsl.bench import conv
    rows = conv.run(sizes=(1, 5), layout="NHWC", bf16=True)
    assert [r["layer"] for r in rows] == [(64, 56, 64, 1, 1), (128, 28, 128, 3, 1)]
    assert all(0 < r["err"] < 2 ** -8 + 1e-5 and r["taskdsl"] > 0 and r["peer"] > 0 for r in rows)   # + f32 sums
    assert "ResNet-50 conv layers, bf16" in capsys.readouterr().out
    for argv, message in ((["matmul", "--bf16"], "--bf16 applies to the conv benchmark only"),
                          (["conv", "--bf16", "--int8"], "--int8 and --bf16 are two benchmarks"),
                          (["conv", "--bf16", "--layers", "depthwise"], "depthwise is f32 only: leave out --bf16")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_cpu_matmul_rows_check_both_kernels_against_numpy(capsys):
    """A prime size through the template as called (B packed per block) and with B packed once; E4M3 operands,
    their f32 product against numpy's; s8 by u8, exactly; u8 by s8 as called and packed, exactly, against
    onnxruntime's MatMulInteger (whose own error, where it saturates, is noted apart)."""
    from taskdsl.bench import matmul
    row, eight, integer, onnx_row = matmul.run(sizes=(37,))
    assert row["size"] == 37 and row["err"] < 1e-5
    assert row["taskdsl"] > 0 and row["packed"] > 0 and row["peer"] > 0
    assert eight["dtype"] == "f8e4m3" and eight["err"] < 1e-5 and eight["taskdsl"] > 0 and "packed" not in eight
    assert integer["dtype"] == "s8 x u8" and integer["err"] == 0 and integer["taskdsl"] > 0
    assert onnx_row["dtype"] == "u8 x s8 vs onnxruntime" and onnx_row["err"] == 0
    assert onnx_row["taskdsl"] > 0 and onnx_row["packed"] > 0 and onnx_row["peer"] > 0
    out = capsys.readouterr().out
    assert "B packed GFLOP/s" in out and "f8e4m3" in out and "s8 x u8" in out and "u8 x s8 vs onnxruntime" in out
    # onnxruntime's error is its own: a note where it saturates (x86 without VNNI), never a failed row
    assert ("note: the peer's 37 u8 x s8" in out) == (onnx_row["peer_err"] > 0)


def test_a_wrong_kernel_is_flagged_and_fails_the_run(monkeypatch, capsys):
    """A matmul giving zeros printed a 17x 'win' and exited 0: the error column was never compared with anything."""
    import numpy as np
    import stdlib_ops
    monkeypatch.setattr(stdlib_ops, "matmul", lambda a, b, **_: np.zeros((a.shape[0], b.shape[1]), np.float32))
    assert main(["matmul", "--sizes", "16"]) == 1
    captured = capsys.readouterr()
    assert "1.0e+00 WRONG" in captured.out
    assert "wrong results: matmul 16 f32: max rel err 1.0e+00 (tolerance 1e-03)" in captured.err
    monkeypatch.undo()
    assert main(["matmul", "--sizes", "16"]) == 0
    out = capsys.readouterr().out
    assert "WRONG" not in out and RATIO_LEGEND in out


@pytest.fixture
def cpu_clock(monkeypatch):
    """time_cuda as host timing: the simulated GPU has no events (its kernels run on the cpu)."""
    from taskdsl.bench import cuda_timing
    from taskdsl.bench.timing import time_cpu
    monkeypatch.setattr(cuda_timing, "time_cuda", lambda fn, **_: time_cpu(fn, repeat=1))


def test_the_gpu_ops_rows_run_on_device_arrays(simulated_gpu, cpu_clock, capsys):
    """The cuda rows of `bench ops` (simulated GPU): the ops on DeviceArrays, checked against numpy."""
    from taskdsl.bench import ops
    rows = ops.run(sizes=(33, 257))
    assert [r[0] for r in rows] == ["softmax", "layer_norm", "sum(axis=-1)", "sum(all)"]
    assert all(r[5] < 1e-4 and r[1] > 0 for r in rows), rows
    out = capsys.readouterr().out
    assert "datasheet peak 3352 GB/s" in out and "of peak" in out


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_launch_rows(target, simulated_gpu, capsys):
    """`bench launch`: the cold compile, the cached load and the per-launch time, on each target.

    No ordering of the times is asserted: on the simulated GPU the cold compile is as cheap as the load."""
    import taskdsl as td
    from taskdsl.bench import launch
    td.set_target(target)
    result = launch.run(sizes=(20,))
    assert result["target"] == target and min(result["cold"], result["cached"], result["launch"]) > 0
    from taskdsl.bench.launch import reads4
    assert result["launch_reading_globals"] > 0 and len(reads4._global_reads.noted) == 4   # LIMIT, SCALE, SHIFT,
    out = capsys.readouterr().out                                                         # _scaled
    assert "us per launch (mean of 20)" in out and "reading 4 globals" in out
    if target == "cpu":     # a new Python process on the disk cache (the in-process figure hit in-memory caches)
        assert result["new_process"] > 0 and "new process, cache on disk" in out


def test_settings_and_sizes_taskdsl_cannot_use_are_usage_errors(capsys):
    """An unusable TASKDSL_CACHE_DIR, and sizes beyond memory: one error line and exit 2, no traceback."""
    env = dict(os.environ, TASKDSL_CACHE_DIR="/proc/taskdsl-cannot-create-this")    # a fresh process: no kernels
    done = subprocess.run([sys.executable, "-m", "taskdsl.bench", "ops", "--sizes", "8", "8"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "the compile cache folder" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(SystemExit) as exit_info:
        main(["ops", "--sizes", "100000000", "100000"])
    assert exit_info.value.code == 2 and "not enough memory for these sizes" in capsys.readouterr().err


def test_the_conv_schedule_column_says_when_the_input_is_the_gemm_operand(simulated_gpu):
    import taskdsl as td
    from stdlib_ops import conv
    from stdlib_ops.conv_geometry import geometry
    from taskdsl.bench.conv import _schedule
    pointwise = conv.plan(geometry((1, 7, 7, 64), (32, 64, 1, 1), layout="NHWC"), td.f16, "cuda", False, None)
    spatial = conv.plan(geometry((1, 7, 7, 64), (32, 64, 3, 3), padding=1, layout="NHWC"), td.f16, "cuda",
                        False, None)
    assert _schedule(pointwise).endswith(", input as A") and "input as A" not in _schedule(spatial)
    assert _schedule(spatial).startswith("16x64 bk64")        # the tensor-core default below 2^20 outputs


def test_tc_parts_needs_the_cuda_target(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tc-parts"])
    assert exit_info.value.code == 2 and "it needs the cuda target" in capsys.readouterr().err


def test_the_tc_parts_rows(simulated_gpu, cpu_clock, monkeypatch, capsys):
    """`bench tc-parts` (simulated GPU, one small point): the whole kernel checked against numpy, each part timed,
    the copies' L2 bytes those of the point's tiles. A point of more shared memory than the device's block may
    have (192 KiB; the simulated GPU does not say, so 160) has no row."""
    from taskdsl.bench import tc_parts
    monkeypatch.setattr(tc_parts, "POINTS", (dict(warps=(1, 4), warp_tiles=(1, 2), bk=64, stages=4),
                                             dict(warps=(4, 2), warp_tiles=(4, 8), bk=64, stages=4)))
    row, = tc_parts.run(sizes=(48,))
    assert row["tile"] == "16x64x64 s4" and row["err"] < 2e-3
    assert row["l2_bytes"] == 3 * 1 * (16 + 64) * 48 * 2      # 3 x 1 blocks, each reading A and B once
    assert min(row["all"], row["copies"], row["math"], row["mma"]) > 0
    assert row["bound"] in ("copies", "math", "mma", "overlap") and row["cublas"] is None     # no torch here
    out = capsys.readouterr().out
    assert "48^3 f16 in parts" in out and "cuBLAS: not timed" in out


def test_the_tc_parts_verdict_compares_the_fastest_math_and_mma_with_the_target(monkeypatch, capsys):
    """With cuBLAS timed, the last line says whether the fastest math alone (a kernel's ceiling) and the fastest
    mma alone reach 0.6x of it, and at which tiles (times made up here: 0.6x cuBLAS is its time / 0.6)."""
    from taskdsl.bench import tc_parts
    common = dict(point=None, l2_bytes=1, err=0.0, copies=2e-4)
    rows = [dict(common, tile="128x128x64 s3", all=3.4e-4, math=3.0e-4, mma=2.8e-4),
            dict(common, tile="128x64x32 s3", all=4.6e-4, math=3.6e-4, mma=2.4e-4)]
    monkeypatch.setattr(tc_parts, "rows", lambda n: [dict(r) for r in rows])
    for cublas, reach in ((1.2e-4, "cannot reach it"), (1.5e-4, "fragment loads (ldmatrix) stand between them"),
                          (1.9e-4, "within the math's reach")):
        monkeypatch.setattr(tc_parts, "cublas_time", lambda n: cublas)
        results = tc_parts.run(sizes=(64,))
        assert [r["cublas"] for r in results] == [cublas, cublas] and results[0]["bound"] == "math"
        out = capsys.readouterr().out
        assert reach in out and "cuBLAS, 128x128x64 s3); the fastest mma alone" in out and "x, 128x64x32 s3)" in out


def test_the_batched_small_products_are_checked_against_numpy(capsys):
    """The cpu's batched small products: taskdsl's batch_matmul against numpy's matmul, timed and checked."""
    from taskdsl.bench import matmul
    row, = matmul.small_products(((64, 3, 5, 7),))
    assert row["shape"] == (64, 3, 5, 7) and row["err"] < 1e-5 and row["taskdsl"] > 0 and row["peer"] > 0
    assert "64 x (3x5 @ 5x7)" in capsys.readouterr().out


@pytest.mark.usefixtures("elementwise_fusion")
def test_the_written_out_models_are_few_kernels_and_match_onnxruntime():
    """bench written-out's models at a small size: the layer's GELU fused into its matmul and its written-out norm
    one kernel (two matmuls and a layer norm), each activation in its convolution's epilogue (im2col and GEMM)."""
    pytest.importorskip("onnxruntime")
    from taskdsl.bench import written_out
    rows = {name: (kernels, err) for name, kernels, _, _, _, _, err in written_out.rows(written_out.SMALL)}
    assert {name: kernels for name, (kernels, _) in rows.items()} == {"bert-ffn": 3, "conv-swish": 4,
                                                                        "conv-softsign": 4}
    assert all(err < 1e-5 for _, err in rows.values()), rows
