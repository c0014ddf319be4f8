"""Shared helpers and fixtures of the pyg_dfgnn tests.

Helpers are plain functions (``from conftest import random_graph, rel_err``) so
that parametrised tests can call them with their own sizes.
"""
from __future__ import annotations

import collections
import contextlib
import importlib.util
import sys
import zlib
from pathlib import Path
from typing import Optional

import pytest
import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csr_tensor

import pyg_dfgnn
from benchmarks import datasets

#: Tests that read real graphs: the data folder ($PYG_DFGNN_DATA) must exist.
needs_data = pytest.mark.skipif(datasets.data_dir() is None or not datasets.data_dir().is_dir(),
                                reason="no data folder ($PYG_DFGNN_DATA; make test sets it)")

# ----------------------------------------------------------------------------- options
def pytest_addoption(parser):
    parser.addoption("--fuzz-profile", choices=("ci", "gpu"), default="ci",
                     help="profile of tests/test_fuzz.py: 'ci' (CPU, seeded, about a "
                          "minute) or 'gpu' (CUDA, >= 2,000 cases)")


# ----------------------------------------------------------------------------- markers
def pytest_collection_modifyitems(config, items):
    """Tests marked ``@pytest.mark.cuda`` need a GPU and the compiled extension; so
    do the fuzz tests under ``--fuzz-profile=gpu``."""
    if config.getoption("--fuzz-profile") == "gpu":
        for item in items:
            if "fuzz" in item.keywords:
                item.add_marker(pytest.mark.cuda)
    if pyg_dfgnn.has_cuda_kernels():
        return
    reason = "needs a CUDA GPU and the compiled extension pyg_dfgnn._C"
    if not pyg_dfgnn.HAS_EXTENSION:
        reason += f" (load error: {pyg_dfgnn.load_error()})"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """One line per skip reason with its count, where ``-rs`` would print one line
    per skipped test (most of them the same "needs a CUDA GPU")."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts = collections.Counter()
    for rep in skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        counts[reason.removeprefix("Skipped: ")] += 1
    terminalreporter.section(f"{len(skipped)} skipped, by reason")
    for reason, n in counts.most_common():
        terminalreporter.line(f"{n:5d}  {reason}")


# ----------------------------------------------------------------------------- helpers
ROOT = Path(__file__).resolve().parents[1]

# The tests that read real graphs find them as the scripts do
# (benchmarks.datasets.data_dir): in $PYG_DFGNN_DATA, which `make test` sets; they
# skip without it rather than download.


def load_script(relpath: str):
    """Imports the script ``<repository>/<relpath>`` (e.g. ``examples/train.py``)
    as a module, registered in ``sys.modules``: ``torch.compile`` looks a traced
    function's module up there by name to read its globals."""
    path = ROOT / relpath
    name = f"_script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_benchmark(name: str):
    """Imports ``benchmarks/<name>.py`` as a module."""
    return importlib.import_module(f"benchmarks.{name}")


def fail_for(monkeypatch, module, name: str, first, error: Exception) -> None:
    r"""Replaces ``module.name`` so that a call whose first argument is ``first``
    raises ``error``; other calls go through (a benchmark's one failing case)."""
    real = getattr(module, name)

    def patched(arg, *args, **kwargs):
        if arg == first:
            raise error
        return real(arg, *args, **kwargs)
    monkeypatch.setattr(module, name, patched)


def stable_seed(*parts) -> int:
    r"""A seed made from a test's parameters, the same in every process: ``hash``
    of a ``str`` is salted per process (``PYTHONHASHSEED``), so a failure seeded
    by it would not come back when the test runs again."""
    return zlib.crc32(repr(parts).encode())


def rel_err(a: Tensor, b: Tensor) -> float:
    r"""``||a - b|| / ||b||`` in float64 (absolute error when ``b`` is zero).

    Fails (returns ``inf``) on a shape mismatch or a NaN/Inf in either tensor, so a
    test that compares two broken results cannot pass."""
    if a.shape != b.shape:
        return float("inf")
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    den = b.norm()
    num = (a - b).norm()
    return float(num / den) if den > 0 else float(num)


#: Over a tolerance, a fused result's error may be at most this times the error of
#: a native (PyG or pure-PyTorch reference) evaluation in the same dtype: both are
#: the rounding noise of an ill-conditioned result there, whose ratio scatters.
#: GATConv with edge features in fp16, one channel over two heads, had an
#: ``att_src`` gradient (a sum over 76 nodes that nearly cancels) 1.03e-2 off
#: float64 against PyG's 2.2e-3, a ratio of 4.6.
NATIVE_FACTOR = 5.0


