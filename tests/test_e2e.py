"""benchmarks/e2e.py --quick on CPU, in-process: JSON structure, finite losses, and
native / fused computing the same function (same weights, dropout 0)."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from pyg_dfgnn import datasets

ROOT = Path(__file__).resolve().parents[1]


def _load_script(name: str):
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def e2e():
    return _load_script("e2e")


@pytest.fixture(scope="module")
def quick(e2e, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "e2e.json"
    report = e2e.main(["--quick", "--datasets", "pattern", "--models", "gt", "--dropout", "0",
                       "--device", "cpu", "--no-progress", "--out", str(out)])
    return report, out


def _finite(xs):
    return all(isinstance(x, float) and math.isfinite(x) for x in xs)


def test_json_structure(quick, e2e):
    report, out = quick
    on_disk = json.loads(out.read_text())
    assert on_disk["rows"] == json.loads(json.dumps(report["rows"]))
    info = on_disk["info"]
    for key in ("gpu", "device", "torch", "cuda", "torch_geometric", "pyg_dfgnn", "cuda_kernels",
                "date", "quick"):
        assert key in info
    assert info["device"] == "cpu" and info["quick"] is True and info["cuda_kernels"] is False
    assert on_disk["config"]["batch_size"] == 32 and on_disk["config"]["train_graphs"] == 64
    (row,) = on_disk["rows"]
    assert (row["dataset"], row["kind"], row["model"]) == ("PATTERN", "batch", "gt")
    assert row["graphs_per_step"] == 32 and row["steps_per_epoch"] == 2
    assert set(row["impls"]) == {"native", "fused"}
    for impl, r in row["impls"].items():
        assert "error" not in r
        for p in e2e.PHASES:
            assert r[f"{p}_ms"] >= 0.0
        assert r["step_ms"] > 0 and r["forward_ms"] > 0 and r["backward_ms"] > 0
        assert r["sum_ms"] == pytest.approx(sum(r[f"{p}_ms"] for p in e2e.PHASES))
        assert r["steps"] == 4 and r["timed_steps"] == 3          # 2 epochs x 2, warmup 1
        assert len(r["losses"]) == 4 and len(r["epochs"]) == 2
        assert r["peak_MB"] is None                               # CPU: no CUDA memory stats
        assert _finite(r["losses"]) and _finite([e["loss"] for e in r["epochs"]])
        assert 0.0 <= r["test_acc"] <= 1.0
    assert row["impls"]["native"]["preprocess_ms"] == 0.0
    assert row["impls"]["fused"]["preprocess_ms"] > 0.0           # layout built every step
    assert set(row["speedup"]) == {"step", "forward", "backward", "sum"}


def test_same_function(quick):
    (row,) = quick[0]["rows"]
    na, fu = row["impls"]["native"], row["impls"]["fused"]
    # identical weights, dropout 0: the first loss is the same function's value
    assert fu["first_loss"] == pytest.approx(na["first_loss"], rel=1e-5)
    assert fu["first_epoch_loss"] == pytest.approx(na["first_epoch_loss"], rel=1e-4)
    for a, b in zip(fu["losses"], na["losses"]):
        assert a == pytest.approx(b, rel=1e-3)


def test_tables(quick, e2e):
    text = e2e.format_tables(quick[0])
    for word in ("GT model", "PATTERN", "Preprocess", "Forward", "Backward", "Optimizer",
                 "Speedup", "Test acc"):
        assert word in text


@pytest.mark.skipif(datasets.data_dir() is None, reason="offline data folder not found")
def test_full_graph_agnn(e2e, tmp_path):
    report = e2e.main(["--quick", "--datasets", "cora", "--models", "agnn", "--dropout", "0",
                       "--device", "cpu", "--no-progress", "--full-epochs", "2",
                       "--out", str(tmp_path / "e.json")])
    (row,) = report["rows"]
    assert row["kind"] == "full" and row["nodes"] == 2708
    na, fu = row["impls"]["native"], row["impls"]["fused"]
    assert fu["first_loss"] == pytest.approx(na["first_loss"], rel=1e-5)
    assert fu["preprocess_first_ms"] > 0.0    # the layout is built once, on the first step
    assert "best_epoch" in fu and _finite(fu["losses"])


def test_plot_from_e2e_json(quick, tmp_path):
    plot = _load_script("plot")
    kernels = ROOT / "benchmarks" / "results" / "kernels_h100.json"
    written = plot.main(["--kernels", str(kernels), "--e2e", str(quick[1]),
                         "--out-dir", str(tmp_path)])
    assert len(written) == 3
    for w in written:
        assert Path(w).stat().st_size > 10 * 1024


def test_bad_arguments(e2e):
    for argv in (["--datasets", "zinc"], ["--models", "gcn"], ["--hidden", "30", "--heads", "4"]):
        with pytest.raises(SystemExit):
            e2e.parse_args(argv)
