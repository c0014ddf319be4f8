"""Multi-device and multi-process tests.

* Two GPUs (marked ``cuda``, skipped with fewer): every fused op, forward and
  backward, on tensors on ``cuda:1`` while ``cuda:0`` is current, matches the
  float64 reference, runs on ``cuda:1``'s current stream and allocates nothing on
  ``cuda:0``; layouts live on their graph's device.
* ``examples/multi_gpu.py`` under DistributedDataParallel: two gloo processes on
  the CPU (the fused layers' reference path) end with identical parameters; on
  GPUs the same with NCCL (two GPUs) or two processes on one GPU (gloo).
"""
from __future__ import annotations

import json
import math
import os
import runpy
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, needs_data, random_graph, rel_err
from pyg_dfgnn import ops
from pyg_dfgnn.layout_cache import get_layout

EXAMPLE = ROOT / "examples" / "multi_gpu.py"

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

# torch.cuda._sleep cycles: about 0.1 s, far longer than the host needs to launch
# an op, so a kernel on any other stream than the busy one runs before its inputs
# are written.
SLEEP_CYCLES = 200_000_000


# ---------------------------------------------------------------- two GPUs: ops
def _graph(n: int = 400):
    """Random edges (duplicates, isolated nodes) plus a node with 300 in-edges, so
    rows are split into several work items."""
    ei = random_graph(n, num_edges=5000)
    hub = torch.stack([torch.randint(0, n, (300,)), torch.full((300,), 1)])
    return torch.cat([ei, hub], 1), n


def _gt(strategy):
    return lambda lay, q, k, v: ops.gt_attention(lay, q, k, v, strategy=strategy)


def _gat(strategy):
    return lambda lay, a_src, a_dst, x: ops.gat_attention(lay, a_src, a_dst, x,
                                                          strategy=strategy)


def _agnn(strategy):
    return lambda lay, x, beta: ops.agnn_attention(lay, x, None, beta, strategy=strategy)


def _inputs(op: str, n: int, dtype=torch.float32):
    H, C = 2, 32
    if op == "gt":
        return [torch.randn(n, H, C, dtype=dtype) for _ in range(3)]
    if op == "gat":
        return [torch.randn(n, H, dtype=dtype), torch.randn(n, H, dtype=dtype),
                torch.randn(n, H, C, dtype=dtype)]
    return [torch.randn(n, C, dtype=dtype), torch.tensor([1.5], dtype=torch.float32)]


def _reference(fn, ei, n, inputs, grad_out):
    """Output and input gradients of ``fn`` in float64 on the CPU (reference path)."""
    lay = get_layout(ei, size=(n, n))
    xs = [t.detach().double().requires_grad_() for t in inputs]
    out = fn(lay, *xs)
    out.backward(grad_out.double())
    return out.detach(), [x.grad for x in xs]


def _run_on_busy_stream(fn, lay, inputs, grad_out, backward: bool):
    r"""Runs ``fn(lay, *inputs)`` (and its backward) with ``cuda:0`` current and a
    side stream current on ``cuda:1`` that first sleeps, then writes the inputs
    (NaN until then). A kernel on another stream or device reads NaN or faults.
    Asserts that nothing was allocated on ``cuda:0`` meanwhile."""
    dev1 = torch.device("cuda", 1)
    src = [t.to(dev1) for t in inputs]
    g_src = grad_out.to(dev1)
    xs = [torch.full_like(t, math.nan).requires_grad_(backward) for t in src]
    g = torch.full_like(g_src, math.nan)
    torch.cuda.synchronize(dev1)
    torch.cuda.set_device(0)
    torch.cuda.reset_peak_memory_stats(0)
    base = torch.cuda.memory_allocated(0)
    side = torch.cuda.Stream(device=dev1)
    prev = torch.cuda.current_stream(dev1)
    torch.cuda.set_stream(side)
    try:
        torch.cuda.set_device(1)
        torch.cuda._sleep(SLEEP_CYCLES)  # on the side stream
        with torch.no_grad():
            for x, s in zip(xs, src):
                x.copy_(s)
            g.copy_(g_src)
        torch.cuda.set_device(0)
        assert torch.cuda.current_device() == 0
        assert torch.cuda.current_stream(dev1) == side
        with torch.set_grad_enabled(backward):
            out = fn(lay, *xs)
            if backward:
                out.backward(g)
        side.synchronize()
    finally:
        torch.cuda.set_stream(prev)
        torch.cuda.set_device(0)
    assert torch.cuda.max_memory_allocated(0) == base, "the call allocated memory on cuda:0"
    assert out.device == dev1
    return out.detach(), [x.grad for x in xs] if backward else []


OPS = {"gt": _gt, "gat": _gat, "agnn": _agnn}


