"""The fused convs as drop-ins for PyG's (CPU, float64, against the native conv
holding the same ``state_dict``): the node counts PyG's ``propagate`` infers from
a bipartite adjacency, ``size`` and the features, and TorchScript."""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv

import pyg_dfgnn.nn.agnn_conv as agnn_mod
import pyg_dfgnn.nn.gat_conv as gat_mod
import pyg_dfgnn.nn.gatv2_conv as gatv2_mod
import pyg_dfgnn.nn.transformer_conv as gt_mod
from conftest import make_adj, random_graph
from pyg_dfgnn.nn import (FusedAGNNConv, FusedGATConv, FusedGATv2Conv, FusedTransformerConv,
                          fuse)

NS, ND, F = 9, 5, 6
NATIVE = {FusedGATConv: GATConv, FusedGATv2Conv: GATv2Conv,
          FusedTransformerConv: TransformerConv, FusedAGNNConv: AGNNConv}
ADJ_KINDS = ["coo", "edge_index", "edge_index_unsized", "sparse_coo", "csr", "sparse_tensor"]


@pytest.fixture
def fused_calls(monkeypatch):
    """The layouts the layers look up: one per call that runs fused, none for a
    call that runs PyG's forward."""
    calls = []
    for mod in (gat_mod, gatv2_mod, gt_mod, agnn_mod):
        def counted(*args, _real=mod.get_layout, **kwargs):
            calls.append(args[0])
            return _real(*args, **kwargs)
        monkeypatch.setattr(mod, "get_layout", counted)
    return calls


def pair(fused_cls, *args, **kwargs):
    """(native, fused) in float64, the fused layer holding the native weights."""
    torch.manual_seed(0)
    native = NATIVE[fused_cls](*args, **kwargs).double()
    fused = fused_cls(*args, **kwargs).double()
    fused.load_state_dict(native.state_dict())
    return native, fused


def adjacency(kind: str, ei: Tensor, ns: int, nd: int):
    if kind == "edge_index_unsized":
        return EdgeIndex(ei.clone())
    return make_adj(kind, ei, ns, nd)


def features(*rows: Optional[int], channels=(F, 4)):
    """Random float64 node features with ``rows[i]`` rows (``None`` stays ``None``)."""
    out = tuple(None if n is None else torch.randn(n, c, dtype=torch.float64)
                for n, c in zip(rows, channels))
    return out[0] if len(out) == 1 else out


def forward_backward(conv, x, adj, **kwargs):
    """``(output, gradients of the features and of each parameter)`` of a fixed
    random linear functional of the output."""
    xs = x.detach().requires_grad_() if isinstance(x, Tensor) else tuple(
        None if t is None else t.detach().requires_grad_() for t in x)
    out = conv(xs, adj, **kwargs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    leaves = [t for t in ((xs,) if isinstance(xs, Tensor) else xs) if t is not None]
    grads = torch.autograd.grad((out * w).sum(), leaves + list(conv.parameters()),
                                allow_unused=True)
    return out, grads


def assert_like_pyg(native, fused, x, adj_fn, **kwargs):
    """Outputs and gradients of ``fused`` equal ``native``'s (each call gets its
    own adjacency from ``adj_fn``, so no layout cached by one serves the other)."""
    want, want_grads = forward_backward(native, x, adj_fn(), **kwargs)
    got, got_grads = forward_backward(fused, x, adj_fn(), **kwargs)
    torch.testing.assert_close(got, want)
    assert len(got_grads) == len(want_grads)
    for g, w in zip(got_grads, want_grads):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w)
    return got


def assert_raises_like_pyg(native, fused, x, adj_fn, **kwargs):
    """Both layers raise, the same exception with the same message."""
    with pytest.raises(Exception) as want:
        native(x, adj_fn(), **kwargs)
    with pytest.raises(type(want.value)) as got:
        fused(x, adj_fn(), **kwargs)
    assert str(got.value) == str(want.value)


# ----------------------------------------------------------------------------- node counts
BIPARTITE = {  # name: (fused class, constructor args, kwargs, feature rows)
    "gat_no_dst": (FusedGATConv, (F, 4), dict(heads=2), (NS, None)),
    "gat": (FusedGATConv, ((F, 4), 4), dict(heads=2, residual=True), (NS, ND)),
    "gatv2": (FusedGATv2Conv, ((F, 4), 4), dict(heads=2, residual=True), (NS, ND)),
    "transformer": (FusedTransformerConv, ((F, 4), 4), dict(heads=2, beta=True), (NS, ND)),
}


