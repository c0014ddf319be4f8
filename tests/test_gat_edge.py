"""Edge features of the GAT layers: the per-edge terms of the additive score
(the ``"additive_edge"`` score, ``GATConv`` with ``edge_dim``) and the per-edge
rows of the GATv2 score (``"gatv2_edge"``, ``GATv2Conv`` with ``edge_dim``).
``gat_attention(edge=...)`` and ``gatv2_attention(edge=...)`` on layouts with
self-loops (the op tests every edge score runs are in ``test_edge_inputs.py``),
``GraphLayout.to_csr_order`` for the edges of a layout with added self-loops,
and ``FusedGATConv(edge_dim=...)`` and ``FusedGATv2Conv(edge_dim=...)`` against
PyG's ``GATConv`` and ``GATv2Conv`` in float64 (outputs, attention weights and
the gradients of the node features, the edge features and every parameter) on
every adjacency type, fill value and self-loop setting (``fuse()`` and
``explain`` with edge features: ``test_edge_inputs.py``; the GATv2 score's
plan: ``test_gatv2.py``). On the CPU the op runs the reference path; the
kernels are checked in ``test_cuda_gat_edge.py`` and
``test_cuda_gatv2_edge.py``."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor
from torch._dynamo.utils import counters
from torch_geometric.utils import add_self_loops, remove_self_loops

from conftest import layer_grad_floor, random_graph, rel_err, rel_err_floor
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATConv, FusedGATv2Conv
from pyg_dfgnn.nn.gat_conv import _edge_terms
from pyg_dfgnn.ops import plan
import test_edge_inputs as edge_inputs
from test_edge_inputs import EDGE_SCORES, _adjacency, assert_runs_pygs_forward

F64 = torch.float64


# ----------------------------------------------------------------------------- the op
def _looped(ei: Tensor, n: int) -> Tensor:
    """PyG's ``remove_self_loops`` then ``add_self_loops(num_nodes=n)``."""
    return add_self_loops(remove_self_loops(ei)[0], num_nodes=n)[0]


@pytest.mark.parametrize("score", ["additive_edge", "gatv2_edge"])
@pytest.mark.parametrize("grouped", [False, True])
def test_self_loop_layout_takes_the_edge_inputs_in_its_edge_index_order(score, grouped):
    """A layout built with self-loops: the edge inputs in the order of PyG's
    ``remove_self_loops`` + ``add_self_loops`` (the layout's ``edge_index``) go
    to CSR order with ``loops_appended=True``; in input order they raise."""
    sc = EDGE_SCORES[score]
    ei = random_graph(16, num_edges=50, num_self_loops=4)
    if grouped:  # the build's other branch: no sort
        ei = ei[:, ei[1].argsort(stable=True)]
    lay = GraphLayout.from_edge_index(ei, (16, 16), add_self_loops=True)
    looped = _looped(ei, 16)
    assert torch.equal(lay.edge_index, looped)
    *nodes, e = leaves = sc.make(16, 16, lay.num_edges, 2, 3)
    e_csr = lay.to_csr_order(e, loops_appended=True)
    out = sc.call(lay, nodes, e_csr, edge_order="csr")
    want, _ = sc.hand(looped, 16, *nodes, e, sc.param)
    assert rel_err(out, want) < 1e-12
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, g)
    exp = torch.autograd.grad(want, leaves, g)
    for a, b in zip(got, exp):
        assert rel_err_floor(a, b, 1e-8) < 1e-10
    with pytest.raises(ValueError, match="loops_appended=True"):
        sc.call(lay, nodes, e)


def test_to_csr_order_with_loops_appended():
    """Row p of the result is the layout's CSR edge p: its (source, destination)
    are those of PyG's looped edge list at the row it came from, for unsorted
    input with self-loops and duplicates, bipartite node counts included."""
    for ns, nd in ((15, 15), (15, 11), (9, 13)):
        ei = random_graph(ns, nd, num_edges=60, num_self_loops=3)
        lay = GraphLayout.from_edge_index(ei, (ns, nd), add_self_loops=True)
        looped = _looped(ei, min(ns, nd))
        ids = torch.arange(looped.size(1))
        assert lay.num_edges == looped.size(1)
        csr = lay.to_csr_order(ids, loops_appended=True)
        assert torch.equal(looped[:, csr], torch.stack([lay.col, lay.csr_row]).long())
        assert torch.equal(lay.to_input_order(csr), ids)
        with pytest.raises(ValueError, match="one row per edge"):
            lay.to_csr_order(ids[1:], loops_appended=True)
        with pytest.raises(ValueError, match="self-loops"):
            lay.to_csr_order(ids)
    # without added self-loops the edge_index order is the input order
    plain = GraphLayout.from_edge_index(ei, (9, 13))
    vals = torch.randn(ei.size(1), 2)
    assert torch.equal(plain.to_csr_order(vals, loops_appended=True), plain.to_csr_order(vals))


