"""FusedTransformerConv's joined projections (``fused_projection``) on CPU.

The joined path (query / key / value / skip as one autograd node: a GEMM per
projection forward, one input and one weight GEMM over the concatenated weights
backward) must give the outputs and gradients of the separate path, keep PyG's
parameters and ``state_dict``, and actually be taken: the tests count the GEMMs
of a forward and of its backward.
"""
from __future__ import annotations

import copy
from typing import Tuple

import pytest
import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.nn import TransformerConv

from conftest import random_graph, rel_err, rel_err_floor
from pyg_dfgnn import HAS_EXTENSION
from pyg_dfgnn.nn import FusedTransformerConv
from pyg_dfgnn.nn._projections import Projections

# aten.linear: in inference mode it reaches the dispatcher undecomposed.
# mm.out / addmm.out / addmm_: the query GEMM over a row prefix writes in place.
_GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
          torch.ops.aten.linear.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.out,
          torch.ops.aten.addmm_.default}
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


class GemmCount(TorchDispatchMode):
    """Counts the matrix products run inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in _GEMMS
        return func(*args, **(kwargs or {}))


def gemms(conv, x, edge_index, x_grad: bool = True) -> Tuple[int, int]:
    """``(forward, backward)``: the GEMMs of one forward and of its backward, the
    features requiring a gradient when ``x_grad``."""
    xs = tuple(t.detach().clone().requires_grad_(x_grad)
               for t in (x if isinstance(x, tuple) else (x,)))
    if isinstance(x, tuple) and x[0] is x[1]:
        xs = (xs[0], xs[0])
    with GemmCount() as fwd:
        out = conv(xs if isinstance(x, tuple) else xs[0], edge_index)
    with GemmCount() as bwd:
        out.backward(torch.randn_like(out))
    return fwd.n, bwd.n


def cut_of(x, edge_index) -> bool:
    """Whether the graph's last destinations have no in-edge, so that the joined
    path runs the query over a row prefix (``GraphLayout.dst_extent``)."""
    nd = (x[1] if isinstance(x, tuple) else x).size(0)
    return int(edge_index[1].max()) + 1 < nd


def expected_gemms(conv, bipartite: bool, joined: bool, x_grad: bool = True,
                   cut: bool = False) -> Tuple[int, int]:
    """``(forward, backward)`` projection GEMMs (``lin_beta``'s included) of a step.

    Forward: one per projection either way. Backward: an input GEMM (when ``x``
    needs a gradient) and a weight GEMM per projection, or per joined group (one
    group, or two for bipartite features: key and value, query and skip; a query
    over a row prefix, ``cut``, is a group of its own); ``lin_beta``'s input
    always needs a gradient.
    """
    beta = conv.lin_beta is not None
    per_gemm = 2 if x_grad else 1
    groups = 3 + conv.root_weight if not joined else (2 if bipartite else 1)
    if joined and cut and not (bipartite and not conv.root_weight):
        groups += 1
    return 3 + conv.root_weight + beta, groups * per_gemm + 2 * beta


def inputs(bipartite: bool, dtype, cut: bool = False):
    """Features, graph and in_channels. The last destination has an in-edge, or
    with ``cut`` the last three have none (the query then covers a row prefix:
    ``GraphLayout.dst_extent``)."""
    ns, nd = (12, 7) if bipartite else (15, 15)
    ei = random_graph(ns, nd, num_edges=40 if bipartite else 60, num_isolated=2)
    if cut:
        ei = ei[:, ei[1] < nd - 3]
    else:
        ei = torch.cat([ei, torch.tensor([[0], [nd - 1]])], 1)
    assert cut_of((None, torch.empty(nd)), ei) == cut
    if bipartite:
        return (torch.randn(ns, 6, dtype=dtype), torch.randn(nd, 8, dtype=dtype)), ei, (6, 8)
    return torch.randn(15, 8, dtype=dtype), ei, 8


def run(conv, x, edge_index):
    """Output, input gradients and parameter gradients of a fixed random functional."""
    xs = tuple(t.detach().clone().requires_grad_(True)
               for t in (x if isinstance(x, tuple) else (x,)))
    conv.zero_grad(set_to_none=True)
    out = conv(xs if isinstance(x, tuple) else xs[0], edge_index)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * w).sum().backward()
    return out, [t.grad for t in xs], {n: p.grad for n, p in conv.named_parameters()}


def joined_and_separate(dtype, in_channels, **kwargs):
    joined = FusedTransformerConv(in_channels, 4, **kwargs).to(dtype)
    separate = copy.deepcopy(joined)
    separate.fused_projection = False
    assert joined.fused_projection
    return joined, separate


CONFIGS = [
    dict(),
    dict(heads=3),
    dict(heads=2, root_weight=False),
    dict(heads=2, beta=True),
    dict(heads=3, concat=False),
    dict(heads=2, concat=False, beta=True),
    dict(heads=2, bias=False),
    dict(heads=2, bias=False, beta=True, root_weight=False),
]


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("kwargs", CONFIGS)
def test_joined_equals_separate(kwargs, bipartite, dtype, cut):
    x, ei, in_channels = inputs(bipartite, dtype, cut)
    joined, separate = joined_and_separate(dtype, in_channels, **kwargs)
    assert gemms(joined, x, ei) == expected_gemms(joined, bipartite, True, cut=cut)
    assert gemms(separate, x, ei) == expected_gemms(separate, bipartite, False)

    oj, gj, pj = run(joined, x, ei)
    os_, gs, ps = run(separate, x, ei)
    tol = TOL[dtype]
    assert oj.dtype == dtype and rel_err(oj, os_) < tol
    for a, b in zip(gj, gs):
        assert rel_err(a, b) < tol
    # the key bias's gradient is zero in exact arithmetic (softmax is shift
    # invariant per row): gradients are compared against 1% of the largest one
    scale = max(float(g.double().norm()) for g in ps.values() if g is not None)
    assert pj.keys() == ps.keys()
    for name, b in ps.items():
        a = pj[name]
        # lin_skip without root_weight is PyG's unused parameter
        unused = name.startswith("lin_skip") and not joined.root_weight
        assert (a is None) == (b is None) == unused, name
        if unused:
            continue
        err = float((a.double() - b.double()).norm()) / max(float(b.double().norm()),
                                                             1e-2 * scale)
        assert err < tol, f"{name}: {err:.3g}"


def test_same_tensor_pair_is_joined():
    x, ei, _ = inputs(False, torch.float32)
    conv = FusedTransformerConv(8, 4, heads=2)
    assert gemms(conv, (x, x), ei) == (4, 2)
    assert gemms(conv, (x, x.clone()), ei) == (4, 4)   # equal values, two tensors
    conv.fused_projection = False
    assert gemms(conv, x, ei) == (4, 8)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_runs_separate_projections(mode):
    # Without a backward the joined GEMM saves nothing and its views cost copies.
    x, ei, _ = inputs(False, torch.float32)
    conv = FusedTransformerConv(8, 4, heads=2)
    want = conv(x, ei)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx, GemmCount() as count:
        got = conv(x, ei)
    assert count.n == 4
    assert rel_err(got, want) < TOL[torch.float32]


def test_constructor_switch():
    x, ei, _ = inputs(False, torch.float32)
    conv = FusedTransformerConv(8, 4, heads=2, fused_projection=False)
    assert conv.fused_projection is False
    assert gemms(conv, x, ei) == (4, 8)


def test_hooked_or_replaced_linear_runs_separately():
    x, ei, _ = inputs(False, torch.float32)
    conv = FusedTransformerConv(8, 4, heads=2)
    calls = []
    handle = conv.lin_value.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    assert gemms(conv, x, ei) == (4, 8)
    assert calls == [torch.Size([15, 8])]
    handle.remove()
    assert gemms(conv, x, ei) == (4, 2)

    class Scaled(torch.nn.Linear):
        def forward(self, x: Tensor) -> Tensor:
            return 2 * super().forward(x)

    ref = conv(x, ei)
    scaled = Scaled(8, 8)
    scaled.load_state_dict(conv.lin_key.state_dict())
    conv.lin_key = scaled
    assert gemms(conv, x, ei) == (4, 8)
    assert not torch.allclose(conv(x, ei), ref)


# ----------------------------------------------------------------------- parameters
STATE_CONFIGS = [((8, 4), dict(heads=3)), ((8, 4), dict(heads=2, beta=True, bias=False)),
                 (((6, 8), 4), dict(heads=2, concat=False)),
                 ((8, 4), dict(root_weight=False))]


@pytest.mark.parametrize("args,kwargs", STATE_CONFIGS)
def test_state_dict_is_pygs(args, kwargs):
    torch.manual_seed(5)
    native = TransformerConv(*args, **kwargs)
    torch.manual_seed(5)
    fused = FusedTransformerConv(*args, **kwargs)
    sn, sf = native.state_dict(), fused.state_dict()
    assert list(sf) == list(sn)
    assert all(sf[k].shape == sn[k].shape and torch.equal(sf[k], sn[k]) for k in sn)
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in native.named_parameters()]
    assert [n for n, _ in fused.named_buffers()] == [n for n, _ in native.named_buffers()]


@pytest.mark.parametrize("args,kwargs", STATE_CONFIGS)
def test_load_state_dict_both_ways(args, kwargs):
    bipartite = isinstance(args[0], tuple)
    x, ei, _ = inputs(bipartite, torch.float32)
    native = TransformerConv(*args, **kwargs)
    fused = FusedTransformerConv(*args, **kwargs)
    fused.load_state_dict(native.state_dict())
    assert gemms(fused, x, ei) == expected_gemms(fused, bipartite, True, cut=cut_of(x, ei))
    ref = native(x, ei)
    assert rel_err(fused(x, ei), ref) < 1e-5

    with torch.no_grad():
        for p in fused.parameters():
            p.add_(torch.randn_like(p))
    back = TransformerConv(*args, **kwargs)
    back.load_state_dict(fused.state_dict())
    assert rel_err(back(x, ei), fused(x, ei)) < 1e-5


# ------------------------------------------------------------------------- lazy init
@pytest.mark.parametrize("bipartite", [False, True])
def test_lazy_init(bipartite):
    x, ei, _ = inputs(bipartite, torch.float32)
    in_channels = (-1, -1) if bipartite else -1
    torch.manual_seed(11)
    native = TransformerConv(in_channels, 4, heads=2, beta=True)
    torch.manual_seed(11)
    fused = FusedTransformerConv(in_channels, 4, heads=2, beta=True)
    torch.manual_seed(12)
    on = native(x, ei)
    torch.manual_seed(12)
    # the first call materialises the weights through the separate projections
    with GemmCount() as count:
        of = fused(x, ei)
    assert count.n == expected_gemms(fused, bipartite, False)[0]
    assert rel_err(of, on) < 1e-5          # same initial weights, drawn in PyG's order
    assert fused.state_dict().keys() == native.state_dict().keys()
    assert gemms(fused, x, ei) == expected_gemms(fused, bipartite, True, cut=cut_of(x, ei))
    assert rel_err(fused(x, ei), native(x, ei)) < 1e-5

    # a lazy layer loads a materialised state and then joins
    fresh = FusedTransformerConv(in_channels, 4, heads=2, beta=True)
    fresh.load_state_dict(native.state_dict())
    assert gemms(fresh, x, ei) == expected_gemms(fresh, bipartite, True, cut=cut_of(x, ei))
    assert rel_err(fresh(x, ei), on) < 1e-5


def test_fused_in_place_joins():
    """A native layer switched by ``fuse()`` (no ``__init__`` run) takes the class
    default."""
    from pyg_dfgnn.nn import fuse
    x, ei, _ = inputs(False, torch.float32)
    native = TransformerConv(8, 4, heads=2)
    ref = native(x, ei)
    assert fuse(native).num_fused == 1
    assert "fused_projection" not in vars(native)
    assert gemms(native, x, ei) == (4, 2)
    assert rel_err(native(x, ei), ref) < 1e-5


def test_compiles_without_graph_break():
    """The joined projection traces whole (``fullgraph=True``) and matches eager."""
    torch._dynamo.reset()
    x, ei, _ = inputs(False, torch.float32)
    conv = FusedTransformerConv(8, 4, heads=2, beta=True)
    with torch.no_grad():
        want = conv(x, ei)  # eager: builds and caches the layout
        got = torch.compile(conv, fullgraph=True, backend="eager")(x, ei)
    assert rel_err(got, want) < 1e-6


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_joined_backward_compiles_without_graph_break(backend):
    """While autograd records, the joined projections (an autograd.Function)
    trace whole, forward and backward, and match eager."""
    torch._dynamo.reset()
    x, ei, _ = inputs(False, torch.float32)
    conv = FusedTransformerConv(8, 4, heads=2, beta=True)
    want, gx_want, gp_want = run(conv, x, ei)
    compiled = torch.compile(conv, fullgraph=True, backend=backend)
    got, gx, gp = run(compiled, x, ei)
    gp = {n.removeprefix("_orig_mod."): g for n, g in gp.items()}
    assert rel_err(got, want) < 1e-6
    assert rel_err(gx[0], gx_want[0]) < 1e-5
    assert gp.keys() == gp_want.keys()
    for name, g in gp_want.items():
        assert rel_err_floor(gp[name], g) < 1e-5, name


# ------------------------------------------------------------- backward variants
@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("bipartite", [False, True])
def test_features_without_gradient(bipartite, cut):
    """Features that need no gradient (a first layer): no input GEMM, parameter
    gradients as on the separate path."""
    x, ei, in_channels = inputs(bipartite, torch.float64, cut)
    joined, separate = joined_and_separate(torch.float64, in_channels, heads=2, beta=True)
    want = expected_gemms(joined, bipartite, True, False, cut=cut)
    assert gemms(joined, x, ei, x_grad=False) == want
    assert gemms(separate, x, ei, x_grad=False) == expected_gemms(separate, bipartite, False,
                                                                  False)
    assert want[1] == (2 if bipartite else 1) + cut + 2
    g = None
    grads = []
    for conv in (joined, separate):
        conv.zero_grad(set_to_none=True)
        out = conv(x, ei)
        g = torch.randn_like(out) if g is None else g
        out.backward(g)
        grads.append({n: p.grad for n, p in conv.named_parameters()})
    assert all(t.grad is None for t in (x if bipartite else (x,)))
    for name, b in grads[1].items():
        assert rel_err_floor(grads[0][name], b) < 1e-12, name


@pytest.mark.parametrize("bipartite", [False, True])
def test_bf16_autocast_matches_separate(bipartite):
    """Under CPU bf16 autocast the joined path runs its GEMMs in bf16 as the
    separate one does, and returns float32 gradients (parameters and ``x`` stay
    float32)."""
    x, ei, in_channels = inputs(bipartite, torch.float32)
    joined, separate = joined_and_separate(torch.float32, in_channels, heads=2, beta=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gemms(joined, x, ei) == expected_gemms(joined, bipartite, True, cut=cut_of(x, ei))
        oj, gj, pj = run(joined, x, ei)
        os_, gs, ps = run(separate, x, ei)
    assert oj.dtype == os_.dtype == torch.bfloat16
    ref = run(separate, x, ei)[0]  # float32: autocast reaches both paths
    assert rel_err(os_, ref) > 1e-4
    assert rel_err(oj, os_) < 1e-2
    for a, b in zip(gj, gs):
        assert a.dtype == torch.float32 and rel_err(a, b) < 1e-2
    for name, b in ps.items():
        assert pj[name].dtype == b.dtype == torch.float32, name
        assert rel_err_floor(pj[name], b) < 1e-2, name


def test_projections_function_directly():
    """``Projections`` against separate ``F.linear`` calls: an unused output (no
    gradient) leaves the join, a frozen weight and a missing bias get no gradient,
    leading batch dimensions are kept."""
    gen = torch.Generator().manual_seed(3)

    def leaf(*shape, grad=True):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_(grad)

    x = leaf(2, 5, 6)
    ws = [leaf(3, 6), leaf(4, 6, grad=False), leaf(2, 6), leaf(5, 6)]
    bs = [leaf(3), None, leaf(2), leaf(5)]
    used = (0, 1, 3)  # output 2 unused: its weight and bias get no gradient
    gs = [torch.randn(2, 5, w.shape[0], generator=gen, dtype=torch.float64) for w in ws]

    def grads(outs):
        torch.autograd.backward([outs[i] for i in used], [gs[i] for i in used])
        res = [t.grad for t in [x, *ws, *bs] if t is not None]
        for t in [x, *ws, *bs]:
            if t is not None:
                t.grad = None
        return res

    with GemmCount() as count:
        outs = Projections.apply(x, None, *ws, *bs)
    assert count.n == 4 and all(o.is_contiguous() for o in outs)
    ref = [torch.nn.functional.linear(x, w, b) for w, b in zip(ws, bs)]
    assert all(rel_err(o, r) < 1e-12 for o, r in zip(outs, ref))
    with GemmCount() as count:
        got = grads(outs)
    assert count.n == 2   # one input GEMM, one weight GEMM
    want = grads(ref)
    assert [g is None for g in got] == [g is None for g in want]
    # x, w0..w3, b0, b2, b3: the frozen w1, the unused w2 and b2 get none
    assert [g is None for g in got] == [False, False, True, True, False, False, True, False]
    for a, b in zip(got, want):
        if b is not None:
            assert rel_err(a, b) < 1e-12

    # only the weights need gradients: one weight GEMM
    x.requires_grad_(False)
    outs = Projections.apply(x, None, *ws, *bs)
    with GemmCount() as count:
        outs[0].backward(gs[0])
    assert count.n == 1 and ws[0].grad is not None and x.grad is None


@pytest.mark.parametrize("rows", [0, 4, 9])
@pytest.mark.parametrize("x_grad", [True, False])
def test_projections_query_rows(rows, x_grad):
    """``Projections`` with ``rows``: the first output is ``F.linear`` over the
    first ``rows`` rows and zero below, its GEMMs cover those rows only (two
    backward GEMMs of its own beside the joined pair), and every gradient equals
    the one of that function written with ``F.linear``."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(9 + 2, 6, generator=gen, dtype=torch.float64).requires_grad_(x_grad)
    ws = [torch.randn(m, 6, generator=gen, dtype=torch.float64).requires_grad_()
          for m in (4, 3, 5)]
    bs = [torch.randn(m, generator=gen, dtype=torch.float64).requires_grad_() for m in (4, 3, 5)]
    gs = [torch.randn(11, w.shape[0], generator=gen, dtype=torch.float64) for w in ws]
    params = [*ws, *bs] + ([x] if x_grad else [])

    def reference():
        head = torch.nn.functional.linear(x[:rows], ws[0], bs[0])
        q = torch.cat([head, head.new_zeros(11 - rows, 4)])
        return [q] + [torch.nn.functional.linear(x, w, b) for w, b in zip(ws[1:], bs[1:])]

    with GemmCount() as count:
        outs = Projections.apply(x, rows, *ws, *bs)
    assert count.n == 3 - (rows == 0)
    ref = reference()
    assert all(o.is_contiguous() and rel_err(o, r) < 1e-12 for o, r in zip(outs, ref))
    assert outs[0][rows:].eq(0).all()
    with GemmCount() as count:
        got = torch.autograd.grad(outs, params, gs)
    # joined key / value: input + weight GEMM; query: the same over its rows
    assert count.n == (2 if x_grad else 1) * (2 - (rows == 0))
    want = torch.autograd.grad(ref, params, gs)
    for a, b in zip(got, want):
        assert rel_err_floor(a, b) < 1e-12


def test_double_backward_raises():
    """The joined backward is once differentiable: a double backward raises rather
    than returning a wrong gradient."""
    x, ei, _ = inputs(False, torch.float64)
    conv = FusedTransformerConv(8, 4, heads=2).double()
    x = x.clone().requires_grad_()
    out = conv(x, ei)
    (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()


# ------------------------------------------------------------------ dfgnn::projections
def _projection_call(impl: str):
    """``(x, rows, ws, bs) -> outputs`` of one implementation: the Python
    ``Projections``, the C++ op through ``torch.ops`` or the direct entry."""
    if impl == "function":
        return lambda x, rows, ws, bs: Projections.apply(x, rows, *ws, *bs)
    if impl == "op":
        return lambda x, rows, ws, bs: torch.ops.dfgnn.projections.default(x, rows, ws, bs)
    from pyg_dfgnn import _C
    return lambda x, rows, ws, bs: _C.projections(x, rows, ws, bs)


def _projection_case(device, dtype, rows, x_grad, gen):
    """Inputs of a four-projection call: a frozen weight, a missing bias and an
    unused output among them; ``x`` 2-D where ``rows`` is set, else 3-D."""
    def leaf(*shape, grad=True):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64)
        return t.to(device=device, dtype=dtype).requires_grad_(grad)
    x = leaf(11, 6, grad=x_grad) if rows is not None else leaf(2, 5, 6, grad=x_grad)
    ws = [leaf(4, 6), leaf(3, 6, grad=False), leaf(2, 6), leaf(5, 6)]
    bs = [leaf(4), None, leaf(2), leaf(5)]
    return x, ws, bs


def _projection_reference(x, rows, ws, bs):
    """The float64 ``F.linear`` function the op computes (query zero past ``rows``)."""
    outs = [torch.nn.functional.linear(x, w, b) for w, b in zip(ws, bs)]
    if rows is not None and rows < x.shape[0]:
        head = torch.nn.functional.linear(x[:rows], ws[0], bs[0])
        outs[0] = torch.cat([head, head.new_zeros(x.shape[0] - rows, ws[0].shape[0])])
    return outs


@pytest.mark.cuda
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("impl", ["op", "entry"])
@pytest.mark.parametrize("rows", [None, 0, 4, 11])
@pytest.mark.parametrize("x_grad", [True, False])
def test_projections_op_against_float64(device, impl, rows, x_grad):
    """``torch.ops.dfgnn.projections`` (and its direct entry) in float32 against
    the float64 ``F.linear`` function: outputs, and the gradients of the inputs
    that need one (none for the frozen weight, the missing bias, and the weight
    and bias of the unused output)."""
    gen = torch.Generator().manual_seed(11)
    x, ws, bs = _projection_case(device, torch.float32, rows, x_grad, gen)
    used = (0, 1, 3)
    leaves = [t for t in [x, *ws, *bs] if t is not None and t.requires_grad]
    outs = _projection_call(impl)(x, rows, ws, bs)
    assert len(outs) == 4 and all(o.dtype == torch.float32 and o.is_contiguous() for o in outs)
    ref_in = [None if t is None else t.detach().double().cpu().requires_grad_(t.requires_grad)
              for t in [x, *ws, *bs]]
    ref = _projection_reference(ref_in[0], rows, ref_in[1:5], ref_in[5:])
    for o, r in zip(outs, ref):
        assert not o.isnan().any() and rel_err(o.double().cpu(), r) < 1e-5
    if rows is not None and rows < 11:
        assert outs[0][rows:].eq(0).all()
    gs = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in ref]
    # output 1 (frozen weight, no bias) has no gradient path without x's
    used = [i for i in used if ref[i].requires_grad]
    got = torch.autograd.grad([outs[i] for i in used], leaves,
                              [gs[i].to(device, torch.float32) for i in used], allow_unused=True)
    ref_leaves = [r for r, t in zip(ref_in, [x, *ws, *bs]) if t is not None and t.requires_grad]
    want = torch.autograd.grad([ref[i] for i in used], ref_leaves, [gs[i] for i in used],
                               allow_unused=True)
    assert [g is None for g in got] == [g is None for g in want]
    for a, b in zip(got, want):
        if b is not None:
            assert a.dtype == torch.float32 and rel_err(a.double().cpu(), b) < 1e-4


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [None, 5])
def test_projections_op_bf16_autocast(rows):
    """Under CUDA bf16 autocast the op casts once, as ``F.linear`` casts each
    call: bf16 outputs within bf16 tolerance of the float64 function, gradients
    back in each input's float32."""
    gen = torch.Generator().manual_seed(12)
    x, ws, bs = _projection_case("cuda", torch.float32, rows, True, gen)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outs = torch.ops.dfgnn.projections(x, rows, ws, bs)
    assert all(o.dtype == torch.bfloat16 for o in outs)
    ref_in = [None if t is None else t.detach().double().cpu().requires_grad_(t.requires_grad)
              for t in [x, *ws, *bs]]
    ref = _projection_reference(ref_in[0], rows, ref_in[1:5], ref_in[5:])
    for o, r in zip(outs, ref):
        assert rel_err(o.double().cpu(), r) < 1e-2
    gs = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in ref]
    leaves = [x, ws[0], ws[2], bs[0], bs[3]]
    got = torch.autograd.grad(outs, leaves, [g.to("cuda", torch.bfloat16) for g in gs])
    want = torch.autograd.grad(ref, [ref_in[0], ref_in[1], ref_in[3], ref_in[5], ref_in[8]], gs)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and rel_err(a.double().cpu(), b) < 2e-2


