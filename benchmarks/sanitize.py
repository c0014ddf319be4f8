"""Workload for the compute-sanitizer stage (``benchmarks/sanitize.sh``).

Runs every kernel family once per path on small graphs, forward and backward,
and checks each result against the float64 reference, so that a sanitizer run
covers: GT (with and without edge rows) / GAT (with and without edge terms) /
GATv2 (with and without edge rows) / AGNN (its half-precision dense tiles too)
scores; fp32, fp16 and bf16; SMMF and PMF; split rows
(a super node longer than a work item); the tensor-core forward (16-edge MMA)
and the dense-tile forward; the one- and two-launch GT backward and its
tensor-core walks (``mma_backward``) and their dense-tile form
(``dense_backward``, with and without saved weights); attention
dropout; returned attention weights; bipartite graphs; the two-rows-per-warp
fp32 forward of larger graphs; the GT layer's backward writing into the
projections' joined gradient.

Paths are forced through :func:`pyg_dfgnn.ops.plan.override`. Exits non-zero on a
wrong result. Usage, from the repository root: ``python -m benchmarks.sanitize [--quick]``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import re
import sys
from typing import Tuple

import torch
from torch_geometric.utils import scatter, softmax

import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

DEV = "cuda"
FAILURES = []
#: Under autocast a layer's error may reach this times native PyG's own error
#: there (tests/test_fuzz.py says why).
NATIVE_FACTOR = 5.0
#: ``[index, count]``: this process runs every ``count``-th case from ``index``
#: (``--shard``), so that a slow tool (racecheck) runs in parallel processes.
SHARD = [0, 1]
#: The families (a case name's first word) to run (``--only``); empty: every case.
ONLY = []
_SEEN = [0]


def _case(fn):
    """A case: counted in call order and run only in its shard (``SHARD``)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if ONLY and str(args[0]).split()[0] not in ONLY:
            return
        i = _SEEN[0]
        _SEEN[0] += 1
        if i % SHARD[1] == SHARD[0]:
            fn(*args, **kwargs)
    return run


#: Name prefixes of kernels outside pyg_dfgnn that racecheck reports hazards in:
#: cuBLAS's Hopper GEMMs (the layers' half-precision projections); docs/findings.md.
FOREIGN_KERNELS = ("nvjet_",)


def racecheck_verdict(log: str) -> Tuple[bool, str]:
    """Whether a racecheck log of this workload passes where racecheck's own exit
    status failed it: every result within tolerance (``0 failed``), no sanitizer or
    application error, and every reported hazard between accesses of
    :data:`FOREIGN_KERNELS` only. Returns ``(passes, reason)``."""
    if not re.search(r"^0 failed$", log, re.M):
        return False, "no '0 failed' line: a result failed or the run did not finish"
    if re.search(r"Internal Sanitizer Error|Traceback \(most recent call last\)", log):
        return False, "the sanitizer or the application raised an error"
    # A report is two lines, each naming a kernel (demangled, with spaces) before
    # "+0x<offset>"; a report this pattern cannot read fails the log.
    pairs = re.findall(r"Race reported between \w+ access at (.+?)\+0x[0-9a-fA-F]+.*\n"
                       r"[= ]*and \w+ access at (.+?)\+0x", log)
    count = log.count("Race reported")
    if count == 0:
        return False, "no hazard report"
    if len(pairs) != count:
        return False, f"{count - len(pairs)} of {count} hazard reports could not be read"
    kernels = sorted({k.strip() for pair in pairs for k in pair})
    ours = [k for k in kernels if not k.startswith(FOREIGN_KERNELS)]
    if ours:
        return False, f"hazards in {'; '.join(ours)}"
    return True, f"{count} hazard reports, all in {', '.join(kernels)}"


def _graph(kind: str, gen: torch.Generator):
    """``(edge_index, N_src, N_dst)`` of a small test graph."""
    if kind == "small":  # isolated rows, duplicates
        n, e = 300, 2400
        ei = torch.randint(0, n, (2, e), generator=gen)
        ei = torch.cat([ei, ei[:, :40]], 1)
        ei[1][ei[1] < 5] = 5  # rows 0-4 have no in-edge
        return ei, n, n
    if kind == "super_node":  # rows far longer than a work item
        n = 400
        ei = torch.randint(0, n, (2, 3000), generator=gen)
        hub = torch.stack([torch.randint(0, n, (2500,), generator=gen),
                           torch.full((2500,), 7)])
        return torch.cat([ei, hub], 1), n, n
    if kind == "batch":  # block-diagonal batch of small dense graphs (MMA, dense tiles)
        blocks, size = 24, 40
        eis = []
        for b in range(blocks):
            m = torch.rand(size, size, generator=gen) < 0.3
            idx = m.nonzero().t() + b * size
            eis.append(idx)
        ei = torch.cat(eis, 1)
        n = blocks * size
        return ei, n, n
    if kind == "bipartite":
        ns, nd = 350, 120
        ei = torch.stack([torch.randint(0, ns, (2000,), generator=gen),
                          torch.randint(0, nd, (2000,), generator=gen)])
        return ei, ns, nd
    if kind == "large":  # >= 2^18 edges, every row within one item: two rows per warp
        n, deg = 40000, 7
        dst = torch.arange(n).repeat_interleave(deg)
        src = torch.randint(0, n, (n * deg,), generator=gen)
        return torch.stack([src, dst]), n, n
    raise ValueError(kind)


