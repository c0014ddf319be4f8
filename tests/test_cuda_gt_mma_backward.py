"""The GT backward's tensor-core walks (cuda/scores/dot_backward_mma.cu: dq on the
CSR, dk / dv on the CSC), forced with ``plan.override(mma_backward=True)``: against
the float64 reference and the CUDA-core backward, on graphs with duplicate edges,
isolated destinations, sources without out-edges, bipartite shapes, rows crossing
16-edge tiles, PATTERN-like batches and split rows (a super node)."""
from __future__ import annotations

import pytest
import torch

from conftest import stable_seed
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from test_cuda_gt import (DEV, GRAPHS, MMA_GRAPHS, _kernel_names, batch_graph, poison, qkv,
                          ref64, rel_err)

pytestmark = pytest.mark.cuda

DQ_KERNEL, DKV_KERNEL = "gt_bwd_dq_mma_kernel", "gt_bwd_dkv_mma_kernel"
#: Edges per work item: above every row of these graphs (the walk needs whole rows).
CHUNK = 512


def _graph(name):
    if name == "batch":  # PATTERN-like: block-diagonal, duplicates, a 300-edge row
        ei, n = batch_graph(torch.Generator().manual_seed(5))
        return GraphLayout.from_edge_index(ei, (n, n))
    ei, ns, nd = (GRAPHS if name == "super_node" else MMA_GRAPHS)[name]()
    return GraphLayout.from_edge_index(ei, (ns, nd))


def _grads(lay, q, k, v, g):
    """(dq, dk, dv) of one forward + backward on poisoned memory, and the names
    of the kernels the backward ran."""
    poison()
    out = ops.gt_attention(lay, q, k, v)
    poison()
    grads = []
    names = _kernel_names(lambda: grads.extend(torch.autograd.grad(out, (q, k, v), g)))
    return grads, " ".join(names)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("H,C", [(1, 32), (4, 64), (1, 128), (4, 128)])
@pytest.mark.parametrize("graph", ["dense", "small", "bipartite", "batch", "super_node"])
def test_mma_backward_matches_reference_and_cuda_cores(graph, H, C, dtype, plan_override):
    """dq, dk, dv with the tensor-core walks within 1e-2 of float64 and of the
    CUDA-core backward (same chunk); destinations without in-edges get dq exactly
    0, sources without out-edges dk = dv = 0. The super node's row (31K edges)
    is split into work items, which the tensor-core walks ignore (whole rows)."""
    plan_override(chunk=CHUNK)
    torch.manual_seed(stable_seed(graph, str(dtype), H, C))
    lay = _graph(graph)
    assert (lay.max_in_degree > CHUNK) == (graph == "super_node")
    q, k, v = qkv(lay, H, C, dtype)
    q = (q * 3).requires_grad_()  # peaked rows: P far from uniform
    k.requires_grad_()
    v.requires_grad_()
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    with torch.no_grad():
        g[::5] *= 10  # rows of different gradient scales
    # The sparse walks themselves: on the batch (dense tiles) the plan would run
    # their dense-tile form (test_cuda_dense_backward.py).
    plan_override(mma_backward=True, dense_backward=False)
    tc, names = _grads(lay, q, k, v, g)
    assert DQ_KERNEL in names and DKV_KERNEL in names
    plan_override(mma_backward=False)
    cc, names = _grads(lay, q, k, v, g)
    assert DQ_KERNEL not in names and DKV_KERNEL not in names
    _, _, want = ref64(lay, q, k, v, g)
    for name, got, base, ref in zip("qkv", tc, cc, want):
        assert got.dtype == dtype and got.shape == ref.shape
        assert rel_err(got, ref) < 1e-2, name
        assert rel_err(got, base) < 1e-2, name
        # no worse than the CUDA-core walk's own rounding, beyond a small margin
        assert rel_err(got, ref) < 2 * rel_err(base, ref) + 2e-3, name
    isolated = lay.in_degree() == 0
    assert isolated.any() and (tc[0][isolated] == 0).all()
    no_out = torch.ones(lay.num_src, dtype=torch.bool, device=DEV)
    no_out[lay.col.long()] = False
    assert (tc[1][no_out] == 0).all() and (tc[2][no_out] == 0).all()


def test_mma_backward_is_deterministic(plan_override):
    """One writer per output element (no atomics): two backwards agree bitwise."""
    plan_override(chunk=CHUNK, mma_backward=True, dense_backward=False)
    torch.manual_seed(3)
    lay = _graph("dense")
    q, k, v = qkv(lay, 2, 64, torch.bfloat16, requires_grad=True)
    g = torch.randn(lay.num_dst, 2, 64, device=DEV, dtype=torch.bfloat16)
    a, names = _grads(lay, q, k, v, g)
    b, _ = _grads(lay, q, k, v, g)
    assert DQ_KERNEL in names and DKV_KERNEL in names
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_mma_backward_in_agnn(plan_override):
    """AGNN's half-precision backward runs gt_bwd too (scale 1, normalised k and q):
    the forced tensor-core walks give AGNN's dx and dbeta within 1e-2 of the
    CUDA-core backward."""
    plan_override(chunk=CHUNK)
    torch.manual_seed(4)
    lay = _graph("small")
    x = torch.randn(lay.num_src, 1, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    beta = torch.tensor([2.0], device=DEV, requires_grad=True)
    g = torch.randn(lay.num_dst, 1, 64, device=DEV, dtype=torch.bfloat16)
    res = {}
    for on in (False, True):
        plan_override(mma_backward=on)
        out = ops.agnn_attention(lay, x, None, beta)
        names = " ".join(_kernel_names(
            lambda: res.__setitem__(on, torch.autograd.grad(out, (x, beta), g))))
        assert (DQ_KERNEL in names) == on
    assert rel_err(res[True][0], res[False][0]) < 1e-2
    assert rel_err(res[True][1], res[False][1]) < 1e-2
