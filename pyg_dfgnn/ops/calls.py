r"""What a fused call needs before its kernels run: whether the kernels run at all,
the call's plan as the extension takes it (one ``torch.classes.dfgnn.Plan``
object per layout and plan key), its inputs as the kernels read them, and the
dropout seed. Shared by the eager ops (:mod:`pyg_dfgnn.ops.attention`) and the
calls compiled code makes (:mod:`pyg_dfgnn.ops.compiled`), whose plans
:func:`resolve` builds when they run.

A small graph's call is host-bound, so what one call needs of the layout is
looked up by one key in ``layout.derived.calls`` and built on the first call.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..extension import HAS_EXTENSION
from ..layout import layout_of
from . import plan as _plan
from . import spec as _spec
from .spec import ScoreSpec
from .tiles import layout_rank_pos, layout_tiles_t, tile_plan


def dropout_p(dropout: float, training: bool, score: str) -> float:
    """The dropout probability a call of the score ``score`` applies; raises for
    one outside ``[0, 1)``."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{score} attention: dropout must be in [0, 1), got {dropout}")
    return float(dropout) if training else 0.0


def seed() -> int:
    """A dropout seed, drawn from torch's CPU generator, so ``torch.manual_seed``
    makes dropout reproducible.

    Raises:
        RuntimeError: while a CUDA graph is captured: the seed is a kernel
            argument, and a captured graph would replay one mask forever.
    """
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("pyg_dfgnn: attention dropout (p > 0) cannot be captured in a CUDA "
                           "graph (the mask's seed would be frozen); capture with dropout=0 or "
                           "in eval mode")
    return int(torch.randint(0, 2**62, (1,)).item())


def needs_grad(inputs: Sequence[Tensor]) -> bool:
    """Whether autograd records a call on ``inputs`` (its backward walks the CSC)."""
    if not torch.is_grad_enabled():
        return False
    for t in inputs:
        if t.requires_grad:
            return True
    return False


def keeps_out32(spec: ScoreSpec, dtype: torch.dtype, need_grad: bool) -> bool:
    """Whether a kernel call's forward ends its saved tensors with its output in
    float32 ``[N_dst, H, C]``: fp16 / bf16 calls that record a backward of a score
    that ``keeps_out32`` (its backward takes ``D = dO . O`` from them;
    ``docs/backward.md``). Inference and fp32 calls keep nothing."""
    return spec.keeps_out32 and need_grad and dtype in (torch.float16, torch.bfloat16)


def runs_kernels(layout, is_cuda: bool, head_size: int, dtype: torch.dtype) -> bool:
    """Whether a call with CUDA features (``is_cuda``) of ``head_size`` channels
    of ``dtype`` runs the fused CUDA kernels.

    Raises:
        NotImplementedError: for CUDA features on a graph whose indices need int64
            (``E``, ``N_src`` or ``N_dst`` >= 2^31): the kernels index with int32,
            and the reference path would allocate ``[E, H, C]`` tensors.
    """
    if not (HAS_EXTENSION and is_cuda):
        return False
    if layout.col.dtype != torch.int32:
        raise NotImplementedError(
            f"pyg_dfgnn: the fused CUDA kernels take graphs with fewer than 2^31 edges and "
            f"nodes (int32 indices); this one has E={layout.num_edges}, N_src="
            f"{layout.num_src}, N_dst={layout.num_dst} ({layout.col.dtype} indices). Split "
            "it (e.g. torch_geometric.loader.NeighborLoader) or run the native PyG layer")
    return _plan.kernel_supports(head_size, dtype)


def uses_kernels(layout, x: Tensor) -> bool:
    """Whether a call with features like ``x`` ``[N, H, C]`` runs the fused CUDA kernels.

    Raises:
        NotImplementedError: as :func:`runs_kernels`.
    """
    return runs_kernels(layout, x.is_cuda, x.size(-1), x.dtype)


def kernel_inputs(inputs: Sequence[Tensor]) -> List[Tensor]:
    """``inputs`` as the attention op takes them: contiguous (the op copies an
    input that does not start on a 16-byte boundary, which vector rows need)."""
    return [t.contiguous() for t in inputs]


class Prepared(NamedTuple):
    """A call's plan and the extension's plan object for it (the layout view the
    kernels read, the plan's decisions, the score)."""
    plan: _plan.Plan
    obj: object


