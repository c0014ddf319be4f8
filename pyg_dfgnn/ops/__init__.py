r"""Fused attention ops: SDDMM -> edge softmax -> SpMM in one call.

Each op takes a :class:`~pyg_dfgnn.layout.GraphLayout` and dense per-node
tensors. On CUDA tensors, with the extension built and a supported head size,
it runs the fused kernels (``torch.ops.dfgnn``) that the kernel plan
(:mod:`pyg_dfgnn.ops.plan`: SMMF or PMF, paper §4.2, and each kernel variant)
picks; otherwise it runs :mod:`pyg_dfgnn.ops.reference`. Both compute the same
function.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .._ext import HAS_EXTENSION
from . import plan, reference, schedule
from ._args import (agnn_args, agnn_op_args, agnn_prepared, cos_op_args, gat_args, gat_op_args,
                    gt_args, gt_op_args, prepared)
from .plan import choose_strategy, kernel_supports

if HAS_EXTENSION:
    from .. import _C
    from . import _custom  # noqa: F401  (fake implementations; autograd is in C++)

__all__ = ["gt_attention", "agnn_attention", "gat_attention", "fused_attention",
           "uses_kernels", "reference", "plan", "schedule", "choose_strategy",
           "kernel_supports", "gt_op_args", "gat_op_args", "agnn_op_args", "cos_op_args"]

OpResult = Union[Tensor, Tuple[Tensor, Tensor]]


def _check_features(layout, q: Tensor, k: Tensor, v: Tensor, who: str) -> None:
    qs = q.shape
    if (len(qs) == 3 and qs[0] == layout.num_dst
            and k.shape == v.shape == (layout.num_src, qs[1], qs[2])
            and q.dtype == k.dtype == v.dtype and q.device == layout._device):
        # The common case, in one expression: this runs on every call's host path
        # (no torch.Size slices, the layout's device cached).
        return
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"{who}: q, k, v must be [N, H, C], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.size(0) != layout.num_dst:
        raise ValueError(f"{who}: q has {q.size(0)} rows but the graph has {layout.num_dst} "
                         "destination nodes")
    if k.size(0) != layout.num_src or v.size(0) != layout.num_src:
        raise ValueError(f"{who}: k and v must have {layout.num_src} rows (source nodes), got "
                         f"{k.size(0)} and {v.size(0)}")
    if q.shape[1:] != k.shape[1:] or k.shape[1:] != v.shape[1:]:
        raise ValueError(f"{who}: q, k, v must share [H, C], got {tuple(q.shape[1:])}, "
                         f"{tuple(k.shape[1:])}, {tuple(v.shape[1:])}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{who}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != layout.device:
        raise ValueError(f"{who}: the features are on {q.device} but the layout is on "
                         f"{layout.device}; move the graph with .to()")


def uses_kernels(layout, x: Tensor) -> bool:
    """Whether a call with features like ``x`` ``[N, H, C]`` runs the fused CUDA kernels.

    Raises:
        NotImplementedError: for CUDA features on a graph whose indices need int64
            (``E``, ``N_src`` or ``N_dst`` >= 2^31): the kernels index with int32,
            and the reference path would allocate ``[E, H, C]`` tensors.
    """
    return _runs_kernels(layout, x.is_cuda, x.size(-1), x.dtype)


def _runs_kernels(layout, is_cuda: bool, head_size: int, dtype: torch.dtype) -> bool:
    # uses_kernels for callers that have the head size and dtype at hand: each
    # Tensor attribute read costs a good part of a microsecond of host time.
    if not (HAS_EXTENSION and is_cuda):
        return False
    if layout.col.dtype != torch.int32:
        raise NotImplementedError(
            f"pyg_dfgnn: the fused CUDA kernels take graphs with fewer than 2^31 edges and "
            f"nodes (int32 indices); this one has E={layout.num_edges}, N_src="
            f"{layout.num_src}, N_dst={layout.num_dst} ({layout.col.dtype} indices). Split "
            "it (e.g. torch_geometric.loader.NeighborLoader) or run the native PyG layer")
    return kernel_supports(head_size, dtype)


def _seed() -> int:
    # Drawn from torch's CPU generator, so torch.manual_seed makes dropout reproducible.
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        # The seed is a kernel argument: a captured graph would replay one mask forever.
        raise RuntimeError("pyg_dfgnn: attention dropout (p > 0) cannot be captured in a CUDA "
                           "graph (the mask's seed would be frozen); capture with dropout=0 or "
                           "in eval mode")
    return int(torch.randint(0, 2**62, (1,)).item())


def _dropout_p(dropout: float, training: bool, who: str) -> float:
    """The dropout probability a call applies; raises for one outside ``[0, 1)``."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{who}: dropout must be in [0, 1), got {dropout}")
    return float(dropout) if training else 0.0


