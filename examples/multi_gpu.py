"""Data-parallel training of the fused attention layers with DistributedDataParallel.

One process per GPU (NCCL), or per CPU share (gloo). Two tasks:

* ``--task node``: node classification on ogbn-arxiv. Every rank samples its own
  mini-batches with a :class:`~torch_geometric.loader.NeighborLoader` over its
  share of the training seeds. The offline copy has no node features, so every
  node gets a fixed random embedding (the same on all ranks: one seed).
  NeighborLoader needs ``pyg-lib`` or ``torch_sparse``.
* ``--task graph``: batches of synthetic SBM PATTERN graphs (node labels: is the
  node part of the planted pattern) split over the ranks by a
  :class:`~torch.utils.data.distributed.DistributedSampler`.

The model is two attention convs (``--model gat | gt``, 4 heads) built from PyG's
convs (``--impl native``) or from the fused ones (``--impl fused``); on CPU the
fused convs run their pure-PyTorch reference path. Training batches are prefetched
(:class:`pyg_dfgnn.loader.LayoutPrefetchLoader`: pinned, copied and, for the fused
convs, their layouts built on a side stream one step ahead; ``--no-prefetch`` copies
in the step and builds on the first conv's call). ``--batch-size`` is per rank,
so N ranks train on N times the batch of one process per step (to compare the
accuracy with one process at batch B, give N ranks B / N each); the reported
throughput (seeds or graphs per second) counts every rank's samples.

    torchrun --nproc-per-node 2 examples/multi_gpu.py --task node --impl fused
    python examples/multi_gpu.py --nprocs 2 --task graph          # mp.spawn instead
    python examples/multi_gpu.py --nprocs 2 --device cpu --quick --check-params
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing.util
import os
import shlex
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

# Run as a script from a checkout: the repository root holds pyg_dfgnn and benchmarks.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import cli  # noqa: E402  (before torch_geometric: quiets its import)

TASKS = ("node", "graph")

# Options left unset take these values; --quick takes the second set (a smoke test).
DEFAULTS = dict(epochs=3, steps=0, batch_size=None, hidden=32, fanout=[10, 10], graphs=4000,
                test_graphs=1000, eval_steps=0, warmup=3)
QUICK = dict(epochs=1, steps=4, batch_size=8, hidden=8, fanout=[5, 5], graphs=48,
             test_graphs=16, eval_steps=2, warmup=1)
BATCH_SIZE = {"node": 1024, "graph": 64}  # per rank


# ----------------------------------------------------------------------- options
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="examples/multi_gpu.py",
        description="DistributedDataParallel training of fused (or native) attention convs.",
        epilog="Under torchrun the ranks come from torchrun; otherwise --nprocs processes "
               "are started with torch.multiprocessing.spawn.",
        formatter_class=cli.HelpFormatter)
    p.add_argument("--task", choices=TASKS, default="graph",
                   help="node: ogbn-arxiv with NeighborLoader; graph: PATTERN batches "
                        "(default: graph)")
    p.add_argument("--model", choices=("gat", "gt"), default="gat",
                   help="gat: GATConv, gt: TransformerConv; 2 layers, 4 heads (default: gat)")
    p.add_argument("--impl", choices=("fused", "native"), default="fused",
                   help="fused: pyg_dfgnn.nn convs, native: torch_geometric.nn convs "
                        "(default: fused)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cuda: one GPU per rank, NCCL; cpu: gloo (default: cuda if available)")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                   help="process group backend (default: nccl on cuda, gloo on cpu and with "
                        "--oversubscribe)")
    p.add_argument("--nprocs", type=int, default=None,
                   help="processes to spawn when not run by torchrun (default: the number "
                        "of GPUs on cuda, 2 on cpu)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than GPUs (ranks share GPUs round-robin; NCCL "
                        "refuses two ranks on one GPU, so the backend is gloo)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default: 3)")
    p.add_argument("--steps", type=int, default=None,
                   help="at most this many steps per epoch, 0 = whole epoch (default: 0)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: tiny sizes, 1 epoch of 4 steps (explicit options win)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="per rank: seed nodes (node, default 1024) or graphs (graph, default 64)")
    p.add_argument("--hidden", type=int, default=None, help="channels per head (default: 32)")
    p.add_argument("--heads", type=int, default=4, help="heads of the first layer (default: 4)")
    p.add_argument("--dropout", type=float, default=0.2,
                   help="dropout on features and attention (default: 0.2)")
    p.add_argument("--lr", type=float, default=0.005, help="Adam learning rate (default: 0.005)")
    p.add_argument("--fanout", type=int, nargs="+", default=None,
                   help="node: neighbours sampled per layer (default: 10 10)")
    p.add_argument("--features", type=int, default=128,
                   help="node: width of the random stand-in features (default: 128)")
    from benchmarks.datasets import add_data_argument
    add_data_argument(p, "ogbn-arxiv/ (--task node)")
    p.add_argument("--graphs", type=int, default=None,
                   help="graph: training graphs (default: 4000)")
    p.add_argument("--test-graphs", type=int, default=None,
                   help="graph: test graphs (default: 1000)")
    p.add_argument("--eval-steps", type=int, default=None,
                   help="at most this many test batches per rank, 0 = all (default: 0)")
    p.add_argument("--workers", type=int, default=0,
                   help="data loader worker processes per rank (default: 0)")
    p.add_argument("--worker-start-method", choices=("fork", "forkserver", "spawn"),
                   default=None,
                   help="how loader workers start (default: the platform's, fork on Linux); "
                        "forkserver or spawn start them without a copy of the rank's "
                        "threads (NCCL's, the pin thread's)")
    p.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                   help="copy each training batch to the device in the step and let the fused "
                        "convs build its layout on their first call, instead of pinning, "
                        "copying and (fused) building the layout of the next batch on a side "
                        "stream while the current one trains (default: prefetch)")
    p.add_argument("--prefetch-thread", action="store_true",
                   help="prefetch in a background thread, so that the training loop never "
                        "waits on the loader or on the layout build's host synchronisation "
                        "(LayoutPrefetchLoader's in_thread)")
    p.add_argument("--warmup", type=int, default=None,
                   help="first steps left out of the throughput (default: 3)")
    p.add_argument("--amp", choices=("none", "bf16"), default="none",
                   help="bf16: forward and loss under torch.autocast in bfloat16 (default: none)")
    p.add_argument("--time-split", action="store_true",
                   help="synchronise after each batch transfer, forward, backward and "
                        "optimiser step to report each rank's median data (the loader, the "
                        "copy and, with prefetching, the next batch's layout), forward, "
                        "backward (with DDP's gradient all-reduce) and optimiser time per "
                        "step, and time an all-reduce of the gradients alone")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--check-params", action="store_true",
                   help="at the end, all-gather a checksum of the parameters and fail unless "
                        "every rank has the same")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="rank 0 writes the results here (default: not written)")
    cli.add_progress_argument(p)
    args = p.parse_args(argv)
    args.command = "python examples/multi_gpu.py " + shlex.join(
        sys.argv[1:] if argv is None else list(argv))  # for the report
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.batch_size is None:
        args.batch_size = BATCH_SIZE[args.task]
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible")
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" and not args.oversubscribe else "gloo"
    if args.device == "cpu" and args.backend == "nccl":
        p.error("NCCL needs GPUs; use --backend gloo with --device cpu")
    if args.nprocs is None:
        args.nprocs = torch.cuda.device_count() if args.device == "cuda" else 2
    if args.prefetch_thread and not args.prefetch:
        p.error("--prefetch-thread prefetches: it contradicts --no-prefetch")
    if min(args.epochs, args.batch_size, args.nprocs) < 1 or args.steps < 0:
        p.error("--epochs, --batch-size and --nprocs must be >= 1, --steps >= 0")
    if args.task == "node":
        from benchmarks.datasets import DataUnavailable, dataset_folder
        try:
            require_neighbor_sampler()
            dataset_folder(args.data, "ogbn-arxiv")  # before any rank starts
        except ImportError as e:
            p.error(str(e))
        except DataUnavailable as e:
            p.exit(1, f"{e}\n")
    return args


def require_neighbor_sampler() -> None:
    r"""Raises :class:`ImportError` unless PyG's neighbour sampling can run: it
    calls ``pyg-lib`` or ``torch_sparse``."""
    import torch_geometric.typing as T
    if not (T.WITH_PYG_LIB or T.WITH_TORCH_SPARSE):
        raise ImportError("--task node samples neighbours with torch_geometric's "
                          "NeighborLoader, which needs pyg-lib or torch_sparse; neither is "
                          "installed (see PyG's installation guide), or run --task graph")


# ------------------------------------------------------------------------ data
def node_task(args, rank: int, world: int):
    r"""ogbn-arxiv: ``(train_loader, test_loader, sampler=None, in_channels,
    classes)``; each rank's loaders cover its share of the train / test seeds."""
    from torch_geometric.loader import NeighborLoader

    from benchmarks.datasets import ogbn_arxiv

    data = ogbn_arxiv(args.data)
    gen = torch.Generator().manual_seed(args.seed)  # same features and shares on every rank
    data.x = torch.randn(data.num_nodes, args.features, generator=gen)
    train = data.train_mask.nonzero().flatten()
    train = train[torch.randperm(train.numel(), generator=gen)]
    train = train[: train.numel() // world * world]  # equal shares: equal steps per rank
    test = data.test_mask.nonzero().flatten()
    # Workers that start anew each epoch: a NeighborLoader holds itself in a
    # reference cycle (its collate_fn is its own bound method), and persistent
    # workers of a loader freed by the cycle collector wait 5 s each to join (the
    # collector finalizes the queues their stop message goes through first):
    # two minutes for 12 + 12 workers at the end of a run.
    train_loader = NeighborLoader(data, input_nodes=train[rank::world], shuffle=True,
                                  batch_size=args.batch_size, drop_last=True,
                                  num_neighbors=args.fanout, **_loader_kw(args, False))
    test_loader = NeighborLoader(data, input_nodes=test[rank::world],
                                 batch_size=4 * args.batch_size, num_neighbors=args.fanout,
                                 **_loader_kw(args, False))
    return train_loader, test_loader, None, args.features, int(data.y.max()) + 1


def graph_task(args, rank: int, world: int):
    r"""PATTERN graphs: ``(train_loader, test_loader, sampler, in_channels,
    classes)``; the train loader draws this rank's graphs from a
    :class:`~torch.utils.data.distributed.DistributedSampler`."""
    from torch.utils.data.distributed import DistributedSampler
    from torch_geometric.loader import DataLoader

    from benchmarks import generators

    train = generators.sbm_dataset("pattern", args.graphs, seed=args.seed)
    test = generators.sbm_dataset("pattern", args.test_graphs, seed=args.seed + 1)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler,
                              drop_last=True, **_loader_kw(args, True))
    # Evaluation needs no collective per batch, so the shares may differ in size.
    test_loader = DataLoader(test[rank::world], batch_size=args.batch_size,
                             **_loader_kw(args, False))
    return train_loader, test_loader, sampler, train[0].num_features, 2


