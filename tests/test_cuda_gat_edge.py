"""GPU tests of the additive_edge kernels (the additive score with a per-edge term
``a_edge`` ``[E, H]``, ``GATConv`` with ``edge_dim``) against the float64
reference, as ``test_cuda_gat.py`` checks the additive score: fresh random
inputs, the allocator poisoned with NaN (an unwritten output shows), relative
error ||got - ref|| / ||ref|| < 1e-5 (outputs, attention weights) and < 1e-4
(gradients, the edge terms' included) in fp32, < 1e-2 in fp16 / bf16; SMMF and
PMF; split rows (a super node, and a tiny chunk), the kernels' dropout mask
recomputed on the host, determinism, and the layer against native ``GATConv``
(the edge terms' order and the peak memory: ``test_cuda_dot_edge.py``)."""
import functools

import pytest
import torch
from torch_geometric.nn import GATConv

from conftest import layer_grad_floor, rel_err_floor
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATConv
from pyg_dfgnn.ops import calls, plan, reference
from test_cuda_dot_edge import (_layer_inputs, _layer_run, assert_deterministic,
                                check_compiled_layer)
from test_cuda_gt import (DEV, GRAPHS, assert_matches_ref, dropout_keep, opcheck_plan_op,
                          poison, rel_err)

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)
SLOPE = 0.2


def make(graph, H, C, dtype, requires_grad=True, loops=False):
    """``(layout, [a_src, a_dst, x, e])``: ``e`` ``[E, H]`` in the input edge
    order (``loops``: a layout with added self-loops, ``e`` in the order of its
    ``edge_index``)."""
    ei, ns, nd = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd), add_self_loops=loops)
    shapes = [(ns, H), (nd, H), (ns, H, C), (lay.num_edges, H)]
    return lay, [torch.randn(s, device=DEV).to(dtype).requires_grad_(requires_grad)
                 for s in shapes]


def edge_ref64(score, kernel_order, lay, leaves, g=None, keep=None, p=0.0):
    """``(out, alpha in CSR order, the gradients of leaves or None)`` in float64
    of the reference of ``score`` (its spec's) over ``leaves``: the op's inputs,
    the edge input last, in the order of the layout's ``edge_index``
    (``kernel_order``: the spec's order of the others); ``keep``: a dropout mask
    ``[E, H]`` by CSR position, applied as ``alpha * keep / (1 - p)`` to the
    softmax before the sum of the value rows."""
    spec = ops.spec.get(score)
    t = [u.detach().double().requires_grad_(g is not None) for u in leaves]
    inputs = [t[i] for i in kernel_order] + [lay.to_csr_order(t[-1], loops_appended=True)]
    out, alpha = spec.reference(lay, inputs, (SLOPE,), 0.0, False)
    if keep is not None:
        out = reference.aggregate(lay.rowptr, lay.col, alpha * keep / (1 - p),
                                  inputs[spec.value_input])
    if g is None:
        return out, alpha, None
    out.backward(g.double())
    return out, alpha, [u.grad for u in t]


def edge_call(op, score, lay, *leaves, **kw):
    """``op`` (a public op) over ``leaves`` (its inputs in its order, the edge
    input last, which goes in CSR order: the layout's own order through
    ``to_csr_order(loops_appended=True)``); checks that the kernels of ``score``
    ran it."""
    *nodes, e = leaves
    e_csr = lay.to_csr_order(e, loops_appended=True)
    with ops.recording() as records:
        res = op(lay, *nodes, negative_slope=SLOPE, edge=e_csr, edge_order="csr", **kw)
    assert [r.score for r in records] == [score] and records[0].plan is not None
    return res


#: :func:`edge_ref64` and :func:`edge_call` of the additive_edge score, ``leaves``
#: ``[a_src, a_dst, x, e]``.
ref64 = functools.partial(edge_ref64, "additive_edge", (1, 0, 2))
call = functools.partial(edge_call, ops.gat_attention, "additive_edge")


def grads_of(leaves):
    return [t.grad for t in leaves]


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("H,C", [(1, 8), (2, 16), (4, 32), (8, 64), (1, 128), (2, 100), (1, 7)])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_forward_backward_fp32(graph, H, C, strategy):
    lay, leaves = make(graph, H, C, torch.float32)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    out, alpha = call(lay, *leaves, return_attention=True, strategy=strategy)
    poison()
    out.backward(g)
    ref, ref_alpha, want = ref64(lay, leaves, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha, list(zip(grads_of(leaves), want)))


