"""Fused conv layers vs the native PyG layers they subclass (CPU, float32; the
``SparseTensor`` tests in float64).

Every comparison copies the native weights into the fused layer through
``load_state_dict`` and checks outputs AND gradients (inputs and all parameters)
to ``||a - b|| / ||b|| < 1e-5``.
"""
from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv
from torch_geometric.utils import add_self_loops, remove_self_loops

import pyg_dfgnn.nn.agnn_conv as agnn_mod
import pyg_dfgnn.nn.gat_conv as gat_mod
import pyg_dfgnn.nn.gatv2_conv as gatv2_mod
import pyg_dfgnn.nn.transformer_conv as gt_mod
from conftest import has_duplicates, isolated_dst, make_adj, random_graph, rel_err
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedGATv2Conv, FusedTransformerConv

TOL = 1e-5
NATIVE = {FusedTransformerConv: TransformerConv, FusedGATConv: GATConv,
          FusedGATv2Conv: GATv2Conv, FusedAGNNConv: AGNNConv}
ADJ_KINDS = ["coo", "edge_index", "csr", "sparse_coo", "sparse_tensor"]


# ----------------------------------------------------------------------------- helpers
def plain(t: Tensor) -> Tensor:
    return t.as_subclass(Tensor) if isinstance(t, Tensor) else t


def make_pair(fused_cls, *args, **kwargs):
    """(native, fused) with the native weights loaded into the fused layer."""
    native = NATIVE[fused_cls](*args, **kwargs)
    fused = fused_cls(*args, **kwargs)
    assert list(fused.state_dict().keys()) == list(native.state_dict().keys())
    fused.load_state_dict(native.state_dict())
    return native, fused


class OpCalls:
    """Counts calls of the fused ops made by the layers (0 means the layer fell
    back to PyG's forward)."""

    def __init__(self, monkeypatch):
        self.n = 0
        for mod, name in ((gt_mod, "gt_attention"), (gat_mod, "gat_attention"),
                          (gatv2_mod, "gatv2_attention"), (agnn_mod, "agnn_attention")):
            fn = getattr(mod, name)
            monkeypatch.setattr(mod, name, self._wrap(fn))

    def _wrap(self, fn):
        def wrapper(*args, **kwargs):
            self.n += 1
            return fn(*args, **kwargs)
        return wrapper


@pytest.fixture
def op_calls(monkeypatch):
    return OpCalls(monkeypatch)


def _leaf(x):
    if x is None:
        return None
    if isinstance(x, Tensor):
        return x.detach().clone().requires_grad_(True)
    return tuple(_leaf(t) for t in x)


def _flat(x):
    if x is None:
        return []
    if isinstance(x, Tensor):
        return [x]
    return [t for t in x if t is not None]


def run(conv, x, adj, **kwargs):
    """Forward + backward of a fixed random linear functional of the output.

    Returns ``(result, input grads, {param name: grad})``."""
    xs = _leaf(x)
    res = conv(xs, adj, **kwargs)
    out = res[0] if isinstance(res, tuple) else res
    g = torch.Generator().manual_seed(7)
    w = torch.randn(out.shape, generator=g).to(out.device)
    (out * w).sum().backward()
    grads = [t.grad for t in _flat(xs)]
    pgrads = {n: p.grad for n, p in conv.named_parameters()}
    return res, grads, pgrads


def assert_close(a: Tensor, b: Tensor, what: str, floor: float = 0.0):
    """``||a - b|| / max(||b||, floor) < TOL`` and no NaN in ``a``."""
    assert not torch.isnan(a).any(), f"{what}: NaN in fused result"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    den = max(float(b.detach().double().norm()), floor)
    if den == 0.0:
        err = rel_err(a, b)
    else:
        err = float((a.detach().double() - b.detach().double()).norm()) / den
    assert err < TOL, f"{what}: relative error {err:.3g}"


def assert_match(native, fused, x, adj, **kwargs):
    """Outputs and gradients of ``fused`` equal ``native``'s; returns both results."""
    rn, gn, pn = run(native, x, adj, **kwargs)
    rf, gf, pf = run(fused, x, adj, **kwargs)
    on = rn[0] if isinstance(rn, tuple) else rn
    of = rf[0] if isinstance(rf, tuple) else rf
    assert isinstance(rf, tuple) == isinstance(rn, tuple)
    assert_close(of, on, "output")
    for i, (a, b) in enumerate(zip(gf, gn)):
        assert (a is None) == (b is None), f"input {i}: gradient presence differs"
        if b is not None:
            assert_close(a, b, f"grad of input {i}")
    assert pf.keys() == pn.keys()
    # Some gradients are zero in exact arithmetic (e.g. the key bias of
    # TransformerConv: softmax is shift-invariant per row); both sides then hold
    # rounding noise, so they are compared against 1% of the largest gradient.
    scale = max([float(g.double().norm()) for g in list(pn.values()) + gn if g is not None]
                + [0.0])
    for name in pn:
        assert (pf[name] is None) == (pn[name] is None), f"{name}: gradient presence differs"
        if pn[name] is not None:
            assert_close(pf[name], pn[name], f"grad of {name}", floor=1e-2 * scale)
    return rn, rf


