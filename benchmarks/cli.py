r"""What the example and benchmark scripts share at their entry points: the help
formatter, the ``--device`` check, progress bars, output files, result tables,
and the one-line refusal of a script that needs a GPU.

(The ``--data`` option and the exit on missing data are in
:mod:`benchmarks.datasets`.)
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Union

__all__ = ["HelpFormatter", "add_run_arguments", "add_progress_argument", "progress",
           "parse_device", "out_file", "table", "require_kernels", "add_device_argument",
           "pick_device", "add_override_argument", "parse_overrides"]


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


def add_run_arguments(parser: argparse.ArgumentParser, results: str) -> None:
    r"""Adds the training examples' ``--device`` (check it with
    :func:`parse_device`), ``--json PATH`` (what it holds: ``results``) and
    ``--no-progress``."""
    parser.add_argument("--device", default=None,
                        help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if "
                             "available, else cpu)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help=f"write the results ({results}) to PATH (default: not written)")
    add_progress_argument(parser)


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    r"""Adds ``--no-progress``, the ``show=False`` of :func:`progress`."""
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar, not even on a terminal (elsewhere, as in a "
                             "log file, there is none anyway)")


def progress(iterable=None, show: bool = True, **kwargs):
    r"""A :class:`tqdm.tqdm` progress bar on stderr, drawn only where stderr is a
    terminal (tqdm's ``disable=None``): a log file or a pipe gets no bar lines.
    ``show=False`` (``--no-progress``) turns it off on a terminal too; ``kwargs``
    go to tqdm."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=None if show else True, file=sys.stderr,
                dynamic_ncols=True, **kwargs)


def parse_device(parser: argparse.ArgumentParser, device: Optional[str]):
    r"""The :class:`torch.device` of a training example's ``--device``: ``device``,
    else ``cuda`` where a GPU is visible, else ``cpu``. A device this machine lacks
    ends in ``parser.error`` (one line, exit status 2) before any work starts."""
    import torch

    try:
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        parser.error(f"--device {device}: {e}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            parser.error(f"--device {device}: no CUDA GPU is available here "
                         f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                         "use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            parser.error(f"--device {device}: only {torch.cuda.device_count()} GPU(s) here")
    return dev


def table(rows: Sequence[Sequence[str]]) -> str:
    r"""``rows`` (the first one the header) as a plain-text table, columns padded
    and separated by ``|``, a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines: List[str] = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


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


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    r"""Adds a measuring script's ``--device`` (check it with :func:`pick_device`)."""
    parser.add_argument("--device", default=None,
                        help="torch device; cpu runs the reference path, a check of the script "
                             "(default: cuda; cpu with --quick and no GPU)")


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


def add_override_argument(parser: argparse.ArgumentParser, what: str = "call") -> None:
    r"""Adds ``--override FIELD=VALUE`` (repeatable): a kernel-plan override
    (:func:`pyg_dfgnn.ops.plan.override`) for every fused ``what``; read it with
    :func:`parse_overrides`."""
    parser.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE",
                        help=f"a kernel-plan override for every fused {what} "
                             "(pyg_dfgnn.ops.plan.override), e.g. chunk=16; repeatable")


def parse_overrides(parser: argparse.ArgumentParser, items: Sequence[str]) -> dict:
    r"""``--override FIELD=VALUE`` items as :func:`pyg_dfgnn.ops.plan.override`'s
    keyword arguments (values as Python literals, else strings); exits with the
    parser's message on a malformed item or a field or value the plan rejects."""
    from pyg_dfgnn import ops
    fields = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            parser.error(f"--override takes FIELD=VALUE, got {item!r}")
        try:
            fields[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            fields[name] = text
    try:
        with ops.plan.override(**fields):
            pass
    except ValueError as e:
        parser.error(str(e))
    return fields
