"""The GPU layout build (``dfgnn::layout_build``, pyg_dfgnn/layout_build.py) against
the torch build it replaces: every tensor bit for bit (CSR, CSC, self-loop variant,
input order, work items of both pointers), on many graph families, and the same
errors for bad indices."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from conftest import random_graph
from pyg_dfgnn import layout_build
from pyg_dfgnn.layout import GraphLayout, LayoutIndexError, _build, gpu_build
from pyg_dfgnn.work_items import SMALL_GRAPH_CHUNK, SMALL_GRAPH_EDGES

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None


# ----------------------------------------------------------------------------- helpers
def _grouped(ei: Tensor) -> Tensor:
    return ei[:, torch.sort(ei[1], stable=True).indices].contiguous()


def _hubs(ei: Tensor, ns: int, nd: int, hub: int) -> Tensor:
    """Adds a destination and a source of degree ``hub`` (split rows in CSR and CSC)."""
    extra = torch.stack([torch.randint(0, ns, (hub,)), torch.full((hub,), nd // 2)])
    extra2 = torch.stack([torch.full((hub,), ns // 3), torch.randint(0, nd, (hub,))])
    ei = torch.cat([ei, extra, extra2], 1)
    return ei[:, torch.randperm(ei.size(1))]


def _work(lay: GraphLayout, kind: str):
    return {key[1:]: val for key, val in lay.derived.work.items() if key[0] == kind}


def assert_same_layout(got: GraphLayout, want: GraphLayout, with_csc: bool = True):
    """Every tensor and statistic of two layouts equal, dtypes included."""
    for name in ("num_src", "num_dst", "num_edges", "max_in_degree", "self_loops",
                 "dst_extent"):
        assert getattr(got, name) == getattr(want, name), name
    for name in ("rowptr", "col", "_csr_row"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.device == b.device and torch.equal(a, b), name
        assert a.is_contiguous(), name
    if want._edge_perm is None:
        assert got._edge_perm is None, "edge_perm: the identity"
    else:
        assert got._edge_perm is not None and got._edge_perm.dtype == torch.long
        assert torch.equal(got._edge_perm, want._edge_perm), "edge_perm"
    assert (got._csc is None) == (want._csc is None)
    if want._csc is not None:
        # read with the build's other statistics: the plan needs no sync for it
        assert got.derived.max_out_degree == want.max_out_degree, "max_out_degree"
        for name, a, b in zip(("colptr", "row", "perm"), got._csc, want._csc):
            assert a.dtype == b.dtype and torch.equal(a, b), name
    for kind in ("row", "col"):
        gw = _work(got, kind)
        # The torch side builds work items at the kernel build's (chunk, order).
        ww = {key: want.work(kind, *key) for key in gw}
        if kind == "row" or got._csc is not None:
            assert gw, kind
        for key in ww:
            for part, a, b in zip(("items", "combine", "slots"), gw[key], ww[key]):
                if isinstance(b, Tensor):
                    assert a.dtype == b.dtype and a.shape == b.shape, (kind, part)
                    assert torch.equal(a, b), (kind, part)
                else:
                    assert a == b, (kind, part)
    assert torch.equal(got.edge_index, want.edge_index)


def build_both(ei: Tensor, ns: int, nd: int, loops: bool, with_csc: bool = True,
               chunk=None, long_first: bool = True):
    """``(kernel layout, torch layout)`` of the same input (its own copy each)."""
    got = gpu_build(ei.clone(), ns, nd, loops, with_csc, chunk, long_first)
    assert got is not None, "the kernel build did not apply"
    want = _build(ei.clone(), ns, nd, loops, with_csc, None, kernel=False)
    return got, want


def check(ei: Tensor, ns: int, nd: int, loops: bool, with_csc: bool = True, chunk=None,
          long_first: bool = True):
    got, want = build_both(ei.cuda(), ns, nd, loops, with_csc, chunk, long_first)
    assert_same_layout(got, want, with_csc)
    return got


# ----------------------------------------------------------------------------- CPU
def test_not_applied_on_the_cpu():
    ei = random_graph(20, num_edges=50)
    assert not layout_build.available(torch.device("cpu"))
    assert gpu_build(ei, 20, 20, False, True) is None


def test_kernel_flag_keeps_the_cpu_build():
    ei = random_graph(30, num_edges=120, num_self_loops=3)
    for loops in (False, True):
        a = GraphLayout.from_edge_index(ei, (30, 30), add_self_loops=loops)
        b = GraphLayout.from_edge_index(ei, (30, 30), add_self_loops=loops, kernel=False)
        assert_same_layout(a, b)


# ----------------------------------------------------------------------------- families
FAMILIES = ["random", "isolated", "duplicates", "self_loops", "hubs", "loops_only_rows",
            "single_edge", "all_self_loops"]


def _rg(ns: int, nd: int, **kw) -> Tensor:
    """conftest.random_graph with at most nd - 1 isolated destinations."""
    kw.setdefault("num_isolated", min(2, nd - 1))
    return random_graph(ns, nd, **kw)


def _family(name: str, ns: int, nd: int) -> Tensor:
    if name == "random":
        return _rg(ns, nd, num_edges=4 * max(ns, nd), num_isolated=0, num_duplicates=0)
    if name == "isolated":
        return _rg(ns, nd, num_edges=3 * max(ns, nd), num_isolated=nd // 3)
    if name == "duplicates":
        ei = _rg(ns, nd, num_edges=2 * max(ns, nd))
        return torch.cat([ei, ei[:, : ei.size(1) // 2], ei[:, :5]], 1)
    if name == "self_loops":
        return _rg(ns, nd, num_edges=3 * max(ns, nd), num_self_loops=min(ns, nd) // 2 + 1)
    if name == "hubs":
        return _hubs(_rg(ns, nd, num_edges=2 * max(ns, nd)), ns, nd, 300)
    if name == "loops_only_rows":  # some destinations hold only their self-loop
        m = min(ns, nd)
        idx = torch.arange(0, m, 3)
        return torch.cat([torch.stack([idx, idx]), _rg(ns, nd, num_edges=ns)], 1)
    if name == "single_edge":
        return torch.tensor([[ns - 1], [nd - 1]])
    if name == "all_self_loops":
        idx = torch.randint(0, min(ns, nd), (40,))
        return torch.stack([idx, idx])
    raise ValueError(name)


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("ns,nd", [(200, 200), (150, 40), (40, 150), (1, 1), (3000, 3000)])
@pytest.mark.parametrize("order", ["shuffled", "grouped"])
@pytest.mark.parametrize("loops", [False, True])
def test_matches_the_torch_build(family, ns, nd, order, loops):
    if (ns, nd) == (1, 1) and family in ("isolated", "hubs"):
        pytest.skip("needs more than one node")
    ei = _family(family, ns, nd)
    if order == "grouped":
        ei = _grouped(ei)
    check(ei, ns, nd, loops)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_csc", [True, False])
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_dtypes_and_without_csc(dtype, with_csc, loops, grouped):
    ns, nd = 500, 300
    ei = _hubs(random_graph(ns, nd, num_edges=2000, num_self_loops=20), ns, nd, 200)
    ei = (_grouped(ei) if grouped else ei).to(dtype)
    lay = check(ei, ns, nd, loops, with_csc)
    assert lay.col.dtype == torch.int32


@pytest.mark.cuda
@pytest.mark.parametrize("ns,nd", [(5, 5), (4, 9), (9, 4), (1, 7)])
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("with_csc", [True, False])
def test_zero_edges(ns, nd, loops, with_csc):
    lay = check(torch.empty(2, 0, dtype=torch.long), ns, nd, loops, with_csc)
    assert lay.num_edges == (min(ns, nd) if loops else 0)


@pytest.mark.cuda
@pytest.mark.parametrize("chunk", [32, 128, 1, 7])
@pytest.mark.parametrize("long_first", [True, False])
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_split_rows(chunk, long_first, loops, grouped):
    """Rows split over many work items (super nodes in both pointers), in row order
    and longest first, over several tiles of rows (5000 nodes)."""
    n = 5000
    ei = random_graph(n, num_edges=40000, num_self_loops=30)
    ei = torch.cat([ei, torch.stack([torch.randint(0, n, (700,)), torch.full((700,), 7)]),
                    torch.stack([torch.full((700,), 4099), torch.randint(0, n, (700,))]),
                    torch.stack([torch.randint(0, n, (129,)), torch.full((129,), 2050)])], 1)
    ei = _grouped(ei) if grouped else ei[:, torch.randperm(ei.size(1))]
    lay = check(ei, n, n, loops, chunk=chunk, long_first=long_first)
    assert lay.derived.work[("row", chunk, long_first, "row")].combine.size(0) > 0  # split rows


@pytest.mark.cuda
@pytest.mark.parametrize("loops", [False, True])
def test_large_batch_with_chunk_128(loops):
    """About 300K edges: the default chunk is 128 (SMALL_GRAPH_EDGES)."""
    n = 60000
    ei = _grouped(random_graph(n, num_edges=300000, num_self_loops=100))
    ei = torch.cat([ei, torch.stack([torch.randint(0, n, (2000,)), torch.full((2000,), n - 1)])], 1)
    lay = check(ei, n, n, loops)
    assert ("row", 128, True, "row") in lay.derived.work


@pytest.mark.cuda
@pytest.mark.parametrize("hub", [2, 32, 33, 256, 257, 1024, 1025, 4096, 4097])
@pytest.mark.parametrize("grouped", [False, True])
def test_csc_column_lengths(hub, grouped):
    """A source of exactly ``hub`` edges (one more with self-loops) among short
    columns: each way the GPU build orders a CSC column (warp ranks up to 32
    edges, block ranks up to 256, a block radix sort of 1,024 or 4,096 keys, a
    device radix sort beyond) gives the torch build's stable order."""
    ns = nd = 3000
    g = torch.Generator().manual_seed(hub)
    ei = torch.stack([torch.randint(0, ns - 1, (20000,), generator=g),
                      torch.randint(0, nd, (20000,), generator=g)])
    hub_edges = torch.stack([torch.full((hub,), ns - 1),
                             torch.randint(0, nd - 1, (hub,), generator=g)])  # no self-loop
    ei = torch.cat([ei, hub_edges], 1)
    ei = ei[:, torch.randperm(ei.size(1), generator=g)]
    if grouped:
        ei = _grouped(ei)
    for loops in (False, True):
        lay = check(ei, ns, nd, loops)
        assert int(lay.colptr[-1] - lay.colptr[-2]) == hub + loops


