"""pyg_dfgnn.explain and the plan's account of itself (Plan.why, Plan.kernels):
what a layer's call runs and why, or why it runs PyG's forward."""
import pytest
import torch
from conftest import random_graph
from torch_geometric.nn import GATConv

import pyg_dfgnn
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv
from pyg_dfgnn.ops import plan

BF16 = torch.bfloat16


def test_fused_layer_on_cpu_reports_the_reference_path():
    conv = FusedGATConv(8, 4, heads=2)
    ei = random_graph(20, num_edges=60)
    report = pyg_dfgnn.explain(conv, torch.randn(20, 8), ei)
    assert report.fused and len(report.ops) == 1
    op = report.ops[0]
    assert (op.score, op.heads, op.head_size, op.plan) == ("additive", 2, 4, None)
    assert op.backward and "CPU tensors" in str(report)


@pytest.mark.parametrize("layer,args,reason", [
    # edge features without edge_dim: PyG's GATConv leaves them out of its scores
    (lambda: FusedGATConv(8, 4), lambda ei: (ei, torch.randn(ei.size(1), 3)),
     "edge features"),
    # edge features without edge_dim: PyG adds them to the values, unprojected
    (lambda: FusedTransformerConv(8, 4), lambda ei: (ei, torch.randn(ei.size(1), 1, 4)),
     "edge features"),
    (lambda: FusedAGNNConv(aggr="mean"), lambda ei: (ei,), "aggr"),
])
def test_fallback_reports_why(layer, args, reason):
    ei = random_graph(20, num_edges=60)
    conv = layer()
    report = pyg_dfgnn.explain(conv, torch.randn(20, 8), *args(ei))
    assert not report.fused and reason in report.reason and reason in str(report)


def test_explain_restores_the_random_state():
    conv = FusedTransformerConv(8, 4, heads=2, dropout=0.5).train()
    ei, x = random_graph(20, num_edges=60), torch.randn(20, 8)
    state = torch.get_rng_state()
    pyg_dfgnn.explain(conv, x, ei)
    assert torch.equal(state, torch.get_rng_state())


def test_a_module_without_fused_calls():
    report = pyg_dfgnn.explain(GATConv(8, 4), torch.randn(5, 8), random_graph(5, num_edges=9))
    assert not report.fused and "no fused op call" in report.reason


def _layout(n, e, gen=0):
    g = torch.Generator().manual_seed(gen)
    return GraphLayout.from_edge_index(torch.randint(0, n, (2, e), generator=g), (n, n))


def test_plan_names_its_kernels_and_reasons():
    small, big = _layout(300, 3000), _layout(20_000, 300_000)
    p = plan.plan_for(small, BF16, 64)
    assert p.mma and [k for k, _ in p.kernels()] == ["dot:fwd_mma"]
    assert [k for k, _ in p.kernels(backward=True)] == ["out_dsum", "dot:bwd_one_launch"]
    assert dict(p.why)["bwd_launches"].endswith("one launch")
    p = plan.plan_for(big, torch.float32, 64)
    assert p.two_rows and "two rows per warp" in p.kernels()[0][1]
    assert [k for k, _ in p.kernels(backward=True)] == ["dot:dq_walk", "dot:dkv_walk"]
    p = plan.plan_for(small, torch.float32, 64, strategy="pmf")
    assert [k for k, _ in p.kernels()] == ["dot:sddmm", "softmax_spmm"]
    assert dict(p.why)["method"] == "strategy='pmf'"
    p = plan.plan_for(small, torch.float32, 64, score="additive")
    assert [k for k, _ in p.kernels(backward=True)] == ["additive:bwd_dst", "additive:bwd_src"]
    with plan.override(chunk=4):  # split rows: merged in the kernel, or after it
        p = plan.plan_for(small, torch.float32, 7)
        assert p.split_rows and not p.vector_rows and "merged in the kernel" in p.kernels()[1][1]
        q = plan.plan_for(small, torch.float32, 7, capturing=True)
        assert not q.merge_in_kernel and q.kernels()[1][0] == "merge_softmax_partials"
        assert [k for k, _ in q.kernels(backward=True)][-1] == "combine_partials"
