"""Calls of the extension's ops on the eager host path (``cuda/glue/python_entry.cpp``).

Only imported when the extension loaded.
"""
from __future__ import annotations

import torch

from .. import _C
from . import plan


def call_op(name: str, args: tuple, eager_overrides=None):
    """``torch.ops.dfgnn.<name>.default(*args)``. In eager mode, without torch
    function modes and with exact ``torch.Tensor`` arguments, the extension's direct
    entry makes the same dispatcher call (autograd, profiler, inference mode and
    dispatch modes as before) without the Python op wrapper's argument parsing: a
    small graph's step is host-bound (``docs/steps.md``, "Host path"). Under
    ``torch.compile``, for tensor subclasses and under
    ``plan.override(direct_entry=False)`` the wrapper runs. ``eager_overrides``:
    the plan overrides in effect (:func:`~pyg_dfgnn.ops.plan.eager_overrides`),
    passed by a caller that has checked that no trace is running."""
    if eager_overrides is None:
        direct = plan.direct_entry() and not torch.compiler.is_compiling()
    else:
        direct = plan.direct_entry(eager_overrides)
    if direct and not torch._C._is_torch_function_mode_enabled():
        res = getattr(_C, name)(*args)
        if res is not NotImplemented:
            return res
    return getattr(torch.ops.dfgnn, name).default(*args)
