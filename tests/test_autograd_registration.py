"""The C++ autograd kernel of the fused attention op (``cuda/glue/attention.cpp``)
on ``meta`` tensors: no GPU needed, the op dispatches to its ``register_fake``
implementation below autograd. Checks the wiring for every score (which outputs
carry a gradient, that the backward op is called with the saved arguments and
returns a gradient of the right shape for every differentiable input, clear
errors); the values are checked on the GPU against the reference
(``test_cuda_*.py``)."""
import pytest
import torch

import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

pytestmark = pytest.mark.skipif(not pyg_dfgnn.HAS_EXTENSION,
                                reason="needs the compiled extension pyg_dfgnn._C")

N, H, C = 5, 2, 8
# score -> (input shapes, params) of an attention_fwd call on the 5-node graph
CALLS = {
    "dot": ([(N, H, C)] * 3, (0.3,)),
    "additive": ([(N, H), (N, H), (N, H, C)], (0.2,)),
    "cosine": ([(N, H, C), (1,)], (1e-12,)),
    "dot_edge": ([(N, H, C)] * 3 + [(7, H, C)], (0.3,)),  # e: one row per edge of _layout
    # a: a 4-channel tail per edge, completing keys and values of C - 4 channels
    "dot_edge_tail": ([(N, H, C)] + [(N, H, C - 4)] * 2 + [(7, 4)], (0.3,)),
    "additive_edge": ([(N, H), (N, H), (N, H, C), (7, H)], (0.2,)),  # a_edge: one per edge
}


def _layout():
    ei = torch.tensor([[0, 1, 2, 3, 1, 4, 4], [1, 2, 3, 0, 0, 0, 1]])
    lay = GraphLayout.from_edge_index(ei, (N, N))
    lay.colptr  # noqa: B018  (CSC built, as a cached layout has it)
    return lay


def _args(score, requires=None, need_grad=True, need_attn=False):
    """attention_fwd's arguments on meta leaves; ``requires``: the inputs that
    require a gradient (all by default)."""
    shapes, params = CALLS[score]
    real = [torch.randn(s) for s in shapes]
    args = list(ops.op_args(score, _layout(), real, params, need_grad=need_grad,
                            need_attn=need_attn))
    args[0] = [torch.empty(s, device="meta", requires_grad=requires is None or i in requires)
               for i, s in enumerate(shapes)]
    return args


def _call(score, **kw):
    args = _args(score, **kw)
    return (args[0], *torch.ops.dfgnn.attention_fwd.default(*args))


@pytest.mark.parametrize("score", list(CALLS))
def test_attention_backward_wiring(score):
    leaves, out, lse, attn, token, saved = _call(score)
    assert out.requires_grad and out.grad_fn is not None
    assert not lse.requires_grad and not attn.requires_grad  # row statistics, weights
    assert not any(t.requires_grad for t in saved) and not token.requires_grad
    out.sum().backward()
    for leaf in leaves:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape


@pytest.mark.parametrize("score", list(CALLS))
def test_no_grad_call_records_nothing(score):
    args = _args(score)
    with torch.no_grad():
        out = torch.ops.dfgnn.attention_fwd.default(*args)[0]
    assert out.grad_fn is None and not out.requires_grad


@pytest.mark.parametrize("which", [(), (2,), (0, 1)])
def test_node_only_when_an_input_requires_grad(which):
    # With grad enabled but no input requiring it, the autograd kernel calls the
    # op directly (no node); with some, only those inputs get a gradient.
    args = _args("dot", requires=which)
    out = torch.ops.dfgnn.attention_fwd.default(*args)[0]
    assert out.requires_grad == bool(which) and (out.grad_fn is not None) == bool(which)
    if which:
        out.sum().backward()
        assert [t.grad is not None for t in args[0]] == [i in which for i in range(3)]


def test_fake_shapes_follow_the_score_spec():
    _, out, lse, attn, token, saved = _call("additive", need_attn=True)
    assert out.shape == (N, H, C) and lse.shape == (N, H) and attn.shape == (7, H)
    assert saved == [] and token.shape == (1,) and token.device.type == "cpu"
    _, out, _, attn, _, saved = _call("cosine")
    assert out.shape == (N, H, C) and attn.shape == (0,)
    assert [t.shape for t in saved] == [(N, H)]  # fp32: rnorm only