@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_self_loop_layout(dtype, strategy):
    """A layout with added self-loops, the terms in its edge_index order (PyG's
    remove_self_loops + add_self_loops, as FusedGATConv hands them over)."""
    lay, leaves = make("small", 2, 32, dtype, loops=True)
    g = torch.randn(lay.num_dst, 2, 32, device=DEV, dtype=dtype)
    poison()
    out = call(lay, *leaves, strategy=strategy)
    out.backward(g)
    ref, _, want = ref64(lay, leaves, g)
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 1e-2)
    assert rel_err(out, ref) < tol[0]
    for got, w in zip(grads_of(leaves), want):
        assert rel_err(got, w) < tol[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_split_rows_with_a_tiny_chunk(dtype, dropout, strategy, plan_override, monkeypatch):
    """Every row of the small graph split into work items of 4 edges (bf16: the
    split rows' sums from their items' shares), with and without dropout."""
    plan_override(chunk=4)
    seed = 123456789
    monkeypatch.setattr(calls, "seed", lambda: seed)
    lay, leaves = make("small", 2, 32, dtype)
    assert lay.work("row", 4).num_slots > 0
    g = torch.randn(lay.num_dst, 2, 32, device=DEV, dtype=dtype)
    poison()
    out = call(lay, *leaves, dropout=dropout, training=True, strategy=strategy)
    poison()
    out.backward(g)
    keep = dropout_keep(seed, lay.num_edges, 2, dropout).to(DEV) if dropout else None
    ref, _, want = ref64(lay, leaves, g, keep=keep, p=dropout)
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 1e-2)
    assert rel_err(out, ref) < tol[0]
    for got, w in zip(grads_of(leaves), want):
        assert rel_err(got, w) < tol[1]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("graph", ["small", "super_node", "bipartite"])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32), (2, 24)])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_half_precision(graph, dtype, H, C, strategy):
    lay, leaves = make(graph, H, C, dtype)
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    out = call(lay, *leaves, strategy=strategy)
    poison()
    out.backward(g)
    e = leaves[3]
    assert out.dtype == dtype and e.grad.dtype == dtype and e.grad.shape == e.shape
    ref, _, want = ref64(lay, leaves, g)
    assert rel_err(out, ref) < 1e-2
    isolated = lay.in_degree() == 0
    assert isolated.any() and (out[isolated] == 0).all()
    for got, w in zip(grads_of(leaves), want):
        assert rel_err(got, w) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("graph", ["small", "super_node"])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_dropout_is_the_kernels_mask_forward_and_backward(graph, dtype, strategy, monkeypatch):
    """The additive score's mask (a counter per CSR position and head, from the
    call's seed; dropout_keep recomputes it): the output and every gradient
    match the float64 reference with that mask, and the attention weights are
    the softmax before it."""
    seed, p = 987654321987, 0.3
    monkeypatch.setattr(calls, "seed", lambda: seed)
    lay, leaves = make(graph, 2, 32, dtype)
    g = torch.randn(lay.num_dst, 2, 32, device=DEV, dtype=dtype)
    poison()
    out, alpha = call(lay, *leaves, dropout=p, training=True, return_attention=True,
                      strategy=strategy)
    poison()
    out.backward(g)
    keep = dropout_keep(seed, lay.num_edges, 2, p).to(DEV)
    assert 0.25 < 1 - keep.double().mean().item() < 0.35
    ref, ref_alpha, want = ref64(lay, leaves, g, keep=keep, p=p)
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 1e-2)
    assert rel_err(out, ref) < tol[0]
    assert rel_err(alpha, lay.to_input_order(ref_alpha)) < tol[0]
    for got, w in zip(grads_of(leaves), want):
        assert rel_err(got, w) < tol[1]
    assert rel_err(out, ref64(lay, leaves)[0]) > 1e-2  # the mask did apply
    assert rel_err(call(lay, *leaves, dropout=p, training=False), ref64(lay, leaves)[0]) \
        < tol[0]


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
def test_deterministic(dtype, dropout, strategy):
    """Bitwise the same output and gradients twice with split rows (the super
    node), and with dropout from the same seed (torch.manual_seed)."""
    lay, leaves = make("super_node", 4, 32, dtype)
    assert_deterministic(
        lambda: call(lay, *leaves, dropout=dropout, training=True, strategy=strategy), leaves,
        torch.randn(lay.num_dst, 4, 32, device=DEV, dtype=dtype))


def test_plan_runs_what_the_score_has(plan_override):
    """SMMF or PMF on CUDA cores with the two-launch backward; what the score
    lacks raises before a launch (ValueError from the plan)."""
    lay, leaves = make("small", 2, 64, torch.bfloat16)
    e_csr = lay.to_csr_order(leaves[3], loops_appended=True)
    for strategy in ("auto", "pmf"):
        with ops.recording() as records:  # call() records its own calls: not nested
            ops.gat_attention(lay, *leaves[:3], negative_slope=SLOPE, edge=e_csr,
                              edge_order="csr", strategy=strategy)
        p = records[0].plan
        assert (p.method, p.mma, p.two_rows, p.bwd_one_launch, p.mma_backward) == \
            ("smmf" if strategy == "auto" else "pmf", False, False, False, False)
        assert "additive_edge:bwd_edge" in [k for k, _ in p.kernels(backward=True)]
    for field in (dict(bwd_launches=1), dict(mma=True), dict(mma_backward=True)):
        with plan.override(**field), pytest.raises(ValueError):
            call(lay, *leaves)