@pytest.mark.cuda
def test_projections_op_checks_and_opcheck():
    """Bad arguments raise ``ValueError``; a double backward raises (the node is
    once differentiable); ``torch.library.opcheck`` passes (fake tensor, schema,
    autograd registration)."""
    gen = torch.Generator().manual_seed(13)
    x, ws, bs = _projection_case("cuda", torch.float32, 4, True, gen)
    with pytest.raises(ValueError, match="biases"):
        torch.ops.dfgnn.projections(x, None, ws, bs[:2])
    with pytest.raises(ValueError, match="rows"):
        torch.ops.dfgnn.projections(x, -1, ws, bs)
    outs = torch.ops.dfgnn.projections(x, None, ws, bs)
    (gx,) = torch.autograd.grad(sum(o.square().sum() for o in outs), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()
    plain = [w.detach().requires_grad_() for w in ws]
    torch.library.opcheck(torch.ops.dfgnn.projections.default,
                          (x.detach().requires_grad_(), 4, plain, [b for b in bs]))


@pytest.mark.parametrize("impl", ["op", "function"])
@pytest.mark.parametrize("rows", [None, 5])
def test_projections_autocast_casts_together(impl, rows):
    """Under bf16 autocast (CPU) the backward of the op (C++ node) and of
    :class:`Projections` casts the joined weight and bias gradients once each
    (plus x's, and a query cut at ``rows`` its own); the op's forward casts x alone
    and the parameters with one multi-tensor copy. Outputs and gradients stay
    those of the float64 function within bf16's tolerance."""
    if impl == "op" and not HAS_EXTENSION:
        pytest.skip("needs the compiled extension pyg_dfgnn._C")
    gen = torch.Generator().manual_seed(14)
    x, ws, bs = _projection_case("cpu", torch.float32, rows, True, gen)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = (torch.ops.dfgnn.projections(x, rows, ws, bs) if impl == "op"
                    else Projections.apply(x, rows, *ws, *bs))
    counts = {e.key: e.count for e in prof.key_averages()}
    if impl == "op":
        assert counts.get("aten::_to_copy", 0) == 1  # x; the parameters went together
        assert counts.get("aten::_foreach_copy_", 0) == 1
    assert all(o.dtype == torch.bfloat16 for o in outs)
    ref_in = [None if t is None else t.detach().double().requires_grad_(t.requires_grad)
              for t in [x, *ws, *bs]]
    ref = _projection_reference(ref_in[0], rows, ref_in[1:5], ref_in[5:])
    for o, r in zip(outs, ref):
        assert rel_err(o.double(), r) < 1e-2
    gs = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in ref]
    leaves = [x, ws[0], ws[2], ws[3], bs[0], bs[2], bs[3]]
    grad_outs = [g.bfloat16() for g in gs]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = torch.autograd.grad(outs, leaves, grad_outs)
    counts = {e.key: e.count for e in prof.key_averages()}
    # x's gradient, the joined weights' and biases'; a query cut at rows has its own two
    assert counts.get("aten::_to_copy", 0) == (3 if rows is None else 5)
    ref_leaves = [ref_in[i] for i in (0, 1, 3, 4, 5, 7, 8)]
    want = torch.autograd.grad(ref, ref_leaves, gs)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and rel_err(a.double(), b) < 2e-2
