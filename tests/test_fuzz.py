r"""Differential fuzzer: the fused layers against native PyG in float64.

Each case draws a graph (a family below, its random edges seeded by a drawn
integer), a layer configuration, a dtype and a fusion strategy; builds the native
layer and the fused one with the same ``state_dict``; and compares the fused
layer's output, attention weights and gradients (inputs and every parameter)
with those of the native layer run in float64 on the *same* values (the fused
layer's parameters and inputs, already rounded to its dtype, cast up):

* float32: rel. err. < 1e-5 (outputs, attention weights), < 1e-4 (gradients);
* float16 / bfloat16: < 1e-2.

:func:`conftest.rel_err_floor` fails on NaN / Inf. On CPU the fused layers run the
reference path (:mod:`pyg_dfgnn.ops.reference`), still a differential test of the
layers against PyG's message passing; on CUDA they run the kernels.

Profiles (``--fuzz-profile``): ``ci`` (default: CPU, 4,060 cases, about 45 s on two
cores) and ``gpu`` (CUDA, >= 2,000 cases; the tests are then marked ``cuda``).
Both draw from fixed seeds with no example database, so a run repeats exactly; a
mismatch prints the falsifying case (graph family, seed, sizes, configuration)
and the command that replays it. The GPU run::

    python -m pytest -q tests/test_fuzz.py --fuzz-profile=gpu -rP

prints the number of cases (``test_fuzz_coverage``).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import functools
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch
from torch import Tensor
from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv
from torch_geometric.nn import Linear as PygLinear
from torch_geometric.nn.conv import agnn_conv, gat_conv, gatv2_conv, transformer_conv
from torch_geometric.utils import add_self_loops, remove_self_loops, scatter
from torch_geometric.utils import softmax as pyg_softmax

from benchmarks.sanitize import beta_terms
from conftest import NATIVE_FACTOR, layer_grad_floor, rel_err_floor
from pyg_dfgnn import ops
from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedGATv2Conv, FusedTransformerConv
from pyg_dfgnn.nn._edge_tails import padded_edge_dim
from pyg_dfgnn.ops import plan
from pyg_dfgnn.ops.scores.dot_edge_tail import tails_pay

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, note, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.fuzz

#: Device and examples per graph family of each layer test, per profile.
PROFILES = {
    "ci": dict(device="cpu", examples={"gt": 100, "gt_edge": 40, "gat": 100, "gatv2": 60,
                                       "agnn": 80, "gat_edge": 40, "gatv2_edge": 40}),
    "gpu": dict(device="cuda", examples={"gt": 90, "gt_edge": 80, "gat": 85, "gatv2": 80,
                                         "agnn": 75, "gat_edge": 80, "gatv2_edge": 80}),
}

TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-2, 1e-2),
       torch.bfloat16: (1e-2, 1e-2)}  # (outputs and attention weights, gradients)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Results with an RMS below this are compared absolutely (see :func:`_error`).
GRAD_FLOOR = 1e-2
#: The layer's output is compared absolutely below this RMS: within 1e-6 in fp32,
#: about 8 ulps of a term near 1. A one-element output whose heads and bias
#: cancel (GATConv, concat=False: heads near 1.97 and -1.83, output -4.9e-4) can
#: be no closer than the rounding of those terms; GRAD_FLOOR would ask 1e-7, under
#: half an ulp of them.
OUTPUT_FLOOR = 1e-1
#: Gradients with an RMS below this fraction of the layer's largest gradient RMS
#: are compared absolutely (see :func:`_floors`).
LAYER_GRAD_FLOOR = 1e-2
#: A gradient under this fraction of its terms' magnitude with no logit gradient
#: cancelling (:func:`_logit_magnitudes`) is a cancellation, compared against
#: that magnitude: the GPU's fp32 draws that needed it, replayed on the CPU with
#: other parameters, sit at 1e-4 to 2e-3 of it (one source's duplicate edges:
#: 3e-17), the source features' gradients in the same draws at 7e-2 to 8e-2.
CANCELLED = 0.1
STRATEGIES = ("auto", "smmf", "pmf")
FAMILIES = ("zero_edges", "one_node", "bipartite", "empty_rows", "super_node", "duplicates",
            "self_loops", "batch", "random")
SQUARE_FAMILIES = tuple(f for f in FAMILIES if f != "bipartite")
#: The ``fill_value`` of the GAT layers with edge features: every reduction of
#: PyG's ``add_self_loops``, a float, an int and a tensor (``"tensor"``: one value
#: per edge feature, built per case).
FILL_VALUES = ("mean", "add", "max", "min", "mul", 0.5, 2, "tensor")
#: The score(s) each layer test's fused op runs: every one must have run
#: (:func:`test_fuzz_coverage`); TransformerConv with ``edge_dim`` runs
#: ``dot_edge_tail`` or ``dot_edge`` (:func:`gt_edge_score`).
SCORES = {"gt": ("dot",), "gt_edge": ("dot_edge", "dot_edge_tail"), "gat": ("additive",),
          "gatv2": ("gatv2",), "agnn": ("cosine",), "gat_edge": ("additive_edge",),
          "gatv2_edge": ("gatv2_edge",)}
#: The layer tests whose layers add self-loops with edge features (``fill_value``).
FILL_LAYERS = ("gat_edge", "gatv2_edge")

#: What the cases of this process drew: ``(layer, key)`` -> count (checked by
#: :func:`test_fuzz_coverage`, which runs after the layer tests).
DRAWN: collections.Counter = collections.Counter()


@dataclass
class Fuzz:
    name: str
    device: torch.device
    examples: dict

    def __call__(self, layer: str, family: str):
        """Decorator of one layer test's ``@given`` function: the profile's settings,
        no example database, and a fixed seed per profile, layer and family (a
        derandomised run would draw the same configurations for every family:
        its seed is the function's source)."""
        def wrap(test):
            test = settings(max_examples=self.examples[layer], database=None, deadline=None,
                            print_blob=True, suppress_health_check=list(HealthCheck))(test)
            return seed(zlib.crc32(f"{self.name}/{layer}/{family}".encode()))(test)
        return wrap


@pytest.fixture(scope="module")
def fuzz(request):
    name = request.config.getoption("--fuzz-profile")
    prof = PROFILES[name]
    # One intra-op thread: the cases' tensors are tiny, and on a busy machine two
    # threads spin-waiting on each other made the ci profile 10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Fuzz(name, torch.device(prof["device"]), prof["examples"])
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- graphs
@dataclass
class Graph:
    """A drawn graph; ``build_graph(*args)`` rebuilds it."""
    args: tuple
    num_src: int
    num_dst: int
    edge_index: Tensor = field(repr=False)

    @property
    def family(self) -> str:
        return self.args[0]

    def __repr__(self) -> str:
        return (f"build_graph{self.args} (N_src={self.num_src}, N_dst={self.num_dst}, "
                f"E={self.edge_index.size(1)})")


def _edges(g: torch.Generator, num_src: int, num_dst: int, num: int,
           dst_pool: Optional[Tensor] = None) -> Tensor:
    if num == 0 or num_src == 0 or num_dst == 0:
        return torch.empty(2, 0, dtype=torch.long)
    src = torch.randint(0, num_src, (num,), generator=g)
    if dst_pool is None:
        dst = torch.randint(0, num_dst, (num,), generator=g)
    else:
        dst = dst_pool[torch.randint(0, dst_pool.numel(), (num,), generator=g)]
    return torch.stack([src, dst])


def build_graph(family: str, seed: int, n: int, m: int, extra: int) -> Graph:
    """The graph of ``family`` with ``n`` nodes (``n`` sources and ``m`` destinations
    if bipartite), about ``extra`` edges per node, random parts from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    ns = nd = n
    if family == "bipartite":
        nd = m if m != n else m + 1
    if family == "one_node":
        ns = nd = 1
        ei = torch.zeros(2, extra % 4, dtype=torch.long)  # 0 to 3 self-loops
    elif family == "zero_edges":
        ei = torch.empty(2, 0, dtype=torch.long)
    elif family == "empty_rows":
        keep = torch.randperm(nd, generator=g)[:max(1, nd // 3)]
        ei = _edges(g, ns, nd, extra * nd, dst_pool=keep)
    elif family == "super_node":
        # A destination with more in-edges than a work item holds (rows split over
        # several items on the GPU) and a source with as many out-edges.
        hub_in = torch.stack([torch.randint(0, ns, (30 + 37 * extra,), generator=g),
                              torch.full((30 + 37 * extra,), int(seed % nd))])
        hub_out = torch.stack([torch.full((40 + 23 * extra,), int(seed % ns)),
                               torch.randint(0, nd, (40 + 23 * extra,), generator=g)])
        ei = torch.cat([_edges(g, ns, nd, 2 * nd), hub_in, hub_out], 1)
    elif family == "duplicates":
        base = _edges(g, ns, nd, extra * nd + 1)
        reps = torch.randint(1, 5, (base.size(1),), generator=g)
        ei = base.repeat_interleave(reps, dim=1)
    elif family == "self_loops":
        loops = torch.randint(0, nd, (max(1, nd // 2),), generator=g)
        ei = torch.cat([_edges(g, ns, nd, extra * nd), loops.repeat(2, 1)], 1)
    elif family == "batch":
        # A disconnected batch of small graphs, as PyG's DataLoader builds it: some
        # without edges, some random, some complete (with loops; a batch of those
        # runs the dense-tile forward on the GPU in half precision).
        parts, off = [], 0
        for i in range(2 + 2 * extra):
            k = 1 + (seed >> i) % 12
            kind = (seed >> (i + 8)) % 4
            if kind == 1:
                parts.append(torch.cartesian_prod(torch.arange(k), torch.arange(k)).t() + off)
            elif kind > 1:
                parts.append(_edges(g, k, k, 2 * k) + off)
            off += k
        ns = nd = off
        ei = torch.cat(parts, 1) if parts else torch.empty(2, 0, dtype=torch.long)
    else:  # random, bipartite
        ei = _edges(g, ns, nd, extra * max(ns, nd))
    perm = torch.randperm(ei.size(1), generator=g)
    return Graph((family, seed, n, m, extra), ns, nd, ei[:, perm].contiguous())


@st.composite
def graphs(draw, family: str) -> Graph:
    return build_graph(family, draw(st.integers(0, 2**31 - 1)), draw(st.integers(1, 40)),
                       draw(st.integers(1, 40)), draw(st.integers(0, 6)))


def out_channels(device: torch.device, smallest: int = 1):
    """Odd and small head sizes everywhere; on CUDA also the sizes of the vector,
    MMA and dense-tile kernels, and rows of two and four 16-byte vectors per lane
    (160, 256 and 384 channels in float32, 384 in half precision; at 160 channels
    the second access leaves 24 of 32 lanes idle)."""
    small = st.integers(smallest, 9)
    if device.type == "cuda":
        return st.one_of(small, st.sampled_from([16, 32, 64, 128, 160, 256, 384]))
    return small


def common(dtypes=DTYPES):
    return dict(dtype=st.sampled_from(dtypes), strategy=st.sampled_from(STRATEGIES),
                graph_seed=st.integers(0, 2**31 - 1), training=st.booleans())


def agnn_dtypes(device: torch.device):
    """Every dtype, on CPU and CUDA."""
    return DTYPES


# ----------------------------------------------------------------------------- comparison
def _describe(layer: str, case: dict) -> str:
    return f"{layer}: " + ", ".join(f"{k}={v!r}" for k, v in case.items())


def _forward_backward(layer, xs, edge_index, call_kwargs, want_alpha, seed: int,
                      dtype: torch.dtype, edge_attr: Optional[Tensor] = None) -> dict:
    """Output, attention weights, returned ``edge_index`` and the gradients of
    ``(out * w).sum()`` (inputs, the edge features where given, then parameters by
    name) of one layer, for a random ``w`` from ``seed`` rounded to ``dtype``."""
    x = xs[0] if len(xs) == 1 else tuple(xs)
    edge = [] if edge_attr is None else [edge_attr]
    res = layer(x, edge_index, *edge, **call_kwargs)
    out, (ei, alpha) = res if want_alpha else (res, (None, None))
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    w = w.to(dtype).to(device=out.device, dtype=out.dtype)
    params = dict(layer.named_parameters())
    leaves = list(xs) + edge + list(params.values())
    grads = torch.autograd.grad((out * w).sum(), leaves, allow_unused=True)
    names = ([f"grad x[{i}]" for i in range(len(xs))] + ["grad edge_attr"] * len(edge)
             + [f"grad {n}" for n in params])
    got = {"output": out, "attention weights": alpha}
    got.update(zip(names, grads))
    if ei is not None:
        got["edge_index"] = ei.as_subclass(Tensor).cpu()
    return got


def _error(a: Optional[Tensor], b: Optional[Tensor], floor: float = GRAD_FLOOR) -> float:
    r"""Error of ``a`` against the float64 ``b``: :func:`conftest.rel_err_floor`
    (RMS floor ``floor``; ``inf`` on NaN or Inf). A result missing on one side only
    (a gradient) is an error unless the other one is all zeros."""
    if a is None or b is None:
        other = b if a is None else a
        return 0.0 if other is None or not bool(other.abs().sum()) else float("inf")
    return rel_err_floor(a, b, floor)


def _agnn_beta_scale(layer, x: Tensor, edge_index: Tensor, seed: int, dtype: torch.dtype,
                     grad_beta: Tensor) -> float:
    r"""The floor of AGNN's ``beta`` gradient: :math:`\sum_e |d\alpha_e \cos_e|`, in
    float64, for the loss of :func:`_forward_backward`.

    That gradient is the sum :math:`\sum_e d\alpha_e \cos_e` (scores
    :math:`\alpha_e = \beta \cos_e`), whose terms cancel: per row
    :math:`\sum_j d\alpha_{ij} = 0`. In half precision the cosines are rounded (in
    PyG too: its normalised features are half) and the error of the sum is a fraction
    of its terms' magnitudes, not of the sum: a float64 emulation of 2,000 bf16 draws
    on fuzz-sized graphs gives the fused error at most 2.1e-3 of this scale, while
    against the sum itself both the fused layer and PyG exceed 1e-2 on about one
    draw in a hundred, each on different draws. Checks that its terms add up to
    ``grad_beta``."""
    x = x.detach().double().cpu()
    edge_index = edge_index.cpu()
    n = x.size(0)
    if layer.add_self_loops:
        edge_index, _ = remove_self_loops(edge_index)
        edge_index, _ = add_self_loops(edge_index, num_nodes=n)
    src, dst = edge_index
    w = torch.randn((n, x.size(1)), generator=torch.Generator().manual_seed(seed))
    w = w.to(dtype).double()  # the weights of _forward_backward's loss
    terms = beta_terms(src, dst, x, float(layer.beta.detach()), w, n)
    scale = float(terms.abs().sum())
    assert abs(float(terms.sum()) - float(grad_beta.sum())) <= 1e-9 * max(scale, 1.0), \
        "the beta gradient's terms do not add up to the float64 reference"
    return scale


def _head_rms(layer, xs: list, edge_index: Tensor, edge_attr: Optional[Tensor]) -> float:
    r"""RMS of the per-head outputs that ``layer`` (float64) sums into its output:
    a copy with ``concat=True`` and without bias, residual or root weight, run on
    the float64 inputs.

    With ``concat=False`` the output is the mean of the heads plus those terms, and
    where they cancel (one output of heads near 1.94 and -1.73 plus a bias: 0.039)
    it can be no closer than the rounding of the heads: half an ulp of 1.94 is
    3.9e-3 in bfloat16, 1.2e-7 in float32. So the output's floor is this RMS at
    least, and the tolerance applies to the terms' scale as it does to every
    other result's."""
    heads = copy.deepcopy(layer)
    for name, off in (("concat", True), ("bias", None), ("res", None), ("root_weight", False)):
        if hasattr(heads, name):
            setattr(heads, name, off)
    x = xs[0] if len(xs) == 1 else tuple(xs)
    with torch.no_grad():
        out = heads(x, edge_index, *([] if edge_attr is None else [edge_attr]))
    return float(out.square().mean().sqrt()) if out.numel() else 0.0


@contextlib.contextmanager
def _linear_scales(layer):
    r"""Collects, while the block runs ``layer`` (float64) forward and backward, the
    terms that each of its linear maps' gradients sum over rows, and fills the
    yielded dict when the block ends: the RMS of
    :math:`\sum_r |\mathbf{g}_r| |\mathbf{x}_r|^\top` for the weight and of
    :math:`\sum_r |\mathbf{g}_r|` for the bias (``g_r``: the gradient of the
    map's output row, ``x_r``: its input row, every call's rows), keyed as the
    results are (``"grad lin_edge.weight"``). The hooks read, never change, what
    flows; the float64 reference run itself feeds them.

    Where those terms cancel, a gradient is a small fraction of them and can be
    no closer than their rounding in half precision (PyG's too), as AGNN's beta
    (:func:`_agnn_beta_scale`): ``lin_edge`` in GATConv, whose logit gradients
    sum to zero per row (one destination row of 12 edges, four heads of one
    channel: off by 1.07e-2 of itself in bfloat16), or ``lin_value`` over
    values of either sign (36 nodes of one feature: 1.2e-2)."""
    terms = collections.defaultdict(list)

    def keep(name):
        def hook(module, inputs, out):
            rows = inputs[0].detach().reshape(-1, module.weight.size(1)).abs()
            out.register_hook(lambda g: terms[name].append(
                (g.reshape(-1, module.weight.size(0)).abs(), rows)))
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in layer.named_modules()
               if isinstance(m, (torch.nn.Linear, PygLinear))
               and isinstance(getattr(m, "weight", None), torch.nn.Parameter)]
    scales = {}
    try:
        yield scales
    finally:
        for h in handles:
            h.remove()
    for name, calls in terms.items():
        weight = sum(g.t() @ x for g, x in calls)
        scales[f"grad {name}.weight"] = float(weight.square().mean().sqrt())
        bias = sum(g.sum(0) for g, _ in calls)
        scales[f"grad {name}.bias"] = float(bias.square().mean().sqrt())


