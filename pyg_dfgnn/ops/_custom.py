"""``register_fake`` for the C++ ``torch.ops.dfgnn`` ops.

The fake (meta) implementations let ``torch.compile`` and ``opcheck`` trace
through the fused ops. Their autograd is registered in C++
(``cuda/glue/autograd.cpp``, the ``Autograd`` dispatch key): a Python autograd kernel
(``torch.library.register_autograd``) ran Python on every call, also under
``no_grad``, and most of a Cora-sized layer's wall time was that host work.
``dfgnn::agnn_fwd`` needs no fake: its
CompositeExplicitAutograd kernel composes ``cos_fwd`` (fp32) or ``l2norm_fwd`` and
``gt_fwd``. Only imported when the extension loaded.
"""
from __future__ import annotations

import torch

_FLOAT = torch.float32


@torch.library.register_fake("dfgnn::csr_rowptr")
def _csr_rowptr_fake(index, num_rows):
    return index.new_empty(num_rows + 1, dtype=torch.int32)


# ------------------------------------------------------------------------------ GT
@torch.library.register_fake("dfgnn::gt_fwd")
def _gt_fwd_fake(q, k, v, csr, csc, sizes, scale, dropout, seed, need_attn, plan, dense_cells):
    out = torch.empty_like(q)
    lse = q.new_empty((q.size(0), q.size(1)), dtype=_FLOAT)
    attn = q.new_empty((csr[1].size(0), q.size(1)) if need_attn else (0,), dtype=_FLOAT)
    return out, lse, attn


@torch.library.register_fake("dfgnn::gt_bwd")
def _gt_bwd_fake(grad_out, q, k, v, out, lse, csr, csc, sizes, scale, dropout, seed,
                 one_launch, mma):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.register_fake("dfgnn::gt_bwd_into")
def _gt_bwd_into_fake(dq, dk, dv, grad_out, q, k, v, out, lse, csr, csc, sizes, scale, dropout,
                      seed, one_launch, mma):
    return None


# ----------------------------------------------------------------------------- GAT
@torch.library.register_fake("dfgnn::gat_fwd")
def _gat_fwd_fake(a_dst, a_src, x, csr, csc, sizes, negative_slope, dropout, seed, need_attn,
                  plan):
    out = x.new_empty((a_dst.size(0), x.size(1), x.size(2)))
    lse = x.new_empty((a_dst.size(0), x.size(1)), dtype=_FLOAT)
    attn = x.new_empty((csr[1].size(0), x.size(1)) if need_attn else (0,), dtype=_FLOAT)
    return out, lse, attn


@torch.library.register_fake("dfgnn::gat_bwd")
def _gat_bwd_fake(grad_out, a_dst, a_src, x, out, lse, csr, csc, sizes, negative_slope, dropout,
                  seed):
    return torch.empty_like(a_dst), torch.empty_like(a_src), torch.empty_like(x)


# ------------------------------------------------------------------- AGNN normalisation
@torch.library.register_fake("dfgnn::l2norm_fwd")
def _l2norm_fwd_fake(x, beta, eps):
    return (torch.empty_like(x), torch.empty_like(x),
            x.new_empty((x.size(0), x.size(1)), dtype=_FLOAT))


@torch.library.register_fake("dfgnn::cos_fwd")
def _cos_fwd_fake(x, beta, eps, csr, sizes, need_attn, plan):
    n, h = x.size(0), x.size(1)
    return (torch.empty_like(x), x.new_empty((n, h), dtype=_FLOAT),
            x.new_empty((csr[1].size(0), h) if need_attn else (0,), dtype=_FLOAT),
            x.new_empty((n, h), dtype=_FLOAT))


@torch.library.register_fake("dfgnn::l2norm_bwd")
def _l2norm_bwd_fake(dk, dq, k, rnorm, beta):
    return torch.empty_like(k), k.new_empty((k.size(0), k.size(1)), dtype=_FLOAT)


@torch.library.register_fake("dfgnn::projections")
def _projections_fake(x, rows, weights, biases):
    return [x.new_empty(*x.shape[:-1], w.shape[0]) for w in weights]
