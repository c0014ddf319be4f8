"""GPU tests of the fused GATv2 kernels (``cuda/scores/gatv2.cu``) against the
float64 reference: fresh random inputs, NaN-poisoned allocator, fp32 < 1e-5
(outputs, attention weights) and < 1e-4 (gradients), fp16 / bf16 < 1e-2; split
rows and super nodes, bipartite graphs, dropout masks forward and backward,
determinism, no E x H x C tensor, and the layer against native GATv2Conv."""
import pytest
import torch
from torch_geometric.nn import GATv2Conv

from conftest import stable_seed
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATv2Conv
from pyg_dfgnn.ops import plan
from test_cuda_gt import DEV, GRAPHS, assert_matches_ref, opcheck_plan_op, poison, rel_err

pytestmark = pytest.mark.cuda
REF = ops.spec.get("gatv2").reference


def make(graph, H, C, dtype, requires_grad=True):
    ei, ns, nd = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    x_l = torch.randn(ns, H, C, device=DEV).to(dtype).requires_grad_(requires_grad)
    x_r = torch.randn(nd, H, C, device=DEV).to(dtype).requires_grad_(requires_grad)
    att = (torch.randn(H, C, device=DEV) / C ** 0.5).to(dtype).requires_grad_(requires_grad)
    return lay, x_l, x_r, att


def ref64(lay, x_l, x_r, att, slope, g, dropout=0.0):
    t = [u.detach().double().requires_grad_() for u in (x_l, x_r, att)]
    out, alpha = REF(lay, (t[1], t[0], t[2]), (slope,), dropout, dropout > 0)
    out.backward(g.double())
    return out, alpha, [u.grad for u in t]


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("H,C", [(1, 8), (2, 16), (4, 32), (1, 128), (2, 100), (1, 7),
                                 (2, 160), (1, 256)])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
@pytest.mark.parametrize("launches", [1, 2])
def test_forward_backward_fp32(graph, H, C, strategy, launches):
    torch.manual_seed(stable_seed(graph, H, C, launches))
    lay, x_l, x_r, att = make(graph, H, C, torch.float32)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    with plan.override(bwd_launches=launches):
        out, alpha = ops.gatv2_attention(lay, x_l, x_r, att, negative_slope=0.2,
                                         return_attention=True, strategy=strategy)
        assert ops.uses_kernels(lay, x_l)
        poison()
        out.backward(g)
    ref, ref_alpha, (dl, dr, da) = ref64(lay, x_l, x_r, att, 0.2, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha,
                       ((x_l.grad, dl), (x_r.grad, dr), (att.grad, da)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("graph", ["small", "super_node", "bipartite"])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32), (2, 24), (1, 384)])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_half_precision(graph, dtype, H, C, strategy):
    torch.manual_seed(11)
    lay, x_l, x_r, att = make(graph, H, C, dtype)
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    out = ops.gatv2_attention(lay, x_l, x_r, att, strategy=strategy)
    out.backward(g)
    assert out.dtype == dtype and x_l.grad.dtype == dtype and att.grad.dtype == dtype
    ref, _, grads = ref64(lay, x_l, x_r, att, 0.2, g)
    assert rel_err(out, ref) < 1e-2
    for got, want in zip((x_l.grad, x_r.grad, att.grad), grads):
        assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("slope", [0.0, 0.01, 0.5, 1.0])
def test_negative_slopes(slope):
    torch.manual_seed(15)
    lay, x_l, x_r, att = make("small", 2, 32, torch.float32)
    g = torch.randn(lay.num_dst, 2, 32, device=DEV)
    ops.gatv2_attention(lay, x_l, x_r, att, negative_slope=slope).backward(g)
    ref, _, grads = ref64(lay, x_l, x_r, att, slope, g)
    for name, got, want in zip(("x_l", "x_r", "att"), (x_l.grad, x_r.grad, att.grad), grads):
        if slope == 1.0 and name == "x_r":
            # A linear score: x_r_i's term is the same for every edge of row i and
            # cancels in the softmax, so the true gradient is 0 and fp32 leaves
            # rounding noise, held against the scale of x_l's gradient.
            assert want.abs().max() < 1e-12
            assert (got.double() - want).norm() / grads[0].norm() < 1e-5
            continue
        assert rel_err(got, want) < 1e-4


