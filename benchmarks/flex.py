r"""FlexAttention as a yardstick for the GT (dot-product) score on batch graphs.

:func:`torch.nn.attention.flex_attention` computes ``softmax(scale * q k^T) v`` over
the pairs a :class:`~torch.nn.attention.flex_attention.BlockMask` allows; with the
graph's adjacency as the mask, that is :func:`pyg_dfgnn.ops.gt_attention`: each
destination's softmax over its in-edges of ``scale * q_i . k_j``, summing ``v_j``.
Two forms, both masked by the same lookup table (:class:`FlexGraph`):

* ``flex-seq``: the whole batch as one sequence of ``N`` nodes, ``[1, H, N, C]``;
  the ``mask_mod`` allows ``(q_idx, kv_idx)`` where both nodes lie in the same
  graph (a block-diagonal test on the batch vector) and the graph's padded
  adjacency holds the edge (``adj[g, local q, local kv]``); the table is
  ``B x M x M`` bytes (``M``: the largest graph), not ``N x N``.
* ``flex-padded``: each graph padded to ``M`` nodes (``to_dense_batch``-style,
  ``[B, H, M, C]``), the ``mask_mod`` reading ``adj[b, q_idx, kv_idx]``.

A destination without in-edges is a fully masked row: FlexAttention defines its
output as 0 and its log-sum-exp as ``-inf``, and its backward maps that
log-sum-exp to 0 so that the row passes no gradient (torch's
``flex_attention.py.jinja``, "[Note] Handle fully masked out rows"; the eager CPU
path uses ``_safe_softmax``): message passing's convention, so no guard is added
to the timed call. :func:`check` verifies that convention on each graph before a
form is timed (such rows exactly 0, every gradient finite), so a torch that
differs records a mismatch. Padding rows of ``flex-padded`` are fully masked too
and are dropped by the gather back to ``[N, H, C]``.

A mask allows a pair once; PyG counts a duplicate edge once per copy.
:func:`not_applicable` says when a graph has duplicate edges (or edges between
graphs, or a batch vector that is not sorted), where neither form computes
message passing's function.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: The two forms, in run order.
FORMS = ("flex-seq", "flex-padded")
#: Relative error (``||a - b|| / ||b||``) allowed against the float64 reference, for the
#: output and each gradient: the tolerances of the fused op's own tests.
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def api():
    r"""``(flex_attention, create_block_mask)`` from torch; ``ImportError`` on a torch
    without FlexAttention (before 2.5)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    return flex_attention, create_block_mask


def unsupported(device, dtype, with_backward: bool) -> Optional[str]:
    r"""``None``, or why FlexAttention cannot run here: a torch without it, or a device
    or dtype it refuses (torch 2.14 has no backward on the CPU). Runs the eager op on
    a 16-token input, so the answer is torch's own."""
    try:
        flex_attention, create_block_mask = api()
    except ImportError as e:
        return f"torch {torch.__version__} has no FlexAttention ({e})"
    x = torch.randn(1, 1, 16, 16, device=device, dtype=dtype, requires_grad=with_backward)
    try:
        with warnings.catch_warnings():
            # eager FlexAttention warns that it is unfused: this call only asks whether it runs
            warnings.simplefilter("ignore")
            bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 16, 16,
                                   device=device)
            flex_attention(x, x, x, block_mask=bm)
    except NotImplementedError as e:
        return f"NotImplementedError: {str(e).strip().splitlines()[0][:200]}"
    return None


def not_applicable(edge_index: Tensor, batch: Optional[Tensor]) -> Optional[str]:
    r"""``None``, or why a block mask cannot express this graph's message passing: no
    batch vector, a batch vector that is not sorted (graphs must be contiguous node
    ranges), edges between graphs, or duplicate edges (PyG counts each copy)."""
    if batch is None:
        return "not a batch of graphs"
    if batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any()):
        return "batch vector not sorted"
    src, dst = edge_index
    if bool((batch[src] != batch[dst]).any()):
        return "edges between graphs"
    n = batch.numel()
    pairs = dst.long() * n + src.long()
    dup = pairs.numel() - torch.unique(pairs).numel()
    if dup:
        return f"{dup} duplicate edges: a mask counts an edge once, PyG once per copy"
    return None


