"""The CPU reference path (pyg_dfgnn.ops.reference) is bit-reproducible: the same
forward + backward gives bitwise-equal outputs and gradients run to run with
several threads, also on graphs with super nodes (thousands of edges into and out
of one node, where a multi-threaded scatter would accumulate in racy order)."""
from __future__ import annotations

import pytest
import torch

from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import reference

RUNS = 5


@pytest.fixture
def two_threads():
    """Runs the test with 2 intra-op threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _super_node_graph(n: int = 1500, e: int = 30000) -> GraphLayout:
    src = torch.randint(0, n, (e,))
    dst = torch.randint(0, n, (e,))
    dst[: e // 3] = 7  # one destination with a third of the edges
    src[e // 3: e // 2] = 11  # one source with a sixth of them
    src[e // 2: e // 2 + e // 10] = 7  # node 7 is both
    return GraphLayout.from_edge_index(torch.stack([src, dst]), (n, n))


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