def rel_err_floor(a: Tensor, b: Tensor, floor: float = 1e-2) -> float:
    r"""``||a - b|| / max(||b||, floor * sqrt(numel))``: :func:`rel_err` for results
    that may be zero in exact arithmetic (the key bias's gradient in attention, or
    the score gradients of equal duplicate edges: only rounding noise, in float64
    too), compared absolutely once their RMS is below ``floor``. ``inf`` on NaN,
    Inf or a shape mismatch."""
    err = rel_err(a, b)
    scale = floor * b.numel() ** 0.5
    if err == float("inf") or scale == 0 or float(b.detach().double().norm()) >= scale:
        return err
    return float((a.detach().double() - b.detach().double()).norm()) / scale


def layer_grad_floor(grads, floor: float = 1e-2, fraction: float = 1e-2) -> float:
    r"""The :func:`rel_err_floor` floor for one layer's float64 reference gradients:
    ``floor``, or ``fraction`` of the largest gradient RMS if that is more. A
    gradient that is zero in exact arithmetic (the key bias's; the key weights'
    when every edge of a row is the same) holds the rounding noise of the terms it
    sums, whose size is the layer's, not its own."""
    rms = [float(g.detach().double().pow(2).mean().sqrt()) for g in grads
           if g is not None and g.numel()]
    return max([floor] + [fraction * r for r in rms])


def random_graph(num_src: int, num_dst: Optional[int] = None, num_edges: int = 60,
                 num_isolated: int = 2, num_duplicates: int = 5, num_self_loops: int = 0,
                 generator: Optional[torch.Generator] = None) -> Tensor:
    r"""A random ``[2, E]`` int64 ``edge_index`` (src, dst) in shuffled order with

    * ``num_isolated`` destination nodes that have no in-edge,
    * ``num_duplicates`` repeated edges,
    * ``num_self_loops`` self-loops ``(i, i)`` (square part of the graph only).

    The total number of edges is ``num_edges + num_duplicates + num_self_loops``.
    """
    num_dst = num_src if num_dst is None else num_dst
    g = generator
    isolated = torch.randperm(num_dst, generator=g)[:num_isolated]
    mask = torch.ones(num_dst, dtype=torch.bool)
    mask[isolated] = False
    allowed_dst = mask.nonzero().flatten()
    assert allowed_dst.numel() > 0
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    dst = allowed_dst[torch.randint(0, allowed_dst.numel(), (num_edges,), generator=g)]
    ei = torch.stack([src, dst])
    if num_duplicates:
        pick = torch.randint(0, num_edges, (num_duplicates,), generator=g)
        ei = torch.cat([ei, ei[:, pick]], 1)
    if num_self_loops:
        n = min(num_src, num_dst)
        cand = torch.tensor([i for i in range(n) if bool(mask[i])], dtype=torch.long)
        loops = cand[torch.randint(0, cand.numel(), (num_self_loops,), generator=g)]
        ei = torch.cat([ei, torch.stack([loops, loops])], 1)
    perm = torch.randperm(ei.size(1), generator=g)
    return ei[:, perm].contiguous()


def make_adj(kind: str, edge_index: Tensor, num_src: int, num_dst: int):
    """The same graph as each adjacency type PyG layers accept (sparse ones are adj_t)."""
    if kind == "coo":
        return edge_index.clone()
    if kind == "edge_index":
        return EdgeIndex(edge_index.clone(), sparse_size=(num_src, num_dst))
    if kind == "csr":
        return to_torch_csr_tensor(edge_index.flip(0), size=(num_dst, num_src))
    if kind == "sparse_coo":
        return to_torch_coo_tensor(edge_index.flip(0), size=(num_dst, num_src))
    if kind == "sparse_tensor":
        torch_sparse = pytest.importorskip("torch_sparse")
        return torch_sparse.SparseTensor(row=edge_index[1], col=edge_index[0],
                                         sparse_sizes=(num_dst, num_src))
    raise ValueError(kind)


def isolated_dst(edge_index: Tensor, num_dst: int) -> Tensor:
    """Destination nodes without in-edges."""
    deg = torch.bincount(edge_index[1], minlength=num_dst)
    return (deg == 0).nonzero().flatten()


def has_duplicates(edge_index: Tensor) -> bool:
    return torch.unique(edge_index, dim=1).size(1) < edge_index.size(1)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def seed(request):
    """Seeds torch's generator per test, from the test's id: every test draws its
    own inputs, reproducibly (``torch.manual_seed``)."""
    s = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(s)
    return s


@pytest.fixture
def build_count():
    """``build_count()`` = GraphLayout builds since the test started."""
    import pyg_dfgnn.layout as L
    start = L.BUILD_COUNT
    return lambda: L.BUILD_COUNT - start


@pytest.fixture
def plan_override():
    """``plan_override(**fields)`` applies :func:`pyg_dfgnn.ops.plan.override` until
    the test ends (fields of later calls add to earlier ones)."""
    from pyg_dfgnn.ops import plan
    with contextlib.ExitStack() as stack:
        yield lambda **fields: stack.enter_context(plan.override(**fields))
