"""Where one layer's forward + backward spends its time: the CUDA kernels of one
step grouped by name (torch.profiler, device time), the step's wall time (CUDA
events) and the host time the step's launches take, for the methods of
:mod:`benchmarks.layers` side by side.

Usage: python -m benchmarks.profile_layer --cases gt:GitHub:fp32,gat:ogbn-arxiv:fp32
       [--methods fused,fused-compile] [--top 12] [--out profile.json]
"""
import argparse
import json
import time

import torch

from benchmarks import layers, profile_backward


def step_fn(case: layers.Case, method: str, backend: str):
    """One forward + backward of the case's layer by ``method``."""
    eager = layers.COMPILED.get(method, method)
    call = (case.compile_fn(method, backend)(None, False) if method in layers.COMPILED
            else case.eager(eager))
    leaves = case.leaves(eager)

    def step():
        for p in leaves:
            p.grad = None
        out = call()
        out.backward(case.g.to(out.dtype))
    return step


def measure(step, reps: int = 30) -> dict:
    """Median wall ms of a step from an idle GPU (CUDA events) and median host ms
    of issuing it (the time until the launches return)."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    wall, host = [], []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t = time.perf_counter()
        a.record()
        step()
        host.append((time.perf_counter() - t) * 1e3)
        b.record()
        torch.cuda.synchronize()
        wall.append(a.elapsed_time(b))
    return {"wall_ms": sorted(wall)[reps // 2], "host_ms": sorted(host)[reps // 2]}


def kernel_table(step, top: int) -> list:
    """``[(kernel name, device ms per step, calls per step)]`` of the top kernels."""
    steps = 3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 1e3 / steps, e.count // steps)
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_layer",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--cases", required=True, help="model:graph:dtype[:HxC], comma-separated")
    ap.add_argument("--methods", default="pyg-compile,fused,fused-compile")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=None, help="JSON of every table")
    args = ap.parse_args(argv)
    largs = layers.parse_args([])
    kernel_precision = layers.kernels.set_matmul_precision(False)
    data = args.data or profile_backward.default_data()
    dev = torch.device("cuda")
    result, graphs = {"matmul": kernel_precision, "cases": []}, {}
    for spec in args.cases.split(","):
        model, gname, dtype, *hc = spec.split(":")
        H, C = (int(v) for v in (hc[0] if hc else "1x128").split("x"))
        if gname not in graphs:
            graphs[gname] = layers.load_graph(gname, dev, False, data)
        case = layers.Case(graphs[gname], model, H, C, dtype, largs)
        for method in args.methods.split(","):
            entry = {"case": spec, "method": method}
            try:
                step = step_fn(case, method, largs.compile_backend)
                entry.update(measure(step))
                entry["kernels"] = kernel_table(step, args.top)
            except Exception as e:  # noqa: BLE001  (recorded, the others still run)
                entry["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            result["cases"].append(entry)
            print(f"== {spec} {method}: " + (entry.get("error") or
                  f"wall {entry['wall_ms']:.3f} ms, host {entry['host_ms']:.3f} ms"))
            for name, ms, calls in entry.get("kernels", []):
                print(f"   {ms:8.3f} ms {calls:4d}x  {name[:110]}")
        del case
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
