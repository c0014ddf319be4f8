r"""Graph layout build time per mini-batch: ``GraphLayout.from_edge_index`` on
NeighborLoader batches of ogbn-arxiv (about 30K and 300K edges) and on the full
graph, the GPU build (``dfgnn::layout_build``, cuda/kernels/layout_build.cu) next to the
torch build it replaces (``kernel=False``).

Median over batches, CUDA events on a GPU (the events bracket what the host
issues, so host time counts), each build from a fresh ``edge_index``. Columns
(``*_torch``: the same with the torch build):

* ``build``: CSR + CSC + work items of both (the fused forward and backward of
  GT read this);
* ``build_loops``: the same with GAT / AGNN self-loops;
* ``csr_only``: ``with_csc=False`` (inference needs no CSC);
* ``shuffled``: the batch's edges in random order (the CSR then needs a sort:
  what grouping by destination saves);
* ``sort``: one stable sort of ``E`` int32 keys, for scale;
* ``ops``: aten / dfgnn operations per ``build`` (host cost); ``syncs``,
  ``syncs_loops``: host synchronisations per build, without and with self-loops
  (GPU only); ``launches``: kernel launches and memcpy / memset calls per
  ``build`` (torch.profiler; GPU only); ``allocs``: device allocations per
  ``build`` (the caching allocator's ``allocation.all.allocated`` count; GPU
  only).

Without the ogbn-arxiv files (``--synthetic``, or when loading fails) the batches
come from a random graph of arxiv's size; without pyg-lib / torch_sparse the
sampler is the vectorised stand-in (benchmarks.minibatch.sample_batches).

.. code-block:: bash

    python -m benchmarks.layout --out out/layout.json
    python -m benchmarks.layout --synthetic --no-full     # no dataset needed
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.minibatch import Timer, load_dataset, sample_batches
from pyg_dfgnn.layout import GraphLayout

#: (seeds, fan-outs) of the batch sizes the targets name: about 30K and 300K edges.
BATCHES = ((1024, (10, 5)), (6144, (20, 8)))
#: Launch-like CUDA runtime calls counted by :func:`count_launches`.
_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaMemcpyAsync", "cudaMemsetAsync")


class _CountOps(TorchDispatchMode):
    """Counts aten operations."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_syncs(fn: Callable[[], object]) -> Optional[int]:
    """Host synchronisations ``fn`` makes on the GPU: the larger of CUDA's sync debug
    mode warnings and the ``cudaStreamSynchronize`` calls torch.profiler records
    (a synchronisation inside an extension's C++ warns outside Python's warning
    machinery, so the first count misses it)."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught, \
                profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    warned = sum("synchroniz" in str(w.message) for w in caught)
    api = sum(e.count for e in prof.key_averages() if e.key == "cudaStreamSynchronize")
    return max(warned, api)


def count_launches(fn: Callable[[], object]) -> Optional[int]:
    """Kernel launches and memcpy / memset calls ``fn`` makes (torch.profiler's
    CUDA runtime events), or ``None`` without a GPU or a working profiler."""
    if not torch.cuda.is_available():
        return None
    try:
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.name in _LAUNCH_CALLS)
    except Exception as e:  # no CUPTI: leave the column out
        warnings.warn(f"launch count unavailable: {e}")
        return None


def count_allocations(fn: Callable[[], object]) -> Optional[int]:
    """Device allocations ``fn`` requests from the caching allocator (the change of
    ``torch.cuda.memory_stats()["allocation.all.allocated"]``), or ``None`` without
    a GPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    fn()
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0) - before


def synthetic_graph(num_nodes: int = 169343, num_edges: int = 1166243, seed: int = 0):
    """An undirected random graph of ogbn-arxiv's size (the stand-in when the
    dataset files are not there)."""
    from torch_geometric.data import Data
    from torch_geometric.utils import to_undirected
    g = torch.Generator().manual_seed(seed)
    # Skewed sources (a few hubs, as in citation graphs), uniform destinations.
    src = (torch.rand(num_edges, generator=g) ** 3 * num_nodes).long()
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    keep = src != dst
    data = Data(edge_index=to_undirected(torch.stack([src[keep], dst[keep]]), num_nodes=num_nodes),
                num_nodes=num_nodes)
    data.name = "synthetic"
    return data


def _median_ms(fn: Callable[[torch.Tensor], object], graphs: List[torch.Tensor], warmup: int,
               device: torch.device) -> float:
    times = []
    for i, ei in enumerate(graphs):
        with Timer(device) as t:
            fn(ei)
        if i >= warmup:
            times.append(t.elapsed())
    return statistics.median(times)


