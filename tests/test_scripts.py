"""The example and benchmark scripts as a user meets them: every option has help
text and shows its default, a script that needs a GPU says so in one line, and
the skipped-tests summary counts reasons."""
from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, load_benchmark, load_script

# (how to load the script, the call that parses ["--help"])
SCRIPTS = {
    "examples/train.py": lambda: load_script("examples/train.py").parse_args,
    "examples/train_minibatch.py": lambda: load_script("examples/train_minibatch.py").main,
    "examples/multi_gpu.py": lambda: load_script("examples/multi_gpu.py").parse_args,
    "examples/train_molhiv.py": lambda: load_script("examples/train_molhiv.py").parse_args,
    "benchmarks.kernels": lambda: load_benchmark("kernels").main,
    "benchmarks.layers": lambda: load_benchmark("layers").parse_args,
    "benchmarks.e2e": lambda: load_benchmark("e2e").parse_args,
    "benchmarks.minibatch": lambda: load_benchmark("minibatch").main,
    "benchmarks.layout": lambda: load_benchmark("layout").main,
    "benchmarks.multi_gpu": lambda: load_benchmark("multi_gpu").parse_args,
    "benchmarks.plot": lambda: load_benchmark("plot").main,
    "benchmarks.profile_backward": lambda: load_benchmark("profile_backward").parse_args,
    "benchmarks.half_precision": lambda: load_benchmark("half_precision").parse_args,
    "benchmarks.sanitize": lambda: load_benchmark("sanitize").main,
    "benchmarks.layout_build_check": lambda: load_benchmark("layout_build_check").main,
    "benchmarks.host_path": lambda: load_benchmark("host_path").main,
}


def _parser(monkeypatch, call) -> argparse.ArgumentParser:
    """The parser a script builds, caught as it parses ``--help``."""
    seen = []
    original = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):
        seen.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    with pytest.raises(SystemExit) as e:
        call(["--help"])
    assert e.value.code == 0
    return seen[0]


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_every_option_has_help_and_default(script, monkeypatch, capsys):
    parser = _parser(monkeypatch, SCRIPTS[script]())
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"{script} {name}: no help text"
        takes_value = action.nargs != 0
        if action.option_strings and takes_value and not action.required:
            text = formatter._get_help_string(action)
            assert "default" in text, f"{script} {name}: the help does not show the default"
    assert "usage:" in capsys.readouterr().out


def test_multi_gpu_names_its_data_folder_data(monkeypatch):
    parser = _parser(monkeypatch, SCRIPTS["examples/multi_gpu.py"]())
    flags = {f for a in parser._actions for f in a.option_strings}
    assert "--data" in flags and "--root" not in flags


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("cmd", [["-m", "benchmarks.kernels", "--out", "x/k.json"],
                                 ["-m", "benchmarks.layers"],
                                 ["-m", "benchmarks.e2e"],
                                 ["-m", "benchmarks.half_precision", "--out", "x"]])
def test_gpu_scripts_refuse_in_one_line(cmd, tmp_path):
    r = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and "FutureWarning" not in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_sanitize_without_gpu_is_one_line(tmp_path):
    r = subprocess.run(["bash", "benchmarks/sanitize.sh", str(tmp_path / "san")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert r.returncode != 0
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "needs a CUDA GPU" in r.stderr
    assert not (tmp_path / "san").exists()


def test_progress_bars_only_on_a_terminal(monkeypatch):
    """A log or a pipe (stderr not a terminal) gets no bar lines; --no-progress
    turns the bar off on a terminal too."""
    from benchmarks import cli

    terminal = io.StringIO()
    terminal.isatty = lambda: True
    for stderr, show, drawn in ((terminal, True, True), (terminal, False, False),
                                (io.StringIO(), True, False)):
        monkeypatch.setattr(sys, "stderr", stderr)
        with cli.progress(range(2), show=show) as bar:
            assert bar.disable != drawn


def test_scripts_draw_bars_through_cli_progress():
    for path in [*ROOT.glob("examples/*.py"), *ROOT.glob("benchmarks/*.py")]:
        if path.name != "cli.py":
            assert "tqdm(" not in path.read_text(), f"{path.name}: use benchmarks.cli.progress"


def test_plot_without_inputs_says_what_it_needs(capsys):
    with pytest.raises(SystemExit) as e:
        load_benchmark("plot").main([])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--kernels JSON" in err and "--e2e JSON" in err and "benchmarks/results/" in err


def test_skip_summary_counts_reasons(tmp_path):
    """``-rs`` would print a line per skipped test; the summary groups them."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(5))\n"
        "def test_a(i):\n    pytest.skip('needs a thing')\n"
        "def test_b():\n    pytest.skip('needs another')\n")
    (tmp_path / "conftest.py").write_text(
        (ROOT / "tests" / "conftest.py").read_text())
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path / "test_skips.py")], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # this checkout's package
    assert "6 skipped, by reason" in r.stdout, r.stdout
    assert "    5  needs a thing" in r.stdout and "    1  needs another" in r.stdout
    assert "SKIPPED" not in r.stdout


def test_host_path_overrides_are_checked_before_the_gpu(capsys):
    """``benchmarks.host_path --override FIELD=VALUE``: values as Python literals
    (else strings), and a bad item exits with the plan's message before anything
    needs a GPU."""
    host_path = load_benchmark("host_path")
    assert load_benchmark("cli").parse_overrides(argparse.ArgumentParser(), [
        "chunk=16", "item_order=rcm", "two_rows=False"]) == {
        "chunk": 16, "item_order": "rcm", "two_rows": False}
    for bad, message in ((["chunk=0"], "chunk must be"), (["nope=1"], "unknown field"),
                         (["chunk"], "FIELD=VALUE")):
        with pytest.raises(SystemExit) as e:
            host_path.main([a for item in bad for a in ("--override", item)])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_build_inputs_hash_follows_the_build_inputs(tmp_path):
    """``benchmarks/build_inputs_hash.sh DIR``, which decides whether a prebuilt
    extension serves a tree (``device_run.sh``'s PREBUILT): equal for a copy of the
    sources, changed by an edit under ``cuda/``, not by a file outside the build
    inputs."""
    import shutil

    def digest(tree):
        r = subprocess.run(["bash", str(ROOT / "benchmarks" / "build_inputs_hash.sh"),
                            str(tree)], capture_output=True, text=True, timeout=60, check=True)
        return r.stdout.strip()

    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "cuda", copy / "cuda")
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(ROOT / name, copy / name)
    base = digest(copy)
    assert len(base) == 40 and base == digest(ROOT)
    (copy / "README.md").write_text("not a build input\n")
    assert digest(copy) == base
    header = copy / "cuda" / "host" / "ops.h"
    header.write_text(header.read_text() + "// edited\n")
    assert digest(copy) != base
