"""GPU tests of the dot_edge kernels (``cuda/scores/dot_edge.cu``: the dot-product
score with per-edge rows, ``TransformerConv`` with ``edge_dim``) against the
float64 reference, as ``test_cuda_gt.py`` checks the dot score: fresh random
inputs, the allocator poisoned with NaN (an unwritten output shows), relative
error ||got - ref|| / ||ref|| < 1e-5 (outputs, attention weights) and < 1e-4
(gradients, the edge rows' included) in fp32, < 1e-2 in fp16 / bf16; split rows
(a super node, and a tiny chunk), the kernels' dropout mask recomputed on the
host, determinism, and the layer against native ``TransformerConv``. The tests
of the edge inputs' order and of the peak memory run the ``additive_edge`` and
``gatv2_edge`` scores too."""
import math

import pytest
import torch
from torch_geometric.nn import TransformerConv
from torch_geometric.utils import to_torch_csr_tensor

from conftest import layer_grad_floor, rel_err_floor
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedTransformerConv
from pyg_dfgnn.ops import calls, plan, reference
from test_cuda_gt import (DEV, GRAPHS, _kernel_names, assert_matches_ref, dropout_keep,
                          opcheck_plan_op, poison, rel_err)
from test_edge_inputs import ADJ, EDGE_SCORES, _adjacency, _transformer_edge_score

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)


def make(graph, H, C, dtype, requires_grad=True):
    """``(layout, [q, k, v, e])``: ``e`` ``[E, H, C]`` in the input edge order."""
    ei, ns, nd = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    shapes = [(nd, H, C), (ns, H, C), (ns, H, C), (lay.num_edges, H, C)]
    return lay, [torch.randn(s, device=DEV).to(dtype).requires_grad_(requires_grad)
                 for s in shapes]


def ref64(lay, q, k, v, e, g=None, scale=None, keep=None, p=0.0):
    """``(out, alpha in CSR order, [dq, dk, dv, de] or None)`` in float64, ``e``
    in the input edge order; ``keep``: a dropout mask ``[E, H]`` by CSR
    position, applied as ``alpha * keep / (1 - p)``."""
    t = [u.detach().double().requires_grad_(g is not None) for u in (q, k, v, e)]
    e_csr = lay.to_csr_order(t[3])
    if keep is None:
        out, alpha = reference.dot_attention(lay.rowptr, lay.col, *t[:3], scale, edge=e_csr)
    else:
        scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
        dst = reference.csr_dst(lay.rowptr, lay.num_edges)
        s = (t[0][dst] * (t[1][lay.col.long()] + e_csr)).sum(-1) * scale
        alpha = reference.edge_softmax(s, lay.rowptr)
        out = reference.aggregate(lay.rowptr, lay.col, alpha * keep / (1 - p), t[2], e_csr)
    if g is None:
        return out, alpha, None
    out.backward(g.double())
    return out, alpha, [u.grad for u in t]


def call(lay, q, k, v, e, **kw):
    """gt_attention with the edge rows; checks that the kernels ran it."""
    with ops.recording() as records:
        res = ops.gt_attention(lay, q, k, v, edge=e, **kw)
    assert [r.score for r in records] == ["dot_edge"] and records[0].plan is not None
    return res


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("H,C", [(1, 16), (4, 16), (1, 32), (4, 32), (1, 64), (4, 64),
                                 (1, 128), (4, 128), (2, 100), (1, 7)])