@pytest.mark.parametrize("pmf", [False, True])
def test_opcheck_and_bad_input(pmf):
    """opcheck of dfgnn::attention_fwd with the score, and the C++ op's own
    checks of the edge terms it is handed directly (the Python op's ValueErrors
    are tested on the CPU)."""
    lay, (a_src, a_dst, x, e) = make("super_node", 2, 32, torch.float32, requires_grad=False)
    e_csr = lay.to_csr_order(e)
    check_op_and_bad_edge_inputs("additive_edge", lay, [a_dst, a_src, x, e_csr],
                                 (e_csr[1:], e_csr.half(), e_csr[:, :1].contiguous()),
                                 "pmf" if pmf else "smmf")


def check_op_and_bad_edge_inputs(score, lay, inputs, bads, strategy="smmf"):
    """opcheck of dfgnn::attention_fwd with ``score`` over ``inputs`` (the
    spec's order, the edge input last, in CSR order), with and without the
    attention weights, and the C++ op's own checks: each of ``bads`` in the
    edge input's place raises."""
    lay.colptr  # noqa: B018
    for need_attn in (False, True):
        args = ops.op_args(score, lay, inputs, (SLOPE,), need_attn=need_attn, strategy=strategy)
        opcheck_plan_op(torch.ops.dfgnn.attention_fwd.default, args)
    for bad in bads:
        with pytest.raises(RuntimeError):
            torch.ops.dfgnn.attention_fwd(*([list(inputs[:-1]) + [bad]] + list(args[1:])))
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------ the layer
LAYER_CONFIGS = {
    "plain": dict(heads=4),
    "one_head": dict(heads=1),
    "bipartite": dict(heads=4),
    "fill_add_concat_off_residual": dict(heads=2, concat=False, residual=True, fill_value="add"),
    "fill_max": dict(heads=2, fill_value="max"),
    "no_loops": dict(heads=2, add_self_loops=False),
    "alpha": dict(heads=4),
    "pmf": dict(heads=2, strategy="pmf"),
}


def check_layer_against_native(native_cls, fused_cls, kwargs: dict, config: str, dtype,
                               score: str):
    """The fused layer ``fused_cls`` (``kwargs`` to both constructors; a
    ``strategy`` the fused one's) against ``native_cls`` with the same weights
    in float64, on :func:`~test_cuda_dot_edge._layer_inputs` of ``config`` (20
    input self-loops; returned attention weights for ``"alpha"``): fp32 within
    1e-5 (outputs, attention weights) and 1e-4 (gradients of x, the edge
    features and every parameter); bf16 under autocast within 1e-2 of float64,
    or within 2x native PyG's own bf16 error where that is larger; outputs in
    PyG's dtype (float32: the scores are, as the attention vectors are). The
    fused call ran the kernels of ``score``; returns its plan."""
    ei, ns, nd, x, ea = _layer_inputs(config, self_loops=20)
    in_ch = (16, 12) if config == "bipartite" else 16
    kwargs = dict(kwargs)
    strategy = kwargs.pop("strategy", "auto")
    native = native_cls(in_ch, 32, edge_dim=16, **kwargs).to(DEV)
    fused = fused_cls(in_ch, 32, edge_dim=16, strategy=strategy, **kwargs).to(DEV)
    fused.load_state_dict(native.state_dict())
    kw = {"return_attention_weights": True} if config == "alpha" else {}
    autocast = dtype == torch.bfloat16
    with ops.recording() as records:
        got = _layer_run(fused, x, ei, ea, torch.float32, autocast, **dict(kw))
    assert [r.score for r in records] == [score] and records[0].plan is not None
    base = _layer_run(native, x, ei, ea, torch.float32, True, **dict(kw)) if autocast else None
    want = _layer_run(native.double(), x, ei, ea.double(), torch.float64, False, **dict(kw))
    out_tol, grad_tol = (1e-2, 1e-2) if autocast else (1e-5, 1e-4)
    floor = layer_grad_floor(want[2])

    def tol(own, t):
        return t if base is None else max(t, 2 * own)

    assert got[0].dtype == torch.float32
    assert rel_err(got[0], want[0]) < tol(base and rel_err(base[0], want[0]), out_tol)
    if config == "alpha":
        assert rel_err(got[1], want[1]) < tol(base and rel_err(base[1], want[1]), out_tol)
    for k, (a, b) in enumerate(zip(got[2], want[2])):
        assert (a is None) == (b is None)
        if b is not None:
            own = base and rel_err_floor(base[2][k], b, floor)
            assert rel_err_floor(a, b, floor) < tol(own, grad_tol), k
    return records[0].plan


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", list(LAYER_CONFIGS))
def test_layer_matches_native(config, dtype):
    """The fused layer against native GATConv (:func:`check_layer_against_native`)."""
    check_layer_against_native(GATConv, FusedGATConv, LAYER_CONFIGS[config], config, dtype,
                               "additive_edge")


def test_compiled_layer_with_edge_features():
    """fullgraph over a cached layout (no self-loops: PyG's remove_self_loops has
    a size that depends on the data)."""
    check_compiled_layer(FusedGATConv(32, 16, heads=2, edge_dim=8, add_self_loops=False))
