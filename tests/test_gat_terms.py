"""FusedGATConv's attention terms (``alpha_src`` / ``alpha_dst``): as one GEMM on
large fp32 / fp64 inputs, PyG's elementwise form otherwise; both give PyG's values
and gradients, and the GEMM is actually taken where the rule says so."""
from __future__ import annotations

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


def test_small_and_half_inputs_keep_the_elementwise_form():
    x = torch.randn(100, H, C)
    att = [torch.randn(1, H, C) for _ in range(2)]
    with GemmCount() as count:
        _attention_terms(x, x, *att)
    assert count.n == 0
    big = torch.randn(N_GEMM, H, C, dtype=torch.bfloat16)
    with GemmCount() as count:
        out = _attention_terms(big, big, *att)
    assert count.n == 0 and out[0].dtype == torch.float32  # PyG's promotion


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_layer_with_gemm_terms_matches_pyg(device):
    """float64 on the CPU; fp32 on the GPU (the fused kernels) against float64 PyG."""
    torch.manual_seed(0)
    n = N_GEMM
    dtype = torch.float64 if device == "cpu" else torch.float32
    tol = (1e-12, 1e-10) if device == "cpu" else (1e-5, 1e-4)
    ei = random_graph(n, num_edges=3 * n)
    native = GATConv(16, C, heads=H).double()
    fused = FusedGATConv(16, C, heads=H)
    fused.load_state_dict(native.state_dict())
    fused = fused.to(device, dtype)
    x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
    xf = x.detach().to(device, dtype).requires_grad_()
    with GemmCount() as count:
        out = fused(xf, ei.to(device))
    assert count.n == 2  # lin and the attention terms
    ref = native(x, ei)
    assert rel_err(out.double().cpu(), ref) < tol[0]
    g = torch.randn_like(ref)
    leaves = [x, native.att_src, native.att_dst, native.lin.weight]
    f_leaves = [xf, fused.att_src, fused.att_dst, fused.lin.weight]
    got = torch.autograd.grad(out, f_leaves, g.to(device, dtype))
    for a, b in zip(got, torch.autograd.grad(ref, leaves, g)):
        assert rel_err(a.double().cpu(), b) < tol[1]
