"""The training example (examples/train.py) and the command line (python -m pyg_dfgnn)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import datasets
from conftest import load_script, needs_data

ROOT = Path(__file__).resolve().parents[1]



@pytest.fixture(scope="module")
def train():
    return load_script("examples/train.py")


@needs_data
@pytest.mark.parametrize("model", ["gt", "gat", "gatv2", "agnn"])
def test_train_both_impls(train, model, tmp_path, capsys):
    out = tmp_path / "res.json"
    report = train.main(["--model", model, "--impl", "both", "--epochs", "6", "--device", "cpu",
                   "--lr", "0.01", "--no-progress", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert set(saved["results"]) == {"native", "fused"}
    assert saved["model"] == model and saved["device"] == "cpu"
    assert saved["speedup"] is not None and saved["speedup"] > 0
    for impl, r in saved["results"].items():
        losses = r["losses"]
        assert len(losses) == 6
        assert all(math.isfinite(v) for v in losses), (impl, losses)
        assert losses[-1] < losses[0], (impl, losses)
        assert 0.0 <= r["test_acc"] <= 1.0 and r["median_epoch_ms"] > 0
    assert report["results"]["fused"]["losses"] == saved["results"]["fused"]["losses"]
    printed = capsys.readouterr().out
    assert "native" in printed and "fused" in printed and "speedup" in printed
    # attention dropout (AGNN has none) draws other masks: the run says so
    assert ("draw their own masks" in printed) == (model != "agnn")


@needs_data
@pytest.mark.parametrize("model", ["gt", "gat", "gatv2", "agnn"])
def test_fused_and_native_train_identically_without_dropout(train, model):
    """Same seed -> same initial parameters; without dropout the two implementations
    compute the same function, so their loss curves agree to fp32 tolerance."""
    report = train.main(["--model", model, "--epochs", "3", "--dropout", "0", "--device", "cpu",
                   "--no-progress"])
    a = torch.tensor(report["results"]["native"]["losses"])
    b = torch.tensor(report["results"]["fused"]["losses"])
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a, b)


def test_fused_model_uses_fused_layers_with_native_parameters(train):
    from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv

    from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedGATv2Conv, FusedTransformerConv
    build_model = train.build_model

    for model, native_cls, fused_cls in [("gt", TransformerConv, FusedTransformerConv),
                                        ("gat", GATConv, FusedGATConv),
                                        ("gatv2", GATv2Conv, FusedGATv2Conv),
                                        ("agnn", AGNNConv, FusedAGNNConv)]:
        torch.manual_seed(0)
        native = build_model(model, "native", 12, 3, hidden=4, heads=2, dropout=0.5)
        torch.manual_seed(0)
        fused = build_model(model, "fused", 12, 3, hidden=4, heads=2, dropout=0.5,
                            strategy="pmf")
        convs = [m for m in fused.modules() if isinstance(m, native_cls)]
        assert len(convs) == 2 and all(isinstance(m, fused_cls) for m in convs)
        assert all(m.strategy == "pmf" for m in convs)
        assert not any(isinstance(m, fused_cls) for m in native.modules())
        sa, sb = native.state_dict(), fused.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_train_help_documents_every_option(train, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--model", "--impl", "--dataset", "--data", "--epochs", "--hidden", "--heads",
                "--lr", "--weight-decay", "--dropout", "--strategy", "--seed", "--device",
                "--json", "--no-progress"):
        assert opt in text
    assert "paper" not in text  # auto is this package's measured choice, not the paper's


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_train_cuda_without_gpu_is_a_clear_error(train, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--device", "cuda"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--device cpu" in err and "Traceback" not in err


def test_train_bad_device_is_a_clear_error(train, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--device", "gpu0"])
    assert e.value.code == 2
    assert "--device gpu0" in capsys.readouterr().err


def test_train_missing_data_folder_is_a_clear_error(train, tmp_path, capsys):
    """A wrong --data: two lines, what was expected there, no traceback."""
    with pytest.raises(SystemExit) as e:
        train.run(["--data", str(tmp_path / "nowhere"), "--epochs", "1", "--device", "cpu",
                   "--no-progress"])
    lines = str(e.value.code).splitlines()
    assert len(lines) == 2, lines
    assert "nowhere" in lines[0] and "(from --data) does not exist" in lines[0]
    assert "Planetoid/Cora/" in lines[1] and "--data DIR" in lines[1]


def test_train_failed_download_is_two_lines_and_leaves_nothing(train, tmp_path, monkeypatch):
    """No data folder and no network: two lines saying what was tried and what to
    pass, and the half-written download folder removed."""
    from torch_geometric.datasets import Planetoid

    def offline(self):
        (Path(self.raw_dir) / "ind.cora.x").write_bytes(b"partial")
        raise OSError("Cannot connect to host github.com:443 ssl:default")

    monkeypatch.setattr(Planetoid, "download", offline)
    monkeypatch.delenv(datasets.ENV_DATA, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv(datasets.ENV_CACHE, str(cache))
    with pytest.raises(SystemExit) as e:
        train.run(["--epochs", "1", "--device", "cpu", "--no-progress"])
    lines = str(e.value.code).splitlines()
    assert len(lines) == 2, lines
    assert "could not download Planetoid/Cora" in lines[0] and "Cannot connect" in lines[0]
    assert "--data DIR" in lines[1] and "PYG_DFGNN_DATA=DIR" in lines[1]
    assert "Planetoid/Cora/raw/" in lines[1]
    assert not cache.exists()  # the attempt's folders are gone


def test_cli_info(capsys):
    from pyg_dfgnn.__main__ import main

    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "torch_geometric" in text and "extension _C" in text and "fused kernels" in text
    assert "circular import" not in text


def test_cli_help(capsys):
    from pyg_dfgnn.__main__ import main
    from pyg_dfgnn.nn import FUSED

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    assert "info" in text
    assert all(cls.__name__ in text for cls in FUSED.values())  # every fused layer
    for removed in (["train"], ["bench"], []):
        with pytest.raises(SystemExit) as e:
            main(removed)
        assert e.value.code == 2


@pytest.mark.parametrize("record", [None, "PYG_DFGNN_NO_EXT=1 was set"])
def test_cli_info_without_extension(tmp_path, record):
    """A copy of the package without ``_C``: ``info`` says the extension is not
    built, and why where setup.py recorded it, instead of reporting the import
    machinery's "circular import"."""
    import json
    import shutil

    pkg = tmp_path / "pyg_dfgnn"
    shutil.copytree(ROOT / "pyg_dfgnn", pkg,
                    ignore=shutil.ignore_patterns("_C*", "__pycache__", "_build_info.json"))
    if record is not None:
        (pkg / "_build_info.json").write_text(json.dumps({"extension": False,
                                                          "reason": record}))
    code = ("import sys; sys.meta_path = [f for f in sys.meta_path "
            "if 'editable' not in str(getattr(f, '__module__', ''))]; "  # an editable install
            "from pyg_dfgnn.__main__ import main; main(['info'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "not built" in r.stdout and "circular" not in r.stdout + r.stderr
    assert (record or "no install record") in r.stdout
    assert "fused kernels    no" in r.stdout
    assert "FutureWarning" not in r.stderr  # PyG's torch.jit.script warning is silenced


def test_example_script_help():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--model {gt,gat,gatv2,agnn}" in r.stdout
    assert "FutureWarning" not in r.stderr
