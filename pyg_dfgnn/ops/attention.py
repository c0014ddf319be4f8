r"""The fused attention op of any score function: SDDMM -> edge softmax -> SpMM
in one call (paper §3-4), forward and backward.

Each score's public op (:func:`~pyg_dfgnn.ops.gt_attention`,
:func:`~pyg_dfgnn.ops.gat_attention`, ...) checks its arguments and calls
:func:`attention` with its :class:`~pyg_dfgnn.ops.spec.ScoreSpec`. On CUDA
tensors, with the extension built and a supported head size, that runs the
kernels the plan (:mod:`pyg_dfgnn.ops.plan`) picks through
``torch.ops.dfgnn.attention_fwd`` (autograd in C++); otherwise the score's
pure-PyTorch reference. Both compute the same function. Inside
``torch.compile`` the same op runs, its plan built when the compiled code runs
(:mod:`pyg_dfgnn.ops.compiled`).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..extension import HAS_EXTENSION
from . import calls, compiled
from . import plan as _plan
from . import spec as _spec
from .plan import choose_strategy
from .spec import ScoreSpec

if HAS_EXTENSION:
    from .direct import call_op

OpResult = Union[Tensor, Tuple[Tensor, Tensor]]


def attention(spec: ScoreSpec, layout, inputs: Sequence[Tensor], params: Sequence[float],
              dropout: float = 0.0, training: bool = True, return_attention: bool = False,
              strategy: str = "auto") -> OpResult:
    r"""Attention with the score ``spec`` over ``layout``'s in-edges.

    Args:
        spec (ScoreSpec): the score function.
        layout (GraphLayout): the graph (``N_src`` sources, ``N_dst`` destinations).
        inputs (sequence of Tensor): the score's inputs, in ``spec.inputs`` order
            (float32 / float16 / bfloat16, one dtype).
        params (sequence of float): the score's scalars, in ``spec.params`` order.
        dropout (float): dropout probability on the attention weights (in-kernel,
            counter-based RNG seeded from torch's generator).
        training (bool): dropout is applied only when ``True``.
        return_attention (bool): also return the softmax weights (before dropout)
            ``[E, H]`` in the layout's input edge order (not differentiable on the
            kernel path).
        strategy (str): ``"auto"``, ``"smmf"`` or ``"pmf"``.

    Returns:
        ``out`` ``[N_dst, H, C]``, or ``(out, alpha)``.

    Raises:
        ValueError: inputs the score rejects, a bad ``strategy``, or ``dropout``
            outside ``[0, 1)``.
    """
    p = calls.dropout_p(dropout, training, spec.name)
    traced = torch.compiler.is_compiling()
    if traced and not return_attention:
        return compiled.attention(spec, layout, inputs, params, p,
                                  calls.needs_grad(inputs), strategy)
    spec.check(layout, *inputs)
    value = inputs[spec.value_input]
    head_size, dtype = value.shape[-1], value.dtype
    if calls.runs_kernels(layout, value.is_cuda, head_size, dtype):
        need_grad = calls.needs_grad(inputs)
        # Read once and passed on: every step below would read them again (the
        # host path of a small graph's call).
        fields = () if traced else _plan.eager_overrides()
        # The kernel plan; it checks strategy.
        prep = calls.prepare(spec, layout, dtype, head_size, strategy, p > 0, return_attention,
                             need_grad, overrides=fields)
        if not traced:
            calls.record(spec, layout, prep.plan, need_grad, value, eager=True, inputs=inputs)
        out, _lse, attn, _token, _saved = call_op("attention_fwd", (
            calls.kernel_inputs(inputs), layout.handle, prep.obj, 0, params, p,
            calls.seed() if p > 0 else 0, return_attention), None if traced else fields)
    else:
        choose_strategy(layout.max_in_degree, spec.name, value.element_size(), strategy)
        calls.record(spec, layout, None, calls.needs_grad(inputs), value,
                     calls.reference_reason(layout, value), inputs=inputs)
        out, attn = spec.reference(layout, inputs, params, p, p > 0)
    if return_attention:
        # Kernel path: the weights are an output without a gradient; reference path: as PyG.
        return out, layout.to_input_order(attn.to(dtype))
    return out


def attention_with_edge(spec: ScoreSpec, edge_score: str, layout, inputs: Sequence[Tensor],
                        params: Sequence[float], dropout: float, training: bool,
                        return_attention: bool, strategy: str, edge: Optional[Tensor],
                        edge_order: str, who: str) -> OpResult:
    r""":func:`attention` with the score ``spec`` over ``inputs``, or, with a
    per-edge input ``edge``, with the registered score ``edge_score`` over
    ``inputs`` and ``edge`` in the layout's CSR edge order
    (:func:`edge_in_csr_order`): the body of a public op whose score has a form
    with edge inputs (``gt_attention``, ``gat_attention``, ...).

    Raises:
        ValueError: as :func:`attention` and :func:`edge_in_csr_order`.
    """
    if edge is None:
        return attention(spec, layout, inputs, params, dropout, training, return_attention,
                         strategy)
    edge = edge_in_csr_order(layout, edge, edge_order, who)
    # The spec by name, not by import: the edge score's module imports the op's.
    return attention(_spec.get(edge_score), layout, (*inputs, edge), params, dropout, training,
                     return_attention, strategy)


def check_edge_input(edge: Tensor, shape: Tuple[int, ...], like: Tensor, like_name: str,
                     who: str) -> None:
    r"""Raises :class:`ValueError` unless the per-edge input ``edge`` has the
    shape ``shape`` (``(E, H)``: one term per edge and head, or ``(E, H, C)``:
    one row) and the dtype and device of ``like``, the op's input(s) named
    ``like_name``; the messages start with ``who``."""
    what = "rows" if len(shape) == 3 else "terms"
    if tuple(edge.shape) != tuple(shape):
        dims = ", ".join("EHC"[:len(shape)])
        one = "one row" if what == "rows" else "one"
        raise ValueError(f"{who}: the edge {what} must be [{dims}] = "
                         f"[{', '.join(str(n) for n in shape)}] ({one} per edge and head), "
                         f"got {tuple(edge.shape)}")
    check_edge_like(edge, like, like_name, who, what)


def check_edge_like(edge: Tensor, like: Tensor, like_name: str, who: str,
                    what: str = "rows") -> None:
    r"""Raises :class:`ValueError` unless the per-edge input ``edge`` (the edge
    ``what``) has the dtype and device of ``like``, the op's input(s) named
    ``like_name``; the messages start with ``who``."""
    if edge.dtype != like.dtype:
        raise ValueError(f"{who}: the edge {what} must have the dtype of {like_name} "
                         f"({like.dtype}), got {edge.dtype}")
    if edge.device != like.device:
        raise ValueError(f"{who}: the edge {what} are on {edge.device} but {like_name} "
                         f"{'are' if ',' in like_name else 'is'} on {like.device}")


def edge_in_csr_order(layout, edge: Tensor, edge_order: str, who: str) -> Tensor:
    r"""The per-edge input ``edge`` (one row per edge) in the layout's CSR edge
    order, as the kernels read it: gathered from the input edge order with
    :meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order` (``edge_order="input"``)
    or taken as it is (``"csr"``).

    Raises:
        ValueError: ``edge_order`` is neither (the message starts with ``who``),
            or as :meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order`.
    """
    if edge_order == "input":
        return layout.to_csr_order(edge)
    if edge_order != "csr":
        raise ValueError(f"{who}: edge_order must be 'input' or 'csr', got {edge_order!r}")
    return edge
