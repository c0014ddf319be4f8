"""The extension's direct entry to the attention op (``_C.attention_fwd``,
``cuda/glue/python_entry.cpp``) against the ``torch.ops.dfgnn`` path, on ``meta``
tensors (no GPU needed): the same outputs, autograd node and gradients; clear
errors for bad arguments; ``NotImplemented`` for tensor subclasses, and the
``torch.ops`` path under torch function modes (``ops.direct.call_op``). Values on
the GPU: ``test_cuda_gt.py``."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

pytestmark = pytest.mark.skipif(not pyg_dfgnn.HAS_EXTENSION,
                                reason="needs the compiled extension pyg_dfgnn._C")

N, H, C = 5, 2, 8


def _args(score="dot", requires_grad=True):
    ei = torch.tensor([[0, 1, 2, 3, 1, 4, 4], [1, 2, 3, 0, 0, 0, 1]])
    lay = GraphLayout.from_edge_index(ei, (N, N))
    lay.colptr  # noqa: B018
    shapes = [(N, H, C)] * 3 if score == "dot" else [(N, H), (N, H), (N, H, C)]
    args = list(ops.op_args(score, lay, [torch.randn(s) for s in shapes], (0.3,)))
    args[0] = [torch.empty(s, device="meta", requires_grad=requires_grad) for s in shapes]
    return args


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_direct_entry_matches_torch_ops(score):
    args = _args(score)
    direct = pyg_dfgnn._C.attention_fwd(*args)
    wrapped = torch.ops.dfgnn.attention_fwd.default(*args)
    assert isinstance(direct, tuple) and len(direct) == len(wrapped) == 5
    assert isinstance(direct[4], list) and len(direct[4]) == len(wrapped[4])
    for a, b in zip(direct[:4], wrapped[:4]):
        assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        assert a.requires_grad == b.requires_grad
    assert type(direct[0].grad_fn).__name__ == type(wrapped[0].grad_fn).__name__
    direct[0].sum().backward()
    for leaf in args[0]:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape


def test_direct_entry_rejects_bad_arguments():
    args = _args()
    with pytest.raises(TypeError, match="dfgnn::attention_fwd: takes 8 positional arguments, "
                                        "got 7"):
        pyg_dfgnn._C.attention_fwd(*args[:-1])
    bad = list(args)
    bad[4] = ["0.3"]  # params
    with pytest.raises(TypeError, match="argument 'params' must be a list of floats, got str"):
        pyg_dfgnn._C.attention_fwd(*bad)
    bad = list(args)
    bad[0] = [[0, 1]] + list(bad[0][1:])
    with pytest.raises(TypeError, match="argument 'inputs' must be a list of Tensors, got list"):
        pyg_dfgnn._C.attention_fwd(*bad)
    bad = list(args)
    bad[0] = bad[0][0]  # a tensor, not a list
    with pytest.raises(TypeError, match="argument 'inputs' must be a list or tuple, got Tensor"):
        pyg_dfgnn._C.attention_fwd(*bad)
    bad = list(args)
    bad[2] = {"rowptr": None}  # not the plan object
    with pytest.raises(TypeError, match="argument 'plan' must be"):
        pyg_dfgnn._C.attention_fwd(*bad)
    bad = list(args)
    bad[7] = 1  # need_attn
    with pytest.raises(TypeError, match="argument 'need_attn' must be a bool, got int"):
        pyg_dfgnn._C.attention_fwd(*bad)


def test_direct_entry_takes_a_call_without_a_plan():
    """A call that names its plan by the layout's handle and a plan key (as
    compiled code makes it) converts ``None`` for the plan; on meta tensors the
    fake sizes the outputs from the key."""
    from pyg_dfgnn.ops import calls
    args = _args()
    args[2], args[3] = None, calls.plan_key("dot", "auto", True)
    out, lse, attn, token, saved = pyg_dfgnn._C.attention_fwd(*args)
    assert out.shape == (N, H, C) and lse.shape == (N, H) and attn.shape == (0,)
    assert token.shape == (1,) and saved == [] and out.grad_fn is not None


class _Sub(torch.Tensor):
    pass


def test_tensor_subclass_takes_the_torch_ops_path():
    from pyg_dfgnn.ops.direct import call_op
    args = _args(requires_grad=False)
    args[0][0] = args[0][0].as_subclass(_Sub)
    assert pyg_dfgnn._C.attention_fwd(*args) is NotImplemented
    out = call_op("attention_fwd", tuple(args))[0]  # falls back to torch.ops
    assert out.shape == (N, H, C)


class _Record(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("direct", [True, False])
def test_torch_function_modes_see_the_op(direct):
    from pyg_dfgnn.ops.direct import call_op
    args = tuple(_args())
    with ops.plan.override(direct_entry=direct), _Record() as mode:
        out = call_op("attention_fwd", args)[0]
    assert torch.ops.dfgnn.attention_fwd.default in mode.seen
    assert out.grad_fn is not None


def test_profiler_records_the_op_on_the_direct_entry():
    args = _args()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pyg_dfgnn._C.attention_fwd(*args)
    assert "dfgnn::attention_fwd" in {e.name for e in prof.events()}


def test_eager_overrides_decide_the_direct_entry(monkeypatch):
    """An eager caller passes the overrides it read (``plan.eager_overrides``) to
    ``call_op``, which takes the direct entry by them, not by those in effect."""
    from pyg_dfgnn.ops import direct
    args = tuple(_args())
    entered = []
    real = pyg_dfgnn._C.attention_fwd
    monkeypatch.setattr(direct._C, "attention_fwd", lambda *a: entered.append(1) or real(*a))
    with ops.plan.override(direct_entry=False):
        fields = ops.plan.eager_overrides()
        assert direct.call_op("attention_fwd", args, ())[0].shape == (N, H, C)
    assert entered == [1]
    assert direct.call_op("attention_fwd", args, fields)[0].shape == (N, H, C)
    assert entered == [1]
