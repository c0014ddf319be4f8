"""GPU tests of the dot_edge_tail kernels (``cuda/scores/dot_edge_tail.cu``: the
dot-product score whose edge rows are ``[E, D]`` tails of every head's row,
``TransformerConv`` with narrow ``edge_dim`` features) against the float64
reference over the ``[E, H, C]`` rows they stand for: poisoned allocator,
relative error < 1e-5 (outputs, weights) and < 1e-4 (gradients) in fp32, < 1e-2
in fp16 / bf16; tails of one vector to all but one, split rows, the scalar-row
path, and the alignment error. The layer runs them in ``test_cuda_dot_edge.py``
(``test_layer_matches_native``), determinism and peak memory too."""
import pytest
import torch

from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import reference
from test_cuda_gt import DEV, GRAPHS, assert_matches_ref, poison, rel_err
from test_edge_inputs import pad_kv, tails_full

pytestmark = pytest.mark.cuda


def make(graph, H, C, D, dtype):
    """``(layout, [q, k, v, a])``: ``a`` ``[E, D]`` in the input edge order, ``k``
    and ``v`` the ``C - D`` channels the tails complete."""
    ei, ns, nd = GRAPHS[graph]()
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    shapes = [(nd, H, C), (ns, H, C - D), (ns, H, C - D), (lay.num_edges, D)]
    return lay, [torch.randn(s, device=DEV).to(dtype).requires_grad_() for s in shapes]


def ref64(lay, q, k, v, a, g):
    """``(out, alpha in CSR order, [dq, dk, dv, da])`` in float64."""
    t = [u.detach().double().requires_grad_() for u in (q, k, v, a)]
    e = tails_full(lay.to_csr_order(t[3]), q.size(1), q.size(2))
    out, alpha = reference.dot_attention(lay.rowptr, lay.col, t[0], pad_kv(t[1], q.size(2)),
                                         pad_kv(t[2], q.size(2)), None, edge=e)
    out.backward(g.double())
    return out, alpha, [u.grad for u in t]


def call(lay, q, k, v, a, **kw):
    with ops.recording() as records:
        res = ops.gt_attention(lay, q, k, v, edge=a, **kw)
    assert [r.score for r in records] == ["dot_edge_tail"] and records[0].plan is not None
    return res


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("H,C,D", [(1, 128, 16), (1, 144, 16), (4, 48, 16), (2, 32, 4),
                                   (1, 36, 32), (3, 20, 8), (1, 7, 3)])