def _needs_grad(a: Tensor, b: Tensor, c: Tensor) -> bool:
    """Whether autograd records a call on ``a``, ``b``, ``c`` (its backward walks the CSC)."""
    return torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or c.requires_grad)


def _call_op(name: str, args: tuple):
    """``torch.ops.dfgnn.<name>.default(*args)``. In eager mode, without torch
    function modes and with exact ``torch.Tensor`` arguments, the extension's direct
    entry makes the same dispatcher call (autograd, profiler, inference mode and
    dispatch modes as before) without the Python op wrapper's argument parsing: a
    small graph's step is host-bound (``docs/design.md``, "Host path"). Under
    ``torch.compile``, for tensor subclasses and under
    ``plan.override(direct_entry=False)`` the wrapper runs."""
    if (plan.direct_entry() and not torch.compiler.is_compiling()
            and not torch._C._is_torch_function_mode_enabled()):
        res = getattr(_C, name)(*args)
        if res is not NotImplemented:
            return res
    return getattr(torch.ops.dfgnn, name).default(*args)


def gt_attention(layout, q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                 dropout: float = 0.0, training: bool = True, return_attention: bool = False,
                 strategy: str = "auto", score: str = "dot") -> OpResult:
    r"""Fused scaled dot-product attention over in-edges (Graph Transformer):

    .. math::
        \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j
        \left(\mathrm{scale}\; \mathbf{q}_i^\top \mathbf{k}_j\right) \mathbf{v}_j

    per head (paper eq. 1-2; SMMF/PMF of §3-4, backward of §4.3).

    Args:
        layout (GraphLayout): the graph (``N_src`` sources, ``N_dst`` destinations).
        q (Tensor): ``[N_dst, H, C]`` queries, float32 / float16 / bfloat16.
        k, v (Tensor): ``[N_src, H, C]`` keys and values, same dtype.
        scale (float, optional): score scale, ``1 / sqrt(C)`` by default.
        dropout (float): dropout probability on the attention weights (in-kernel,
            counter-based RNG seeded from torch's generator).
        training (bool): dropout is applied only when ``True``.
        return_attention (bool): also return the softmax weights (before dropout)
            ``[E, H]`` in the layout's input edge order (not differentiable on the
            fused-kernel path).
        strategy (str): ``"auto"``, ``"smmf"`` or ``"pmf"``.
        score (str): ``"dot"`` or ``"cosine"``; only used for the kernel plan.

    Returns:
        ``out`` ``[N_dst, H, C]`` (dtype of ``q``), or ``(out, alpha)``.

    Raises:
        ValueError: mismatched shapes, dtypes or devices, bad ``strategy``, or
            ``dropout`` outside ``[0, 1)``.

    .. note::
        In float16 / bfloat16 with ``C`` in {32, 64, 128}, no dropout, no returned
        attention and no row longer than a work item (the batch graphs), the SMMF
        forward runs on tensor cores (``cuda/kernels/gt_forward_mma.cu``); the softmax
        weights then enter the aggregation rounded to the input dtype, as in flash
        attention. Blocks of 64 rows whose in-neighbours lie in a window of at most
        512 consecutive source rows, with at most 24 window cells per edge and no
        duplicate edge, run the window as one dense tile masked by the edges
        (``cuda/kernels/gt_forward_dense.cu``), on graphs whose median block has at most
        20 cells per edge (the PATTERN, CLUSTER and MNIST-like batches;
        ``docs/design.md``, "Tensor cores and dense tiles"). The windows and edge
        masks (the tile plan, :mod:`pyg_dfgnn.ops.tiles`) are built on the first
        such call and cached on the layout. On graphs under 2^16 edges the backward
        runs its CSR (dQ) and CSC (dK, dV) walks in one kernel launch. In two
        launches the dQ kernel saves each edge's dropped-out weight and score
        gradient (8 bytes per edge and head, freed when the backward returns) and
        the dK / dV kernel is an SpMM with them (``docs/design.md``, "Backward").
        The kernel plan (:mod:`pyg_dfgnn.ops.plan`) makes each of these decisions;
        :func:`pyg_dfgnn.ops.plan.override` changes them, for tests and comparisons.

    .. note::
        Inside ``torch.compile`` (without ``return_attention``) the call is the
        custom op ``pyg_dfgnn::gt_attention`` (:mod:`pyg_dfgnn.ops.compiled`): the
        layout enters the compiled graph as its ``handle`` tensor, and the checks,
        the kernel plan and the dropout seed run inside the op, so a new graph does
        not recompile.
    """
    p = _dropout_p(dropout, training, "gt_attention")
    if torch.compiler.is_compiling() and not return_attention:
        return compiled.gt_attention(layout, q, k, v, scale, p, _needs_grad(q, k, v), strategy,
                                     score)
    _check_features(layout, q, k, v, "gt_attention")
    C, dtype = q.shape[2], q.dtype
    scale = 1.0 / math.sqrt(C) if scale is None else float(scale)
    if _runs_kernels(layout, q.is_cuda, C, dtype):
        # The kernel plan; it checks strategy and score.
        prep = prepared(layout, dtype, C, score, strategy, p > 0, return_attention,
                        _needs_grad(q, k, v))
        args = gt_args(prep, q.contiguous(), k.contiguous(), v.contiguous(), scale, p,
                       _seed() if p > 0 else 0, return_attention)
        out, _lse, attn = _call_op("gt_fwd", args)  # autograd: cuda/glue/autograd.cpp
    else:
        choose_strategy(layout.max_in_degree, score, q.element_size(), strategy)  # checks
        out, attn = reference.dot_attention(layout.rowptr, layout.col, q, k, v, scale, p,
                                            training=p > 0)
    if return_attention:
        # Kernel path: the weights are an output without a gradient; reference path: as PyG.
        return out, layout.to_input_order(attn.to(q.dtype))
    return out


