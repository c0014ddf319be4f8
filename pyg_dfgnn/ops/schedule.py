r"""SMMF vs PMF: which fusion method a call uses (paper §4.2), and how the
node-parallel kernels split their rows into work items.

The paper's rule: a graph whose largest in-degree satisfies
``max_v |N(v)| >= shared_memory_capacity / bytes_per_element`` and a dot-product
score (GT, AGNN) moves the bottleneck from launch overhead to an unbalanced
SDDMM, so **PMF** (edge-parallel SDDMM + fused softmax/SpMM) is used; otherwise
**SMMF** (one fused node-parallel kernel). Additive scores (GAT) stay on SMMF
(paper Fig. 12).

Our SMMF kernel keeps scores in registers (online softmax) and splits long rows
into work items of at most ``chunk`` edges (:func:`split_work`), so it never runs
out of shared memory and a super node is spread over many lane groups. Measured
on the H100, it beats PMF on every graph, super-node
graphs included (Reddit-like: 2.06 ms vs 3.68 ms forward), so ``"auto"`` uses
the measured rule (:data:`RULE` ``= "measured"``: SMMF) for dot-product and
cosine scores.

For additive scores (GAT) SMMF is as fast as PMF or faster on every graph, as the
paper says (Fig. 12): its kernel scores a tile of edges at once, one edge per
lane, and took 0.273 ms against PMF's 0.338 ms on PATTERN-like (0.646 against
0.713 ms on ppa-like, 1.102 ms both on Reddit-like), so
``"auto"`` is SMMF for them under both rules; ``strategy=`` forces either method
per call.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

#: Edges per work item of the node-parallel kernels (SMMF forward, PMF softmax +
#: SpMM, both backward kernels); see :func:`choose_chunk`.
DEFAULT_CHUNK = 128
#: Graphs with fewer edges than this use :data:`SMALL_GRAPH_CHUNK`.
SMALL_GRAPH_EDGES = 1 << 18
#: Edges per work item on small graphs (Cora, CiteSeer, PubMed).
SMALL_GRAPH_CHUNK = 32
#: Forces the chunk (benchmarks sweep it); ``None``: :func:`choose_chunk` decides.
CHUNK_OVERRIDE = None
#: Work items of graphs with split rows ordered by their number of edges, longest
#: first (:func:`split_work`); benchmarks turn it off to compare with row order.
LONG_ITEMS_FIRST = True
#: How "auto" decides: "measured" (SMMF everywhere, see the module docstring) or
#: "paper" (paper §4.2: PMF for dot-product scores when a row exceeds shared memory).
RULE = "measured"
#: Largest head size (bytes per head row) the vectorised kernels hold in registers.
MAX_ROW_BYTES = 128 * 16
#: Largest head size of the scalar (any C) kernels.
MAX_SCALAR_C = 128

STRATEGIES = ("auto", "smmf", "pmf")


def kernel_supports(head_size: int, dtype: torch.dtype) -> bool:
    r"""Whether the fused kernels handle heads of ``head_size`` channels of ``dtype``.

    Mirrors ``dispatch_row_shape`` in ``cuda/common.cuh``: 16-byte vectors when
    ``C * itemsize`` is a multiple of 16 (up to 2 KiB per head row), else scalar
    loads for ``C <= 128``. Unsupported sizes fall back to the reference.
    """
    if dtype not in (torch.float32, torch.float16, torch.bfloat16) or head_size <= 0:
        return False
    row_bytes = head_size * dtype.itemsize
    if row_bytes % 16 == 0 and row_bytes <= MAX_ROW_BYTES:
        return True
    return head_size <= MAX_SCALAR_C


@functools.lru_cache(maxsize=None)
def shared_memory_per_block(device_index: Optional[int] = None) -> int:
    """Shared memory (bytes) one block may use on the device (opt-in maximum)."""
    if not torch.cuda.is_available():
        return 48 * 1024
    props = torch.cuda.get_device_properties(device_index if device_index is not None else
                                             torch.cuda.current_device())
    return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)


def choose_strategy(max_in_degree: int, score: str = "dot", elem_size: int = 4,
                    strategy: str = "auto", capacity: Optional[int] = None,
                    rule: Optional[str] = None) -> str:
    r"""Picks ``"smmf"`` or ``"pmf"`` (paper §4.2; measured rule in the module
    docstring).

    Args:
        max_in_degree (int): largest in-degree of the graph.
        score (str): ``"dot"`` (GT), ``"cosine"`` (AGNN) or ``"additive"`` (GAT).
        elem_size (int): bytes per feature element (4 fp32, 2 fp16/bf16).
        strategy (str): ``"auto"``, or ``"smmf"`` / ``"pmf"`` to force one.
        capacity (int, optional): shared memory per block in bytes, for the paper
            rule; the current device's by default.
        rule (str, optional): ``"measured"`` or ``"paper"``; :data:`RULE` by default.

    Raises:
        ValueError: unknown ``strategy``, ``score`` or ``rule``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if score not in ("dot", "cosine", "additive"):
        raise ValueError(f"score must be 'dot', 'cosine' or 'additive', got {score!r}")
    rule = RULE if rule is None else rule
    if rule not in ("measured", "paper"):
        raise ValueError(f"rule must be 'measured' or 'paper', got {rule!r}")
    if strategy != "auto":
        return strategy
    if score == "additive" or rule == "measured":
        return "smmf"
    capacity = shared_memory_per_block() if capacity is None else capacity
    return "pmf" if max_in_degree >= capacity // max(elem_size, 1) else "smmf"


