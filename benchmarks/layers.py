r"""Whole-layer benchmark: one PyG attention layer, projections included, against its
fused subclass, each eager and under ``torch.compile`` (issue 25's yardstick).

For each graph, model and dtype, one layer is built from a seed --
``TransformerConv`` (``gt``), ``TransformerConv`` with ``edge_dim=16`` (``gt_edge``:
:data:`EDGE_DIM` features per edge, as per-edge tails where they pay, the
``dot_edge_tail`` score; ``gt_edge_rows``: the same layer with ``edge_tails=False``,
the ``dot_edge`` score's ``[E, H, C]`` rows), ``GATConv`` (``gat``),
``GATConv`` with ``edge_dim=16`` (``gat_edge``, the ``additive_edge`` score),
``GATv2Conv`` (``gatv2``), ``GATv2Conv`` with ``edge_dim=16`` (``gatv2_edge``, the
``gatv2_edge`` score) or ``AGNNConv`` (``agnn``) of
:mod:`torch_geometric.nn`, ``--in-channels`` (128) input features, ``--heads-channels``
(1x128) -- and its fused copy with the same state (:func:`pyg_dfgnn.nn.fuse` of a deep
copy). ``AGNNConv`` has no projection and keeps its 128 channels whatever the heads.
Random features ``x`` (with ``requires_grad``: the layer sits inside a model, so its
backward computes the input gradient too; the edge features are data, without:
random standard-normal ones, or a molecule graph's embedded bond features)
go through four methods:

* ``pyg``: the native layer, eager,
* ``pyg-compile``: ``torch.compile(layer, dynamic=False)`` of the native layer,
* ``fused``: the fused layer, eager,
* ``fused-compile``: ``torch.compile(layer, dynamic=False)`` of the fused layer.

Each method is timed as in :mod:`benchmarks.kernels` (``triton.testing.do_bench``:
warm-up, median ms): the forward under ``no_grad`` (``fwd_ms``) and forward +
backward of a random output gradient (``fwd_bwd_ms``), each step starting with the
gradients of ``x`` and the parameters set to ``None`` as after ``zero_grad()``; plus
the peak extra memory of forward + backward (``peak_MB``). A compiled method is
compiled afresh per graph and configuration (the compiler's caches reset first); its
first calls' wall times are ``compile_fwd_s`` / ``compile_fwd_bwd_s``, left out of
the timings. A compiler failure is recorded as ``status: "compile_failed"``, an
out-of-memory or other failure as ``status: "error"``, each with its first line;
neither stops the run. Every method's output is compared with the eager PyG layer's
(``rel_err``; above ``TOLERANCE`` the method's status is ``mismatch``), so a broken
run shows. Rows carry ``speedup_vs_pyg_compile`` (compiled PyG's time / fused's and
fused-compile's) and ``target`` (issue 25's fwd+bwd target for the row,
:data:`TARGETS`, and whether the better of the two meets it). ``bf16`` runs the layer
call under ``torch.autocast(dtype=torch.bfloat16)``, both sides alike (parameters and
``x`` stay fp32); its ``rel_err`` is against the fp32 eager PyG layer. Every method
runs under the same matmul precision (TF32 off unless ``--tf32``).

``GATConv`` and ``AGNNConv`` read a graph to which self-loops were added once
(``--self-loops graph``, the default: both layers built with ``add_self_loops=False``;
native PyG then skips its per-call ``remove_self_loops`` / ``add_self_loops``, whose
boolean mask has a data-dependent size) or add them themselves
(``--self-loops layer``: the convs' default). ``gat_edge`` and ``gatv2_edge`` on
a graph with its self-loops get their features from PyG's
``add_self_loops(fill_value="mean")``, once, as ``GATConv`` and ``GATv2Conv``
compute them in every call otherwise.

Graphs: PATTERN and CLUSTER (batches of 1024 generated graphs,
:func:`benchmarks.generators.sbm_batch`), MUSAE GitHub, ogbn-arxiv (the full graph,
undirected), the generated Reddit-like power-law graph, loaded as
:mod:`benchmarks.profile_backward` loads them (real graphs from ``--data``, default
``$PYG_DFGNN_DATA``, else a PyG download: :mod:`benchmarks.datasets`), the generated
web-NotreDame-like power-law graph (:data:`EDGE_GRAPHS`) and ``HIV``, a batch of
``--hiv-molecules`` (512) MoleculeNet HIV molecules read from ``--hiv-batches FILE``
(:func:`benchmarks.datasets.hiv_batches`: pre-batched molecules, for machines
without RDKit) with its bond features embedded (:func:`embed_bonds`). The edge
models (``gt_edge``, ``gt_edge_rows``, ``gat_edge``, ``gatv2_edge``) run on PATTERN,
web-NotreDame-like and HIV only, and the last two run the edge models only
(:data:`MODEL_GRAPHS`; HIV only with ``--hiv-batches``). Needs a CUDA GPU and the
compiled extension, except with ``--quick``: 8-graph batches and
300-node power-law graphs in place of the real ones, short repeats (tests, a smoke
run), which runs on the CPU too (``--device cpu``, the default without a GPU), with
a wall-clock timer in place of ``do_bench``, no peak memory and, unless
``--methods`` names them, no compiled methods.

Run order: every eager method of every case first, then the compiled ones (a compile
running before an eager measurement slowed host-bound steps, see
:func:`benchmarks.kernels.phases`). The JSON (``--out``) is rewritten after every
method; ``--resume`` keeps what ``--out`` holds and runs the rest, and a method that
leaves the CUDA context unusable (a fault in generated code) is recorded and the run
restarts itself with ``--resume``.

Default grid: 5 graphs x 4 models x (fp32, bf16) = 40 cases, plus ``gt_edge``,
``gt_edge_rows``, ``gat_edge`` and ``gatv2_edge`` on 2 graphs (3 with
``--hiv-batches``) x 2 dtypes, x 4 methods; the 30 cases of 3 models took 7
minutes on an H100 in one process, most of it compiling (5-26 s per compiled
native layer, 1-4 s per compiled fused layer). Autocast leaves ``AGNNConv`` in
fp32 (it has no matmul), so its bf16 rows repeat the fp32 computation;
``--bf16-models`` narrows the bf16 cases to some models.

Usage, from the repository root::

    python -m benchmarks.layers --out out/layers.json
    python -m benchmarks.layers --models gt_edge,gat_edge,gatv2_edge --graphs HIV \
        --hiv-batches hiv_batches.pt --out out/hiv.json
    python -m benchmarks.layers --quick --out q.json      # no GPU: the CPU, eager methods
    python -m benchmarks.layers --quick --device cpu --methods pyg,pyg-compile \
        --compile-backend aot_eager --out q.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

from benchmarks import cli, generators, kernels, profile_backward

#: Graphs in run order: the two batch graphs, then the power-law ones.
BATCH_GRAPHS = {"PATTERN": "pattern", "CLUSTER": "cluster"}
#: Generated graphs of the edge-feature model: ``(nodes, mean in-degree, largest
#: in-degree, seed)`` of :func:`benchmarks.generators.power_law_graph`. SNAP's
#: web-NotreDame has 325,729 nodes, 1,497,134 edges and a largest in-degree of
#: about 10,700: a sparse graph with hubs, unlike the dense Reddit-like one.
EDGE_GRAPHS = {"web-NotreDame-like": (325_729, 1_497_134 / 325_729, 10_721, 3)}
#: The molecule graph: a batch of MoleculeNet HIV molecules from ``--hiv-batches``.
HIV = "HIV"
#: Molecules in the HIV batch (``--hiv-molecules``).
HIV_MOLECULES = 512
GRAPHS = tuple(BATCH_GRAPHS) + profile_backward.GRAPHS + tuple(EDGE_GRAPHS) + (HIV,)
MODELS = ("gt", "gt_edge", "gt_edge_rows", "gat", "gat_edge", "gatv2", "gatv2_edge", "agnn")
#: The models with edge features (``edge_dim=EDGE_DIM``).
EDGE_MODELS = ("gt_edge", "gt_edge_rows", "gat_edge", "gatv2_edge")
#: Features per edge of the edge models.
EDGE_DIM = 16
#: The graphs only the edge models run on.
EDGE_ONLY_GRAPHS = tuple(EDGE_GRAPHS) + (HIV,)
#: The graphs a model runs on (a run's ``--graphs`` narrows them); a model not
#: named runs on every graph but :data:`EDGE_ONLY_GRAPHS`.
MODEL_GRAPHS = {m: ("PATTERN",) + EDGE_ONLY_GRAPHS for m in EDGE_MODELS}
METHODS = ("pyg", "pyg-compile", "fused", "fused-compile")
#: Compiled method -> its eager method (the layer it compiles).
COMPILED = {"pyg-compile": "pyg", "fused-compile": "fused"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: Largest ``rel_err`` of a method's output against eager PyG's fp32 output (``tf32``:
#: fp32 under ``--tf32``, whose GEMMs round their inputs to 10-bit mantissas).
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2}
#: Graphs per batch graph under ``--quick``.
QUICK_BATCH = 8
#: ``(warmup_ms, rep_ms)`` of ``do_bench``; wall-clock repetitions on the CPU.
REPEATS, QUICK_REPEATS, CPU_REPEATS = kernels.REPEATS, kernels.QUICK_REPEATS, 2


class Graph:
    """One graph of the run: ``edge_index`` on the device, ``num_nodes``, ``kind``
    (``batch`` / ``super``), ``edge_attr`` (``[E, EDGE_DIM]`` features of its own, or
    ``None``: the edge models draw random ones) and, built once on first use, the
    same graph with one self-loop per node (the same tensor every time, so the fused
    layout cached on it is built once)."""

    def __init__(self, name: str, edge_index, num_nodes: int, kind: str, edge_attr=None):
        self.name, self.edge_index, self.num_nodes, self.kind = name, edge_index, num_nodes, kind
        self.edge_attr = edge_attr
        self._looped = None

    def edges_for(self, model: str, self_loops: str):
        if model in ("gt", "gt_edge", "gt_edge_rows") or self_loops == "layer":
            return self.edge_index
        if self._looped is None:
            from benchmarks.e2e import native_graph_edge_index
            self._looped = native_graph_edge_index(self.edge_index, self.num_nodes)
        return self._looped


def embed_bonds(bonds, dim: int = EDGE_DIM, seed: int = 0):
    r"""``[E, dim]`` float32 features of PyG's integer bond features ``bonds``
    ``[E, 3]`` (bond type, stereo, conjugated): one fixed random
    standard-normal table per column (the vocabularies of
    :mod:`torch_geometric.utils.smiles` ``e_map``), seeded, the rows summed, as
    a molecule model's ``BondEncoder`` embeds them (``examples/train_molhiv.py``)."""
    from torch_geometric.utils.smiles import e_map

    gen = torch.Generator().manual_seed(seed)
    tables = [torch.randn(len(v), dim, generator=gen) for v in e_map.values()]
    return sum(t.to(bonds.device)[bonds[:, i]] for i, t in enumerate(tables))


