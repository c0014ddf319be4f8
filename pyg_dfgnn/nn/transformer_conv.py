"""Fused :class:`~torch_geometric.nn.conv.TransformerConv`."""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn.conv import TransformerConv
from torch_geometric.nn.dense.linear import Linear as PyGLinear
from torch_geometric.typing import Adj, OptTensor, PairTensor

from ..layout import get_layout
from ..ops import gt_attention
from ._common import (adjacency_supported, check_strategy, edge_index_size, is_sparse_tensor,
                      propagate_is_customised, use_own_propagate)

# Forwards that are exactly F.linear(x, weight, bias), so a join of them is too.
_PLAIN_FORWARDS = (PyGLinear.forward, torch.nn.Linear.forward)


def _plain_linears(lins: Sequence[torch.nn.Module]) -> bool:
    r"""Whether ``lins`` are plain linear maps without module hooks (a joined call
    would skip the hooks)."""
    for lin in lins:
        if (type(lin).forward not in _PLAIN_FORWARDS or lin._forward_pre_hooks
                or lin._forward_hooks or lin._backward_pre_hooks or lin._backward_hooks):
            return False
    return True


def _autocast_dtype(x: Tensor) -> Optional[torch.dtype]:
    r"""The dtype autocast runs ``F.linear(x, ...)`` in, or ``None`` where it
    leaves ``x``'s (autocast off for ``x``'s device type, or ``x`` other than
    float32 / float16 / bfloat16: autocast does not cast float64)."""
    dev = x.device.type
    if (x.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev)):
        return torch.get_autocast_dtype(dev)
    return None


class _Projections(torch.autograd.Function):
    r"""``F.linear(x, w_i, b_i)`` for each weight and bias, as one autograd node
    that runs separate GEMMs forward and joined GEMMs backward.

    Forward: one GEMM per projection, so each output is contiguous (the attention
    kernels read ``[N, H, C]`` rows of it without a copy). Backward: the output
    gradients, joined as :math:`\mathbf{G}` ``[N, sum(out_i)]``, go through one
    input GEMM :math:`\mathbf{G} [\mathbf{W}_1; \mathbf{W}_2; \ldots]` and one
    weight GEMM :math:`\mathbf{G}^\top \mathbf{x}`, whose rows are split back per
    weight (views of one tensor), and the bias gradients are the split
    :math:`\mathbf{G}` column sums. An output without a gradient (unused) leaves
    the join; the input GEMM runs only when ``x`` needs a gradient, the weight
    GEMM only when a weight does.

    Under autocast (``x`` float32 / float16 / bfloat16 on a device type whose
    autocast is on), ``x``, the weights and the biases are cast once to
    autocast's dtype, as ``F.linear`` would cast them, and the backward's GEMMs
    run in that dtype; every gradient comes back in its input's dtype.

    ``apply(x, *weights, *biases)``: ``x`` ``[..., F_in]``, weights
    ``[out_i, F_in]``, biases ``[out_i]`` or ``None``, as many biases as weights.
    Returns the tuple of outputs ``[..., out_i]``. The backward is
    ``once_differentiable`` (a double backward raises): nothing in this package
    or its tests takes one through the projections.
    """

    @staticmethod
    def forward(ctx, x: Tensor, *params: Optional[Tensor]) -> Tuple[Tensor, ...]:
        n = len(params) // 2
        ws, bs = list(params[:n]), list(params[n:])
        ctx.dtypes = [x.dtype] + [None if p is None else p.dtype for p in params]
        dtype = _autocast_dtype(x)
        if dtype is not None:
            # once here, not per F.linear (autocast casts x in each call)
            x = x.to(dtype)
            ws = [w.to(dtype) for w in ws]
            bs = [None if b is None else b.to(dtype) for b in bs]
        outs = tuple(F.linear(x, w, b) for w, b in zip(ws, bs))
        need = ctx.needs_input_grad
        # x for the weight gradients, the weights for x's gradient
        ctx.save_for_backward(x if any(need[1:n + 1]) else None,
                              *(ws if need[0] else [None] * n))
        ctx.sizes = [w.shape[0] for w in ws]
        ctx.set_materialize_grads(False)
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
        x, *ws = ctx.saved_tensors
        need, dtypes, n = ctx.needs_input_grad, ctx.dtypes, len(ctx.sizes)
        res: List[Optional[Tensor]] = [None] * (1 + 2 * n)
        live = [i for i in range(n) if grads[i] is not None]
        if not live:
            return tuple(res)
        sizes = [ctx.sizes[i] for i in live]
        # G [M, sum(out_i)], M the rows of every leading dimension
        g = torch.cat([grads[i].reshape(-1, ctx.sizes[i]) for i in live], dim=-1)
        if need[0]:
            w = torch.cat([ws[i] for i in live]) if len(live) > 1 else ws[live[0]]
            gx = g.to(w.dtype).mm(w)
            res[0] = gx.view(*grads[live[0]].shape[:-1], gx.shape[-1]).to(dtypes[0])
        if any(need[1 + i] for i in live):
            gw = g.to(x.dtype).t().mm(x.reshape(-1, x.shape[-1])).split(sizes)
            for i, gw_i in zip(live, gw):
                if need[1 + i]:
                    res[1 + i] = gw_i.to(dtypes[1 + i])
        if any(need[1 + n + i] for i in live):
            gb = g.sum(0).split(sizes)
            for i, gb_i in zip(live, gb):
                if need[1 + n + i]:
                    res[1 + n + i] = gb_i.to(dtypes[1 + n + i])
        return tuple(res)


