"""Audit of `python -m models`, `python -m taskdsl.bench` and the compile cache: bad TASKDSL_* settings are
usage errors before any work, an unusable default cache folder degrades to a per-process one, and the CLI's
reference check compares whole outputs."""
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from models.cli import main as models_main
from taskdsl.bench.__main__ import main as bench_main
from taskdsl.runtime import config

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _relu_model(path):
    """A one-operator ONNX model (compiles in seconds)."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return str(path)


@pytest.fixture
def relu_run(tmp_path, monkeypatch):
    """argv of `python -m models run` on a tiny ONNX model, with a private cache."""
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path / "cache"))
    return ["run", "--onnx", _relu_model(tmp_path / "relu.onnx"), "--iters", "1", "--target", "cpu"]


BAD_SETTINGS = [
    ("TASKDSL_TUNE", "maybe"),                  # was never read on the cpu target: silently ignored
    ("TASKDSL_COMPILE_WORKERS", "0"),           # was a ValueError traceback from the compile workers
    ("TASKDSL_COMPILE_WORKERS", "-1"),
    ("TASKDSL_COMPILE_WORKERS", "x"),
    ("TASKDSL_NUM_THREADS", "0"),               # was silently read as 1
    ("TASKDSL_CACHE_MAX_MB", "x"),              # was swallowed by the recording run, then ignored
]


@pytest.mark.parametrize("name, value", BAD_SETTINGS)
def test_a_bad_setting_is_a_usage_error_before_the_build(name, value, relu_run, monkeypatch, capsys):
    monkeypatch.setenv(name, value)
    assert models_main(relu_run) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert f"{name}={value!r}" in err and len(err.splitlines()) == 1, err
    assert "building" not in captured.out          # refused before any work


def test_good_settings_still_run(relu_run, monkeypatch, capsys):
    for name, value in (("TASKDSL_TUNE", " No "), ("TASKDSL_COMPILE_WORKERS", "2"), ("TASKDSL_NUM_THREADS", " 1"),
                        ("TASKDSL_CACHE_MAX_MB", "")):
        monkeypatch.setenv(name, value)
    assert models_main(relu_run) == 0
    assert ", ok" in capsys.readouterr().out


def test_bench_refuses_a_bad_setting_before_it_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TASKDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TASKDSL_COMPILE_WORKERS", "x")     # the launch benchmark never reads it: was ignored
    with pytest.raises(SystemExit) as exit_info:
        bench_main(["launch", "--sizes", "3"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "TASKDSL_COMPILE_WORKERS='x'" in captured.err and "positive whole number" in captured.err
    assert captured.out == ""


def test_a_bad_vector_width_is_a_usage_error_not_a_traceback(tmp_path):
    """TASKDSL_CPU_VECTOR_BITS's reader raises a plain ValueError deep in code generation: a traceback before."""
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path), TASKDSL_CPU_VECTOR_BITS="100")
    done = subprocess.run([sys.executable, "-m", "taskdsl.bench", "launch", "--sizes", "3"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "TASKDSL_CPU_VECTOR_BITS='100': use 128, 256 or 512" in done.stderr


def test_env_count_reads_positive_whole_numbers_only(monkeypatch):
    for text, want in (("", 7), ("  ", 7), ("3", 3), (" 12 ", 12)):
        monkeypatch.setenv("TASKDSL_NUM_THREADS", text)
        assert config.env_count("TASKDSL_NUM_THREADS", 7) == want
    for text in ("0", "-1", "x", "1.5", "²", "1e3"):
        monkeypatch.setenv("TASKDSL_NUM_THREADS", text)
        with pytest.raises(config.ConfigError, match="TASKDSL_NUM_THREADS=.*positive whole number"):
            config.env_count("TASKDSL_NUM_THREADS", 7)


def test_a_home_that_cannot_hold_the_cache_costs_the_reuse_not_the_run(tmp_path):
    """No TASKDSL_CACHE_DIR and a home where ~/.cache cannot be made (a read-only home in a container): the run
    works in a per-process folder, removed at exit, with one warning (it was a ConfigError, exit 2). An explicit
    TASKDSL_CACHE_DIR that cannot be made stays an error (test_cli.py)."""
    home, scratch = tmp_path / "home", tmp_path / "tmp"
    home.write_text("a file, so no ~/.cache under it")
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TASKDSL_CACHE_DIR"}
    env.update(HOME=str(home), TMPDIR=str(scratch))
    done = subprocess.run([sys.executable, "-m", "models", "run", "--onnx", _relu_model(tmp_path / "relu.onnx"),
                           "--iters", "1", "--target", "cpu"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert ", ok" in done.stdout
    assert done.stderr.count("cannot create the compile cache") == 1, done.stderr
    assert not list(scratch.glob("taskdsl-cache-*"))


def test_an_unwritable_cache_leaves_no_temporary_modules_behind(tmp_path):
    """Where the cache cannot take a module it goes to a folder of the process: one warning, the same result, and
    the folder (modules and numba's machine code) is removed at exit; every run left one in $TMPDIR before."""
    cache, scratch = tmp_path / "cache", tmp_path / "tmp"
    cache.mkdir()
    scratch.mkdir()
    (cache / "cpu").write_text("a file where the cpu folder goes: nothing can be stored")
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(cache), TMPDIR=str(scratch))
    done = subprocess.run([sys.executable, "-m", "models", "run", "--onnx", _relu_model(tmp_path / "relu.onnx"),
                           "--iters", "1", "--target", "cpu"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and ", ok" in done.stdout, done.stderr
    assert done.stderr.count("cannot write the compile cache") == 1, done.stderr
    assert not list(scratch.glob("taskdsl-*"))


def test_a_cache_dir_with_a_tilde_is_under_the_home(tmp_path, monkeypatch):
    """A quoted '~/...' (systemd, Dockerfile ENV) reaches the process unexpanded: it made a folder named '~'."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TASKDSL_CACHE_DIR", "~/td-cache")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert config.cache_dir() == tmp_path / "home" / "td-cache"
    assert (tmp_path / "home" / "td-cache").is_dir() and not (tmp_path / "cwd" / "~").exists()


def test_outputs_of_another_shape_or_number_are_no_match():
    """`run` checks the compiled outputs against the reference: broadcasting compared the wrong pairs (a (2, 1)
    output against a (1, 2) reference) and zip dropped a missing output, both reported as a match."""
    from models.inference import relative_error
    column, row = np.array([[1.0], [2.0]]), np.array([[1.0, 2.0]])
    assert relative_error([column], [row]) == math.inf
    assert relative_error([np.zeros(3)], [np.zeros(3), np.ones(2)]) == math.inf
    assert relative_error([np.ones(4, np.float16)], [np.ones(4, np.float32)]) == 0.0


def test_equal_infinities_are_compared_without_a_warning():
    """`run` printed 'RuntimeWarning: invalid value encountered in subtract' for outputs with agreeing infinities."""
    from models.inference import relative_error
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert relative_error([np.array([np.inf, 1.5, np.nan])], [np.array([np.inf, 2.0, np.nan])]) == 0.25


def test_the_target_help_names_taskdsl_target(capsys):
    """The default target honours TASKDSL_TARGET (td.get_target); the help said only 'cuda with a GPU, else cpu'."""
    with pytest.raises(SystemExit):
        models_main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default: $TASKDSL_TARGET, else cuda with a usable GPU, else cpu" in help_text


def test_library_readers_of_counts_and_vector_width_raise_config_errors(monkeypatch):
    """Outside the CLIs too: num_threads read 0 as 1 and 'x' as a bare int() error; the vector width cap was a
    plain ValueError."""
    from taskdsl.backend.cpu import launch, precompile, vectors
    for name, reader in (("TASKDSL_NUM_THREADS", launch.num_threads), ("TASKDSL_COMPILE_WORKERS", precompile.workers)):
        for text in ("0", "x"):
            monkeypatch.setenv(name, text)
            with pytest.raises(config.ConfigError, match=f"{name}='{text}'"):
                reader()
        monkeypatch.setenv(name, "3")
        assert reader() == 3
    monkeypatch.setenv("TASKDSL_CPU_VECTOR_BITS", "100")
    with pytest.raises(config.ConfigError, match="use 128, 256 or 512"):
        vectors.host.__wrapped__()      # (host() is read once a process)


@pytest.mark.parametrize("command", [["taskdsl", "cache", "info"], ["taskdsl.bench", "launch"], ["models", "list"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(command, tmp_path):
    """`python -m models run resnet50 | head -1` ended in a BrokenPipeError traceback (exit 1); it now ends as
    `cat` does there, with 128 + SIGPIPE and nothing on stderr."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TASKDSL_CACHE_DIR=str(tmp_path), PYTHONPATH=root, TASKDSL_TARGET="cpu")
    process = subprocess.Popen([sys.executable, "-m", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, cwd=tmp_path)
    process.stdout.close()          # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141 and "Traceback" not in stderr and "Error" not in stderr, stderr
