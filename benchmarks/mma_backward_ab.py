"""A/B of the GT backward's tensor-core walks against its CUDA-core walks.

``plan.override(mma_backward=True)`` against the default plan, at op level
(:func:`pyg_dfgnn.ops.gt_attention`) in fp16 / bf16.

For each graph and case it times forward + backward and backward alone (median
ms, ``triton.testing.do_bench``, the two arms interleaved twice and the lower
median kept) and forward + backward in fp32 (the issue's yardstick: bf16 at
least 1.6x fp32), checks the two arms' gradients against each other (relative
error, float64 norms) and records the kernel plan. A case that fails is recorded
with its error; the others still run. On the power-law graph the CUDA-core arm
splits its long rows into work items (the default plan) while the tensor-core
walks take each row whole, one warp per 8 rows.

Usage, from the repository root (needs a CUDA GPU and the compiled extension;
estimated under a minute on an H100)::

    python -m benchmarks.mma_backward_ab --out mma_backward_ab.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import traceback

import torch

from benchmarks import generators
from benchmarks.kernels import bench
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import plan

DEV = "cuda"
#: ``(dtype, heads, channels)`` of each graph's cases.
CASES = (("bfloat16", 1, 128), ("bfloat16", 4, 32), ("float16", 2, 64), ("bfloat16", 8, 64))
REPEATS = (10, 60)  # warm-up, measured ms of each timing


def graphs(quick: bool) -> dict:
    """name -> (edge_index on GPU, nodes, chunk override or None: the default)."""
    nb = 128 if quick else 1024
    out = {}
    for kind, name in (("pattern", "PATTERN"), ("cluster", "CLUSTER")):
        ei, batch, _, _ = generators.sbm_batch(kind, nb, seed=0)
        out[name] = (ei.to(DEV), batch.numel(), None)
    for kind, name in (("mnist", "MNIST"), ("coco_sp", "COCO-SP")):
        ei, batch = generators.knn_batch(kind, nb, seed=0)
        out[name] = (ei.to(DEV), batch.numel(), None)
    n = 5_000 if quick else 20_000
    out["power-law"] = (generators.power_law_graph(n, 100, 2_000, 0, DEV), n, None)
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(lay, dtype, H, C, chunk) -> dict:
    torch.manual_seed(0)
    n_dst, n_src = lay.num_dst, lay.num_src
    q = torch.randn(n_dst, H, C, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(n_src, H, C, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(n_src, H, C, device=DEV, dtype=dtype, requires_grad=True)
    g = torch.randn(n_dst, H, C, device=DEV, dtype=dtype)
    res = {"edges": lay.num_edges, "nodes": n_dst, "chunk": chunk}

    def fwd_bwd(leaves=(q, k, v), grad=g):
        out = ops.gt_attention(lay, *leaves)
        return torch.autograd.grad(out, leaves, grad)

    # fp32 copies, default plan: the target is bf16 f+b >= 1.6x fp32
    leaves32 = tuple(t.detach().float().requires_grad_() for t in (q, k, v))
    with plan.override(chunk=chunk):
        res["fp32_fwd_bwd_ms"] = bench(lambda: fwd_bwd(leaves32, g.float()), *REPEATS)
    del leaves32

    arms = {"cuda_cores": False, "tensor_cores": True}
    grads, times = {}, {name: {"fwd_bwd": math.inf, "bwd": math.inf} for name in arms}
    for name, on in arms.items():
        with plan.override(mma_backward=on, chunk=chunk):
            pl = plan.plan_for(lay, dtype, C)
            res[f"plan_{name}"] = {"mma": pl.mma, "dense_cells": pl.dense_cells,
                                   "bwd_one_launch": pl.bwd_one_launch,
                                   "mma_backward": pl.mma_backward}
            grads[name] = fwd_bwd()
    res["rel_diff"] = {n: rel(a, b) for n, a, b in
                       zip(("dq", "dk", "dv"), grads["tensor_cores"], grads["cuda_cores"])}
    for _ in range(2):  # interleaved: clock and cache drift hit both arms alike
        for name, on in arms.items():
            with plan.override(mma_backward=on, chunk=chunk):
                out = ops.gt_attention(lay, q, k, v)
                t_fb = bench(fwd_bwd, *REPEATS)
                t_b = bench(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True),
                            *REPEATS)
            times[name]["fwd_bwd"] = min(times[name]["fwd_bwd"], t_fb)
            times[name]["bwd"] = min(times[name]["bwd"], t_b)
    res["ms"] = times
    res["speedup_bwd"] = times["cuda_cores"]["bwd"] / times["tensor_cores"]["bwd"]
    res["speedup_fwd_bwd"] = times["cuda_cores"]["fwd_bwd"] / times["tensor_cores"]["fwd_bwd"]
    res["over_fp32_fwd_bwd"] = {name: res["fp32_fwd_bwd_ms"] / t["fwd_bwd"]
                                for name, t in times.items()}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--quick", action="store_true", help="128-graph batches, 5K-node power law")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'graph':<10} {'case':<14} {'bwd cc':>8} {'bwd tc':>8} {'x':>5} "
          f"{'f+b cc':>8} {'f+b tc':>8} {'x':>5} {'f+b fp32':>8} {'tc/32':>5}  rel dq/dk/dv")
    for gname, (ei, n, chunk) in graphs(args.quick).items():
        lay = GraphLayout.from_edge_index(ei, (n, n))
        for dname, H, C in CASES:
            row = {"graph": gname, "dtype": dname, "H": H, "C": C}
            try:
                row.update(run_case(lay, getattr(torch, dname), H, C, chunk))
                row["status"] = "ok"
                ms, d = row["ms"], row["rel_diff"]
                print(f"{gname:<10} {dname[:4]} {H}x{C:<7} {ms['cuda_cores']['bwd']:8.3f} "
                      f"{ms['tensor_cores']['bwd']:8.3f} {row['speedup_bwd']:5.2f} "
                      f"{ms['cuda_cores']['fwd_bwd']:8.3f} {ms['tensor_cores']['fwd_bwd']:8.3f} "
                      f"{row['speedup_fwd_bwd']:5.2f} {row['fp32_fwd_bwd_ms']:8.3f} "
                      f"{row['over_fp32_fwd_bwd']['tensor_cores']:5.2f}  "
                      f"{d['dq']:.1e}/{d['dk']:.1e}/{d['dv']:.1e}")
            except Exception as e:  # recorded; the other cases still run
                row["status"] = "error"
                row["error"] = f"{type(e).__name__}: {e}"
                row["traceback"] = traceback.format_exc(limit=3)
                print(f"{gname:<10} {dname[:4]} {H}x{C:<7} ERROR {row['error'][:80]}")
            rows.append(row)
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
