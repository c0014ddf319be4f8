r"""The GATv2 score with per-edge rows (``GATv2Conv`` with ``edge_dim``): per
head, with :math:`\mathbf{e}_{ij}` the projected edge features,

.. math::
    s_{ij} = \mathbf{a} \cdot \mathrm{LeakyReLU}(\mathbf{x}_{r,i} + \mathbf{x}_{l,j}
    + \mathbf{e}_{ij}),
    \qquad
    \mathbf{o}_i = \sum_j \mathrm{softmax}_j(s_{ij})\, \mathbf{x}_{l,j}.

The edge row enters the score only, inside the LeakyReLU and per channel, so it
is a whole ``[E, H, C]`` row per edge (no per-head scalar, as the additive
score's ``[E, H]`` terms, can stand for it); the sum takes :math:`\mathbf{x}_{l,j}`
without it, as PyG's ``message`` does. The kernels (the shared row walks over the
``GATv2EdgeScore`` functor, SMMF only) read one edge row per edge, in the
layout's CSR edge order, beside the gathered :math:`\mathbf{x}_l` row, which
serves as key and value; the backward's CSR walk writes its gradient
:math:`dS_{ij}\, \partial s_{ij} / \partial \mathbf{x}_{l,j}` per edge (the key's
gradient alone: no :math:`P' d\mathbf{o}_i` term). The public op is
:func:`~pyg_dfgnn.ops.gatv2_attention` with ``edge=``.
"""
from __future__ import annotations

from torch import Tensor

from ..attention import OpResult, check_edge_input
from ..spec import ScoreSpec, register
from .gatv2 import check_rows, gatv2_attention, gatv2_reference

# No public op of its own: gatv2_attention(edge=...) is this score's op.
__all__: list = []


def _check(layout, x_r: Tensor, x_l: Tensor, att: Tensor, e: Tensor) -> None:
    check_rows(layout, x_r, x_l, att)
    check_edge_input(e, (layout.num_edges, x_l.size(1), x_l.size(2)), x_l, "x_l",
                     "gatv2_attention")


SPEC = register(ScoreSpec(
    name="gatv2_edge", inputs=("x_r", "x_l", "att", "e"), params=("negative_slope",),
    dst_input=0, value_input=1, row_inputs=(0, 1, 3), edge_inputs=(3,),
    reference=gatv2_reference, check=_check, pmf=False, pmf_rule=False, mma=False,
    dense_tiles=False, two_rows=False, one_launch_backward=False, keeps_out32=True))


def edge_attention(layout, x_l: Tensor, x_r: Tensor, att: Tensor, edge: Tensor,
                   **kwargs) -> OpResult:
    r""":func:`~pyg_dfgnn.ops.gatv2_attention` with the per-edge rows ``edge``
    ``[E, H, C]`` (input edge order) required: the op of
    ``pyg_dfgnn.ops.fused_attention(layout, "gatv2_edge", ...)``; ``kwargs`` go
    to :func:`~pyg_dfgnn.ops.gatv2_attention`."""
    return gatv2_attention(layout, x_l, x_r, att, edge=edge, **kwargs)


SCORE_OP = edge_attention