class FlexGraph:
    r"""The lookup tables of both forms, built on the graph's device from
    ``edge_index`` and a sorted batch vector: ``adj`` ``[B, M, M]`` bool (``adj[g, i,
    j]``: an edge from local node ``j`` to local node ``i`` of graph ``g``; ``M`` the
    largest graph), ``graph_of`` ``[N]`` (the batch vector), ``start`` ``[B]`` (each
    graph's first node), ``index`` ``[N]`` (each node's row in the padded ``[B * M]``)
    and ``empty`` ``[N]`` (nodes without in-edges)."""

    def __init__(self, edge_index: Tensor, batch: Tensor):
        n = batch.numel()
        self.B = int(batch.max()) + 1
        counts = torch.bincount(batch, minlength=self.B)
        self.M = int(counts.max())
        self.N = n
        self.start = counts.cumsum(0) - counts
        local = torch.arange(n, device=batch.device) - self.start[batch]
        src, dst = edge_index
        self.adj = torch.zeros(self.B, self.M, self.M, dtype=torch.bool, device=batch.device)
        self.adj[batch[dst], local[dst], local[src]] = True
        self.graph_of = batch
        self.index = batch * self.M + local
        self.empty = torch.bincount(dst, minlength=n) == 0

    def seq_mask_mod(self) -> Callable:
        """``mask_mod`` of ``flex-seq``: same graph and an edge (block-diagonal test,
        then the padded adjacency at the graph-local indices)."""
        adj, graph_of, start, last = self.adj, self.graph_of, self.start, self.M - 1

        def mask_mod(b, h, q_idx, kv_idx):
            g = graph_of[q_idx]
            # kv_idx outside q's graph reads a valid entry that the test discards
            kv = (kv_idx - start[g]).clamp(0, last)
            return (graph_of[kv_idx] == g) & adj[g, q_idx - start[g], kv]
        return mask_mod

    def padded_mask_mod(self) -> Callable:
        """``mask_mod`` of ``flex-padded``: the padded adjacency of graph ``b``."""
        adj = self.adj

        def mask_mod(b, h, q_idx, kv_idx):
            return adj[b, q_idx, kv_idx]
        return mask_mod

    def block_mask(self, form: str, build: Optional[Callable] = None):
        r"""The form's :class:`BlockMask` (128 x 128 blocks), made by ``build``
        (``create_block_mask``, or ``torch.compile(create_block_mask)``: compiled, it
        evaluates the ``mask_mod`` block by block without an ``N x N`` tensor)."""
        build = build or api()[1]
        if form == "flex-seq":
            return build(self.seq_mask_mod(), None, None, self.N, self.N,
                         device=self.adj.device)
        return build(self.padded_mask_mod(), self.B, None, self.M, self.M,
                     device=self.adj.device)

    def pad(self, x: Tensor) -> Tensor:
        """``[N, H, C]`` -> ``[B, H, M, C]``, zeros in the padding rows."""
        N, H, C = x.shape
        xd = x.new_zeros(self.B * self.M, H, C).index_copy(0, self.index, x)
        return xd.view(self.B, self.M, H, C).transpose(1, 2)

    def unpad(self, o: Tensor) -> Tensor:
        """``[B, H, M, C]`` -> ``[N, H, C]`` (the real nodes' rows)."""
        B, H, M, C = o.shape
        return o.transpose(1, 2).reshape(B * M, H, C)[self.index]


def attention(form: str, fg: FlexGraph, block_mask, q: Tensor, k: Tensor, v: Tensor,
              flex: Callable) -> Tensor:
    r"""``[N, H, C]`` GT attention of ``q`` / ``k`` / ``v`` ``[N, H, C]`` through ``flex``
    (``flex_attention``, compiled or not) in ``form``, scale ``1 / sqrt(C)``."""
    if form == "flex-seq":
        def seq(x):
            # a view made under no_grad still requires grad, and FlexAttention refuses
            # such inputs where it has no backward (the CPU)
            x = x if torch.is_grad_enabled() else x.detach()
            return x.transpose(0, 1).unsqueeze(0)   # [1, H, N, C], a view
        return flex(seq(q), seq(k), seq(v), block_mask=block_mask)[0].transpose(0, 1)
    return fg.unpad(flex(fg.pad(q), fg.pad(k), fg.pad(v), block_mask=block_mask))


def rel_err(got: Tensor, want: Tensor) -> float:
    """``||got - want|| / ||want||`` in float64 (``want`` float64; absolute if zero)."""
    diff = float((got.detach().double() - want).norm())
    ref = float(want.norm())
    return diff / ref if ref > 0 else diff


def check(fn: Callable[[], Tensor], leaves: Sequence[Tensor], g: Tensor, ref: Tensor,
          ref_grads: Optional[Sequence[Tensor]], dtype, empty: Tensor
          ) -> Tuple[Optional[str], Dict[str, float]]:
    r"""``(why, errors)``: ``fn()``'s output and, with ``ref_grads``, the gradients of
    ``<fn(), g>`` with respect to ``leaves`` against the float64 reference ``ref`` /
    ``ref_grads`` (relative errors in ``errors``: ``out``, ``grad0`` ...); ``why`` is
    ``None`` when every one is finite and below :data:`TOL` and the nodes without
    in-edges (``empty``) output exactly 0, else the first failure."""
    tol = TOL[dtype]
    errs: Dict[str, float] = {}
    if ref_grads is None:
        with torch.no_grad():
            out = fn()
        grads: Sequence[Tensor] = ()
    else:
        with torch.enable_grad():
            out = fn()
            grads = torch.autograd.grad(out, leaves, g)
    named = [("out", out, ref)] + [(f"grad{i}", a, b)
                                   for i, (a, b) in enumerate(zip(grads, ref_grads or ()))]
    why = None
    for name, got, want in named:
        if not bool(torch.isfinite(got).all()):
            why = why or f"{name} is not finite"
            errs[name] = math.inf
            continue
        errs[name] = rel_err(got, want)
        if errs[name] >= tol:
            why = why or f"{name} rel. err {errs[name]:.2e} vs float64 >= {tol:g}"
    if why is None and bool(empty.any()) and bool(out.detach()[empty].ne(0).any()):
        why = "rows without in-edges are not 0"
    return why, errs
