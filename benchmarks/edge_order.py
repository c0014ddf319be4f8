r"""Per-edge rows into a layout's CSR order: the gather (``index_select``) against
the scatter through the inverse permutation (:func:`pyg_dfgnn.edge_order.permute_rows`,
what :meth:`~pyg_dfgnn.layout.GraphLayout.to_csr_order` runs), forward and
forward + backward, on two permutations of as many edges as PATTERN's 6,071,220:
``random`` and ``pattern``, the CSR order of the PATTERN-like batch itself (its
edges come grouped by source: a CSR position's input edge lies a few hundred rows
from its neighbour's).

Each row: permutation, width ``D`` and dtype, median ms of each way
(``do_bench``), and the ratios. Results must agree bit for bit (checked before
timing).

Run::

    python -m benchmarks.edge_order --out docs/results/edge_order_h200.json
    python -m benchmarks.edge_order --device cpu --edges 5000 --pattern-graphs 4 \
        --out /tmp/eo.json  # a check of the script
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from pyg_dfgnn import edge_order

#: PATTERN-like batch's edges (benchmarks.generators.sbm_batch("pattern", 1024)).
PATTERN_EDGES = 6_071_220
WIDTHS = ((4, torch.float32), (16, torch.float32), (16, torch.bfloat16), (128, torch.float32))


def _bench(fn, cuda: bool) -> float:
    if cuda:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    from benchmarks.profile_backward import wall_timer
    return wall_timer(fn, 3)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--edges", type=int, default=PATTERN_EDGES,
                    help="edges of the random permutation")
    ap.add_argument("--pattern-graphs", type=int, default=1024,
                    help="graphs of the PATTERN-like batch (default: 1024, 6.07M edges)")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("benchmarks.edge_order: no CUDA GPU here.\n"
              "Run it on a GPU machine, or pass --device cpu for a check of the script.",
              file=sys.stderr)
        return 2
    from benchmarks import generators
    from pyg_dfgnn.layout import GraphLayout
    gen = torch.Generator().manual_seed(0)
    ei, batch, _, _ = generators.sbm_batch("pattern", args.pattern_graphs, seed=0)
    n = batch.numel()
    perms = {"random": torch.randperm(args.edges, generator=gen),
             "pattern": GraphLayout.from_edge_index(ei, (n, n)).edge_perm}
    info = {"gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": "python -m benchmarks.edge_order " + shlex.join(argv),
            "edges": {k: int(p.numel()) for k, p in perms.items()},
            "permutations": "random: torch.randperm, seed 0; pattern: the CSR order of "
                            "benchmarks.generators.sbm_batch('pattern', graphs, seed=0)"}
    rows = []
    for kind, perm_cpu in perms.items():
        perm = perm_cpu.to(dev)
        pos = edge_order.inverse(perm)
        E = perm.numel()
        for width, dtype in WIDTHS:
            x = torch.randn(E, width, generator=gen).to(dev, dtype).requires_grad_()
            g = torch.randn(E, width, generator=gen).to(dev, dtype)
            gather = lambda: x.index_select(0, perm)  # noqa: E731
            scatter = lambda: edge_order.permute_rows(x, perm, pos)  # noqa: E731
            got, want = scatter(), gather()
            (dx_got,) = torch.autograd.grad(got, x, g)
            (dx_want,) = torch.autograd.grad(want, x, g)
            if not (torch.equal(got, want) and torch.equal(dx_got, dx_want)):
                raise AssertionError(f"{kind} D={width} {dtype}: the scatter differs from "
                                     f"the gather")
            row = {"perm": kind, "edges": E, "D": width, "dtype": str(dtype).replace("torch.", "")}
            for name, fn in (("gather", gather), ("scatter", scatter)):
                row[f"{name}_fwd_ms"] = _bench(lambda: fn().detach(), cuda)
                row[f"{name}_fwd_bwd_ms"] = _bench(lambda: torch.autograd.grad(fn(), x, g), cuda)
            row["fwd_speedup"] = row["gather_fwd_ms"] / row["scatter_fwd_ms"]
            row["fwd_bwd_speedup"] = row["gather_fwd_bwd_ms"] / row["scatter_fwd_bwd_ms"]
            rows.append(row)
            print(f"{kind:8s} D={width:4d} {row['dtype']:9s} fwd gather {row['gather_fwd_ms']:.3f}"
                  f" / scatter {row['scatter_fwd_ms']:.3f} ms ({row['fwd_speedup']:.2f}x); f+b "
                  f"{row['gather_fwd_bwd_ms']:.3f} / {row['scatter_fwd_bwd_ms']:.3f} ms "
                  f"({row['fwd_bwd_speedup']:.2f}x)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
