"""Kernel benchmark: fused attention vs native PyG vs an unfused torch.sparse pipeline.

For each graph (paper Table 1 shapes) and configuration, times forward and
forward + backward (CUDA events, warm-up, median; ``triton.testing.do_bench``)
of

* ``fused-auto`` / ``fused-smmf`` / ``fused-pmf``: :func:`pyg_dfgnn.ops.gt_attention`,
* ``pyg``: native ``TransformerConv.propagate`` on the same q / k / v,
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
per-node tensors (``score_rows`` in the JSON).

Usage, from the repository root (needs a CUDA GPU and the compiled extension):
``python -m benchmarks.kernels [--quick] [--models gt,gat,agnn] [--out results.json]``
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from benchmarks import generators
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

DEV = "cuda"
#: fwd+bwd steps accumulate into the leaves' ``.grad`` (the tables before v11) instead
#: of starting from ``None``; ``--accumulate-grads``.
ACCUMULATE_GRADS = False


def bench(fn, warmup_ms=25, rep_ms=150):
    import triton.testing
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def copy_bandwidth():
    x = torch.empty(2**28, dtype=torch.float32, device=DEV).normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), rep_ms=200)
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e9  # GB/s, read + write


def autograd_floor():
    """Eager forward + backward of a trivial op: the per-step cost of autograd itself."""
    x = torch.randn(1024, device=DEV, requires_grad=True)
    g = torch.randn(1024, device=DEV)
    return bench(lambda: torch.autograd.backward(x * 2.0, g))


def load_graphs(quick: bool):
    """name -> (edge_index on GPU, num_nodes, kind)."""
    from benchmarks import datasets
    out = {}
    nb = 128 if quick else 1024
    for kind, name in (("pattern", "PATTERN"), ("cluster", "CLUSTER")):
        ei, batch, _, _ = generators.sbm_batch(kind, nb, seed=0)
        out[name] = (ei, batch.numel(), "batch")
    for kind, name in (("mnist", "MNIST"), ("cifar10", "CIFAR10"), ("coco_sp", "COCO-SP")):
        ei, batch = generators.knn_batch(kind, nb, seed=0)
        out[name] = (ei, batch.numel(), "batch")
    for name in ("Cora", "CiteSeer"):
        d = datasets.planetoid(name)
        out[name] = (d.edge_index, d.num_nodes, "full")
    d = datasets.pubmed_graph()
    out["PubMed"] = (d.edge_index, d.num_nodes, "full")
    d = datasets.musae_github()
    out["GitHub"] = (d.edge_index, d.num_nodes, "super")
    if not quick:
        # Reddit-, Protein- and ppa-like: paper avg/max in-degree, fewer nodes to fit native PyG.
        out["Reddit-like"] = (generators.power_law_graph(30_000, 492, 21_657, 0, DEV), 30_000, "super")
        out["Protein-like"] = (generators.power_law_graph(20_000, 597, 7_750, 1, DEV), 20_000, "super")
        out["ppa-like"] = (generators.power_law_graph(100_000, 74, 3_241, 2, DEV), 100_000, "super")
    return {k: (v[0].to(DEV), v[1], v[2]) for k, v in out.items()}


def native_conv(H, C):
    from torch_geometric.nn import TransformerConv
    return TransformerConv(H * C, C, heads=H).to(DEV)


def sparse_pipeline(lay, q, k, v, scale):
    """Unfused: SDDMM (sampled_addmm) -> sparse softmax -> SpMM, one head at a time."""
    vals = torch.ones(lay.num_edges, device=DEV, dtype=q.dtype)
    A = torch.sparse_csr_tensor(lay.rowptr.long(), lay.col.long(), vals, (lay.num_dst, lay.num_src))
    outs = []
    for h in range(q.size(1)):
        S = torch.sparse.sampled_addmm(A, q[:, h], k[:, h].t(), beta=0.0, alpha=scale)
        P = torch.sparse.softmax(S.to_sparse_coo(), dim=1)
        outs.append(torch.sparse.mm(P, v[:, h]))
    return torch.stack(outs, 1)


#: Graphs of kind "full" (Cora, CiteSeer, PubMed) are host-bound: a call's time is
#: mostly host time, and a host's speed can drift by 2x or more within seconds
#: (docs/design.md, "Host path"), so one do_bench per method made the fused / PyG
#: ratio a matter of which phase each landed in. There, fused-auto and PyG are
#: timed in this many interleaved rounds (fused, PyG, fused, PyG, ...) and each
#: reports its median; the rounds are kept in the JSON (``*_rounds``). Nine: with
#: five, the median fwd+bwd ratio of the same code moved between 5.8x and 9.2x
#: across runs (single rounds 4.7-18x).
HOST_BOUND_ROUNDS = 9


def measure_methods(fns, methods, g, leaves, kind, with_backward=True):
    """:func:`measure` of each method, in order; for host-bound graphs (``kind``
    ``"full"``) fused-auto and pyg then get ``HOST_BOUND_ROUNDS - 1`` more
    interleaved rounds and report the median of all of theirs."""
    res = {m: measure(fns[m], g, leaves, with_backward) for m in methods}
    inter = [m for m in ("fused-auto", "pyg") if m in res and "error" not in res[m]]
    if kind != "full" or len(inter) < 2:
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


def measure(f, g, leaves, with_backward=True, peak=True):
    """``fwd_ms`` of ``f()`` under ``no_grad``; with ``with_backward``, also the peak
    extra memory (``peak_MB``) and time (``fwd_bwd_ms``) of ``f()`` then backward of
    ``g``, each step starting with the ``leaves``' gradients set to ``None`` as a
    training step after ``optimizer.zero_grad()`` does (accumulated over the timed
    steps, each step also paid one addition kernel per leaf). A method that fails is
    recorded as ``error``, not dropped."""
    r = {}
    try:
        with torch.no_grad():
            r["fwd_ms"] = bench(f)
        if with_backward:
            def fb():
                if not ACCUMULATE_GRADS:
                    for t in leaves:
                        t.grad = None
                torch.autograd.backward(f(), g)
            if peak:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fb()
                torch.cuda.synchronize()
                r["peak_MB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            r["fwd_bwd_ms"] = bench(fb)
    except Exception as e:  # noqa: BLE001  (recorded: a benchmark that could not run says so)
        r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        torch.cuda.empty_cache()
    for t in leaves:
        t.grad = None
    return r


def run_case(name, ei, n, kind, H, C, dtype, methods, with_backward=True):
    torch.manual_seed(0)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    lay.colptr  # noqa: B018  (CSC built before timing, as a cached layout would be)
    q = torch.randn(n, H, C, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(n, H, C, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(n, H, C, device=DEV, dtype=dtype, requires_grad=True)
    g = torch.randn(n, H, C, device=DEV, dtype=dtype)
    scale = 1 / math.sqrt(C)
    conv = native_conv(H, C).to(dtype)
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
    res["methods"] = measure_methods(fns, methods, g, (q, k, v), kind, with_backward)
    for r in res["methods"].values():
        if "fwd_ms" in r:
            r["fwd_GBps"] = compulsory / (r["fwd_ms"] * 1e-3) / 1e9
    return res


def chunk_sweep(graphs, chunks, dtype=torch.float32):
    """Fused fwd / fwd+bwd time per work-item chunk (tunes schedule.choose_chunk)."""
    from pyg_dfgnn.ops import schedule
    rows = []
    for name, (ei, n, kind) in graphs.items():
        for chunk in chunks + [None]:
            schedule.CHUNK_OVERRIDE = chunk
            r = run_case(name, ei, n, kind, 1, 128, dtype, ["fused-auto"])
            m = r["methods"]["fused-auto"]
            lay_chunk = chunk if chunk else "auto"
            rows.append({"graph": name, "chunk": lay_chunk, "dtype": r["dtype"], **m})
            print(f"{name:<13} chunk={str(lay_chunk):>5}  fwd {m.get('fwd_ms', float('nan')):.3f} ms"
                  f"  fwd+bwd {m.get('fwd_bwd_ms', float('nan')):.3f} ms")
    schedule.CHUNK_OVERRIDE = None
    return rows


def run_score_case(model, name, ei, n, kind, H, C, dtype, fused_only=False):
    """GAT (additive) or AGNN (cosine): fused op vs native PyG message passing on the
    same per-node tensors; same fields as :func:`run_case`."""
    import torch.nn.functional as F
    from torch_geometric.nn import AGNNConv, GATConv
    torch.manual_seed(0)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x = torch.randn(n, H, C, device=DEV, dtype=dtype, requires_grad=True)
    g = torch.randn(n, H, C, device=DEV, dtype=dtype)
    if model == "gat":
        a_src = torch.randn(n, H, device=DEV, dtype=dtype, requires_grad=True)
        a_dst = torch.randn(n, H, device=DEV, dtype=dtype, requires_grad=True)
        conv = GATConv(H * C, C, heads=H, add_self_loops=False).to(DEV).to(dtype)
        fns = {"fused-auto": lambda: ops.gat_attention(lay, a_src, a_dst, x),
               "fused-smmf": lambda: ops.gat_attention(lay, a_src, a_dst, x, strategy="smmf"),
               "fused-pmf": lambda: ops.gat_attention(lay, a_src, a_dst, x, strategy="pmf"),
               "pyg": lambda: conv.propagate(ei, x=(x, x), alpha=conv.edge_updater(
                   ei, alpha=(a_src, a_dst), edge_attr=None, size=None), size=None)}
        leaves = (a_src, a_dst, x)
    else:
        beta = torch.ones((), device=DEV, dtype=dtype, requires_grad=True)
        conv = AGNNConv(add_self_loops=False).to(DEV).to(dtype)
        x2 = x.view(n, H * C)
        fns = {"fused-auto": lambda: ops.agnn_attention(lay, x2, None, beta),
               "pyg": lambda: conv.propagate(ei, x=x2, x_norm=F.normalize(x2, p=2.0, dim=-1))}
        g = g.view(n, H * C)
        leaves = (x, beta)
    res = {"graph": name, "kind": kind, "model": model, "nodes": n, "edges": lay.num_edges,
           "max_in_degree": lay.max_in_degree, "H": H, "C": C, "dtype": str(dtype).split(".")[-1],
           "auto": ops.choose_strategy(
               lay.max_in_degree, "additive" if model == "gat" else "cosine", x.element_size()),
           "methods": {}}
    methods = [m for m in fns if not (fused_only and m == "pyg")]
    res["methods"] = measure_methods(fns, methods, g, leaves, kind)
    return res


def fmt_score_table(rows):
    lines = [f"{'model':<6}{'graph':<13}{'H×C':>7}{'auto':>6} | {'fused fwd':>9}{'smmf':>8}"
             f"{'pmf':>8}{'pyg fwd':>9}{'×pyg':>7} | {'fused f+b':>9}{'pyg f+b':>9}{'×pyg':>7} | "
             f"{'memMB f/p':>14}"]
    for r in rows:
        m = r["methods"]
        f, p = m.get("fused-auto", {}), m.get("pyg", {})
        sm, pm = m.get("fused-smmf", {}), m.get("fused-pmf", {})

        def v(d, k):
            return f"{d[k]:.3f}" if k in d else ("err" if "error" in d else "-")

        def ratio(k):
            return f"{p[k] / f[k]:.1f}" if k in p and k in f else "-"
        lines.append(f"{r['model']:<6}{r['graph']:<13}{str(r['H']) + '×' + str(r['C']):>7}"
                     f"{r['auto']:>6} | {v(f, 'fwd_ms'):>9}{v(sm, 'fwd_ms'):>8}{v(pm, 'fwd_ms'):>8}"
                     f"{v(p, 'fwd_ms'):>9}{ratio('fwd_ms'):>7} | {v(f, 'fwd_bwd_ms'):>9}"
                     f"{v(p, 'fwd_bwd_ms'):>9}{ratio('fwd_bwd_ms'):>7} | "
                     f"{f.get('peak_MB', float('nan')):.0f}/{p.get('peak_MB', float('nan')):.0f}")
    return "\n".join(lines)


def fmt_table(rows):
    lines = []
    hdr = (f"{'graph':<13}{'H×C':>7}{'dtype':>9}{'auto':>6} | {'fused fwd':>9}{'smmf':>8}{'pmf':>8}"
           f"{'pyg':>9}{'sparse':>9}{'×pyg':>7} | {'fused f+b':>9}{'pyg f+b':>9}{'×pyg':>7}"
           f" | {'GB/s':>6}{'memMB f/p':>14}")
    lines.append(hdr)
    for r in rows:
        m = r["methods"]

        def g(k, key):
            v = m.get(k, {}).get(key)
            return f"{v:.3f}" if isinstance(v, float) else ("err" if "error" in m.get(k, {}) else "-")

        def ratio(key):
            a, b = m.get("fused-auto", {}).get(key), m.get("pyg", {}).get(key)
            return f"{b / a:.1f}" if a and b else "-"
        mem = (f"{m.get('fused-auto', {}).get('peak_MB', float('nan')):.0f}/"
               f"{m.get('pyg', {}).get('peak_MB', float('nan')):.0f}")
        bw = m.get("fused-auto", {}).get("fwd_GBps")
        lines.append(f"{r['graph']:<13}{str(r['H']) + '×' + str(r['C']):>7}{r['dtype']:>9}{r['auto']:>6} | "
                     f"{g('fused-auto', 'fwd_ms'):>9}{g('fused-smmf', 'fwd_ms'):>8}{g('fused-pmf', 'fwd_ms'):>8}"
                     f"{g('pyg', 'fwd_ms'):>9}{g('sparse', 'fwd_ms'):>9}{ratio('fwd_ms'):>7} | "
                     f"{g('fused-auto', 'fwd_bwd_ms'):>9}{g('pyg', 'fwd_bwd_ms'):>9}{ratio('fwd_bwd_ms'):>7} | "
                     f"{(f'{bw:.0f}' if bw else '-'):>6}{mem:>14}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels",
                                 description=__doc__.splitlines()[0] + " Needs a CUDA GPU "
                                 "and the compiled extension.")
    ap.add_argument("--quick", action="store_true", help="small batches, no synthetic super-node graphs")
    ap.add_argument("--out", default="kernels.json")
    ap.add_argument("--graphs", default="", help="comma-separated subset of graph names")
    ap.add_argument("--no-sparse", action="store_true", help="skip the torch.sparse pipeline")
    ap.add_argument("--chunk-sweep", default="", help="comma-separated chunks: only sweep them")
    ap.add_argument("--sweep-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="dtype of the chunk sweep")
    ap.add_argument("--accumulate-grads", action="store_true",
                    help="fwd+bwd steps accumulate into .grad (one addition kernel per leaf "
                         "and step) instead of starting from None as a training step does")
    ap.add_argument("--models", default="gt,gat,agnn", help="score functions to run: gt, gat, agnn")
    ap.add_argument("--fused-only", action="store_true",
                    help="time only the fused methods (A/B runs of kernel versions)")
    args = ap.parse_args(argv)
    global ACCUMULATE_GRADS
    ACCUMULATE_GRADS = args.accumulate_grads
    if not torch.cuda.is_available():
        print("benchmarks.kernels needs a CUDA GPU and the compiled extension; no GPU is "
              "visible here", file=sys.stderr)
        return 1
    from tqdm import tqdm
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
            "copy_GBps": copy_bandwidth(), "autograd_floor_ms": autograd_floor()}
    print(f"# {info}")
    graphs = load_graphs(args.quick)
    if args.graphs:
        graphs = {k: v for k, v in graphs.items() if k in args.graphs.split(",")}
    if args.chunk_sweep:
        rows = chunk_sweep(graphs, [int(c) for c in args.chunk_sweep.split(",")],
                           getattr(torch, args.sweep_dtype))
        with open(args.out, "w") as f:
            json.dump({"info": info, "chunk_sweep": rows}, f, indent=1)
        return 0
    models = args.models.split(",")
    base = ["fused-auto", "fused-smmf", "fused-pmf", "pyg"] + ([] if args.no_sparse else ["sparse"])
    if args.fused_only:
        base = base[:3]
    native = [] if args.fused_only else ["pyg"]
    cases = []
    for name, (ei, n, kind) in graphs.items():
        if "gt" in models:
            cases.append(("gt", (name, ei, n, kind, 1, 128, torch.float32, base)))
            cases.append(("gt", (name, ei, n, kind, 4, 32, torch.float32,
                                 ["fused-auto", "fused-smmf", "fused-pmf"] + native)))
            cases.append(("gt", (name, ei, n, kind, 1, 128, torch.bfloat16, ["fused-auto"] + native)))
        if "gat" in models:
            cases.append(("gat", (name, ei, n, kind, 1, 128, torch.float32)))
            cases.append(("gat", (name, ei, n, kind, 4, 32, torch.float32)))
        if "agnn" in models:
            cases.append(("agnn", (name, ei, n, kind, 1, 128, torch.float32)))
    rows, score_rows = [], []
    for model, c in tqdm(cases, desc="kernels", file=sys.stderr):
        if model == "gt":
            rows.append(run_case(*c))
        else:
            score_rows.append(run_score_case(model, *c, fused_only=args.fused_only))
        with open(args.out, "w") as f:
            json.dump({"info": info, "rows": rows, "score_rows": score_rows}, f, indent=1)
    if score_rows:
        print(fmt_score_table(score_rows))
    print(fmt_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
