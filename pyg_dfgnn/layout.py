"""GraphLayout: the sparse formats the fused kernels read, built once per graph.

PyG's flow is ``source_to_target``: messages go from ``edge_index[0]`` (src) to
``edge_index[1]`` (dst) and the edge softmax runs over the in-edges of each dst
node. The kernels therefore walk

* **CSR by destination** (``rowptr`` ``[N_dst + 1]``, ``col`` ``[E]`` = src of each
  edge) in the forward pass and for dQ in the backward pass, and
* **CSC by source** (``colptr`` ``[N_src + 1]``, ``row`` ``[E]`` = dst of each edge,
  ``perm`` ``[E]`` = CSR position of each CSC edge) for dK/dV, so the backward needs
  no atomics (paper Appendix B, Fig. 8).

``edge_perm`` maps CSR positions back to the input edge order, so per-edge outputs
(attention weights) are returned in the order the user gave.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ._ext import HAS_EXTENSION

#: Number of GraphLayout builds in this process (tests use it to check caching).
BUILD_COUNT = 0

_INT32_MAX = 2**31 - 1


def _rowptr_from_sorted(index: Tensor, num_rows: int, dtype: torch.dtype) -> Tensor:
    """``rowptr[r]`` = number of entries of the sorted ``index`` that are ``< r``."""
    if index.is_cuda and HAS_EXTENSION and dtype == torch.int32:
        return torch.ops.dfgnn.csr_rowptr(index, num_rows)
    return torch._convert_indices_from_coo_to_csr(index, num_rows,
                                                  out_int32=dtype == torch.int32)


class GraphLayout:
    r"""CSR/CSC layout of a graph with ``N_src`` source and ``N_dst`` destination
    nodes, as read by the fused attention kernels.

    Build it with :meth:`from_adj` (any PyG adjacency type) or let the layers do it
    through :func:`get_layout`, which caches it on the adjacency object.

    Attributes:
        rowptr (Tensor): ``[N_dst + 1]``, CSR row pointer over destination nodes.
        col (Tensor): ``[E]``, source node of each edge, in CSR order.
        edge_perm (Tensor): ``[E]`` int64, input edge id of each CSR position.
        edge_index (Tensor): ``[2, E]`` int64, the edges in input order (with the
            self-loops this layout added, if any), as PyG layers return them with
            attention weights.
        num_src, num_dst (int): node counts (equal unless the graph is bipartite).
        max_in_degree (int), mean_in_degree (float): in-degree statistics used by
            :mod:`pyg_dfgnn.ops.schedule`.
        colptr, row, perm (Tensor): CSC by source (built on first use):
            ``[N_src + 1]``, ``[E]`` dst of each CSC edge, ``[E]`` CSR position of each
            CSC edge.

    Index tensors are int32 when every index and ``E`` fit, else int64.
    """

    def __init__(self, rowptr: Tensor, col: Tensor, edge_perm: Tensor, edge_index: Tensor,
                 num_src: int, num_dst: int, max_in_degree: int, self_loops: bool = False):
        self.rowptr = rowptr
        self.col = col
        self.edge_perm = edge_perm
        self.edge_index = edge_index
        self.num_src = int(num_src)
        self.num_dst = int(num_dst)
        self.num_edges = int(col.numel())
        self.max_in_degree = int(max_in_degree)
        self.mean_in_degree = self.num_edges / max(self.num_dst, 1)
        self.self_loops = self_loops
        # The fused ops' per-call check compares this with the features' device
        # (cheaper than col.device); a mismatch falls back to the full check
        # against `device`, so a stale copy (say, after unpickling elsewhere) only
        # costs time.
        self._device = col.device
        self._csc: Optional[Tuple[Tensor, Tensor, Tensor]] = None
        self._cache: dict = {}  # derived data the kernels reuse (row of each CSR edge, splits)

    # ------------------------------------------------------------------ build
    @classmethod
    def from_edge_index(cls, edge_index: Tensor, size: Optional[Tuple[int, int]] = None,
                        add_self_loops: bool = False, with_csc: bool = True) -> "GraphLayout":
        r"""Builds the layout from a ``[2, E]`` COO ``edge_index`` (src, dst).

        Args:
            edge_index (Tensor): ``[2, E]`` integer tensor.
            size ((int, int), optional): ``(N_src, N_dst)``; inferred as
                ``max index + 1`` (same for both) when not given.
            add_self_loops (bool): remove existing self-loops and append one loop
                per node ``0 .. min(N_src, N_dst) - 1``, exactly as
                :class:`~torch_geometric.nn.conv.GATConv` does in every forward.
            with_csc (bool): also build the CSC and the kernels' work items now
                (needed for the backward; building everything up front keeps
                ``torch.compile`` regions free of data-dependent sizes).

        Raises:
            ValueError: for a malformed ``edge_index`` or indices out of range.
        """
        global BUILD_COUNT
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must be a [2, E] tensor, got "
                             f"{tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index)}")
        if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
            raise ValueError(f"edge_index must be an integer tensor, got {edge_index.dtype}")
        # detach() first: a plain as_subclass() alias keeps a hidden reference to
        # the input, and the input caches this layout (get_layout), a cycle the
        # garbage collector cannot see: every batch's graph leaked (e2e, GT model).
        edge_index = edge_index.detach().as_subclass(Tensor).long()
        if size is None:
            n = int(edge_index.max()) + 1 if edge_index.numel() > 0 else 0
            size = (n, n)
        num_src, num_dst = int(size[0]), int(size[1])
        if edge_index.numel() > 0:
            lo, hi = torch.aminmax(edge_index, dim=1)
            lo, hi = lo.tolist(), hi.tolist()
            if min(lo) < 0 or hi[0] >= num_src or hi[1] >= num_dst:
                raise LayoutIndexError(f"edge_index out of range: src in [{lo[0]}, {hi[0]}] for "
                                       f"N_src={num_src}, dst in [{lo[1]}, {hi[1]}] for "
                                       f"N_dst={num_dst}")
        if add_self_loops:
            from torch_geometric.utils import add_self_loops as _add, remove_self_loops
            edge_index, _ = remove_self_loops(edge_index)
            edge_index, _ = _add(edge_index, num_nodes=min(num_src, num_dst))
        src, dst = edge_index[0], edge_index[1]
        E = src.numel()
        idx_dtype = torch.int32 if max(E, num_src, num_dst) <= _INT32_MAX else torch.int64
        dst_sorted, edge_perm = torch.sort(dst, stable=True)
        col = src[edge_perm].to(idx_dtype)
        rowptr = _rowptr_from_sorted(dst_sorted.to(idx_dtype), num_dst, idx_dtype)
        max_deg = int((rowptr[1:] - rowptr[:-1]).max()) if num_dst > 0 and E > 0 else 0
        BUILD_COUNT += 1
        layout = cls(rowptr, col, edge_perm, edge_index, num_src, num_dst, max_deg, add_self_loops)
        layout.prepare(with_csc)
        return layout

    @classmethod
    def from_adj(cls, adj, size: Optional[Tuple[int, int]] = None,
                 add_self_loops: bool = False, with_csc: bool = True) -> "GraphLayout":
        r"""Builds the layout from any PyG adjacency type.

        Args:
            adj: a ``[2, E]`` ``edge_index`` tensor, a PyG ``EdgeIndex``, a
                ``torch_sparse.SparseTensor`` or a ``torch.sparse`` COO/CSR/CSC
                matrix. As in PyG, sparse matrices are ``adj_t``: rows are
                destinations, columns are sources.
            size ((int, int), optional): ``(N_src, N_dst)`` for ``edge_index``
                inputs (sparse matrices carry their own size).
            add_self_loops, with_csc (bool): see :meth:`from_edge_index`.
        """
        from torch_geometric.typing import SparseTensor
        if isinstance(adj, SparseTensor):
            row, col, _ = adj.coo()  # row = dst, col = src
            size = (adj.size(1), adj.size(0))
            return cls.from_edge_index(torch.stack([col, row]), size, add_self_loops, with_csc)
        if isinstance(adj, Tensor) and adj.layout != torch.strided:
            size = (adj.size(1), adj.size(0))
            if adj.layout == torch.sparse_csr:
                rowptr, col = adj.crow_indices(), adj.col_indices()
                dst = torch._convert_indices_from_csr_to_coo(rowptr, col)[0]
                ei = torch.stack([col.long(), dst.long()])
            else:  # COO, entries as stored (PyG's propagate keeps duplicates too)
                coo = adj if adj.layout == torch.sparse_coo else adj.to_sparse_coo()
                ei = coo._indices().flip(0)
            return cls.from_edge_index(ei, size, add_self_loops, with_csc)
        if size is None and hasattr(adj, "sparse_size"):  # PyG EdgeIndex
            s = adj.sparse_size()
            if s[0] is not None and s[1] is not None:
                size = (int(s[0]), int(s[1]))
        return cls.from_edge_index(adj, size, add_self_loops, with_csc)

    # ------------------------------------------------------------------ derived
    def prepare(self, with_csc: bool = True) -> "GraphLayout":
        """Builds now what the kernels read lazily: the CSR work items and, with
        ``with_csc``, the CSC and its work items (paper Table 2's "preprocess")."""
        from .ops import schedule
        chunk = schedule.choose_chunk(self)
        schedule.row_work(self, chunk)
        if with_csc:
            schedule.col_work(self, chunk)
        return self

    @property
    def device(self) -> torch.device:
        return self.col.device

    def _build_csc(self):
        perm = torch.sort(self.col, stable=True).indices
        row = self.csr_row[perm]
        colptr = _rowptr_from_sorted(self.col[perm], self.num_src, self.col.dtype)
        self._csc = (colptr, row, perm.to(self.col.dtype))

    @property
    def csr_row(self) -> Tensor:
        """``[E]`` destination node of each CSR edge (for edge-parallel kernels)."""
        r = self._cache.get("csr_row")
        if r is None:
            r = self.edge_index[1][self.edge_perm].to(self.col.dtype)
            self._cache["csr_row"] = r
        return r

    @property
    def colptr(self) -> Tensor:
        if self._csc is None:
            self._build_csc()
        return self._csc[0]

    @property
    def row(self) -> Tensor:
        if self._csc is None:
            self._build_csc()
        return self._csc[1]

    @property
    def perm(self) -> Tensor:
        if self._csc is None:
            self._build_csc()
        return self._csc[2]

    @property
    def max_out_degree(self) -> int:
        """Largest out-degree (over source nodes)."""
        if "max_out_degree" not in self._cache:
            colptr = self.colptr
            self._cache["max_out_degree"] = (int((colptr[1:] - colptr[:-1]).max())
                                             if self.num_src > 0 and self.num_edges else 0)
        return self._cache["max_out_degree"]

    def in_degree(self) -> Tensor:
        """``[N_dst]`` in-degree of each destination node."""
        return (self.rowptr[1:] - self.rowptr[:-1]).long()

    def to_input_order(self, edge_values: Tensor) -> Tensor:
        """Reorders ``[E, ...]`` per-edge values from CSR order to input edge order."""
        out = torch.empty_like(edge_values)
        out[self.edge_perm] = edge_values
        return out

    # ------------------------------------------------------------------ moves
    def to(self, device, *args, **kwargs) -> "GraphLayout":
        """Moves every tensor (PyG's ``Data.to`` calls this for stored layouts)."""
        if isinstance(device, torch.dtype):  # Data.to(dtype) must not touch indices
            return self
        device = torch.device(device)
        here = self.device
        if device.type == here.type and (device.index is None or device.index == here.index):
            return self
        new = GraphLayout(self.rowptr.to(device), self.col.to(device), self.edge_perm.to(device),
                          self.edge_index.to(device), self.num_src, self.num_dst,
                          self.max_in_degree, self.self_loops)
        if self._csc is not None:
            new._csc = tuple(t.to(device) for t in self._csc)
        for key, val in self._cache.items():  # work items, csr_row, degree statistics
            if isinstance(key, tuple) and key[0] == "op_args":
                continue  # tuples of the tensors above, rebuilt on the first call
            new._cache[key] = (tuple(t.to(device) if isinstance(t, Tensor) else t for t in val)
                               if isinstance(val, tuple) else
                               val.to(device) if isinstance(val, Tensor) else val)
        return new

    def cuda(self, device=None, *args, **kwargs) -> "GraphLayout":
        return self.to(torch.device("cuda") if device is None else device)

    def cpu(self) -> "GraphLayout":
        return self.to("cpu")

    def __repr__(self) -> str:
        return (f"GraphLayout(num_src={self.num_src}, num_dst={self.num_dst}, "
                f"num_edges={self.num_edges}, max_in_degree={self.max_in_degree}, "
                f"mean_in_degree={self.mean_in_degree:.2f}, self_loops={self.self_loops}, "
                f"index={self.col.dtype}, device={self.device})")


# ---------------------------------------------------------------------------- cache
# The layout cache and its validity contract are described in docs/layout_cache.md.

_ATTR = "_dfgnn_layouts"


class LayoutIndexError(IndexError, ValueError):
    """An ``edge_index`` entry is negative or not below the node count. An
    :class:`IndexError` as PyG raises it, and a :class:`ValueError` for callers
    that caught the earlier type."""


class StaleLayoutError(RuntimeError):
    """A compiled region was about to use a cached layout whose ``edge_index`` has
    changed since the layout was built (a compiled graph cannot rebuild it)."""


def _index_parts(adj) -> Optional[Tuple[Tensor, ...]]:
    """The index tensors that define ``adj``'s edges, or ``None`` for objects whose
    edges cannot be identified (those are not cached)."""
    if isinstance(adj, Tensor):
        if adj.layout == torch.strided:
            return (adj,)
        if adj.layout == torch.sparse_coo:
            return (adj._indices(),)
        if adj.layout == torch.sparse_csr:
            return (adj.crow_indices(), adj.col_indices())
        return None
    storage = getattr(adj, "storage", None)  # torch_sparse.SparseTensor
    if storage is not None and hasattr(storage, "_col"):
        return tuple(t for t in (storage._row, storage._rowptr, storage._col) if t is not None)
    return None


def _plain(t: Tensor) -> Tensor:
    """The plain tensor holding ``t``'s values (``EdgeIndex`` wraps one)."""
    return t if type(t) is Tensor else t.as_tensor() if hasattr(t, "as_tensor") else t


def _stamp(parts: Tuple[Tensor, ...]) -> list:
    """Identity of the index tensors: version counter (``-1`` for inference
    tensors, which have none), data pointer, storage offset, shape and strides.
    An ``EdgeIndex`` adds the version of the tensor it wraps: an edit through
    either one bumps only its own counter."""
    out = []
    for t in parts:
        v = _plain(t)
        inner = -1 if v is t or v.is_inference() else v._version
        out += (-1 if t.is_inference() else t._version, inner, v.data_ptr(),
                v.storage_offset(), v.dim(), *v.shape, *v.stride())
    return out


def _content_checked(parts: Tuple[Tensor, ...]) -> bool:
    """Whether validity is decided by comparing contents: on the CPU (a compare
    without a device sync, cheap next to the CPU attention, and it sees writes that
    bypass the version counter) and for inference tensors (no version counter)."""
    return any(t.device.type == "cpu" or t.is_inference() for t in parts)


def _matches(parts: Tuple[Tensor, ...], stamp: list, snapshot: Tuple[Tensor, ...]) -> bool:
    """Whether index tensors ``parts`` still describe the graph a layout was built
    from (``stamp`` and ``snapshot`` taken at build time)."""
    if not snapshot:
        return _stamp(parts) == stamp
    if len(parts) != len(snapshot):
        return False
    for t, s in zip(parts, snapshot):
        v = _plain(t)
        if v.shape != s.shape or v.device != s.device:
            return False
        if v.device.type == "cpu":
            import numpy as np
            if not np.array_equal(v.numpy(), s.numpy()):
                return False
        elif v.is_cuda and torch.cuda.is_current_stream_capturing():
            # No sync inside a capture: identity only (inference tensors).
            return _stamp(parts) == stamp
        elif not torch.equal(v, s):
            return False
    return True


class _LayoutCache:
    """The layouts cached on one adjacency object, with what identifies its graph."""

    def __init__(self, parts: Tuple[Tensor, ...]):
        self.stamp = _stamp(parts)
        with torch.inference_mode(False):
            # The compiled check reads the stamp as a tensor: torch.compile lifts
            # tensors reachable from its inputs as graph inputs, whereas Python ints
            # would be guarded as constants (a recompile for each new edge_index).
            self.stamp_tensor = torch.tensor(self.stamp, dtype=torch.int64)
            self.snapshot = (tuple(_plain(t).detach().clone() for t in parts)
                             if _content_checked(parts) else ())
        # The common case, a plain edge_index on the GPU, compares one tuple: the
        # lookup runs in every layer's host path.
        self.plain = (_plain_key(parts[0]) if len(parts) == 1 and type(parts[0]) is Tensor
                      and not self.snapshot else None)
        self.layouts: dict = {}

    def matches(self, adj) -> bool:
        if self.plain is not None and type(adj) is Tensor:
            try:
                return _plain_key(adj) == self.plain
            except RuntimeError:  # no version counter any more (inference data)
                return False
        parts = _index_parts(adj)
        return parts is not None and _matches(parts, self.stamp, self.snapshot)


def _plain_key(t: Tensor) -> tuple:
    """:func:`_stamp` of one plain strided tensor, as a tuple."""
    return (t._version, t.data_ptr(), t.storage_offset(), t.shape, t.stride())


def _check_layout(index: Tuple[Tensor, ...], stamp: Tensor,
                  snapshot: Tuple[Tensor, ...]) -> None:
    # Runs each time a compiled graph runs (the op is opaque to the compiler), so an
    # edit of edge_index between calls is seen although the layout is a constant of
    # the compiled code.
    if not _matches(tuple(index), stamp.tolist(), tuple(snapshot)):
        raise StaleLayoutError(
            "pyg_dfgnn: edge_index changed since its GraphLayout was cached (in-place "
            "edit), and a compiled model cannot rebuild the layout. Pass a new edge_index "
            "tensor, or call pyg_dfgnn.layout.invalidate(edge_index) and run the model "
            "once eagerly (or apply CacheLayout) before the next compiled call.")


# A plain torch.library op rather than torch.library.custom_op: a third of the
# per-call cost (about 6 us against 20 us on the CPU), and it runs once per layer
# and compiled call. cudagraph_unsafe keeps it out of CUDA graphs that
# torch.compile captures (mode="reduce-overhead"), so it still runs on each call.
_LIB = torch.library.Library("pyg_dfgnn", "DEF")
_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()
_LIB.define("check_layout(Tensor[] index, Tensor stamp, Tensor[] snapshot) -> ()", tags=_TAGS)
_LIB.impl("check_layout", _check_layout, "CompositeExplicitAutograd")


@torch.library.register_fake("pyg_dfgnn::check_layout", lib=_LIB)
def _check_layout_fake(index, stamp, snapshot) -> None:
    return None


# An op without outputs would be removed as dead code otherwise.
torch.fx.node.has_side_effect(torch.ops.pyg_dfgnn.check_layout.default)


def _key(size, add_self_loops: bool):
    return (None if size is None else (int(size[0]), int(size[1])), bool(add_self_loops))


def _store(adj, key, layout: GraphLayout) -> None:
    parts = _index_parts(adj)
    if parts is None:
        return
    cache = getattr(adj, _ATTR, None)
    if not isinstance(cache, _LayoutCache) or not cache.matches(adj):
        cache = _LayoutCache(parts)
        try:
            setattr(adj, _ATTR, cache)
        except (AttributeError, TypeError):  # an object that takes no attributes
            return
    cache.layouts[key] = layout


def _merged(adj: Tensor) -> Tensor:
    """``adj`` (torch.sparse COO or CSR) as a COO matrix with duplicate entries
    merged, whatever its ``is_coalesced`` flag says (PyG sets the flag on an input
    without merging it)."""
    coo = adj if adj.layout == torch.sparse_coo else adj.to_sparse_coo()
    idx = coo._indices()
    ones = torch.ones(idx.size(1), device=idx.device)
    return torch.sparse_coo_tensor(idx, ones, coo.shape[:2]).coalesce()


def _build(adj, size, add_self_loops: bool) -> GraphLayout:
    # Plain (not inference) tensors, so a layout built under inference_mode also
    # serves later training steps (autograd saves its index tensors).
    with torch.inference_mode(False):
        src = adj
        if (add_self_loops and isinstance(adj, Tensor)
                and adj.layout in (torch.sparse_coo, torch.sparse_csr)):
            # PyG's add_self_loops rebuilds a torch.sparse matrix coalesced: the
            # layer then sees its duplicate entries merged.
            src = _merged(adj)
        layout = GraphLayout.from_adj(src, size, add_self_loops)
    _store(adj, _key(size, add_self_loops), layout)
    return layout


_MISS_UNDER_COMPILE = (
    "pyg_dfgnn: no GraphLayout is cached for this edge_index, and building one inside "
    "a compiled region needs data-dependent sizes. Apply "
    "pyg_dfgnn.transforms.CacheLayout to the data, or call the model once eagerly on "
    "the same edge_index, before the compiled call (without fullgraph=True the layout "
    "is built eagerly at a graph break).")
try:
    _build_outside_graph = torch.compiler.disable(_build, reason=_MISS_UNDER_COMPILE)
except TypeError:  # torch without the reason argument
    _build_outside_graph = torch.compiler.disable(_build)


def get_layout(adj: Union[Tensor, "object"], size: Optional[Tuple[int, int]] = None,
               add_self_loops: bool = False) -> GraphLayout:
    r"""Returns the :class:`GraphLayout` of ``adj``, building it at most once.

    The layout is cached on the adjacency object itself (``edge_index`` tensor,
    ``EdgeIndex``, ``SparseTensor`` or ``torch.sparse`` matrix), keyed by size and
    self-loop handling, so the layers of a model that receive the same
    ``edge_index`` share one build. :class:`pyg_dfgnn.transforms.CacheLayout` fills
    the same cache ahead of time.

    A cached layout is used only while the object still holds the same edges
    (docs/layout_cache.md): on the CPU and for inference tensors its contents are
    compared with a private copy; on other devices its version counter, data
    pointer, storage offset, shape and strides must be unchanged. Writes that
    bypass the version counter of a GPU tensor (``.data``, DLPack) need
    :func:`invalidate`. Inside ``torch.compile`` the same check runs each time the
    compiled code runs.

    Raises:
        StaleLayoutError: in a compiled region, ``edge_index`` was edited in place
            after its layout was cached.
        torch._dynamo.exc.Unsupported: inside ``torch.compile(fullgraph=True)`` when
            no layout is cached yet (the message says what to do); without
            ``fullgraph`` the layout is built at a graph break.
        LayoutIndexError: indices out of range (an ``IndexError``).
        ValueError: a malformed ``edge_index``.
    """
    key = _key(size, add_self_loops)
    cache = getattr(adj, _ATTR, None)
    if torch.compiler.is_compiling():
        layout = cache.layouts.get(key) if isinstance(cache, _LayoutCache) else None
        if layout is None:
            return _build_outside_graph(adj, size, add_self_loops)
        torch.ops.pyg_dfgnn.check_layout.default(list(_index_parts(adj)), cache.stamp_tensor,
                                                 list(cache.snapshot))
        return layout
    if type(cache) is _LayoutCache:
        layout = cache.layouts.get(key)
        if layout is not None and cache.matches(adj):
            return layout
    return _build(adj, size, add_self_loops)


def attach_layout(adj, layout: GraphLayout, size=None, add_self_loops: bool = False) -> None:
    """Stores ``layout`` in ``adj``'s cache (used by :class:`~pyg_dfgnn.transforms.CacheLayout`).
    The caller vouches that ``layout`` was built from ``adj``'s current edges."""
    _store(adj, _key(size, add_self_loops), layout)


def invalidate(adj) -> None:
    """Drops every layout cached on ``adj``: the next fused call rebuilds it. Needed
    only after writes that bypass the version counter of a GPU tensor (``.data``,
    DLPack, a custom kernel); see docs/layout_cache.md."""
    if getattr(adj, _ATTR, None) is not None:
        delattr(adj, _ATTR)
