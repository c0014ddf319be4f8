"""GPU time of each kernel of a fused call, and the call's GPU span (first kernel
start to last kernel end), with an L2 flush before every call as in
``triton.testing.do_bench``. Shows which kernel of a forward or forward + backward
takes the time, and (span against the kernel sum) how much of it waits on the host.

Usage: python -m benchmarks.profile_kernels [--graphs PubMed,GitHub] [--json out.json]
"""
import argparse
import collections
import json
import sys

import torch

from benchmarks import kernels  # the benchmark's graphs
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout


def profile_call(fn, flush, iters=20):
    """(median GPU span in µs, {kernel name: median µs}, kernels per call)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    spans, cur, per = [], None, collections.defaultdict(list)
    for e in events:
        if "FillFunctor" in e.name and e.time_range.elapsed_us() > 30:  # the flush
            if cur and cur[0] is not None:
                spans.append(cur[1] - cur[0])
            cur = [None, None]
            continue
        if cur is None:
            continue
        cur[0] = e.time_range.start if cur[0] is None else cur[0]
        cur[1] = e.time_range.end
        per[e.name[:100]].append(e.time_range.elapsed_us())
    if cur and cur[0] is not None:
        spans.append(cur[1] - cur[0])
    spans.sort()
    kern = {k: sorted(t)[len(t) // 2] for k, t in per.items()}
    return (spans[len(spans) // 2] if spans else float("nan"), kern,
            sum(len(t) for t in per.values()) / iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="Cora,PubMed,GitHub")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("profile_kernels.py: no CUDA device: nothing was profiled")
        return 1
    graphs = kernels.load_graphs(quick=True)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    res = {}
    for name in args.graphs.split(","):
        ei, n, _ = graphs[name]
        lay = GraphLayout.from_edge_index(ei, (n, n))
        lay.colptr  # noqa: B018
        H, C = 1, 128
        q, k, v, x = (torch.randn(n, H, C, device="cuda", requires_grad=True) for _ in range(4))
        a_src, a_dst = (torch.randn(n, H, device="cuda", requires_grad=True) for _ in range(2))
        beta = torch.ones((), device="cuda", requires_grad=True)
        g = torch.randn(n, H, C, device="cuda")
        x2 = x.view(n, H * C)
        calls = {
            "gt_fwd": (lambda: ops.gt_attention(lay, q, k, v), None),
            "gat_fwd": (lambda: ops.gat_attention(lay, a_src, a_dst, x), None),
            "agnn_fwd": (lambda: ops.agnn_attention(lay, x2, None, beta), None),
            "gt_fwd_bwd": (lambda: ops.gt_attention(lay, q, k, v), g),
            "gat_fwd_bwd": (lambda: ops.gat_attention(lay, a_src, a_dst, x), g),
        }
        for cname, (f, grad) in calls.items():
            def fn(f=f, grad=grad):
                if grad is None:
                    with torch.no_grad():
                        f()
                else:
                    torch.autograd.backward(f(), grad)
            span, kern, count = profile_call(fn, flush)
            res[f"{name}/{cname}"] = {"gpu_span_us": span, "kernels_us": kern,
                                      "kernels_per_call": count}
            print(f"{name:8} {cname:12} GPU span {span:7.1f} µs, {count:.0f} kernels per call")
            for kname, t in sorted(kern.items(), key=lambda kv: -kv[1]):
                print(f"      {t:7.1f}  {kname}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
