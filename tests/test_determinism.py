"""The CPU reference path (pyg_dfgnn.ops.reference) is bit-reproducible: the same
forward + backward gives bitwise-equal outputs and gradients run to run with
several threads, also on graphs with super nodes (thousands of edges into and out
of one node, where a multi-threaded scatter would accumulate in racy order)."""
from __future__ import annotations

import pytest
import torch

from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATConv
from pyg_dfgnn.ops import reference

RUNS = 5


@pytest.fixture
def two_threads():
    """Runs the test with 2 intra-op threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _super_node_edges(n: int = 1500, e: int = 30000) -> torch.Tensor:
    src = torch.randint(0, n, (e,))
    dst = torch.randint(0, n, (e,))
    dst[: e // 3] = 7  # one destination with a third of the edges
    src[e // 3: e // 2] = 11  # one source with a sixth of them
    src[e // 2: e // 2 + e // 10] = 7  # node 7 is both
    return torch.stack([src, dst])


def _super_node_graph(n: int = 1500, e: int = 30000) -> GraphLayout:
    return GraphLayout.from_edge_index(_super_node_edges(n, e), (n, n))


def _run(score: str, lay: GraphLayout, inputs):
    """Forward + backward of one reference function on fresh leaves; returns the
    output and every gradient."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    r, c = lay.rowptr, lay.col
    if score == "dot":
        out, alpha = reference.dot_attention(r, c, *leaves)
    elif score == "cosine":
        out, alpha = reference.cosine_attention(r, c, leaves[0], leaves[0], leaves[1])
    else:
        out, alpha = reference.additive_attention(r, c, *leaves, negative_slope=0.2)
    w_out = torch.linspace(-1, 1, out.numel()).view_as(out)
    w_alpha = torch.linspace(1, -1, alpha.numel()).view_as(alpha)
    ((out * w_out).sum() + (alpha * w_alpha).sum()).backward()
    return [out.detach(), alpha.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("score", ["dot", "cosine", "additive"])
def test_reference_backward_bit_reproducible(two_threads, score):
    lay = _super_node_graph()
    n, H, C = lay.num_src, 4, 16
    if score == "dot":
        inputs = [torch.randn(n, H, C) for _ in range(3)]
    elif score == "cosine":
        inputs = [torch.randn(n, H, C), torch.tensor(0.8)]
    else:
        inputs = [torch.randn(n, H), torch.randn(n, H), torch.randn(n, H, C)]
    first = _run(score, lay, inputs)
    assert all(torch.isfinite(t).all() and t.abs().sum() > 0 for t in first)
    for run in range(1, RUNS):
        again = _run(score, lay, inputs)
        for i, (a, b) in enumerate(zip(again, first)):
            same = torch.equal(a, b)
            assert same, f"{score}: run {run}, tensor {i} differs by {(a - b).abs().max():.3g}"


# The scores with per-edge inputs (and GATv2's), through their public ops
# (pyg_dfgnn.ops: on CPU tensors the reference path, edge rows gathered from the
# input edge order), on the same super-node graph. Each case: the op, its
# keyword arguments' names and shapes (E: one per edge), in the op's order.
EDGE_CASES = {
    "dot_edge": (ops.gt_attention, {"q": "NHC", "k": "NHC", "v": "NHC", "edge": "EHC"}),
    # K: the C - D channels of the keys and values the [E, D] tails complete
    "dot_edge_tail": (ops.gt_attention, {"q": "NHC", "k": "NHK", "v": "NHK", "edge": "ED"}),
    "additive_edge": (ops.gat_attention, {"a_src": "NH", "a_dst": "NH", "x": "NHC",
                                          "edge": "EH"}),
    "gatv2": (ops.gatv2_attention, {"x_l": "NHC", "x_r": "NHC", "att": "HC"}),
    "gatv2_edge": (ops.gatv2_attention, {"x_l": "NHC", "x_r": "NHC", "att": "HC",
                                         "edge": "EHC"}),
}


def _run_op(score: str, lay: GraphLayout, inputs):
    """Forward + backward of one public op on fresh leaves (as :func:`_run`), its
    calls recorded; returns the output, the weights, every gradient and the
    records."""
    op, names = EDGE_CASES[score]
    leaves = {k: t.clone().requires_grad_() for k, t in inputs.items()}
    with ops.recording() as records:
        out, alpha = op(lay, **leaves, return_attention=True)
        w_out = torch.linspace(-1, 1, out.numel()).view_as(out)
        w_alpha = torch.linspace(1, -1, alpha.numel()).view_as(alpha)
        ((out * w_out).sum() + (alpha * w_alpha).sum()).backward()
    return [out.detach(), alpha.detach()] + [leaves[k].grad for k in names], records


@pytest.mark.parametrize("score", list(EDGE_CASES))
def test_edge_score_backward_bit_reproducible(two_threads, score):
    lay = _super_node_graph()
    n, E, H, C, D = lay.num_src, lay.num_edges, 4, 16, 8
    dims = {"N": n, "E": E, "H": H, "C": C, "D": D, "K": C - D}
    _, names = EDGE_CASES[score]
    inputs = {k: torch.randn(*(dims[d] for d in shape)) for k, shape in names.items()}
    first, records = _run_op(score, lay, inputs)
    # the score asked for ran (not another, e.g. dot_edge for [E, D] tails), once
    assert [(r.score, r.need_grad, r.plan) for r in records] == [(score, True, None)]
    assert all(torch.isfinite(t).all() and t.abs().sum() > 0 for t in first)
    for run in range(1, RUNS):
        again, _ = _run_op(score, lay, inputs)
        for i, (a, b) in enumerate(zip(again, first)):
            same = torch.equal(a, b)
            assert same, f"{score}: run {run}, tensor {i} differs by {(a - b).abs().max():.3g}"


def test_edge_layer_backward_bit_reproducible(two_threads):
    """FusedGATConv with edge features and self-loops whose features are the mean
    of each node's in-edges' (fill_value='mean': a scatter into the super node),
    forward + backward twice on the same inputs: bitwise-equal output and
    gradients of the input, the edge features and every parameter."""
    n, F_in, H, C, D = 1500, 12, 4, 8, 6
    edge_index = _super_node_edges(n)
    torch.manual_seed(1)
    conv = FusedGATConv(F_in, C, heads=H, edge_dim=D, fill_value="mean")
    x = torch.randn(n, F_in)
    edge_attr = torch.randn(edge_index.size(1), D)

    def run():
        conv.zero_grad(set_to_none=True)
        xs, es = x.clone().requires_grad_(), edge_attr.clone().requires_grad_()
        with ops.recording() as records:
            out = conv(xs, edge_index, es)
            out.mul(torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads = {name: p.grad for name, p in conv.named_parameters()}
        return [out.detach(), xs.grad, es.grad], grads, records

    first, first_grads, records = run()
    # it ran fused, with the edge score (a fallback to PyG would be a test of PyG)
    assert [(r.score, r.need_grad) for r in records] == [("additive_edge", True)]
    names = [name for name, p in conv.named_parameters() if p.requires_grad]
    assert "lin_edge.weight" in names and "att_edge" in names
    assert all(first_grads[name] is not None for name in names), first_grads
    assert all(torch.isfinite(t).all() and t.abs().sum() > 0 for t in first)
    again, again_grads, _ = run()
    for i, (a, b) in enumerate(zip(again, first)):
        assert torch.equal(a, b), f"tensor {i} differs by {(a - b).abs().max():.3g}"
    for name in names:
        a, b = again_grads[name], first_grads[name]
        assert torch.equal(a, b), f"{name}.grad differs by {(a - b).abs().max():.3g}"
