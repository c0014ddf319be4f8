r"""The additive score with a per-edge term (``GATConv`` with ``edge_dim``): per
head, with :math:`a_{e,ij}` one scalar per edge,

.. math::
    s_{ij} = \mathrm{LeakyReLU}(a_{dst,i} + a_{src,j} + a_{e,ij}),
    \qquad
    \mathbf{o}_i = \sum_j \mathrm{softmax}_j(s_{ij})\, \mathbf{x}_j.

``GATConv`` computes :math:`a_{e,ij} = \mathbf{a}_e^\top \mathbf{\Theta}_e
\mathbf{e}_{ij}` from the edge features (``nn/gat_conv.py`` does it without the
``E x H x C`` projection); the kernels read the ``[E, H]`` terms in the
layout's CSR edge order, beside the node terms the additive score's walks
read, and the backward returns their gradient (that of the pre-activation
:math:`a_{dst,i} + a_{src,j} + a_{e,ij}`) per edge and head, in that order, from
an edge-parallel kernel after the destination walk. The public op is
:func:`~pyg_dfgnn.ops.gat_attention` with ``edge=``.
"""
from __future__ import annotations

from torch import Tensor

from .. import reference
from ..attention import OpResult, check_edge_input
from ..spec import ScoreSpec, register
from .additive import check_terms, gat_attention

# No public op of its own: gat_attention(edge=...) is this score's op.
__all__: list = []


def _check(layout, a_dst: Tensor, a_src: Tensor, x: Tensor, a_edge: Tensor) -> None:
    check_terms(layout, a_dst, a_src, x)
    check_edge_input(a_edge, (layout.num_edges, x.size(1)), x, "x", "gat_attention")


def _reference(layout, inputs, params, dropout, training):
    a_dst, a_src, x, a_edge = inputs
    return reference.additive_attention(layout.rowptr, layout.col, a_dst, a_src, x, params[0],
                                        dropout, training=training, edge=a_edge)


SPEC = register(ScoreSpec(
    name="additive_edge", inputs=("a_dst", "a_src", "x", "a_edge"), params=("negative_slope",),
    dst_input=0, value_input=2, row_inputs=(2,), edge_inputs=(3,), reference=_reference,
    check=_check, pmf_rule=False, one_launch_backward=False, csr_row_backward=True))


def edge_attention(layout, a_src: Tensor, a_dst: Tensor, x: Tensor, edge: Tensor,
                   **kwargs) -> OpResult:
    r""":func:`~pyg_dfgnn.ops.gat_attention` with the per-edge terms ``edge``
    ``[E, H]`` (input edge order) required: the op of
    ``pyg_dfgnn.ops.fused_attention(layout, "additive_edge", ...)``; ``kwargs``
    go to :func:`~pyg_dfgnn.ops.gat_attention`."""
    return gat_attention(layout, a_src, a_dst, x, edge=edge, **kwargs)


SCORE_OP = edge_attention