def test_forward_backward_fp32(graph, H, C):
    lay, (q, k, v, e) = make(graph, H, C, torch.float32)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    out, alpha = call(lay, q, k, v, e, return_attention=True)
    poison()
    out.backward(g)
    ref, ref_alpha, (dq, dk, dv, de) = ref64(lay, q, k, v, e, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha,
                       ((q.grad, dq), (k.grad, dk), (v.grad, dv), (e.grad, de)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_split_rows_with_a_tiny_chunk(dtype, dropout, plan_override, monkeypatch):
    """Every row of the small graph split into work items of 4 edges, merged in
    the kernels (fp32) or in merge launches (bf16), with and without dropout."""
    plan_override(chunk=4)
    seed = 123456789
    monkeypatch.setattr(calls, "seed", lambda: seed)
    lay, (q, k, v, e) = make("small", 2, 32, dtype)
    assert lay.work("row", 4).num_slots > 0
    g = torch.randn(lay.num_dst, 2, 32, device=DEV, dtype=dtype)
    poison()
    out = call(lay, q, k, v, e, dropout=dropout, training=True)
    poison()
    out.backward(g)
    keep = dropout_keep(seed, lay.num_edges, 2, dropout).to(DEV) if dropout else None
    ref, _, grads = ref64(lay, q, k, v, e, g, keep=keep, p=dropout)
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 1e-2)
    assert rel_err(out, ref) < tol[0]
    for got, want in zip((q.grad, k.grad, v.grad, e.grad), grads):
        assert rel_err(got, want) < tol[1]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("graph", ["small", "super_node", "bipartite"])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32), (4, 64), (1, 16), (2, 24)])
def test_half_precision(graph, dtype, H, C):
    lay, (q, k, v, e) = make(graph, H, C, dtype)
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    out = call(lay, q, k, v, e)
    poison()
    out.backward(g)
    assert out.dtype == dtype and e.grad.dtype == dtype and e.grad.shape == e.shape
    ref, _, grads = ref64(lay, q, k, v, e, g)
    assert rel_err(out, ref) < 1e-2
    isolated = lay.in_degree() == 0
    assert isolated.any() and (out[isolated] == 0).all()
    for got, want in zip((q.grad, k.grad, v.grad, e.grad), grads):
        assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("graph", ["small", "super_node"])
def test_dropout_is_the_kernels_mask_forward_and_backward(graph, dtype, monkeypatch):
    """The mask of the dot score (a counter per CSR position and head, from the
    call's seed; dropout_keep recomputes it): the output and every gradient
    match the float64 reference with that mask, and the attention weights are
    the softmax before it."""
    seed, p = 987654321987, 0.3
    monkeypatch.setattr(calls, "seed", lambda: seed)
    lay, (q, k, v, e) = make(graph, 2, 32, dtype)
    g = torch.randn(lay.num_dst, 2, 32, device=DEV, dtype=dtype)
    poison()
    out, alpha = call(lay, q, k, v, e, dropout=p, training=True, return_attention=True)
    poison()
    out.backward(g)
    keep = dropout_keep(seed, lay.num_edges, 2, p).to(DEV)
    assert 0.25 < 1 - keep.double().mean().item() < 0.35
    ref, ref_alpha, grads = ref64(lay, q, k, v, e, g, keep=keep, p=p)
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 1e-2)
    assert rel_err(out, ref) < tol[0]
    assert rel_err(alpha, lay.to_input_order(ref_alpha)) < tol[0]
    for got, want in zip((q.grad, k.grad, v.grad, e.grad), grads):
        assert rel_err(got, want) < tol[1]
    assert rel_err(out, ref64(lay, q, k, v, e)[0]) > 1e-2  # the mask did apply
    assert rel_err(call(lay, q, k, v, e, dropout=p, training=False), ref64(lay, q, k, v, e)[0]) \
        < tol[0]