def prepare(spec: ScoreSpec, layout, dtype: torch.dtype, head_size: int, strategy: str,
            dropout: bool, need_attn: bool, need_grad: bool, tiles: bool = True,
            overrides: Optional[tuple] = None) -> Prepared:
    """The :class:`Prepared` of a call (:func:`~pyg_dfgnn.ops.plan.plan_for`'s
    arguments, and ``need_grad``: the call records a backward, which walks the
    CSC). ``overrides``: the plan overrides to decide with, by default those in
    effect (a backward passes its forward's).

    Raises:
        ValueError: as :func:`~pyg_dfgnn.ops.plan.plan_for`.
    """
    calls = layout.derived.calls
    key = (spec.name, dtype, head_size, strategy, dropout, need_attn, tiles,
           _plan._current() if overrides is None else overrides, need_grad)
    hit = calls.get(key)
    if hit is None:
        hit = _prepare(spec, layout, key, False)
    # col.is_cuda, not the device's type: torch.device.type builds a string on each read.
    if (hit.plan.split_rows and layout.col.is_cuda
            and torch.cuda.is_current_stream_capturing()):
        # Split rows merge in merge launches in a captured graph (Plan.merge_in_kernel).
        key = key + ("capturing",)
        hit = calls.get(key) or _prepare(spec, layout, key, True)
    return hit


# ------------------------------------------------------------ compiled calls
@torch.compiler.assume_constant_result
def plan_key(score: str, strategy: str, need_grad: bool) -> int:
    """A traced call's plan key, ``attention_fwd``'s ``key``: what
    :func:`prepare` takes beyond the layout, the inputs' dtype and head size and
    the dropout, as one int (a traced graph holds no Python objects): the
    score's place in the registration order, the strategy's in
    :data:`~pyg_dfgnn.ops.plan.STRATEGIES`, and ``need_grad``, so that the
    same call has the same key in every process. The forward builds its plan
    from it, the layout's handle, its inputs and its dropout when it runs
    (:func:`resolve`). A trace takes the key as a constant (sizes and the
    dropout may be symbolic there).

    Raises:
        ValueError: an unknown score or strategy.
    """
    _spec.get(score)  # raises for an unknown score, naming the known ones
    _plan.check_strategy(strategy)
    fields = _spec.names().index(score) * len(_plan.STRATEGIES) + _plan.STRATEGIES.index(strategy)
    return fields * 2 + int(bool(need_grad))


def key_parts(key: int) -> Tuple[str, str, bool]:
    """``(score, strategy, need_grad)`` of the plan key ``key`` (:func:`plan_key`)."""
    fields, need_grad = divmod(int(key), 2)
    score, strategy = divmod(fields, len(_plan.STRATEGIES))
    return _spec.names()[score], _plan.STRATEGIES[strategy], bool(need_grad)


def resolve(handle: Tensor, key: int, inputs: List[Tensor],
            dropout: float) -> Tuple[object, int]:
    """``(plan object, seed)`` of a forward call compiled code makes: the call
    names its layout by ``handle`` and its plan by the plan key ``key``, with the
    dropout probability it applies; the plan overrides are those in effect when
    it runs. The extension calls it
    (``cuda/glue/call_token.h``), and its exceptions reach the caller as raised.

    Raises:
        ValueError: inputs the score rejects, or as :func:`prepare`.
        NotImplementedError: as :func:`runs_kernels`.
        LookupError: no live layout has the handle.
    """
    name, strategy, need_grad = key_parts(key)
    dropout = dropout > 0
    spec = _spec.get(name)
    layout = layout_of(int(handle[0]))
    spec.check(layout, *inputs)
    value = inputs[spec.value_input]
    dtype, head_size = value.dtype, value.size(-1)
    runs_kernels(layout, True, head_size, dtype)
    prep = prepare(spec, layout, dtype, head_size, strategy, dropout, False, need_grad)
    return prep.obj, (seed() if dropout else 0)


if HAS_EXTENSION:
    from .. import _C

    _C.set_plan_resolver(resolve)


def _prepare(spec: ScoreSpec, layout, key: tuple, capturing: bool) -> Prepared:
    _, dtype, head_size, strategy, dropout, need_attn, tiles, overrides, need_grad = key[:9]
    plan, kept = _plan.kept_plan(layout, (dtype, head_size, spec.name, strategy, dropout,
                                          need_attn, tiles, capturing, overrides))
    prep = Prepared(plan, plan_object(spec, layout, plan, need_grad))
    if kept:
        layout.derived.calls[key] = prep
    return prep


def plan_object(spec: ScoreSpec, layout, plan: _plan.Plan, need_grad: bool):
    """The ``torch.classes.dfgnn.Plan`` of ``plan`` on ``layout`` (``None``
    without the extension), from :func:`plan_parts`."""
    if not HAS_EXTENSION:
        return None
    return torch.classes.dfgnn.Plan(spec.name, *plan_parts(layout, plan, need_grad,
                                                           spec.csr_row_backward))


