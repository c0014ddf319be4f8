"""The C++ autograd kernels of the fused ops (``cuda/glue/autograd.cpp``), on ``meta``
tensors: no GPU needed, the ops dispatch to their ``register_fake``
implementations below autograd. Checks the wiring (which outputs carry a
gradient, that the backward op is called with the saved arguments and returns a
gradient of the right shape for every differentiable input, clear errors); the
values are checked on the GPU against the reference (``test_cuda_*.py``)."""
import pytest
import torch

import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

pytestmark = pytest.mark.skipif(not pyg_dfgnn.HAS_EXTENSION,
                                reason="needs the compiled extension pyg_dfgnn._C")

N, H, C = 5, 2, 8


def _layout():
    ei = torch.tensor([[0, 1, 2, 3, 1, 4, 4], [1, 2, 3, 0, 0, 0, 1]])
    lay = GraphLayout.from_edge_index(ei, (N, N))
    lay.colptr  # noqa: B018  (CSC built, as a cached layout has it)
    return lay


def _meta(args):
    """The op arguments on ``meta``, also inside the layout lists (csr, csc)."""
    def meta(a):
        if isinstance(a, torch.Tensor):
            return a.to("meta")
        if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
            return [meta(t) for t in a]
        return a
    return [meta(a) for a in args]


def _leaf(*shape):
    return torch.empty(*shape, device="meta", requires_grad=True)


def _attention_call(op):
    """A gt_fwd / gat_fwd call on meta leaves: (leaves, out, lse, attn)."""
    lay = _layout()
    if op == "gt":
        args = _meta(ops.gt_op_args(lay, *(torch.randn(N, H, C) for _ in range(3)), 0.3))
        leaves = [_leaf(N, H, C) for _ in range(3)]
        fn = torch.ops.dfgnn.gt_fwd.default
    else:
        args = _meta(ops.gat_op_args(lay, torch.randn(N, H), torch.randn(N, H),
                                     torch.randn(N, H, C), 0.2))
        leaves = [_leaf(N, H), _leaf(N, H), _leaf(N, H, C)]
        fn = torch.ops.dfgnn.gat_fwd.default
    args[:3] = leaves
    return (leaves, *fn(*args))


@pytest.mark.parametrize("op", ["gt", "gat"])
def test_attention_backward_wiring(op):
    leaves, out, lse, attn = _attention_call(op)
    assert out.requires_grad and out.grad_fn is not None
    assert not lse.requires_grad and not attn.requires_grad  # row statistics, weights
    out.sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape


def test_no_grad_call_records_nothing():
    lay = _layout()
    args = _meta(ops.gt_op_args(lay, *(torch.randn(N, H, C) for _ in range(3)), 0.3))
    args[:3] = [_leaf(N, H, C) for _ in range(3)]
    with torch.no_grad():
        out, _, _ = torch.ops.dfgnn.gt_fwd.default(*args)
    assert out.grad_fn is None and not out.requires_grad


@pytest.mark.parametrize("which", [(), (2,), (0, 1)])
def test_node_only_when_an_input_requires_grad(which):
    # With grad enabled but no input requiring it, the autograd kernel calls the
    # op directly (no node); with some, only those inputs get a gradient.
    lay = _layout()
    args = _meta(ops.gt_op_args(lay, *(torch.randn(N, H, C) for _ in range(3)), 0.3))
    args[:3] = [torch.empty(N, H, C, device="meta", requires_grad=i in which) for i in range(3)]
    out, _, _ = torch.ops.dfgnn.gt_fwd.default(*args)
    assert out.requires_grad == bool(which) and (out.grad_fn is not None) == bool(which)
    if which:
        out.sum().backward()
        assert [args[i].grad is not None for i in range(3)] == [i in which for i in range(3)]


@pytest.mark.parametrize("op", ["l2norm", "agnn"])
@pytest.mark.parametrize("which", [(), ("beta",), ("x", "beta")])
def test_normalised_ops_node_only_when_required(op, which):
    # The same rule for l2norm_fwd and agnn_fwd: a node only when x or beta needs it.
    lay = _layout()
    x = torch.empty(N, H, C, device="meta", requires_grad="x" in which)
    beta = torch.empty(1, device="meta", requires_grad="beta" in which)
    if op == "l2norm":
        out = torch.ops.dfgnn.l2norm_fwd.default(x, beta, 1e-12)[1]  # q = beta k
    else:
        args = _meta(ops.agnn_op_args(lay, torch.randn(N, H, C), torch.ones(1), 1e-12))
        out = torch.ops.dfgnn.agnn_fwd.default(x, beta, *args[2:])[0]
    assert out.requires_grad == bool(which) and (out.grad_fn is not None) == bool(which)
    if which:
        out.sum().backward()
        assert (x.grad is not None) == ("x" in which) and beta.grad.shape == beta.shape


