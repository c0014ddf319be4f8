r"""``TransformerConv``'s edge features as tails: the ``"dot_edge_tail"`` score
(:mod:`pyg_dfgnn.ops.scores.dot_edge_tail`) without an ``[E, H, C]`` tensor.

``lin_edge`` has no bias, so with ``W_h`` head ``h``'s ``[C, D]`` slice of its
weight the layer's score and sum are those of rows of ``C + D`` channels per head:
queries ``[q_i, W_h^T q_i]``, keys ``[k_j, a_ij]``, values ``[v_j, a_ij]`` with
the raw features ``a_ij`` ``[E, D]`` as every head's last ``D`` channels; the
output is the op's first ``C`` channels plus ``W_h`` times its last ``D``. The
op takes the keys and values as they are, ``C`` channels, and the tails beside
them.

The widened queries come out of the query projection's GEMM itself
(:func:`tail_projections`): ``W_h^T q_i = (W_h^T W_q) x_i + W_h^T b_q``.
Widening the projection's output afterwards (a concatenation) would cost another
pass over ``[N, H, C + D]`` rows forward and its slices backward, which on a graph
with few edges per node outweigh the ``[E, H, C]`` rows the tails save.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import UninitializedParameter

from ..ops import plan as _plan
from ..ops.scores.dot_edge_tail import tails_fit_rows, tails_pay
from ._projections import autocast_dtype, plain_linears


def tail_weight(lin_edge: torch.nn.Module, feats: Optional[Tensor], heads: int, channels: int,
                x: Tensor) -> Optional[Tensor]:
    r"""``W`` ``[H, C, D']``, head ``h``'s ``[C, D]`` slice of ``lin_edge``'s
    weight padded with zero channels to ``D'`` (whole 16-byte vectors where the
    kernels read the rows so), where the edge features ``feats`` ``[E, D]`` run as
    tails; ``None`` where the ``[E, H, C]`` rows of
    :func:`~pyg_dfgnn.nn._projections.edge_rows` serve: a hooked, replaced, lazy
    or biased ``lin_edge``, features wide enough that tails move more bytes
    (:func:`~pyg_dfgnn.ops.scores.dot_edge_tail.tails_pay`), or rows of
    ``C + D'`` channels the kernels do not take. ``x``: the destinations'
    features (their device, and the dtype the projections give them)."""
    if (feats is None or feats.dim() != 2 or not plain_linears([lin_edge])
            or lin_edge.bias is not None):
        return None
    weight = lin_edge.weight
    D = feats.size(-1)
    if isinstance(weight, UninitializedParameter) or not tails_pay(heads, channels, D):
        return None
    weight = weight.view(heads, channels, D)
    if x.is_cuda:
        width = padded_edge_dim(channels, D, autocast_dtype(x) or x.dtype)
        if width is None:
            return None
        if width > D:
            weight = F.pad(weight, (0, width - D))
    return weight


def padded_edge_dim(channels: int, edge_dim: int, dtype: torch.dtype) -> Optional[int]:
    r"""``D'``, the tails' width on CUDA: ``edge_dim`` padded with zero channels to
    whole 16-byte vectors where the kernels read rows of ``channels`` so (the
    tails then start on a vector); where they read scalars, ``edge_dim``, or one
    more where ``channels + edge_dim`` would be whole vectors (rows the kernels
    read in vectors, which tails after a part of a vector cannot fill:
    :func:`~pyg_dfgnn.ops.scores.dot_edge_tail.tails_fit_rows`); ``None`` where
    the kernels take no rows of ``channels + D'`` channels of ``dtype``
    (:func:`~pyg_dfgnn.ops.plan.kernel_supports`)."""
    size = dtype.itemsize
    if (channels * size) % 16 == 0:
        width = edge_dim + -edge_dim % (16 // size)
    else:
        width = edge_dim + int(not tails_fit_rows(channels + edge_dim, edge_dim, size))
    return width if _plan.kernel_supports(channels + width, dtype) else None


def tail_projections(weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]],
                     tails: Tensor) -> Tuple[List[Tensor], List[Optional[Tensor]]]:
    r"""The query projection's weight ``[H * C, F]`` and bias widened to
    ``[H * (C + D)]`` outputs for the tails ``W`` ``[H, C, D]``
    (:func:`tail_weight`): per head the rows ``[W_q; W^T W_q]`` (bias ``[b_q;
    W^T b_q]``); the key's and value's (``C`` channels, the op takes the tails
    beside them) and any after them (the skip projection) are left as they are.
    Differentiable: built from the parameters in every call, so autograd reaches
    them."""
    H, C, D = tails.shape
    wq = weights[0].view(H, C, -1)
    tq = torch.einsum("hcd,hcf->hdf", tails.to(wq.dtype), wq)
    ws = [torch.cat([wq, tq], dim=1).reshape(H * (C + D), -1)]
    bq = biases[0]
    if bq is not None:
        bq = bq.view(H, C)
        tail = torch.einsum("hcd,hc->hd", tails.to(bq.dtype), bq)
        bq = torch.cat([bq, tail], dim=1).reshape(-1)
    return ws + list(weights[1:]), [bq] + list(biases[1:])


def csr_tails(layout, feats: Tensor, tails: Tensor, dtype: torch.dtype) -> Tensor:
    r"""The edge features ``[E, D]`` (the layout's input edge order) as the op's
    tails ``[E, D']``: in CSR edge order, in ``dtype``, padded with the zero
    channels of ``tails`` ``[H, C, D']``."""
    a = layout.to_csr_order(feats).to(dtype)
    pad = tails.size(-1) - a.size(-1)
    return F.pad(a, (0, pad)) if pad else a


def edge_tails_out(out: Tensor, tails: Tensor) -> Tensor:
    r"""The layer's output ``[N, H, C]`` from the op's ``[N, H, C + D]`` and the
    tails ``W`` ``[H, C, D]``: the first ``C`` channels plus ``W_h`` times the
    last ``D``."""
    C = tails.size(1)
    return out[..., :C] + torch.einsum("nhd,hcd->nhc", out[..., C:], tails.to(out.dtype))