def load_graph(name: str, device, quick: bool = False, data=None, hiv_batches=None,
               hiv_molecules: int = HIV_MOLECULES) -> Graph:
    """A :class:`Graph` of :data:`GRAPHS`; ``quick``: 8-graph batches and 300-node
    power-law graphs (generated, no data files). ``HIV`` reads ``hiv_molecules``
    molecules from the file ``hiv_batches`` (:func:`benchmarks.datasets.hiv_batches`),
    quick or not.

    Raises:
        ValueError: an unknown name. FileNotFoundError: a real graph without data,
            or ``HIV`` without ``hiv_batches``.
    """
    if name == HIV:
        from benchmarks import datasets
        if hiv_batches is None:
            raise FileNotFoundError("graph HIV needs --hiv-batches FILE (pre-batched "
                                    "MoleculeNet HIV molecules)")
        mol = datasets.hiv_batches(hiv_batches, hiv_molecules)
        return Graph(name, mol.edge_index.to(device), mol.num_nodes, "batch",
                     embed_bonds(mol.edge_attr).to(device))
    if name in BATCH_GRAPHS:
        ei, batch, _, _ = generators.sbm_batch(BATCH_GRAPHS[name], QUICK_BATCH if quick else 1024,
                                               seed=0)
        return Graph(name, ei.to(device), batch.numel(), "batch")
    if name not in GRAPHS:
        raise ValueError(f"unknown graph {name!r}; expected one of {GRAPHS}")
    if name in EDGE_GRAPHS and not quick:
        n, avg, mx, seed = EDGE_GRAPHS[name]
        return Graph(name, generators.power_law_graph(n, avg, mx, seed, device), n, "super")
    ei, n = profile_backward.load_graph(name, data, device, tiny=quick)
    return Graph(name, ei, n, "super")