@pytest.mark.parametrize("adj_kind", ADJ_KINDS)
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("case", list(BIPARTITE))
def test_bipartite_node_counts_like_pyg(case, loops, adj_kind, fused_calls):
    r"""Bipartite graphs with ``N_src != N_dst``, every adjacency kind: the
    destination count is the adjacency's where it carries one (a sparse matrix's
    rows, an ``EdgeIndex``'s ``sparse_size``), else the destination features',
    else (``x_dst=None``) the source count, as PyG infers it; the call runs fused."""
    cls, args, kwargs, rows = BIPARTITE[case]
    if cls is FusedTransformerConv:
        if loops:
            pytest.skip("TransformerConv adds no self-loops")
    else:
        kwargs = dict(kwargs, add_self_loops=loops)
    native, fused = pair(cls, *args, **kwargs)
    ei = random_graph(NS, ND, num_edges=30, num_isolated=1, num_self_loops=2)
    x = features(*rows)
    out = assert_like_pyg(native, fused, x, lambda: adjacency(adj_kind, ei, NS, ND))
    # PyG's self-loops for x_src's rows widen an EdgeIndex to (NS, NS)
    sized = adj_kind in ("sparse_coo", "csr", "sparse_tensor") or (
        adj_kind == "edge_index" and not loops)
    assert out.size(0) == (ND if rows[1] is not None or sized else NS)
    assert len(fused_calls) == 1


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_gat_without_destination_features_takes_them_from_adj_t(layout, fused_calls):
    """``x=(x_src, None)`` and a ``torch.sparse`` ``adj_t`` of shape ``[2, 4]``:
    two destination nodes, as in PyG."""
    native, fused = pair(FusedGATConv, 16, 32, heads=2)
    ei = torch.tensor([[0, 1, 2, 3, 3], [0, 0, 1, 1, 0]])
    x = (torch.randn(4, 16, dtype=torch.float64), None)
    out = assert_like_pyg(native, fused, x, lambda: make_adj(
        "sparse_coo" if layout == "coo" else "csr", ei, 4, 2))
    assert out.shape == (2, 64) and len(fused_calls) == 1


@pytest.mark.parametrize("adj_kind", ["coo", "edge_index", "edge_index_unsized", "sparse_coo"])
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("dst", [False, True])
def test_gat_size_argument_like_pyg(dst, loops, adj_kind, fused_calls):
    """``size=(N_src, N_dst)`` sets the counts of a ``[2, E]`` tensor; PyG ignores
    it for an ``EdgeIndex`` and a sparse matrix, except that ``min(size)`` is the
    number of self-loops it adds to an ``EdgeIndex``. Where those loops are not
    one per node below ``min(N_src, N_dst)`` the layer runs PyG's forward."""
    native, fused = pair(FusedGATConv, (F, 4), 4, heads=2, add_self_loops=loops)
    ei = random_graph(NS, ND, num_edges=30, num_self_loops=2)
    x = features(NS, ND if dst else None)
    out = assert_like_pyg(native, fused, x, lambda: adjacency(adj_kind, ei, NS, ND),
                          size=(NS, ND))
    ignored = adj_kind == "edge_index_unsized" and not dst  # counts from x_src: (NS, NS)
    assert out.size(0) == (NS if ignored else ND)
    assert len(fused_calls) == (0 if ignored and loops else 1)


MISMATCHED = {  # name: (fused class, constructor args, kwargs, feature rows)
    "gat_single": (FusedGATConv, (F, 4), dict(heads=2), (NS,)),
    "gat_pair": (FusedGATConv, ((F, 4), 4), dict(heads=2), (NS, ND + 1)),
    "gatv2_single": (FusedGATv2Conv, (F, 4), dict(heads=2), (NS,)),
    "gatv2_pair": (FusedGATv2Conv, ((F, 4), 4), dict(heads=2), (NS + 1, ND)),
    "transformer_single": (FusedTransformerConv, (F, 4), dict(heads=2), (NS,)),
    "transformer_pair": (FusedTransformerConv, ((F, 4), 4), dict(heads=2), (NS, ND + 1)),
    "agnn": (FusedAGNNConv, (), dict(), (NS,)),
}


