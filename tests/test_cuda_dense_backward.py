"""GPU tests of the dense-tile backward of the dot score
(cuda/scores/dot_backward_dense.cu; the plan's dense_backward): fp16 / bf16
gradients against the float64 reference (relative error < 1e-2) on batch graphs
(PATTERN-like, a batch mixing dense and sparse blocks in both tile plans, a
bipartite batch; isolated nodes, N not a multiple of 64, rows unsorted and
sorted by source), on NaN-poisoned memory, bitwise the same on a second run,
and close to the sparse tensor-core walks (dense_backward off). The plan picks
it on PATTERN-like batches by default, and the launches are the ones it names."""
import pytest
import torch

from benchmarks.generators import sbm_batch
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import plan, tiles
from test_cuda_gt import DEV, batch_graph, poison, ref64, rel_err

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)
SHAPES = [(1, 128), (2, 64), (4, 32), (2, 128)]


def _pattern(sort=False):
    """48 PATTERN-like graphs (279K edges: past the one-launch backward) and 5
    isolated nodes after them."""
    ei, batch, _, _ = sbm_batch("pattern", 48, seed=1)
    n = batch.numel() + 5
    assert n % 64
    if sort:  # rows sorted by source: no rank map
        ei = ei[:, torch.argsort(ei[1] * n + ei[0])]
    return ei.to(DEV), n, n


def _mixed():
    """Blocks of both kinds in both plans: duplicate edges, a row of 300 and a
    column of 200 edges, far edges (test_cuda_gt.batch_graph)."""
    ei, n = batch_graph(torch.Generator().manual_seed(11))
    return ei, n, n