def build_layers(model: str, H: int, C: int, in_channels: int, self_loops: str):
    r"""``(native, fused, fused_reason)``: the PyG layer (seeded) and its fused copy
    with the same state; ``fused_reason`` is why the fused copy falls back to PyG's
    forward (``""`` when it runs fused)."""
    from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv

    from pyg_dfgnn.nn import fuse
    torch.manual_seed(0)
    loops = self_loops == "layer"
    if model == "gt":
        native = TransformerConv(in_channels, C, heads=H)
    elif model in ("gt_edge", "gt_edge_rows"):
        native = TransformerConv(in_channels, C, heads=H, edge_dim=EDGE_DIM)
    elif model == "gat":
        native = GATConv(in_channels, C, heads=H, add_self_loops=loops)
    elif model == "gat_edge":
        native = GATConv(in_channels, C, heads=H, add_self_loops=loops, edge_dim=EDGE_DIM)
    elif model == "gatv2":
        native = GATv2Conv(in_channels, C, heads=H, add_self_loops=loops)
    elif model == "gatv2_edge":
        native = GATv2Conv(in_channels, C, heads=H, add_self_loops=loops, edge_dim=EDGE_DIM)
    elif model == "agnn":
        native = AGNNConv(add_self_loops=loops)
    else:
        raise ValueError(f"unknown model {model!r}; expected one of {MODELS}")
    report = fuse(native, inplace=False)
    if model == "gt_edge_rows":
        report.model.edge_tails = False
    return native, report.model, report[0].reason


