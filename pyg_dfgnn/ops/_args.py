r"""Argument tuples of the ``torch.ops.dfgnn`` forward ops for a layout and its
kernel plan (:mod:`pyg_dfgnn.ops.plan`).

A small graph's call is host-bound, so what one call needs of the layout (the
plan, the CSR and CSC with their work items, the tile plan) is looked up by one
key in ``layout.derived.calls``, prepared on the first call.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import plan as _plan
from .tiles import tile_plan


class Prepared(NamedTuple):
    """What the forward ops take of a layout for one kind of call.

    Attributes:
        plan (Plan): the kernel plan.
        graph (tuple): ``rowptr, col``, the CSR work items (3), ``csr_row``
            (PMF, else ``None``), ``colptr, row, perm`` and the CSC work items
            (3; ``None`` and 0 without ``need_grad``), ``chunk``: the arguments of
            ``gt_fwd`` / ``gat_fwd`` between the features and the scalars.
        gt_tail (tuple): ``gt_fwd``'s plan arguments after ``need_attn``: the tile
            plan (where ``plan.dense_cells > 0``), ``dense_cells``, ``mma``,
            ``two_rows``, ``bwd_one_launch``.
    """
    plan: _plan.Plan
    graph: tuple
    gt_tail: tuple


def prepared(layout, dtype: torch.dtype, head_size: int, score: str, strategy: str,
             dropout: bool, need_attn: bool, need_grad: bool, tiles: bool = True) -> Prepared:
    """The :class:`Prepared` arguments of a call (:func:`~pyg_dfgnn.ops.plan.plan_for`'s
    arguments, and ``need_grad``: the call records a backward, which walks the CSC).

    Raises:
        ValueError: as :func:`~pyg_dfgnn.ops.plan.plan_for`.
    """
    calls = layout.derived.calls
    key = (dtype, head_size, score, strategy, dropout, need_attn, tiles,
           _plan._current(), need_grad)
    hit = calls.get(key)
    if hit is None:
        plan, kept = _plan.kept_plan(layout, key[:-1])
        tp = tile_plan(layout) if plan.dense_cells > 0 else None
        hit = Prepared(plan, _graph_args(layout, plan, need_grad),
                       (tp, float(plan.dense_cells), plan.mma, plan.two_rows,
                        plan.bwd_one_launch))
        if kept:
            calls[key] = hit
    return hit


def _graph_args(layout, plan: _plan.Plan, need_grad: bool) -> tuple:
    chunk, first = plan.chunk, plan.long_items_first
    rw = layout.work("row", chunk, first)
    if need_grad:
        cw = layout.work("col", chunk, first)
        csc = (layout.colptr, layout.row, layout.perm, *cw)
    else:
        csc = (None, None, None, None, None, 0)
    return (layout.rowptr, layout.col, *rw, layout.csr_row if plan.pmf else None, *csc, chunk)


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
    return (q, k, v, *p.graph, float(scale), float(dropout), int(seed), p.plan.pmf,
            bool(need_attn), *p.gt_tail)


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
    return (a_dst, a_src, x, *p.graph, float(negative_slope), float(dropout), int(seed),
            p.plan.pmf, bool(need_attn), p.plan.two_rows)


def agnn_prepared(layout, dtype: torch.dtype, head_size: int, strategy: str, need_attn: bool,
                  need_grad: bool) -> Prepared:
    """:func:`prepared` for AGNN's one-call op (``agnn_fwd`` takes no tile plan)."""
    return prepared(layout, dtype, head_size, "cosine", strategy, False, need_attn, need_grad,
                    tiles=False)


def agnn_args(p: Prepared, x: Tensor, beta: Tensor, eps: float, need_attn: bool) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.agnn_fwd`` from an SMMF plan."""
    pl = p.plan
    return (x, beta, float(eps), *p.graph[:5], *p.graph[6:], bool(need_attn), pl.mma,
            pl.two_rows, pl.bwd_one_launch)


def agnn_op_args(layout, x: Tensor, beta: Tensor, eps: float, need_attn: bool = False,
                 need_grad: bool = True) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.agnn_fwd`` (SMMF) for a layout."""
    return agnn_args(agnn_prepared(layout, x.dtype, x.size(-1), "smmf", need_attn, need_grad), x,
                     beta, eps, need_attn)


def cos_op_args(layout, x: Tensor, beta: Tensor, eps: float, need_attn: bool = False) -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.cos_fwd`` (fp32 AGNN attention)."""
    p = agnn_prepared(layout, x.dtype, x.size(-1), "smmf", need_attn, False)
    return (x, beta, float(eps), *p.graph[:5], p.plan.chunk, bool(need_attn), p.plan.two_rows)
