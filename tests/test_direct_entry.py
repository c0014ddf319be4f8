"""The extension's direct entry to the forward ops (``_C.gt_fwd`` and the like,
``cuda/glue/python_entry.cpp``) against the ``torch.ops.dfgnn`` path, on ``meta``
tensors (no GPU needed): the same outputs, autograd node and gradients; clear
errors for bad arguments; ``NotImplemented`` for tensor subclasses, and the
``torch.ops`` path under torch function modes (``ops._call_op``). Values on the
GPU: ``test_cuda_gt.py``."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

import pyg_dfgnn
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

pytestmark = pytest.mark.skipif(not pyg_dfgnn.HAS_EXTENSION,
                                reason="needs the compiled extension pyg_dfgnn._C")

N, H, C = 5, 2, 8


def _args(op, requires_grad=True):
    ei = torch.tensor([[0, 1, 2, 3, 1, 4, 4], [1, 2, 3, 0, 0, 0, 1]])
    lay = GraphLayout.from_edge_index(ei, (N, N))
    lay.colptr  # noqa: B018
    if op == "gt_fwd":
        args = list(ops.gt_op_args(lay, *(torch.randn(N, H, C) for _ in range(3)), 0.3))
        shapes = [(N, H, C)] * 3
    else:
        args = list(ops.gat_op_args(lay, torch.randn(N, H), torch.randn(N, H),
                                    torch.randn(N, H, C), 0.2))
        shapes = [(N, H), (N, H), (N, H, C)]
    args = [[t.to("meta") if isinstance(t, torch.Tensor) else t for t in a]
            if isinstance(a, tuple) and any(isinstance(t, torch.Tensor) for t in a)
            else a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    args[:3] = [torch.empty(s, device="meta", requires_grad=requires_grad) for s in shapes]
    return args


@pytest.mark.parametrize("op", ["gt_fwd", "gat_fwd"])
def test_direct_entry_matches_torch_ops(op):
    args = _args(op)
    direct = getattr(pyg_dfgnn._C, op)(*args)
    wrapped = getattr(torch.ops.dfgnn, op).default(*args)
    assert isinstance(direct, tuple) and len(direct) == len(wrapped) == 3
    for a, b in zip(direct, wrapped):
        assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        assert a.requires_grad == b.requires_grad
    assert type(direct[0].grad_fn).__name__ == type(wrapped[0].grad_fn).__name__
    direct[0].sum().backward()
    for leaf in args[:3]:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape


def test_direct_entry_rejects_bad_arguments():
    args = _args("gt_fwd")
    with pytest.raises(TypeError, match="dfgnn::gt_fwd: takes 12 positional arguments, got 11"):
        pyg_dfgnn._C.gt_fwd(*args[:-1])
    bad = list(args)
    bad[5] = list(bad[5][:2]) + ["32"]  # sizes: row_slots, col_slots, chunk
    with pytest.raises(TypeError, match="argument 'sizes' must be a list of ints, got str"):
        pyg_dfgnn._C.gt_fwd(*bad)
    bad = list(args)
    bad[3] = [[0, 1]] + list(bad[3][1:])  # csr: rowptr
    with pytest.raises(TypeError, match="argument 'csr' must be a list of Tensors, got list"):
        pyg_dfgnn._C.gt_fwd(*bad)
    bad = list(args)
    bad[3] = bad[3][0]  # csr: a tensor, not a list
    with pytest.raises(TypeError, match="argument 'csr' must be a list or tuple, got Tensor"):
        pyg_dfgnn._C.gt_fwd(*bad)
    bad = list(args)
    bad[9] = 1  # need_attn
    with pytest.raises(TypeError, match="argument 'need_attn' must be a bool, got int"):
        pyg_dfgnn._C.gt_fwd(*bad)


class _Sub(torch.Tensor):
    pass


def test_tensor_subclass_takes_the_torch_ops_path():
    args = _args("gt_fwd", requires_grad=False)
    args[0] = args[0].as_subclass(_Sub)
    assert pyg_dfgnn._C.gt_fwd(*args) is NotImplemented
    out, _, _ = ops._call_op("gt_fwd", tuple(args))  # falls back to torch.ops
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
    args = tuple(_args("gt_fwd"))
    with ops.plan.override(direct_entry=direct), _Record() as mode:
        out, _, _ = ops._call_op("gt_fwd", args)
    assert torch.ops.dfgnn.gt_fwd.default in mode.seen
    assert out.grad_fn is not None


def test_profiler_records_the_op_on_the_direct_entry():
    args = _args("gt_fwd")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pyg_dfgnn._C.gt_fwd(*args)
    assert "dfgnn::gt_fwd" in {e.name for e in prof.events()}