class Case:
    """One graph x model x configuration x dtype: both layers on the device, the
    input ``x`` (and ``edge_attr`` for the edge models: the graph's own, else
    random; with the graph's self-loops those of the loops too), the output
    gradient ``g`` and each method's eager call."""

    def __init__(self, graph: Graph, model: str, H: int, C: int, dtype: str, args):
        dev = graph.edge_index.device
        self.graph, self.model, self.H, self.C, self.dtype = graph, model, H, C, dtype
        self.ei = graph.edges_for(model, args.self_loops)
        native, fused, self.fused_reason = build_layers(model, H, C, args.in_channels,
                                                        args.self_loops)
        self.layers = {"pyg": native.to(dev).train(), "fused": fused.to(dev).train()}
        gen = torch.Generator(device="cpu").manual_seed(1)
        self.x = torch.randn(graph.num_nodes, args.in_channels, generator=gen).to(dev)
        self.x.requires_grad_()
        out_channels = args.in_channels if model == "agnn" else H * C
        self.g = torch.randn(graph.num_nodes, out_channels, generator=gen).to(dev)
        self.edge_attr = None
        if model in EDGE_MODELS:
            ea = graph.edge_attr
            if ea is None:
                ea = torch.randn(graph.edge_index.size(1), EDGE_DIM, generator=gen).to(dev)
            if self.ei is not graph.edge_index:  # the graph's self-loops: PyG's features
                from torch_geometric.utils import add_self_loops, remove_self_loops
                ei, ea = remove_self_loops(graph.edge_index, ea)
                ea = add_self_loops(ei, ea, fill_value="mean", num_nodes=graph.num_nodes)[1]
            self.edge_attr = ea
        self.device_type = dev.type

    def leaves(self, eager: str):
        return (self.x, *self.layers[eager].parameters())

    def inputs(self):
        """``(x, edge_index)``, and ``edge_attr`` where the model has edge features."""
        return (self.x, self.ei) if self.edge_attr is None else (self.x, self.ei, self.edge_attr)

    def call(self, layer):
        """``layer(*inputs())``, under bf16 autocast for ``bf16``."""
        ctx = (torch.autocast(self.device_type, dtype=torch.bfloat16) if self.dtype == "bf16"
               else contextlib.nullcontext())
        with ctx:
            return layer(*self.inputs())

    def eager(self, method: str):
        layer = self.layers[method]
        return lambda: self.call(layer)

    def reference(self):
        """Eager PyG's fp32 output (no autocast), detached."""
        with torch.no_grad():
            return self.layers["pyg"](*self.inputs()).detach()

    def compile_fn(self, method: str, backend: str):
        """The ``compile_fn`` of :func:`benchmarks.kernels.compile_case`: compiles the
        layer module itself (``torch.compile(layer, dynamic=False)``), not the call."""
        layer = self.layers[COMPILED[method]]

        def compile_fn(_fn, dynamic):
            compiled = torch.compile(layer, dynamic=dynamic, backend=backend)
            return lambda: self.call(compiled)
        return compile_fn