class _LogitMagnitudes(torch.autograd.Function):
    r"""PyG's ``softmax`` forward; backward, the magnitude of each logit
    gradient's terms, :math:`P_{ij} (|dP_{ij}| + |D_i|)` with
    :math:`D_i = \sum_j P_{ij} dP_{ij}`, in place of the gradient
    :math:`P_{ij} (dP_{ij} - D_i)` itself (:func:`_logit_magnitudes`)."""

    @staticmethod
    def forward(ctx, src, index, num_nodes):
        out = pyg_softmax(src, index, None, num_nodes)
        ctx.save_for_backward(out, index)
        ctx.num_nodes = out.size(0) if num_nodes is None else num_nodes
        return out

    @staticmethod
    def backward(ctx, grad):
        p, index = ctx.saved_tensors
        d = scatter(p * grad, index, 0, dim_size=ctx.num_nodes, reduce="sum")
        return p * (grad.abs() + d.abs().index_select(0, index)), None, None


@contextlib.contextmanager
def _logit_magnitudes():
    r"""PyG's attention layers (float64) with logit gradients of the magnitude of
    their terms (:class:`_LogitMagnitudes`) while the block runs: their gradients
    are then those the layer would have if no logit gradient cancelled.

    Per row the logit gradients sum to zero (:math:`\sum_j P_{ij} (dP_{ij} -
    D_i) = 0`), so what reaches a gradient only through their per-row sums is a
    cancellation: GATConv's destination terms (``att_dst``, ``x_dst``,
    ``lin_dst``), or a source's duplicate edges, whose ``dP`` all equal ``D``
    (``edge_attr`` of GATConv with edge features on one source node). Such a
    gradient is zero in exact arithmetic, and a layer can be no closer to it than
    the rounding of those terms: on the H200 the fp32 kernels missed such
    gradients by 1.1e-4 to 1.5e-4 against the other floors, native PyG by 2.6e-7
    to 1.8e-5 (rounding other terms; docs/findings.md, "The fuzzer's floors")."""
    modules = (agnn_conv, gat_conv, gatv2_conv, transformer_conv)

    def softmax(src, index=None, ptr=None, num_nodes=None, dim=0):
        assert index is not None and dim == 0, "PyG's layers call softmax by index here"
        return _LogitMagnitudes.apply(src, index, num_nodes)

    saved = [m.softmax for m in modules]
    for m in modules:
        m.softmax = softmax
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.softmax = f


