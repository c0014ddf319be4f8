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

import itertools
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import edge_order, layout_build
from .layout_build import LayoutIndexError, out_of_range  # noqa: F401  (re-export)
from .derived import Derived
from .node_order import ITEM_ORDERS, degree_rank, rcm_rank
from .work_items import Work, chunk_for, order_items, split_work, work_items, work_stats


#: Number of GraphLayout builds (:meth:`~GraphLayout.narrow` included) in this
#: process (tests use it to check caching).
BUILD_COUNT = 0

_INT32_MAX = 2**31 - 1

# handle id -> layout, for the calls compiled code makes (pyg_dfgnn.ops.calls.resolve,
# pyg_dfgnn.ops.compiled): they receive a layout's `handle` tensor, not the layout. Weak values: the
# registry never keeps a layout alive.
_BY_HANDLE: "weakref.WeakValueDictionary[int, GraphLayout]" = weakref.WeakValueDictionary()
_HANDLE_IDS = itertools.count(1)


def layout_of(handle_id: int) -> "GraphLayout":
    """The live :class:`GraphLayout` whose ``handle`` holds ``handle_id``.

    Raises:
        LookupError: no live layout has that handle.
    """
    layout = _BY_HANDLE.get(int(handle_id))
    if layout is None:
        raise LookupError(f"pyg_dfgnn: no live GraphLayout has handle {int(handle_id)} (the "
                          "layout was freed, or the handle came from another process)")
    return layout


