"""The FlexAttention yardstick of benchmarks/kernels.py (benchmarks/flex.py) on CPU:
the masks it builds against the adjacency, the padding, the float64 check (torch's
eager FlexAttention for the forward, a differentiable stand-in for the gradients:
FlexAttention has no backward on the CPU), the statuses and tables of its rows, the
case grid, --methods and --resume; on a GPU, the compiled forms end to end."""
from __future__ import annotations

import functools
import json
import math
import warnings

import pytest
import torch

from conftest import load_benchmark
from pyg_dfgnn.layout import GraphLayout
# the kernel benchmark's fixtures and graph: node 4 of graph 0 and node 0 of graph 2
# (node 8) have no in-edges; with ``duplicates``, one edge appears twice
from test_kernels_bench import kb, tiny_batch, wall_clock  # noqa: F401  (fixtures)

flex_api = pytest.importorskip("torch.nn.attention.flex_attention")


@pytest.fixture(scope="module")
def fx():
    return load_benchmark("flex")


def eager_backend(fn, dynamic):
    """``torch.compile`` with dynamo's eager backend: compiles nothing, runs on CPU."""
    return torch.compile(fn, dynamic=dynamic, backend="eager")


def generated(kind, num_graphs=6):
    from benchmarks import generators
    if kind in ("pattern", "cluster"):
        ei, batch, _, _ = generators.sbm_batch(kind, num_graphs, seed=0)
    else:
        ei, batch = generators.knn_batch(kind, num_graphs, seed=0)
    return ei, batch


def dense_adjacency(ei, n):
    a = torch.zeros(n, n, dtype=torch.bool)
    a[ei[1], ei[0]] = True     # [dst, src]
    return a


def reference(ei, n, q, k, v, g=None):
    """float64 GT attention (and gradients of ``<out, g>``) of the same inputs."""
    lay = GraphLayout.from_edge_index(ei, (n, n))
    from benchmarks import kernels
    return kernels.flex_reference(lay, q, k, v, g if g is not None else torch.zeros_like(q),
                                  g is not None)


def flex_standin(q, k, v, block_mask):
    """FlexAttention's function, differentiable on the CPU: the dense mask its
    ``mask_mod`` induces, softmax over allowed keys, a fully masked row 0."""
    mask = flex_api.create_mask(block_mask.mask_mod, q.size(0), 1, q.size(2), k.size(2),
                                device=q.device)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    p = torch.softmax(s.masked_fill(~mask, -math.inf), -1)
    return torch.where(mask.any(-1, keepdim=True), p, 0.0) @ v


