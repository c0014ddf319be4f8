"""``fuse(model)``: turns the attention convs of an existing PyG model into their
fused subclasses, in place, and says which of its convs run fused and why the
others do not."""
from __future__ import annotations

import copy
from typing import List, NamedTuple

import torch
from torch_geometric.nn.conv import MessagePassing

from ..ops.plan import check_strategy
from ._common import _HOOK_DICTS, FUSED

# FUSED (native class -> fused subclass) is filled by the layer modules, which
# pyg_dfgnn.nn imports. The fused classes add one attribute (``strategy``;
# ``FusedTransformerConv``'s ``fused_projection`` and ``edge_tails`` have class
# defaults) and override ``forward`` only, so an instance changes class in place
# and keeps its parameters, buffers and hooks. A conv class that is not a key (nor a subclass
# of one) is reported as having no fused kernel.


class FusedLayer(NamedTuple):
    """One conv (:class:`~torch_geometric.nn.conv.MessagePassing` module) seen by
    :func:`fuse`."""
    name: str  #: qualified module name (``model.get_submodule(name)``)
    cls: str  #: the class name (the native one for a fused layer)
    fused: bool  #: whether its forward runs the fused op
    reason: str  #: why it does not (empty when fused)


class FuseReport(List[FusedLayer]):
    """The convs :func:`fuse` found: a list of :class:`FusedLayer`, printable."""

    @property
    def num_fused(self) -> int:
        return sum(layer.fused for layer in self)

    def __str__(self) -> str:
        if not self:
            return "fuse(): no message-passing conv found"
        width = max(len(layer.name) for layer in self)
        cls_width = max(len(layer.cls) for layer in self)
        lines = [f"fuse(): {self.num_fused} of {len(self)} convs run fused"]
        for layer in self:
            state = "fused" if layer.fused else f"not fused: {layer.reason}"
            lines.append(f"  {layer.name:<{width}}  {layer.cls:<{cls_width}}  {state}")
        return "\n".join(lines)


def static_fallback_reason(conv) -> str:
    r"""Why ``conv`` runs PyG's forward whatever its inputs (``""`` when it runs
    fused for the inputs it supports)."""
    edge_features = getattr(conv, "lin_edge", None) is not None or getattr(conv, "edge_dim", None)
    if edge_features and not getattr(conv, "fuses_edge_features", False):
        return "edge features (edge_dim)"
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        return f"flow={conv.flow!r}"
    aggr = getattr(conv, "aggr", "add")
    if not (isinstance(aggr, str) and aggr in ("add", "sum")):
        return f"aggr={aggr!r}"
    if getattr(conv, "_explain", None):
        return "explain mode"
    if getattr(conv, "decomposed_layers", 1) != 1:
        return "decomposed_layers > 1"
    if any(len(getattr(conv, name, ())) > 0 for name in _HOOK_DICTS):
        return "message-passing hooks registered"
    return ""


def fuse(model: torch.nn.Module, strategy: str = "auto", inplace: bool = True) -> FuseReport:
    r"""Swaps every conv of ``model`` that has a fused subclass
    (:class:`~torch_geometric.nn.conv.TransformerConv`,
    :class:`~torch_geometric.nn.conv.GATConv`,
    :class:`~torch_geometric.nn.conv.AGNNConv`, and each further layer of
    :mod:`pyg_dfgnn.nn`) for that subclass (nested modules,
    ``ModuleDict``\ s and the per-type copies :func:`torch_geometric.nn.to_hetero`
    makes included) for its fused subclass.

    Each layer changes class in place: the same module object, the same parameter
    and buffer objects (device, dtype, ``state_dict`` keys and optimiser state
    stay valid). Subclasses of those convs other than the fused ones are left
    alone (their ``forward`` may differ). Layers already fused get ``strategy``.

    Args:
        model (torch.nn.Module): the model (or a single conv).
        strategy (str): ``"auto"``, ``"smmf"`` or ``"pmf"`` for every fused layer.
        inplace (bool): with ``False``, a deep copy of ``model`` is fused and
            returned as ``report.model``; ``model`` is untouched.

    Returns:
        FuseReport: one :class:`FusedLayer` per conv (every
        :class:`~torch_geometric.nn.conv.MessagePassing` module): its qualified
        name, class, whether it runs fused and, if not, why (no fused kernel for
        its class, edge features where its layer does not fuse them, ``flow``,
        ``aggr``, explain mode, hooks).
        ``print(report)`` shows a table; ``report.model`` is the fused model.

    Raises:
        ValueError: unknown ``strategy``.
    """
    check_strategy(strategy)
    if not inplace:
        model = copy.deepcopy(model)
    report = FuseReport()
    root = type(model).__name__  # a single conv: named by its own (native) class
    for name, module in model.named_modules():
        cls = type(module)
        fused_cls = FUSED.get(cls)
        if fused_cls is None and cls not in FUSED.values():
            if isinstance(module, MessagePassing):
                native = next((n for n in FUSED if isinstance(module, n)), None)
                reason = (f"subclass of {native.__name__}, left as it is" if native is not None
                          else f"no fused kernel for {cls.__name__}")
                report.append(FusedLayer(name or root, cls.__name__, False, reason))
            continue
        if fused_cls is not None:
            module.__class__ = fused_cls
        module.strategy = strategy
        reason = static_fallback_reason(module)
        native_name = next(n.__name__ for n in FUSED if isinstance(module, n))
        report.append(FusedLayer(name or root, native_name, not reason, reason))
    report.model = model
    return report