def test_plan_of_the_additive_edge_score():
    """The additive score's own-walk plans, with the edge kernel in the backward
    between the destination walk (and the split rows' sums) and the source walk;
    the edge score has no row-walk forward (its edge term is not a source scalar)."""
    lay = GraphLayout.from_edge_index(random_graph(300, num_edges=3000), (300, 300))
    spec = ops.spec.get("additive_edge")
    assert spec.edge_inputs == (3,) and spec.pmf and not spec.pmf_rule
    for dtype in (torch.float32, torch.bfloat16):
        for strategy in ("smmf", "pmf"):
            for chunk in (None, 4):
                with plan.override(chunk=chunk):
                    p = plan.plan_for(lay, dtype, 32, score="additive_edge", strategy=strategy)
                with plan.override(chunk=chunk, row_walk=False):
                    base = plan.plan_for(lay, dtype, 32, score="additive", strategy=strategy)
                assert not p.row_walk
                fwd = [k for k, _ in p.kernels()]
                assert fwd == [k.replace("additive", "additive_edge") for k, _ in base.kernels()]
                bwd = [k for k, _ in p.kernels(backward=True)]
                want = [k.replace("additive", "additive_edge")
                        for k, _ in base.kernels(backward=True)]
                want.insert(want.index("additive_edge:bwd_src"), "additive_edge:bwd_edge")
                assert bwd == want, (dtype, strategy, chunk)
                assert ("additive_edge:split_dsum" in bwd) == (dtype != torch.float32
                                                              and chunk == 4)


# ----------------------------------------------------------------------------- the layer
#: The layers whose edge features enter GAT-like scores: name -> (fused class,
#: the score of its calls with edge features, that of its calls without).
LAYERS = {"gat": (FusedGATConv, "additive_edge", "additive"),
          "gatv2": (FusedGATv2Conv, "gatv2_edge", "gatv2")}


def _pair(layer, *args, **kwargs):
    """``(native, fused)`` float64 layers of ``layer`` (a key of :data:`LAYERS`)
    with the same parameters."""
    return edge_inputs._pair(*args, cls=LAYERS[layer][0], **kwargs)


def _compare(layer, native, fused, x, ei, ns, nd, ea, kind="coo", from_values=False,
             call=None):
    """:func:`test_edge_inputs._compare` (the fused layer ran the fused op with
    ``layer``'s edge score; outputs, weights and every gradient match PyG's in
    float64)."""
    return edge_inputs._compare(native, fused, x, ei, ns, nd, ea, kind, from_values, call,
                                LAYERS[layer][1])


def _graph(ns=20, nd=None, **kw):
    """Unsorted edges with duplicates, destinations without in-edges and (in the
    square part) existing self-loops."""
    kw = {"num_edges": 80, "num_isolated": 3, "num_duplicates": 7, "num_self_loops": 4, **kw}
    return random_graph(ns, nd, **kw)


def _features(ns, nd, f_src, f_dst, D, E, dst="features"):
    x = torch.randn(ns, f_src, dtype=F64)
    if dst == "features":
        x = (x, torch.randn(nd, f_dst, dtype=F64))
    elif dst == "none":
        x = (x, None)
    return x, torch.randn(E, D, dtype=F64)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("loops", [True, False])
def test_layer_matches_pyg(layer, heads, concat, loops):
    ei = _graph()
    native, fused = _pair(layer, 8, 5, heads=heads, concat=concat, edge_dim=6,
                          add_self_loops=loops)
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    assert fused.fallback_reason(x, ei, ea) == ""
    _compare(layer, native, fused, x, ei, 20, 20, ea)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("fill", ["mean", "add", "sum", "mul", "max", "min", 0.7, 2, "tensor"])
