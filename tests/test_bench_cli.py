"""`python -m taskdsl.bench`: the command line refuses options that do not apply."""
import pytest

from taskdsl.bench.__main__ import main


def test_layout_is_a_conv_option_only(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["matmul", "--layout", "NHWC"])
    assert exit_info.value.code == 2
    assert "--layout applies to the conv benchmark only" in capsys.readouterr().err
