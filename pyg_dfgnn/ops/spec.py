r"""Score specs: what the ops, the kernel plan, the fakes and the
``torch.compile`` registrations know of a score function.

Every attention layer is score -> edge softmax -> weighted SpMM (paper §3); what
differs is the **score function** of edge :math:`j \to i`. A score is one
:class:`ScoreSpec` here and, in C++, its device functor (``cuda/scores/<name>.cuh``)
and host entry points, registered under the same name (``cuda/scores/<name>.cu``
or ``.cpp``), so adding a score is its spec (with its reference), its C++ files
and its ``nn`` layer, and no edit to a shared file (``docs/architecture.md``).
The spec modules live in :mod:`pyg_dfgnn.ops.scores` and register themselves on
import.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from torch import Tensor


def _no_saved(inputs: Sequence[Tensor], plan=None) -> List[Tensor]:
    return []


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
    r"""One score function.

    Attributes:
        name (str): the registry name, shared with the C++ side
            (``DFGNN_REGISTER_SCORE`` in ``cuda/scores/<name>.cu`` or ``.cpp``).
        inputs (tuple of str): the op's tensor inputs, in kernel order.
        params (tuple of str): its scalar parameters, in kernel order.
        dst_input (int): the input whose rows are the destination nodes (its
            ``size(0)`` is ``N_dst``).
        value_input (int): the ``[N_src, H, C]`` input whose dtype, heads and
            channels are the call's.
        row_inputs (tuple of int): the inputs read as ``[N, H, C]`` or ``[E, H,
            C]`` rows (16-byte vector loads: they must be 16-byte aligned).
        edge_inputs (tuple of int): the inputs with one row per edge in the
            layout's CSR edge order: ``[E, H, C]`` (in ``row_inputs`` too) or
            ``[E, H]``, one scalar per edge and head; the backward returns their
            gradients in that order.
        reference (callable): ``(layout, inputs, params, dropout, training) ->
            (out [N_dst, H, C], alpha [E, H])`` in pure PyTorch, CSR edge order:
            the CPU path and the oracle of the tests.
        check (callable): ``(layout, *inputs)``, raises :class:`ValueError` on
            inputs the op cannot take (shapes, dtypes, devices).
        saved_like (callable): ``(inputs, plan=None) -> list`` of empty tensors
            shaped like those the CUDA forward saves for its backward (the fakes;
            ``plan``: the call's plan object, where known).
        pmf (bool): the score has an edge-parallel (PMF) path.
        pmf_rule (bool): the paper's rule (§4.2) sends it to PMF on graphs with
            rows longer than shared memory (dot-product-like scores).
        mma (bool): the fp16 / bf16 tensor-core forward and backward run it.
        dense_tiles (bool): the dense-tile forward runs it.
        two_rows (bool): its fp32 SMMF forward has the two-rows-per-warp shapes.
        one_launch_backward (bool): its backward can run both walks in one launch.
        row_walk (bool): besides its own SMMF forward it has one on the shared row
            walk (``kernels/row_forward.cuh``; the plan's ``row_walk`` picks).
        csr_row_backward (bool): its backward runs an edge-parallel kernel (the
            additive_edge score's d a_edge), which reads each CSR edge's
            destination, ``csr_row``, as the PMF forward does.
        keeps_out32 (bool): its fp16 / bf16 backward takes ``D = dO . O`` from
            the forward's output in float32, which the forward then keeps where a
            backward follows, as the last entry of its saved tensors
            (:func:`pyg_dfgnn.ops.calls.keeps_out32`; the additive scores compute
            D in their own backward walk). ``ScoreOps::keeps_out32`` in C++.
        normalize_first (callable, optional): ``(dtype, method) -> bool``: whether
            a call of that dtype and method (``"smmf"`` / ``"pmf"``) normalises its
            rows first and runs the dot score's kernels over them (the plan's
            ``normalize_first``); ``None``: never.
    """
    name: str
    inputs: Tuple[str, ...]
    params: Tuple[str, ...]
    dst_input: int
    value_input: int
    row_inputs: Tuple[int, ...]
    reference: Callable
    check: Callable
    saved_like: Callable = _no_saved
    edge_inputs: Tuple[int, ...] = ()
    pmf: bool = True
    pmf_rule: bool = True
    mma: bool = False
    dense_tiles: bool = False
    two_rows: bool = True
    one_launch_backward: bool = True
    row_walk: bool = False
    normalize_first: Optional[Callable] = None
    csr_row_backward: bool = False
    keeps_out32: bool = False


_SPECS: Dict[str, ScoreSpec] = {}


def register(spec: ScoreSpec) -> ScoreSpec:
    """Adds ``spec`` to the registry (once per name) and returns it."""
    if spec.name in _SPECS and _SPECS[spec.name] is not spec:
        raise ValueError(f"pyg_dfgnn: a score named {spec.name!r} is registered already")
    _SPECS[spec.name] = spec
    return spec


def get(name: str) -> ScoreSpec:
    """The spec registered as ``name``.

    Raises:
        ValueError: no score has that name.
    """
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown score function {name!r}; known: {', '.join(sorted(_SPECS))}")
    return spec


def names() -> Tuple[str, ...]:
    """The registered scores' names, in registration order."""
    return tuple(_SPECS)


def specs() -> Iterator[ScoreSpec]:
    """Every registered spec, in registration order."""
    return iter(list(_SPECS.values()))