def _floors(want: dict) -> dict:
    r"""RMS floor of each result: :data:`OUTPUT_FLOOR` for the output,
    :data:`GRAD_FLOOR` for the attention weights, and for gradients
    :func:`conftest.layer_grad_floor` (at least :data:`LAYER_GRAD_FLOOR` of the
    layer's largest gradient RMS)."""
    grads = [v for k, v in want.items() if k.startswith("grad")]
    grad_floor = layer_grad_floor(grads, GRAD_FLOOR, LAYER_GRAD_FLOOR)
    return {k: grad_floor if k.startswith("grad") else
            OUTPUT_FLOOR if k == "output" else GRAD_FLOOR for k in want}


@contextlib.contextmanager
def _deterministic():
    """PyG's scatter sums in a fixed order (torch's deterministic algorithms, where
    an op has one) for the duration.

    On CUDA they add with atomics otherwise, so PyG's own half-precision error
    changes from call to call (for one GAT bf16 case: 0.0072 to 0.0130 over 40
    calls, 0.0027 in another run) and a comparison against it is not repeatable.
    The fused kernels sum in edge order and give one result."""
    was, warn_only = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():  # ops with no deterministic kernel still run
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def compare(native_cls, fused_cls, ctor: dict, graph: Graph, in_dims, device: torch.device,
            dtype: torch.dtype, strategy: str, seed: int, training: bool, call_kwargs: dict,
            want_alpha: bool, score: str, beta: Optional[float] = None,
            edge_dim: Optional[int] = None) -> str:
    r"""Builds the native and the fused layer from ``ctor`` (same ``state_dict``),
    runs the fused one in ``dtype`` on ``device`` and the native one in float64 on
    the same (rounded) values, and checks the output, the attention weights and
    every gradient against :data:`TOL`. Returns the score the fused op ran.

    The fused layer's forward must make exactly one fused op call
    (:func:`pyg_dfgnn.ops.recording`), of the score ``score`` in ``dtype``: a
    silent fallback to PyG's own ``forward`` (no call) or another score fails.
    No drawn case is one the layers hand to PyG (their ``fallback_reason``: no
    customised propagate, hooks or sparse adjacency here, attention weights
    only without dropout in training, reducing ``fill_value`` only where PyG
    takes it; CPU tensors run the op's reference path, CUDA ones the kernels),
    and an empty graph or one without edges still makes the call (its rows
    just have no in-edge). The op records its forward only; its backward,
    reference autograd or the extension's, records nothing.

    A result over the tolerance still passes when the native layer run in ``dtype``
    misses the float64 result by at least a fifth as much (PyG summing in a
    fixed order, :func:`_deterministic`; the case is
    ill-conditioned, say a one-element output with cancellation, and the fused
    layer is as accurate as PyG). A NaN or Inf never passes.

    ``in_dims`` is ``(F_src, F_dst)`` (``F_dst`` ``None``: one feature matrix);
    ``edge_dim`` set: random ``[E, edge_dim]`` edge features are passed too.
    Training mode is used only without dropout (the two layers would draw
    different masks); layers with dropout run in eval mode."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    native = native_cls(**ctor)
    with torch.no_grad():  # no zero parameters (PyG initialises biases to zero)
        for p in native.parameters():
            p.add_(torch.randn(p.shape, generator=gen), alpha=0.3)
        if beta is not None:
            native.beta.fill_(beta)
    fused = fused_cls(**ctor, strategy=strategy)
    fused.load_state_dict(native.state_dict())
    fused = fused.to(device=device, dtype=dtype)
    train = training and not ctor.get("dropout", 0.0)

    def native_in(dt):  # the native layer holding the fused layer's (rounded) values
        layer = copy.deepcopy(native).to(device=device, dtype=dt)
        layer.load_state_dict(fused.state_dict())
        return layer.train(train)

    fused.train(train)
    f_src, f_dst = in_dims
    xs = [torch.randn(graph.num_src, f_src, generator=gen)]
    if f_dst is not None:
        xs.append(torch.randn(graph.num_dst, f_dst, generator=gen))
    xs = [x.to(device=device, dtype=dtype) for x in xs]
    edge_index = graph.edge_index.to(device)
    ea = (None if edge_dim is None else
          torch.randn(edge_index.size(1), edge_dim, generator=gen).to(device=device,
                                                                     dtype=dtype))

    def run(layer, dt):
        inputs = [x.to(dt).requires_grad_() for x in xs]
        edge = None if ea is None else ea.to(dt).requires_grad_()
        return _forward_backward(layer, inputs, edge_index, call_kwargs, want_alpha, seed,
                                 dtype, edge)

    with ops.recording() as calls:
        got = run(fused, dtype)
    ran = [c.score for c in calls]
    assert ran == [score], (
        f"fused op calls {ran}, expected one call of the {score!r} score"
        + ("" if ran else " (the fused layer ran PyG's own forward)"))
    assert calls[0].dtype == dtype, f"the fused op ran in {calls[0].dtype}, not {dtype}"
    assert got["output"].dtype == dtype and got["output"].device.type == device.type
    reference = native_in(torch.float64)
    with _linear_scales(reference) as scales:
        want = run(reference, torch.float64)
    assert got.keys() == want.keys(), f"results differ: {sorted(got)} vs {sorted(want)}"
    if "edge_index" in got:
        assert torch.equal(got.pop("edge_index"), want.pop("edge_index")), \
            "returned edge_index differs"
    floors = _floors(want)
    floors["output"] = max(floors["output"], _head_rms(
        reference, [x.to(torch.float64) for x in xs], edge_index,
        None if ea is None else ea.to(torch.float64)))
    for k, scale in scales.items():
        if k in floors:
            floors[k] = max(floors[k], scale)
    if native_cls is AGNNConv and want.get("grad beta") is not None:
        floors["grad beta"] = max(floors["grad beta"],
                                  _agnn_beta_scale(native_in(torch.float64), xs[0], edge_index,
                                                   seed, dtype, want["grad beta"]))
    errors = {k: _error(got[k], want[k], floors[k]) for k in got}
    tol = {k: TOL[dtype][k.startswith("grad")] for k in got}
    bad = {k: e for k, e in errors.items() if not e < tol[k]}
    if any(k.startswith("grad") for k in bad):  # through logit gradients that cancel?
        with _logit_magnitudes():
            mags = run(native_in(torch.float64), torch.float64)
        for k in [k for k in bad if k.startswith("grad") and mags[k] is not None]:
            scale = float(mags[k].square().mean().sqrt())
            if float(want[k].square().mean().sqrt()) <= CANCELLED * scale:
                floors[k] = max(floors[k], scale)
                bad[k] = _error(got[k], want[k], floors[k])
                if bad[k] < tol[k]:
                    del bad[k]
    if bad:  # is PyG itself that far off in this dtype?
        with _deterministic():
            same = run(native_in(dtype), dtype)
        base = {k: _error(same[k], want[k], floors[k]) for k in bad}
        bad = {k: e for k, e in bad.items()
               if not (e < float("inf") and e <= NATIVE_FACTOR * base[k])}
        assert not bad, "; ".join(
            f"{k}: rel. err. {e:.3g} >= {tol[k]:g} (native PyG in {dtype}: {base[k]:.3g})"
            for k, e in bad.items())
    return ran[0]


#: The property each family exists for (see :func:`_count`).
FAMILY_PROPERTY = {"zero_edges": "E=0", "one_node": "N=1", "bipartite": "N_src!=N_dst",
                   "empty_rows": "isolated dst", "super_node": "in-degree > 32",
                   "duplicates": "duplicate edges", "self_loops": "self-loops",
                   "batch": "isolated dst", "random": "E>0"}


def _count(layer: str, graph: Graph, dtype: torch.dtype, strategy: str, score: str,
           fill: Optional[str] = None) -> None:
    r"""Counts a case's keys in :data:`DRAWN`: the properties of its graph, its
    dtype and strategy, the score its fused op ran (``score=...``), whether the
    input graph has self-loops (``input loops: present`` / ``absent``) and, for a
    layer with edge features that adds self-loops, the kind of ``fill_value``
    the layer was built with (``fill``: :func:`fill_kind`; ``None``: no loops
    added) and the input's own loops again, which the layer replaces."""
    ei = graph.edge_index
    deg = torch.bincount(ei[1], minlength=graph.num_dst)
    props = {"E=0": ei.size(1) == 0, "E>0": ei.size(1) > 0,
             "N=1": graph.num_src == graph.num_dst == 1,
             "N_src!=N_dst": graph.num_src != graph.num_dst,
             "isolated dst": bool((deg == 0).any()),
             # more in-edges than a small graph's work item (rows split on the GPU)
             "in-degree > 32": bool((deg > 32).any()),
             "duplicate edges": torch.unique(ei, dim=1).size(1) < ei.size(1),
             "self-loops": bool((ei[0] == ei[1]).any())}
    keys = [k for k, hit in props.items() if hit] + [str(dtype), strategy, "cases"]
    loops = "input loops: " + ("present" if props["self-loops"] else "absent")
    keys += [f"score={score}", loops]
    if fill is not None:
        keys += [f"fill={fill}", f"fill, {loops}"]
    for key in keys:
        DRAWN[layer, graph.family, key] += 1
        hypothesis.event(key)


