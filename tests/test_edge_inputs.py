"""Per-edge inputs: ``gt_attention(edge=...)`` (the ``"dot_edge"`` score) and,
in the op tests all three run, ``gat_attention(edge=...)`` (``"additive_edge"``)
and ``gatv2_attention(edge=...)`` (``"gatv2_edge"``; the other tests of both are
in ``test_gat_edge.py``) against float64 formulas written
out here, their errors, and ``FusedTransformerConv(edge_dim=...)`` against PyG's
``TransformerConv`` in float64 (outputs, attention weights and the gradients of
the node features, the edge features and every parameter) on every adjacency
type. On the CPU the op runs the reference path; the kernels are checked in
``test_cuda_dot_edge.py``, ``test_cuda_gat_edge.py`` and
``test_cuda_gatv2_edge.py``."""
from __future__ import annotations

import copy
import math
from typing import Callable, NamedTuple, Tuple

import pytest
import torch
from torch import Tensor
from torch._dynamo.utils import counters
from torch_geometric import EdgeIndex
from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csr_tensor

import pyg_dfgnn
from conftest import layer_grad_floor, random_graph, rel_err, rel_err_floor
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATConv, FusedGATv2Conv, FusedTransformerConv, fuse
from pyg_dfgnn.ops import plan, reference

F64 = torch.float64


# ----------------------------------------------------------------------------- the op
def _softmax_rows(s: Tensor, dst: Tensor, num_dst: int) -> Tensor:
    """Softmax of ``s`` ``[E, H]`` over the edges into each destination, with
    nothing of the package: max-shifted, by ``index_add``."""
    H = s.size(1)
    mx = torch.full((num_dst, H), -math.inf, dtype=s.dtype).scatter_reduce(
        0, dst[:, None].expand(-1, H), s, "amax")
    w = (s - mx[dst]).exp()
    den = torch.zeros(num_dst, H, dtype=s.dtype).index_add(0, dst, w)
    return w / den[dst]


def hand_formula(ei: Tensor, num_dst: int, q, k, v, e, scale):
    r"""``(out, alpha)`` of :math:`s_{ij} = scale\, q_i \cdot (k_j + e_{ij})`,
    :math:`o_i = \sum_j softmax_j(s_{ij}) (v_j + e_{ij})` in the input edge order,
    with nothing of the package."""
    src, dst = ei
    alpha = _softmax_rows((q[dst] * (k[src] + e)).sum(-1) * scale, dst, num_dst)
    out = torch.zeros(num_dst, *q.shape[1:], dtype=q.dtype).index_add(
        0, dst, alpha[..., None] * (v[src] + e))
    return out, alpha


def tails_full(a: Tensor, heads: int, channels: int) -> Tensor:
    """The ``[E, H, C]`` rows that tails ``a`` ``[E, D]`` stand for: zero, then
    ``a`` in the last ``D`` channels of every head."""
    E, D = a.shape
    return torch.cat([a.new_zeros(E, heads, channels - D), a[:, None].expand(E, heads, D)], -1)


