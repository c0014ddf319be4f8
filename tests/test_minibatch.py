"""Mini-batch training conventions of PyG's NeighborLoader on the fused layers, and
``pyg_dfgnn.nn.fuse``.

Batches come from the real ``NeighborLoader`` where pyg-lib or torch_sparse is
installed, and always from :func:`loader_batch`, which reproduces its conventions
(seeds first, local ids, edges grouped by destination hop by hop,
``num_sampled_nodes`` / ``num_sampled_edges`` per hop, ``disjoint`` trees). On CPU
the fused layers run the reference path: these tests check that they see the
same graph as PyG's ``propagate`` and build one layout per batch.
"""
from __future__ import annotations

import copy
from typing import List, Optional

import pytest
import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv, to_hetero
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
from torch_geometric.utils import trim_to_layer

from conftest import rel_err
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import (FusedAGNNConv, FusedGATConv, FusedTransformerConv, FuseReport,
                          fuse)

HAS_LOADER = WITH_PYG_LIB or WITH_TORCH_SPARSE
needs_loader = pytest.mark.skipif(not HAS_LOADER, reason="NeighborLoader needs pyg-lib or "
                                  "torch_sparse")


# ----------------------------------------------------------------------------- batches
def loader_batch(edge_index: Tensor, num_nodes: int, seeds: Tensor, fanouts: List[int],
                 disjoint: bool = False, generator: Optional[torch.Generator] = None) -> Data:
    r"""One batch in ``NeighborLoader``'s layout: nodes in the order they are
    reached (the seeds first, then each hop's new nodes), local ids, per hop the
    sampled in-edges of that hop's destination nodes in destination order (at
    most ``fanout`` per node, without replacement), ``num_sampled_nodes`` /
    ``num_sampled_edges`` per hop, ``n_id`` (global ids) and ``batch_size``; with
    ``disjoint``, one tree per seed (nodes repeated across trees) and ``batch``."""
    order = torch.sort(edge_index[1], stable=True).indices
    nbr = edge_index[0][order].tolist()
    ptr = [0] + torch.bincount(edge_index[1], minlength=num_nodes).cumsum(0).tolist()
    n_id = seeds.tolist()
    tree = list(range(len(n_id)))
    local = {((t if disjoint else 0), g): i for i, (t, g) in enumerate(zip(tree, n_id))}
    rows, cols, nodes_per_hop, edges_per_hop = [], [], [len(n_id)], []
    frontier = range(len(n_id))
    for k in fanouts:
        start, n_edges = len(n_id), 0
        for dst in frontier:
            cand = nbr[ptr[n_id[dst]]:ptr[n_id[dst] + 1]]
            if len(cand) > k:
                cand = [cand[i] for i in torch.randperm(len(cand), generator=generator)[:k]]
            for s in cand:
                key = (tree[dst] if disjoint else 0, s)
                if key not in local:
                    local[key] = len(n_id)
                    n_id.append(s)
                    tree.append(tree[dst])
                rows.append(local[key])
                cols.append(dst)
                n_edges += 1
        frontier = range(start, len(n_id))
        nodes_per_hop.append(len(n_id) - start)
        edges_per_hop.append(n_edges)
    data = Data(edge_index=torch.tensor([rows, cols], dtype=torch.long).view(2, -1).clone(),
                n_id=torch.tensor(n_id), num_nodes=len(n_id), batch_size=seeds.numel(),
                num_sampled_nodes=nodes_per_hop, num_sampled_edges=edges_per_hop)
    if disjoint:
        data.batch = torch.tensor(tree)
    return data


def real_loader_batch(edge_index: Tensor, num_nodes: int, seeds: Tensor, fanouts: List[int],
                      disjoint: bool = False) -> Data:
    from torch_geometric.loader import NeighborLoader
    if disjoint and not WITH_PYG_LIB:
        pytest.skip("disjoint sampling needs pyg-lib (torch_sparse's sampler rejects it)")
    data = Data(edge_index=edge_index, num_nodes=num_nodes, n_id=torch.arange(num_nodes))
    loader = NeighborLoader(data, num_neighbors=fanouts, input_nodes=seeds,
                            batch_size=seeds.numel(), disjoint=disjoint)
    return next(iter(loader))