def _run_case(layer: str, test: str, fuzz: Fuzz, case: dict, fill: Optional[str] = None,
              **kwargs) -> None:
    """Runs :func:`compare` on ``case`` (``kwargs``: its further arguments, the
    expected ``score`` among them) and counts it (:func:`_count`; ``fill``: its
    :func:`fill_kind` where the layer adds self-loops with edge features)."""
    note(_describe(layer, case))
    try:
        score = compare(device=fuzz.device, dtype=case["dtype"], strategy=case["strategy"],
                        seed=case["graph_seed"], training=case["training"],
                        graph=case["graph"], **kwargs)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n  case: {_describe(layer, case)}\n  replay: pytest "
            f"'tests/test_fuzz.py::{test}' --fuzz-profile={fuzz.name}") from None
    _count(layer, case["graph"], case["dtype"], case["strategy"], score, fill)


def fill_kind(fill) -> str:
    """The kind of a ``fill_value``: the reduction's name, ``"tensor"``, or the
    number's type (``"float"``, ``"int"``)."""
    if isinstance(fill, str):
        return fill
    if isinstance(fill, Tensor):
        return "tensor"
    return type(fill).__name__


def gt_edge_score(device: torch.device, dtype: torch.dtype, heads: int, channels: int,
                  edge_dim: int, tails: bool) -> str:
    r"""The score :class:`~pyg_dfgnn.nn.FusedTransformerConv` with ``edge_dim``
    runs (``nn/_edge_tails.py``, ``tail_weight``): ``"dot_edge_tail"`` where
    ``edge_tails`` is on (``tails``), the tails move fewer bytes
    (:func:`~pyg_dfgnn.ops.scores.dot_edge_tail.tails_pay`) and, on CUDA, the
    kernels take rows of ``C + D'`` channels (:func:`padded_edge_dim`);
    ``"dot_edge"`` otherwise."""
    if not (tails and tails_pay(heads, channels, edge_dim)):
        return "dot_edge"
    if device.type == "cuda" and padded_edge_dim(channels, edge_dim, dtype) is None:
        return "dot_edge"
    return "dot_edge_tail"


