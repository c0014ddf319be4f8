r"""What the example and benchmark scripts share at their entry points: the help
formatter, output files, and the one-line refusal of a script that needs a GPU.

(The ``--data`` option and the exit on missing data are in
:mod:`benchmarks.datasets`.)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Union

__all__ = ["HelpFormatter", "out_file", "require_kernels", "pick_device"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    r"""Keeps the description's line breaks and appends ``(default: X)`` to every
    option whose help does not mention its default already; flags
    (``store_true``) and options without a default say what they do instead."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text or not action.option_strings or action.nargs == 0
                or action.default is None or action.default is argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def out_file(path: Union[str, os.PathLike]) -> Path:
    r"""``Path(path)``, its folder created: for ``--out out/x.json``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def require_kernels(script: str, hint: str = "") -> None:
    r"""Exits with one line unless the fused CUDA kernels can run here (a GPU and
    the compiled extension): for the scripts that measure them. ``hint``: what
    the script can do instead."""
    import pyg_dfgnn

    if pyg_dfgnn.has_cuda_kernels():
        return
    import torch
    why = ("no CUDA GPU is visible" if not torch.cuda.is_available()
           else f"the CUDA kernels are missing ({pyg_dfgnn.load_error()})")
    sys.exit(f"{script} needs a CUDA GPU and the compiled extension: {why} (python -m "
             f"pyg_dfgnn info shows what this machine has{'; ' + hint if hint else ''}).")


def pick_device(script: str, device: Optional[str], quick: bool = False):
    r"""The :class:`torch.device` a measuring script runs on: ``device`` (its
    ``--device``) if given, else ``cuda``, or ``cpu`` with ``quick`` and no GPU.
    CUDA needs the fused kernels (:func:`require_kernels`); the CPU runs the
    reference path, a check of the script whose times say nothing about the
    kernels, so it is taken only when asked for."""
    import torch

    if device is None:
        device = "cpu" if quick and not torch.cuda.is_available() else "cuda"
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        sys.exit(f"{script}: --device {device}: {e}")
    if dev.type == "cuda":
        require_kernels(script, "--device cpu runs it on the reference path, a check of "
                                "the script")
    return dev