def graph(n=15, e=60, **kw):
    ei = random_graph(n, num_edges=e, **kw)
    return ei, torch.randn(n, 8)


# ----------------------------------------------------------------------------- construction
@pytest.mark.parametrize("fused_cls,args,kwargs", [
    (FusedTransformerConv, (8, 4), dict(heads=3, beta=True)),
    (FusedTransformerConv, ((6, 8), 4), dict(heads=2, concat=False, edge_dim=3)),
    (FusedGATConv, (8, 4), dict(heads=3, residual=True)),
    (FusedGATConv, ((6, 8), 4), dict(heads=2, concat=False, edge_dim=2, bias=False)),
    (FusedAGNNConv, (), dict(requires_grad=True)),
    (FusedAGNNConv, (), dict(requires_grad=False, add_self_loops=False)),
])
def test_initialisation_identical_to_pyg(fused_cls, args, kwargs):
    torch.manual_seed(3)
    native = NATIVE[fused_cls](*args, **kwargs)
    torch.manual_seed(3)
    fused = fused_cls(*args, **kwargs)
    sn, sf = native.state_dict(), fused.state_dict()
    assert list(sn.keys()) == list(sf.keys())
    for k in sn:
        assert sn[k].dtype == sf[k].dtype and torch.equal(sn[k], sf[k]), k
    assert fused.strategy == "auto"
    assert "strategy" not in " ".join(sf.keys())
    assert repr(fused).startswith(fused_cls.__name__)


@pytest.mark.parametrize("fused_cls,args", [(FusedTransformerConv, (8, 4)),
                                            (FusedGATConv, (8, 4)), (FusedAGNNConv, ())])
def test_strategy_argument(fused_cls, args):
    with pytest.raises(ValueError, match="strategy"):
        fused_cls(*args, strategy="fastest")
    ei, x = graph()
    native, _ = make_pair(fused_cls, *args)
    outs = []
    for s in ("auto", "smmf", "pmf"):
        conv = fused_cls(*args, strategy=s)
        conv.load_state_dict(native.state_dict())
        assert conv.strategy == s
        outs.append(conv(x, ei))
    ref = native(x, ei)
    for o in outs:
        assert_close(o, ref, "strategy output")


# ----------------------------------------------------------------------------- TransformerConv
@pytest.mark.parametrize("adj_kind", ADJ_KINDS)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("concat", [True, False])
def test_transformer_matches(adj_kind, heads, concat, op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=heads, concat=concat)
    adj = make_adj(adj_kind, ei, 15, 15)
    assert_match(native, fused, x, adj)
    assert op_calls.n == 1


@pytest.mark.parametrize("beta,root_weight,bias", [(True, True, True), (False, False, True),
                                                   (True, False, False), (True, True, False)])
def test_transformer_beta_root_weight(beta, root_weight, bias, op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=2, beta=beta,
                              root_weight=root_weight, bias=bias)
    assert (fused.lin_beta is not None) == (beta and root_weight)
    assert_match(native, fused, x, ei)
    assert op_calls.n == 1


@pytest.mark.parametrize("adj_kind", ["coo", "edge_index", "csr"])
@pytest.mark.parametrize("concat", [True, False])
def test_transformer_bipartite(adj_kind, concat, op_calls):
    ns, nd = 12, 7
    ei = random_graph(ns, nd, num_edges=40, num_isolated=2)
    x = (torch.randn(ns, 6), torch.randn(nd, 8))
    native, fused = make_pair(FusedTransformerConv, (6, 8), 4, heads=3, concat=concat)
    out_n, out_f = assert_match(native, fused, x, make_adj(adj_kind, ei, ns, nd))
    assert out_f.shape == (nd, 12 if concat else 4)
    assert op_calls.n == 1


def test_transformer_isolated_nodes_get_zero_messages(op_calls):
    ei = random_graph(20, num_edges=50, num_isolated=4)
    iso = isolated_dst(ei, 20)
    assert iso.numel() == 4
    x = torch.randn(20, 8)
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=2, root_weight=False)
    _, out = assert_match(native, fused, x, ei)
    assert torch.equal(out[iso], torch.zeros_like(out[iso]))
    has_in = torch.ones(20, dtype=torch.bool)
    has_in[iso] = False
    assert (out[has_in].abs().sum(-1) > 0).all()