# ----------------------------------------------------------------------------- layers
@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_transformer_conv(fuzz, family):
    @fuzz("gt", family)
    @given(graph=graphs(family), heads=st.integers(1, 4), channels=out_channels(fuzz.device),
           f_src=st.integers(1, 10), f_dst=st.integers(1, 10), concat=st.booleans(),
           beta=st.booleans(), root_weight=st.booleans(), bias=st.booleans(),
           dropout=st.sampled_from([0.0, 0.3]), alpha=st.sampled_from([None, False, True]),
           **common())
    def case(**case):
        graph = case["graph"]
        bip = graph.num_src != graph.num_dst
        ctor = dict(in_channels=(case["f_src"], case["f_dst"]) if bip else case["f_src"],
                    out_channels=case["channels"], heads=case["heads"], concat=case["concat"],
                    beta=case["beta"], root_weight=case["root_weight"], bias=case["bias"],
                    dropout=case["dropout"])
        kwargs = {} if case["alpha"] is None else {"return_attention_weights": case["alpha"]}
        _run_case("gt", f"test_fuzz_transformer_conv[{family}]", fuzz, case, native_cls=TransformerConv, fused_cls=FusedTransformerConv,
                  ctor=ctor, score="dot",
                  in_dims=(case["f_src"], case["f_dst"] if bip else None),
                  call_kwargs=kwargs, want_alpha=case["alpha"] is not None)

    case()


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_transformer_conv_edge_features(fuzz, family):
    """TransformerConv with ``edge_dim``: the ``dot_edge`` score, or
    ``dot_edge_tail`` where the features are narrow and ``edge_tails`` is on."""
    @fuzz("gt_edge", family)
    @given(graph=graphs(family), heads=st.integers(1, 4), channels=out_channels(fuzz.device),
           f_src=st.integers(1, 10), f_dst=st.integers(1, 10), edge_dim=st.integers(1, 16),
           tails=st.booleans(), concat=st.booleans(), beta=st.booleans(),
           root_weight=st.booleans(),
           dropout=st.sampled_from([0.0, 0.3]), alpha=st.sampled_from([None, True]),
           **common())
    def case(**case):
        graph = case["graph"]
        bip = graph.num_src != graph.num_dst
        ctor = dict(in_channels=(case["f_src"], case["f_dst"]) if bip else case["f_src"],
                    out_channels=case["channels"], heads=case["heads"], concat=case["concat"],
                    beta=case["beta"], root_weight=case["root_weight"],
                    dropout=case["dropout"], edge_dim=case["edge_dim"])
        kwargs = {} if case["alpha"] is None else {"return_attention_weights": True}
        fused_cls = functools.partial(FusedTransformerConv, edge_tails=case["tails"])
        _run_case("gt_edge", f"test_fuzz_transformer_conv_edge_features[{family}]", fuzz, case,
                  native_cls=TransformerConv, fused_cls=fused_cls, ctor=ctor,
                  in_dims=(case["f_src"], case["f_dst"] if bip else None),
                  call_kwargs=kwargs, want_alpha=case["alpha"] is not None,
                  edge_dim=case["edge_dim"],
                  score=gt_edge_score(fuzz.device, case["dtype"], case["heads"],
                                      case["channels"], case["edge_dim"], case["tails"]))

    case()


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_gat_conv(fuzz, family):
    @fuzz("gat", family)
    @given(graph=graphs(family), heads=st.integers(1, 4), channels=out_channels(fuzz.device),
           f_src=st.integers(1, 10), f_dst=st.integers(1, 10), concat=st.booleans(),
           negative_slope=st.sampled_from([0.2, 0.0, 0.01, 0.5, 1.0]),
           add_self_loops=st.booleans(), bias=st.booleans(), residual=st.booleans(),
           dropout=st.sampled_from([0.0, 0.4]), alpha=st.booleans(),
           row_walk=st.sampled_from([None, True, False]), **common())
    def case(**case):
        graph = case["graph"]
        bip = graph.num_src != graph.num_dst
        ctor = dict(in_channels=(case["f_src"], case["f_dst"]) if bip else case["f_src"],
                    out_channels=case["channels"], heads=case["heads"], concat=case["concat"],
                    negative_slope=case["negative_slope"], add_self_loops=case["add_self_loops"],
                    bias=case["bias"], residual=case["residual"], dropout=case["dropout"])
        # The SMMF forward's two walks (the plan's row_walk; None: its rule).
        walk = None if case["strategy"] == "pmf" else case["row_walk"]
        with plan.override(row_walk=walk):
            _run_case("gat", f"test_fuzz_gat_conv[{family}]", fuzz, case, native_cls=GATConv,
                      fused_cls=FusedGATConv, ctor=ctor, score="additive",
                      in_dims=(case["f_src"], case["f_dst"] if bip else None),
                      call_kwargs={"return_attention_weights": True} if case["alpha"] else {},
                      want_alpha=case["alpha"])

    case()


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_gatv2_conv(fuzz, family):
    @fuzz("gatv2", family)
    @given(graph=graphs(family), heads=st.integers(1, 4), channels=out_channels(fuzz.device),
           f_src=st.integers(1, 10), f_dst=st.integers(1, 10), concat=st.booleans(),
           negative_slope=st.sampled_from([0.2, 0.0, 0.01, 0.5, 1.0]),
           add_self_loops=st.booleans(), bias=st.booleans(), residual=st.booleans(),
           share_weights=st.booleans(), dropout=st.sampled_from([0.0, 0.4]),
           alpha=st.booleans(), **common())
    def case(**case):
        graph = case["graph"]
        bip = graph.num_src != graph.num_dst
        ctor = dict(in_channels=(case["f_src"], case["f_dst"]) if bip else case["f_src"],
                    out_channels=case["channels"], heads=case["heads"], concat=case["concat"],
                    negative_slope=case["negative_slope"], add_self_loops=case["add_self_loops"],
                    bias=case["bias"], residual=case["residual"], dropout=case["dropout"],
                    share_weights=case["share_weights"] and not bip)
        _run_case("gatv2", f"test_fuzz_gatv2_conv[{family}]", fuzz, case, native_cls=GATv2Conv,
                  fused_cls=FusedGATv2Conv, ctor=ctor, score="gatv2",
                  in_dims=(case["f_src"], case["f_dst"] if bip else None),
                  call_kwargs={"return_attention_weights": True} if case["alpha"] else {},
                  want_alpha=case["alpha"])

    case()


