r"""Pure-PyTorch attention over the in-edges of each destination node.

The CPU path of every fused op and the oracle of every test. All functions take
the graph in CSR-by-destination form (``rowptr`` ``[N_dst + 1]``, ``col`` ``[E]`` =
source of each edge, see :class:`pyg_dfgnn.layout.GraphLayout`) and run

1. SDDMM: a score per edge and head ``s_ij`` ``[E, H]``;
2. edge softmax over the in-edges of each destination (paper Appendix A, eq. 2),
   with segment reductions over ``rowptr``;
3. optional attention dropout on the normalised weights;
4. SpMM: ``out_i = sum_j alpha_ij v_j`` (segment sum).

On CPU, forward and backward are bitwise reproducible run to run with any number
of threads: the per-edge gathers of node rows (:func:`gather_rows`) use the gather
whose backward sums in a fixed order.

They materialise ``[E, H, C]`` intermediates, which is what the fused kernels
avoid; here clarity wins. Nodes with no in-edge get zeros, as in PyG. Float16 and
bfloat16 inputs are computed in float32 and the results rounded back, as the
kernels accumulate in float32 (summing a super node's hundreds of terms in half
precision misses by more than 1e-2).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import segment, softmax


def csr_dst(rowptr: Tensor, num_edges: int) -> Tensor:
    """Destination node ``[E]`` (int64) of each CSR edge."""
    deg = rowptr[1:] - rowptr[:-1]
    return torch.repeat_interleave(torch.arange(deg.numel(), device=rowptr.device), deg.long(),
                                   output_size=num_edges)


def gather_rows(x: Tensor, index: Tensor) -> Tensor:
    r"""``x[index]``: rows of ``x`` ``[N, ...]`` for ``index`` ``[E]``, with a
    deterministic backward on CPU and CUDA.

    The backward sums each node's gradient rows. On CPU, ``x[index]``'s backward
    (``index_put_`` with ``accumulate=True``) adds float32 rows with atomics from
    several threads, in an order that changes run to run, while ``index_select``'s
    (``index_add_``) adds them serially in index order. On CUDA it is the other way
    round: ``index_add_`` uses atomics and ``index_put_`` sorts the indices first.
    """
    if x.device.type == "cpu":
        return x.index_select(0, index.long())
    return x[index.long()]


_HALF = (torch.float16, torch.bfloat16)


def to_float32(*tensors: Tensor) -> Tuple[Tensor, ...]:
    """The tensors, float16 / bfloat16 ones as float32 (the kernels accumulate in
    float32)."""
    return tuple(t.float() if t.dtype in _HALF else t for t in tensors)


def edge_softmax(scores: Tensor, rowptr: Tensor) -> Tensor:
    r"""Softmax of ``scores`` ``[E, H]`` (CSR order) over each destination's
    in-edges (paper eq. 2), via PyG's segment-based :func:`~torch_geometric.utils.softmax`."""
    return softmax(scores, ptr=rowptr.long(), dim=0)


def aggregate(rowptr: Tensor, col: Tensor, alpha: Tensor, value: Tensor,
              edge: Optional[Tensor] = None) -> Tensor:
    r"""SpMM ``out_i = sum_j alpha_ij value_j``: ``alpha`` ``[E, H]``, ``value``
    ``[N_src, H, C]`` -> ``[N_dst, H, C]``; with ``edge`` ``[E, H, C]`` (CSR
    order), ``out_i = sum_j alpha_ij (value_j + edge_ij)``."""
    rows = gather_rows(value, col)
    if edge is not None:
        rows = rows + edge
    msg = rows * alpha.unsqueeze(-1)
    if msg.numel() == 0:
        # No edges: zeros, still connected to the inputs (out.backward() works and
        # gives zero gradients, as with PyG's scatter), which segment() would not do.
        out = value.new_zeros(rowptr.numel() - 1, value.size(1), value.size(2))
        return out.index_add(0, csr_dst(rowptr, msg.size(0)), msg)
    return segment(msg, rowptr.long(), reduce="sum")


