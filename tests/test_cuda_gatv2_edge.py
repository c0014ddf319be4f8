"""GPU tests of the gatv2_edge kernels (the GATv2 score with per-edge rows ``e``
``[E, H, C]`` inside its LeakyReLU, ``GATv2Conv`` with ``edge_dim``) against the
float64 reference, as ``test_cuda_gat_edge.py`` checks the additive_edge score:
fresh random inputs, the allocator poisoned with NaN (an unwritten output
shows), relative error ||got - ref|| / ||ref|| < 1e-5 (outputs, attention
weights) and < 1e-4 (gradients, the edge rows' and the attention vector's
included) in fp32, < 1e-2 in fp16 / bf16; SMMF only (the score has no PMF path);
split rows (a super node, and a tiny chunk), isolated destinations, the kernels'
dropout mask recomputed on the host, and the layer against native ``GATv2Conv``
(the edge rows' order, the peak memory and determinism: ``test_cuda_dot_edge.py``,
which runs the edge scores)."""
import functools

import pytest
import torch
from torch_geometric.nn import GATv2Conv

from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.nn import FusedGATv2Conv
from pyg_dfgnn.ops import calls, plan
from test_cuda_dot_edge import _layer_inputs, check_compiled_layer
from test_cuda_gat_edge import LAYER_CONFIGS as GAT_LAYER_CONFIGS
from test_cuda_gat_edge import (check_layer_against_native, check_op_and_bad_edge_inputs,
                                edge_call, edge_ref64)
from test_cuda_gt import DEV, GRAPHS, assert_matches_ref, dropout_keep, poison, rel_err

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)
SLOPE = 0.2
SCORE = "gatv2_edge"
#: The least distance of the test inputs' pre-activations from the LeakyReLU's
#: kink. One at the kink takes either branch once rounded (the fp32 sums of the
#: kernels and of PyG round differently from float64's), and the two branches'
#: gradients differ by (1 - slope) att_c dS_ij: a true jump of the function, of
#: 1e-4 to 1e-3 of a gradient on these graphs (without the margin, the float64
#: reference's own fp32 twin missed the fp32 bar on up to one draw in 150). The
#: pre-activations are per channel, E x H x C of them, so a draw holds some within
#: fp32's rounding of 0 often enough.
KINK_MARGIN = 1e-3


def make(graph, H, C, dtype, requires_grad=True, loops=False):
    """``(layout, [x_l, x_r, att, e])``: ``att`` scaled by ``1 / sqrt(C)`` (scores
    of a few units), ``e`` ``[E, H, C]`` in the input edge order (``loops``: a
    layout with added self-loops, ``e`` in the order of its ``edge_index``),
    moved where ``x_r,i + x_l,j + e_ij`` lies within :data:`KINK_MARGIN` of 0."""
    ei, ns, nd = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd), add_self_loops=loops)
    x_l, x_r = torch.randn(ns, H, C, device=DEV), torch.randn(nd, H, C, device=DEV)
    e = torch.randn(lay.num_edges, H, C, device=DEV)
    src, dst = lay.edge_index
    pre = x_r[dst] + x_l[src] + e
    away = torch.where(pre < 0, -2 * KINK_MARGIN, 2 * KINK_MARGIN)  # 0 goes up too
    e = torch.where(pre.abs() < KINK_MARGIN, e + away, e)
    leaves = [x_l, x_r, torch.randn(H, C, device=DEV) / C ** 0.5, e]
    return lay, [t.to(dtype).requires_grad_(requires_grad) for t in leaves]


#: :func:`test_cuda_gat_edge.edge_ref64` and ``edge_call`` of the gatv2_edge
#: score, ``leaves`` ``[x_l, x_r, att, e]``.
ref64 = functools.partial(edge_ref64, SCORE, (1, 0, 2))
call = functools.partial(edge_call, ops.gatv2_attention, SCORE)