@pytest.mark.parametrize("input_loops", [4, 0])
def test_layer_fill_values_match_pyg(layer, fill, input_loops):
    """The self-loops' features: PyG's add_self_loops with each fill_value (the
    reductions its scatter takes: "sum" as "add", "mul" from ones; a float, an
    int, a tensor), the rows of destinations without in-edges included ('mean' /
    'max' give them zeros, 'mul' ones), with and without self-loops in the input
    (which PyG removes first)."""
    if fill == "tensor":
        fill = torch.randn(6, dtype=F64)
    ei = _graph(num_self_loops=input_loops)
    if not input_loops:
        ei = remove_self_loops(ei)[0]  # random edges may be loops too
    assert bool((ei[0] == ei[1]).any()) == bool(input_loops)
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6, fill_value=fill)
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    _compare(layer, native, fused, x, ei, 20, 20, ea, call={"return_attention_weights": True})


@pytest.mark.parametrize("fill, reduced", [("mean", "terms"), ("add", "terms"),
                                           ("sum", "terms"), ("max", "features"),
                                           (0.5, "features")])
def test_gat_linear_fill_reduces_the_edge_terms(fill, reduced, monkeypatch):
    """GATConv with a sum or mean fill_value adds the self-loops to the [E, H] edge
    terms (the projection is linear, so the loops' terms are the reduction of their
    in-edges' terms), where other fills add them to the [E, D] features; either way
    the layer matches PyG."""
    from pyg_dfgnn.nn import _common

    widths = []

    def spy(ei, attr, **kwargs):
        widths.append(attr.size(-1))
        return add_self_loops(ei, attr, **kwargs)

    monkeypatch.setattr(_common, "add_self_loops", spy)
    ei = _graph(num_self_loops=3)
    native, fused = _pair("gat", 8, 4, heads=2, edge_dim=6, fill_value=fill)
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    _compare("gat", native, fused, x, ei, 20, 20, ea)
    assert widths and set(widths) == {2 if reduced == "terms" else 6}


@pytest.mark.parametrize("layer", list(LAYERS))
def test_input_without_self_loops_skips_their_removal(layer, monkeypatch):
    """Where the layout counts no self-loop in the input, the edge features go to
    PyG's add_self_loops as they are: neither the scatters nor the selection that
    remove loops run (host time per layer and call), and the layer matches PyG."""
    from pyg_dfgnn import edge_order

    def removal(*args, **kwargs):
        raise AssertionError("the self-loop removal ran on an input without self-loops")

    ei = remove_self_loops(_graph(num_self_loops=0))[0]
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6)
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    monkeypatch.setattr(edge_order, "compact", removal)
    monkeypatch.setattr(torch, "nonzero_static", removal)
    _compare(layer, native, fused, x, ei, 20, 20, ea)
    monkeypatch.undo()
    looped = _graph(num_self_loops=2)
    ea = torch.randn(looped.size(1), 6, dtype=F64)
    fused(x, looped, ea)  # its layout built and cached: the call below removes loops only
    monkeypatch.setattr(torch, "nonzero_static", removal)
    with pytest.raises(AssertionError, match="removal ran"):  # the guard sees a removal
        fused(x, looped, ea)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("kind", ["coo", "edge_index"])
@pytest.mark.parametrize("dst", ["features", "none"])
@pytest.mark.parametrize("loops", [True, False])
def test_layer_bipartite_matches_pyg(layer, kind, dst, loops):
    """Source and destination features (or none for the destinations: GATv2Conv
    asserts, and the fused layer lets it) with ``N_src != N_dst``; with
    self-loops PyG adds ``min(N_src, N_dst)``."""
    ns, nd = 14, 9
    ei = _graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=4, num_self_loops=3)
    native, fused = _pair(layer, (6, 7), 4, heads=3, edge_dim=5, add_self_loops=loops)
    x, ea = _features(ns, nd, 6, 7, 5, ei.size(1), dst=dst)
    if layer == "gatv2" and dst == "none":
        assert_runs_pygs_forward(native, fused, x, ei, ea)
        return
    call = {"return_attention_weights": True}
    if kind == "coo" and layer == "gat":  # the destination count: an EdgeIndex carries it
        call["size"] = (ns, nd)  # (GATv2Conv takes no size: its features set it)
    _compare(layer, native, fused, x, ei, ns, nd, ea, kind, call=call)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("kind", ["csr", "sparse_tensor"])
