"""Fused :class:`~torch_geometric.nn.conv.AGNNConv`."""
from __future__ import annotations

from torch import Tensor
from torch_geometric.nn.conv import AGNNConv
from torch_geometric.typing import Adj

from ..layout_cache import get_layout
from ..ops import agnn_attention
from ..ops.plan import check_strategy
from ._common import (adjacency_supported, edge_index_size, fused_layer,
                      kernels_missing, propagate_is_customised, use_own_propagate)


@fused_layer
class FusedAGNNConv(AGNNConv):
    r"""Drop-in :class:`torch_geometric.nn.conv.AGNNConv` whose cosine attention
    (SDDMM :math:`\beta \cos(\mathbf{x}_i, \mathbf{x}_j)` -> edge softmax -> SpMM)
    runs as one fused op, :func:`pyg_dfgnn.ops.agnn_attention` (DF-GNN paper
    §3–4; cosine scores are dot-product scores on normalised features, so SMMF/PMF
    are chosen as for the Graph Transformer, §4.2).

    .. math::
        \mathbf{X}^{\prime} = \mathbf{P} \mathbf{X}, \qquad
        P_{i,j} = \frac{\exp( \beta \cdot \cos(\mathbf{x}_i, \mathbf{x}_j))}
        {\sum_{k \in \mathcal{N}(i)\cup \{ i \}} \exp( \beta \cdot
        \cos(\mathbf{x}_i, \mathbf{x}_k))}

    Constructor arguments, the parameter (or buffer) ``beta`` and ``state_dict`` are
    those of :class:`~torch_geometric.nn.conv.AGNNConv`. With
    ``add_self_loops=True`` the loops are added once, when the cached
    :class:`~pyg_dfgnn.layout.GraphLayout` is built.

    Args:
        requires_grad (bool, optional), add_self_loops (bool, optional), **kwargs:
            as in ``AGNNConv``.
        strategy (str, optional): ``"auto"``, ``"smmf"`` or ``"pmf"``; see
            :class:`FusedTransformerConv`. (default: ``"auto"``)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F)`, edge indices
          :math:`(2, |\mathcal{E}|)` (``Tensor`` or ``EdgeIndex``) or a sparse
          ``adj_t`` (``SparseTensor`` or ``torch.sparse``)
        - **output:** node features :math:`(|\mathcal{V}|, F)`

    Falls back to PyG's own ``forward`` (same results, unfused) for an
    uncoalesced ``torch.sparse`` COO matrix with ``add_self_loops=False`` (with
    self-loops its duplicate entries are merged, as PyG's ``add_self_loops``
    does), features that are not 2-D, features whose node count disagrees with
    the adjacency's size (a sparse ``adj_t``'s shape, an ``EdgeIndex``'s
    ``sparse_size``; PyG raises), ``flow="target_to_source"``, an ``aggr``
    other than ``"add"``, explain mode, registered message-passing hooks, or
    CUDA inputs when the compiled kernels are missing (warned once per process,
    with the reason).

    :func:`torch.jit.script` compiles PyG's ``AGNNConv`` forward in this layer's
    place, sharing ``beta`` (:func:`~pyg_dfgnn.nn._common.native_twin`), so the
    layer scripts wherever ``AGNNConv`` does; the fused op runs eagerly and under
    ``torch.compile``.
    """

    def __init__(self, requires_grad: bool = True, add_self_loops: bool = True, *,
                 strategy: str = "auto", **kwargs):
        use_own_propagate(type(self))
        super().__init__(requires_grad=requires_grad, add_self_loops=add_self_loops, **kwargs)
        self.strategy = check_strategy(strategy)

    def fallback_reason(self, x, edge_index) -> str:
        r"""Why this call runs PyG's ``forward`` (``""``: it runs fused)."""
        if not isinstance(x, Tensor) or x.dim() != 2:
            return "features that are not one 2-D tensor"
        if propagate_is_customised(self):
            return "flow, aggr, explain mode or message-passing hooks"
        if not adjacency_supported(edge_index, False, self.add_self_loops):
            return "an adjacency PyG's propagate handles itself (or rejects)"
        return kernels_missing(self, x)

    def forward(self, x: Tensor, edge_index: Adj) -> Tensor:
        r"""Runs the forward pass (same signature and results as
        :meth:`torch_geometric.nn.conv.AGNNConv.forward`).

        Args:
            x (torch.Tensor): node features ``[N, F]``.
            edge_index (torch.Tensor, EdgeIndex, SparseTensor or torch.sparse):
                the graph.
        """
        if self.fallback_reason(x, edge_index):
            return super().forward(x, edge_index)
        n = x.size(self.node_dim)
        ok, size = edge_index_size(edge_index, n, n, add_self_loops=self.add_self_loops)
        if not ok:
            return super().forward(x, edge_index)
        layout = get_layout(edge_index, size=size, add_self_loops=self.add_self_loops)
        return agnn_attention(layout, x, x, self.beta, strategy=self.strategy)
