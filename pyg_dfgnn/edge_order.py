r"""Per-edge rows moved between a layout's input edge order and its CSR order
(:meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order`) as scatters.

On CUDA a row gather by a permutation of 6.07M edges takes 3.65 ms whatever the row
width (4 to 128 floats): ``index_select``, advanced indexing, ``gather`` and
``embedding`` all run one gather kernel whose time follows the number of rows. The
same move written as a scatter through the inverse permutation (``index_copy_``)
takes 0.12 to 0.38 ms for 4 floats per row, 0.39 to 0.44 ms for 16 and 2.5 ms for
128 (PATTERN's permutation, a random one; ``docs/scores.md``, "Per-edge inputs"). A
permutation has no repeated index, so the scatter is deterministic, and its gradient
is the scatter the other way. On the CPU the gather is the faster for rows up to 16
floats.
"""
from __future__ import annotations

import torch
from torch import Tensor


class _PermuteRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, perm: Tensor, pos: Tensor) -> Tensor:
        ctx.save_for_backward(perm)
        return torch.empty_like(values, memory_format=torch.contiguous_format).index_copy_(
            0, pos, values)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (perm,) = ctx.saved_tensors
        return (torch.empty_like(grad, memory_format=torch.contiguous_format).index_copy_(
            0, perm, grad), None, None)


def permute_rows(values: Tensor, perm: Tensor, pos: Tensor) -> Tensor:
    r"""``values[perm]`` for a permutation ``perm`` of the ``E`` rows of ``values``
    (row ``p`` of the result is row ``perm[p]``), computed as the scatter
    ``out[pos[j]] = values[j]`` through its inverse ``pos`` (:func:`inverse`);
    differentiable in ``values``.

    Args:
        values (Tensor): ``[E, ...]``.
        perm (Tensor): ``[E]`` int64, a permutation of ``0 .. E - 1``.
        pos (Tensor): ``[E]`` int64, ``inverse(perm)``.
    """
    return _PermuteRows.apply(values, perm, pos)


def inverse(perm: Tensor) -> Tensor:
    r"""The inverse ``pos`` of a permutation ``perm`` (``pos[perm[p]] = p``),
    same dtype and device."""
    return torch.empty_like(perm).index_copy_(
        0, perm, torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype))