@pytest.mark.parametrize("adj_kind", ["edge_index", "sparse_coo", "csr"])
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("case", list(MISMATCHED))
def test_counts_that_disagree_with_the_adjacency_like_pyg(case, loops, adj_kind,
                                                          fused_calls):
    """Features whose row counts disagree with a sized adjacency's: PyG raises,
    and so does the layer, with PyG's error. Except for an ``EdgeIndex`` with
    self-loops, where PyG's loops can widen the ``sparse_size`` to the
    features' counts: then the layer computes what PyG computes."""
    cls, args, kwargs, rows = MISMATCHED[case]
    if cls is not FusedTransformerConv:
        kwargs = dict(kwargs, add_self_loops=loops)
    native, fused = pair(cls, *args, **kwargs)
    x = features(*rows)
    ei = random_graph(NS, ND, num_edges=30)
    try:
        native(x, adjacency(adj_kind, ei, NS, ND))
    except ValueError:
        assert_raises_like_pyg(native, fused, x, lambda: adjacency(adj_kind, ei, NS, ND))
        assert fused_calls == []
        return
    assert adj_kind == "edge_index" and loops and cls is not FusedTransformerConv
    assert_like_pyg(native, fused, x, lambda: adjacency(adj_kind, ei, NS, ND))
    assert len(fused_calls) == 1


def test_gat_size_that_disagrees_raises_like_pyg(fused_calls):
    """A ``size`` that disagrees with the features of a ``[2, E]`` tensor."""
    native, fused = pair(FusedGATConv, (F, 4), 4, heads=2)
    ei = random_graph(NS, ND, num_edges=30)
    assert_raises_like_pyg(native, fused, features(NS, ND), lambda: ei, size=(NS, ND + 1))
    assert fused_calls == []


@pytest.mark.parametrize("adj_kind", ["edge_index", "sparse_coo", "csr"])
@pytest.mark.parametrize("loops", [False, True])
def test_agnn_adjacency_size_like_pyg(loops, adj_kind, fused_calls):
    """AGNN on a sized adjacency (an ``EdgeIndex`` with self-loops included) runs
    fused and matches PyG."""
    native, fused = pair(FusedAGNNConv, add_self_loops=loops)
    with torch.no_grad():
        native.beta.fill_(1.3)
        fused.beta.fill_(1.3)
    ei = random_graph(NS, num_edges=40, num_self_loops=3)
    assert_like_pyg(native, fused, features(NS), lambda: adjacency(adj_kind, ei, NS, NS))
    assert len(fused_calls) == 1


# ----------------------------------------------------------------------------- TorchScript
class Net(torch.nn.Module):
    """A model around one conv, as PyG models script."""

    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(x, edge_index).tanh()


class EdgeNet(Net):
    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        return self.conv(x, edge_index, edge_attr).tanh()


SCRIPT_CONFIGS = {
    "gat": (FusedGATConv, (F, 4), dict(heads=2)),
    "gat_two_lins_mean": (FusedGATConv, ((F, F), 4), dict(heads=2, concat=False)),
    "gat_edge_dim": (FusedGATConv, (F, 4), dict(heads=2, edge_dim=3, residual=True)),
    "gatv2": (FusedGATv2Conv, (F, 4), dict(heads=2)),
    "gatv2_shared_residual": (FusedGATv2Conv, (F, 4), dict(heads=2, share_weights=True,
                                                           residual=True)),
    "gatv2_edge_dim": (FusedGATv2Conv, (F, 4), dict(heads=2, edge_dim=3)),
    "transformer": (FusedTransformerConv, (F, 4), dict(heads=2)),
    "transformer_beta_mean": (FusedTransformerConv, (F, 4), dict(heads=2, beta=True,
                                                                 concat=False)),
    "transformer_edge_dim": (FusedTransformerConv, (F, 4), dict(heads=2, edge_dim=3)),
    "transformer_no_root": (FusedTransformerConv, (F, 4), dict(heads=2, root_weight=False)),
    "agnn": (FusedAGNNConv, (), dict()),
    "agnn_buffer_no_loops": (FusedAGNNConv, (), dict(requires_grad=False,
                                                     add_self_loops=False)),
}


