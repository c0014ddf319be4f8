"""Shared helpers of the fused conv layers: when to run the fused op, and the
graph size the layout is built for."""
from __future__ import annotations

import inspect
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.typing import SparseTensor, torch_sparse
from torch_geometric.utils import add_self_loops, is_torch_sparse_tensor
from torch_geometric.utils.sparse import set_sparse_value

from .. import edge_order, extension

# MessagePassing hook dictionaries; a registered hook expects PyG's propagate().
_HOOK_DICTS = (
    "_propagate_forward_pre_hooks", "_propagate_forward_hooks",
    "_message_forward_pre_hooks", "_message_forward_hooks",
    "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
    "_edge_update_forward_pre_hooks", "_edge_update_forward_hooks",
)


def use_own_propagate(cls) -> None:
    r"""Gives ``cls`` (a fused subclass) PyG's un-generated ``propagate`` before
    :class:`~torch_geometric.nn.conv.MessagePassing` first instantiates it.

    PyG generates a ``propagate`` per class from a template on the first
    instantiation and records the class's previous ``propagate`` as
    ``_orig_propagate``, which explain mode (edge masks) and decomposed layers
    switch to. When the native parent (say ``GATConv``) was instantiated first,
    the subclass inherits the parent's *generated* ``propagate`` and would record
    that one: explain mode would then run a ``propagate`` that ignores the edge
    mask. Restoring the parent's original here makes the subclass's records the
    same whatever the instantiation order.
    """
    if "_orig_propagate" in cls.__dict__:
        return
    for base in cls.__mro__[1:]:
        if "_orig_propagate" in base.__dict__:
            cls.propagate = base.__dict__["_orig_propagate"]
            if "_orig_edge_updater" in base.__dict__:
                cls.edge_updater = base.__dict__["_orig_edge_updater"]
            return


#: Native PyG conv class -> its fused subclass, filled by :func:`fused_layer` as
#: the layer modules are imported (``pyg_dfgnn.nn`` imports them all).
FUSED: Dict[type, type] = {}


def fused_layer(cls):
    r"""Class decorator of a fused layer: registers ``cls`` as the fused subclass
    of its first base (a PyG conv) for :func:`~pyg_dfgnn.nn.fuse`, and makes
    :func:`native_twin` what :func:`torch.jit.script` compiles in its place. The
    class calls :func:`use_own_propagate` in its ``__init__`` and has a
    ``fallback_reason(*args) -> str`` method (``""``: the call runs fused)."""
    native = cls.__bases__[0]
    if native in FUSED and FUSED[native] is not cls:
        raise ValueError(f"{native.__name__} has a fused layer already: "
                         f"{FUSED[native].__name__}")
    FUSED[native] = cls
    cls.__prepare_scriptable__ = native_twin
    return cls


