"""`python -m taskdsl.bench`: the command line refuses options that do not apply."""
import pytest

from taskdsl.bench.__main__ import main


def test_layout_is_a_conv_option_only(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["matmul", "--layout", "NHWC"])
    assert exit_info.value.code == 2
    assert "--layout applies to the conv benchmark only" in capsys.readouterr().err


def test_layers_is_a_conv_option_only(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ops", "--layers", "depthwise"])
    assert exit_info.value.code == 2
    assert "--layers applies to the conv benchmark only" in capsys.readouterr().err


def test_the_depthwise_layers_match_onnxruntime(capsys):
    """One MobileNet-V2 depthwise layer (7x7x960) with bias and ReLU6, timed against and checked with onnxruntime."""
    pytest.importorskip("onnxruntime")
    from taskdsl.bench import conv
    row, = conv.run(sizes=(9,), layers="depthwise")
    assert row["layer"] == (960, 7, 960, 3, 1) and row["err"] < 1e-5
    assert row["taskdsl"] > 0 and row["peer"] > 0
    assert "MobileNet-V2 depthwise layers" in capsys.readouterr().out


def test_the_cpu_matmul_rows_check_both_kernels_against_numpy(capsys):
    """A prime size through the template as called (B packed per block) and with B packed once."""
    from taskdsl.bench import matmul
    row, = matmul.run(sizes=(37,))
    assert row["size"] == 37 and row["err"] < 1e-5
    assert row["taskdsl"] > 0 and row["packed"] > 0 and row["peer"] > 0
    assert "B packed GFLOP/s" in capsys.readouterr().out
