r"""The query / key / value / skip projections of :class:`FusedTransformerConv`.

Eager training runs them as one autograd node (``torch.ops.dfgnn.projections``
with the extension, :class:`Projections` without it): a GEMM per projection
forward (each output contiguous, as the attention kernels read it) and one input
plus one weight GEMM over the joined gradients backward. The query
projection may stop at a row prefix: destinations past
:attr:`~pyg_dfgnn.layout.GraphLayout.dst_extent` have no in-edge, so no score
reads their query (in a ``NeighborLoader`` batch, the last hop's nodes: most of
the batch). Under ``torch.compile`` the projections run as one GEMM over the
concatenated weights (:func:`joined_gemm`), whose column views the compiler's
own kernels copy. :func:`edge_rows` projects edge features to the ``[E, H, C]``
rows of the edge scores (``TransformerConv`` and ``GATv2Conv`` with
``edge_dim``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch_geometric.nn.dense.linear import Linear as PyGLinear

from ..extension import HAS_EXTENSION
if HAS_EXTENSION:
    from ..ops.direct import call_op

# Forwards that are exactly F.linear(x, weight, bias), so a join of them is too.
_PLAIN_FORWARDS = (PyGLinear.forward, torch.nn.Linear.forward)


def plain_linears(lins: Sequence[torch.nn.Module]) -> bool:
    r"""Whether ``lins`` are plain linear maps without module hooks (a joined call
    would skip the hooks)."""
    for lin in lins:
        if (type(lin).forward not in _PLAIN_FORWARDS or lin._forward_pre_hooks
                or lin._forward_hooks or lin._backward_pre_hooks or lin._backward_hooks):
            return False
    return True


def edge_rows(lin_edge: torch.nn.Module, layout, feats: Tensor, heads: int, channels: int,
              loops_appended: bool = False) -> Tensor:
    r"""``lin_edge(feats)`` as ``[E, H, C]`` rows in ``layout``'s CSR edge order,
    for the edge features ``feats`` ``[E, D]`` in the layout's input edge order
    (``loops_appended``: in the order of its ``edge_index``, self-loops last; see
    :meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order`).

    Raises:
        ValueError: as :meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order`.
    """
    if plain_linears([lin_edge]):
        # The [E, D] features are narrower than the [E, H * C] projection: the
        # gather moves less, and one [E, H, C] tensor exists.
        rows = lin_edge(layout.to_csr_order(feats, loops_appended))
    else:
        # A replaced or hooked lin_edge sees the rows in PyG's order.
        rows = layout.to_csr_order(lin_edge(feats), loops_appended)
    return rows.view(-1, heads, channels)


def autocast_dtype(x: Tensor) -> Optional[torch.dtype]:
    r"""The dtype autocast runs ``F.linear(x, ...)`` in, or ``None`` where it
    leaves ``x``'s (autocast off for ``x``'s device type, or ``x`` other than
    float32 / float16 / bfloat16: autocast does not cast float64)."""
    dev = x.device.type
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return None
    # CUDA and CPU always have autocast; other device types are asked first
    # (torch.is_autocast_enabled raises for one without it).
    if dev not in ("cuda", "cpu") and not torch.amp.is_autocast_available(dev):
        return None
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def linear_rows(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                rows: Optional[int]) -> Tensor:
    r"""``F.linear(x, weight, bias)`` on the first ``rows`` rows of a 2-D ``x``,
    zeros below them (the GEMM writes into the output's leading rows); all rows
    where ``rows`` is ``None``. In autocast's dtype where autocast would cast
    ``F.linear``. Not differentiable (:class:`Projections` and no-grad calls use
    it)."""
    if rows is None:
        return F.linear(x, weight, bias)
    dtype = autocast_dtype(x)
    if dtype is not None:  # out= calls are outside autocast: cast as F.linear would
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    out = x.new_empty(x.shape[0], weight.shape[0])
    out[rows:].zero_()
    if rows:
        head = out[:rows]  # leading rows of a contiguous tensor: contiguous
        if bias is None:
            torch.mm(x[:rows], weight.t(), out=head)
        else:
            torch.addmm(bias, x[:rows], weight.t(), out=head)
    return out


def _column_sums(g: Tensor) -> Tensor:
    r"""``g.sum(0)`` of a 2-D ``g`` as a GEMV against ones: on an H100 it reads
    ``g`` at 1.2-2.7x the rate of the column reduction (110K x 768 fp32
    0.134 / 0.158 ms, bf16 0.072 / 0.106; 37K x 512 fp32 0.038 / 0.074)."""
    if g.shape[0] == 0:
        return g.sum(0)
    return torch.mv(g.t(), g.new_ones(g.shape[0]))


def _split_into(res: List[Optional[Tensor]], t: Tensor, base: int, joined: List[int],
                sizes: List[int], dtypes: List[Optional[torch.dtype]], need) -> None:
    r"""The joined gradient ``t`` (the joined projections' rows, in order) split
    into ``res[1 + base + i]`` per joined projection ``i`` that needs it, in the
    dtype of parameter ``base + i``: one cast where those share one (autocast's
    GEMMs over float32 parameters), not one per projection (``to`` of a part
    already in its dtype is free)."""
    wanted = {dtypes[base + i] for i in joined if need[1 + base + i]}  # None: a missing bias
    if len(wanted) == 1:
        t = t.to(wanted.pop())
    for i, part in zip(joined, t.split(sizes)):
        if need[1 + base + i]:
            res[1 + base + i] = part.to(dtypes[base + i])


class Projections(torch.autograd.Function):
    r"""``F.linear(x, w_i, b_i)`` for each weight and bias, as one autograd node
    that runs separate GEMMs forward and joined GEMMs backward.

    Forward: one GEMM per projection, so each output is contiguous (the attention
    kernels read ``[N, H, C]`` rows of it without a copy). With ``rows`` set (2-D
    ``x`` only), the first projection covers ``x[:rows]`` and its other rows are
    zero: the caller reads only those rows, and its gradient there is ignored.
    Backward: the output gradients, joined as :math:`\mathbf{G}`
    ``[N, sum(out_i)]``, go through one input GEMM
    :math:`\mathbf{G} [\mathbf{W}_1; \mathbf{W}_2; \ldots]` and one weight GEMM
    :math:`\mathbf{G}^\top \mathbf{x}`, whose rows are split back per weight
    (views of one tensor), and the bias gradients are the split
    :math:`\mathbf{G}` column sums (a GEMV against ones); a first projection
    cut at ``rows`` stays out of the join and gets its own two GEMMs over those
    rows. An output without a gradient (unused) leaves the join; the input GEMM
    runs only when ``x`` needs a gradient, the weight GEMM only when a weight
    does.

    Under autocast (``x`` float32 / float16 / bfloat16 on a device type whose
    autocast is on), ``x``, the weights and the biases are cast once to
    autocast's dtype, as ``F.linear`` would cast them, and the backward's GEMMs
    run in that dtype; every gradient comes back in its input's dtype.

    ``apply(x, rows, *weights, *biases)``: ``x`` ``[..., F_in]``, ``rows`` an
    int below ``x.shape[0]`` or ``None``, weights ``[out_i, F_in]``, biases
    ``[out_i]`` or ``None``, as many biases as weights. Returns the tuple of
    outputs ``[..., out_i]``. The backward is ``once_differentiable`` (a double
    backward raises): nothing in this package or its tests takes one through the
    projections.
    """

    @staticmethod
    def forward(ctx, x: Tensor, rows: Optional[int], *params: Optional[Tensor]
                ) -> Tuple[Tensor, ...]:
        n = len(params) // 2
        ws, bs = list(params[:n]), list(params[n:])
        ctx.dtypes = [x.dtype] + [None if p is None else p.dtype for p in params]
        dtype = autocast_dtype(x)
        if dtype is not None:
            # once here, not per F.linear (autocast casts x in each call)
            x = x.to(dtype)
            ws = [w.to(dtype) for w in ws]
            bs = [None if b is None else b.to(dtype) for b in bs]
        if rows is not None and (x.dim() != 2 or rows >= x.shape[0]):
            rows = None
        outs = tuple(linear_rows(x, w, b, rows if i == 0 else None)
                     for i, (w, b) in enumerate(zip(ws, bs)))
        need = ctx.needs_input_grad
        # x for the weight gradients, the weights for x's gradient
        ctx.save_for_backward(x if any(need[2:n + 2]) else None,
                              *(ws if need[0] else [None] * n))
        ctx.sizes = [w.shape[0] for w in ws]
        ctx.rows = rows
        ctx.set_materialize_grads(False)
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
        x, *ws = ctx.saved_tensors
        need, dtypes, n, rows = ctx.needs_input_grad, ctx.dtypes, len(ctx.sizes), ctx.rows
        res: List[Optional[Tensor]] = [None] * (2 + 2 * n)
        live = [i for i in range(n) if grads[i] is not None]
        if not live:
            return tuple(res)
        cut = rows is not None and live[0] == 0  # the first projection, rows only
        joined = live[1:] if cut else live
        gq = grads[0][:rows] if cut else None
        g = None
        if joined:
            sizes = [ctx.sizes[i] for i in joined]
            # G [M, sum(out_i)], M the rows of every leading dimension
            g = (torch.cat([grads[i].reshape(-1, ctx.sizes[i]) for i in joined], dim=-1)
                 if len(joined) > 1 else grads[joined[0]].reshape(-1, sizes[0]))
        if need[0]:
            if g is not None:
                w = torch.cat([ws[i] for i in joined]) if len(joined) > 1 else ws[joined[0]]
                gx = g.to(w.dtype).mm(w)
            else:
                gx = ws[0].new_zeros(grads[0].shape[0], ws[0].shape[1])
            if cut and rows:
                gx[:rows].addmm_(gq.to(ws[0].dtype), ws[0])
            res[0] = gx.view(*grads[live[0]].shape[:-1], gx.shape[-1]).to(dtypes[0])
        if g is not None and any(need[2 + i] for i in joined):
            _split_into(res, g.to(x.dtype).t().mm(x.reshape(-1, x.shape[-1])), 1, joined,
                        sizes, dtypes, need)
        if g is not None and any(need[2 + n + i] for i in joined):
            _split_into(res, _column_sums(g), 1 + n, joined, sizes, dtypes, need)
        if cut:
            if need[2]:
                gw0 = (gq.to(x.dtype).t().mm(x[:rows]) if rows
                       else x.new_zeros(ctx.sizes[0], x.shape[-1]))
                res[2] = gw0.to(dtypes[1])
            if need[2 + n]:
                res[2 + n] = _column_sums(gq).to(dtypes[1 + n])
        return tuple(res)


def joined_linear(x: Tensor, weights: List[Tensor], biases: List[Optional[Tensor]],
                  rows: Optional[int] = None) -> Sequence[Tensor]:
    r"""``F.linear(x, w, b)`` for each weight and bias, with the backward's GEMMs
    joined (the first projection over ``x[:rows]`` where ``rows`` is set); the
    weights are each layer's own parameters, so autograd reaches them. One
    projection over all rows is a plain ``F.linear``.

    In eager mode with the extension built this is ``torch.ops.dfgnn.projections``,
    whose node is C++ (``cuda/glue/projections.cpp``): the backward runs on the
    autograd engine's thread without the GIL, where :class:`Projections` runs
    Python. Under ``torch.compile`` it is :class:`Projections`, which the compiler
    traces through: the C++ autograd kernel reads concrete sizes, which would
    specialise dynamic shapes (a recompile per mini-batch)."""
    if len(weights) == 1 and rows is None:
        return [F.linear(x, weights[0], biases[0])]
    if HAS_EXTENSION and not torch.compiler.is_compiling():
        return call_op("projections", (x, rows, weights, biases))
    return Projections.apply(x, rows, *weights, *biases)


def joined_gemm(x: Tensor, weights: List[Tensor],
                biases: List[Optional[Tensor]]) -> Sequence[Tensor]:
    r"""``F.linear(x, w, b)`` for each weight and bias, as one GEMM over the
    concatenated weights (concatenated in every call, so autograd reaches each
    layer's own parameters), split into views of its columns (not contiguous).
    The compiled path: the compiler fuses the copies the views need."""
    if len(weights) == 1:
        return [F.linear(x, weights[0], biases[0])]
    sizes = [w.shape[0] for w in weights]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([w.new_zeros(n) if b is None else b
                          for w, b, n in zip(weights, biases, sizes)])
    return F.linear(x, torch.cat(weights), bias).split(sizes, dim=-1)