class GraphLayout:
    r"""CSR/CSC layout of a graph with ``N_src`` source and ``N_dst`` destination
    nodes, as read by the fused attention kernels.

    Build it with :meth:`from_adj` (any PyG adjacency type) or let the layers do it
    through :func:`get_layout`, which caches it on the adjacency object.

    Attributes:
        rowptr (Tensor): ``[N_dst + 1]``, CSR row pointer over destination nodes.
        col (Tensor): ``[E]``, source node of each edge, in CSR order.
        csr_row (Tensor): ``[E]``, destination node of each edge, in CSR order.
        edge_perm (Tensor): ``[E]`` int64, input edge id of each CSR position
            (built on first use where it is the identity).
        edge_index (Tensor): ``[2, E]`` int64, the edges in input order (with the
            self-loops this layout added, if any), as PyG layers return them with
            attention weights (built on first use).
        num_src, num_dst (int): node counts (equal unless the graph is bipartite).
        max_in_degree (int), mean_in_degree (float): in-degree statistics used by
            the kernel plan (:mod:`pyg_dfgnn.ops.plan`).
        dst_extent (int): destinations at or past this index have no in-edge
            (``1 +`` the largest destination index where the build saw it, else
            ``num_dst``). In a ``NeighborLoader`` batch the last hop's nodes come
            last and have no in-edge, so a layer needs their queries not at all.
        colptr, row, perm (Tensor): CSC by source (built with the layout unless
            ``with_csc=False``, then on first use): ``[N_src + 1]``, ``[E]`` dst of
            each CSC edge, ``[E]`` CSR position of each CSC edge.
        derived (Derived): what the kernels derive from the graph and reuse
            (work items, tile plan, kernel plans; :mod:`pyg_dfgnn.derived`).
        handle (Tensor): ``[1]`` int64 on the CPU, this layout's id for the ops
            compiled code calls (:func:`layout_of` finds the layout); every layout,
            copy and move has its own.

    Index tensors are int32 when every index and ``E`` fit, else int64.
    """

    def __init__(self, rowptr: Tensor, col: Tensor, edge_perm: Optional[Tensor],
                 edge_index: Optional[Tensor], num_src: int, num_dst: int, max_in_degree: int,
                 self_loops: bool = False, csr_row: Optional[Tensor] = None,
                 dst_extent: Optional[int] = None):
        self.rowptr = rowptr
        self.col = col
        self._edge_perm = edge_perm  # None: the identity (input grouped by destination)
        self._edge_index = edge_index
        self._csr_row = csr_row
        self.num_src = int(num_src)
        self.num_dst = int(num_dst)
        self.num_edges = int(col.numel())
        self.max_in_degree = int(max_in_degree)
        self.dst_extent = (self.num_dst if dst_extent is None
                           else max(0, min(int(dst_extent), self.num_dst)))
        self.mean_in_degree = self.num_edges / max(self.num_dst, 1)
        self.self_loops = self_loops
        # The fused ops' per-call check compares this with the features' device
        # (cheaper than col.device); a mismatch falls back to the full check
        # against `device`, so a stale copy (say, after unpickling elsewhere) only
        # costs time.
        self._device = col.device
        self._csc: Optional[Tuple[Tensor, Tensor, Tensor]] = None
        self.derived = Derived()
        self._register()

    def _register(self) -> None:
        # A CPU int64 [1] tensor naming this layout in the registry: under
        # torch.compile it is a graph input read from the layout on each call, so
        # a new graph is a new input value, where the layout's Python ints would
        # be guarded constants (docs/layout_cache.md, "torch.compile").
        handle_id = next(_HANDLE_IDS)
        with torch.inference_mode(False):  # saved for backward by compiled code
            self.handle = torch.tensor([handle_id], dtype=torch.int64)
        _BY_HANDLE[handle_id] = self

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["handle"]  # a copy (pickle, copy, deepcopy) gets a handle of its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("dst_extent", self.num_dst)  # pickled before it existed
        self._register()

    # ------------------------------------------------------------------ build
    @classmethod
    def from_edge_index(cls, edge_index: Tensor, size: Optional[Tuple[int, int]] = None,
                        add_self_loops: bool = False, with_csc: bool = True,
                        kernel: bool = True) -> "GraphLayout":
        r"""Builds the layout from a ``[2, E]`` COO ``edge_index`` (src, dst).

        Edges keep their multiplicity (duplicates are separate edges, as in PyG's
        ``propagate``) and, within a destination row, their input order. The build
        takes one host synchronisation (two when ``size`` is inferred): degrees,
        work-item counts and the index bounds are computed on the device and read
        together. Input already grouped by destination (as PyG's neighbour
        samplers emit it) skips the sort by destination.

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
            kernel (bool): on a GPU, build with the layout-build kernels
                (:mod:`pyg_dfgnn.layout_build`) where they apply; ``False`` runs the
                torch ops (the reference; benchmarks compare the two).

        Raises:
            ValueError: for a malformed ``edge_index`` or indices out of range.
        """
        global BUILD_COUNT
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must be a [2, E] tensor, got "
                             f"{tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index)}")
        dtype = edge_index.dtype
        if dtype.is_floating_point or dtype == torch.bool:
            raise ValueError(f"edge_index must be an integer tensor, got {dtype}")
        sorted_by_dst = False
        if type(edge_index) is not Tensor:  # a subclass, such as PyG's EdgeIndex
            order = getattr(edge_index, "_sort_order", None)
            sorted_by_dst = order is not None and str(order).lower().endswith("col")
            # detach() first: a plain as_subclass() alias keeps a hidden reference
            # to the input, and the input caches this layout (get_layout), a cycle
            # the garbage collector cannot see: every batch's graph would leak. A
            # plain tensor needs neither: no build keeps its input.
            edge_index = edge_index.detach().as_subclass(Tensor)
        if dtype not in layout_build.INDEX_DTYPES:
            edge_index = edge_index.long()
        if size is None:
            n = int(edge_index.max()) + 1 if edge_index.numel() > 0 else 0
            size = (n, n)
        layout = _build(edge_index, int(size[0]), int(size[1]), bool(add_self_loops),
                        with_csc, sorted_by_dst or None, kernel)
        BUILD_COUNT += 1
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

    def narrow(self, edge_index: Tensor, size: Tuple[int, int],
               with_csc: bool = True) -> Optional["GraphLayout"]:
        r"""The layout of a prefix of this graph, as PyG's
        :func:`~torch_geometric.utils.trim_to_layer` makes one for a deeper layer:
        ``edge_index`` holds the first ``E_k`` input edges, ``size`` =
        ``(N_src_k, N_dst_k)`` node prefixes, same self-loop handling.

        It serves when those edges lead this layout's CSR (their destinations
        come first, as in NeighborLoader batches, where they are the first hops'
        edges) with sources below ``N_src_k``, and without self-loops added
        (added loops of the rows the prefix leaves without edges sit between the
        parent's edges). Then the CSR is a view of this one's and only the CSC
        and the work items are built, with one host synchronisation, which also
        checks that the prefix serves.

        Returns:
            the :class:`GraphLayout` :meth:`from_edge_index` would build for
            ``edge_index`` and ``size``, or ``None`` where the prefix does not
            serve (build that one instead; a prefix of edges grouped by
            destination skips the sort there too).
        """
        global BUILD_COUNT
        layout = _narrow(self, edge_index, int(size[0]), int(size[1]), with_csc)
        BUILD_COUNT += layout is not None
        return layout

    # ------------------------------------------------------------------ derived
    def prepare(self, with_csc: bool = True) -> "GraphLayout":
        """Builds now what the kernels read lazily: the CSR work items and, with
        ``with_csc``, the CSC and its work items (paper Table 2's "preprocess"),
        for the default chunk (:func:`~pyg_dfgnn.work_items.chunk_for`)."""
        chunk = chunk_for(self.num_edges)
        self.work("row", chunk)
        if with_csc:
            self.work("col", chunk)
        return self

    def work(self, kind: str, chunk: int, long_first: bool = True, order: str = "row") -> Work:
        r"""Work items of the CSR (``kind="row"``, by destination) or the CSC
        (``"col"``, by source, for dK / dV) at ``chunk`` edges per item
        (:func:`~pyg_dfgnn.work_items.split_work`), scheduled in ``order``
        (:data:`~pyg_dfgnn.node_order.ITEM_ORDERS`; other than ``"row"``: the
        ``"row"`` items permuted by :func:`~pyg_dfgnn.work_items.order_items`
        with :meth:`node_rank`), built on first use and kept in :attr:`derived`.

        Raises:
            ValueError: ``kind`` is neither ``"row"`` nor ``"col"``, or an
                unknown ``order``.
        """
        key = (kind, chunk, long_first, order)
        w = self.derived.work.get(key)
        if w is None:
            if kind not in ("row", "col"):
                raise ValueError(f"kind must be 'row' or 'col', got {kind!r}")
            if order not in ITEM_ORDERS:
                raise ValueError(f"order must be one of {ITEM_ORDERS}, got {order!r}")
            ptr = self.rowptr if kind == "row" else self.colptr
            if order == "row":
                w = split_work(ptr, chunk, long_first)
            else:
                w = order_items(self.work(kind, chunk, long_first), ptr,
                                self.node_rank(order, kind), chunk, long_first)
            self.derived.work[key] = w
        return w

    def node_rank(self, order: str, kind: str) -> Tensor:
        r"""int64 ``[N]`` rank of each destination (``kind="row"``) or source
        (``"col"``) node in ``order`` (``"rcm"`` or ``"degree"``,
        :mod:`pyg_dfgnn.node_order`), computed once and kept in :attr:`derived`.
        ``"rcm"`` runs on the host (one copy of the CSR there).

        Raises:
            ValueError: an unknown ``order`` or ``kind``.
        """
        ranks = self.derived.node_rank
        key = (order, kind)
        r = ranks.get(key)
        if r is not None:
            return r
        if kind not in ("row", "col"):
            raise ValueError(f"kind must be 'row' or 'col', got {kind!r}")
        if order == "rcm":
            ranks[("rcm", "row")], ranks[("rcm", "col")] = rcm_rank(
                self.rowptr, self.col, self.num_src, self.num_dst)
        elif order == "degree":
            ranks[key] = degree_rank(self.rowptr if kind == "row" else self.colptr)
        else:
            raise ValueError(f"order must be 'rcm' or 'degree', got {order!r}")
        return ranks[key]

    @property
    def device(self) -> torch.device:
        return self.col.device

    def _build_csc(self):
        colptr = torch.zeros(self.num_src + 1, dtype=self.col.dtype, device=self.col.device)
        colptr[1:].index_add_(0, self.col, torch.ones_like(self.col))
        self._csc = _csc(self.col, self.csr_row, colptr.cumsum_(0))

    @property
    def csr_row(self) -> Tensor:
        """``[E]`` destination node of each CSR edge (for edge-parallel kernels)."""
        if self._csr_row is None:
            self._csr_row = torch.repeat_interleave(
                torch.arange(self.num_dst, dtype=self.col.dtype, device=self.col.device),
                self.rowptr[1:] - self.rowptr[:-1], output_size=self.num_edges)
        return self._csr_row

    @property
    def edge_perm(self) -> Tensor:
        if self._edge_perm is None:
            self._edge_perm = torch.arange(self.num_edges, device=self.col.device)
        return self._edge_perm

    @property
    def edge_index(self) -> Tensor:
        """``[2, E]`` int64 edges in input order (self-loops appended, if added)."""
        if self._edge_index is None:
            csr = torch.stack([self.col, self.csr_row]).long()
            if self._edge_perm is None:
                self._edge_index = csr
            else:
                ei = torch.empty_like(csr)
                self._edge_index = ei.index_copy_(1, self._edge_perm, csr)
        return self._edge_index

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
        if self.derived.max_out_degree is None:
            colptr = self.colptr
            self.derived.max_out_degree = (int((colptr[1:] - colptr[:-1]).max())
                                           if self.num_src > 0 and self.num_edges else 0)
        return self.derived.max_out_degree

    def in_degree(self) -> Tensor:
        """``[N_dst]`` in-degree of each destination node."""
        return (self.rowptr[1:] - self.rowptr[:-1]).long()

    def to_input_order(self, edge_values: Tensor) -> Tensor:
        """Reorders ``[E, ...]`` per-edge values from CSR order to input edge order."""
        if self._edge_perm is None:
            return edge_values
        # A scatter by the permutation (pyg_dfgnn.edge_order: faster than a gather)
        return torch.empty_like(edge_values, memory_format=torch.contiguous_format).index_copy_(
            0, self.edge_perm, edge_values)

    def to_csr_order(self, edge_values: Tensor, loops_appended: bool = False) -> Tensor:
        r"""Reorders ``[E, ...]`` per-edge values from input edge order to CSR
        order (the inverse of :meth:`to_input_order`): row ``p`` of the result is
        the input row ``edge_perm[p]``, on CUDA written as a scatter through the
        inverse permutation (:mod:`pyg_dfgnn.edge_order`: a gather is slower), so the
        gradient returns to ``edge_values`` in input order; ``edge_values`` itself
        where the input edges were grouped by destination already.

        Args:
            edge_values (Tensor): ``[E, ...]``, one row per edge of the layout.
            loops_appended (bool): ``edge_values`` are in the order of
                :attr:`edge_index`: on a layout built with ``add_self_loops=True``,
                the input edges without their self-loops, in order, then one row
                per added loop ``0 .. min(N_src, N_dst) - 1``, as PyG's
                ``remove_self_loops`` and ``add_self_loops`` leave edge features
                (``GATConv`` with ``edge_dim``). On a layout without added
                self-loops that is the input order.

        Raises:
            ValueError: the layout added self-loops and ``loops_appended`` is
                ``False`` (those edges have no input row, and the input
                self-loops it removed have no CSR position), or ``edge_values``
                is not on the layout's device or has other than ``E`` rows.
        """
        if self.self_loops and not loops_appended:
            raise ValueError(
                "per-edge values: this layout adds self-loops (add_self_loops=True), which "
                "have no row in the input edge order; build the layout without self-loops, "
                "or pass the values in the order of its edge_index (loops_appended=True)")
        if edge_values.device != self.device:
            raise ValueError(f"per-edge values are on {edge_values.device} but the layout is on "
                             f"{self.device}; move the graph with .to()")
        # Compiled code skips the row count: it reads the layout's Python int E, a
        # guarded constant there (a recompile per graph); the fused op's own check
        # compares it when the op runs.
        if (not torch.compiler.is_compiling()
                and (edge_values.dim() == 0 or edge_values.size(0) != self.num_edges)):
            raise ValueError(f"per-edge values must have one row per edge ({self.num_edges}), "
                             f"got shape {tuple(edge_values.shape)}")
        if self._edge_perm is None:
            return edge_values
        if torch.compiler.is_compiling() or not edge_values.is_cuda:
            # Inductor writes its own gather (the inverse is a layout cache); on
            # the CPU the gather is the faster.
            return edge_values.index_select(0, self._edge_perm)
        pos = self.derived.edge_pos
        if pos is None:
            pos = self.derived.edge_pos = edge_order.inverse(self._edge_perm)
        return edge_order.permute_rows(edge_values, self._edge_perm, pos)

    # ------------------------------------------------------------------ moves
    def to(self, device, *args, **kwargs) -> "GraphLayout":
        """Moves every tensor (PyG's ``Data.to`` calls this for stored layouts)."""
        if isinstance(device, torch.dtype):  # Data.to(dtype) must not touch indices
            return self
        device = torch.device(device)
        here = self.device
        if device.type == here.type and (device.index is None or device.index == here.index):
            return self

        def move(t):
            return None if t is None else t.to(device)

        new = GraphLayout(move(self.rowptr), move(self.col), move(self._edge_perm),
                          move(self._edge_index), self.num_src, self.num_dst,
                          self.max_in_degree, self.self_loops, move(self._csr_row),
                          self.dst_extent)
        if self._csc is not None:
            new._csc = tuple(t.to(device) for t in self._csc)
        new.derived = self.derived.to(device)
        return new

    def record_stream(self, stream) -> None:
        """Marks every GPU tensor of the layout as used on ``stream``
        (:meth:`torch.Tensor.record_stream`): a layout built on one stream and read
        on another keeps its memory until the work queued on ``stream`` when it is
        freed has run. PyG's ``Data.record_stream`` calls this for a stored layout."""
        tensors = (self.rowptr, self.col, self._edge_perm, self._edge_index, self._csr_row,
                   *(self._csc or ()), *self.derived.tensors())
        for t in tensors:
            if t is not None and t.is_cuda:
                t.record_stream(stream)

    def cuda(self, device=None, *args, **kwargs) -> "GraphLayout":
        return self.to(torch.device("cuda") if device is None else device)

    def cpu(self) -> "GraphLayout":
        return self.to("cpu")

    def __repr__(self) -> str:
        return (f"GraphLayout(num_src={self.num_src}, num_dst={self.num_dst}, "
                f"num_edges={self.num_edges}, max_in_degree={self.max_in_degree}, "
                f"mean_in_degree={self.mean_in_degree:.2f}, self_loops={self.self_loops}, "
                f"index={self.col.dtype}, device={self.device})")


