"""Data-parallel training throughput of the fused and native attention convs on 1
and 2 GPUs (DistributedDataParallel, NCCL).

    python -m benchmarks.multi_gpu                  # node and graph task, fused and native
    python -m benchmarks.multi_gpu --oversubscribe  # one GPU: also 2 ranks on it (gloo)
    python -m benchmarks.multi_gpu --tasks graph --world-sizes 1 2 4 --out out/ddp
    python -m benchmarks.multi_gpu --tasks graph --batch-sizes 64 512 --amp none bf16 --time-split
    python -m benchmarks.multi_gpu --models gat gt --out out/ddp --resume  # finish a stopped run
    python -m benchmarks.multi_gpu --tasks graph --impls fused --repeats 3  # medians of 3 runs

Each configuration (task x model x implementation x world size x amp) trains
``examples/multi_gpu.py`` in a fresh process, which starts its ranks with
``torch.multiprocessing.spawn`` (``--launcher torchrun``: one ``torchrun`` agent
starts them, as a cluster job does); a fresh process per configuration starts every
measurement from the same state (empty caching allocator, new NCCL communicator).
Throughput is the samples of every rank (seed nodes or graphs) over the slowest
rank's time for the steps after the warm-up; ``--batch-size`` is per rank, so a
world size of N trains N times the batch of one GPU per step (weak scaling).

A world size larger than the number of GPUs is skipped unless ``--oversubscribe``
is given: then the ranks share GPUs, over gloo, since NCCL refuses two ranks on
one GPU. That exercises the multi-process path, not the scaling: such rows are
marked in the table.

Writes ``multi_gpu.json`` (every configuration's report) and ``multi_gpu.md`` (the
table) to ``--out`` (default: a new temporary folder), again after every run, and
prints the table; ``--table-from JSON`` prints the table of such a record again.
``--resume`` keeps the finished runs of the record in ``--out`` and runs only the
others, so that a table whose runs outlast one sitting is still one record of one
machine.

``--repeats N`` trains every configuration N times, in rounds (each configuration
once before any twice), so that a drift of the host's speed over the sitting reaches
every configuration alike; the table gives each configuration's median throughput
and the range of its runs, and the scaling and fused / native ratios of the medians.
A host-bound step makes one run's throughput move by a fifth between runs on one
machine (docs/multi_gpu.md, "Measurements").
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi_gpu.py"
UNIT = {"node": "seeds/s", "graph": "graphs/s"}
BATCH_SIZE = {"node": 1024, "graph": 64}
#: Loader workers per rank by task (--workers sets both): a node batch's sampling
#: takes 38 ms on one CPU core (docs/multi_gpu.md, "The data path").
WORKERS = {"node": 12, "graph": 4}
#: Training steps per rank by task (--steps sets both): ogbn-arxiv's 90,941 training
#: seeds give two ranks 44 batches of 1,024 each; PATTERN graphs are generated to
#: measure, and 90 timed steps of 6-8 ms span half a second of a host-bound step.
STEPS = {"node": 40, "graph": 100}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    from benchmarks import cli, datasets
    p = argparse.ArgumentParser(prog="python -m benchmarks.multi_gpu",
                                description=__doc__.split("\n")[0],
                                formatter_class=cli.HelpFormatter)
    p.add_argument("--tasks", nargs="+", choices=("node", "graph"), default=["node", "graph"],
                   help="node: ogbn-arxiv with NeighborLoader; graph: PATTERN batches")
    p.add_argument("--impls", nargs="+", choices=("fused", "native"),
                   default=["fused", "native"], help="conv implementations")
    p.add_argument("--models", "--model", nargs="+", choices=("gat", "gt"), default=["gat"],
                   help="gat: GATConv, gt: TransformerConv (default: gat)")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2],
                   help="ranks per run, one GPU each")
    p.add_argument("--oversubscribe", action="store_true",
                   help="run world sizes above the number of GPUs with ranks sharing GPUs")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per rank and run (default: 40 for node, 100 for "
                        "graph)")
    p.add_argument("--warmup", type=int, default=10, help="of which the first are not timed")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help="per rank, each a run (default: 1024 seeds for node, 64 graphs for "
                        "graph)")
    p.add_argument("--amp", nargs="+", choices=("none", "bf16"), default=["none"],
                   help="precisions, each a run: none (fp32) or bf16 autocast")
    p.add_argument("--time-split", action="store_true",
                   help="also report data / forward / backward / optimiser time per step "
                        "(each part then synchronises) and the time of an all-reduce alone")
    p.add_argument("--hidden", type=int, default=32, help="channels per head")
    p.add_argument("--workers", type=int, default=None,
                   help="data loader workers per rank (default: 12 for node, whose "
                        "neighbour sampling takes about 40 ms a batch on one CPU core, 4 for "
                        "graph)")
    p.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                   help="pass --no-prefetch to the example: batches copied and layouts built "
                        "in the step (default: prefetched on a side stream)")
    p.add_argument("--worker-start-method", choices=("fork", "forkserver", "spawn"),
                   default=None, help="passed to the example: how loader workers start "
                                      "(default: the platform's)")
    p.add_argument("--prefetch-thread", action="store_true",
                   help="pass --prefetch-thread to the example: prefetch in a background thread")
    p.add_argument("--launcher", choices=("spawn", "torchrun"), default="spawn",
                   help="how the ranks start: torch.multiprocessing.spawn from the example, "
                        "or a standalone torchrun agent (default: spawn)")
    p.add_argument("--numa-binding", choices=("node", "socket", "exclusive", "core-complex"),
                   default=None, help="torchrun's --numa-binding: each rank's threads on the "
                                      "CPUs near its GPU (default: unbound)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every configuration, in rounds; the table takes their "
                        "median")
    p.add_argument("--timeout", type=int, default=600,
                   help="seconds per run; a run past it is aborted, its log then ends with "
                        "every process's Python stacks")
    datasets.add_data_argument(p, "ogbn-arxiv/ (--tasks node)")
    p.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    p.add_argument("--resume", action="store_true",
                   help="continue the record in --out: its finished runs are kept, not run "
                        "again (default: a new record)")
    p.add_argument("--table-from", metavar="JSON", default=None,
                   help="print the table of a record this benchmark wrote (e.g. "
                        "docs/results/multi_gpu.json) and run nothing (default: none, the "
                        "benchmark runs)")
    args = p.parse_args(argv)
    if args.warmup >= (min(STEPS.values()) if args.steps is None else args.steps):
        p.error("--warmup must be below --steps")
    if args.numa_binding and args.launcher != "torchrun":
        p.error("--numa-binding is torchrun's: pass --launcher torchrun")
    if args.prefetch_thread and not args.prefetch:
        p.error("--prefetch-thread prefetches: it contradicts --no-prefetch")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.resume and not args.out:
        p.error("--resume continues the record in --out; name that folder")
    return args


#: A line of torchrun's own log ("E1129 20:46:38.954000 3805 ...").
TORCHRUN_LOG = re.compile(r"[EWIF]\d{4} \d\d:\d\d:\d\d")


def command(args, task: str, model: str, impl: str, world: int, batch: int, amp: str,
            gpus: int, path: Path) -> List[str]:
    """The command line that trains one configuration, its report to ``path``."""
    opts = ["--task", task, "--model", model, "--impl", impl, "--device", "cuda",
            "--epochs", "1", "--steps", str(steps(args, task)), "--warmup", str(args.warmup),
            "--batch-size", str(batch), "--hidden", str(args.hidden),
            "--workers", str(workers(args, task)), "--eval-steps", "1", "--no-progress",
            "--amp", amp, "--json", str(path)]
    if args.time_split:
        opts.append("--time-split")
    if not args.prefetch:
        opts.append("--no-prefetch")
    elif args.prefetch_thread:
        opts.append("--prefetch-thread")
    if args.worker_start_method:
        opts += ["--worker-start-method", args.worker_start_method]
    if args.data:
        opts += ["--data", args.data]
    if task == "graph":  # enough graphs for every rank's steps in one epoch
        opts += ["--graphs", str(steps(args, task) * batch * world), "--test-graphs",
                 str(batch)]
    if world > gpus:
        opts.append("--oversubscribe")
    if args.launcher == "torchrun":
        bind = ["--numa-binding", args.numa_binding] if args.numa_binding else []
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(world), *bind, str(EXAMPLE), *opts]
    return [sys.executable, str(EXAMPLE), "--nprocs", str(world), *opts]


def run_one(args, task: str, model: str, impl: str, world: int, batch: int, amp: str,
            gpus: int, out: Path, repeat: int = 0) -> Dict[str, object]:
    """Trains one configuration (its ``repeat``-th run, from 0); returns the
    example's report, or an ``error``."""
    path = out / (f"{task}_{model}_{impl}_{world}_b{batch}_{amp}"
                  + (f"_r{repeat}" if repeat else "") + ".json")
    log = path.with_suffix(".log")
    cmd = command(args, task, model, impl, world, batch, amp, gpus, path)
    print(" ".join(cmd[1:]), flush=True)
    base = {"task": task, "model": model, "impl": impl, "world_size": world,
            "batch_size_per_rank": batch, "amp": amp, "launcher": args.launcher,
            "repeat": repeat}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        # Its own process group, so that a run past the timeout is stopped with all
        # its ranks and loader workers; PYTHONFAULTHANDLER makes each of them print
        # its threads' Python stacks on the SIGABRT: the log shows where it hung.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code = None
    base["wall_s"] = round(time.perf_counter() - t0, 1)  # start-up, training, evaluation
    if code is None and not path.is_file():
        return {**base, "error": f"timed out after {args.timeout} s (stacks: {log})"}
    if code not in (0, None):
        return {**base, "error": _last_message(log.read_text(errors="replace"), code)
                + f" (log: {log})"}
    rep = {**json.loads(path.read_text()), "launcher": args.launcher, "wall_s": base["wall_s"],
           "repeat": repeat}
    if code is None:  # measured and reported, then stuck on its way out
        rep["exit"] = f"timed out after {args.timeout} s, after its report (stacks: {log})"
    if rep["steps"] < steps(args, task):
        rep["error"] = f"only {rep['steps']} of {steps(args, task)} steps (too few samples)"
    return rep


