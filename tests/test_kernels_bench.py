"""benchmarks/kernels.py on CPU: dense masked SDPA against the float64 reference,
compile-failure recording through a failing fake compiler, the JSON fields of a
case run end to end on CPU (timer swapped for a wall clock), and the tables."""
from __future__ import annotations

import json
import math
import time

import pytest
import torch

from conftest import load_benchmark, rel_err
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import reference


@pytest.fixture(scope="module")
def kb():
    return load_benchmark("kernels")


@pytest.fixture
def wall_clock(kb, monkeypatch):
    """``bench`` as a few wall-clock calls (triton's ``do_bench`` needs a GPU)."""
    def bench(fn, warmup_ms=None, rep_ms=None):
        fn()
        t0 = time.perf_counter()
        for _ in range(2):
            fn()
        return (time.perf_counter() - t0) * 500.0
    monkeypatch.setattr(kb, "bench", bench)


def tiny_batch(duplicates=False):
    """Three graphs (5, 3, 4 nodes); node 4 of graph 0 and node 0 of graph 2 have no
    in-neighbours; with ``duplicates``, one edge appears twice."""
    src = [0, 1, 2, 3, 1, 0, 5, 6, 7, 9, 10, 11]
    dst = [1, 2, 3, 0, 0, 2, 6, 7, 5, 10, 11, 10]
    if duplicates:
        src, dst = src + [2], dst + [3]
    batch = torch.tensor([0] * 5 + [1] * 3 + [2] * 4)
    return torch.tensor([src, dst]), batch


def reference_gt(ei, n, q, k, v):
    lay = GraphLayout.from_edge_index(ei, (n, n))
    return reference.dot_attention(lay.rowptr.long(), lay.col.long(), q, k, v,
                                   1 / math.sqrt(q.size(-1)))[0]


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("H,C", [(1, 8), (2, 4)])
def test_dense_sdpa_matches_reference(kb, duplicates, H, C):
    torch.manual_seed(0)
    ei, batch = tiny_batch(duplicates)
    n = batch.numel()
    leaves = [torch.randn(n, H, C, requires_grad=True) for _ in range(3)]
    dense = kb.DenseBatch(ei, batch, n)
    assert dense.mask.dtype == (torch.float32 if duplicates else torch.bool)
    out = kb.dense_sdpa(dense, *leaves)
    gout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, gout)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = reference_gt(ei, n, *ref_leaves)
    ref_grads = torch.autograd.grad(ref, ref_leaves, gout.double())
    assert rel_err(out, ref) < 1e-5
    for a, b in zip(grads, ref_grads):
        assert rel_err(a, b) < 1e-4
    # nodes without in-neighbours output exactly 0 and nothing is NaN
    assert out[4].abs().max() == 0 and out[8].abs().max() == 0
    assert out[0].abs().max() > 0
    assert kb.check_dense(dense, *leaves, ref.float(), torch.float32) is None
    assert "rel. err" in kb.check_dense(dense, *leaves, ref.float() + 1.0, torch.float32)


def _failing_at_compile(fn, dynamic):
    raise RuntimeError("backend exploded\nsecond line of the trace")


def _failing_at_first_call(fn, dynamic):
    assert dynamic is False

    def run():
        raise AssertionError("misaligned address in generated kernel\nmore")
    return run


@pytest.mark.parametrize("fake,stage", [(_failing_at_compile, "compile"),
                                        (_failing_at_first_call, "fwd")])
def test_compile_failure_recorded(kb, fake, stage):
    x = torch.randn(4, requires_grad=True)
    calls = []
    fns = {"pyg": lambda: (calls.append(1), x * 2)[1]}
    res = kb.measure_methods(fns, ["pyg-compile"], torch.ones(4), (x,), "batch",
                             compile_fn=fake)
    r = res["pyg-compile"]
    assert r["status"] == "compile_failed" and r["stage"] == stage
    assert r["error"].splitlines() == [r["error"]] and "second line" not in r["error"]
    assert r["error"].startswith(("RuntimeError: backend", "AssertionError: misaligned"))
    assert "fwd_ms" not in r and x.grad is None and not calls
    assert kb._cell(r, "fwd_ms") == "cfail"