def random_sparse_graph(n: int = 300, avg_deg: int = 12) -> Tensor:
    src = torch.randint(0, n, (n * avg_deg,))
    dst = torch.randint(0, n, (n * avg_deg,))
    hub = torch.randint(0, n, (3 * avg_deg,))  # a high in-degree node: fan-outs bite
    return torch.cat([torch.stack([src, dst]), torch.stack([hub, torch.zeros_like(hub)])], 1)


SOURCES = ["conventions", pytest.param("neighbor_loader", marks=needs_loader)]


def make_batch(source: str, fanouts=(6, 4), disjoint: bool = False) -> Data:
    n = 300
    ei = random_sparse_graph(n)
    seeds = torch.randperm(n)[:24]
    seeds[0] = 0  # the hub is a seed
    fn = loader_batch if source == "conventions" else real_loader_batch
    return fn(ei, n, seeds, list(fanouts), disjoint=disjoint)


def test_loader_batch_conventions():
    """The helper's batches follow NeighborLoader's conventions (and the real loader's
    batches the same ones, where it is installed)."""
    for source in ["conventions"] + (["neighbor_loader"] if HAS_LOADER else []):
        b = make_batch(source, fanouts=(6, 4, 3))
        if getattr(b, "num_sampled_nodes", None) is None:  # torch_sparse's sampler does not count hops
            continue
        dst = b.edge_index[1]
        assert b.num_sampled_nodes[0] == b.batch_size == 24
        assert sum(b.num_sampled_nodes) == b.num_nodes
        assert sum(b.num_sampled_edges) == b.edge_index.size(1)
        bounds = torch.tensor([0] + b.num_sampled_nodes).cumsum(0)
        e0 = 0
        for hop, ne in enumerate(b.num_sampled_edges):
            d = dst[e0:e0 + ne]
            assert ((d >= bounds[hop]) & (d < bounds[hop + 1])).all()  # this hop's nodes
            assert (b.edge_index[0, e0:e0 + ne] < bounds[hop + 2]).all()
            e0 += ne
        assert int(torch.bincount(dst).max()) <= 6


# ----------------------------------------------------------------------------- models
def conv_pair(kind: str, cin: int, cout: int, last: bool):
    if kind == "gat":
        return GATConv(cin, cout, heads=2, concat=not last)
    if kind == "gt":
        return TransformerConv(cin, cout, heads=2, concat=not last)
    return AGNNConv()


class Net(torch.nn.Module):
    """A NeighborLoader model: optional hierarchical trimming (``trim_to_layer``)."""

    def __init__(self, kind: str, num_layers: int, trim: bool = False, cin: int = 16):
        super().__init__()
        self.trim = trim
        hidden = 8
        dims = [cin] + [hidden * 2] * (num_layers - 1)
        self.lin = torch.nn.Linear(cin, 16) if kind == "agnn" else None
        self.convs = torch.nn.ModuleList(
            conv_pair(kind, 16 if kind == "agnn" else dims[i], hidden, i == num_layers - 1)
            for i in range(num_layers))

    def forward(self, x, edge_index, num_sampled_nodes=None, num_sampled_edges=None):
        if self.lin is not None:
            x = self.lin(x)
        for i, conv in enumerate(self.convs):
            if self.trim:
                x, edge_index, _ = trim_to_layer(i, num_sampled_nodes, num_sampled_edges, x,
                                                 edge_index)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def compare(native: torch.nn.Module, fused: torch.nn.Module, args_native, args_fused,
            rows: int, build_count=None, builds: Optional[int] = None):
    out_n = native(*args_native)[:rows]
    start = build_count() if build_count else 0
    out_f = fused(*args_fused)[:rows]
    if build_count is not None and builds is not None:
        assert build_count() - start == builds
    assert out_n.abs().sum() > 0
    assert rel_err(out_f, out_n) < 1e-5
    g = torch.randn_like(out_n)
    out_n.backward(g)
    out_f.backward(g)
    check_grads(native, fused)


def check_grads(native: torch.nn.Module, fused: torch.nn.Module):
    """Gradients per parameter, relative to the largest one: some are zero in exact
    arithmetic (a key bias under softmax) and differ only by rounding."""
    pairs = [(name, pn.grad, pf.grad) for (name, pn), pf in zip(native.named_parameters(),
                                                                fused.parameters())]
    assert all(gn is not None and gf is not None for _, gn, gf in pairs)
    scale = max(float(gn.norm()) for _, gn, _ in pairs)
    assert scale > 0
    for name, gn, gf in pairs:
        assert torch.isfinite(gf).all(), name
        assert float((gf - gn).norm()) <= 1e-4 * max(float(gn.norm()), 1e-3 * scale), name