def case_key(model: str, graph: str, H: int, C: int, dtype: str) -> str:
    return f"{model}/{graph}/{H}x{C}/{dtype}"


def rel_err(out, ref) -> float:
    if out.shape != ref.shape:
        return float("inf")
    ref = ref.double()
    return float((out.detach().double() - ref).norm() / ref.norm())


def run_method(case: Case, method: str, timer, backend: str, tol: float) -> dict:
    """One method of one case: compile (compiled methods), check against eager PyG
    (``rel_err`` above ``tol``: status ``mismatch``), time; failures recorded in the
    result, never raised."""
    eager = COMPILED.get(method, method)
    leaves = case.leaves(eager)
    try:
        ref = case.reference()
        with torch.no_grad():
            out_dtype = case.eager(eager)().dtype  # also builds the fused layout
    except Exception as e:  # noqa: BLE001  (out of memory, say: recorded)
        kernels._free_cache(leaves)
        return {"status": "error", "error": kernels._first_line(e)}
    g = case.g.to(out_dtype)
    if method in COMPILED:
        fn, res = kernels.compile_case(None, leaves, g, True, case.compile_fn(method, backend))
        if fn is None:
            return res
    else:
        fn, res = case.eager(method), {}
    try:
        with torch.no_grad():
            res["rel_err"] = rel_err(fn(), ref)
    except Exception as e:  # noqa: BLE001
        kernels._free_cache(leaves)
        return {**res, "status": "error", "error": kernels._first_line(e)}
    del ref
    res.update(kernels.measure(fn, g, leaves, True, peak=True, timer=timer))
    if res["status"] == "ok" and not res["rel_err"] <= tol:
        res["status"] = "mismatch"
        res["error"] = f"rel. err {res['rel_err']:.2e} vs eager PyG > {tol:g}"
    return res


def speedups(row: dict) -> dict:
    """``{method: {fwd, fwd_bwd}}``: compiled PyG's time / the method's time for
    ``fused`` and ``fused-compile`` (how many times faster than the yardstick)."""
    m = row["methods"]
    base = m.get("pyg-compile", {})
    out = {}
    for meth in ("fused", "fused-compile"):
        d = m.get(meth, {})
        r = {k: base[f"{k}_ms"] / d[f"{k}_ms"] for k in ("fwd", "fwd_bwd")
             if isinstance(base.get(f"{k}_ms"), float) and isinstance(d.get(f"{k}_ms"), float)
             and d[f"{k}_ms"] > 0}
        if r:
            out[meth] = r
    return out


#: Issue 25's whole-layer targets: forward + backward speedup over compiled PyG.
TARGETS = {("fp32", "batch"): 3.0, ("fp32", "super"): 2.0, ("bf16", "batch"): 3.0,
           ("bf16", "super"): 3.0}


def target(row: dict):
    """``{"fwd_bwd": target, "best": the better of fused / fused-compile, "met": bool}``
    of the row's fwd+bwd speedup over compiled PyG, or ``None`` where either is
    missing."""
    want = TARGETS.get((row["dtype"], row.get("kind")))
    got = [v["fwd_bwd"] for v in row.get("speedup_vs_pyg_compile", {}).values()
           if "fwd_bwd" in v]
    if want is None or not got:
        return None
    return {"fwd_bwd": want, "best": max(got), "met": max(got) >= want}


