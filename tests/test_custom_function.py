"""``pyg_dfgnn.ops._custom._op_function`` on CPU, with a toy custom op: gradients of
the differentiable outputs (``None`` for an unused one), no gradient for the rest.
Needs the compiled extension (``_custom`` registers the ``dfgnn`` ops' formulas)."""
from __future__ import annotations

from typing import Tuple

import pytest
import torch
from torch import Tensor

import pyg_dfgnn

if not pyg_dfgnn.HAS_EXTENSION:
    pytest.skip("needs the compiled extension pyg_dfgnn._C", allow_module_level=True)

from pyg_dfgnn.ops import _custom  # noqa: E402


@torch.library.custom_op("dfgnn_test::two_scales", mutates_args=())
def _two_scales(x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    return 2 * x, 3 * x, x.sum().reshape(1)


@_two_scales.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x), x.new_empty(1)


def _setup(ctx, inputs, outputs):
    ctx.calls = getattr(ctx, "calls", 0) + 1


def _backward(ctx, g2, g3):
    grad = torch.zeros(())
    if g2 is not None:
        grad = grad + 2 * g2
    if g3 is not None:
        grad = grad + 3 * g3
    return (grad,)


TwoScales = _custom._op_function("TwoScales", torch.ops.dfgnn_test.two_scales, _setup, _backward,
                                 1, 2, "toy op")


@pytest.mark.parametrize("use,factor", [((0,), 2.0), ((1,), 3.0), ((0, 1), 5.0)])
def test_op_function_gradients(use, factor):
    x = torch.randn(6, requires_grad=True)
    outs = TwoScales.apply(x)
    assert outs[0].requires_grad and outs[1].requires_grad and not outs[2].requires_grad
    sum(outs[i].sum() for i in use).backward()
    assert torch.allclose(x.grad, torch.full_like(x, factor))


def test_op_function_forward_values():
    x = torch.randn(4)
    a, b, s = TwoScales.apply(x)
    assert torch.equal(a, 2 * x) and torch.equal(b, 3 * x) and torch.allclose(s, x.sum())
