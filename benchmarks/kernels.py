"""Kernel benchmark: fused attention vs native PyG vs an unfused torch.sparse pipeline.

For each graph (paper Table 1 shapes) and configuration, times forward and
forward + backward (CUDA events, warm-up, median; ``triton.testing.do_bench``)
of

* ``fused-auto`` / ``fused-smmf`` / ``fused-pmf``: :func:`pyg_dfgnn.ops.gt_attention`,
* ``pyg``: native ``TransformerConv.propagate`` on the same q / k / v,
* ``pyg-compile``: the same message passing under ``torch.compile`` (``dynamic=False``,
  default mode, compiled afresh per graph and configuration): the first call's wall
  time is reported as ``compile_fwd_s`` / ``compile_fwd_bwd_s`` and left out of the
  timings; a compiler failure is recorded as ``status: "compile_failed"`` with the
  exception's first line,
* ``dense-sdpa`` (batch graphs, GT): ``to_dense_batch`` of q / k / v +
  ``scaled_dot_product_attention`` with the adjacency mask (:func:`dense_sdpa`),
  checked against ``fused-auto`` once before timing,
* ``flex-seq`` / ``flex-padded`` (batch graphs, GT): FlexAttention, compiled
  (``torch.compile(flex_attention)``), with a block mask from the graph: the whole
  batch as one sequence, or padded per graph (:mod:`benchmarks.flex`); the mask
  build (``mask_build_first_s``: the first, compiling ``create_block_mask``;
  ``mask_build_ms``: a rebuild) and the first calls (``compile_fwd_s`` /
  ``compile_fwd_bwd_s``) are reported apart from the timings, and the output and
  gradients are checked against the float64 reference before timing
  (:func:`run_flex`),
* ``sparse``: ``torch.sparse.sampled_addmm`` -> sparse softmax -> ``spmm`` per head
  (the role DGL-sparse plays in the paper),

plus peak memory of forward + backward and the achieved bandwidth of the
forward against the compulsory bytes (q, k, v, out, rowptr, col, each once).
On the host-bound full graphs (Cora, CiteSeer, PubMed), fused-auto and PyG are
timed in interleaved rounds and report their medians (``HOST_BOUND_ROUNDS``).
Writes JSON (``--out``) and prints a table. A method that fails (out of memory,
unsupported op) is recorded with its error, not silently dropped.

GAT (additive) and AGNN (cosine) rows compare the fused op with native
``GATConv`` (``edge_updater`` + ``propagate``) and ``AGNNConv.propagate`` on the same
per-node tensors (``score_rows`` in the JSON); GAT rows also time ``fused-row`` and
``fused-own``, the additive score's SMMF forward on the shared row walk and on its
own walk (the plan's ``row_walk``, forced).

Every method runs under the same matmul precision (``--tf32``, off by default:
``torch.backends.cuda.matmul.allow_tf32`` is set explicitly and recorded in ``info``).
Each method's result has ``status``: ``ok``, ``error``, ``compile_failed``,
``mismatch`` (dense SDPA disagreeing with the fused result, FlexAttention with the
float64 reference), ``not_applicable`` (FlexAttention on a graph with duplicate
edges, which a mask cannot count) or ``unsupported`` (FlexAttention on a torch or
device without it).

Usage, from the repository root (needs a CUDA GPU and the compiled extension):
``python -m benchmarks.kernels [--quick] [--models gt,gat,agnn] [--out results.json]``
(``--quick``: two small graphs, GT 1x128 fp32 only, fused-auto / PyG / compiled PyG /
dense SDPA, short repeats; under a minute). ``--quick`` without a GPU (or with
``--device cpu``) runs those cases on the CPU without compiled PyG: the fused op's
reference path, timed by the wall clock, a check of the script whose times say
nothing about the kernels. ``--methods a,b`` runs only the named
methods, wherever the full grid has them (``--quick --methods`` on the quick graphs).

The JSON is rewritten after every case and ``--resume`` runs only the cases it lacks
(keyed model / graph / HxC / dtype; for GT, the methods a case's row lacks), so a
long run can be split, e.g. ``--models gt`` then ``--models gat,agnn --resume`` with
the same ``--out``: compiling PyG afresh for every case makes the full grid take many
minutes (``compile_*_s`` in the JSON).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time

import torch

from benchmarks import flex, generators
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

#: The device measured on; ``--device`` sets it.
DEV = "cuda"
#: fwd+bwd steps accumulate into the leaves' ``.grad`` instead of starting from
#: ``None`` (as after ``optimizer.zero_grad()``); ``--accumulate-grads``.
ACCUMULATE_GRADS = False


#: ``(warmup_ms, rep_ms)`` of :func:`bench`; ``--quick`` shortens them.
REPEATS = (25, 150)
QUICK_REPEATS = (10, 40)
#: Timed calls of :func:`bench` on the CPU, after one untimed call.
CPU_REPEATS = 2
#: Methods timed under ``torch.compile`` (their eager function, compiled per case).
COMPILED = {"pyg-compile": "pyg"}
#: Methods that compile, timed after every eager one (:func:`phases`).
LATE = (*COMPILED, *flex.FORMS)


def bench(fn, warmup_ms=None, rep_ms=None):
    """Median ms of ``fn()``: ``triton.testing.do_bench`` on a GPU, a few wall-clock
    calls on the CPU (the reference path: the script's check, not a measurement)."""
    if torch.device(DEV).type != "cuda":
        from benchmarks.profile_backward import wall_timer
        return wall_timer(fn, CPU_REPEATS)
    import triton.testing
    return triton.testing.do_bench(fn, warmup=warmup_ms or REPEATS[0], rep=rep_ms or REPEATS[1],
                                   return_mode="median")


def set_matmul_precision(allow_tf32: bool) -> dict:
    """Sets TF32 for fp32 matmuls / convolutions explicitly (the same for every method)
    and returns the settings for the JSON's ``info``."""
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    return {"allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def copy_bandwidth(numel: int = 2**28):
    """GB/s (read + write) of a device-to-device copy of ``numel`` fp32 elements."""
    x = torch.empty(numel, dtype=torch.float32, device=DEV).normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), rep_ms=200)
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e9  # GB/s, read + write


def autograd_floor():
    """Eager forward + backward of a trivial op: the per-step cost of autograd itself."""
    x = torch.randn(1024, device=DEV, requires_grad=True)
    g = torch.randn(1024, device=DEV)
    return bench(lambda: torch.autograd.backward(x * 2.0, g))


