"""The training example (examples/train.py -> pyg_dfgnn.train) and the CLI."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyg_dfgnn import datasets

ROOT = Path(__file__).resolve().parents[1]

needs_data = pytest.mark.skipif(datasets.data_dir() is None or not datasets.data_dir().is_dir(),
                                reason="offline data folder (../shared/data) not found")


@needs_data
@pytest.mark.parametrize("model", ["gt", "gat", "agnn"])
def test_train_both_impls(model, tmp_path, capsys):
    from pyg_dfgnn.train import main

    out = tmp_path / "res.json"
    report = main(["--model", model, "--impl", "both", "--epochs", "6", "--device", "cpu",
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


@needs_data
@pytest.mark.parametrize("model", ["gt", "gat", "agnn"])
def test_fused_and_native_train_identically_without_dropout(model):
    """Same seed -> same initial parameters; without dropout the two implementations
    compute the same function, so their loss curves agree to fp32 tolerance."""
    from pyg_dfgnn.train import main

    report = main(["--model", model, "--epochs", "3", "--dropout", "0", "--device", "cpu",
                   "--no-progress"])
    a = torch.tensor(report["results"]["native"]["losses"])
    b = torch.tensor(report["results"]["fused"]["losses"])
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a, b)


def test_fused_model_uses_fused_layers_with_native_parameters():
    from torch_geometric.nn import AGNNConv, GATConv, TransformerConv

    from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv
    from pyg_dfgnn.train import build_model

    for model, native_cls, fused_cls in [("gt", TransformerConv, FusedTransformerConv),
                                        ("gat", GATConv, FusedGATConv),
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


def test_cli_help(capsys):
    from pyg_dfgnn.__main__ import main

    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "train" in text and "bench" in text
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--model", "--impl", "--epochs", "--hidden", "--heads", "--lr",
                "--weight-decay", "--dropout", "--seed", "--device", "--json"):
        assert opt in text


def test_cli_bench_without_script(monkeypatch, tmp_path, capsys):
    import pyg_dfgnn.__main__ as cli

    monkeypatch.setattr(cli, "BENCH_SCRIPT", tmp_path / "missing.py")
    assert cli.main(["bench"]) == 2
    assert "no benchmark script" in capsys.readouterr().err


def test_example_script_help():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--model {gt,gat,agnn}" in r.stdout