def _rel(a, b, floor: float = 0.0) -> float:
    """``||a - b|| / max(||b||, floor)`` (``||a - b||`` where both are 0)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.shape != b.shape or not torch.isfinite(a).all():
        return float("inf")
    d = max(float(b.norm()), floor)
    return float((a - b).norm() / d) if d > 0 else float((a - b).norm())


def _check(name, got, want, tol, floor: float = 0.0):
    err = _rel(got, want, floor)
    status = "ok" if err < tol else "FAIL"
    print(f"  {name:<58} rel err {err:.2e} {status}", flush=True)
    if err >= tol:
        FAILURES.append((name, err))


def _path(bwd_launches=None, dense=None, mma_bwd=None, dense_bwd=None, save=None):
    """Forces the GT backward launches (1, 2), the dense-tile rule ("off",
    "force"), the tensor-core backward walks, their dense-tile form and whether
    it saves per-edge weights for one case; ``None`` keeps the default."""
    return ops.plan.override(bwd_launches=bwd_launches, dense_tiles=dense,
                             mma_backward=mma_bwd, dense_backward=dense_bwd,
                             save_weights=save)


def _ref_gt(lay, q, k, v, scale, g):
    q64, k64, v64 = (t.detach().double().cpu().requires_grad_() for t in (q, k, v))
    lay64 = lay.to("cpu")
    out, _ = ops.reference.dot_attention(lay64.rowptr, lay64.col, q64, k64, v64, scale, 0.0,
                                         training=False)
    out.backward(g.double().cpu())
    return out, (q64.grad, k64.grad, v64.grad)


@_case
def gt_case(name, ei, ns, nd, H, C, dtype, strategy="smmf", bwd=None, dense=None,
            dropout=0.0, attn=False, mma_bwd=None, dense_bwd=None, save=None):
    lay = GraphLayout.from_edge_index(ei.to(DEV), (ns, nd))
    q = torch.randn(nd, H, C, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(ns, H, C, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(ns, H, C, device=DEV, dtype=dtype, requires_grad=True)
    g = torch.randn(nd, H, C, device=DEV, dtype=dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    with _path(bwd, dense, mma_bwd, dense_bwd, save):
        res = ops.gt_attention(lay, q, k, v, dropout=dropout, training=dropout > 0,
                               return_attention=attn, strategy=strategy)
        out = res[0] if attn else res
        out.backward(g)
    torch.cuda.synchronize()
    if dropout > 0:  # the mask is the kernel's own: check shapes and finiteness only
        ok = all(torch.isfinite(t).all() for t in (out, q.grad, k.grad, v.grad))
        print(f"  {name:<58} finite {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            FAILURES.append((name, float("nan")))
        return
    ref, grads = _ref_gt(lay, q, k, v, 1.0 / C ** 0.5, g)
    _check(name + " out", out, ref, tol)
    for nm, got, want in zip("qkv", (q.grad, k.grad, v.grad), grads):
        _check(f"{name} d{nm}", got, want, tol)


def _check_score(name, score, lay, inputs, names, params, out, g, dropout):
    """One case of a walked score against its float64 reference (the spec's, on
    the CPU): the output and the gradient of each input; with dropout, whose mask
    the reference does not draw, only that every result is finite."""
    torch.cuda.synchronize()
    tol = 1e-4 if out.dtype == torch.float32 else 2e-2
    if dropout > 0:
        ok = all(torch.isfinite(t).all() for t in (out, *(t.grad for t in inputs)))
        print(f"  {name:<58} finite {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            FAILURES.append((name, float("nan")))
        return
    t64 = [t.detach().double().cpu().requires_grad_() for t in inputs]
    ref, _ = ops.spec.get(score).reference(lay.to("cpu"), t64, params, 0.0, False)
    ref.backward(g.double().cpu())
    _check(name + " out", out, ref, tol)
    for nm, got, want in zip(names, inputs, t64):
        _check(f"{name} d{nm}", got.grad, want.grad, tol)


@_case
def gt_edge_case(name, ei, ns, nd, H, C, dtype, dropout=0.0, chunk=None):
    """The dot_edge score (GT with per-edge rows ``e`` ``[E, H, C]``, CSR order);
    ``chunk``: edges per work item (a small one splits every row)."""
    lay = GraphLayout.from_edge_index(ei.to(DEV), (ns, nd))
    q = torch.randn(nd, H, C, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(ns, H, C, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(ns, H, C, device=DEV, dtype=dtype, requires_grad=True)
    e = torch.randn(lay.num_edges, H, C, device=DEV, dtype=dtype, requires_grad=True)
    g = torch.randn(nd, H, C, device=DEV, dtype=dtype)
    with ops.plan.override(chunk=chunk):
        out = ops.gt_attention(lay, q, k, v, edge=e, edge_order="csr", dropout=dropout,
                               training=dropout > 0)
        out.backward(g)
    _check_score(name, "dot_edge", lay, (q, k, v, e), ("q", "k", "v", "e"), (1.0 / C ** 0.5,),
                 out, g, dropout)


@_case
def gt_edge_tail_case(name, ei, ns, nd, H, C, D, dtype, dropout=0.0, chunk=None):
    """The dot_edge_tail score (GT with ``[E, D]`` tails completing every head's
    keys and values of ``C - D`` channels, CSR order); ``chunk``: edges per work
    item."""
    lay = GraphLayout.from_edge_index(ei.to(DEV), (ns, nd))
    q = torch.randn(nd, H, C, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(ns, H, C - D, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(ns, H, C - D, device=DEV, dtype=dtype, requires_grad=True)
    a = torch.randn(lay.num_edges, D, device=DEV, dtype=dtype, requires_grad=True)
    g = torch.randn(nd, H, C, device=DEV, dtype=dtype)
    with ops.plan.override(chunk=chunk):
        out = ops.gt_attention(lay, q, k, v, edge=a, edge_order="csr", dropout=dropout,
                               training=dropout > 0)
        out.backward(g)
    _check_score(name, "dot_edge_tail", lay, (q, k, v, a), ("q", "k", "v", "a"),
                 (1.0 / C ** 0.5,), out, g, dropout)


@_case
def gat_case(name, ei, ns, nd, H, C, dtype, strategy="smmf", dropout=0.0, edge=False,
             chunk=None, row_walk=None):
    """The additive score on a layout with self-loops where the graph is square;
    ``edge``: with per-edge terms ``a_edge`` ``[E, H]`` in CSR order (the
    additive_edge score); ``chunk``: edges per work item (a small one splits every
    row); ``row_walk``: the SMMF forward's walk (the plan's ``row_walk``; ``None``:
    its rule)."""
    lay = GraphLayout.from_edge_index(ei.to(DEV), (ns, nd), add_self_loops=ns == nd)
    x = torch.randn(ns, H, C, device=DEV, dtype=dtype, requires_grad=True)
    a_s = torch.randn(ns, H, device=DEV, dtype=dtype, requires_grad=True)
    a_d = torch.randn(nd, H, device=DEV, dtype=dtype, requires_grad=True)
    inputs, names = (a_d, a_s, x), ("a_dst", "a_src", "x")
    if edge:
        a_e = torch.randn(lay.num_edges, H, device=DEV, dtype=dtype, requires_grad=True)
        inputs, names = inputs + (a_e,), names + ("a_edge",)
    g = torch.randn(nd, H, C, device=DEV, dtype=dtype)
    with ops.plan.override(chunk=chunk, row_walk=row_walk):
        out = ops.gat_attention(lay, a_s, a_d, x, dropout=dropout, training=dropout > 0,
                                strategy=strategy, edge=inputs[3] if edge else None,
                                edge_order="csr")
        out.backward(g)
    _check_score(name, "additive_edge" if edge else "additive", lay, inputs, names, (0.2,),
                 out, g, dropout)


def gat_cases(prefix, G, **kw):
    """:func:`gat_case` on each small graph of ``G``: SMMF and PMF in fp32 and
    bf16, fp16 with a head size of 5, fp32 with dropout; ``kw`` to each. Without
    per-edge terms the SMMF cases run on each of the score's two walks (the
    plan's ``row_walk``)."""
    f32, f16, b16 = torch.float32, torch.float16, torch.bfloat16
    walks = [(" row", True), (" own", False)] if not kw.get("edge") else [("", None)]
    for kind in ("small", "super_node", "bipartite", "batch"):
        for strat, (tag, walk) in [("smmf", w) for w in walks] + [("pmf", ("", None))]:
            name = f"{prefix} {kind} {strat}{tag}"
            gat_case(f"{name} fp32 H2C32", *G[kind], 2, 32, f32, strat, row_walk=walk, **kw)
            gat_case(f"{name} bf16 H2C64", *G[kind], 2, 64, b16, strat, row_walk=walk, **kw)
        for tag, walk in walks:
            gat_case(f"{prefix} {kind} smmf{tag} fp16 H1C5", *G[kind], 1, 5, f16,
                     row_walk=walk, **kw)
            gat_case(f"{prefix} {kind} smmf{tag} fp32 dropout", *G[kind], 2, 16, f32,
                     dropout=0.4, row_walk=walk, **kw)


