"""Fused :class:`~torch_geometric.nn.conv.GATv2Conv`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn.conv import GATv2Conv
from torch_geometric.typing import Adj, OptTensor, PairTensor

from ..layout_cache import get_layout
from ..ops.scores.gatv2 import gatv2_attention
from ._common import (check_strategy, edge_index_size, fused_layer, gat_fallback_reason,
                      gat_output, use_own_propagate)


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
        \right)\right)

    Constructor arguments, parameters (``lin_l``, ``lin_r``, ``att``, ``res``,
    ``bias``), initialisation and ``state_dict`` are those of
    :class:`~torch_geometric.nn.conv.GATv2Conv`; only :meth:`forward` differs, in
    speed and memory. With ``add_self_loops=True`` the self-loops (existing loops
    removed, one per node ``0 .. min(N_src, N_dst) - 1`` appended, as PyG does,
    with ``torch_sparse.set_diag`` for a ``SparseTensor``) are added once, when the
    graph's layout is built and cached.

    Args:
        in_channels (int or tuple), out_channels (int), heads (int, optional),
        concat (bool, optional), negative_slope (float, optional),
        dropout (float, optional), add_self_loops (bool, optional),
        edge_dim (int, optional), fill_value (float or Tensor or str, optional),
        bias (bool, optional), share_weights (bool, optional),
        residual (bool, optional), **kwargs: as in ``GATv2Conv``.
        strategy (str, optional): ``"auto"``, ``"smmf"`` or ``"pmf"``. Ignored on
            CPU. (default: ``"auto"``)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite,
          edge indices :math:`(2, |\mathcal{E}|)` (``Tensor`` or ``EdgeIndex``) or a
          sparse ``adj_t`` (``SparseTensor`` or ``torch.sparse``)
        - **output:** node features :math:`(|\mathcal{V}_t|, H * F_{out})`
          (:math:`(|\mathcal{V}_t|, F_{out})` if ``concat=False``); with
          ``return_attention_weights=True`` also ``(edge_index, alpha)`` as PyG
          returns them.

    Falls back to PyG's own ``forward`` (same results, unfused) when:

    * edge features are used (``edge_dim`` set or ``edge_attr`` given);
    * ``return_attention_weights=True`` with a ``torch.sparse`` input and
      ``add_self_loops=True`` (PyG returns a rebuilt sparse matrix);
    * an uncoalesced ``torch.sparse`` COO input without self-loops, or a
      ``torch.sparse`` layout other than COO / CSR (PyG raises);
    * ``return_attention_weights=True`` while training with ``dropout > 0``: PyG
      returns the weights *after* dropout, the fused op those before it;
    * node features whose counts disagree with the adjacency's size (a sparse
      ``adj_t``'s shape, an ``EdgeIndex``'s ``sparse_size``; PyG raises);
    * ``flow="target_to_source"``, an ``aggr`` other than ``"add"``, explain
      mode, registered message-passing hooks, or inputs PyG rejects.

    :func:`torch.jit.script` compiles PyG's ``GATv2Conv`` forward in this layer's
    place, sharing its parameters (:func:`~pyg_dfgnn.nn._common.native_twin`), so
    the layer scripts wherever ``GATv2Conv`` does; the fused op runs eagerly and
    under ``torch.compile``.

    Differences from PyG: the returned attention weights are detached from the
    autograd graph; under autocast the attention vector enters the kernels in the
    features' dtype (the sums stay float32); attention dropout draws its own mask
    (in the kernel from a seed taken from torch's generator; on the CPU over the
    edges in the layout's order), so from the same seed it can drop other weights than
    ``GATv2Conv``.
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 *args, strategy: str = "auto", **kwargs):
        use_own_propagate(type(self))
        super().__init__(in_channels, out_channels, *args, **kwargs)
        self.strategy = check_strategy(strategy)

    def fallback_reason(self, x, edge_index, edge_attr=None,
                        return_attention_weights=None) -> str:
        r"""Why this call runs PyG's ``forward`` (``""``: it runs fused)."""
        return gat_fallback_reason(self, x, edge_index, edge_attr, return_attention_weights,
                                   dst_optional=False)

    def forward(  # noqa: F811
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        return_attention_weights: Optional[bool] = None,
    ):
        r"""Runs the forward pass (same signature and results as
        :meth:`torch_geometric.nn.conv.GATv2Conv.forward`)."""
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
        want_alpha = bool(return_attention_weights)
        out = gatv2_attention(layout, x_l, x_r, att.to(x_l.dtype),
                              negative_slope=self.negative_slope, dropout=self.dropout,
                              training=self.training, return_attention=want_alpha,
                              strategy=self.strategy)
        alpha = None
        if want_alpha:
            out, alpha = out
            alpha = alpha.to(out_dtype)
        return gat_output(self, out.to(out_dtype), res, alpha, edge_index, layout)
