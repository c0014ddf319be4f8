"""Fused :class:`~torch_geometric.nn.conv.TransformerConv`."""
from __future__ import annotations

import functools
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn.conv import TransformerConv
from torch_geometric.typing import Adj, OptTensor, PairTensor

from ..layout_cache import get_layout
from ..ops import gt_attention
from ..ops.plan import check_strategy
from ._common import (adjacency_supported, edge_index_size, fused_layer,
                      is_sparse_tensor, kernels_missing, message_edge_features,
                      num_adjacency_edges, propagate_is_customised, use_own_propagate)
from ._edge_tails import csr_tails, edge_tails_out, tail_projections, tail_weight
from ._projections import edge_rows, joined_gemm, linear_rows, plain_linears
from ._projections import joined_linear as _joined_linear  # a name benchmarks swap

@fused_layer
class FusedTransformerConv(TransformerConv):
    r"""Drop-in :class:`torch_geometric.nn.conv.TransformerConv` whose attention
    (SDDMM :math:`\mathbf{q}_i^\top \mathbf{k}_j / \sqrt{d}` -> edge softmax ->
    SpMM :math:`\sum_j \alpha_{i,j} \mathbf{v}_j`) runs as one fused op,
    :func:`pyg_dfgnn.ops.gt_attention` (DF-GNN paper §3–4: SMMF or PMF, chosen per
    call by the rule of §4.2; fused backward of §4.3).

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \sum_{j \in \mathcal{N}(i)} \alpha_{i,j} \left(\mathbf{W}_2 \mathbf{x}_{j}
        + \mathbf{W}_6 \mathbf{e}_{ij}\right),
        \qquad
        \alpha_{i,j} = \textrm{softmax} \left(
        \frac{(\mathbf{W}_3\mathbf{x}_i)^{\top} (\mathbf{W}_4\mathbf{x}_j
        + \mathbf{W}_6 \mathbf{e}_{ij})}{\sqrt{d}} \right)

    (the :math:`\mathbf{W}_6 \mathbf{e}_{ij}` terms with edge features,
    ``edge_dim``). With edge features the edge features ``[E, D]`` are put in the
    layout's CSR edge order first, then, where ``D`` is small against ``C``
    (:func:`~pyg_dfgnn.ops.scores.dot_edge_tail.tails_pay`), the op runs the
    ``"dot_edge_tail"`` score on them as they are: ``lin_edge`` has no bias, so
    :math:`\mathbf{q}_i^\top \mathbf{W}_6 \mathbf{e}_{ij} = (\mathbf{W}_6^\top
    \mathbf{q}_i)^\top \mathbf{e}_{ij}` and the weighted sum of the
    :math:`\mathbf{W}_6 \mathbf{e}_{ij}` is :math:`\mathbf{W}_6` times the weighted
    sum of the :math:`\mathbf{e}_{ij}`, and no ``[E, H, C]`` tensor exists.
    Otherwise the ``"dot_edge"`` score: ``lin_edge`` projects them to the one
    ``[E, H, C]`` tensor the kernels read, where PyG adds it to the gathered keys
    and values as two more.

    Constructor arguments, parameters, initialisation and ``state_dict`` are those
    of :class:`~torch_geometric.nn.conv.TransformerConv` (``load_state_dict`` of a
    native layer's state works both ways); only :meth:`forward` differs, and only in
    speed and memory: the ``[E, H, C]`` messages are never materialised.

    The graph's :class:`~pyg_dfgnn.layout.GraphLayout` (CSR by destination, CSC for
    the backward) is built on the first call and cached on the ``edge_index`` /
    adjacency object, so the layers of a model share it (or build it ahead of time
    with :class:`pyg_dfgnn.transforms.CacheLayout`).

    Args:
        in_channels (int or tuple): as in ``TransformerConv``.
        out_channels (int): size of each head's output.
        heads (int, optional), concat (bool, optional), beta (bool, optional),
        dropout (float, optional), edge_dim (int, optional), bias (bool, optional),
        root_weight (bool, optional), **kwargs: as in ``TransformerConv``.
        strategy (str, optional): fusion method of the CUDA kernels:
            ``"auto"`` (paper §4.2 rule on the device's shared memory and the
            graph's largest in-degree), ``"smmf"`` (shared-memory maximisation
            fusion, node-parallel) or ``"pmf"`` (parallelism maximisation fusion,
            edge-parallel SDDMM; calls with edge features run SMMF, as the
            ``"dot_edge"`` score has no PMF path). Ignored on CPU.
            (default: ``"auto"``)
        fused_projection (bool, optional): on the fused path and while autograd
            records (training), run the query, key, value and skip projections
            of the same features as one autograd node (a bipartite pair: one
            for key and value, one for query and skip) whose forward runs one
            GEMM per projection and whose backward joins them: one input GEMM
            and one weight GEMM over the concatenated weights and output
            gradients. The parameters and ``state_dict`` stay PyG's, and
            gradients reach each ``lin_*``. Lazy
            (``in_channels=-1``) weights before their first call, replaced
            ``lin_*`` modules and ``lin_*`` with hooks run separately. Also
            an attribute, which may be flipped on a built layer (benchmarks).
            (default: :obj:`True`)
        edge_tails (bool, optional): run narrow edge features as tails (the
            ``"dot_edge_tail"`` score, no ``[E, H, C]`` tensor) where
            :func:`~pyg_dfgnn.ops.scores.dot_edge_tail.tails_pay` says they move
            fewer bytes; :obj:`False` always projects them to ``[E, H, C]`` rows
            (the ``"dot_edge"`` score). Also an attribute, as
            ``fused_projection``. (default: :obj:`True`)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite,
          edge indices :math:`(2, |\mathcal{E}|)` (``Tensor`` or ``EdgeIndex``) or a
          sparse ``adj_t`` (``SparseTensor`` or ``torch.sparse`` COO/CSR),
          edge features :math:`(|\mathcal{E}|, D)` *(optional)*: ``edge_attr``
          in the adjacency's edge order (a sparse ``adj_t``'s row-major order), or,
          without ``edge_attr``, the values of a ``SparseTensor`` or of a
          ``torch.sparse`` matrix with a feature dimension, as PyG takes them
        - **output:** node features :math:`(|\mathcal{V}_t|, H * F_{out})`
          (or :math:`(|\mathcal{V}_t|, F_{out})` if ``concat=False``); with
          ``return_attention_weights`` set to a bool, additionally
          ``(edge_index, alpha)`` with ``alpha`` :math:`(|\mathcal{E}|, H)` in the
          input edge order, or a ``SparseTensor`` holding ``alpha``, exactly as PyG.

    Falls back to PyG's own ``forward`` (same results, unfused) when:

    * edge features without ``edge_dim`` (PyG adds them, unprojected, to the
      values only), ``edge_dim`` without edge features (PyG raises), or edge
      features that are not ``[E, edge_dim]`` with one row per edge;
    * the adjacency is an uncoalesced ``torch.sparse`` COO matrix (PyG keeps its
      duplicate entries as separate edges) or a ``torch.sparse`` layout other than
      COO/CSR (PyG raises for it);
    * node features whose counts disagree with the adjacency's size (a sparse
      ``adj_t``'s shape, an ``EdgeIndex``'s ``sparse_size``; PyG raises);
    * ``flow="target_to_source"``, an ``aggr`` other than ``"add"``, explain
      mode, or registered message-passing hooks;
    * training with ``dropout >= 1``, or inputs that are not plain tensors;
    * CUDA inputs when the compiled kernels are missing (warned once per
      process, with the reason).

    :func:`torch.jit.script` compiles PyG's ``TransformerConv`` forward in this
    layer's place, sharing its parameters
    (:func:`~pyg_dfgnn.nn._common.native_twin`), so the layer scripts wherever
    ``TransformerConv`` does; the fused op runs eagerly and under
    ``torch.compile``.

    Differences from PyG: the returned attention weights are detached from the
    autograd graph (PyG's carry gradients); attention dropout draws its own mask (in
    the kernel from a seed taken from torch's generator; on the CPU over the edges
    in the layout's order), so from the same seed it can drop other weights than
    ``TransformerConv``.
    """
    #: Default of ``fused_projection``; a layer that :func:`~pyg_dfgnn.nn.fuse`
    #: switches in place (no ``__init__`` runs) reads this.
    fused_projection: bool = True
    #: Default of ``edge_tails``, read as ``fused_projection``'s.
    edge_tails: bool = True
    #: Edge features (``edge_dim``) run fused: :func:`~pyg_dfgnn.nn.fuse` reports
    #: such a layer as fused.
    fuses_edge_features: bool = True

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 *args, strategy: str = "auto", fused_projection: bool = True,
                 edge_tails: bool = True, **kwargs):
        use_own_propagate(type(self))
        super().__init__(in_channels, out_channels, *args, **kwargs)
        self.strategy = check_strategy(strategy)
        self.fused_projection = bool(fused_projection)
        self.edge_tails = bool(edge_tails)

    def _weights(self):
        r"""``(weights, biases)`` of ``lin_query``, ``lin_key``, ``lin_value`` (and
        ``lin_skip`` with ``root_weight``), or ``None`` where one is hooked,
        replaced or lazy (its module call then runs, as in PyG)."""
        lins = [self.lin_query, self.lin_key, self.lin_value]
        if self.root_weight:
            lins.append(self.lin_skip)
        if not plain_linears(lins):
            return None
        # each weight read once: a module attribute costs host time
        ws = [lin.weight for lin in lins]
        # a lazy weight is shaped by its first call (isinstance: Dynamo traces it)
        if any(isinstance(w, UninitializedParameter) for w in ws):
            return None
        return ws, [lin.bias for lin in lins]

    def _project(self, x: Tuple[Tensor, Tensor], rows: Optional[int], params,
                 tails: Optional[Tensor] = None):
        r"""``(query, key, value, x_r)``: the outputs of ``lin_query``, ``lin_key``,
        ``lin_value`` and ``lin_skip`` (``params``: :meth:`_weights`). Where
        ``rows`` is set, the query covers ``x[1][:rows]`` and is zero below: the
        destinations past the layout's ``dst_extent`` have no in-edge, so no score
        reads their query. With ``tails`` (``[H, C, D]``, :func:`tail_weight`) the
        query rows are the tails' ``C + D`` channels per head
        (:func:`tail_projections`). ``x_r`` is ``None`` when the skip projection is
        left to its own call after the attention, where PyG makes it (a lazy
        ``lin_skip`` then draws its initial weights in PyG's order)."""
        if params is None:
            return self.lin_query(x[1]), self.lin_key(x[0]), self.lin_value(x[0]), None
        ws, bs = params
        if tails is not None:
            ws, bs = tail_projections(ws, bs, tails)
        if not (torch.is_grad_enabled() and self.fused_projection):
            if not torch.is_grad_enabled():
                query = linear_rows(x[1], ws[0], bs[0], rows)
            else:
                query = F.linear(x[1], ws[0], bs[0])
            return query, F.linear(x[0], ws[1], bs[1]), F.linear(x[0], ws[2], bs[2]), None
        # Joined only where autograd records, and only in the backward: one input
        # and one weight GEMM over the joined gradients instead of three or four
        # each. The forward runs a GEMM per projection, as one joined GEMM's column
        # views would cost copies into the kernels' contiguous [N, H, C] rows
        # (docs/design.md, "GT projections"). Under
        # torch.compile one joined GEMM: the compiler fuses those copies, and the
        # row prefix would make the graph's sizes constants of the compiled code.
        if torch.compiler.is_compiling():
            join = joined_gemm
        else:
            join = functools.partial(_joined_linear, rows=rows)
        if x[0] is x[1]:
            query, key, value, *x_r = join(x[0], ws, bs)
        else:
            key, value = _joined_linear(x[0], ws[1:3], bs[1:3])
            query, *x_r = join(x[1], ws[:1] + ws[3:], bs[:1] + bs[3:])
        return query, key, value, (x_r[0] if x_r else None)

    def _edge_reason(self, edge_index, edge_attr: OptTensor) -> str:
        r"""Why the edge features of this call send it to PyG's ``forward``
        (``""``: none, or they run fused); the adjacency is one
        :func:`~pyg_dfgnn.nn._common.adjacency_supported` takes."""
        feats = message_edge_features(edge_index, edge_attr)
        if self.lin_edge is None:
            return ("" if feats is None else
                    "edge features without edge_dim (PyG adds them, unprojected, to the values)")
        if feats is None:
            return "edge_dim set but no edge features given (PyG raises)"
        num_edges = num_adjacency_edges(edge_index)
        if not (isinstance(feats, Tensor) and feats.dim() == 2 and feats.size(0) == num_edges):
            return "edge features that are not [E, edge_dim] (PyG raises or broadcasts them)"
        return ""

    def fallback_reason(self, x, edge_index, edge_attr=None,
                        return_attention_weights=None) -> str:
        r"""Why this call runs PyG's ``forward`` (``""``: it runs fused)."""
        if propagate_is_customised(self):
            return "flow, aggr, explain mode or message-passing hooks"
        if self.training and self.dropout >= 1.0:
            return "dropout >= 1 (PyG's F.dropout drops everything)"
        xs = (x, x) if isinstance(x, Tensor) else x
        if not (isinstance(xs, (tuple, list)) and len(xs) == 2
                and all(isinstance(t, Tensor) for t in xs)):
            return "features that are not a tensor or a pair of tensors"
        if not adjacency_supported(edge_index, isinstance(return_attention_weights, bool)):
            return "an adjacency PyG's propagate handles itself (or rejects)"
        reason = self._edge_reason(edge_index, edge_attr)
        if reason:
            return reason
        return kernels_missing(self, xs)

    def forward(  # noqa: F811
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        return_attention_weights: Optional[bool] = None,
    ):
        r"""Runs the forward pass (same signature and results as
        :meth:`torch_geometric.nn.conv.TransformerConv.forward`).

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): node features.
            edge_index (torch.Tensor, EdgeIndex, SparseTensor or torch.sparse):
                the graph.
            edge_attr (torch.Tensor, optional): ``[E, edge_dim]`` edge features in
                the adjacency's edge order (a sparse matrix's values by default).
            return_attention_weights (bool, optional): when set to a bool (even
                ``False``, as in PyG), also return ``(edge_index, alpha)``.
        """
        if self.fallback_reason(x, edge_index, edge_attr, return_attention_weights):
            return super().forward(x, edge_index, edge_attr, return_attention_weights)

        H, C = self.heads, self.out_channels
        if isinstance(x, Tensor):
            x = (x, x)
        ok, size = edge_index_size(edge_index, x[0].size(0), x[1].size(0))
        if not ok:
            return super().forward(x, edge_index, edge_attr, return_attention_weights)

        params = self._weights()
        tails = feats = None
        if self.lin_edge is not None:
            feats = message_edge_features(edge_index, edge_attr)
            # a lazy projection makes PyG's module calls, lin_edge's after the others
            if params is not None and self.edge_tails:
                tails = tail_weight(self.lin_edge, feats, H, C, x[1])
        if torch.compiler.is_compiling():
            # No row prefix: a Python int of the layout would be a guarded
            # constant, recompiling for every mini-batch; the layout is looked up
            # after the projections, where the graph break it costs falls.
            query, key, value, x_r = self._project(x, None, params, tails)
            layout = get_layout(edge_index, size=size, add_self_loops=False)
        else:
            layout = get_layout(edge_index, size=size, add_self_loops=False)
            rows = layout.dst_extent
            query, key, value, x_r = self._project(x, rows if rows < x[1].size(0) else None,
                                                   params, tails)
        # Contiguous [N, H * C] projections, except under torch.compile: the
        # kernels read these [N, H, C] views without a copy (gt_attention's
        # .contiguous() returns them). With tails, C + D query channels per head.
        width = C if tails is None else C + tails.size(-1)
        query, key, value = query.view(-1, H, width), key.view(-1, H, C), value.view(-1, H, C)
        strategy, edge = self.strategy, None
        if self.lin_edge is not None:
            if tails is not None:
                edge = csr_tails(layout, feats, tails, query.dtype)
            else:
                edge = edge_rows(self.lin_edge, layout, feats, H, C)
            if strategy == "pmf":
                strategy = "smmf"  # the dot_edge scores have no PMF path
        want_alpha = isinstance(return_attention_weights, bool)
        res = gt_attention(layout, query, key, value, scale=1.0 / math.sqrt(C),
                           dropout=self.dropout if self.training else 0.0,
                           training=self.training, return_attention=want_alpha,
                           strategy=strategy, edge=edge, edge_order="csr")
        out, alpha = res if want_alpha else (res, None)
        if tails is not None:
            out = edge_tails_out(out, tails)

        if self.concat:
            out = out.reshape(-1, self.heads * self.out_channels)
        else:
            out = out.mean(dim=1)

        if self.root_weight:
            if x_r is None:
                x_r = self.lin_skip(x[1])
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1))
                beta = beta.sigmoid()
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r

        if want_alpha:
            if is_sparse_tensor(edge_index):
                return out, edge_index.set_value(alpha, layout='coo')
            return out, (edge_index, alpha)
        return out

