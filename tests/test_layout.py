"""GraphLayout: CSR/CSC construction from every PyG adjacency type, self-loops,
validation, caching and CacheLayout."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.data import Data
from torch_geometric.utils import (add_self_loops, remove_self_loops, to_torch_coo_tensor,
                                   to_torch_csc_tensor, to_torch_csr_tensor)

from conftest import random_graph
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.layout_cache import get_layout
from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv
from pyg_dfgnn.work_items import chunk_for, split_work
from pyg_dfgnn.transforms import CacheLayout


# ----------------------------------------------------------------------------- checks
def check_csr(lay: GraphLayout, edge_index: Tensor, num_src: int, num_dst: int):
    """The CSR semantics every kernel relies on, against the given input edges."""
    src, dst = edge_index
    E = src.numel()
    assert lay.num_src == num_src and lay.num_dst == num_dst and lay.num_edges == E
    assert lay.rowptr.shape == (num_dst + 1,) and lay.col.shape == (E,)
    assert lay.edge_perm.dtype == torch.long
    # edge_perm is a permutation of the input edges
    assert torch.equal(torch.sort(lay.edge_perm).values, torch.arange(E))
    # col[i] is the source of the input edge edge_perm[i]; rows are sorted by dst
    assert torch.equal(lay.col.long(), src[lay.edge_perm])
    dst_csr = dst[lay.edge_perm]
    assert (dst_csr[1:] >= dst_csr[:-1]).all()
    counts = torch.bincount(dst, minlength=num_dst)
    expect = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    assert torch.equal(lay.rowptr.long(), expect)
    assert lay.max_in_degree == (int(counts.max()) if E else 0)
    assert lay.mean_in_degree == pytest.approx(E / max(num_dst, 1))
    assert torch.equal(lay.in_degree(), counts)
    assert torch.equal(lay.csr_row.long(), dst_csr)


def check_csc(lay: GraphLayout):
    """For every CSC position p: CSR edge perm[p] has source = the CSC column of p
    and destination = row[p]; colptr counts the out-degrees."""
    E = lay.num_edges
    colptr, row, perm = lay.colptr.long(), lay.row.long(), lay.perm.long()
    assert colptr.shape == (lay.num_src + 1,) and row.shape == (E,) and perm.shape == (E,)
    assert torch.equal(torch.sort(perm).values, torch.arange(E))
    csc_col = torch.repeat_interleave(torch.arange(lay.num_src), colptr[1:] - colptr[:-1])
    assert torch.equal(lay.col.long()[perm], csc_col)
    assert torch.equal(lay.csr_row.long()[perm], row)
    out_deg = torch.bincount(lay.col.long(), minlength=lay.num_src)
    assert torch.equal(colptr[1:] - colptr[:-1], out_deg)
    assert lay.max_out_degree == (int(out_deg.max()) if E else 0)


def edge_set(ei: Tensor):
    return sorted(map(tuple, ei.as_subclass(Tensor).t().tolist()))


# ----------------------------------------------------------------------------- construction
@pytest.mark.parametrize("ns,nd", [(15, 15), (12, 7), (5, 9)])
def test_from_edge_index(ns, nd):
    ei = random_graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=5)
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    check_csr(lay, ei, ns, nd)
    check_csc(lay)
    assert torch.equal(lay.edge_index, ei)
    assert not lay.self_loops
    assert lay.col.dtype == torch.int32 and lay.rowptr.dtype == torch.int32
    # stable: within a row, edges keep their input order
    for r in range(nd):
        seg = lay.edge_perm[int(lay.rowptr[r]):int(lay.rowptr[r + 1])]
        assert (seg[1:] > seg[:-1]).all()


def test_inferred_size_and_int32_input():
    ei = random_graph(10, num_edges=30, num_isolated=0)
    lay = GraphLayout.from_edge_index(ei.int())
    n = int(ei.max()) + 1
    check_csr(lay, ei, n, n)


def test_every_adjacency_type_gives_the_same_layout():
    ns, nd = 13, 9
    ei = random_graph(ns, nd, num_edges=45, num_duplicates=0)
    ei = torch.unique(ei, dim=1)  # torch.sparse coalesces duplicates
    ei = ei[:, torch.randperm(ei.size(1))]
    adj_t_size = (nd, ns)
    inputs = {
        "edge_index": ei,
        "EdgeIndex": EdgeIndex(ei, sparse_size=(ns, nd)),
        "sparse_coo": to_torch_coo_tensor(ei.flip(0), size=adj_t_size),
        "sparse_csr": to_torch_csr_tensor(ei.flip(0), size=adj_t_size),
        "sparse_csc": to_torch_csc_tensor(ei.flip(0), size=adj_t_size),
    }
    ref = GraphLayout.from_edge_index(ei, (ns, nd))
    for name, adj in inputs.items():
        size = (ns, nd) if name == "edge_index" else None
        lay = GraphLayout.from_adj(adj, size)
        assert (lay.num_src, lay.num_dst) == (ns, nd), name
        check_csr(lay, lay.edge_index, ns, nd)
        check_csc(lay)
        assert edge_set(lay.edge_index) == edge_set(ei), name
        assert torch.equal(lay.rowptr, ref.rowptr), name
        # same edges per row (the order inside a row follows the input order)
        for r in range(nd):
            s, e = int(ref.rowptr[r]), int(ref.rowptr[r + 1])
            assert sorted(lay.col[s:e].tolist()) == sorted(ref.col[s:e].tolist()), (name, r)


def test_sparse_tensor_input():
    torch_sparse = pytest.importorskip("torch_sparse")
    ns, nd = 11, 8
    ei = torch.unique(random_graph(ns, nd, num_edges=30), dim=1)
    adj = torch_sparse.SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(nd, ns))
    lay = GraphLayout.from_adj(adj)
    check_csr(lay, lay.edge_index, ns, nd)
    assert edge_set(lay.edge_index) == edge_set(ei)
    row, col, _ = adj.coo()  # attention weights come back in adj's COO order
    assert torch.equal(lay.edge_index, torch.stack([col, row]))


@pytest.mark.parametrize("ns,nd", [(14, 14), (12, 7), (6, 10)])
def test_self_loop_variant_matches_pyg(ns, nd):
    ei = random_graph(ns, nd, num_edges=40, num_self_loops=4)
    lay = GraphLayout.from_edge_index(ei, (ns, nd), add_self_loops=True)
    expect, _ = remove_self_loops(ei)
    expect, _ = add_self_loops(expect, num_nodes=min(ns, nd))
    assert torch.equal(lay.edge_index, expect)
    assert lay.self_loops
    check_csr(lay, expect, ns, nd)
    check_csc(lay)
    loops = lay.edge_index[0] == lay.edge_index[1]
    assert int(loops.sum()) == min(ns, nd)


def test_empty_graph():
    lay = GraphLayout.from_edge_index(torch.empty(2, 0, dtype=torch.long), (4, 3))
    check_csr(lay, torch.empty(2, 0, dtype=torch.long), 4, 3)
    check_csc(lay)
    assert lay.max_in_degree == 0


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("ns,nd", [(20, 20), (30, 12), (8, 25)])
def test_dst_extent(loops, ns, nd):
    """``dst_extent``: no destination at or past it has an in-edge; it is the
    least such bound (the last hop of a NeighborLoader batch has no in-edge),
    raised to the self-loop rows with ``add_self_loops``; kept by moves, pickling
    and a prefix narrowed for ``trim_to_layer``."""
    import pickle
    hi = nd // 2
    ei = random_graph(ns, nd, num_edges=60)
    ei = torch.cat([ei[:, ei[1] < hi], torch.tensor([[0], [hi - 1]])], 1)
    lay = GraphLayout.from_edge_index(ei, (ns, nd), add_self_loops=loops)
    want = max(hi, min(ns, nd)) if loops else hi
    assert lay.dst_extent == want
    deg = lay.rowptr.diff()
    assert deg[want:].eq(0).all() and deg[:want].gt(0).any()
    assert lay.to("meta").dst_extent == want
    assert pickle.loads(pickle.dumps(lay)).dst_extent == want
    if not loops:
        grouped = ei[:, torch.sort(ei[1], stable=True).indices]
        parent = GraphLayout.from_edge_index(grouped, (ns, nd))
        part = grouped[:, grouped[1] < hi - 1]
        narrow = parent.narrow(part, (ns, hi - 1))
        assert narrow is not None and narrow.dst_extent == hi - 1
    empty = GraphLayout.from_edge_index(torch.empty(2, 0, dtype=torch.long), (ns, nd),
                                        add_self_loops=loops)
    assert empty.dst_extent == (min(ns, nd) if loops else 0)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("bad,size", [
    (torch.tensor([[0, 1, 5], [1, 2, 0]]), (5, 5)),      # src == N_src
    (torch.tensor([[0, 1, 2], [1, 2, 4]]), (5, 4)),      # dst == N_dst (bipartite)
    (torch.tensor([[0, -1, 2], [1, 2, 0]]), (5, 5)),     # negative
])
def test_out_of_range_indices_raise(bad, size):
    with pytest.raises(ValueError, match="out of range"):
        GraphLayout.from_edge_index(bad, size)


@pytest.mark.parametrize("bad", [
    torch.tensor([0, 1, 2]),
    torch.tensor([[0, 1], [1, 2], [2, 0]]),
    torch.zeros(2, 3, 1, dtype=torch.long),
])
def test_bad_shape_raises(bad):
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        GraphLayout.from_edge_index(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_non_integer_edge_index_raises(dtype):
    with pytest.raises(ValueError, match="integer"):
        GraphLayout.from_edge_index(torch.tensor([[0, 1], [1, 0]]).to(dtype))


# ----------------------------------------------------------------------------- caching
def test_get_layout_caches_and_invalidates(build_count):
    ei = random_graph(12, num_edges=40)
    a = get_layout(ei, (12, 12))
    assert build_count() == 1
    assert get_layout(ei, (12, 12)) is a
    inferred = get_layout(ei)  # an unspecified size is its own cache entry
    assert inferred is not a and get_layout(ei) is inferred and build_count() == 2
    b = get_layout(ei, (12, 12), add_self_loops=True)
    assert b is not a and b.self_loops and not a.self_loops
    assert get_layout(ei, (12, 12), add_self_loops=True) is b
    c = get_layout(ei, (12, 20))  # another size is another layout
    assert c is not a and c.num_dst == 20
    assert build_count() == 4
    # an in-place modification bumps the tensor version: rebuilt
    old_src = int(ei[0, 0])
    ei[0, 0] = (old_src + 1) % 12
    d = get_layout(ei, (12, 12))
    assert d is not a and build_count() == 5
    check_csr(d, ei, 12, 12)
    # a copy of the tensor is a different object: its own cache
    e = get_layout(ei.clone(), (12, 12))
    assert e is not d and build_count() == 6


@pytest.mark.parametrize("kind", ["EdgeIndex", "csr", "coo"])
def test_get_layout_caches_on_other_adjacency_types(kind, build_count):
    ei = torch.unique(random_graph(10, num_edges=30), dim=1).contiguous()
    adj = {"EdgeIndex": lambda: EdgeIndex(ei, sparse_size=(10, 10)),
           "csr": lambda: to_torch_csr_tensor(ei.flip(0), size=(10, 10)),
           "coo": lambda: to_torch_coo_tensor(ei.flip(0), size=(10, 10))}[kind]()
    size = (10, 10) if kind == "EdgeIndex" else None
    a = get_layout(adj, size)
    assert get_layout(adj, size) is a
    assert build_count() == 1


def test_to_device():
    ei = random_graph(10, num_edges=30)
    lay = GraphLayout.from_edge_index(ei, (10, 10))
    lay.colptr  # noqa: B018  (build CSC)
    assert lay.to("cpu") is lay
    assert lay.cpu() is lay
    assert lay.to(torch.float16) is lay  # a dtype cast never touches indices
    moved = lay.to("meta")  # a real move, without a GPU
    assert isinstance(moved, GraphLayout) and moved is not lay
    assert moved.device.type == "meta" and moved.rowptr.device.type == "meta"
    assert moved.col.dtype == lay.col.dtype and moved._csc is not None
    assert (moved.num_src, moved.num_dst, moved.num_edges, moved.max_in_degree) == \
        (lay.num_src, lay.num_dst, lay.num_edges, lay.max_in_degree)
    assert "GraphLayout(" in repr(lay)


# ----------------------------------------------------------------------------- CacheLayout
def test_cache_layout_transform(build_count):
    n = 14
    data = Data(x=torch.randn(n, 8), edge_index=random_graph(n, num_edges=50, num_self_loops=2))
    data = CacheLayout()(data)
    assert isinstance(data.dfgnn_layout, GraphLayout)
    assert not data.dfgnn_layout.self_loops
    check_csr(data.dfgnn_layout, data.edge_index, n, n)
    assert data.dfgnn_layout._csc is not None  # CSC built ahead for the backward
    built = build_count()
    assert built == 2  # with and without self-loops
    for conv in (FusedTransformerConv(8, 4, heads=2), FusedGATConv(8, 4, heads=2),
                 FusedGATConv(8, 4, add_self_loops=False), FusedAGNNConv()):
        conv(data.x, data.edge_index).sum().backward()
    assert build_count() == built
    assert get_layout(data.edge_index, (n, n)) is data.dfgnn_layout


def test_cache_layout_single_variant(build_count):
    data = Data(x=torch.randn(9, 8), edge_index=random_graph(9, num_edges=20))
    data = CacheLayout(self_loops=(True,), with_csc=False)(data)
    assert data.dfgnn_layout.self_loops and build_count() == 1
    FusedGATConv(8, 4)(data.x, data.edge_index)
    assert build_count() == 1
    FusedTransformerConv(8, 4)(data.x, data.edge_index)  # the other variant: one build
    assert build_count() == 2


def test_data_to_moves_stored_layout():
    data = CacheLayout()(Data(x=torch.randn(10, 4), edge_index=random_graph(10, num_edges=30)))
    same = data.to("cpu")
    assert isinstance(same.dfgnn_layout, GraphLayout)
    moved = data.clone().to("meta")
    assert isinstance(moved.dfgnn_layout, GraphLayout)
    assert moved.dfgnn_layout.device.type == "meta"


@pytest.mark.parametrize("kind", ["tensor", "edge_index", "coo", "csr"])
@pytest.mark.parametrize("loops", [False, True])
def test_cached_layout_does_not_keep_the_graph_alive(kind, loops):
    """The layout cached on a batch's adjacency must be freed with it: a hidden
    reference from the layout back to the adjacency made every training batch leak
    (about 40 bytes per edge per step in the end-to-end benchmark)."""
    import gc
    import weakref
    ei = random_graph(40, num_edges=200)
    adj = {"tensor": lambda: ei.clone(),
           "edge_index": lambda: EdgeIndex(ei.clone(), sparse_size=(40, 40)),
           "coo": lambda: to_torch_coo_tensor(ei, size=(40, 40)),
           "csr": lambda: to_torch_coo_tensor(ei, size=(40, 40)).to_sparse_csr()}[kind]()
    ref = weakref.ref(adj)
    lay = weakref.ref(get_layout(adj, None if kind in ("coo", "csr") else (40, 40),
                                 add_self_loops=loops))
    del adj
    gc.collect()
    assert ref() is None and lay() is None


# ----------------------------------------------------------------------------- the build
def _reference_split_work(ptr: Tensor, chunk: int):
    """The work items by their definition (row-major, then longest first where rows split)."""
    ptr = ptr.long()
    deg = ptr[1:] - ptr[:-1]
    n_items = torch.clamp((deg + chunk - 1) // chunk, min=1)
    row = torch.repeat_interleave(torch.arange(deg.numel()), n_items)
    first_item = torch.cumsum(n_items, 0) - n_items
    local = torch.arange(row.numel()) - first_item[row]
    start = ptr[:-1][row] + local * chunk
    split = n_items > 1
    slots_per_row = torch.where(split, n_items, torch.zeros_like(n_items))
    first_slot = torch.cumsum(slots_per_row, 0) - slots_per_row
    slot = torch.where(split[row], first_slot[row] + local, torch.full_like(local, -1))
    items = torch.stack([row, start, slot], 1)
    if bool(split.any()):
        n_edges = torch.clamp(ptr[1:][row] - start, max=chunk)
        items = items[torch.argsort(-n_edges, stable=True)]
    rows = split.nonzero().flatten()
    combine = torch.stack([rows, first_slot[rows], n_items[rows]], 1)
    return items.int(), combine.int(), int(slots_per_row.sum())


def _reference_layout(ei: Tensor, num_src: int, num_dst: int, loops: bool) -> dict:
    """A layout by its definition: PyG's self-loop passes, stable sorts by destination
    (CSR) and by source (CSC)."""
    ei = ei.long()
    if loops:
        ei, _ = remove_self_loops(ei)
        ei, _ = add_self_loops(ei, num_nodes=min(num_src, num_dst))
    dst_sorted, edge_perm = torch.sort(ei[1], stable=True)
    col = ei[0][edge_perm]
    rowptr = torch.cat([torch.zeros(1, dtype=torch.long),
                        torch.bincount(ei[1], minlength=num_dst).cumsum(0)])
    perm = torch.sort(col, stable=True).indices
    colptr = torch.cat([torch.zeros(1, dtype=torch.long),
                        torch.bincount(col, minlength=num_src).cumsum(0)])
    return dict(edge_index=ei, rowptr=rowptr, col=col, csr_row=dst_sorted, edge_perm=edge_perm,
                colptr=colptr, row=dst_sorted[perm], perm=perm,
                max_in_degree=int(rowptr.diff().max()) if ei.size(1) and num_dst else 0)


def _grouped(ei: Tensor) -> Tensor:
    return ei[:, torch.sort(ei[1], stable=True).indices].contiguous()


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("order", ["shuffled", "grouped", "grouped_edge_index"])
@pytest.mark.parametrize("ns,nd,hub", [(300, 300, 0), (300, 300, 90), (250, 120, 70),
                                       (90, 260, 40), (1, 1, 0)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_build_matches_the_definition(loops, order, ns, nd, hub, dtype):
    """Every tensor of the build (CSR, CSC, input order with self-loops, work items of
    both) equals a sort-based construction, on inputs grouped by destination (the
    samplers' order, sort skipped) or not, with duplicates, existing self-loops and
    hubs whose rows split into several work items."""
    ei = random_graph(ns, nd, num_edges=6 * max(ns, nd), num_self_loops=min(ns, nd) // 10 + 1,
                      num_isolated=min(2, nd - 1))
    if hub:  # a destination and a source of high degree: split rows in CSR and CSC
        extra = torch.stack([torch.randint(0, ns, (hub,)), torch.full((hub,), nd // 2)])
        extra2 = torch.stack([torch.full((hub,), ns // 3), torch.randint(0, nd, (hub,))])
        ei = torch.cat([ei, extra, extra2], 1)[:, torch.randperm(ei.size(1) + 2 * hub)]
    if order != "shuffled":
        ei = _grouped(ei)
    adj = ei.to(dtype)
    if order == "grouped_edge_index":
        adj = EdgeIndex(adj, sparse_size=(ns, nd), sort_order="col")
    lay = GraphLayout.from_adj(adj, (ns, nd), add_self_loops=loops)
    ref = _reference_layout(ei, ns, nd, loops)
    for name in ("rowptr", "col", "csr_row", "edge_perm", "colptr", "row", "perm",
                 "edge_index"):
        got = getattr(lay, name)
        assert torch.equal(got.long(), ref[name]), name
        if name != "edge_index" and name != "edge_perm":
            assert got.dtype == torch.int32, name
        assert got.is_contiguous(), name
    assert lay.edge_perm.dtype == lay.edge_index.dtype == torch.long
    assert lay.max_in_degree == ref["max_in_degree"]
    assert lay.self_loops == loops
    chunk = chunk_for(lay.num_edges)
    for kind, ptr in (("row", ref["rowptr"]), ("col", ref["colptr"])):
        cached = lay.derived.work[(kind, chunk, True, "row")]  # built with the layout
        expect = _reference_split_work(ptr, chunk)
        for got, want in zip(cached, expect):
            assert (torch.equal(got, want) and got.dtype == want.dtype
                    if isinstance(want, Tensor) else got == want), kind
        assert all(torch.equal(a, b) if isinstance(a, Tensor) else a == b
                   for a, b in zip(split_work(ptr, chunk), expect)), kind
    if hub:
        assert lay.derived.work[("row", chunk, True, "row")][1].size(0) > 0


def test_build_without_csc_builds_it_on_use():
    ei = random_graph(40, num_edges=200)
    lay = GraphLayout.from_edge_index(ei, (40, 40), with_csc=False)
    assert lay._csc is None
    ref = _reference_layout(ei, 40, 40, False)
    assert torch.equal(lay.perm.long(), ref["perm"]) and torch.equal(lay.row.long(), ref["row"])
    assert torch.equal(lay.colptr.long(), ref["colptr"])


def test_build_does_not_alias_the_input():
    ei = _grouped(random_graph(30, num_edges=100))
    lay = GraphLayout.from_edge_index(ei, (30, 30))
    before = lay.col.clone()
    ei[0].zero_()
    assert torch.equal(lay.col, before)


def test_out_of_range_on_an_empty_side():
    with pytest.raises(ValueError, match="out of range"):
        GraphLayout.from_edge_index(torch.tensor([[0], [0]]), (0, 3))


def test_build_loops_only_graph():
    lay = GraphLayout.from_edge_index(torch.empty(2, 0, dtype=torch.long), (5, 3),
                                      add_self_loops=True)
    assert lay.edge_index.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert lay.rowptr.tolist() == [0, 1, 2, 3] and lay.max_in_degree == 1


@pytest.mark.parametrize("grouped,sorts", [(True, 1), (False, 2)])
def test_grouped_input_skips_the_csr_sort(grouped, sorts):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    ei = random_graph(200, num_edges=1000)
    ei = _grouped(ei) if grouped else ei
    with Count() as c:
        GraphLayout.from_edge_index(ei, (200, 200))
    assert c.ops.count("sort") == sorts  # the CSC's sort, and the CSR's if not grouped
    assert c.ops.count("_local_scalar_dense") == 0  # no item(): the one read is a tolist()


@pytest.mark.cuda
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_build_synchronises_once_on_cuda(loops, grouped):
    ei = random_graph(3000, num_edges=30000)
    ei = (_grouped(ei) if grouped else ei).cuda()
    from benchmarks.layout import count_syncs
    GraphLayout.from_edge_index(ei, (3000, 3000), add_self_loops=loops)  # warm-up
    built = []
    assert count_syncs(lambda: built.append(
        GraphLayout.from_edge_index(ei, (3000, 3000), add_self_loops=loops))) == 1
    lay = built[0]
    ref = _reference_layout(ei.cpu(), 3000, 3000, loops)
    assert torch.equal(lay.col.cpu().long(), ref["col"])
    assert torch.equal(lay.perm.cpu().long(), ref["perm"])


@pytest.mark.cuda
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("hub", [0, 400])
def test_cuda_build_matches_the_definition(loops, grouped, hub):
    n = 5000
    ei = random_graph(n, num_edges=60000, num_self_loops=50)
    if hub:  # split rows in the CSR and the CSC
        ei = torch.cat([ei, torch.stack([torch.randint(0, n, (hub,)), torch.full((hub,), 7)]),
                        torch.stack([torch.full((hub,), 9), torch.randint(0, n, (hub,))])], 1)
    ei = _grouped(ei) if grouped else ei
    lay = GraphLayout.from_edge_index(ei.cuda(), (n, n), add_self_loops=loops)
    ref = _reference_layout(ei, n, n, loops)
    for name in ("rowptr", "col", "csr_row", "edge_perm", "colptr", "row", "perm",
                 "edge_index"):
        assert torch.equal(getattr(lay, name).cpu().long(), ref[name]), name
    chunk = chunk_for(lay.num_edges)
    for kind, ptr in (("row", ref["rowptr"]), ("col", ref["colptr"])):
        got = lay.derived.work[(kind, chunk, True, "row")]
        want = _reference_split_work(ptr, chunk)
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
        assert got[2] == want[2]


@pytest.mark.cuda
def test_cuda_out_of_range_raises_before_any_fault():
    ei = torch.tensor([[0, 1, 70000], [1, 2, 0]], device="cuda")
    with pytest.raises(ValueError, match="out of range"):
        GraphLayout.from_edge_index(ei, (5, 5), add_self_loops=True)
    torch.cuda.synchronize()  # the device is still healthy
    assert GraphLayout.from_edge_index(ei[:, :2], (5, 5)).num_edges == 2
