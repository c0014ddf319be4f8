r"""Node orders for scheduling the node-parallel kernels' work items.

The kernels gather the k and v rows (q and dO rows in the CSC walk) of each work
item's neighbours, mostly from L2. Lane groups that run at the same time share L2,
so running rows whose neighbour sets overlap together reuses the rows they gather.
An order here is a rank per node of one side of the graph (the rows of the CSR
walk, by destination, or of the CSC walk, by source); the work items are then
scheduled by the rank of their row (:func:`pyg_dfgnn.work_items.order_items`).
Only the order in which items run changes: no feature row moves, outputs stay in
the user's node order, and since each split row's partials merge in slot order
the results are bitwise the same for every order.

Orders (:data:`ITEM_ORDERS`):

* ``"row"``: the node ids (the items as the layout build makes them);
* ``"rcm"``: reverse Cuthill-McKee (:func:`scipy.sparse.csgraph.reverse_cuthill_mckee`)
  of the symmetrised graph: nodes joined by an edge get nearby ranks, so rows
  ranked close together draw their neighbours from a narrow band of nodes;
* ``"degree"``: the walked side's degree, largest first (ties by id).

This module sits below :mod:`pyg_dfgnn.layout`, which computes the ranks once per
layout and keeps them in its :class:`~pyg_dfgnn.derived.Derived`; which order a
call uses is the kernel plan's decision (:mod:`pyg_dfgnn.ops.plan`).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
from torch import Tensor

#: Work-item orders of the kernel plan (``plan.override(item_order=...)``).
ITEM_ORDERS = ("row", "rcm", "degree")


def _inverse(perm: np.ndarray) -> np.ndarray:
    """The inverse permutation: ``out[perm[i]] = i``."""
    out = np.empty(perm.size, dtype=np.int64)
    out[perm] = np.arange(perm.size, dtype=np.int64)
    return out


def _dense_rank(key: np.ndarray) -> np.ndarray:
    """``rank[i]`` = position of ``key[i]`` among the sorted keys (a permutation of
    ``0 .. n - 1``; the keys are distinct)."""
    return _inverse(np.argsort(key, kind="stable"))


def rcm_rank(rowptr: Tensor, col: Tensor, num_src: int, num_dst: int) -> Tuple[Tensor, Tensor]:
    r"""Reverse Cuthill-McKee ranks of a graph's destination and source nodes.

    A square graph (``num_src == num_dst``) is ordered as the symmetrised
    ``A + A^T`` of its ``N`` nodes, so a node has one rank as a destination and as
    a source; a bipartite graph as the bipartite graph of its ``N_dst + N_src``
    nodes (destinations joined to their sources), each side's ranks its nodes'
    order in it. Computed on the host with SciPy (one copy of the CSR there).

    Args:
        rowptr (Tensor): ``[N_dst + 1]`` CSR row pointer (by destination).
        col (Tensor): ``[E]`` source of each CSR edge.
        num_src, num_dst (int): node counts.

    Returns:
        ``(row_rank, col_rank)``: int64 ``[N_dst]`` and ``[N_src]`` on ``col``'s
        device, each a permutation of ``0 .. N - 1`` of its side.

    Raises:
        ImportError: SciPy is not installed (only this order needs it).
    """
    try:
        import scipy.sparse as sp
        from scipy.sparse.csgraph import reverse_cuthill_mckee
    except ImportError as e:
        raise ImportError("pyg_dfgnn: the 'rcm' work-item order needs SciPy "
                          "(pip install scipy)") from e

    dev = col.device
    ptr = rowptr.cpu().numpy().astype(np.int64)
    idx = col.cpu().numpy().astype(np.int64)
    # float32 weights: sums of duplicate edges never cancel to an explicit zero.
    ones = np.ones(idx.size, dtype=np.float32)
    a = sp.csr_matrix((ones, idx, ptr), shape=(num_dst, num_src))
    if num_src == num_dst:
        sym, split = (a + a.T).tocsr(), None
    else:
        sym, split = sp.bmat([[None, a], [a.T, None]], format="csr"), num_dst
    n = sym.shape[0]
    if n == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return empty, empty
    # int32 indices: the SciPy routine takes no other index type.
    sym = sp.csr_matrix((sym.data, sym.indices.astype(np.int32), sym.indptr.astype(np.int32)),
                        shape=sym.shape)
    pos = _inverse(reverse_cuthill_mckee(sym, symmetric_mode=True))  # perm[new] = old
    if split is None:
        rank = torch.from_numpy(pos).to(dev)
        return rank, rank
    return (torch.from_numpy(_dense_rank(pos[:split])).to(dev),
            torch.from_numpy(_dense_rank(pos[split:])).to(dev))


def degree_rank(ptr: Tensor) -> Tensor:
    r"""Ranks of a pointer's rows by degree, largest first, ties by row id:
    int64 ``[N]`` on ``ptr``'s device (computed there, no host synchronisation)."""
    deg = ptr[1:] - ptr[:-1]
    order = torch.sort(deg, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return rank