@pytest.mark.parametrize("family", SQUARE_FAMILIES)
def test_fuzz_agnn_conv(fuzz, family):
    @fuzz("agnn", family)
    # AGNN with one channel: cos(x_i, x_j) is +-1, and the gradient through the
    # normalisation is rounding noise amplified by 1 / |x_i| (in PyG too).
    @given(graph=graphs(family), channels=out_channels(fuzz.device, smallest=2),
           requires_grad=st.booleans(), add_self_loops=st.booleans(),
           beta=st.sampled_from([1.0, 0.5, -1.5, 3.0]), **common(agnn_dtypes(fuzz.device)))
    def case(**case):
        ctor = dict(requires_grad=case["requires_grad"], add_self_loops=case["add_self_loops"])
        _run_case("agnn", f"test_fuzz_agnn_conv[{family}]", fuzz, case, native_cls=AGNNConv, fused_cls=FusedAGNNConv, ctor=ctor,
                  score="cosine",
                  in_dims=(case["channels"], None), call_kwargs={}, want_alpha=False,
                  beta=case["beta"])

    case()


def _gat_edge_case(fuzz, family: str, layer: str, test: str, native_cls, fused_cls,
                   score: str, **extra) -> None:
    r"""The fuzz test of a ``GATConv``-like layer with ``edge_dim`` (``layer``: a
    key of the profiles' examples; ``score``: its fused op's), the self-loops'
    features from each ``fill_value`` (:data:`FILL_VALUES`); ``extra``:
    strategies of further constructor arguments
    (``share_weights``: left off on bipartite graphs, whose two feature widths
    one shared projection cannot take)."""
    @fuzz(layer, family)
    @given(graph=graphs(family), heads=st.integers(1, 4), channels=out_channels(fuzz.device),
           f_src=st.integers(1, 10), f_dst=st.integers(1, 10), edge_dim=st.integers(1, 16),
           concat=st.booleans(), negative_slope=st.sampled_from([0.2, 0.0, 0.5, 1.0]),
           add_self_loops=st.booleans(),
           fill_value=st.sampled_from(FILL_VALUES),
           residual=st.booleans(), dropout=st.sampled_from([0.0, 0.4]), alpha=st.booleans(),
           **extra, **common())
    def case(**case):
        graph = case["graph"]
        bip = graph.num_src != graph.num_dst
        fill = case["fill_value"]
        if fill == "tensor":
            fill = torch.linspace(-1.0, 1.0, case["edge_dim"])
        elif (isinstance(fill, str) and case["add_self_loops"]
              and bool((graph.edge_index[1] >= min(graph.num_src, graph.num_dst)).any())):
            # PyG's add_self_loops reduces the features over destinations below
            # min(N_src, N_dst) only, and raises for an edge into another (so does
            # the fused layer: tests/test_gat_edge.py); a constant fills these.
            fill = 0.5
        ctor = dict(in_channels=(case["f_src"], case["f_dst"]) if bip else case["f_src"],
                    out_channels=case["channels"], heads=case["heads"], concat=case["concat"],
                    negative_slope=case["negative_slope"], add_self_loops=case["add_self_loops"],
                    fill_value=fill, residual=case["residual"], dropout=case["dropout"],
                    edge_dim=case["edge_dim"])
        ctor.update({k: case[k] and not (k == "share_weights" and bip) for k in extra})
        _run_case(layer, f"{test}[{family}]", fuzz, case, native_cls=native_cls,
                  fused_cls=fused_cls, ctor=ctor, score=score,
                  fill=fill_kind(fill) if case["add_self_loops"] else None,
                  in_dims=(case["f_src"], case["f_dst"] if bip else None),
                  call_kwargs={"return_attention_weights": True} if case["alpha"] else {},
                  want_alpha=case["alpha"], edge_dim=case["edge_dim"])

    case()


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_gat_conv_edge_features(fuzz, family):
    """GATConv with ``edge_dim``: the ``additive_edge`` score."""
    _gat_edge_case(fuzz, family, "gat_edge", "test_fuzz_gat_conv_edge_features", GATConv,
                   FusedGATConv, "additive_edge")


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_gatv2_conv_edge_features(fuzz, family):
    """GATv2Conv with ``edge_dim``: the ``gatv2_edge`` score (SMMF whatever the
    strategy drawn), with and without ``share_weights``."""
    _gat_edge_case(fuzz, family, "gatv2_edge", "test_fuzz_gatv2_conv_edge_features",
                   GATv2Conv, FusedGATv2Conv, "gatv2_edge", share_weights=st.booleans())


