"""Work-item orders (pyg_dfgnn.node_order, work_items.order_items): the node ranks,
the reordered items (a permutation that keeps every item and the merge slots),
their cache on the layout, the plan's ``item_order`` override, and on the GPU the
claim that makes an order safe to pick by speed alone: outputs and gradients are
bitwise the same in every order."""
from __future__ import annotations

import pytest
import torch

from conftest import random_graph
from pyg_dfgnn import layout as layout_mod
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.node_order import ITEM_ORDERS, degree_rank, rcm_rank
from pyg_dfgnn.ops import plan
from pyg_dfgnn.ops.calls import prepare
from pyg_dfgnn.ops.spec import get as get_spec
from pyg_dfgnn.work_items import order_items, split_work

F32 = torch.float32
ORDERS = [o for o in ITEM_ORDERS if o != "row"]


def _hub_graph(n=400, e=3000, hub=300, num_src=None, seed=0):
    """Random edges plus a destination and a source with ``hub`` edges each: rows
    split at small chunks in both the CSR and the CSC."""
    g = torch.Generator().manual_seed(seed)
    ns = n if num_src is None else num_src
    ei = random_graph(ns, n, num_edges=e, generator=g)
    to_hub = torch.stack([torch.randint(0, ns, (hub,), generator=g), torch.full((hub,), 3)])
    from_hub = torch.stack([torch.full((hub,), 5), torch.randint(0, n, (hub,), generator=g)])
    ei = torch.cat([ei, to_hub, from_hub], 1)
    return GraphLayout.from_edge_index(ei, (ns, n))


def _ptr(lay, kind):
    return lay.rowptr if kind == "row" else lay.colptr


def _sorted_rows(items):
    """The item rows in a canonical order (for multiset comparisons)."""
    key = (items[:, 0].long() * (1 << 32)) + items[:, 1].long()
    return items[torch.argsort(key)]


# ---------------------------------------------------------------------------- ranks
def test_rcm_orders_a_shuffled_path_along_the_path():
    n = 200
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    src, dst = ids[:-1], ids[1:]  # a path through the shuffled ids
    lay = GraphLayout.from_edge_index(torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]),
                                      (n, n))
    rank = lay.node_rank("rcm", "row")
    assert sorted(rank.tolist()) == list(range(n))
    # bandwidth 1: path neighbours get consecutive ranks (the ids alone give ~n/3)
    assert (rank[src] - rank[dst]).abs().max().item() == 1
    assert (ids[:-1] - ids[1:]).abs().max().item() > 1
    assert lay.node_rank("rcm", "col") is rank  # a square graph: one rank per node


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("num_src", [None, 250])
def test_ranks_are_permutations_of_each_side(order, num_src):
    lay = _hub_graph(num_src=num_src)
    for kind, n in (("row", lay.num_dst), ("col", lay.num_src)):
        rank = lay.node_rank(order, kind)
        assert rank.dtype == torch.int64 and rank.device == lay.col.device
        assert sorted(rank.tolist()) == list(range(n)), (order, kind)


def test_bipartite_rcm_has_a_rank_per_side():
    lay = _hub_graph(n=300, num_src=120)
    row_rank, col_rank = rcm_rank(lay.rowptr, lay.col, lay.num_src, lay.num_dst)
    assert row_rank.numel() == 300 and col_rank.numel() == 120


def test_degree_rank_is_largest_first_ties_by_id():
    ptr = torch.tensor([0, 2, 2, 7, 9, 10, 15])  # degrees 2 0 5 2 1 5
    assert degree_rank(ptr).tolist() == [2, 5, 0, 3, 4, 1]
    lay = _hub_graph()
    for kind in ("row", "col"):
        deg = (_ptr(lay, kind)[1:] - _ptr(lay, kind)[:-1])
        by_rank = deg[torch.argsort(lay.node_rank("degree", kind))]
        assert (by_rank[:-1] >= by_rank[1:]).all(), kind


def test_rcm_of_a_graph_without_edges():
    lay = GraphLayout.from_edge_index(torch.empty(2, 0, dtype=torch.long), (6, 6))
    assert sorted(lay.node_rank("rcm", "row").tolist()) == list(range(6))
    for kind in ("row", "col"):
        w = lay.work(kind, 4, True, "rcm")
        assert w.items.size(0) == 6 and w.num_slots == 0