@_case
def gatv2_case(name, ei, ns, nd, H, C, dtype, strategy="smmf", dropout=0.0, bwd=None,
               edge=False, chunk=None):
    """The GATv2 score on a layout with self-loops where the graph is square;
    ``bwd``: the backward's launches; ``edge``: with per-edge rows ``e`` ``[E, H,
    C]`` in CSR order inside the LeakyReLU (the gatv2_edge score); ``chunk``:
    edges per work item (a small one splits every row)."""
    lay = GraphLayout.from_edge_index(ei.to(DEV), (ns, nd), add_self_loops=ns == nd)
    x_l = torch.randn(ns, H, C, device=DEV, dtype=dtype, requires_grad=True)
    x_r = torch.randn(nd, H, C, device=DEV, dtype=dtype, requires_grad=True)
    att = (torch.randn(H, C, device=DEV) / C ** 0.5).to(dtype).requires_grad_()
    inputs, names = (x_r, x_l, att), ("x_r", "x_l", "att")
    if edge:
        e = torch.randn(lay.num_edges, H, C, device=DEV, dtype=dtype)
        # Off the LeakyReLU's kink by 1e-3, where rounding cannot pick the other
        # branch, whose gradient differs (tests/test_cuda_gatv2_edge.py, KINK_MARGIN).
        pre = x_r[lay.csr_row.long()] + x_l[lay.col.long()] + e
        away = torch.where(pre < 0, -2e-3, 2e-3).to(dtype)
        e = torch.where(pre.abs() < 1e-3, e + away, e).detach().requires_grad_()
        inputs, names = inputs + (e,), names + ("e",)
    g = torch.randn(nd, H, C, device=DEV, dtype=dtype)
    with _path(bwd_launches=bwd), ops.plan.override(chunk=chunk):
        out = ops.gatv2_attention(lay, x_l, x_r, att, dropout=dropout, training=dropout > 0,
                                  strategy=strategy, edge=inputs[3] if edge else None,
                                  edge_order="csr")
        out.backward(g)
    _check_score(name, "gatv2_edge" if edge else "gatv2", lay, inputs, names, (0.2,), out, g,
                 dropout)


