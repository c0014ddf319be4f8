r"""The fused ops as ``torch.compile`` sees them: custom ops that take the
layout as its ``handle`` tensor.

Inside a compiled region, :func:`~pyg_dfgnn.ops.gt_attention` and
:func:`~pyg_dfgnn.ops.gat_attention` (and :func:`~pyg_dfgnn.ops.agnn_attention`,
through the GT op) call ``pyg_dfgnn::gt_attention`` / ``pyg_dfgnn::gat_attention``
instead of reading the layout in Python. The compiled graph then depends on
tensors and on static configuration only: the handle is a graph input read from
the layout on each call, so a new graph (a mini-batch) is a new input value, not a
recompile. Everything that reads the layout's integers runs inside the op when it
runs, exactly as an eager call runs it: the shape checks, the int64-index
``NotImplementedError``, the kernel plan and its work items
(:func:`~pyg_dfgnn.ops._args.prepared`) and the dropout seed (drawn on each call
from torch's CPU generator and returned in the ``token`` output for the
backward).

The backward ops (``*_bwd``, wired with :func:`torch.library.register_autograd`)
take that token: the seed, the plan overrides of the forward (so the backward
walks the forward's work items) and the layout, which the token's storage keeps
alive until the backward has run. On CUDA with kernel support they call
``torch.ops.dfgnn.gt_bwd`` / ``gat_bwd`` with the arguments the C++ autograd
node passes (``cuda/glue/autograd.cpp``); elsewhere they differentiate
:mod:`pyg_dfgnn.ops.reference`, recomputed with the forward's dropout mask (a
generator seeded from the token).

The ops carry the ``cudagraph_unsafe`` tag: a CUDA graph that Inductor records
(``mode="reduce-overhead"``) would replay the launches of one layout for every
later handle, so they run outside the recorded graphs.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Dict, List, NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor

from ..layout import layout_of
from . import _check_features, _check_gat, _runs_kernels, _seed
from . import plan as _plan
from . import reference
from ._args import gat_args, gt_args, prepared
from .plan import choose_strategy

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


class _Family(NamedTuple):
    """One fused op family: its compiled entry's name, the argument names of its
    three features and scalar, its checks, kernel ops and reference."""
    name: str
    names: tuple  # (a, b, c, param): the schema's argument names
    check: Callable  # (layout, a, b, c)
    kernel_fwd: str
    kernel_bwd: str
    args: Callable  # (prep, a, b, c, param, dropout, seed, need_attn) -> op args
    reference: Callable  # (layout, a, b, c, param, dropout) -> out
    one_launch: bool  # the backward op takes the plan's bwd_one_launch and mma_backward


def _gt_reference(layout, q, k, v, scale, dropout):
    return reference.dot_attention(layout.rowptr, layout.col, q, k, v, scale, dropout,
                                   training=dropout > 0)[0]


def _gat_reference(layout, a_dst, a_src, x, negative_slope, dropout):
    return reference.additive_attention(layout.rowptr, layout.col, a_dst, a_src, x,
                                        negative_slope, dropout, training=dropout > 0)[0]


def _check_gt(layout, q, k, v):
    _check_features(layout, q, k, v, "gt_attention")


def _check_gat_call(layout, a_dst, a_src, x):
    _check_gat(layout, a_src, a_dst, x)


GT = _Family("gt_attention", ("q", "k", "v", "scale"), _check_gt, "gt_fwd", "gt_bwd", gt_args,
             _gt_reference, True)
GAT = _Family("gat_attention", ("a_dst", "a_src", "x", "negative_slope"), _check_gat_call,
              "gat_fwd", "gat_bwd", gat_args, _gat_reference, False)


def _kernel(name: str):
    """``torch.ops.dfgnn.<name>.default`` (a function: tests stand in for the
    kernels on machines without them)."""
    return getattr(torch.ops.dfgnn, name).default


def _forward(fam: _Family, a: Tensor, b: Tensor, c: Tensor, handle: Tensor, param: float,
             dropout: float, need_grad: bool, strategy: str, score: str):
    handle_id = int(handle[0])
    layout = layout_of(handle_id)
    fam.check(layout, a, b, c)
    head_size, dtype = c.size(2), c.dtype
    if _runs_kernels(layout, c.is_cuda, head_size, dtype):
        prep = prepared(layout, dtype, head_size, score, strategy, dropout > 0, False, need_grad)
        seed = _seed() if dropout > 0 else 0
        args = fam.args(prep, a.contiguous(), b.contiguous(), c.contiguous(), param, dropout,
                        seed, False)
        out, lse, _attn = _kernel(fam.kernel_fwd)(*args)
    else:
        choose_strategy(layout.max_in_degree, score, c.element_size(), strategy)  # checks
        seed = _seed() if dropout > 0 else 0
        with _dropout_rng(seed, dropout, c.device):
            out = fam.reference(layout, a, b, c, param, dropout).contiguous()
        lse = c.new_zeros((a.size(0), c.size(1)), dtype=_FLOAT)  # the kernels' only
    return out, lse, _token(seed, layout, handle_id)


def _backward(fam: _Family, grad: Tensor, a: Tensor, b: Tensor, c: Tensor, out: Tensor,
              lse: Tensor, token: Tensor, param: float, dropout: float, strategy: str,
              score: str):
    seed, oid, handle_id = token.tolist()
    layout = layout_of(handle_id)  # alive: the token's storage holds it
    head_size, dtype = c.size(2), c.dtype
    if _runs_kernels(layout, c.is_cuda, head_size, dtype):
        prep = prepared(layout, dtype, head_size, score, strategy, dropout > 0, False, True,
                        overrides=_OVERRIDES[oid])
        extra = (bool(prep.flags[3]), bool(prep.flags[4])) if fam.one_launch else ()
        return _kernel(fam.kernel_bwd)(
            grad.contiguous(), a.contiguous(), b.contiguous(), c.contiguous(), out, lse,
            prep.csr, prep.csc, prep.sizes, param, dropout, seed, *extra)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (a, b, c)]
        with _dropout_rng(seed, dropout, c.device):
            ref = fam.reference(layout, *leaves, param, dropout)
        grads = torch.autograd.grad(ref, leaves, grad, allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g.contiguous()
                 for g, t in zip(grads, leaves))


def _define(fam: _Family) -> None:
    a, b, c, param = fam.names
    feats = f"Tensor {a}, Tensor {b}, Tensor {c}"
    _LIB.define(f"{fam.name}({feats}, Tensor handle, float {param}, float dropout, "
                "bool need_grad, str strategy, str score) -> (Tensor, Tensor, Tensor)",
                tags=_FWD_TAGS)
    _LIB.define(f"{fam.name}_bwd(Tensor grad_out, {feats}, Tensor out, Tensor lse, "
                f"Tensor token, float {param}, float dropout, str strategy, str score) "
                "-> (Tensor, Tensor, Tensor)", tags=_BWD_TAGS)
    _LIB.impl(fam.name, lambda *args: _forward(fam, *args), "CompositeExplicitAutograd")
    _LIB.impl(f"{fam.name}_bwd", lambda *args: _backward(fam, *args),
              "CompositeExplicitAutograd")

    def fake_forward(a, b, c, handle, param, dropout, need_grad, strategy, score):
        out = c.new_empty((a.size(0), c.size(1), c.size(2)))
        lse = c.new_empty((a.size(0), c.size(1)), dtype=_FLOAT)
        return out, lse, torch.empty(3, dtype=torch.int64)

    def fake_backward(grad, a, b, c, out, lse, token, param, dropout, strategy, score):
        return a.new_empty(a.shape), b.new_empty(b.shape), c.new_empty(c.shape)

    torch.library.register_fake(f"pyg_dfgnn::{fam.name}", fake_forward, lib=_LIB)
    torch.library.register_fake(f"pyg_dfgnn::{fam.name}_bwd", fake_backward, lib=_LIB)

    def setup_context(ctx, inputs, output):
        a, b, c, _handle, param, dropout, _need_grad, strategy, score = inputs
        out, lse, token = output
        ctx.save_for_backward(a, b, c, out, lse, token)
        ctx.config = (param, dropout, strategy, score)

    def backward(ctx, grad_out, _grad_lse, _grad_token):
        a, b, c, out, lse, token = ctx.saved_tensors
        grads = getattr(torch.ops.pyg_dfgnn, f"{fam.name}_bwd").default(
            grad_out, a, b, c, out, lse, token, *ctx.config)
        return (*grads, None, None, None, None, None, None)

    torch.library.register_autograd(f"pyg_dfgnn::{fam.name}", backward,
                                    setup_context=setup_context, lib=_LIB)


_define(GT)
_define(GAT)


def gt_attention(layout, q: Tensor, k: Tensor, v: Tensor, scale: Optional[float],
                 dropout: float, need_grad: bool, strategy: str, score: str) -> Tensor:
    """:func:`~pyg_dfgnn.ops.gt_attention` without attention weights, through
    ``pyg_dfgnn::gt_attention`` (the layout as its handle); ``dropout`` is the
    probability the call applies (0 outside training)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, _lse, _token = torch.ops.pyg_dfgnn.gt_attention.default(
        q, k, v, layout.handle, scale, dropout, need_grad, strategy, score)
    return out


def gat_attention(layout, a_src: Tensor, a_dst: Tensor, x: Tensor, negative_slope: float,
                  dropout: float, need_grad: bool, strategy: str) -> Tensor:
    """:func:`~pyg_dfgnn.ops.gat_attention` without attention weights, through
    ``pyg_dfgnn::gat_attention`` (``dropout`` as in :func:`gt_attention`)."""
    out, _lse, _token = torch.ops.pyg_dfgnn.gat_attention.default(
        a_dst, a_src, x, layout.handle, float(negative_slope), dropout, need_grad, strategy,
        "additive")
    return out