def test_duplicate_edges_count_twice(op_calls):
    ei = random_graph(15, num_edges=40, num_duplicates=10)
    assert has_duplicates(ei)
    x = torch.randn(15, 8)
    for cls, args in ((FusedTransformerConv, (8, 4)), (FusedGATConv, (8, 4)), (FusedAGNNConv, ())):
        native, fused = make_pair(cls, *args)
        assert_match(native, fused, x, ei)
        # The de-duplicated graph gives a different result: duplicates must matter.
        uniq = torch.unique(ei, dim=1)
        assert rel_err(fused(x, uniq), fused(x, ei)) > 1e-4
    assert op_calls.n == 9


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("adj_kind", ["coo", "edge_index", "csr", "sparse_coo"])
def test_transformer_attention_weights(flag, adj_kind, op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=4)
    adj = make_adj(adj_kind, ei, 15, 15)
    # PyG returns the weights whenever a bool is given, even False.
    rn, rf = assert_match(native, fused, x, adj, return_attention_weights=flag)
    (en, an), (ef, af) = rn[1], rf[1]
    if adj_kind in ("coo", "edge_index"):
        assert torch.equal(plain(ef), plain(en))
    else:
        assert ef is adj and en is adj
    assert af.shape == an.shape == (plain(en).size(1) if adj_kind in ("coo", "edge_index")
                                    else adj._nnz(), 4)
    assert_close(af, an, "attention weights")
    assert op_calls.n == 1


@pytest.mark.parametrize("fused_cls", [FusedTransformerConv, FusedGATConv])
def test_eval_mode_dropout_is_exact(fused_cls, op_calls):
    ei, x = graph()
    native, fused = make_pair(fused_cls, 8, 4, heads=2, dropout=0.5)
    native.eval()
    fused.eval()
    assert_match(native, fused, x, ei)
    assert op_calls.n == 1


@pytest.mark.parametrize("fused_cls", [FusedTransformerConv, FusedGATConv])
def test_training_mode_dropout(fused_cls, op_calls):
    ei, x = graph(n=30, e=200)
    fused = fused_cls(8, 4, heads=2, dropout=0.5)
    fused.train()
    torch.manual_seed(1)
    out1 = fused(x, ei)
    torch.manual_seed(1)
    out1b = fused(x, ei)
    out2 = fused(x, ei)
    fused.eval()
    ref = fused(x, ei)
    assert out1.shape == ref.shape
    assert torch.isfinite(out1).all() and torch.isfinite(out2).all()
    assert rel_err(out1, ref) > 1e-3
    assert rel_err(out1, out2) > 1e-3  # a fresh mask every call
    assert torch.equal(out1, out1b)  # seeded by torch.manual_seed
    out1.sum().backward()  # differentiable in training mode
    assert op_calls.n == 4


def test_transformer_training_attention_is_pre_dropout(op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=2, dropout=0.5)
    _, (_, an) = native(x, ei, return_attention_weights=True)
    _, (_, af) = fused(x, ei, return_attention_weights=True)
    assert_close(af, an, "pre-dropout attention")
    assert op_calls.n == 1


@pytest.mark.parametrize("adj_kind", ["coo", "edge_index", "csr"])
def test_transformer_edge_dim_runs_fused(adj_kind, op_calls, build_count):
    """Edge features run the dot_edge score (tests/test_edge_inputs.py has the
    float64 parity on every adjacency type); the layout is built once."""
    ei, x = graph()
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=2, edge_dim=3)
    adj = make_adj(adj_kind, ei, 15, 15)
    nnz = ei.size(1) if adj_kind != "csr" else adj._nnz()
    edge_attr = torch.randn(nnz, 3)
    rn, rf = assert_match(native, fused, x, adj, edge_attr=edge_attr)
    rn, rf = assert_match(native, fused, x, adj, edge_attr=edge_attr,
                          return_attention_weights=True)
    assert_close(rf[1][1], rn[1][1], "attention weights")
    assert op_calls.n == 2 and build_count() == 1


def test_transformer_edge_dim_without_edge_attr_falls_back(op_calls, build_count):
    """PyG raises for edge_dim without edge features: the layer lets it."""
    ei, x = graph()
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=2, edge_dim=3)
    with pytest.raises(AssertionError):
        native(x, ei)
    with pytest.raises(AssertionError):
        fused(x, ei)
    assert op_calls.n == 0 and build_count() == 0


@pytest.mark.parametrize("kwargs", [dict(aggr="mean"), dict(flow="target_to_source")])
def test_transformer_unsupported_propagate_config_falls_back(kwargs, op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedTransformerConv, 8, 4, heads=2, **kwargs)
    assert_match(native, fused, x, ei)
    assert op_calls.n == 0


def test_propagate_hook_falls_back(op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedGATConv, 8, 4, heads=2)
    seen = []
    for m in (native, fused):
        m.register_propagate_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    assert_match(native, fused, x, ei)
    assert op_calls.n == 0 and len(seen) == 2


# ----------------------------------------------------------------------------- GATConv
@pytest.mark.parametrize("adj_kind", ADJ_KINDS)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("loops", [True, False])
def test_gat_matches(adj_kind, heads, concat, loops, op_calls):
    ei = random_graph(15, num_edges=60, num_self_loops=3)
    x = torch.randn(15, 8)
    native, fused = make_pair(FusedGATConv, 8, 4, heads=heads, concat=concat,
                              add_self_loops=loops)
    assert_match(native, fused, x, make_adj(adj_kind, ei, 15, 15))
    assert op_calls.n == 1