def test_backward_deterministic():
    torch.manual_seed(12)
    lay, x_l, x_r, att = make("super_node", 4, 32, torch.float32)
    g = torch.randn(lay.num_dst, 4, 32, device=DEV)
    grads = []
    for _ in range(2):
        for t in (x_l, x_r, att):
            t.grad = None
        ops.gatv2_attention(lay, x_l, x_r, att).backward(g)
        grads.append([t.grad.clone() for t in (x_l, x_r, att)])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
@pytest.mark.parametrize("launches", [1, 2])
def test_dropout_backward_matches_forward_mask(strategy, launches):
    """The backward regenerates the forward's dropout mask: with the seed fixed,
    the gradients agree with finite differences of the forward."""
    torch.manual_seed(14)
    lay, x_l, x_r, att = make("small", 2, 16, torch.float32)
    g = torch.randn(lay.num_dst, 2, 16, device=DEV)

    def f(x_l, x_r, att):
        torch.manual_seed(4321)
        with plan.override(bwd_launches=launches):
            return (ops.gatv2_attention(lay, x_l, x_r, att, dropout=0.5, training=True,
                                        strategy=strategy) * g).sum()

    f(x_l, x_r, att).backward()
    dirs = [torch.randn_like(t) for t in (x_l, x_r, att)]
    eps = 1e-2
    with torch.no_grad():
        plus = f(*(t + eps * d for t, d in zip((x_l, x_r, att), dirs)))
        minus = f(*(t - eps * d for t, d in zip((x_l, x_r, att), dirs)))
    fd = ((plus - minus) / (2 * eps)).item()
    an = sum((t.grad * d).sum() for t, d in zip((x_l, x_r, att), dirs)).item()
    assert abs(fd - an) / abs(an) < 2e-2


def test_memory_never_holds_edge_messages():
    """Peak memory of a fwd+bwd stays far below one E x H x C float tensor (PyG
    materialises several)."""
    torch.manual_seed(3)
    n, e, H, C = 20_000, 2_000_000, 4, 64
    ei = torch.randint(0, n, (2, e), device=DEV)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    x_l = torch.randn(n, H, C, device=DEV, requires_grad=True)
    x_r = torch.randn(n, H, C, device=DEV, requires_grad=True)
    att = torch.randn(H, C, device=DEV, requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ops.gatv2_attention(lay, x_l, x_r, att).sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < e * H * C * 4 / 4, peak


def test_opcheck():
    lay, x_l, x_r, att = make("small", 2, 16, torch.float32, requires_grad=False)
    lay.colptr  # noqa: B018
    args = ops.op_args("gatv2", lay, [x_r, x_l, att], (0.2,), need_attn=True)
    opcheck_plan_op(torch.ops.dfgnn.attention_fwd.default, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", ["plain", "bipartite", "share", "residual_concat_off",
                                    "no_loops", "alpha"])
def test_layer_matches_native(dtype, config):
    torch.manual_seed(5)
    n_src, n_dst = (300, 200) if config == "bipartite" else (300, 300)
    ei = torch.stack([torch.randint(0, n_src, (3000,)), torch.randint(0, n_dst, (3000,))])
    kw = dict(heads=4, add_self_loops=config != "no_loops" and config != "bipartite",
              share_weights=config == "share", residual=config == "residual_concat_off",
              concat=config != "residual_concat_off")
    in_ch = (16, 12) if config == "bipartite" else 16
    native = GATv2Conv(in_ch, 32, **kw).to(DEV)
    fused = FusedGATv2Conv(in_ch, 32, **kw).to(DEV)
    fused.load_state_dict(native.state_dict())
    x = ((torch.randn(n_src, 16, device=DEV), torch.randn(n_dst, 12, device=DEV))
         if config == "bipartite" else torch.randn(n_src, 16, device=DEV))
    ei = ei.to(DEV)
    call = {"return_attention_weights": True} if config == "alpha" else {}
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        got = fused(x, ei, **call)
        want = native(x, ei, **call)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    if config == "alpha":
        (got, (ei_g, a_g)), (want, (ei_w, a_w)) = got, want
        assert torch.equal(ei_g, ei_w) and rel_err(a_g, a_w) < tol
    assert got.dtype == want.dtype and rel_err(got, want) < tol
    g = torch.randn_like(want)
    gf = torch.autograd.grad(got, list(fused.parameters()), g)
    gn = torch.autograd.grad(want, list(native.parameters()), g)
    for a, b in zip(gf, gn):
        assert rel_err(a, b) < (1e-4 if dtype == torch.float32 else 3e-2)