def work_stats(deg: Tensor, chunk: int) -> Tensor:
    r"""Per-row extra work items: ``max(1, ceil(deg / chunk)) - 1``, computed on the
    device. Their sum and the number of rows with a positive count size the work
    items (:func:`work_items`), so a caller can fetch both with its other scalars
    in one host synchronisation."""
    return (deg - 1).clamp_(min=0).div_(chunk, rounding_mode="floor")


def work_items(ptr: Tensor, extra: Tensor, num_items: int, num_split: int, chunk: int,
               long_first: Optional[bool] = None) -> Tuple[Tensor, Tensor, int]:
    r""":func:`split_work` from on-device statistics, without a host
    synchronisation: ``extra`` is :func:`work_stats` of the pointer's degrees,
    ``num_items`` = ``N + extra.sum()`` and ``num_split`` =
    ``(extra > 0).sum()``, both already on the host."""
    N = extra.numel()
    dev = extra.device
    if num_items == N:  # every row fits one item: one item per row, in row order
        row = torch.arange(N, dtype=torch.int32, device=dev)
        items = torch.stack([row, ptr[:-1].to(torch.int32), row.new_full((N,), -1)], 1)
        return items, row.new_empty((0, 3)), 0
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
    if LONG_ITEMS_FIRST if long_first is None else long_first:
        # Longest first (stable): a kernel ends with its last-started long items
        # otherwise, and a split row's last item merges the row. Only where rows
        # are split (power-law graphs): where every row fits one item (the batch
        # graphs) row order keeps neighbouring rows, which share neighbours,
        # together in L2, and sorting made them 1.2-1.8x slower.
        n_edges = (ptr[1:][row] - start).clamp_(max=chunk)
        items = items[torch.sort(n_edges, descending=True, stable=True).indices]
    split_rows = torch.nonzero_static(split, size=num_split).flatten()
    combine = torch.stack([split_rows.to(i32), slot[first[split_rows]], n_items[split_rows]], 1)
    return items.contiguous(), combine.to(torch.int32), num_items - N + num_split


def split_work(ptr: Tensor, chunk: int,
               long_first: Optional[bool] = None) -> Tuple[Tensor, Tensor, int]:
    r"""Node-parallel work items over a CSR (or CSC) pointer.

    Every row gets ``max(1, ceil(deg / chunk))`` items of at most ``chunk``
    consecutive edges, so one super node is spread over many lane groups; rows
    split over several items write partial results to slots, which the kernel
    itself merges up a tree of slots in a fixed order (``merge_split_row`` in
    ``cuda/common.cuh``), or a combine kernel (``combine``) where it cannot:
    deterministic either way. One host synchronisation (the sizes);
    :class:`~pyg_dfgnn.layout.GraphLayout` builds its items with
    :func:`work_items` instead, sharing its build's single synchronisation.

    Args:
        ptr (Tensor): ``[N + 1]`` row pointer.
        chunk (int): edges per item.
        long_first (bool, optional): on a pointer with split rows, order the
            items by their number of edges, longest first (stable), instead of
            by row; :data:`LONG_ITEMS_FIRST` by default.

    Returns:
        ``items`` int32 ``[I, 3]`` (row, first edge, partial slot or -1),
        ``combine`` int32 ``[R, 3]`` (row, first slot, number of slots) for the
        ``R`` split rows, and the total number of slots.
    """
    extra = work_stats(ptr[1:] - ptr[:-1], chunk)
    total, num_split = torch.stack([extra.long().sum(), (extra > 0).sum()]).tolist()
    return work_items(ptr, extra, extra.numel() + total, num_split, chunk, long_first)


def chunk_for(num_edges: int) -> int:
    """Edges per work item for a graph of ``num_edges`` edges (:func:`choose_chunk`)."""
    if CHUNK_OVERRIDE is not None:
        return int(CHUNK_OVERRIDE)
    return SMALL_GRAPH_CHUNK if num_edges < SMALL_GRAPH_EDGES else DEFAULT_CHUNK


def choose_chunk(layout) -> int:
    r"""Edges per work item for ``layout``.

    A lane group walks its item a few edges per memory round trip, so a long item
    is a long latency chain; each extra item of a split row costs an fp32 partial
    row and the rows' combine launch. Swept on the H100:

    * below :data:`SMALL_GRAPH_EDGES` edges the GPU is far from full and a kernel
      takes as long as its longest item's chain, so short items win: GT forward
      on Cora 0.033 ms at 128 against 0.019 ms at 32, PubMed 0.060 against 0.049;
    * on larger graphs throughput decides and 128 was best or within 10 % of the
      best everywhere (GitHub forward 0.162 ms at 128, 0.233 ms at 32; longer
      items lost on Reddit-like).
    """
    return chunk_for(layout.num_edges)


def _work_key(kind: str, chunk: int) -> tuple:
    return (kind, chunk, LONG_ITEMS_FIRST)


def cache_work(layout, kind: str, chunk: int, work: Tuple[Tensor, Tensor, int]) -> None:
    """Stores work items built elsewhere (the layout build) where :func:`row_work`
    (``kind="row_work"``) or :func:`col_work` (``"col_work"``) finds them."""
    layout._cache[_work_key(kind, chunk)] = work


def row_work(layout, chunk: int) -> Tuple[Tensor, Tensor, int]:
    """:func:`split_work` over the layout's CSR (destinations), cached on the layout."""
    key = _work_key("row_work", chunk)
    if key not in layout._cache:
        layout._cache[key] = split_work(layout.rowptr, chunk)
    return layout._cache[key]


def col_work(layout, chunk: int) -> Tuple[Tensor, Tensor, int]:
    """:func:`split_work` over the layout's CSC (sources, for dK / dV), cached on the layout."""
    key = _work_key("col_work", chunk)
    if key not in layout._cache:
        layout._cache[key] = split_work(layout.colptr, chunk)
    return layout._cache[key]