def test_case_json_fields(kb, wall_clock):
    """A GT case on CPU with every method (the compiler: dynamo's eager backend):
    the statuses, compile times and ratios the tables and plots read."""
    ei, batch = tiny_batch()
    n = batch.numel()

    def eager_backend(fn, dynamic):
        return torch.compile(fn, dynamic=dynamic, backend="eager")
    methods = ["fused-auto", "pyg", "pyg-compile", "sparse", "dense-sdpa"]
    row = kb.run_case("tiny", ei, n, "batch", 2, 4, torch.float32, methods, batch=batch,
                      compile_fn=eager_backend)
    row = json.loads(json.dumps(row))
    m = row["methods"]
    assert set(m) == set(methods)
    for name, r in m.items():
        if name == "sparse":      # torch.sparse on CPU may lack an op: recorded, not raised
            assert r["status"] in ("ok", "error")
            continue
        assert r["status"] == "ok", (name, r)
        assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0
    assert m["pyg-compile"]["compile_fwd_s"] > 0 and m["pyg-compile"]["compile_fwd_bwd_s"] > 0
    assert "compile_fwd_s" not in m["pyg"] and m["pyg-compile"]["graph_breaks"] >= 0
    text = kb.fmt_table([row])
    head = text.splitlines()[0]
    for col in ("cpyg", "×cpyg", "sdpa", "×sdpa", "cmp s"):
        assert col in head
    assert kb.failures([row]) == "" or "sparse" in kb.failures([row])

    # a failed compile and a dense mismatch show in the table and the failure list
    row["methods"]["pyg-compile"] = {"status": "compile_failed", "error": "E: boom",
                                     "stage": "fwd"}
    row["methods"]["dense-sdpa"] = {"status": "mismatch", "error": "dense SDPA rel. err 1e-2"}
    line = kb.fmt_table([row]).splitlines()[1]
    assert line.count("cfail") == 3 and line.count("mism") == 2   # fwd, f+b, compile s
    assert "pyg-compile: compile_failed: E: boom" in kb.failures([row])


def test_table_ratios(kb):
    m = {"fused-auto": {"status": "ok", "fwd_ms": 1.0, "fwd_bwd_ms": 2.0},
         "pyg": {"status": "ok", "fwd_ms": 20.0, "fwd_bwd_ms": 50.0},
         "pyg-compile": {"status": "ok", "fwd_ms": 3.0, "fwd_bwd_ms": 9.0,
                         "compile_fwd_s": 4.0, "compile_fwd_bwd_s": 6.5},
         "dense-sdpa": {"status": "ok", "fwd_ms": 4.5, "fwd_bwd_ms": 8.0}}
    row = {"graph": "PATTERN", "H": 1, "C": 128, "dtype": "float32", "auto": "smmf",
           "methods": m}
    line = kb.fmt_table([row]).splitlines()[1]
    for want in ("20.0", "3.000", "3.0", "4.500", "4.5", "25.0", "9.000", "4.5", "4.0", "10.5"):
        assert want in line, want
    walks = {"fused-row": {"status": "ok", "fwd_ms": 0.777}, "fused-own": {"status": "ok"}}
    srow = dict(row, model="gat", methods={**m, **walks})
    sline = kb.fmt_score_table([srow]).splitlines()[1]
    assert "3.000" in sline and "10.5" in sline and "0.777" in sline
    assert "-" in sline.split("0.777")[1].split()[0]  # fused-own without a time


def test_quick_cases(kb):
    ei, batch = tiny_batch()
    graphs = {"PATTERN": (ei, 12, "batch", batch), "power-law-5K": (ei, 12, "super", None)}
    cases = kb.build_cases(graphs, ["gt"], quick=True)
    assert [(c[0], c[1][0], c[1][4], c[1][5], c[1][6]) for c in cases] == [
        ("gt", "PATTERN", 1, 128, torch.float32), ("gt", "power-law-5K", 1, 128, torch.float32)]
    # the compiled method last: a fault in generated code would end the CUDA context
    assert cases[0][1][7] == ["fused-auto", "pyg", "dense-sdpa", "pyg-compile"]
    assert cases[1][1][7] == ["fused-auto", "pyg", "pyg-compile"]
    assert [kb.case_key(c[0], c[1]) for c in cases] == ["gt/PATTERN/1x128/float32",
                                                       "gt/power-law-5K/1x128/float32"]
    assert kb.cuda_context_ok("cpu")
    assert all("pyg-compile" in c[1][7] for c in cases)
    # --quick --models keeps every named family, one 1x128 fp32 case per graph each
    quick_all = kb.build_cases(graphs, ["gt", "gat", "agnn"], quick=True)
    assert [(c[0], c[1][0]) for c in quick_all] == [
        (m, g) for g in ("PATTERN", "power-law-5K") for m in ("gt", "gat", "agnn")]
    full = kb.build_cases(graphs, ["gt", "gat", "agnn"], compiled=False)
    assert len(full) == 2 * (3 + 2 + 1)
    assert not any("pyg-compile" in c[1][7] for c in full if c[0] == "gt")
    assert all(c[2]["compiled"] is False for c in full if c[0] != "gt")