# ---------------------------------------------------------------------------- items
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kind", ["row", "col"])
@pytest.mark.parametrize("long_first", [True, False])
def test_ordered_items_are_a_permutation_in_rank_order(order, kind, long_first):
    lay, chunk = _hub_graph(), 16
    base = lay.work(kind, chunk, long_first)
    w = lay.work(kind, chunk, long_first, order)
    assert base.num_slots > 0  # split rows: the slot and length orders matter
    assert w.items.dtype == torch.int32 and w.items.is_contiguous()
    assert torch.equal(_sorted_rows(w.items), _sorted_rows(base.items))
    assert w.combine is base.combine and w.num_slots == base.num_slots
    # (degree order within the length order is nearly longest first: an unsplit row's
    # one item holds its degree's edges)
    if order == "rcm" or not long_first:
        assert not torch.equal(w.items, base.items)
    rank = lay.node_rank(order, kind)[w.items[:, 0].long()]
    start = w.items[:, 1].long()
    if long_first:
        ptr = _ptr(lay, kind)
        n_edges = (ptr[1:][w.items[:, 0].long()] - start).clamp(max=chunk)
        assert (n_edges[:-1] >= n_edges[1:]).all()
        same = n_edges[:-1] == n_edges[1:]
        assert (rank[:-1][same] <= rank[1:][same]).all()
    else:
        assert (rank[:-1] <= rank[1:]).all()
    # a row's items stay in edge order (the slots in item order)
    same_row = w.items[:-1, 0] == w.items[1:, 0]
    assert (start[:-1][same_row] < start[1:][same_row]).all()


@pytest.mark.parametrize("long_first", [True, False])
def test_order_does_not_depend_on_the_items_order(long_first):
    """The GPU layout build lays its items out differently from split_work (its
    longest-first order, say): the ordered items are the same from any base."""
    lay, chunk = _hub_graph(), 16
    rank = lay.node_rank("rcm", "row")
    base = split_work(lay.rowptr, chunk, long_first)
    shuffled = base._replace(items=base.items[torch.randperm(base.items.size(0))])
    a = order_items(base, lay.rowptr, rank, chunk, long_first)
    b = order_items(shuffled, lay.rowptr, rank, chunk, long_first)
    assert torch.equal(a.items, b.items)


def test_row_order_is_the_default_items():
    lay, chunk = _hub_graph(), 16
    for kind in ("row", "col"):
        for lf in (True, False):
            w = lay.work(kind, chunk, lf, "row")
            assert w is lay.work(kind, chunk, lf)
            ref = split_work(_ptr(lay, kind), chunk, lf)
            assert torch.equal(w.items, ref.items) and torch.equal(w.combine, ref.combine)
    assert not lay.derived.node_rank  # row order computes no rank


def test_orders_are_cached_per_key(monkeypatch):
    calls = []

    def counting(*args):
        calls.append(1)
        return rcm_rank(*args)
    monkeypatch.setattr(layout_mod, "rcm_rank", counting)
    lay, chunk = _hub_graph(), 16
    keys = [(kind, chunk, True, order) for kind in ("row", "col") for order in ITEM_ORDERS]
    works = {key: lay.work(*key) for key in keys}
    assert len(calls) == 1  # one RCM for both sides
    assert set(keys) <= set(lay.derived.work)
    assert len({id(w.items) for w in works.values()}) == len(keys)  # distinct entries
    assert all(lay.work(*key) is works[key] for key in keys)
    assert len(calls) == 1
    assert set(lay.derived.node_rank) == {("rcm", "row"), ("rcm", "col"), ("degree", "row"),
                                         ("degree", "col")}


def test_bad_order_raises():
    lay = _hub_graph()
    with pytest.raises(ValueError, match="order must be"):
        lay.work("row", 16, True, "metis")
    with pytest.raises(ValueError, match="order must be"):
        lay.node_rank("row", "row")
    with pytest.raises(ValueError, match="kind must be"):
        lay.node_rank("rcm", "dst")


