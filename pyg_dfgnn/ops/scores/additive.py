r"""The additive score of GAT (``GATConv``):
:math:`s_{ij} = \mathrm{LeakyReLU}(a_{dst,i} + a_{src,j})` from per-node terms
:math:`a^\top W x`, summing :math:`W x_j`. Its functor is
``cuda/scores/additive.cuh``, its host entry points ``cuda/scores/additive.cpp``
and its walks (one scalar per edge, the LeakyReLU branch split of the backward)
``cuda/scores/additive_forward.cu`` and ``additive_backward.cu``; its functor of
the shared row walk, the forward the plan's ``row_walk`` runs,
``cuda/scores/additive_row.cuh``."""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .. import reference
from ..attention import OpResult, attention_with_edge
from ..spec import ScoreSpec, register

__all__ = ["gat_attention"]


def check_terms(layout, a_dst: Tensor, a_src: Tensor, x: Tensor) -> None:
    """Raises :class:`ValueError` unless ``x`` is ``[N_src, H, C]``, ``a_src``
    ``[N_src, H]`` and ``a_dst`` ``[N_dst, H]``, of one dtype, on the layout's
    device."""
    xs = x.shape
    if (len(xs) == 3 and xs[0] == layout.num_src and a_src.shape == (xs[0], xs[1])
            and a_dst.shape == (layout.num_dst, xs[1])
            and x.dtype == a_src.dtype == a_dst.dtype and x.device == layout._device):
        # The common case, in one expression: this runs on every call's host path
        # (no torch.Size slices, the layout's device cached).
        return
    if x.dim() != 3 or a_src.shape != x.shape[:2] or a_dst.shape != (layout.num_dst, x.size(1)):
        raise ValueError(f"gat_attention: expected x [N_src, H, C], a_src [N_src, H], a_dst "
                         f"[N_dst, H]; got {tuple(x.shape)}, {tuple(a_src.shape)}, "
                         f"{tuple(a_dst.shape)}")
    if x.size(0) != layout.num_src:
        raise ValueError(f"gat_attention: x has {x.size(0)} rows but the graph has "
                         f"{layout.num_src} source nodes")
    if not (x.dtype == a_src.dtype == a_dst.dtype):
        raise ValueError("gat_attention: a_src, a_dst and x must share a dtype")
    if x.device != layout.device:
        raise ValueError(f"gat_attention: the features are on {x.device} but the layout is on "
                         f"{layout.device}")


def _reference(layout, inputs, params, dropout, training):
    a_dst, a_src, x = inputs
    return reference.additive_attention(layout.rowptr, layout.col, a_dst, a_src, x, params[0],
                                        dropout, training=training)


SPEC = register(ScoreSpec(
    name="additive", inputs=("a_dst", "a_src", "x"), params=("negative_slope",), dst_input=0,
    value_input=2, row_inputs=(2,), reference=_reference, check=check_terms, pmf_rule=False,
    one_launch_backward=False, row_walk=True))


def gat_attention(layout, a_src: Tensor, a_dst: Tensor, x: Tensor, negative_slope: float = 0.2,
                  dropout: float = 0.0, training: bool = True, return_attention: bool = False,
                  strategy: str = "auto", edge: Optional[Tensor] = None,
                  edge_order: str = "input") -> OpResult:
    r"""Fused additive attention (GAT, ``GATConv``):

    .. math::
        \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j\left(
        \mathrm{LeakyReLU}(a_{dst,i} + a_{src,j})\right) \mathbf{x}_j

    per head, with in-kernel attention dropout; the backward returns gradients for
    ``a_src``, ``a_dst`` and ``x`` (paper §4.3). With per-edge terms
    :math:`a_{e,ij}` (``edge``; ``GATConv`` with ``edge_dim``) the score is
    :math:`\mathrm{LeakyReLU}(a_{dst,i} + a_{src,j} + a_{e,ij})` (the
    ``"additive_edge"`` score, :mod:`pyg_dfgnn.ops.scores.additive_edge`).
    ``"auto"`` is SMMF (paper §4.2, Fig. 12, and the measurements in
    ``docs/kernels.md``); ``"smmf"`` / ``"pmf"`` (edge-parallel score kernel,
    then softmax + SpMM) force one.

    Args:
        a_src (Tensor): ``[N_src, H]`` per-source terms :math:`a_{src}^\top W x_j`.
        a_dst (Tensor): ``[N_dst, H]`` per-destination terms.
        x (Tensor): ``[N_src, H, C]`` transformed source features, same dtype.
        negative_slope (float): LeakyReLU slope.
        dropout (float), training (bool), return_attention (bool), strategy (str):
            as in :func:`~pyg_dfgnn.ops.gt_attention`.
        edge (Tensor, optional): ``[E, H]`` per-edge terms, the dtype of ``x``,
            one per edge of the layout and head; differentiable (its gradient
            comes back in ``edge``'s order).
        edge_order (str): the order of ``edge``'s rows: ``"input"`` (the edges
            as the layout was built from them, gathered into CSR order with
            :meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order`) or ``"csr"``
            (the layout's CSR order already). On a layout with added self-loops
            put the terms in CSR order first with ``to_csr_order(edge,
            loops_appended=True)`` (``edge`` in the order of the layout's
            ``edge_index``: input edges without their self-loops, then the
            added loops, as PyG's ``add_self_loops`` leaves edge features).

    Returns:
        ``out`` ``[N_dst, H, C]``, or ``(out, alpha [E, H])`` in input edge order.

    Raises:
        ValueError: mismatched shapes, dtypes or devices; ``dropout`` outside
            [0, 1); a bad ``edge_order``; ``edge`` in input order on a layout
            with added self-loops.
    """
    return attention_with_edge(SPEC, "additive_edge", layout, (a_dst, a_src, x),
                               (float(negative_slope),), dropout, training, return_attention,
                               strategy, edge, edge_order, "gat_attention")


SCORE_OP = gat_attention
