r"""Host path of one fused op call: the latency of a forward (one call, then
synchronise) on Cora, per score function, with the kernel's own GPU time beside
it (CUDA events over the same call), so the difference is host time.

    python -m benchmarks.host_path --data DIR --calls 1000 --out out/host_path.json

Each row: median and 10th / 90th percentile of ``calls`` single calls (perf_counter
around call + synchronize, after 50 warm-up calls), the median GPU time between
events around the call (CUDA events: the kernels and the host gaps inside the
call), and the host time per call of ``calls`` calls back to back; under
``no_grad`` and with autograd recording (the node). ``--breakdown`` adds where
the host time of a call goes: the extension's op alone (the dispatcher, the
autograd node, the output allocations and the launches), the Python steps before
it (argument checks, the plan lookup, the kernel inputs, ...) each timed alone,
and the Python remainder (the whole call less the op).
Needs a CUDA GPU and the compiled extension.
"""
from __future__ import annotations

import argparse
import importlib
import json
import shlex
import statistics
import sys
import time

import torch

from benchmarks import cli, datasets
from pyg_dfgnn import ops
from pyg_dfgnn.layout_cache import get_layout

HEADS, C = 8, 8  # the training example's first layer on Cora


def _inputs(score, lay, requires_grad):
    n_dst, n_src, dev = lay.num_dst, lay.num_src, lay.device

    def rand(*shape):
        return torch.randn(*shape, device=dev, requires_grad=requires_grad)

    if score == "dot":
        args = [rand(n_dst, HEADS, C), rand(n_src, HEADS, C), rand(n_src, HEADS, C)]
        return lambda: ops.gt_attention(lay, *args), args
    if score == "additive":
        args = [rand(n_src, HEADS), rand(n_dst, HEADS), rand(n_src, HEADS, C)]
        return lambda: ops.gat_attention(lay, *args), args
    if score == "gatv2":
        args = [rand(n_src, HEADS, C), rand(n_dst, HEADS, C), rand(HEADS, C)]
        return lambda: ops.gatv2_attention(lay, *args), args
    x = rand(n_src, 1, 16)
    beta = torch.ones(1, device=dev)
    return lambda: ops.agnn_attention(lay, x, None, beta), [x]


def measure(fn, calls: int) -> dict:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    wall, gpu = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(calls):
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e6)
        gpu.append(start.elapsed_time(end) * 1e3)
    q = statistics.quantiles(wall, n=10)
    # Calls back to back, one synchronisation at the end: the host's time per call
    # while the GPU keeps up (Cora's kernels are shorter than the host path).
    host = per_call_us(fn, calls, rounds=1)
    return {"median_us": statistics.median(wall), "p10_us": q[0], "p90_us": q[-1],
            "gpu_median_us": statistics.median(gpu), "host_us": host}


def per_call_us(fn, calls: int, rounds: int = 7) -> float:
    """Median over ``rounds`` of the host time per call of ``calls`` calls back to
    back (microseconds)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def breakdown(fn, calls: int) -> dict:
    """Host microseconds per call of the fused call ``fn`` and of its parts, each
    run alone with the arguments ``fn`` passed them (recorded by one call)."""
    # By name: the package exports a function ``attention`` that hides the module.
    attention_mod = importlib.import_module("pyg_dfgnn.ops.attention")
    calls_mod = importlib.import_module("pyg_dfgnn.ops.calls")

    seen = {}

    def spy(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            seen[name] = (args, kwargs)
            return real(*args, **kwargs)
        return real, wrapper

    spies = [(module, name, *spy(module, name)) for module, name in (
        (attention_mod, "call_op"), (calls_mod, "prepare"), (calls_mod, "kernel_inputs"))]
    for module, name, _, wrapper in spies:
        setattr(module, name, wrapper)
    try:
        fn()
    finally:
        for module, name, real, _ in spies:
            setattr(module, name, real)
    (inputs,), _ = seen["kernel_inputs"]
    prep_args, prep_kw = seen["prepare"]
    spec, lay, dtype, head_size, _, _, _, need = prep_args
    value = inputs[spec.value_input]
    plan = calls_mod.prepare(*prep_args, **prep_kw).plan
    (op_name, op_args), _ = seen["call_op"]
    parts = {
        "whole_call": fn,
        "extension_op": lambda: attention_mod.call_op(op_name, op_args),
        "check_inputs": lambda: spec.check(lay, *inputs),
        "runs_kernels": lambda: calls_mod.runs_kernels(lay, value.is_cuda, head_size, dtype),
        "needs_grad": lambda: calls_mod.needs_grad(inputs),
        "plan_lookup": lambda: calls_mod.prepare(*prep_args, **prep_kw),
        "explain_record": lambda: calls_mod.record(spec, lay, plan, need, value),
        "kernel_inputs": lambda: calls_mod.kernel_inputs(inputs),
        "is_compiling": torch.compiler.is_compiling,
    }
    us = {k: per_call_us(f, calls) for k, f in parts.items()}
    us["python_rest"] = us["whole_call"] - us["extension_op"]
    return us


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_path",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=cli.HelpFormatter)
    datasets.add_data_argument(parser, "Planetoid/Cora/raw/")
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per row")
    parser.add_argument("--scores", default="dot,additive,gatv2,cosine",
                        help="comma-separated score functions")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the parts of a call's host path alone")
    parser.add_argument("--out", default="host_path.json", help="JSON output")
    args = parser.parse_args(argv)
    cli.require_kernels("benchmarks.host_path")
    with datasets.exit_on_missing_data():
        data = datasets.planetoid("Cora", root=args.data).to("cuda")
    rows = []
    for score in args.scores.split(","):
        lay = get_layout(data.edge_index, size=(data.num_nodes, data.num_nodes),
                         add_self_loops=score in ("additive", "gatv2", "cosine"))
        for grad in (False, True):
            fn, _ = _inputs(score, lay, grad)
            with torch.enable_grad() if grad else torch.no_grad():
                row = measure(fn, args.calls)
                if args.breakdown:
                    row["host_parts_us"] = breakdown(fn, args.calls)
            row.update(score=score, autograd=grad)
            rows.append(row)
            print(f"{score:9s} {'grad' if grad else 'no_grad':8s} median {row['median_us']:7.1f} us"
                  f" (p10 {row['p10_us']:6.1f}, p90 {row['p90_us']:6.1f}); kernels "
                  f"{row['gpu_median_us']:6.1f} us; host per call {row['host_us']:5.1f} us",
                  flush=True)
            if args.breakdown:
                print("  host us per call: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in row["host_parts_us"].items()), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "calls": args.calls, "heads": HEADS, "C": C,
            "command": "python -m benchmarks.host_path " + shlex.join(
                sys.argv[1:] if argv is None else list(argv))}
    cli.out_file(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
