"""FusedTransformerConv's joined projection GEMM (``fused_projection``) on CPU.

The joined path (query / key / value / skip as one ``F.linear`` over their
concatenated weights) must give the outputs and gradients of the separate path,
keep PyG's parameters and ``state_dict``, and actually be taken: every test
counts the GEMMs a forward runs.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.nn import TransformerConv

from conftest import random_graph, rel_err
from pyg_dfgnn.nn import FusedTransformerConv

# aten.linear: in inference mode it reaches the dispatcher undecomposed.
_GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
          torch.ops.aten.linear.default}
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


class GemmCount(TorchDispatchMode):
    """Counts the matrix products run inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in _GEMMS
        return func(*args, **(kwargs or {}))


def forward_gemms(conv, x, edge_index, grad: bool = True) -> int:
    with torch.set_grad_enabled(grad), GemmCount() as count:
        conv(x, edge_index)
    return count.n


def expected_gemms(conv, bipartite: bool, joined: bool) -> int:
    """Projection GEMMs (plus ``lin_beta``'s) of one forward."""
    beta = conv.lin_beta is not None
    if not joined:
        return 3 + conv.root_weight + beta
    return (2 if bipartite else 1) + beta


def inputs(bipartite: bool, dtype):
    if bipartite:
        ns, nd = 12, 7
        ei = random_graph(ns, nd, num_edges=40, num_isolated=2)
        return (torch.randn(ns, 6, dtype=dtype), torch.randn(nd, 8, dtype=dtype)), ei, (6, 8)
    ei = random_graph(15, num_edges=60)
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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("kwargs", CONFIGS)
def test_joined_equals_separate(kwargs, bipartite, dtype):
    x, ei, in_channels = inputs(bipartite, dtype)
    joined, separate = joined_and_separate(dtype, in_channels, **kwargs)
    assert forward_gemms(joined, x, ei) == expected_gemms(joined, bipartite, True)
    assert forward_gemms(separate, x, ei) == expected_gemms(separate, bipartite, False)

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
    assert forward_gemms(conv, (x, x), ei) == 1
    assert forward_gemms(conv, (x, x.clone()), ei) == 2   # equal values, two tensors
    conv.fused_projection = False
    assert forward_gemms(conv, x, ei) == 4


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
    assert forward_gemms(conv, x, ei) == 4


def test_hooked_or_replaced_linear_runs_separately():
    x, ei, _ = inputs(False, torch.float32)
    conv = FusedTransformerConv(8, 4, heads=2)
    calls = []
    handle = conv.lin_value.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    assert forward_gemms(conv, x, ei) == 4
    assert calls == [torch.Size([15, 8])]
    handle.remove()
    assert forward_gemms(conv, x, ei) == 1

    class Scaled(torch.nn.Linear):
        def forward(self, x: Tensor) -> Tensor:
            return 2 * super().forward(x)

    ref = conv(x, ei)
    scaled = Scaled(8, 8)
    scaled.load_state_dict(conv.lin_key.state_dict())
    conv.lin_key = scaled
    assert forward_gemms(conv, x, ei) == 4
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
    assert forward_gemms(fused, x, ei) == expected_gemms(fused, bipartite, True)
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
    assert count.n == expected_gemms(fused, bipartite, False)
    assert rel_err(of, on) < 1e-5          # same initial weights, drawn in PyG's order
    assert fused.state_dict().keys() == native.state_dict().keys()
    assert forward_gemms(fused, x, ei) == expected_gemms(fused, bipartite, True)
    assert rel_err(fused(x, ei), native(x, ei)) < 1e-5

    # a lazy layer loads a materialised state and then joins
    fresh = FusedTransformerConv(in_channels, 4, heads=2, beta=True)
    fresh.load_state_dict(native.state_dict())
    assert forward_gemms(fresh, x, ei) == expected_gemms(fresh, bipartite, True)
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
    assert forward_gemms(native, x, ei) == 1
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