#: ``F.normalize``'s default, which ``AGNNConv`` uses.
_NORMALIZE_EPS = 1e-12


def agnn_attention(layout, x_src: Tensor, x_dst: Optional[Tensor], beta: Union[Tensor, float],
                   return_attention: bool = False, strategy: str = "auto") -> OpResult:
    r"""Fused cosine attention (AGNN, ``AGNNConv``):

    .. math::
        \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j
        \left(\beta \cos(\mathbf{x}_i, \mathbf{x}_j)\right) \mathbf{x}_j

    computed as a dot-product SDDMM on L2-normalised features (scale 1, ``beta``
    folded into the queries), so gradients reach ``beta`` and ``x`` through the
    normalisation and the aggregation. With ``x_dst`` ``None`` on the fused-kernel
    path, the normalisation and the SMMF attention are one op call
    (``torch.ops.dfgnn.agnn_fwd``, one autograd node); in fp32 its kernel scores
    ``beta rnorm_i rnorm_j (x_i . x_j)`` on the unnormalised rows, one row gather
    per edge for the score and the sum (``torch.ops.dfgnn.cos_fwd``). PMF and
    bipartite calls normalise first and call :func:`gt_attention`.

    Args:
        x_src (Tensor): ``[N_src, C]`` (or ``[N_src, H, C]``) source features.
        x_dst (Tensor, optional): destination features, ``x_src`` if ``None``.
        beta (Tensor or float): temperature, a scalar.
        return_attention (bool), strategy (str): as in :func:`gt_attention`.

    Returns:
        ``out`` shaped like ``x_dst``, or ``(out, alpha [E, H])``.

    Raises:
        ValueError: mismatched shapes, dtypes or devices, or a bad ``strategy``.
    """
    x_dst = x_src if x_dst is None else x_dst
    squeeze = x_src.dim() == 2
    xs = x_src.unsqueeze(1) if squeeze else x_src
    if torch.compiler.is_compiling() and not return_attention:
        # The normalisation in traced torch ops (in float32, rounded once, as the
        # l2norm kernel), then the GT op with scale 1 (the PMF branch below): the
        # layout enters the graph as its handle only.
        k = F.normalize(xs.float(), p=2.0, dim=-1, eps=_NORMALIZE_EPS)
        q = k if x_dst is x_src else F.normalize(
            (x_dst.unsqueeze(1) if squeeze else x_dst).float(), p=2.0, dim=-1,
            eps=_NORMALIZE_EPS)
        q, k = (q * beta).to(xs.dtype), k.to(xs.dtype)
        out = compiled.gt_attention(layout, q, k, xs, 1.0, 0.0, _needs_grad(q, k, xs), strategy,
                                    "cosine")
        return out.squeeze(1) if squeeze else out
    C, dtype = xs.shape[-1], xs.dtype
    fused_norm = (x_dst is x_src and _runs_kernels(layout, xs.is_cuda, C, dtype)
                  and xs.size(0) == layout.num_dst == layout.num_src)
    if fused_norm:
        b = beta if isinstance(beta, Tensor) else torch.tensor(float(beta), device=xs.device)
        b = b.to(torch.float32)  # one element, any shape (dbeta keeps it)
        need_grad = torch.is_grad_enabled() and (xs.requires_grad or b.requires_grad)
        prep = agnn_prepared(layout, dtype, C, strategy, return_attention, need_grad)
    if fused_norm and not prep.plan.pmf:
        # Normalisation (k = x / max(||x||, eps), q = beta k) and SMMF attention in
        # one op call, one autograd node (cuda/glue/agnn.cpp; fp32: cos_fwd).
        out, attn = _call_op("agnn_fwd", agnn_args(prep, xs.contiguous(), b, _NORMALIZE_EPS,
                                                   return_attention))
        res = (out, layout.to_input_order(attn.to(xs.dtype))) if return_attention else out
    elif not fused_norm and not uses_kernels(layout, xs):
        # The reference scores the cosine from the features in float32; rounding
        # beta * normalize(x) to half precision first cost beta's gradient (a sum
        # with heavy cancellation) several percent.
        xd = x_dst.unsqueeze(1) if squeeze else x_dst
        _check_features(layout, xd, xs, xs, "agnn_attention")
        out, attn = reference.cosine_attention(layout.rowptr, layout.col, xd, xs, beta)
        res = (out, layout.to_input_order(attn.to(xs.dtype))) if return_attention else out
    else:
        if fused_norm:  # PMF: the fused normalisation, then gt_attention
            k, q, _rnorm = torch.ops.dfgnn.l2norm_fwd.default(xs.contiguous(), b,
                                                              _NORMALIZE_EPS)
        else:
            xd = x_dst.unsqueeze(1) if squeeze else x_dst
            k = F.normalize(xs, p=2.0, dim=-1, eps=_NORMALIZE_EPS)
            q = k if x_dst is x_src else F.normalize(xd, p=2.0, dim=-1, eps=_NORMALIZE_EPS)
            q = q * beta
        res = gt_attention(layout, q, k, xs, scale=1.0, return_attention=return_attention,
                           strategy=strategy, score="cosine")
    out = res[0] if return_attention else res
    out = out.squeeze(1) if squeeze else out
    return (out, res[1]) if return_attention else out


