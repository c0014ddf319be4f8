r"""The kernel plan: which fused kernels a call runs, decided in one place.

A :class:`Plan` holds the kernel choices of a call: the fusion method (SMMF or
PMF, paper §4.2), the work-item chunk and order, vector or scalar row accesses,
two rows per warp, the tensor-core and dense-tile forward, how split rows are
merged, and the backward's launches, tensor-core walks and dense tiles.
:func:`plan_for` computes it once per (layout, score, dtype, head size, flags)
from everything the CUDA side could look at and keeps it in the layout's
:class:`~pyg_dfgnn.derived.Derived`; the ops pass it to ``torch.ops.dfgnn`` in the
plan object (:mod:`pyg_dfgnn.ops.calls`), and the C++ side runs what it says or
raises where a call cannot run it; that includes the cosine score's choice between
its fp32 SMMF kernel and the normalisation followed by the dot score's kernels
(``normalize_first``, from the score's spec). :func:`Plan.kernels` names what runs
and why (:func:`pyg_dfgnn.explain` shows it for a layer's call).

This module is the only home of the thresholds and support tables below, each
measured on an H100 (``docs/kernels.md`` has the numbers). The default chunk
(:func:`pyg_dfgnn.work_items.chunk_for`) lives below the layout, whose build
needs it.

Tests and benchmarks change the decisions with :func:`override`, a context
manager (per thread and task, through :mod:`contextvars`)::

    from pyg_dfgnn.ops import plan
    with plan.override(bwd_launches=2, dense_tiles="off"):
        out = gt_attention(layout, q, k, v)

The overrides are part of every plan's key, so no plan made under one is used
outside it.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import Iterator, List, Optional, Tuple

import torch

from ..node_order import ITEM_ORDERS
from ..work_items import chunk_for
from . import spec as _spec
from .tiles import layout_tiles, layout_tiles_t

STRATEGIES = ("auto", "smmf", "pmf")
RULES = ("measured", "paper")
#: Largest head row (bytes) the vectorised kernels hold in registers
#: (``dispatch_row_shape`` in ``cuda/host/dispatch.cuh``).
MAX_ROW_BYTES = 128 * 16
#: Largest head size of the scalar (any C) kernels.
MAX_SCALAR_C = 128
#: Head sizes of the tensor-core and dense-tile forward (fp16 / bf16).
MMA_HEAD_SIZES = (32, 64, 128)
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: Feature dtypes of the fused kernels.
KERNEL_DTYPES = (torch.float32, *HALF_DTYPES)
#: Two rows per warp (16-lane groups) in the fp32 SMMF forwards from this many
#: edges, on graphs without split rows: COCO-SP 0.629 -> 0.469 ms, but Cora
#: 0.019 -> 0.024 and GitHub 0.162 -> 0.188 (one chain is the kernel time there).
TWO_ROWS_MIN_EDGES = 1 << 18
#: The additive score's SMMF forward runs on the shared row walk (2-4 edges' rows in
#: flight per step) where the graph's mean in-degree is at most this, or where a row
#: takes at most ROW_WALK_MAX_LANES lanes and no row is split; elsewhere its own
#: walk (a tile of one edge per lane, G edges per step) is faster. Forward ms on an
#: H200, fp32, row walk / own walk: mean in-degree 5.7-8 (COCO-SP-, MNIST-,
#: CIFAR10-like batches, PubMed) 1.03-1.25x faster on the row walk at 1 x 128 and
#: 4 x 32, Cora 8 x 8 9.5 / 11.4 us; PATTERN-like (50) 0.331 / 0.358 at 4 x 32 but
#: 0.330 / 0.261 at 1 x 128; power-law graphs with split rows (GitHub, Reddit-,
#: Protein-, ppa-like) 0.84-0.97x (docs/kernels.md, "The additive forward's two
#: walks"). In fp16 / bf16 its own walk: the row walk gains nothing from half rows
#: (PATTERN-like batch, 4 x 32: bf16 forward 0.362 ms against fp32's 0.332 in one
#: run), and a bf16 step on it was slower than the fp32 one (1.218 / 1.177 ms).
ROW_WALK_MAX_MEAN_DEGREE = 8.0
ROW_WALK_MAX_LANES = 8
#: The GT backward runs its CSR and CSC walks in one launch below this many
#: edges: Cora backward kernels 14.9 us in one launch, 9.6 + 9.6 in two; PubMed
#: (89K edges) 71.4 us in one, 29.2 + 26.1 in two.
ONE_LAUNCH_BWD_MAX_EDGES = 1 << 16
#: The tensor-core backward walks 8 whole CSC columns per warp, so its longest
#: column is one warp's serial chain; where that column holds more than this
#: share of the edges, the CUDA-core walks (columns split into work items) run
#: instead. bf16 GT mini-batch step ([25, 10], 8,192 seeds), GPU ms tensor /
#: CUDA cores: GitHub (longest column 1/45 of the edges) 1.38 / 1.09, ogbn-arxiv
#: (1/238) 2.66 / 2.69.
MMA_BWD_MAX_COLUMN_SHARE = 1 / 128
#: A graph runs the dense-tile forward when at least this fraction of its
#: 64-row blocks can run dense ...
DENSE_MIN_FRACTION = 0.5
#: ... and their median window holds at most this many cells per edge: dense is
#: faster on PATTERN / CLUSTER (4.3 / 5.9) and MNIST-like (17.6), slower on
#: CIFAR10- (23.9) and COCO-SP-like (24.7) batches.
DENSE_MAX_MEDIAN_CELLS = 20.0
#: The fp16 / bf16 backward runs over dense tiles by default where the forward's
#: median window holds at most this many cells per edge. Backward ms, bf16 on
#: an H200, dense tiles / sparse tensor-core walks at 1 x 128, 2 x 64, 4 x 32:
#: PATTERN-like (4.3 cells) 0.34 / 0.97, 0.48 / 0.99, 0.59 / 1.26; CLUSTER-like
#: (5.9) 0.35 / 0.75, 0.49 / 0.76, 0.60 / 0.96; MNIST-like (17.6) 0.18 / 0.16,
#: 0.24 / 0.16, 0.27 / 0.19 (``benchmarks.dense_backward``).
DENSE_BACKWARD_MAX_CELLS = 12.0
#: Inside a dense-tile launch, a block whose window holds more cells per edge
#: than this runs the sparse units.
DENSE_BLOCK_MAX_CELLS = 24.0
# "force": a bound no window reaches (finite: the kernel multiplies it by a
# block's edge count, which may be 0).
_FORCE_CELLS = 1e30

# ------------------------------------------------------------------------ override
#: Override fields and their allowed values (:func:`override`).
_FIELDS = {
    "rule": "'measured' (SMMF for every score) or 'paper' (paper §4.2)",
    "chunk": "a positive int (edges per work item)",
    "long_items_first": "a bool (split-row graphs' items longest first)",
    "item_order": f"one of {ITEM_ORDERS} (the node order the work items run in)",
    "two_rows": "a bool (two rows per warp in the fp32 SMMF forward)",
    "row_walk": "a bool (the additive score's SMMF forward on the shared row walk)",
    "mma": "a bool (the fp16 / bf16 tensor-core GT forward)",
    "mma_backward": "a bool (the fp16 / bf16 GT backward's walks on tensor cores)",
    "dense_tiles": "'off', 'force' or a positive number (cells per edge per block)",
    "dense_backward": "a bool (the tensor-core GT backward over dense tiles)",
    "save_weights": "a bool (the dense-tile backward saves per-edge weights)",
    "bwd_launches": "1 or 2 (kernel launches of the GT backward)",
    "direct_entry": "a bool (eager calls through the extension's direct entry)",
}
_OVERRIDES: contextvars.ContextVar[Tuple[Tuple[str, object], ...]] = contextvars.ContextVar(
    "pyg_dfgnn_plan_overrides", default=())


def _valid(name: str, value) -> bool:
    if name == "rule":
        return value in RULES
    if name == "chunk":
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if name == "dense_tiles":
        return value in ("off", "force") or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0)
    if name == "bwd_launches":
        return value in (1, 2) and not isinstance(value, bool)
    if name == "item_order":
        return value in ITEM_ORDERS
    return isinstance(value, bool)


@contextlib.contextmanager
def override(**fields) -> Iterator[None]:
    r"""Overrides kernel-plan decisions inside a ``with`` block (tests, benchmarks).

    Nested blocks add to the outer ones; a field set to ``None`` goes back to the
    default rule. The previous state returns when the block exits, also on an
    exception. Overrides are per thread and asyncio task (:mod:`contextvars`);
    a backward keeps the decisions of its forward. Under ``torch.compile`` the fused
    calls read them when the compiled code runs (the op builds its plan then:
    :func:`pyg_dfgnn.ops.calls.resolve`); code
    that Dynamo traces sees none (it cannot read a context variable), so a traced
    ``return_attention`` call runs the default plan.

    Args:
        rule (str): how ``strategy="auto"`` decides: ``"measured"`` (default,
            SMMF for every score) or ``"paper"`` (PMF for dot-product and cosine
            scores when a row exceeds shared memory).
        chunk (int): edges per work item.
        long_items_first (bool): order the work items of graphs with split rows
            longest first (default) or by row.
        item_order (str): the node order the work items run in (within the
            length order where ``long_items_first`` applies): ``"row"``
            (default, node ids), ``"rcm"`` (reverse Cuthill-McKee) or
            ``"degree"`` (:mod:`pyg_dfgnn.node_order`); results are bitwise the
            same for every order.
        two_rows (bool): two rows per warp in the fp32 SMMF forward (where the
            head shape has that variant).
        row_walk (bool): a score with two SMMF forwards (the additive score:
            :attr:`ScoreSpec.row_walk <pyg_dfgnn.ops.spec.ScoreSpec>`) runs the
            one on the shared row walk, ``U`` edges' rows in flight per step,
            rather than its own walk, one edge per lane (by default for fp32
            inputs where the mean in-degree is at most
            :data:`ROW_WALK_MAX_MEAN_DEGREE`, or where a row takes at most
            :data:`ROW_WALK_MAX_LANES` lanes and no row is split).
        mma (bool): the fp16 / bf16 tensor-core GT forward.
        mma_backward (bool): the GT backward's CSR and CSC walks on tensor
            cores (fp16 / bf16, ``C`` in :data:`MMA_HEAD_SIZES`, no dropout; by
            default on where no row is split, no column holds more than
            :data:`MMA_BWD_MAX_COLUMN_SHARE` of the edges and the graph is past
            the one-launch backward). The CSC walk reads the CSR walk's per-edge
            weights, so the backward runs in two launches.
        dense_tiles (str or float): ``"off"``, ``"force"`` (every block that can)
            or a bound on window cells per edge per block; the dense-tile forward
            then runs wherever the tensor-core forward does.
        dense_backward (bool): the tensor-core GT backward over dense tiles
            (``cuda/scores/dot_backward_dense.cu``): its dq launch over the
            forward's tile plan, its dkv launch over the transposed graph's, the
            blocks too sparse for the bound of ``dense_tiles`` on the tensor-core
            walks' units. By default on wherever the forward runs dense tiles
            whose median window holds at most :data:`DENSE_BACKWARD_MAX_CELLS`
            cells per edge, ``mma_backward`` holds (neither has dropout) and the
            transposed graph has a block that can run dense.
        save_weights (bool): the dense-tile backward's dq launch saves each
            edge's (P', dS) for the dkv launch's sparse blocks. By default only
            where a block of the transposed tile plan with edges has no window;
            elsewhere every dkv block runs dense and recomputes them. ``False``
            where a block has no window raises.
        bwd_launches (int): ``1`` or ``2`` kernel launches of the GT backward.
        direct_entry (bool): eager forward calls through the extension's direct
            entry (default) or ``torch.ops.dfgnn``'s Python wrapper.

    Raises:
        ValueError: an unknown field or a value it does not take. A forced
            decision a call cannot run (say ``mma=True`` with dropout) raises
            when that call is planned (:func:`plan_for`).
    """
    for name, value in fields.items():
        if name not in _FIELDS:
            raise ValueError(f"plan.override: unknown field {name!r}; fields: "
                             f"{', '.join(_FIELDS)}")
        if value is not None and not _valid(name, value):
            raise ValueError(f"plan.override: {name} must be {_FIELDS[name]}, got {value!r}")
    merged = dict(_OVERRIDES.get())
    merged.update(fields)
    token = _OVERRIDES.set(tuple(sorted((k, v) for k, v in merged.items() if v is not None)))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def _current() -> Tuple[Tuple[str, object], ...]:
    # Dynamo cannot trace ContextVar.get, so traced code runs the default plan; the
    # plans of compiled calls are built outside the trace, when they run
    # (pyg_dfgnn.ops.calls.resolve), and read it.
    if torch.compiler.is_compiling():
        return ()
    return _OVERRIDES.get()


def eager_overrides() -> Tuple[Tuple[str, object], ...]:
    """The overrides in effect as ``(field, value)`` pairs, for a caller that knows
    no trace is running (one context-variable read: an eager call's host path)."""
    return _OVERRIDES.get()


def overrides() -> dict:
    """The overrides in effect (field -> value), empty outside :func:`override` and
    inside code that ``torch.compile`` traces (which runs the default plan)."""
    return dict(_current())


def _get(name: str, default, fields: Optional[Tuple[Tuple[str, object], ...]] = None):
    """One override's value among ``fields`` (by default those in effect), else
    ``default`` (no dict on the common path)."""
    for key, value in _current() if fields is None else fields:
        if key == name:
            return value
    return default


def direct_entry(fields: Optional[Tuple[Tuple[str, object], ...]] = None) -> bool:
    """Whether eager forward calls take the extension's direct entry (the host
    path, not a kernel: not part of :class:`Plan`), by the overrides ``fields``
    (:func:`eager_overrides`; by default those in effect)."""
    return _get("direct_entry", True, fields)


# ------------------------------------------------------------------ support tables
def kernel_supports(head_size: int, dtype: torch.dtype) -> bool:
    r"""Whether the fused kernels handle heads of ``head_size`` channels of ``dtype``:
    16-byte vectors when ``C * itemsize`` is a multiple of 16 (up to
    :data:`MAX_ROW_BYTES` per head row), else scalar loads for ``C <=``
    :data:`MAX_SCALAR_C`. Unsupported sizes run the reference."""
    if dtype not in KERNEL_DTYPES or head_size <= 0:
        return False
    # The scalar test first: it decides the common heads without vector_rows' call (a
    # small graph's call is host-bound: docs/steps.md, "Host path").
    return head_size <= MAX_SCALAR_C or vector_rows(head_size, dtype)


def vector_rows(head_size: int, dtype: torch.dtype) -> bool:
    """Whether heads of ``head_size`` channels of ``dtype`` are read as 16-byte
    vectors (``dispatch_row_shape``); the attention op copies an input that does
    not start on a 16-byte boundary (``cuda/glue/attention.cpp``)."""
    row_bytes = head_size * dtype.itemsize
    return row_bytes % 16 == 0 and row_bytes <= MAX_ROW_BYTES


def lanes_per_row(head_size: int, dtype: torch.dtype) -> int:
    """Lanes of the SMMF forward's lane group for a head of ``head_size`` channels
    of ``dtype`` (``G`` of ``dispatch_row_shape`` in ``cuda/host/dispatch.cuh``): 4
    to 32 for 16-byte vector rows, 32 for scalar rows."""
    if not vector_rows(head_size, dtype):
        return 32
    vectors = head_size * dtype.itemsize // 16
    return next(g for g in (4, 8, 16, 32) if vectors <= g or g == 32)


def two_rows_shape(head_size: int, dtype: torch.dtype) -> bool:
    """Whether the fp32 SMMF forward has a two-rows-per-warp shape for
    ``head_size``: 4-float vectors, 5 to 32 of them per row (``kHasTwoRowsShape``
    in ``cuda/host/dispatch.cuh``; fp16 / bf16 would spill)."""
    return dtype == torch.float32 and head_size % 4 == 0 and 20 <= head_size <= 128


@functools.lru_cache(maxsize=None)
def shared_memory_per_block(device_index: Optional[int] = None) -> int:
    """Shared memory (bytes) one block may use on the device (opt-in maximum)."""
    if not torch.cuda.is_available():
        return 48 * 1024
    props = torch.cuda.get_device_properties(device_index if device_index is not None else
                                             torch.cuda.current_device())
    return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)