# ------------------------------------------------------------------ masks and padding
@pytest.mark.parametrize("kind", ["tiny", "pattern", "cifar10"])
def test_mask_mods_induce_the_adjacency(fx, kind):
    """Each form's ``mask_mod`` allows exactly the edges, and its block mask keeps
    exactly the blocks that hold an edge (16 x 16 blocks, so several per graph)."""
    ei, batch = tiny_batch() if kind == "tiny" else generated(kind, 8)
    n = batch.numel()
    fg = fx.FlexGraph(ei, batch)
    assert kind == "pattern" or bool(fg.empty.any())   # rows without in-edges included
    want = dense_adjacency(ei, n)
    seq = flex_api.create_mask(fg.seq_mask_mod(), None, None, n, n, device="cpu")[0, 0]
    assert torch.equal(seq, want)
    padded = flex_api.create_mask(fg.padded_mask_mod(), fg.B, None, fg.M, fg.M, device="cpu")
    from torch_geometric.utils import to_dense_adj
    assert torch.equal(padded[:, 0], to_dense_adj(ei, batch).transpose(1, 2) > 0)
    build = functools.partial(flex_api.create_block_mask, BLOCK_SIZE=16)
    for form, dense, size in (("flex-seq", want[None], n), ("flex-padded", padded[:, 0], fg.M)):
        bm = fg.block_mask(form, build)
        nb = -(-size // 16)
        blocks = torch.zeros(dense.size(0), nb * 16, nb * 16, dtype=torch.bool)
        blocks[:, :size, :size] = dense
        blocks = blocks.view(-1, nb, 16, nb, 16).any(4).any(2)
        assert torch.equal(bm.to_dense()[:, 0].bool(), blocks), form
    assert torch.equal(fg.empty, torch.bincount(ei[1], minlength=n) == 0)


def test_pad_unpad(fx):
    ei, batch = tiny_batch()
    fg = fx.FlexGraph(ei, batch)
    assert (fg.B, fg.M) == (3, 5)
    x = torch.randn(12, 2, 4)
    xd = fg.pad(x)
    assert xd.shape == (3, 2, 5, 4)
    assert torch.equal(xd[1, :, :3], x[5:8].transpose(0, 1))
    assert xd[1, :, 3:].abs().max() == 0 and xd[2, :, 4:].abs().max() == 0
    assert torch.equal(fg.unpad(xd), x)


def test_not_applicable(fx):
    ei, batch = tiny_batch()
    assert fx.not_applicable(ei, batch) is None
    assert "1 duplicate edges" in fx.not_applicable(*tiny_batch(duplicates=True))
    assert "between graphs" in fx.not_applicable(torch.cat([ei, torch.tensor([[0], [6]])], 1),
                                                 batch)
    assert "not sorted" in fx.not_applicable(ei, batch.flip(0))
    assert fx.not_applicable(ei, None) == "not a batch of graphs"
    # the benchmark's batch graphs have neither duplicates nor edges between graphs
    for kind in ("pattern", "cluster", "mnist", "cifar10", "coco_sp"):
        assert fx.not_applicable(*generated(kind, 16)) is None, kind


def test_unsupported_here(fx):
    assert fx.unsupported("cpu", torch.float32, with_backward=False) is None
    why = fx.unsupported("cpu", torch.float32, with_backward=True)
    assert why is None or why.startswith("NotImplementedError: ")   # torch 2.14: no CPU backward


# ------------------------------------------------------------------ float64 check
@pytest.mark.parametrize("form", ["flex-seq", "flex-padded"])
@pytest.mark.parametrize("kind,H,C", [("tiny", 2, 16), ("cifar10", 1, 32), ("pattern", 4, 16)])
def test_flex_forward_cpu_matches_float64(fx, form, kind, H, C):
    """torch's own (eager) FlexAttention through each form: the float64 reference's
    output, rows without in-edges exactly 0, and the check agrees."""
    ei, batch = tiny_batch() if kind == "tiny" else generated(kind, 8 if kind == "cifar10" else 4)
    n = batch.numel()
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, H, C) for _ in range(3))
    fg = fx.FlexGraph(ei, batch)
    bm = fg.block_mask(form)
    ref, _ = reference(ei, n, q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # eager FlexAttention: "unfused implementation"

        def run():
            return fx.attention(form, fg, bm, q, k, v, flex_api.flex_attention)
        out = run()
        assert out.shape == (n, H, C)
        assert fx.rel_err(out, ref) < 1e-5
        assert kind == "pattern" or out[fg.empty].abs().max() == 0
        why, errs = fx.check(run, (q, k, v), None, ref, None, torch.float32, fg.empty)
    assert why is None and set(errs) == {"out"} and errs["out"] < 1e-5


@pytest.mark.parametrize("form", ["flex-seq", "flex-padded"])
def test_check_gradients(fx, form):
    """The check's gradient half, with a differentiable stand-in for FlexAttention
    through the form's padding and mask: passes on the right function, names the
    first failure on wrong ones."""
    ei, batch = tiny_batch()
    n = batch.numel()
    torch.manual_seed(0)
    leaves = [torch.randn(n, 2, 8, requires_grad=True) for _ in range(3)]
    g = torch.randn(n, 2, 8)
    fg = fx.FlexGraph(ei, batch)
    bm = fg.block_mask(form)
    ref, ref_grads = reference(ei, n, *leaves, g)
    assert len(ref_grads) == 3 and ref.dtype == torch.float64

    def run(flex=flex_standin):
        return fx.attention(form, fg, bm, *leaves, flex)
    why, errs = fx.check(run, leaves, g, ref, ref_grads, torch.float32, fg.empty)
    assert why is None, (why, errs)
    assert set(errs) == {"out", "grad0", "grad1", "grad2"} and max(errs.values()) < 1e-5
    assert all(t.grad is None for t in leaves)

    def scaled(q, k, v, block_mask):      # a wrong scale: the output and gradients differ
        return flex_standin(2 * q, k, v, block_mask)
    why, errs = fx.check(lambda: run(scaled), leaves, g, ref, ref_grads, torch.float32,
                         fg.empty)
    assert why.startswith("out rel. err") and errs["grad0"] > 1e-4

    def nan_rows(q, k, v, block_mask):    # fully masked rows as 0 / 0
        out = flex_standin(q, k, v, block_mask)
        return torch.where(out == 0, math.nan, out)
    why, errs = fx.check(lambda: run(nan_rows), leaves, g, ref, ref_grads, torch.float32,
                         fg.empty)
    assert why == "out is not finite" and errs["out"] == math.inf

    def grads_only():                     # the output right, the gradients 0
        return ref.float() + 0 * sum(t.sum() for t in leaves)
    why, _ = fx.check(grads_only, leaves, g, ref, ref_grads, torch.float32, fg.empty)
    assert why.startswith("grad0 rel. err")

    def not_zero():                       # within tolerance, but an empty row not 0
        out = ref.float().clone()
        out[4] += 1e-7
        return out
    why, _ = fx.check(not_zero, leaves, g, ref, None, torch.float32, fg.empty)
    assert why == "rows without in-edges are not 0"
    assert fx.check(not_zero, leaves, g, ref, None, torch.bfloat16, fg.empty)[0] == why


# ------------------------------------------------------------------ rows and tables
def test_case_rows_cpu(kb, fx, wall_clock):
    """run_case with both forms on CPU: forward only runs through every step (eager
    FlexAttention under dynamo's eager backend); with the backward, the forms are
    ``unsupported`` here; on a graph with duplicate edges ``not_applicable``."""
    ei, batch = tiny_batch()
    methods = ["fused-auto", "flex-seq", "flex-padded"]
    row = kb.run_case("tiny", ei, 12, "batch", 2, 16, torch.float32, methods,
                      with_backward=False, batch=batch, compile_fn=eager_backend)
    row = json.loads(json.dumps(row))
    for form in fx.FORMS:
        r = row["methods"][form]
        assert r["status"] == "ok", r
        assert r["mask_build_first_s"] > 0 and r["mask_build_ms"] > 0
        assert r["compile_fwd_s"] > 0 and "compile_fwd_bwd_s" not in r
        assert r["graph_breaks"] == 0 and r["check_rel_err"]["out"] < 1e-5
        assert r["fwd_ms"] > 0 and r["fwd_GBps"] > 0
    table = kb.fmt_flex_table([row])
    assert len(table.splitlines()) == 2 and "cfail" not in table
    assert kb.failures([row]) == ""

    with_bwd = kb.run_case("tiny", ei, 12, "batch", 2, 16, torch.float32, methods,
                           batch=batch, compile_fn=eager_backend)
    why = fx.unsupported("cpu", torch.float32, True)
    for form in fx.FORMS:
        r = with_bwd["methods"][form]
        if why is not None:
            assert r == {"status": "unsupported", "error": why}
    if why is not None:
        assert kb.fmt_flex_table([with_bwd]).count("unsup") == 8   # fwd, f+b, mask, cmp
        assert "flex-seq: unsupported: NotImplementedError" in kb.failures([with_bwd])

    dei, dbatch = tiny_batch(duplicates=True)
    dup = kb.run_case("tiny", dei, 12, "batch", 1, 16, torch.float32, ["flex-seq", "flex-padded"],
                      batch=dbatch, compile_fn=eager_backend)
    for form in fx.FORMS:
        assert dup["methods"][form]["status"] == "not_applicable"
        assert "duplicate edges" in dup["methods"][form]["error"]
    assert kb._cell(dup["methods"]["flex-seq"], "fwd_ms") == "n/a"
    # a graph that is not a batch: not applicable either
    none = kb.run_flex(["flex-seq"], ei, None, None, *[torch.zeros(12, 1, 16)] * 4)
    assert none == {"flex-seq": {"status": "not_applicable", "error": "not a batch of graphs"}}


def test_inductor_cpu_forward(kb, fx, wall_clock):
    """The default compiler (inductor) on CPU, ``create_block_mask`` and
    ``flex_attention`` compiled as on the GPU: the one-sequence form passes the
    float64 check (one form keeps the CPU time down: about 30 s on two cores)."""
    ei, batch = tiny_batch()
    row = kb.run_case("tiny", ei, 12, "batch", 1, 16, torch.float32, ["flex-seq"],
                      with_backward=False, batch=batch)
    r = row["methods"]["flex-seq"]
    assert r["status"] == "ok", r
    assert r["check_rel_err"]["out"] < 1e-5 and r["fwd_ms"] > 0


def test_failures_recorded(kb, fx, wall_clock, monkeypatch):
    """A failing mask build, first call or check is a status in the row, not a raise;
    nothing is timed after it."""
    ei, batch = tiny_batch()
    flex_attention, create_block_mask = fx.api()

    def failing_at(target):
        def compile_fn(fn, dynamic):
            if fn is target:
                def boom(*a, **kw):
                    raise RuntimeError("generated kernel failed\nsecond line")
                return boom
            return eager_backend(fn, dynamic)
        return compile_fn

    def case(compile_fn):
        return kb.run_case("tiny", ei, 12, "batch", 1, 16, torch.float32, ["flex-seq"],
                           with_backward=False, batch=batch, compile_fn=compile_fn
                           )["methods"]["flex-seq"]
    r = case(failing_at(create_block_mask))
    assert (r["status"], r["stage"]) == ("error", "mask") and "fwd_ms" not in r
    assert r["error"] == "RuntimeError: generated kernel failed"
    r = case(failing_at(flex_attention))
    assert (r["status"], r["stage"]) == ("compile_failed", "fwd") and "fwd_ms" not in r
    assert "mask_build_ms" in r and kb._cell(r, "fwd_ms") == "cfail"

    real = fx.attention
    monkeypatch.setattr(fx, "attention", lambda *a: real(*a) * 1.01)
    r = case(eager_backend)
    assert r["status"] == "mismatch" and r["error"].startswith("out rel. err")
    assert 5e-3 < r["check_rel_err"]["out"] < 2e-2 and "fwd_ms" not in r
    assert kb._cell(r, "fwd_bwd_ms") == "mism"


def test_flex_table_ratios(kb):
    m = {"fused-auto": {"status": "ok", "fwd_ms": 0.5, "fwd_bwd_ms": 1.5},
         "flex-seq": {"status": "ok", "fwd_ms": 28.0, "fwd_bwd_ms": 45.0,
                      "mask_build_first_s": 3.25, "mask_build_ms": 40.0,
                      "compile_fwd_s": 10.0, "compile_fwd_bwd_s": 20.5},
         "flex-padded": {"status": "mismatch", "error": "out rel. err 1e-3"}}
    row = {"graph": "PATTERN", "H": 1, "C": 128, "dtype": "float32", "methods": m}
    head, line = kb.fmt_flex_table([row]).splitlines()
    for col in ("fused fwd", "seq", "padded", "fused f+b", "mask seq s/ms", "cmp s"):
        assert col in head
    for want in ("0.500", "28.000", "56.0", "1.500", "45.000", "30.0", "3.2/40.0", "30.5"):
        assert want in line, want
    assert line.count("mism") == 4                   # fwd, f+b, mask, compile
    assert kb.fmt_flex_table([dict(row, methods={"fused-auto": m["fused-auto"]})]) == ""
    assert "flex-padded: mismatch: out rel. err" in kb.failures([row])


def test_plot_series(kb):
    plot = load_benchmark("plot")
    m = {"fused-auto": {"status": "ok", "fwd_ms": 0.5, "fwd_bwd_ms": 1.5},
         "pyg": {"status": "ok", "fwd_ms": 10.0, "fwd_bwd_ms": 30.0},
         "flex-seq": {"status": "ok", "fwd_ms": 28.0, "fwd_bwd_ms": 45.0},
         "flex-padded": {"status": "not_applicable", "error": "duplicates"}}
    sp = plot.kernel_speedups({"rows": [{"graph": "PATTERN", "H": 1, "C": 128,
                                         "dtype": "float32", "methods": m}]})
    got = sp["gt"]["H=1×C=128 float32"]["PATTERN"]
    assert got["fwd_flex_seq"] == pytest.approx(56.0) and got["fwd_bwd_flex_seq"] == 30.0
    assert not any(k.endswith("_flex_padded") for k in got)
    assert {"_flex_seq", "_flex_padded"} <= set(plot.SERIES_STYLE)


# ------------------------------------------------------------------ grid, --methods, --resume
def test_cases_and_phases(kb, fx):
    ei, batch = tiny_batch()
    graphs = {"PATTERN": (ei, 12, "batch", batch), "power-law-5K": (ei, 12, "super", None)}
    full = kb.build_cases(graphs, ["gt"])
    for model, args, _ in full:
        methods = args[7]
        has = [m for m in methods if m in fx.FORMS]
        assert has == (list(fx.FORMS) if args[0] == "PATTERN" else []), args[:7]
        if has:   # compiled last, FlexAttention after compiled PyG
            assert methods[-3:] == ["pyg-compile", *fx.FORMS]
    assert not any(m in fx.FORMS for _, a, _ in kb.build_cases(graphs, ["gt"], quick=True)
                   for m in a[7])
    assert not any(m in fx.FORMS for _, a, _ in kb.build_cases(graphs, ["gt"], flex_forms=False)
                   for m in a[7])
    # every FlexAttention form runs in the compiled phase, after every eager method
    for phase, model, args, _ in kb.phases(full):
        assert (phase == "compiled") == any(m in kb.LATE for m in args[7]) or not args[7]
    # --methods: the named ones wherever the full grid has them, quick or not
    picked = kb.build_cases(graphs, ["gt", "gat"], methods=["fused-auto", "flex-seq"])
    gt = [(a[0], a[4], a[5], a[6], a[7]) for m, a, _ in picked if m == "gt"]
    assert gt == [("PATTERN", 1, 128, torch.float32, ["fused-auto", "flex-seq"]),
                  ("PATTERN", 4, 32, torch.float32, ["fused-auto", "flex-seq"]),
                  ("PATTERN", 1, 128, torch.bfloat16, ["fused-auto", "flex-seq"]),
                  ("power-law-5K", 1, 128, torch.float32, ["fused-auto"]),
                  ("power-law-5K", 4, 32, torch.float32, ["fused-auto"]),
                  ("power-law-5K", 1, 128, torch.bfloat16, ["fused-auto"])]
    quick = kb.build_cases(graphs, ["gt"], quick=True, methods=["flex-padded"])
    assert [(a[0], a[7]) for _, a, _ in quick] == [("PATTERN", ["flex-padded"])]
    steps = kb.phases(picked)
    assert all(kw["only"] == ("fused-auto", "flex-seq") for p, m, _, kw in steps if m == "gat")
    assert not any(p == "compiled" for p, m, _, _ in steps if m == "gat")   # no pyg-compile
    assert [a[7] for p, m, a, _ in steps if m == "gt" and p == "compiled"] == [["flex-seq"]] * 3


def test_resume_runs_what_a_row_lacks(kb):
    ei, batch = tiny_batch()
    args = ("PATTERN", ei, 12, "batch", 1, 128, torch.float32,
            ["fused-auto", "dense-sdpa"])
    key = kb.case_key("gt", args)
    by_key = {}
    assert kb.pending(by_key, "eager", "gt", args) is args
    by_key[key] = {"methods": {"fused-auto": {"status": "ok"}}}
    assert kb.pending(by_key, "eager", "gt", args)[7] == ["dense-sdpa"]
    late = args[:7] + (["pyg-compile", "flex-seq"],)
    by_key[key]["methods"]["flex-seq"] = {"status": "unsupported", "error": "no GPU"}
    assert kb.pending(by_key, "compiled", "gt", late)[7] == ["pyg-compile"]
    by_key[key]["methods"].update({"dense-sdpa": {}, "pyg-compile": {}})
    assert kb.pending(by_key, "eager", "gt", args) is None
    assert kb.pending(by_key, "compiled", "gt", late) is None
    sargs = ("PATTERN", ei, 12, "batch", 1, 128, torch.float32)
    assert kb.pending({}, "eager", "gat", sargs) is sargs
    skey = {kb.case_key("gat", sargs): {"methods": {"fused-auto": {}}}}
    assert kb.pending(skey, "eager", "gat", sargs) is None
    assert kb.pending(skey, "compiled", "gat", sargs) is sargs


# ------------------------------------------------------------------ GPU
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["pattern", "mnist"])
def test_flex_cuda(kb, fx, kind, dtype):
    """32-graph PATTERN (dense rows) and MNIST (nodes without in-edges) batches with
    inductor: both forms pass the float64 check in the forward and the backward, and
    are timed."""
    ei, batch = generated(kind, 32)
    ei, batch = ei.cuda(), batch.cuda()
    kb.set_matmul_precision(False)
    row = kb.run_case(kind, ei, batch.numel(), "batch", 1, 128, dtype,
                      ["fused-auto", *fx.FORMS], batch=batch)
    tol = fx.TOL[dtype]
    for form in fx.FORMS:
        r = row["methods"][form]
        assert r["status"] == "ok", (form, r)
        assert set(r["check_rel_err"]) == {"out", "grad0", "grad1", "grad2"}
        assert max(r["check_rel_err"].values()) < tol
        assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 and r["peak_MB"] > 0
        assert r["compile_fwd_s"] > 0 and r["compile_fwd_bwd_s"] > 0
        assert r["mask_build_first_s"] > 0 and r["mask_build_ms"] > 0
    assert kind != "mnist" or bool(fx.FlexGraph(ei, batch).empty.any())
    assert "mism" not in kb.fmt_flex_table([row]) and kb.failures([row]) == ""