def test_forward_backward_fp32(graph, H, C, D):
    lay, (q, k, v, a) = make(graph, H, C, D, torch.float32)
    g = torch.randn(lay.num_dst, H, C, device=DEV)
    poison()
    out, alpha = call(lay, q, k, v, a, return_attention=True)
    poison()
    out.backward(g)
    ref, ref_alpha, (dq, dk, dv, da) = ref64(lay, q, k, v, a, g)
    assert a.grad.shape == a.shape
    assert_matches_ref(lay, out, alpha, ref, ref_alpha,
                       ((q.grad, dq), (k.grad, dk), (v.grad, dv), (a.grad, da)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("graph", ["small", "super_node", "bipartite"])
@pytest.mark.parametrize("H,C,D", [(1, 144, 16), (4, 48, 16), (2, 24, 8), (1, 24, 16)])
def test_half_precision(graph, dtype, H, C, D):
    lay, (q, k, v, a) = make(graph, H, C, D, dtype)
    g = torch.randn(lay.num_dst, H, C, device=DEV, dtype=dtype)
    poison()
    out = call(lay, q, k, v, a)
    poison()
    out.backward(g)
    ref, _, grads = ref64(lay, q, k, v, a, g)
    assert out.dtype == dtype and a.grad.dtype == dtype
    assert rel_err(out, ref) < 1e-2
    for got, want in zip((q.grad, k.grad, v.grad, a.grad), grads):
        assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_rows_with_a_tiny_chunk(dtype, plan_override):
    plan_override(chunk=4)
    lay, (q, k, v, a) = make("small", 2, 48, 16, dtype)
    assert lay.work("row", 4).num_slots > 0
    g = torch.randn(lay.num_dst, 2, 48, device=DEV, dtype=dtype)
    poison()
    out = call(lay, q, k, v, a)
    poison()
    out.backward(g)
    ref, _, grads = ref64(lay, q, k, v, a, g)
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 1e-2)
    assert rel_err(out, ref) < tol[0]
    for got, want in zip((q.grad, k.grad, v.grad, a.grad), grads):
        assert rel_err(got, want) < tol[1]


def test_tails_of_part_of_a_vector_raise():
    lay, (q, k, v, _) = make("small", 1, 128, 16, torch.bfloat16)
    a = torch.randn(lay.num_edges, 12, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8"):
        ops.gt_attention(lay, q, k, v, edge=a)


@pytest.mark.parametrize("case,match", [
    ("kv_channels", r"k must be \[N_src, H, 24\] = \[N_src, 2, 24\]"),
    ("a_dtype", "a has dtype"), ("a_width", r"a must be \[E, D\] with 1 <= D < C")])
def test_op_rejects_bad_tails(case, match):
    """The C++ op checks what it is handed directly: keys and values of C - D
    channels, tails in q's dtype and narrower than q's rows (the Python op's
    ValueErrors are tested on the CPU)."""
    lay, inputs = make("small", 2, 32, 8, torch.float32)
    q, k, v, a = [t.detach() for t in inputs]
    a = lay.to_csr_order(a)
    args = list(ops.op_args("dot_edge_tail", lay, [q, k, v, a], (0.2,), need_grad=False))
    bad = {"kv_channels": [q, q[:k.size(0)].contiguous(), v, a],
           "a_dtype": [q, k, v, a.double()],
           "a_width": [q, k, v, torch.randn(a.size(0), 32, device=DEV)]}[case]
    with pytest.raises(RuntimeError, match=match):
        torch.ops.dfgnn.attention_fwd(*([bad] + args[1:]))
    torch.cuda.synchronize()


@pytest.mark.parametrize("channels", [32, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_pads_narrow_features_to_whole_vectors(dtype, channels):
    """Three features per edge: the layer pads the tails (and lin_edge's slice in
    the widened query projection) with zero channels to whole 16-byte vectors
    after 32 channels, and by one zero channel after 5 (5 + 3 channels are whole
    vectors, which tails of 3 cannot fill: the rows stay scalar), and matches
    float64 PyG: fp32 within 1e-5 (output) and 1e-4 (parameter gradients); bf16
    under autocast within 1e-2, or 1.5x PyG's own bf16 error where that is larger
    (weight gradients summed over a super node's edges)."""
    from torch_geometric.nn import TransformerConv

    from pyg_dfgnn.nn import FusedTransformerConv
    torch.manual_seed(4)
    ei, n, _ = GRAPHS["super_node"]()
    native = TransformerConv(16, channels, heads=2, edge_dim=3).to(DEV)
    fused = FusedTransformerConv(16, channels, heads=2, edge_dim=3).to(DEV)
    fused.load_state_dict(native.state_dict())
    x = torch.randn(n, 16, device=DEV)
    ea = torch.randn(ei.size(1), 3, device=DEV)
    half = dtype == torch.bfloat16

    def run(layer, record=False):
        layer.zero_grad(set_to_none=True)
        with ops.recording() as records, torch.autocast("cuda", torch.bfloat16, enabled=half):
            out = layer(x, ei, ea)
        assert not record or [r.score for r in records] == ["dot_edge_tail"]
        out.float().pow(2).sum().backward()
        return out, {k: p.grad.clone() for k, p in layer.named_parameters()}

    got, got_g = run(fused, record=True)
    assert got.dtype == dtype
    base, base_g = run(native) if half else (None, None)
    native.zero_grad(set_to_none=True)
    want = native.double()(x.double(), ei, ea.double())
    want.pow(2).sum().backward()
    want_g = {k: p.grad for k, p in native.named_parameters()}
    out_tol, grad_tol = (1e-2, 1e-2) if half else (1e-5, 1e-4)
    assert rel_err(got, want) < max(out_tol, 1.5 * rel_err(base, want) if half else 0)
    for name, b in want_g.items():
        if name == "lin_key.bias":  # zero in exact arithmetic (shift-invariant softmax)
            continue
        own = 1.5 * rel_err(base_g[name], b) if half else 0
        assert rel_err(got_g[name], b) < max(grad_tol, own), name