@pytest.mark.parametrize("dst", ["features", "none"])
@pytest.mark.parametrize("from_values", [False, True])
def test_layer_bipartite_sparse_adjacency_matches_pyg(layer, kind, dst, from_values):
    """A bipartite ``adj_t`` (``torch.sparse`` CSR or ``SparseTensor`` of
    ``[N_dst, N_src]``, fewer destinations than sources) without self-loops (with
    them PyG raises for a ``SparseTensor`` and asserts on a ``torch.sparse``
    matrix's ``edge_attr``: the layer runs PyG's forward, in
    :func:`test_layer_adjacency_types`), the edge features as ``edge_attr`` in its
    order or as its values: the edge score runs fused, and outputs, attention
    weights and gradients match PyG's (GATv2Conv asserts on no destination
    features, and the layer runs PyG's forward)."""
    ns, nd = 14, 9
    ei = _graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=4, num_self_loops=3)
    native, fused = _pair(layer, (6, 7), 4, heads=3, edge_dim=5, add_self_loops=False)
    x, ea = _features(ns, nd, 6, 7, 5, ei.size(1), dst=dst)
    call = {"return_attention_weights": True}
    if layer == "gatv2" and dst == "none":
        adj, edge_attr = _adjacency(kind, ei, ns, nd, ea, from_values)
        assert_runs_pygs_forward(native, fused, x, adj, edge_attr, **call)
        return
    _compare(layer, native, fused, x, ei, ns, nd, ea, kind, from_values, call)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_reducing_fill_past_the_loops_raises_as_pyg(layer):
    """A bipartite graph with edges into destinations past min(N_src, N_dst):
    PyG's add_self_loops reduces over the first ones only and raises for the
    others; the fused layer raises alike (a constant fill runs)."""
    ns, nd = 5, 9
    ei = torch.stack([torch.randint(0, ns, (30,)), torch.randint(0, nd, (30,))])
    ei[1, 0] = nd - 1
    x, ea = _features(ns, nd, 4, 3, 3, ei.size(1))
    native, fused = _pair(layer, (4, 3), 2, edge_dim=3, fill_value="mean")
    with pytest.raises(RuntimeError) as want:
        native(x, ei, ea)
    with pytest.raises(type(want.value), match="out of bounds"):
        fused(x, ei, ea)
    native, fused = _pair(layer, (4, 3), 2, edge_dim=3, fill_value=0.5)
    _compare(layer, native, fused, x, ei, ns, nd, ea)


OPTIONS = [dict(residual=True), dict(residual=True, concat=False),
           dict(bias=False, negative_slope=0.0), dict(dropout=0.4), dict(edge_dim=1),
           dict(negative_slope=1.0, add_self_loops=False)]


@pytest.mark.parametrize("layer,kwargs", [(layer, kw) for layer in LAYERS for kw in OPTIONS]
                         + [("gatv2", dict(share_weights=True)),
                            ("gatv2", dict(share_weights=True, residual=True,
                                           add_self_loops=False))])
def test_layer_options_match_pyg(layer, kwargs):
    """Each option, dropout in eval mode; GATv2Conv's ``share_weights`` too."""
    ei = _graph()
    kwargs = {"heads": 2, "edge_dim": 6, **kwargs}
    native, fused = _pair(layer, 8, 4, **kwargs)
    if kwargs.get("dropout"):
        native.eval()
        fused.eval()
    x, ea = _features(20, 20, 8, None, kwargs["edge_dim"], ei.size(1), dst="single")
    _compare(layer, native, fused, x, ei, 20, 20, ea)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_one_feature_per_edge_as_a_vector(layer):
    """edge_dim=1 and edge_attr [E]: PyG views it as [E, 1], after its self-loops."""
    ei = _graph()
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=1)
    x, ea = _features(20, 20, 8, None, 1, ei.size(1), dst="single")
    _compare(layer, native, fused, x, ei, 20, 20, ea[:, 0])


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_super_node_and_grouped_edges(layer):
    n = 40
    hub = torch.stack([torch.randint(0, n, (300,)), torch.full((300,), 7)])
    ei = torch.cat([random_graph(n, num_edges=100), hub], 1)
    ei = ei[:, torch.randperm(ei.size(1))]
    for edges in (ei, ei[:, ei[1].argsort(stable=True)]):
        for loops in (True, False):
            native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6, add_self_loops=loops)
            x, ea = _features(n, n, 8, None, 6, edges.size(1), dst="single")
            _compare(layer, native, fused, x, edges, n, n, ea)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("kind", ["coo", "edge_index", "csr", "sparse_coo", "sparse_tensor"])
