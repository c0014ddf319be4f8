"""``register_fake`` and ``register_autograd`` for the C++ ``torch.ops.dfgnn`` ops.

The fake (meta) implementations let ``torch.compile`` trace through the fused
ops; the autograd formulas call the fused backward kernels (paper §4.3).
Only imported when the extension loaded.

:class:`GTAttentionFunction`, :class:`GATAttentionFunction` and
:class:`L2NormFunction` (built by :func:`_op_function`) apply the same formulas as
plain ``torch.autograd.Function`` classes, and the ops in :mod:`pyg_dfgnn.ops`
call the kernels through them: the generic ``register_autograd`` wrapper costs
about 0.4 ms of Python per call (measured on the H100 machine,
benchmarks/NOTES.md), ten times the kernel time of a Cora-sized layer.
"""
from __future__ import annotations

import torch

_FLOAT = torch.float32


@torch.library.register_fake("dfgnn::csr_rowptr")
def _csr_rowptr_fake(index, num_rows):
    return index.new_empty(num_rows + 1, dtype=torch.int32)


def _op_function(name: str, op, setup_context, backward, n_inputs: int, n_diff: int,
                 doc: str):
    r"""A ``torch.autograd.Function`` for the custom op ``op``, with the formulas
    given to ``register_autograd`` (``setup_context`` and ``backward``). The first
    ``n_diff`` outputs are differentiable; the rest (row statistics, attention
    weights) are marked non-differentiable, so autograd materialises no zero
    gradients for them. ``backward(ctx, *grads)`` gets the ``n_diff`` output
    gradients, ``None`` for an unused output, and is skipped when all are ``None``."""

    def forward(ctx, *args):
        if torch.compiler.is_compiling():
            outs = op(*args)
        else:  # skip the generic register_autograd hop: this Function is the autograd
            with torch._C._AutoDispatchBelowAutograd():
                outs = op(*args)
        setup_context(ctx, args, outs)
        ctx.mark_non_differentiable(*outs[n_diff:])
        ctx.set_materialize_grads(False)
        return outs

    def backward_fn(ctx, *grads):
        if all(g is None for g in grads[:n_diff]):
            return (None,) * n_inputs
        return backward(ctx, *grads[:n_diff])

    return type(name, (torch.autograd.Function,), {
        "__doc__": doc, "forward": staticmethod(forward), "backward": staticmethod(backward_fn)})


# ------------------------------------------------------------------------------ GT
@torch.library.register_fake("dfgnn::gt_fwd")
def _gt_fwd_fake(q, k, v, rowptr, col, row_items, row_combine, row_slots, csr_row, colptr, row,
                 perm, col_items, col_combine, col_slots, chunk, scale, dropout, seed, pmf,
                 need_attn):
    out = torch.empty_like(q)
    lse = q.new_empty((q.size(0), q.size(1)), dtype=_FLOAT)
    attn = q.new_empty((col.size(0), q.size(1)) if need_attn else (0,), dtype=_FLOAT)
    return out, lse, attn


@torch.library.register_fake("dfgnn::gt_bwd")
def _gt_bwd_fake(grad_out, q, k, v, out, lse, rowptr, col, row_items, row_combine, row_slots,
                 colptr, row, perm, col_items, col_combine, col_slots, chunk, scale, dropout,
                 seed):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_N_FWD_INPUTS = 21


def _gt_setup_context(ctx, inputs, output):
    (q, k, v, rowptr, col, row_items, row_combine, row_slots, _csr_row, colptr, row, perm,
     col_items, col_combine, col_slots, chunk, scale, dropout, seed, _pmf, _need_attn) = inputs
    out, lse, _attn = output
    ctx.save_for_backward(q, k, v, out, lse, rowptr, col, row_items, row_combine, colptr, row,
                          perm, col_items, col_combine)
    ctx.args = (row_slots, col_slots, chunk, scale, dropout, seed)


def _gt_backward(ctx, grad_out, _grad_lse=None, _grad_attn=None):
    (q, k, v, out, lse, rowptr, col, row_items, row_combine, colptr, row, perm, col_items,
     col_combine) = ctx.saved_tensors
    row_slots, col_slots, chunk, scale, dropout, seed = ctx.args
    if colptr is None or col_items is None:
        raise RuntimeError("dfgnn::gt_fwd was called without the CSC layout (colptr, row, perm, "
                           "col_items, col_combine), so it cannot be differentiated")
    dq, dk, dv = torch.ops.dfgnn.gt_bwd(grad_out.contiguous(), q, k, v, out, lse, rowptr, col,
                                        row_items, row_combine, row_slots, colptr, row, perm,
                                        col_items, col_combine, col_slots, chunk, scale, dropout,
                                        seed)
    return (dq, dk, dv) + (None,) * (_N_FWD_INPUTS - 3)


torch.library.register_autograd("dfgnn::gt_fwd", _gt_backward, setup_context=_gt_setup_context)

