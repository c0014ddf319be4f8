r"""The per-graph data a :class:`~pyg_dfgnn.layout.GraphLayout` derives from its
index tensors and keeps for the kernels: work items, the dense-tile plans,
degree statistics, kernel plans and the fused ops' prepared arguments.

Everything derived lives in one :class:`Derived` object (``layout.derived``) with
a typed field per kind, so that moving a layout (:meth:`Derived.to`) knows what
each entry holds, and no module stores ad-hoc keys on the layout.
"""
from __future__ import annotations

from typing import Dict, Hashable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .work_items import Work


class TilePlan(NamedTuple):
    r"""The dense-tile plan of a graph (:mod:`pyg_dfgnn.ops.tiles`) and the
    statistics the kernel plan's rule reads (:mod:`pyg_dfgnn.ops.plan`).

    Attributes:
        tiles (Tensor, optional): the int32 plan the dense-tile kernel reads;
            ``None`` where no block can run dense.
        dense_fraction (float): fraction of blocks that can run dense.
        median_cells (float): median window cells per edge over those blocks
            (``inf`` without any).
        min_fraction (float): the bound the build gave up under (``tiles`` then
            ``None`` and ``dense_fraction`` 0), ``0`` for a complete build.
    """
    tiles: Optional[Tensor]
    dense_fraction: float
    median_cells: float
    min_fraction: float = 0.0


class BackwardTiles(NamedTuple):
    r"""What the dense-tile backward (``cuda/scores/dot_backward_dense.cu``) reads
    beside the graph's tile plan (:func:`pyg_dfgnn.ops.tiles.layout_tiles_t`).

    Attributes:
        tiles_t (Tensor, optional): the tile plan of the transposed graph (blocks
            of 64 source rows, windows of destination rows); ``None`` where no
            block can run dense.
        rank_pos (Tensor, optional): ``[E]`` int32, the CSR position of the edge
            of rank ``p`` (each row's edges ordered by source, ``p`` counted from
            the row's first edge); ``None`` where the CSR rows are sorted by
            source (the identity) or while not ``ranked``.
        windowed (bool): every block of ``tiles_t`` that has edges has a window
            (none needs the sparse units for its structure: a window over 512
            keys or a duplicate edge), so the dkv launch can run them all dense
            and the backward need not save per-edge weights.
        ranked (bool): ``rank_pos`` is built (only where weights are saved:
            :func:`pyg_dfgnn.ops.tiles.layout_rank_pos`).
    """
    tiles_t: Optional[Tensor]
    rank_pos: Optional[Tensor]
    windowed: bool = False
    ranked: bool = True

    def to(self, device) -> "BackwardTiles":
        """A copy with the tensors on ``device``."""
        return self._replace(**{name: getattr(self, name).to(device)
                                for name in ("tiles_t", "rank_pos")
                                if getattr(self, name) is not None})

    def tensors(self):
        """The tensors held."""
        return [t for t in (self.tiles_t, self.rank_pos) if t is not None]


#: Key of :attr:`Derived.work`: ``(kind, chunk, long_first, order)``, ``kind``
#: ``"row"`` (the CSR, by destination) or ``"col"`` (the CSC, by source), ``order``
#: one of :data:`pyg_dfgnn.node_order.ITEM_ORDERS`.
WorkKey = Tuple[str, int, bool, str]
#: Key of :attr:`Derived.node_rank`: ``(order, kind)``.
RankKey = Tuple[str, str]


class Derived:
    r"""Data derived from one layout's index tensors, built on first use.

    Attributes:
        work (dict): :class:`~pyg_dfgnn.work_items.Work` per :data:`WorkKey`.
        node_rank (dict): int64 node ranks of the work-item orders
            (:mod:`pyg_dfgnn.node_order`) per :data:`RankKey`.
        tile_plan (TilePlan, optional): the dense-tile plan once built.
        tile_plan_t (BackwardTiles, optional): the dense-tile backward's
            transposed plan and rank map once built.
        max_out_degree (int, optional): largest out-degree once computed.
        edge_pos (Tensor, optional): ``[E]`` int64, the CSR position of each input
            edge (the inverse of the layout's ``edge_perm``) once computed.
        plans (dict): kernel plans (:class:`pyg_dfgnn.ops.plan.Plan`) by their key.
        calls (dict): the fused ops' prepared layout arguments by their key
            (tuples of this layout's tensors; rebuilt rather than moved).
    """
    __slots__ = ("work", "node_rank", "tile_plan", "tile_plan_t", "max_out_degree", "edge_pos",
                 "plans", "calls")

    def __init__(self):
        self.work: Dict[WorkKey, Work] = {}
        self.node_rank: Dict[RankKey, Tensor] = {}
        self.tile_plan: Optional[TilePlan] = None
        self.tile_plan_t: Optional[BackwardTiles] = None
        self.max_out_degree: Optional[int] = None
        self.edge_pos: Optional[Tensor] = None
        self.plans: Dict[Hashable, object] = {}
        self.calls: Dict[Hashable, tuple] = {}

    def __getstate__(self) -> dict:
        # A copy (pickle, copy, deepcopy) keeps what the graph determines; plans
        # and prepared calls are rebuilt on first use (the calls hold extension
        # objects that do not pickle).
        state = {name: getattr(self, name) for name in self.__slots__}
        state["plans"], state["calls"] = {}, {}
        return state

    def __setstate__(self, state: dict) -> None:
        for name in self.__slots__:
            setattr(self, name, state.get(name, {} if name in ("plans", "calls") else None))

    def to(self, device: torch.device) -> "Derived":
        """A copy with every tensor on ``device``. Kernel plans and prepared call
        arguments are dropped: plans depend on the device (a CPU layout has no
        tile plan) and the arguments hold this layout's tensors."""
        new = Derived()
        new.work = {key: Work(w.items.to(device), w.combine.to(device), w.num_slots)
                    for key, w in self.work.items()}
        new.node_rank = {key: r.to(device) for key, r in self.node_rank.items()}
        if self.tile_plan is not None:
            tp = self.tile_plan
            new.tile_plan = tp._replace(tiles=None if tp.tiles is None else tp.tiles.to(device))
        if self.tile_plan_t is not None:
            new.tile_plan_t = self.tile_plan_t.to(device)
        new.max_out_degree = self.max_out_degree
        new.edge_pos = None if self.edge_pos is None else self.edge_pos.to(device)
        return new

    def tensors(self):
        """Every tensor held (for checks of a moved layout)."""
        for w in self.work.values():
            yield w.items
            yield w.combine
        yield from self.node_rank.values()
        if self.tile_plan is not None and self.tile_plan.tiles is not None:
            yield self.tile_plan.tiles
        if self.tile_plan_t is not None:
            yield from self.tile_plan_t.tensors()
        if self.edge_pos is not None:
            yield self.edge_pos