@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("backward", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("strategy", ["smmf", "pmf"])
@pytest.mark.parametrize("op", list(OPS))
def test_op_on_second_gpu_while_first_is_current(op, strategy, backward):
    ei, n = _graph()
    fn = OPS[op](strategy)
    inputs = _inputs(op, n)
    torch.cuda.set_device(0)
    lay = get_layout(ei.to("cuda:1"), size=(n, n)).prepare()
    with torch.no_grad():  # warm-up: fills the layout's caches
        shape = fn(lay, *[t.to("cuda:1") for t in inputs]).shape
    grad_out = torch.randn(shape)
    ref, ref_grads = _reference(fn, ei, n, inputs, grad_out)
    out, grads = _run_on_busy_stream(fn, lay, inputs, grad_out, backward)
    assert rel_err(out.cpu(), ref) < 1e-5
    for got, want in zip(grads, ref_grads):
        assert got is not None and got.device == torch.device("cuda", 1)
        assert rel_err(got.cpu(), want) < 1e-4


@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gt_on_second_gpu(dtype):
    """The tensor-core forward and its tile plan (fp16 / bf16, C = 32)."""
    ei, n = _graph()
    fn = _gt("smmf")
    inputs = _inputs("gt", n, dtype)
    torch.cuda.set_device(0)
    lay = get_layout(ei.to("cuda:1"), size=(n, n)).prepare()
    grad_out = torch.randn(n, 2, 32, dtype=dtype)
    ref, ref_grads = _reference(fn, ei, n, inputs, grad_out)
    out, grads = _run_on_busy_stream(fn, lay, inputs, grad_out, backward=True)
    assert rel_err(out.cpu(), ref) < 1e-2
    for got, want in zip(grads, ref_grads):
        assert rel_err(got.cpu(), want) < 1e-2


@pytest.mark.cuda
@two_gpus
def test_dropout_on_second_gpu_matches_first():
    """The in-kernel dropout mask depends on the seed only, not on the device."""
    ei, n = _graph()
    q, k, v = _inputs("gt", n)
    outs = []
    for dev in ("cuda:0", "cuda:1"):
        torch.cuda.set_device(0)
        lay = get_layout(ei.to(dev), size=(n, n))
        torch.manual_seed(5)
        outs.append(ops.gt_attention(lay, q.to(dev), k.to(dev), v.to(dev), dropout=0.3).cpu())
    assert rel_err(outs[1], outs[0]) < 1e-6
    assert rel_err(outs[0], ops.gt_attention(get_layout(ei, size=(n, n)), q, k, v)) > 1e-2


# ------------------------------------------------------------ two GPUs: layouts
@pytest.mark.cuda
@two_gpus
def test_layout_is_built_on_its_graphs_device():
    ei, n = _graph()
    want = get_layout(ei, size=(n, n)).prepare()
    torch.cuda.set_device(0)
    torch.cuda.reset_peak_memory_stats(0)
    base = torch.cuda.memory_allocated(0)
    lay = get_layout(ei.to("cuda:1"), size=(n, n)).prepare()
    torch.cuda.synchronize(1)
    assert torch.cuda.max_memory_allocated(0) == base
    assert lay.device == torch.device("cuda", 1)
    for name in ("rowptr", "col", "edge_perm", "colptr", "row", "perm"):
        got = getattr(lay, name)
        assert got.device == lay.device, name
        assert torch.equal(got.cpu().long(), getattr(want, name).long()), name


@pytest.mark.cuda
@two_gpus
def test_graph_moved_to_another_gpu_gets_its_own_layout():
    from torch_geometric.data import Data

    from pyg_dfgnn.nn import FusedGATConv
    from pyg_dfgnn.transforms import CacheLayout

    ei, n = _graph()
    data = CacheLayout()(Data(x=torch.randn(n, 16), edge_index=ei).to("cuda:0"))
    conv = FusedGATConv(16, 8, heads=2).to("cuda:0")
    out0 = conv(data.x, data.edge_index)
    lay0 = get_layout(data.edge_index, (n, n), add_self_loops=True)

    torch.cuda.set_device(0)
    moved = data.to("cuda:1")
    assert moved.dfgnn_layout.device == torch.device("cuda", 1)
    assert all(t.device == moved.dfgnn_layout.device
               for t in (moved.dfgnn_layout.rowptr, moved.dfgnn_layout.colptr))
    conv.to("cuda:1")
    out1 = conv(moved.x, moved.edge_index)
    lay1 = get_layout(moved.edge_index, (n, n), add_self_loops=True)
    assert lay1 is not lay0
    assert lay1.device == torch.device("cuda", 1) and lay0.device == torch.device("cuda", 0)
    assert out1.device == torch.device("cuda", 1)
    assert rel_err(out1.cpu(), out0.cpu()) < 1e-6


@pytest.mark.cuda
@two_gpus
def test_moved_layout_carries_everything_to_the_new_device():
    """GraphLayout.to copies the cached work items too; the copy computes the same."""
    ei, n = _graph()
    q, k, v = _inputs("gt", n)
    lay0 = get_layout(ei.to("cuda:0"), size=(n, n)).prepare()
    out0 = ops.gt_attention(lay0, q.cuda(0), k.cuda(0), v.cuda(0))
    lay1 = lay0.to("cuda:1")
    assert lay1.derived.work
    for t in lay1.derived.tensors():
        assert t.device == torch.device("cuda", 1)
    torch.cuda.set_device(0)
    out1 = ops.gt_attention(lay1, q.cuda(1), k.cuda(1), v.cuda(1))
    assert rel_err(out1.cpu(), out0.cpu()) < 1e-6


@pytest.mark.cuda
@two_gpus
def test_layout_on_another_device_than_the_features_raises():
    ei, n = _graph()
    q, k, v = (t.cuda(1) for t in _inputs("gt", n))
    with pytest.raises(ValueError, match="layout is on"):
        ops.gt_attention(get_layout(ei.cuda(0), size=(n, n)), q, k, v)


# ------------------------------------------------- examples/multi_gpu.py (DDP)
def _example(tmp_path, *args, env=None, timeout=300):
    """Runs the example (a timeout turns a hang into a failure); returns rank 0's
    JSON report. The ranks meet through a file store: no port is picked."""
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(EXAMPLE), *args, "--quick", "--check-params",
                           "--no-progress", "--json", str(out)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # quiet: no semaphore left to the resource tracker, no PyG import warning
    assert "leaked" not in proc.stderr and "FutureWarning" not in proc.stderr, proc.stderr
    return json.loads(out.read_text())


def _check_ddp_report(rep, world):
    assert rep["world_size"] == world
    assert rep["command"].startswith(f"python examples/multi_gpu.py --task {rep['task']} "), rep
    assert len(rep["date"]) == 10 and rep["date"][4] == "-", rep["date"]
    assert rep["steps"] > 0 and math.isfinite(rep["final_loss"])
    sums = rep["param_checksums"]
    assert len(sums) == world and len(set(sums)) == 1, sums
    assert sums[0] != rep["param_checksum_initial"], "training did not change the parameters"
    assert rep["test_samples"] > 0 and 0.0 <= rep["test_acc"] <= 1.0
    # Where a slow start-up goes: rank 0's parts of the run, in order, all timed.
    parts = rep["phase_s"]
    assert list(parts) == ["process_group", "data", "model", "train", "evaluate"], parts
    assert all(t > 0 for t in parts.values()), parts


@pytest.mark.parametrize("model", ["gat", "gt"])
def test_ddp_on_cpu_gives_every_rank_the_same_parameters(tmp_path, model):
    rep = _example(tmp_path, "--task", "graph", "--model", model, "--impl", "fused",
                   "--device", "cpu", "--nprocs", "2")
    _check_ddp_report(rep, 2)
    assert rep["backend"] == "gloo"


def test_ddp_four_ranks_on_cpu(tmp_path):
    """World size 4 (the four-GPU kind's) through the same code paths, on gloo:
    every rank ends with the same parameters, and the time split is reported
    (128 graphs: the quick set's 48 leave a rank no step after its warm-up)."""
    rep = _example(tmp_path, "--task", "graph", "--model", "gt", "--impl", "fused",
                   "--device", "cpu", "--nprocs", "4", "--time-split", "--graphs", "128")
    _check_ddp_report(rep, 4)
    assert rep["backend"] == "gloo"
    _check_time_split(rep, 4)


def _has_neighbor_sampler() -> bool:
    import torch_geometric.typing as T
    return bool(T.WITH_PYG_LIB or T.WITH_TORCH_SPARSE)


@pytest.mark.skipif(not _has_neighbor_sampler(), reason="NeighborLoader needs pyg-lib or "
                    "torch_sparse")
@needs_data  # ogbn-arxiv
def test_ddp_node_task_on_cpu(tmp_path):
    rep = _example(tmp_path, "--task", "node", "--device", "cpu", "--nprocs", "2")
    _check_ddp_report(rep, 2)


@pytest.mark.skipif(_has_neighbor_sampler(), reason="a neighbour sampler is installed")
def test_node_task_without_sampler_names_the_missing_packages(capsys):
    example = runpy.run_path(str(EXAMPLE))
    with pytest.raises(SystemExit):
        example["parse_args"](["--task", "node", "--device", "cpu"])
    err = capsys.readouterr().err
    assert "pyg-lib" in err and "torch_sparse" in err


def test_loader_workers_of_a_spawned_rank_start_as_the_platform_default():
    """A rank that torch.multiprocessing.spawn starts has "spawn" as its default
    start method; its loader workers do not inherit it (each would import torch
    and PyG again and get the dataset pickled: a two-rank run took 90 s to start
    where one rank took 13 s). --worker-start-method still picks any."""
    import multiprocessing
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](["--workers", "2", "--device", "cpu"])
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        multiprocessing.set_start_method("spawn", force=True)  # as in a spawned rank
        kw = example["_loader_kw"](args, True)
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert kw["multiprocessing_context"] == multiprocessing.get_all_start_methods()[0]
    args = example["parse_args"](["--workers", "2", "--device", "cpu",
                                  "--worker-start-method", "spawn"])
    assert example["_loader_kw"](args, True)["multiprocessing_context"] == "spawn"
    args = example["parse_args"](["--workers", "0", "--device", "cpu"])
    assert "multiprocessing_context" not in example["_loader_kw"](args, True)