@pytest.mark.parametrize("from_values", [False, True])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("weights", [None, True, False])
def test_layer_adjacency_types(layer, kind, from_values, loops, weights):
    """Edge features as ``edge_attr`` in the adjacency's order, or (no
    ``edge_attr``) a sparse matrix's values, as PyG's ``collect`` takes them;
    ``return_attention_weights=False`` returns the output alone, as PyG's
    ``if return_attention_weights:``.
    Fused, except with self-loops on a sparse matrix: PyG raises for a
    ``SparseTensor`` and asserts on a ``torch.sparse`` matrix's ``edge_attr``
    (the layer lets it), or derives the loops' features from its values (the
    layer runs PyG's forward). Where PyG raises (the weights of a
    ``torch.sparse`` matrix with a feature dimension), the layer raises alike."""
    if from_values and kind in ("coo", "edge_index"):
        pytest.skip("a [2, E] edge_index has no values")
    ns = nd = 18
    ei = random_graph(ns, num_edges=70, num_isolated=2, num_duplicates=6)
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6, add_self_loops=loops)
    x, ea = _features(ns, nd, 8, None, 6, ei.size(1), dst="single")
    call = {} if weights is None else {"return_attention_weights": weights}
    adj, edge_attr = _adjacency(kind, ei, ns, nd, ea, from_values)
    sparse_loops = loops and kind in ("csr", "sparse_coo", "sparse_tensor")
    reason = fused.fallback_reason(x, adj, edge_attr)
    assert ("sparse adjacency" in reason) if sparse_loops else reason == "", reason
    if sparse_loops:
        assert_runs_pygs_forward(native, fused, x, adj, edge_attr, **call)
        return
    try:
        want = native(x, adj, edge_attr, **call)
    except Exception as exc:  # PyG raises: so does the fused layer, the same way
        with pytest.raises(type(exc)):
            fused(x, adj, edge_attr, **call)
        return
    if weights is False:
        assert type(want) is Tensor and type(fused(x, adj, edge_attr, **call)) is Tensor
        # _compare unpacks (out, weights) from a call with return_attention_weights:
        # both layers get the False from a hook instead
        for conv in (native, fused):
            _call_with(conv, return_attention_weights=False)
        call = {}
    _compare(layer, native, fused, x, ei, ns, nd, ea, kind, from_values, call)


def _call_with(layer: torch.nn.Module, **kwargs) -> None:
    """Adds ``kwargs`` to every call of ``layer`` (a forward pre-hook)."""
    layer.register_forward_pre_hook(lambda mod, args, kw: (args, {**kw, **kwargs}),
                                    with_kwargs=True)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_attention_weights_and_edges_with_loops(layer):
    """The returned edges are PyG's (input edges without their loops, then one
    loop per node) and the weights in that order, each row summing to one."""
    ei = _graph()
    native, fused = _pair(layer, 8, 4, heads=3, edge_dim=6)
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    _, (ei_f, alpha) = fused(x, ei, ea, return_attention_weights=True)
    _, (ei_n, alpha_n) = native(x, ei, ea, return_attention_weights=True)
    assert torch.equal(ei_f, ei_n) and rel_err(alpha, alpha_n) < 1e-12
    sums = torch.zeros(20, 3, dtype=F64).index_add(0, ei_f[1], alpha.detach())
    assert torch.allclose(sums, torch.ones_like(sums))


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_pmf_strategy(layer):
    """The additive_edge score has a PMF path, kept; the gatv2_edge score has
    none, and the layer runs SMMF (the op raises for "pmf" on the CPU too)."""
    ei = _graph()
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6)
    fused.strategy = "pmf"
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    _compare(layer, native, fused, x, ei, 20, 20, ea)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_hooked_or_replaced_lin_edge_runs_pygs_form(layer):
    """A lin_edge with hooks sees the features PyG's does (self-loops'
    included); one with a bias adds its projected bias, as PyG's."""
    ei = _graph()
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6)
    seen = {}
    for name, conv in (("native", native), ("fused", fused)):
        conv.lin_edge.register_forward_hook(
            lambda mod, inp, out, name=name: seen.__setitem__(name, inp[0].detach()))
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    _compare(layer, native, fused, x, ei, 20, 20, ea)
    assert torch.equal(seen["fused"], seen["native"])
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6)
    lin = torch.nn.Linear(6, 8, dtype=F64)
    native.lin_edge, fused.lin_edge = lin, copy.deepcopy(lin)
    _compare(layer, native, fused, x, ei, 20, 20, ea)