@pytest.mark.cuda
def test_removed_loops_cross_the_chunk_threshold():
    """E0 + N >= 2^18 but E < 2^18 once the input's self-loops are removed: the
    work items are built for E's chunk (the torch build's prepare())."""
    n = 1000
    E0 = SMALL_GRAPH_EDGES - n
    ei = torch.stack([torch.randint(0, n, (E0,)), torch.randint(0, n, (E0,))])
    idx = torch.arange(300)
    ei[:, :300] = torch.stack([idx, idx])
    ei[0, 300:] = torch.where(ei[0, 300:] == ei[1, 300:], (ei[1, 300:] + 1) % n, ei[0, 300:])
    lay = check(ei, n, n, True)
    assert ("row", SMALL_GRAPH_CHUNK, True, "row") in lay.derived.work


@pytest.mark.cuda
def test_trimmed_view_input():
    """A prefix view (trim_to_layer's narrow: rows with stride E) builds like its copy."""
    ei = _grouped(random_graph(400, num_edges=3000)).cuda()
    view = ei.narrow(1, 0, 1700)
    assert not view.is_contiguous()
    got = gpu_build(view, 400, 400, False, True)
    want = _build(view.contiguous(), 400, 400, False, True, None, kernel=False)
    assert_same_layout(got, want)