def _script_inputs(kwargs):
    g = torch.Generator().manual_seed(2)
    ei = random_graph(NS, num_edges=40, generator=g)
    x = torch.randn(NS, F, generator=g, dtype=torch.float64)
    if "edge_dim" in kwargs:
        return EdgeNet, (x, ei, torch.randn(ei.size(1), 3, generator=g, dtype=torch.float64))
    return Net, (x, ei)


def _perturb(conv):
    """Changes every parameter and buffer of ``conv`` in place."""
    with torch.no_grad():
        for t in list(conv.parameters()) + list(conv.buffers()):
            t.mul_(1.5).add_(0.1)


@pytest.mark.parametrize("config", list(SCRIPT_CONFIGS))
def test_scripts_where_pyg_does(config, fused_calls):
    r""":func:`torch.jit.script` of the fused layer, and of a model holding it,
    succeeds where it does for PyG's conv (and raises the same exception type
    where PyG's does: with torch 2.14 and PyG 2.8, ``GATConv`` and ``GATv2Conv``
    do not script, and a scripted ``TransformerConv`` has only its overloads,
    ``forward__0`` ..., no ``forward``). The scripted module computes what the
    eager fused layer computes, and shares its parameters: an in-place change of
    the fused layer shows in it."""
    cls, args, kwargs = SCRIPT_CONFIGS[config]
    native, fused = pair(cls, *args, **kwargs)
    wrap, inputs = _script_inputs(kwargs)
    try:
        native_direct = torch.jit.script(native)
        torch.jit.script(wrap(native))
    except Exception as e:  # PyG's conv does not script: neither does the fused one
        with pytest.raises(type(e)):
            torch.jit.script(fused)
        with pytest.raises(type(e)):
            torch.jit.script(wrap(fused))
        return
    direct = torch.jit.script(fused)
    assert hasattr(direct, "forward") == hasattr(native_direct, "forward")
    scripted = torch.jit.script(wrap(fused))
    eager = wrap(fused)  # the fused layer itself: scripting put PyG's in the model
    for _ in range(2):
        want = eager(*inputs)
        torch.testing.assert_close(scripted(*inputs), want)
        if hasattr(direct, "forward"):
            torch.testing.assert_close(direct(*inputs).tanh(), want)
        _perturb(fused)
    assert not torch.allclose(eager(*inputs), want)
    assert len(fused_calls) == 3  # the eager calls ran fused


@pytest.mark.parametrize("config", list(SCRIPT_CONFIGS))
def test_scripted_twin_is_the_native_conv_in_the_same_state(config):
    """What TorchScript compiles in the fused layer's place, a PyG conv whatever
    PyG's scriptability: same class as PyG's, the same parameter and buffer
    objects, the same training flag, and eagerly the same results."""
    cls, args, kwargs = SCRIPT_CONFIGS[config]
    dropout = {} if cls is FusedAGNNConv else dict(dropout=0.25)
    _, fused = pair(cls, *args, **dropout, **kwargs)
    fused.eval()
    twin = fused.__prepare_scriptable__()
    assert type(twin) is NATIVE[cls]
    assert [(n, id(p)) for n, p in twin.named_parameters()] == \
        [(n, id(p)) for n, p in fused.named_parameters()]
    assert [(n, id(b)) for n, b in twin.named_buffers()] == \
        [(n, id(b)) for n, b in fused.named_buffers()]
    assert not twin.training
    _, inputs = _script_inputs(kwargs)
    _perturb(fused)
    torch.testing.assert_close(twin(*inputs), fused(*inputs))


def test_scripting_a_model_puts_pyg_conv_in_it_and_fuse_restores():
    """torch.jit.script stores what ``__prepare_scriptable__`` returns in the
    scripted model's ``_modules``: the eager model then holds PyG's conv (same
    parameters, same results) until :func:`~pyg_dfgnn.nn.fuse` switches it back."""
    _, fused = pair(FusedTransformerConv, F, 4, heads=2)
    model = Net(fused)
    _, inputs = _script_inputs({})
    want = model(*inputs)
    torch.jit.script(model)
    assert type(model.conv) is TransformerConv
    assert model.conv.lin_query.weight is fused.lin_query.weight
    torch.testing.assert_close(model(*inputs), want)
    fuse(model)
    assert type(model.conv) is FusedTransformerConv
    torch.testing.assert_close(model(*inputs), want)
