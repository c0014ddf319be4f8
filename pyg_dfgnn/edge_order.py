r"""Per-edge rows moved between a layout's input edge order and its CSR order
(:meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order`), and compacted where a layer
drops the input's self-loops, as scatters.

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

from typing import Tuple

import torch
from torch import Tensor


class _ScatterRows(torch.autograd.Function):
    r"""``out[index[j]] = values[j]`` into ``rows`` new rows; the gradient row
    ``back[p]`` of ``values`` is the output gradient's row ``p``, the others 0 (none
    where ``back`` has a row for each of ``values``': a permutation)."""

    @staticmethod
    def forward(ctx, values: Tensor, index: Tensor, rows: int, back: Tensor) -> Tensor:
        ctx.save_for_backward(back)
        ctx.num_rows = values.size(0)
        return values.new_empty((rows, *values.shape[1:])).index_copy_(0, index, values)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (back,) = ctx.saved_tensors
        shape = (ctx.num_rows, *grad.shape[1:])
        gx = grad.new_empty(shape) if back.numel() == ctx.num_rows else grad.new_zeros(shape)
        return gx.index_copy_(0, back, grad[:back.numel()]), None, None, None


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
    return _ScatterRows.apply(values, pos, perm.numel(), perm)


def inverse(perm: Tensor) -> Tensor:
    r"""The inverse ``pos`` of a permutation ``perm`` (``pos[perm[p]] = p``),
    same dtype and device."""
    return torch.empty_like(perm).index_copy_(
        0, perm, torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype))


def compact(keep: Tensor, num_kept: int, edge_index: Tensor,
            values: Tensor) -> Tuple[Tensor, Tensor]:
    r"""The columns of ``edge_index`` and the rows of ``values`` where ``keep`` is
    set, in order: ``edge_index[:, keep]`` and ``values[keep]`` (differentiable in
    ``values``) without the host synchronisation of a boolean selection, written
    as scatters (each kept row to its rank among the kept; the others to a spare
    row that is dropped), the gradient as the scatter back.

    Args:
        keep (Tensor): ``[E]`` bool.
        num_kept (int): the number of set entries of ``keep``, known to the caller.
        edge_index (Tensor): ``[2, E]``.
        values (Tensor): ``[E, ...]``.
    """
    dest = torch.where(keep, keep.cumsum(0) - 1, num_kept)
    ei = edge_index.new_empty((2, num_kept + 1)).index_copy_(1, dest, edge_index)[:, :num_kept]
    kept = torch.nonzero_static(keep, size=num_kept).view(-1)  # the gradient's rows
    return ei, _ScatterRows.apply(values, dest, num_kept + 1, kept)[:num_kept]