@pytest.mark.cuda
def test_from_edge_index_uses_the_kernels_on_cuda():
    ei = random_graph(300, num_edges=2000, num_self_loops=10).cuda()
    for loops in (False, True):
        a = GraphLayout.from_edge_index(ei, (300, 300), add_self_loops=loops)
        b = GraphLayout.from_edge_index(ei, (300, 300), add_self_loops=loops, kernel=False)
        assert_same_layout(a, b)


@pytest.mark.cuda
def test_outputs_save_and_load(tmp_path):
    """The int32 outputs share one allocation (edge_perm, int64, has its own):
    torch.save takes them, and they load equal, with the right strides."""
    ei = random_graph(500, num_edges=4000, num_self_loops=10).cuda()
    lay = gpu_build(ei, 500, 500, True, True)
    tensors = [lay.rowptr, lay.col, lay._csr_row, lay._edge_perm, *lay._csc]
    tensors += [t for w in lay.derived.work.values() for t in (w.items, w.combine)]
    torch.save(tensors, tmp_path / "layout.pt")
    back = torch.load(tmp_path / "layout.pt")
    for a, b in zip(tensors, back):
        assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)
    col = lay.col.clone()
    lay.rowptr.add_(1)  # one output's version counter and values only
    assert torch.equal(lay.col, col) and lay.col._version == 0


