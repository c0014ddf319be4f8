"""GPU tests of the fused additive-attention (GAT) kernels against the float64
reference: fresh random inputs, NaN-poisoned allocator, fp32 < 1e-5 (outputs) and
< 1e-4 (gradients), fp16 / bf16 < 1e-2; dropout statistics and mask consistency,
determinism, opcheck and the layer against native GATConv."""
import pytest
import torch

from conftest import rel_err_floor, stable_seed
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import calls, plan, reference
from test_cuda_gt import (DEV, GRAPHS, assert_matches_ref, opcheck_plan_op, poison,
                          random_graph, rel_err)

pytestmark = pytest.mark.cuda

#: The additive score's forwards: SMMF on the shared row walk and on its own walk
#: (the plan's row_walk, forced), and PMF.
STRATEGIES = ["smmf-row", "smmf-own", "pmf"]


def walk(strategy, plan_override):
    """The op's ``strategy`` for an entry of :data:`STRATEGIES`, its walk forced."""
    if strategy.startswith("smmf-"):
        plan_override(row_walk=strategy == "smmf-row")
        return "smmf"
    return strategy


def make(graph, H, C, dtype, requires_grad=True, scale=1.0):
    ei, ns, nd = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    x = torch.randn(ns, H, C, device=DEV, dtype=dtype, requires_grad=requires_grad)
    a_src = (scale * torch.randn(ns, H, device=DEV)).to(dtype).requires_grad_(requires_grad)
    a_dst = (scale * torch.randn(nd, H, device=DEV)).to(dtype).requires_grad_(requires_grad)
    return lay, a_src, a_dst, x


def ref64(lay, a_src, a_dst, x, slope, g):
    t = [u.detach().double().requires_grad_() for u in (a_src, a_dst, x)]
    out, alpha = reference.additive_attention(lay.rowptr, lay.col, t[1], t[0], t[2], slope)
    out.backward(g.double())
    return out, alpha, [u.grad for u in t]


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("H,C", [(1, 8), (2, 16), (4, 32), (8, 64), (1, 128), (2, 100), (1, 7),
                                 (2, 160), (1, 256), (1, 384)])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_forward_backward_fp32(graph, H, C, strategy, plan_override):
    strategy = walk(strategy, plan_override)
    torch.manual_seed(stable_seed(graph, H, C))
    lay, a_src, a_dst, x = make(graph, H, C, torch.float32)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    out, alpha = ops.gat_attention(lay, a_src, a_dst, x, negative_slope=0.2,
                                   return_attention=True, strategy=strategy)
    assert ops.uses_kernels(lay, x)
    poison()
    out.backward(g)
    ref, ref_alpha, (ds, dd, dx) = ref64(lay, a_src, a_dst, x, 0.2, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha,
                       ((a_src.grad, ds), (a_dst.grad, dd), (x.grad, dx)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("graph", ["small", "super_node"])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32), (2, 24), (1, 384)])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_half_precision(graph, dtype, H, C, strategy, plan_override):
    strategy = walk(strategy, plan_override)
    torch.manual_seed(11)
    lay, a_src, a_dst, x = make(graph, H, C, dtype)
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    out = ops.gat_attention(lay, a_src, a_dst, x, strategy=strategy)
    out.backward(g)
    assert out.dtype == dtype and x.grad.dtype == dtype and a_src.grad.dtype == dtype
    ref, _, (ds, dd, dx) = ref64(lay, a_src, a_dst, x, 0.2, g)
    assert rel_err(out, ref) < 1e-2
    for got, want in ((a_src.grad, ds), (a_dst.grad, dd), (x.grad, dx)):
        assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("graph", ["bipartite", "super_node"])
def test_gradients_of_one_call_are_separate_tensors(graph):
    """The backward keeps its small scratch in dx's allocation (cuda/host/scratch.cpp):
    the gradients still have storages of their own and are right."""
    torch.manual_seed(13)
    lay, a_src, a_dst, x = make(graph, 2, 64, torch.float32)
    g = torch.randn(lay.num_dst, 2, 64, device=DEV)
    ops.gat_attention(lay, a_src, a_dst, x).backward(g)
    grads = [a_src.grad, a_dst.grad, x.grad]
    assert len({t.untyped_storage().data_ptr() for t in grads}) == 3
    assert all(t._base is None and t.storage_offset() == 0 and t.shape == u.shape
               for t, u in zip(grads, (a_src, a_dst, x)))
    _, _, want = ref64(lay, a_src, a_dst, x, 0.2, g)
    for got, w in zip(grads, want):
        assert rel_err(got, w) < 1e-4


