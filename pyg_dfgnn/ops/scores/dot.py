r"""The dot-product score of Graph Transformers (``TransformerConv``):
:math:`s_{ij} = \mathrm{scale}\; \mathbf{q}_i \cdot \mathbf{k}_j`, summing
:math:`\mathbf{v}_j` (paper eq. 1-2). Its functor is ``cuda/scores/dot.cuh``, its
host entry points ``cuda/scores/dot.cpp``, and its walks and its tensor-core and
dense-tile kernels ``cuda/scores/dot_forward*.cu`` and ``dot_backward*.cu``."""
from __future__ import annotations

import math
from typing import Optional

from torch import Tensor

from .. import reference
from ..attention import OpResult, attention_with_edge
from ..spec import ScoreSpec, register

__all__ = ["gt_attention"]


def check_qkv(layout, q: Tensor, k: Tensor, v: Tensor, who: str = "gt_attention",
              kv_channels: Optional[int] = None) -> None:
    """Raises :class:`ValueError` unless ``q`` is ``[N_dst, H, C]`` and ``k``,
    ``v`` are ``[N_src, H, C]`` (``[N_src, H, kv_channels]`` where given: the
    tails' score, whose ``[E, D]`` tails complete them, ``C - D``) of one dtype on
    the layout's device."""
    qs = q.shape
    if (len(qs) == 3 and qs[0] == layout.num_dst
            and k.shape == v.shape == (layout.num_src, qs[1],
                                       qs[2] if kv_channels is None else kv_channels)
            and q.dtype == k.dtype == v.dtype and q.device == layout._device):
        # The common case, in one expression: this runs on every call's host path
        # (no torch.Size slices, the layout's device cached).
        return
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"{who}: q, k, v must be [N, H, C], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.size(0) != layout.num_dst:
        raise ValueError(f"{who}: q has {q.size(0)} rows but the graph has {layout.num_dst} "
                         "destination nodes")
    if k.size(0) != layout.num_src or v.size(0) != layout.num_src:
        raise ValueError(f"{who}: k and v must have {layout.num_src} rows (source nodes), got "
                         f"{k.size(0)} and {v.size(0)}")
    kv = (q.size(1), q.size(2) if kv_channels is None else kv_channels)
    if tuple(k.shape[1:]) != kv or tuple(v.shape[1:]) != kv:
        what = "C" if kv_channels is None else "C - D"  # tails of D channels complete them
        raise ValueError(f"{who}: k and v must be [N_src, H, {what}] = [N_src, {kv[0]}, "
                         f"{kv[1]}], got {tuple(k.shape)}, {tuple(v.shape)} (q: {tuple(q.shape)})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{who}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != layout.device:
        raise ValueError(f"{who}: the features are on {q.device} but the layout is on "
                         f"{layout.device}; move the graph with .to()")


def _reference(layout, inputs, params, dropout, training):
    q, k, v = inputs
    return reference.dot_attention(layout.rowptr, layout.col, q, k, v, params[0], dropout,
                                   training=training)


SPEC = register(ScoreSpec(
    name="dot", inputs=("q", "k", "v"), params=("scale",), dst_input=0, value_input=2,
    row_inputs=(0, 1, 2), reference=_reference, check=check_qkv, mma=True, dense_tiles=True,
    keeps_out32=True))


def gt_attention(layout, q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                 dropout: float = 0.0, training: bool = True, return_attention: bool = False,
                 strategy: str = "auto", edge: Optional[Tensor] = None,
                 edge_order: str = "input") -> OpResult:
    r"""Fused scaled dot-product attention over in-edges (Graph Transformer):

    .. math::
        \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j
        \left(\mathrm{scale}\; \mathbf{q}_i^\top \mathbf{k}_j\right) \mathbf{v}_j

    per head (paper eq. 1-2; SMMF/PMF of §3-4, backward of §4.3). With per-edge
    rows :math:`\mathbf{e}_{ij}` (``edge``; ``TransformerConv`` with
    ``edge_dim``), :math:`\mathbf{k}_j + \mathbf{e}_{ij}` scores and
    :math:`\mathbf{v}_j + \mathbf{e}_{ij}` is summed (the ``"dot_edge"`` score,
    :mod:`pyg_dfgnn.ops.scores.dot_edge`).

    Args:
        layout (GraphLayout): the graph (``N_src`` sources, ``N_dst`` destinations).
        q (Tensor): ``[N_dst, H, C]`` queries, float32 / float16 / bfloat16.
        k, v (Tensor): ``[N_src, H, C]`` keys and values, same dtype
            (``[N_src, H, C - D]`` with ``[E, D]`` tails, below).
        scale (float, optional): score scale, ``1 / sqrt(C)`` by default.
        dropout (float): dropout probability on the attention weights (in-kernel,
            counter-based RNG seeded from torch's generator).
        training (bool): dropout is applied only when ``True``.
        return_attention (bool): also return the softmax weights (before dropout)
            ``[E, H]`` in the layout's input edge order (not differentiable on the
            fused-kernel path).
        strategy (str): ``"auto"``, ``"smmf"`` or ``"pmf"`` (``"pmf"`` not with
            ``edge``).
        edge (Tensor, optional): ``[E, H, C]`` per-edge rows, the dtype of ``q``,
            one per edge of the layout; or ``[E, D]`` tails (``D < C``) that
            complete every head's key and value rows, which then have ``C - D``
            channels: :math:`[\mathbf{k}_j, \mathbf{a}_{ij}]` scores and
            :math:`[\mathbf{v}_j, \mathbf{a}_{ij}]` is summed (the
            ``"dot_edge_tail"`` score, :mod:`pyg_dfgnn.ops.scores.dot_edge_tail`;
            on CUDA ``D`` a multiple of the 16-byte vector where ``C`` is);
            differentiable (its gradient comes back in ``edge``'s order).
        edge_order (str): the order of ``edge``'s rows: ``"input"`` (the edges
            as the layout was built from them; gathered into CSR order with
            :meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order`, no gather where
            they were grouped by destination) or ``"csr"`` (the layout's CSR
            order already: callers that permute narrower per-edge features
            before projecting them).

    Returns:
        ``out`` ``[N_dst, H, C]`` (dtype of ``q``), or ``(out, alpha)``.

    Raises:
        ValueError: mismatched shapes, dtypes or devices, bad ``strategy`` or
            ``edge_order``, ``dropout`` outside ``[0, 1)``, or ``edge`` on a
            layout with added self-loops (which have no input edge row).

    .. note::
        In float16 / bfloat16 with ``C`` in {32, 64, 128}, no dropout, no returned
        attention and no row longer than a work item (the batch graphs), the SMMF
        forward runs on tensor cores (``cuda/scores/dot_forward_mma.cu``); the softmax
        weights then enter the aggregation rounded to the input dtype, as in flash
        attention. Blocks of 64 rows whose in-neighbours lie in a window of at most
        512 consecutive source rows, with at most 24 window cells per edge and no
        duplicate edge, run the window as one dense tile masked by the edges
        (``cuda/scores/dot_forward_dense.cu``), on graphs whose median block has at most
        20 cells per edge (``docs/kernels.md``). The tile plan
        (:mod:`pyg_dfgnn.ops.tiles`) is built on the first such call and cached on
        the layout. On graphs under 2^16 edges the backward runs its CSR (dQ) and
        CSC (dK, dV) walks in one kernel launch; in two launches the dQ kernel
        saves each edge's dropped-out weight and score gradient (8 bytes per edge
        and head, freed when the backward returns) and the dK / dV kernel is an
        SpMM with them (``docs/backward.md``). The kernel plan
        (:mod:`pyg_dfgnn.ops.plan`) makes each of these decisions;
        :func:`pyg_dfgnn.explain` shows them for a layer's call.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    edge_score = "dot_edge_tail" if edge is not None and edge.dim() == 2 else "dot_edge"
    return attention_with_edge(SPEC, edge_score, layout, (q, k, v), (scale,), dropout,
                               training, return_attention, strategy, edge, edge_order,
                               "gt_attention")


SCORE_OP = gt_attention