@pytest.mark.skipif(not _has_neighbor_sampler(), reason="NeighborLoader needs pyg-lib or "
                    "torch_sparse")
@needs_data  # ogbn-arxiv
def test_node_task_loader_workers_end_with_their_loop():
    """A NeighborLoader lives in a reference cycle: persistent workers of one
    outlived the run until a cycle collection, whose join then waited 5 s per
    worker (the collector had finalized their queues first), two minutes for a
    one-rank run on the GPU machine. The node task's workers end with the loop
    that broke off, without a collection."""
    import gc
    import multiprocessing
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](["--task", "node", "--device", "cpu", "--workers", "2",
                                  "--batch-size", "64", "--fanout", "2", "2"])
    gc.disable()  # only reference counting frees what the loop leaves
    try:
        train, test, *_ = example["node_task"](args, 0, 1)
        for loader in (train, test):
            for i, _ in enumerate(loader):
                if i == 1:
                    break
        deadline = time.monotonic() + 20
        while multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not multiprocessing.active_children(), "loader workers outlived their loop"
    finally:
        gc.enable()


def test_param_checksum_sees_one_ulp():
    checksum = runpy.run_path(str(EXAMPLE))["param_checksum"]
    lin = torch.nn.Linear(4, 3)
    before = checksum(lin)
    assert checksum(lin) == before
    with torch.no_grad():
        lin.weight[1, 2] = torch.nextafter(lin.weight[1, 2], torch.tensor(math.inf))
    fp32 = checksum(lin)
    assert fp32 != before
    assert checksum(lin.to(torch.bfloat16)) != fp32  # dtypes numpy lacks work too