@pytest.mark.parametrize("residual,bias", [(True, True), (True, False), (False, False)])
def test_gat_residual_bias(residual, bias, op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedGATConv, 8, 4, heads=3, residual=residual, bias=bias)
    assert_match(native, fused, x, ei)
    native, fused = make_pair(FusedGATConv, (6, 8), 4, heads=3, residual=residual, bias=bias,
                              add_self_loops=False)
    ei2 = random_graph(10, 7, num_edges=30)
    assert_match(native, fused, (torch.randn(10, 6), torch.randn(7, 8)), ei2)
    assert op_calls.n == 2


@pytest.mark.parametrize("adj_kind", ["coo", "edge_index", "csr"])
@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("shared_lin", [False, True])
def test_gat_bipartite(adj_kind, loops, shared_lin, op_calls):
    ns, nd = 12, 7
    ei = random_graph(ns, nd, num_edges=40, num_isolated=2, num_self_loops=2)
    if shared_lin:
        args, x = (8, 4), (torch.randn(ns, 8), torch.randn(nd, 8))
    else:
        args, x = ((6, 8), 4), (torch.randn(ns, 6), torch.randn(nd, 8))
    native, fused = make_pair(FusedGATConv, *args, heads=2, add_self_loops=loops)
    _, out = assert_match(native, fused, x, make_adj(adj_kind, ei, ns, nd))
    assert out.shape == (nd, 8)
    assert op_calls.n == 1


@pytest.mark.parametrize("loops", [False, True])
def test_gat_missing_destination_features(loops, op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedGATConv, 8, 4, heads=2, add_self_loops=loops)
    assert_match(native, fused, (x, None), ei)
    assert op_calls.n == 1


@pytest.mark.parametrize("bipartite", [False, True])
def test_gat_explicit_size(bipartite, op_calls):
    if bipartite:
        ns, nd = 12, 7
        ei = random_graph(ns, nd, num_edges=40)
        x = (torch.randn(ns, 8), torch.randn(nd, 8))
    else:
        ns = nd = 15
        ei, x = graph()
    native, fused = make_pair(FusedGATConv, 8, 4, heads=2, add_self_loops=True)
    assert_match(native, fused, x, ei, size=(ns, nd))
    assert op_calls.n == 1


def test_gat_self_loops_in_input(op_calls):
    ei = random_graph(15, num_edges=50, num_self_loops=6)
    n_in = int((ei[0] == ei[1]).sum())
    assert n_in >= 6
    x = torch.randn(15, 8)
    for loops in (True, False):
        native, fused = make_pair(FusedGATConv, 8, 4, heads=2, add_self_loops=loops)
        rn, rf = assert_match(native, fused, x, ei, return_attention_weights=True)
        (en, an), (ef, af) = rn[1], rf[1]
        assert torch.equal(plain(ef), plain(en))
        n_loops = int((plain(ef)[0] == plain(ef)[1]).sum())
        assert n_loops == (15 if loops else n_in)
        assert_close(af, an, "attention weights")
    assert op_calls.n == 2


@pytest.mark.parametrize("adj_kind", ["coo", "edge_index", "csr", "sparse_coo"])
@pytest.mark.parametrize("loops", [True, False])
def test_gat_attention_weights(adj_kind, loops, op_calls):
    ei = random_graph(15, num_edges=60, num_self_loops=2)
    x = torch.randn(15, 8)
    native, fused = make_pair(FusedGATConv, 8, 4, heads=4, add_self_loops=loops)
    adj = make_adj(adj_kind, ei, 15, 15)
    rn, rf = assert_match(native, fused, x, adj, return_attention_weights=True)
    (en, an), (ef, af) = rn[1], rf[1]
    if adj_kind in ("coo", "edge_index"):
        assert torch.equal(plain(ef), plain(en))
        if loops:
            expect, _ = add_self_loops(remove_self_loops(ei)[0], num_nodes=15)
            assert torch.equal(plain(ef), expect)
        else:
            assert ef is adj
    else:
        assert ef.layout == en.layout
        if adj_kind == "csr":
            assert torch.equal(ef.crow_indices(), en.crow_indices())
            assert torch.equal(ef.col_indices(), en.col_indices())
        else:
            assert torch.equal(ef.indices(), en.indices())
        assert_close(ef.values(), en.values(), "sparse attention values")
    assert_close(af, an, "attention weights")
    # torch.sparse with self-loops rebuilds the matrix in PyG: deliberate fallback
    fell_back = loops and adj_kind in ("csr", "sparse_coo")
    assert op_calls.n == (0 if fell_back else 1)
    # return_attention_weights=False returns the output only (PyG tests truthiness)
    assert isinstance(fused(x, adj, return_attention_weights=False), Tensor)


def test_gat_training_attention_falls_back_to_post_dropout(op_calls):
    ei, x = graph()
    native, fused = make_pair(FusedGATConv, 8, 4, heads=2, dropout=0.5)
    torch.manual_seed(5)
    on, (en, an) = native(x, ei, return_attention_weights=True)
    torch.manual_seed(5)
    of, (ef, af) = fused(x, ei, return_attention_weights=True)
    assert torch.equal(plain(ef), plain(en))
    assert_close(af, an, "post-dropout attention")
    assert_close(of, on, "output")
    assert (af == 0).any()  # really after dropout
    assert op_calls.n == 0