def test_fuzz_coverage(fuzz):
    """Each family test above drew the case it exists for (no edge, one node,
    N_src != N_dst, a row longer than a work item, ...); a layer whose families all
    ran drew every dtype and strategy, ran every score of :data:`SCORES` (both
    ``dot_edge`` and ``dot_edge_tail`` for TransformerConv with ``edge_dim``) and
    had input graphs with and without self-loops; a GAT layer with edge features
    (:data:`FILL_LAYERS`) also added self-loops with every kind of fill value
    (:data:`FILL_VALUES`), to inputs with and without self-loops of their own."""
    ran = sorted({key[:2] for key in DRAWN})
    if not ran:
        pytest.skip("run with the layer fuzz tests (it checks what they drew)")
    layers = sorted({layer for layer, _ in ran})
    total = {layer: sum(DRAWN[layer, f, "cases"] for f in FAMILIES) for layer in layers}
    print(f"fuzz profile {fuzz.name!r} on {fuzz.device}: "
          + ", ".join(f"{layer} {n} cases" for layer, n in total.items()))
    missing = [f"{layer}/{family}: {FAMILY_PROPERTY[family]}" for layer, family in ran
               if DRAWN[layer, family, FAMILY_PROPERTY[family]] == 0]
    for layer in layers:
        families = SQUARE_FAMILIES if layer == "agnn" else FAMILIES
        dtypes = agnn_dtypes(fuzz.device) if layer == "agnn" else DTYPES
        if all((layer, f) in ran for f in families):
            keys = ([str(d) for d in dtypes] + list(STRATEGIES)
                    + [f"score={s}" for s in SCORES[layer]]
                    + ["input loops: present", "input loops: absent"])
            if layer in FILL_LAYERS:
                keys += sorted({f"fill={fill_kind(v)}" for v in FILL_VALUES})
                keys += ["fill, input loops: present", "fill, input loops: absent"]
            for key in keys:
                if not sum(DRAWN[layer, f, key] for f in families):
                    missing.append(f"{layer}: {key}")
    assert not missing, f"never drawn: {missing}"


def test_deterministic_context_restores_the_mode():
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    with _deterministic():
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled()) == was


def test_logit_magnitudes_floor_the_gradients_that_cancel():
    """The GPU draw the floor is for (GATConv with edge features on one source
    node's five duplicate edges): every dP equals D, so ``edge_attr``'s and
    ``att_src``'s gradients are zero in exact arithmetic, a float64 rounding of
    terms of order one. Under :func:`_logit_magnitudes` the forward is PyG's, those
    gradients take their terms' magnitude, and one no logit reaches (the residual
    map's) keeps its value."""
    gen = torch.Generator().manual_seed(0)
    layer = GATConv(4, 16, heads=3, edge_dim=1, add_self_loops=False, residual=True).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype), alpha=0.3)
    x = torch.randn(1, 4, generator=gen, dtype=torch.float64)
    ea = torch.randn(5, 1, generator=gen, dtype=torch.float64)
    ei = torch.zeros(2, 5, dtype=torch.long)

    def run():
        return _forward_backward(layer, [x.clone().requires_grad_()], ei, {}, False, 0,
                                 torch.float32, ea.clone().requires_grad_())

    want = run()
    with _logit_magnitudes():
        mags = run()
    assert torch.equal(want["output"], mags["output"])
    rms = {k: (float(want[k].square().mean().sqrt()), float(mags[k].square().mean().sqrt()))
           for k in ("grad edge_attr", "grad att_src", "grad res.weight")}
    for k in ("grad edge_attr", "grad att_src"):
        assert rms[k][1] > 0.1 and rms[k][0] < 1e-12 * rms[k][1], (k, rms[k])
    assert torch.equal(want["grad res.weight"], mags["grad res.weight"])
    assert rms["grad res.weight"][0] > 0.1
    assert gat_conv.softmax is pyg_softmax  # restored after the block