@pytest.mark.cuda
@two_gpus
def test_ddp_on_two_gpus_with_nccl(tmp_path):
    rep = _example(tmp_path, "--task", "graph", "--impl", "fused", "--device", "cuda",
                   "--nprocs", "2")
    _check_ddp_report(rep, 2)
    assert rep["backend"] == "nccl"


@pytest.mark.cuda
@two_gpus
def test_ddp_on_two_gpus_with_loader_workers_and_time_split(tmp_path):
    """What benchmarks.multi_gpu runs: loader workers (pinning in their thread),
    prefetched layouts and the time split, on NCCL."""
    rep = _example(tmp_path, "--task", "graph", "--impl", "fused", "--device", "cuda",
                   "--nprocs", "2", "--workers", "2", "--time-split", "--graphs", "128")
    _check_ddp_report(rep, 2)
    assert rep["backend"] == "nccl" and rep["workers"] == 2
    _check_time_split(rep, 2)


@pytest.mark.cuda
def test_ddp_two_processes_on_one_gpu(tmp_path):
    """Two ranks share GPU 0 (gloo: NCCL refuses two ranks on one GPU)."""
    rep = _example(tmp_path, "--task", "graph", "--impl", "fused", "--device", "cuda",
                   "--nprocs", "2", "--oversubscribe", env={"CUDA_VISIBLE_DEVICES": "0"})
    _check_ddp_report(rep, 2)
    assert rep["backend"] == "gloo"


def _two_nodes(tmp_path, *args, timeout=300):
    """Two torchrun agents on this host as two "nodes" of one process each, meeting
    at a c10d rendezvous on 127.0.0.1 (what a multi-node launch does, one agent
    per machine); returns node 0's rank-0 report."""
    import socket
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node in range(2):
        out = tmp_path / f"node{node}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
               str(EXAMPLE), *args, "--quick", "--check-params", "--no-progress",
               "--json", str(out)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(node)} if "cuda" in args else None
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    reports = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("node*.json"))]
    assert len(reports) == 1, "only global rank 0 reports"
    return reports[0]


def test_two_torchrun_nodes_on_cpu(tmp_path):
    rep = _two_nodes(tmp_path, "--task", "graph", "--device", "cpu")
    _check_ddp_report(rep, 2)


@pytest.mark.cuda
@two_gpus
def test_two_torchrun_nodes_on_two_gpus(tmp_path):
    rep = _two_nodes(tmp_path, "--task", "graph", "--device", "cuda")
    _check_ddp_report(rep, 2)
    assert rep["backend"] == "nccl"