GTAttentionFunction = _op_function(
    "GTAttentionFunction", torch.ops.dfgnn.gt_fwd, _gt_setup_context, _gt_backward,
    _N_FWD_INPUTS, 1, "``dfgnn::gt_fwd`` with the fused backward; takes the op's arguments.")


# ----------------------------------------------------------------------------- GAT
@torch.library.register_fake("dfgnn::gat_fwd")
def _gat_fwd_fake(a_dst, a_src, x, rowptr, col, row_items, row_combine, row_slots, csr_row,
                  colptr, row, perm, col_items, col_combine, col_slots, chunk, negative_slope,
                  dropout, seed, pmf, need_attn):
    out = x.new_empty((a_dst.size(0), x.size(1), x.size(2)))
    lse = x.new_empty((a_dst.size(0), x.size(1)), dtype=_FLOAT)
    attn = x.new_empty((col.size(0), x.size(1)) if need_attn else (0,), dtype=_FLOAT)
    return out, lse, attn


@torch.library.register_fake("dfgnn::gat_bwd")
def _gat_bwd_fake(grad_out, a_dst, a_src, x, out, lse, rowptr, col, row_items, row_combine,
                  row_slots, colptr, row, perm, col_items, col_combine, col_slots, chunk,
                  negative_slope, dropout, seed):
    return torch.empty_like(a_dst), torch.empty_like(a_src), torch.empty_like(x)


_N_GAT_INPUTS = 21


def _gat_setup_context(ctx, inputs, output):
    (a_dst, a_src, x, rowptr, col, row_items, row_combine, row_slots, _csr_row, colptr, row,
     perm, col_items, col_combine, col_slots, chunk, negative_slope, dropout, seed, _pmf,
     _need_attn) = inputs
    out, lse, _attn = output
    ctx.save_for_backward(a_dst, a_src, x, out, lse, rowptr, col, row_items, row_combine, colptr,
                          row, perm, col_items, col_combine)
    ctx.args = (row_slots, col_slots, chunk, negative_slope, dropout, seed)


def _gat_backward(ctx, grad_out, _grad_lse=None, _grad_attn=None):
    (a_dst, a_src, x, out, lse, rowptr, col, row_items, row_combine, colptr, row, perm,
     col_items, col_combine) = ctx.saved_tensors
    row_slots, col_slots, chunk, negative_slope, dropout, seed = ctx.args
    if colptr is None or col_items is None:
        raise RuntimeError("dfgnn::gat_fwd was called without the CSC layout, so it cannot be "
                           "differentiated")
    da_dst, da_src, dx = torch.ops.dfgnn.gat_bwd(
        grad_out.contiguous(), a_dst, a_src, x, out, lse, rowptr, col, row_items, row_combine,
        row_slots, colptr, row, perm, col_items, col_combine, col_slots, chunk, negative_slope,
        dropout, seed)
    return (da_dst, da_src, dx) + (None,) * (_N_GAT_INPUTS - 3)


torch.library.register_autograd("dfgnn::gat_fwd", _gat_backward, setup_context=_gat_setup_context)

GATAttentionFunction = _op_function(
    "GATAttentionFunction", torch.ops.dfgnn.gat_fwd, _gat_setup_context, _gat_backward,
    _N_GAT_INPUTS, 1, "``dfgnn::gat_fwd`` with the fused backward; takes the op's arguments.")


# ------------------------------------------------------------------- AGNN normalisation
@torch.library.register_fake("dfgnn::l2norm_fwd")
def _l2norm_fwd_fake(x, beta, eps):
    return (torch.empty_like(x), torch.empty_like(x),
            x.new_empty((x.size(0), x.size(1)), dtype=_FLOAT))


@torch.library.register_fake("dfgnn::l2norm_bwd")
def _l2norm_bwd_fake(dk, dq, k, rnorm, beta):
    return torch.empty_like(k), k.new_empty((k.size(0), k.size(1)), dtype=_FLOAT)


def _l2norm_setup_context(ctx, inputs, output):
    _x, beta, _eps = inputs
    k, _q, rnorm = output
    ctx.save_for_backward(k, rnorm, beta)


def _l2norm_backward(ctx, dk, dq, _drnorm=None):
    k, rnorm, beta = ctx.saved_tensors
    dk = torch.zeros_like(k) if dk is None else dk.contiguous()
    dq = torch.zeros_like(k) if dq is None else dq.contiguous()
    dx, dbeta_part = torch.ops.dfgnn.l2norm_bwd(dk, dq, k, rnorm, beta)
    return dx, dbeta_part.sum().reshape(beta.shape), None


torch.library.register_autograd("dfgnn::l2norm_fwd", _l2norm_backward,
                                setup_context=_l2norm_setup_context)


L2NormFunction = _op_function(
    "L2NormFunction", torch.ops.dfgnn.l2norm_fwd, _l2norm_setup_context, _l2norm_backward, 3, 2,
    "``dfgnn::l2norm_fwd`` (k = x / max(||x||, eps), q = beta k) with its fused backward; "
    "``beta`` is a one-element float32 tensor.")