def check_strategy(strategy: str) -> str:
    """``strategy`` if it is one of :data:`STRATEGIES`; raises :class:`ValueError`
    otherwise."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def choose_strategy(max_in_degree: int, score: str = "dot", elem_size: int = 4,
                    strategy: str = "auto", capacity: Optional[int] = None,
                    rule: Optional[str] = None) -> str:
    r"""Picks ``"smmf"`` or ``"pmf"``.

    The paper (§4.2) runs PMF for dot-product scores on graphs whose largest
    in-degree reaches ``shared_memory_capacity / bytes_per_element``. Our SMMF
    kernel keeps scores in registers and splits long rows into work items, and
    beat PMF on every graph measured, super nodes included (Reddit-like 2.06 ms
    against 3.68 forward), so the ``"measured"`` rule runs SMMF everywhere.
    Additive scores (GAT) are SMMF under both rules (paper Fig. 12); a score
    without a PMF path always is.

    Args:
        max_in_degree (int): largest in-degree of the graph.
        score (str): a registered score (:mod:`pyg_dfgnn.ops.spec`): ``"dot"``
            (GT), ``"cosine"`` (AGNN), ``"additive"`` (GAT), ``"additive_edge"``
            (GAT with edge features), ``"gatv2"``, ``"gatv2_edge"`` (GATv2 with edge
            features), ...
        elem_size (int): bytes per feature element (4 fp32, 2 fp16/bf16).
        strategy (str): ``"auto"``, or ``"smmf"`` / ``"pmf"`` to force one.
        capacity (int, optional): shared memory per block in bytes, for the paper
            rule; the current device's by default.
        rule (str, optional): ``"measured"`` or ``"paper"``; the :func:`override`
            in effect, else ``"measured"``.

    Raises:
        ValueError: unknown ``strategy``, ``score`` or ``rule``, or
            ``strategy="pmf"`` for a score without a PMF path.
    """
    check_strategy(strategy)
    spec = _spec.get(score)
    if not spec.pmf and strategy == "pmf":
        # Here, not only in the plan: the reference path (CPU) refuses it too.
        raise ValueError(f"the {score} score has no PMF path; use strategy='smmf' or 'auto'")
    if rule is None:
        rule = _get("rule", "measured")
    if rule not in RULES:
        raise ValueError(f"rule must be 'measured' or 'paper', got {rule!r}")
    if strategy != "auto":
        return strategy
    if not spec.pmf_rule or rule == "measured":
        return "smmf"
    capacity = shared_memory_per_block() if capacity is None else capacity
    return "pmf" if max_in_degree >= capacity // max(elem_size, 1) else "smmf"


# ---------------------------------------------------------------------------- plan
@dataclasses.dataclass(frozen=True)
class Plan:
    r"""The kernels one fused call runs (:func:`plan_for`).

    Attributes:
        score (str): the score function (:mod:`pyg_dfgnn.ops.spec`).
        half (bool): the features are fp16 / bf16.
        method (str): ``"smmf"`` (node-parallel, fused) or ``"pmf"``
            (edge-parallel scores, then softmax + SpMM).
        chunk (int): edges per work item.
        long_items_first (bool): work items of split rows ordered longest first.
        item_order (str): node order of the work items of both walks
            (:data:`~pyg_dfgnn.node_order.ITEM_ORDERS`).
        vector_rows (bool): rows read as 16-byte vectors (else one element per
            access, any ``C`` up to :data:`MAX_SCALAR_C`).
        two_rows (bool): two rows per warp in the SMMF forward (fp32 head shapes
            with that variant; needs SMMF and no split rows).
        row_walk (bool): the SMMF forward on the shared row walk
            (``kernels/row_forward.cuh``) rather than the score's own walk (the
            additive score; needs SMMF).
        mma (bool): the tensor-core forward (fp16 / bf16, ``C`` in
            :data:`MMA_HEAD_SIZES`, SMMF, no dropout, no attention weights).
        dense_cells (float): ``0``: no dense tiles; else the forward runs over
            the layout's tile plan, a block dense while its window holds at most
            this many cells per edge (needs ``mma``).
        split_rows (bool): some row is longer than a work item (its items merge
            their partial results).
        merge_in_kernel (bool): the forward's split rows merge in the kernel
            (arrival counters) rather than in merge launches after it (PMF, and
            calls captured into a CUDA graph, where the counters cannot be
            reset between replays).
        bwd_one_launch (bool): the backward's CSR and CSC walks in one launch.
        mma_backward (bool): the backward's two walks on tensor cores
            (``cuda/scores/dot_backward_mma.cu``; needs what ``mma`` needs and
            ``bwd_one_launch=False``; a warp walks 8 whole rows or columns).
        bwd_merge_in_kernel (bool): the backward's split rows merge in its
            kernels (fp32 kernels carry the merge, outside graph capture).
        why (tuple): ``(decision, reason)`` pairs: why each choice was made.
        normalize_first (bool): the score's rows are normalised first and the
            forward runs the dot score's kernels over them (the cosine score in
            fp16 / bf16 or PMF: :attr:`ScoreSpec.normalize_first
            <pyg_dfgnn.ops.spec.ScoreSpec>`); the kernel names and flags below
            are then the dot score's.
        split_cols (bool): some source's column is longer than a work item
            (the backward's CSC walk merges its items' partial results).
        dense_backward (bool): the tensor-core backward's two launches over dense
            tiles (``cuda/scores/dot_backward_dense.cu``): the dq launch over
            the forward's tile plan, the dkv launch over the transposed graph's
            (``layout.derived.tile_plan_t``), each block dense up to
            ``dense_cells`` window cells per edge, else on the walks' units
            (needs ``mma_backward`` and ``dense_cells > 0``).
        save_weights (bool): the two-launch backward's first launch saves each
            edge's (P', dS) for the second. ``False`` only in the dense-tile
            backward where every block of the transposed tile plan that has
            edges has a window (:func:`~pyg_dfgnn.ops.tiles.every_block_windowed`):
            the dkv launch then runs them all dense, recomputing the weights.
    """
    score: str
    half: bool
    method: str
    chunk: int
    long_items_first: bool
    item_order: str
    vector_rows: bool
    two_rows: bool
    mma: bool
    dense_cells: float
    split_rows: bool
    merge_in_kernel: bool
    bwd_one_launch: bool
    mma_backward: bool
    bwd_merge_in_kernel: bool
    why: Tuple[Tuple[str, str], ...] = dataclasses.field(default=(), compare=False)
    normalize_first: bool = False
    split_cols: bool = False
    dense_backward: bool = False
    save_weights: bool = True
    row_walk: bool = False

    @property
    def pmf(self) -> bool:
        return self.method == "pmf"

    def flags(self) -> dict:
        """The decisions as the C++ plan object takes them (0 / 1)."""
        return {"pmf": int(self.pmf), "vector_rows": int(self.vector_rows),
                "two_rows": int(self.two_rows), "mma": int(self.mma),
                "merge_in_kernel": int(self.merge_in_kernel),
                "bwd_one_launch": int(self.bwd_one_launch),
                "mma_backward": int(self.mma_backward),
                "bwd_merge_in_kernel": int(self.bwd_merge_in_kernel),
                "normalize_first": int(self.normalize_first),
                "dense_backward": int(self.dense_backward),
                "save_weights": int(self.save_weights),
                "row_walk": int(self.row_walk)}

    def kernels(self, backward: bool = False) -> List[Tuple[str, str]]:
        r"""``(kernel, what it does)`` for each kernel the forward (or the
        backward) of this plan launches, in launch order."""
        if _spec.get(self.score).normalize_first is not None:
            return self._normalizing_kernels(backward)
        return self._walk_kernels(backward)

    def _walk_kernels(self, backward: bool) -> List[Tuple[str, str]]:
        # The score's attention kernels, named after it.
        merge = "merge launch: the split rows' partial results, in slot order"
        name = self.score
        if backward:
            # Per-edge inputs get their gradient in the CSR walk, one edge at a time
            # (the dot_edge and gatv2_edge scores' rows), or in a kernel of their own
            # (the additive_edge score's terms). In half precision the walks take
            # D_i = dO_i . O_i from the forward's fp32 rows (docs/backward.md): the
            # tensor-core dq walks compute it for their own rows, the CUDA-core
            # walks read it from a pass of its own.
            edge = bool(_spec.get(name).edge_inputs)
            dq = "dq and the edge rows' gradients" if edge else "dq"
            res = []
            if name in ("additive", "additive_edge"):
                res.append((f"{name}:bwd_dst", "CSR walk over destinations: D and d a_dst"))
                if self.half and self.split_rows:
                    res.append((f"{name}:split_dsum", "split rows' D and d a_dst from their "
                                                      "items' shares, in slot order"))
                if edge:
                    res.append((f"{name}:bwd_edge", "edge-parallel d a_edge: dO_i . x_j per "
                                                    "edge and head, through the softmax "
                                                    "and LeakyReLU"))
                res.append((f"{name}:bwd_src", "CSC walk over sources: dx and d a_src"))
            else:
                if self.half and not self.mma_backward:
                    res.append(("out_dsum", "D_i = dO_i . O_i per row and head, from the "
                                            "forward's fp32 rows"))
                if self.bwd_one_launch:
                    res.append((f"{name}:bwd_one_launch", f"the CSR ({dq}) and CSC (dk, dv) "
                                "walks side by side in one launch, the CSC walk recomputing "
                                "its weights"))
                elif self.mma_backward and self.dense_backward and not self.save_weights:
                    res += [(f"{name}:dq_dense", f"tensor cores over dense 64-row tiles (D and "
                                                 f"{dq}; too sparse blocks walk 8 whole rows "
                                                 "per warp)"),
                            (f"{name}:dkv_dense", "tensor cores over dense 64-source tiles of "
                                                  "the transposed graph, every block with a "
                                                  "window, recomputing the weights")]
                elif self.mma_backward and self.dense_backward:
                    res += [(f"{name}:dq_dense", f"tensor cores over dense 64-row tiles (D and "
                                                 f"{dq}; too sparse blocks walk 8 whole rows "
                                                 "per warp); saves (P', dS) per edge and "
                                                 "head"),
                            (f"{name}:dkv_dense", "tensor cores over dense 64-source tiles of "
                                                  "the transposed graph, recomputing the "
                                                  "weights (too sparse blocks: SpMM with the "
                                                  "saved ones)")]
                elif self.mma_backward:
                    res += [(f"{name}:dq_mma", f"CSR walk on tensor cores (D and {dq}), 8 whole "
                                               "rows per warp; saves (P', dS) per edge and "
                                               "head"),
                            (f"{name}:dkv_mma", "CSC walk on tensor cores: SpMM with the saved "
                                                "weights")]
                else:
                    res += [(f"{name}:dq_walk", f"CSR walk: scores, softmax backward and {dq}; "
                                                "saves (P', dS) per edge and head"),
                            (f"{name}:dkv_walk", "CSC walk: dk and dv as an SpMM with the saved "
                                                 "weights")]
            # The additive scores' split rows in half precision merge in split_dsum.
            rows = self.split_rows and not (name in ("additive", "additive_edge") and self.half)
            if (rows or self.split_cols) and not self.bwd_merge_in_kernel \
                    and not self.mma_backward:
                res.append(("combine_partials", merge))
            return res
        if self.mma:
            if self.dense_cells > 0:
                return [("dot:fwd_dense", "tensor cores over dense 64-row tiles (blocks whose "
                                          "window is too sparse run 16-edge units)")]
            return [("dot:fwd_mma", "tensor cores, 16-edge units, 8 whole rows per warp")]
        if self.pmf:
            res = [(f"{self.score}:sddmm", "edge-parallel scores [E, H] (PMF, paper §4.1)"),
                   ("softmax_spmm", "edge softmax + SpMM over work items")]
            if self.split_rows:
                res.append(("combine_partials", merge))
            return res
        shape = "two rows per warp" if self.two_rows else "one row per lane group"
        access = "16-byte vectors" if self.vector_rows else "one element per access"
        smmf = f"{self.score}:row_smmf" if self.row_walk else f"{self.score}:smmf"
        walk = ", the shared row walk" if self.row_walk else ""
        res = [(smmf, f"SMMF: scores, online softmax and SpMM in one pass "
                      f"({shape}, {access}{walk})")]
        if self.split_rows:
            res.append(("merge_softmax_partials", merge) if not self.merge_in_kernel else
                       (smmf, "split rows merged in the kernel by their last item"))
        return res


    def _normalizing_kernels(self, backward: bool) -> List[Tuple[str, str]]:
        # A score that may normalise first (the cosine score): its backward is always
        # the dot score's over the normalised rows, between the normalisation's
        # forward (recomputed where the forward kept only the norms) and backward.
        name = self.score
        dot = dataclasses.replace(self, score="dot", normalize_first=False)
        normalize = (f"{name}:normalize", "k = x / max(||x||, eps), q = beta k and the "
                                          "inverse norms, in one pass")
        if backward:
            res = [] if self.normalize_first else [
                (normalize[0], "k and q recomputed (the forward kept the inverse norms only)")]
            return res + dot.kernels(backward=True) + [
                (f"{name}:normalize_bwd", "dx through the normalisation, and beta's per-row "
                                          "terms")]
        if self.normalize_first:
            return [normalize] + dot.kernels()
        return [(f"{name}:rnorm", "inverse row norms")] + self._walk_kernels(False)

def plan_for(layout, dtype: torch.dtype, head_size: int, score: str = "dot",
             strategy: str = "auto", dropout: bool = False, need_attn: bool = False,
             tiles: bool = True, capturing: bool = False) -> Plan:
    r"""The :class:`Plan` of a fused call, made once per key and kept in
    ``layout.derived.plans``.

    Args:
        layout (GraphLayout): the graph.
        dtype (torch.dtype): the features' dtype.
        head_size (int): channels per head ``C``.
        score (str): a registered score (``"dot"``, ``"cosine"``, ``"additive"``,
            ``"gatv2"``, ...).
        strategy (str): ``"auto"``, ``"smmf"`` or ``"pmf"``.
        dropout (bool): the call applies attention dropout.
        need_attn (bool): the call returns the attention weights.
        tiles (bool): the call may run dense tiles (where the score has them);
            without, ``dense_cells`` is 0 and no tile plan is built.
        capturing (bool): the call is captured into a CUDA graph (split rows then
            merge in merge launches).

    Raises:
        ValueError: a bad ``strategy`` or ``score``, or an :func:`override` that
            forces a decision this call cannot run.
    """
    return kept_plan(layout, (dtype, head_size, score, strategy, bool(dropout),
                              bool(need_attn), bool(tiles), bool(capturing), _current()))[0]


def kept_plan(layout, key: tuple) -> Tuple[Plan, bool]:
    """:func:`plan_for` by its key ``(dtype, head_size, score, strategy, dropout,
    need_attn, tiles, capturing, overrides)``; also whether the plan is kept on
    the layout (callers that cache what they derive from it must not cache
    otherwise)."""
    plan = layout.derived.plans.get(key)
    if plan is not None:
        return plan, True
    plan, final = _decide(layout, *key[:-1], dict(key[-1]))
    if final:
        layout.derived.plans[key] = plan
    return plan, final


def _forced(o: dict, name: str, default, possible: bool, why: str):
    value = o.get(name, default)
    if value and not possible:
        raise ValueError(f"plan.override({name}={o[name]!r}): {why}")
    return value


def _decide(layout, dtype, head_size, score, strategy, dropout, need_attn, tiles, capturing,
            o) -> tuple:
    """``(plan, final)``; ``final`` is False where the plan rests on data not
    built yet (a tile plan inside ``torch.compile``) and must not be kept."""
    spec = _spec.get(score)
    why = []
    method = choose_strategy(layout.max_in_degree, score, dtype.itemsize, strategy,
                             rule=o.get("rule"))
    why.append(("method", f"strategy={strategy!r}" if strategy != "auto" else
                ("paper rule (§4.2): a row longer than shared memory" if method == "pmf" else
                 "SMMF measured faster than PMF on every graph (docs/kernels.md)")))
    chunk = o.get("chunk") or chunk_for(layout.num_edges)
    long_first = o.get("long_items_first", True)
    # Node ids by default (docs/kernels.md, "Item order").
    item_order = o.get("item_order", "row")
    smmf = method == "smmf"
    split = layout.work("row", chunk, long_first).num_slots > 0
    if split:
        why.append(("split_rows", f"a row of {layout.max_in_degree} edges is longer than a "
                                  f"work item ({chunk} edges)"))
    vec = vector_rows(head_size, dtype)
    has_two = spec.two_rows and two_rows_shape(head_size, dtype)
    two_rows = _forced(o, "two_rows", has_two and smmf and not split and
                       layout.num_edges >= TWO_ROWS_MIN_EDGES,
                       has_two and smmf and not split,
                       "two rows per warp need SMMF, no split rows (a row longer than the "
                       "chunk), a score with that variant and an fp32 head of 20 to 128 "
                       "channels (a multiple of 4)")
    if has_two and smmf and not split:
        why.append(("two_rows", f"{layout.num_edges} edges "
                                f"{'>=' if two_rows else '<'} {TWO_ROWS_MIN_EDGES}: two rows per "
                                f"warp {'on' if two_rows else 'off'}"))
    mean_degree = layout.num_edges / max(layout.num_dst, 1)
    lanes = lanes_per_row(head_size, dtype)
    half = dtype in HALF_DTYPES
    row_walk = _forced(o, "row_walk", spec.row_walk and smmf and not half and (
                           mean_degree <= ROW_WALK_MAX_MEAN_DEGREE
                           or (lanes <= ROW_WALK_MAX_LANES and not split)),
                       spec.row_walk and smmf,
                       "the shared row walk's forward needs SMMF and a score with two SMMF "
                       "forwards (additive)")
    if spec.row_walk and smmf:
        walk = "the shared row walk" if row_walk else "the score's own walk"
        if "row_walk" in o:
            why.append(("row_walk", f"{walk} (override)"))
        elif half:
            why.append(("row_walk", f"fp16 / bf16 rows: {walk}"))
        else:
            why.append(("row_walk", f"mean in-degree {mean_degree:.1f}, {lanes} lanes per row"
                                    f"{', split rows' if split else ''}: {walk}"))
    can_mma = (spec.mma and smmf and not dropout and not need_attn
               and half and head_size in MMA_HEAD_SIZES)
    mma = _forced(o, "mma", can_mma and not split, can_mma,
                  f"the tensor-core forward needs a score with it (dot, cosine), SMMF, "
                  f"fp16 / bf16, C in {MMA_HEAD_SIZES}, no dropout and no attention weights")
    if can_mma:
        why.append(("mma", "tensor-core forward" if mma else
                    "split rows: the CUDA-core forward (a warp of the tensor-core forward takes "
                    "8 whole rows)"))
    dense_cells, final = (_dense_cells(layout, o.get("dense_tiles"))
                          if mma and tiles and spec.dense_tiles else (0.0, True))
    if dense_cells > 0:
        why.append(("dense_tiles", "most 64-row blocks have narrow source windows"))
    # On where the A/B measured it faster: whole rows (a walk takes 8 whole rows, so
    # split rows leave warps idle behind hub rows), no hub column (likewise for the
    # CSC walk) and graphs past the one-launch backward (docs/backward.md).
    one_launch = layout.num_edges < ONE_LAUNCH_BWD_MAX_EDGES
    mma_bwd = _forced(o, "mma_backward",
                      can_mma and not split and not one_launch and o.get("bwd_launches", 2) == 2
                      and layout.max_out_degree <= MMA_BWD_MAX_COLUMN_SHARE * layout.num_edges,
                      can_mma and o.get("bwd_launches", 2) == 2,
                      f"the tensor-core backward needs a score with it (dot, cosine), SMMF, "
                      f"fp16 / bf16, C in {MMA_HEAD_SIZES}, no dropout, no attention weights "
                      f"and two backward launches")
    if not spec.one_launch_backward:
        if o.get("bwd_launches") == 1:
            raise ValueError(f"plan.override(bwd_launches=1): the {score} score's backward "
                             "has one form")
        bwd_one_launch = False
    elif mma_bwd:
        bwd_one_launch = False  # the dq walk writes the CSC walk's weights
    else:
        bwd_one_launch = o.get("bwd_launches", 1 if one_launch else 2) == 1
    if spec.one_launch_backward:
        why.append(("bwd_launches", "tensor-core walks" if mma_bwd else
                    f"{layout.num_edges} edges {'<' if one_launch else '>='} "
                    f"{ONE_LAUNCH_BWD_MAX_EDGES}: {'one launch' if bwd_one_launch else 'two'}"))
    dense_bwd, save, final_t = _dense_backward(layout, o, dense_cells > 0 and bool(mma_bwd),
                                               why)
    final = final and final_t
    merge = smmf and not capturing
    bwd_merge = dtype == torch.float32 and not capturing
    first = spec.normalize_first is not None and bool(spec.normalize_first(dtype, method))
    if first:
        why.append(("normalize_first", f"the {score} score in {dtype} with {method.upper()} "
                                       "normalises its rows, then runs the dot score's kernels"))
    return Plan(score, half, method, chunk, long_first, item_order, vec,
                bool(two_rows), bool(mma), dense_cells, split, merge, bwd_one_launch,
                bool(mma_bwd), bwd_merge, tuple(why), normalize_first=first,
                split_cols=layout.max_out_degree > chunk, dense_backward=dense_bwd,
                save_weights=save, row_walk=bool(row_walk)), final


def _dense_backward(layout, o: dict, possible: bool, why: list) -> Tuple[bool, bool, bool]:
    """``(dense_backward, save_weights, final)``: the tensor-core backward over
    dense tiles wherever the forward runs them (``possible``: dense tiles and
    ``mma_backward``), their median window holds at most
    :data:`DENSE_BACKWARD_MAX_CELLS` cells per edge and the transposed graph has
    a block that can run dense, unless the ``dense_backward`` override says
    otherwise (``True`` also forces wider windows); it saves no weights where
    every block of the transposed plan that has edges has a window."""
    asked = o.get("dense_backward")
    if asked is False or not possible:
        if asked:
            raise ValueError("plan.override(dense_backward=True): the dense-tile backward "
                             "needs the dense-tile forward (dense_tiles) and the tensor-core "
                             "backward (mma_backward)")
        if possible:
            why.append(("dense_backward", "off (override)"))
        return False, True, True
    cells = _median_cells(layout)
    if asked is None and cells > DENSE_BACKWARD_MAX_CELLS:
        why.append(("dense_backward", f"off: the median window holds {cells:.1f} cells per "
                                      f"edge > {DENSE_BACKWARD_MAX_CELLS:g} (the sparse "
                                      "walks measured faster there)"))
        return False, True, True
    entry = layout_tiles_t(layout)
    if entry is None:  # a tile plan not built inside torch.compile
        return False, True, False
    if entry.tiles_t is None:
        if asked:
            raise ValueError("plan.override(dense_backward=True): no 64-source block of the "
                             "transposed graph can run dense")
        why.append(("dense_backward", "off: no 64-source block of the transposed graph can "
                                      "run dense"))
        return False, True, True
    why.append(("dense_backward", "dense tiles in the backward too: dq over the forward's "
                                  "tiles, dk and dv over the transposed graph's"))
    save = o.get("save_weights")
    if save is False and not entry.windowed:
        raise ValueError("plan.override(save_weights=False): a 64-source block of the "
                         "transposed graph has no window (over 512 keys or a duplicate "
                         "edge); its dkv units read the saved weights")
    if save is not None:
        why.append(("save_weights", f"{'on' if save else 'off'} (override)"))
    elif entry.windowed:
        why.append(("save_weights", "off: every 64-source block with edges has a window, so "
                                    "the dkv launch runs them all dense"))
    else:
        why.append(("save_weights", "on: a 64-source block has no window (over 512 keys or a "
                                    "duplicate edge); its dkv units read the weights the dq "
                                    "launch saves"))
    return True, (not entry.windowed) if save is None else save, True


def _median_cells(layout) -> float:
    """The median window cells per edge of the layout's dense blocks (its tile
    plan, built where the forward runs dense tiles); ``inf`` without one."""
    tp = layout_tiles(layout)
    return math.inf if tp is None else tp.median_cells


def _dense_cells(layout, mode) -> Tuple[float, bool]:
    """``(dense_cells, final)`` of a tensor-core call: the per-block bound where
    the graph runs dense tiles (:data:`DENSE_MIN_FRACTION`,
    :data:`DENSE_MAX_MEDIAN_CELLS`, or the ``dense_tiles`` override), else 0."""
    if mode == "off":
        return 0.0, True
    # By the rule alone, the build gives up early on graphs it would not run dense.
    tp = layout_tiles(layout, DENSE_MIN_FRACTION if mode is None else 0.0)
    if tp is None:  # CPU layout, or a tile plan not built inside torch.compile
        return 0.0, not layout.col.is_cuda
    if tp.tiles is None:
        return 0.0, True
    if mode is None:
        dense = tp.dense_fraction >= DENSE_MIN_FRACTION and tp.median_cells <= \
            DENSE_MAX_MEDIAN_CELLS
        return (DENSE_BLOCK_MAX_CELLS if dense else 0.0), True
    return (_FORCE_CELLS if mode == "force" else float(mode)), True
