"""``register_fake`` for the C++ ``torch.ops.dfgnn`` ops.

The fake (meta) implementations let ``torch.compile``, ``opcheck`` and meta
tensors trace through the ops. The attention ops' fakes are the same for every
score: shapes come from the score's spec (:mod:`pyg_dfgnn.ops.spec`), named by
the plan object, which FakeTensor tracing passes as the real object (its
``tracing_mode`` is ``"real"``). Their autograd is registered in C++
(``cuda/glue/attention.cpp``, the ``Autograd`` dispatch key). Only imported when
the extension loaded.
"""
from __future__ import annotations

import torch

from . import spec as _spec

_FLOAT = torch.float32


@torch.library.register_fake("dfgnn::attention_fwd")
def _attention_fwd_fake(inputs, plan, params, dropout, seed, need_attn):
    spec = _spec.get(plan.score())
    dst, value = inputs[spec.dst_input], inputs[spec.value_input]
    n, h = dst.size(0), value.size(1)
    out = value.new_empty((n, h, value.size(2)))
    lse = value.new_empty((n, h), dtype=_FLOAT)
    attn = value.new_empty((plan.num_edges(), h) if need_attn else (0,), dtype=_FLOAT)
    saved = spec.saved_like(inputs, plan)
    if plan.keeps_out32() and value.dtype != _FLOAT:  # the output in float32, last
        saved = saved + [value.new_empty(out.shape, dtype=_FLOAT)]
    return out, lse, attn, saved


@torch.library.register_fake("dfgnn::attention_bwd")
def _attention_bwd_fake(grad_out, inputs, out, lse, saved, plan, params, dropout, seed):
    return [t.new_empty(t.shape) for t in inputs]


@torch.library.register_fake("dfgnn::attention_bwd_into")
def _attention_bwd_into_fake(grads, grad_out, inputs, out, lse, saved, plan, params, dropout,
                             seed):
    return None


@torch.library.register_fake("dfgnn::projections")
def _projections_fake(x, rows, weights, biases):
    return [x.new_empty(*x.shape[:-1], w.shape[0]) for w in weights]