def fmt_table(rows) -> str:
    """One line per row: each method's fwd / fwd+bwd ms, the ratios of compiled PyG
    to fused and to fused-compile (``×``), the row's target (:func:`target`) and
    whether the better of the two meets it, compile seconds (PyG / fused), the fused
    output's ``rel_err`` and peak MB (PyG / fused)."""
    def cell(d, key):
        v = d.get(key)
        if not isinstance(v, float):
            return kernels._cell(d, key)
        return f"{v:.3g}" if v < 1000 else f"{v:.0f}"

    def ratio(row, meth, key):
        v = row.get("speedup_vs_pyg_compile", {}).get(meth, {}).get(key)
        return f"{v:.2f}" if v else "-"

    def comp(d):
        v = [d[k] for k in ("compile_fwd_s", "compile_fwd_bwd_s") if k in d]
        return f"{sum(v):.0f}" if v else cell(d, "compile_fwd_s")

    head = (f"{'model':<8}{'graph':<12}{'H×C':>6}{'dtype':>6} |"
            + "".join(f"{m:>14}" for m in METHODS)
            + f" | {'×fused':>11}{'×fcomp':>11}{'target':>12} | {'cmp s':>6}{'err':>9}"
            + f"{'peak MB p/f':>14}")
    lines = [head, f"{'':<32}|" + f"{'fwd/f+b':>14}" * 4
             + f" | {'fwd/f+b':>11}{'fwd/f+b':>11}{'f+b':>12} |"]
    for r in rows:
        m = r["methods"]
        cells = "".join(f"{cell(m.get(k, {}), 'fwd_ms'):>7}/{cell(m.get(k, {}), 'fwd_bwd_ms'):<6}"
                        for k in METHODS)
        rats = "".join(f" {ratio(r, k, 'fwd')}/{ratio(r, k, 'fwd_bwd')}".rjust(11)
                       for k in ("fused", "fused-compile"))
        err = m.get("fused", {}).get("rel_err")
        t = r.get("target")
        tgt = f"{t['fwd_bwd']:g}x {'met' if t['met'] else 'miss'}" if t else "-"
        peak = (f"{m.get('pyg', {}).get('peak_MB', float('nan')):.0f}/"
                f"{m.get('fused', {}).get('peak_MB', float('nan')):.0f}")
        lines.append(f"{r['model']:<8}{r['graph']:<12}{str(r['H']) + '×' + str(r['C']):>6}"
                     f"{r['dtype']:>6} |{cells} | {rats}{tgt:>12} | "
                     f"{comp(m.get('pyg-compile', {})) + '/' + comp(m.get('fused-compile', {})):>6}"
                     f"{(f'{err:.1e}' if err is not None else '-'):>9}{peak:>14}")
    return "\n".join(lines)


def failures(rows) -> str:
    """One line per method not measured or mismatched, and per fused layer that
    falls back to PyG's forward (its times would be PyG's)."""
    return "\n".join([f"{r['key']} {meth}: {d['status']}: {d.get('error', '')}"
                      for r in rows for meth, d in r["methods"].items()
                      if d.get("status", "ok") != "ok"]
                     + [f"{r['key']} fused: runs PyG's forward ({r['fused_reason']})"
                        for r in rows if r.get("fused_reason")])


