r"""The fused ops as ``torch.compile`` sees them.

Where the kernels run (CUDA tensors, the extension loaded, heads the kernels
take), a compiled call is the eager call's op, ``dfgnn::attention_fwd``, with
its autograd kernel (``cuda/glue/attention.cpp``): AOTAutograd traces that
kernel's node into the compiled backward graph, so eager and compiled calls
run one op and one autograd path. The traced call passes no plan but the
layout's ``handle`` tensor and a plan key (:func:`~pyg_dfgnn.ops.calls.plan_key`);
the op builds the plan when it runs (:func:`~pyg_dfgnn.ops.calls.resolve`:
the input checks, the int64-index ``NotImplementedError``, the kernel plan and
the dropout seed, drawn on each call from torch's CPU generator), and its token
output carries plan and seed to the backward. The compiled graph thus depends on
tensors and static configuration only: a new graph (a mini-batch) is a new
handle value, not a recompile.

Elsewhere (CPU tensors, or no kernel for the heads) a compiled call runs the
score's reference inside one custom op per score,
``pyg_dfgnn::<score>_attention``, defined from the score specs
(:mod:`pyg_dfgnn.ops.spec`) by :func:`define`: the reference reads the layout,
which a trace must not. Its backward op (``<score>_attention_bwd``, wired with
:func:`torch.library.register_autograd`) differentiates the reference,
recomputed with the forward's dropout mask (a generator seeded from the
forward's ``token``, whose storage also keeps the layout alive until the
backward has run).

The ops carry the ``cudagraph_unsafe`` tag: a CUDA graph that Inductor records
(``mode="reduce-overhead"``) would replay the launches of one layout for every
later handle, so they run outside the recorded graphs.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Sequence

import numpy as np
import torch
from torch import Tensor

from ..extension import HAS_EXTENSION
from ..layout import layout_of
from . import calls
from . import plan as _plan
from .plan import choose_strategy
from .spec import ScoreSpec

_LIB = torch.library.Library("pyg_dfgnn", "FRAGMENT")
_FLOAT = torch.float32
# cudagraph_unsafe: see above. nondeterministic_seeded (the forward): each call
# draws a dropout seed, so two calls are never merged or recomputed.
_BWD_TAGS = tuple(getattr(torch.Tag, name) for name in ("cudagraph_unsafe",)
                  if hasattr(torch.Tag, name))
_FWD_TAGS = _BWD_TAGS + tuple(getattr(torch.Tag, name) for name in ("nondeterministic_seeded",)
                              if hasattr(torch.Tag, name))
_DEFINED: Dict[str, ScoreSpec] = {}


class _Keep(np.ndarray):
    """An int64 array whose ``layout`` attribute rides with the token tensor's
    storage (``torch.from_numpy`` keeps the array alive): the compiled backward
    receives the token, not the layout, and the user may drop the graph first."""


def _token(seed: int, layout, handle_id: int) -> Tensor:
    arr = np.array([seed, handle_id], dtype=np.int64).view(_Keep)
    arr.layout = layout
    return torch.from_numpy(arr)


@contextlib.contextmanager
def _dropout_rng(seed: int, dropout: float, device: torch.device):
    """Torch's generator of ``device`` seeded with ``seed`` inside the block, as it
    was outside afterwards: the reference path draws its mask from it, the same in
    the forward and the backward."""
    if dropout <= 0:
        yield
        return
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else [],
                               device_type="cuda" if cuda else "cpu"):
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.default_generators[device.index or 0].manual_seed(seed)
        yield


def _forward(spec: ScoreSpec, inputs: List[Tensor], handle: Tensor, params: List[float],
             dropout: float, strategy: str):
    handle_id = int(handle[0])
    layout = layout_of(handle_id)
    spec.check(layout, *inputs)
    value = inputs[spec.value_input]
    choose_strategy(layout.max_in_degree, spec.name, value.element_size(), strategy)
    seed = calls.seed() if dropout > 0 else 0
    with _dropout_rng(seed, dropout, value.device):
        out = spec.reference(layout, inputs, params, dropout, dropout > 0)[0].contiguous()
    return out, _token(seed, layout, handle_id)


def _backward(spec: ScoreSpec, grad: Tensor, inputs: List[Tensor], token: Tensor,
              params: List[float], dropout: float) -> List[Tensor]:
    seed, handle_id = token.tolist()
    layout = layout_of(handle_id)  # alive: the token's storage holds it
    value = inputs[spec.value_input]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in inputs]
        with _dropout_rng(seed, dropout, value.device):
            ref = spec.reference(layout, leaves, params, dropout, dropout > 0)[0]
        grads = torch.autograd.grad(ref, leaves, grad, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g.contiguous() for g, t in zip(grads, leaves)]


def define(spec: ScoreSpec) -> None:
    """Defines ``pyg_dfgnn::<spec.name>_attention`` (the reference of the score
    ``spec`` inside one op) and its backward op, with fakes and autograd (once
    per score)."""
    if spec.name in _DEFINED:
        return
    _DEFINED[spec.name] = spec
    n_in, n_par = len(spec.inputs), len(spec.params)
    name = f"{spec.name}_attention"
    feats = ", ".join(f"Tensor {a}" for a in spec.inputs)
    params = "".join(f", float {p}" for p in spec.params)
    _LIB.define(f"{name}({feats}, Tensor handle{params}, float dropout, str strategy) "
                "-> (Tensor, Tensor)", tags=_FWD_TAGS)
    _LIB.define(f"{name}_bwd(Tensor grad_out, {feats}, Tensor token{params}, float dropout) "
                "-> Tensor[]", tags=_BWD_TAGS)

    def forward(*args):
        inputs, handle = list(args[:n_in]), args[n_in]
        params_ = list(args[n_in + 1:n_in + 1 + n_par])
        dropout, strategy = args[n_in + 1 + n_par:]
        return _forward(spec, inputs, handle, params_, dropout, strategy)

    def backward_op(grad, *args):
        inputs, token = list(args[:n_in]), args[n_in]
        params_ = list(args[n_in + 1:n_in + 1 + n_par])
        (dropout,) = args[n_in + 1 + n_par:]
        return _backward(spec, grad, inputs, token, params_, dropout)

    _LIB.impl(name, forward, "CompositeExplicitAutograd")
    _LIB.impl(f"{name}_bwd", backward_op, "CompositeExplicitAutograd")

    def fake_forward(*args):
        inputs = args[:n_in]
        dst, value = inputs[spec.dst_input], inputs[spec.value_input]
        out = value.new_empty((dst.size(0), value.size(1), value.size(2)))
        return out, torch.empty(2, dtype=torch.int64)

    def fake_backward(grad, *args):
        return [t.new_empty(t.shape) for t in args[:n_in]]

    torch.library.register_fake(f"pyg_dfgnn::{name}", fake_forward, lib=_LIB)
    torch.library.register_fake(f"pyg_dfgnn::{name}_bwd", fake_backward, lib=_LIB)

    def setup_context(ctx, inputs, output):
        _out, token = output
        ctx.save_for_backward(*inputs[:n_in], token)
        ctx.config = tuple(inputs[n_in + 1:n_in + 1 + n_par]) + (inputs[n_in + 1 + n_par],)

    def backward(ctx, grad_out, _grad_token):
        t = ctx.saved_tensors
        grads = getattr(torch.ops.pyg_dfgnn, f"{name}_bwd").default(
            grad_out, *t[:n_in], t[n_in], *ctx.config)
        return (*grads, None, *([None] * n_par), None, None)

    torch.library.register_autograd(f"pyg_dfgnn::{name}", backward,
                                    setup_context=setup_context, lib=_LIB)


def _kernels_run(value: Tensor) -> bool:
    """Whether a traced call with the row input ``value`` takes the kernels."""
    return HAS_EXTENSION and value.is_cuda and _plan.kernel_supports(value.size(2), value.dtype)


def attention(spec: ScoreSpec, layout, inputs: Sequence[Tensor], params: Sequence[float],
              dropout: float, need_grad: bool, strategy: str) -> Tensor:
    """:func:`~pyg_dfgnn.ops.attention.attention` without attention weights, as
    compiled code calls it (the layout as its handle); ``dropout`` is the
    probability the call applies (0 outside training). Whether the kernels run
    is decided from the inputs alone (device, head size, dtype), as a trace
    must not read the layout."""
    value = inputs[spec.value_input]
    params = [float(p) for p in params]
    if _kernels_run(value):
        _plan.check_strategy(strategy)  # here too: raised in plan_key, a trace wraps it
        key = calls.plan_key(spec.name, strategy, need_grad)
        return torch.ops.dfgnn.attention_fwd.default(
            calls.kernel_inputs(inputs), layout.handle, None, key, params, float(dropout), 0,
            False)[0]
    op = getattr(torch.ops.pyg_dfgnn, f"{spec.name}_attention").default
    out, _token = op(*inputs, layout.handle, *params, float(dropout), strategy)
    return out