def test_edge_terms_gemm_and_pygs_form():
    """The GEMM with lin_edge.weight x att_edge gives PyG's terms, and gradients to
    both parameters and the features; a half-precision model runs PyG's form
    itself (bit for bit PyG's terms)."""
    lin = torch.nn.Linear(6, 3 * 4, bias=False, dtype=F64)
    att = torch.randn(1, 3, 4, dtype=F64, requires_grad=True)
    feats = torch.randn(50, 6, dtype=F64, requires_grad=True)
    got = _edge_terms(feats, lin, att, 3, 4)
    want = (lin(feats).view(-1, 3, 4) * att).sum(-1)
    assert rel_err(got, want) < 1e-14
    g = torch.randn_like(want)
    leaves = (feats, att, lin.weight)
    for a, b in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g)):
        assert rel_err(a, b) < 1e-13
    for dtype in (torch.float16, torch.bfloat16):
        half = copy.deepcopy(lin).to(dtype)
        args = (feats.detach().to(dtype), half, att.detach().to(dtype))
        assert torch.equal(_edge_terms(*args, 3, 4),
                           (half(args[0]).view(-1, 3, 4) * args[2]).sum(-1))


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_under_cpu_autocast_matches_pyg(layer):
    """bf16 autocast: the fused layer within 1e-2 of float64 PyG, or within 2x
    PyG's own bf16 error where that is larger (GAT: the kernel takes the
    attention terms rounded to bf16, where PyG sums them in float32: over seeds
    the two errors stay within 1.3x of each other); outputs in PyG's dtype."""
    ei = _graph(60, num_edges=400)
    native, fused = _pair(layer, 16, 8, heads=2, edge_dim=6)
    native32, fused32 = copy.deepcopy(native).float(), copy.deepcopy(fused).float()
    x, ea = torch.randn(60, 16), torch.randn(ei.size(1), 6)

    def run(layer, dtype, autocast):
        leaves = [x.to(dtype).requires_grad_(), ea.to(dtype).requires_grad_()]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = layer(leaves[0], ei, leaves[1])
        grads = torch.autograd.grad(out.float().square().sum(), leaves + list(layer.parameters()))
        return out, grads

    got, base = run(fused32, torch.float32, True), run(native32, torch.float32, True)
    want = run(native, F64, False)
    assert got[0].dtype == base[0].dtype
    assert rel_err(got[0], want[0]) < max(1e-2, 2 * rel_err(base[0], want[0]))
    floor = layer_grad_floor(want[1])
    for a, b, w in zip(got[1], base[1], want[1]):
        assert rel_err_floor(a, w, floor) < max(1e-2, 2 * rel_err_floor(b, w, floor))


# ----------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("layer", list(LAYERS))
def test_edge_dim_without_features_runs_the_node_score(layer):
    """PyG leaves the edge term out when no edge features reach edge_update."""
    ei = _graph()
    for loops in (True, False):
        native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6, add_self_loops=loops)
        x = torch.randn(20, 8, dtype=F64)
        assert fused.fallback_reason(x, ei) == ""
        with ops.recording() as records:
            got = fused(x, ei)
        assert [r.score for r in records] == [LAYERS[layer][2]]
        assert rel_err(got, native(x, ei)) < 1e-12


@pytest.mark.parametrize("layer", list(LAYERS))
def test_edge_features_without_edge_dim_run_pygs_forward(layer):
    """GATConv leaves them out of its scores; GATv2Conv asserts on them, a
    SparseTensor's values with a feature dimension included (plain weights,
    1-D, reach neither)."""
    ei = _graph()
    native, fused = _pair(layer, 8, 4, heads=2)
    x, ea = _features(20, 20, 8, None, 6, ei.size(1), dst="single")
    assert "without edge_dim" in fused.fallback_reason(x, ei, ea)
    assert_runs_pygs_forward(native, fused, x, ei, ea)
    torch_sparse = pytest.importorskip("torch_sparse")
    # without self-loops: set_diag takes no feature rows
    native, fused = _pair(layer, 8, 4, heads=2, add_self_loops=False)
    for value in (ea, torch.rand(ei.size(1), dtype=F64)):
        adj = torch_sparse.SparseTensor(row=ei[1], col=ei[0], value=value,
                                        sparse_sizes=(20, 20))
        falls_back = layer == "gatv2" and value.dim() == 2
        assert ("without edge_dim" in fused.fallback_reason(x, adj)) == falls_back
        if falls_back:
            assert_runs_pygs_forward(native, fused, x, adj)
        else:
            assert rel_err(fused(x, adj), native(x, adj)) < 1e-12