def workers(args, task: str) -> int:
    """Loader workers per rank for ``task``: ``--workers``, else :data:`WORKERS`."""
    return WORKERS[task] if args.workers is None else args.workers


def steps(args, task: str) -> int:
    """Training steps per rank for ``task``: ``--steps``, else :data:`STEPS`."""
    return STEPS[task] if args.steps is None else args.steps


def _last_message(text: str, code: int) -> str:
    """The last line a failed run printed, before torchrun's own traceback and
    failure report (``ChildFailedError``) and not one of torchrun's log lines."""
    report = text.find("ChildFailedError")
    if report >= 0:
        text = text[:max(text.rfind("Traceback (most recent call last):", 0, report), 0)]
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not TORCHRUN_LOG.match(ln)]
    return lines[-1] if lines else f"exit status {code}"


def _stop_group(proc: subprocess.Popen, grace_s: float = 20.0, settle_s: float = 3.0,
                stagger_s: float = 0.3) -> None:
    """Aborts every process of ``proc``'s group, so that each prints its stacks;
    waits up to ``grace_s`` for ``proc`` and ``settle_s`` more for the others (the
    ranks and workers, still writing theirs), then kills what is left.

    One process at a time, ``stagger_s`` apart: aborted together, their stacks
    interleave in the one log, line by line. ``proc`` (the launcher) goes first,
    so that it cannot stop its ranks before they print (``spawn`` terminates the
    others when one dies); then the rest, newest first (loader workers before
    the rank that started them)."""
    for pid in [proc.pid] + sorted(_group_members(proc.pid) - {proc.pid}, reverse=True):
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            continue
        time.sleep(stagger_s)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(settle_s)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group is gone
        pass
    proc.wait()


