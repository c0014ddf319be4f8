"""Faults: out of memory, streams and devices, graphs too large for int32 indices.

* An out-of-memory error in the middle of a forward or a backward leaves the
  layer, the layout cache and the process usable: under a memory cap a big batch
  raises ``torch.OutOfMemoryError``, a small batch then runs and is correct, and
  with the cap lifted the big batch gives the result it gives uncapped.
* The kernels run on the current stream and the inputs' device: on a side stream
  whose inputs are written behind a long kernel, or next to a busy default
  stream, the results are those of the float64 reference.
* A graph whose indices need int64 (``E``, ``N_src`` or ``N_dst`` >= 2^31) raises
  ``NotImplementedError`` on CUDA instead of running the reference path, whose
  ``[E, H, C]`` intermediates would not fit.
"""
from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch_geometric.nn import AGNNConv, GATConv, TransformerConv

from conftest import layer_grad_floor, random_graph, rel_err, rel_err_floor
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.layout_cache import attach_layout
from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv

LAYERS = {
    "gt": (TransformerConv, FusedTransformerConv, lambda f: dict(in_channels=f, out_channels=32,
                                                                  heads=4)),
    "gat": (GATConv, FusedGATConv, lambda f: dict(in_channels=f, out_channels=32, heads=4)),
    "agnn": (AGNNConv, FusedAGNNConv, lambda f: dict(requires_grad=True)),
}
FEATURES = 64  # input features (AGNN: also the output features, one head)


def make_pair(name: str, device="cuda"):
    """(native float64, fused float32) layers with the same perturbed parameters."""
    native_cls, fused_cls, ctor = LAYERS[name]
    native = native_cls(**ctor(FEATURES))
    with torch.no_grad():
        for p in native.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    fused = fused_cls(**ctor(FEATURES))
    fused.load_state_dict(native.state_dict())
    return copy.deepcopy(native).to(device, torch.float64), fused.to(device)


#: Memory (bytes) the capped process keeps beyond half of the big call's need, for
#: the retry (see test_out_of_memory_leaves_layer_cache_and_process_usable).
RETRY_HEADROOM = 64 * 2**20


def fwd_bwd(layer, x, edge_index, w):
    """Output and the gradients of ``(out * w).sum()`` w.r.t. ``x`` and the parameters."""
    x = x.detach().requires_grad_()
    out = layer(x, edge_index)
    grads = torch.autograd.grad((out * w.to(out.dtype)).sum(), [x, *layer.parameters()])
    return out.detach(), grads


def _to_cpu(result):
    out, grads = result
    return out.cpu(), [g.cpu() for g in grads]


def assert_close(got, want):
    """Output and gradients against float64, gradients with the layer's floor
    (:func:`conftest.layer_grad_floor`)."""
    out, grads = got
    out_r, grads_r = want
    assert rel_err(out, out_r) < 1e-5
    floor = layer_grad_floor(grads_r)
    for a, b in zip(grads, grads_r):
        assert rel_err_floor(a, b, floor) < 1e-4