@pytest.mark.parametrize("loops", [True, False])
def test_gat_edge_dim_runs_fused(loops, op_calls, build_count):
    """Edge features run the additive_edge score (tests/test_gat_edge.py has the
    float64 parity on every adjacency type and fill value); edge_dim without
    edge features runs the additive score, as PyG leaves the edge term out; the
    layout is built once."""
    ei, x = graph(num_self_loops=3)
    native, fused = make_pair(FusedGATConv, 8, 4, heads=2, edge_dim=3, add_self_loops=loops)
    edge_attr = torch.randn(ei.size(1), 3)
    assert_match(native, fused, x, ei, edge_attr=edge_attr)
    assert_match(native, fused, x, ei)
    assert op_calls.n == 2 and build_count() == 1


# ----------------------------------------------------------------------------- AGNNConv
@pytest.mark.parametrize("adj_kind", ADJ_KINDS)
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_agnn_matches(adj_kind, loops, requires_grad, op_calls):
    ei = random_graph(15, num_edges=60, num_self_loops=3)
    x = torch.randn(15, 8)
    native, fused = make_pair(FusedAGNNConv, requires_grad=requires_grad, add_self_loops=loops)
    if requires_grad:  # move beta away from its initial 1 so its role is tested
        with torch.no_grad():
            native.beta.fill_(1.7)
            fused.beta.fill_(1.7)
    assert_match(native, fused, x, make_adj(adj_kind, ei, 15, 15))
    assert op_calls.n == 1


# ----------------------------------------------------------------------------- SparseTensor
# (N_src, N_dst): square, more sources than destinations, more destinations
SPARSE_SIZES = [(15, 15), (12, 7), (6, 10)]


def sparse_tensor_graph(ns: int, nd: int):
    """``adj_t`` as the ``SparseTensor`` ``T.ToSparseTensor()`` makes, with
    duplicate entries, self-loops and isolated destinations."""
    torch_sparse = pytest.importorskip("torch_sparse")
    ei = random_graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=6, num_self_loops=3)
    assert has_duplicates(ei) and isolated_dst(ei, nd).numel() >= 2
    adj = torch_sparse.SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(nd, ns))
    row, col, _ = adj.coo()
    assert adj.nnz() == ei.size(1) and (row == col).any()  # duplicates stay entries
    return adj


def sparse_features(ns: int, nd: int):
    """float64 features: one tensor for a square graph, else a pair ``(F_s=8, F_t=6)``."""
    if ns == nd:
        return torch.randn(ns, 8, dtype=torch.float64)
    return torch.randn(ns, 8, dtype=torch.float64), torch.randn(nd, 6, dtype=torch.float64)


def double_pair(fused_cls, *args, **kwargs):
    native, fused = make_pair(fused_cls, *args, **kwargs)
    return native.double(), fused.double()


def assert_same_sparse_tensor(a, b, what: str):
    """Same sizes, entries in the same order, close values."""
    (ra, ca, va), (rb, cb, vb) = a.coo(), b.coo()
    assert a.sparse_sizes() == b.sparse_sizes(), f"{what}: sizes differ"
    assert torch.equal(ra, rb) and torch.equal(ca, cb), f"{what}: entries or order differ"
    assert_close(va, vb, what)


@pytest.mark.parametrize("ns,nd", SPARSE_SIZES)
@pytest.mark.parametrize("fused_cls", [FusedGATConv, FusedGATv2Conv])
def test_gat_sparse_tensor_self_loops(fused_cls, ns, nd, op_calls, build_count):
    adj = sparse_tensor_graph(ns, nd)
    x = sparse_features(ns, nd)
    args = (8, 4) if ns == nd else ((8, 6), 4)
    native, fused = double_pair(fused_cls, *args, heads=3, residual=True)
    assert fused.add_self_loops
    assert fused.fallback_reason(x, adj) == ""
    assert fused.fallback_reason(x, adj, return_attention_weights=True) == ""
    assert_match(native, fused, x, adj)
    rn, rf = assert_match(native, fused, x, adj, return_attention_weights=True)
    assert_same_sparse_tensor(rf[1], rn[1], "attention weights")
    # PyG's set_diag puts each loop inside its row, not after the input's entries:
    # the weights are really reordered
    row, col, _ = rf[1].coo()
    loops = row == col
    assert int(loops.sum()) == min(ns, nd) and not loops[-min(ns, nd):].all()
    assert op_calls.n == 2 and build_count() == 1  # both calls use the cached layout


@pytest.mark.parametrize("ns,nd", SPARSE_SIZES)
def test_gat_sparse_tensor_missing_destination_features(ns, nd, op_calls):
    adj = sparse_tensor_graph(ns, nd)  # N_dst is the matrix's, not the features'
    x = (torch.randn(ns, 8, dtype=torch.float64), None)
    native, fused = double_pair(FusedGATConv, 8, 4, heads=2)
    assert fused.fallback_reason(x, adj) == ""
    _, out = assert_match(native, fused, x, adj)
    assert out.shape == (nd, 8)
    assert op_calls.n == 1


