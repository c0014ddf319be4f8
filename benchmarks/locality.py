r"""Work-item order benchmark: the fused ops' time per item order.

The node-parallel kernels run their work items in the order of the layout's item
tensor; ``plan.override(item_order=, long_items_first=)`` picks it
(:mod:`pyg_dfgnn.node_order`). For each graph this times, at op level on the same
q / k / v (as :mod:`benchmarks.kernels` does, with its ``measure``), GT
(:func:`pyg_dfgnn.ops.gt_attention`) and GAT (:func:`pyg_dfgnn.ops.gat_attention`),
1 head x 128 fp32, forward and forward + backward, in every order:

* ``row``, ``rcm``, ``degree`` (:data:`pyg_dfgnn.node_order.ITEM_ORDERS`), each
  with the longest-first length sort (``+long``) and without, on graphs with
  split rows; where every row fits one item the sort does nothing and each order
  runs once.

The orders of one graph and model run interleaved: ``--rounds`` rounds, each
timing every order once (``triton.testing.do_bench``, median, with warm-up), and
each order reports the median of its rounds. Before timing, each order's forward
is compared bit for bit with row order's (``same_as_row``). Per graph it also
reports the one-off cost of each order: the node ranks of both sides
(``rank_ms``; RCM runs on the host) and the reordered items of both walks
(``items_ms``), next to the layout build they follow (``build_ms``).

Graphs: MUSAE GitHub (super nodes) and ogbn-arxiv (full graph, undirected) from
the data folder (``--data``, else ``$PYG_DFGNN_DATA``), the Reddit- and ppa-like
power-law graphs and a PATTERN batch (:mod:`benchmarks.generators`), all at the
sizes of :mod:`benchmarks.kernels`. A graph or order that fails is recorded with
its error; graphs past ``--budget-s`` are recorded as skipped.

Usage, from the repository root (needs a CUDA GPU and the compiled extension)::

    python -m benchmarks.locality --data /path/to/data --out locality.json

Writes JSON (``--out``, rewritten after every graph) and prints a table: per graph,
model and order the forward and forward + backward times and their ratio to the
default order (``row+long``, or ``row`` without split rows; < 1: faster).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from benchmarks import generators, kernels
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.node_order import ITEM_ORDERS
from pyg_dfgnn.ops import plan

DEV = "cuda"
H, C = 1, 128
MODELS = ("gt", "gat")
#: ``(warmup_ms, rep_ms)`` of each ``do_bench`` (``--warmup-ms``, ``--rep-ms``).
REPEATS = (10, 40)
ROUNDS = 3


def configs(split: bool) -> List[Tuple[str, bool]]:
    """``(item_order, long_items_first)`` to time; the default order first. Without
    split rows the length sort does nothing, so each order runs once."""
    return [(o, lf) for o in ITEM_ORDERS for lf in ((True, False) if split else (True,))]


def label(order: str, long_first: bool, split: bool) -> str:
    return f"{order}+long" if split and long_first else order


# ------------------------------------------------------------------------ graphs
def graph_loaders(root: Optional[str], quick: bool) -> List[Tuple[str, Callable]]:
    """``[(name, load)]``; ``load()`` returns ``(edge_index, num_nodes)``. Loaded one
    at a time, so a failing loader costs only its graph."""
    def github():
        from benchmarks import datasets
        d = datasets.musae_github(root)
        return d.edge_index, d.num_nodes

    def arxiv():
        from benchmarks import datasets
        d = datasets.ogbn_arxiv(root)
        return d.edge_index, d.num_nodes

    def power_law(n, avg, mx, seed):
        return lambda: (generators.power_law_graph(n, avg, mx, seed, DEV), n)

    def pattern(num_graphs):
        def load():
            ei, batch, _, _ = generators.sbm_batch("pattern", num_graphs, seed=0)
            return ei, batch.numel()
        return load
    if quick:
        return [("power-law-5K", power_law(5_000, 100, 2_000, 0)), ("PATTERN-128", pattern(128))]
    # Reddit- and ppa-like at benchmarks.kernels' sizes (paper avg / max in-degree).
    return [("GitHub", github), ("arxiv", arxiv), ("PATTERN", pattern(1024)),
            ("ppa-like", power_law(100_000, 74, 3_241, 2)),
            ("Reddit-like", power_law(30_000, 492, 21_657, 0))]


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _ms(fn) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return (time.perf_counter() - t0) * 1e3


def order_cost(lay, chunk: int) -> Dict[str, dict]:
    """The one-off cost of each order on a layout that has none computed yet: per
    order ``rank_ms`` (both sides' ranks) and ``items_ms`` (both walks' items at
    ``chunk``, longest first)."""
    res = {}
    for order in ITEM_ORDERS[1:]:
        try:
            rank = _ms(lambda: [lay.node_rank(order, kind) for kind in ("row", "col")])
            items = _ms(lambda: [lay.work(kind, chunk, True, order) for kind in ("row", "col")])
            res[order] = {"rank_ms": rank, "items_ms": items}
        except Exception as e:  # noqa: BLE001  (recorded)
            res[order] = {"error": kernels._first_line(e)}
    return res


# ----------------------------------------------------------------------- timing
def model_fn(model: str, lay, n: int, device):
    """``(fn, grad, leaves)`` of one fused op on fixed random inputs."""
    torch.manual_seed(0)
    x = torch.randn(n, H, C, device=device, requires_grad=True)
    g = torch.randn(n, H, C, device=device)
    if model == "gt":
        k = torch.randn(n, H, C, device=device, requires_grad=True)
        v = torch.randn(n, H, C, device=device, requires_grad=True)
        return (lambda: ops.gt_attention(lay, x, k, v)), g, (x, k, v)
    a_src = torch.randn(n, H, device=device, requires_grad=True)
    a_dst = torch.randn(n, H, device=device, requires_grad=True)
    return (lambda: ops.gat_attention(lay, a_src, a_dst, x)), g, (a_src, a_dst, x)


def time_orders(fn, g, leaves, cfgs, rounds: int) -> Dict[Tuple[str, bool], dict]:
    """Per ``(order, long_first)``: ``same_as_row`` (the forward bit for bit equal
    to the first config's), then ``rounds`` interleaved rounds of
    :func:`benchmarks.kernels.measure`; ``fwd_ms`` / ``fwd_bwd_ms`` are the medians
    of the rounds (kept in ``*_rounds``)."""
    res: Dict[Tuple[str, bool], dict] = {c: {} for c in cfgs}
    want = None
    for c in cfgs:
        try:
            with plan.override(item_order=c[0], long_items_first=c[1]), torch.no_grad():
                out = fn()
            want = out if want is None else want
            res[c]["same_as_row"] = bool(torch.equal(out, want))
        except Exception as e:  # noqa: BLE001  (recorded)
            res[c]["error"] = kernels._first_line(e)
    for _ in range(rounds):
        for c in cfgs:
            if "error" in res[c]:
                continue
            with plan.override(item_order=c[0], long_items_first=c[1]):
                r = kernels.measure(fn, g, leaves, peak=False)
            if "error" in r:
                res[c]["error"] = r["error"]
                continue
            for key in ("fwd_ms", "fwd_bwd_ms"):
                res[c].setdefault(key + "_rounds", []).append(r[key])
    for r in res.values():
        for key in ("fwd_ms", "fwd_bwd_ms"):
            if r.get(key + "_rounds"):
                r[key] = statistics.median(r[key + "_rounds"])
        r["status"] = "error" if "error" in r else "ok"
    return res


def run_graph(name: str, ei, n: int, models=MODELS, rounds: int = ROUNDS,
              device=DEV) -> dict:
    """One graph: its statistics, the layout build's time (``build_ms``, after a
    warm-up build), :func:`order_cost` and :func:`time_orders` per model."""
    ei = ei.to(device)
    GraphLayout.from_edge_index(ei, (n, n))  # warm-up (kernels, allocator)
    box = []
    build_ms = _ms(lambda: box.append(GraphLayout.from_edge_index(ei, (n, n))))
    lay = box[0]
    chunk = plan.plan_for(lay, torch.float32, C).chunk
    split = lay.work("row", chunk).num_slots > 0 or lay.work("col", chunk).num_slots > 0
    row = {"graph": name, "nodes": n, "edges": lay.num_edges, "max_in_degree": lay.max_in_degree,
           "max_out_degree": lay.max_out_degree, "chunk": chunk, "split_rows": split,
           "build_ms": build_ms, "order_cost": order_cost(lay, chunk), "models": {}}
    cfgs = configs(split)
    for model in models:
        fn, g, leaves = model_fn(model, lay, n, device)
        res = time_orders(fn, g, leaves, cfgs, rounds)
        row["models"][model] = {label(o, lf, split): dict(r, item_order=o, long_items_first=lf)
                                for (o, lf), r in res.items()}
    return row


# ------------------------------------------------------------------------ output
def fmt_table(rows: List[dict]) -> str:
    """Per graph, model and order: fwd and fwd+bwd ms, their ratio to the default
    order (the first), whether the forward matched row order bit for bit; then
    each graph's one-off order cost."""
    lines = [f"{'graph':<13}{'model':<6}{'order':<13}{'fwd ms':>9}{'×def':>7}"
             f"{'f+b ms':>9}{'×def':>7}{'same':>6}"]
    for r in rows:
        if "error" in r or "skipped" in r:
            lines.append(f"{r['graph']:<13}{r.get('error') or r.get('skipped')}")
            continue
        for model, by_order in r["models"].items():
            base = next(iter(by_order.values()))
            for name, m in by_order.items():
                cells = []
                for key in ("fwd_ms", "fwd_bwd_ms"):
                    v, b = m.get(key), base.get(key)
                    cells.append(f"{v:>9.3f}{(v / b if b else float('nan')):>7.2f}" if v else
                                 f"{'err':>9}{'-':>7}")
                lines.append(f"{r['graph']:<13}{model:<6}{name:<13}{''.join(cells)}"
                             f"{str(m.get('same_as_row', '-')):>6}")
        parts = [f"build {r['build_ms']:.1f} ms"] + [
            f"{o}: rank {c['rank_ms']:.1f} + items {c['items_ms']:.1f} ms" if "error" not in c
            else f"{o}: {c['error']}" for o, c in r["order_cost"].items()]
        lines.append(f"{r['graph']:<13}order cost: " + "; ".join(parts))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.locality",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None,
                    help="data folder with MUSAE/ and ogbn-arxiv/ (default: $PYG_DFGNN_DATA)")
    ap.add_argument("--out", default="locality.json")
    ap.add_argument("--graphs", default="", help="comma-separated subset of graph names")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--warmup-ms", type=float, default=REPEATS[0])
    ap.add_argument("--rep-ms", type=float, default=REPEATS[1])
    ap.add_argument("--budget-s", type=float, default=60.0,
                    help="graphs not started within this many seconds are skipped")
    ap.add_argument("--quick", action="store_true",
                    help="a 5K-node power-law graph and a 128-graph PATTERN batch, one round")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.locality needs a CUDA GPU and the compiled extension", file=sys.stderr)
        return 1
    t_start = time.perf_counter()
    kernels.REPEATS = (args.warmup_ms, args.rep_ms)  # kernels.measure's do_bench
    rounds = 1 if args.quick else args.rounds
    models = tuple(args.models.split(","))
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"), "H": H, "C": C,
            "dtype": "float32", "rounds": rounds, "repeats_ms": list(kernels.REPEATS),
            **kernels.set_matmul_precision(False)}
    print(f"# {info}")
    rows: List[dict] = []
    wanted = set(args.graphs.split(",")) if args.graphs else None
    for name, load in graph_loaders(args.data, args.quick):
        if wanted is not None and name not in wanted:
            continue
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget_s:
            rows.append({"graph": name, "skipped": f"time budget ({elapsed:.0f} s)"})
        else:
            t0 = time.perf_counter()
            try:
                ei, n = load()
                rows.append(run_graph(name, ei, n, models, rounds))
            except Exception as e:  # noqa: BLE001  (recorded; the next graph runs)
                rows.append({"graph": name, "error": kernels._first_line(e)})
                try:
                    torch.cuda.empty_cache()
                except Exception:  # noqa: BLE001  (a lost context is checked below)
                    pass
            rows[-1]["wall_s"] = time.perf_counter() - t0
            print(f"# {name}: {rows[-1]['wall_s']:.1f} s", file=sys.stderr)
        with open(args.out, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)
        if not kernels.cuda_context_ok(DEV):
            rows[-1]["cuda_context_lost"] = True
            break
    info["wall_s"] = time.perf_counter() - t_start
    with open(args.out, "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    print(fmt_table(rows))
    print(f"# total {info['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
