r"""The score of GATv2 (``GATv2Conv``, Brody et al., 2022):
:math:`s_{ij} = \mathbf{a} \cdot \mathrm{LeakyReLU}(\mathbf{x}_{r,i} +
\mathbf{x}_{l,j})` per head, summing :math:`\mathbf{x}_{l,j}`. PyG computes it
by materialising :math:`\mathbf{x}_{r,i} + \mathbf{x}_{l,j}` as an
``E x H x C`` tensor; the fused kernels (``cuda/scores/gatv2.cu``) gather one
:math:`\mathbf{x}_l` row per edge for the score and the sum and keep nothing of
size ``E x C``. With edge features (``edge_dim``) the op runs the
``"gatv2_edge"`` score (:mod:`pyg_dfgnn.ops.scores.gatv2_edge`)."""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .. import reference
from ..attention import OpResult, attention_with_edge
from ..spec import ScoreSpec, register

__all__ = ["gatv2_attention"]


def check_rows(layout, x_r: Tensor, x_l: Tensor, att: Tensor) -> None:
    """Raises :class:`ValueError` unless ``x_r`` is ``[N_dst, H, C]``, ``x_l``
    ``[N_src, H, C]`` and ``att`` ``[H, C]``, of one dtype, on the layout's
    device."""
    xs = x_l.shape
    if (len(xs) == 3 and xs[0] == layout.num_src and x_r.shape == (layout.num_dst, xs[1], xs[2])
            and att.shape == (xs[1], xs[2]) and x_r.dtype == x_l.dtype == att.dtype
            and x_l.device == layout._device and x_r.device == x_l.device
            and att.device == x_l.device):
        # The common case, in one expression, as check_qkv (scores/dot.py).
        return
    if (x_r.dim() != 3 or x_l.dim() != 3 or x_r.shape[1:] != x_l.shape[1:]
            or att.shape != x_l.shape[1:]):
        raise ValueError(f"gatv2_attention: expected x_r [N_dst, H, C], x_l [N_src, H, C] and "
                         f"att [H, C]; got {tuple(x_r.shape)}, {tuple(x_l.shape)}, "
                         f"{tuple(att.shape)}")
    if x_r.size(0) != layout.num_dst or x_l.size(0) != layout.num_src:
        raise ValueError(f"gatv2_attention: x_r must have {layout.num_dst} rows (destination "
                         f"nodes) and x_l {layout.num_src} (source nodes), got {x_r.size(0)} "
                         f"and {x_l.size(0)}")
    if not (x_r.dtype == x_l.dtype == att.dtype):
        raise ValueError(f"gatv2_attention: x_r, x_l and att must share a dtype, got "
                         f"{x_r.dtype}, {x_l.dtype}, {att.dtype}")
    if x_l.device != layout.device or x_r.device != x_l.device or att.device != x_l.device:
        raise ValueError(f"gatv2_attention: the features are on {x_l.device} but the layout is "
                         f"on {layout.device}")


def gatv2_reference(layout, inputs, params, dropout, training):
    r"""The spec's reference of the ``gatv2`` score, ``inputs`` ``(x_r, x_l,
    att)``, and of the ``gatv2_edge`` score, ``(x_r, x_l, att, e)``
    (:func:`pyg_dfgnn.ops.reference.gatv2_attention`)."""
    x_r, x_l, att, *edge = inputs
    return reference.gatv2_attention(layout.rowptr, layout.col, x_r, x_l, att, params[0],
                                     dropout, training=training, edge=edge[0] if edge else None)


SPEC = register(ScoreSpec(
    name="gatv2", inputs=("x_r", "x_l", "att"), params=("negative_slope",), dst_input=0,
    value_input=1, row_inputs=(0, 1), reference=gatv2_reference, check=check_rows,
    keeps_out32=True))


def gatv2_attention(layout, x_l: Tensor, x_r: Tensor, att: Tensor, negative_slope: float = 0.2,
                    dropout: float = 0.0, training: bool = True, return_attention: bool = False,
                    strategy: str = "auto", edge: Optional[Tensor] = None,
                    edge_order: str = "input") -> OpResult:
    r"""Fused GATv2 attention (``GATv2Conv``):

    .. math::
        \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j\left(
        \mathbf{a}^\top \mathrm{LeakyReLU}(\mathbf{x}_{r,i} + \mathbf{x}_{l,j})
        \right) \mathbf{x}_{l,j}

    per head, with in-kernel attention dropout; the backward returns gradients for
    ``x_l``, ``x_r`` and ``att`` (SMMF and PMF as the dot-product score, paper
    §3-4; the backward walks the CSR for ``x_r`` and the CSC for ``x_l``, without
    atomics). With per-edge rows :math:`\mathbf{e}_{ij}` (``edge``;
    ``GATv2Conv`` with ``edge_dim``) the score is :math:`\mathbf{a}^\top
    \mathrm{LeakyReLU}(\mathbf{x}_{r,i} + \mathbf{x}_{l,j} + \mathbf{e}_{ij})`
    and :math:`\mathbf{x}_{l,j}` is summed as it is (the ``"gatv2_edge"`` score,
    :mod:`pyg_dfgnn.ops.scores.gatv2_edge`; SMMF only).

    Args:
        layout (GraphLayout): the graph.
        x_l (Tensor): ``[N_src, H, C]`` source features (``lin_l(x)``): keys and values.
        x_r (Tensor): ``[N_dst, H, C]`` destination features (``lin_r(x)``).
        att (Tensor): ``[H, C]`` attention vector, the dtype of ``x_l``.
        negative_slope (float): LeakyReLU slope.
        dropout (float), training (bool), return_attention (bool), strategy (str):
            as in :func:`~pyg_dfgnn.ops.gt_attention` (``"pmf"`` not with ``edge``).
        edge (Tensor, optional): ``[E, H, C]`` per-edge rows, the dtype of
            ``x_l``, one per edge of the layout; differentiable (its gradient
            comes back in ``edge``'s order).
        edge_order (str): the order of ``edge``'s rows, ``"input"`` or ``"csr"``,
            as in :func:`~pyg_dfgnn.ops.gat_attention` (on a layout with added
            self-loops, ``"csr"`` after ``to_csr_order(edge,
            loops_appended=True)``).

    Returns:
        ``out`` ``[N_dst, H, C]``, or ``(out, alpha [E, H])`` in input edge order.

    Raises:
        ValueError: mismatched shapes, dtypes or devices; ``dropout`` outside
            [0, 1); a bad ``edge_order``; ``edge`` in input order on a layout
            with added self-loops; ``strategy="pmf"`` with ``edge``.
    """
    return attention_with_edge(SPEC, "gatv2_edge", layout, (x_r, x_l, att),
                               (float(negative_slope),), dropout, training, return_attention,
                               strategy, edge, edge_order, "gatv2_attention")


SCORE_OP = gatv2_attention