def test_matmul_precision_recorded(kb):
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        info = kb.set_matmul_precision(False)
        assert info["allow_tf32"] is False and info["cudnn_allow_tf32"] is False
        assert info["float32_matmul_precision"] == "highest"
        assert kb.set_matmul_precision(True)["allow_tf32"] is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


# ------------------------------------------------------------------ GPU
@pytest.mark.cuda
def test_case_cuda_compiled_and_dense(kb):
    """A 32-graph PATTERN batch on the GPU with inductor: every method runs, the
    dense SDPA passes its check against the fused op, compile times are recorded
    and the compiled PyG computes the same output as eager PyG."""
    from benchmarks import generators
    ei, batch, _, _ = generators.sbm_batch("pattern", 32, seed=0)
    ei, batch = ei.cuda(), batch.cuda()
    kb.set_matmul_precision(False)
    methods = ["fused-auto", "pyg", "dense-sdpa", "pyg-compile"]
    row = kb.run_case("PATTERN", ei, batch.numel(), "batch", 4, 32, torch.float32, methods,
                      batch=batch)
    m = row["methods"]
    for name in methods:
        assert m[name]["status"] == "ok", (name, m[name])
        assert m[name]["fwd_ms"] > 0 and m[name]["fwd_bwd_ms"] > 0
    assert m["pyg-compile"]["compile_fwd_s"] > 0 and m["pyg-compile"]["compile_fwd_bwd_s"] > 0
    text = kb.fmt_table([row])
    assert "cfail" not in text and "mism" not in text

    torch.manual_seed(0)
    n = batch.numel()
    q, k, v = (torch.randn(n, 4, 32, device="cuda") for _ in range(3))
    dense = kb.DenseBatch(ei, batch, n)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    from pyg_dfgnn import ops
    assert kb.check_dense(dense, q, k, v, ops.gt_attention(lay, q, k, v), torch.float32) is None
    conv = kb.native_conv(4, 32, "cuda")
    fn = lambda: conv.propagate(ei, query=q, key=k, value=v, edge_attr=None)  # noqa: E731
    torch._dynamo.reset()
    assert rel_err(torch.compile(fn, dynamic=False)(), fn()) < 1e-5


def test_phases_time_every_compile_after_the_eager_methods(kb):
    ei, batch = tiny_batch()
    graphs = {"PATTERN": (ei, 12, "batch", batch), "power-law-5K": (ei, 12, "super", None)}
    cases = kb.build_cases(graphs, ["gt", "gat", "agnn"], quick=True)
    steps = kb.phases(cases)
    kinds = [p for p, *_ in steps]
    assert kinds == ["eager"] * len(cases) + ["compiled"] * len(cases)
    for phase, model, args, kw in steps:
        if model == "gt":
            methods = args[7]
            assert (set(methods) <= set(kb.COMPILED)) == (phase == "compiled"), methods
            assert not (phase == "eager" and set(methods) & set(kb.COMPILED))
        elif phase == "eager":
            assert kw["compiled"] is False
        else:
            assert kw["only"] == tuple(kb.COMPILED)
    # the same cases, keyed alike, in both phases
    keys = [kb.case_key(m, a) for _, m, a, _ in steps]
    assert keys[:len(cases)] == keys[len(cases):]
    assert kb.phases(kb.build_cases(graphs, ["gt", "gat"], quick=True, fused_only=True)) == [
        ("eager", m, a, dict(kw, compiled=False) if m != "gt" else kw)
        for m, a, kw in kb.build_cases(graphs, ["gt", "gat"], quick=True, fused_only=True)]


def test_quick_run_on_the_cpu(kb, tmp_path, monkeypatch):
    """``--quick --device cpu``: the reference path, timed by the wall clock, without
    compiled PyG, written as on a GPU (a check of the script)."""
    ei, batch = tiny_batch()
    monkeypatch.setattr(kb, "load_graphs",
                        lambda quick, data=None: {"tiny": (ei, batch.numel(), "batch", batch)})
    for name in ("DEV", "REPEATS"):  # main sets them; restored afterwards
        monkeypatch.setattr(kb, name, getattr(kb, name))
    out = tmp_path / "k.json"
    assert kb.main(["--quick", "--device", "cpu", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["info"]["gpu"] == "cpu" and doc["info"]["copy_GBps"] is None
    (row,) = doc["rows"]
    assert set(row["methods"]) == {"fused-auto", "pyg", "dense-sdpa"}
    assert all(m["status"] == "ok" and m["fwd_bwd_ms"] > 0 for m in row["methods"].values())
