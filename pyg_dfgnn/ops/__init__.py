r"""Fused attention ops: SDDMM -> edge softmax -> SpMM in one call.

Each op takes a :class:`~pyg_dfgnn.layout.GraphLayout` and dense per-node
tensors: :func:`gt_attention` (dot-product scores, ``TransformerConv``),
:func:`gat_attention` (additive, ``GATConv``), :func:`agnn_attention` (cosine,
``AGNNConv``) and one op per further score function (:mod:`pyg_dfgnn.ops.scores`).
On CUDA tensors, with the extension built and a supported head size, they run
the fused kernels that the kernel plan (:mod:`pyg_dfgnn.ops.plan`: SMMF or PMF,
paper §4.2, and each kernel variant) picks; otherwise the score's pure-PyTorch
reference (:mod:`pyg_dfgnn.ops.reference`). Both compute the same function.
"""
from __future__ import annotations

from ..extension import HAS_EXTENSION
from . import compiled, plan, reference, spec, tiles
from .attention import attention
from .calls import op_args, recording, uses_kernels
from .plan import choose_strategy, kernel_supports
from . import scores  # noqa: E402  (registers every score's spec and op)

if HAS_EXTENSION:
    from . import _fakes  # noqa: F401  (fake implementations; autograd is in C++)

for _spec in spec.specs():
    compiled.define(_spec)
globals().update(scores.OPS)

__all__ = ["attention", "fused_attention", "uses_kernels", "op_args", "recording", "reference",
           "plan", "spec", "choose_strategy", "kernel_supports", *sorted(scores.OPS)]


def fused_attention(layout, score: str = "dot", **kwargs):
    r"""One entry for every score function: ``"dot"`` -> :func:`gt_attention`,
    ``"cosine"`` -> :func:`agnn_attention`, ``"additive"`` -> :func:`gat_attention`,
    and each further registered score to its op; ``kwargs`` go to that op.

    Raises:
        ValueError: an unknown ``score``.
    """
    op = scores.BY_SCORE.get(score)
    if op is None:
        raise ValueError(f"score must be one of {sorted(scores.BY_SCORE)}, got {score!r}")
    return op(layout, **kwargs)