@pytest.mark.parametrize("requires_grad", [True, False])
def test_agnn_sparse_tensor_self_loops(requires_grad, op_calls):
    adj = sparse_tensor_graph(15, 15)  # AGNNConv takes one feature tensor: square
    x = sparse_features(15, 15)
    native, fused = double_pair(FusedAGNNConv, requires_grad=requires_grad)
    if requires_grad:  # beta away from its initial 1, so its gradient is tested
        with torch.no_grad():
            native.beta.fill_(1.7)
            fused.beta.fill_(1.7)
    assert fused.add_self_loops and fused.fallback_reason(x, adj) == ""
    assert_match(native, fused, x, adj)
    assert op_calls.n == 1


@pytest.mark.parametrize("ns,nd", SPARSE_SIZES)
def test_transformer_sparse_tensor(ns, nd, op_calls):
    adj = sparse_tensor_graph(ns, nd)
    x = sparse_features(ns, nd)
    args = (8, 4) if ns == nd else ((8, 6), 4)
    native, fused = double_pair(FusedTransformerConv, *args, heads=3, beta=True)
    assert fused.fallback_reason(x, adj, return_attention_weights=True) == ""
    assert_match(native, fused, x, adj)
    rn, rf = assert_match(native, fused, x, adj, return_attention_weights=True)
    assert_same_sparse_tensor(rf[1], rn[1], "attention weights")
    assert op_calls.n == 2


# ----------------------------------------------------------------------------- layout reuse
class TwoLayer(torch.nn.Module):
    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x, edge_index):
        return self.second(self.first(x, edge_index).relu(), edge_index)


@pytest.mark.parametrize("layers,variants", [
    (lambda: (FusedTransformerConv(8, 4, heads=2), FusedTransformerConv(8, 8)), 1),
    (lambda: (FusedGATConv(8, 4, heads=2), FusedAGNNConv()), 1),
    (lambda: (FusedTransformerConv(8, 4, heads=2), FusedGATConv(8, 8)), 2),
])
def test_layout_built_once_per_graph(layers, variants, build_count, op_calls):
    ei, x = graph()
    model = TwoLayer(*layers())
    for _ in range(3):
        model(x, ei).sum().backward()
    assert build_count() == variants
    assert op_calls.n == 6
    # an in-place change of the edges invalidates the cached layout
    ei[0, 0] = (ei[0, 0] + 1) % 15
    model(x, ei)
    assert build_count() == 2 * variants


def test_dataloader_builds_once_per_batch(build_count, op_calls):
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader
    graphs = []
    for n in (9, 12, 7, 15, 10):
        graphs.append(Data(x=torch.randn(n, 8), edge_index=random_graph(n, num_edges=3 * n)))
    loader = DataLoader(graphs, batch_size=2, shuffle=False)
    model = TwoLayer(FusedTransformerConv(8, 4, heads=2), FusedTransformerConv(8, 8))
    native = TwoLayer(TransformerConv(8, 4, heads=2), TransformerConv(8, 8))
    native.load_state_dict(model.state_dict())
    n_batches = 0
    for batch in loader:
        out = model(batch.x, batch.edge_index)
        assert_close(out, native(batch.x, batch.edge_index), "batched output")
        n_batches += 1
    assert n_batches == 3
    assert build_count() == n_batches
    assert op_calls.n == 2 * n_batches


def test_cached_layout_is_used(build_count, op_calls):
    from torch_geometric.data import Data
    from pyg_dfgnn.transforms import CacheLayout
    ei, x = graph()
    data = CacheLayout()(Data(x=x, edge_index=ei))
    assert isinstance(data.dfgnn_layout, GraphLayout)
    built = build_count()
    assert built >= 1
    for cls in (FusedTransformerConv, FusedGATConv):
        native, fused = make_pair(cls, 8, 4, heads=2)
        assert_match(native, fused, data.x, data.edge_index)
    native, fused = make_pair(FusedAGNNConv)
    assert_match(native, fused, data.x, data.edge_index)
    assert build_count() == built
    assert op_calls.n == 3


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("fused_cls,args,kwargs", [
    (FusedTransformerConv, (32, 32), dict(heads=4)),
    (FusedTransformerConv, (32, 32), dict(heads=2, concat=False, beta=True)),
    (FusedGATConv, (32, 32), dict(heads=4)),
    (FusedAGNNConv, (), dict()),
])
@pytest.mark.parametrize("strategy", ["auto", "smmf", "pmf"])
def test_layers_match_on_cuda(fused_cls, args, kwargs, strategy):
    """The fused kernels (SMMF and PMF, rows split over several PMF work items)
    against native PyG on the GPU, float32."""
    n = 300
    ei = random_graph(n, num_edges=3000, num_isolated=5, num_duplicates=20, num_self_loops=4)
    hub = torch.stack([torch.randint(0, n, (700,)), torch.zeros(700, dtype=torch.long)])
    ei = torch.cat([ei, hub], 1).cuda()  # node 0: in-degree > 2 PMF chunks
    x = torch.randn(n, 32, device="cuda")
    native = NATIVE[fused_cls](*args, **kwargs).cuda()
    fused = fused_cls(*args, strategy=strategy, **kwargs).cuda()
    fused.load_state_dict(native.state_dict())
    rn, gn, pn = run(native, x, ei)
    rf, gf, pf = run(fused, x, ei)
    tol = 1e-4  # different (deterministic) summation order than PyG's scatter
    assert rel_err(rf, rn) < tol
    for a, b in zip(gf, gn):
        assert rel_err(a, b) < tol
    scale = max(float(g.double().norm()) for g in pn.values() if g is not None)
    for name in pn:
        if pn[name] is not None:
            err = float((pf[name] - pn[name]).double().norm()) / max(
                float(pn[name].double().norm()), 1e-2 * scale)
            assert err < tol, name