@_case
def agnn_case(name, ei, n, C, dtype, strategy="smmf"):
    lay = GraphLayout.from_edge_index(ei.to(DEV), (n, n), add_self_loops=True)
    x = torch.randn(n, C, device=DEV, dtype=dtype, requires_grad=True)
    beta = torch.tensor(1.3, device=DEV, requires_grad=True)
    g = torch.randn(n, C, device=DEV, dtype=dtype)
    out = ops.agnn_attention(lay, x, None, beta, strategy=strategy)
    out.backward(g)
    torch.cuda.synchronize()
    lay64 = lay.to("cpu")
    x64 = x.detach().double().cpu().requires_grad_()
    b64 = beta.detach().double().cpu().requires_grad_()
    ref = ops.agnn_attention(lay64, x64, None, b64)
    ref.backward(g.double().cpu())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    _check(name + " out", out, ref, tol)
    _check(name + " dx", x.grad, x64.grad, tol)
    _check(name + " dbeta", beta.grad.reshape(1), b64.grad.reshape(1), tol,
           floor=beta_terms(lay64.col.long(), lay64.csr_row.long(), x64, 1.3,
                            g.double().cpu(), n).abs().sum().item())


def beta_terms(src, dst, x, beta: float, g, num_nodes: int):
    r"""The per-edge terms :math:`d\alpha_e \cos_e` of AGNN's ``beta`` gradient
    for the loss ``(out * g).sum()``, over the edges ``src -> dst`` (self-loops
    included, as the layer adds them), in ``x``'s dtype (float64 for a reference).

    The gradient is their sum, and they cancel (per row :math:`\sum_j
    d\alpha_{ij} = 0`): in half precision the cosines are rounded, and the error
    of the sum is a fraction of the terms' magnitudes, not of the sum, which can
    lie near 0 (a super-node draw: ``dbeta`` -0.092 in float64, -0.029 fused in
    bf16 by SMMF and PMF alike, with ``sum |terms|`` hundreds of times larger).
    So ``dbeta`` is checked against ``sum |terms|`` where that is larger, here
    and in the fuzzer (``tests/test_fuzz.py``)."""
    x = x.detach()
    xn = torch.nn.functional.normalize(x, dim=-1)
    cos = (xn[src] * xn[dst]).sum(-1)
    p = softmax(beta * cos, dst, num_nodes=num_nodes)
    dp = (g[dst] * x[src]).sum(-1)
    dalpha = p * (dp - scatter(p * dp, dst, 0, dim_size=num_nodes, reduce="sum")[dst])
    return dalpha * cos