@pytest.mark.parametrize("row_walk", [True, False])
def test_backward_deterministic(row_walk, plan_override):
    plan_override(row_walk=row_walk)
    torch.manual_seed(12)
    lay, a_src, a_dst, x = make("super_node", 4, 32, torch.float32)
    g = torch.randn(lay.num_dst, 4, 32, device=DEV)
    grads = []
    for _ in range(2):
        for t in (a_src, a_dst, x):
            t.grad = None
        ops.gat_attention(lay, a_src, a_dst, x).backward(g)
        grads.append([t.grad.clone() for t in (a_src, a_dst, x)])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("graph", ["sparse", "super_node"])
def test_two_walks_agree(graph, dtype, plan_override):
    """The row walk and the own walk round the score alike (gat_score2), so the
    additive backward, which recomputes the weights from the saved lse, serves
    both: out and lse agree to a few ulps, and a row of one edge, whose a_dst
    gradient is zero in exact arithmetic (P = 1), gets only rounding's share of
    it after either forward: P = exp(s - lse) is 1 to an ulp of s and lse."""
    torch.manual_seed(31)
    if graph == "sparse":  # mean in-degree 1.5: many rows of one edge
        lay = GraphLayout.from_edge_index(random_graph(2000, 2000, 3000), (2000, 2000))
        x = torch.randn(2000, 2, 32, device=DEV, dtype=dtype, requires_grad=True)
        a_src, a_dst = (torch.randn(2000, 2, device=DEV).to(dtype).requires_grad_()
                        for _ in range(2))
    else:
        lay, a_src, a_dst, x = make(graph, 2, 32, dtype)
    one = lay.in_degree() == 1
    assert one.any()
    res, stray = {}, {}
    for row_walk in (True, False):
        plan_override(row_walk=row_walk)
        args = ops.op_args("additive", lay, [a_src.detach(), a_dst.detach(), x.detach()], (0.2,),
                           need_grad=False)
        res[row_walk] = torch.ops.dfgnn.attention_fwd(*args)[:2]
        for t in (a_src, a_dst, x):
            t.grad = None
        ops.gat_attention(lay, a_src, a_dst, x).sum().backward()
        g = a_dst.grad.float().abs()
        stray[row_walk] = (g[one].max() / g[~one].max()).item()
    assert max(stray.values()) <= 1e-5, stray
    (out_r, lse_r), (out_o, lse_o) = res[True], res[False]
    live = torch.isfinite(lse_o)
    assert torch.equal(torch.isfinite(lse_r), live)
    assert (lse_r[live] - lse_o[live]).abs().max() <= 4e-6 * lse_o[live].abs().max().clamp(min=1)
    assert rel_err(out_r.float(), out_o.float()) < (1e-6 if dtype == torch.float32 else 8e-3)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dropout_statistics(strategy, plan_override):
    strategy = walk(strategy, plan_override)
    torch.manual_seed(13)
    n, p = 200_000, 0.6
    ei = torch.stack([torch.randint(0, n, (n,)), torch.arange(n)]).to(DEV)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x = torch.rand(n, 2, 4, device=DEV) + 0.1
    a = torch.randn(n, 2, device=DEV)
    out = ops.gat_attention(lay, a, a, x, dropout=p, training=True, strategy=strategy)
    dropped = (out == 0).all(-1)
    assert abs(dropped.float().mean().item() - p) < 0.01
    want = x[lay.col.long()] / (1 - p)
    assert torch.allclose(out[~dropped], want[~dropped], rtol=1e-5, atol=1e-6)
    assert (ops.gat_attention(lay, a, a, x, dropout=p, training=False) != 0).all()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dropout_backward_matches_forward_mask(strategy, plan_override):
    strategy = walk(strategy, plan_override)
    torch.manual_seed(14)
    lay, a_src, a_dst, x = make("small", 2, 16, torch.float32)
    g = torch.randn(lay.num_dst, 2, 16, device=DEV)

    def f(a_src, a_dst, x):
        torch.manual_seed(4321)
        return (ops.gat_attention(lay, a_src, a_dst, x, dropout=0.5, training=True,
                                  strategy=strategy) * g).sum()

    f(a_src, a_dst, x).backward()
    dirs = [torch.randn_like(t) for t in (a_src, a_dst, x)]
    eps = 1e-2
    with torch.no_grad():
        plus = f(*(t + eps * d for t, d in zip((a_src, a_dst, x), dirs)))
        minus = f(*(t - eps * d for t, d in zip((a_src, a_dst, x), dirs)))
    fd = ((plus - minus) / (2 * eps)).item()
    an = sum((t.grad * d).sum() for t, d in zip((a_src, a_dst, x), dirs)).item()
    assert abs(fd - an) / abs(an) < 2e-2