#: The generated super-node graphs, ``name -> (nodes, avg in-degree, max in-degree, seed)``
#: of :func:`benchmarks.generators.power_law_graph`: the paper's Reddit, Protein and
#: ppa average and largest in-degrees, with fewer nodes so that native PyG fits.
POWER_LAW = {"Reddit-like": (30_000, 492, 21_657, 0), "Protein-like": (20_000, 597, 7_750, 1),
             "ppa-like": (100_000, 74, 3_241, 2)}


def load_graphs(quick: bool, data=None):
    """name -> (edge_index on GPU, num_nodes, kind, batch vector on GPU or None).
    ``quick``: a 128-graph PATTERN batch and a 5K-node power-law graph (generated,
    no data files). ``data``: the data folder of the real graphs
    (:func:`benchmarks.datasets.data_dir`)."""
    out = {}
    nb = 128 if quick else 1024
    for kind, name in (("pattern", "PATTERN"), ("cluster", "CLUSTER"))[:1 if quick else 2]:
        ei, batch, _, _ = generators.sbm_batch(kind, nb, seed=0)
        out[name] = (ei, batch.numel(), "batch", batch)
    if quick:
        out["power-law-5K"] = (generators.power_law_graph(5_000, 100, 2_000, 0, DEV), 5_000,
                               "super", None)
        return _to_dev(out)
    from benchmarks import datasets
    for kind, name in (("mnist", "MNIST"), ("cifar10", "CIFAR10"), ("coco_sp", "COCO-SP")):
        ei, batch = generators.knn_batch(kind, nb, seed=0)
        out[name] = (ei, batch.numel(), "batch", batch)
    for name in ("Cora", "CiteSeer"):
        d = datasets.planetoid(name, root=data)
        out[name] = (d.edge_index, d.num_nodes, "full", None)
    d = datasets.pubmed_graph(root=data)
    out["PubMed"] = (d.edge_index, d.num_nodes, "full", None)
    d = datasets.musae_github(data)
    out["GitHub"] = (d.edge_index, d.num_nodes, "super", None)
    for name, (n, avg, mx, seed) in POWER_LAW.items():
        out[name] = (generators.power_law_graph(n, avg, mx, seed, DEV), n, "super", None)
    return _to_dev(out)


def _to_dev(graphs):
    return {k: (ei.to(DEV), n, kind, None if b is None else b.to(DEV))
            for k, (ei, n, kind, b) in graphs.items()}


def native_conv(H, C, device=DEV):
    from torch_geometric.nn import TransformerConv
    return TransformerConv(H * C, C, heads=H).to(device)


def sparse_pipeline(lay, q, k, v, scale):
    """Unfused: SDDMM (sampled_addmm) -> sparse softmax -> SpMM, one head at a time."""
    vals = torch.ones(lay.num_edges, device=q.device, dtype=q.dtype)
    A = torch.sparse_csr_tensor(lay.rowptr.long(), lay.col.long(), vals, (lay.num_dst, lay.num_src))
    outs = []
    for h in range(q.size(1)):
        S = torch.sparse.sampled_addmm(A, q[:, h], k[:, h].t(), beta=0.0, alpha=scale)
        P = torch.sparse.softmax(S.to_sparse_coo(), dim=1)
        outs.append(torch.sparse.mm(P, v[:, h]))
    return torch.stack(outs, 1)


class DenseBatch:
    r"""What :func:`dense_sdpa` needs of a batch of graphs, built once per graph like
    the fused layout: ``B`` graphs padded to ``max_nodes``, ``mask`` ``[B, 1, M, M]``
    (query = destination, key = source; boolean, or the log of the edge multiplicity
    when the graph has duplicate edges so that each copy counts, as in message
    passing), ``index`` ``[N]`` of each node in the padded ``[B * M]`` rows and
    ``has_in`` ``[N, 1, 1]`` (1 where the node has an in-neighbour).

    A row without any allowed key (a node without in-neighbours, or padding) makes
    SDPA's softmax 0 / 0 = NaN, and a NaN in the forward spreads through its backward
    to every key. Such rows attend to themselves instead (a finite dummy row) and
    their output is multiplied by ``has_in = 0``, so they output 0 and pass no
    gradient, as in message passing."""

    def __init__(self, edge_index, batch, num_nodes):
        from torch_geometric.utils import to_dense_adj, to_dense_batch
        self.batch = batch
        self.B = int(batch.max()) + 1
        self.max_nodes = int(torch.bincount(batch, minlength=self.B).max())
        adj = to_dense_adj(edge_index, batch, max_num_nodes=self.max_nodes, batch_size=self.B)
        adj = adj.transpose(1, 2)  # [B, dst, src]
        has_in = adj.sum(-1) > 0
        dummy = torch.eye(self.max_nodes, dtype=torch.bool, device=adj.device) & ~has_in[..., None]
        if bool((adj > 1).any()):
            self.mask = adj.log().masked_fill(dummy, 0.0)[:, None]
        else:
            self.mask = ((adj > 0) | dummy)[:, None]
        _, real = to_dense_batch(batch.new_zeros(num_nodes, 1), batch, batch_size=self.B,
                                 max_num_nodes=self.max_nodes)
        self.index = real.view(-1).nonzero().view(-1)
        self.has_in = has_in.view(-1)[self.index].view(-1, 1, 1)


def dense_sdpa(dense: DenseBatch, q, k, v):
    r"""``[N, H, C]`` attention of each node over its in-neighbours (the function of
    :func:`pyg_dfgnn.ops.gt_attention`, scale ``1 / sqrt(C)``) computed densely per
    graph: ``to_dense_batch`` of q / k / v, ``scaled_dot_product_attention`` with the
    adjacency mask, back to ``[N, H, C]``; nodes without in-neighbours output 0."""
    import torch.nn.functional as F
    from torch_geometric.utils import to_dense_batch
    N, H, C = q.shape
    B, M = dense.B, dense.max_nodes

    def pad(x):
        xd, _ = to_dense_batch(x.reshape(x.size(0), H * C), dense.batch, batch_size=B,
                               max_num_nodes=M)
        return xd.view(B, M, H, C).transpose(1, 2)
    mask = dense.mask if dense.mask.dtype == torch.bool else dense.mask.to(q.dtype)
    o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=mask)
    return o.transpose(1, 2).reshape(B * M, H, C)[dense.index] * dense.has_in


