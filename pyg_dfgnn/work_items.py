r"""Work items of the node-parallel kernels: how a CSR (or CSC) pointer's rows are
split into items of at most ``chunk`` edges.

The node-parallel kernels (SMMF forward, PMF softmax + SpMM, both backward walks)
run one lane group per work item. Long rows are split over several items, so a
super node is spread over many lane groups; the items of a split row write
partial results to slots that the kernel merges in a fixed order (deterministic).

This module sits below :mod:`pyg_dfgnn.layout`: the layout build computes the
items with its single host synchronisation (:func:`work_stats`, :func:`work_items`).
Which chunk and item order a call uses is the kernel plan's decision
(:mod:`pyg_dfgnn.ops.plan`); :func:`chunk_for` is its default chunk, here because
the layout build needs it. :func:`order_items` schedules the items in a node order
(:mod:`pyg_dfgnn.node_order`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

#: Edges per work item on graphs of at least :data:`SMALL_GRAPH_EDGES` edges.
DEFAULT_CHUNK = 128
#: Graphs with fewer edges than this use :data:`SMALL_GRAPH_CHUNK`.
SMALL_GRAPH_EDGES = 1 << 18
#: Edges per work item on small graphs (Cora, CiteSeer, PubMed).
SMALL_GRAPH_CHUNK = 32


class Work(NamedTuple):
    r"""Work items over one pointer (the kernels' ``Work``, ``cuda/host/params.h``).

    Attributes:
        items (Tensor): int32 ``[I, 3]``: (row, first edge, partial slot or -1).
        combine (Tensor): int32 ``[R, 3]``: (row, first slot, number of slots) of
            the ``R`` rows split over several items.
        num_slots (int): partial slots of the split rows.
    """
    items: Tensor
    combine: Tensor
    num_slots: int


def chunk_for(num_edges: int) -> int:
    r"""Default edges per work item for a graph of ``num_edges`` edges.

    A lane group walks its item a few edges per memory round trip, so a long item
    is a long latency chain; each extra item of a split row costs an fp32 partial
    row and a merge. Swept on the H100:

    * below :data:`SMALL_GRAPH_EDGES` edges the GPU is far from full and a kernel
      takes as long as its longest item's chain, so short items win: GT forward
      on Cora 0.033 ms at 128 against 0.019 ms at 32, PubMed 0.060 against 0.049;
    * on larger graphs throughput decides and 128 was best or within 10 % of the
      best everywhere (GitHub forward 0.162 ms at 128, 0.233 ms at 32; longer
      items lost on Reddit-like).
    """
    return SMALL_GRAPH_CHUNK if num_edges < SMALL_GRAPH_EDGES else DEFAULT_CHUNK


def work_stats(deg: Tensor, chunk: int) -> Tensor:
    r"""Per-row extra work items: ``max(1, ceil(deg / chunk)) - 1``, computed on the
    device. Their sum and the number of rows with a positive count size the work
    items (:func:`work_items`), so a caller can fetch both with its other scalars
    in one host synchronisation."""
    return (deg - 1).clamp_(min=0).div_(chunk, rounding_mode="floor")


def item_edges(ptr: Tensor, row: Tensor, start: Tensor, chunk: int) -> Tensor:
    r"""Edges of each work item (row ``row``, first edge ``start``): the rest of
    its row, at most ``chunk``; the key of the longest-first order."""
    return (ptr[1:][row] - start).clamp_(max=chunk)


def work_items(ptr: Tensor, extra: Tensor, num_items: int, num_split: int, chunk: int,
               long_first: bool = True) -> Work:
    r""":func:`split_work` from on-device statistics, without a host
    synchronisation: ``extra`` is :func:`work_stats` of the pointer's degrees,
    ``num_items`` = ``N + extra.sum()`` and ``num_split`` =
    ``(extra > 0).sum()``, both already on the host."""
    N = extra.numel()
    dev = extra.device
    if num_items == N:  # every row fits one item: one item per row, in row order
        row = torch.arange(N, dtype=torch.int32, device=dev)
        items = torch.stack([row, ptr[:-1].to(torch.int32), row.new_full((N,), -1)], 1)
        return Work(items, row.new_empty((0, 3)), 0)
    # int32 throughout (I, E < 2^31 here): the items come out int32 without a cast.
    i32 = torch.int32
    n_items = extra.to(i32) + 1
    row = torch.repeat_interleave(n_items, output_size=num_items)
    first = n_items.cumsum(0, dtype=i32) - n_items
    local = torch.arange(num_items, dtype=i32, device=dev) - first[row]
    start = ptr[:-1][row] + local * chunk
    # Split rows' items take consecutive partial slots, in item (= row) order.
    split = extra > 0
    split_item = split[row]
    slot = split_item.cumsum(0, dtype=i32) * split_item - 1
    items = torch.stack([row, start, slot], 1).to(i32)
    if long_first:
        # Longest first (stable): a kernel ends with its last-started long items
        # otherwise, and a split row's last item merges the row. Only where rows
        # are split (power-law graphs): where every row fits one item (the batch
        # graphs) row order keeps neighbouring rows, which share neighbours,
        # together in L2, and sorting made them 1.2-1.8x slower.
        n_edges = item_edges(ptr, row, start, chunk)
        items = items[torch.sort(n_edges, descending=True, stable=True).indices]
    split_rows = torch.nonzero_static(split, size=num_split).flatten()
    combine = torch.stack([split_rows.to(i32), slot[first[split_rows]], n_items[split_rows]], 1)
    return Work(items.contiguous(), combine.to(torch.int32), num_items - N + num_split)


def split_work(ptr: Tensor, chunk: int, long_first: bool = True) -> Work:
    r"""Node-parallel work items over a CSR (or CSC) pointer.

    Every row gets ``max(1, ceil(deg / chunk))`` items of at most ``chunk``
    consecutive edges; rows split over several items write partial results to
    slots, which the kernel itself merges up a tree of slots in a fixed order
    (``merge_split_row`` in ``cuda/device/split_merge.cuh``), or a combine kernel
    (``combine``) where it cannot: deterministic either way. One host
    synchronisation (the sizes); :class:`~pyg_dfgnn.layout.GraphLayout` builds
    its items with :func:`work_items` instead, sharing its build's single
    synchronisation.

    Args:
        ptr (Tensor): ``[N + 1]`` row pointer.
        chunk (int): edges per item.
        long_first (bool): on a pointer with split rows, order the items by their
            number of edges, longest first (stable), instead of by row.

    Returns:
        :class:`Work`: ``items`` int32 ``[I, 3]``, ``combine`` int32 ``[R, 3]``
        and the total number of slots.
    """
    extra = work_stats(ptr[1:] - ptr[:-1], chunk)
    total, num_split = torch.stack([extra.long().sum(), (extra > 0).sum()]).tolist()
    return work_items(ptr, extra, extra.numel() + total, num_split, chunk, long_first)


def order_items(work: Work, ptr: Tensor, rank: Tensor, chunk: int, long_first: bool = True) -> Work:
    r"""``work`` with its items scheduled by the rank of their row
    (:mod:`pyg_dfgnn.node_order`): a permutation of the item rows, on the device.

    Items run in increasing ``rank[row]``, a row's items in edge order; with
    ``long_first`` on a pointer with split rows, longest first as in
    :func:`work_items`, then by rank. Each item keeps its row, first edge and
    slot, and ``combine`` is unchanged, so a split row's partials still merge in
    slot order: the kernels' results do not depend on the order. The result
    depends only on the items, not on their order in ``work`` (the GPU layout
    build and :func:`work_items` give the same).

    Args:
        work (Work): items over ``ptr`` at ``chunk`` edges per item.
        ptr (Tensor): ``[N + 1]`` row pointer of the items.
        rank (Tensor): ``[N]`` integer rank of each row.
        chunk (int): edges per item.
        long_first (bool): as in :func:`work_items`.
    """
    items = work.items
    row = items[:, 0].long()
    start = items[:, 1]
    # Stable sorts from the least significant key: (length, rank, first edge).
    perm = torch.sort(start, stable=True).indices
    perm = perm[torch.sort(rank[row[perm]], stable=True).indices]
    if long_first and work.num_slots > 0:
        n_edges = item_edges(ptr, row[perm], start[perm], chunk)
        perm = perm[torch.sort(n_edges, descending=True, stable=True).indices]
    return Work(items[perm].contiguous(), work.combine, work.num_slots)