def _loader_kw(args, persistent: bool) -> dict:
    """A loader's worker and pinning options; ``persistent``: its workers live
    from one epoch to the next (an evaluation's pass needs them once)."""
    kw = dict(num_workers=args.workers, persistent_workers=persistent and args.workers > 0,
              pin_memory=_pins(args))
    if args.workers > 0:
        kw["multiprocessing_context"] = worker_start_method(args)
    return kw


def worker_start_method(args) -> str:
    """How the loader workers start: ``--worker-start-method``, else the platform's
    default. Named, not left to ``multiprocessing``: a rank that
    ``torch.multiprocessing.spawn`` started has ``spawn`` as its default, whose
    workers each import torch and PyG again and get the dataset pickled, which
    held a two-rank run's start-up at 90 s where one rank took 13 s."""
    return args.worker_start_method or multiprocessing.get_all_start_methods()[0]


def _pins(args) -> bool:
    """Whether the loaders pin their batches (in their own thread with workers):
    the prefetcher's copies to the GPU are non-blocking only from pinned memory."""
    return args.prefetch and args.device == "cuda"


def _outputs(model, batch, task: str):
    """``(logits, labels, samples)`` of the nodes the batch is for."""
    out = model(batch.x, batch.edge_index)
    if task == "node":  # the seed nodes come first
        n = batch.batch_size
        return out[:n], batch.y[:n], n
    return out, batch.y, batch.num_graphs


