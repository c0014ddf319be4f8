r"""Host path of one fused op call: the latency of a forward (one call, then
synchronise) on Cora, per score function, and where it goes: the GPU's view of
the call (CUDA events), its kernels' own time (the profiler) and the host's.

    python -m benchmarks.host_path --data DIR --calls 1000 --out out/host_path.json

Each row: median and 10th / 90th percentile of ``calls`` single calls
(perf_counter around call + synchronize, after 50 warm-up calls); then the same
calls with CUDA events recorded around each (a pass of its own, so the events'
host time stays out of the first), their median wall time and the median span
between the events (the kernels and the host gaps before and between them); the
kernels' own device time and the number of GPU operations per call (from
:mod:`torch.profiler`); and the host time per call of ``calls`` calls back to back;
under ``no_grad`` and with autograd recording (the node). The run's ``meta``
holds the floors of a synchronisation: ``synchronize()`` with the GPU idle, and
two events recorded and synchronised. ``--breakdown`` adds where the host time of
a call goes: the extension's op alone (the dispatcher, the autograd node, the
output allocations and the launches), the Python steps before it (argument
checks, the plan lookup, the kernel inputs, ...) each timed alone, and the Python
remainder (the whole call less the op).
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
    wall = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e6)
    ev_wall, gpu = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(calls):
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ev_wall.append((time.perf_counter() - t0) * 1e6)
        gpu.append(start.elapsed_time(end) * 1e3)
    q = statistics.quantiles(wall, n=10)
    # Calls back to back, one synchronisation at the end: the host's time per call
    # while the GPU keeps up (Cora's kernels are shorter than the host path).
    host = per_call_us(fn, calls, rounds=1)
    return {"median_us": statistics.median(wall), "p10_us": q[0], "p90_us": q[-1],
            "with_events_median_us": statistics.median(ev_wall),
            "gpu_median_us": statistics.median(gpu), "host_us": host, **kernel_time(fn)}


def kernel_time(fn, calls: int = 20) -> dict:
    """The device time of the GPU operations one call of ``fn`` runs (kernels,
    copies; microseconds, from the profiler's CUPTI records) and their number per
    call; ``None`` with the reason where the profiler records no GPU activity."""
    torch.cuda.synchronize()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        ops = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    except (RuntimeError, AssertionError) as e:  # no CUPTI: no CUDA activity to record
        return {"kernel_us": None, "gpu_ops_per_call": None, "kernel_time_error": str(e)}
    if not ops:
        return {"kernel_us": None, "gpu_ops_per_call": None,
                "kernel_time_error": "the profiler recorded no GPU activity"}
    return {"kernel_us": sum(e.device_time for e in ops) / calls,
            "gpu_ops_per_call": len(ops) / calls}


def sync_floors(calls: int) -> dict:
    """Median microseconds of ``torch.cuda.synchronize()`` with the GPU idle, and of
    two events recorded and synchronised (what the events' pass adds to a call)."""
    bare, events = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    for _ in range(calls):
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        bare.append((time.perf_counter() - t0) * 1e6)
        t0 = time.perf_counter()
        start.record()
        end.record()
        torch.cuda.synchronize()
        events.append((time.perf_counter() - t0) * 1e6)
    return {"sync_idle_us": statistics.median(bare),
            "events_sync_us": statistics.median(events)}


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
    op_call, _ = seen["call_op"]
    parts = {
        "whole_call": fn,
        "extension_op": lambda: attention_mod.call_op(*op_call),
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


def measure_scores(args, data, rows: list) -> None:
    """Appends a row per score of ``args.scores`` and autograd mode (see the
    module docstring) to ``rows``, printing each."""
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
            kern = ("-" if row["kernel_us"] is None else
                    f"{row['kernel_us']:5.1f} us in {row['gpu_ops_per_call']:.0f} op(s)")
            print(f"{score:9s} {'grad' if grad else 'no_grad':8s} median {row['median_us']:7.1f} us"
                  f" (p10 {row['p10_us']:6.1f}, p90 {row['p90_us']:6.1f}); with events "
                  f"{row['with_events_median_us']:6.1f} us, their span {row['gpu_median_us']:6.1f}"
                  f" us; kernels {kern}; host per call {row['host_us']:5.1f} us", flush=True)
            if args.breakdown:
                print("  host us per call: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in row["host_parts_us"].items()), flush=True)


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
    cli.add_override_argument(parser)
    parser.add_argument("--out", default="host_path.json", help="JSON output")
    args = parser.parse_args(argv)
    overrides = cli.parse_overrides(parser, args.override)
    cli.require_kernels("benchmarks.host_path")
    with datasets.exit_on_missing_data():
        data = datasets.planetoid("Cora", root=args.data).to("cuda")
    rows = []
    with ops.plan.override(**overrides):
        measure_scores(args, data, rows)
    floors = sync_floors(args.calls)
    print(f"synchronize, GPU idle: {floors['sync_idle_us']:.1f} us; two events recorded and "
          f"synchronised: {floors['events_sync_us']:.1f} us", flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "calls": args.calls, "heads": HEADS, "C": C,
            **floors, "overrides": {k: repr(v) for k, v in overrides.items()},
            "command": "python -m benchmarks.host_path " + shlex.join(
                sys.argv[1:] if argv is None else list(argv))}
    cli.out_file(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