@pytest.mark.parametrize("row_walk", [True, False])
@pytest.mark.parametrize("super_deg", [0, 40_000])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32), (2, 64), (2, 100)])
def test_two_rows_per_warp(H, C, super_deg, row_walk, plan_override):
    """At least 2^18 edges: the fp32 SMMF forward runs two rows per warp on either
    walk (additive_forward.cu, additive_row.cuh), with and without split rows (a
    super node)."""
    plan_override(row_walk=row_walk)
    torch.manual_seed(C + super_deg)
    n = 20_000
    ei = random_graph(n, n, 300_000, super_deg=super_deg)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    assert lay.num_edges >= plan.TWO_ROWS_MIN_EDGES
    x = torch.randn(n, H, C, device=DEV, requires_grad=True)
    a_src = torch.randn(n, H, device=DEV, requires_grad=True)
    a_dst = torch.randn(n, H, device=DEV, requires_grad=True)
    g = torch.randn(n, H, C, device=DEV)
    poison()
    out, alpha = ops.gat_attention(lay, a_src, a_dst, x, return_attention=True, strategy="smmf")
    out.backward(g)
    ref, ref_alpha, (ds, dd, dx) = ref64(lay, a_src, a_dst, x, 0.2, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha,
                       ((a_src.grad, ds), (a_dst.grad, dd), (x.grad, dx)))


@pytest.mark.parametrize("row_walk", [True, False])
def test_two_rows_per_warp_dropout(row_walk, plan_override):
    """One in-edge per destination, 2^18+ edges, C = 128: out_i = z_i x_src(i)."""
    plan_override(row_walk=row_walk)
    torch.manual_seed(15)
    n, p = 300_000, 0.6
    ei = torch.stack([torch.randint(0, n, (n,)), torch.arange(n)]).to(DEV)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    assert lay.num_edges >= plan.TWO_ROWS_MIN_EDGES
    x = torch.rand(n, 1, 128, device=DEV) + 0.1
    a = torch.randn(n, 1, device=DEV)
    out = ops.gat_attention(lay, a, a, x, dropout=p, training=True, strategy="smmf")
    dropped = (out == 0).all(-1)
    assert abs(dropped.float().mean().item() - p) < 0.01
    want = x[lay.col.long()] / (1 - p)
    assert torch.allclose(out[~dropped], want[~dropped], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["gt", "gat", "gat-own"])
@pytest.mark.parametrize("H,C", [(4, 32), (1, 128), (2, 100), (1, 7)])
def test_many_split_rows(plan_override, model, H, C):
    """Work items of 4 edges: thousands of split rows (and columns) of a few slots,
    and a super node of 6,000 in-edges, 1,500 slots merged up a 4-level tree
    (device/split_merge.cuh, merge_split_row); forward and backward against float64."""
    plan_override(chunk=4)
    if model.startswith("gat"):  # "gat": the shared row walk, "gat-own": the score's own
        plan_override(row_walk=model == "gat")
    torch.manual_seed(H * 1000 + C)
    n = 12_000
    ei = random_graph(n, n, 150_000, super_deg=6_000)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    combine = lay.work("row", 4)[1]
    assert combine.shape[0] > 8000 and combine[:, 2].max() > 8 ** 3  # split rows, a deep tree
    g = torch.randn(n, H, C, device=DEV)
    if model.startswith("gat"):
        a_src, a_dst = (torch.randn(n, H, device=DEV, requires_grad=True) for _ in range(2))
        x = torch.randn(n, H, C, device=DEV, requires_grad=True)
        poison()
        out = ops.gat_attention(lay, a_src, a_dst, x, strategy="smmf")
        out.backward(g)
        ref, _, grads = ref64(lay, a_src, a_dst, x, 0.2, g)
        got = (a_src.grad, a_dst.grad, x.grad)
    else:
        q, k, v = (torch.randn(n, H, C, device=DEV, requires_grad=True) for _ in range(3))
        poison()
        out = ops.gt_attention(lay, q, k, v, strategy="smmf")
        out.backward(g)
        t = [u.detach().double().requires_grad_() for u in (q, k, v)]
        ref, _ = reference.dot_attention(lay.rowptr, lay.col, *t)
        ref.backward(g.double())
        grads, got = [u.grad for u in t], (q.grad, k.grad, v.grad)
    assert rel_err(out, ref) < 1e-5
    for a, b in zip(got, grads):
        assert rel_err(a, b) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("H,C", [(4, 32), (1, 128)])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("row_walk", [True, False])