# ---------------------------------------------------------------------- the build
def _csc(col: Tensor, csr_row: Tensor, colptr: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """CSC by source: ``(colptr, row, perm)``; ``perm`` is the stable order of the
    CSR positions by source, so each column keeps the CSR order."""
    perm = torch.sort(col, stable=True).indices
    return colptr, csr_row[perm], perm.to(col.dtype)


def gpu_build(ei: Tensor, num_src: int, num_dst: int, loops: bool, with_csc: bool,
              chunk: Optional[int] = None, long_first: bool = True) -> Optional[GraphLayout]:
    r"""The :class:`GraphLayout` of ``ei`` built by the layout-build kernels
    (:func:`pyg_dfgnn.layout_build.build`, same arguments), with its CSC and work
    items cached as the torch build caches them, or ``None`` where the kernels do
    not apply. :func:`_build` takes it first; ``chunk`` and ``long_first`` let the
    tests compare other work items with the torch build's."""
    b = layout_build.build(ei, num_src, num_dst, loops, with_csc, chunk, long_first)
    if b is None:
        return None
    layout = GraphLayout(b.rowptr, b.col, b.edge_perm, None, num_src, num_dst, b.max_in_degree,
                         loops, csr_row=b.csr_row, dst_extent=b.dst_extent)
    if with_csc:
        layout._csc = b.csc
        layout.derived.max_out_degree = b.max_out_degree
    if b.rechunk:
        return layout.prepare(with_csc)
    work = layout.derived.work
    work[("row", b.chunk, b.long_first, "row")] = b.row_work
    if with_csc:
        work[("col", b.chunk, b.long_first, "row")] = b.col_work
    return layout


def _build(ei: Tensor, num_src: int, num_dst: int, loops: bool, with_csc: bool,
           sorted_by_dst: Optional[bool], kernel: bool = True) -> GraphLayout:
    r"""The layout of ``ei`` (``[2, E]`` int32 / int64), its CSC when ``with_csc``,
    and the work items of both, with one host synchronisation.

    Phase 1 (device): the index bounds, the in- and out-degrees (self-loops
    removed and appended by arithmetic: no compaction), the work items each row
    needs, whether the input is grouped by destination; all read by one
    ``tolist()``. Phase 2 (device, sizes known): the CSR (no sort where the input
    is grouped by destination: the CSR position of an edge follows from its rank),
    the CSC (one stable sort by source) and the work items.

    On a GPU (``kernel``) :func:`gpu_build` makes the same layout in a few
    kernels; these torch ops remain the CPU path, the fallback
    and the reference. It checks the input's order itself (``sorted_by_dst`` is
    only a hint here).
    """
    if kernel and ei.is_cuda:
        built = gpu_build(ei, num_src, num_dst, loops, with_csc)
        if built is not None:
            return built
    E0 = ei.size(1)
    dev = ei.device
    n = min(num_src, num_dst) if loops else 0
    if E0 and (num_src == 0 or num_dst == 0):
        lo, hi = torch.aminmax(ei, dim=1)
        raise out_of_range(lo.tolist(), hi.tolist(), num_src, num_dst)
    wd = torch.int32 if max(E0 + n, num_src, num_dst) <= _INT32_MAX else torch.int64
    chunk = chunk_for(E0 + n)  # exact unless existing self-loops are removed
    src, dst = ei[0], ei[1]

    # ---- phase 1: statistics on the device, one synchronisation
    deg = torch.zeros(num_dst + num_src, dtype=wd, device=dev)
    din, dout = deg[:num_dst], deg[num_dst:]
    parts = []
    keep = None
    if E0:
        parts.extend(torch.aminmax(ei, dim=1))
        if loops:
            keep = src != dst
            w = keep.to(wd)
        else:
            w = torch.ones(1, dtype=wd, device=dev).expand(E0)
        # Clamped: an out-of-range index must reach the range check below, not
        # fault inside a scatter first.
        if num_src == num_dst:
            safe_src, safe_dst = ei.clamp(0, num_dst - 1)
        else:
            safe_src, safe_dst = src.clamp(0, num_src - 1), dst.clamp(0, num_dst - 1)
        din.index_add_(0, safe_dst, w)
        dout.index_add_(0, safe_src, w)
    if n:
        if num_src == num_dst:
            deg.add_(1)
        else:
            din[:n].add_(1)
            dout[:n].add_(1)
    extra = work_stats(deg, chunk)
    have_deg = num_dst > 0 and num_src > 0
    if have_deg:
        parts.extend(_count_parts(deg, extra, num_dst, num_src))
    if keep is not None:
        parts.append(keep.sum(0, keepdim=True))
    check_sorted = sorted_by_dst is None and E0 > 1
    if check_sorted:
        parts.append((dst[1:] < dst[:-1]).any(0, keepdim=True))
    vals = torch.cat(parts).tolist() if parts else []  # the build's one synchronisation

    # ---- host: sizes and checks
    if E0:
        lo, hi, vals = vals[0:2], vals[2:4], vals[4:]
        if min(lo) < 0 or hi[0] >= num_src or hi[1] >= num_dst:
            raise out_of_range(lo, hi, num_src, num_dst)
    counts, vals = (vals[:6], vals[6:]) if have_deg else ([0] * 6, vals)
    kept = vals.pop(0) if keep is not None else E0
    unsorted = bool(vals.pop(0)) if check_sorted else not sorted_by_dst and E0 > 1
    E = kept + n
    idx = torch.int32 if max(E, num_src, num_dst) <= _INT32_MAX else torch.int64

    # ---- phase 2: CSR
    rowptr = torch.zeros(num_dst + 1, dtype=idx, device=dev)
    torch.cumsum(din, 0, dtype=idx, out=rowptr[1:])
    if not loops:
        ei_idx = ei.to(idx, copy=True)  # a copy: the layout never aliases the input
        if unsorted:
            csr_row, edge_perm = torch.sort(ei_idx[1], stable=True)
            col = ei_idx[0][edge_perm]
        else:
            col, csr_row = ei_idx[0], ei_idx[1]
            edge_perm = None  # the identity
    else:
        col, csr_row, edge_perm = _csr_with_loops(ei, keep, kept, n, rowptr, idx, unsorted)

    extent = max(hi[1] + 1 if E0 else 0, n)  # removed self-loops only overstate it
    layout = GraphLayout(rowptr, col, edge_perm, None, num_src, num_dst, counts[4], loops,
                         csr_row=csr_row, dst_extent=extent)
    if have_deg:
        layout.derived.max_out_degree = counts[5]
    return _finish(layout, dout, extra, counts, chunk, with_csc)


def _count_parts(deg: Tensor, extra: Tensor, num_dst: int, num_src: int) -> list:
    """Device values the work items and the plan need, for one read: extra items of
    the CSR and of CSR + CSC, split rows of the CSR and of both, the largest in-
    and out-degree."""
    ex_cum = extra.cumsum(0)
    sp_cum = (extra > 0).cumsum(0)
    return [ex_cum.as_strided((2,), (num_src,), num_dst - 1),
            sp_cum.as_strided((2,), (num_src,), num_dst - 1),
            deg[:num_dst].amax(0, keepdim=True), deg[num_dst:].amax(0, keepdim=True)]


def _finish(layout: GraphLayout, dout: Tensor, extra: Tensor, counts: list, chunk: int,
            with_csc: bool) -> GraphLayout:
    """The CSC (when ``with_csc``) and the work items of a layout whose CSR is
    built, from the out-degrees, :func:`~pyg_dfgnn.work_items.work_stats` over
    ``[in-degrees, out-degrees]`` and the :func:`_count_parts` values read."""
    ex_in, ex_all, sp_in, sp_all = counts[:4]
    nd, ns = layout.num_dst, layout.num_src
    same_chunk = chunk_for(layout.num_edges) == chunk
    work = layout.derived.work
    if same_chunk:
        work[("row", chunk, True, "row")] = work_items(layout.rowptr, extra[:nd], nd + ex_in,
                                                       sp_in, chunk)
    if with_csc:
        col = layout.col
        colptr = torch.zeros(ns + 1, dtype=col.dtype, device=col.device)
        torch.cumsum(dout, 0, dtype=col.dtype, out=colptr[1:])
        layout._csc = _csc(col, layout.csr_row, colptr)
        if same_chunk:
            work[("col", chunk, True, "row")] = work_items(
                colptr, extra[nd:], ns + ex_all - ex_in, sp_all - sp_in, chunk)
    if not same_chunk:  # removed self-loops moved E across the chunk threshold
        layout.prepare(with_csc)
    return layout


def _narrow(parent: GraphLayout, edge_index: Tensor, num_src: int, num_dst: int,
            with_csc: bool) -> Optional[GraphLayout]:
    ek = edge_index.size(1)
    if (parent.self_loops or edge_index.dim() != 2 or edge_index.size(0) != 2 or ek == 0
            or ek > parent.num_edges or num_src > parent.num_src or num_dst > parent.num_dst
            or num_src <= 0 or num_dst <= 0 or parent.col.dtype != torch.int32):
        return None
    dev = parent.col.device
    # The prefix's edges lead the CSR; destinations past them keep no in-edge.
    rowptr = parent.rowptr[:num_dst + 1].clamp(max=ek)
    col, edge_perm = parent.col[:ek], parent._edge_perm
    edge_perm = None if edge_perm is None else edge_perm[:ek]
    chunk = chunk_for(ek)
    deg = torch.zeros(num_dst + num_src, dtype=torch.int32, device=dev)
    torch.sub(rowptr[1:], rowptr[:-1], out=deg[:num_dst])
    deg[num_dst:].index_add_(0, col.clamp(max=num_src - 1),
                             torch.ones(1, dtype=torch.int32, device=dev).expand(ek))
    extra = work_stats(deg, chunk)
    max_id = col.new_full((1,), -1) if edge_perm is None else edge_perm.amax(0, keepdim=True)
    vals = torch.cat([parent.rowptr[num_dst:num_dst + 1], max_id,
                      col.amax(0, keepdim=True),
                      *_count_parts(deg, extra, num_dst, num_src)]).tolist()  # one sync
    in_rows, max_id, max_src = vals[:3]
    # Serves iff the first E_k CSR positions are the prefix's edges (ids below E_k),
    # all in the first N_dst_k rows, with sources below N_src_k.
    if in_rows < ek or max_id >= ek or max_src >= num_src:
        return None
    layout = GraphLayout(rowptr, col, edge_perm, None, num_src, num_dst, vals[7], False,
                         csr_row=parent.csr_row[:ek], dst_extent=parent.dst_extent)
    layout.derived.max_out_degree = vals[8]
    return _finish(layout, deg[num_dst:], extra, vals[3:7], chunk, with_csc)


def prefix_base(adj) -> Optional[Tensor]:
    r"""The ``[2, E]`` tensor whose first ``E_k`` columns ``adj`` is (a view such as
    :func:`~torch_geometric.utils.trim_to_layer`'s ``narrow``), else ``None``: a
    layout cached for it may serve ``adj`` through :meth:`GraphLayout.narrow`."""
    base = getattr(adj, "_base", None)
    if (base is None or type(adj) is not Tensor or adj.layout != torch.strided
            or adj.dim() != 2 or base.dim() != 2 or base.size(0) != 2 or adj.size(0) != 2):
        return None
    if (adj.storage_offset() != base.storage_offset() or adj.stride() != base.stride()
            or adj.size(1) > base.size(1) or adj.dtype != base.dtype):
        return None
    return base


def _csr_with_loops(ei: Tensor, keep: Optional[Tensor], kept: int, n: int, rowptr: Tensor,
                    idx: torch.dtype, unsorted: bool) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(col, csr_row, edge_perm)`` of PyG's ``remove_self_loops`` followed by
    ``add_self_loops(num_nodes=n)``: the kept edges in input order (ids
    ``0 .. kept - 1``), then loop ``i`` with id ``kept + i``."""
    dev = ei.device
    E = kept + n
    src, dst = ei[0], ei[1]
    loop = torch.arange(n, dtype=ei.dtype, device=dev)
    if keep is None:  # no input edges
        return loop.to(idx), loop.to(idx), torch.arange(n, device=dev)
    rank = keep.cumsum(0) - 1  # id of each kept edge
    if unsorted:
        # Stable sort of [kept edges, loops] by destination; removed loops get
        # the key N_dst + 1 and sort past the end.
        key = torch.cat([torch.where(keep, dst, rowptr.numel()), loop]).to(idx)
        csr_row, order = torch.sort(key, stable=True)
        order = order[:E]
        edge_perm = torch.cat([rank, loop + kept])[order]
        col = torch.cat([src, loop]).to(idx)[order]
        return col, csr_row[:E], edge_perm
    # Grouped by destination: row r holds its kept edges in input order, then its
    # loop; a kept edge's CSR position is its id plus the loops of the rows before.
    pos = torch.where(keep, rank + dst.clamp(max=n), E)
    loop_pos = rowptr[1:n + 1].long() - 1
    edge_perm = torch.empty(E + 1, dtype=torch.long, device=dev)
    edge_perm.index_copy_(0, pos, rank).index_copy_(0, loop_pos, loop.long() + kept)
    pair = torch.empty(2, E + 1, dtype=idx, device=dev)
    pair.index_copy_(1, pos, ei.to(idx)).index_copy_(1, loop_pos, loop.to(idx).expand(2, n))
    return pair[0, :E], pair[1, :E], edge_perm[:E]
