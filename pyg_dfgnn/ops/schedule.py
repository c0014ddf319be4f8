r"""SMMF vs PMF: which fusion method a call uses (paper §4.2).

The paper's rule: a graph whose largest in-degree satisfies
``max_v |N(v)| >= shared_memory_capacity / bytes_per_element`` and a dot-product
score (GT, AGNN) moves the bottleneck from launch overhead to an unbalanced
SDDMM, so **PMF** (edge-parallel SDDMM + fused softmax/SpMM) is used; otherwise
**SMMF** (one fused node-parallel kernel). Additive scores (GAT) are cheap per
edge, so they stay on SMMF (paper Fig. 12).

Our SMMF kernel keeps scores in registers (online softmax), so it never runs out
of shared memory; what a super node costs it is one lane group walking the whole
row while the rest of the GPU idles. ``capacity`` therefore defaults to the
paper's rule on this device's shared memory per block, and the threshold
:data:`PMF_MIN_DEGREE` (measured, see ``benchmarks/NOTES.md``) caps it.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

#: Edges per work item of the node-parallel kernels (SMMF forward, PMF softmax +
#: SpMM, both backward kernels): a longer row is split over several lane groups.
CHUNK = 256
#: In-degree from which "auto" picks PMF for dot-product scores, whatever the
#: shared-memory rule says (tuned on the H100, benchmarks/NOTES.md).
PMF_MIN_DEGREE = 2048
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
    row_bytes = head_size * torch.empty((), dtype=dtype).element_size()
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
                    min_degree: Optional[int] = None) -> str:
    r"""Picks ``"smmf"`` or ``"pmf"`` (paper §4.2).

    Args:
        max_in_degree (int): largest in-degree of the graph.
        score (str): ``"dot"`` (GT), ``"cosine"`` (AGNN) or ``"additive"`` (GAT).
        elem_size (int): bytes per feature element (4 fp32, 2 fp16/bf16).
        strategy (str): ``"auto"``, or ``"smmf"`` / ``"pmf"`` to force one.
        capacity (int, optional): shared memory per block in bytes; the current
            device's by default.
        min_degree (int, optional): in-degree from which dot scores use PMF
            regardless of ``capacity``; :data:`PMF_MIN_DEGREE` by default.

    Raises:
        ValueError: unknown ``strategy`` or ``score``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if score not in ("dot", "cosine", "additive"):
        raise ValueError(f"score must be 'dot', 'cosine' or 'additive', got {score!r}")
    if strategy != "auto":
        return strategy
    if score == "additive":
        return "smmf"
    capacity = shared_memory_per_block() if capacity is None else capacity
    min_degree = PMF_MIN_DEGREE if min_degree is None else min_degree
    super_node = max_in_degree >= capacity // max(elem_size, 1) or max_in_degree >= min_degree
    return "pmf" if super_node else "smmf"


def split_work(ptr: Tensor, chunk: int) -> Tuple[Tensor, Tensor, int]:
    r"""Node-parallel work items over a CSR (or CSC) pointer.

    Every row gets ``max(1, ceil(deg / chunk))`` items of at most ``chunk``
    consecutive edges, so one super node is spread over many lane groups; rows
    split over several items write partial results to slots that a combine
    kernel sums in a fixed order (deterministic, no atomics).

    Args:
        ptr (Tensor): ``[N + 1]`` row pointer.
        chunk (int): edges per item.

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
    items = torch.stack([row, start, slot], 1).to(torch.int32).contiguous()
    split_rows = split.nonzero().flatten()
    combine = torch.stack([split_rows, first_slot[split_rows], n_items[split_rows]], 1)
    return items, combine.to(torch.int32).contiguous(), int(slots_per_row.sum())


def row_work(layout, chunk: int = CHUNK) -> Tuple[Tensor, Tensor, int]:
    """:func:`split_work` over the layout's CSR (destinations), cached on the layout."""
    key = ("row_work", chunk)
    if key not in layout._cache:
        layout._cache[key] = split_work(layout.rowptr, chunk)
    return layout._cache[key]


def col_work(layout, chunk: int = CHUNK) -> Tuple[Tensor, Tensor, int]:
    """:func:`split_work` over the layout's CSC (sources, for dK / dV), cached on the layout."""
    key = ("col_work", chunk)
    if key not in layout._cache:
        layout._cache[key] = split_work(layout.colptr, chunk)
    return layout._cache[key]