def check_dense(dense, q, k, v, want, dtype):
    """``None``, or why ``dense_sdpa`` disagrees with ``want`` (rel. err < 1e-4 fp32,
    < 1e-2 half precision)."""
    with torch.no_grad():
        got = dense_sdpa(dense, q, k, v)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    if not torch.isfinite(got).all():
        return "dense SDPA output is not finite"
    want = want.detach().double()
    err = float((got.double() - want).norm() / want.norm())
    return None if err < tol else f"dense SDPA rel. err {err:.2e} vs fused >= {tol:g}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _free_cache(leaves):
    """Returns cached blocks after a failure; a no-op where the failure left the CUDA
    context unusable (the caller records that, see :func:`cuda_context_ok`)."""
    if leaves and leaves[0].is_cuda:
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def _sync(leaves):
    if leaves and leaves[0].is_cuda:
        torch.cuda.synchronize()


def compile_case(fn, leaves, g, with_backward=True, compile_fn=None):
    r"""``fn`` under ``compile_fn`` (``torch.compile``, ``dynamic=False``), after a
    reset of the compiler's caches (the message-passing code objects are shared by
    every case, and past the recompile limit dynamo would silently run them eagerly).
    Returns ``(compiled, result)``: the compiled function and the first call's wall
    time, ``compile_fwd_s`` (under ``no_grad``) and ``compile_fwd_bwd_s`` (forward +
    backward: the training graphs); or ``(None, {"status": "compile_failed", "error":
    first line, "stage": ...})`` when compiling or the first call raised."""
    compile_fn = compile_fn or torch.compile
    res, stage = {}, "compile"
    breaks = _graph_breaks()
    try:
        torch._dynamo.reset()
        cf = compile_fn(fn, dynamic=False)
        stage = "first call"
        first_calls(cf, leaves, g, with_backward, res)
    except Exception as e:  # noqa: BLE001  (a compiler failure is a result, not a crash)
        _free_cache(leaves)
        return None, {"status": "compile_failed", "error": _first_line(e),
                      "stage": stage if stage == "compile" else _first_call_stage(res)}
    finally:
        for t in leaves:
            t.grad = None
    res["graph_breaks"] = _graph_breaks() - breaks
    return cf, res


def first_calls(fn, leaves, g, with_backward, res):
    """Wall time of ``fn``'s first forward (under ``no_grad``) and, with
    ``with_backward``, first forward + backward of ``g``, into ``res`` as
    ``compile_fwd_s`` / ``compile_fwd_bwd_s``: a compiled function compiles there."""
    for stage in ("fwd", "fwd_bwd") if with_backward else ("fwd",):
        _sync(leaves)
        t0 = time.perf_counter()
        if stage == "fwd":
            with torch.no_grad():
                fn()
        else:
            torch.autograd.backward(fn(), g)
        _sync(leaves)
        res[f"compile_{stage}_s"] = time.perf_counter() - t0


def _first_call_stage(res):
    """The stage of :func:`first_calls` that raised, from what it recorded."""
    return "fwd_bwd" if "compile_fwd_s" in res else "fwd"


def cuda_context_ok(device) -> bool:
    """Whether the CUDA context still works: a faulting kernel (a misaligned address
    in generated code, say) leaves it unusable for the rest of the process."""
    if torch.device(device).type != "cuda":
        return True
    try:
        torch.ones(1, device=device).add_(1).item()
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def phases(cases):
    """``[(phase, model, args, kwargs)]``: every case without its compiled methods
    (:data:`LATE`: compiled PyG, FlexAttention) first, then those alone. Timed after a
    compile, the host-bound fused backward of GAT and AGNN ran 2-3x slower than timed
    before one (the compiler's worker processes share the host), so no compile
    precedes an eager measurement."""
    eager, compiled = [], []
    for model, args, kw in cases:
        if model == "gt":
            methods = args[7]
            eager.append(("eager", model, args[:7] + ([m for m in methods if m not in LATE],)
                          + args[8:], kw))
            if any(m in LATE for m in methods):
                compiled.append(("compiled", model, args[:7]
                                 + ([m for m in methods if m in LATE],) + args[8:], kw))
        else:
            eager.append(("eager", model, args, dict(kw, compiled=False)))
            only = tuple(m for m in COMPILED if m in (kw.get("only") or COMPILED))
            if kw.get("compiled", True) and not kw.get("fused_only", False) and only:
                compiled.append(("compiled", model, args, dict(kw, only=only)))
    return eager + compiled


def case_key(model, args) -> str:
    """``model/graph/HxC/dtype``: what identifies a case across resumed runs."""
    name, H, C, dtype = args[0], args[4], args[5], args[6]
    return f"{model}/{name}/{H}x{C}/{str(dtype).split('.')[-1]}"


def pending(by_key, phase, model, args):
    """What a step of :func:`phases` still has to run, given the rows by
    :func:`case_key`: ``args`` with only the methods the case's row lacks (GT; all of
    them without a row), ``args`` (GAT / AGNN without a row, or a compiled phase
    without a compiled method in it) or ``None`` (done)."""
    row = by_key.get(case_key(model, args))
    if row is None:
        return args
    if model == "gt":
        rest = [m for m in args[7] if m not in row["methods"]]
        return args[:7] + (rest,) + args[8:] if rest else None
    return None if phase == "eager" or any(m in row["methods"] for m in COMPILED) else args


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters
    return sum(counters["graph_break"].values())


#: Graphs of kind "full" (Cora, CiteSeer, PubMed) are host-bound: a call's time is
#: mostly host time, and a host's speed can drift by 2x or more within seconds
#: (docs/design.md, "Host path"), so one do_bench per method made the fused / PyG
#: ratio a matter of which phase each landed in. There, fused-auto and PyG are
#: timed in this many interleaved rounds (fused, PyG, fused, PyG, ...) and each
#: reports its median; the rounds are kept in the JSON (``*_rounds``). Nine: with
#: five, the median fwd+bwd ratio of the same code moved between 5.8x and 9.2x
#: across runs (single rounds 4.7-18x).
HOST_BOUND_ROUNDS = 9