def _joined_linear(x: Tensor, weights: List[Tensor],
                   biases: List[Optional[Tensor]]) -> Sequence[Tensor]:
    r"""``F.linear(x, w, b)`` for each weight and bias, with the backward's GEMMs
    joined (:class:`_Projections`); the weights are each layer's own parameters,
    so autograd reaches them. One projection is a plain ``F.linear``."""
    if len(weights) == 1:
        return [F.linear(x, weights[0], biases[0])]
    return _Projections.apply(x, *weights, *biases)


class FusedTransformerConv(TransformerConv):
    r"""Drop-in :class:`torch_geometric.nn.conv.TransformerConv` whose attention
    (SDDMM :math:`\mathbf{q}_i^\top \mathbf{k}_j / \sqrt{d}` -> edge softmax ->
    SpMM :math:`\sum_j \alpha_{i,j} \mathbf{v}_j`) runs as one fused op,
    :func:`pyg_dfgnn.ops.gt_attention` (DF-GNN paper §3–4: SMMF or PMF, chosen per
    call by the rule of §4.2; fused backward of §4.3).

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \sum_{j \in \mathcal{N}(i)} \alpha_{i,j} \mathbf{W}_2 \mathbf{x}_{j},
        \qquad
        \alpha_{i,j} = \textrm{softmax} \left(
        \frac{(\mathbf{W}_3\mathbf{x}_i)^{\top} (\mathbf{W}_4\mathbf{x}_j)}
        {\sqrt{d}} \right)

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
            edge-parallel SDDMM). Ignored on CPU. (default: ``"auto"``)
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

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite,
          edge indices :math:`(2, |\mathcal{E}|)` (``Tensor`` or ``EdgeIndex``) or a
          sparse ``adj_t`` (``SparseTensor`` or ``torch.sparse`` COO/CSR),
          edge features :math:`(|\mathcal{E}|, D)` *(optional, see below)*
        - **output:** node features :math:`(|\mathcal{V}_t|, H * F_{out})`
          (or :math:`(|\mathcal{V}_t|, F_{out})` if ``concat=False``); with
          ``return_attention_weights`` set to a bool, additionally
          ``(edge_index, alpha)`` with ``alpha`` :math:`(|\mathcal{E}|, H)` in the
          input edge order, or a ``SparseTensor`` holding ``alpha``, exactly as PyG.

    Falls back to PyG's own ``forward`` (same results, unfused) when:

    * edge features are used (``edge_dim`` set or ``edge_attr`` given);
    * the adjacency is an uncoalesced ``torch.sparse`` COO matrix (PyG keeps its
      duplicate entries as separate edges) or a ``torch.sparse`` layout other than
      COO/CSR (PyG raises for it);
    * an ``EdgeIndex`` whose ``sparse_size`` disagrees with the features (PyG raises);
    * ``flow="target_to_source"``, an ``aggr`` other than ``"add"``, explain
      mode, or registered message-passing hooks;
    * training with ``dropout >= 1``, or inputs that are not plain tensors.

    Differences from PyG: the returned attention weights are detached from the
    autograd graph (PyG's carry gradients).
    """
    #: Default of ``fused_projection``; a layer that :func:`~pyg_dfgnn.nn.fuse`
    #: switches in place (no ``__init__`` runs) reads this.
    fused_projection: bool = True

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 *args, strategy: str = "auto", fused_projection: bool = True, **kwargs):
        use_own_propagate(type(self))
        super().__init__(in_channels, out_channels, *args, **kwargs)
        self.strategy = check_strategy(strategy)
        self.fused_projection = bool(fused_projection)

    def _project(self, x: Tuple[Tensor, Tensor]):
        r"""``(query, key, value, x_r)``: the outputs of ``lin_query``, ``lin_key``,
        ``lin_value`` and ``lin_skip``. ``x_r`` is ``None`` when the skip
        projection is left to its own call after the attention, where PyG makes
        it (a lazy ``lin_skip`` then draws its initial weights in PyG's order)."""
        lins = [self.lin_query, self.lin_key, self.lin_value]
        if self.root_weight:
            lins.append(self.lin_skip)
        # Joined only where autograd records, and only in the backward: one input
        # and one weight GEMM over the joined gradients instead of three or four
        # each. The forward runs a GEMM per projection, as one joined GEMM's column
        # views would cost copies into the kernels' contiguous [N, H, C] rows; on
        # an H100 (10K-100K nodes, fp32 and bf16) a joined forward GEMM alone is
        # 0.56-1.00x of separate ones in 5 of 6 shapes, while joining forward and
        # backward is 1.02-1.31x in 5 of 6 (benchmarks/projection_ab.py times
        # this separate-forward, joined-backward split against separate GEMMs).
        if self.fused_projection and torch.is_grad_enabled() and _plain_linears(lins):
            # each weight read once: a module attribute costs host time
            ws = [lin.weight for lin in lins]
            # a lazy weight is shaped by its first call (isinstance: Dynamo traces it)
            if not any(isinstance(w, UninitializedParameter) for w in ws):
                bs = [lin.bias for lin in lins]
                if x[0] is x[1]:
                    query, key, value, *x_r = _joined_linear(x[0], ws, bs)
                else:
                    key, value = _joined_linear(x[0], ws[1:3], bs[1:3])
                    query, *x_r = _joined_linear(x[1], ws[:1] + ws[3:], bs[:1] + bs[3:])
                return query, key, value, (x_r[0] if x_r else None)
        return self.lin_query(x[1]), self.lin_key(x[0]), self.lin_value(x[0]), None

    def _fusable(self, x, edge_index, edge_attr, return_attention_weights) -> bool:
        if edge_attr is not None or self.lin_edge is not None:
            return False
        if propagate_is_customised(self):
            return False
        if self.training and self.dropout >= 1.0:
            return False
        xs = (x, x) if isinstance(x, Tensor) else x
        if not (isinstance(xs, (tuple, list)) and len(xs) == 2
                and all(isinstance(t, Tensor) for t in xs)):
            return False
        return adjacency_supported(edge_index, isinstance(return_attention_weights, bool))

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
            edge_attr (torch.Tensor, optional): edge features (runs PyG's path).
            return_attention_weights (bool, optional): when set to a bool (even
                ``False``, as in PyG), also return ``(edge_index, alpha)``.
        """
        if not self._fusable(x, edge_index, edge_attr, return_attention_weights):
            return super().forward(x, edge_index, edge_attr, return_attention_weights)

        H, C = self.heads, self.out_channels
        if isinstance(x, Tensor):
            x = (x, x)
        ok, size = edge_index_size(edge_index, x[0].size(0), x[1].size(0))
        if not ok:
            return super().forward(x, edge_index, edge_attr, return_attention_weights)

        query, key, value, x_r = self._project(x)
        # Contiguous [N, H * C] projections: the kernels read these [N, H, C] views
        # without a copy (gt_attention's .contiguous() returns them).
        query, key, value = query.view(-1, H, C), key.view(-1, H, C), value.view(-1, H, C)

        layout = get_layout(edge_index, size=size, add_self_loops=False)
        want_alpha = isinstance(return_attention_weights, bool)
        res = gt_attention(layout, query, key, value, scale=1.0 / math.sqrt(C),
                           dropout=self.dropout if self.training else 0.0,
                           training=self.training, return_attention=want_alpha,
                           strategy=self.strategy)
        out, alpha = res if want_alpha else (res, None)

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

