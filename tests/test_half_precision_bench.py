"""benchmarks/half_precision.py on CPU: the op-level byte model against hand counts,
and the whole script on tiny generated graphs (``--device cpu --tiny``): the JSON's
schema, values finite and positive where set, the FlexAttention statuses, a failing
row and the time limit."""
from __future__ import annotations

import json
import math

import pytest

from conftest import fail_for, load_benchmark


@pytest.fixture(scope="module")
def hp():
    return load_benchmark("half_precision")


@pytest.fixture(scope="module")
def pb():
    return load_benchmark("profile_backward")


N, E, H, C = 10, 40, 2, 8
ROWS = N * H * C * 4  # one fp32 [N, H, C] tensor
STAT = N * H * 4  # an fp32 per-row, per-head statistic
CSR = (N + 1) * 4 + E * 4 + 12 * 12  # rowptr, col, 12 work items
CSC = (N + 1) * 4 + E * 4 + 11 * 12  # colptr, row, 11 work items


def test_op_bytes(pb):
    ob = {s: pb.op_bytes(s, N, N, E, H, C, 4, 12, 11)
          for s in ("dot", "additive", "gatv2", "cosine")}
    # the dot forward is byte_model's: q, k, v, the CSR read; out, lse written
    assert ob["dot"]["fwd"]["bytes"] == 4 * ROWS + STAT + CSR
    assert ob["dot"]["fwd"]["bytes"] == pb.byte_model("gt", N, N, E, H, C, 4, 12, 11)[
        "gt_fwd"]["bytes"]
    # q, k, v, out, dO, lse, the CSR and the CSC read; dq, dk, dv written
    assert ob["dot"]["bwd"]["bytes"] == 8 * ROWS + STAT + CSR + CSC
    assert ob["additive"]["fwd"]["bytes"] == 2 * ROWS + 3 * STAT + CSR
    assert ob["additive"]["bwd"]["bytes"] == 4 * ROWS + 5 * STAT + CSR + CSC
    att = H * C * 4
    assert ob["gatv2"]["fwd"]["bytes"] == 3 * ROWS + att + STAT + CSR
    assert ob["gatv2"]["bwd"]["bytes"] == 6 * ROWS + 2 * att + STAT + CSR + CSC
    assert ob["cosine"]["fwd"]["bytes"] == 2 * ROWS + 4 + STAT + CSR
    assert ob["cosine"]["bwd"]["write"] == {"dx": ROWS, "dbeta": 4}
    half = pb.op_bytes("dot", N, N, E, H, C, 2, 12, 11)
    assert half["fwd"]["read"]["q"] == ROWS // 2 and half["fwd"]["write"]["lse"] == STAT
    with pytest.raises(ValueError):
        pb.op_bytes("flash", N, N, E, H, C, 4, 1, 1)


def run_main(hp, out, *extra):
    assert hp.main(["--out", str(out), "--device", "cpu", "--tiny", *extra]) == 0
    return json.loads((out / "half_precision.json").read_text())


def positive(v):
    return isinstance(v, float) and math.isfinite(v) and v > 0