def test_backward_without_csc_raises_clearly():
    lay = _layout()
    args = _meta(ops.gt_op_args(lay, *(torch.randn(N, H, C) for _ in range(3)), 0.3,
                                need_grad=False))
    args[0] = _leaf(N, H, C)
    out, _, _ = torch.ops.dfgnn.gt_fwd.default(*args)
    with pytest.raises(RuntimeError, match="without the CSC layout"):
        out.sum().backward()


@pytest.mark.parametrize("use", ["k", "q", "both"])
def test_l2norm_backward_wiring(use):
    x, beta = _leaf(N, H, C), _leaf(1)
    k, q, rnorm = torch.ops.dfgnn.l2norm_fwd.default(x, beta, 1e-12)
    assert k.requires_grad and q.requires_grad and not rnorm.requires_grad
    loss = {"k": k.sum(), "q": q.sum(), "both": k.sum() + q.sum()}[use]
    loss.backward()  # an unused output gets a zero gradient, not an error
    assert x.grad.shape == x.shape and beta.grad.shape == beta.shape


def test_agnn_backward_wiring():
    lay = _layout()
    x, beta = _leaf(N, H, C), _leaf(1)
    args = _meta(ops.agnn_op_args(lay, torch.randn(N, H, C), torch.ones(1), 1e-12,
                                  need_attn=True))
    out, attn = torch.ops.dfgnn.agnn_fwd.default(x, beta, *args[2:])
    assert out.requires_grad and not attn.requires_grad
    assert attn.shape == (lay.num_edges, H)
    out.sum().backward()
    assert x.grad.shape == x.shape and beta.grad.shape == beta.shape


@pytest.mark.parametrize("op,name", [("gt", "dfgnn::GtAttentionBackward"),
                                     ("gat", "dfgnn::GatAttentionBackward")])
def test_attention_node_name_and_edges(op, name):
    # The hand-written node (cuda/glue/autograd.cpp, AttentionBackward): its name, and
    # one next edge per feature tensor, to that leaf's gradient accumulator.
    leaves, out, _, _ = _attention_call(op)
    assert out.grad_fn.name() == name
    nexts = [f for f, _ in out.grad_fn.next_functions]
    assert len(nexts) == 3 and all(type(f).__name__ == "AccumulateGrad" for f in nexts)
    assert [f.variable is leaf for f, leaf in zip(nexts, leaves)] == [True] * 3


@pytest.mark.parametrize("op", ["gt", "gat"])
def test_attention_backward_twice(op):
    # retain_graph keeps the saved tensors for a second backward; without it the
    # node frees them and a second backward raises PyTorch's usual error.
    leaves, out, _, _ = _attention_call(op)
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    assert all(leaf.grad is not None for leaf in leaves)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()


def test_attention_input_modified_in_place_raises():
    leaves, out, _, _ = _attention_call("gt")
    with torch.no_grad():
        leaves[1].mul_(2.0)  # k changed after the forward saved it
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_attention_saved_tensor_hooks_see_features_and_out():
    # q, k, v and out are saved as SavedVariables, so saved-tensor hooks (activation
    # offloading, non-reentrant checkpointing) see them; the layout is not saved that way.
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t

    def unpack(t):
        unpacked.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        _, out, _, _ = _attention_call("gt")
    assert packed == [(N, H, C)] * 4
    out.sum().backward()
    assert unpacked == [(N, H, C)] * 4


def test_attention_forward_ad_raises_clearly():
    import torch.autograd.forward_ad as fwAD
    lay = _layout()
    args = _meta(ops.gt_op_args(lay, *(torch.randn(N, H, C) for _ in range(3)), 0.3))
    with fwAD.dual_level():
        args[0] = fwAD.make_dual(args[0], torch.empty_like(args[0]))
        with pytest.raises(RuntimeError, match="forward-mode AD"):
            torch.ops.dfgnn.gt_fwd.default(*args)
