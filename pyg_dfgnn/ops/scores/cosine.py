r"""The cosine score of AGNN (``AGNNConv``):
:math:`s_{ij} = \beta \cos(\mathbf{x}_i, \mathbf{x}_j)`, summing the
unnormalised :math:`\mathbf{x}_j`. Its kernels (``cuda/scores/cosine.cu``) score
the unnormalised rows in fp32 (one gathered row per edge for the score and the
sum) and, in fp16 / bf16, normalise first and run the dot score with scale 1,
on the kernels the plan names for it (tensor cores, dense tiles on batches)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import calls, compiled, reference
from ..attention import OpResult, attention
from ..plan import choose_strategy
from ..spec import ScoreSpec, register
from .dot import SPEC as DOT
from .dot import check_qkv, gt_attention

__all__ = ["agnn_attention"]

#: ``F.normalize``'s default, which ``AGNNConv`` uses.
NORMALIZE_EPS = 1e-12


def _check(layout, x: Tensor, beta: Tensor) -> None:
    check_qkv(layout, x, x, x, "agnn_attention")
    if beta.numel() != 1 or beta.dtype != torch.float32 or beta.device != x.device:
        raise ValueError(f"agnn_attention: beta must be one float32 element on {x.device}, got "
                         f"{beta.dtype} {tuple(beta.shape)} on {beta.device}")


def _reference(layout, inputs, params, dropout, training):
    x, beta = inputs
    return reference.cosine_attention(layout.rowptr, layout.col, x, x, beta)


def _normalize_first(dtype: torch.dtype, method: str) -> bool:
    # The cosine kernel is fp32 SMMF only: in fp16 / bf16 the lse must match the
    # rounded k and q that the backward recomputes the scores from.
    return dtype != torch.float32 or method == "pmf"


def _saved_like(inputs: Sequence[Tensor], plan=None) -> List[Tensor]:
    # rnorm [N, H] from the fp32 SMMF kernel; normalising first also k = x / ||x||
    # and q = beta k, first: (k, q, rnorm).
    x = inputs[0]
    rnorm = x.new_empty(x.shape[:2], dtype=torch.float32)
    first = (plan.normalize_first() if plan is not None
             else _normalize_first(x.dtype, "smmf"))
    if not first:
        return [rnorm]
    return [x.new_empty(x.shape), x.new_empty(x.shape), rnorm]


SPEC = register(ScoreSpec(
    name="cosine", inputs=("x", "beta"), params=("eps",), dst_input=0, value_input=0,
    row_inputs=(0,), reference=_reference, check=_check, saved_like=_saved_like, mma=True,
    dense_tiles=True, normalize_first=_normalize_first, keeps_out32=True))


def _normalised(x: Tensor) -> Tensor:
    # In float32, rounded once, as the normalisation kernel does.
    return F.normalize(x.float(), p=2.0, dim=-1, eps=NORMALIZE_EPS)


def agnn_attention(layout, x_src: Tensor, x_dst: Optional[Tensor], beta: Union[Tensor, float],
                   return_attention: bool = False, strategy: str = "auto") -> OpResult:
    r"""Fused cosine attention (AGNN, ``AGNNConv``):

    .. math::
        \mathbf{o}_i = \sum_{j \in \mathcal{N}(i)} \mathrm{softmax}_j
        \left(\beta \cos(\mathbf{x}_i, \mathbf{x}_j)\right) \mathbf{x}_j

    With ``x_dst`` ``None`` (one node set) on the fused-kernel path, the
    normalisation and the attention are one op call and one autograd node (the
    cosine score); its fp32 SMMF kernel scores ``beta rnorm_i rnorm_j (x_i . x_j)``
    on the unnormalised rows. Bipartite calls normalise first and call
    :func:`~pyg_dfgnn.ops.gt_attention` with scale 1; gradients reach ``beta``
    and ``x`` through the normalisation and the aggregation either way.

    Args:
        x_src (Tensor): ``[N_src, C]`` (or ``[N_src, H, C]``) source features.
        x_dst (Tensor, optional): destination features, ``x_src`` if ``None``.
        beta (Tensor or float): temperature, a scalar.
        return_attention (bool), strategy (str): as in
            :func:`~pyg_dfgnn.ops.gt_attention`.

    Returns:
        ``out`` shaped like ``x_dst``, or ``(out, alpha [E, H])``.

    Raises:
        ValueError: mismatched shapes, dtypes or devices, or a bad ``strategy``.
    """
    x_dst = x_src if x_dst is None else x_dst
    squeeze = x_src.dim() == 2
    xs = x_src.unsqueeze(1) if squeeze else x_src
    xd = x_dst.unsqueeze(1) if squeeze else x_dst
    if torch.compiler.is_compiling() and not return_attention:
        # The normalisation in traced torch ops, then the dot score with scale 1:
        # the layout enters the graph as its handle only.
        k = _normalised(xs)
        q = k if x_dst is x_src else _normalised(xd)
        q, k = (q * beta).to(xs.dtype), k.to(xs.dtype)
        out = compiled.attention(DOT, layout, (q, k, xs), (1.0,), 0.0,
                                 calls.needs_grad((q, k, xs)), strategy)
        return out.squeeze(1) if squeeze else out
    C, dtype = xs.shape[-1], xs.dtype
    on_kernels = calls.uses_kernels(layout, xs)
    one_set = x_dst is x_src and xs.size(0) == layout.num_dst == layout.num_src
    if on_kernels and one_set:
        b = beta if isinstance(beta, Tensor) else torch.tensor(float(beta), device=xs.device)
        res = attention(SPEC, layout, (xs, b.to(torch.float32)), (NORMALIZE_EPS,),
                        return_attention=return_attention, strategy=strategy)
    elif not on_kernels:
        # The reference scores the cosine from the features in float32; rounding
        # beta * normalize(x) to half precision first cost beta's gradient (a sum
        # with heavy cancellation) several percent.
        check_qkv(layout, xd, xs, xs, "agnn_attention")
        choose_strategy(layout.max_in_degree, "cosine", xs.element_size(), strategy)  # checks
        calls.record(SPEC, layout, None, calls.needs_grad((xs, xd)), xs,
                     calls.reference_reason(layout, xs))
        out, attn = reference.cosine_attention(layout.rowptr, layout.col, xd, xs, beta)
        res = (out, layout.to_input_order(attn.to(xs.dtype))) if return_attention else out
    else:
        k = _normalised(xs)
        q = k if x_dst is x_src else _normalised(xd)
        q, k = (q * beta).to(dtype), k.to(dtype)
        res = gt_attention(layout, q, k, xs, scale=1.0, return_attention=return_attention,
                           strategy=strategy)
    out = res[0] if return_attention else res
    out = out.squeeze(1) if squeeze else out
    return (out, res[1]) if return_attention else out


SCORE_OP = agnn_attention