def gat_attention(layout, a_src: Tensor, a_dst: Tensor, x: Tensor, negative_slope: float = 0.2,
                  dropout: float = 0.0, training: bool = True, return_attention: bool = False,
                  strategy: str = "auto") -> OpResult:
    r"""Fused additive attention (GAT, ``GATConv``):

    .. math::
        \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j\left(
        \mathrm{LeakyReLU}(a_{dst,i} + a_{src,j})\right) \mathbf{x}_j

    per head, with in-kernel attention dropout; the backward returns gradients for
    ``a_src``, ``a_dst`` and ``x`` (paper §4.3). ``"auto"`` is SMMF (paper §4.2,
    Fig. 12, and the measurements in ``docs/design.md``, "SMMF or PMF");
    ``"smmf"`` / ``"pmf"`` (edge-parallel score kernel, then softmax + SpMM) force
    one.

    Args:
        a_src (Tensor): ``[N_src, H]`` per-source terms :math:`a_{src}^\top W x_j`.
        a_dst (Tensor): ``[N_dst, H]`` per-destination terms.
        x (Tensor): ``[N_src, H, C]`` transformed source features, same dtype.
        negative_slope (float): LeakyReLU slope.
        dropout (float), training (bool), return_attention (bool), strategy (str):
            as in :func:`gt_attention`.

    Returns:
        ``out`` ``[N_dst, H, C]``, or ``(out, alpha [E, H])`` in input edge order.

    Raises:
        ValueError: mismatched shapes, dtypes or devices; ``dropout`` outside [0, 1).

    .. note::
        Inside ``torch.compile`` (without ``return_attention``) the call is the
        custom op ``pyg_dfgnn::gat_attention``, as in :func:`gt_attention`.
    """
    p = _dropout_p(dropout, training, "gat_attention")
    if torch.compiler.is_compiling() and not return_attention:
        return compiled.gat_attention(layout, a_src, a_dst, x, negative_slope, p,
                                      _needs_grad(x, a_src, a_dst), strategy)
    _check_gat(layout, a_src, a_dst, x)
    C, dtype = x.shape[2], x.dtype
    if _runs_kernels(layout, x.is_cuda, C, dtype):
        prep = prepared(layout, dtype, C, "additive", strategy, p > 0, return_attention,
                        _needs_grad(x, a_src, a_dst))
        args = gat_args(prep, a_dst.contiguous(), a_src.contiguous(), x.contiguous(),
                        negative_slope, p, _seed() if p > 0 else 0, return_attention)
        out, _lse, attn = _call_op("gat_fwd", args)
    else:
        choose_strategy(layout.max_in_degree, "additive", x.element_size(), strategy)  # checks
        out, attn = reference.additive_attention(layout.rowptr, layout.col, a_dst, a_src, x,
                                                 negative_slope, p, training=p > 0)
    if return_attention:
        return out, layout.to_input_order(attn.to(x.dtype))
    return out