def measure(graphs: List[torch.Tensor], n: int, warmup: int, device: torch.device) -> dict:
    """Build times (ms) over ``graphs`` (each used once per column), GPU build and
    torch build (``*_torch``)."""
    def fresh():
        return [g.clone() for g in graphs]

    size = (n, n)
    shuffled = [g[:, torch.randperm(g.size(1), device=g.device)] for g in graphs]
    res = {"edges": statistics.median(g.size(1) for g in graphs), "nodes": n}
    for suffix, kernel in (("", True), ("_torch", False)):
        def build(e, loops=False, with_csc=True):
            return GraphLayout.from_edge_index(e, size, add_self_loops=loops, with_csc=with_csc,
                                               kernel=kernel)

        res["build" + suffix] = _median_ms(build, fresh(), warmup, device)
        res["build_loops" + suffix] = _median_ms(lambda e: build(e, loops=True), fresh(), warmup,
                                                 device)
        res["csr_only" + suffix] = _median_ms(lambda e: build(e, with_csc=False), fresh(),
                                              warmup, device)
        res["shuffled" + suffix] = _median_ms(build, shuffled, warmup, device)
        with _CountOps() as c:
            build(graphs[0].clone())
        res["ops" + suffix] = c.ops
        if graphs[0].is_cuda:
            res["syncs" + suffix] = count_syncs(lambda: build(graphs[0].clone()))
            res["syncs_loops" + suffix] = count_syncs(lambda: build(graphs[0].clone(), loops=True))
            res["launches" + suffix] = count_launches(lambda: build(graphs[0].clone()))
            g = graphs[0].clone()  # outside the count
            res["allocs" + suffix] = count_allocations(lambda: build(g))
    res["sort"] = _median_ms(lambda e: torch.sort(e[1].int(), stable=True), fresh(), warmup,
                             device)
    return res


def main(argv: Optional[Sequence[str]] = None) -> dict:
    from benchmarks import cli, datasets
    p = argparse.ArgumentParser(prog="python -m benchmarks.layout",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=cli.HelpFormatter)
    datasets.add_data_argument(p, "ogbn-arxiv/")
    p.add_argument("--device", default=None,
                   help="torch device; cpu builds on the CPU, a check of the script "
                        "(default: cuda)")
    p.add_argument("--batches", type=int, default=40, help="batches per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed builds first")
    p.add_argument("--no-full", action="store_true", help="skip the full graph")
    p.add_argument("--synthetic", action="store_true",
                   help="a random graph of arxiv's size instead of ogbn-arxiv")
    p.add_argument("--out", default=None, help="JSON results (default: a new temporary file)")
    a = p.parse_args(argv)
    device = cli.pick_device("benchmarks.layout", a.device)
    data = None
    if not a.synthetic:
        try:
            data = load_dataset("arxiv", a.data)
        except Exception as e:  # no dataset files here: the synthetic stand-in
            print(f"ogbn-arxiv not loaded ({str(e).splitlines()[0]}); using a synthetic graph "
                  "of its size")
    data = synthetic_graph() if data is None else data
    rows = {}
    for seeds, fan in BATCHES:
        batches, _, sampler = sample_batches(data, seeds, fan, a.batches + a.warmup)
        n = max(int(b.num_nodes) for b in batches)
        graphs = [b.edge_index.to(device) for b in batches]
        key = f"{data.name} {seeds} seeds {list(fan)}"
        rows[key] = {"sampler": sampler, **measure(graphs, n, a.warmup, device)}
        print(key, json.dumps(rows[key]), flush=True)
    if not a.no_full:
        full = data.edge_index.to(device)
        key = f"{data.name} full graph"
        rows[key] = measure([full] * 8, data.num_nodes, 3, device)
        print(key, json.dumps(rows[key]), flush=True)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="layout_")) / "layout.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    cols = ("edges", "build", "build_torch", "build_loops", "build_loops_torch", "csr_only",
            "csr_only_torch", "shuffled", "shuffled_torch", "sort", "ops", "ops_torch", "syncs",
            "syncs_torch", "launches", "launches_torch", "allocs", "allocs_torch")
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']} (ms, median)\n")
    print("| graph | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for k, r in rows.items():
        print(f"| {k} | " + " | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float)
                                       else str(r.get(c, "-")) for c in cols) + " |")
    print(f"\nresults: {out}")
    return rows


if __name__ == "__main__":
    main()