def _bipartite():
    """Small bipartite graphs one after the other: N_src != N_dst."""
    gen = torch.Generator().manual_seed(12)
    src, dst, os_, od = [], [], 0, 0
    for _ in range(40):
        ns, nd = (int(torch.randint(20, 130, (1,), generator=gen)) for _ in range(2))
        cells = torch.randperm(ns * (nd - 1), generator=gen)[:int(0.3 * ns * nd)]
        src.append(cells % ns + os_)
        dst.append(cells // ns + od)  # destination nd - 1: isolated
        os_, od = os_ + ns, od + nd
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    ei = ei[:, torch.randperm(ei.size(1), generator=gen)]
    return ei.to(DEV), os_ + 7, od + 3


GRAPHS = {"pattern": _pattern, "pattern_sorted": lambda: _pattern(True), "mixed": _mixed,
          "bipartite": _bipartite}


def _inputs(lay, H, C, dtype, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def t(n, mul=1.0):
        x = torch.randn(n, H, C, device=DEV, generator=gen) * mul
        return x.to(dtype).requires_grad_()
    q, k, v = t(lay.num_dst, 2.0), t(lay.num_src), t(lay.num_src)
    g = torch.randn(lay.num_dst, H, C, device=DEV, generator=gen).to(dtype)
    return q, k, v, g


def _grads(lay, q, k, v, g):
    """(dq, dk, dv) of one forward and backward, both on NaN-poisoned memory."""
    for x in (q, k, v):
        x.grad = None
    poison()
    out = ops.gt_attention(lay, q, k, v)
    poison()
    out.backward(g)
    return [x.grad.clone() for x in (q, k, v)]


def _backward_kernels(lay, q, k, v, g):
    out = ops.gt_attention(lay, q, k, v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out.backward(g)
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("H,C", SHAPES)
def test_dense_backward_matches_reference(graph, dtype, H, C, plan_override):
    ei, ns, nd = GRAPHS[graph]()
    if not graph.startswith("pattern"):
        # Rows whole (chunk 512), the tensor-core walks on this small graph, every
        # block dense that can be, forward and backward.
        plan_override(chunk=512, mma_backward=True, dense_tiles="force", dense_backward=True)
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    p = plan.plan_for(lay, dtype, C)
    assert p.dense_backward, p.why  # PATTERN-like: by the default rules
    entry = tiles.layout_tiles_t(lay)
    # Duplicates and far edges (mixed) leave blocks without a window: only there
    # are weights saved, and only there is the rank map built (rows unsorted).
    assert entry.windowed == (graph != "mixed") and p.save_weights == (graph == "mixed")
    assert (entry.rank_pos is None) == (graph != "mixed")
    if graph == "mixed":  # dense and sparse blocks in both plans
        for pl, n in ((tiles.tile_plan(lay), nd), (entry.tiles_t, ns)):
            lo = pl[:8 * ((n + 63) // 64)].view(-1, 8)[:, 0]
            assert (lo >= 0).any() and (lo < 0).any()
    q, k, v, g = _inputs(lay, H, C, dtype, hash((graph, H, C)) % 2**31)
    names = _backward_kernels(lay, q, k, v, g)
    assert "gt_bwd_dq_dense_kernel" in names and "gt_bwd_dkv_dense_kernel" in names
    assert "gt_bwd_dq_mma_kernel" not in names and "gt_bwd_dkv_mma_kernel" not in names

    got = _grads(lay, q, k, v, g)
    _, _, want = ref64(lay, q, k, v, g)
    for name, a, b in zip("qkv", got, want):
        assert rel_err(a, b) < 1e-2, f"d{name}"
    dst_iso = lay.in_degree() == 0
    src_iso = (lay.colptr[1:] - lay.colptr[:-1]) == 0
    assert dst_iso.any() and (graph == "mixed" or src_iso.any())
    assert (got[0][dst_iso] == 0).all()  # isolated nodes: gradients written, zero
    assert (got[1][src_iso] == 0).all() and (got[2][src_iso] == 0).all()
    again = _grads(lay, q, k, v, g)
    for a, b in zip(got, again):
        assert torch.equal(a, b)  # deterministic: no atomics

    plan_override(dense_backward=False)  # the sparse tensor-core walks
    assert not plan.plan_for(lay, dtype, C).dense_backward
    names = _backward_kernels(lay, q, k, v, g)
    assert "gt_bwd_dq_dense_kernel" not in names and "gt_bwd_dq_mma_kernel" in names
    sparse = _grads(lay, q, k, v, g)
    for name, a, b in zip("qkv", got, sparse):
        assert rel_err(a, b) < 1e-2, f"d{name}"


@pytest.mark.parametrize("sort", [False, True])
@pytest.mark.parametrize("dtype", HALF)
def test_dense_backward_writes_every_edges_weights(dtype, sort, plan_override):
    """The dq launch's dense blocks write each edge's (P, dS) at the CSR position
    of its rank in its row (through the rank map where rows are unsorted): with
    every block of the transposed plan sent to the sparse units, which read
    those weights, dk and dv still match the reference."""
    ei, ns, nd = _pattern(sort)
    plan_override(dense_backward=True)  # whatever the default rule says
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    assert plan.plan_for(lay, dtype, 64).dense_backward
    entry = tiles.layout_tiles_t(lay)
    n_meta = 8 * ((ns + 63) // 64)
    sparse_t = entry.tiles_t.clone()
    sparse_t[:n_meta].view(-1, 8)[:, 0] = -1  # every source block to the sparse units
    lay.derived.tile_plan_t = entry._replace(tiles_t=sparse_t, windowed=False)
    lay.derived.plans.clear()
    lay.derived.calls.clear()
    assert plan.plan_for(lay, dtype, 64).save_weights
    q, k, v, g = _inputs(lay, 2, 64, dtype, 7)
    got = _grads(lay, q, k, v, g)
    _, _, want = ref64(lay, q, k, v, g)
    for name, a, b in zip("qkv", got, want):
        assert rel_err(a, b) < 1e-2, f"d{name}"


@pytest.mark.parametrize("H,C", [(1, 128), (4, 32)])
def test_dense_backward_without_saved_weights(H, C, plan_override):
    """Where every transposed block has a window the backward saves no weights:
    the same gradients, bitwise, as with them saved (every block runs dense either
    way on PATTERN-like graphs), and a peak memory lower by at least their
    E x H x 8 bytes."""
    ei, ns, nd = _pattern()
    plan_override(dense_backward=True)
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    q, k, v, g = _inputs(lay, H, C, torch.bfloat16, 9)
    runs = {}
    for save in (False, True):
        plan_override(save_weights=None if not save else True)
        assert plan.plan_for(lay, torch.bfloat16, C).save_weights == save
        grads = _grads(lay, q, k, v, g)  # warm: plans, layouts, allocator
        out = ops.gt_attention(lay, q, k, v)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out.backward(g)
        torch.cuda.synchronize()
        runs[save] = grads, torch.cuda.max_memory_allocated() - base
    assert tiles.layout_tiles_t(lay).windowed
    for a, b in zip(runs[False][0], runs[True][0]):
        assert torch.equal(a, b)
    assert runs[True][1] - runs[False][1] >= lay.num_edges * H * 8
    _, _, want = ref64(lay, q, k, v, g)
    for name, a, b in zip("qkv", runs[False][0], want):
        assert rel_err(a, b) < 1e-2, f"d{name}"


def test_dense_backward_off_by_default_where_the_forward_is_sparse():
    """A random graph (wide windows): no dense forward, no dense backward."""
    gen = torch.Generator().manual_seed(13)
    n = 4000
    ei = torch.stack([torch.randint(0, n, (20 * n,), generator=gen),
                      torch.arange(n).repeat(20)]).to(DEV)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    p = plan.plan_for(lay, torch.bfloat16, 64)
    assert p.mma_backward and p.dense_cells == 0 and not p.dense_backward