def test_moved_layout_keeps_orders():
    lay = _hub_graph()
    w = lay.work("col", 16, True, "rcm")
    moved = lay.to("meta")
    assert moved.derived.work[("col", 16, True, "rcm")].items.device.type == "meta"
    assert moved.derived.node_rank[("rcm", "col")].device.type == "meta"
    assert sum(t.device.type == "meta" for t in moved.derived.tensors()) == \
        sum(1 for _ in lay.derived.tensors())
    assert w.items.device.type == "cpu"


# ---------------------------------------------------------------------------- plan
def _same_items(prep, row_work, col_work):
    """The plan object holds exactly these work items (its tensors, not copies)."""
    if prep.obj is None:  # without the extension there is no plan object
        return
    assert prep.obj.layout_tensor("row_items").data_ptr() == row_work.items.data_ptr()
    assert prep.obj.layout_tensor("col_items").data_ptr() == col_work.items.data_ptr()


def test_item_order_override():
    lay = _hub_graph()
    default = plan.plan_for(lay, F32, 32)
    assert default.item_order == "row"
    with plan.override(item_order="rcm"):
        p = plan.plan_for(lay, F32, 32)
        assert p.item_order == "rcm" and p is not default
        prep = prepare(get_spec("dot"), lay, F32, 32, "auto", False, False, True)
        _same_items(prep, lay.work("row", p.chunk, True, "rcm"),
                    lay.work("col", p.chunk, True, "rcm"))
        with plan.override(item_order=None, long_items_first=False):  # nested: back to rows
            q = plan.plan_for(lay, F32, 32)
            assert q.item_order == "row" and not q.long_items_first
    assert plan.plan_for(lay, F32, 32) is default  # nothing leaks out
    prep = prepare(get_spec("dot"), lay, F32, 32, "auto", False, False, True)
    _same_items(prep, lay.work("row", default.chunk, True), lay.work("col", default.chunk, True))


@pytest.mark.parametrize("value", ["bfs", True, 1, "RCM"])
def test_item_order_override_rejects_bad_values(value):
    with pytest.raises(ValueError, match="item_order must be"):
        with plan.override(item_order=value):
            pass


def test_reference_path_ignores_the_order():
    """On the CPU the reference runs: the order computes nothing and changes nothing."""
    lay = _hub_graph()
    n, H, C = lay.num_src, 2, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, H, C, generator=g) for _ in range(3))
    a_src, a_dst = torch.randn(n, H, generator=g), torch.randn(n, H, generator=g)
    x = torch.randn(n, H * C, generator=g)

    def run():
        return [ops.gt_attention(lay, q, k, v), ops.gat_attention(lay, a_src, a_dst, k),
                ops.agnn_attention(lay, x, None, 0.7)]
    want = run()
    with plan.override(item_order="rcm"):
        got = run()
    assert all(torch.equal(a, b) and b.abs().sum() > 0 for a, b in zip(got, want))
    assert not lay.derived.node_rank


# ---------------------------------------------------------------------------- GPU
def _batch_like(num_graphs=48, nodes=40, deg=9, seed=0):
    """Block-diagonal small graphs (no split rows at the default chunk)."""
    g = torch.Generator().manual_seed(seed)
    off = torch.arange(num_graphs).repeat_interleave(nodes * deg) * nodes
    dst = torch.arange(nodes).repeat_interleave(deg).repeat(num_graphs) + off
    src = torch.randint(0, nodes, (num_graphs * nodes * deg,), generator=g) + off
    return torch.stack([src, dst]), num_graphs * nodes


def _gpu_graphs():
    hub = _hub_graph(n=3000, e=40000, hub=2500, seed=4)
    ei, n = _batch_like()
    return {"split": hub.edge_index.cuda(), "batch": ei.cuda()}, {"split": 3000, "batch": n}


def _fwd_bwd(model, lay, leaves, g, **kw):
    for t in leaves:
        t.grad = None
    torch.manual_seed(7)  # the dropout seed
    if model == "gt":
        out = ops.gt_attention(lay, *leaves, **kw)
    elif model == "gat":
        out = ops.gat_attention(lay, *leaves, **kw)
    else:
        out = ops.agnn_attention(lay, leaves[0], None, leaves[1])
    torch.autograd.backward(out, g)
    return [out.detach().clone()] + [t.grad.clone() for t in leaves]