def _gt_pair_on_cuda(ns: int, nd: int, bipartite: bool):
    """``(x, features, native float64 layer, fused layer)``: 4 heads x 32 channels
    over 32 input channels (bipartite: 32 source, 24 destination), the native
    weights loaded into the fused layer."""
    x = torch.randn(ns, 32, device="cuda")
    xs = (x, torch.randn(nd, 24, device="cuda")) if bipartite else x
    in_ch = (32, 24) if bipartite else 32
    native = TransformerConv(in_ch, 32, heads=4).cuda().double()
    fused = FusedTransformerConv(in_ch, 32, heads=4).cuda()
    fused.load_state_dict(native.state_dict())
    return x, xs, native, fused


@pytest.mark.cuda
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("mode", ["train", "no_grad", "bf16"])
def test_transformer_query_prefix_on_cuda(bipartite, mode):
    """A NeighborLoader-shaped batch (the last hop's nodes, the tail rows, have no
    in-edge): the query projection covers the rows below ``dst_extent`` only,
    and output and gradients still match native PyG in float64 (fp32 < 1e-5 /
    1e-4, bf16 autocast < 1e-2)."""
    torch.manual_seed(11)
    ns, nd, extent = 400, (150 if bipartite else 400), 90
    ei = random_graph(ns, nd, num_edges=2500, num_isolated=0, num_duplicates=10)
    ei = ei[:, ei[1] < extent].cuda()
    x, xs, native, fused = _gt_pair_on_cuda(ns, nd, bipartite)
    from pyg_dfgnn.layout_cache import get_layout
    assert get_layout(ei, size=(ns, nd)).dst_extent == extent
    dbl = tuple(t.double() for t in xs) if bipartite else x.double()
    if mode == "no_grad":
        with torch.no_grad():
            got, want = fused(xs, ei), native(dbl, ei)
        assert rel_err(got, want) < 1e-5
        return
    if mode == "bf16":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = fused(xs, ei)
        assert got.dtype == torch.bfloat16
        assert rel_err(got, native(dbl, ei)) < 1e-2
        return
    rf, gf, pf = run(fused, xs, ei)
    rn, gn, pn = run(native, dbl, ei)
    assert rel_err(rf, rn) < 1e-5
    for a, b in zip(gf, gn):
        assert rel_err(a, b) < 1e-4
    scale = max(float(g.norm()) for g in pn.values() if g is not None)
    for name, b in pn.items():
        if b is not None:
            err = float((pf[name].double() - b).norm()) / max(float(b.norm()), 1e-2 * scale)
            assert err < 1e-4, name


