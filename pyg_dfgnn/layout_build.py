r"""The GraphLayout build on the GPU: ``dfgnn::layout_build`` (``cuda/kernels/layout_build.cu``).

Mini-batch training builds a new layout every step; the torch build
(:func:`pyg_dfgnn.layout._build`) takes about 80 small operations for it. This op
builds the same tensors, bit for bit (CSR, CSC, the self-loop variant and the work
items of both, as :func:`pyg_dfgnn.work_items.work_items` makes them), in a few
kernels with the one host synchronisation that reads the sizes.

:func:`build` returns ``None`` where it does not apply (CPU input, extension not
loaded or without the op, an empty side, more than ``2^31 - 1`` edges or nodes, a
chunk above :data:`MAX_CHUNK`); the caller then runs the torch build, which stays
the reference the tests compare with. Layouts are built outside compiled regions
(:mod:`pyg_dfgnn.layout_cache`), so the op is only ever called eagerly.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import extension
from .work_items import Work, chunk_for

#: Largest work-item chunk the kernels handle (``kLayoutBuildMaxChunk``).
MAX_CHUNK = 512
_INT32_MAX = 2**31 - 1
#: Index dtypes the build takes (others are converted to int64 first).
INDEX_DTYPES = (torch.int32, torch.int64)
# Positions in the op's int64 `info` output (LayoutBuildInfo in cuda/kernels/layout_build.h).
_STATUS, _LO_SRC, _LO_DST, _HI_SRC, _HI_DST, _KEPT, _UNSORTED, _MAX_IN, _ROW_SLOTS, \
    _COL_SLOTS, _NUM_EDGES, _MAX_OUT = range(12)


class LayoutIndexError(IndexError, ValueError):
    """An ``edge_index`` entry is negative or not below the node count. An
    :class:`IndexError` as PyG raises it, and a :class:`ValueError` for callers
    that caught the earlier type."""


def out_of_range(lo, hi, num_src: int, num_dst: int) -> LayoutIndexError:
    """The error of indices in ``[lo, hi]`` (per side: src, dst) for the node counts."""
    return LayoutIndexError(f"edge_index out of range: src in [{lo[0]}, {hi[0]}] for N_src="
                            f"{num_src}, dst in [{lo[1]}, {hi[1]}] for N_dst={num_dst}")


class GpuBuild(NamedTuple):
    """What :func:`build` makes: the tensors and statistics of a
    :class:`~pyg_dfgnn.layout.GraphLayout`, which ``pyg_dfgnn.layout`` assembles."""
    rowptr: Tensor
    col: Tensor
    csr_row: Tensor
    edge_perm: Optional[Tensor]  #: ``None`` where it is the identity
    csc: Optional[Tuple[Tensor, Tensor, Tensor]]  #: ``(colptr, row, perm)`` with ``with_csc``
    row_work: Work
    col_work: Optional[Work]
    chunk: int
    long_first: bool
    max_in_degree: int
    max_out_degree: int
    dst_extent: int
    #: removed self-loops moved ``E`` across a chunk threshold: the default
    #: chunk differs from the one built (the layout rebuilds its work items)
    rechunk: bool


def available(device: torch.device) -> bool:
    """Whether the op can run on ``device`` (a CUDA device and an extension that
    registers ``dfgnn::layout_build``)."""
    if device.type != "cuda":
        return False
    return extension.HAS_EXTENSION and hasattr(torch.ops.dfgnn, "layout_build")


def build(ei: Tensor, num_src: int, num_dst: int, loops: bool, with_csc: bool,
          chunk: Optional[int] = None, long_first: bool = True) -> Optional[GpuBuild]:
    r"""The layout tensors of ``ei`` built on its GPU, or ``None`` where the op
    does not apply (see the module docstring).

    Args:
        ei (Tensor): ``[2, E0]`` int32 / int64 CUDA tensor (src, dst), not an alias
            of anything the layout keeps (the outputs are new tensors).
        num_src, num_dst (int): node counts.
        loops (bool): remove existing self-loops and append one per node below
            ``min(num_src, num_dst)`` (GAT / AGNN).
        with_csc (bool): also build the CSC and its work items.
        chunk (int, optional): edges per work item; by default
            :func:`~pyg_dfgnn.work_items.chunk_for` of the edge count, as the
            torch build. Tests pass others to compare the two builds.
        long_first (bool): work-item order (:func:`~pyg_dfgnn.work_items.work_items`).

    Returns:
        GpuBuild: ``rowptr``, ``col``, ``csr_row``, ``edge_perm`` (``None``
        where it is the identity: grouped input without self-loops), the CSC
        (``with_csc``) and the work items, as the torch build makes them.

    Raises:
        LayoutIndexError: an index is negative or not below its node count
            (found from the one statistics read, before any scatter).
    """
    E0 = ei.size(1)
    n = min(num_src, num_dst) if loops else 0
    if (num_src <= 0 or num_dst <= 0 or max(E0 + n, num_src, num_dst) > _INT32_MAX
            or ei.dtype not in INDEX_DTYPES or not available(ei.device)):
        return None
    default = chunk is None
    if default:
        chunk = chunk_for(E0 + n)  # as the torch build: exact unless loops are removed
    elif not 1 <= chunk <= MAX_CHUNK:
        return None
    if E0 > 1 and ei.stride(1) != 1:
        ei = ei.contiguous()
    (rowptr, col, csr_row, edge_perm, colptr, row, perm, row_items, row_combine, col_items,
     col_combine, info) = torch.ops.dfgnn.layout_build.default(
        ei, num_src, num_dst, loops, with_csc, chunk, bool(long_first))
    info = info.tolist()  # a CPU tensor: no synchronisation
    if info[_STATUS]:
        raise out_of_range([info[_LO_SRC], info[_LO_DST]], [info[_HI_SRC], info[_HI_DST]],
                            num_src, num_dst)
    # Outputs not built come back empty: edge_perm where it is the identity (only
    # ever for E > 0), the CSC without with_csc.
    extent = max(info[_HI_DST] + 1 if E0 else 0, n)  # removed self-loops only overstate it
    return GpuBuild(
        rowptr, col, csr_row, edge_perm if edge_perm.numel() else None,
        (colptr, row, perm) if with_csc else None,
        Work(row_items, row_combine, info[_ROW_SLOTS]),
        Work(col_items, col_combine, info[_COL_SLOTS]) if with_csc else None,
        chunk, bool(long_first), info[_MAX_IN], info[_MAX_OUT], extent,
        default and chunk_for(info[_NUM_EDGES]) != chunk)
