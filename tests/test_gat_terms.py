"""FusedGATConv's attention terms (``alpha_src`` / ``alpha_dst``): as one GEMM on
large inputs whose dtype promoted with ``att``'s is fp32 / fp64 (autocast's bf16
features included), PyG's elementwise form otherwise; both give PyG's values and
gradients, and the GEMM is actually taken where the rule says so."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch_geometric.nn import GATConv

from conftest import random_graph, rel_err
from pyg_dfgnn.nn import FusedGATConv
from pyg_dfgnn.nn.gat_conv import TERMS_GEMM_MIN_ELEMENTS, _attention_terms
from test_projection import GemmCount

#: rows that put ``N * H * C`` just past the GEMM's threshold
H, C = 2, 32
N_GEMM = TERMS_GEMM_MIN_ELEMENTS // (H * C) + 1


def _elementwise(x_src, x_dst, att_src, att_dst):
    return ((x_src * att_src).sum(-1), None if x_dst is None else (x_dst * att_dst).sum(-1))


@pytest.mark.parametrize("dst", ["same", "other", "none"])
def test_gemm_terms_match_elementwise_float64(dst):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N_GEMM, H, C, generator=gen, dtype=torch.float64, requires_grad=True)
    x_dst = {"same": x, "none": None,
             "other": torch.randn(N_GEMM - 7, H, C, generator=gen, dtype=torch.float64,
                                  requires_grad=True)}[dst]
    att = [torch.randn(1, H, C, generator=gen, dtype=torch.float64, requires_grad=True)
           for _ in range(2)]
    with GemmCount() as count:
        got = _attention_terms(x, x_dst, *att)
    assert count.n == (2 if dst == "other" else 1)
    want = _elementwise(x, x_dst, *att)
    assert (got[1] is None) == (dst == "none")
    outs = [t for t in got if t is not None]
    leaves = [x, *att] + ([x_dst] if dst == "other" else [])
    grads = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in outs]
    g_got = torch.autograd.grad(outs, leaves, grads, allow_unused=True)
    g_want = torch.autograd.grad([t for t in want if t is not None], leaves, grads,
                                 allow_unused=True)
    for a, b in zip(outs, want):
        assert a.shape == b.shape and rel_err(a, b) < 1e-12
    for a, b in zip(g_got, g_want):
        if b is None:
            assert a is None or not a.abs().max() > 0  # att_dst without a dst term
        else:
            assert rel_err(a, b) < 1e-12


def test_small_and_all_half_inputs_keep_the_elementwise_form():
    x = torch.randn(100, H, C)
    att = [torch.randn(1, H, C) for _ in range(2)]
    with GemmCount() as count:
        _attention_terms(x, x, *att)
    assert count.n == 0
    big = torch.randn(N_GEMM, H, C, dtype=torch.bfloat16)
    with GemmCount() as count:
        out = _attention_terms(big, big, *[a.bfloat16() for a in att])
    assert count.n == 0 and out[0].dtype == torch.bfloat16  # a half-precision model


def test_half_features_with_float32_att_take_a_float32_gemm():
    """Autocast's case: bf16 projections, float32 ``att``. The GEMM runs in
    float32 although autocast is on, and its values and gradients are as close to
    float64 as the fp32 tolerance asks (a bf16 GEMM's att gradients are not)."""
    gen = torch.Generator().manual_seed(1)
    xb = torch.randn(N_GEMM, H, C, generator=gen).bfloat16().requires_grad_()
    att = [torch.randn(1, H, C, generator=gen, requires_grad=True) for _ in range(2)]
    with torch.autocast("cpu", dtype=torch.bfloat16), GemmCount() as count:
        got = _attention_terms(xb, xb, *att)
    assert count.n == 1 and got[0].dtype == got[1].dtype == torch.float32
    pyg = _elementwise(xb, xb, *att)
    x64 = xb.detach().double().requires_grad_()
    att64 = [a.detach().double().requires_grad_() for a in att]
    want = _elementwise(x64, x64, *att64)
    grads = [torch.randn(t.shape, generator=gen) for t in want]
    g_got = torch.autograd.grad(got, [xb, *att], grads)
    g_pyg = torch.autograd.grad(pyg, [xb, *att], grads)
    g_want = torch.autograd.grad(want, [x64, *att64], [g.double() for g in grads])
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-6
    assert g_got[0].dtype == torch.bfloat16 and rel_err(g_got[0], g_pyg[0]) < 1e-2
    for a, b in zip(g_got[1:], g_want[1:]):
        assert rel_err(a, b) < 1e-4


@pytest.mark.parametrize("mode", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda),
                                  pytest.param("cuda-bf16", marks=pytest.mark.cuda)])