def test_backward_without_csc_raises_clearly():
    args = _args("dot", requires=(0,), need_grad=False)
    out = torch.ops.dfgnn.attention_fwd.default(*args)[0]
    with pytest.raises(RuntimeError, match="without the CSC layout"):
        out.sum().backward()


@pytest.mark.parametrize("score", list(CALLS))
def test_attention_node_name_and_edges(score):
    # The hand-written node (cuda/glue/attention.cpp, AttentionBackward): its name,
    # and one next edge per input, to that leaf's gradient accumulator.
    leaves, out = _call(score)[:2]
    assert out.grad_fn.name() == "dfgnn::AttentionBackward"
    nexts = [f for f, _ in out.grad_fn.next_functions]
    assert len(nexts) == len(leaves) and all(type(f).__name__ == "AccumulateGrad" for f in nexts)
    assert [f.variable is leaf for f, leaf in zip(nexts, leaves)] == [True] * len(leaves)


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_attention_backward_twice(score):
    # retain_graph keeps the saved tensors for a second backward; without it the
    # node frees them and a second backward raises PyTorch's usual error.
    leaves, out = _call(score)[:2]
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    assert all(leaf.grad is not None for leaf in leaves)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()


def test_attention_input_modified_in_place_raises():
    leaves, out = _call("dot")[:2]
    with torch.no_grad():
        leaves[1].mul_(2.0)  # k changed after the forward saved it
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_attention_saved_tensor_hooks_see_inputs_and_out():
    # The inputs and out are saved as SavedVariables, so saved-tensor hooks
    # (activation offloading, non-reentrant checkpointing) see them; the layout
    # (in the plan object) is not saved that way.
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t

    def unpack(t):
        unpacked.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = _call("dot")[1]
    assert packed == [(N, H, C)] * 4
    out.sum().backward()
    assert unpacked == [(N, H, C)] * 4


def test_attention_forward_ad_raises_clearly():
    import torch.autograd.forward_ad as fwAD
    args = _args("dot")
    with fwAD.dual_level():
        args[0][0] = fwAD.make_dual(args[0][0], torch.empty_like(args[0][0]))
        with pytest.raises(RuntimeError, match="forward-mode AD"):
            torch.ops.dfgnn.attention_fwd.default(*args)


def test_plan_object_rejects_a_malformed_layout():
    lay = _layout()
    t = {"rowptr": lay.rowptr, "col": lay.col, "row_items": torch.zeros(1, 3, dtype=torch.int32),
         "row_combine": torch.zeros(0, 3, dtype=torch.int32)}
    ints = {"n_src": N, "chunk": 8, "row_slots": 0, "col_slots": 0, "pmf": 0, "vector_rows": 1,
            "two_rows": 0, "mma": 0, "merge_in_kernel": 1, "bwd_one_launch": 0,
            "mma_backward": 0, "bwd_merge_in_kernel": 1, "normalize_first": 0}
    torch.classes.dfgnn.Plan("dot", t, ints, {})  # well formed
    first = {**ints, "normalize_first": 1}
    assert torch.classes.dfgnn.Plan("cosine", t, first, {}).normalize_first()
    with pytest.raises(RuntimeError, match="the dot score has no normalised form"):
        torch.classes.dfgnn.Plan("dot", t, first, {})
    with pytest.raises(RuntimeError, match="unknown layout entry 'rowpointer'"):
        torch.classes.dfgnn.Plan("dot", {**t, "rowpointer": lay.rowptr}, ints, {})
    with pytest.raises(RuntimeError, match="'chunk' is missing"):
        torch.classes.dfgnn.Plan("dot", t, {k: v for k, v in ints.items() if k != "chunk"}, {})
    with pytest.raises(RuntimeError, match="col must be int32"):
        torch.classes.dfgnn.Plan("dot", {**t, "col": lay.col.long()}, ints, {})
    with pytest.raises(RuntimeError, match="pmf needs csr_row"):
        torch.classes.dfgnn.Plan("dot", t, {**ints, "pmf": 1}, {})
    with pytest.raises(RuntimeError, match="all together"):
        torch.classes.dfgnn.Plan("dot", {**t, "colptr": lay.colptr}, ints, {})
    with pytest.raises(RuntimeError, match="no score function 'sigmoid'"):
        torch.classes.dfgnn.Plan("sigmoid", t, ints, {})