def _group_members(pgid: int) -> set:
    """The processes in process group ``pgid`` (from ``/proc``; empty elsewhere)."""
    members = set()
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    members.add(int(name))
            except OSError:  # gone meanwhile
                pass
    return members


def table(reports: List[Dict[str, object]]) -> str:
    """Markdown table, a row per configuration: its median throughput over its
    runs (``--repeats``) with their range, the scaling over one rank and fused over
    native of the medians, and the time split of the median run. A configuration's
    failed runs each get a row."""
    groups: Dict[tuple, List[Dict[str, object]]] = {}
    for r in reports:
        groups.setdefault(_config(r), []).append(r)
    median = {}  # configuration -> its median run
    for config, runs in groups.items():
        ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["throughput"])
        if ok:
            median[config] = ok[(len(ok) - 1) // 2]  # the lower median: a measured run

    def throughput(r, impl=None, world=None):
        task, model, impl_, world_, batch, amp = _config(r)
        run = median.get((task, model, impl or impl_, world or world_, batch, amp))
        return run["throughput"] if run else None
    rows = ["| task | model | batch / rank | amp | impl | ranks | throughput | vs 1 rank "
            "| fused / native | runs | mean step ms | data ms (median / mean) | forward ms "
            "| backward ms | optimiser ms | all-reduce ms | data share | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for config, runs in groups.items():
        if config in median:
            r = median[config]
            rows.append(_measured_row(r, [x["throughput"] for x in runs if "error" not in x],
                                      throughput(r, world=1), throughput(r, impl="native")))
        for r in runs:
            if "error" in r:
                run = f" (run {r['repeat'] + 1})" if r.get("repeat") else ""
                rows.append(f"{_row_head(r)} | | | | | | | | | | | failed{run}: "
                            f"{r['error']} |")
    return "\n".join(rows)


def _measured_row(r: Dict[str, object], throughputs: List[float], one: Optional[float],
                  native: Optional[float]) -> str:
    """The table row of run ``r``, the median of ``throughputs`` (its
    configuration's runs), against the medians ``one`` (1 rank) and ``native``."""
    scale = f"{r['throughput'] / one:.2f}x" if one else ""
    ratio = f"{r['throughput'] / native:.2f}x" if native and r["impl"] == "fused" else ""
    spread = (f"{len(throughputs)}: {min(throughputs):,.0f}-{max(throughputs):,.0f}"
              if len(throughputs) > 1 else "1")
    # The slowest rank's mean step, from the throughput: above the split's median
    # step where some steps stalled.
    mean = 1e3 * r["batch_size_per_rank"] * r["world_size"] / r["throughput"]
    cells = [f"{r[k]:.2f}" if k in r else "" for k in
             ("data_ms", "forward_ms", "backward_ms", "optimizer_ms", "allreduce_ms")]
    if "data_mean_ms" in r:  # a loader that stalls some steps shows in the mean
        cells[0] += f" / {r['data_mean_ms']:.2f}"
    cells.append(f"{r['data_share']:.0%}" if "data_share" in r else "")
    note = "; ".join(n for n in (
        "oversubscribed GPU: not a scaling number" if r.get("oversubscribed") else "",
        "its exit timed out after the report" if r.get("exit") else "") if n)
    return (f"{_row_head(r)} {r['throughput']:,.0f} {r['unit']} | {scale} | {ratio} | {spread} "
            f"| {mean:.2f} | {' | '.join(cells)} | {note} |")


def _row_head(r: Dict[str, object]) -> str:
    return (f"| {r['task']} | {r['model']} | {r['batch_size_per_rank']} | {r['amp']} | "
            f"{r['impl']} | {r['world_size']} |")


def header(result: Dict[str, object]) -> str:
    """The line above the table: machine, versions, configuration."""
    per_rank = ", ".join(f"{n} ({task})" for task, n in result["workers"].items())
    models = result.get("models") or [result["model"]]  # records of one model name it alone
    steps = result["steps"]  # per task; one number in older records
    steps = (", ".join(f"{n} ({task})" for task, n in steps.items())
             if isinstance(steps, dict) else str(steps))
    return (f"{result['device_name']} x {result['gpus']}, torch {result['torch']}, NCCL "
            f"{result['nccl']}, {result['date']}, {' '.join(models)}, steps per rank: {steps}, "
            f"{result['warmup']} of them warm-up, loader workers per rank: {per_rank}")


def write_record(result: Dict[str, object], out: Path) -> str:
    """Writes ``multi_gpu.json`` and ``multi_gpu.md`` of ``result`` to ``out``;
    returns the table."""
    # From a run's report: this process leaves the GPUs to the runs (no CUDA context).
    result["device_name"] = next((r["device_name"] for r in result["runs"]
                                  if "device_name" in r), "?")
    md = table(result["runs"])
    (out / "multi_gpu.json").write_text(json.dumps(result, indent=2))
    (out / "multi_gpu.md").write_text(f"{header(result)}\n\n{md}\n")
    return md


#: What makes two records comparable row by row (``--resume`` refuses others).
SETTINGS = ("gpus", "torch", "nccl", "warmup", "hidden", "prefetch", "prefetch_thread",
            "launcher", "numa_binding", "worker_start_method")
#: Settings per task: the tasks both records hold must agree.
PER_TASK = ("workers", "steps")


def _config(r: Dict[str, object]) -> tuple:
    """A run's configuration: the loops of :func:`main` (its runs differ in
    ``repeat`` alone)."""
    return (r["task"], r["model"], r["impl"], r["world_size"], r["batch_size_per_rank"],
            r["amp"])


def _resume(result: Dict[str, object], out: Path) -> None:
    """Continues the record in ``out`` (if any) in ``result``: its finished runs,
    date, command (this one goes to ``resumed_by``), tasks' workers and models.
    Raises ``SystemExit`` where its settings differ (its rows would not compare)."""
    path = out / "multi_gpu.json"
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    # Older records give one number of steps for every task: not comparable.
    per_task = {k: old.get(k) if isinstance(old.get(k), dict) else None for k in PER_TASK}
    merged = {k: {**(per_task[k] or {}), **result[k]} for k in PER_TASK}
    differ = [k for k in SETTINGS if old.get(k) != result[k]]
    differ += [k for k in PER_TASK
               if per_task[k] is None or merged[k] != {**result[k], **per_task[k]}]
    if differ:
        sys.exit(f"--resume: {path} was measured with other settings ({', '.join(differ)}); "
                 "give a new --out, or the same options")
    result["resumed_by"] = old.get("resumed_by", []) + [result["command"]]
    result.update(date=old["date"], command=old["command"], **merged,
                  models=list(dict.fromkeys(old.get("models", []) + result["models"])))
    result["runs"] = [r for r in old["runs"] if "error" not in r]


def configurations(args, gpus: int) -> List[tuple]:
    """Every configuration to run, as :func:`_config` gives a run's, in the order
    of a round: task, model, world size, batch size, amp, implementation (so a
    configuration's fused and native runs are neighbours)."""
    configs = []
    for task in args.tasks:
        for model in args.models:
            for world in args.world_sizes:
                if world > gpus and not args.oversubscribe:
                    print(f"skipping {world} ranks: {gpus} GPU(s) (--oversubscribe shares "
                          "them)")
                    continue
                for batch in args.batch_sizes or [BATCH_SIZE[task]]:
                    for amp in args.amp:
                        for impl in args.impls:
                            configs.append((task, model, impl, world, batch, amp))
    return configs


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    args = parse_args(argv)
    if args.table_from:
        result = json.loads(Path(args.table_from).read_text())
        print(f"{header(result)}\n\n{table(result['runs'])}")
        return result
    if not torch.cuda.is_available():
        sys.exit("benchmarks.multi_gpu measures GPUs and none is visible here "
                 "(python examples/multi_gpu.py --device cpu --quick runs the CPU path)")
    gpus = torch.cuda.device_count()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="multi_gpu_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    nccl = torch.cuda.nccl.version()
    line = "python -m benchmarks.multi_gpu " + shlex.join(
        sys.argv[1:] if argv is None else list(argv))
    result = {
        "device_name": "?", "gpus": gpus, "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"), "command": line,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "models": args.models,
        "steps": {task: steps(args, task) for task in args.tasks}, "warmup": args.warmup,
        "hidden": args.hidden, "numa_binding": args.numa_binding,
        "workers": {task: workers(args, task) for task in args.tasks},
        "prefetch": args.prefetch,
        "prefetch_thread": args.prefetch and args.prefetch_thread, "launcher": args.launcher,
        "worker_start_method": args.worker_start_method,
        "runs": [],
    }
    if args.resume:
        _resume(result, out)
    reports: List[Dict[str, object]] = result["runs"]
    done = {(_config(r), r.get("repeat", 0)) for r in reports}
    configs = configurations(args, gpus)
    for repeat in range(args.repeats):
        for config in configs:
            if (config, repeat) in done:
                continue
            rep = run_one(args, *config, gpus, out, repeat=repeat)
            reports.append(rep)
            print(f"  failed: {rep['error']}" if "error" in rep else
                  f"  {rep['throughput']:,.0f} {rep['unit']}, wall {rep.get('wall_s')} s, "
                  f"rank 0's parts (s): {rep.get('phase_s')}", flush=True)
            # After every run: a benchmark stopped part-way (a caller's time limit)
            # leaves the record of the runs it finished.
            write_record(result, out)
    md = write_record(result, out)
    print(f"\n{md}\n\nwritten to {out}")
    return result


if __name__ == "__main__":
    main()