class _ColumnCats(TorchDispatchMode):
    """Counts concatenations along a dimension other than the first (the joined
    gradient's columns; the weights are joined by rows) inside the ``with`` block,
    the autograd engine's threads included (dispatch modes are part of the state
    they inherit)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.cat.default:
            dim = args[1] if len(args) > 1 else (kwargs or {}).get("dim", 0)
            self.n += dim != 0
        return func(*args, **(kwargs or {}))


JOINED_PATHS = ["one_launch", "two_launches", "mma"]


@pytest.mark.cuda
@pytest.mark.parametrize("path", JOINED_PATHS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("hub", [False, True])
@pytest.mark.parametrize("bipartite,cut", [(False, False), (False, True), (True, False),
                                           (True, True)])
def test_transformer_joined_gradient_on_cuda(bipartite, cut, hub, dtype, path, plan_override):
    """The GT attention's backward writes dq, dk and dv into column slices of the
    projections' joined gradient (``attention_bwd_into``), so the projections' backward
    concatenates nothing; outputs and gradients match native PyG in float64
    (fp32 < 1e-5 / 1e-4, bf16 autocast < 1e-2). Covers the query cut at
    ``dst_extent`` (not joined: its own gradient), bipartite features (key and
    value joined, query and skip joined), split rows (a hub: the fp32 in-kernel
    merge and the separate merge of half-precision walks write into the slices)
    and the backward's one-launch, two-launch and tensor-core walks."""
    if path == "mma" and (dtype == "fp32" or hub):
        pytest.skip("the tensor-core walks run fp16 / bf16 without split rows")
    plan_override(bwd_launches=1 if path == "one_launch" else 2,
                  mma_backward=path == "mma")
    ns, nd = (500, 300) if bipartite else (500, 500)
    extent = nd - 60 if cut else nd
    ei = random_graph(ns, nd, num_edges=4000, num_isolated=5, num_duplicates=20)
    ei = ei[:, ei[1] < extent]
    ei = torch.cat([ei, torch.tensor([[0], [extent - 1]])], 1)  # dst_extent is `extent`
    if hub:  # destination 1: in-degree past a work item's chunk, its row split
        ei = torch.cat([ei, torch.stack([torch.randint(0, ns, (1500,)),
                                         torch.ones(1500, dtype=torch.long)])], 1)
    ei = ei.cuda()
    x, xs, native, fused = _gt_pair_on_cuda(ns, nd, bipartite)
    poison = torch.full((64 << 20,), float("nan"), device="cuda")  # unwritten rows show
    del poison

    leaves = [t.detach().clone().requires_grad_() for t in (xs if bipartite else (xs,))]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        out = fused(tuple(leaves) if bipartite else leaves[0], ei)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).cuda()
    with _ColumnCats() as cats:
        (out.float() * w).sum().backward()
    assert cats.n == 0
    rn, gn, pn = run(native, tuple(t.double() for t in xs) if bipartite else x.double(), ei)
    tol_out, tol_grad = (1e-5, 1e-4) if dtype == "fp32" else (1e-2, 1e-2)
    assert rel_err(out.float(), rn) < tol_out
    for a, b in zip(leaves, gn):
        assert rel_err(a.grad, b) < tol_grad
    scale = max(float(g.norm()) for g in pn.values() if g is not None)
    for name, p in fused.named_parameters():
        b = pn[name]
        assert p.grad is not None and not torch.isnan(p.grad).any(), name
        err = float((p.grad.double() - b).norm()) / max(float(b.norm()), 1e-2 * scale)
        assert err < tol_grad, f"{name}: {err:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("same", ["tensor", "column"])
def test_joined_gradient_feature_passed_twice(same):
    """q and k of one projections output (the same tensor, or two views of one
    column): one of them writes the joined slice, the other its own gradient,
    which autograd adds; the gradients equal those of the same call on copies
    (no joined buffer)."""
    from pyg_dfgnn import ops
    from pyg_dfgnn.layout_cache import get_layout
    n, H, C = 300, 2, 16
    ei = random_graph(n, num_edges=2500).cuda()
    lay = get_layout(ei, size=(n, n), add_self_loops=False)
    x = torch.randn(n, 24, device="cuda")
    ws = [torch.randn(H * C, 24, device="cuda", requires_grad=True) for _ in range(2)]
    bs = [torch.randn(H * C, device="cuda", requires_grad=True) for _ in range(2)]
    gout = torch.randn(n, H, C, device="cuda")

    def grads(copy: bool):
        o1, o2 = torch.ops.dfgnn.projections(x, None, ws, bs)
        q = o1.view(n, H, C)
        if copy:
            q = q.clone()
        k = q if same == "tensor" or copy else o1.view(n, H, C)
        out = ops.gt_attention(lay, q, k, o2.view(n, H, C), scale=0.25)
        return torch.autograd.grad(out, ws + bs, gout)

    for a, b in zip(grads(False), grads(True)):
        assert rel_err(a, b) < 1e-5


@pytest.mark.cuda
def test_bwd_into_checks_its_outputs():
    """``dfgnn::attention_bwd_into`` writes the dot score's gradients into column
    slices of one buffer, and refuses outputs it cannot write (a wrong shape or
    dtype, channels that are not contiguous) with a RuntimeError, never a fault."""
    from pyg_dfgnn.layout_cache import get_layout
    from pyg_dfgnn.ops import op_args
    n, H, C = 40, 2, 8
    ei = random_graph(n, num_edges=200).cuda()
    lay = get_layout(ei, size=(n, n), add_self_loops=False)
    q, k, v = (torch.randn(n, H, C, device="cuda") for _ in range(3))
    args = op_args("dot", lay, [q, k, v], (0.5,))
    out, lse, _, token, saved = torch.ops.dfgnn.attention_fwd(*args)
    grad = torch.randn_like(out)
    tail = (args[0], out, lse, token, saved, args[4], 0.0)
    want = torch.ops.dfgnn.attention_bwd(grad, *tail)
    joined = torch.full((n, 4 * H * C), float("nan"), device="cuda")
    good = [joined[:, i * H * C:(i + 1) * H * C].view(n, H, C) for i in range(3)]
    torch.ops.dfgnn.attention_bwd_into(good, grad, *tail)
    for got, ref in zip(good, want):
        assert torch.equal(got, ref)
    assert joined[:, 3 * H * C:].isnan().all()  # nothing written past the slices
    bad = {
        "shape": [torch.empty(n - 1, H, C, device="cuda")] + good[1:],
        "dtype": [good[0].half()] + good[1:],
        "channels": [torch.empty(n, C, H, device="cuda").transpose(1, 2)] + good[1:],
        "count": good[:2],
    }
    for what, outs in bad.items():
        with pytest.raises(RuntimeError, match="attention_bwd_into"):
            torch.ops.dfgnn.attention_bwd_into(outs, grad, *tail)
