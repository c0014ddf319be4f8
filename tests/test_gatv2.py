"""FusedGATv2Conv and the GATv2 score on the CPU (the reference path): the layer
against native GATv2Conv in float64 for each option, the spec's registration,
``fuse()`` mapping GATv2Conv, and the plan of the score with edge rows
(``gatv2_edge``; the layer with edge features against PyG: ``test_gat_edge.py``,
the op: ``test_edge_inputs.py``). The kernels: ``test_cuda_gatv2.py`` and
``test_cuda_gatv2_edge.py``."""
import pytest
import torch
from conftest import random_graph, rel_err
from torch_geometric.nn import GATv2Conv

import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATv2Conv, fuse
from pyg_dfgnn.ops import plan

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


def test_plan_of_the_gatv2_edge_score():
    """With edge rows the GATv2 score runs what its kernels have: SMMF on CUDA
    cores, one row per lane group, and the two-launch backward (the GATv2
    score's, renamed: fp16 / bf16 D first, split rows merged after), whose
    CSR walk writes the edge rows' gradient; what it lacks raises before a
    launch (the layer against PyG: test_gat_edge.py)."""
    big = GraphLayout.from_edge_index(
        torch.stack([torch.randint(0, 1 << 15, (1 << 18,)),
                     torch.arange(1 << 15).repeat_interleave(8)]), (1 << 15, 1 << 15))
    small = GraphLayout.from_edge_index(random_graph(300, num_edges=3000), (300, 300))
    assert plan.plan_for(big, torch.float32, 32, score="gatv2").two_rows
    assert not plan.plan_for(big, torch.float32, 32, score="gatv2_edge").two_rows
    spec = ops.spec.get("gatv2_edge")
    assert spec.inputs == ("x_r", "x_l", "att", "e") and spec.edge_inputs == (3,)
    for dtype in (torch.float32, torch.bfloat16):
        for chunk in (None, 4):
            with plan.override(chunk=chunk):
                p = plan.plan_for(small, dtype, 32, score="gatv2_edge")
                with plan.override(bwd_launches=2):
                    base = plan.plan_for(small, dtype, 32, score="gatv2")
            assert (p.method, p.mma, p.bwd_one_launch, p.split_rows) == \
                ("smmf", False, False, chunk is not None)
            for backward in (False, True):
                want = [k.replace("gatv2", "gatv2_edge") for k, _ in base.kernels(backward)]
                assert [k for k, _ in p.kernels(backward)] == want, (dtype, chunk, backward)
            bwd = dict(p.kernels(backward=True))
            assert "edge rows' gradients" in bwd["gatv2_edge:dq_walk"]
            assert not any(k.endswith(":dsum") for k in bwd)  # D: the forward's fp32 rows
    with pytest.raises(ValueError, match="no PMF path"):
        plan.plan_for(small, torch.float32, 32, score="gatv2_edge", strategy="pmf")
    # the paper's rule (§4.2) sends the GATv2 score to PMF on long rows, not this one
    assert plan.choose_strategy(10 ** 7, "gatv2", 4, capacity=16, rule="paper") == "pmf"
    assert plan.choose_strategy(10 ** 7, "gatv2_edge", 4, capacity=16, rule="paper") == "smmf"
    for field in (dict(bwd_launches=1), dict(two_rows=True), dict(mma=True)):
        with plan.override(**field), pytest.raises(ValueError):
            plan.plan_for(big, torch.bfloat16 if "mma" in field else torch.float32, 32,
                          score="gatv2_edge")


def test_edge_dim_runs_fused_and_explains_its_score():
    native, fused = _pair(dict(edge_dim=3))
    ei = random_graph(15, num_edges=50)
    x, ea = torch.randn(15, 6, dtype=torch.float64), torch.randn(ei.size(1), 3, dtype=torch.float64)
    assert fused.fallback_reason(x, ei, ea) == ""
    assert rel_err(fused(x, ei, ea), native(x, ei, ea)) < 1e-12
    report = pyg_dfgnn.explain(fused, x, ei, ea)
    assert report.fused and report.ops[0].score == "gatv2_edge"


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


@pytest.mark.parametrize("bad, match", [
    ("x_r_rows", "x_r must have 9 rows"), ("x_l_rows", "x_l 12"), ("heads", "expected x_r"),
    ("att", "att"), ("dtype", "share a dtype"), ("dim", "expected x_r")])
def test_op_rejects_each_bad_input(bad, match):
    """The check's one-expression common case lets no bad input through."""
    lay = GraphLayout.from_edge_index(random_graph(12, 9, num_edges=40), (12, 9))
    x_l, x_r, att = torch.randn(12, 2, 4), torch.randn(9, 2, 4), torch.randn(2, 4)
    ops.gatv2_attention(lay, x_l, x_r, att)
    x_l, x_r, att = {
        "x_r_rows": (x_l, x_r[:8], att), "x_l_rows": (x_l[:11], x_r, att),
        "heads": (x_l, x_r[:, :1], att), "att": (x_l, x_r, att[:, :3]),
        "dtype": (x_l, x_r.double(), att), "dim": (x_l, x_r[:, 0], att)}[bad]
    with pytest.raises(ValueError, match=match):
        ops.gatv2_attention(lay, x_l, x_r, att)