@pytest.mark.parametrize("score", ["dot_edge", "dot_edge_tail", "gatv2_edge"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic(score, dtype, dropout):
    """Bitwise the same output and gradients twice with split rows (the super
    node), and with dropout from the same seed (torch.manual_seed); the scores
    without a PMF path (additive_edge's, SMMF and PMF: test_cuda_gat_edge.py)."""
    sc = EDGE_SCORES[score]
    ei, ns, nd = GRAPHS["super_node"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    *nodes, e = leaves = sc.make(ns, nd, lay.num_edges, 4, 32, dtype, DEV)

    def run():
        with ops.recording() as records:
            out = sc.call(lay, nodes, e, dropout=dropout, training=True)
        assert [r.score for r in records] == [score] and records[0].plan is not None
        return out

    assert_deterministic(run, leaves, torch.randn(nd, 4, 32, device=DEV, dtype=dtype))


def assert_deterministic(run, leaves, g):
    """``run()`` and its backward of ``g`` give bitwise the same output and
    gradients of ``leaves`` twice, torch's generator seeded alike before each."""
    runs = []
    for _ in range(2):
        for t in leaves:
            t.grad = None
        torch.manual_seed(77)
        out = run()
        out.backward(g)
        runs.append([out.detach().clone()] + [t.grad.clone() for t in leaves])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_plan_runs_what_the_score_has(plan_override):
    """SMMF on CUDA cores with the two-launch backward; what the score lacks
    raises before a launch (ValueError from the plan)."""
    lay, (q, k, v, e) = make("small", 2, 64, torch.bfloat16)
    with ops.recording() as records:
        ops.gt_attention(lay, q, k, v, edge=e)
    p = records[0].plan
    assert (p.method, p.mma, p.two_rows, p.bwd_one_launch, p.mma_backward) == \
        ("smmf", False, False, False, False) and p.dense_cells == 0
    with pytest.raises(ValueError, match="no PMF path"):
        ops.gt_attention(lay, q, k, v, edge=e, strategy="pmf")
    for field in (dict(bwd_launches=1), dict(mma=True), dict(mma_backward=True)):
        with plan.override(**field), pytest.raises(ValueError):
            ops.gt_attention(lay, q, k, v, edge=e)
    names = " ".join(_kernel_names(lambda: ops.gt_attention(lay, q, k, v, edge=e)))
    assert "gt_fwd_mma_kernel" not in names and "gt_fwd_dense_kernel" not in names


@pytest.mark.parametrize("score", list(EDGE_SCORES))
def test_csr_order_rows_skip_the_gather_and_match(score):
    """Every edge score (dot_edge, additive_edge, gatv2_edge): the edge inputs in
    input order and gathered into CSR order give bitwise the same results."""
    sc = EDGE_SCORES[score]
    ei, ns, nd = GRAPHS["bipartite"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    *nodes, e = sc.make(ns, nd, lay.num_edges, 2, 32, torch.float32, DEV)
    e_csr = lay.to_csr_order(e.detach()).requires_grad_()
    with ops.recording() as records:
        a = sc.call(lay, nodes, e)
        b = sc.call(lay, nodes, e_csr, edge_order="csr")
    assert [r.score for r in records] == [score] * 2 and records[0].plan is not None
    assert torch.equal(a, b)
    g = torch.randn_like(a)
    ge, = torch.autograd.grad(a, e, g)
    ge_csr, = torch.autograd.grad(b, e_csr, g)
    assert torch.equal(lay.to_csr_order(ge), ge_csr)


@pytest.mark.parametrize("score,bound", [("dot_edge", 1.5), ("dot_edge_tail", 1.0),
                                         ("additive_edge", 0.25),
                                         ("gatv2_edge", 1.5)])
def test_memory_holds_no_edge_messages(score, bound):
    """Peak memory of a forward + backward beyond its inputs, in E x H x C fp32
    tensors: dot_edge and gatv2_edge hold the edge rows' gradient (one, the size
    of the input rows) and small things, additive_edge the [E, H] terms'
    gradient, far below one; PyG holds several (and its edge projection one
    more)."""
    n, E, H, C = 20_000, 1_000_000, 4, 64
    ei = torch.randint(0, n, (2, E), device=DEV)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    sc = EDGE_SCORES[score]
    *nodes, e = sc.make(n, n, E, H, C, torch.float32, DEV)  # CSR order: no gather copy
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    sc.call(lay, nodes, e, edge_order="csr").sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < bound * E * H * C * 4, peak


def test_opcheck():
    lay, (q, k, v, e) = make("small", 2, 16, torch.float32, requires_grad=False)
    lay.colptr  # noqa: B018
    e_csr = lay.to_csr_order(e)
    for need_attn in (False, True):
        args = ops.op_args("dot_edge", lay, [q, k, v, e_csr], (0.25,), need_attn=need_attn)
        opcheck_plan_op(torch.ops.dfgnn.attention_fwd.default, args)


@pytest.mark.parametrize("case", ["rows", "dtype"])
def test_op_rejects_bad_edge_rows(case):
    """The C++ op checks the edge rows it is handed directly (the Python op's
    ValueErrors are tested on the CPU)."""
    lay, (q, k, v, e) = make("small", 2, 32, torch.float32, requires_grad=False)
    args = list(ops.op_args("dot_edge", lay, [q, k, v, lay.to_csr_order(e)], (0.2,),
                            need_grad=False))
    bad = e[1:] if case == "rows" else e.half()
    with pytest.raises(RuntimeError):
        torch.ops.dfgnn.attention_fwd(*([[q, k, v, bad]] + args[1:]))
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------ the layer
def _layer_inputs(config, self_loops: int = 0):
    """``(edge_index, N_src, N_dst, x, edge_attr)`` of a layer test: duplicate
    edges, the last quarter of the destinations without in-edges and
    ``self_loops`` self-loops."""
    ns, nd = (300, 200) if config == "bipartite" else (300, 300)
    ei = torch.stack([torch.randint(0, ns, (3000,)), torch.randint(0, nd * 3 // 4, (3000,))])
    loops = torch.arange(0, 3 * self_loops, 3).repeat(2, 1)
    ei = torch.cat([ei, ei[:, ::7], loops], 1)
    x = ((torch.randn(ns, 16), torch.randn(nd, 12)) if config == "bipartite"
         else torch.randn(ns, 16))
    ea = torch.randn(ei.size(1), 16)
    return ei.to(DEV), ns, nd, x, ea.to(DEV)


LAYER_CONFIGS = {
    "plain": dict(heads=4),
    "one_head": dict(heads=1),
    "bipartite": dict(heads=4),
    "concat_off_beta": dict(heads=2, concat=False, beta=True),
    "no_root": dict(heads=2, root_weight=False),
    "alpha": dict(heads=4),
    "csr_values": dict(heads=2),
}


def _layer_run(layer, x, adj, ea, dtype, autocast, **call_kw):
    """One layer call on fresh leaves in ``dtype``: ``(out, alpha in the
    adjacency's edge order or None, gradients of (out * w).sum())`` (leaves:
    node features, the edge features, then the parameters). ``autocast``: False,
    True (bf16) or the autocast dtype. ``adj``: the adjacency, ``(edge_index,
    N_dst, N_src)`` with ``values=True`` (the features as a torch.sparse CSR
    matrix's values), or a function of the edge-feature leaf giving
    ``(adjacency, edge_attr)``."""
    xs = [t.to(DEV, dtype).requires_grad_() for t in (x if isinstance(x, tuple) else (x,))]
    ea = ea.to(dtype).requires_grad_()
    edge_attr = ea
    if call_kw.pop("values", False):
        ei, nd, ns = adj
        adj, edge_attr = to_torch_csr_tensor(ei.flip(0), ea, size=(nd, ns)), None
    elif callable(adj):
        adj, edge_attr = adj(ea)
    amp = torch.bfloat16 if autocast is True else autocast or None
    with torch.autocast("cuda", dtype=amp or torch.bfloat16, enabled=amp is not None):
        res = layer(xs[0] if len(xs) == 1 else tuple(xs), adj, edge_attr, **call_kw)
    out, alpha = (res[0], res[1]) if call_kw else (res, None)
    if alpha is not None:  # PyG returns a SparseTensor's weights as its values
        alpha = alpha[1] if isinstance(alpha, tuple) else alpha.storage.value()
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEV, out.dtype)
    leaves = xs + [ea] + list(layer.parameters())
    grads = torch.autograd.grad((out * w).sum(), leaves, allow_unused=True)
    return out, alpha, grads


def _assert_layer_parity(native, fused, x, adj, ea, amp=None, call_kw=None, plan_check=None):
    """``fused`` (fp32 parameters, CUDA) made one fused op call, on the kernels
    (with a plan ``plan_check`` accepts), and matches ``native``'s float64 call
    (:func:`_layer_run`'s ``adj`` and ``call_kw``): fp32 within 1e-5 (outputs,
    weights) and 1e-4 (every gradient); under ``amp`` autocast within 1e-2, or
    1.5x native PyG's own error under the same autocast where that is larger
    (weight gradients summed over every edge). Returns the call's record."""
    call_kw = call_kw or {}
    with ops.recording() as records:
        got = _layer_run(fused, x, adj, ea, torch.float32, amp, **dict(call_kw))
    assert len(records) == 1 and records[0].plan is not None, records
    if plan_check is not None:
        assert plan_check(records[0].plan), records[0].plan
    base = None
    if amp is not None:
        base = _layer_run(native, x, adj, ea, torch.float32, amp, **dict(call_kw))
    want = _layer_run(native.double(), x, adj, ea.double(), torch.float64, False,
                      **dict(call_kw))
    native.float()
    out_tol, grad_tol = (1e-2, 1e-2) if amp is not None else (1e-5, 1e-4)
    floor = layer_grad_floor(want[2])

    def tol(t, a_base, b, grad=False):
        if base is None:
            return t
        return max(t, 1.5 * (rel_err_floor(a_base, b, floor) if grad else rel_err(a_base, b)))

    assert got[0].dtype == (amp or torch.float32)
    assert rel_err(got[0], want[0]) < tol(out_tol, base and base[0], want[0])
    if want[1] is not None:
        assert rel_err(got[1], want[1]) < tol(out_tol, base and base[1], want[1])
    for k, (a, b) in enumerate(zip(got[2], want[2])):
        assert (a is None) == (b is None), k
        if b is not None:
            t = tol(grad_tol, base and base[2][k], b, grad=True)
            assert rel_err_floor(a, b, floor) < t, (k, t)
    return records[0]


@pytest.mark.parametrize("tails", [True, False], ids=["tails", "rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", list(LAYER_CONFIGS))
def test_layer_matches_native(config, dtype, tails):
    """The fused layer against native TransformerConv in float64 (same weights),
    the features as tails (widened projections) or as [E, H, C] rows:
    fp32 within 1e-5 (outputs, attention weights) and 1e-4 (gradients of x, the
    edge features and every parameter); bf16 under autocast within 1e-2 of
    float64, or within 1.5x native PyG's own bf16 error where that is larger
    (weight gradients summed over every edge)."""
    ei, ns, nd, x, ea = _layer_inputs(config)
    in_ch = (16, 12) if config == "bipartite" else 16
    native = TransformerConv(in_ch, 32, edge_dim=16, **LAYER_CONFIGS[config]).to(DEV)
    fused = FusedTransformerConv(in_ch, 32, edge_dim=16, edge_tails=tails,
                                 **LAYER_CONFIGS[config]).to(DEV)
    fused.load_state_dict(native.state_dict())
    kw = {"return_attention_weights": True} if config == "alpha" else {}
    adj = ei
    if config == "csr_values":
        adj, kw = (ei, nd, ns), {"values": True}
    amp = torch.bfloat16 if dtype == torch.bfloat16 else None
    rec = _assert_layer_parity(native, fused, x, adj, ea, amp=amp, call_kw=kw)
    score = _transformer_edge_score(fused, 16)
    assert score == ("dot_edge_tail" if tails else "dot_edge") and rec.score == score


def check_compiled_layer(conv):
    """``conv`` (32 features in, 8 per edge) compiled with fullgraph over a
    cached layout (the small graph) against its eager calls: the compiled entry
    op with the kernels."""
    torch.manual_seed(8)
    ei, n, _ = GRAPHS["small"]()
    conv = conv.to(DEV)
    x = torch.randn(n, 32, device=DEV, requires_grad=True)
    ea = torch.randn(ei.size(1), 8, device=DEV, requires_grad=True)
    want = conv(x, ei, ea)  # eager first: builds and caches the layout on ei
    model = torch.compile(conv, fullgraph=True)
    y = model(x, ei, ea)
    assert rel_err(y, want) < 1e-5
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, ea), g)
    exp = torch.autograd.grad(want, (x, ea), g)
    for a, b in zip(got, exp):
        assert rel_err(a, b) < 1e-4


def test_compiled_layer_with_edge_features():
    check_compiled_layer(FusedTransformerConv(32, 16, heads=2, edge_dim=8))


# ------------------------------------------ the layer: adjacency types, plans, precision
ADJ_CASES = [(kind, values) for kind in ADJ for values in (False, True)
             if not (values and kind in ("coo", "edge_index"))]


@pytest.mark.parametrize("tails", [True, False], ids=["tails", "rows"])
@pytest.mark.parametrize("kind,from_values", ADJ_CASES)
def test_layer_adjacency_types_match_native(kind, from_values, tails):
    """Every adjacency type PyG's ``TransformerConv`` takes on CUDA, the edge
    features as ``edge_attr`` (in the adjacency's edge order) or as the sparse
    matrix's values, with the attention weights returned as PyG returns them;
    on a graph with duplicates and isolated destinations."""
    ei, ns, nd, x, ea = _layer_inputs("plain")
    native = TransformerConv(16, 32, heads=2, edge_dim=16).to(DEV)
    fused = FusedTransformerConv(16, 32, heads=2, edge_dim=16, edge_tails=tails).to(DEV)
    fused.load_state_dict(native.state_dict())
    rec = _assert_layer_parity(native, fused, x,
                               lambda e: _adjacency(kind, ei, ns, nd, e, from_values), ea,
                               call_kw={"return_attention_weights": True})
    assert rec.score == _transformer_edge_score(fused, 16)


# Plan overrides of the layer's call: split rows (merged in the kernels in fp32,
# in merge launches in fp16 / bf16), another work-item order, PMF asked for (the
# edge scores have no PMF walk: SMMF runs).
LAYER_PLANS = {
    "default": ({}, "auto", lambda p: p.method == "smmf"),
    "split_rows": ({"chunk": 4}, "auto", lambda p: p.split_rows),
    "split_rows_rcm": ({"chunk": 8, "long_items_first": False, "item_order": "rcm"}, "auto",
                       lambda p: p.split_rows and p.item_order == "rcm"),
    "pmf_asked": ({}, "pmf", lambda p: p.method == "smmf"),
}


@pytest.mark.parametrize("tails", [True, False], ids=["tails", "rows"])
@pytest.mark.parametrize("amp", [None, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", list(LAYER_PLANS))
def test_layer_plans_and_precisions_match_native(case, amp, tails, plan_override):
    """The layer on one head of 128 channels (tails by default: 144-channel rows)
    and on 4 x 32, with a super node, under each plan and autocast dtype."""
    fields, strategy, check = LAYER_PLANS[case]
    plan_override(**fields)
    ei, ns, nd, x, ea = _layer_inputs("plain")
    hub = torch.stack([torch.randint(0, ns, (700,)), torch.full((700,), 5)]).to(DEV)
    ei = torch.cat([ei, hub], 1)
    ea = torch.cat([ea, torch.randn(700, 16, device=DEV)])
    for heads, C in ((1, 128), (4, 32)):
        native = TransformerConv(16, C, heads=heads, edge_dim=16, beta=True).to(DEV)
        fused = FusedTransformerConv(16, C, heads=heads, edge_dim=16, beta=True,
                                     edge_tails=tails, strategy=strategy).to(DEV)
        fused.load_state_dict(native.state_dict())
        rec = _assert_layer_parity(native, fused, x, lambda e: (ei, e), ea, amp=amp,
                                   plan_check=check)
        assert rec.score == _transformer_edge_score(fused, 16)


@pytest.mark.parametrize("tails", [True, False], ids=["tails", "rows"])
@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_is_deterministic_with_dropout(amp, tails):
    """The training layer with attention dropout, twice from the same seed:
    bitwise the same output and gradients (node and edge features, parameters)."""
    ei, ns, nd, x, ea = _layer_inputs("plain")
    layer = FusedTransformerConv(16, 128, heads=1, edge_dim=16, dropout=0.3,
                                 edge_tails=tails).to(DEV).train()
    x, ea = x.to(DEV).requires_grad_(), ea.requires_grad_()

    def run():
        with ops.recording() as records, torch.autocast("cuda", dtype=amp or torch.bfloat16,
                                                        enabled=amp is not None):
            out = layer(x, ei, ea)
        assert len(records) == 1 and records[0].plan is not None
        assert records[0].score == _transformer_edge_score(layer, 16)
        return out.float()

    assert_deterministic(run, [x, ea] + list(layer.parameters()),
                         torch.randn(nd, 128, device=DEV))