#: (item_order, long_items_first): every order, with and without the length sort
CONFIGS = [("row", True), ("row", False), ("rcm", True), ("rcm", False), ("degree", True),
           ("degree", False)]


@pytest.mark.cuda
@pytest.mark.parametrize("graph", ["split", "batch"])
@pytest.mark.parametrize("model,extra", [
    ("gt", {}), ("gt", {"bwd_launches": 2}), ("gt", {"strategy": "pmf"}),
    ("gt", {"dropout": 0.2}), ("gat", {}), ("gat", {"dropout": 0.2}), ("agnn", {}),
    ("gt", {"dtype": torch.bfloat16})])
def test_outputs_and_grads_are_bitwise_equal_in_every_order(graph, model, extra):
    eis, ns = _gpu_graphs()
    n = ns[graph]
    lay = GraphLayout.from_edge_index(eis[graph], (n, n))
    extra = dict(extra)
    dtype = extra.pop("dtype", F32)
    over = {k: extra.pop(k) for k in ("bwd_launches",) if k in extra}
    H, C = 2, 32
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=dtype).requires_grad_()
    if model == "gt":
        leaves = [rand(n, H, C) for _ in range(3)]
        grad = torch.randn(n, H, C, device="cuda", generator=g, dtype=dtype)
    elif model == "gat":
        leaves = [rand(n, H), rand(n, H), rand(n, H, C)]
        grad = torch.randn(n, H, C, device="cuda", generator=g, dtype=dtype)
    else:
        leaves = [rand(n, H * C), torch.tensor(0.8, device="cuda", requires_grad=True)]
        grad = torch.randn(n, H * C, device="cuda", generator=g)
    chunk = plan.plan_for(lay, dtype, C).chunk
    assert (lay.work("row", chunk).num_slots > 0) == (graph == "split")
    results = {}
    for order, lf in CONFIGS:
        with plan.override(item_order=order, long_items_first=lf, **over):
            results[(order, lf)] = _fwd_bwd(model, lay, leaves, grad, **extra)
    first = results[CONFIGS[0]]
    assert all(torch.isfinite(t).all() and t.abs().sum() > 0 for t in first)
    for cfg, res in results.items():
        for i, (a, b) in enumerate(zip(res, first)):
            assert torch.equal(a, b), f"{cfg}: tensor {i} differs by {(a - b).abs().max():.3g}"
    for kind in ("row", "col"):  # the orders did reach the kernels
        assert not torch.equal(lay.work(kind, chunk, True, "rcm").items,
                               lay.work(kind, chunk, True).items), kind


@pytest.mark.cuda
def test_two_rows_per_warp_is_bitwise_equal_in_every_order():
    ei, n = _batch_like()
    lay = GraphLayout.from_edge_index(ei.cuda(), (n, n))
    q, k, v = (torch.randn(n, 1, 64, device="cuda") for _ in range(3))
    outs = []
    for order in ITEM_ORDERS:
        with plan.override(item_order=order, two_rows=True):
            assert plan.plan_for(lay, F32, 64).two_rows
            outs.append(ops.gt_attention(lay, q, k, v))
    assert outs[0].abs().sum() > 0 and all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.cuda
@pytest.mark.parametrize("long_first", [True, False])
def test_gpu_built_items_order_like_the_torch_build(long_first):
    """The layout-build kernel's items (its own layout of them) reorder to the
    same items as the torch build's."""
    lay_cpu = _hub_graph(n=3000, e=40000, hub=2500, seed=4)
    ei = lay_cpu.edge_index
    lay_gpu = GraphLayout.from_edge_index(ei.cuda(), (3000, 3000))
    lay_ref = GraphLayout.from_edge_index(ei.cuda(), (3000, 3000), kernel=False)
    chunk = plan.plan_for(lay_gpu, F32, 32).chunk
    for kind in ("row", "col"):
        for order in ORDERS:
            a = lay_gpu.work(kind, chunk, long_first, order)
            b = lay_ref.work(kind, chunk, long_first, order)
            assert torch.equal(a.items, b.items) and torch.equal(a.combine, b.combine), \
                (kind, order)
            assert a.items.is_cuda