def _check_time_split(rep, world):
    """Every rank's split adds up to its step; the report's is the slowest rank's."""
    parts = ("data", "forward", "backward", "optimizer")
    ranks = rep["rank_split_ms"]
    assert len(ranks) == world
    for r in ranks:
        assert all(r[k] > 0 for k in parts), r
        assert r["step"] == pytest.approx(sum(r[k] for k in parts))
    slowest = max(ranks, key=lambda r: r["step"])
    assert rep["step_ms"] == slowest["step"]
    assert rep["compute_ms"] == pytest.approx(rep["step_ms"] - rep["data_ms"])
    assert sum(rep[f"{k}_share"] for k in parts) == pytest.approx(1.0)
    assert rep["data_share"] == pytest.approx(rep["data_ms"] / rep["step_ms"])
    assert rep["allreduce_ms"] > 0
    # means beside the medians: each rank's mean step is its parts' means' sum
    means = rep["rank_mean_ms"]
    assert len(means) == world
    for m in means:
        assert m["step"] == pytest.approx(sum(m[k] for k in parts))
        assert all(m[k] > 0 for k in parts), m
    longest = max(means, key=lambda m: m["step"])
    assert (rep["data_mean_ms"], rep["step_mean_ms"]) == (longest["data"], longest["step"])


def test_rank_threads_leave_the_loader_workers_their_cores():
    from conftest import load_script
    rank_threads = load_script("examples/multi_gpu.py").rank_threads
    assert rank_threads(1, 12, cores=32) == 20
    assert rank_threads(2, 12, cores=32) == 4
    assert rank_threads(2, 4, cores=32) == 12
    assert rank_threads(1, 0, cores=2) == 2
    assert rank_threads(2, 4, cores=2) == 1  # never none


def test_time_split_and_bf16_autocast_on_cpu(tmp_path):
    rep = _example(tmp_path, "--task", "graph", "--device", "cpu", "--nprocs", "2",
                   "--amp", "bf16", "--time-split")
    _check_ddp_report(rep, 2)
    assert rep["amp"] == "bf16"
    _check_time_split(rep, 2)


def test_prefetched_layouts_train_the_same_parameters_on_cpu(tmp_path):
    """The default prefetch (layouts built one batch ahead), the prefetch in a
    thread and ``--no-prefetch`` (built on the first conv's call) train
    bit-identical parameters."""
    args = ("--task", "graph", "--model", "gat", "--device", "cpu", "--nprocs", "2")
    ahead = _example(tmp_path, *args)
    threaded = _example(tmp_path, *args, "--prefetch-thread")
    in_step = _example(tmp_path, *args, "--no-prefetch")
    assert ahead["prefetch"] and not in_step["prefetch"]
    assert threaded["prefetch_thread"] and not ahead["prefetch_thread"]
    _check_ddp_report(ahead, 2)
    for rep in (threaded, in_step):
        assert ahead["param_checksums"] == rep["param_checksums"]
        assert ahead["final_loss"] == rep["final_loss"]