def test_layer_with_gemm_terms_matches_pyg(mode):
    """float64 on the CPU and fp32 on the GPU (the fused kernels) against float64
    PyG; under bf16 autocast, as close to float64 PyG as PyG's own layer under
    autocast is (its bf16 projection alone is 2-7e-2 off in the gradients)."""
    torch.manual_seed(0)
    n = N_GEMM
    device = mode.split("-")[0]
    dtype = torch.float64 if device == "cpu" else torch.float32
    autocast = mode == "cuda-bf16"
    tol = (1e-12, 1e-10) if device == "cpu" else (1e-5, 1e-4)
    ei = random_graph(n, num_edges=3 * n)
    native = GATConv(16, C, heads=H).double()
    fused = FusedGATConv(16, C, heads=H)
    fused.load_state_dict(native.state_dict())
    fused = fused.to(device, dtype)
    x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(n, H * C, dtype=torch.float64)

    def run(layer, inputs, graph, count=None):
        with (torch.autocast(device, dtype=torch.bfloat16, enabled=autocast),
              count or contextlib.nullcontext()):
            out = layer(inputs, graph)
        leaves = [inputs, layer.att_src, layer.att_dst, layer.lin.weight]
        return out, torch.autograd.grad(out, leaves, g.to(out.device, out.dtype))

    xf = x.detach().to(device, dtype).requires_grad_()
    count = GemmCount()
    out, got = run(fused, xf, ei.to(device), count)
    assert count.n == 2  # lin and the attention terms
    assert out.dtype == dtype
    ref, want = run(native, x, ei)
    if autocast:
        pyg = copy.deepcopy(native).to(device, dtype)
        pyg_out, pyg_grads = run(pyg, xf, ei.to(device))
        tol = [1.5 * rel_err(pyg_out.double().cpu(), ref)]
        tol += [1.5 * rel_err(a.double().cpu(), b) for a, b in zip(pyg_grads, want)]
    else:
        tol = [tol[0]] + [tol[1]] * len(want)
    assert rel_err(out.double().cpu(), ref) < tol[0]
    for a, b, t in zip(got, want, tol[1:]):
        assert rel_err(a.double().cpu(), b) < t


@pytest.mark.parametrize("bad, match", [
    ("x_rows", "x has 11 rows"), ("a_src", "expected x"), ("a_dst", "expected x"),
    ("dtype", "share a dtype"), ("dim", "expected x")])
def test_op_rejects_each_bad_input(bad, match):
    """The additive score's check: its one-expression common case lets no bad
    input through."""
    from pyg_dfgnn import ops
    from pyg_dfgnn.layout import GraphLayout
    lay = GraphLayout.from_edge_index(random_graph(12, 9, num_edges=40), (12, 9))
    a_src, a_dst, x = torch.randn(12, 2), torch.randn(9, 2), torch.randn(12, 2, 4)
    ops.gat_attention(lay, a_src, a_dst, x)
    a_src, a_dst, x = {
        "x_rows": (a_src[:11], a_dst, x[:11]), "a_src": (a_src[:, :1], a_dst, x),
        "a_dst": (a_src, a_dst[:8], x), "dtype": (a_src, a_dst.double(), x),
        "dim": (a_src, a_dst, x[:, :, 0])}[bad]
    with pytest.raises(ValueError, match=match):
        ops.gat_attention(lay, a_src, a_dst, x)