# ----------------------------------------------------------------------- model
def conv_class(model: str, impl: str) -> type:
    """PyG's conv (``native``) or its fused drop-in subclass (``fused``)."""
    # Imported here, not at the top: the launching process needs none of it.
    if impl == "native":
        from torch_geometric.nn import GATConv, TransformerConv
        return {"gat": GATConv, "gt": TransformerConv}[model]
    from pyg_dfgnn.nn import FusedGATConv, FusedTransformerConv
    return {"gat": FusedGATConv, "gt": FusedTransformerConv}[model]


class Net(torch.nn.Module):
    r"""Two attention convs: ``heads`` concatenated heads of ``hidden`` channels,
    ELU, then one head with the class scores; dropout on each conv's input and on
    the attention weights."""

    def __init__(self, conv: type, in_channels: int, hidden: int, heads: int, classes: int,
                 dropout: float):
        super().__init__()
        self.dropout = dropout
        self.conv1 = conv(in_channels, hidden, heads=heads, dropout=dropout)
        self.conv2 = conv(hidden * heads, classes, heads=1, concat=False, dropout=dropout)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


# -------------------------------------------------------------------- training
def param_checksum(model: torch.nn.Module) -> str:
    """CRC-32 of every parameter's bytes, in order: ranks whose parameters differ in
    any bit get different checksums (but for a 2^-32 chance of a collision)."""
    crc = 0
    for p in model.parameters():
        raw = p.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # any dtype
        crc = zlib.crc32(raw.numpy().tobytes(), crc)
    return f"{crc:08x}"