def test_half_split_rows_backward(plan_override, dtype, H, C, dropout, row_walk):
    """fp16 / bf16 with thousands of split rows (work items of 4 edges and a super
    node): their D_i and d a_dst_i come from the items' shares
    (gat_split_dsum_kernel), against float64 without dropout, and with dropout
    against the fp32 kernels of the same seed (the same mask), which the float64
    reference has no mask for."""
    plan_override(chunk=4, row_walk=row_walk)
    torch.manual_seed(H * 100 + C)
    n = 6_000
    ei = random_graph(n, n, 60_000, super_deg=3_000)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    assert lay.work("row", 4)[1].shape[0] > 1000
    # values exact in dtype, so both runs see the same inputs
    x32, g32 = (torch.randn(n, H, C, device=DEV).to(dtype).float() for _ in range(2))
    a32 = [torch.randn(n, H, device=DEV).to(dtype).float() for _ in range(2)]

    def run(dt):
        a_src, a_dst, x = (t.to(dt).requires_grad_() for t in (*a32, x32))
        torch.manual_seed(5)  # the dropout seed
        poison()
        out = ops.gat_attention(lay, a_src, a_dst, x, dropout=dropout, training=dropout > 0,
                                strategy="smmf")
        out.backward(g32.to(dt))
        return out, (a_src.grad, a_dst.grad, x.grad)

    out, grads = run(dtype)
    if dropout == 0:
        ref, _, want = ref64(lay, *a32, x32, 0.2, g32)
    else:
        ref, want = run(torch.float32)
    assert rel_err(out, ref) < 1e-2
    for got, w in zip(grads, want):
        assert got.dtype == dtype and rel_err(got, w) < 1e-2


@pytest.mark.parametrize("pmf", [False, True])
def test_opcheck_and_bad_input(pmf):
    torch.manual_seed(15)
    lay, a_src, a_dst, x = make("super_node", 2, 32, torch.float32)
    args = ops.op_args("additive", lay, [a_dst, a_src, x], (0.2,), need_attn=True,
                       strategy="pmf" if pmf else "smmf")
    opcheck_plan_op(torch.ops.dfgnn.attention_fwd.default, args)
    bad = [list(args[0])] + list(args[1:])
    bad[0][1] = a_src.detach().half()
    with pytest.raises(RuntimeError, match="a_src has dtype"):
        torch.ops.dfgnn.attention_fwd(*bad)
    bad[0] = [a_dst.detach()[:-1].contiguous(), a_src, x]
    with pytest.raises(RuntimeError, match="a_dst must be"):
        torch.ops.dfgnn.attention_fwd(*bad)
    if pmf:
        prep = calls.prepare(ops.spec.get("additive"), lay, x.dtype, 32, "pmf", False, True,
                             True)
        tensors, ints, floats = calls.plan_parts(lay, prep.plan, True)
        csr_row = tensors.pop("csr_row")
        with pytest.raises(RuntimeError, match="needs csr_row"):
            torch.classes.dfgnn.Plan("additive", tensors, ints, floats)
        tensors["csr_row"] = csr_row
        with pytest.raises(RuntimeError, match="row_walk .* needs pmf=0"):
            torch.classes.dfgnn.Plan("additive", tensors, {**ints, "row_walk": 1}, floats)


