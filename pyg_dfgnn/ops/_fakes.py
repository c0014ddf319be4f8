"""``register_fake`` for the C++ ``torch.ops.dfgnn`` ops.

The fake (meta) implementations let ``torch.compile``, ``opcheck`` and meta
tensors trace through the ops. The attention ops' fakes are the same for every
score: shapes come from the score's spec (:mod:`pyg_dfgnn.ops.spec`), named by
the plan object, which FakeTensor tracing passes as the real object (its
``tracing_mode`` is ``"real"``), or in a traced call without one by its plan
key (:func:`~pyg_dfgnn.ops.calls.plan_key`). Their autograd is registered in C++
(``cuda/glue/attention.cpp``, the ``Autograd`` dispatch key). Only imported when
the extension loaded.
"""
from __future__ import annotations

import torch

from . import calls
from . import spec as _spec

_FLOAT = torch.float32


@torch.library.register_fake("dfgnn::attention_fwd")
def _attention_fwd_fake(inputs, handle, plan, key, params, dropout, seed, need_attn):
    if plan is not None:  # an eager call
        spec = _spec.get(plan.score())
        keeps_out32 = plan.keeps_out32()
    else:  # a traced one: the plan key names what the plan will be
        score, _strategy, need_grad = calls.key_parts(key)
        spec = _spec.get(score)
        value = inputs[spec.value_input]
        keeps_out32 = calls.keeps_out32(spec, value.dtype, need_grad)
        if need_attn:
            raise ValueError("dfgnn::attention_fwd: a call without a plan cannot return the "
                             "attention weights (their number is the graph's)")
    dst, value = inputs[spec.dst_input], inputs[spec.value_input]
    n, h = dst.size(0), value.size(1)
    out = value.new_empty((n, h, value.size(2)))
    lse = value.new_empty((n, h), dtype=_FLOAT)
    attn = value.new_empty((plan.num_edges(), h) if need_attn else (0,), dtype=_FLOAT)
    saved = spec.saved_like(inputs, plan)
    if keeps_out32 and value.dtype != _FLOAT:  # the output in float32, last
        saved = saved + [value.new_empty(out.shape, dtype=_FLOAT)]
    token = torch.empty(1, dtype=torch.int64)  # on the CPU, as the op's
    return out, lse, attn, token, saved


@torch.library.register_fake("dfgnn::attention_bwd")
def _attention_bwd_fake(grad_out, inputs, out, lse, token, saved, params, dropout):
    return [t.new_empty(t.shape) for t in inputs]


@torch.library.register_fake("dfgnn::attention_bwd_into")
def _attention_bwd_into_fake(grads, grad_out, inputs, out, lse, token, saved, params, dropout):
    return None


@torch.library.register_fake("dfgnn::projections")
def _projections_fake(x, rows, weights, biases):
    return [x.new_empty(*x.shape[:-1], w.shape[0]) for w in weights]