def softmax_aggregate(rowptr: Tensor, col: Tensor, scores: Tensor, value: Tensor,
                      dropout: float, training: bool,
                      edge: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""Edge softmax of ``scores`` ``[E, H]``, attention dropout, then the SpMM over
    ``value`` ``[N_src, H, C]`` (plus the per-edge rows ``edge`` ``[E, H, C]``,
    see :func:`aggregate`): ``(out [N_dst, H, C], alpha [E, H])``, ``alpha``
    before dropout."""
    alpha = edge_softmax(scores, rowptr)
    a = F.dropout(alpha, p=dropout, training=training) if dropout > 0 else alpha
    return aggregate(rowptr, col, a, value, edge), alpha


def dot_attention(rowptr: Tensor, col: Tensor, q: Tensor, k: Tensor, v: Tensor,
                  scale: Optional[float] = None, dropout: float = 0.0,
                  training: bool = False, edge: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""Scaled dot-product attention (Graph Transformer, ``TransformerConv``):
    :math:`s_{ij} = \mathrm{scale}\; q_i \cdot k_j`; with per-edge rows
    :math:`e_{ij}` (``TransformerConv`` with ``edge_dim``, the ``"dot_edge"``
    score), :math:`s_{ij} = \mathrm{scale}\; q_i \cdot (k_j + e_{ij})` and
    :math:`o_i = \sum_j \alpha_{ij} (v_j + e_{ij})`.

    Args:
        rowptr (Tensor): ``[N_dst + 1]`` CSR row pointer (int32/int64).
        col (Tensor): ``[E]`` source node of each edge, CSR order.
        q (Tensor): ``[N_dst, H, C]`` queries.
        k, v (Tensor): ``[N_src, H, C]`` keys and values.
        scale (float, optional): score scale, default ``1 / sqrt(C)``.
        dropout (float): dropout probability on the attention weights.
        training (bool): apply dropout only when ``True``.
        edge (Tensor, optional): ``[E, H, C]`` per-edge rows in CSR order, added
            to the keys and to the values.

    Returns:
        ``(out [N_dst, H, C], alpha [E, H])``; ``alpha`` is the softmax before dropout
        (what PyG returns with ``return_attention_weights``).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    dtype = v.dtype
    q, k, v = to_float32(q, k, v)
    dst = csr_dst(rowptr, col.numel())
    keys = gather_rows(k, col)
    if edge is not None:
        edge, = to_float32(edge)
        keys = keys + edge
    scores = (gather_rows(q, dst) * keys).sum(-1) * scale
    out, alpha = softmax_aggregate(rowptr, col, scores, v, dropout, training, edge)
    return out.to(dtype), alpha.to(dtype)


def cosine_attention(rowptr: Tensor, col: Tensor, x_dst: Tensor, x_src: Tensor, beta: Tensor,
                     dropout: float = 0.0, training: bool = False) -> Tuple[Tensor, Tensor]:
    r"""Cosine attention (AGNN, ``AGNNConv``):
    :math:`s_{ij} = \beta \cos(x_i, x_j)`, aggregating the *unnormalised* ``x_j``.

    Args:
        x_dst (Tensor): ``[N_dst, C]`` or ``[N_dst, H, C]``.
        x_src (Tensor): ``[N_src, C]`` or ``[N_src, H, C]``.
        beta (Tensor or float): the learnable temperature (scalar).

    Returns:
        ``(out, alpha [E, H])`` with ``out`` shaped like ``x_dst``.
    """
    squeeze = x_src.dim() == 2
    if squeeze:
        x_dst, x_src = x_dst.unsqueeze(1), x_src.unsqueeze(1)
    dtype = x_src.dtype
    x_dst, x_src = to_float32(x_dst, x_src)
    xn_dst = F.normalize(x_dst, p=2.0, dim=-1)
    xn_src = F.normalize(x_src, p=2.0, dim=-1)
    dst = csr_dst(rowptr, col.numel())
    scores = beta * (gather_rows(xn_dst, dst) * gather_rows(xn_src, col)).sum(-1)
    out, alpha = softmax_aggregate(rowptr, col, scores, x_src, dropout, training)
    return (out.squeeze(1) if squeeze else out).to(dtype), alpha.to(dtype)


def pair_sums(rowptr: Tensor, col: Tensor, dst_terms: Tensor, src_terms: Tensor,
              edge: Optional[Tensor] = None) -> Tensor:
    r"""``dst_terms[i] + src_terms[j]`` for each CSR edge :math:`j \to i`, plus
    the edge's row of ``edge`` (``[E, ...]``, CSR order; float16 / bfloat16 in
    float32): the pre-activation of the additive and GATv2 scores. ``dst_terms``
    ``[N_dst, ...]`` and ``src_terms`` ``[N_src, ...]`` are float32 or float64
    already (:func:`to_float32`)."""
    pre = gather_rows(dst_terms, csr_dst(rowptr, col.numel())) + gather_rows(src_terms, col)
    return pre if edge is None else pre + to_float32(edge)[0]


def additive_attention(rowptr: Tensor, col: Tensor, a_dst: Tensor, a_src: Tensor, v: Tensor,
                       negative_slope: float = 0.2, dropout: float = 0.0,
                       training: bool = False,
                       edge: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""Additive attention (GAT, ``GATConv``):
    :math:`s_{ij} = \mathrm{LeakyReLU}(a_{dst,i} + a_{src,j})`; with per-edge
    terms :math:`a_{e,ij}` (``GATConv`` with ``edge_dim``, the
    ``"additive_edge"`` score), :math:`s_{ij} = \mathrm{LeakyReLU}(a_{dst,i} +
    a_{src,j} + a_{e,ij})`.

    Args:
        a_dst (Tensor): ``[N_dst, H]`` per-destination terms :math:`a_{dst}^\top W x_i`.
        a_src (Tensor): ``[N_src, H]`` per-source terms :math:`a_{src}^\top W x_j`.
        v (Tensor): ``[N_src, H, C]`` transformed source features :math:`W x_j`.
        negative_slope (float): LeakyReLU slope.
        edge (Tensor, optional): ``[E, H]`` per-edge terms in CSR order, added to
            the pre-activation (differentiable).

    Returns:
        ``(out [N_dst, H, C], alpha [E, H])``.
    """
    dtype = v.dtype
    a_dst, a_src, v = to_float32(a_dst, a_src, v)
    scores = F.leaky_relu(pair_sums(rowptr, col, a_dst, a_src, edge), negative_slope)
    out, alpha = softmax_aggregate(rowptr, col, scores, v, dropout, training)
    return out.to(dtype), alpha.to(dtype)


