"""benchmarks/plot.py: PNG charts from the committed kernel results and a small
e2e result in benchmarks/e2e.py's format (CPU, Agg backend)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_benchmark

KERNELS_JSON = ROOT / "benchmarks" / "results" / "kernels_h100.json"
MIN_PNG_BYTES = 10 * 1024

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def plot():
    return load_benchmark("plot")


def _impl(step, pre=0.0, err=False):
    if err:
        return {"error": "OutOfMemoryError: CUDA out of memory"}
    fwd, bwd, opt = 0.3 * step, 0.6 * step, 0.1 * step - pre
    return {"preprocess_ms": pre, "forward_ms": fwd, "backward_ms": bwd, "optimizer_ms": opt,
            "step_ms": step, "sum_ms": step, "peak_MB": 100.0, "test_acc": 0.8,
            "first_loss": 1.0, "final_loss": 0.5, "losses": [1.0, 0.5],
            "epochs": [{"epoch": 1, "loss": 0.7, "train_acc": 0.6, "test_acc": 0.8}]}


def synthetic_e2e():
    """A result in benchmarks/e2e.py's format: 3 datasets x 3 models, one failed run."""
    rows = []
    for ds, kind, native in (("PATTERN", "batch", 120.0), ("Cora", "full", 16.0),
                             ("PubMed", "full", 18.0)):
        for model, f in (("gt", 4.0), ("gat", 2.5), ("agnn", 3.0)):
            na = _impl(native)
            fu = _impl(native / f, pre=1.5 if kind == "batch" else 0.0)
            row = {"dataset": ds, "key": ds.lower(), "kind": kind, "model": model,
                   "impls": {"native": na, "fused": fu},
                   "speedup": {"step": f, "forward": f, "backward": f, "sum": f}}
            rows.append(row)
    rows[-1]["impls"]["native"] = _impl(0, err=True)
    del rows[-1]["speedup"]
    info = {"gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "torch": "2.11.0+cu130",
            "cuda": "13.0", "date": "2026-11-22", "cuda_kernels": True, "quick": False}
    return {"info": info, "config": {}, "rows": rows}


def _check_png(path):
    p = Path(path)
    assert p.is_file() and p.suffix == ".png"
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > MIN_PNG_BYTES, f"{p.name} is only {len(data)} bytes"


def test_stamp(plot):
    info = json.loads(KERNELS_JSON.read_text())["info"]
    s = plot.stamp(info)
    for part in (info["gpu"], info["torch"], info["cuda"], info["date"]):
        assert part in s
    assert "reference path" in plot.stamp({**info, "cuda_kernels": False})


def test_kernel_speedups_from_committed_results(plot):
    data = json.loads(KERNELS_JSON.read_text())
    sp = plot.kernel_speedups(data)
    row = next(r for r in data["rows"] if r["graph"] == "PATTERN" and r["H"] == 1
               and r["dtype"] == "float32")
    m = row["methods"]
    want = m["pyg"]["fwd_ms"] / m["fused-auto"]["fwd_ms"]
    assert sp["gt"]["H=1×C=128 float32"]["PATTERN"]["fwd"] == pytest.approx(want)
    assert len(sp["gt"]["H=1×C=128 float32"]) == len({r["graph"] for r in data["rows"]})
    # GAT / AGNN rows (kernels.py's score_rows) get their own panels
    extra = copy.deepcopy(data)
    extra["score_rows"] = [dict(copy.deepcopy(row), model="gat"),
                           dict(copy.deepcopy(row), model="agnn", H=1)]
    assert set(plot.kernel_speedups(extra)) == {"gt", "gat", "agnn"}


def test_plot_cli_writes_pngs(plot, tmp_path):
    e2e = tmp_path / "e2e.json"
    e2e.write_text(json.dumps(synthetic_e2e()))
    out = tmp_path / "plots"
    written = plot.main(["--kernels", str(KERNELS_JSON), "--e2e", str(e2e), "--out-dir", str(out)])
    assert [Path(w).name for w in written] == ["kernels_speedup.png", "e2e_speedup.png",
                                               "e2e_breakdown.png"]
    for w in written:
        _check_png(w)


def test_plot_kernels_with_score_rows(plot, tmp_path):
    data = json.loads(KERNELS_JSON.read_text())
    data["score_rows"] = [dict(copy.deepcopy(r), model="gat") for r in data["rows"][:6]]
    _check_png(plot.plot_kernels(data, str(tmp_path / "k.png")))