def test_loader_workers_started_by_forkserver_on_cpu(tmp_path):
    """--worker-start-method: each rank's loader workers start from a fork server
    (no copy of the rank's threads), and training runs as with forked ones."""
    rep = _example(tmp_path, "--task", "graph", "--device", "cpu", "--nprocs", "2",
                   "--workers", "1", "--worker-start-method", "forkserver")
    _check_ddp_report(rep, 2)
    assert rep["workers"] == 1 and rep["worker_start_method"] == "forkserver"
    assert rep["threads"] == max(1, (os.cpu_count() or 1) // 2 - 1)  # rank_threads


def test_benchmark_table_scales_over_one_rank_and_native():
    table = runpy.run_path(str(ROOT / "benchmarks" / "multi_gpu.py"))["table"]
    runs = [dict(task="graph", model=model, impl=impl, world_size=w, batch_size_per_rank=64,
                 amp="none", throughput=t * (1 if model == "gat" else 7), unit="graphs/s",
                 data_ms=1.0, forward_ms=0.5, backward_ms=1.25, optimizer_ms=0.25,
                 allreduce_ms=0.125, data_share=1 / 3, data_mean_ms=2.5)
            for model in ("gat", "gt")
            for impl, w, t in (("fused", 1, 100.0), ("native", 1, 50.0), ("fused", 2, 180.0),
                               ("native", 2, 60.0))]
    runs.append(dict(task="graph", model="gat", impl="fused", world_size=4,
                     batch_size_per_rank=64, amp="none", error="timed out"))
    rows = table(runs).splitlines()
    # fused, 2 ranks: over 1 rank, over native, each within its own model
    assert "| graph | gat | 64 | none | fused | 2 | 180 graphs/s | 1.80x | 3.00x |" in rows[4]
    # one run; its mean step from the throughput: 64 graphs x 2 ranks / 180 graphs/s
    assert "| 1 | 711.11 | 1.00 / 2.50 | 0.50 | 1.25 | 0.25 | 0.12 | 33% |" in rows[4]
    assert "| graph | gt | 64 | none | fused | 2 | 1,260 graphs/s | 1.80x | 3.00x |" in rows[8]
    assert "failed: timed out" in rows[-1]


def test_benchmark_table_takes_the_median_run_of_each_configuration():
    """With repeats, a configuration's row is its median run (split included), its
    range beside it, and the ratios are of the medians; a failed repeat keeps a row."""
    from conftest import load_benchmark
    bench = load_benchmark("multi_gpu")

    def run(impl, world, repeat, thr, data=1.0):
        return dict(task="graph", model="gat", impl=impl, world_size=world,
                    batch_size_per_rank=64, amp="none", throughput=thr, unit="graphs/s",
                    data_ms=data, repeat=repeat)
    runs = [run("fused", 1, 0, 100.0, 9.0), run("fused", 1, 1, 80.0, 2.0),
            run("fused", 1, 2, 90.0, 3.0), run("fused", 2, 0, 160.0), run("fused", 2, 1, 190.0),
            run("fused", 2, 2, 170.0), run("native", 1, 0, 45.0), run("native", 1, 1, 50.0)]
    runs.append(dict(runs[-1], repeat=2, error="timed out"))
    del runs[-1]["throughput"]
    rows = bench.table(runs).splitlines()[2:]
    assert len(rows) == 4, rows
    assert rows[0].startswith("| graph | gat | 64 | none | fused | 1 | 90 graphs/s | 1.00x | "
                              "2.00x | 3: 80-100 | 711.11 | 3.00 |"), rows[0]
    assert "| 170 graphs/s | 1.89x |  | 3: 160-190 |" in rows[1], rows[1]
    # even count: the lower median, a run that was measured
    assert "| native | 1 | 45 graphs/s | 1.00x |  | 2: 45-50 |" in rows[2], rows[2]
    assert rows[3].endswith("| failed (run 3): timed out |"), rows[3]


def test_benchmark_table_from_a_record(tmp_path, capsys):
    """--table-from prints a committed record's table again, with no GPU."""
    main = runpy.run_path(str(ROOT / "benchmarks" / "multi_gpu.py"))["main"]
    run = dict(task="graph", model="gt", impl="fused", world_size=2, batch_size_per_rank=64,
               amp="bf16", throughput=1234.0, unit="graphs/s", data_ms=2.0)
    record = dict(device_name="GPU X", gpus=2, torch="2.x", nccl="2.1", date="2026-01-02",
                  model="gt", steps=40, warmup=10, workers={"graph": 4}, runs=[run])
    path = tmp_path / "multi_gpu.json"
    path.write_text(json.dumps(record))
    assert main(["--table-from", str(path)]) == record
    out = capsys.readouterr().out
    assert out.startswith("GPU X x 2, torch 2.x, NCCL 2.1, 2026-01-02, gt, steps per rank: 40, "
                          "10 of them warm-up, loader workers per rank: 4 (graph)\n")
    assert "| graph | gt | 64 | bf16 | fused | 2 | 1,234 graphs/s |" in out


# --------------------------------------------------- benchmarks/multi_gpu.py runs
def _bench_with_example(tmp_path, monkeypatch, name: str, source: str):
    """The benchmark module, running the script ``source`` in place of the example."""
    from conftest import load_benchmark
    bench = load_benchmark("multi_gpu")
    fake = tmp_path / f"{name}.py"
    fake.write_text(source)
    monkeypatch.setattr(bench, "EXAMPLE", fake)
    return bench, fake


def _bench_on_two_gpus(monkeypatch):
    """The benchmark module, believing two GPUs and NCCL 2.28.9 are there."""
    from conftest import load_benchmark
    bench = load_benchmark("multi_gpu")
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(bench.torch.cuda.nccl, "version", lambda: (2, 28, 9))
    return bench


HANGING_RUN = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[sys.argv.index("--json") + 1] + ".pid", "w").write(str(child.pid))
print("started", flush=True)
time.sleep(600)
"""


def test_benchmark_run_past_its_timeout_leaves_stacks_and_no_process(tmp_path, monkeypatch):
    """A hung configuration costs its timeout, not the benchmark: its whole process
    group (ranks, loader workers) is stopped, and its log keeps the output and the
    Python stacks of where it hung."""
    bench, fake = _bench_with_example(tmp_path, monkeypatch, "hangs", HANGING_RUN)
    args = bench.parse_args(["--tasks", "graph", "--timeout", "5"])
    rep = bench.run_one(args, "graph", "gat", "fused", 2, 64, "none", 2, tmp_path)
    assert rep["error"].startswith("timed out after 5 s"), rep
    assert rep["wall_s"] >= 5
    log = (tmp_path / "graph_gat_fused_2_b64_none.log").read_text()
    assert "started" in log and log.count("Fatal Python error: Aborted") == 2, log
    # Each process's stack whole (they are aborted one at a time): the launcher's
    # hung frame, then its child's.
    assert f'File "{fake}", line 6 in <module>' in log, log
    assert 'File "<string>", line 1 in <module>' in log, log
    child = int((tmp_path / "graph_gat_fused_2_b64_none.json.pid").read_text())
    assert not _running(child), "the run's child process outlived the timeout"


REPORTS_THEN_HANGS = """
import json, sys, time
report = dict(task="graph", model="gat", impl="fused", world_size=1, batch_size_per_rank=64,
              amp="none", throughput=123.0, unit="graphs/s", steps=40)