def measure_methods(fns, methods, g, leaves, kind, with_backward=True, compile_fn=None):
    """:func:`measure` of each method, in order (a ``COMPILED`` method compiles its
    eager function first: :func:`compile_case`); for host-bound graphs (``kind``
    ``"full"``) fused-auto, pyg and pyg-compile then get ``HOST_BOUND_ROUNDS - 1``
    more interleaved rounds and report the median of all of theirs."""
    fns, res = dict(fns), {}
    for m in methods:
        if m in COMPILED:
            fns[m], res[m] = compile_case(fns[COMPILED[m]], leaves, g, with_backward, compile_fn)
            if fns[m] is None:
                continue
            res[m].update(measure(fns[m], g, leaves, with_backward))
            res[m]["status"] = "error" if "error" in res[m] else "ok"
        else:
            res[m] = measure(fns[m], g, leaves, with_backward)
    inter = [m for m in ("fused-auto", "pyg", "pyg-compile") if m in res and "error" not in res[m]]
    if kind != "full" or len(inter) < 2 or not cuda_context_ok(leaves[0].device):
        return res
    keys = [k for k in ("fwd_ms", "fwd_bwd_ms") if k in res[inter[0]]]
    rounds = {m: {k: [res[m][k]] for k in keys} for m in inter}
    for _ in range(HOST_BOUND_ROUNDS - 1):
        for m in inter:
            r = measure(fns[m], g, leaves, with_backward, peak=False)
            for k in keys:
                rounds[m][k].append(r.get(k, float("nan")))
    for m in inter:
        for k in keys:
            res[m][k + "_rounds"] = rounds[m][k]
            res[m][k] = statistics.median(rounds[m][k])
    return res