def test_plot_cli_needs_an_input(plot, tmp_path):
    with pytest.raises(SystemExit) as e:
        plot.main(["--out-dir", str(tmp_path)])
    assert e.value.code == 2


def test_plot_as_module(tmp_path):
    """``python -m benchmarks.plot`` from the repository root, as the README runs it."""
    r = subprocess.run([sys.executable, "-m", "benchmarks.plot", "--kernels", str(KERNELS_JSON),
                        "--out-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    _check_png(tmp_path / "kernels_speedup.png")


def with_compiled(data):
    """The committed kernel results plus a ``pyg-compile`` entry per GT row (3x faster
    than eager PyG), one of them a compiler failure."""
    data = copy.deepcopy(data)
    for r in data["rows"]:
        p = r["methods"].get("pyg", {})
        if "fwd_ms" in p:
            r["methods"]["pyg-compile"] = {"status": "ok", "fwd_ms": p["fwd_ms"] / 3,
                                           **({"fwd_bwd_ms": p["fwd_bwd_ms"] / 3}
                                              if "fwd_bwd_ms" in p else {})}
    data["rows"][0]["methods"]["pyg-compile"] = {"status": "compile_failed",
                                                 "error": "E: boom", "stage": "fwd"}
    return data


def test_kernel_speedups_vs_compiled(plot, tmp_path):
    data = with_compiled(json.loads(KERNELS_JSON.read_text()))
    sp = plot.kernel_speedups(data)
    row = next(r for r in data["rows"][1:] if "fwd_bwd_ms" in r["methods"].get("pyg", {})
               and "fwd_bwd_ms" in r["methods"]["fused-auto"])
    cfg = f"H={row['H']}×C={row['C']} {row['dtype']}"
    got = sp["gt"][cfg][row["graph"]]
    assert got["fwd_compiled"] == pytest.approx(got["fwd"] / 3)
    assert got["fwd_bwd_compiled"] == pytest.approx(got["fwd_bwd"] / 3)
    first = data["rows"][0]
    cfg0 = f"H={first['H']}×C={first['C']} {first['dtype']}"
    assert "fwd_compiled" not in sp["gt"][cfg0][first["graph"]]      # compile failed: left out
    assert "fwd" in sp["gt"][cfg0][first["graph"]]
    _check_png(plot.plot_kernels(data, str(tmp_path / "k.png")))


def test_kernel_speedups_vs_dense_sdpa(plot, tmp_path):
    data = json.loads(KERNELS_JSON.read_text())
    sp = plot.kernel_speedups(data)
    rows = [r for r in data["rows"] if r["methods"].get("dense-sdpa", {}).get("status") == "ok"]
    assert rows, "the committed kernel results have dense SDPA rows"
    for r in rows:
        f, d = r["methods"]["fused-auto"], r["methods"]["dense-sdpa"]
        got = sp["gt"][f"H={r['H']}×C={r['C']} {r['dtype']}"][r["graph"]]
        assert got["fwd_sdpa"] == pytest.approx(d["fwd_ms"] / f["fwd_ms"])
        assert got["fwd_bwd_sdpa"] == pytest.approx(d["fwd_bwd_ms"] / f["fwd_bwd_ms"])
    # a full graph has no dense SDPA; a mismatching one is left out, not plotted
    full = next(r for r in data["rows"] if "dense-sdpa" not in r["methods"])
    assert "fwd_sdpa" not in sp["gt"][f"H={full['H']}×C={full['C']} {full['dtype']}"][full["graph"]]
    bad = copy.deepcopy(data)
    r0 = next(r for r in bad["rows"] if "dense-sdpa" in r["methods"])
    r0["methods"]["dense-sdpa"]["status"] = "mismatch"
    got = plot.kernel_speedups(bad)["gt"][f"H={r0['H']}×C={r0['C']} {r0['dtype']}"][r0["graph"]]
    assert "fwd_sdpa" not in got and "fwd" in got
    _check_png(plot.plot_kernels(bad, str(tmp_path / "k.png")))


def test_e2e_speedup_vs_compiled(plot, tmp_path):
    data = synthetic_e2e()
    for r in data["rows"][:4]:
        r["impls"]["native_compile"] = _impl(r["impls"]["native"]["step_ms"] / 2)
    data["rows"][4]["impls"]["native_compile"] = {"status": "compile_failed",
                                                  "error": "compile failed: E: boom"}
    _check_png(plot.plot_e2e_speedup(data, str(tmp_path / "e.png")))
    _check_png(plot.plot_e2e_breakdown(data, str(tmp_path / "b.png")))
