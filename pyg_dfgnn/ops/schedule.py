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
on the H100 (``benchmarks/NOTES.md``), it beats PMF on every graph, super-node
graphs included (Reddit-like: 2.06 ms vs 3.68 ms forward), so ``"auto"`` uses
the measured rule (:data:`RULE` ``= "measured"``: SMMF) for dot-product and
cosine scores.

For additive scores (GAT) SMMF is as fast as PMF or faster on every graph, as the
paper says (Fig. 12): since v6 its kernel scores a tile of edges at once, one edge
per lane, and took 0.273 ms against PMF's 0.338 ms on PATTERN-like (0.646 against
0.713 ms on ppa-like, 1.102 ms both on Reddit-like; ``benchmarks/NOTES.md``), so
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


def split_work(ptr: Tensor, chunk: int,
               long_first: Optional[bool] = None) -> Tuple[Tensor, Tensor, int]:
    r"""Node-parallel work items over a CSR (or CSC) pointer.

    Every row gets ``max(1, ceil(deg / chunk))`` items of at most ``chunk``
    consecutive edges, so one super node is spread over many lane groups; rows
    split over several items write partial results to slots, which the kernel
    itself merges up a tree of slots in a fixed order (``merge_split_row`` in
    ``cuda/common.cuh``), or a combine kernel (``combine``) where it cannot:
    deterministic either way.

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
    ptr = ptr.long()
    deg = ptr[1:] - ptr[:-1]
    n_items = torch.clamp((deg + chunk - 1) // chunk, min=1)
    total = int(n_items.sum())
    row = torch.repeat_interleave(torch.arange(deg.numel(), device=deg.device), n_items,
                                  output_size=total)
    first_item = torch.cumsum(n_items, 0) - n_items
    local = torch.arange(total, device=deg.device) - first_item[row]
    start = ptr[:-1][row] + local * chunk
    split = n_items > 1
    slots_per_row = torch.where(split, n_items, torch.zeros_like(n_items))
    first_slot = torch.cumsum(slots_per_row, 0) - slots_per_row
    slot = torch.where(split[row], first_slot[row] + local, torch.full_like(local, -1))
    items = torch.stack([row, start, slot], 1)
    if (LONG_ITEMS_FIRST if long_first is None else long_first) and bool(split.any()):
        # Longest first (stable): a kernel ends with its last-started long items
        # otherwise, and a split row's last item merges the row. Only where rows
        # are split (power-law graphs): on graphs whose rows all fit one item (the
        # batch graphs) row order keeps neighbouring rows, which share neighbours,
        # together in L2, and sorting made them 1.2-1.8x slower (v9.1, NOTES.md).
        n_edges = torch.clamp(ptr[1:][row] - start, max=chunk)
        items = items[torch.argsort(-n_edges, stable=True)]
    items = items.to(torch.int32).contiguous()
    split_rows = split.nonzero().flatten()
    combine = torch.stack([split_rows, first_slot[split_rows], n_items[split_rows]], 1)
    return items, combine.to(torch.int32).contiguous(), int(slots_per_row.sum())


def choose_chunk(layout) -> int:
    r"""Edges per work item for ``layout``.

    A lane group walks its item a few edges per memory round trip, so a long item
    is a long latency chain; each extra item of a split row costs an fp32 partial
    row and the rows' combine launch. Swept on the H100 (``benchmarks/NOTES.md``):

    * below :data:`SMALL_GRAPH_EDGES` edges the GPU is far from full and a kernel
      takes as long as its longest item's chain, so short items win: GT forward
      on Cora 0.033 ms at 128 against 0.019 ms at 32, PubMed 0.060 against 0.049;
    * on larger graphs throughput decides and 128 was best or within 10 % of the
      best everywhere (GitHub forward 0.162 ms at 128, 0.233 ms at 32; longer
      items lost on Reddit-like).
    """
    if CHUNK_OVERRIDE is not None:
        return int(CHUNK_OVERRIDE)
    return SMALL_GRAPH_CHUNK if layout.num_edges < SMALL_GRAPH_EDGES else DEFAULT_CHUNK


def row_work(layout, chunk: int) -> Tuple[Tensor, Tensor, int]:
    """:func:`split_work` over the layout's CSR (destinations), cached on the layout."""
    key = ("row_work", chunk, LONG_ITEMS_FIRST)
    if key not in layout._cache:
        layout._cache[key] = split_work(layout.rowptr, chunk)
    return layout._cache[key]


def col_work(layout, chunk: int) -> Tuple[Tensor, Tensor, int]:
    """:func:`split_work` over the layout's CSC (sources, for dK / dV), cached on the layout."""
    key = ("col_work", chunk, LONG_ITEMS_FIRST)
    if key not in layout._cache:
        layout._cache[key] = split_work(layout.colptr, chunk)
    return layout._cache[key]