def gatv2_attention(rowptr: Tensor, col: Tensor, x_r: Tensor, x_l: Tensor, att: Tensor,
                    negative_slope: float = 0.2, dropout: float = 0.0, training: bool = False,
                    edge: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""GATv2 attention (``GATv2Conv``):
    :math:`s_{ij} = \mathbf{a} \cdot \mathrm{LeakyReLU}(\mathbf{x}_{r,i} +
    \mathbf{x}_{l,j})`, summing :math:`\mathbf{x}_{l,j}`; with per-edge rows
    :math:`\mathbf{e}_{ij}` (``GATv2Conv`` with ``edge_dim``, the
    ``"gatv2_edge"`` score), :math:`s_{ij} = \mathbf{a} \cdot
    \mathrm{LeakyReLU}(\mathbf{x}_{r,i} + \mathbf{x}_{l,j} + \mathbf{e}_{ij})`,
    still summing :math:`\mathbf{x}_{l,j}` (the edge row enters the score only).

    Args:
        x_r (Tensor): ``[N_dst, H, C]`` destination features (``lin_r(x)``).
        x_l (Tensor): ``[N_src, H, C]`` source features (``lin_l(x)``): keys and
            values.
        att (Tensor): ``[H, C]`` attention vector.
        negative_slope (float): LeakyReLU slope.
        dropout (float): dropout probability on the attention weights.
        training (bool): apply dropout only when ``True``.
        edge (Tensor, optional): ``[E, H, C]`` per-edge rows in CSR order, added
            inside the LeakyReLU (differentiable).

    Returns:
        ``(out [N_dst, H, C], alpha [E, H])``.
    """
    dtype = x_l.dtype
    x_r, x_l, att = to_float32(x_r, x_l, att)
    scores = (F.leaky_relu(pair_sums(rowptr, col, x_r, x_l, edge), negative_slope) * att).sum(-1)
    out, alpha = softmax_aggregate(rowptr, col, scores, x_l, dropout, training)
    return out.to(dtype), alpha.to(dtype)