def plot(rows, path: str, title: str = "") -> None:
    """Bar chart of ``speedup_vs_pyg_compile`` (fwd+bwd) per row, fused and
    fused-compile side by side, with the 1x line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['model']} {r['graph']}\n{r['H']}×{r['C']} {r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 2), 4))
    for i, meth in enumerate(("fused", "fused-compile")):
        vals = [r.get("speedup_vs_pyg_compile", {}).get(meth, {}).get("fwd_bwd", 0.0)
                for r in rows]
        ax.bar([j + 0.4 * i for j in range(len(rows))], vals, 0.4, label=meth)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([j + 0.2 for j in range(len(rows))], labels, rotation=90, fontsize=7)
    ax.set_ylabel("× PyG + torch.compile, fwd+bwd")
    ax.set_title(title, fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv):
    from benchmarks import datasets
    ap = argparse.ArgumentParser(prog="python -m benchmarks.layers",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--out", default="layers.json", help="JSON results, written as it goes")
    ap.add_argument("--graphs", default=None,
                    help=f"comma-separated subset of {','.join(GRAPHS)} (default: all; "
                         f"{HIV} with --hiv-batches)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32,bf16")
    ap.add_argument("--bf16-models", default=",".join(MODELS),
                    help="models also run under bf16 autocast")
    ap.add_argument("--methods", default=None,
                    help=f"comma-separated subset of {','.join(METHODS)} (default: all; on "
                         "the CPU: pyg,fused, as compiling there takes minutes per case)")
    ap.add_argument("--heads-channels", default="1x128",
                    help="comma-separated HxC configurations (e.g. 1x128,4x32)")
    ap.add_argument("--in-channels", type=int, default=128, help="input features per node")
    ap.add_argument("--self-loops", choices=("graph", "layer"), default="graph",
                    help="GAT / AGNN: self-loops added to the graph once or by the layers "
                         "in every call (add_self_loops=True)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend of the compiled methods")
    ap.add_argument("--tf32", action="store_true",
                    help="allow TF32 in fp32 matmuls (every method alike; default: off)")
    cli.add_device_argument(ap)
    datasets.add_data_argument(ap, "MUSAE/GitHub/ and ogbn-arxiv/")
    ap.add_argument("--hiv-batches", default=None, metavar="FILE",
                    help=f"file of pre-batched MoleculeNet HIV molecules "
                         f"(benchmarks.datasets.hiv_batches) for graph {HIV} (default: none, "
                         f"no graph {HIV})")
    ap.add_argument("--hiv-molecules", type=int, default=HIV_MOLECULES,
                    help=f"molecules in the {HIV} batch")
    ap.add_argument("--quick", action="store_true",
                    help="small generated graphs, short repeats (tests, smoke run; also on CPU)")
    ap.add_argument("--plot", default=None,
                    help="PNG of the speedups over compiled PyG (default: no plot)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the methods already in --out and run the others")
    args = ap.parse_args(argv)
    args.device = cli.pick_device("benchmarks.layers", args.device, args.quick)
    if args.graphs is None:
        args.graphs = ",".join(g for g in GRAPHS if g != HIV or args.hiv_batches)
    if args.methods is None:
        args.methods = ",".join(m for m in METHODS
                                if args.device.type == "cuda" or m not in COMPILED)
    return args


def plan(args):
    """``[(graph, model, H, C, dtype)]`` of the run, and the methods."""
    configs = [tuple(int(v) for v in hc.split("x")) for hc in args.heads_channels.split(",")]
    models, dtypes = args.models.split(","), args.dtypes.split(",")
    bf16 = args.bf16_models.split(",")
    for d in dtypes:
        if d not in DTYPES:
            raise SystemExit(f"unknown dtype {d!r}; expected fp32 or bf16")
    for name, given, known in (("graph", args.graphs, GRAPHS), ("model", args.models, MODELS),
                               ("method", args.methods, METHODS)):
        unknown = set(given.split(",")) - set(known)
        if unknown:
            raise SystemExit(f"unknown {name}(s) {sorted(unknown)}; expected {','.join(known)}")
    methods = [m for m in METHODS if m in args.methods.split(",")]
    cases = []
    if HIV in args.graphs.split(",") and not args.hiv_batches:
        raise SystemExit(f"graph {HIV} needs --hiv-batches FILE (pre-batched MoleculeNet HIV "
                         "molecules, benchmarks.datasets.hiv_batches)")
    for graph in args.graphs.split(","):
        for model in models:
            if graph not in MODEL_GRAPHS.get(model, tuple(g for g in GRAPHS
                                                          if g not in EDGE_ONLY_GRAPHS)):
                continue
            # AGNNConv has no heads or projection: one configuration
            for H, C in configs[:1] if model == "agnn" else configs:
                cases += [(graph, model, H, C, d) for d in dtypes
                          if d == "fp32" or model in bf16]
    if not cases:
        only = "; ".join(f"{m} runs on {', '.join(g)} only" for m, g in MODEL_GRAPHS.items())
        raise SystemExit(f"no case in these graphs and models ({only}; "
                         f"{', '.join(EDGE_ONLY_GRAPHS)} run {', '.join(MODEL_GRAPHS)} only)")
    return cases, methods


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cuda = args.device.type == "cuda"
    reps = QUICK_REPEATS if args.quick else REPEATS
    if cuda:
        def timer(fn):
            return kernels.bench(fn, *reps)
    else:
        def timer(fn):
            return profile_backward.wall_timer(fn, CPU_REPEATS)
    info = {"device": torch.cuda.get_device_name(args.device) if cuda else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d"), "quick": args.quick,
            "command": " ".join(["python -m benchmarks.layers"] + argv),
            "repeats_ms": list(reps) if cuda else None, **kernels.set_matmul_precision(args.tf32),
            "compile": {"dynamic": False, "mode": "default", "backend": args.compile_backend,
                        "per": "graph and configuration"},
            "in_channels": args.in_channels, "self_loops": args.self_loops,
            "hiv_batches": args.hiv_batches, "hiv_molecules": args.hiv_molecules,
            "x_requires_grad": True}
    cases, methods = plan(args)
    rows = []
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            rows = json.load(f).get("rows", [])
    by_key = {r["key"]: r for r in rows}
    graphs, graph_errors = {}, {}
    data = args.data
    cli.out_file(args.out)

    def graph(name):
        if name not in graphs and name not in graph_errors:
            try:
                graphs[name] = load_graph(name, args.device, args.quick, data,
                                          args.hiv_batches, args.hiv_molecules)
            except Exception as e:  # noqa: BLE001  (missing data, say: recorded per row)
                graph_errors[name] = kernels._first_line(e)
        return graphs.get(name)

    def save():
        for r in rows:
            r["speedup_vs_pyg_compile"] = speedups(r)
            r["target"] = target(r)
        with open(args.out, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)

    # eager methods of every case first, then the compiled ones
    steps = [(c, m) for phase in (False, True) for c in cases for m in methods
             if (m in COMPILED) == phase]
    for (name, model, H, C, dtype), method in steps:
        key = case_key(model, name, H, C, dtype)
        row = by_key.get(key)
        if row is not None and method in row["methods"]:
            continue
        gr = graph(name)
        if row is None:
            row = {"key": key, "graph": name, "model": model, "H": H, "C": C, "dtype": dtype,
                   "methods": {}}
            if gr is not None:
                row.update(kind=gr.kind, nodes=gr.num_nodes,
                           edges=int(gr.edges_for(model, args.self_loops).size(1)))
            rows.append(row)
            by_key[key] = row
        t0 = time.perf_counter()
        if gr is None:
            res = {"status": "error", "error": f"graph not loaded: {graph_errors[name]}"}
        else:
            try:
                case = Case(gr, model, H, C, dtype, args)
                row["fused_reason"] = case.fused_reason
                tol = TOLERANCE["tf32" if args.tf32 and dtype == "fp32" else dtype]
                res = run_method(case, method, timer, args.compile_backend, tol)
            except Exception as e:  # noqa: BLE001  (building the case failed: recorded)
                res = {"status": "error", "error": kernels._first_line(e)}
            case = None
        row["methods"][method] = res
        lost = not kernels.cuda_context_ok(args.device)
        if lost:
            row["cuda_context_lost"] = True
            res.setdefault("error", "left the CUDA context unusable")
            res["status"] = "error"
        elif cuda:
            torch.cuda.empty_cache()  # the next case starts from the same free memory
        save()
        print(f"# {key} {method}: {res.get('status')} ({time.perf_counter() - t0:.1f} s)",
              file=sys.stderr, flush=True)
        if lost:
            sys.stdout.flush()
            rest = [a for a in argv if a != "--resume"] + ["--resume"]
            os.execv(sys.executable, [sys.executable, "-m", "benchmarks.layers", *rest])
    save()
    print(f"# {info}")
    print(fmt_table(rows))
    bad = failures(rows)
    if bad:
        print("not measured or mismatched:\n" + bad)
    if args.plot and rows:
        try:
            plot(rows, cli.out_file(args.plot),
                 f"{info['device']}, torch {info['torch']}, {info['date']}")
        except Exception as e:  # noqa: BLE001  (the JSON is the result; the plot is optional)
            print(f"plot failed: {kernels._first_line(e)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
