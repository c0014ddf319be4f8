"""benchmarks/projection_ab.py on CPU: a quick run on a small generated graph
times every variant, finds them equal to ``separate`` and records a failing
variant instead of stopping."""
from __future__ import annotations

import json

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def ab():
    return load_benchmark("projection_ab")


def run(ab, tmp_path, *extra):
    out = tmp_path / "ab.json"
    assert ab.main(["--quick", "--device", "cpu", "--graphs", "ogbn-arxiv",
                    "--heads-channels", "2x8", "--in-channels", "16", "--out", str(out),
                    *extra]) == 0
    with open(out) as f:
        return json.load(f)["rows"]


def test_quick_run(ab, tmp_path, capsys):
    rows = run(ab, tmp_path)
    assert [(r["graph"], r["dtype"]) for r in rows] == [("ogbn-arxiv", "fp32"),
                                                        ("ogbn-arxiv", "bf16")]
    for r in rows:
        assert "error" not in r and r["nodes"] == 300
        assert list(r["variants"]) == list(ab.VARIANTS)
        tol = 1e-5 if r["dtype"] == "fp32" else 2e-2
        for name, d in r["variants"].items():
            assert d["status"] == "ok", (name, d)
            assert d["fwd_ms"] > 0 and d["fwd_bwd_ms"] > 0
            assert d["rel_err"] < tol and d["grad_rel_err"] < tol, (name, d)
        assert set(r["speedup_vs_separate"]) == {"joined", "joined-fwd"}
    assert "ogbn-arxiv | fp32 | 2x8" in capsys.readouterr().out


def test_failing_variant_is_recorded(ab, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(ab, "joined_forward_gemm", broken)
    (row,) = run(ab, tmp_path, "--dtypes", "fp32")
    d = row["variants"]
    assert d["joined-fwd"]["status"] == "error" and "boom" in d["joined-fwd"]["error"]
    assert d["separate"]["status"] == d["joined"]["status"] == "ok"
    assert d["joined"]["fwd_bwd_ms"] > 0


def test_unknown_variant_is_refused(ab):
    with pytest.raises(SystemExit):
        ab.parse_args(["--variants", "joined,nope"])
