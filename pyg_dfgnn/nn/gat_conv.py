"""Fused :class:`~torch_geometric.nn.conv.GATConv`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn.conv import GATConv
from torch_geometric.typing import Adj, OptPairTensor, OptTensor, Size

from ..layout_cache import get_layout
from ..ops import gat_attention
from ..ops.plan import check_strategy
from ._common import (edge_index_size, fused_layer, gat_edge_reason,
                      gat_fallback_reason, gat_output, looped_edge_features,
                      message_edge_features, use_own_propagate)
from ._projections import autocast_dtype, plain_linears


#: Features (``N * H * C``) from which :func:`_attention_terms` runs as a GEMM.
#: Below, the step is host-bound and the GEMM's extra launches cost more than
#: the elementwise passes they save (docs/design.md, "GAT").
TERMS_GEMM_MIN_ELEMENTS = 1 << 23
#: The ``fill_value`` reductions that are linear in the edge features, so that
#: the self-loops' edge terms can be reduced from the edges' terms.
LINEAR_FILLS = ("mean", "add", "sum")


def _attention_terms(x_src: Tensor, x_dst: Optional[Tensor], att_src: Tensor,
                     att_dst: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    r"""``(alpha_src [N_src, H], alpha_dst [N_dst, H] or None)``: the per-head dot
    products :math:`\mathbf{a}_s^\top \mathbf{x}_j` and :math:`\mathbf{a}_t^\top
    \mathbf{x}_i` of PyG's ``(x * att).sum(-1)``, in PyG's dtype.

    On large inputs as one GEMM, ``x [N, H*C] @ A [H*C, 2H]`` with ``A`` block
    diagonal (each head's ``att_src`` and ``att_dst``): the backward is then two
    GEMMs, where the elementwise form writes ``[N, H, C]`` products twice and
    reduces the parameters' gradients over all nodes. The GEMM runs in PyG's
    dtype, ``x``'s promoted with ``att``'s, outside autocast: half-precision
    features under autocast (float32 ``att``) are multiplied in float32, as PyG
    does. A half-precision GEMM would round the gradient of ``att_dst``, a sum of
    terms that nearly cancel (softmax is shift invariant up to the LeakyReLU):
    it drifted from float64 several times further than PyG's. So a model whose
    ``att`` is half precision too keeps PyG's form, and so does
    ``torch.compile``, where Inductor fuses the elementwise form itself. With
    TF32 matmuls allowed the GEMM rounds as the layer's projection already
    does."""
    dtype = torch.promote_types(x_src.dtype, att_src.dtype)
    if (dtype.itemsize < 4 or x_src.numel() < TERMS_GEMM_MIN_ELEMENTS
            or torch.compiler.is_compiling()):
        return ((x_src * att_src).sum(-1),
                None if x_dst is None else (x_dst * att_dst).sum(-1))
    H, C = x_src.shape[1], x_src.shape[2]

    def gemm(x: Tensor, att: Tensor) -> Tensor:
        # att [K, H, C] -> A [H*C, K*H], A[h*C + c, k*H + h] = att[k, h, c]
        a = torch.diag_embed(att.permute(2, 0, 1)).permute(2, 0, 1, 3)
        return x.reshape(x.shape[0], H * C).to(dtype) @ a.reshape(H * C, -1).to(dtype)

    with torch.autocast(x_src.device.type, enabled=False):
        if x_dst is x_src:
            terms = gemm(x_src, torch.cat([att_src, att_dst]))
            return terms[:, :H], terms[:, H:]
        return gemm(x_src, att_src), (None if x_dst is None else gemm(x_dst, att_dst))


def _edge_gemm_dtype(feats: Tensor, lin_edge: torch.nn.Module,
                     att_edge: Tensor) -> Optional[torch.dtype]:
    r"""The dtype in which :func:`_edge_terms` runs its one GEMM on ``feats``,
    or ``None`` where it runs PyG's form (below)."""
    weight = getattr(lin_edge, "weight", None)
    if not (plain_linears([lin_edge]) and not isinstance(weight, UninitializedParameter)
            and lin_edge.bias is None):
        return None
    dtype = torch.promote_types(torch.promote_types(feats.dtype, weight.dtype), att_edge.dtype)
    return None if dtype.itemsize < 4 else dtype


def _edge_terms(feats: Tensor, lin_edge: torch.nn.Module, att_edge: Tensor, H: int,
                C: int) -> Tensor:
    r"""``alpha_edge`` ``[E, H]``: the per-head terms :math:`\mathbf{a}_e^\top
    \mathbf{\Theta}_e \mathbf{e}_{ij}` of PyG's ``(lin_edge(e).view(-1, H, C) *
    att_edge).sum(-1)``, for ``feats`` ``[E, D]`` (or ``[E]``, one feature per
    edge, as PyG takes it).

    The projection is linear and has no bias, so the terms are one GEMM with the
    ``[D, H]`` product :math:`W_a` of ``lin_edge.weight`` and ``att_edge``,
    ``feats @ W_a``: no ``[E, H, C]`` tensor, and autograd takes the gradients
    to both parameters through :math:`W_a`. It runs in PyG's dtype for the
    terms, ``feats``' promoted with the parameters', outside autocast: under
    autocast float32 for half-precision features, where a half-precision GEMM
    would round the gradient of :math:`W_a`, a sum over every edge (PyG
    multiplies the half-precision projection by ``att_edge`` in float32;
    docs/design.md, "GAT"). Where that dtype is half precision (a model in
    float16 / bfloat16), PyG's form runs, as for the node terms: :math:`W_a`
    would round other values than PyG's projection does, and an edge whose
    score lies at the LeakyReLU's kink would take the other branch's gradient.
    So does a ``lin_edge`` that is not a plain linear map without hooks, or
    that has a bias or lazy weights not yet drawn (:func:`_edge_gemm_dtype`)."""
    return _edge_terms_as(feats, lin_edge, att_edge, H, C,
                          _edge_gemm_dtype(feats, lin_edge, att_edge))


def _edge_terms_as(feats: Tensor, lin_edge: torch.nn.Module, att_edge: Tensor, H: int, C: int,
                   dtype: Optional[torch.dtype]) -> Tensor:
    r""":func:`_edge_terms` with its form decided: the GEMM in ``dtype``, or
    PyG's form where ``dtype`` is ``None`` (:func:`_edge_gemm_dtype` of ``feats``)."""
    if feats.dim() == 1:
        feats = feats.view(-1, 1)
    if dtype is None:
        return (lin_edge(feats).view(-1, H, C) * att_edge).sum(-1)
    cast = autocast_dtype(feats) is not None
    with torch.autocast(feats.device.type, enabled=False):
        w_a = (lin_edge.weight.view(H, C, -1) * att_edge.view(H, C, 1)).sum(1).t()
        if cast:
            feats, w_a = feats.to(dtype), w_a.to(dtype)
        return feats @ w_a


@fused_layer
class FusedGATConv(GATConv):
    r"""Drop-in :class:`torch_geometric.nn.conv.GATConv` whose attention (additive
    SDDMM :math:`\mathrm{LeakyReLU}(\mathbf{a}_s^\top \mathbf{\Theta}_s \mathbf{x}_i +
    \mathbf{a}_t^\top \mathbf{\Theta}_t \mathbf{x}_j)` -> edge softmax -> SpMM) runs as
    one fused op, :func:`pyg_dfgnn.ops.gat_attention` (DF-GNN paper §3–4). As in the
    paper (§4.2, Fig. 12), ``strategy="auto"`` runs additive scores with SMMF,
    which measured as fast or faster than PMF on every benchmark graph on the
    H100 (:func:`pyg_dfgnn.ops.plan.choose_strategy`).

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_t\mathbf{x}_{j}, \qquad
        \alpha_{i,j} = \mathrm{softmax}_j\left(\mathrm{LeakyReLU}\left(
        \mathbf{a}^{\top}_{s} \mathbf{\Theta}_{s}\mathbf{x}_i
        + \mathbf{a}^{\top}_{t} \mathbf{\Theta}_{t}\mathbf{x}_j
        + \mathbf{a}^{\top}_{e} \mathbf{\Theta}_{e}\mathbf{e}_{i,j} \right)\right)

    (the :math:`\mathbf{e}_{i,j}` term with edge features, ``edge_dim``). With
    edge features the op runs the ``"additive_edge"`` score: one term per edge
    and head, :math:`\mathbf{a}_e^\top \mathbf{\Theta}_e \mathbf{e}_{i,j}`,
    computed as one ``[E, D] @ [D, H]`` GEMM with the product of ``lin_edge``'s
    weight and ``att_edge`` (PyG projects every edge to ``[E, H, C]`` first), then
    put in the layout's CSR edge order. With ``add_self_loops=True`` the
    self-loops' features come from PyG's ``remove_self_loops`` and
    ``add_self_loops`` with ``fill_value``, in every call, as in PyG.

    Constructor arguments, parameters (``lin`` or ``lin_src``/``lin_dst``,
    ``att_src``, ``att_dst``, ``res``, ``bias``), initialisation and ``state_dict``
    are those of :class:`~torch_geometric.nn.conv.GATConv`; only :meth:`forward`
    differs, in speed and memory.

    With ``add_self_loops=True`` the self-loops (existing loops removed, one loop per
    node ``0 .. min(N_src, N_dst) - 1`` appended, as PyG does, with
    ``torch_sparse.set_diag`` for a ``SparseTensor``) are added **once**, when the
    graph's :class:`~pyg_dfgnn.layout.GraphLayout` is built and cached on the
    ``edge_index`` object, not in every forward.

    Args:
        in_channels (int or tuple), out_channels (int), heads (int, optional),
        concat (bool, optional), negative_slope (float, optional),
        dropout (float, optional), add_self_loops (bool, optional),
        edge_dim (int, optional), fill_value (float or Tensor or str, optional),
        bias (bool, optional), residual (bool, optional), **kwargs:
            as in ``GATConv``.
        strategy (str, optional): ``"auto"`` (the measured rule above),
            ``"smmf"`` or ``"pmf"``. Ignored on CPU. (default: ``"auto"``)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite,
          edge indices :math:`(2, |\mathcal{E}|)` (``Tensor`` or ``EdgeIndex``) or a
          sparse ``adj_t`` (``SparseTensor`` or ``torch.sparse``),
          edge features :math:`(|\mathcal{E}|, D)` *(optional)*: ``edge_attr``
          in the adjacency's edge order (a sparse ``adj_t``'s row-major order),
          or, without ``edge_attr``, the values of a ``SparseTensor`` or of a
          ``torch.sparse`` matrix with a feature dimension, as PyG takes them
        - **output:** node features :math:`(|\mathcal{V}_t|, H * F_{out})`
          (:math:`(|\mathcal{V}_t|, F_{out})` if ``concat=False``). With
          ``return_attention_weights=True``, additionally ``(edge_index, alpha)``:
          the edges used (self-loops included, as a plain ``[2, E']`` tensor) and
          :math:`(|\mathcal{E}'|, H)` weights; for ``torch.sparse`` input
          ``(adj, alpha)``, for ``SparseTensor`` the adjacency holding ``alpha``
          (with ``add_self_loops=True``: ``torch_sparse.set_diag``'s, as PyG).

    The node counts are those PyG's ``propagate`` infers: a sparse ``adj_t``'s
    shape, an ``EdgeIndex``'s ``sparse_size`` (where set) or, for a ``[2, E]``
    tensor, ``size`` (PyG ignores ``size`` for the other kinds), and the node
    features for the counts these leave open; without destination features,
    :math:`|\mathcal{V}_t| = |\mathcal{V}_s|` unless the adjacency or ``size``
    sets it.

    Falls back to PyG's own ``forward`` (same results, unfused) when:

    * ``edge_attr`` without ``edge_dim`` (PyG leaves it out of the scores),
      edge features that are not ``[E, edge_dim]`` floating-point features with
      one row per edge (or ``[E]`` with ``edge_dim=1``; PyG raises), or
      ``edge_dim`` with ``add_self_loops=True`` on a ``SparseTensor`` (PyG raises)
      or a ``torch.sparse`` matrix (PyG asserts on ``edge_attr``, or derives the
      loops' features from the matrix's values); ``edge_dim`` without edge
      features runs fused, without the edge term, as PyG computes it;
    * ``return_attention_weights=True`` with a ``torch.sparse`` input and
      ``add_self_loops=True`` (PyG returns a rebuilt sparse matrix);
    * an uncoalesced ``torch.sparse`` COO input with ``add_self_loops=False``
      (PyG raises for it) or a ``torch.sparse`` layout other than COO/CSR (PyG
      raises); with self-loops, duplicate COO entries are merged, as PyG's
      ``add_self_loops`` does;
    * ``return_attention_weights=True`` while training with ``dropout > 0``: PyG
      returns the weights *after* dropout, the fused op those before it;
    * node features whose counts disagree with the adjacency's size or ``size``
      (PyG raises);
    * ``add_self_loops=True`` with an ``EdgeIndex`` and a ``size`` whose minimum
      is not :math:`\min(|\mathcal{V}_s|, |\mathcal{V}_t|)`: PyG then adds
      ``min(size)`` self-loops;
    * ``flow="target_to_source"``, an ``aggr`` other than ``"add"``, explain
      mode, registered message-passing hooks, or inputs PyG rejects (non-2-D
      features);
    * CUDA inputs when the compiled kernels are missing (warned once per
      process, with the reason).

    :func:`torch.jit.script` compiles PyG's ``GATConv`` forward in this layer's
    place, sharing its parameters (:func:`~pyg_dfgnn.nn._common.native_twin`), so
    the layer scripts wherever ``GATConv`` does; the fused op runs eagerly and
    under ``torch.compile``.

    Differences from PyG: the returned attention weights are detached from the
    autograd graph; with ``add_self_loops=True`` and an ``EdgeIndex`` input the
    returned ``edge_index`` is a plain tensor (same values); attention dropout draws
    its own mask (in the kernel from a seed taken from torch's generator; on the CPU
    over the edges in the layout's order), so from the same seed it can drop other
    weights than ``GATConv``.
    """

    #: Edge features (``edge_dim``) run fused: :func:`~pyg_dfgnn.nn.fuse` reports
    #: such a layer as fused.
    fuses_edge_features: bool = True

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 *args, strategy: str = "auto", **kwargs):
        use_own_propagate(type(self))
        super().__init__(in_channels, out_channels, *args, **kwargs)
        self.strategy = check_strategy(strategy)

    def _edge_reason(self, edge_index, edge_attr: OptTensor) -> str:
        r"""Why the edge features of this call send it to PyG's ``forward``
        (``""``: none, or they run fused); the adjacency is one
        :func:`~pyg_dfgnn.nn._common.adjacency_supported` takes."""
        if self.lin_edge is None:
            return ("" if edge_attr is None else
                    "edge features without edge_dim (PyG leaves them out of the scores)")
        return gat_edge_reason(self, edge_index, edge_attr)

    def fallback_reason(self, x, edge_index, edge_attr=None,
                        return_attention_weights=None) -> str:
        r"""Why this call runs PyG's ``forward`` (``""``: it runs fused)."""
        return gat_fallback_reason(self, x, edge_index, edge_attr, return_attention_weights,
                                   dst_optional=True, edge_reason=self._edge_reason)

    def _layout_edge_terms(self, layout, edge_index, feats: Tensor) -> Tensor:
        r"""``alpha_edge`` ``[E, H]`` of ``feats`` (the edge features in the
        adjacency's order) in the layout's CSR edge order: the features of the
        layout's :attr:`~pyg_dfgnn.layout.GraphLayout.edge_index`, self-loops'
        included, exactly as ``GATConv.forward`` makes them
        (:func:`~pyg_dfgnn.nn._common.looped_edge_features`), projected by
        :func:`_edge_terms`; with a ``fill_value`` in :data:`LINEAR_FILLS` the
        self-loops' terms reduced from their in-edges' terms instead (equal up to
        rounding)."""
        H, C = self.heads, self.out_channels
        dtype = _edge_gemm_dtype(feats, self.lin_edge, self.att_edge)

        def terms_of(f: Tensor) -> Tensor:
            return _edge_terms_as(f, self.lin_edge, self.att_edge, H, C, dtype)

        if dtype is not None and isinstance(self.fill_value, str) \
                and self.fill_value in LINEAR_FILLS:
            # The loops' features are a sum or mean of their in-edges' and the
            # terms a linear map of the features (the GEMM form): the loops'
            # terms are that sum or mean of the in-edges' terms, a scatter of
            # [E, H] rather than [E, D] values (D / H times less to move).
            terms = looped_edge_features(self, layout, edge_index, feats, project=terms_of)
        else:
            terms = terms_of(looped_edge_features(self, layout, edge_index, feats))
        return layout.to_csr_order(terms, loops_appended=self.add_self_loops)

    def forward(  # noqa: F811
        self,
        x: Union[Tensor, OptPairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        size: Size = None,
        return_attention_weights: Optional[bool] = None,
    ):
        r"""Runs the forward pass (same signature and results as
        :meth:`torch_geometric.nn.conv.GATConv.forward`).

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): node features
                (the destination features may be ``None``).
            edge_index (torch.Tensor, EdgeIndex, SparseTensor or torch.sparse):
                the graph.
            edge_attr (torch.Tensor, optional): ``[E, edge_dim]`` edge features
                in the adjacency's edge order (a sparse matrix's values by
                default, as in PyG).
            size ((int, int), optional): ``(N_src, N_dst)`` of a ``[2, E]``
                tensor (ignored for the other kinds, as in PyG); with
                ``add_self_loops`` and a ``[2, E]`` tensor or ``EdgeIndex``, its
                minimum is the number of self-loops added, as in PyG.
            return_attention_weights (bool, optional): if ``True``, also return
                ``(edge_index, alpha)``.
        """
        if self.fallback_reason(x, edge_index, edge_attr, return_attention_weights):
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)

        H, C = self.heads, self.out_channels
        x_src_in, x_dst_in = (x, x) if isinstance(x, Tensor) else x
        ok, lsize = edge_index_size(edge_index, x_src_in.size(0),
                                    None if x_dst_in is None else x_dst_in.size(0), size,
                                    self.add_self_loops)
        if not ok:
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)

        # Feature transforms, exactly as GATConv.forward:
        res: Optional[Tensor] = None
        if isinstance(x, Tensor):
            if self.res is not None:
                res = self.res(x)
            if self.lin is not None:
                x_src = x_dst = self.lin(x).view(-1, H, C)
            else:
                x_src = self.lin_src(x).view(-1, H, C)
                x_dst = self.lin_dst(x).view(-1, H, C)
        else:
            x_src, x_dst = x
            if x_dst is not None and self.res is not None:
                res = self.res(x_dst)
            if self.lin is not None:
                x_src = self.lin(x_src).view(-1, H, C)
                if x_dst is not None:
                    x_dst = self.lin(x_dst).view(-1, H, C)
            else:
                x_src = self.lin_src(x_src).view(-1, H, C)
                if x_dst is not None:
                    x_dst = self.lin_dst(x_dst).view(-1, H, C)

        # Node-level attention terms; the edge-level sum, LeakyReLU, softmax,
        # dropout and aggregation are fused:
        alpha_src, alpha_dst = _attention_terms(x_src, x_dst, self.att_src, self.att_dst)
        layout = get_layout(edge_index, size=lsize, add_self_loops=self.add_self_loops)
        if alpha_dst is None:  # PyG then uses alpha_j alone, over the graph's N_dst rows
            alpha_dst = alpha_src.new_zeros(layout.num_dst, H)
        feats = (None if self.lin_edge is None else
                 message_edge_features(edge_index, edge_attr))
        alpha_edge = None if feats is None else self._layout_edge_terms(layout, edge_index, feats)
        # Under autocast the projections are half precision and att_* float32, so
        # PyG's attention terms come out float32 and it aggregates in float32: the
        # kernel takes one dtype, and the result is returned in PyG's dtype.
        out_dtype = alpha_src.dtype
        if alpha_edge is not None:
            out_dtype = torch.promote_types(out_dtype, alpha_edge.dtype)
            alpha_edge = alpha_edge.to(x_src.dtype)
        if alpha_src.dtype != x_src.dtype:
            alpha_src, alpha_dst = alpha_src.to(x_src.dtype), alpha_dst.to(x_src.dtype)

        want_alpha = bool(return_attention_weights)
        out = gat_attention(layout, alpha_src, alpha_dst, x_src,
                            negative_slope=self.negative_slope, dropout=self.dropout,
                            training=self.training, return_attention=want_alpha,
                            strategy=self.strategy, edge=alpha_edge, edge_order="csr")
        alpha = None
        if want_alpha:
            out, alpha = out
        return gat_output(self, out.to(out_dtype), res, alpha, edge_index, layout)