@_case
def layers_case(dtype, autocast):
    """The three fused layers, forward and backward, as a model runs them."""
    from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv
    gen = torch.Generator().manual_seed(1)
    ei, n, _ = _graph("small", gen)
    ei = ei.to(DEV)
    x = torch.randn(n, 64, device=DEV)
    for conv in (FusedTransformerConv(64, 32, heads=2), FusedGATConv(64, 32, heads=2),
                 FusedAGNNConv()):
        conv = conv.to(DEV)
        xin = x.clone().requires_grad_()
        if not autocast:
            conv = conv.to(dtype)
            xin = x.to(dtype).requires_grad_()
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            out = conv(xin, ei)
        out.float().square().sum().backward()
        torch.cuda.synchronize()
        ok = bool(torch.isfinite(out).all() and torch.isfinite(xin.grad).all())
        name = f"layer {type(conv).__name__} {dtype} autocast={autocast}"
        print(f"  {name:<58} finite {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            FAILURES.append((name, float("nan")))


def _layer_against_native(name, native, conv, ei, ns, nd, autocast, edge_dim, params,
                          path=None, grad_tol=1e-2):
    """The fused layer ``conv`` forward and backward (under bf16 autocast with
    ``autocast``; ``path``: a plan override for the call) against ``native``, the
    PyG layer whose state it takes, in float64: the output, the gradients of the
    node features (a bipartite pair where ``ns != nd``: 48 and 40 features), of
    ``edge_dim`` random features per edge where set, and of the parameters
    ``params`` (label -> name) within 1e-5 / 1e-4 in fp32, 1e-2 / ``grad_tol``
    under autocast."""
    native = native.to(DEV).double()
    conv = conv.to(DEV)
    conv.load_state_dict(native.state_dict())
    xs = [torch.randn(ns, 48, device=DEV)] + ([torch.randn(nd, 40, device=DEV)]
                                              if ns != nd else [])
    if edge_dim:
        xs.append(torch.randn(ei.size(1), edge_dim, device=DEV))
    leaves = [t.clone().requires_grad_() for t in xs]
    ei = ei.to(DEV)

    def call(layer, inputs):
        nodes = inputs[:-1] if edge_dim else inputs
        edge = inputs[-1:] if edge_dim else []
        return layer(tuple(nodes) if len(nodes) == 2 else nodes[0], ei, *edge)

    with path or contextlib.nullcontext():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = call(conv, leaves)
        g = torch.randn(out.shape, device=DEV)
        out.float().backward(g)
    torch.cuda.synchronize()
    ref_in = [t.double().requires_grad_() for t in xs]
    ref = call(native, ref_in)
    ref.backward(g.double())
    got = {"out": out.float()}
    want = {"out": ref}
    leaf_keys = [f"d{'edge_attr' if edge_dim and i == len(xs) - 1 else f'x{i}'}"
                 for i in range(len(xs))]
    for key, a, r in zip(leaf_keys, leaves, ref_in):
        got[key], want[key] = a.grad, r.grad
    for label, param in params.items():
        got[f"d{label}"] = conv.get_parameter(param).grad
        want[f"d{label}"] = native.get_parameter(param).grad
    tols = {k: (1e-2 if autocast else 1e-5) if k == "out" else (grad_tol if autocast else 1e-4)
            for k in got}
    if autocast:
        # The layer's GEMMs round to bf16 as PyG's do, and a gradient that sums
        # nearly cancelling terms keeps only that rounding noise: the bar is then
        # native PyG's own error under the same autocast (tests/test_fuzz.py's
        # NATIVE_FACTOR).
        same = copy.deepcopy(native).float()
        same.zero_grad(set_to_none=True)
        s_in = [t.clone().requires_grad_() for t in xs]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s_out = call(same, s_in)
        s_out.float().backward(g)
        base = {"out": s_out.float()}
        base.update({k: t.grad for k, t in zip(leaf_keys, s_in)})
        for label, param in params.items():
            base[f"d{label}"] = same.get_parameter(param).grad
        for k in got:
            native_err = _rel(base[k].double(), want[k])
            tols[k] = max(tols[k], NATIVE_FACTOR * native_err)
    for k in got:
        _check(f"{name} {k}", got[k], want[k], tols[k])


@_case
def gt_layer_case(name, ei, ns, nd, autocast, bwd=None, mma_bwd=None, edge_dim=None):
    """FusedTransformerConv forward and backward against native PyG in float64:
    the attention backward writes dq, dk, dv into the projections' joined
    gradient (``attention_bwd_into``); bipartite features join key and value, and
    query and skip; ``edge_dim``: with edge features (the dot_edge score)."""
    from torch_geometric.nn import TransformerConv

    from pyg_dfgnn.nn import FusedTransformerConv
    torch.manual_seed(3)
    in_ch = (48, 40) if ns != nd else 48
    native = TransformerConv(in_ch, 32, heads=2, edge_dim=edge_dim)
    conv = FusedTransformerConv(in_ch, 32, heads=2, edge_dim=edge_dim)
    params = {"W_value": "lin_value.weight"}
    if edge_dim:
        params["W_edge"] = "lin_edge.weight"
    _layer_against_native(name, native, conv, ei, ns, nd, autocast, edge_dim, params,
                          _path(bwd_launches=bwd, mma_bwd=mma_bwd))


@_case
def gat_edge_layer_case(name, ei, ns, nd, autocast, v2=False):
    """FusedGATConv (``v2``: FusedGATv2Conv) with edge features (``edge_dim=16``,
    self-loops with ``fill_value="mean"``: the additive_edge or gatv2_edge score)
    forward and backward against native PyG in float64 (bf16 gradients within
    2e-2: the attention vectors' gradients sum terms that nearly cancel)."""
    from torch_geometric.nn import GATConv, GATv2Conv

    from pyg_dfgnn.nn import FusedGATConv, FusedGATv2Conv
    torch.manual_seed(4)
    in_ch = (48, 40) if ns != nd else 48
    native_cls, fused_cls = (GATv2Conv, FusedGATv2Conv) if v2 else (GATConv, FusedGATConv)
    native = native_cls(in_ch, 32, heads=2, edge_dim=16)
    conv = fused_cls(in_ch, 32, heads=2, edge_dim=16)
    att = "att" if v2 else "att_edge"
    _layer_against_native(name, native, conv, ei, ns, nd, autocast, 16,
                          {"W_edge": "lin_edge.weight", att: att}, grad_tol=2e-2)


def _node_cases(G, gen, args) -> None:
    """The cases of the scores with per-node inputs only."""
    f32, f16, b16 = torch.float32, torch.float16, torch.bfloat16
    print("GT")
    for kind in ("small", "super_node", "bipartite"):
        for strat in ("smmf", "pmf"):
            for bwd in (1, 2):
                gt_case(f"gt {kind} {strat} fp32 H2C32 bwd{bwd}", *G[kind], 2, 32, f32, strat,
                        bwd=bwd, attn=strat == "pmf")
        gt_case(f"gt {kind} smmf fp32 H1C7 scalar", *G[kind], 1, 7, f32)
        gt_case(f"gt {kind} smmf fp32 dropout", *G[kind], 2, 16, f32, dropout=0.3)
        for dt in (f16, b16):
            gt_case(f"gt {kind} smmf {dt} H2C64", *G[kind], 2, 64, dt)
            gt_case(f"gt {kind} pmf {dt} H1C24", *G[kind], 1, 24, dt, "pmf")
    for dt in (f16, b16):
        for C in (32, 64, 128):
            gt_case(f"gt batch mma {dt} C{C}", *G["batch"], 2, C, dt, dense="off")
            gt_case(f"gt batch dense {dt} C{C}", *G["batch"], 2, C, dt, dense="force")
            gt_case(f"gt batch mma {dt} C{C} bwd2", *G["batch"], 1, C, dt, bwd=2, dense="off")
            gt_case(f"gt batch mma {dt} C{C} tc-bwd", *G["batch"], 2, C, dt, mma_bwd=True,
                    dense_bwd=False)
            gt_case(f"gt batch dense {dt} C{C} dense-bwd", *G["batch"], 2, C, dt,
                    dense="force", mma_bwd=True, dense_bwd=True)
            gt_case(f"gt batch dense {dt} C{C} dense-bwd saved", *G["batch"], 2, C, dt,
                    dense="force", mma_bwd=True, dense_bwd=True, save=True)
        for kind in ("super_node", "bipartite"):
            gt_case(f"gt {kind} {dt} H2C64 tc-bwd", *G[kind], 2, 64, dt, mma_bwd=True)
    gt_case("gt batch fp32 attn", *G["batch"], 4, 32, f32, attn=True)
    for kind in ("small", "super_node", "bipartite"):
        for bwd in (1, 2):
            for autocast in (False, True)[:1 if args.no_layers else 2]:
                gt_layer_case(f"gt layer {kind} bwd{bwd} {'bf16' if autocast else 'fp32'}",
                              *G[kind], autocast, bwd=bwd)
    if not args.no_layers:
        gt_layer_case("gt layer batch bf16 tc-bwd", *G["batch"], True, mma_bwd=True)
    print("GAT")
    gat_cases("gat", G)
    for dt in (f32, b16):  # split rows merged in the kernel, on each walk
        for tag, walk in ((" row", True), (" own", False)):
            gat_case(f"gat small smmf{tag} {dt} split rows chunk 4", *G["small"], 2, 32, dt,
                     chunk=4, row_walk=walk)
    print("GATv2")
    for kind in ("small", "super_node", "bipartite", "batch"):
        for strat in ("smmf", "pmf"):
            for bwd in (1, 2):
                gatv2_case(f"gatv2 {kind} {strat} fp32 H2C32 bwd{bwd}", *G[kind], 2, 32, f32,
                           strat, bwd=bwd)
            gatv2_case(f"gatv2 {kind} {strat} bf16 H2C64", *G[kind], 2, 64, b16, strat)
        gatv2_case(f"gatv2 {kind} smmf fp16 H1C5", *G[kind], 1, 5, f16)
        gatv2_case(f"gatv2 {kind} smmf fp32 dropout", *G[kind], 2, 16, f32, dropout=0.4)
    if not args.no_layers:
        print("layers")
        for dt in (b16, f16):
            layers_case(dt, autocast=False)
            layers_case(dt, autocast=True)
    print("AGNN")
    for kind in ("small", "super_node", "batch"):
        ei, n, _ = G[kind]
        for strat in ("smmf", "pmf"):
            for dt in (f32, b16):
                agnn_case(f"agnn {kind} {strat} {dt} C32", ei, n, 32, dt, strat)
    ei, n, _ = G["batch"]
    for dt in (f16, b16):  # half precision runs the dot kernels, the dense tiles too
        with _path(dense="force", mma_bwd=True, dense_bwd=True):
            agnn_case(f"agnn batch dense {dt} C32 dense-bwd", ei, n, 32, dt)
    if not args.quick:
        print("large")
        ei, n, _ = _graph("large", gen)
        gt_case("gt large smmf fp32 two rows/warp H1C32", ei, n, n, 1, 32, f32)
        for tag, walk in ((" row", True), (" own", False)):
            gat_case(f"gat large smmf{tag} fp32 two rows/warp H1C32", ei, n, n, 1, 32, f32,
                     row_walk=walk)
        gatv2_case("gatv2 large smmf fp32 two rows/warp H1C32", ei, n, n, 1, 32, f32)


def _edge_cases(G, args) -> None:
    """The cases of the scores with per-edge inputs (dot_edge, additive_edge,
    gatv2_edge, dot_edge_tail)."""
    f32, f16, b16 = torch.float32, torch.float16, torch.bfloat16
    # Last, so that the cases above draw the inputs they always drew (one global
    # generator): a case's tolerance holds for its inputs, not for every draw.
    print("GT with edge rows")
    for kind in ("small", "super_node", "bipartite"):
        gt_edge_case(f"gt_edge {kind} fp32 H2C32", *G[kind], 2, 32, f32)
        gt_edge_case(f"gt_edge {kind} fp32 H1C7 scalar", *G[kind], 1, 7, f32)
        gt_edge_case(f"gt_edge {kind} bf16 H2C64", *G[kind], 2, 64, b16)
        gt_edge_case(f"gt_edge {kind} fp16 H4C32", *G[kind], 4, 32, f16)
        for dt in (f32, b16):
            gt_edge_case(f"gt_edge {kind} {dt} dropout", *G[kind], 2, 32, dt, dropout=0.3)
    for dt in (f32, b16):
        gt_edge_case(f"gt_edge small {dt} split rows chunk 4", *G["small"], 2, 32, dt, chunk=4)
        gt_edge_case(f"gt_edge small {dt} split rows chunk 4 dropout", *G["small"], 2, 32, dt,
                     dropout=0.3, chunk=4)
    for kind in ("small", "bipartite"):
        for autocast in (False, True)[:1 if args.no_layers else 2]:
            gt_layer_case(f"gt layer {kind} edge_dim 16 {'bf16' if autocast else 'fp32'}",
                          *G[kind], autocast, edge_dim=16)
    print("GAT with edge terms")
    gat_cases("gat_edge", G, edge=True)
    for dt in (f32, b16):
        for strat in ("smmf", "pmf"):
            gat_case(f"gat_edge small {strat} {dt} split rows chunk 4", *G["small"], 2, 32, dt,
                     strat, edge=True, chunk=4)
    for kind in ("small", "bipartite"):
        for autocast in (False, True)[:1 if args.no_layers else 2]:
            gat_edge_layer_case(f"gat layer {kind} edge_dim 16 "
                                f"{'bf16' if autocast else 'fp32'}", *G[kind], autocast)
    print("GATv2 with edge rows")
    for kind in ("small", "super_node", "bipartite", "batch"):
        gatv2_case(f"gatv2_edge {kind} smmf fp32 H2C32", *G[kind], 2, 32, f32, edge=True)
        gatv2_case(f"gatv2_edge {kind} smmf fp32 H1C7 scalar", *G[kind], 1, 7, f32, edge=True)
        gatv2_case(f"gatv2_edge {kind} smmf bf16 H2C64", *G[kind], 2, 64, b16, edge=True)
        gatv2_case(f"gatv2_edge {kind} smmf fp16 H1C5", *G[kind], 1, 5, f16, edge=True)
        gatv2_case(f"gatv2_edge {kind} smmf fp32 dropout", *G[kind], 2, 16, f32, dropout=0.4,
                   edge=True)
    for dt in (f32, b16):
        gatv2_case(f"gatv2_edge small {dt} split rows chunk 4", *G["small"], 2, 32, dt,
                   edge=True, chunk=4)
        gatv2_case(f"gatv2_edge small {dt} split rows chunk 4 dropout", *G["small"], 2, 32, dt,
                   dropout=0.3, edge=True, chunk=4)
    for kind in ("small", "bipartite"):
        for autocast in (False, True)[:1 if args.no_layers else 2]:
            gat_edge_layer_case(f"gatv2 layer {kind} edge_dim 16 "
                                f"{'bf16' if autocast else 'fp32'}", *G[kind], autocast, v2=True)
    print("GT with edge tails")
    for kind in ("small", "super_node", "bipartite", "batch"):
        gt_edge_tail_case(f"gt_edge_tail {kind} fp32 H1C144D16", *G[kind], 1, 144, 16, f32)
        gt_edge_tail_case(f"gt_edge_tail {kind} fp32 H1C7D3 scalar", *G[kind], 1, 7, 3, f32)
        gt_edge_tail_case(f"gt_edge_tail {kind} bf16 H1C144D16", *G[kind], 1, 144, 16, b16)
        gt_edge_tail_case(f"gt_edge_tail {kind} fp16 H4C48D16", *G[kind], 4, 48, 16, f16)
        gt_edge_tail_case(f"gt_edge_tail {kind} fp32 dropout", *G[kind], 2, 48, 16, f32,
                          dropout=0.3)
    for dt in (f32, b16):
        gt_edge_tail_case(f"gt_edge_tail small {dt} split rows chunk 4", *G["small"], 2, 48, 16,
                          dt, chunk=4)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the >= 2^18-edge graph")
    ap.add_argument("--no-layers", action="store_true",
                    help="skip the whole-layer cases with half-precision GEMMs (for "
                         "initcheck: it does not see the writes of some cuBLAS "
                         "half-precision GEMMs, so every later read of the layers' "
                         "projections is reported)")
    ap.add_argument("--edge-only", action="store_true",
                    help="only the cases with per-edge inputs (a quick check of the edge "
                         "walks; their inputs then differ from a whole run's)")
    ap.add_argument("--judge-racecheck", metavar="LOG",
                    help="only judge a racecheck log of this workload (racecheck_verdict): "
                         "exit 0 where every hazard lies in cuBLAS's kernels (default: run "
                         "the cases)")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="run every N-th case from the I-th (0-based): N processes with "
                         "I = 0 .. N-1 run every case once (default: %(default)s, every case)")
    ap.add_argument("--only", default="", metavar="FAMILIES",
                    help="only the cases whose name's first word is one of these, "
                         "comma-separated, e.g. gat,gat_edge (default: every case)")
    args = ap.parse_args(argv)
    ONLY[:] = [p for p in args.only.split(",") if p]
    try:
        index, count = (int(p) for p in args.shard.split("/"))
    except ValueError:
        ap.error(f"--shard must be I/N, got {args.shard!r}")
    if not 0 <= index < count:
        ap.error(f"--shard I/N needs 0 <= I < N, got {args.shard!r}")
    SHARD[:] = [index, count]
    if args.judge_racecheck:
        with open(args.judge_racecheck, errors="replace") as f:
            passes, reason = racecheck_verdict(f.read())
        print(reason)
        return 0 if passes else 1
    if not pyg_dfgnn.has_cuda_kernels():
        print("needs a CUDA GPU and the compiled extension", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    G = {k: _graph(k, gen) for k in ("small", "super_node", "batch", "bipartite")}
    if not args.edge_only:
        _node_cases(G, gen, args)
    _edge_cases(G, args)
    print(f"{len(FAILURES)} failed")
    for name, err in FAILURES:
        print(f"FAIL {name}: {err:.3e}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