def tail_width(C: int) -> int:
    """The tails' width ``D`` of the dot_edge_tail cases with ``C`` query
    channels (keys and values have ``C - D``)."""
    return max(1, C // 2)


def pad_kv(x: Tensor, C: int) -> Tensor:
    """Keys or values without tails padded with zeros to ``C`` channels."""
    return torch.nn.functional.pad(x, (0, C - x.size(-1)))


def gat_hand_formula(ei: Tensor, num_dst: int, a_src, a_dst, x, e, slope):
    r"""``(out, alpha)`` of :math:`s_{ij} = LeakyReLU(a_{dst,i} + a_{src,j} +
    e_{ij})`, :math:`o_i = \sum_j softmax_j(s_{ij}) x_j` in the edge order of
    ``ei``, with nothing of the package."""
    src, dst = ei
    s = torch.nn.functional.leaky_relu(a_dst[dst] + a_src[src] + e, slope)
    alpha = _softmax_rows(s, dst, num_dst)
    out = torch.zeros(num_dst, *x.shape[1:], dtype=x.dtype).index_add(
        0, dst, alpha[..., None] * x[src])
    return out, alpha


def gatv2_hand_formula(ei: Tensor, num_dst: int, x_l, x_r, att, e, slope):
    r"""``(out, alpha)`` of :math:`s_{ij} = a \cdot LeakyReLU(x_{r,i} + x_{l,j} +
    e_{ij})`, :math:`o_i = \sum_j softmax_j(s_{ij}) x_{l,j}` in the edge order of
    ``ei``, with nothing of the package."""
    src, dst = ei
    s = (torch.nn.functional.leaky_relu(x_r[dst] + x_l[src] + e, slope) * att).sum(-1)
    alpha = _softmax_rows(s, dst, num_dst)
    out = torch.zeros(num_dst, *x_l.shape[1:], dtype=x_l.dtype).index_add(
        0, dst, alpha[..., None] * x_l[src])
    return out, alpha


def _grouped(ei: Tensor) -> Tensor:
    return ei[:, ei[1].argsort(stable=True)]


OP_GRAPHS = {
    # name: (edge_index, N_src, N_dst)
    "unsorted_duplicates_isolated": lambda: (random_graph(20, num_edges=70, num_isolated=3,
                                                          num_duplicates=9), 20, 20),
    "bipartite": lambda: (random_graph(13, 9, num_edges=40), 13, 9),
    "super_node": lambda: (torch.cat([random_graph(30, num_edges=60),
                                      torch.stack([torch.randint(0, 30, (200,)),
                                                   torch.full((200,), 4)])], 1), 30, 30),
    "grouped_by_destination": lambda: (_grouped(random_graph(16, num_edges=50)), 16, 16),
    "zero_edges": lambda: (torch.empty(2, 0, dtype=torch.long), 6, 6),
}


class EdgeScore(NamedTuple):
    """A score with a per-edge input, as the op tests drive it: its public op
    takes the node inputs ``names`` (shapes ``shapes(N_src, N_dst, H, C)``), the
    scalar ``param_name=param`` and ``edge`` (``edge_shape(E, H, C)``)."""
    op: Callable
    base: str  #: the score of the op without ``edge``
    names: Tuple[str, ...]
    shapes: Callable
    edge_shape: Callable
    param_name: str
    param: float
    hand: Callable  #: ``(ei, N_dst, *nodes, edge, param) -> (out, alpha)``
    reference: Callable  #: ``(layout, nodes, edge in CSR order, dropout, training) -> out``
    kernel_order: Tuple[int, ...]  #: the node inputs in the spec's order
    shape_msg: str  #: what a wrong edge input's ValueError says
    pmf: bool  #: the score has a PMF path

    def make(self, ns, nd, E, H, C, dtype=F64, device="cpu"):
        """``[*nodes, edge]`` random leaves."""
        return [torch.randn(*s, device=device).to(dtype).requires_grad_()
                for s in (*self.shapes(ns, nd, H, C), self.edge_shape(E, H, C))]

    def call(self, lay, nodes, edge, **kw):
        kw.setdefault(self.param_name, self.param)
        return self.op(lay, **dict(zip(self.names, nodes)), edge=edge, **kw)


EDGE_SCORES = {
    "dot_edge": EdgeScore(
        ops.gt_attention, "dot", ("q", "k", "v"),
        lambda ns, nd, H, C: ((nd, H, C), (ns, H, C), (ns, H, C)), lambda E, H, C: (E, H, C),
        "scale", 0.37, hand_formula,
        lambda lay, t, e, p, train: reference.dot_attention(
            lay.rowptr, lay.col, *t, 0.37, p, training=train, edge=e)[0],
        (0, 1, 2), r"\[E, H, C\]|\[E, D\]", False),
    "dot_edge_tail": EdgeScore(
        ops.gt_attention, "dot", ("q", "k", "v"),
        lambda ns, nd, H, C: ((nd, H, C), (ns, H, C - tail_width(C)), (ns, H, C - tail_width(C))),
        lambda E, H, C: (E, tail_width(C)), "scale", 0.37,
        lambda ei, nd, q, k, v, e, scale: hand_formula(
            ei, nd, q, pad_kv(k, q.size(2)), pad_kv(v, q.size(2)),
            tails_full(e, q.size(1), q.size(2)), scale),
        lambda lay, t, e, p, train: reference.dot_attention(
            lay.rowptr, lay.col, t[0], pad_kv(t[1], t[0].size(2)), pad_kv(t[2], t[0].size(2)),
            0.37, p, training=train, edge=tails_full(e, t[0].size(1), t[0].size(2)))[0],
        (0, 1, 2), r"\[E, H, C\]|\[E, D\]", False),
    "additive_edge": EdgeScore(
        ops.gat_attention, "additive", ("a_src", "a_dst", "x"),
        lambda ns, nd, H, C: ((ns, H), (nd, H), (ns, H, C)), lambda E, H, C: (E, H),
        "negative_slope", 0.3, gat_hand_formula,
        lambda lay, t, e, p, train: reference.additive_attention(
            lay.rowptr, lay.col, t[1], t[0], t[2], 0.3, p, training=train, edge=e)[0],
        (1, 0, 2), r"\[E, H\] = ", True),
    "gatv2_edge": EdgeScore(
        ops.gatv2_attention, "gatv2", ("x_l", "x_r", "att"),
        lambda ns, nd, H, C: ((ns, H, C), (nd, H, C), (H, C)), lambda E, H, C: (E, H, C),
        "negative_slope", 0.3, gatv2_hand_formula,
        lambda lay, t, e, p, train: reference.gatv2_attention(
            lay.rowptr, lay.col, t[1], t[0], t[2], 0.3, p, training=train, edge=e)[0],
        (1, 0, 2), r"gatv2_attention: the edge rows must be \[E, H, C\] = ", False),
}


def base_nodes(score: str, nodes):
    """The node inputs as the score without edge inputs takes them: the tails'
    keys and values padded with zeros to the queries' channels."""
    if score != "dot_edge_tail":
        return nodes
    return (nodes[0], *(pad_kv(t, nodes[0].size(-1)) for t in nodes[1:]))


def _qkve(ns, nd, E, H, C, dtype=F64):
    return EDGE_SCORES["dot_edge"].make(ns, nd, E, H, C, dtype)


@pytest.mark.parametrize("score", list(EDGE_SCORES))
@pytest.mark.parametrize("graph", list(OP_GRAPHS))
@pytest.mark.parametrize("H,C", [(1, 16), (3, 5)])
def test_op_matches_the_hand_formula(score, graph, H, C):
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    *nodes, e = leaves = sc.make(ns, nd, ei.size(1), H, C)
    out, alpha = sc.call(lay, nodes, e, return_attention=True)
    want, want_alpha = sc.hand(ei, nd, *nodes, e, sc.param)
    assert out.dtype == F64 and alpha.shape == (ei.size(1), H)
    assert rel_err(out, want) < 1e-12 and rel_err(alpha, want_alpha) < 1e-12
    g = torch.randn_like(want)
    got = torch.autograd.grad(out, leaves, g)
    exp = torch.autograd.grad(want, leaves, g)
    for name, a, b in zip(sc.names + ("e",), got, exp):
        assert rel_err_floor(a, b, 1e-8) < 1e-10, name
    if ei.size(1):
        # the edge inputs matter (the tails' keys and values padded to q's channels)
        assert rel_err(sc.call(lay, base_nodes(score, nodes), None), want) > 1e-3


@pytest.mark.parametrize("score", list(EDGE_SCORES))
def test_op_gradcheck(score):
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS["unsorted_duplicates_isolated"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    leaves = sc.make(ns, nd, ei.size(1), 2, 3)
    assert torch.autograd.gradcheck(lambda *t: sc.call(lay, t[:3], t[3]), leaves)


def test_op_default_scale():
    ei, ns, nd = OP_GRAPHS["unsorted_duplicates_isolated"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    q, k, v, e = _qkve(ns, nd, ei.size(1), 2, 3)
    want = hand_formula(ei, nd, q, k, v, e, 1 / math.sqrt(3))[0]
    assert rel_err(ops.gt_attention(lay, q, k, v, edge=e), want) < 1e-12


@pytest.mark.parametrize("score", list(EDGE_SCORES))
def test_csr_order_input_is_the_gathered_input_order(score):
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS["unsorted_duplicates_isolated"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    assert lay._edge_perm is not None  # unsorted: a real gather
    *nodes, e = sc.make(ns, nd, ei.size(1), 2, 4)
    e_csr = lay.to_csr_order(e)
    assert torch.equal(e_csr, e[lay.edge_perm])
    assert torch.equal(lay.to_input_order(e_csr), e)
    a = sc.call(lay, nodes, e)
    b = sc.call(lay, nodes, e_csr, edge_order="csr")
    assert torch.equal(a, b)
    # the gradient of the CSR rows comes back to e in its own order
    g = torch.randn_like(a)
    ge, = torch.autograd.grad(a, e, g)
    want, = torch.autograd.grad(sc.hand(ei, nd, *nodes, e, sc.param)[0], e, g)
    assert rel_err(ge, want) < 1e-10


def test_grouped_edges_skip_the_gather():
    ei, ns, nd = OP_GRAPHS["grouped_by_destination"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    assert lay._edge_perm is None
    e = torch.randn(ei.size(1), 2, 4)
    assert lay.to_csr_order(e) is e


@pytest.mark.parametrize("score", list(EDGE_SCORES))
def test_reference_in_half_precision_sums_in_float32(score):
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS["super_node"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    *nodes, e = (t.detach() for t in sc.make(ns, nd, ei.size(1), 2, 8))
    want = sc.call(lay, nodes, e)
    for dtype in (torch.float16, torch.bfloat16):
        half = [t.to(dtype) for t in nodes]
        got = sc.call(lay, half, e.to(dtype))
        assert got.dtype == dtype and rel_err(got, want) < 1e-2
        # without: another function
        assert rel_err(sc.call(lay, base_nodes(score, half), None), want) > 1e-2


@pytest.mark.parametrize("score", list(EDGE_SCORES))
def test_dropout_masks_the_csr_positions_with_torchs_generator(score):
    """On the CPU the mask is F.dropout's over the [E, H] weights in CSR order,
    drawn from torch's generator: seeded alike, the reference with the edge
    inputs in CSR order gives the same output, and the backward goes through that
    mask."""
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS["unsorted_duplicates_isolated"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    *nodes, e = leaves = sc.make(ns, nd, ei.size(1), 2, 4)
    torch.manual_seed(5)
    out = sc.call(lay, nodes, e, dropout=0.4, training=True)
    torch.manual_seed(5)
    want = sc.reference(lay, nodes, lay.to_csr_order(e), 0.4, True)
    assert torch.equal(out, want)
    assert rel_err(out, sc.call(lay, nodes, e)) > 1e-2  # it dropped
    assert torch.equal(sc.call(lay, nodes, e, dropout=0.4, training=False),
                       sc.call(lay, nodes, e))
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(want, leaves, g)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("score", list(EDGE_SCORES))
def test_fused_attention_entry_and_records(score):
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS["bipartite"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    *nodes, e = sc.make(ns, nd, ei.size(1), 2, 4)
    kwargs = dict(zip(sc.names, nodes), **{sc.param_name: 0.3})
    with ops.recording() as records:
        got = ops.fused_attention(lay, score, edge=e, **kwargs)
        sc.call(lay, base_nodes(score, nodes), None)
    assert torch.equal(got, sc.op(lay, edge=e, **kwargs))
    assert [r.score for r in records] == [score, sc.base]
    with pytest.raises(TypeError):
        ops.fused_attention(lay, score, **kwargs)  # the edge inputs are required


def _bad_case(score, case):
    """``(layout, nodes, edge, kwargs)`` of an op call with ``case`` wrong."""
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS["unsorted_duplicates_isolated"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    E = ei.size(1)
    *nodes, e = (t.detach() for t in sc.make(ns, nd, E, 2, 4, torch.float32))
    kw, csr = {}, dict(edge_order="csr")
    if case == "rows":
        e = torch.randn(sc.edge_shape(E - 1, 2, 4))
    elif case == "rows_csr":
        e, kw = torch.randn(sc.edge_shape(E + 1, 2, 4)), csr
    elif case == "heads":
        e = torch.randn(sc.edge_shape(E, 3, 4))
    elif case == "channels_csr":  # dot_edge: one channel too many; additive_edge: [E, H, C]
        e, kw = torch.randn(E, 2, 5), csr
    elif case == "two_dims":  # dot_edge: [E, H * C]; additive_edge: [E, 8], too many heads
        e, kw = torch.randn(E, 8), csr
    elif case == "dtype":
        e = e.double()
    elif case == "device":
        e = torch.empty(sc.edge_shape(E, 2, 4), device="meta")
    elif case == "device_csr":
        e, kw = torch.empty(sc.edge_shape(E, 2, 4), device="meta"), csr
    elif case == "order":
        kw = dict(edge_order="coo")
    elif case == "pmf":
        kw = dict(strategy="pmf")
    elif case == "self_loops":
        lay = GraphLayout.from_edge_index(ei, (ns, nd), add_self_loops=True)
        e = torch.randn(sc.edge_shape(lay.num_edges, 2, 4))
    elif case == "dropout":
        kw = dict(dropout=1.0)
    return lay, nodes, e, kw


@pytest.mark.parametrize("score", list(EDGE_SCORES))
@pytest.mark.parametrize("case,msg", [
    ("rows", "one row per edge"), ("rows_csr", "shape"), ("heads", "shape"),
    ("channels_csr", "shape"), ("two_dims", "shape"), ("dtype", "dtype"),
    ("device", "meta"), ("device_csr", "meta"), ("order", "edge_order"),
    ("pmf", "no PMF path"), ("self_loops", "self-loops"), ("dropout", "dropout"),
])
def test_bad_inputs_raise_value_error(score, case, msg):
    """Clear errors; "shape": the score's message naming the edge input's shape
    (for "heads" too: the row count is right, and the check after the gather
    names the shape)."""
    if case == "pmf" and EDGE_SCORES[score].pmf:
        pytest.skip(f"the {score} score has a PMF path")
    if case == "heads" and score == "dot_edge_tail":
        pytest.skip("tails [E, D] serve every head: no head count to get wrong")
    lay, nodes, e, kw = _bad_case(score, case)
    if case == "channels_csr" and score == "dot_edge_tail":
        # [E, H, C] rows select the dot_edge score, whose keys have q's channels
        msg = r"k and v must be \[N_src, H, C\]"
    with pytest.raises(ValueError, match=EDGE_SCORES[score].shape_msg if msg == "shape" else msg):
        EDGE_SCORES[score].call(lay, nodes, e, **kw)


def test_plan_of_the_dot_edge_score():
    """The plan runs what the score's kernels have: SMMF, CUDA cores, the
    two-launch backward, whose CSR walk writes the edge rows' gradient."""
    big = GraphLayout.from_edge_index(
        torch.stack([torch.randint(0, 1 << 15, (1 << 18,)),
                     torch.arange(1 << 15).repeat_interleave(8)]), (1 << 15, 1 << 15))
    small = GraphLayout.from_edge_index(random_graph(300, num_edges=3000), (300, 300))
    p = plan.plan_for(big, torch.float32, 32, score="dot_edge")
    assert p.method == "smmf" and not p.two_rows  # the dot score runs two rows here
    assert plan.plan_for(big, torch.float32, 32).two_rows
    with plan.override(chunk=4096):
        p = plan.plan_for(small, torch.bfloat16, 64, score="dot_edge")
        assert not p.mma and p.dense_cells == 0 and not p.mma_backward
        assert plan.plan_for(small, torch.bfloat16, 64).mma
    p = plan.plan_for(small, torch.float32, 64, score="dot_edge")
    assert not p.bwd_one_launch  # under 2^16 edges, where the dot score runs one launch
    assert [k for k, _ in p.kernels()] == ["dot_edge:smmf"]
    bwd = p.kernels(backward=True)
    assert [k for k, _ in bwd] == ["dot_edge:dq_walk", "dot_edge:dkv_walk"]
    assert "edge rows' gradients" in bwd[0][1]
    with pytest.raises(ValueError, match="no PMF path"):
        plan.plan_for(small, torch.float32, 64, score="dot_edge", strategy="pmf")
    with pytest.raises(ValueError, match="no PMF path"):
        plan.choose_strategy(10, "dot_edge", 4, "pmf")
    assert plan.choose_strategy(10 ** 7, "dot_edge", 4, capacity=16, rule="paper") == "smmf"
    for field in (dict(bwd_launches=1), dict(mma=True), dict(two_rows=True)):
        with plan.override(**field), pytest.raises(ValueError):
            plan.plan_for(small, torch.bfloat16 if "mma" in field else torch.float32, 64,
                          score="dot_edge")


# ---------------------------------------------------------------- the compiled entry op
@pytest.mark.parametrize("score", list(EDGE_SCORES))
def test_compiled_op_matches_reference_gradchecks_and_keeps_the_mask(score):
    sc = EDGE_SCORES[score]
    ei, ns, nd = OP_GRAPHS["bipartite"]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    *nodes, e = sc.make(ns, nd, ei.size(1), 2, 3)
    e_csr = lay.to_csr_order(e.detach()).requires_grad_()
    inputs = tuple(nodes[i] for i in sc.kernel_order) + (e_csr,)
    op = getattr(torch.ops.pyg_dfgnn, f"{score}_attention")

    def call(*t, dropout=0.0):
        return op(*t, lay.handle, sc.param, dropout, "auto")

    out, token = call(*inputs)
    assert token.tolist()[1] == int(lay.handle[0])
    assert rel_err(out, sc.call(lay, nodes, e_csr, edge_order="csr")) < 1e-12
    assert torch.autograd.gradcheck(lambda *t: call(*t)[0], inputs)
    # dropout: a generator seeded from the token's seed, forward and backward
    out, token = call(*inputs, dropout=0.3)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(token.tolist()[0])
        want = sc.reference(lay, nodes, e_csr, 0.3, True)
    assert rel_err(out, want) < 1e-12
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(want, inputs, g)):
        assert rel_err(a, b) < 1e-10
    inputs32 = [t.detach().float().requires_grad_() for t in inputs]
    torch.library.opcheck(op, (*inputs32, lay.handle, sc.param, 0.0, "auto"))
    with pytest.raises(ValueError, match=sc.shape_msg):
        call(*inputs[:3], e_csr[1:])


# ----------------------------------------------------------------------------- the layer
ADJ = ["coo", "edge_index", "csr", "sparse_coo", "sparse_tensor"]


def _adjacency(kind: str, ei: Tensor, ns: int, nd: int, ea: Tensor, from_values: bool):
    """``(adj, edge_attr)``: ``kind`` holding the graph, the edge features either
    as the matrix's values (``edge_attr`` then ``None``) or as ``edge_attr`` in
    the adjacency's edge order (a sparse matrix's own order, duplicates merged
    where ``torch.sparse`` merges them)."""
    if kind == "coo":
        return ei.clone(), ea
    if kind == "edge_index":
        return EdgeIndex(ei.clone(), sparse_size=(ns, nd)), ea
    if kind == "sparse_tensor":
        torch_sparse = pytest.importorskip("torch_sparse")
        if from_values:
            return torch_sparse.SparseTensor(row=ei[1], col=ei[0], value=ea,
                                             sparse_sizes=(nd, ns)), None
        adj = torch_sparse.SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(nd, ns))
        return adj, ea[:adj.nnz()]
    to = to_torch_csr_tensor if kind == "csr" else to_torch_coo_tensor
    if from_values:
        return to(ei.flip(0), ea, size=(nd, ns)), None
    adj = to(ei.flip(0), size=(nd, ns))
    return adj, ea[:adj._nnz()]


def _run(layer, x, ei, ns, nd, ea, kind, from_values, call):
    """Output, attention weights and the gradients of ``(out * w).sum()`` (leaves:
    node features, the edge features, then parameters by name) of one layer on
    fresh leaves, with its own adjacency object built from them. ``x``: a
    tensor, or a pair whose destination features may be ``None``; ``call``: the
    layer's keyword arguments."""
    pair = isinstance(x, tuple)
    xs = [t.detach().clone().requires_grad_() for t in (x if pair else (x,)) if t is not None]
    ea_leaf = ea.detach().clone().requires_grad_()
    adj, edge_attr = _adjacency(kind, ei, ns, nd, ea_leaf, from_values)
    inp = (tuple(xs) if len(xs) == 2 else (xs[0], None)) if pair else xs[0]
    res = layer(inp, adj, edge_attr, **call)
    out, alpha = (res[0], res[1]) if "return_attention_weights" in call else (res, None)
    if alpha is not None and not isinstance(alpha, tuple):  # a SparseTensor
        alpha = alpha.storage.value()
    elif alpha is not None:
        alpha = alpha[1]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(11), dtype=F64)
    params = dict(layer.named_parameters())
    leaves = xs + [ea_leaf] + list(params.values())
    grads = torch.autograd.grad((out * w).sum(), leaves, allow_unused=True)
    names = [f"x[{i}]" for i in range(len(xs))] + ["edge_attr"] + list(params)
    return out, alpha, dict(zip(names, grads))


def _compare(native, fused, x, ei, ns, nd, ea, kind="coo", from_values=False, call=None,
             score="dot_edge"):
    """The fused layer against PyG's on the same inputs (:func:`_run`): it ran the
    fused op with ``score``, and its outputs, weights and gradients match in
    float64."""
    call = call or {}
    if score == "dot_edge" and isinstance(fused, FusedTransformerConv) and ea is not None:
        score = _transformer_edge_score(fused, ea.size(-1))
    with ops.recording() as records:
        got = _run(fused, x, ei, ns, nd, ea, kind, from_values, call)
    assert [r.score for r in records] == [score], "the layer did not run the fused op"
    want = _run(native, x, ei, ns, nd, ea, kind, from_values, call)
    assert rel_err(got[0], want[0]) < 1e-12
    if "return_attention_weights" in call:
        assert rel_err(got[1], want[1]) < 1e-12
    assert got[2].keys() == want[2].keys()
    # Gradients that are 0 in exact arithmetic (the key bias's: the softmax is
    # shift-invariant per row; GAT's att_dst's nearly) hold float64 rounding
    # noise on both sides.
    floor = layer_grad_floor(want[2].values(), 1e-6, 1e-6)
    for name, b in want[2].items():
        a = got[2][name]
        assert (a is None) == (b is None), name
        if b is not None:
            assert rel_err_floor(a, b, floor) < 1e-8, name
    return got, want


def _transformer_edge_score(layer, edge_dim: int) -> str:
    """The score a FusedTransformerConv runs with ``edge_dim`` features on the
    CPU: tails where they move fewer bytes, else [E, H, C] rows."""
    from pyg_dfgnn.ops.scores.dot_edge_tail import tails_pay
    tails = layer.edge_tails and tails_pay(layer.heads, layer.out_channels, edge_dim)
    return "dot_edge_tail" if tails else "dot_edge"


def test_tails_pay_where_the_features_are_narrow():
    from pyg_dfgnn.ops.scores.dot_edge_tail import tails_pay
    assert tails_pay(1, 128, 16) and tails_pay(4, 32, 16) and tails_pay(4, 5, 3)
    assert tails_pay(8, 16, 16) and tails_pay(1, 5, 3)
    # 2 H D + 3 D against 5 H C elements per edge: equal bytes do not pay
    assert not tails_pay(4, 32, 128) and not tails_pay(1, 8, 8) and not tails_pay(1, 4, 4)


def test_tails_with_keys_of_q_channels_raise():
    """Keys and values of q's C channels beside [E, D] tails: the op names the
    C - D channels it wants (ValueError, as PyG raises for bad shapes)."""
    lay = GraphLayout.from_edge_index(random_graph(30, num_edges=90), (30, 30))
    q, k = torch.randn(30, 2, 12), torch.randn(30, 2, 12)
    a = torch.randn(lay.num_edges, 4)
    with pytest.raises(ValueError, match=r"k and v must be \[N_src, H, C - D\] = "
                                         r"\[N_src, 2, 8\]"):
        ops.gt_attention(lay, q, k, k, edge=a)


def test_padded_edge_dim_starts_the_tails_on_a_vector():
    """On CUDA the tails are padded to whole 16-byte vectors where the rows are
    read so (fp32: 4 channels, half: 8), left as they are where the kernels read
    scalars, one channel wider where C + D would be whole vectors after C that is
    not (the op would refuse them), and refused where no kernel takes rows of
    C + D' channels."""
    from pyg_dfgnn.nn._edge_tails import padded_edge_dim
    from pyg_dfgnn.ops import plan
    from pyg_dfgnn.ops.scores.dot_edge_tail import tails_fit_rows
    f32, b16 = torch.float32, torch.bfloat16
    assert padded_edge_dim(12, 3, f32) == 4 and padded_edge_dim(128, 16, f32) == 16
    assert padded_edge_dim(32, 3, b16) == 8 and padded_edge_dim(5, 2, f32) == 2
    # 5 + 3 and 3 + 1 fp32 channels are whole vectors: the GPU fuzzer's failures
    assert padded_edge_dim(5, 3, f32) == 4 and padded_edge_dim(3, 1, f32) == 2
    assert padded_edge_dim(plan.MAX_SCALAR_C + 1, 1, torch.float16) is None
    for dtype in (f32, b16):
        vec = 16 // dtype.itemsize
        for C in range(1, 41):
            for D in range(1, 17):
                width = padded_edge_dim(C, D, dtype)
                if width is not None:
                    assert D <= width < D + vec and tails_fit_rows(C + width, width,
                                                                   dtype.itemsize), (C, D)


def _pair(*args, cls=FusedTransformerConv, **kwargs):
    """``(native, fused)`` float64 layers of the fused class ``cls`` and its PyG
    class, with the same parameters."""
    native = cls.__bases__[0](*args, **kwargs).double()
    with torch.no_grad():  # no zero biases: a wrong bias would show
        for p in native.parameters():
            p.add_(0.3 * torch.randn_like(p))
    fused = cls(*args, **kwargs).double()
    fused.load_state_dict(native.state_dict())
    return native, fused


def _features(ns, nd, f_src, f_dst, D, E, bipartite=False):
    x = torch.randn(ns, f_src, dtype=F64)
    if bipartite:
        x = (x, torch.randn(nd, f_dst, dtype=F64))
    return x, torch.randn(E, D, dtype=F64)


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("edge_dim", [16, 3])
def test_layer_matches_pyg(heads, concat, edge_dim):
    ei = random_graph(20, num_edges=80, num_isolated=3, num_duplicates=7)
    native, fused = _pair(8, 5, heads=heads, concat=concat, edge_dim=edge_dim)
    x, ea = _features(20, 20, 8, None, edge_dim, ei.size(1))
    _compare(native, fused, x, ei, 20, 20, ea)


@pytest.mark.parametrize("kwargs", [dict(beta=True), dict(root_weight=False),
                                    dict(beta=True, concat=False, bias=False),
                                    dict(dropout=0.3), dict(edge_dim=1)])
def test_layer_options_match_pyg(kwargs):
    ei = random_graph(20, num_edges=80, num_isolated=2, num_duplicates=5)
    kwargs = {"heads": 2, "edge_dim": 16, **kwargs}
    native, fused = _pair(8, 4, **kwargs)
    if kwargs.get("dropout"):
        native.eval()
        fused.eval()
    x, ea = _features(20, 20, 8, None, kwargs["edge_dim"], ei.size(1))
    _compare(native, fused, x, ei, 20, 20, ea)


@pytest.mark.parametrize("kind", ["coo", "edge_index", "csr"])
@pytest.mark.parametrize("concat", [True, False])
def test_layer_bipartite_matches_pyg(kind, concat):
    ns, nd = 14, 9
    ei = random_graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=4)
    native, fused = _pair((6, 7), 4, heads=3, concat=concat, edge_dim=16)
    x, ea = _features(ns, nd, 6, 7, 16, ei.size(1), bipartite=True)
    _compare(native, fused, x, ei, ns, nd, ea, kind)


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_tensor"])
@pytest.mark.parametrize("from_values", [False, True])
@pytest.mark.parametrize("edge_dim", [16, 3])
def test_layer_bipartite_sparse_adjacency_matches_pyg(kind, from_values, edge_dim):
    """A bipartite ``adj_t`` (``torch.sparse`` COO or ``SparseTensor`` of
    ``[N_dst, N_src]``, fewer destinations than sources) with the edge features
    as ``edge_attr`` in its order or as its values, as PyG's ``propagate`` takes
    them; [E, H, C] rows (16 features) and tails (3): outputs, attention weights
    (PyG's ``SparseTensor`` / ``(adj, alpha)``) and gradients."""
    ns, nd = 14, 9
    ei = random_graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=4)
    native, fused = _pair((6, 7), 8, heads=2, edge_dim=edge_dim)
    assert _transformer_edge_score(fused, edge_dim) == ("dot_edge_tail" if edge_dim == 3
                                                        else "dot_edge")
    x, ea = _features(ns, nd, 6, 7, edge_dim, ei.size(1), bipartite=True)
    _compare(native, fused, x, ei, ns, nd, ea, kind, from_values,
             call={"return_attention_weights": True})


def test_layer_super_node_and_grouped_edges():
    n = 40
    hub = torch.stack([torch.randint(0, n, (300,)), torch.full((300,), 7)])
    ei = torch.cat([random_graph(n, num_edges=100), hub], 1)
    ei = ei[:, torch.randperm(ei.size(1))]
    for edges in (ei, _grouped(ei)):
        native, fused = _pair(8, 4, heads=2, edge_dim=16)
        x, ea = _features(n, n, 8, None, 16, edges.size(1))
        _compare(native, fused, x, edges, n, n, ea)


@pytest.mark.parametrize("kind", ADJ)
@pytest.mark.parametrize("from_values", [False, True])
@pytest.mark.parametrize("weights", [None, True, False])
def test_layer_adjacency_types_match_pyg(kind, from_values, weights):
    """Edge features as ``edge_attr`` in the adjacency's order, or (no
    ``edge_attr``) as a ``SparseTensor``'s / ``torch.sparse`` matrix's values,
    as PyG's ``propagate`` takes them; attention weights as PyG returns them."""
    if from_values and kind in ("coo", "edge_index"):
        pytest.skip("a [2, E] edge_index has no values")
    ns = nd = 18
    ei = random_graph(ns, num_edges=70, num_isolated=2, num_duplicates=6)
    native, fused = _pair(8, 4, heads=2, edge_dim=16)
    x, ea = _features(ns, nd, 8, None, 16, ei.size(1))
    call = {} if weights is None else {"return_attention_weights": weights}
    _compare(native, fused, x, ei, ns, nd, ea, kind, from_values, call)


def test_layer_attention_weights_in_input_order():
    ei = random_graph(20, num_edges=60, num_duplicates=5)
    native, fused = _pair(8, 4, heads=3, edge_dim=16)
    x, ea = _features(20, 20, 8, None, 16, ei.size(1))
    out, (ei_f, alpha) = fused(x, ei, ea, return_attention_weights=True)
    _, (ei_n, alpha_n) = native(x, ei, ea, return_attention_weights=True)
    assert ei_f is ei and alpha.shape == (ei.size(1), 3)
    assert rel_err(alpha, alpha_n) < 1e-12
    # the weights of each destination's in-edges sum to one, in the caller's order
    sums = torch.zeros(20, 3, dtype=F64).index_add(0, ei[1], alpha.detach())
    has_in = torch.bincount(ei[1], minlength=20) > 0
    assert torch.allclose(sums[has_in], torch.ones_like(sums[has_in]))


def test_layer_pmf_strategy_runs_smmf_with_edge_features():
    ei = random_graph(20, num_edges=60)
    native, fused = _pair(8, 4, heads=2, edge_dim=16)
    fused.strategy = "pmf"
    x, ea = _features(20, 20, 8, None, 16, ei.size(1))
    _compare(native, fused, x, ei, 20, 20, ea)


@pytest.mark.parametrize("fused_cls", [FusedTransformerConv, FusedGATConv, FusedGATv2Conv])
def test_layer_lazy_weights_drawn_in_pygs_order(fused_cls):
    """in_channels=-1 and edge_dim=-1: the first call draws each lazy weight in
    PyG's order (TransformerConv: lin_edge after the query, key and value and
    before the skip, as PyG's message does; GATConv and GATv2Conv: lin_edge in
    edge_update, after the node projections)."""
    ei = random_graph(20, num_edges=60)
    x, ea = torch.randn(20, 8), torch.randn(ei.size(1), 6)
    outs = []
    for cls in (fused_cls.__bases__[0], fused_cls):
        torch.manual_seed(3)
        conv = cls(-1, 4, heads=2, edge_dim=-1)
        torch.manual_seed(4)
        outs.append((conv(x, ei, ea), conv.state_dict()))
    (a, sa), (b, sb) = outs
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert rel_err(b, a) < 1e-5


def test_hooked_lin_edge_sees_the_rows_in_pygs_order():
    ei = random_graph(20, num_edges=60)
    native, fused = _pair(8, 4, heads=2, edge_dim=16)
    seen = {}
    for name, layer in (("native", native), ("fused", fused)):
        layer.lin_edge.register_forward_hook(
            lambda mod, inp, out, name=name: seen.__setitem__(name, inp[0].detach()))
    x, ea = _features(20, 20, 8, None, 16, ei.size(1))
    _compare(native, fused, x, ei, 20, 20, ea)
    assert torch.equal(seen["fused"], seen["native"])


@pytest.mark.parametrize("cls", [FusedTransformerConv, FusedGATConv, FusedGATv2Conv])
def test_layer_training_dropout_is_seeded_and_differentiable(cls):
    ei = random_graph(30, num_edges=200)
    fused = cls(8, 4, heads=2, dropout=0.5, edge_dim=16).train()
    x, ea = torch.randn(30, 8), torch.randn(ei.size(1), 16, requires_grad=True)
    torch.manual_seed(1)
    a = fused(x, ei, ea)
    torch.manual_seed(1)
    b = fused(x, ei, ea)
    c = fused(x, ei, ea)
    assert torch.equal(a, b) and rel_err(a, c) > 1e-3
    assert rel_err(a, fused.eval()(x, ei, ea)) > 1e-3
    a.sum().backward()
    assert ea.grad is not None and torch.isfinite(ea.grad).all() and ea.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- fallbacks
def _no_fused_call(layer, *args, **kwargs):
    with ops.recording() as records:
        res = layer(*args, **kwargs)
    assert records == [], "the call ran the fused op"
    return res


def assert_runs_pygs_forward(native, fused, *args, **kwargs):
    """``fused(*args, **kwargs)`` runs no fused op and gives ``native``'s output,
    or raises where it raises, the same type."""
    try:
        want = native(*args, **kwargs)
    except Exception as exc:  # PyG raises: so does the fused layer, the same way
        with pytest.raises(type(exc)):
            _no_fused_call(fused, *args, **kwargs)
        return
    got = _no_fused_call(fused, *args, **kwargs)
    if isinstance(want, tuple):
        got, want = got[0], want[0]
    assert rel_err(got, want) < 1e-12


def test_edge_features_without_edge_dim_run_pygs_forward():
    """PyG adds edge features that no lin_edge projects to the values only."""
    ei = random_graph(20, num_edges=60)
    native, fused = _pair(8, 4, heads=2)
    x = torch.randn(20, 8, dtype=F64)
    ea = torch.randn(ei.size(1), 1, 4, dtype=F64)  # broadcast over the heads
    assert "without edge_dim" in fused.fallback_reason(x, ei, ea)
    got = _no_fused_call(fused, x, ei, ea)
    assert rel_err(got, native(x, ei, ea)) < 1e-12
    assert rel_err(got, native(x, ei)) > 1e-3
    # A SparseTensor's values with a feature dimension reach PyG's message as
    # edge features too; plain edge weights (1-D) do not, and run fused.
    torch_sparse = pytest.importorskip("torch_sparse")

    def adj(value):
        return torch_sparse.SparseTensor(row=ei[1], col=ei[0], value=value,
                                         sparse_sizes=(20, 20))
    a = adj(ea)
    assert "without edge_dim" in fused.fallback_reason(x, a)
    assert rel_err(_no_fused_call(fused, x, a), native(x, a)) < 1e-12
    weighted = adj(torch.rand(ei.size(1), dtype=F64))
    assert fused.fallback_reason(x, weighted) == ""
    assert rel_err(fused(x, weighted), native(x, weighted)) < 1e-12


def test_edge_dim_without_features_or_wrong_rows_run_pygs_forward():
    ei = random_graph(20, num_edges=60)
    native, fused = _pair(8, 4, heads=2, edge_dim=16)
    x = torch.randn(20, 8, dtype=F64)
    assert "no edge features" in fused.fallback_reason(x, ei)
    for ea in (None, torch.randn(ei.size(1) - 1, 16, dtype=F64),
               torch.randn(ei.size(1), 2, 16, dtype=F64)):
        if ea is not None:
            assert "not [E, edge_dim]" in fused.fallback_reason(x, ei, ea)
        assert_runs_pygs_forward(native, fused, x, ei, ea)


def test_fuse_reports_every_layer_with_edge_dim_fused():
    """TransformerConv, GATConv and GATv2Conv fuse their edge features."""
    model = torch.nn.ModuleDict({"gt": TransformerConv(16, 8, edge_dim=4),
                                 "gat": GATConv(16, 8, edge_dim=4),
                                 "gatv2": GATv2Conv(16, 8, edge_dim=4)})
    report = fuse(model)
    assert [(r.name, r.fused, r.reason) for r in report] == [
        ("gt", True, ""), ("gat", True, ""), ("gatv2", True, "")]


@pytest.mark.parametrize("gt_score", ["dot_edge", "dot_edge_tail"])
def test_fuse_swapped_edge_layers_match_pyg(gt_score):
    """fuse() on a deep copy of a PyG model of TransformerConv, GATConv and
    GATv2Conv with edge_dim: each swapped layer (no __init__ runs: the class
    defaults of edge_tails and fused_projection) runs its edge score, and the
    model's output and the gradients of the node features, the edge features
    and every parameter match the untouched PyG model in float64."""
    C, D = (4, 16) if gt_score == "dot_edge" else (12, 3)
    model = torch.nn.ModuleDict({
        "gt": TransformerConv(8, C, heads=2, edge_dim=D),
        "gat": GATConv(2 * C, 4, heads=2, edge_dim=D),
        "gatv2": GATv2Conv(8, 3, heads=2, edge_dim=D, concat=False),
    }).double()
    with torch.no_grad():  # no zero biases: a wrong bias would show
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    swapped = copy.deepcopy(model)
    report = fuse(swapped)
    assert [(r.name, r.fused, r.reason) for r in report] == [
        ("gt", True, ""), ("gat", True, ""), ("gatv2", True, "")]
    assert [type(m) for m in swapped.values()] == [FusedTransformerConv, FusedGATConv,
                                                   FusedGATv2Conv]
    assert [type(m) for m in model.values()] == [TransformerConv, GATConv, GATv2Conv]
    assert _transformer_edge_score(swapped["gt"], D) == gt_score

    ei = random_graph(20, num_edges=80, num_isolated=2, num_duplicates=6)
    x0, ea0 = _features(20, 20, 8, None, D, ei.size(1))

    def run(m):
        x, ea = x0.clone().requires_grad_(), ea0.clone().requires_grad_()
        h = m["gt"](x, ei, ea).tanh()
        h = m["gat"](h, ei, ea).tanh()
        out = m["gatv2"](h, ei, ea)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(11), dtype=F64)
        params = dict(m.named_parameters())
        grads = torch.autograd.grad((out * w).sum(), [x, ea] + list(params.values()))
        return out, dict(zip(["x", "edge_attr"] + list(params), grads))

    with ops.recording() as records:
        got = run(swapped)
    assert [r.score for r in records] == [gt_score, "additive_edge", "gatv2_edge"]
    with ops.recording() as records:
        want = run(model)
    assert records == []
    assert rel_err(got[0], want[0]) < 1e-12
    assert got[1].keys() == want[1].keys()
    floor = layer_grad_floor(want[1].values(), 1e-6, 1e-6)
    for name, b in want[1].items():
        assert rel_err_floor(got[1][name], b, floor) < 1e-8, name


@pytest.mark.parametrize("cls,score,C,D", [(FusedTransformerConv, "dot_edge", 4, 16),
                                           (FusedTransformerConv, "dot_edge_tail", 12, 3),
                                           (FusedGATConv, "additive_edge", 4, 16),
                                           (FusedGATv2Conv, "gatv2_edge", 4, 16)])
def test_explain_names_the_edge_score(cls, score, C, D):
    """The op's rows: with tails, C + D channels per head (the tails' D last),
    and the score's per-edge input with its shape: the tails ``[E, D]``, the
    rows ``[E, H, C]``, GAT's terms ``[E, H]``."""
    ei = random_graph(20, num_edges=60)
    conv = cls(8, C, heads=2, edge_dim=D)
    report = pyg_dfgnn.explain(conv, torch.randn(20, 8), ei, torch.randn(ei.size(1), D))
    assert report.fused and [op.score for op in report.ops] == [score]
    width = C + D if score == "dot_edge_tail" else C
    assert f"{score} attention, 2 x {width} channels" in str(report)
    # the GAT layers replace the graph's self-loops by one per node
    E = ei.size(1) if cls is FusedTransformerConv else int((ei[0] != ei[1]).sum()) + 20
    shape = {"dot_edge_tail": (E, D), "additive_edge": (E, 2)}.get(score, (E, 2, C))
    [(name, got)] = report.ops[0].edge_inputs
    assert got == shape
    assert f"per-edge inputs: {name} [{', '.join(map(str, shape))}]" in str(report)


def test_torchscript_compiles_pygs_forward_in_its_place():
    ei = random_graph(20, num_edges=60)
    native, fused = _pair(8, 4, heads=2, edge_dim=16)
    x, ea = _features(20, 20, 8, None, 16, ei.size(1))
    scripted = torch.jit.script(fused)
    want = fused(x, ei, ea)
    forward = getattr(scripted, "forward", None) or getattr(scripted, "forward__0")
    assert rel_err(forward(x, ei, ea), want) < 1e-12


# ----------------------------------------------------------------------------- compile
class EdgeModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = FusedTransformerConv(8, 4, heads=2, edge_dim=6)
        self.conv2 = FusedTransformerConv(8, 4, heads=2, edge_dim=6, concat=False)

    def forward(self, x, edge_index, edge_attr):
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


def _recording_backend(targets: set):
    inner = torch._dynamo.lookup_backend("aot_eager")

    def compile_fn(gm, example_inputs):
        targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return inner(gm, example_inputs)
    return compile_fn


def compiled_steps(model, steps: int = 5, num_self_loops: int = 0):
    r"""``model`` (edge features: ``[E, 6]``) compiled with ``dynamic=True`` and
    eager over a new graph each step: outputs and gradients (node and edge
    features, every parameter) match. Returns ``(compiled graphs after each
    step, the ops the compiled graphs call)``."""
    torch._dynamo.reset()
    counters.clear()
    eager = copy.deepcopy(model)
    targets = set()
    compiled = torch.compile(model, dynamic=True, backend=_recording_backend(targets))
    seen = []
    for i in range(steps):
        n = 20 + 7 * i
        ei = random_graph(n, num_edges=60 + 23 * i, num_self_loops=num_self_loops)
        x, ea = torch.randn(n, 8), torch.randn(ei.size(1), 6)
        outs = []
        for m in (compiled, eager):
            m.zero_grad()
            ea_leaf = ea.clone().requires_grad_()
            out = m(x, ei.clone(), ea_leaf)
            out.sum().backward()
            outs.append((out.detach(), ea_leaf.grad, [p.grad.clone() for p in m.parameters()
                                                      if p.grad is not None]))
        (a, ga, pa), (b, gb, pb) = outs
        assert rel_err(a, b) < 1e-5 and rel_err(ga, gb) < 1e-4 and len(pa) == len(pb)
        floor = layer_grad_floor(pb)
        assert all(rel_err_floor(u, w, floor) < 1e-4 for u, w in zip(pa, pb))
        seen.append(counters["stats"]["unique_graphs"])
    return seen, targets


def test_compiled_layer_with_edge_features_new_graph_each_step():
    """A new graph each step: the edge rows enter the compiled entry op
    pyg_dfgnn::dot_edge_attention, outputs and gradients match the eager layer,
    and no graph is compiled per batch."""
    seen, targets = compiled_steps(EdgeModel())
    assert seen[1] == seen[-1], seen
    assert "pyg_dfgnn.dot_edge_attention.default" in targets


@pytest.mark.parametrize("case", ["plain", "beta", "no_root_no_concat", "weights", "bipartite",
                                  "csr", "sparse_coo_values", "super_node"])
def test_layer_with_tails_matches_pyg(case):
    """Narrow features run as tails (the dot_edge_tail score, no [E, H, C]
    tensor) and match PyG in float64 with the layer's options."""
    kwargs = dict(heads=2, edge_dim=3, beta=case == "beta",
                  root_weight=case != "no_root_no_concat", concat=case != "no_root_no_concat")
    ns = nd = 20
    ei = random_graph(20, num_edges=90, num_isolated=2, num_duplicates=6)
    if case == "super_node":
        ei = torch.cat([ei, torch.stack([torch.randint(0, 20, (120,)), torch.full((120,), 3)])], 1)
    f_src = (6, 7) if case == "bipartite" else 6
    if case == "bipartite":
        ns, nd = 14, 9
        ei = random_graph(ns, nd, num_edges=50, num_isolated=2, num_duplicates=4)
    native, fused = _pair(f_src, 12, **kwargs)
    assert _transformer_edge_score(fused, 3) == "dot_edge_tail"
    x, ea = _features(ns, nd, 6, 7, 3, ei.size(1), bipartite=case == "bipartite")
    kind = {"csr": "csr", "sparse_coo_values": "sparse_coo"}.get(case, "coo")
    call = dict(return_attention_weights=True) if case == "weights" else None
    _compare(native, fused, x, ei, ns, nd, ea, kind, from_values=case == "sparse_coo_values",
             call=call)


def test_tail_projections_widen_the_query_rows():
    """The widened query projection gives per head [q, W^T q] (bias included), so
    no [N, H, C + D] copy follows the GEMM; the key, value and skip projections
    are left as they are (the op takes the tails beside C-channel keys and
    values)."""
    from pyg_dfgnn.nn._edge_tails import tail_projections
    torch.manual_seed(0)
    H, C, D, F_in = 3, 5, 2, 7
    x = torch.randn(11, F_in, dtype=torch.float64)
    ws = [torch.randn(H * C, F_in, dtype=torch.float64) for _ in range(4)]
    for bq in (torch.randn(H * C, dtype=torch.float64), None):
        bs = [bq, None, torch.randn(H * C, dtype=torch.float64),
              torch.randn(H * C, dtype=torch.float64)]
        W = torch.randn(H, C, D, dtype=torch.float64)
        wide_w, wide_b = tail_projections(ws, bs, W)
        assert all(a is b for a, b in zip(wide_w[1:], ws[1:]))
        assert all(a is b for a, b in zip(wide_b[1:], bs[1:]))
        q = torch.nn.functional.linear(x, ws[0], bq).view(-1, H, C)
        q2 = torch.nn.functional.linear(x, wide_w[0], wide_b[0]).view(-1, H, C + D)
        torch.testing.assert_close(q2, torch.cat([q, torch.einsum("nhc,hcd->nhd", q, W)], -1))


def test_layer_with_edge_tails_off_runs_edge_rows():
    """edge_tails=False (a constructor argument, also an attribute) runs the
    [E, H, C] rows of the dot_edge score where tails would pay, matching PyG."""
    ns = nd = 20
    ei = random_graph(20, num_edges=90, num_isolated=2, num_duplicates=6)
    native, fused = _pair(6, 12, heads=2, edge_dim=3)
    assert _transformer_edge_score(fused, 3) == "dot_edge_tail"
    fused.edge_tails = False
    assert _transformer_edge_score(fused, 3) == "dot_edge"
    x, ea = _features(ns, nd, 6, 7, 3, ei.size(1))
    _compare(native, fused, x, ei, ns, nd, ea)
    assert not FusedTransformerConv(6, 12, heads=2, edge_dim=3, edge_tails=False).edge_tails


def test_lazy_projections_keep_pyg_order_with_tails():
    """A lazy layer's first call makes PyG's module calls (edge rows, not tails),
    drawing the weights as PyG does, and later calls run tails."""
    native = TransformerConv(-1, 12, heads=2, edge_dim=3).double()
    fused = FusedTransformerConv(-1, 12, heads=2, edge_dim=3).double()
    fused.lin_edge.load_state_dict(native.lin_edge.state_dict())
    ei = random_graph(20, num_edges=90, num_isolated=2, num_duplicates=6)
    x, ea = _features(20, 20, 6, 7, 3, ei.size(1))
    for step in range(2):
        torch.manual_seed(5)  # the lazy weights' draws, on the first call
        with ops.recording() as records:
            got = fused(x, ei, ea)
        torch.manual_seed(5)
        want = native(x, ei, ea)
        assert [r.score for r in records] == ["dot_edge" if step == 0 else "dot_edge_tail"]
        assert rel_err(got, want) < 1e-12


def _mode_graph(graph: str):
    """``(edge_index, N_src, N_dst)``: ``"bipartite"`` has fewer destinations than
    sources and its last three have no in-edge (the layout's ``dst_extent`` below
    ``N_dst``: the query's row prefix)."""
    if graph == "square":
        return random_graph(20, num_edges=80, num_isolated=2, num_duplicates=6), 20, 20
    return random_graph(16, 6, num_edges=50, num_isolated=1, num_duplicates=4), 16, 9


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "unfused_projection"])
@pytest.mark.parametrize("tails", [True, False])
@pytest.mark.parametrize("graph", ["square", "bipartite"])
def test_layer_modes_match_pyg(mode, tails, graph, monkeypatch):
    """Under no_grad and inference_mode (separate projections, the query over the
    row prefix where destinations past dst_extent have no in-edge) and, while
    autograd records, with fused_projection=False (no joined projection node),
    with tails (12 channels, 3 features) and [E, H, C] rows (4 channels, 16
    features): the expected score ran and outputs and attention weights (and,
    recording, gradients) match PyG in float64. After the inference_mode call the
    same edge_index (its cached layout) serves a training call."""
    C, D = (12, 3) if tails else (4, 16)
    score = "dot_edge_tail" if tails else "dot_edge"
    ei, ns, nd = _mode_graph(graph)
    bipartite = graph == "bipartite"
    native, fused = _pair((6, 7) if bipartite else 8, C, heads=2, edge_dim=D)
    assert _transformer_edge_score(fused, D) == score
    x, ea = _features(ns, nd, 6 if bipartite else 8, 7, D, ei.size(1), bipartite=bipartite)
    import pyg_dfgnn.nn.transformer_conv as transformer_conv
    joined, joined_linear = [], transformer_conv._joined_linear
    monkeypatch.setattr(transformer_conv, "_joined_linear",
                        lambda *a, **k: joined.append(1) or joined_linear(*a, **k))
    if mode == "unfused_projection":
        fused.fused_projection = False
        assert not FusedTransformerConv(8, C, heads=2, edge_dim=D,
                                        fused_projection=False).fused_projection
        got, _ = _compare(native, fused, x, ei, ns, nd, ea,
                          call={"return_attention_weights": True}, score=score)
        assert joined == [], "the projections ran joined"
        fused.fused_projection = True  # the counter sees the joined projections
        fused(x, ei, ea)
        assert joined
        return
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with ctx(), ops.recording() as records:
        got, (ei_f, alpha) = fused(x, ei, ea, return_attention_weights=True)
    with ctx():
        want, (_, alpha_n) = native(x, ei, ea, return_attention_weights=True)
    assert [(r.score, r.need_grad) for r in records] == [(score, False)]
    assert joined == [], "the projections ran joined"
    if bipartite:
        assert records[0].layout.dst_extent == int(ei[1].max()) + 1 <= 6 < nd
    assert ei_f is ei and not got.requires_grad
    assert got.is_inference() == (mode == "inference_mode")
    assert rel_err(got, want) < 1e-12 and rel_err(alpha, alpha_n) < 1e-12
    if mode == "inference_mode":
        with ops.recording() as records:
            out = fused(x, ei, ea)
        assert [(r.score, r.need_grad) for r in records] == [(score, True)]
        assert rel_err(out, native(x, ei, ea)) < 1e-12
        out.sum().backward()
        assert all(p.grad is not None for p in fused.parameters())