def _check_gat(layout, a_src: Tensor, a_dst: Tensor, x: Tensor) -> None:
    if x.dim() != 3 or a_src.shape != x.shape[:2] or a_dst.shape != (layout.num_dst, x.size(1)):
        raise ValueError(f"gat_attention: expected x [N_src, H, C], a_src [N_src, H], a_dst "
                         f"[N_dst, H]; got {tuple(x.shape)}, {tuple(a_src.shape)}, "
                         f"{tuple(a_dst.shape)}")
    if x.size(0) != layout.num_src:
        raise ValueError(f"gat_attention: x has {x.size(0)} rows but the graph has "
                         f"{layout.num_src} source nodes")
    if not (x.dtype == a_src.dtype == a_dst.dtype):
        raise ValueError("gat_attention: a_src, a_dst and x must share a dtype")
    if x.device != layout.device:
        raise ValueError(f"gat_attention: the features are on {x.device} but the layout is on "
                         f"{layout.device}")


def fused_attention(layout, score: str = "dot", **kwargs) -> OpResult:
    r"""One entry for the three score functions of the paper (§5.1):
    ``"dot"`` -> :func:`gt_attention`, ``"cosine"`` -> :func:`agnn_attention`,
    ``"additive"`` -> :func:`gat_attention`; ``kwargs`` go to that function."""
    if score == "dot":
        return gt_attention(layout, **kwargs)
    if score == "cosine":
        return agnn_attention(layout, **kwargs)
    if score == "additive":
        return gat_attention(layout, **kwargs)
    raise ValueError(f"score must be 'dot', 'cosine' or 'additive', got {score!r}")


# Last: it takes the checks and helpers above.
from . import compiled  # noqa: E402  (the custom ops torch.compile regions call)