def run(rank: int, world: int, local_rank: int, init_method: str,
        args: argparse.Namespace) -> Optional[Dict[str, object]]:
    r"""One rank: joins the process group, trains, evaluates; rank 0 returns
    (and with ``--json`` writes) the results, the other ranks ``None``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.device == "cuda":
        gpus = torch.cuda.device_count()
        if local_rank >= gpus and not args.oversubscribe:
            raise RuntimeError(f"rank {rank} has no GPU of its own ({gpus} visible); start at "
                               "most one process per GPU, or pass --oversubscribe")
        if local_rank >= gpus and args.backend == "nccl":
            raise RuntimeError("NCCL does not run two ranks on one GPU; use --backend gloo")
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # Seconds of this rank's parts of the run, in order: what a slow start-up spends.
    clock = {"start": time.perf_counter()}
    dist.init_process_group(args.backend, init_method=init_method, rank=rank, world_size=world)
    clock["process_group"] = time.perf_counter()
    # NCCL reduces device tensors, gloo host tensors (it would copy device ones).
    comm = device if args.backend == "nccl" else torch.device("cpu")
    try:
        make = node_task if args.task == "node" else graph_task
        train_loader, test_loader, sampler, in_ch, classes = make(args, rank, world)
        clock["data"] = time.perf_counter()
        torch.manual_seed(args.seed)  # DDP broadcasts rank 0's parameters anyway
        model = Net(conv_class(args.model, args.impl), in_ch, args.hidden, args.heads,
                    classes, args.dropout).to(device)
        # Gradients as views of the all-reduce buckets: no copy kernels between the
        # two in each backward, launches that a host-bound step would wait for.
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  gradient_as_bucket_view=True)
        if args.prefetch:
            # The next batch is copied, and its layout built, on a side stream while
            # the current step runs: the step neither waits for the copy nor builds.
            from pyg_dfgnn.loader import LayoutPrefetchLoader, layout_variants
            train_loader = LayoutPrefetchLoader(train_loader, device, layout_variants(model),
                                                in_thread=args.prefetch_thread)
        initial = param_checksum(model) if args.check_params else None
        # On a GPU one fused kernel updates every parameter: the multi-tensor path
        # launches several per step, and a step that the host bounds pays for each.
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr,
                               fused=True if device.type == "cuda" else None)
        clock["model"] = time.perf_counter()
        torch.manual_seed(args.seed + 1 + rank)  # dropout and shuffling differ per rank

        step, samples, t0, loss = 0, 0, None, torch.zeros(())
        # Per timed step, seconds: data, forward (with the loss), backward, optimiser.
        phases: List[List[float]] = []
        for epoch in range(args.epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            n_steps = min(args.steps or len(train_loader), len(train_loader))
            bar = cli.progress(total=n_steps, show=rank == 0 and not args.no_progress,
                               desc=f"epoch {epoch + 1}/{args.epochs}")
            ddp.train()
            t_data = time.perf_counter()
            for i, batch in enumerate(train_loader):
                if i == n_steps:
                    break
                if step == args.warmup:  # timing starts after the warm-up steps
                    _sync(device)
                    t0, samples = time.perf_counter(), 0
                if not args.prefetch:
                    batch = batch.to(device)
                marks = [t_data, _mark(device)] if args.time_split else None
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.bfloat16,
                                    enabled=args.amp == "bf16"):
                    out, y, n = _outputs(ddp, batch, args.task)
                    loss = F.cross_entropy(out.float(), y)
                if marks:
                    marks.append(_mark(device))
                loss.backward()
                if marks:
                    marks.append(_mark(device))
                opt.step()
                if marks:
                    marks.append(_mark(device))
                    if step >= args.warmup:
                        phases.append([b - a for a, b in zip(marks, marks[1:])])
                    t_data = marks[-1]
                step, samples = step + 1, samples + n
                bar.update()
                if rank == 0 and (i % 10 == 0 or i == n_steps - 1):
                    bar.set_postfix(loss=f"{loss.item():.4f}")
            bar.close()
        _sync(device)
        elapsed = time.perf_counter() - t0 if t0 is not None else math.nan
        clock["train"] = time.perf_counter()

        split = _time_split(model, phases, comm, world) if args.time_split else {}
        correct, total = _evaluate(model, test_loader, args, device)
        clock["evaluate"] = time.perf_counter()
        stats = torch.tensor([correct, total, samples, loss.item()], dtype=torch.float64,
                             device=comm)
        dist.all_reduce(stats)
        slowest = torch.tensor([elapsed], dtype=torch.float64, device=comm)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        checksums: Optional[List[str]] = None
        if args.check_params:
            checksums = [None] * world
            dist.all_gather_object(checksums, param_checksum(model))
            if len(set(checksums)) != 1:
                raise RuntimeError(f"the ranks' parameters differ: checksums {checksums}")
        # Every rank leaves its last collective before any tears the group down:
        # gloo aborted a rank (SIGABRT, "terminate called without an active
        # exception") whose peer destroyed the group first.
        del ddp
        dist.barrier()
    finally:
        dist.destroy_process_group()

    if rank != 0:
        return None
    correct, total, samples, loss_sum = stats.tolist()
    report = {
        "task": args.task, "model": args.model, "impl": args.impl, "world_size": world,
        "backend": args.backend, "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "oversubscribed": args.device == "cuda" and world > torch.cuda.device_count(),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
        "command": args.command, "epochs": args.epochs, "steps": step,
        "batch_size_per_rank": args.batch_size, "final_loss": loss_sum / world,
        "test_acc": correct / max(total, 1), "test_samples": int(total),
        "unit": "seeds/s" if args.task == "node" else "graphs/s",
        "throughput": samples / slowest.item() if step > args.warmup else math.nan,
        "timed_steps": max(step - args.warmup, 0), "param_checksums": checksums,
        "param_checksum_initial": initial, "amp": args.amp, "prefetch": args.prefetch,
        "prefetch_thread": args.prefetch and args.prefetch_thread,
        "worker_start_method": worker_start_method(args) if args.workers > 0 else None,
        "workers": args.workers, "threads": torch.get_num_threads(), **split,
        "phase_s": {b: round(clock[b] - clock[a], 3) for a, b in zip(clock, list(clock)[1:])},
    }
    print(f"{args.task}/{args.model}/{args.impl} on {world} rank(s) ({args.backend}): "
          f"{step} steps, final loss {report['final_loss']:.4f}, test accuracy "
          f"{report['test_acc']:.4f} ({int(total)} nodes), {report['throughput']:.1f} "
          f"{report['unit']}" + (", parameters identical on every rank" if checksums else ""))
    if split:
        print("slowest rank's median step: " + ", ".join(
            f"{k} {split[f'{k}_ms']:.2f} ms ({split[f'{k}_share']:.0%})" for k in PHASES)
            + f"; one all-reduce of the gradients alone {split['allreduce_ms']:.3f} ms")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


#: The parts of a step that ``--time-split`` times, in order.
PHASES = ("data", "forward", "backward", "optimizer")


@torch.no_grad()
def _time_split(model, phases: List[List[float]], comm, world: int) -> Dict[str, object]:
    r"""Where a step's time goes: every rank's median time per step of each part
    of :data:`PHASES` (ms); the slowest rank's (the largest sum of them), with
    ``compute_ms`` (forward + backward + optimiser) and each part's share of its
    step; and the median time of one all-reduce of a buffer as large as the
    model's gradients (ms, ``0`` on one rank). DDP overlaps that all-reduce with
    the backward, so it bounds what communication adds to a step.

    Every rank's mean times too (``rank_mean_ms``), and the data and step means
    of the rank with the longest mean step (``data_mean_ms``, ``step_mean_ms``):
    a mean above the median is a few steps that stalled, which the throughput
    pays for and the medians hide."""
    import statistics
    cols = list(zip(*phases)) if phases else [[math.nan]] * len(PHASES)
    med = [statistics.median(c) * 1e3 for c in cols]
    mean = [statistics.fmean(c) * 1e3 for c in cols]
    mine = torch.tensor([*med, sum(med), *mean, sum(mean)], dtype=torch.float64, device=comm)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    keys = [*PHASES, "step"]
    ranks = [dict(zip(keys, t.tolist()[:len(keys)])) for t in every]
    means = [dict(zip(keys, t.tolist()[len(keys):])) for t in every]
    slow, slow_mean = _longest_step(ranks), _longest_step(means)
    allreduce = 0.0
    if world > 1:
        grads = torch.randn(sum(p.numel() for p in model.parameters()), device=comm)
        times = []
        for _ in range(25):
            t = _mark(comm)
            dist.all_reduce(grads)
            times.append(_mark(comm) - t)
        allreduce = statistics.median(times[5:]) * 1e3
    split: Dict[str, object] = {f"{k}_ms": slow[k] for k in PHASES}
    split["compute_ms"] = slow["forward"] + slow["backward"] + slow["optimizer"]
    split["step_ms"] = slow["step"]
    split.update({f"{k}_share": slow[k] / slow["step"] for k in PHASES})
    split["allreduce_ms"] = allreduce
    split["rank_split_ms"] = ranks
    split["data_mean_ms"], split["step_mean_ms"] = slow_mean["data"], slow_mean["step"]
    split["rank_mean_ms"] = means
    return split


def _longest_step(ranks: List[Dict[str, float]]) -> Dict[str, float]:
    """The rank whose step is the longest (a rank that timed no step: NaN, longest)."""
    return max(ranks, key=lambda r: r["step"] if math.isfinite(r["step"]) else math.inf)


def _evaluate(model, loader, args, device) -> tuple:
    """This rank's ``(correct, total)`` test predictions (nodes)."""
    model.eval()
    correct = total = 0
    for i, batch in enumerate(loader):
        if args.eval_steps and i == args.eval_steps:
            break
        out, y, _ = _outputs(model, batch.to(device), args.task)
        correct += int((out.argmax(-1) == y).sum())
        total += y.numel()
    return correct, total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mark(device: torch.device) -> float:
    """The host clock once the device has run everything queued so far."""
    _sync(device)
    return time.perf_counter()


