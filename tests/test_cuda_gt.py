"""GPU tests of the fused dot-product (GT) kernels against the float64 reference.

Every case draws fresh random inputs, poisons the allocator with NaN first (so
an unwritten output shows), forces both fusion methods, and checks relative
error ||out - ref|| / ||ref||: < 1e-5 (outputs) and < 1e-4 (gradients) in fp32,
< 1e-2 in fp16 / bf16.
"""
import math

import numpy as np
import pytest
import torch

from conftest import stable_seed
import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import calls, plan, reference, tiles
from pyg_dfgnn.work_items import DEFAULT_CHUNK, chunk_for

pytestmark = pytest.mark.cuda

DEV = "cuda"


def dot_args(lay, q, k, v, scale, **kw):
    """dfgnn::attention_fwd's arguments for the dot score (a list to change)."""
    return list(ops.op_args("dot", lay, [q, k, v], (scale,), **kw))


def plan_parts(lay, dtype, C, need_grad=False, strategy="smmf", need_attn=False):
    """The plan object's parts by name (tensors, ints, floats) for a dot call, to
    rebuild it with changes: torch.classes.dfgnn.Plan("dot", *parts)."""
    prep = calls.prepare(ops.spec.get("dot"), lay, dtype, C, strategy, False, need_attn,
                         need_grad)
    return [dict(d) for d in calls.plan_parts(lay, prep.plan, need_grad)]


def rel_err(a, b):
    a, b = a.double(), b.double()
    assert not torch.isnan(a).any(), "NaN in result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def assert_matches_ref(lay, out, alpha, ref, ref_alpha, grads):
    """The fp32 bar against the float64 reference: output and attention weights
    < 1e-5, each (got, want) gradient pair < 1e-4; isolated destinations exactly 0."""
    assert rel_err(out, ref) < 1e-5
    assert rel_err(alpha, lay.to_input_order(ref_alpha)) < 1e-5
    for got, want in grads:
        assert rel_err(got, want) < 1e-4
    isolated = lay.in_degree() == 0
    assert isolated.any() and (out[isolated] == 0).all()


def poison():
    """Fill freed allocator blocks with NaN so outputs that are not written show up."""
    x = torch.empty(64 * 2**20, device=DEV).fill_(float("nan"))
    del x