@pytest.mark.cuda
def test_deterministic():
    ei = _hubs(random_graph(3000, num_edges=50000, num_self_loops=40), 3000, 3000, 900).cuda()
    a = gpu_build(ei, 3000, 3000, True, True)
    b = gpu_build(ei, 3000, 3000, True, True)
    assert_same_layout(a, b)


# ----------------------------------------------------------------------------- errors
@pytest.mark.cuda
@pytest.mark.parametrize("bad,size", [
    ([[0, 1, 70000], [1, 2, 0]], (5, 5)),
    ([[0, -1], [1, 2]], (5, 5)),
    ([[0, 1], [1, 5]], (5, 5)),
    ([[0, 6], [1, 2]], (6, 3)),
    ([[0, 1], [3, 2]], (6, 3)),
    ([[0, 2**40], [1, 2]], (5, 5)),
    ([[0, 1], [-2**40, 2]], (5, 5)),
])
@pytest.mark.parametrize("loops", [False, True])
def test_out_of_range_raises_as_the_torch_build(bad, size, loops):
    ei = torch.tensor(bad, device="cuda")
    with pytest.raises(LayoutIndexError) as got:
        gpu_build(ei, size[0], size[1], loops, True)
    with pytest.raises(LayoutIndexError) as want:
        _build(ei, size[0], size[1], loops, True, None, kernel=False)
    assert str(got.value) == str(want.value)
    torch.cuda.synchronize()  # no fault: the device is still healthy
    check(ei[:, :1].clamp(0, min(size) - 1), size[0], size[1], loops)


@pytest.mark.cuda
def test_op_rejects_bad_arguments():
    op = torch.ops.dfgnn.layout_build.default
    ei = torch.tensor([[0, 1], [1, 0]], device="cuda")
    with pytest.raises(RuntimeError):  # no CPU kernel (NotImplementedError is one)
        op(ei.cpu(), 2, 2, False, True, 32, True)
    with pytest.raises(RuntimeError, match="int32 or int64"):
        op(ei.float(), 2, 2, False, True, 32, True)
    with pytest.raises(RuntimeError, match="chunk"):
        op(ei, 2, 2, False, True, 0, True)
    with pytest.raises(RuntimeError, match="num_src"):
        op(ei, 0, 2, False, True, 32, True)
    with pytest.raises(RuntimeError, match=r"\[2, E\]"):
        op(ei[0], 2, 2, False, True, 32, True)


@pytest.mark.cuda
def test_empty_side_falls_back_to_the_torch_build():
    ei = torch.tensor([[0], [0]], device="cuda")
    assert gpu_build(ei, 0, 3, False, True) is None
    with pytest.raises(LayoutIndexError):
        GraphLayout.from_edge_index(ei, (0, 3))


@pytest.mark.cuda
@pytest.mark.parametrize("loops", [False, True])
def test_one_synchronisation(loops):
    from benchmarks.layout import count_syncs
    ei = _grouped(random_graph(3000, num_edges=30000)).cuda()
    gpu_build(ei, 3000, 3000, loops, True)  # warm-up
    assert count_syncs(lambda: gpu_build(ei, 3000, 3000, loops, True)) == 1


# ----------------------------------------------------------------------------- property
if given is not None:
    @st.composite
    def graphs(draw):
        ns = draw(st.integers(1, 70))
        nd = draw(st.integers(1, 70))
        E = draw(st.integers(0, 300))
        src = draw(st.lists(st.integers(0, ns - 1), min_size=E, max_size=E))
        dst = draw(st.lists(st.integers(0, nd - 1), min_size=E, max_size=E))
        n_loops = draw(st.integers(0, 20))
        loop_ids = draw(st.lists(st.integers(0, min(ns, nd) - 1), min_size=n_loops,
                                 max_size=n_loops))
        ei = torch.tensor([src + loop_ids, dst + loop_ids], dtype=torch.long).reshape(2, -1)
        if draw(st.booleans()):
            ei = _grouped(ei)
        dtype = draw(st.sampled_from([torch.int32, torch.int64]))
        return (ei.to(dtype), ns, nd, draw(st.booleans()), draw(st.booleans()),
                draw(st.sampled_from([1, 2, 3, 5, 32])), draw(st.booleans()))

    @pytest.mark.cuda
    @settings(max_examples=300, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(graphs())
    def test_property_matches_the_torch_build(case):
        ei, ns, nd, loops, with_csc, chunk, long_first = case
        check(ei, ns, nd, loops, with_csc, chunk, long_first)