def graph(n: int, e: int, device="cuda"):
    ei = random_graph(n, n, num_edges=e, num_isolated=max(1, n // 50), num_duplicates=e // 100)
    return ei.to(device)


# ----------------------------------------------------------------------------- out of memory
def _needs(layer, x, edge_index, w):
    """Bytes the forward and the forward + backward allocate at their peaks, beyond
    what is allocated before the call, for ``edge_index`` without a cached layout."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    xg = x.detach().requires_grad_()
    out = layer(xg, edge_index)
    torch.cuda.synchronize()
    fwd = torch.cuda.max_memory_allocated()
    torch.autograd.grad((out * w).sum(), [xg, *layer.parameters()])
    torch.cuda.synchronize()
    return fwd - base, torch.cuda.max_memory_allocated() - base


@pytest.mark.cuda
@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_out_of_memory_leaves_layer_cache_and_process_usable(name, phase):
    native, fused = make_pair(name)
    big_ei = graph(200_000, 4_000_000)
    x_big = torch.randn(200_000, FEATURES, device="cuda")
    small_ei = graph(2_000, 20_000)
    x_small = torch.randn(2_000, FEATURES, device="cuda")
    w_big = torch.randn(200_000, 128 if name != "agnn" else FEATURES, device="cuda")
    w_small = w_big[:2_000]

    # Uncapped: the reference result of the big batch and its memory profile
    # (on a copy of edge_index, so the capped call below builds its layout).
    need_fwd, need_bwd = _needs(fused, x_big, big_ei.clone(), w_big)
    expected = _to_cpu(fwd_bwd(fused, x_big, big_ei.clone(), w_big))  # off the capped device
    # PyG's float64 result of the small batch, before the cap: computed under it, PyG's
    # own float64 message passing ran out of memory when other processes shared the
    # GPU (the suite beside the four sanitizers).
    want_small = fwd_bwd(native, x_small.double(), small_ei, w_small.double())
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    xg = x_big.detach().requires_grad_()
    out = None
    if phase == "backward":
        # The forward runs uncapped and the cap is set for what the backward adds to
        # the forward's saved state, so the error comes from the backward whatever
        # the forward's transient peak (the layout build's scratch, for one).
        start = torch.cuda.memory_allocated()
        out = fused(xg, big_ei)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        need = start + need_bwd - torch.cuda.memory_allocated()
        if need < 128 * 2**20:
            pytest.skip("the backward needs little more memory than the forward keeps")
    else:
        need = need_fwd
    # The cap limits reserved memory. Segments that live tensors keep after
    # empty_cache() hold free space (reserved - allocated) the capped call may use:
    # the cap gives the call max(half of what it needs, that space) and the retry's small
    # tensors RETRY_HEADROOM beyond what is reserved. Counting from the allocated
    # memory alone left the retry no room (GAT and AGNN under pytest -n 8); from the
    # reserved memory alone, a large free space let the capped call finish.
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    cap = max(allocated + need // 2, reserved) + RETRY_HEADROOM
    free = reserved - allocated
    if free + RETRY_HEADROOM >= need:
        # Earlier tests in this process (pytest -n) left segments whose free space
        # holds the whole call: no cap at or above the reserved memory can fail it.
        pytest.skip(f"the allocator's segments hold {free / 2**20:.0f} MiB free, the "
                    f"{phase} needs {need / 2**20:.0f} MiB: no cap can fail it")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)
    try:
        raised = False
        try:  # no pytest.raises: its traceback would keep the big tensors alive
            if phase == "forward":
                out = fused(xg, big_ei)
            else:
                torch.autograd.grad((out * w_big).sum(), [xg, *fused.parameters()])
        except torch.OutOfMemoryError:
            raised = True
        out = xg = None
        gc.collect()
        assert raised, f"no out-of-memory error in the {phase} under a cap of " \
                       f"{cap / 2**20:.0f} MiB"
        # Under the cap: a small batch runs and is correct.
        got = fwd_bwd(fused, x_small, small_ei, w_small)
        torch.cuda.synchronize()
        assert_close(got, want_small)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()
    # Cap lifted: the same layer on the same edge_index (whatever its cache holds
    # after the failed call) gives the uncapped result, bit for bit.
    again = _to_cpu(fwd_bwd(fused, x_big, big_ei, w_big))
    assert torch.equal(again[0], expected[0])
    for a, b in zip(again[1], expected[1]):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- streams
SLEEP_CYCLES = 1_000_000_000  # torch.cuda._sleep: about half a second on an H100


@pytest.mark.cuda
@pytest.mark.parametrize("busy", ["side", "default"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_kernels_run_on_the_current_stream(name, busy):
    """Forward and backward on a side stream. ``busy="side"``: the inputs are
    written on the side stream behind a long kernel, so a kernel launched on
    another stream reads them unwritten. ``busy="default"``: a long kernel holds
    the default stream, so a kernel launched there writes its output after the
    side stream has copied it to the host."""
    native, fused = make_pair(name)
    n = 3_000
    ei = graph(n, 40_000)
    x_true = torch.randn(n, FEATURES, device="cuda")
    w = torch.randn(n, 128 if name != "agnn" else FEATURES, device="cuda")
    want = fwd_bwd(native, x_true.double(), ei, w.double())
    fwd_bwd(fused, torch.randn_like(x_true), ei, w)  # layout, work items: no host sync below
    x = torch.full_like(x_true, float("nan"))
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    if busy == "default":
        torch.cuda._sleep(SLEEP_CYCLES)
    with torch.cuda.stream(side):
        if busy == "side":
            torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(x_true)
        xg = x.requires_grad_()
        out = fused(xg, ei)
        grads = torch.autograd.grad((out * w).sum(), [xg, *fused.parameters()])
        busy_stream = side if busy == "side" else torch.cuda.default_stream()
        assert not busy_stream.query(), ("the call synchronised with the host: the test "
                                         "cannot see a kernel on the wrong stream")
        got = _to_cpu((out.detach(), grads))  # waits for `side` only
    torch.cuda.synchronize()
    assert_close(got, _to_cpu(want))


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(LAYERS))
def test_kernels_run_on_the_inputs_device(name):
    """Inputs on ``cuda:1`` while ``cuda:0`` is the current device."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    native, fused = make_pair(name, "cuda:1")
    ei = graph(2_000, 30_000, "cuda:1")
    x = torch.randn(2_000, FEATURES, device="cuda:1")
    w = torch.randn(2_000, 128 if name != "agnn" else FEATURES, device="cuda:1")
    with torch.cuda.device(0):
        got = fwd_bwd(fused, x, ei, w)
        assert got[0].device == torch.device("cuda:1")
    torch.cuda.synchronize(1)
    assert_close(got, fwd_bwd(native, x.double(), ei, w.double()))


# ----------------------------------------------------------------------------- int64 indices
def as_int64(layout: GraphLayout) -> GraphLayout:
    """The same graph with int64 index tensors, as :meth:`GraphLayout.from_edge_index`
    builds them when ``E``, ``N_src`` or ``N_dst`` is 2^31 or more."""
    lay = GraphLayout(layout.rowptr.long(), layout.col.long(), layout.edge_perm,
                      layout.edge_index, layout.num_src, layout.num_dst,
                      layout.max_in_degree, layout.self_loops)
    return lay.prepare()


def _op_calls(lay, n, H=2, C=16, device="cpu"):
    q, k, v = (torch.randn(n, H, C, device=device) for _ in range(3))
    a_src, a_dst = torch.randn(n, H, device=device), torch.randn(n, H, device=device)
    x = torch.randn(n, C, device=device)
    return {
        "gt_attention": lambda: ops.gt_attention(lay, q, k, v),
        "gat_attention": lambda: ops.gat_attention(lay, a_src, a_dst, v),
        "agnn_attention": lambda: ops.agnn_attention(lay, x, None, 1.3),
    }


def test_int64_layout_on_cpu_runs_the_reference():
    """On CPU an int64 layout is fine (the reference path) and gives the int32 results."""
    n = 50
    lay = GraphLayout.from_edge_index(random_graph(n, num_edges=300), (n, n))
    big = as_int64(lay)
    assert lay.col.dtype == torch.int32 and big.col.dtype == torch.int64
    torch.manual_seed(0)
    ref = {k: f() for k, f in _op_calls(lay, n).items()}
    torch.manual_seed(0)
    got = {k: f() for k, f in _op_calls(big, n).items()}
    for k in ref:
        assert torch.equal(got[k], ref[k]), k


@pytest.mark.cuda
def test_int64_layout_on_cuda_raises():
    """Every op and every layer raises NotImplementedError naming the limit, and
    allocates nothing of the graph's ``[E, H, C]`` size first."""
    # Eighty edges per node, so an [E, H, C] tensor dwarfs what the layers may
    # allocate per node first (the joined projection and the q, k, v rows).
    n = 500
    ei = random_graph(n, num_edges=40_000).cuda()
    lay = as_int64(GraphLayout.from_edge_index(ei, (n, n)))
    for name, call in _op_calls(lay, n, device="cuda").items():
        with pytest.raises(NotImplementedError, match=r"2\^31"):
            call()
    for name in LAYERS:
        _, fused = make_pair(name)
        loops = getattr(fused, "add_self_loops", False)
        edge_index = ei.clone()
        layout = as_int64(GraphLayout.from_edge_index(edge_index, (n, n),
                                                      add_self_loops=loops))
        attach_layout(edge_index, layout, (n, n), loops)
        x = torch.randn(n, FEATURES, device="cuda")
        x @ x.t()  # cuBLAS's workspace comes from the caching allocator: before the count
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with pytest.raises(NotImplementedError, match=r"2\^31"):
            fused(x, edge_index)
        # q, k, v ([N, H, C]) may exist; an [E, H, C] message tensor may not.
        assert torch.cuda.max_memory_allocated() - before < layout.num_edges * 128 * 4, name