def random_graph(n_src, n_dst, n_edges, super_deg=0, gen=None):
    """Random edges with duplicates, isolated destinations and optionally a super node."""
    src = torch.randint(0, n_src, (n_edges,), generator=gen)
    dst = torch.randint(0, max(n_dst * 3 // 4, 1), (n_edges,), generator=gen)  # last quarter: no in-edges
    dup = torch.arange(0, n_edges, 7)
    src, dst = torch.cat([src, src[dup]]), torch.cat([dst, dst[dup]])  # duplicate edges
    if super_deg:
        src = torch.cat([src, torch.randint(0, n_src, (super_deg,), generator=gen)])
        dst = torch.cat([dst, torch.zeros(super_deg, dtype=torch.long)])
    perm = torch.randperm(src.numel(), generator=gen)
    return torch.stack([src[perm], dst[perm]]).to(DEV)


GRAPHS = {
    "small": lambda: (random_graph(300, 300, 3000), 300, 300),
    "bipartite": lambda: (random_graph(400, 250, 4000), 400, 250),
    "super_node": lambda: (random_graph(2000, 2000, 8000, super_deg=31000), 2000, 2000),
}


def make_layout(name):
    ei, ns, nd = GRAPHS[name]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    return lay


def qkv(lay, H, C, dtype, requires_grad=False):
    q = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(lay.num_src, H, C, device=DEV, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(lay.num_src, H, C, device=DEV, dtype=dtype, requires_grad=requires_grad)
    return q, k, v


def ref64(lay, q, k, v, grad_out=None):
    q64, k64, v64 = (t.detach().double().requires_grad_(grad_out is not None) for t in (q, k, v))
    out, alpha = reference.dot_attention(lay.rowptr, lay.col, q64, k64, v64)
    if grad_out is None:
        return out, alpha, None
    out.backward(grad_out.double())
    return out, alpha, (q64.grad, k64.grad, v64.grad)


@pytest.mark.parametrize("backward", ["one_launch", "two_launches"])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("H,C", [(1, 8), (2, 16), (4, 32), (8, 64), (1, 128), (2, 100), (1, 7),
                                 (2, 160), (1, 256), (1, 384)])
def test_forward_backward_fp32(graph, strategy, H, C, backward, plan_override):
    """Both backward paths of these small graphs: one launch, and the two-launch
    path of larger graphs (the dq kernel saving each edge's P' and dS for the dk /
    dv SpMM), which plan.override(bwd_launches=2) forces."""
    if backward == "two_launches":
        plan_override(bwd_launches=2)
    torch.manual_seed(stable_seed(graph, strategy, H, C))
    lay = make_layout(graph)
    q, k, v = qkv(lay, H, C, torch.float32, requires_grad=True)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    out, alpha = ops.gt_attention(lay, q, k, v, strategy=strategy, return_attention=True)
    assert ops.uses_kernels(lay, q)
    poison()
    out.backward(g)
    ref, ref_alpha, (dq, dk, dv) = ref64(lay, q, k, v, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha, ((q.grad, dq), (k.grad, dk), (v.grad, dv)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
@pytest.mark.parametrize("graph", ["small", "super_node"])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32), (2, 24), (1, 384)])
def test_half_precision(graph, strategy, dtype, H, C):
    torch.manual_seed(1)
    lay = make_layout(graph)
    q, k, v = qkv(lay, H, C, dtype, requires_grad=True)
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    out = ops.gt_attention(lay, q, k, v, strategy=strategy)
    out.backward(g)
    assert out.dtype == dtype and q.grad.dtype == dtype
    ref, _, (dq, dk, dv) = ref64(lay, q, k, v, g)
    assert rel_err(out, ref) < 1e-2
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert rel_err(got, want) < 1e-2


def _kernel_names(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events()}


def _check_half_forward_backward(lay, q, k, v, g):
    """fp16 / bf16 forward and backward on poisoned memory against the float64
    reference (< 1e-2), isolated rows exactly 0; returns the output."""
    poison()
    out = ops.gt_attention(lay, q, k, v)
    poison()
    out.backward(g)
    ref, _, (dq, dk, dv) = ref64(lay, q, k, v, g)
    assert rel_err(out, ref) < 1e-2
    isolated = lay.in_degree() == 0
    assert isolated.any() and (out[isolated] == 0).all()
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert rel_err(got, want) < 1e-2
    return out


def _tensor_core(kernel_name):
    """A tensor-core forward: the sparse units or the dense tiles."""
    return "gt_fwd_mma_kernel" in kernel_name or "gt_fwd_dense_kernel" in kernel_name


MMA_GRAPHS = {
    # rows of ~90 edges (many 16-edge tiles per row, rows crossing tiles), 200
    # destinations (not a multiple of the kernel's 8 rows per warp)
    "dense": lambda: (random_graph(500, 200, 10_000), 500, 200),
    "small": GRAPHS["small"],
    "bipartite": GRAPHS["bipartite"],
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("graph,H,C", [("dense", 1, 128), ("small", 4, 32), ("bipartite", 2, 64),
                                       ("bipartite", 1, 128), ("dense", 2, 32)])
def test_tensor_core_forward(graph, dtype, H, C, plan_override):
    """The tensor-core forward (dot_forward_mma.cu: fp16 / bf16, C in {32, 64, 128},
    no split rows, no dropout, no attention weights) runs, matches the float64
    reference, and so does the backward that uses its lse; scores of a few units
    make the running maximum of a row rise across its tiles. The chunk of large
    graphs keeps these small graphs' rows whole."""
    plan_override(chunk=DEFAULT_CHUNK)
    torch.manual_seed(stable_seed(graph, str(dtype), H, C))
    ei, ns, nd = MMA_GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    assert lay.max_in_degree <= DEFAULT_CHUNK  # no split rows
    q, k, v = qkv(lay, H, C, dtype)
    q = (q * 3).requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    assert any(_tensor_core(n) for n in _kernel_names(lambda: ops.gt_attention(lay, q, k, v)))
    out = _check_half_forward_backward(lay, q, k, v, g)
    # The CUDA-core kernel (taken when attention weights are requested) agrees.
    names = _kernel_names(lambda: ops.gt_attention(lay, q, k, v, return_attention=True))
    assert not any(_tensor_core(n) for n in names)
    other, _ = ops.gt_attention(lay, q, k, v, return_attention=True)
    assert rel_err(out, other) < 1e-2


def batch_graph(gen, n_graphs=40, density=0.3):
    """A batch of small random graphs one after the other (block-diagonal, like
    the PATTERN / CLUSTER batches) with isolated rows, plus: duplicate edges in the
    first graphs, a row of 300 in-edges from a 40-node window (repeats: its block
    runs sparse), a row whose 200 in-edges all come from one source (a count of
    200, in another block), and a few edges from far away (blocks whose key window
    is over 512 wide: sparse too)."""
    src, dst, off = [], [], 0
    for i in range(n_graphs):
        n = int(torch.randint(20, 150, (1,), generator=gen))
        m = int(density * n * n)
        cells = torch.randperm(n * (n - 1), generator=gen)[:m]  # node n - 1: no in-edges
        s_, d_ = cells % n + off, cells // n + off
        src += [s_, s_[::9]] if i < 3 else [s_]
        dst += [d_, d_[::9]] if i < 3 else [d_]
        off += n
    src += [torch.randint(0, 40, (300,), generator=gen), torch.full((200,), 7)]
    dst += [torch.full((300,), 5), torch.full((200,), 100)]
    far = torch.randint(0, off, (6,), generator=gen)
    src += [(far + off // 2) % off]
    dst += [far]
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    return ei.to(DEV), off


@pytest.mark.parametrize("mode", [None, "force", "3", "off"])
@pytest.mark.parametrize("dtype,H,C", [(torch.bfloat16, 1, 128), (torch.float16, 1, 128),
                                       (torch.bfloat16, 4, 32), (torch.bfloat16, 2, 64),
                                       (torch.float16, 3, 32), (torch.bfloat16, 1, 64),
                                       (torch.bfloat16, 2, 32)])
def test_dense_tile_forward(mode, dtype, H, C, plan_override):
    """The dense-tile tensor-core forward (dot_forward_dense.cu; plan.override's
    dense_tiles: unset = default rule, "force", a cells-per-edge ratio, "off") on a batch of
    small graphs: matches the float64 reference in output and (through its lse) in
    the backward, leaves isolated rows at 0, counts duplicate edges, and agrees
    with the sparse units, in one launch where blocks go both ways."""
    plan_override(chunk=512, dense_tiles=float(mode) if mode == "3" else mode)
    gen = torch.Generator().manual_seed(stable_seed(mode, str(dtype), H, C))
    ei, n = batch_graph(gen)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    assert 300 <= lay.max_in_degree <= plan.plan_for(lay, dtype, C).chunk
    q, k, v = qkv(lay, H, C, dtype)
    q = (q * 3).requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    names = _kernel_names(lambda: ops.gt_attention(lay, q, k, v))
    assert ("gt_fwd_dense_kernel" in " ".join(names)) == (mode != "off")
    # The tile plan has both kinds of blocks: dense, and sparse for the duplicates,
    # the 300-edge row and the far edges.
    lo = tiles.tile_plan(lay)[:8 * ((n + 63) // 64)].view(-1, 8)[:, 0]
    assert 0.5 < (lo >= 0).float().mean() < 1
    out = _check_half_forward_backward(lay, q, k, v, g)
    plan_override(dense_tiles="off")
    sparse = ops.gt_attention(lay, q, k, v)
    assert rel_err(out, sparse) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_backward_deterministic(strategy, dtype):
    """Bitwise the same gradients twice with split rows: fp32 merges them in the
    kernels, bf16 with merge launches (also the split rows' fp32 D_i sums)."""
    torch.manual_seed(2)
    lay = make_layout("super_node")
    q, k, v = qkv(lay, 4, 32, dtype, requires_grad=True)
    g = torch.randn_like(q)
    grads = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        ops.gt_attention(lay, q, k, v, strategy=strategy).backward(g)
        grads.append([t.grad.clone() for t in (q, k, v)])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("graph", ["small", "bipartite", "super_node"])
def test_outputs_of_one_call_are_separate_tensors(graph, dtype):
    """A call keeps its small fp32 scratch in the allocation of one of its outputs
    (the forward's lse, the backward's dQ; cuda/host/scratch.cpp). The outputs must
    still not alias one another, as the schemas promise: distinct storages, each
    output at offset 0 and not a view, and an in-place change of one gradient
    leaves the others as they were."""
    torch.manual_seed(5)
    lay = make_layout(graph)
    q, k, v = qkv(lay, 2, 64, dtype, requires_grad=True)
    g = torch.randn_like(q)
    poison()
    args = dot_args(lay, q.detach(), k.detach(), v.detach(), 0.125)
    outs = torch.ops.dfgnn.attention_fwd.default(*args)[:3]
    assert outs[1].shape == (lay.num_dst, 2) and outs[1].dtype == torch.float32
    assert outs[2].numel() == 0 and not torch.isnan(outs[1]).any()
    ops.gt_attention(lay, q, k, v).backward(g)
    for ts in (outs, (q.grad, k.grad, v.grad)):
        storages = {t.untyped_storage().data_ptr() for t in ts}
        assert len(storages) == 3
        assert all(t._base is None and t.storage_offset() == 0 and t.is_contiguous() for t in ts)
    kept = [t.clone() for t in (q.grad, k.grad, v.grad)]
    q.grad.fill_(float("nan"))
    assert torch.equal(k.grad, kept[1]) and torch.equal(v.grad, kept[2])
    _, _, want = ref64(lay, q, k, v, g)
    for got, w in zip(kept, want):
        assert rel_err(got, w) < (1e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("n_edges", [20_000, 90_000])  # under 2^16 (one launch), over (two)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_backward_one_launch_and_two_launches_agree(dtype, dropout, n_edges):
    """The backward's CSR (dq) and CSC (dk, dv) walks in one launch, the CSC walk
    recomputing each edge's weights with D_i = dO_i . O_i (row_bwd_one_launch_kernel,
    the default under 2^16 edges), and in two, the CSC walk an SpMM with the
    per-edge (P', dS) that the dq kernel saved; plan.override(bwd_launches=) forces each
    on either size. Both match the float64 reference, with split rows merged in the
    kernels, a super node, duplicate edges, a bipartite graph, and the same dropout
    mask."""
    torch.manual_seed(stable_seed(str(dtype), dropout, n_edges))
    ei = random_graph(3_000, 2_000, n_edges, super_deg=4_000)
    hub = torch.stack([torch.zeros(3_000, dtype=torch.long),  # a source of out-degree > 3000
                       torch.randint(0, 2_000, (3_000,))]).to(DEV)
    lay = GraphLayout.from_edge_index(torch.cat([ei, hub], 1), (3_000, 2_000))
    assert (lay.num_edges < 2**16) == (n_edges < 2**16)
    assert lay.work("col", chunk_for(lay.num_edges))[1].shape[0] > 0  # split CSC rows
    q, k, v = qkv(lay, 2, 64, dtype, requires_grad=True)
    g = torch.randn(lay.num_dst, 2, 64, device=DEV, dtype=dtype)
    default = _kernel_names(lambda: ops.gt_attention(lay, q, k, v).backward(g))
    assert any("row_bwd_one_launch_kernel" in n for n in default) == (n_edges < 2**16)
    grads = {}
    for launches in (1, 2):
        with plan.override(bwd_launches=launches):
            names = _kernel_names(lambda: ops.gt_attention(lay, q, k, v).backward(g))
            assert any("row_bwd_one_launch_kernel" in n for n in names) == (launches == 1)
            for t in (q, k, v):
                t.grad = None
            poison()
            torch.manual_seed(99)
            out = ops.gt_attention(lay, q, k, v, dropout=dropout, training=True)
        poison()
        out.backward(g)  # outside the override: the forward's plan decides
        grads[launches] = [t.grad.clone() for t in (q, k, v)]
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    for a, b in zip(grads[1], grads[2]):
        assert rel_err(a, b) < tol
    if dropout == 0.0:
        _, _, want = ref64(lay, q, k, v, g)
        for got, w in zip(grads[1], want):
            assert rel_err(got, w) < tol


def dropout_keep(seed, n_edges, H, p):
    """The kernels' dropout mask, [E, H] bool (True: kept), recomputed on the host:
    splitmix64 of seed + golden * (e * H + h + 1), e the CSR position, 24 bits
    compared with p (cuda/device/dropout.cuh)."""
    M = np.uint64
    with np.errstate(over="ignore"):
        z = M(seed) + M(0x9E3779B97F4A7C15) * (np.arange(n_edges * H, dtype=M) + M(1))
        z = (z ^ (z >> M(30))) * M(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> M(27))) * M(0x94D049BB133111EB)
    z ^= z >> M(31)
    u = (z >> M(40)).astype(np.float32) * np.float32(2.0**-24)
    return torch.from_numpy(u >= np.float32(p)).reshape(n_edges, H)


def test_dropout_keep_matches_known_bits():
    """dropout_keep against bits the device code gives (dropout.cuh compiled for
    the host: seed 123456789012345, p = 0.3, counters 0..63)."""
    want = "1100101111110001101111101011011010110101100001111101110111111101"
    got = "".join(str(int(b)) for b in dropout_keep(123456789012345, 64, 1, 0.3).flatten())
    assert got == want


@pytest.mark.parametrize("launches", [1, 2])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_backward_row_sums_in_fp32(dtype, dropout, launches, plan_override, monkeypatch):
    """fp16 / bf16 backward against float64 with the kernels' dropout mask, where
    D_i = dO_i . O_i decides: values alike (a shared row plus 10 % noise), so
    dS_ij = P_ij (z_ij dP_ij - D_i) keeps a small difference of close terms, on a
    bipartite graph with duplicate edges and a super node (split rows), in both
    backward paths. D from the output rounded to the half type gives the
    gradients 2e-2 (bf16) / 2.5e-3 (fp16) relative error here without dropout,
    4e-3 / 5e-4 with it (float64 emulation); D in fp32 (from the forward's fp32
    rows) leaves the rounding of the gradients themselves, 1.7e-3 / 2.1e-4."""
    plan_override(bwd_launches=launches)
    torch.manual_seed(stable_seed(str(dtype), dropout, launches))
    seed = 987654321987
    monkeypatch.setattr(calls, "seed", lambda: seed)
    ei = random_graph(1_500, 1_000, 12_000, super_deg=3_000)
    lay = GraphLayout.from_edge_index(ei, (1_500, 1_000))
    assert lay.work("row", chunk_for(lay.num_edges))[1].shape[0] > 0  # split rows
    H, C = 2, 64
    q, k, _ = qkv(lay, H, C, dtype, requires_grad=True)
    v = (torch.randn(1, H, C, device=DEV) + 0.1 * torch.randn(lay.num_src, H, C, device=DEV))
    v = v.to(dtype).requires_grad_()
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    out = ops.gt_attention(lay, q, k, v, dropout=dropout, training=True)
    poison()
    names = _kernel_names(lambda: out.backward(g))
    # no walk for D: one pass over the forward's fp32 rows
    assert not any("row_bwd_dsum" in n for n in names)
    assert any("out_dsum_kernel" in n for n in names)
    assert any("row_bwd_one_launch_kernel" in n for n in names) == (launches == 1)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    deg = (lay.rowptr[1:] - lay.rowptr[:-1]).long()
    dst = torch.repeat_interleave(torch.arange(lay.num_dst, device=DEV), deg)
    col = lay.col.long()
    alpha = reference.edge_softmax((q64[dst] * k64[col]).sum(-1) / math.sqrt(C), lay.rowptr)
    if dropout > 0:
        keep = dropout_keep(seed, lay.num_edges, H, dropout).to(DEV)
        assert 0.25 < 1 - keep.double().mean().item() < 0.35
        alpha = alpha * keep / (1 - dropout)
    ref = reference.aggregate(lay.rowptr, lay.col, alpha, v64)
    ref.backward(g.double())
    assert rel_err(out, ref) < 1e-2
    tol = 3.5e-3 if dtype == torch.bfloat16 else 4.5e-4
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert rel_err(got, want) < tol


def _split_row_case(seed, n=6_000, n_edges=60_000, super_deg=5_000):
    torch.manual_seed(seed)
    lay = GraphLayout.from_edge_index(random_graph(n, n, n_edges, super_deg=super_deg), (n, n))
    assert lay.work("row", chunk_for(lay.num_edges))[1].shape[0] > 0  # split rows
    q, k, v = qkv(lay, 2, 64, torch.float32)
    return lay, q, k, v


def test_split_rows_merged_the_same_after_other_layouts():
    """Split rows are merged in the kernel with per-stream arrival counters that
    every launch leaves at zero: a layout gives bit-identical results before and
    after calls on layouts with other split rows (forward and backward)."""
    cases = [_split_row_case(s, super_deg=d) for s, d in ((20, 5_000), (21, 900), (22, 40_000))]

    def run(lay, q, k, v):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = ops.gt_attention(lay, qg, kg, vg, strategy="smmf")
        out.backward(torch.ones_like(out))
        return [out.detach(), qg.grad, kg.grad, vg.grad]

    first = run(*cases[0])
    for c in cases[1:]:
        run(*c)
    for a, b in zip(first, run(*cases[0])):
        assert torch.equal(a, b)
    ref, _, _ = ref64(*cases[0])
    assert rel_err(first[0], ref) < 1e-5


def test_split_rows_on_two_streams():
    """Two streams running split-row kernels at the same time get separate
    counters: both match the result on the default stream."""
    lay, q, k, v = _split_row_case(23, n=40_000, n_edges=600_000, super_deg=30_000)
    want = ops.gt_attention(lay, q, k, v)
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [[], []]
    torch.cuda.synchronize()
    for _ in range(4):
        for s, o in zip(streams, outs):
            with torch.cuda.stream(s):
                o.append(ops.gt_attention(lay, q, k, v))
    torch.cuda.synchronize()
    for o in outs[0] + outs[1]:
        assert torch.equal(o, want)


def test_split_rows_in_cuda_graph():
    """Under CUDA-graph capture split rows are merged by the separate merge
    launches (no counters); the replayed graph matches the reference."""
    lay, q, k, v = _split_row_case(24)
    a_src, a_dst = torch.randn(lay.num_src, 2, device=DEV), torch.randn(lay.num_dst, 2, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (layout caches), as torch.cuda.graph asks
        ops.gt_attention(lay, q, k, v)
        ops.gat_attention(lay, a_src, a_dst, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.gt_attention(lay, q, k, v)
        out_gat = ops.gat_attention(lay, a_src, a_dst, v)
    q.normal_()
    v.normal_()
    graph.replay()
    torch.cuda.synchronize()
    ref, _, _ = ref64(lay, q, k, v)
    assert rel_err(out, ref) < 1e-5
    ref_gat, _ = reference.additive_attention(lay.rowptr, lay.col, a_dst.double(),
                                              a_src.double(), v.double(), 0.2)
    assert rel_err(out_gat, ref_gat) < 1e-5


def test_strategies_agree_and_auto():
    torch.manual_seed(3)
    lay = make_layout("super_node")
    q, k, v = qkv(lay, 2, 64, torch.float32)
    a = ops.gt_attention(lay, q, k, v, strategy="smmf")
    b = ops.gt_attention(lay, q, k, v, strategy="pmf")
    c = ops.gt_attention(lay, q, k, v)
    assert rel_err(a, b) < 1e-5 and rel_err(c, b) < 1e-5


def test_dropout_statistics_and_mask_consistency():
    torch.manual_seed(4)
    n, p = 200_000, 0.3
    # one in-edge per destination: out_i = z_i * v_src(i), z in {0, 1/(1-p)}
    ei = torch.stack([torch.randint(0, n, (n,)), torch.arange(n)]).to(DEV)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    q, k, v = qkv(lay, 2, 8, torch.float32)
    v = v.abs() + 0.1
    out = ops.gt_attention(lay, q, k, v, dropout=p, training=True)
    dropped_rows = (out == 0).all(-1)  # [n, H]
    assert abs(dropped_rows.float().mean().item() - p) < 0.01
    # kept weights are scaled by 1 / (1 - p): out_i = v_src(i) / (1 - p)
    want = v[lay.col.long()] / (1 - p)
    kept = ~dropped_rows
    assert torch.allclose(out[kept], want[kept], rtol=1e-5, atol=1e-6)
    # eval mode: no dropout
    out_eval = ops.gt_attention(lay, q, k, v, dropout=p, training=False)
    assert (out_eval != 0).all()


def _batch_like_layout(n=20_000, n_edges=300_000):
    """At least 2^18 edges and every row within one work item: the shape of the
    batch graphs, where the fp32 forward of 5-32 vectors per head row runs two
    rows per warp (dot_forward.cu)."""
    lay = GraphLayout.from_edge_index(random_graph(n, n, n_edges), (n, n))
    assert lay.num_edges >= plan.TWO_ROWS_MIN_EDGES
    assert lay.max_in_degree <= DEFAULT_CHUNK
    return lay


@pytest.mark.parametrize("H,C", [(1, 128), (2, 100), (4, 32), (2, 64)])
def test_two_rows_per_warp_forward(H, C):
    torch.manual_seed(C)
    lay = _batch_like_layout()
    q, k, v = qkv(lay, H, C, torch.float32, requires_grad=True)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    out, alpha = ops.gt_attention(lay, q, k, v, return_attention=True)
    out.backward(g)
    ref, ref_alpha, (dq, dk, dv) = ref64(lay, q, k, v, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha, ((q.grad, dq), (k.grad, dk), (v.grad, dv)))


def test_two_rows_per_warp_dropout():
    """One in-edge per destination: out_i = z_i v_src(i), z in {0, 1 / (1 - p)}."""
    torch.manual_seed(7)
    n, p = 300_000, 0.3
    ei = torch.stack([torch.randint(0, n, (n,)), torch.arange(n)]).to(DEV)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    assert lay.num_edges >= plan.TWO_ROWS_MIN_EDGES
    q, k, v = qkv(lay, 1, 128, torch.float32)
    v = v.abs() + 0.1
    out = ops.gt_attention(lay, q, k, v, dropout=p, training=True)
    dropped = (out == 0).all(-1)
    assert abs(dropped.float().mean().item() - p) < 0.01
    want = v[lay.col.long()] / (1 - p)
    assert torch.allclose(out[~dropped], want[~dropped], rtol=1e-5, atol=1e-6)


def test_dropout_backward_matches_forward_mask():
    """Directional finite difference with the same seed: the backward regenerates
    the forward's mask."""
    torch.manual_seed(5)
    lay = make_layout("small")
    q, k, v = qkv(lay, 2, 16, torch.float32, requires_grad=True)
    g = torch.randn(lay.num_dst, 2, 16, device=DEV)

    def f(q, k, v):
        torch.manual_seed(1234)  # same dropout seed every call
        return (ops.gt_attention(lay, q, k, v, dropout=0.4, training=True) * g).sum()

    f(q, k, v).backward()
    dirs = [torch.randn_like(t) for t in (q, k, v)]
    eps = 1e-2
    with torch.no_grad():
        plus = f(*(t + eps * d for t, d in zip((q, k, v), dirs)))
        minus = f(*(t - eps * d for t, d in zip((q, k, v), dirs)))
    fd = ((plus - minus) / (2 * eps)).item()
    an = sum((t.grad * d).sum() for t, d in zip((q, k, v), dirs)).item()
    assert abs(fd - an) / abs(an) < 2e-2


#: opcheck's utilities that take an op whose arguments include the Plan object
#: (a ``torch.classes`` object): test_schema takes ``len()`` of every argument, which
#: the Plan answers with NotImplementedError instead of TypeError, and the
#: aot_dispatch checks deep-copy the arguments, which the Plan (per layout, not
#: picklable) refuses. Compiled code never passes the Plan: it names the plan
#: by the layout's handle and a plan key, and that call passes every opcheck
#: (tests/test_compile.py); :func:`opcheck_plan_op` checks what test_schema would
#: (no input is written) itself.
PLAN_OPCHECK = ("test_autograd_registration", "test_faketensor")


def opcheck_plan_op(op, args):
    """``torch.library.opcheck`` of an op that takes the Plan object, and a check
    that the call leaves every input tensor bit for bit as it was."""
    flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))
            if isinstance(t, torch.Tensor)]
    before = [t.detach().clone() for t in flat]
    with torch.no_grad():
        op(*args)
    for t, b in zip(flat, before):
        assert torch.equal(t.detach(), b), "the op wrote into an input"
    torch.library.opcheck(op, args, test_utils=PLAN_OPCHECK)


def test_opcheck():
    torch.manual_seed(6)
    lay = make_layout("super_node")
    q, k, v = qkv(lay, 2, 32, torch.float32, requires_grad=True)
    for pmf in (False, True):
        args = dot_args(lay, q, k, v, 1 / math.sqrt(32), need_attn=pmf,
                        strategy="pmf" if pmf else "smmf")
        opcheck_plan_op(torch.ops.dfgnn.attention_fwd.default, args)


@pytest.mark.parametrize("kernel,mode", [("gt_fwd_mma_kernel", "off"),
                                         ("gt_fwd_dense_kernel", "force")])
def test_opcheck_tensor_core(kernel, mode, plan_override):
    """opcheck of attention_fwd (dot score) on calls that take the tensor-core forwards (bf16, no
    split rows): the sparse units and the dense tiles."""
    plan_override(chunk=DEFAULT_CHUNK, dense_tiles=mode)
    torch.manual_seed(7)
    lay = make_layout("small")
    q, k, v = qkv(lay, 2, 64, torch.bfloat16, requires_grad=True)
    args = dot_args(lay, q, k, v, 1 / 8)
    assert any(kernel in n for n in
               _kernel_names(lambda: torch.ops.dfgnn.attention_fwd.default(*args)))
    opcheck_plan_op(torch.ops.dfgnn.attention_fwd.default, args)


@pytest.mark.parametrize("case", ["k_dtype", "v_noncontig", "double", "k_shape", "q_rows"])
def test_bad_inputs_raise_clear_errors(case):
    lay = make_layout("small")
    q, k, v = qkv(lay, 2, 32, torch.float32)
    args = dot_args(lay, q, k, v, 0.1, need_grad=False)
    inputs, msg = {
        "k_dtype": ([q, k.half(), v], "k has dtype"),
        "v_noncontig": ([q, k, torch.randn(lay.num_src, 32, 2, device=DEV).transpose(1, 2)],
                        "must be contiguous"),
        "double": ([q.double(), k.double(), v.double()], "float32, float16 or bfloat16"),
        "k_shape": ([q, torch.randn(lay.num_src, 2, 16, device=DEV), v], "heads and channels"),
        "q_rows": ([q[:-1], k, v], "rows"),
    }[case]
    with pytest.raises(RuntimeError, match=msg):
        torch.ops.dfgnn.attention_fwd(inputs, *args[1:])
    torch.cuda.synchronize()


@pytest.mark.parametrize("case", ["rowptr_dtype", "col_device", "items_dtype", "csc_part",
                                  "unknown", "missing"])
def test_malformed_layouts_raise_when_the_plan_is_built(case):
    """The plan object checks the layout once, when it is built: a malformed
    entry raises a RuntimeError that names it, before any call."""
    lay = make_layout("small")
    lay.colptr  # noqa: B018
    tensors, ints, floats = plan_parts(lay, torch.float32, 32, need_grad=True)
    change, msg = {
        "rowptr_dtype": ({"rowptr": lay.rowptr.long()}, "rowptr must be int32"),
        "col_device": ({"col": lay.col.cpu()}, "col is on cpu"),
        "items_dtype": ({"row_items": tensors["row_items"].long()}, "work items"),
        "csc_part": ({"colptr": None}, "all together"),
        "unknown": ({"rowpointer": lay.rowptr}, "unknown layout entry"),
        "missing": ({"col": None}, "'col' is missing"),
    }[case]
    for name, val in change.items():
        if val is None:
            del tensors[name]
        else:
            tensors[name] = val
    with pytest.raises(RuntimeError, match=msg):
        torch.classes.dfgnn.Plan("dot", tensors, ints, floats)


@pytest.mark.parametrize("case", ["dtype", "short", "device"])
def test_bad_tile_plan_raises_clear_error(case, plan_override):
    """The dense-tile plan: wrong dtype, too few ints or wrong device raise errors
    that name it when the plan object is built."""
    plan_override(chunk=512, dense_tiles="force")
    ei, n = batch_graph(torch.Generator().manual_seed(3))
    lay = GraphLayout.from_edge_index(ei, (n, n))
    tensors, ints, floats = plan_parts(lay, torch.bfloat16, 64)
    tp = tiles.tile_plan(lay)
    assert tensors["tiles"] is tp
    tensors["tiles"] = {"dtype": tp.long(), "short": tp[:8].clone(), "device": tp.cpu()}[case]
    with pytest.raises(RuntimeError, match="tiles"):
        torch.classes.dfgnn.Plan("dot", tensors, ints, floats)


@pytest.mark.parametrize("case", ["mma_fp32", "mma_attn", "mma_pmf", "two_rows_split",
                                  "two_rows_pmf", "tiles_no_mma", "tiles_no_cells"])
def test_impossible_plan_arguments_raise_before_launch(case, plan_override):
    """A plan decision the call cannot run raises a clear error, when the plan
    object is built or when it is called, never a wrong launch (two rows per
    warp without the split-row merge would leave split rows unmerged; the
    tensor-core kernels have no dropout, attention weights or fp32)."""
    plan_override(chunk=512, dense_tiles="force")
    ei, n = batch_graph(torch.Generator().manual_seed(5))
    lay = GraphLayout.from_edge_index(ei, (n, n))
    q, k, v = qkv(lay, 1, 64, torch.bfloat16)
    tensors, ints, floats = plan_parts(lay, torch.bfloat16, 64)
    assert "tiles" in tensors and ints["mma"] and not ints["two_rows"]
    with plan.override(chunk=4, dense_tiles="off", mma=False):
        split, split_ints, _ = plan_parts(lay, torch.bfloat16, 64)
    assert split_ints["row_slots"] > 0
    pmf = {"pmf": 1}
    no_tiles = {"tiles": None, "dense_cells": 0.0, "dense_backward": 0, "tiles_t": None,
                "rank_pos": None}
    two_rows = {"two_rows": 1, "mma": 0, **no_tiles}
    split_items = {"row_items": split["row_items"], "row_combine": split["row_combine"],
                   "row_slots": split_ints["row_slots"]}
    change, inputs, need_attn, msg = {
        "mma_fp32": (no_tiles, [q.float(), k.float(), v.float()], False, "mma=True"),
        "mma_attn": (no_tiles, [q, k, v], True, "mma=True"),
        "mma_pmf": ({**pmf, "csr_row": lay.csr_row, **no_tiles}, [q, k, v], False, "mma"),
        "two_rows_split": ({**split_items, **two_rows}, [q, k, v], False, "two_rows"),
        "two_rows_pmf": ({**pmf, "csr_row": lay.csr_row, **two_rows}, [q, k, v], False,
                         "two_rows"),
        "tiles_no_mma": ({"mma": 0}, [q, k, v], False, "mma=1"),
        "tiles_no_cells": ({"dense_cells": 0.0}, [q, k, v], False, "dense_cells"),
    }[case]
    for name, val in change.items():
        d = floats if name == "dense_cells" else ints if isinstance(val, int) else tensors
        if val is None:
            d.pop(name, None)
        else:
            d[name] = val
    with pytest.raises(RuntimeError, match=msg):
        obj = torch.classes.dfgnn.Plan("dot", tensors, ints, floats)
        torch.ops.dfgnn.attention_fwd(inputs, lay.handle, obj, 0, [0.125], 0.0, 0, need_attn)
    torch.cuda.synchronize()


@pytest.mark.parametrize("forced", ["mma_split_rows", "two_rows_small", "scalar_two_rows"])
def test_forced_plan_paths_match_reference(forced, plan_override):
    """Paths the default plan does not take but override() may force: the
    tensor-core forward on a graph with split rows (it walks whole rows, whatever
    the work items) and two rows per warp on a small fp32 graph; two_rows on a
    head shape without that variant is refused by the plan (ValueError), never
    silently run as another shape."""
    torch.manual_seed(11)
    lay = make_layout("small" if forced != "mma_split_rows" else "super_node")
    dtype, C = (torch.bfloat16, 64) if forced == "mma_split_rows" else (torch.float32, 32)
    if forced == "scalar_two_rows":
        C = 7
    if forced == "mma_split_rows":
        plan_override(mma=True)
        assert lay.work("row", chunk_for(lay.num_edges)).num_slots > 0
    else:
        plan_override(chunk=DEFAULT_CHUNK, two_rows=True)  # no split rows at chunk 128
    q, k, v = qkv(lay, 2, C, dtype, requires_grad=True)
    g = torch.randn(lay.num_dst, 2, C, device=DEV, dtype=dtype)
    if forced == "scalar_two_rows":
        with pytest.raises(ValueError, match="two rows per warp"):
            ops.gt_attention(lay, q, k, v)
        return
    names = " ".join(_kernel_names(lambda: ops.gt_attention(lay, q, k, v)))
    assert ("gt_fwd_mma_kernel" in names) == (forced == "mma_split_rows")
    for t in (q, k, v):
        t.grad = None
    poison()
    out = ops.gt_attention(lay, q, k, v)
    out.backward(g)
    ref, _, grads = ref64(lay, q, k, v, g)
    tol = 1e-2 if dtype != torch.float32 else 1e-5
    assert rel_err(out, ref) < tol
    for got, want in zip((q.grad, k.grad, v.grad), grads):
        assert rel_err(got, want) < max(tol, 1e-4)


def test_garbage_tile_plan_stays_in_bounds(plan_override):
    """A plan that does not belong to the graph gives wrong numbers, but every
    block reads only inside k, v and the plan: windows past the source rows and
    mask offsets past the plan send blocks to the sparse units, so random plan
    contents never fault (the plan is built by tiles.py; the op cannot check it
    against the graph without a kernel)."""
    plan_override(chunk=512, dense_tiles="force")  # rows whole: the tensor-core forward
    ei, n = batch_graph(torch.Generator().manual_seed(4))
    lay = GraphLayout.from_edge_index(ei, (n, n))
    q, k, v = qkv(lay, 1, 128, torch.bfloat16)
    tensors, ints, floats = plan_parts(lay, torch.bfloat16, 128)
    tp = tiles.tile_plan(lay)
    assert tensors["tiles"] is tp

    def call(tile_plan):
        obj = torch.classes.dfgnn.Plan("dot", {**tensors, "tiles": tile_plan}, ints, floats)
        return torch.ops.dfgnn.attention_fwd([q, k, v], lay.handle, obj, 0, [1 / math.sqrt(128)],
                                             0.0, 0, False)

    gen = torch.Generator(device=DEV).manual_seed(0)
    for lo_hi in ((0, 2**31 - 1), (-5, n + 600), (0, n)):
        bad = torch.randint(*lo_hi, tp.shape, device=DEV, dtype=torch.int32, generator=gen)
        out, lse = call(bad)[:2]
        torch.cuda.synchronize()
        assert out.shape == q.shape and lse.shape == (n, 1)
    out = call(tp)[0]  # and the real plan still gives the right answer afterwards
    ref = reference.dot_attention(lay.rowptr, lay.col, q.double(), k.double(), v.double(),
                                  1 / math.sqrt(128), 0.0, training=False)[0]
    assert rel_err(out, ref) < 1e-2


def test_bad_shapes_raise_value_error():
    lay = make_layout("small")
    q, k, v = qkv(lay, 2, 32, torch.float32)
    with pytest.raises(ValueError, match="destination nodes"):
        ops.gt_attention(lay, q[:-1], k, v)
    with pytest.raises(ValueError, match="dropout"):
        ops.gt_attention(lay, q, k, v, dropout=1.0)


def test_transformer_conv_layer_on_gpu_matches_native():
    from torch_geometric.nn import TransformerConv

    from pyg_dfgnn.nn import FusedTransformerConv
    torch.manual_seed(7)
    ei, n, _ = GRAPHS["super_node"]()
    x = torch.randn(n, 64, device=DEV, requires_grad=True)
    native = TransformerConv(64, 32, heads=4).to(DEV)
    fused = FusedTransformerConv(64, 32, heads=4).to(DEV)
    fused.load_state_dict(native.state_dict())
    a = native(x, ei)
    b = fused(x, ei)
    assert rel_err(b, a) < 1e-5
    ga, = torch.autograd.grad(a.square().sum(), x)
    gb, = torch.autograd.grad(b.square().sum(), x)
    assert rel_err(gb, ga) < 1e-4


def test_torch_compile_fullgraph():
    from pyg_dfgnn.nn import FusedTransformerConv
    torch.manual_seed(8)
    ei, n, _ = GRAPHS["small"]()
    lay = GraphLayout.from_edge_index(ei, (n, n))
    conv = FusedTransformerConv(32, 16, heads=2).to(DEV)
    x = torch.randn(n, 32, device=DEV, requires_grad=True)

    def attention(q, k, v):
        return ops.gt_attention(lay, q, k, v)

    q, k, v = qkv(lay, 2, 16, torch.float32, requires_grad=True)
    compiled = torch.compile(attention, fullgraph=True)
    out = compiled(q, k, v)
    out.sum().backward()
    assert rel_err(out, attention(q, k, v)) < 1e-6
    want = conv(x, ei)  # eager call first: builds and caches the layout on ei
    model = torch.compile(conv, fullgraph=True)
    y = model(x, ei)
    assert rel_err(y, want) < 1e-5
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("op", ["gt", "gt_edge", "gat", "gat_edge", "agnn"])
def test_direct_entry_and_torch_ops_give_the_same_results(op):
    """The op's direct entry (_C.attention_fwd, ops.direct.call_op) and the
    torch.ops path run the same kernels: bit-identical outputs and gradients, and
    the profiler records the op's kernel under the op's name on both."""
    torch.manual_seed(7)
    lay = make_layout("super_node")
    n = lay.num_dst
    if op == "gt":
        leaves = list(qkv(lay, 2, 32, torch.float32, requires_grad=True))
        call = lambda: ops.gt_attention(lay, *leaves)  # noqa: E731
    elif op == "gt_edge":  # the dot_edge score
        leaves = list(qkv(lay, 2, 32, torch.float32, requires_grad=True))
        leaves.append(torch.randn(lay.num_edges, 2, 32, device=DEV, requires_grad=True))
        call = lambda: ops.gt_attention(lay, *leaves[:3], edge=leaves[3])  # noqa: E731
    elif op in ("gat", "gat_edge"):  # gat_edge: the additive_edge score
        leaves = [torch.randn(n, 2, device=DEV, requires_grad=True),
                  torch.randn(n, 2, device=DEV, requires_grad=True),
                  torch.randn(n, 2, 32, device=DEV, requires_grad=True)]
        if op == "gat_edge":
            leaves.append(torch.randn(lay.num_edges, 2, device=DEV, requires_grad=True))
        edge = leaves[3] if op == "gat_edge" else None
        call = lambda: ops.gat_attention(lay, *leaves[:3], edge=edge)  # noqa: E731
    else:
        leaves = [torch.randn(n, 64, device=DEV, requires_grad=True),
                  torch.tensor(0.7, device=DEV, requires_grad=True)]
        call = lambda: ops.agnn_attention(lay, leaves[0], None, leaves[1])  # noqa: E731
    res, g = {}, None
    for direct in (True, False):
        for t in leaves:
            t.grad = None
        poison()
        with (plan.override(direct_entry=direct),
              torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof):
            out = call()
        assert "dfgnn::attention_fwd" in {e.name for e in prof.events()}
        g = torch.randn_like(out) if g is None else g
        poison()
        out.backward(g)
        res[direct] = [out.detach().clone()] + [t.grad.clone() for t in leaves]
    for a, b in zip(res[True], res[False]):
        assert not torch.isnan(a).any() and torch.equal(a, b)