open(sys.argv[sys.argv.index("--json") + 1], "w").write(json.dumps(report))
print("reported", flush=True)
time.sleep(600)  # a loader worker that never joins
"""


def test_benchmark_keeps_the_report_of_a_run_stuck_on_its_way_out(tmp_path, monkeypatch):
    """A run that measured and wrote its report, then hung in its teardown, keeps
    its numbers; the record and the table say that its exit timed out."""
    bench, _ = _bench_with_example(tmp_path, monkeypatch, "reports_then_hangs",
                                   REPORTS_THEN_HANGS)
    args = bench.parse_args(["--tasks", "graph", "--timeout", "5", "--steps", "40"])
    rep = bench.run_one(args, "graph", "gat", "fused", 1, 64, "none", 1, tmp_path)
    assert "error" not in rep and rep["throughput"] == 123.0, rep
    assert rep["exit"].startswith("timed out after 5 s, after its report (stacks: "), rep
    assert rep["wall_s"] >= 5
    assert "| its exit timed out after the report |" in bench.table([rep])


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is no zombie (an orphan that this
    container's init may never reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_benchmark_run_that_fails_reports_its_last_line(tmp_path, monkeypatch):
    bench, _ = _bench_with_example(
        tmp_path, monkeypatch, "fails",
        "import sys\nprint('working')\nsys.exit('no GPU here: pass --device cpu')\n")
    args = bench.parse_args(["--tasks", "graph", "--launcher", "torchrun"])
    rep = bench.run_one(args, "graph", "gat", "native", 1, 64, "bf16", 1, tmp_path)
    assert rep["error"].startswith("no GPU here: pass --device cpu (log: "), rep
    assert rep["launcher"] == "torchrun"
    assert 0 < rep["wall_s"] < 120  # the run's whole wall time, kept with its error


@pytest.mark.parametrize("given, node, graph", [((), 12, 4), (("--workers", "2"), 2, 2)])
def test_benchmark_loader_workers_per_task(tmp_path, monkeypatch, given, node, graph):
    """The node task's neighbour sampling gets more loader workers by default;
    --workers sets both tasks'."""
    bench, _ = _bench_with_example(tmp_path, monkeypatch, "argv",
                                   "import sys\nsys.exit(' '.join(sys.argv[1:]))\n")
    args = bench.parse_args(["--tasks", "node", "graph", *given])
    for task, n in (("node", node), ("graph", graph)):
        rep = bench.run_one(args, task, "gt", "fused", 1, 8, "none", 1, tmp_path)
        assert f"--task {task} --model gt " in rep["error"], rep
        assert f" --workers {n} " in rep["error"], rep


def test_benchmark_command_per_task_and_launcher(tmp_path):
    """Steps per task by default (--steps sets both), graphs enough for every
    rank's steps; torchrun's NUMA binding only through torchrun."""
    from conftest import load_benchmark
    bench = load_benchmark("multi_gpu")
    path = tmp_path / "r.json"
    for given, node, graph in (((), 40, 100), (("--steps", "30"), 30, 30)):
        args = bench.parse_args(["--tasks", "node", "graph", *given])
        cmd = " ".join(bench.command(args, "node", "gt", "fused", 2, 1024, "none", 2, path))
        assert f" --steps {node} " in cmd and "--graphs" not in cmd, cmd
        cmd = " ".join(bench.command(args, "graph", "gt", "fused", 2, 64, "bf16", 2, path))
        assert f" --steps {graph} " in cmd and f" --graphs {graph * 64 * 2} " in cmd, cmd
    args = bench.parse_args(["--launcher", "torchrun", "--numa-binding", "node"])
    cmd = bench.command(args, "graph", "gat", "native", 2, 64, "none", 2, path)
    assert cmd[1:9] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "--numa-binding", "node", str(bench.EXAMPLE)], cmd
    with pytest.raises(SystemExit):
        bench.parse_args(["--numa-binding", "node"])  # spawn has no such option


def test_benchmark_record_grows_with_every_run(tmp_path, monkeypatch):
    """The record is written after each run, so a benchmark stopped part-way (a
    caller's time limit) leaves the runs it finished, with the table's header."""
    bench = _bench_on_two_gpus(monkeypatch)
    done = []

    def run_one(args, task, model, impl, world, batch, amp, gpus, out, repeat=0):
        if len(done) == 2:
            raise KeyboardInterrupt  # the caller's limit, during the third run
        done.append(impl)
        return dict(task=task, model=model, impl=impl, world_size=world,
                    batch_size_per_rank=batch, amp=amp, throughput=100.0 * len(done),
                    unit="graphs/s", device_name="GPU X")
    monkeypatch.setattr(bench, "run_one", run_one)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--tasks", "graph", "--world-sizes", "1", "2", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "multi_gpu.json").read_text())
    assert [r["impl"] for r in record["runs"]] == ["fused", "native"]
    assert record["device_name"] == "GPU X" and record["nccl"] == "2.28.9"
    md = (tmp_path / "multi_gpu.md").read_text()
    assert md.startswith("GPU X x 2, torch ") and "| 200 graphs/s |" in md, md