def run_against_ref(lay, leaves, dtype, keep=None, p=0.0, **kw):
    """One call (``kw`` to :func:`call`) and its backward of a random output
    gradient, each after the allocator is poisoned, against :func:`ref64` with
    the same mask: the output and every gradient (the edge rows' of ``dtype``,
    shaped as they are) within 1e-5 / 1e-4 in fp32, 1e-2 in fp16 / bf16.
    Returns ``(out, the call's result)``."""
    H, C = leaves[3].shape[1:]
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    res = call(lay, *leaves, **kw)
    out = res[0] if kw.get("return_attention") else res
    poison()
    out.backward(g)
    e = leaves[3]
    assert out.dtype == dtype and e.grad.dtype == dtype and e.grad.shape == e.shape
    ref, _, want = ref64(lay, leaves, g, keep=keep, p=p)
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 1e-2)
    assert rel_err(out, ref) < tol[0]
    for name, got, w in zip(("x_l", "x_r", "att", "e"), (t.grad for t in leaves), want):
        assert rel_err(got, w) < tol[1], name
    return out, res


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("H,C", [(1, 8), (2, 16), (4, 32), (8, 64), (1, 128), (2, 100), (1, 7)])
def test_forward_backward_fp32(graph, H, C):
    """Every head shape, vector and scalar rows; the attention weights and the
    isolated destinations (zeros) too."""
    lay, leaves = make(graph, H, C, torch.float32)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    out, alpha = call(lay, *leaves, return_attention=True)
    poison()
    out.backward(g)
    ref, ref_alpha, want = ref64(lay, leaves, g)
    assert_matches_ref(lay, out, alpha, ref, ref_alpha,
                       list(zip((t.grad for t in leaves), want)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_self_loop_layout(dtype):
    """A layout with added self-loops, the edge rows in its edge_index order
    (PyG's remove_self_loops + add_self_loops, as FusedGATv2Conv hands them
    over)."""
    lay, leaves = make("small", 2, 32, dtype, loops=True)
    run_against_ref(lay, leaves, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_split_rows_with_a_tiny_chunk(dtype, dropout, plan_override, monkeypatch):
    """Every row of the small graph split into work items of 4 edges, merged in
    the kernels (fp32) or in merge launches (bf16), with and without dropout
    (the kernels' mask, recomputed on the host)."""
    plan_override(chunk=4)
    seed = 123456789
    monkeypatch.setattr(calls, "seed", lambda: seed)
    lay, leaves = make("small", 2, 32, dtype)
    assert lay.work("row", 4).num_slots > 0
    keep = dropout_keep(seed, lay.num_edges, 2, dropout).to(DEV) if dropout else None
    run_against_ref(lay, leaves, dtype, keep=keep, p=dropout, dropout=dropout, training=True)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("graph", ["small", "super_node", "bipartite"])
@pytest.mark.parametrize("H,C", [(1, 128), (4, 32), (4, 64), (1, 16), (2, 24)])
def test_half_precision(graph, dtype, H, C):
    lay, leaves = make(graph, H, C, dtype)
    out, _ = run_against_ref(lay, leaves, dtype)
    isolated = lay.in_degree() == 0
    assert isolated.any() and (out[isolated] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("graph", ["small", "super_node"])
def test_dropout_is_the_kernels_mask_forward_and_backward(graph, dtype, monkeypatch):
    """The mask of the GATv2 score (a counter per CSR position and head, from
    the call's seed; dropout_keep recomputes it): the output and every gradient
    match the float64 reference with that mask, and the attention weights are
    the softmax before it."""
    seed, p = 987654321987, 0.3
    monkeypatch.setattr(calls, "seed", lambda: seed)
    lay, leaves = make(graph, 2, 32, dtype)
    keep = dropout_keep(seed, lay.num_edges, 2, p).to(DEV)
    assert 0.25 < 1 - keep.double().mean().item() < 0.35
    out, (_, alpha) = run_against_ref(lay, leaves, dtype, keep=keep, p=p, dropout=p,
                                      training=True, return_attention=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    ref, ref_alpha, _ = ref64(lay, leaves)
    assert rel_err(alpha, lay.to_input_order(ref_alpha)) < tol
    assert rel_err(out, ref) > 1e-2  # the mask did apply
    assert rel_err(call(lay, *leaves, dropout=p, training=False), ref) < tol


def test_plan_runs_what_the_score_has(plan_override):
    """SMMF on CUDA cores with the two-launch backward, whose dq walk writes the
    edge rows' gradient; what the score lacks raises before a launch
    (ValueError from the plan): PMF, and each forced kernel variant."""
    lay, leaves = make("small", 2, 64, torch.bfloat16)
    e_csr = lay.to_csr_order(leaves[3])
    with ops.recording() as records:  # call() records its own calls: not nested
        ops.gatv2_attention(lay, *leaves[:3], negative_slope=SLOPE, edge=e_csr,
                            edge_order="csr")
    p = records[0].plan
    assert (p.method, p.mma, p.two_rows, p.bwd_one_launch, p.mma_backward) == \
        ("smmf", False, False, False, False) and p.dense_cells == 0
    # bf16: D from the forward's float32 rows first (out_dsum), then the two walks
    assert [k for k, _ in p.kernels(backward=True)][:3] == \
        ["out_dsum", f"{SCORE}:dq_walk", f"{SCORE}:dkv_walk"]
    with pytest.raises(ValueError, match="no PMF path"):
        call(lay, *leaves, strategy="pmf")
    for field in (dict(bwd_launches=1), dict(mma=True), dict(mma_backward=True),
                  dict(two_rows=True)):
        with plan.override(**field), pytest.raises(ValueError):
            call(lay, *leaves)


def test_opcheck_and_bad_input():
    """opcheck of dfgnn::attention_fwd with the score, and the C++ op's own
    checks of the edge rows it is handed directly (the Python op's ValueErrors
    are tested on the CPU)."""
    lay, (x_l, x_r, att, e) = make("super_node", 2, 32, torch.float32, requires_grad=False)
    e_csr = lay.to_csr_order(e)
    check_op_and_bad_edge_inputs(SCORE, lay, [x_r, x_l, att, e_csr],
                                 (e_csr[1:], e_csr.half(), e_csr[:, :, :16].contiguous(),
                                  e_csr[:, :1].contiguous()))


# ------------------------------------------------------------------------------ the layer
#: GATConv's configurations ("pmf": SMMF here, the score has no PMF path) and
#: shared weights.
LAYER_CONFIGS = {**GAT_LAYER_CONFIGS,
                 "share_weights_residual": dict(heads=2, share_weights=True, residual=True)}


def _seed_away_from_the_kink(config: str) -> int:
    """The first seed from 0 whose draws in :func:`check_layer_against_native`
    (the inputs, then the native layer's weights) keep each pre-activation of
    GATv2Conv's scores, ``x_i + x_j + lin_edge(e_ij)`` in float64, at least 1e-6
    from the LeakyReLU's kink (:data:`KINK_MARGIN` says why; the layer's fp32
    pre-activations round by about 1e-7, and a wider margin would reject most
    draws of its 400,000)."""
    kwargs = dict(LAYER_CONFIGS[config])
    kwargs.pop("strategy", None)
    for seed in range(100):
        torch.manual_seed(seed)
        ei, ns, nd, x, ea = _layer_inputs(config, self_loops=20)
        native = GATv2Conv((16, 12) if config == "bipartite" else 16, 32, edge_dim=16,
                           **kwargs).double()
        pre = []

        def hook(conv, inputs):
            h = inputs[2]
            rows = conv.lin_edge(h["edge_attr"]).view(-1, conv.heads, conv.out_channels)
            pre.append(h["x_i"] + h["x_j"] + rows)

        handle = native.register_edge_update_forward_pre_hook(hook)
        xs = tuple(t.double() for t in x) if isinstance(x, tuple) else x.double()
        with torch.no_grad():
            native(xs, ei.cpu(), ea.cpu().double())
        handle.remove()
        if pre[0].abs().min() > 1e-6:
            return seed
    raise AssertionError("no seed below 100 keeps the pre-activations off the kink")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", list(LAYER_CONFIGS))
def test_layer_matches_native(config, dtype):
    """The fused layer against native GATv2Conv
    (:func:`test_cuda_gat_edge.check_layer_against_native`), by SMMF, on draws
    whose pre-activations keep off the LeakyReLU's kink."""
    torch.manual_seed(_seed_away_from_the_kink(config))
    p = check_layer_against_native(GATv2Conv, FusedGATv2Conv, LAYER_CONFIGS[config], config,
                                   dtype, SCORE)
    assert p.method == "smmf"


def test_compiled_layer_with_edge_features():
    """fullgraph over a cached layout (no self-loops: PyG's remove_self_loops has
    a size that depends on the data)."""
    check_compiled_layer(FusedGATv2Conv(32, 16, heads=2, edge_dim=8, add_self_loops=False))
