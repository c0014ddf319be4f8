"""pyg_dfgnn.ops.reference (and the CPU path of the ops) vs independent
implementations: a Python loop over destination nodes and a dense masked softmax,
both in float64."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import isolated_dst, random_graph, rel_err
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import reference

DT = torch.float64
TOL = 1e-10


# ----------------------------------------------------------------------------- oracles
def loop_attention(edge_index, num_dst, score, value):
    r"""Edge softmax + aggregation by a Python loop over destinations.

    ``score(e)`` gives the ``[H]`` score of input edge ``e``; ``value`` is
    ``[N_src, H, C]``. Returns ``(out [N_dst, H, C], alpha [E, H])`` with ``alpha``
    in input edge order. Differentiable (plain torch ops)."""
    src, dst = edge_index.tolist()
    E = len(src)
    H, C = value.shape[1], value.shape[2]
    rows = []
    alpha = [None] * E
    for i in range(num_dst):
        es = [e for e in range(E) if dst[e] == i]
        if not es:
            rows.append(value.new_zeros(H, C))
            continue
        s = torch.stack([score(e) for e in es])  # [d, H]
        w = torch.exp(s - s.max(0).values)
        w = w / w.sum(0)
        acc = value.new_zeros(H, C)
        for e, we in zip(es, w):
            alpha[e] = we
            acc = acc + we.unsqueeze(-1) * value[src[e]]
        rows.append(acc)
    out = torch.stack(rows) if rows else value.new_zeros(0, H, C)
    alpha = torch.stack(alpha) if E else value.new_zeros(0, H)
    return out, alpha


def dense_attention(edge_index, num_src, num_dst, scores_dense, value):
    r"""Masked dense softmax. ``scores_dense`` ``[H, N_dst, N_src]``. Duplicate edges
    are handled by their multiplicity ``m_ij`` (adding ``log m_ij`` to the logits:
    each copy gets ``exp(s_ij) / Z_i``). Returns ``(out, alpha per input edge)``."""
    M = torch.zeros(num_dst, num_src, dtype=DT)
    M.index_put_((edge_index[1], edge_index[0]), torch.ones(edge_index.size(1), dtype=DT),
                 accumulate=True)
    logits = scores_dense + torch.log(M)  # -inf on non-edges
    P = torch.softmax(logits, dim=-1)
    P = torch.nan_to_num(P, nan=0.0)  # rows without in-edges
    out = torch.einsum("hij,jhc->ihc", P, value)
    alpha = (P[:, edge_index[1], edge_index[0]] / M[edge_index[1], edge_index[0]]).t()
    return out, alpha


def csr(edge_index, ns, nd):
    return GraphLayout.from_edge_index(edge_index, (ns, nd))


def ref_dot(layout, q, k, v, scale=None, **kw):
    out, a = reference.dot_attention(layout.rowptr, layout.col, q, k, v, scale, **kw)
    return out, layout.to_input_order(a)


# ----------------------------------------------------------------------------- dot product
@pytest.mark.parametrize("ns,nd,heads", [(14, 14, 1), (14, 14, 3), (11, 6, 2)])
def test_dot_vs_loop_and_dense(ns, nd, heads):
    ei = random_graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=6)
    C = 5
    q = torch.randn(nd, heads, C, dtype=DT, requires_grad=True)
    k = torch.randn(ns, heads, C, dtype=DT, requires_grad=True)
    v = torch.randn(ns, heads, C, dtype=DT, requires_grad=True)
    scale = 0.7
    lay = csr(ei, ns, nd)
    out, alpha = ref_dot(lay, q, k, v, scale)

    src, dst = ei
    o_loop, a_loop = loop_attention(ei, nd, lambda e: (q[dst[e]] * k[src[e]]).sum(-1) * scale, v)
    assert rel_err(out, o_loop) < TOL
    assert rel_err(alpha, a_loop) < TOL

    S = torch.einsum("ihc,jhc->hij", q, k) * scale
    o_dense, a_dense = dense_attention(ei, ns, nd, S, v)
    assert rel_err(out, o_dense) < TOL
    assert rel_err(alpha, a_dense) < TOL

    # gradients of the reference (autograd through segment ops) vs the loop
    w = torch.randn_like(out)
    g_ref = torch.autograd.grad((out * w).sum(), (q, k, v))
    g_loop = torch.autograd.grad((o_loop * w).sum(), (q, k, v))
    for a, b in zip(g_ref, g_loop):
        assert rel_err(a, b) < 1e-9


def test_gt_attention_op_default_scale_and_input_order():
    ns = nd = 13
    ei = random_graph(ns, num_edges=45, num_duplicates=4)
    H, C = 2, 9
    q, k, v = (torch.randn(n, H, C, dtype=DT) for n in (nd, ns, ns))
    lay = csr(ei, ns, nd)
    out, alpha = ops.gt_attention(lay, q, k, v, return_attention=True)
    src, dst = ei
    o_loop, a_loop = loop_attention(
        ei, nd, lambda e: (q[dst[e]] * k[src[e]]).sum(-1) / math.sqrt(C), v)
    assert rel_err(out, o_loop) < TOL
    assert alpha.shape == (ei.size(1), H)
    assert rel_err(alpha, a_loop) < TOL  # alpha comes back in the input edge order
    assert torch.equal(ops.gt_attention(lay, q, k, v), out)


# ----------------------------------------------------------------------------- cosine
@pytest.mark.parametrize("three_d", [False, True])
def test_cosine_vs_loop(three_d):
    n = 12
    ei = random_graph(n, num_edges=40, num_duplicates=3)
    shape = (n, 2, 6) if three_d else (n, 6)
    x = torch.randn(*shape, dtype=DT, requires_grad=True)
    beta = torch.tensor([1.9], dtype=DT, requires_grad=True)
    lay = csr(ei, n, n)
    out, alpha = reference.cosine_attention(lay.rowptr, lay.col, x, x, beta)
    alpha = lay.to_input_order(alpha)

    x3 = x if three_d else x.unsqueeze(1)
    xn = x3 / x3.norm(dim=-1, keepdim=True)
    src, dst = ei
    o_loop, a_loop = loop_attention(ei, n, lambda e: beta * (xn[dst[e]] * xn[src[e]]).sum(-1), x3)
    o_loop = o_loop if three_d else o_loop.squeeze(1)
    assert out.shape == x.shape
    assert rel_err(out, o_loop) < TOL
    assert rel_err(alpha, a_loop) < TOL

    # the op (beta folded into the queries) gives the same values and gradients
    out_op, alpha_op = ops.agnn_attention(lay, x, None, beta, return_attention=True)
    assert rel_err(out_op, o_loop) < TOL
    assert rel_err(alpha_op, a_loop) < TOL
    w = torch.randn_like(out)
    g_op = torch.autograd.grad((out_op * w).sum(), (x, beta))
    g_loop = torch.autograd.grad((o_loop * w).sum(), (x, beta))
    for a, b in zip(g_op, g_loop):
        assert rel_err(a, b) < 1e-9
    assert g_op[1].abs().item() > 0  # beta really receives a gradient


def test_cosine_bipartite_op():
    ns, nd = 10, 6
    ei = random_graph(ns, nd, num_edges=30)
    xs = torch.randn(ns, 4, dtype=DT)
    xd = torch.randn(nd, 4, dtype=DT)
    beta = 0.8
    lay = csr(ei, ns, nd)
    out = ops.agnn_attention(lay, xs, xd, beta)
    xsn, xdn = F.normalize(xs, dim=-1), F.normalize(xd, dim=-1)
    src, dst = ei
    o_loop, _ = loop_attention(ei, nd, lambda e: beta * (xdn[dst[e]] * xsn[src[e]]).sum(-1,
                                                                                      keepdim=True),
                               xs.unsqueeze(1))
    assert out.shape == (nd, 4)
    assert rel_err(out, o_loop.squeeze(1)) < TOL


# ----------------------------------------------------------------------------- additive
@pytest.mark.parametrize("ns,nd,heads", [(13, 13, 1), (13, 13, 4), (9, 5, 2)])
def test_additive_vs_loop_and_dense(ns, nd, heads):
    ei = random_graph(ns, nd, num_edges=40, num_duplicates=5)
    C = 3
    a_src = torch.randn(ns, heads, dtype=DT, requires_grad=True)
    a_dst = torch.randn(nd, heads, dtype=DT, requires_grad=True)
    x = torch.randn(ns, heads, C, dtype=DT, requires_grad=True)
    slope = 0.2
    lay = csr(ei, ns, nd)
    out, alpha = reference.additive_attention(lay.rowptr, lay.col, a_dst, a_src, x, slope)
    alpha = lay.to_input_order(alpha)
    src, dst = ei
    o_loop, a_loop = loop_attention(
        ei, nd, lambda e: F.leaky_relu(a_dst[dst[e]] + a_src[src[e]], slope), x)
    assert rel_err(out, o_loop) < TOL
    assert rel_err(alpha, a_loop) < TOL

    S = F.leaky_relu(a_dst.t().unsqueeze(-1) + a_src.t().unsqueeze(1), slope)  # [H, nd, ns]
    o_dense, a_dense = dense_attention(ei, ns, nd, S, x)
    assert rel_err(out, o_dense) < TOL
    assert rel_err(alpha, a_dense) < TOL

    out_op, alpha_op = ops.gat_attention(lay, a_src, a_dst, x, slope, return_attention=True)
    assert rel_err(out_op, o_loop) < TOL and rel_err(alpha_op, a_loop) < TOL
    w = torch.randn_like(out)
    g_op = torch.autograd.grad((out_op * w).sum(), (a_src, a_dst, x))
    g_loop = torch.autograd.grad((o_loop * w).sum(), (a_src, a_dst, x))
    for a, b in zip(g_op, g_loop):
        assert rel_err(a, b) < 1e-9


# ----------------------------------------------------------------------------- properties
def _each_score(lay, n_src, n_dst, H=2, C=4):
    q = torch.randn(n_dst, H, C, dtype=DT)
    k = torch.randn(n_src, H, C, dtype=DT)
    v = torch.randn(n_src, H, C, dtype=DT)
    a_s, a_d = torch.randn(n_src, H, dtype=DT), torch.randn(n_dst, H, dtype=DT)
    r, c = lay.rowptr, lay.col
    e = torch.randn(lay.num_edges, H, C, dtype=DT)  # per-edge rows, CSR order
    return {
        "dot": reference.dot_attention(r, c, q, k, v),
        "dot_edge": reference.dot_attention(r, c, q, k, v, edge=e),
        "cosine": reference.cosine_attention(r, c, q, k, torch.tensor(1.3, dtype=DT)),
        "additive": reference.additive_attention(r, c, a_d, a_s, v, 0.2),
        "additive_edge": reference.additive_attention(r, c, a_d, a_s, v, 0.2, edge=e[..., 0]),
    }


def test_isolated_nodes_get_zeros():
    ns = nd = 16
    ei = random_graph(ns, num_edges=40, num_isolated=5)
    iso = isolated_dst(ei, nd)
    assert iso.numel() == 5
    lay = csr(ei, ns, nd)
    for name, (out, _) in _each_score(lay, ns, nd).items():
        assert torch.isfinite(out).all(), name
        assert torch.equal(out[iso], torch.zeros_like(out[iso])), name
        keep = torch.ones(nd, dtype=torch.bool)
        keep[iso] = False
        assert (out[keep].abs().flatten(1).sum(-1) > 0).all(), name


def test_graph_without_edges():
    lay = csr(torch.empty(2, 0, dtype=torch.long), 4, 3)
    for name, (out, alpha) in _each_score(lay, 4, 3).items():
        assert alpha.shape == (0, 2), name
        assert torch.equal(out, torch.zeros_like(out)) and out.shape[0] == 3, name


def test_graph_without_edges_backward():
    """Zero outputs that still belong to the autograd graph: backward runs and
    gives zero gradients (a fresh zeros tensor would make backward() raise)."""
    lay = csr(torch.empty(2, 0, dtype=torch.long), 4, 3)
    q = torch.randn(3, 2, 4, dtype=DT, requires_grad=True)
    k = torch.randn(4, 2, 4, dtype=DT, requires_grad=True)
    v = torch.randn(4, 2, 4, dtype=DT, requires_grad=True)
    out, _ = reference.dot_attention(lay.rowptr, lay.col, q, k, v)
    assert out.requires_grad
    out.sum().backward()
    assert torch.equal(v.grad, torch.zeros_like(v))


def test_attention_rows_sum_to_one():
    ns, nd = 15, 12
    ei = random_graph(ns, nd, num_edges=60, num_isolated=3, num_duplicates=5)
    lay = csr(ei, ns, nd)
    deg = torch.bincount(ei[1], minlength=nd)
    for name, (_, alpha) in _each_score(lay, ns, nd).items():
        a = lay.to_input_order(alpha)
        assert (a >= 0).all(), name
        sums = torch.zeros(nd, a.size(1), dtype=DT).index_add_(0, ei[1], a)
        assert torch.allclose(sums[deg > 0], torch.ones_like(sums[deg > 0]), atol=1e-12), name
        assert torch.equal(sums[deg == 0], torch.zeros_like(sums[deg == 0])), name


# ----------------------------------------------------------------------------- dropout
def _one_edge_per_dst(n):
    """Each destination has exactly one in-edge: its weight is 1, so the output
    shows the dropout mask directly (0 or 1 / (1 - p))."""
    src = torch.randint(0, n, (n,))
    return torch.stack([src, torch.arange(n)])


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_keeps_expected_fraction(p):
    n, H = 20000, 2
    ei = _one_edge_per_dst(n)
    lay = csr(ei, n, n)
    q = torch.randn(n, H, 1)
    k = torch.randn(n, H, 1)
    v = torch.ones(n, H, 1)
    outs = {
        "reference": reference.dot_attention(lay.rowptr, lay.col, q, k, v, None, p,
                                             training=True)[0],
        "gt_attention": ops.gt_attention(lay, q, k, v, dropout=p, training=True),
        "gat_attention": ops.gat_attention(lay, torch.randn(n, H), torch.randn(n, H), v,
                                           dropout=p, training=True),
    }
    std = math.sqrt(p * (1 - p) / (n * H))
    for name, out in outs.items():
        vals = out.flatten()
        kept = vals != 0
        assert torch.allclose(vals[kept], torch.full_like(vals[kept], 1 / (1 - p))), name
        frac = kept.double().mean().item()
        assert abs(frac - (1 - p)) < 6 * std, (name, frac)


def test_dropout_eval_mode_is_deterministic():
    ei = random_graph(30, num_edges=150)
    lay = csr(ei, 30, 30)
    q, k, v = (torch.randn(30, 2, 4) for _ in range(3))
    base = ops.gt_attention(lay, q, k, v)
    for _ in range(2):
        assert torch.equal(ops.gt_attention(lay, q, k, v, dropout=0.5, training=False), base)
        assert torch.equal(reference.dot_attention(lay.rowptr, lay.col, q, k, v, None, 0.5,
                                                   training=False)[0], base)
    a_s, a_d = torch.randn(30, 2), torch.randn(30, 2)
    g = ops.gat_attention(lay, a_s, a_d, v)
    assert torch.equal(ops.gat_attention(lay, a_s, a_d, v, dropout=0.5, training=False), g)
    # in training mode the result changes
    assert not torch.equal(ops.gt_attention(lay, q, k, v, dropout=0.5, training=True), base)


def test_returned_attention_is_pre_dropout():
    ei = random_graph(20, num_edges=80)
    lay = csr(ei, 20, 20)
    q, k, v = (torch.randn(20, 2, 4) for _ in range(3))
    _, a_eval = ops.gt_attention(lay, q, k, v, return_attention=True)
    _, a_train = ops.gt_attention(lay, q, k, v, dropout=0.5, training=True,
                                  return_attention=True)
    assert torch.allclose(a_train, a_eval)


# ----------------------------------------------------------------------------- op checks
def test_op_input_errors():
    ei = random_graph(10, num_edges=30)
    lay = csr(ei, 10, 10)
    q, k, v = (torch.randn(10, 2, 4) for _ in range(3))
    with pytest.raises(ValueError, match="destination"):
        ops.gt_attention(lay, q[:9], k, v)
    with pytest.raises(ValueError, match="source"):
        ops.gt_attention(lay, q, k[:9], v)
    with pytest.raises(ValueError, match=r"\[N, H, C\]"):
        ops.gt_attention(lay, q.flatten(1), k, v)
    with pytest.raises(ValueError, match="dropout"):
        ops.gt_attention(lay, q, k, v, dropout=1.0)
    with pytest.raises(ValueError, match="strategy"):
        ops.gt_attention(lay, q, k, v, strategy="fast")
    with pytest.raises(ValueError, match="score"):
        ops.fused_attention(lay, score="sigmoid")
