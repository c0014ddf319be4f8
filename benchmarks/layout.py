r"""Graph layout build time per mini-batch: ``GraphLayout.from_edge_index`` on
NeighborLoader batches of ogbn-arxiv (about 30K and 300K edges) and on the full
graph.

Median over batches, CUDA events on a GPU (the events bracket what the host
issues, so host time counts), each build from a fresh ``edge_index``. Columns:

* ``build``: CSR + CSC + work items of both (the fused forward and backward of
  GT read this);
* ``build_loops``: the same with GAT / AGNN self-loops;
* ``csr_only``: ``with_csc=False`` (inference needs no CSC);
* ``shuffled``: the batch's edges in random order (the CSR then needs a sort:
  what grouping by destination saves);
* ``sort``: one stable sort of ``E`` int32 keys, for scale;
* ``ops``: aten operations per ``build`` (host cost); ``syncs``, ``syncs_loops``:
  host synchronisations per build, without and with self-loops (GPU only).

.. code-block:: bash

    python -m benchmarks.layout --out /tmp/layout.json
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


class _CountOps(TorchDispatchMode):
    """Counts aten operations."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_syncs(fn: Callable[[], object]) -> Optional[int]:
    """Host synchronisations ``fn`` makes on the GPU (CUDA's sync debug mode)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


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
    """Build times (ms) over ``graphs`` (each used once per column)."""
    def fresh():
        return [g.clone() for g in graphs]

    size = (n, n)
    shuffled = [g[:, torch.randperm(g.size(1), device=g.device)] for g in graphs]
    res = {
        "edges": statistics.median(g.size(1) for g in graphs),
        "nodes": n,
        "build": _median_ms(lambda e: GraphLayout.from_edge_index(e, size), fresh(), warmup,
                            device),
        "build_loops": _median_ms(
            lambda e: GraphLayout.from_edge_index(e, size, add_self_loops=True), fresh(),
            warmup, device),
        "csr_only": _median_ms(lambda e: GraphLayout.from_edge_index(e, size, with_csc=False),
                               fresh(), warmup, device),
        "shuffled": _median_ms(lambda e: GraphLayout.from_edge_index(e, size), shuffled, warmup,
                               device),
        "sort": _median_ms(lambda e: torch.sort(e[1].int(), stable=True), fresh(), warmup,
                           device),
    }
    with _CountOps() as c:
        GraphLayout.from_edge_index(graphs[0].clone(), size)
    res["ops"] = c.ops
    if graphs[0].is_cuda:
        res["syncs"] = count_syncs(lambda: GraphLayout.from_edge_index(graphs[0].clone(), size))
        res["syncs_loops"] = count_syncs(
            lambda: GraphLayout.from_edge_index(graphs[0].clone(), size, add_self_loops=True))
    return res


def main(argv: Optional[Sequence[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help="ogbn-arxiv folder (default: $PYG_DFGNN_DATA)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batches", type=int, default=40, help="batches per size")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-full", action="store_true", help="skip the full graph")
    p.add_argument("--out", default=None, help="JSON results (default: a new temporary file)")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    data = load_dataset("arxiv", a.data)
    rows = {}
    for seeds, fan in BATCHES:
        batches, _, sampler = sample_batches(data, seeds, fan, a.batches + a.warmup)
        n = max(int(b.num_nodes) for b in batches)
        graphs = [b.edge_index.to(device) for b in batches]
        key = f"arxiv {seeds} seeds {list(fan)}"
        rows[key] = {"sampler": sampler, **measure(graphs, n, a.warmup, device)}
        print(key, json.dumps(rows[key]), flush=True)
    if not a.no_full:
        full = data.edge_index.to(device)
        rows["arxiv full graph"] = measure([full] * 8, data.num_nodes, 3, device)
        print("arxiv full graph", json.dumps(rows["arxiv full graph"]), flush=True)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="layout_")) / "layout.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    cols = ("edges", "build", "build_loops", "csr_only", "shuffled", "sort", "ops", "syncs")
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']} (ms, median)\n")
    print("| graph | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for k, r in rows.items():
        print(f"| {k} | " + " | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float)
                                       else str(r.get(c, "-")) for c in cols) + " |")
    print(f"\nresults: {out}")
    return rows


if __name__ == "__main__":
    main()
