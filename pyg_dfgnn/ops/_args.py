r"""Argument tuples of the ``torch.ops.dfgnn`` forward ops for a layout and its
kernel plan (:mod:`pyg_dfgnn.ops.plan`).

A small graph's call is host-bound, so what one call needs of the layout (the
plan, the CSR and CSC with their work items, the tile plan) is looked up by one
key in ``layout.derived.calls``, prepared on the first call. The ops take the
layout as three arguments, ``csr``, ``csc`` and ``sizes`` (one ``LayoutView`` in
C++), and the plan's decisions as ``plan`` (and ``gt_fwd``'s ``dense_cells``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import plan as _plan
from .tiles import tile_plan


class Prepared(NamedTuple):
    """What the forward ops take of a layout for one kind of call: the layout and
    plan arguments of their schemas (``cuda/glue/bindings.cpp``).

    Attributes:
        plan (Plan): the kernel plan.
        csr (tuple): ``rowptr, col``, the CSR work items (``items, combine``),
            ``csr_row`` (PMF, else ``None``) and the tile plan (where
            ``plan.dense_cells > 0``, else ``None``): the ops' ``csr``.
        csc (tuple, optional): ``colptr, row, perm`` and the CSC work items
            (``items, combine``); ``None`` without ``need_grad``: the ops' ``csc``.
        sizes (tuple): ``row_slots, col_slots`` (0 without ``need_grad``),
            ``chunk``: the ops' ``sizes``.
        flags (tuple): ``pmf, two_rows, mma, bwd_one_launch, mma_backward`` as
            ints: the ops' ``plan``.
    """
    plan: _plan.Plan
    csr: tuple
    csc: Optional[tuple]
    sizes: tuple
    flags: tuple


def prepared(layout, dtype: torch.dtype, head_size: int, score: str, strategy: str,
             dropout: bool, need_attn: bool, need_grad: bool, tiles: bool = True,
             overrides: Optional[tuple] = None) -> Prepared:
    """The :class:`Prepared` arguments of a call (:func:`~pyg_dfgnn.ops.plan.plan_for`'s
    arguments, and ``need_grad``: the call records a backward, which walks the CSC).
    ``overrides``: the plan overrides to decide with, by default those in effect
    (a backward passes its forward's).

    Raises:
        ValueError: as :func:`~pyg_dfgnn.ops.plan.plan_for`.
    """
    calls = layout.derived.calls
    key = (dtype, head_size, score, strategy, dropout, need_attn, tiles,
           _plan._current() if overrides is None else overrides, need_grad)
    hit = calls.get(key)
    if hit is None:
        plan, kept = _plan.kept_plan(layout, key[:-1])
        hit = _prepare(layout, plan, need_grad)
        if kept:
            calls[key] = hit
    return hit


def _prepare(layout, plan: _plan.Plan, need_grad: bool) -> Prepared:
    chunk, first, order = plan.chunk, plan.long_items_first, plan.item_order
    rw = layout.work("row", chunk, first, order)
    tp = tile_plan(layout) if plan.dense_cells > 0 else None
    csr = (layout.rowptr, layout.col, rw.items, rw.combine,
           layout.csr_row if plan.pmf else None, tp)
    csc, col_slots = None, 0
    if need_grad:
        cw = layout.work("col", chunk, first, order)
        csc, col_slots = (layout.colptr, layout.row, layout.perm, cw.items, cw.combine), \
            cw.num_slots
    flags = (int(plan.pmf), int(plan.two_rows), int(plan.mma), int(plan.bwd_one_launch),
             int(plan.mma_backward))
    return Prepared(plan, csr, csc, (rw.num_slots, col_slots, chunk), flags)


def gt_op_args(layout, q: Tensor, k: Tensor, v: Tensor, scale: float, dropout: float = 0.0,
               seed: int = 0, pmf: bool = False, need_attn: bool = False,
               need_grad: bool = True, score: str = "dot",
               strategy: Optional[str] = None) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.gt_fwd`` for a layout, with the
    plan of the call: ``strategy`` as in :func:`~pyg_dfgnn.ops.gt_attention`, by
    default the method ``pmf`` says.

    Raises:
        ValueError: as :func:`~pyg_dfgnn.ops.plan.plan_for`.
    """
    strategy = strategy or ("pmf" if pmf else "smmf")
    p = prepared(layout, q.dtype, q.size(-1), score, strategy, dropout > 0, need_attn, need_grad)
    return gt_args(p, q, k, v, scale, dropout, seed, need_attn)


def gt_args(p: Prepared, q: Tensor, k: Tensor, v: Tensor, scale: float, dropout: float,
            seed: int, need_attn: bool) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.gt_fwd`` from a :class:`Prepared`."""
    return (q, k, v, p.csr, p.csc, p.sizes, float(scale), float(dropout), int(seed),
            bool(need_attn), p.flags, float(p.plan.dense_cells))


def gat_op_args(layout, a_dst: Tensor, a_src: Tensor, x: Tensor, negative_slope: float,
                dropout: float = 0.0, seed: int = 0, pmf: bool = False, need_attn: bool = False,
                need_grad: bool = True, strategy: Optional[str] = None) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.gat_fwd`` for a layout (``strategy``
    as in :func:`gt_op_args`)."""
    strategy = strategy or ("pmf" if pmf else "smmf")
    p = prepared(layout, x.dtype, x.size(-1), "additive", strategy, dropout > 0, need_attn,
                 need_grad)
    return gat_args(p, a_dst, a_src, x, negative_slope, dropout, seed, need_attn)


def gat_args(p: Prepared, a_dst: Tensor, a_src: Tensor, x: Tensor, negative_slope: float,
             dropout: float, seed: int, need_attn: bool) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.gat_fwd`` from a :class:`Prepared`."""
    return (a_dst, a_src, x, p.csr, p.csc, p.sizes, float(negative_slope), float(dropout),
            int(seed), bool(need_attn), p.flags)


def agnn_prepared(layout, dtype: torch.dtype, head_size: int, strategy: str, need_attn: bool,
                  need_grad: bool) -> Prepared:
    """:func:`prepared` for AGNN's one-call op (``agnn_fwd`` takes no tile plan)."""
    return prepared(layout, dtype, head_size, "cosine", strategy, False, need_attn, need_grad,
                    tiles=False)


def agnn_args(p: Prepared, x: Tensor, beta: Tensor, eps: float, need_attn: bool) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.agnn_fwd`` from an SMMF plan."""
    return (x, beta, float(eps), p.csr, p.csc, p.sizes, bool(need_attn), p.flags)


def agnn_op_args(layout, x: Tensor, beta: Tensor, eps: float, need_attn: bool = False,
                 need_grad: bool = True) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.agnn_fwd`` (SMMF) for a layout."""
    return agnn_args(agnn_prepared(layout, x.dtype, x.size(-1), "smmf", need_attn, need_grad), x,
                     beta, eps, need_attn)


def cos_op_args(layout, x: Tensor, beta: Tensor, eps: float, need_attn: bool = False) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.cos_fwd`` (fp32 AGNN attention)."""
    p = agnn_prepared(layout, x.dtype, x.size(-1), "smmf", need_attn, False)
    return (x, beta, float(eps), p.csr, p.sizes, bool(need_attn), p.flags)