def test_gat_layer_matches_native_on_gpu():
    from torch_geometric.nn import GATConv

    from pyg_dfgnn.nn import FusedGATConv
    torch.manual_seed(16)
    ei, n, _ = GRAPHS["super_node"]()
    x = torch.randn(n, 48, device=DEV, requires_grad=True)
    native = GATConv(48, 32, heads=4, dropout=0.0).to(DEV)
    fused = FusedGATConv(48, 32, heads=4, dropout=0.0).to(DEV)
    fused.load_state_dict(native.state_dict())
    a, b = native(x, ei), fused(x, ei)
    assert rel_err(b, a) < 1e-5
    ga, = torch.autograd.grad(a.square().sum(), x)
    gb, = torch.autograd.grad(b.square().sum(), x)
    assert rel_err(gb, ga) < 1e-4


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("C", [16, 128, 100])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_agnn_cosine_attention(graph, C, strategy):
    """AGNN through the GT kernels (L2-normalised dot product, beta folded into the
    queries) against reference.cosine_attention in float64, gradients of x and beta."""
    torch.manual_seed(stable_seed(graph, C))
    ei, ns, nd = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    x_src = torch.randn(ns, C, device=DEV, requires_grad=True)
    x_dst = torch.randn(nd, C, device=DEV, requires_grad=True)
    beta = torch.tensor(1.7, device=DEV, requires_grad=True)
    g = torch.randn(nd, C, device=DEV)
    poison()
    out = ops.agnn_attention(lay, x_src, x_dst, beta, strategy=strategy)
    out.backward(g)
    t = [u.detach().double().requires_grad_() for u in (x_src, x_dst, beta)]
    ref, _ = reference.cosine_attention(lay.rowptr, lay.col, t[1], t[0], t[2])
    ref.backward(g.double())
    assert rel_err(out, ref) < 1e-5
    for got, want in zip((x_src.grad, x_dst.grad), (t[0].grad, t[1].grad)):
        assert rel_err(got, want) < 1e-4
    # beta's gradient is one sum over the 4,572 edges that can nearly cancel (-0.011,
    # where it is 3 in a typical draw; the float32 reference is then 5e-5 off
    # float64 itself): below 1 it is compared absolutely, as 1e-4 of its typical
    # size, far above the summation's rounding and far below a wrong term.
    assert rel_err_floor(beta.grad, t[2].grad, floor=1.0) < 1e-4


@pytest.mark.parametrize("graph", ["small", "super_node"])
@pytest.mark.parametrize("H,C", [(1, 128), (2, 32), (1, 7)])
def test_agnn_fused_normalisation(graph, H, C):
    """x_dst = x_src: the fused normalisation kernel (k = x / max(||x||, eps),
    q = beta k, one pass each way) against the float64 reference, with a zero row
    and a row below eps (the clamped branch of the backward) among the inputs."""
    torch.manual_seed(stable_seed(graph, H, C))
    ei, n, _ = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x = torch.randn(n, H, C, device=DEV)
    x[3] = 0.0
    x[5] = 1e-14
    x.requires_grad_()
    beta = torch.tensor([0.8], device=DEV, requires_grad=True)
    g = torch.randn(n, H, C, device=DEV)
    poison()
    out = ops.agnn_attention(lay, x, None, beta)
    out.backward(g)
    t = [u.detach().double().requires_grad_() for u in (x, beta)]
    ref, _ = reference.cosine_attention(lay.rowptr, lay.col, t[0], t[0], t[1])
    ref.backward(g.double())
    assert rel_err(out, ref) < 1e-5
    assert rel_err(x.grad, t[0].grad) < 1e-4
    assert rel_err(beta.grad, t[1].grad) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_agnn_fused_normalisation_half(dtype):
    torch.manual_seed(21)
    ei, n, _ = GRAPHS["small"]()
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x = torch.randn(n, 64, device=DEV, dtype=dtype, requires_grad=True)
    beta = torch.tensor([1.3], device=DEV, requires_grad=True)
    g = torch.randn(n, 64, device=DEV, dtype=dtype)
    out = ops.agnn_attention(lay, x, None, beta)
    out.backward(g)
    t = [u.detach().double().requires_grad_() for u in (x, beta)]
    ref, _ = reference.cosine_attention(lay.rowptr, lay.col, t[0], t[0], t[1])
    ref.backward(g.double())
    assert out.dtype == dtype and x.grad.dtype == dtype
    assert rel_err(out, ref) < 1e-2
    assert rel_err(x.grad, t[0].grad) < 1e-2
    assert rel_err(beta.grad, t[1].grad) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32)])