@pytest.mark.parametrize("layer", list(LAYERS))
def test_bad_edge_features_run_pygs_forward(layer):
    ei = _graph()
    native, fused = _pair(layer, 8, 4, heads=2, edge_dim=6)
    x = torch.randn(20, 8, dtype=F64)
    E = ei.size(1)
    for ea in (torch.randn(E - 1, 6, dtype=F64), torch.randn(E, 2, 6, dtype=F64),
               torch.randn(E, 5, dtype=F64), torch.randint(0, 3, (E, 6)),
               torch.randn(E, dtype=F64)):
        assert "not [E, edge_dim]" in fused.fallback_reason(x, ei, ea)
        assert_runs_pygs_forward(native, fused, x, ei, ea)


# ----------------------------------------------------------------------------- compile
class EdgeModel(torch.nn.Module):
    def __init__(self, cls, loops: bool):
        super().__init__()
        self.conv1 = cls(8, 4, heads=2, edge_dim=6, add_self_loops=loops)
        self.conv2 = cls(8, 4, heads=2, edge_dim=6, concat=False, add_self_loops=loops)

    def forward(self, x, edge_index, edge_attr):
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("loops", [False, True])
def test_compiled_layer_with_edge_features_new_graph_each_step(layer, loops):
    """A new graph each step: the edge inputs enter the compiled entry op
    pyg_dfgnn::<score>_attention (additive_edge, gatv2_edge); outputs and
    gradients match the eager layer. No graph is compiled per batch, with
    self-loops too: the layer removes the input's loops with ``nonzero_static``
    sized by the layout's count of the edges it keeps (a size that under
    ``dynamic=True`` is symbolic, not a data-dependent one), and the layout of
    each new graph is built at a graph break the compiled frames resume from
    (docs/layout_cache.md)."""
    cls, score, _ = LAYERS[layer]
    seen, targets = edge_inputs.compiled_steps(EdgeModel(cls, loops), steps=4,
                                               num_self_loops=2)
    assert seen[1] == seen[-1], seen
    assert f"pyg_dfgnn.{score}_attention.default" in targets


@pytest.mark.parametrize("layer,fill", [("gat", 0.5), ("gatv2", "add")])
def test_compiled_layer_with_self_loops_and_fill_value_compiles_once(layer, fill):
    """Self-loops added by the layer with a ``fill_value``, each batch's layout
    cached ahead (an eager call), ``fullgraph=True`` over batches of different
    sizes: one graph, no recompile, and the eager layer's outputs and edge
    feature gradients.

    The Python ints of the loop handling (``GraphLayout.num_edges`` less
    ``min(N_src, N_dst)``: the size of ``nonzero_static`` in
    ``pyg_dfgnn.nn._common.looped_edge_features``) are traced as symbolic sizes
    under ``dynamic=True``: their guards are relations (``num_edges - N >= 2``)
    that every batch here meets. (A batch keeping 0 or 1 edges fails the 0/1
    specialization and recompiles; with ``dynamic=False`` each new size does.)"""
    torch._dynamo.reset()
    counters.clear()
    conv = LAYERS[layer][0](8, 4, heads=2, edge_dim=6, fill_value=fill)
    model = torch.compile(conv, dynamic=True, fullgraph=True, backend="aot_eager")
    for i in range(4):
        n = 20 + 7 * i
        ei = random_graph(n, num_edges=60 + 23 * i, num_self_loops=2)
        x, ea = torch.randn(n, 8), torch.randn(ei.size(1), 6, requires_grad=True)
        want = conv(x, ei, ea)  # builds and caches the layout
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            got = model(x, ei, ea)
        assert rel_err(got, want) < 1e-5
        g = torch.randn_like(want)
        assert rel_err(torch.autograd.grad(got, ea, g)[0],
                       torch.autograd.grad(want, ea, g)[0]) < 1e-4
    assert counters["stats"]["unique_graphs"] == 1
