r"""The dot-product score with per-edge rows (``TransformerConv`` with
``edge_dim``): per head, with :math:`\mathbf{e}_{ij}` the projected edge
features,

.. math::
    s_{ij} = \mathrm{scale}\; \mathbf{q}_i \cdot (\mathbf{k}_j + \mathbf{e}_{ij}),
    \qquad
    \mathbf{o}_i = \sum_j \mathrm{softmax}_j(s_{ij})\, (\mathbf{v}_j + \mathbf{e}_{ij}).

PyG adds :math:`\mathbf{e}_{ij}` to the gathered keys and values as two
``E x H x C`` tensors; the kernels (``cuda/scores/dot_edge.cu``) read one edge row
per edge, in the layout's CSR edge order, and the backward's CSR walk writes its
gradient :math:`\mathrm{scale}\, dS_{ij}\, \mathbf{q}_i + P'_{ij}\, d\mathbf{o}_i`
per edge. The public op is :func:`~pyg_dfgnn.ops.gt_attention` with ``edge=``.
"""
from __future__ import annotations

from torch import Tensor

from .. import reference
from ..attention import OpResult, check_edge_input
from ..spec import ScoreSpec, register
from .dot import check_qkv, gt_attention

# No public op of its own: gt_attention(edge=...) is this score's op.
__all__: list = []


def _check(layout, q: Tensor, k: Tensor, v: Tensor, e: Tensor) -> None:
    check_qkv(layout, q, k, v)
    es, qs = e.shape, q.shape
    if (len(es) == 3 and es[0] == layout.num_edges and es[1] == qs[1] and es[2] == qs[2]
            and e.dtype == q.dtype and e.device == q.device):
        return  # the common case, in one expression (check_qkv says why)
    check_edge_input(e, (layout.num_edges, qs[1], qs[2]), q, "q, k and v", "gt_attention")


def _reference(layout, inputs, params, dropout, training):
    q, k, v, e = inputs
    return reference.dot_attention(layout.rowptr, layout.col, q, k, v, params[0], dropout,
                                   training=training, edge=e)


SPEC = register(ScoreSpec(
    name="dot_edge", inputs=("q", "k", "v", "e"), params=("scale",), dst_input=0,
    value_input=2, row_inputs=(0, 1, 2, 3), edge_inputs=(3,), reference=_reference,
    check=_check, pmf=False, pmf_rule=False, mma=False, dense_tiles=False, two_rows=False,
    one_launch_backward=False, keeps_out32=True))


def edge_attention(layout, q: Tensor, k: Tensor, v: Tensor, edge: Tensor, **kwargs) -> OpResult:
    r""":func:`~pyg_dfgnn.ops.gt_attention` with the per-edge rows ``edge``
    ``[E, H, C]`` (input edge order) required: the op of
    ``pyg_dfgnn.ops.fused_attention(layout, "dot_edge", ...)``; ``kwargs`` go to
    :func:`~pyg_dfgnn.ops.gt_attention`."""
    return gt_attention(layout, q, k, v, edge=edge, **kwargs)


SCORE_OP = edge_attention
