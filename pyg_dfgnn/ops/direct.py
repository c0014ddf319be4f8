"""Calls of the extension's ops on the eager host path (``cuda/glue/python_entry.cpp``).

Only imported when the extension loaded.
"""
from __future__ import annotations

import torch

from .. import _C
from . import plan


def call_op(name: str, args: tuple):
    """``torch.ops.dfgnn.<name>.default(*args)``. In eager mode, without torch
    function modes and with exact ``torch.Tensor`` arguments, the extension's direct
    entry makes the same dispatcher call (autograd, profiler, inference mode and
    dispatch modes as before) without the Python op wrapper's argument parsing: a
    small graph's step is host-bound (``docs/steps.md``, "Host path"). Under
    ``torch.compile``, for tensor subclasses and under
    ``plan.override(direct_entry=False)`` the wrapper runs."""
    if (plan.direct_entry() and not torch.compiler.is_compiling()
            and not torch._C._is_torch_function_mode_enabled()):
        res = getattr(_C, name)(*args)
        if res is not NotImplemented:
            return res
    return getattr(torch.ops.dfgnn, name).default(*args)
