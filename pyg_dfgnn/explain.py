r"""``explain(layer, ...)``: which kernels a fused layer's call runs, forward and
backward, and why, or why the layer runs PyG's own ``forward``.

The report is of a real call: the layer runs once on the given inputs (torch's
random state is restored afterwards, so dropout masks drawn later are those the
model would have drawn), and every fused op call it makes reports the plan it ran
with (:func:`pyg_dfgnn.ops.recording`). The plan is the one place that decides
(:mod:`pyg_dfgnn.ops.plan`); the CUDA side runs what it says or raises.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import torch

from .ops import calls as _calls
from .ops.plan import Plan


@dataclasses.dataclass
class OpReport:
    """One fused op call of the layer.

    Attributes:
        score (str): its score function (``"dot"``, ``"additive"``, ...).
        heads (int), head_size (int), dtype (torch.dtype): its rows' heads,
            channels per head and dtype (with ``TransformerConv``'s edge features
            as tails, ``dot_edge_tail``, the layer's channels plus the tails').
        edge_inputs (list): ``(name, shape)`` of each per-edge input of the score
            (``dot_edge_tail``'s ``a`` ``[E, D]``: the rows' last ``D`` channels).
        plan (Plan, optional): the kernel plan; ``None`` where the pure-PyTorch
            reference ran.
        backward (bool): autograd records the call (its backward will run).
        forward_kernels (list): ``(kernel, what it does)`` in launch order.
        backward_kernels (list): the same for the backward (empty without one).
        why (list): ``(decision, reason)`` pairs of the plan, or the reason the
            reference ran.
    """
    score: str
    heads: int
    head_size: int
    dtype: torch.dtype
    plan: Optional[Plan]
    backward: bool
    forward_kernels: List[Tuple[str, str]]
    backward_kernels: List[Tuple[str, str]]
    why: List[Tuple[str, str]]
    edge_inputs: List[Tuple[str, Tuple[int, ...]]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Explanation:
    """What :func:`explain` found: whether the layer ran fused, why not, and
    its op calls (:class:`OpReport`). ``print()`` shows a report."""
    layer: str
    fused: bool
    reason: str
    ops: List[OpReport]

    def __str__(self) -> str:
        if not self.fused:
            return f"{self.layer}: PyG's own forward ({self.reason})"
        lines = [f"{self.layer}: fused"]
        for op in self.ops:
            where = "CUDA kernels" if op.plan is not None else "reference path"
            lines.append(f"  {op.score} attention, {op.heads} x {op.head_size} channels, "
                         f"{str(op.dtype).replace('torch.', '')}, {where}"
                         f"{', with backward' if op.backward else ''}")
            if op.edge_inputs:
                lines.append("    per-edge inputs: " + ", ".join(
                    f"{name} [{', '.join(map(str, shape))}]" for name, shape in op.edge_inputs))
            for title, kernels in (("forward", op.forward_kernels),
                                   ("backward", op.backward_kernels)):
                if kernels:
                    lines.append(f"    {title}:")
                    lines += [f"      {name}: {what}" for name, what in kernels]
            if op.why:
                lines.append("    why:")
                lines += [f"      {name}: {what}" for name, what in op.why]
        return "\n".join(lines)


def _report(rec: "_calls.CallRecord") -> OpReport:
    if rec.plan is None:
        return OpReport(rec.score, rec.heads, rec.head_size, rec.dtype, None, rec.need_grad, [],
                        [], [("path", rec.why)], list(rec.edge_inputs))
    plan = rec.plan
    return OpReport(rec.score, rec.heads, rec.head_size, rec.dtype, plan, rec.need_grad,
                    plan.kernels(), plan.kernels(backward=True) if rec.need_grad else [],
                    list(plan.why), list(rec.edge_inputs))


def explain(layer: torch.nn.Module, *args, **kwargs) -> Explanation:
    r"""Runs ``layer(*args, **kwargs)`` once and reports the kernels its fused op
    calls ran forward (and will run backward, where autograd records them) and
    why; or, where the layer ran PyG's own ``forward``, why.

    .. code-block:: python

        print(pyg_dfgnn.explain(conv, x, edge_index))

    Args:
        layer (torch.nn.Module): a fused layer (:mod:`pyg_dfgnn.nn`) or any module
            that calls the fused ops.
        *args, **kwargs: the call's arguments, as the layer takes them.

    Returns:
        Explanation: printable; ``.ops`` holds one :class:`OpReport` per op call.
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), _calls.recording() as records:
        layer(*args, **kwargs)
    name = type(layer).__name__
    if records:
        return Explanation(name, True, "", [_report(r) for r in records])
    reason_of = getattr(layer, "fallback_reason", None)
    reason = reason_of(*args, **kwargs) if reason_of is not None else ""
    return Explanation(name, False, reason or "the layer made no fused op call", [])
