r"""Tile plan of a graph for the dense-tile fp16 / bf16 GT forward
(``cuda/scores/dot_forward_dense.cu``; ``docs/design.md``, "Tensor cores and dense tiles").

The kernel runs blocks of :data:`TILE_ROWS` consecutive destination rows. On batch
graphs (PATTERN-, CLUSTER-, MNIST-like) a block's in-neighbours lie in a narrow
window of consecutive source rows, so the block computes the whole window as one
dense tile, masked by the edges. The plan says, per block, where its window is
and which (row, key) pairs are edges; it depends on the graph only, so it is built
once per :class:`~pyg_dfgnn.layout.GraphLayout` (a few tensor ops and one host
synchronisation) and cached there (``layout.derived.tile_plan``). Whether a call
runs it is the kernel plan's decision (:mod:`pyg_dfgnn.ops.plan`). Building the
window and the edge counts inside the kernel on every call cost a chain of
dependent loads and three block barriers before the block's first tile.

Format: one ``int32`` tensor. For block ``b`` (rows ``64 b .. 64 b + 63``), ints
``8 b .. 8 b + 7`` are

- ``lo``: first key (source row) of the window, ``-1`` if the block has no edge,
  a window wider than :data:`MAX_WIDTH` keys or a duplicate edge (it then runs
  the sparse kernel's units);
- ``width``: keys in the window (``max col - lo + 1``);
- ``edges``: the block's edges;
- ``offset``: index (in ints, into this tensor) of the block's masks;
- two words of chunk bits: bit ``c`` of half-word ``w`` (warp ``w``, rows
  ``16 w .. 16 w + 15``) is set when one of those rows has an edge in keys
  ``lo + 32 c .. lo + 32 c + 31``; words ``w = 0 | 1 << 16`` and ``2 | 3 << 16``;
- two ints of padding (16-byte aligned entries).

Then the masks of each block with a window, ``ceil(width / 32)`` chunks of
:data:`TILE_ROWS` words: bit ``j`` of word ``offset + 64 c + r`` is set when row
``64 b + r`` has an in-edge from source row ``lo + 32 c + j``.

The dense-tile backward (``cuda/scores/dot_backward_dense.cu``) reads this plan
in its dq launch and the same format built over the transposed graph (the CSC:
blocks of 64 source rows, windows of destination rows) in its dkv launch
(:func:`layout_tiles_t`). Where a block of the transposed plan with edges has no
window, its dkv units read per-edge weights that the dq launch saves, at each
edge's CSR position: a map from each edge's rank in its row (by source: the rank
of its mask bit) to that position (:func:`rank_positions`). Where every such
block has a window (:func:`every_block_windowed`), nothing is saved.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..derived import BackwardTiles, TilePlan
from .reference import csr_dst

#: Destination rows per block of the dense-tile kernel (``kDenseRows``).
TILE_ROWS = 64
#: Keys per chunk, one mask word per row (``kDenseKeys``).
CHUNK_KEYS = 32
#: Widest window a block runs dense (``kDenseMaxWidth``); 16 chunk bits per warp.
MAX_WIDTH = 512
#: Ints per block before the masks (``kTileMetaInts``).
META_INTS = 8
_INT32_MAX = 2**31 - 1


def _to_int32_bits(x: Tensor) -> Tensor:
    """int64 values in ``[0, 2^32)`` as int32 with the same 32 bits."""
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def _popcount32(x: Tensor) -> Tensor:
    """Set bits of the 32 bits of each int32 (SWAR bit count, in int64)."""
    x = x.long() & 0xFFFFFFFF
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 0xFF


def build_tile_plan(rowptr: Tensor, col: Tensor, row: Tensor, num_dst: int,
                    num_src: int, min_fraction: float = 0.0) -> Optional[Tensor]:
    r"""The tile plan (module docstring) of a CSR graph.

    Per-edge work is in int32 (a few tensors of ``E`` entries at a time; the
    edges of blocks that cannot run dense go to a spare word, not through a
    boolean selection): the build's peak extra memory is 26 (PATTERN), 39
    (MNIST) and 48 (COCO-SP) bytes per edge, against 91-109 with int64.

    Args:
        rowptr (Tensor): ``[N_dst + 1]`` CSR row pointers.
        col (Tensor): ``[E]`` source row of each CSR edge.
        row (Tensor): ``[E]`` destination row of each CSR edge.
        num_dst (int): destination rows ``N_dst``.
        num_src (int): source rows ``N_src``.
        min_fraction (float): stop after the window widths, returning ``None``,
            where fewer than this fraction of the blocks have a window of at most
            :data:`MAX_WIDTH` keys: the kernel plan's rule would not run such a
            plan, and a mini-batch builds a new graph every step, whose windows
            (sampled neighbours, ids across the batch) are wide.

    Returns:
        ``int32`` tensor on ``col``'s device, or ``None`` when no block can run
        dense (no edges, every window too wide), fewer than ``min_fraction`` of
        them could, or the plan or the graph would not fit int32.
    """
    E = col.numel()
    if E == 0 or num_dst == 0 or max(num_src, num_dst, E) > _INT32_MAX:
        return None
    dev = col.device
    n_blocks = (num_dst + TILE_ROWS - 1) // TILE_ROWS
    bounds = rowptr.long()[torch.arange(n_blocks + 1, device=dev).mul_(TILE_ROWS)
                           .clamp_(max=num_dst)]
    # A block's edges are contiguous in the CSR: segment reductions, exact in
    # float64, where an atomic scatter_reduce contends on one word per block.
    colf = col.double()
    lo = torch.segment_reduce(colf, "min", offsets=bounds, initial=float(num_src), unsafe=True)
    hi = torch.segment_reduce(colf, "max", offsets=bounds, initial=-1.0, unsafe=True)
    del colf
    lo, hi = lo.to(torch.int32), hi.long()
    col = col.int()
    row = row.int()
    edges = bounds[1:] - bounds[:-1]
    width = (hi - lo.long() + 1).clamp_(min=0)
    ok = (edges > 0) & (width <= MAX_WIDTH)
    n_words = torch.where(ok, (width + CHUNK_KEYS - 1) // CHUNK_KEYS, 0) * TILE_ROWS
    offset = META_INTS * n_blocks + torch.cumsum(n_words, 0) - n_words
    words, n_ok = torch.stack([n_words.sum(), ok.sum()]).tolist()  # the one host synchronisation
    total = META_INTS * n_blocks + words
    if total >= _INT32_MAX or n_ok == 0 or n_ok < min_fraction * n_blocks:
        return None

    # Word of each edge (row, key - lo) in its block's masks; `total`: the spare
    # word that takes the edges of blocks without a window.
    blk = row // TILE_ROWS
    e_ok = ok[blk]
    key = col - lo[blk]
    word = torch.where(e_ok, offset.int()[blk] + (key >> 5) * TILE_ROWS + (row & (TILE_ROWS - 1)),
                       total)
    bit = torch.ones_like(key).bitwise_left_shift_(key & (CHUNK_KEYS - 1))
    masks = torch.zeros(total + 1, dtype=torch.int32, device=dev).index_add_(0, word, bit)
    del bit
    # A duplicate (row, key) pair carries into another bit (or out of the word):
    # its word then has fewer set bits than edges. Such blocks run sparse.
    count = torch.zeros(total + 1, dtype=torch.int32, device=dev).index_add_(
        0, word, torch.ones_like(word))
    dup_word = _popcount32(masks) != count
    dup_word[total] = False
    del count
    dup = torch.zeros(n_blocks, dtype=torch.int32, device=dev).index_add_(
        0, blk, dup_word[word].int())
    ok &= dup == 0

    # Chunk bits per (block, warp); the spare slot again for edges without a window.
    n_cb = MAX_WIDTH // CHUNK_KEYS
    slot = torch.where(e_ok, (blk * 4 + (row & (TILE_ROWS - 1)) // 16) * n_cb + (key >> 5),
                       n_blocks * 4 * n_cb)
    seen = torch.zeros(n_blocks * 4 * n_cb + 1, dtype=torch.long, device=dev)
    seen[slot] = 1
    bits = (seen[:-1].view(n_blocks, 4, n_cb) << torch.arange(n_cb, device=dev)).sum(-1)
    meta = torch.stack([torch.where(ok, lo.long(), -1), width, edges, offset,
                        _to_int32_bits(bits[:, 0] | bits[:, 1] << 16).long(),
                        _to_int32_bits(bits[:, 2] | bits[:, 3] << 16).long(),
                        torch.zeros_like(width), torch.zeros_like(width)], 1).to(torch.int32)
    masks = masks[:total]
    masks[:META_INTS * n_blocks] = meta.view(-1)
    return masks


def block_meta(plan: Tensor, num_rows: int) -> Tensor:
    """``[blocks, META_INTS]``: the per-block ints of a plan over ``num_rows``
    rows (``lo``, ``width``, ``edges``, ``offset``, chunk bits; a view)."""
    return plan[:META_INTS * ((num_rows + TILE_ROWS - 1) // TILE_ROWS)].view(-1, META_INTS)


def plan_cells_per_edge(plan: Tensor, num_dst: int) -> Tuple[float, float]:
    """``(fraction of dense-eligible blocks, median window cells per edge over
    them)`` of a plan (the kernel plan's dense-tile rule reads them); ``(0, inf)``
    without any."""
    meta = block_meta(plan, num_dst)
    ok = meta[:, 0] >= 0
    cells = (TILE_ROWS * meta[:, 1].double() / meta[:, 2].double().clamp(min=1))[ok]
    if cells.numel() == 0:
        return 0.0, math.inf
    frac, med = torch.stack([ok.double().mean(), cells.median()]).tolist()
    return frac, med


def layout_tiles(layout, min_fraction: float = 0.0) -> Optional[TilePlan]:
    """The layout's :class:`~pyg_dfgnn.derived.TilePlan`, built on first use and
    kept in ``layout.derived`` (``min_fraction``: see :func:`build_tile_plan`; a
    plan given up under a higher bound is built again for a lower one). ``None``
    on CPU layouts, and inside a ``torch.compile`` region while the plan is not
    built yet (its size depends on the data; the caller then runs the sparse
    units and must not keep that decision)."""
    if not layout.col.is_cuda:
        return None
    entry = layout.derived.tile_plan
    if entry is None or (entry.tiles is None and entry.min_fraction > min_fraction):
        n_blocks = (layout.num_dst + TILE_ROWS - 1) // TILE_ROWS
        if (layout.dst_extent + TILE_ROWS - 1) // TILE_ROWS < min_fraction * n_blocks:
            # Blocks past dst_extent have no edge, so cannot run dense: given up
            # without device work (a NeighborLoader batch's last hop).
            entry = layout.derived.tile_plan = TilePlan(None, 0.0, math.inf, min_fraction)
            return entry
        if torch.compiler.is_compiling():
            return None
        plan = build_tile_plan(layout.rowptr, layout.col, layout.csr_row, layout.num_dst,
                               layout.num_src, min_fraction)
        frac, med = (0.0, math.inf) if plan is None else plan_cells_per_edge(plan,
                                                                             layout.num_dst)
        entry = layout.derived.tile_plan = TilePlan(plan, frac, med, min_fraction)
    return entry


def tile_plan(layout) -> Optional[Tensor]:
    """The layout's tile plan tensor (:func:`build_tile_plan`), built on first use
    and cached; ``None`` on CPU layouts or where no block can run dense."""
    entry = layout_tiles(layout)
    return None if entry is None else entry.tiles


def rank_positions(col: Tensor, csr_row: Tensor, num_src: int) -> Optional[Tensor]:
    r"""``[E]`` int32: the CSR position of the edge of rank ``p``, where each row's
    edges are ranked by source from the row's first position (``rowptr[r] +
    rank``); ``None`` where every row is sorted by source already (the identity).

    The dense-tile backward's dq launch knows an edge by its mask bit, whose rank
    among the row's bits is the edge's rank by source; it writes the edge's
    weights at this position. The layout keeps each row's edges in their input
    order (a stable sort by destination), so the rows need not be sorted. One
    host synchronisation (the sortedness test), and a sort of ``E`` int64 keys
    where a row is not sorted.
    """
    E = col.numel()
    if E < 2:
        return None
    key = csr_row.long() * max(num_src, 1) + col.long()
    if not bool((key[1:] < key[:-1]).any()):
        return None
    return torch.sort(key, stable=True).indices.to(torch.int32)


def every_block_windowed(plan: Tensor, num_rows: int) -> bool:
    """Whether every block of ``plan`` (over ``num_rows`` rows) that has edges has
    a window, that is, none has a window over :data:`MAX_WIDTH` keys or a
    duplicate edge. One host synchronisation."""
    meta = block_meta(plan, num_rows)
    return not bool(((meta[:, 2] > 0) & (meta[:, 0] < 0)).any())


def transposed_tile_plan(layout) -> Optional[Tensor]:
    r""":func:`build_tile_plan` over ``layout``'s CSC (the transposed graph: blocks
    of :data:`TILE_ROWS` source rows, windows of destination rows), any device."""
    # The source of each CSC edge, from the column pointers: a gather of col
    # through perm would cost a fixed time per edge on CUDA (pyg_dfgnn.edge_order).
    src = csr_dst(layout.colptr, layout.num_edges)
    return build_tile_plan(layout.colptr, layout.row, src, layout.num_src, layout.num_dst)


def layout_tiles_t(layout) -> Optional[BackwardTiles]:
    r"""The layout's :class:`~pyg_dfgnn.derived.BackwardTiles`: the tile plan of
    the transposed graph (:func:`build_tile_plan` over the CSC: blocks of
    :data:`TILE_ROWS` source rows, windows of destination rows) and the rank map
    of :func:`rank_positions` where the plan is not :func:`every_block_windowed`
    (there the backward saves weights; elsewhere :func:`layout_rank_pos` builds
    it where an override asks for them), built on first use and kept in
    ``layout.derived.tile_plan_t``. ``None`` on CPU layouts and inside a
    ``torch.compile`` region while not built yet (as :func:`layout_tiles`)."""
    if not layout.col.is_cuda:
        return None
    entry = layout.derived.tile_plan_t
    if entry is None:
        if torch.compiler.is_compiling():
            return None
        tiles_t = transposed_tile_plan(layout)
        windowed = tiles_t is not None and every_block_windowed(tiles_t, layout.num_src)
        entry = layout.derived.tile_plan_t = BackwardTiles(tiles_t, None, windowed,
                                                           ranked=False)
        if tiles_t is not None and not windowed:
            layout_rank_pos(layout)
            entry = layout.derived.tile_plan_t
    return entry


def layout_rank_pos(layout) -> Optional[Tensor]:
    r"""The rank map (:func:`rank_positions`) of a layout whose transposed tile
    plan is built (:func:`layout_tiles_t`), built on first use and kept with
    that plan; ``None`` where the CSR rows are sorted by source."""
    entry = layout.derived.tile_plan_t
    if not entry.ranked:
        entry = layout.derived.tile_plan_t = entry._replace(
            rank_pos=rank_positions(layout.col, layout.csr_row, layout.num_src), ranked=True)
    return entry.rank_pos