def measure(f, g, leaves, with_backward=True, peak=True, timer=None):
    """``fwd_ms`` of ``f()`` under ``no_grad``; with ``with_backward``, also the peak
    extra memory (``peak_MB``) and time (``fwd_bwd_ms``) of ``f()`` then backward of
    ``g``, each step starting with the ``leaves``' gradients set to ``None`` as a
    training step after ``optimizer.zero_grad()`` does (accumulated over the timed
    steps, each step also paid one addition kernel per leaf). ``timer`` (a function
    of a callable, returning ms) replaces :func:`bench`. A method that fails is
    recorded as ``error``, not dropped."""
    r = {}
    timer = timer or bench
    try:
        with torch.no_grad():
            r["fwd_ms"] = timer(f)
        if with_backward:
            def fb():
                if not ACCUMULATE_GRADS:
                    for t in leaves:
                        t.grad = None
                torch.autograd.backward(f(), g)
            if peak and leaves[0].is_cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fb()
                torch.cuda.synchronize()
                r["peak_MB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            r["fwd_bwd_ms"] = timer(fb)
    except Exception as e:  # noqa: BLE001  (recorded: a benchmark that could not run says so)
        r["error"] = _first_line(e)
        _free_cache(leaves)
    for t in leaves:
        t.grad = None
    r["status"] = "error" if "error" in r else "ok"
    return r


def run_case(name, ei, n, kind, H, C, dtype, methods, with_backward=True, batch=None,
             compile_fn=None):
    """GT (dot-product) attention on one graph and configuration; ``batch`` (the
    batch vector of a batch of graphs) enables ``dense-sdpa`` and the FlexAttention
    forms (:func:`run_flex`)."""
    torch.manual_seed(0)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    lay.colptr  # noqa: B018  (CSC built before timing, as a cached layout would be)
    q = torch.randn(n, H, C, device=ei.device, dtype=dtype, requires_grad=True)
    k = torch.randn(n, H, C, device=ei.device, dtype=dtype, requires_grad=True)
    v = torch.randn(n, H, C, device=ei.device, dtype=dtype, requires_grad=True)
    g = torch.randn(n, H, C, device=ei.device, dtype=dtype)
    scale = 1 / math.sqrt(C)
    conv = native_conv(H, C, ei.device).to(dtype)
    esize = torch.empty((), dtype=dtype).element_size()
    compulsory = 4 * n * H * C * esize + (lay.num_dst + 1 + lay.num_edges) * 4
    fns = {
        "fused-auto": lambda: ops.gt_attention(lay, q, k, v),
        "fused-smmf": lambda: ops.gt_attention(lay, q, k, v, strategy="smmf"),
        "fused-pmf": lambda: ops.gt_attention(lay, q, k, v, strategy="pmf"),
        "pyg": lambda: conv.propagate(ei, query=q, key=k, value=v, edge_attr=None),
        "sparse": lambda: sparse_pipeline(lay, q, k, v, scale),
    }
    res = {"graph": name, "kind": kind, "nodes": n, "edges": lay.num_edges,
           "max_in_degree": lay.max_in_degree, "H": H, "C": C, "dtype": str(dtype).split(".")[-1],
           "auto": ops.choose_strategy(lay.max_in_degree, "dot", esize), "methods": {}}
    failed = {}
    if "dense-sdpa" in methods:
        methods = [m for m in methods if m != "dense-sdpa"]
        if batch is not None:
            try:
                dense = DenseBatch(ei, batch, n)
                with torch.no_grad():
                    why = check_dense(dense, q, k, v, ops.gt_attention(lay, q, k, v), dtype)
            except Exception as e:  # noqa: BLE001  (recorded, e.g. out of memory)
                dense, why = None, _first_line(e)
            if why is None:
                fns["dense-sdpa"] = lambda: dense_sdpa(dense, q, k, v)
                methods.append("dense-sdpa")
            else:
                failed["dense-sdpa"] = {"status": "mismatch" if dense else "error", "error": why}
    forms = [m for m in methods if m in flex.FORMS]
    methods = [m for m in methods if m not in flex.FORMS]
    res["methods"] = measure_methods(fns, methods, g, (q, k, v), kind, with_backward, compile_fn)
    res["methods"].update(failed)
    if forms:
        res["methods"].update(run_flex(forms, ei, batch, lay, q, k, v, g, with_backward,
                                       compile_fn))
    for r in res["methods"].values():
        if "fwd_ms" in r:
            r["fwd_GBps"] = compulsory / (r["fwd_ms"] * 1e-3) / 1e9
    return res


def flex_reference(lay, q, k, v, g, with_backward):
    """``(out, grads or None)``: float64 GT attention
    (:func:`pyg_dfgnn.ops.reference.dot_attention`, scale ``1 / sqrt(C)``) of ``q`` /
    ``k`` / ``v`` promoted to float64, and the gradients of ``<out, g>``: what
    :func:`flex.check` compares with."""
    from pyg_dfgnn.ops import reference
    leaves = [t.detach().double().requires_grad_(with_backward) for t in (q, k, v)]
    with torch.enable_grad():
        out = reference.dot_attention(lay.rowptr.long(), lay.col.long(), *leaves,
                                      1 / math.sqrt(q.size(-1)))[0]
        grads = torch.autograd.grad(out, leaves, g.double()) if with_backward else None
    return out.detach(), grads


def run_flex(forms, ei, batch, lay, q, k, v, g, with_backward=True, compile_fn=None):
    r"""The FlexAttention forms (:mod:`benchmarks.flex`) of GT attention on a batch
    graph, each ``{"status": ...}`` plus, in order of the steps:

    * ``mask_build_first_s``: wall time of the first build of the lookup tables and
      the block mask, ``create_block_mask`` compiled by ``compile_fn`` (its compile
      included); ``mask_build_ms``: the median rebuild (:func:`bench`), what a new
      batch of graphs costs each step;
    * ``compile_fwd_s`` / ``compile_fwd_bwd_s``: the first forward (under
      ``no_grad``) and forward + backward of ``compile_fn(flex_attention)``
      (``dynamic=False``, after a reset of the compiler's caches), ``graph_breaks``;
    * ``check_rel_err``: output and gradients against float64 (:func:`flex.check`);
    * the timings of :func:`measure` of the compiled call.

    ``not_applicable`` (duplicate edges, edges between graphs: :func:`flex.not_applicable`)
    and ``unsupported`` (:func:`flex.unsupported`) skip every step; a failing build
    is an ``error`` with ``stage: "mask"``, a failing first call ``compile_failed``,
    a failing check ``mismatch``: each recorded, never raised."""
    why, status = flex.not_applicable(ei, batch), "not_applicable"
    if why is None:
        why, status = flex.unsupported(q.device, q.dtype, with_backward), "unsupported"
    if why is not None:
        return {form: {"status": status, "error": why} for form in forms}
    flex_attention, create_block_mask = flex.api()
    compile_fn = compile_fn or torch.compile
    leaves, ref, out = (q, k, v), None, {}
    for form in forms:
        r, stage = out.setdefault(form, {}), "mask"
        try:
            torch._dynamo.reset()
            build = compile_fn(create_block_mask, dynamic=False)

            def make():
                fg = flex.FlexGraph(ei, batch)
                return fg, fg.block_mask(form, build)
            _sync(leaves)
            t0 = time.perf_counter()
            fg, bm = make()
            _sync(leaves)
            r["mask_build_first_s"] = time.perf_counter() - t0
            r["mask_build_ms"] = bench(make)
            breaks = _graph_breaks()
            fx = compile_fn(flex_attention, dynamic=False)

            def fn():
                return flex.attention(form, fg, bm, q, k, v, fx)
            stage = "first call"
            first_calls(fn, leaves, g, with_backward, r)
            r["graph_breaks"] = _graph_breaks() - breaks
            stage = "check"
            if ref is None:
                ref = flex_reference(lay, q, k, v, g, with_backward)
            why, r["check_rel_err"] = flex.check(fn, leaves, g, *ref, q.dtype, fg.empty)
        except Exception as e:  # noqa: BLE001  (a result, not a crash)
            _free_cache(leaves)
            failed = stage in ("mask", "check")
            r.update(status="error" if failed else "compile_failed", error=_first_line(e),
                     stage=stage if failed else _first_call_stage(r))
            continue
        finally:
            for t in leaves:
                t.grad = None
        if why is not None:
            r.update(status="mismatch", error=why)
            continue
        r.update(measure(fn, g, leaves, with_backward))
    return out


def chunk_sweep(graphs, chunks, dtype=torch.float32):
    """Fused fwd / fwd+bwd time per work-item chunk (tunes work_items.chunk_for)."""
    rows = []
    for name, (ei, n, kind, _) in graphs.items():
        for chunk in chunks + [None]:
            with ops.plan.override(chunk=chunk):
                r = run_case(name, ei, n, kind, 1, 128, dtype, ["fused-auto"])
            m = r["methods"]["fused-auto"]
            lay_chunk = chunk if chunk else "auto"
            rows.append({"graph": name, "chunk": lay_chunk, "dtype": r["dtype"], **m})
            print(f"{name:<13} chunk={str(lay_chunk):>5}  fwd {m.get('fwd_ms', float('nan')):.3f} ms"
                  f"  fwd+bwd {m.get('fwd_bwd_ms', float('nan')):.3f} ms")
    return rows


#: The GAT rows' methods of the additive score's two SMMF forwards.
GAT_WALKS = ("fused-row", "fused-own")


def _with_row_walk(row_walk: bool, fn):
    """``fn`` run under ``plan.override(row_walk=row_walk)``: the additive score's SMMF
    forward on the shared row walk or on its own."""
    def run():
        with ops.plan.override(row_walk=row_walk):
            return fn()
    return run


def run_score_case(model, name, ei, n, kind, H, C, dtype, fused_only=False, compiled=True,
                   compile_fn=None, only=None):
    """GAT (additive) or AGNN (cosine): fused op vs native PyG message passing on the
    same per-node tensors; same fields as :func:`run_case`."""
    import torch.nn.functional as F
    from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv
    torch.manual_seed(0)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x = torch.randn(n, H, C, device=ei.device, dtype=dtype, requires_grad=True)
    g = torch.randn(n, H, C, device=ei.device, dtype=dtype)
    if model == "gat":
        a_src = torch.randn(n, H, device=ei.device, dtype=dtype, requires_grad=True)
        a_dst = torch.randn(n, H, device=ei.device, dtype=dtype, requires_grad=True)
        conv = GATConv(H * C, C, heads=H, add_self_loops=False).to(ei.device).to(dtype)
        fns = {"fused-auto": lambda: ops.gat_attention(lay, a_src, a_dst, x),
               "fused-smmf": lambda: ops.gat_attention(lay, a_src, a_dst, x, strategy="smmf"),
               "fused-pmf": lambda: ops.gat_attention(lay, a_src, a_dst, x, strategy="pmf"),
               # SMMF on each of the score's two walks (the plan's row_walk, forced)
               "fused-row": _with_row_walk(True, lambda: ops.gat_attention(lay, a_src, a_dst, x)),
               "fused-own": _with_row_walk(False, lambda: ops.gat_attention(lay, a_src, a_dst, x)),
               "pyg": lambda: conv.propagate(ei, x=(x, x), alpha=conv.edge_updater(
                   ei, alpha=(a_src, a_dst), edge_attr=None, size=None), size=None)}
        leaves = (a_src, a_dst, x)
    elif model == "gatv2":
        x_r = torch.randn(n, H, C, device=ei.device, dtype=dtype, requires_grad=True)
        conv = GATv2Conv(H * C, C, heads=H, add_self_loops=False).to(ei.device).to(dtype)
        att = conv.att.view(H, C)

        def pyg():
            alpha = conv.edge_updater(ei, x=(x, x_r), edge_attr=None)
            return conv.propagate(ei, x=(x, x_r), alpha=alpha)

        fns = {"fused-auto": lambda: ops.gatv2_attention(lay, x, x_r, att),
               "fused-smmf": lambda: ops.gatv2_attention(lay, x, x_r, att, strategy="smmf"),
               "fused-pmf": lambda: ops.gatv2_attention(lay, x, x_r, att, strategy="pmf"),
               "pyg": pyg}
        leaves = (x, x_r, conv.att)
    else:
        beta = torch.ones((), device=ei.device, dtype=dtype, requires_grad=True)
        conv = AGNNConv(add_self_loops=False).to(ei.device).to(dtype)
        x2 = x.view(n, H * C)
        fns = {"fused-auto": lambda: ops.agnn_attention(lay, x2, None, beta),
               "pyg": lambda: conv.propagate(ei, x=x2, x_norm=F.normalize(x2, p=2.0, dim=-1))}
        g = g.view(n, H * C)
        leaves = (x, beta)
    res = {"graph": name, "kind": kind, "model": model, "nodes": n, "edges": lay.num_edges,
           "max_in_degree": lay.max_in_degree, "H": H, "C": C, "dtype": str(dtype).split(".")[-1],
           "auto": ops.choose_strategy(
               lay.max_in_degree, {"gat": "additive", "gatv2": "gatv2"}.get(model, "cosine"),
               x.element_size()),
           "methods": {}}
    methods = [m for m in fns if not (fused_only and m == "pyg")]
    if compiled and not fused_only:
        methods.append("pyg-compile")
    if only is not None:
        methods = [m for m in methods if m in only]
    res["methods"] = measure_methods(fns, methods, g, leaves, kind, compile_fn=compile_fn)
    return res


def _cell(d, key):
    """A method's ``key`` in ms, or why it is missing (``cfail``: compile failed)."""
    v = d.get(key)
    if isinstance(v, float):
        return f"{v:.3f}"
    return {"compile_failed": "cfail", "mismatch": "mism", "not_applicable": "n/a",
            "unsupported": "unsup"}.get(d.get("status"), "err" if "error" in d else "-")


def _ratio(m, other, key, ref="fused-auto"):
    """``other``'s time / ``ref``'s time for ``key`` (how many times faster fused is)."""
    a, b = m.get(ref, {}).get(key), m.get(other, {}).get(key)
    return f"{b / a:.1f}" if a and b else "-"


def _compile_s(m):
    d = m.get("pyg-compile", {})
    v = [d[k] for k in ("compile_fwd_s", "compile_fwd_bwd_s") if k in d]
    return f"{sum(v):.1f}" if v else _cell(d, "compile_fwd_s")


def fmt_score_table(rows):
    lines = [f"{'model':<6}{'graph':<13}{'H×C':>7}{'auto':>6} | {'fused fwd':>9}{'smmf':>8}"
             f"{'pmf':>8}{'row':>8}{'own':>8}{'pyg fwd':>9}{'×pyg':>7}{'cpyg':>8}{'×cpyg':>7} | {'fused f+b':>9}"
             f"{'pyg f+b':>9}{'×pyg':>7}{'cpyg':>8}{'×cpyg':>7} | {'cmp s':>6}{'memMB f/p':>14}"]
    for r in rows:
        m = r["methods"]
        f, p = m.get("fused-auto", {}), m.get("pyg", {})
        sm, pm, cp = m.get("fused-smmf", {}), m.get("fused-pmf", {}), m.get("pyg-compile", {})
        rw, ow = m.get("fused-row", {}), m.get("fused-own", {})
        lines.append(f"{r['model']:<6}{r['graph']:<13}{str(r['H']) + '×' + str(r['C']):>7}"
                     f"{r['auto']:>6} | {_cell(f, 'fwd_ms'):>9}{_cell(sm, 'fwd_ms'):>8}"
                     f"{_cell(pm, 'fwd_ms'):>8}{_cell(rw, 'fwd_ms'):>8}{_cell(ow, 'fwd_ms'):>8}"
                     f"{_cell(p, 'fwd_ms'):>9}{_ratio(m, 'pyg', 'fwd_ms'):>7}"
                     f"{_cell(cp, 'fwd_ms'):>8}{_ratio(m, 'pyg-compile', 'fwd_ms'):>7} | "
                     f"{_cell(f, 'fwd_bwd_ms'):>9}{_cell(p, 'fwd_bwd_ms'):>9}"
                     f"{_ratio(m, 'pyg', 'fwd_bwd_ms'):>7}{_cell(cp, 'fwd_bwd_ms'):>8}"
                     f"{_ratio(m, 'pyg-compile', 'fwd_bwd_ms'):>7} | {_compile_s(m):>6}"
                     f"{f.get('peak_MB', float('nan')):>8.0f}/{p.get('peak_MB', float('nan')):<5.0f}")
    return "\n".join(lines)


def fmt_table(rows):
    """The GT table: per graph and configuration, fused (auto, smmf, pmf), eager PyG,
    compiled PyG (``cpyg``), dense SDPA and torch.sparse times in ms, and the ratios
    of eager / compiled PyG and dense SDPA to fused-auto (``×``), for the forward and
    forward + backward; the compile time (s, forward + training graphs) of PyG."""
    lines = [f"{'graph':<13}{'H×C':>7}{'dtype':>9}{'auto':>6} | {'fused fwd':>9}{'smmf':>8}"
             f"{'pmf':>8}{'pyg':>9}{'sparse':>9}{'×pyg':>7}{'cpyg':>8}{'×cpyg':>7}{'sdpa':>8}"
             f"{'×sdpa':>7} | {'fused f+b':>9}{'pyg f+b':>9}{'×pyg':>7}{'cpyg':>8}{'×cpyg':>7}"
             f"{'sdpa':>8}{'×sdpa':>7} | {'cmp s':>6}{'GB/s':>6}{'memMB f/p':>14}"]
    for r in rows:
        m = r["methods"]

        def g(k, key):
            return _cell(m.get(k, {}), key)
        mem = (f"{m.get('fused-auto', {}).get('peak_MB', float('nan')):.0f}/"
               f"{m.get('pyg', {}).get('peak_MB', float('nan')):.0f}")
        bw = m.get("fused-auto", {}).get("fwd_GBps")
        side = {key: (f"{g('pyg-compile', key):>8}{_ratio(m, 'pyg-compile', key):>7}"
                      f"{g('dense-sdpa', key):>8}{_ratio(m, 'dense-sdpa', key):>7}")
                for key in ("fwd_ms", "fwd_bwd_ms")}
        lines.append(f"{r['graph']:<13}{str(r['H']) + '×' + str(r['C']):>7}{r['dtype']:>9}"
                     f"{r['auto']:>6} | {g('fused-auto', 'fwd_ms'):>9}{g('fused-smmf', 'fwd_ms'):>8}"
                     f"{g('fused-pmf', 'fwd_ms'):>8}{g('pyg', 'fwd_ms'):>9}{g('sparse', 'fwd_ms'):>9}"
                     f"{_ratio(m, 'pyg', 'fwd_ms'):>7}{side['fwd_ms']} | "
                     f"{g('fused-auto', 'fwd_bwd_ms'):>9}{g('pyg', 'fwd_bwd_ms'):>9}"
                     f"{_ratio(m, 'pyg', 'fwd_bwd_ms'):>7}{side['fwd_bwd_ms']} | "
                     f"{_compile_s(m):>6}{(f'{bw:.0f}' if bw else '-'):>6}{mem:>14}")
    return "\n".join(lines)


def fmt_flex_table(rows):
    """The FlexAttention table (rows that have a ``flex-*`` method): per graph and
    configuration, fused-auto and each form in ms with its ratio to fused-auto
    (``×``), forward and forward + backward; the mask build (s, the first one with
    its compile / ms, a rebuild) and the first calls (s, forward + training graphs)."""
    forms = [(m, m.split("-")[1]) for m in flex.FORMS]
    head = f"{'graph':<13}{'H×C':>7}{'dtype':>9} |"
    for key in ("fwd", "f+b"):
        head += f"{'fused ' + key:>10}" + "".join(f"{s:>8}{'×':>6}" for _, s in forms) + " |"
    head += "".join(f"{'mask ' + s + ' s/ms':>18}{'cmp s':>7}" for _, s in forms)
    lines = [head]
    for r in rows:
        m = r["methods"]
        if not any(f in m for f, _ in forms):
            continue
        line = f"{r['graph']:<13}{str(r['H']) + '×' + str(r['C']):>7}{r['dtype']:>9} |"
        for key in ("fwd_ms", "fwd_bwd_ms"):
            line += f"{_cell(m.get('fused-auto', {}), key):>10}" + "".join(
                f"{_cell(m.get(f, {}), key):>8}{_ratio(m, f, key):>6}" for f, _ in forms) + " |"
        for f, _ in forms:
            d = m.get(f, {})
            first, again = d.get("mask_build_first_s"), d.get("mask_build_ms")
            mask = f"{first:.1f}/{again:.1f}" if first is not None and again else _cell(d, "x")
            cmp = [d[k] for k in ("compile_fwd_s", "compile_fwd_bwd_s") if k in d]
            line += f"{mask:>18}{(f'{sum(cmp):.1f}' if cmp else _cell(d, 'x')):>7}"
        lines.append(line)
    return "\n".join(lines) if len(lines) > 1 else ""


def failures(rows):
    """One line per method that did not run: ``graph H×C dtype model method: status: error``."""
    out = []
    for r in rows:
        for meth, d in r["methods"].items():
            if d.get("status", "ok") != "ok":
                out.append(f"{r['graph']} {r['H']}×{r['C']} {r['dtype']} {r.get('model', 'gt')} "
                           f"{meth}: {d['status']}: {d.get('error', '')}")
    return "\n".join(out)


def gt_methods(batch_graph, quick=False, fused_only=False, sparse=True, compiled=True,
               dense=True, flex_forms=True):
    """``[(H, C, dtype, methods)]``: the GT configurations of a graph and their methods."""
    base = ["fused-auto", "fused-smmf", "fused-pmf"]
    native = [] if fused_only else ["pyg"]
    # compiled last: a fault in generated code ends the CUDA context for what follows
    cc = ["pyg-compile"] if compiled and not fused_only else []
    dn = ["dense-sdpa"] if dense and not fused_only and batch_graph else []
    fx = list(flex.FORMS) if flex_forms and not fused_only and not quick and batch_graph else []
    sp = ["sparse"] if sparse and not fused_only else []
    out = [(1, 128, torch.float32,
            (["fused-auto"] if quick else base) + native + ([] if quick else sp) + dn + cc + fx)]
    if not quick:
        out += [(4, 32, torch.float32, base + native + dn + cc + fx),
                (1, 128, torch.bfloat16, ["fused-auto"] + native + dn + cc + fx)]
    return out


def build_cases(graphs, models, quick=False, fused_only=False, sparse=True, compiled=True,
                dense=True, flex_forms=True, methods=None):
    """``[(model, run_case / run_score_case positional args, keyword args)]`` in run order.
    ``methods``: only these, in the configurations where the full grid has them (GT),
    or as ``only`` (GAT, AGNN)."""
    cases = []
    for name, (ei, n, kind, batch) in graphs.items():
        kw = {"batch": batch}
        if "gt" in models:
            configs = gt_methods(batch is not None, quick, fused_only, sparse, compiled, dense,
                                 flex_forms)
            if methods is not None:
                every = {cfg[:3]: cfg[3] for cfg in gt_methods(batch is not None)}
                configs = [(*cfg[:3], [m for m in every[cfg[:3]] if m in methods])
                           for cfg in configs]
            cases += [("gt", (name, ei, n, kind, H, C, dtype, ms), kw)
                      for H, C, dtype, ms in configs if ms]
        skw = {"fused_only": fused_only, "compiled": compiled}
        if methods is not None:
            skw["only"] = tuple(methods)
        if "gat" in models:
            cases.append(("gat", (name, ei, n, kind, 1, 128, torch.float32), skw))
            if not quick:
                cases.append(("gat", (name, ei, n, kind, 4, 32, torch.float32), skw))
        if "gatv2" in models:
            cases.append(("gatv2", (name, ei, n, kind, 1, 128, torch.float32), skw))
            if not quick:
                cases.append(("gatv2", (name, ei, n, kind, 4, 32, torch.float32), skw))
        if "agnn" in models:
            cases.append(("agnn", (name, ei, n, kind, 1, 128, torch.float32), skw))
    return cases


def main(argv=None):
    global REPEATS
    from benchmarks import cli, datasets
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels",
                                 description=__doc__.splitlines()[0] + " Needs a CUDA GPU "
                                 "and the compiled extension; without them, --quick runs the "
                                 "reference path on the CPU (without compiled PyG), a check "
                                 "of the script.", formatter_class=cli.HelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a 128-graph PATTERN batch and a 5K-node power-law graph, GT 1x128 fp32 "
                         "only (unless --models), short repeats: under a minute")
    ap.add_argument("--out", default="kernels.json", help="JSON results, written as it goes")
    cli.add_device_argument(ap)
    datasets.add_data_argument(ap, "Planetoid/, MUSAE/GitHub/")
    ap.add_argument("--graphs", default="",
                    help="comma-separated subset of graph names (default: every graph)")
    ap.add_argument("--no-sparse", action="store_true", help="skip the torch.sparse pipeline")
    ap.add_argument("--no-compile", action="store_true",
                    help="skip PyG + torch.compile (always skipped on the CPU)")
    ap.add_argument("--no-dense", action="store_true", help="skip dense masked SDPA")
    ap.add_argument("--no-flex", action="store_true",
                    help="skip FlexAttention (flex-seq, flex-padded)")
    ap.add_argument("--methods", default=None,
                    help="comma-separated methods to run, wherever the full grid has them "
                         "(e.g. fused-auto,flex-seq,flex-padded; default: the grid's own)")
    ap.add_argument("--tf32", action="store_true",
                    help="allow TF32 in fp32 matmuls (all methods alike; default: off)")
    ap.add_argument("--chunk-sweep", default="",
                    help="comma-separated chunks: only sweep them (default: no sweep)")
    ap.add_argument("--sweep-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="dtype of the chunk sweep")
    ap.add_argument("--accumulate-grads", action="store_true",
                    help="fwd+bwd steps accumulate into .grad (one addition kernel per leaf "
                         "and step) instead of starting from None as a training step does")
    ap.add_argument("--models", default=None,
                    help="score functions to run: gt, gat, agnn (default: all; --quick: gt)")
    ap.add_argument("--fused-only", action="store_true",
                    help="time only the fused methods (A/B runs of kernel versions)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the cases already in --out and run the others (the run "
                         "restarts itself this way when a case leaves the CUDA context unusable)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    methods = args.methods.split(",") if args.methods else None
    known = {m for cfg in gt_methods(True) for m in cfg[3]} | set(GAT_WALKS)
    if methods is not None and not set(methods) <= known:
        ap.error(f"--methods: unknown {sorted(set(methods) - known)}; known: {sorted(known)}")
    global ACCUMULATE_GRADS, DEV
    ACCUMULATE_GRADS = args.accumulate_grads
    DEV = cli.pick_device("benchmarks.kernels", args.device, args.quick)
    cuda = DEV.type == "cuda"
    # Inductor compiles C++ for minutes per case on a CPU, to time the reference path.
    args.no_compile = args.no_compile or not cuda
    cli.out_file(args.out)
    REPEATS = QUICK_REPEATS if args.quick else REPEATS
    info = {"gpu": torch.cuda.get_device_name(DEV) if cuda else "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
            "quick": args.quick, "repeats_ms": list(REPEATS),
            **set_matmul_precision(args.tf32),
            "compile": None if args.no_compile else {"dynamic": False, "mode": "default",
                                                     "per": "graph and configuration"},
            "copy_GBps": copy_bandwidth() if cuda else None,
            "autograd_floor_ms": autograd_floor(),
            "command": "python -m benchmarks.kernels " + shlex.join(argv)}
    print(f"# {info}")
    with datasets.exit_on_missing_data():
        graphs = load_graphs(args.quick, args.data)
    if args.graphs:
        graphs = {k: v for k, v in graphs.items() if k in args.graphs.split(",")}
    if args.chunk_sweep:
        rows = chunk_sweep(graphs, [int(c) for c in args.chunk_sweep.split(",")],
                           getattr(torch, args.sweep_dtype))
        with open(args.out, "w") as f:
            json.dump({"info": info, "chunk_sweep": rows}, f, indent=1)
        return 0
    models = (args.models or ("gt" if args.quick else "gt,gat,agnn")).split(",")
    cases = build_cases(graphs, models, args.quick, args.fused_only, not args.no_sparse,
                        not args.no_compile, not args.no_dense, not args.no_flex, methods)
    rows, score_rows = [], []
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            done = json.load(f)
        rows, score_rows = done.get("rows", []), done.get("score_rows", [])
        prev = done.get("info", {})
        info["resumed_from"] = prev.get("resumed_from", prev)  # the first run's info
    by_key = {r["key"]: r for r in rows + score_rows if "key" in r}

    steps = [(p, m, pending(by_key, p, m, c), kw) for p, m, c, kw in phases(cases)]
    steps = [st for st in steps if st[2] is not None]
    for phase, model, c, kw in cli.progress(steps, desc="kernels"):
        res = run_case(*c, **kw) if model == "gt" else run_score_case(model, *c, **kw)
        key = case_key(model, c)
        if key in by_key:  # joins the case's row (the first phase's, or a resumed one)
            row = by_key[key]
            row["methods"].update(res["methods"])
        else:
            row = dict(res, key=key)
            (rows if model == "gt" else score_rows).append(row)
            by_key[key] = row
        lost = not cuda_context_ok(DEV)
        if lost:
            row["cuda_context_lost"] = True
        with open(args.out, "w") as f:
            json.dump({"info": info, "rows": rows, "score_rows": score_rows}, f, indent=1)
        if lost:
            print(f"# {row['key']} left the CUDA context unusable (recorded); restarting with "
                  "--resume for the remaining cases", file=sys.stderr)
            sys.stderr.flush()
            sys.stdout.flush()
            rest = [a for a in argv if a != "--resume"] + ["--resume"]
            os.execv(sys.executable, [sys.executable, "-m", "benchmarks.kernels", *rest])
    if score_rows:
        print(fmt_score_table(score_rows))
    print(fmt_table(rows))
    ftable = fmt_flex_table(rows)
    if ftable:
        print(ftable)
    bad = failures(rows + score_rows)
    if bad:
        print("not measured:\n" + bad)
    return 0


if __name__ == "__main__":
    sys.exit(main())
