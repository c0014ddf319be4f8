r"""The dot-product score with per-edge tails (``TransformerConv`` with
``edge_dim``, without an ``E x H x C`` tensor): per head, rows of :math:`C`
channels whose edge rows are the raw features :math:`\mathbf{a}_{ij}`
``[E, D]`` in their last :math:`D` channels and zero before,

.. math::
    s_{ij} = \mathrm{scale}\; \mathbf{q}_i \cdot (\mathbf{k}_j + [0, \mathbf{a}_{ij}]),
    \qquad
    \mathbf{o}_i = \sum_j \mathrm{softmax}_j(s_{ij})\, (\mathbf{v}_j + [0, \mathbf{a}_{ij}]).

``lin_edge`` has no bias, so with :math:`W_h` head :math:`h`'s ``[C, D]`` slice
of its weight, :math:`\mathbf{q}_i \cdot (\mathbf{k}_j + W_h \mathbf{a}_{ij})` is
:math:`[\mathbf{q}_i, W_h^\top \mathbf{q}_i] \cdot [\mathbf{k}_j, \mathbf{a}_{ij}]`
and :math:`\sum_j P_{ij} (\mathbf{v}_j + W_h \mathbf{a}_{ij})` the first
:math:`C` channels of :math:`\sum_j P_{ij} [\mathbf{v}_j, \mathbf{a}_{ij}]` plus
:math:`W_h` times its last :math:`D`: the layer (``nn/transformer_conv.py``)
passes such rows, and the kernels (``cuda/scores/dot_edge_tail.cu``) read
``[E, D]`` per edge where the ``"dot_edge"`` score reads ``[E, H, C]``. The public
op is :func:`~pyg_dfgnn.ops.gt_attention` with a 2-D ``edge=``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import reference
from ..attention import OpResult, check_edge_like
from ..spec import ScoreSpec, register
from .dot import check_qkv, gt_attention

# No public op of its own: gt_attention(edge=[E, D]) is this score's op.
__all__: list = []


def _check(layout, q: Tensor, k: Tensor, v: Tensor, a: Tensor) -> None:
    check_qkv(layout, q, k, v)
    C = q.size(2)
    if not (a.dim() == 2 and a.size(0) == layout.num_edges and 1 <= a.size(1) <= C):
        raise ValueError(f"gt_attention: 2-D edge rows must be [E, D] = [{layout.num_edges}, D] "
                         f"with 1 <= D <= C = {C} (tails of every head's row), got "
                         f"{tuple(a.shape)}")
    check_edge_like(a, q, "q, k and v", "gt_attention")
    vec = 16 // a.element_size()
    if a.is_cuda and (C * a.element_size()) % 16 == 0 and a.size(1) % vec:
        raise ValueError(f"gt_attention: on CUDA, heads of {C} {q.dtype} channels take edge "
                         f"tails of a multiple of {vec} channels (whole 16-byte vectors), got "
                         f"D = {a.size(1)}; pad them with zero channels")


def tails_pay(heads: int, channels: int, edge_dim: int) -> bool:
    r"""Whether a ``TransformerConv`` step with ``edge_dim`` features moves fewer
    bytes per edge with tails (queries, keys and values of ``C + D`` channels,
    ``[E, D]`` edge rows, an ``[E, H, D]`` gradient summed over the heads) than
    with ``[E, H, C]`` rows (written by ``lin_edge``, read by the forward and the
    dq walk, their gradient written and read by ``lin_edge``'s backward), counted
    in elements, forward and backward: ``4 H (C + D) + 2 H D + 3 D`` against
    ``9 H C`` (a model, not a measurement). Tails pay where ``D`` is small
    against ``C``: 1 x 128 channels with 16 features, not 4 x 32 with 128."""
    H, C, D = heads, channels, edge_dim
    return 4 * H * (C + D) + 2 * H * D + 3 * D < 9 * H * C


def tail_rows(a: Tensor, heads: int, channels: int) -> Tensor:
    r"""The ``[E, H, C]`` edge rows that the tails ``a`` ``[E, D]`` stand for:
    zero in the first ``C - D`` channels of every head, ``a`` in the last ``D``
    (the reference's form; differentiable, ``a``'s gradient summed over the heads)."""
    E, D = a.shape
    return torch.cat([a.new_zeros(E, heads, channels - D),
                      a[:, None, :].expand(E, heads, D)], dim=-1)


def _reference(layout, inputs, params, dropout, training):
    q, k, v, a = inputs
    e = tail_rows(a, q.size(1), q.size(2))
    return reference.dot_attention(layout.rowptr, layout.col, q, k, v, params[0], dropout,
                                   training=training, edge=e)


SPEC = register(ScoreSpec(
    name="dot_edge_tail", inputs=("q", "k", "v", "a"), params=("scale",), dst_input=0,
    value_input=2, row_inputs=(0, 1, 2, 3), edge_inputs=(3,), reference=_reference,
    check=_check, pmf=False, pmf_rule=False, mma=False, dense_tiles=False, two_rows=False,
    one_launch_backward=False, keeps_out32=True))


def edge_tail_attention(layout, q: Tensor, k: Tensor, v: Tensor, edge: Tensor,
                        **kwargs) -> OpResult:
    r""":func:`~pyg_dfgnn.ops.gt_attention` with the per-edge tails ``edge``
    ``[E, D]`` (input edge order) required: the op of
    ``pyg_dfgnn.ops.fused_attention(layout, "dot_edge_tail", ...)``; ``kwargs`` go
    to :func:`~pyg_dfgnn.ops.gt_attention`."""
    return gt_attention(layout, q, k, v, edge=edge, **kwargs)


SCORE_OP = edge_tail_attention
