r"""The dot-product score with per-edge tails (``TransformerConv`` with
``edge_dim``, without an ``E x H x C`` tensor): per head, queries of :math:`C`
channels whose last :math:`D` are tails, keys and values of the first
:math:`C - D`, and the raw features :math:`\mathbf{a}_{ij}` ``[E, D]`` as every
edge's tail,

.. math::
    s_{ij} = \mathrm{scale}\; \mathbf{q}_i \cdot [\mathbf{k}_j, \mathbf{a}_{ij}],
    \qquad
    \mathbf{o}_i = \sum_j \mathrm{softmax}_j(s_{ij})\, [\mathbf{v}_j, \mathbf{a}_{ij}].

``lin_edge`` has no bias, so with :math:`W_h` head :math:`h`'s ``[C', D]`` slice
of its weight (:math:`C'` the layer's channels), :math:`\mathbf{q}_i \cdot
(\mathbf{k}_j + W_h \mathbf{a}_{ij})` is :math:`[\mathbf{q}_i, W_h^\top
\mathbf{q}_i] \cdot [\mathbf{k}_j, \mathbf{a}_{ij}]` and :math:`\sum_j P_{ij}
(\mathbf{v}_j + W_h \mathbf{a}_{ij})` the first :math:`C'` channels of
:math:`\sum_j P_{ij} [\mathbf{v}_j, \mathbf{a}_{ij}]` plus :math:`W_h` times its
last :math:`D`: the layer (``nn/transformer_conv.py``) passes such rows, and the
kernels (``cuda/scores/dot_edge_tail.cu``) read ``[E, D]`` per edge where the
``"dot_edge"`` score reads ``[E, H, C]``, and keys and values without tails
(zeros there would be gathered for every edge). The public op is
:func:`~pyg_dfgnn.ops.gt_attention` with a 2-D ``edge=``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import reference
from ..attention import OpResult, check_edge_like
from ..spec import ScoreSpec, register
from .dot import check_qkv, gt_attention

# No public op of its own: gt_attention(edge=[E, D]) is this score's op.
__all__: list = []


def tails_fit_rows(C: int, D: int, itemsize: int) -> bool:
    r"""Whether ``[E, D]`` tails complete rows of ``C`` channels (the queries',
    tails included) of ``itemsize``-byte elements as the CUDA kernels read them:
    rows of whole 16-byte vectors are read in vectors, and their tails must then be
    whole vectors too; other rows are read in scalars and take any ``D``."""
    return (C * itemsize) % 16 != 0 or D % (16 // itemsize) == 0


def _check(layout, q: Tensor, k: Tensor, v: Tensor, a: Tensor) -> None:
    C = q.size(-1)
    if not (a.dim() == 2 and a.size(0) == layout.num_edges and 1 <= a.size(1) < C):
        raise ValueError(f"gt_attention: 2-D edge rows must be [E, D] = [{layout.num_edges}, D] "
                         f"with 1 <= D < C = {C}, q's channels (the tails of every head's "
                         f"query), got {tuple(a.shape)}")
    D = a.size(1)
    if a.is_cuda and not tails_fit_rows(C, D, a.element_size()):
        raise ValueError(f"gt_attention: on CUDA, heads of {C} {q.dtype} channels take edge "
                         f"tails of a multiple of {16 // a.element_size()} channels (whole "
                         f"16-byte vectors), got D = {D}; pad them with zero channels")
    # Keys and values are the rows without the tails.
    check_qkv(layout, q, k, v, kv_channels=C - D)
    check_edge_like(a, q, "q, k and v", "gt_attention")


def pad_tails(x: Tensor, width: int) -> Tensor:
    r"""Keys or values ``[N, H, C - D]`` with ``width`` = ``D`` zero channels
    appended: the rows the tails fill (the reference's form; differentiable)."""
    return F.pad(x, (0, width))


def tails_pay(heads: int, channels: int, edge_dim: int) -> bool:
    r"""Whether a ``TransformerConv`` step with ``edge_dim`` features moves fewer
    bytes per edge with tails (``[E, D]`` edge rows read by the forward and the dq
    walk, an ``[E, H, D]`` gradient written and summed over the heads) than with
    ``[E, H, C]`` rows (written by ``lin_edge``, read by the forward and the dq
    walk, their gradient written and read by ``lin_edge``'s backward), counted in
    elements, forward and backward: ``2 H D + 3 D`` against ``5 H C``; the
    gathered key, value, query and output-gradient rows are the same ``C``
    channels either way (a model, not a measurement). Tails pay where ``D`` is
    small against ``H C``: 1 x 128 channels with 16 features, not 4 x 32 with
    128."""
    H, C, D = heads, channels, edge_dim
    return 2 * H * D + 3 * D < 5 * H * C


def tail_rows(a: Tensor, heads: int, channels: int) -> Tensor:
    r"""The ``[E, H, C]`` edge rows that the tails ``a`` ``[E, D]`` stand for:
    zero in the first ``C - D`` channels of every head, ``a`` in the last ``D``
    (the reference's form; differentiable, ``a``'s gradient summed over the heads)."""
    E, D = a.shape
    return torch.cat([a.new_zeros(E, heads, channels - D),
                      a[:, None, :].expand(E, heads, D)], dim=-1)


def _reference(layout, inputs, params, dropout, training):
    q, k, v, a = inputs
    D = a.size(1)
    e = tail_rows(a, q.size(1), q.size(2))
    return reference.dot_attention(layout.rowptr, layout.col, q, pad_tails(k, D),
                                   pad_tails(v, D), params[0], dropout, training=training,
                                   edge=e)


# value_input: q, whose C channels (tails included) the output has; k and v
# have C - D.
SPEC = register(ScoreSpec(
    name="dot_edge_tail", inputs=("q", "k", "v", "a"), params=("scale",), dst_input=0,
    value_input=0, row_inputs=(0, 1, 2, 3), edge_inputs=(3,), reference=_reference,
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