def native_twin(layer):
    r"""The native PyG conv that :func:`torch.jit.script` compiles in place of the
    fused ``layer`` (its ``__prepare_scriptable__``; the fused ops are not
    TorchScript), so a fused layer scripts wherever its PyG conv does, running
    PyG's forward.

    The twin is an instance of the PyG class that ``layer``'s class fuses, with
    ``layer``'s attributes; it shares the layer's parameter, buffer, submodule and
    hook dictionaries, so a change to either shows in both and in the scripted
    module. PyG's constructor builds it first, on the meta device (no random
    numbers drawn, nothing allocated), so that the PyG class's TorchScript
    templates exist; the twin keeps that class's ``inspector``, which they are
    generated from.

    :func:`torch.jit.script` stores the twin in the place of a fused submodule of
    the model it scripts (its ``_modules``): that model then runs PyG's forward
    eagerly too, until :func:`~pyg_dfgnn.nn.fuse` switches it back.
    """
    native_cls = next(c for c in type(layer).__mro__ if c in FUSED)
    params = list(inspect.signature(native_cls.__init__).parameters.values())[1:]
    args = [getattr(layer, p.name) for p in params
            if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
    with torch.device("meta"):
        twin = native_cls(*args)
    # All of the layer's state: the constructor's defaults may have put what the
    # layer holds as a submodule (lin_edge) in the instance dict.
    twin.__dict__ = {**layer.__dict__, "inspector": twin.inspector}
    return twin


def missing_kernels_reason(x: Tensor) -> str:
    r"""Why the fused kernels cannot run on ``x``'s device though they should:
    ``x`` is a CUDA tensor and the compiled extension is missing (not built, or
    built but not loadable). ``""`` when they can run, and on the CPU, where the
    pure-PyTorch reference path is the intended one."""
    if not x.is_cuda or extension.HAS_EXTENSION:
        return ""
    return extension.missing_reason()


_warned_missing_kernels = False  # one warning per process


def kernels_missing(layer, x) -> str:
    r"""Why ``layer`` hands its input ``x`` (a tensor or a pair, as the layer
    takes it) to PyG's own ``forward`` because the fused kernels are missing
    for it (:func:`missing_kernels_reason`), or ``""``. On a GPU, PyG's forward
    is many times faster than the reference path, which materialises what the
    kernels fuse. The first call that hands over warns, once per process, with
    the reason and what to do about it.
    """
    t = x if isinstance(x, Tensor) else x[0]
    reason = missing_kernels_reason(t)
    if not reason:
        return ""
    global _warned_missing_kernels
    if not _warned_missing_kernels:
        _warned_missing_kernels = True
        warnings.warn(
            f"pyg_dfgnn: no fused CUDA kernels ({reason}), so {type(layer).__name__} and the "
            "other fused layers run PyG's own forward on CUDA tensors.\nReinstall pyg_dfgnn "
            "where it can build them (README, 'Troubleshooting the build'); `python -m "
            "pyg_dfgnn info` shows what the install found.", stacklevel=3)
    return f"no fused CUDA kernels ({reason})"


def gat_fallback_reason(conv, x, edge_index, edge_attr, return_attention_weights,
                        dst_optional: bool,
                        edge_reason: Optional[Callable[[object, Optional[Tensor]], str]] = None
                        ) -> str:
    r"""Why a ``GATConv``-like layer (``GATConv``, ``GATv2Conv``) runs PyG's
    ``forward`` for this call, ``""`` when it runs fused: edge features, a
    customised ``propagate``, features PyG rejects (``dst_optional``: a bipartite
    pair may leave the destination features ``None``), attention weights PyG
    returns after dropout or in a rebuilt sparse matrix, an adjacency the layout
    does not see as PyG does, or missing kernels.

    ``edge_reason(edge_index, edge_attr)`` says why the call's edge features
    send it to PyG's ``forward`` (``""``: they run fused), for a layer that fuses
    them; it runs once the adjacency is known to be one the layout reads. Without
    it, any edge feature (``edge_attr``, or ``edge_dim`` set) does."""
    if edge_reason is None and (edge_attr is not None or conv.lin_edge is not None
                                or conv.edge_dim is not None):
        return "edge features (edge_dim)"
    if propagate_is_customised(conv):
        return "flow, aggr, explain mode or message-passing hooks"
    if isinstance(x, Tensor):
        if x.dim() != 2:
            return "features that are not 2-D (PyG raises)"
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        ok_dst = ((dst_optional and x[1] is None) or
                  (isinstance(x[1], Tensor) and x[1].dim() == 2))
        if not (isinstance(x[0], Tensor) and x[0].dim() == 2 and ok_dst):
            return "bipartite features that are not 2-D (PyG raises)"
    else:
        return "features that are not a tensor or a pair of tensors"
    want_alpha = bool(return_attention_weights)
    if want_alpha and conv.training and conv.dropout > 0:
        return "attention weights while training with dropout (PyG returns them dropped)"
    if want_alpha and conv.add_self_loops and is_torch_sparse_tensor(edge_index):
        return "attention weights of a torch.sparse input with self-loops"
    if not adjacency_supported(edge_index, want_alpha, conv.add_self_loops):
        return "an adjacency PyG's propagate handles itself (or rejects)"
    if edge_reason is not None:
        reason = edge_reason(edge_index, edge_attr)
        if reason:
            return reason
    return kernels_missing(conv, x)


def propagate_is_customised(conv) -> bool:
    r"""Whether ``conv`` is configured so that only PyG's ``propagate`` computes
    what the user asked for: a ``flow`` other than ``source_to_target``, an
    aggregation other than ``"add"``, explain mode (edge masks) or registered
    message-passing hooks."""
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        return True
    aggr = getattr(conv, "aggr", "add")
    if not (isinstance(aggr, str) and aggr in ("add", "sum")):
        return True
    if getattr(conv, "_explain", None) or getattr(conv, "_edge_mask", None) is not None:
        return True
    return any(len(getattr(conv, name, ())) > 0 for name in _HOOK_DICTS)


def is_sparse_tensor(adj) -> bool:
    """``torch_sparse.SparseTensor`` (the placeholder class when it is not installed)."""
    return isinstance(adj, SparseTensor)


def adjacency_supported(adj, need_input_edge_order: bool, add_self_loops: bool = False) -> bool:
    r"""Whether :func:`~pyg_dfgnn.layout_cache.get_layout` sees the same edges, in the
    same order where that matters (``need_input_edge_order``: attention weights are
    returned), as PyG's ``propagate``.

    * ``[2, E]`` tensors and ``EdgeIndex``: always.
    * ``SparseTensor``: always (row-major COO order, as ``set_value(layout='coo')``).
    * ``torch.sparse`` CSR: always. COO with ``add_self_loops`` (the layer's):
      always; PyG's ``add_self_loops`` rebuilds the matrix coalesced, merging
      duplicate entries, and ``get_layout`` merges them too, whatever the
      ``is_coalesced()`` flag says (PyG sets it on the input without merging).
      COO without self-loops: when flagged coalesced; PyG's ``propagate`` and
      the layout then both take the entries as stored (duplicates are separate
      edges); unflagged, PyG's GATConv raises, so the layer lets it.
      Other layouts (CSC, BSR): never (PyG's ``propagate`` rejects them, so the
      layer lets PyG raise).
    """
    if is_sparse_tensor(adj):
        return True
    if not isinstance(adj, Tensor):
        return False
    if is_torch_sparse_tensor(adj):
        if adj.layout == torch.sparse_csr:
            return True
        if adj.layout == torch.sparse_coo:
            return add_self_loops or adj.is_coalesced()
        return False  # CSC/BSR: PyG's propagate rejects them; let it raise
    if adj.layout != torch.strided:
        return False
    return (adj.dim() == 2 and adj.size(0) == 2 and not adj.dtype.is_floating_point
            and adj.dtype != torch.bool)


def message_edge_features(adj, edge_attr: Optional[Tensor]) -> Optional[Tensor]:
    r"""The edge features a conv's ``message`` or ``edge_update`` receives from
    the ``collect`` PyG generates for it: ``edge_attr``, else the values of a
    ``SparseTensor`` or a ``torch.sparse`` matrix where they have a feature
    dimension (``None`` for plain edge weights, which PyG leaves out)."""
    if edge_attr is not None:
        return edge_attr
    if is_sparse_tensor(adj):
        values = adj.storage.value()
    elif is_torch_sparse_tensor(adj):
        values = adj.values()
    else:
        return None
    return values if values is not None and values.dim() > 1 else None


def gat_edge_reason(conv, adj, edge_attr: Optional[Tensor]) -> str:
    r"""Why the edge features of a call of a ``GATConv``-like layer with a
    ``lin_edge`` (``edge_dim``: ``GATConv``, ``GATv2Conv``) send it to PyG's
    ``forward`` (``""``: they run fused, or the call has none, and PyG leaves
    the edge term out); ``adj`` is an adjacency :func:`adjacency_supported`
    takes.

    It does where the features PyG's ``edge_update`` would receive
    (:func:`message_edge_features`) are not ``[E, edge_dim]`` floating-point
    features with one row per edge (or ``[E]`` with ``edge_dim=1``; PyG
    raises), and with ``add_self_loops=True`` on a sparse adjacency: PyG
    raises for a ``SparseTensor`` and asserts on a ``torch.sparse`` matrix's
    ``edge_attr``, or derives the loops' features from the matrix's values.
    """
    if conv.add_self_loops and (is_sparse_tensor(adj) or is_torch_sparse_tensor(adj)):
        return ("edge_dim with self-loops on a sparse adjacency (PyG raises, or derives "
                "the loops' features from the matrix's values)")
    feats = message_edge_features(adj, edge_attr)
    if feats is None:
        return ""
    weight = getattr(conv.lin_edge, "weight", None)
    width = (weight.size(1) if isinstance(weight, Tensor)
             and not isinstance(weight, UninitializedParameter) else None)
    if not (isinstance(feats, Tensor) and feats.is_floating_point()
            and feats.dim() in (1, 2) and feats.size(0) == num_adjacency_edges(adj)
            and (width is None or (feats.size(1) if feats.dim() == 2 else 1) == width)):
        return "edge features that are not [E, edge_dim] floats (PyG raises)"
    return ""


def looped_edge_features(conv, layout, adj, feats: Tensor,
                         project: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    r"""The edge features ``feats`` (in the order of the adjacency ``adj``, a
    ``[2, E]`` tensor or an ``EdgeIndex`` where ``conv.add_self_loops``) in the
    order of ``layout``'s :attr:`~pyg_dfgnn.layout.GraphLayout.edge_index`, as a
    ``GATConv``-like layer's ``forward`` hands them to its ``edge_update``: with
    self-loops, the input's loops removed (as PyG's ``remove_self_loops``, without
    its host synchronisation) and PyG's ``add_self_loops`` (``conv.fill_value``, one
    loop per node below :math:`\min(N_s, N_t)`), in every call as in PyG;
    ``feats`` as they are otherwise. On CUDA the loops are dropped by scatters
    (:func:`pyg_dfgnn.edge_order.compact`).

    ``project``: a map of the rows applied after the removal and before the
    loops are added, whose rows the fill then reduces, for a map that commutes
    with ``conv.fill_value`` (a linear map, and a sum or mean).

    Raises:
        RuntimeError: as PyG's ``add_self_loops`` (a reducing ``fill_value``
            with an edge into a destination past the loops).
    """
    if not conv.add_self_loops:
        return feats if project is None else project(feats)
    ei = adj if type(adj) is Tensor else adj.as_subclass(Tensor)
    n_loops = min(layout.num_src, layout.num_dst)
    # remove_self_loops, with the count of the edges it keeps taken from the
    # layout (its edges less the loops it appended): a boolean mask's selection
    # waits for the GPU to count them (a host synchronisation per layer and call)
    # and has a data-dependent shape under torch.compile.
    num_kept = layout.num_edges - n_loops
    compiling = torch.compiler.is_compiling()
    # An input without self-loops (molecules, most graphs) keeps every edge, and the
    # removal's eight small ops per layer and call would be host time for nothing.
    # Under torch.compile the sizes are symbolic and that test would guard on them.
    if compiling or num_kept != ei.size(1):
        keep = ei[0] != ei[1]
        if feats.is_cuda and not compiling:
            # Scatters: a CUDA row gather costs a fixed time per row (pyg_dfgnn.edge_order).
            ei, feats = edge_order.compact(keep, num_kept, ei, feats)
        else:
            kept = torch.nonzero_static(keep, size=num_kept).view(-1)
            ei, feats = ei.index_select(1, kept), feats.index_select(0, kept)
    if project is not None:
        feats = project(feats)
    _, feats = add_self_loops(ei, feats, fill_value=conv.fill_value, num_nodes=n_loops)
    return feats


def num_adjacency_edges(adj) -> int:
    r"""The number of edges of an adjacency that
    :func:`adjacency_supported` takes: a sparse matrix's stored entries, a
    ``[2, E]`` tensor's columns."""
    if is_sparse_tensor(adj):
        return adj.nnz()
    if is_torch_sparse_tensor(adj):
        return adj._nnz()
    return adj.size(1)


def edge_index_size(adj, num_src: int, num_dst: Optional[int], size=None,
                    add_self_loops: bool = False) -> Tuple[bool, Optional[Tuple[int, int]]]:
    r"""``(ok, size)``: the ``(N_src, N_dst)`` to build the layout for, as PyG's
    ``propagate`` infers them.

    A sparse matrix's shape (``size=None`` is returned: the layout reads the
    matrix's) or an ``EdgeIndex``'s ``sparse_size`` come first, and PyG ignores
    ``size`` for both; ``size`` sets those of a ``[2, E]`` tensor. The feature
    row counts ``num_src`` and ``num_dst`` (``None``: no destination features)
    set the counts still open, and a count left open is the other one. With
    ``add_self_loops``, PyG adds ``min(size)`` loops to an ``EdgeIndex``
    (without ``size``, as many as the fewest feature rows) and widens its
    ``sparse_size`` to hold them.

    ``ok=False`` where PyG raises (features that disagree with the counts) or
    adds other self-loops than the layout's one per node below
    ``min(N_src, N_dst)``: the layer then runs PyG's forward.
    """
    sparse = is_sparse_tensor(adj) or is_torch_sparse_tensor(adj)
    # PyG's self-loop count where it can differ from the layout's, an EdgeIndex's:
    # a sparse matrix gets min(N_dst, N_src) loops, a [2, E] tensor min(size) or
    # the fewest feature rows, which are its counts then.
    loops: Optional[int] = None
    if sparse:
        sizes = [adj.size(1), adj.size(0)]
    elif hasattr(adj, "sparse_size"):  # EdgeIndex
        if add_self_loops:
            loops = (min(size) if size is not None else
                     num_src if num_dst is None else min(num_src, num_dst))
        sizes = [None if s is None else int(s) if loops is None else max(int(s), loops)
                 for s in adj.sparse_size()]
    else:
        sizes = list(size) if size is not None else [None, None]
    for i, rows in enumerate((num_src, num_dst)):
        if rows is not None and sizes[i] is not None and int(sizes[i]) != rows:
            return False, None
        if sizes[i] is None:
            sizes[i] = rows
    n_src = int(sizes[0] if sizes[0] is not None else sizes[1])
    n_dst = int(sizes[1] if sizes[1] is not None else sizes[0])
    if loops is not None and loops != min(n_src, n_dst):
        return False, None
    return True, (None if sparse else (n_src, n_dst))


def gat_output(conv, out: Tensor, res: Optional[Tensor], alpha: Optional[Tensor], edge_index,
               layout):
    r"""The end of ``GATConv`` / ``GATv2Conv.forward`` after the attention:
    ``out [N_dst, H, C]`` concatenated or averaged over the heads, plus the
    residual ``res`` and the bias; with ``alpha [E, H]`` (the weights were asked
    for) also the graph PyG returns them with: a ``SparseTensor`` holding them
    (with the self-loops :func:`sparse_tensor_with_loops` adds), a
    ``torch.sparse`` matrix and ``alpha`` (no self-loops then: the layers'
    fallback covers that case), or ``(edge_index, alpha)`` with the self-loops
    the layer added."""
    out = out.reshape(-1, conv.heads * conv.out_channels) if conv.concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if conv.bias is not None:
        out = out + conv.bias
    if alpha is None:
        return out
    if is_sparse_tensor(edge_index):
        if conv.add_self_loops:
            edge_index, alpha = sparse_tensor_with_loops(edge_index, alpha)
        return out, edge_index.set_value(alpha, layout='coo')
    if is_torch_sparse_tensor(edge_index):
        return out, (set_sparse_value(edge_index, alpha), alpha)
    return out, (layout.edge_index if conv.add_self_loops else edge_index, alpha)


def sparse_tensor_with_loops(adj: SparseTensor, alpha: Tensor) -> Tuple[SparseTensor, Tensor]:
    r"""``(torch_sparse.set_diag(adj), alpha)`` with ``alpha`` moved into that
    matrix's COO order: PyG's GAT layers add a ``SparseTensor``'s self-loops
    with ``set_diag`` and return the attention weights on its result.

    ``alpha`` comes in the order of the layout built with ``add_self_loops``:
    ``adj``'s entries off the diagonal in COO order, then one loop per node
    ``0 .. min(N_src, N_dst) - 1``. ``set_diag`` holds the same entries: it
    removes the diagonal, keeps the other entries in order (duplicates
    included) and inserts loop ``i`` into row ``i``, so a stable sort of its
    entries by "is a loop" lists their positions in ``alpha``'s order.
    """
    adj = torch_sparse.set_diag(adj)
    row, col, _ = adj.coo()
    pos = (row == col).to(torch.uint8).argsort(stable=True)
    return adj, torch.empty_like(alpha).index_copy_(0, pos, alpha)
