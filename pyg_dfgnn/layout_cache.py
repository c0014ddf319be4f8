"""The layout cache: :func:`get_layout` builds a graph's
:class:`~pyg_dfgnn.layout.GraphLayout` at most once and stores it on the adjacency
object, and reuses it only while that object still holds the same edges. The
validity contract (what identifies a graph, what invalidates it, what is checked
under ``torch.compile``, in CUDA graphs and in inference mode) is in
docs/layout_cache.md.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .layout import GraphLayout, prefix_base

_ATTR = "_dfgnn_layouts"


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
        # self_loops -> [(sized, layout)] in build order: the lookup of compiled
        # code (_compiled_lookup), which must not key a dict on the node counts
        # (Python ints a guard would pin: a recompile per mini-batch).
        self.by_flag: dict = {}

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
            "tensor, or call pyg_dfgnn.layout_cache.invalidate(edge_index) and run the model "
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
    cache.by_flag[key[1]] = [(k[0] is not None, lay) for k, lay in cache.layouts.items()
                             if k[1] == key[1]]


def _merged(adj: Tensor) -> Tensor:
    """``adj`` (torch.sparse COO or CSR) as a COO matrix with duplicate entries
    merged, whatever its ``is_coalesced`` flag says (PyG sets the flag on an input
    without merging it)."""
    coo = adj if adj.layout == torch.sparse_coo else adj.to_sparse_coo()
    idx = coo._indices()
    ones = torch.ones(idx.size(1), device=idx.device)
    return torch.sparse_coo_tensor(idx, ones, coo.shape[:2]).coalesce()


def _build_cached(adj, size, add_self_loops: bool) -> GraphLayout:
    # Plain (not inference) tensors, so a layout built under inference_mode also
    # serves later training steps (autograd saves its index tensors).
    with torch.inference_mode(False):
        src = adj
        if (add_self_loops and isinstance(adj, Tensor)
                and adj.layout in (torch.sparse_coo, torch.sparse_csr)):
            # PyG's add_self_loops rebuilds a torch.sparse matrix coalesced: the
            # layer then sees its duplicate entries merged.
            src = _merged(adj)
        layout = _from_prefix(adj, size) if size is not None and not add_self_loops else None
        if layout is None:
            layout = GraphLayout.from_adj(src, size, add_self_loops)
    _store(adj, _key(size, add_self_loops), layout)
    return layout


def _from_prefix(adj, size) -> Optional[GraphLayout]:
    """The layout of a trimmed view (``trim_to_layer``) derived from the layout
    cached for the tensor it was cut from, where that one serves."""
    base = prefix_base(adj)
    cache = None if base is None else getattr(base, _ATTR, None)
    if not isinstance(cache, _LayoutCache) or not cache.matches(base):
        return None
    for (_, loops), parent in list(cache.layouts.items()):
        if not loops:
            layout = parent.narrow(adj, size)
            if layout is not None:
                return layout
    return None


_MISS_UNDER_COMPILE = (
    "pyg_dfgnn: no GraphLayout is cached for this edge_index, and building one inside "
    "a compiled region needs data-dependent sizes. Apply "
    "pyg_dfgnn.transforms.CacheLayout to the data, or call the model once eagerly on "
    "the same edge_index, before the compiled call (without fullgraph=True the layout "
    "is built eagerly at a graph break).")
try:
    _build_outside_graph = torch.compiler.disable(_build_cached, reason=_MISS_UNDER_COMPILE)
except TypeError:  # torch without the reason argument
    _build_outside_graph = torch.compiler.disable(_build_cached)


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
    cache = getattr(adj, _ATTR, None)
    if torch.compiler.is_compiling():
        layout = (_compiled_lookup(cache, size, bool(add_self_loops))
                  if isinstance(cache, _LayoutCache) else None)
        if layout is None:
            return _build_outside_graph(adj, size, add_self_loops)
        torch.ops.pyg_dfgnn.check_layout.default(list(_index_parts(adj)), cache.stamp_tensor,
                                                 list(cache.snapshot))
        return layout
    if type(cache) is _LayoutCache:
        layout = cache.layouts.get(_key(size, add_self_loops))
        if layout is not None and cache.matches(adj):
            return layout
    return _build_cached(adj, size, add_self_loops)


def _compiled_lookup(cache: _LayoutCache, size, add_self_loops: bool) -> Optional[GraphLayout]:
    # The node counts are compared, not hashed: under dynamic shapes each
    # comparison is a relation between symbolic sizes, whose guard holds for
    # every batch of the same model (a dict key would pin the counts).
    for sized, layout in cache.by_flag.get(add_self_loops, ()):
        if size is None:
            if not sized:
                return layout
        elif sized and layout.num_src == size[0] and layout.num_dst == size[1]:
            return layout
    return None


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
