"""Per-call overheads of the fused ops on a small graph: the host (CPU) cost of each
layer of a call, measured as pipelined wall time per call (the GPU work of these
calls is shorter than their host work, so the queue never backs up), and a
profiler table of one forward + backward.

Usage: python -m benchmarks.profile_step [--graph Cora] [--json out.json] [--table]
"""
import argparse
import json
import time

import torch

from benchmarks import datasets
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout


def per_call_us(fn, n=400):
    """Median over 5 rounds of the pipelined wall time per call, in µs."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t) / n * 1e6)
    return sorted(rounds)[2]


def gpu_us(fn, n=50):
    """Median time of one call from an idle GPU to its last kernel (CUDA events,
    synchronised before each call): host and GPU latency together."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[n // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", default="Cora")
    ap.add_argument("--json", default="")
    ap.add_argument("--table", action="store_true", help="also print a profiler table")
    args = ap.parse_args()
    d = datasets.planetoid(args.graph) if args.graph != "PubMed" else datasets.pubmed_graph()
    n = d.num_nodes
    lay = GraphLayout.from_edge_index(d.edge_index.cuda(), (n, n))
    lay.colptr  # noqa: B018
    leaf = dict(device="cuda", requires_grad=True)
    q, k, v = (torch.randn(n, 1, 128, **leaf) for _ in range(3))
    a_src, a_dst = torch.randn(n, 1, **leaf), torch.randn(n, 1, **leaf)
    x2 = torch.randn(n, 128, **leaf)
    beta = torch.ones((), **leaf)
    g = torch.randn(n, 1, 128, device="cuda")
    args_nograd = ops.gt_op_args(lay, q.detach(), k.detach(), v.detach(), 128 ** -0.5,
                                 need_grad=False)
    empty = torch.empty(0, device="cuda")

    def fb(f, grad):
        def step():
            torch.autograd.backward(f(), grad)
        return step

    with torch.no_grad():
        calls = {
            "empty_like (floor of one ATen op)": lambda: torch.empty_like(empty),
            "torch.ops.dfgnn.gt_fwd, prebuilt args": lambda: torch.ops.dfgnn.gt_fwd(*args_nograd),
            "gt_attention fwd (no_grad)": lambda: ops.gt_attention(lay, q, k, v),
            "gat_attention fwd (no_grad)": lambda: ops.gat_attention(lay, a_src, a_dst, q),
            "agnn_attention fwd (no_grad)": lambda: ops.agnn_attention(lay, x2, None, beta),
        }
        res = {name: per_call_us(f) for name, f in calls.items()}
        gpu = {name: gpu_us(f) for name, f in calls.items()}
    steps = {
        "x * 2 fwd+bwd (autograd floor)": fb(lambda: x2 * 2.0, x2.detach()),
        "gt_attention fwd (grad)": lambda: ops.gt_attention(lay, q, k, v),
        "gt_attention fwd+bwd": fb(lambda: ops.gt_attention(lay, q, k, v), g),
        "gat_attention fwd+bwd": fb(lambda: ops.gat_attention(lay, a_src, a_dst, q), g),
        "agnn_attention fwd+bwd": fb(lambda: ops.agnn_attention(lay, x2, None, beta), g.view(n, 128)),
    }
    for name, f in steps.items():
        res[name] = per_call_us(f)
        gpu[name] = gpu_us(f)
    print(f"{args.graph}: host µs per call (pipelined) | one synchronised call, µs")
    for name in res:
        print(f"  {name:<42} {res[name]:8.1f} | {gpu[name]:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graph": args.graph, "host_us": res, "single_call_us": gpu}, f, indent=1)
    if args.table:
        from torch.profiler import ProfilerActivity, profile
        step = steps["gt_attention fwd+bwd"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25,
                                        max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12,
                                        max_name_column_width=60))


if __name__ == "__main__":
    main()