def test_agnn_dense_tiles_half(dtype, H, C, plan_override):
    """A PATTERN-like batch in fp16 / bf16: the cosine score normalises first and
    runs the dot score's dense-tile forward and backward (the plan says so and
    the profiler sees those kernels); output and gradients against float64 as
    close as the sparse tensor-core walks' (dense_tiles off) within 1e-2, beta's
    gradient (one sum over every edge, ill-conditioned in half precision) no
    further from float64 than 5 times theirs."""
    from benchmarks.generators import sbm_batch
    from torch.profiler import ProfilerActivity, profile
    ei, batch, _, _ = sbm_batch("pattern", 48, seed=3)
    n = batch.numel()
    lay = GraphLayout.from_edge_index(ei.to(DEV), (n, n))
    torch.manual_seed(stable_seed("dense", H, C))
    x = torch.randn(n, H, C, device=DEV).to(dtype).requires_grad_()
    beta = torch.tensor([1.3], device=DEV, requires_grad=True)
    g = torch.randn(n, H, C, device=DEV).to(dtype)
    t = [u.detach().double().requires_grad_() for u in (x, beta)]
    ref, _ = reference.cosine_attention(lay.rowptr, lay.col, t[0], t[0], t[1])
    ref.backward(g.double())

    def run():
        x.grad = beta.grad = None
        poison()
        out = ops.agnn_attention(lay, x, None, beta)
        out.backward(g)
        torch.cuda.synchronize()
        return out, x.grad.clone(), beta.grad.clone()
    p = plan.plan_for(lay, dtype, C, score="cosine")
    assert p.normalize_first and p.dense_cells > 0 and p.dense_backward, p.why
    run()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dense = run()
    names = " ".join(e.name for e in prof.events())
    for kernel in ("gt_fwd_dense_kernel", "gt_bwd_dq_dense_kernel", "gt_bwd_dkv_dense_kernel"):
        assert kernel in names
    plan_override(dense_tiles="off")
    assert plan.plan_for(lay, dtype, C, score="cosine").dense_cells == 0
    sparse = run()
    for got in (dense, sparse):
        assert got[0].dtype == dtype and got[1].dtype == dtype
        assert rel_err(got[0], ref) < 1e-2 and rel_err(got[1], t[0].grad) < 1e-2
    beta_err = [rel_err_floor(got[2], t[1].grad, floor=1.0) for got in (dense, sparse)]
    assert beta_err[0] <= max(1e-2, 5 * beta_err[1]), beta_err


@pytest.mark.parametrize("strategy", ["auto", "pmf"])
def test_agnn_attention_weights(strategy):
    """The attention weights of the one-call AGNN op (auto: SMMF) and of the
    composed PMF path, in input edge order, against the float64 reference."""
    torch.manual_seed(23)
    ei, n, _ = GRAPHS["small"]()  # with duplicate edges
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x = torch.randn(n, 32, device=DEV)
    beta = torch.tensor([0.9], device=DEV)
    out, alpha = ops.agnn_attention(lay, x, None, beta, return_attention=True, strategy=strategy)
    ref, ref_alpha = reference.cosine_attention(lay.rowptr, lay.col, x.double(), x.double(),
                                                beta.double())
    assert rel_err(out, ref) < 1e-5
    assert rel_err(alpha, lay.to_input_order(ref_alpha)) < 1e-5


def test_cosine_op_opcheck_and_bad_input():
    """The cosine score through dfgnn::attention_fwd: opcheck, the fp32 forward
    over unnormalised x against the dot score on the normalised rows, and clear
    errors."""
    torch.manual_seed(24)
    ei, n, _ = GRAPHS["super_node"]()
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x = torch.randn(n, 2, 32, device=DEV, requires_grad=True)
    beta = torch.tensor([1.1], device=DEV, requires_grad=True)
    args = ops.op_args("cosine", lay, [x, beta], (1e-12,), need_attn=True)
    opcheck_plan_op(torch.ops.dfgnn.attention_fwd.default, args)
    out, lse, attn, _token, saved = torch.ops.dfgnn.attention_fwd(*args)
    k = torch.nn.functional.normalize(x.detach(), dim=-1, eps=1e-12)
    want = torch.ops.dfgnn.attention_fwd(*ops.op_args("dot", lay, [1.1 * k, k, x.detach()],
                                                      (1.0,), need_attn=True, need_grad=False))
    empty = lay.in_degree() == 0  # lse = -inf there, in both
    assert empty.any() and torch.isneginf(lse[empty]).all() and torch.isneginf(want[1][empty]).all()
    for got, ref in ((out, want[0]), (lse[~empty], want[1][~empty]), (attn, want[2])):
        assert rel_err(got, ref) < 1e-5
    assert len(saved) == 1 and saved[0].shape == (n, 2)  # fp32: rnorm only
    with pytest.raises(RuntimeError, match="beta must be a float32"):
        torch.ops.dfgnn.attention_fwd([x, beta.double()], *args[1:])
    with pytest.raises(RuntimeError, match="rows"):
        torch.ops.dfgnn.attention_fwd([x[:-1], beta], *args[1:])