def plan_parts(layout, plan: _plan.Plan, need_grad: bool,
               csr_row_backward: bool = False) -> tuple:
    """``(tensors, ints, floats)``: what the plan object is built from, by name
    (``cuda/glue/call_plan.h``): the layout tensors the kernels read, with the CSC
    where the call records a backward (and ``csr_row`` where that backward reads
    it: ``csr_row_backward``; and the dense-tile backward's transposed tile plan,
    with the rank map where it saves weights), the sizes and the plan's decisions."""
    rw = layout.work("row", plan.chunk, plan.long_items_first, plan.item_order)
    tensors = {"rowptr": layout.rowptr, "col": layout.col, "row_items": rw.items,
               "row_combine": rw.combine}
    if plan.pmf or (need_grad and csr_row_backward):
        tensors["csr_row"] = layout.csr_row
    if plan.dense_cells > 0:
        tensors["tiles"] = tile_plan(layout)
    ints = {"n_src": layout.num_src, "chunk": plan.chunk, "row_slots": rw.num_slots,
            "col_slots": 0, **plan.flags()}
    if need_grad:
        cw = layout.work("col", plan.chunk, plan.long_items_first, plan.item_order)
        tensors.update(colptr=layout.colptr, row=layout.row, perm=layout.perm,
                       col_items=cw.items, col_combine=cw.combine)
        ints["col_slots"] = cw.num_slots
        if plan.dense_backward:
            tensors["tiles_t"] = layout_tiles_t(layout).tiles_t
            rank_pos = layout_rank_pos(layout) if plan.save_weights else None
            if rank_pos is not None:
                tensors["rank_pos"] = rank_pos
    return tensors, ints, {"dense_cells": float(plan.dense_cells)}


# ---------------------------------------------------------------- recording
class CallRecord(NamedTuple):
    """One fused op call seen by :func:`recording`."""
    score: str  #: the score function
    layout: object  #: the graph (GraphLayout)
    plan: Optional[_plan.Plan]  #: the kernels' plan; ``None``: the reference path ran
    need_grad: bool  #: the call records a backward
    dtype: torch.dtype
    heads: int
    head_size: int
    why: str  #: why the reference path ran (empty on the kernel path)
    #: the score's per-edge inputs, ``(name, shape)`` each (``dot_edge_tail``'s
    #: ``a`` ``[E, D]``: its last ``D`` of the ``head_size`` channels)
    edge_inputs: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()


_RECORDS: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar(
    "pyg_dfgnn_call_records", default=None)


@contextlib.contextmanager
def recording():
    """Collects a :class:`CallRecord` for each fused op call inside the block
    (:func:`pyg_dfgnn.explain`); yields the list."""
    records: List[CallRecord] = []
    token = _RECORDS.set(records)
    try:
        yield records
    finally:
        _RECORDS.reset(token)


def record(spec: ScoreSpec, layout, plan: Optional[_plan.Plan], need_grad: bool,
           value: Tensor, why: str = "", eager: bool = False,
           inputs: Sequence[Tensor] = ()) -> None:
    """Adds a call to the innermost :func:`recording` block, if any; none while
    ``torch.compile`` traces (a trace runs once for many calls, and some
    versions' Dynamo cannot read a context variable). ``eager``: the caller has
    checked that no trace is running. ``inputs``: the call's inputs, whose
    per-edge ones (``spec.edge_inputs``) the record names with their shapes."""
    if not eager and torch.compiler.is_compiling():
        return
    records = _RECORDS.get()
    if records is not None:
        edge = tuple((spec.inputs[i], tuple(inputs[i].shape)) for i in spec.edge_inputs)
        records.append(CallRecord(spec.name, layout, plan, need_grad, value.dtype,
                                  value.size(1), value.size(2), why, edge))


def reference_reason(layout, value: Tensor) -> str:
    """Why a call with the row input ``value`` runs the reference path."""
    if not value.is_cuda:
        return "CPU tensors: the pure-PyTorch reference path"
    if not HAS_EXTENSION:
        return "the extension pyg_dfgnn._C is not loaded (python -m pyg_dfgnn info)"
    return (f"no fused kernel for heads of {value.size(-1)} {value.dtype} channels "
            f"(pyg_dfgnn.ops.plan.kernel_supports)")



def op_args(score: str, layout, inputs: Sequence[Tensor], params: Sequence[float],
            dropout: float = 0.0, seed: int = 0, need_attn: bool = False, need_grad: bool = True,
            strategy: str = "smmf") -> tuple:
    """The argument tuple of ``torch.ops.dfgnn.attention_fwd`` for an eager call
    of the score ``score`` on ``layout`` with the plan of ``strategy`` (tests and
    benchmarks that call the op directly).

    Raises:
        ValueError: as :func:`~pyg_dfgnn.ops.plan.plan_for`.
    """
    spec = _spec.get(score)
    value = inputs[spec.value_input]
    prep = prepare(spec, layout, value.dtype, value.size(-1), strategy, dropout > 0, need_attn,
                   need_grad)
    return (list(inputs), layout.handle, prep.obj, 0, [float(p) for p in params],
            float(dropout), int(seed), bool(need_attn))
