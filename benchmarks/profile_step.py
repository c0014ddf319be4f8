"""Profiles one fused forward + backward on a small graph (CPU-side and GPU-side
time per op), to find fixed per-call overheads. Usage: python benchmarks/profile_step.py"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pyg_dfgnn import datasets, ops  # noqa: E402
from pyg_dfgnn.layout import GraphLayout  # noqa: E402


def main():
    d = datasets.planetoid("Cora")
    n = d.num_nodes
    lay = GraphLayout.from_edge_index(d.edge_index.cuda(), (n, n))
    q, k, v = (torch.randn(n, 1, 128, device="cuda", requires_grad=True) for _ in range(3))
    g = torch.randn(n, 1, 128, device="cuda")

    def step():
        out = ops.gt_attention(lay, q, k, v)
        torch.autograd.backward(out, g)

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    for name, fn in (("fwd", lambda: ops.gt_attention(lay, q, k, v)), ("fwd+bwd", step)):
        t = time.perf_counter()
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        print(f"{name}: {(time.perf_counter() - t) / 200 * 1e3:.3f} ms/iter (wall, pipelined)")
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            print(f"  single {name}: {(time.perf_counter() - t) * 1e3:.3f} ms")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=22, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=60))


if __name__ == "__main__":
    main()