def test_output_floor_judges_a_cancelled_output_by_its_terms():
    """The GPU case that the output's floor is for (GATConv, one output of heads
    near 1.97 and -1.83 plus a bias, -4.9e-4 in all): an error of 1.03e-7,
    half an ulp of its terms, passes; 1.1e-6, over eight ulps, does not; the
    attention weights keep the tighter floor."""
    want = {"output": torch.tensor([[-4.882898666106472e-4]], dtype=torch.float64),
            "attention weights": torch.tensor([[1e-3, 2e-3]], dtype=torch.float64)}
    floors = _floors(want)
    tol = TOL[torch.float32][0]
    assert _error(want["output"] + 1.03e-7, want["output"], floors["output"]) < tol
    assert _error(want["output"] + 1.1e-6, want["output"], floors["output"]) >= tol
    alpha = want["attention weights"]
    assert _error(alpha + 2e-7, alpha, floors["attention weights"]) >= tol


def _replay_gat_edge_bf16(graph: Graph, heads: int) -> None:
    """Replays a GPU fuzz case of GATConv with edge features in bfloat16 (one
    destination row, ``heads`` heads of one channel, ``concat=False``, one
    feature per edge) on the CPU reference path, which rounds as the kernels do."""
    ctor = dict(in_channels=(10, 9), out_channels=1, heads=heads, concat=False,
                negative_slope=0.5, add_self_loops=False, fill_value="mean", residual=False,
                dropout=0.0, edge_dim=1)
    assert compare(GATConv, FusedGATConv, ctor, graph, (10, 9), torch.device("cpu"),
                   torch.bfloat16, "auto", 477365477, False, {}, False, "additive_edge",
                   edge_dim=1) == "additive_edge"


def test_head_rms_is_the_scale_of_the_heads_not_of_their_mean():
    """The output's floor for ``concat=False``: the RMS of the heads' outputs
    before the mean, whatever the bias adds; and the GPU fuzz case it is for
    (GATConv with edge features in bfloat16, one output of heads near 1.94 and
    -1.73 plus a bias, 0.039 in all, missed by 3.6e-3 on the CPU reference path
    as by the kernels) passes."""
    torch.manual_seed(0)
    graph = build_graph("bipartite", 20598965, 2, 1, 3)
    layer = GATConv((10, 9), 3, heads=2, concat=False, edge_dim=4).double()
    with torch.no_grad():
        layer.bias.fill_(100.0)
    xs = [torch.randn(2, 10, dtype=torch.float64), torch.randn(1, 9, dtype=torch.float64)]
    ea = torch.randn(graph.edge_index.size(1), 4, dtype=torch.float64)
    concat = GATConv((10, 9), 3, heads=2, concat=True, edge_dim=4, bias=False).double()
    concat.load_state_dict({k: v for k, v in layer.state_dict().items() if k != "bias"})
    heads = concat(tuple(xs), graph.edge_index, ea)
    assert _head_rms(layer, xs, graph.edge_index, ea) == pytest.approx(
        float(heads.square().mean().sqrt()), rel=1e-12)
    assert float(layer(tuple(xs), graph.edge_index, ea).abs().min()) > 50.0
    _replay_gat_edge_bf16(graph, heads=2)


def test_linear_scales_bound_the_gradients_and_pass_the_cancelled_cases():
    """A linear map's gradients are held to the magnitudes of their terms: each
    scale is at least the gradient's own RMS (each element a sum of those terms),
    and for one linear map the loss weights' magnitudes against the inputs'; the
    GPU fuzz case it is for
    (GATConv with edge features in bfloat16, one destination row of 12 edges,
    four heads of one channel: ``lin_edge``'s weight gradient off by 1.07e-2 of
    itself on the CPU reference path as by the kernels) passes, and so does a
    CPU one (TransformerConv in bfloat16 on 36 nodes of one feature with
    duplicate edges: ``lin_value``'s off by 1.2e-2)."""
    torch.manual_seed(0)
    graph = build_graph("bipartite", 1021919964, 4, 1, 3)
    layer = GATConv((10, 9), 2, heads=3, edge_dim=5, add_self_loops=False).double()
    xs = [torch.randn(4, 10, dtype=torch.float64, requires_grad=True),
          torch.randn(1, 9, dtype=torch.float64, requires_grad=True)]
    ea = torch.randn(graph.edge_index.size(1), 5, dtype=torch.float64, requires_grad=True)
    with _linear_scales(layer) as scales:
        got = _forward_backward(layer, xs, graph.edge_index, {}, False, 3, torch.float64, ea)
    assert {"grad lin_src.weight", "grad lin_dst.weight", "grad lin_edge.weight"} <= set(scales)
    for k, scale in scales.items():
        if got.get(k) is not None:
            assert float(got[k].square().mean().sqrt()) <= scale * (1 + 1e-12) and scale > 0.0
    _replay_gat_edge_bf16(graph, heads=4)

    class OneLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x, edge_index):
            return self.lin(x)

    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 2, generator=torch.Generator().manual_seed(3)).double()
    one = OneLinear().double()
    with _linear_scales(one) as scales:
        _forward_backward(one, [x], graph.edge_index, {}, False, 3, torch.float64)
    assert scales["grad lin.weight"] == pytest.approx(
        float((w.abs().t() @ x.abs()).square().mean().sqrt()), rel=1e-12)
    assert scales["grad lin.bias"] == pytest.approx(
        float(w.abs().sum(0).square().mean().sqrt()), rel=1e-12)
    dup = build_graph("duplicates", 0, 36, 1, 5)
    ctor = dict(in_channels=1, out_channels=1, heads=1, concat=False, beta=True,
                root_weight=True, dropout=0.0, edge_dim=1)
    assert compare(TransformerConv, functools.partial(FusedTransformerConv, edge_tails=False),
                   ctor, dup, (1, None), torch.device("cpu"), torch.bfloat16, "auto", 0, False,
                   {}, False, "dot_edge", edge_dim=1) == "dot_edge"
