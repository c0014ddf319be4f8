r"""The fused ops as ``torch.compile`` sees them: one custom op per score
function, ``pyg_dfgnn::<score>_attention``, that takes the layout as its
``handle`` tensor. They are defined from the score specs
(:mod:`pyg_dfgnn.ops.spec`), with their fakes and autograd, by :func:`define`.

Inside a compiled region the score's op (:func:`~pyg_dfgnn.ops.attention.attention`)
calls its custom op instead of reading the layout in Python. The compiled graph
then depends on tensors and on static configuration only: the handle is a graph
input read from the layout on each call, so a new graph (a mini-batch) is a new
input value, not a recompile. Everything that reads the layout's integers runs
inside the op when it runs, exactly as an eager call runs it: the input checks,
the int64-index ``NotImplementedError``, the kernel plan and its work items
(:func:`~pyg_dfgnn.ops.calls.prepare`) and the dropout seed (drawn on each call
from torch's CPU generator and returned in the ``token`` output for the
backward).

The backward op (``<score>_attention_bwd``, wired with
:func:`torch.library.register_autograd`) takes that token: the seed, the plan
overrides of the forward (so the backward walks the forward's work items) and
the layout, which the token's storage keeps alive until the backward has run. On
CUDA with kernel support it calls ``torch.ops.dfgnn.attention_bwd`` with what
the C++ autograd node passes (``cuda/glue/attention.cpp``); elsewhere it
differentiates the score's reference, recomputed with the forward's dropout mask
(a generator seeded from the token).

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

# Plan overrides (pyg_dfgnn.ops.plan.override) a forward ran with, by id: the
# token names them, as a tensor holds no Python objects. Tests and benchmarks use
# a handful of distinct overrides, so the table stays small.
_OVERRIDE_IDS: Dict[tuple, int] = {}
_OVERRIDES: List[tuple] = []
_DEFINED: Dict[str, ScoreSpec] = {}


class _Keep(np.ndarray):
    """An int64 array whose ``layout`` attribute rides with the token tensor's
    storage (``torch.from_numpy`` keeps the array alive): the compiled backward
    receives the token, not the layout, and the user may drop the graph first."""


def _token(seed: int, layout, handle_id: int) -> Tensor:
    overrides = _plan._current()
    oid = _OVERRIDE_IDS.get(overrides)
    if oid is None:
        oid = _OVERRIDE_IDS[overrides] = len(_OVERRIDES)
        _OVERRIDES.append(overrides)
    arr = np.array([seed, oid, handle_id], dtype=np.int64).view(_Keep)
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


def _kernel(name: str):
    """``torch.ops.dfgnn.<name>.default`` (a function: tests stand in for the
    kernels on machines without them)."""
    return getattr(torch.ops.dfgnn, name).default


def _runs_kernels(layout, is_cuda: bool, head_size: int, dtype: torch.dtype) -> bool:
    return calls.runs_kernels(layout, is_cuda, head_size, dtype)


def _forward(spec: ScoreSpec, inputs: List[Tensor], handle: Tensor, params: List[float],
             dropout: float, need_grad: bool, strategy: str):
    handle_id = int(handle[0])
    layout = layout_of(handle_id)
    spec.check(layout, *inputs)
    value = inputs[spec.value_input]
    head_size, dtype = value.size(2), value.dtype
    if _runs_kernels(layout, value.is_cuda, head_size, dtype):
        prep = calls.prepare(spec, layout, dtype, head_size, strategy, dropout > 0, False,
                             need_grad)
        seed = calls.seed() if dropout > 0 else 0
        out, lse, _attn, saved = _kernel("attention_fwd")(
            calls.kernel_inputs(spec, inputs), prep.obj, params, dropout, seed, False)
    else:
        choose_strategy(layout.max_in_degree, spec.name, value.element_size(), strategy)
        seed = calls.seed() if dropout > 0 else 0
        with _dropout_rng(seed, dropout, value.device):
            out = spec.reference(layout, inputs, params, dropout, dropout > 0)[0].contiguous()
        dst = inputs[spec.dst_input]
        lse = value.new_zeros((dst.size(0), value.size(1)), dtype=_FLOAT)  # the kernels' only
        saved = [torch.zeros_like(t) for t in spec.saved_like(inputs)]
    return out, lse, _token(seed, layout, handle_id), list(saved)


def _backward(spec: ScoreSpec, grad: Tensor, inputs: List[Tensor], out: Tensor, lse: Tensor,
              token: Tensor, saved: List[Tensor], params: List[float], dropout: float,
              strategy: str) -> List[Tensor]:
    seed, oid, handle_id = token.tolist()
    layout = layout_of(handle_id)  # alive: the token's storage holds it
    value = inputs[spec.value_input]
    head_size, dtype = value.size(2), value.dtype
    if _runs_kernels(layout, value.is_cuda, head_size, dtype):
        prep = calls.prepare(spec, layout, dtype, head_size, strategy, dropout > 0, False, True,
                             overrides=_OVERRIDES[oid])
        return list(_kernel("attention_bwd")(
            grad.contiguous(), calls.kernel_inputs(spec, inputs), out, lse, saved, prep.obj,
            params, dropout, seed))
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in inputs]
        with _dropout_rng(seed, dropout, value.device):
            ref = spec.reference(layout, leaves, params, dropout, dropout > 0)[0]
        grads = torch.autograd.grad(ref, leaves, grad, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g.contiguous() for g, t in zip(grads, leaves)]


def define(spec: ScoreSpec) -> None:
    """Defines ``pyg_dfgnn::<spec.name>_attention`` and its backward op, with
    fakes and autograd (once per score)."""
    if spec.name in _DEFINED:
        return
    _DEFINED[spec.name] = spec
    n_in, n_par = len(spec.inputs), len(spec.params)
    name = f"{spec.name}_attention"
    feats = ", ".join(f"Tensor {a}" for a in spec.inputs)
    params = "".join(f", float {p}" for p in spec.params)
    _LIB.define(f"{name}({feats}, Tensor handle{params}, float dropout, bool need_grad, "
                "str strategy) -> (Tensor, Tensor, Tensor, Tensor[])", tags=_FWD_TAGS)
    _LIB.define(f"{name}_bwd(Tensor grad_out, {feats}, Tensor out, Tensor lse, Tensor token, "
                f"Tensor[] saved{params}, float dropout, str strategy) -> Tensor[]",
                tags=_BWD_TAGS)

    def forward(*args):
        inputs, handle = list(args[:n_in]), args[n_in]
        params_, (dropout, need_grad, strategy) = list(args[n_in + 1:n_in + 1 + n_par]), \
            args[n_in + 1 + n_par:]
        return _forward(spec, inputs, handle, params_, dropout, need_grad, strategy)

    def backward_op(grad, *args):
        inputs = list(args[:n_in])
        out, lse, token, saved = args[n_in:n_in + 4]
        params_ = list(args[n_in + 4:n_in + 4 + n_par])
        dropout, strategy = args[n_in + 4 + n_par:]
        return _backward(spec, grad, inputs, out, lse, token, list(saved), params_, dropout,
                         strategy)

    _LIB.impl(name, forward, "CompositeExplicitAutograd")
    _LIB.impl(f"{name}_bwd", backward_op, "CompositeExplicitAutograd")

    def fake_forward(*args):
        inputs = args[:n_in]
        need_grad = args[n_in + 2 + n_par]
        dst, value = inputs[spec.dst_input], inputs[spec.value_input]
        out = value.new_empty((dst.size(0), value.size(1), value.size(2)))
        lse = value.new_empty((dst.size(0), value.size(1)), dtype=_FLOAT)
        saved = spec.saved_like(inputs)
        if (calls.keeps_out32(spec, value.dtype, need_grad) and value.is_cuda
                and HAS_EXTENSION and _plan.kernel_supports(value.size(2), value.dtype)):
            saved = saved + [value.new_empty(out.shape, dtype=_FLOAT)]  # the kernels' only
        return out, lse, torch.empty(3, dtype=torch.int64), saved

    def fake_backward(grad, *args):
        return [t.new_empty(t.shape) for t in args[:n_in]]

    torch.library.register_fake(f"pyg_dfgnn::{name}", fake_forward, lib=_LIB)
    torch.library.register_fake(f"pyg_dfgnn::{name}_bwd", fake_backward, lib=_LIB)

    def setup_context(ctx, inputs, output):
        out, lse, token, saved = output
        ctx.save_for_backward(*inputs[:n_in], out, lse, token, *saved)
        ctx.n_saved = len(saved)
        ctx.config = tuple(inputs[n_in + 1:n_in + 1 + n_par]) + (inputs[n_in + 1 + n_par],
                                                                   inputs[-1])

    def backward(ctx, grad_out, _grad_lse, _grad_token, _grad_saved):
        t = ctx.saved_tensors
        feats, (out, lse, token), saved = t[:n_in], t[n_in:n_in + 3], list(t[n_in + 3:])
        grads = getattr(torch.ops.pyg_dfgnn, f"{name}_bwd").default(
            grad_out, *feats, out, lse, token, saved, *ctx.config)
        return (*grads, None, *([None] * n_par), None, None, None)

    torch.library.register_autograd(f"pyg_dfgnn::{name}", backward,
                                    setup_context=setup_context, lib=_LIB)


def attention(spec: ScoreSpec, layout, inputs: Sequence[Tensor], params: Sequence[float],
              dropout: float, need_grad: bool, strategy: str) -> Tensor:
    """:func:`~pyg_dfgnn.ops.attention.attention` without attention weights,
    through ``pyg_dfgnn::<score>_attention`` (the layout as its handle);
    ``dropout`` is the probability the call applies (0 outside training)."""
    op = getattr(torch.ops.pyg_dfgnn, f"{spec.name}_attention").default
    out, _lse, _token, _saved = op(*inputs, layout.handle, *(float(p) for p in params),
                                   float(dropout), bool(need_grad), strategy)
    return out