# -------------------------------------------------------------------- launching
def rank_threads(world: int, workers: int, cores: Optional[int] = None) -> int:
    """Intra-op threads of a rank that this script starts: its share of the host's
    cores less one per loader worker of its own. The ranks share the cores, as
    torchrun's ``OMP_NUM_THREADS`` makes them, and so do their workers (one thread
    each): a rank whose pool spans cores that its workers sample or collate on
    contends with them for the batches its steps wait for."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // world - workers)


def _spawned(local_rank: int, world: int, init_method: str, args) -> None:
    import threading

    from tqdm import tqdm

    # tqdm's default lock holds a multiprocessing semaphore, which the rank's
    # os._exit below never releases (the resource tracker then reports it leaked).
    # A rank draws its bars alone, so a thread lock does.
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(rank_threads(world, args.workers))
    run(local_rank, world, local_rank, init_method, args)
    # Loaders left in reference cycles shut their workers down, and multiprocessing
    # runs its exit finalizers (the workers' queues release their semaphores), as
    # the interpreter teardown skipped below would.
    gc.collect()
    multiprocessing.util._exit_function()
    # The rank's work is done and reported. A spawned gloo rank aborted now and then
    # in interpreter teardown ("terminate called without an active exception", a
    # C++ thread of the destroyed group), which turned a finished run into a failed
    # one: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if "LOCAL_RANK" in os.environ:  # started by torchrun: it set the rendezvous up
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
            int(os.environ["LOCAL_RANK"]), "env://", args)
        return
    # A file store in a fresh folder: no port to pick, nothing shared between runs.
    store = tempfile.mkdtemp(prefix="multi_gpu_")
    try:
        init = "file://" + os.path.join(store, "rendezvous")
        if args.nprocs == 1:
            torch.set_num_threads(rank_threads(1, args.workers))
            run(0, 1, 0, init, args)
        else:
            import torch.multiprocessing as mp
            mp.spawn(_spawned, args=(args.nprocs, init, args), nprocs=args.nprocs, join=True)
    finally:
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
