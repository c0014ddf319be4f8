"""FusedGATv2Conv and the GATv2 score on the CPU (the reference path): the layer
against native GATv2Conv in float64 for each option, the spec's registration, and
``fuse()`` mapping GATv2Conv. The kernels: ``test_cuda_gatv2.py``."""
import pytest
import torch
from conftest import random_graph, rel_err
from torch_geometric.nn import GATv2Conv

import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATv2Conv, fuse

CONFIGS = {
    "plain": dict(),
    "heads_mean": dict(heads=3, concat=False),
    "share_weights": dict(share_weights=True),
    "residual": dict(residual=True),
    "no_self_loops": dict(add_self_loops=False),
    "no_bias": dict(bias=False, negative_slope=0.01),
}


def _pair(ctor, in_ch=6, out_ch=5):
    torch.manual_seed(0)
    kw = {"heads": 2, **ctor}
    native = GATv2Conv(in_ch, out_ch, **kw).double()
    fused = FusedGATv2Conv(in_ch, out_ch, **kw).double()
    fused.load_state_dict(native.state_dict())
    return native, fused


@pytest.mark.parametrize("config", list(CONFIGS))
def test_layer_matches_native(config):
    native, fused = _pair(CONFIGS[config])
    ei = random_graph(30, num_edges=120, num_isolated=4, num_duplicates=6)
    x = torch.randn(30, 6, dtype=torch.float64, requires_grad=True)
    got, want = fused(x, ei), native(x, ei)
    assert rel_err(got, want) < 1e-12
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, [x, *fused.parameters()], g),
                    torch.autograd.grad(want, [x, *native.parameters()], g)):
        assert rel_err(a, b) < 1e-10


def test_bipartite_and_attention_weights():
    torch.manual_seed(1)
    native = GATv2Conv((6, 4), 5, heads=2, add_self_loops=False).double()
    fused = FusedGATv2Conv((6, 4), 5, heads=2, add_self_loops=False).double()
    fused.load_state_dict(native.state_dict())
    ei = random_graph(20, 12, num_edges=60)
    x = (torch.randn(20, 6, dtype=torch.float64), torch.randn(12, 4, dtype=torch.float64))
    got, (ei_g, a_g) = fused(x, ei, return_attention_weights=True)
    want, (ei_w, a_w) = native(x, ei, return_attention_weights=True)
    assert torch.equal(ei_g, ei_w) and rel_err(a_g, a_w) < 1e-12 and rel_err(got, want) < 1e-12


def test_self_loops_are_returned_as_pyg_returns_them():
    native, fused = _pair({})
    ei = random_graph(15, num_edges=50)
    x = torch.randn(15, 6, dtype=torch.float64)
    got, (ei_g, a_g) = fused(x, ei, return_attention_weights=True)
    want, (ei_w, a_w) = native(x, ei, return_attention_weights=True)
    assert torch.equal(ei_g, ei_w) and rel_err(a_g, a_w) < 1e-12


def test_edge_features_fall_back_to_pyg():
    torch.manual_seed(2)
    native = GATv2Conv(6, 5, heads=2, edge_dim=3).double()
    fused = FusedGATv2Conv(6, 5, heads=2, edge_dim=3).double()
    fused.load_state_dict(native.state_dict())
    ei = random_graph(15, num_edges=50)
    x, ea = torch.randn(15, 6, dtype=torch.float64), torch.randn(ei.size(1), 3, dtype=torch.float64)
    assert fused.fallback_reason(x, ei, ea) == "edge features (edge_dim)"
    assert torch.equal(fused(x, ei, ea), native(x, ei, ea))
    report = pyg_dfgnn.explain(fused, x, ei, ea)
    assert not report.fused and "edge features" in str(report)


def test_op_matches_reference_and_gradchecks():
    ei = random_graph(12, 9, num_edges=40)
    lay = GraphLayout.from_edge_index(ei, (12, 9))
    x_l = torch.randn(12, 2, 3, dtype=torch.float64, requires_grad=True)
    x_r = torch.randn(9, 2, 3, dtype=torch.float64, requires_grad=True)
    att = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: ops.gatv2_attention(lay, a, b, c, negative_slope=0.3), (x_l, x_r, att))
    with pytest.raises(ValueError, match="att"):
        ops.gatv2_attention(lay, x_l, x_r, att[:1])


def test_registered_and_fused_by_fuse():
    assert ops.spec.get("gatv2").inputs == ("x_r", "x_l", "att")
    assert ops.fused_attention.__doc__ and "gatv2_attention" in ops.__all__
    model = torch.nn.Sequential(GATv2Conv(6, 5, heads=2), torch.nn.ReLU(), GATv2Conv(10, 3))
    report = fuse(model)
    assert [type(m).__name__ for m in model if hasattr(m, "att")] == ["FusedGATv2Conv"] * 2
    assert report.num_fused == 2 and all(layer.cls == "GATv2Conv" for layer in report)


def test_explain_names_the_plan_on_cpu():
    _, fused = _pair({})
    ei = random_graph(15, num_edges=50)
    report = pyg_dfgnn.explain(fused, torch.randn(15, 6, dtype=torch.float64), ei)
    assert report.fused and report.ops[0].score == "gatv2" and report.ops[0].plan is None
    assert "reference" in str(report)