def test_benchmark_repeats_run_in_rounds_and_resume_adds_them(tmp_path, monkeypatch):
    """--repeats N runs every configuration once before any twice; --resume with a
    larger N runs only the repeats the record lacks; each repeat has its own report."""
    bench = _bench_on_two_gpus(monkeypatch)
    calls = []

    def run_one(args, task, model, impl, world, batch, amp, gpus, out, repeat=0):
        calls.append((impl, world, repeat))
        return dict(task=task, model=model, impl=impl, world_size=world, repeat=repeat,
                    batch_size_per_rank=batch, amp=amp, throughput=10.0 * len(calls),
                    unit="graphs/s", device_name="GPU X")
    monkeypatch.setattr(bench, "run_one", run_one)
    out = ["--tasks", "graph", "--out", str(tmp_path)]
    bench.main([*out, "--repeats", "2"])
    one_round = [("fused", 1), ("native", 1), ("fused", 2), ("native", 2)]
    assert calls == [(i, w, 0) for i, w in one_round] + [(i, w, 1) for i, w in one_round]
    calls.clear()
    record = bench.main([*out, "--repeats", "3", "--resume"])
    assert calls == [(i, w, 2) for i, w in one_round]
    assert len(record["runs"]) == 12
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])


def test_benchmark_repeat_reports_to_its_own_file(tmp_path, monkeypatch):
    bench, _ = _bench_with_example(tmp_path, monkeypatch, "argv",
                                   "import sys\nsys.exit(' '.join(sys.argv[1:]))\n")
    args = bench.parse_args(["--tasks", "graph"])
    first = bench.run_one(args, "graph", "gat", "fused", 1, 64, "none", 1, tmp_path)
    second = bench.run_one(args, "graph", "gat", "fused", 1, 64, "none", 1, tmp_path, repeat=1)
    assert "graph_gat_fused_1_b64_none.json" in first["error"], first
    assert "graph_gat_fused_1_b64_none_r1.json" in second["error"], second
    assert (first["repeat"], second["repeat"]) == (0, 1)


def test_benchmark_resume_runs_only_what_the_record_lacks(tmp_path, monkeypatch):
    """--resume keeps a stopped record's finished runs and runs the rest (a failed
    one again) into the same record; a record of other settings is refused."""
    bench = _bench_on_two_gpus(monkeypatch)
    calls, runs = [], []

    def run_one(args, task, model, impl, world, batch, amp, gpus, out, repeat=0):
        calls.append((task, model, impl, world))
        runs.append(calls[-1])
        rep = dict(task=task, model=model, impl=impl, world_size=world,
                   batch_size_per_rank=batch, amp=amp, throughput=100.0 * len(runs),
                   unit="graphs/s", device_name="GPU X")
        if len(runs) == 2:  # the first sitting's second run
            rep["error"] = "timed out"
        return rep
    monkeypatch.setattr(bench, "run_one", run_one)
    out = ["--out", str(tmp_path)]
    bench.main(["--tasks", "graph", "--world-sizes", "1", *out])
    assert calls == [("graph", "gat", "fused", 1), ("graph", "gat", "native", 1)]
    calls.clear()
    record = bench.main(["--tasks", "graph", "node", "--models", "gat", "gt", "--world-sizes",
                         "1", "--resume", *out])
    assert calls == [("graph", "gat", "native", 1), ("graph", "gt", "fused", 1),
                         ("graph", "gt", "native", 1), ("node", "gat", "fused", 1),
                         ("node", "gat", "native", 1), ("node", "gt", "fused", 1),
                         ("node", "gt", "native", 1)]
    assert record["runs"][0]["throughput"] == 100.0  # kept, not run again
    assert [r["impl"] for r in record["runs"][:2]] == ["fused", "native"]
    assert "error" not in record["runs"][1]
    assert record["command"].endswith("--world-sizes 1 --out " + str(tmp_path))
    assert record["resumed_by"][0].endswith("--resume --out " + str(tmp_path))
    assert record["models"] == ["gat", "gt"] and record["workers"] == {"graph": 4, "node": 12}
    assert json.loads((tmp_path / "multi_gpu.json").read_text()) == record
    with pytest.raises(SystemExit, match="other settings \\(steps\\)"):
        bench.main(["--tasks", "graph", "--steps", "20", "--resume", *out])
    with pytest.raises(SystemExit, match="other settings \\(workers\\)"):
        bench.main(["--tasks", "graph", "--workers", "2", "--resume", *out])
    record["steps"] = 40  # a record from before steps were per task
    (tmp_path / "multi_gpu.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="other settings \\(steps\\)"):
        bench.main(["--tasks", "graph", "--resume", *out])