def test_main_on_cpu_tiny(hp, tmp_path):
    layers = ("dot-4x32", "additive-4x32", "gatv2-4x32", "cosine-4x32")
    doc = run_main(hp, tmp_path / "out", "--graphs", "PATTERN,GitHub", "--layers",
                   ",".join(layers), "--dtypes", "fp32,bf16")
    info = doc["info"]
    assert info["gpu"] == "cpu" and info["torch"] and info["date"]
    assert info["command"].startswith("python -m benchmarks.half_precision --out ")
    assert positive(info["copy_GBps"]) and positive(info["wall_s"])
    assert doc["graphs"]["PATTERN"]["kind"] == "batch"
    assert doc["graphs"]["GitHub"]["kind"] == "power-law"
    assert [(r["graph"], r["layer"], r["dtype"]) for r in doc["rows"]] == [
        (g, layer, dt) for g in ("PATTERN", "GitHub") for layer in layers
        for dt in ("fp32", "bf16")]
    keys = set(hp.new_row("PATTERN", "dot-4x32", "fp32"))
    for r in doc["rows"]:
        assert set(r) == keys, r
        assert r["status"] == "ok", r
        assert (r["H"], r["C"]) == (4, 32) and r["error"] is None
        for k in ("fwd_ms", "fused_fwd_bwd_ms"):
            assert positive(r[k]), (k, r)
        # a difference of two wall-clock medians: finite, its sign is noise on a CPU
        assert math.isfinite(r["bwd_ms"]) and math.isfinite(r["bwd_over_fwd"])
        assert r["bwd_ms"] == pytest.approx(r["fused_fwd_bwd_ms"] - r["fwd_ms"])
        assert r["peak_MB"] is None  # no CUDA memory statistics on the CPU
        rf = r["roofline"]
        assert rf["copy_GBps"] == info["copy_GBps"]
        assert rf["bwd_bytes"] > rf["fwd_bytes"] > 0
        for k, v in rf.items():
            assert v is None or positive(float(v)), (k, v)
        assert positive(rf["fwd_GBps"]) and positive(rf["fwd_of_copy"])
        assert r["bf16_over_fp32"] is None if r["dtype"] == "fp32" else positive(
            r["bf16_over_fp32"])
        assert r["fp16_over_fp32"] is None
        # FlexAttention: none on CPU (no backward), none for other scores or graphs
        assert r["flex_fwd_bwd_ms"] is None and r["flex_over_fused"] is None
        status = r["flex"]["status"]
        if r["score"] != "dot" or r["graph"] == "GitHub":
            assert status == "not_applicable", r["flex"]
        elif r["dtype"] == "fp32":
            assert status == "not_run", r["flex"]   # not in --flex-dtypes (bf16)
        else:
            assert status in ("unsupported", "error"), r["flex"]
            assert r["flex"]["forms"]["flex-seq"]["status"] == status
    assert doc["rows"][2]["flex"]["error"] == "additive score: no mask form"
    assert doc["rows"][8]["flex"]["error"] == "not a batch of graphs"  # GitHub, dot


def test_failed_row_and_time_limit(hp, pb, tmp_path, monkeypatch):
    """A row whose op raises keeps its error and null timings; the run goes on. A
    FlexAttention case past --time-limit-s is skipped."""
    fail_for(monkeypatch, pb, "make_case", "gatv2", RuntimeError("out of memory\nsecond line"))
    doc = run_main(hp, tmp_path / "out", "--graphs", "MNIST", "--layers",
                   "gatv2-4x32,dot-1x128", "--dtypes", "bf16", "--time-limit-s", "0")
    bad, dot = doc["rows"]
    assert (bad["status"], bad["error"]) == ("error", "RuntimeError: out of memory")
    assert all(bad[k] is None for k in hp.TIMES + hp.RATIOS)
    assert bad["roofline"]["fwd_bytes"] > 0 and bad["roofline"]["fwd_GBps"] is None
    assert dot["status"] == "ok" and positive(dot["fwd_ms"])
    assert dot["flex"]["status"] == "skipped"


def test_arguments(hp):
    args = hp.parse_args(["--out", "x", "--quick"])
    assert args.graphs == ["PATTERN", "GitHub"] and args.layers == ["dot-1x128", "gatv2-4x32"]
    assert args.dtypes == ["fp32", "bf16"] and args.time_limit_s == hp.QUICK_TIME_LIMIT_S
    args = hp.parse_args(["--out", "x"])
    assert args.graphs == list(hp.GRAPHS) and len(args.layers) == 5
    assert args.flex_forms == ["flex-seq"] and args.flex_dtypes == ["bf16"]
    for bad in (["--graphs", "Cora"], ["--layers", "dot-2x64"], ["--dtypes", "fp8"],
                ["--device", "cpu"]):
        with pytest.raises(SystemExit):
            hp.parse_args(["--out", "x", *bad])


def test_override_reaches_every_fused_row(hp, tmp_path, monkeypatch):
    """``--override FIELD=VALUE``: checked with the plan's message before anything
    runs, in force around each fused row and recorded in ``info``."""
    seen = []
    real = hp.run_fused

    def spy(row, *args):
        seen.append(hp.ops.plan.overrides())
        return real(row, *args)

    monkeypatch.setattr(hp, "run_fused", spy)
    doc = run_main(hp, tmp_path / "out", "--graphs", "PATTERN", "--layers", "additive-4x32",
                   "--dtypes", "bf16", "--override", "row_walk=True", "--override", "chunk=16")
    assert seen == [{"row_walk": True, "chunk": 16}]
    assert doc["info"]["overrides"] == {"row_walk": "True", "chunk": "16"}
    assert hp.ops.plan.overrides() == {}
    for bad in ("chunk=0", "row_walk", "nope=1"):
        with pytest.raises(SystemExit):
            hp.parse_args(["--out", "x", "--override", bad])
