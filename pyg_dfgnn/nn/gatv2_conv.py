"""Fused :class:`~torch_geometric.nn.conv.GATv2Conv`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.conv import GATv2Conv
from torch_geometric.typing import Adj, OptTensor, PairTensor

from ..layout_cache import get_layout
from ..ops.scores.gatv2 import gatv2_attention
from ..ops.plan import check_strategy
from ._common import (edge_index_size, fused_layer, gat_edge_reason,
                      gat_fallback_reason, gat_output, looped_edge_features,
                      message_edge_features, use_own_propagate)
from ._projections import edge_rows


@fused_layer
class FusedGATv2Conv(GATv2Conv):
    r"""Drop-in :class:`torch_geometric.nn.conv.GATv2Conv` whose attention
    (:math:`\mathbf{a}^\top \mathrm{LeakyReLU}(\mathbf{\Theta}_s \mathbf{x}_i +
    \mathbf{\Theta}_t \mathbf{x}_j)` -> edge softmax -> SpMM) runs as one fused
    op, :func:`pyg_dfgnn.ops.gatv2_attention` (DF-GNN paper §3–4): no
    ``E x H x C`` tensor of per-edge sums or messages exists, forward or
    backward.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j}, \qquad
        \alpha_{i,j} = \mathrm{softmax}_j\left(\mathbf{a}^{\top}\mathrm{LeakyReLU}\left(
        \mathbf{\Theta}_{s} \mathbf{x}_j + \mathbf{\Theta}_{t} \mathbf{x}_{i}
        + \mathbf{\Theta}_{e} \mathbf{e}_{i,j}
        \right)\right)

    (the :math:`\mathbf{\Theta}_{e} \mathbf{e}_{i,j}` term with edge features,
    ``edge_dim``). With edge features the op runs the ``"gatv2_edge"`` score:
    the projected features sit inside the LeakyReLU, one ``[H, C]`` row per edge,
    so ``lin_edge`` projects them to the one ``[E, H, C]`` tensor the kernels
    read (after a gather of the ``[E, D]`` features into the layout's CSR edge
    order), where PyG adds it to an ``[E, H, C]`` sum of the gathered node rows;
    the messages stay :math:`\mathbf{\Theta}_{s}\mathbf{x}_{j}`, without it, as in
    PyG. With ``add_self_loops=True`` the self-loops' features come from PyG's
    ``remove_self_loops`` and ``add_self_loops`` with ``fill_value``, in every
    call, as in PyG. The ``"gatv2_edge"`` score has no PMF path: such calls run
    SMMF whatever ``strategy`` says.

    Constructor arguments, parameters (``lin_l``, ``lin_r``, ``att``,
    ``lin_edge``, ``res``, ``bias``), initialisation and ``state_dict`` are those
    of :class:`~torch_geometric.nn.conv.GATv2Conv`; only :meth:`forward` differs,
    in speed and memory. With ``add_self_loops=True`` the self-loops (existing
    loops removed, one per node ``0 .. min(N_src, N_dst) - 1`` appended, as PyG
    does, with ``torch_sparse.set_diag`` for a ``SparseTensor``) are added once,
    when the graph's layout is built and cached.

    Args:
        in_channels (int or tuple), out_channels (int), heads (int, optional),
        concat (bool, optional), negative_slope (float, optional),
        dropout (float, optional), add_self_loops (bool, optional),
        edge_dim (int, optional), fill_value (float or Tensor or str, optional),
        bias (bool, optional), share_weights (bool, optional),
        residual (bool, optional), **kwargs: as in ``GATv2Conv``.
        strategy (str, optional): ``"auto"``, ``"smmf"`` or ``"pmf"`` (calls with
            edge features run SMMF). Ignored on CPU. (default: ``"auto"``)

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
          (:math:`(|\mathcal{V}_t|, F_{out})` if ``concat=False``); with
          ``return_attention_weights=True`` also ``(edge_index, alpha)`` as PyG
          returns them.

    Falls back to PyG's own ``forward`` (same results, unfused) when:

    * edge features without ``edge_dim`` (``edge_attr``, or a sparse matrix's
      values with a feature dimension; PyG raises), edge features that are not
      ``[E, edge_dim]`` floating-point features with one row per edge (or
      ``[E]`` with ``edge_dim=1``; PyG raises), or ``edge_dim`` with
      ``add_self_loops=True`` on a ``SparseTensor`` (PyG raises) or a
      ``torch.sparse`` matrix (PyG asserts on ``edge_attr``, or derives the
      loops' features from the matrix's values); ``edge_dim`` without edge
      features runs fused, without the edge term, as PyG computes it;
    * ``return_attention_weights=True`` with a ``torch.sparse`` input and
      ``add_self_loops=True`` (PyG returns a rebuilt sparse matrix);
    * an uncoalesced ``torch.sparse`` COO input without self-loops, or a
      ``torch.sparse`` layout other than COO / CSR (PyG raises);
    * ``return_attention_weights=True`` while training with ``dropout > 0``: PyG
      returns the weights *after* dropout, the fused op those before it;
    * node features whose counts disagree with the adjacency's size (a sparse
      ``adj_t``'s shape, an ``EdgeIndex``'s ``sparse_size``; PyG raises);
    * ``flow="target_to_source"``, an ``aggr`` other than ``"add"``, explain
      mode, registered message-passing hooks, or inputs PyG rejects;
    * CUDA inputs when the compiled kernels are missing (warned once per
      process, with the reason).

    :func:`torch.jit.script` compiles PyG's ``GATv2Conv`` forward in this layer's
    place, sharing its parameters (:func:`~pyg_dfgnn.nn._common.native_twin`), so
    the layer scripts wherever ``GATv2Conv`` does; the fused op runs eagerly and
    under ``torch.compile``.

    Differences from PyG: the returned attention weights are detached from the
    autograd graph; with ``add_self_loops=True`` and an ``EdgeIndex`` input the
    returned ``edge_index`` is a plain tensor (same values); under autocast the
    attention vector enters the kernels in the features' dtype (the sums stay
    float32); attention dropout draws its own mask (in the kernel from a seed
    taken from torch's generator; on the CPU over the edges in the layout's
    order), so from the same seed it can drop other weights than ``GATv2Conv``.
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
            # PyG's edge_update asserts on any edge features that reach it.
            return ("" if message_edge_features(edge_index, edge_attr) is None else
                    "edge features without edge_dim (PyG raises)")
        return gat_edge_reason(self, edge_index, edge_attr)

    def fallback_reason(self, x, edge_index, edge_attr=None,
                        return_attention_weights=None) -> str:
        r"""Why this call runs PyG's ``forward`` (``""``: it runs fused)."""
        return gat_fallback_reason(self, x, edge_index, edge_attr, return_attention_weights,
                                   dst_optional=False, edge_reason=self._edge_reason)

    def _layout_edge_rows(self, layout, edge_index, feats: Tensor) -> Tensor:
        r"""``lin_edge`` of ``feats`` (the edge features in the adjacency's order)
        as ``[E, H, C]`` rows in the layout's CSR edge order: the features of the
        layout's :attr:`~pyg_dfgnn.layout.GraphLayout.edge_index`, self-loops'
        included, exactly as ``GATv2Conv.forward`` makes them
        (:func:`~pyg_dfgnn.nn._common.looped_edge_features`), then projected
        (:func:`~pyg_dfgnn.nn._projections.edge_rows`)."""
        feats = looped_edge_features(self, layout, edge_index, feats)
        if feats.dim() == 1:  # one feature per edge, as PyG's edge_update views it
            feats = feats.view(-1, 1)
        return edge_rows(self.lin_edge, layout, feats, self.heads, self.out_channels,
                         loops_appended=self.add_self_loops)

    def forward(  # noqa: F811
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        return_attention_weights: Optional[bool] = None,
    ):
        r"""Runs the forward pass (same signature and results as
        :meth:`torch_geometric.nn.conv.GATv2Conv.forward`).

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): node features.
            edge_index (torch.Tensor, EdgeIndex, SparseTensor or torch.sparse):
                the graph.
            edge_attr (torch.Tensor, optional): ``[E, edge_dim]`` edge features
                in the adjacency's edge order (a sparse matrix's values by
                default, as in PyG).
            return_attention_weights (bool, optional): if ``True``, also return
                ``(edge_index, alpha)``.
        """
        if self.fallback_reason(x, edge_index, edge_attr, return_attention_weights):
            return super().forward(x, edge_index, edge_attr, return_attention_weights)
        H, C = self.heads, self.out_channels
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        ok, lsize = edge_index_size(edge_index, x_src.size(0), x_dst.size(0),
                                    add_self_loops=self.add_self_loops)
        if not ok:
            return super().forward(x, edge_index, edge_attr, return_attention_weights)

        # Feature transforms, exactly as GATv2Conv.forward:
        res = self.res(x_dst) if self.res is not None else None
        x_l = self.lin_l(x_src).view(-1, H, C)
        if self.share_weights and x_dst is x_src:
            x_r = x_l
        else:
            x_r = self.lin_r(x_dst).view(-1, H, C)  # lin_r is lin_l with share_weights

        # Under autocast the projections are half precision and att float32, so
        # PyG's scores and sums come out float32: the kernel takes one dtype (its
        # sums are float32), and the result is returned in PyG's dtype.
        att = self.att.view(H, C)
        out_dtype = torch.promote_types(att.dtype, x_l.dtype)
        layout = get_layout(edge_index, size=lsize, add_self_loops=self.add_self_loops)
        strategy, edge = self.strategy, None
        feats = None if self.lin_edge is None else message_edge_features(edge_index, edge_attr)
        if feats is not None:  # after the node projections: lazy weights in PyG's order
            edge = self._layout_edge_rows(layout, edge_index, feats)
            out_dtype = torch.promote_types(out_dtype, edge.dtype)
            edge = edge.to(x_l.dtype)
            if strategy == "pmf":
                strategy = "smmf"  # the gatv2_edge score has no PMF path
        want_alpha = bool(return_attention_weights)
        out = gatv2_attention(layout, x_l, x_r, att.to(x_l.dtype),
                              negative_slope=self.negative_slope, dropout=self.dropout,
                              training=self.training, return_attention=want_alpha,
                              strategy=strategy, edge=edge, edge_order="csr")
        alpha = None
        if want_alpha:
            out, alpha = out
            alpha = alpha.to(out_dtype)
        return gat_output(self, out.to(out_dtype), res, alpha, edge_index, layout)
