"""Fused layers on CUDA tensors without the compiled kernels: one warning per
process with the reason, then PyG's own forward (native speed), never the
pure-PyTorch reference path, which is the CPU path only."""
from __future__ import annotations

import types
import warnings

import pytest
import torch
from torch_geometric.nn import AGNNConv, GATConv, TransformerConv

import pyg_dfgnn.extension as ext
import pyg_dfgnn.nn._common as common
import pyg_dfgnn.nn.agnn_conv as agnn_mod
import pyg_dfgnn.nn.gat_conv as gat_mod
import pyg_dfgnn.nn.transformer_conv as gt_mod
from conftest import random_graph
from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv

LAYERS = {
    "gt": (TransformerConv, FusedTransformerConv, (16, 8), dict(heads=2)),
    "gat": (GATConv, FusedGATConv, (16, 8), dict(heads=2)),
    "agnn": (AGNNConv, FusedAGNNConv, (), {}),
}


class Calls:
    """Counts calls of the fused ops and of the layout build made by the layers."""

    def __init__(self, monkeypatch):
        self.n = 0
        for mod, names in ((gt_mod, ("gt_attention", "get_layout")),
                           (gat_mod, ("gat_attention", "get_layout")),
                           (agnn_mod, ("agnn_attention", "get_layout"))):
            for name in names:
                monkeypatch.setattr(mod, name, self._wrap(getattr(mod, name)))

    def _wrap(self, fn):
        def wrapper(*args, **kwargs):
            self.n += 1
            return fn(*args, **kwargs)
        return wrapper


def _pair(kind, device):
    native_cls, fused_cls, args, kwargs = LAYERS[kind]
    native = native_cls(*args, **kwargs).to(device)
    fused = fused_cls(*args, **kwargs).to(device)
    fused.load_state_dict(native.state_dict())
    return native, fused


def _check_runs_pyg(kind, device, monkeypatch):
    monkeypatch.setattr(common, "_warned_missing_kernels", False)
    calls = Calls(monkeypatch)
    native, fused = _pair(kind, device)
    x = torch.randn(30, 16, device=device)
    ei = random_graph(30, num_edges=120).to(device)
    with pytest.warns(UserWarning, match="no fused CUDA kernels") as rec:
        out = fused(x, ei)
    assert len([w for w in rec if "no fused CUDA kernels" in str(w.message)]) == 1
    assert "python -m pyg_dfgnn info" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call (any fused layer) is silent
        again = _pair("gt" if kind != "gt" else "gat", device)[1](x, ei)
        out2 = fused(x, ei)
    assert calls.n == 0, "pyg_dfgnn.ops (or the layout build) ran"
    ref = native(x, ei)
    # The same PyG forward on the same parameters: the same numbers, bit for bit on
    # the CPU; on a GPU PyG's scatters use atomics, whose order may change the last bits.
    tol = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(out2, ref, **tol)
    assert again.shape[0] == 30
    return rec[0]


@pytest.mark.parametrize("kind", list(LAYERS))
def test_missing_kernels_run_pyg_forward_once_warned(kind, monkeypatch):
    """With the source of truth saying the kernels are missing (simulated on the
    CPU), each fused layer warns once and computes with PyG's forward."""
    monkeypatch.setattr(common, "missing_kernels_reason",
                        lambda x: "pyg_dfgnn._C not built: simulated")
    w = _check_runs_pyg(kind, "cpu", monkeypatch)
    assert "simulated" in str(w.message) and LAYERS[kind][1].__name__ in str(w.message)


@pytest.mark.parametrize("kind", list(LAYERS))
def test_cpu_runs_reference_path_silently(kind, monkeypatch):
    """On the CPU the reference path is the intended one: no warning, the ops run."""
    monkeypatch.setattr(common, "_warned_missing_kernels", False)
    monkeypatch.setattr(ext, "HAS_EXTENSION", False)
    calls = Calls(monkeypatch)
    _, fused = _pair(kind, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused(torch.randn(30, 16), random_graph(30, num_edges=120))
    assert calls.n > 0


def test_missing_kernels_reason_source_of_truth(monkeypatch):
    """CUDA tensors without a loaded extension get the install's reason; CPU
    tensors and a loaded extension get none."""
    cuda_like = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(ext, "HAS_EXTENSION", False)
    monkeypatch.setattr(ext, "_BUILT", False)
    monkeypatch.setattr(ext, "install_record", lambda: {"extension": False,
                                                        "reason": "PYG_DFGNN_NO_EXT=1 was set"})
    assert common.missing_kernels_reason(cuda_like) == (
        "pyg_dfgnn._C not built: PYG_DFGNN_NO_EXT=1 was set")
    assert common.missing_kernels_reason(torch.zeros(1)) == ""
    monkeypatch.setattr(ext, "HAS_EXTENSION", True)
    assert common.missing_kernels_reason(cuda_like) == ""


@pytest.mark.cuda
@pytest.mark.parametrize("kind", list(LAYERS))
def test_missing_kernels_on_gpu(kind, monkeypatch):
    """On a GPU with the extension taken away: one warning, PyG's forward."""
    monkeypatch.setattr(ext, "HAS_EXTENSION", False)
    w = _check_runs_pyg(kind, "cuda", monkeypatch)
    assert "not built" in str(w.message) or "failed to load" in str(w.message)