def fused_copy(model):
    report = fuse(model, inplace=False)
    assert report.num_fused == len(report) > 0
    return report.model


# ----------------------------------------------------------------------------- conventions
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("kind", ["gat", "gt", "agnn"])
@pytest.mark.parametrize("disjoint", [False, True])
def test_neighbor_loader_batches(source, kind, disjoint, build_count):
    b = make_batch(source, disjoint=disjoint)
    x = torch.randn(b.num_nodes, 16)
    native = Net(kind, 2)
    fused = fused_copy(native)
    # One layout per batch, shared by both layers (two variants: GT has no self-loops).
    compare(native, fused, (x, b.edge_index), (x, b.edge_index), b.batch_size, build_count, 1)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("kind", ["gat", "gt", "agnn"])
def test_trim_to_layer(source, kind, build_count):
    """PyG's hierarchical trimming: layer ``i`` sees a prefix of the nodes and of the
    edges; the fused layers follow each trimmed view."""
    b = make_batch(source, fanouts=(5, 4, 3))
    if getattr(b, "num_sampled_nodes", None) is None:
        pytest.skip("torch_sparse's sampler does not count hops (trim_to_layer needs pyg-lib)")
    x = torch.randn(b.num_nodes, 16)
    native = Net(kind, 3, trim=True)
    fused = fused_copy(native)
    args = (x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
    compare(native, fused, args, args, b.batch_size, build_count, 3)
    # and the untrimmed model computes the same seed outputs
    full = copy.deepcopy(fused)
    full.trim = False
    assert rel_err(full(x, b.edge_index)[:b.batch_size],
                   native(*args)[:b.batch_size]) < 1e-5


@pytest.mark.parametrize("kind", ["gat", "gt"])
def test_bipartite_calls(kind):
    """``conv((x_src, x_dst), edge_index)`` with ``x_dst`` the first rows (layer-wise
    inference and the sampled hops' destinations)."""
    b = make_batch("conventions")
    n_dst = b.batch_size + b.num_sampled_nodes[1]
    ei = b.edge_index[:, :sum(b.num_sampled_edges[:2])]
    x = torch.randn(b.num_nodes, 16)
    native = (GATConv(16, 8, heads=2, add_self_loops=True) if kind == "gat"
              else TransformerConv(16, 8, heads=2, root_weight=True))
    fused = fused_copy(native)
    compare(native, fused, ((x, x[:n_dst]), ei), ((x, x[:n_dst]), ei), n_dst)
    # a bipartite graph without destination features (GAT: x_dst None)
    if kind == "gat":
        native.add_self_loops = fused.add_self_loops = False
        compare(native, fused, ((x, None), ei, None, (x.size(0), n_dst)),
                ((x, None), ei, None, (x.size(0), n_dst)), n_dst)


def hetero_batch(n_paper: int = 60, n_author: int = 40) -> HeteroData:
    data = HeteroData()
    data["paper"].x = torch.randn(n_paper, 16)
    data["author"].x = torch.randn(n_author, 12)
    cites = random_sparse_graph(n_paper, 5)
    data["paper", "cites", "paper"].edge_index = cites[:, torch.sort(cites[1]).indices]
    writes = torch.stack([torch.randint(0, n_author, (150,)), torch.randint(0, n_paper, (150,))])
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    return data


class HeteroBase(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        make = {"gat": lambda: GATConv((-1, -1), 8, heads=2, add_self_loops=False),
                "gt": lambda: TransformerConv((-1, -1), 8, heads=2)}[kind]
        self.conv1, self.conv2 = make(), make()

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


@pytest.mark.parametrize("kind", ["gat", "gt"])
def test_to_hetero_models(kind, build_count):
    data = hetero_batch()
    if HAS_LOADER:
        from torch_geometric.loader import NeighborLoader
        data = next(iter(NeighborLoader(data, num_neighbors=[5, 3],
                                        input_nodes=("paper", torch.arange(20)),
                                        batch_size=20)))
    native = to_hetero(HeteroBase(kind), data.metadata(), aggr="sum")
    native(data.x_dict, data.edge_index_dict)  # materialise the lazy parameters
    report = fuse(copy.deepcopy(native), inplace=False)
    fused = report.model
    assert len(report) == 6 and report.num_fused == 6  # 2 layers x 3 edge types
    assert all("." in layer.name for layer in report)
    assert all(isinstance(m, (FusedGATConv, FusedTransformerConv)) for m in fused.modules()
               if isinstance(m, (GATConv, TransformerConv)))
    out_n = native(data.x_dict, data.edge_index_dict)
    start = build_count()
    out_f = fused(data.x_dict, data.edge_index_dict)
    assert build_count() - start == 3  # one layout per edge type, shared by both layers
    for key in out_n:
        assert rel_err(out_f[key], out_n[key]) < 1e-5, key
    sum(o.square().sum() for o in out_n.values()).backward()
    sum(o.square().sum() for o in out_f.values()).backward()
    check_grads(native, fused)


# ----------------------------------------------------------------------------- fuse()
def test_fuse_keeps_parameters_and_reports():
    model = torch.nn.ModuleDict({
        "gat": GATConv(16, 8, heads=2),
        "gatv2_t2s": GATv2Conv(16, 8, heads=2, flow="target_to_source"),
        "gt": TransformerConv(16, 8, heads=2),
        "gt_t2s": TransformerConv(16, 8, flow="target_to_source"),
        "agnn": AGNNConv(),
        "agnn_mean": AGNNConv(aggr="mean"),
        "lin": torch.nn.Linear(4, 4),
    })
    params = {k: v for k, v in model.named_parameters()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = fuse(model, strategy="smmf")
    assert isinstance(report, FuseReport) and report.model is model
    assert [(r.name, r.cls, r.fused) for r in report] == [
        ("gat", "GATConv", True), ("gatv2_t2s", "GATv2Conv", False),
        ("gt", "TransformerConv", True), ("gt_t2s", "TransformerConv", False),
        ("agnn", "AGNNConv", True), ("agnn_mean", "AGNNConv", False)]
    reasons = {r.name: r.reason for r in report}
    assert "flow" in reasons["gatv2_t2s"] and "flow" in reasons["gt_t2s"]
    assert "aggr" in reasons["agnn_mean"] and reasons["gat"] == ""
    assert type(model["gat"]) is FusedGATConv and type(model["agnn"]) is FusedAGNNConv
    assert type(model["gt"]) is FusedTransformerConv and model["gt"].strategy == "smmf"
    assert {k: v for k, v in model.named_parameters()} == params  # the same objects
    assert all(params[k] is v for k, v in model.named_parameters())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    text = str(report)
    assert "3 of 6" in text and "gatv2_t2s" in text and "flow" in text
    # a fused layer is fused again with the new strategy
    assert fuse(model, strategy="pmf").num_fused == 3 and model["gat"].strategy == "pmf"


def test_fuse_reports_every_conv(monkeypatch):
    """Every MessagePassing module is listed, with why it is not fused; adding a
    class to ``FUSED`` is all it takes to fuse it."""
    import importlib

    from torch_geometric.nn import GCNConv, GraphConv

    fuse_mod = importlib.import_module("pyg_dfgnn.nn.fuse")  # the module, not the function

    model = torch.nn.ModuleDict({"gat": GATConv(16, 8), "gcn": GCNConv(16, 8),
                                 "graph": GraphConv(16, 8), "lin": torch.nn.Linear(4, 4)})
    report = fuse(model, inplace=False)
    assert [(r.name, r.cls, r.fused) for r in report] == [
        ("gat", "GATConv", True), ("gcn", "GCNConv", False), ("graph", "GraphConv", False)]
    text = str(report)
    assert text.splitlines()[0] == "fuse(): 1 of 3 convs run fused"
    assert "not fused: no fused kernel for GCNConv" in text

    class FusedGraphConv(GraphConv):
        pass

    monkeypatch.setitem(fuse_mod.FUSED, GraphConv, FusedGraphConv)
    report = fuse(model)
    assert type(model["graph"]) is FusedGraphConv and report.num_fused == 2
    assert [r.cls for r in report if r.fused] == ["GATConv", "GraphConv"]


def test_fuse_not_in_place_and_bad_strategy():
    conv = GATConv(16, 8, heads=2)
    report = fuse(conv, inplace=False)
    assert type(conv) is GATConv and type(report.model) is FusedGATConv
    assert report[0].name == "GATConv" and report.num_fused == 1
    with pytest.raises(ValueError, match="strategy"):
        fuse(conv, strategy="fastest")
    assert type(conv) is GATConv


def test_fuse_leaves_other_subclasses():
    class MyGAT(GATConv):
        pass

    model = torch.nn.Sequential(MyGAT(8, 4))
    report = fuse(model)
    assert type(model[0]) is MyGAT and not report[0].fused
    assert "subclass" in report[0].reason


@pytest.mark.parametrize("kind", ["gat", "gt", "agnn"])
def test_fused_model_matches_native_after_fuse(kind):
    """fuse() on a model that already ran (PyG's generated propagate set up per class):
    outputs and gradients equal the native model's, also with explain mode's
    propagate switch on a fused layer."""
    x = torch.randn(50, 16)
    ei = random_sparse_graph(50, 4)
    native = Net(kind, 2)
    native(x, ei)
    fused = copy.deepcopy(native)
    fuse(fused)
    compare(native, fused, (x, ei), (x, ei), 50)
    conv = fused.convs[0]
    conv.explain = False  # PyG's propagate switch, as an explainer leaves it
    assert rel_err(fused(x, ei), native(x, ei)) < 1e-5


def test_fuse_then_layout_is_built_once(build_count):
    b = make_batch("conventions")
    model = Net("gat", 2)
    fuse(model)
    model(torch.randn(b.num_nodes, 16), b.edge_index)
    assert build_count() == 1
    from pyg_dfgnn.layout_cache import get_layout
    lay = get_layout(b.edge_index, (b.num_nodes, b.num_nodes), add_self_loops=True)
    assert build_count() == 1  # the layers' layout, from the cache
    assert isinstance(lay, GraphLayout) and lay.self_loops


# ----------------------------------------------------------------------------- trimmed layouts
def _same_layout(a: GraphLayout, b: GraphLayout):
    from pyg_dfgnn.work_items import chunk_for
    assert (a.num_src, a.num_dst, a.num_edges, a.max_in_degree, a.self_loops) == \
        (b.num_src, b.num_dst, b.num_edges, b.max_in_degree, b.self_loops)
    assert a.derived.max_out_degree == b.max_out_degree  # read by the narrowing's sync
    for name in ("rowptr", "col", "csr_row", "edge_perm", "colptr", "row", "perm", "edge_index"):
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y) and x.dtype == y.dtype and x.is_contiguous(), name
    chunk = chunk_for(b.num_edges)
    for kind in ("row", "col"):
        wa = a.derived.work[(kind, chunk, True, "row")]
        wb = b.derived.work[(kind, chunk, True, "row")]
        assert torch.equal(wa[0], wb[0]) and torch.equal(wa[1], wb[1]) and wa[2] == wb[2], kind


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("loops", [False, True])
def test_trimmed_layout_is_a_prefix(source, loops):
    """Each trim_to_layer view's layout, derived from the first layer's, equals the
    one built from scratch (CSR, CSC, input order, work items). With self-loops
    added the prefix does not serve (``None``): the view is built afresh."""
    from pyg_dfgnn.layout import prefix_base
    b = make_batch(source, fanouts=(8, 6, 5))
    if getattr(b, "num_sampled_nodes", None) is None:
        pytest.skip("torch_sparse's sampler does not count hops (trim_to_layer needs pyg-lib)")
    ei = b.edge_index
    ei[0, 3] = ei[1, 3]  # a self-loop, which GAT's layout removes
    x = torch.randn(b.num_nodes, 4)
    full = GraphLayout.from_edge_index(ei, (b.num_nodes, b.num_nodes), add_self_loops=loops)
    xk, eik = x, ei
    for layer in range(1, 3):
        xk, eik, _ = trim_to_layer(layer, b.num_sampled_nodes, b.num_sampled_edges, xk, eik)
        assert prefix_base(eik) is ei
        n = xk.size(0)
        derived = full.narrow(eik, (n, n))
        assert (derived is None) == loops
        if derived is not None:
            _same_layout(derived, GraphLayout.from_edge_index(eik, (n, n)))


def test_trimmed_layout_refuses_what_is_not_a_prefix():
    b = make_batch("conventions")
    n = b.num_nodes
    full = GraphLayout.from_edge_index(b.edge_index, (n, n))
    m = b.batch_size + b.num_sampled_nodes[1]
    e = b.num_sampled_edges[0]
    assert full.narrow(b.edge_index[:, :e], (m, b.batch_size)) is not None
    short = b.edge_index[:, :e - 1]  # a row cut short: still a prefix of the CSR
    _same_layout(full.narrow(short, (m, b.batch_size)),
                 GraphLayout.from_edge_index(short, (m, b.batch_size)))
    assert full.narrow(b.edge_index[:, :e], (m - 1, b.batch_size)) is None  # a source beyond
    shuffled = b.edge_index[:, torch.randperm(b.edge_index.size(1))]
    lay = GraphLayout.from_edge_index(shuffled, (n, n))
    assert lay.narrow(shuffled[:, :e], (m, b.batch_size)) is None
    flipped = b.edge_index.clone()
    flipped[:, :3] = flipped[:, :3].flip(0)  # hop-1 edges into hop-1 nodes: rows shared
    lay = GraphLayout.from_edge_index(flipped, (n, n))  # with the second hop's edges
    assert lay.narrow(flipped[:, :e], (m, m)) is None
    from pyg_dfgnn.layout import prefix_base
    assert prefix_base(b.edge_index[:, 1:]) is None and prefix_base(b.edge_index) is None


# ----------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["gat", "gt", "agnn"])
@pytest.mark.parametrize("trim", [False, True])
def test_cuda_loader_batches_run_the_kernels(kind, trim):
    """The fused kernels on loader batches (hierarchical trimming included) against
    native PyG: fp32 outputs and gradients."""
    b = make_batch("conventions", fanouts=(8, 5, 3))
    x = torch.randn(b.num_nodes, 16, device="cuda")
    ei = b.edge_index.cuda()
    native = Net(kind, 3, trim=trim).cuda()
    fused = fused_copy(native)
    args = (x, ei, b.num_sampled_nodes, b.num_sampled_edges)
    compare(native, fused, args, args, b.batch_size)


def test_trimmed_view_layout_comes_from_the_parent(monkeypatch):
    """get_layout derives a trim_to_layer view's layout from its parent's (no new
    build) and it equals a fresh build."""
    from torch_geometric.utils import trim_to_layer

    from pyg_dfgnn.layout_cache import get_layout
    b = make_batch("conventions")
    if getattr(b, "num_sampled_nodes", None) is None:
        pytest.skip("torch_sparse's sampler does not count hops (trim_to_layer needs pyg-lib)")
    n = b.num_nodes
    get_layout(b.edge_index, (n, n))
    x = torch.randn(n, 4)
    xk, eik, _ = trim_to_layer(1, b.num_sampled_nodes, b.num_sampled_edges, x, b.edge_index)
    m = xk.size(0)
    with monkeypatch.context() as mp:
        mp.setattr(GraphLayout, "from_adj", None)  # a build from scratch would fail
        lay = get_layout(eik, (m, m))
    _same_layout(lay, GraphLayout.from_edge_index(eik.clone(), (m, m)))


def test_example_trains_from_a_data_folder(tmp_path):
    """examples/train_minibatch.py end to end on CPU, reading ``--data`` as the
    folder that holds ``ogbn-arxiv/`` (a small graph in ogbn-arxiv's files)."""
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np
    n = 300
    g = torch.Generator().manual_seed(0)
    folder = tmp_path / "ogbn-arxiv"
    folder.mkdir()
    np.savez(folder / "edges.npz", edge_index=random_sparse_graph(n, 6).int().numpy())
    np.save(folder / "labels.npy", torch.randint(0, 5, (n,), generator=g).numpy())
    np.save(folder / "split.npy", torch.randint(0, 3, (n,), generator=g).numpy())
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "examples" / "train_minibatch.py"),
                        "--data", str(tmp_path), "--quick", "--device", "cpu",
                        "--batch-size", "32", "--model", "gat"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("epoch 1")]
    assert line and "native: loss" in line[0] and "fused: loss" in line[0], r.stdout[-2000:]
