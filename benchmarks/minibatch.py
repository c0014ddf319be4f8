r"""Mini-batch training step, native PyG vs fused, on NeighborLoader batches.

For each dataset (ogbn-arxiv, MUSAE GitHub; stand-in random 128-dim features),
model (GAT, GT, AGNN: 4 heads, 128 -> 256 -> classes, one layer per hop), seed
count, fan-out and dtype (fp32, bf16 autocast) it reports the median over steps
(CUDA events) of

* ``sampling``: NeighborLoader's time per batch (CPU, excluded from the steps);
* ``layout``: the fused layers' graph layout build per batch (CSR + CSC + work
  items; with self-loops for GAT / AGNN);
* ``step``: forward + backward + Adam for ``native``, ``native_compile``
  (``torch.compile(dynamic=True)``), ``fused`` (``pyg_dfgnn.nn.fuse`` on a copy of
  the same model; the layout is built in the step, from a fresh ``edge_index``
  every step) and ``fused_compile``; with peak memory per variant.

The optimizer is Adam, ``--adam fused`` (default on CUDA: one launch per step, as
a user who times training picks it) or ``foreach``, the same for every variant.

``--profile`` adds, per variant, the GPU time of a few more steps by kernel
category (:func:`kernel_categories`: GEMMs, the fused attention and layout
kernels, compiler-generated kernels, gathers and scatters, the optimizer, other
elementwise) next to the step's wall time, so a row says whether attention,
the dense layers or the host bound the step.

Batches are sampled first, moved to the device, then each variant runs over
them twice, timing the second pass (the first loads the GEMM kernels of every
batch's shapes); a compiler failure is recorded in the results, not raised.

.. code-block:: bash

    python -m benchmarks.minibatch --quick                  # one configuration
    python -m benchmarks.minibatch --out results.json       # the full grid
    python -m benchmarks.minibatch --out results.json --resume  # the rows it lacks

The JSON is rewritten after every row. ``--resume`` keeps the rows ``--out`` has
(measured on the same GPU and torch, with the same steps, warm-up and Adam, and
every requested variant) and runs the rest: a grid longer than one process or one
device call becomes one file of one GPU model and software stack, and
``meta.processes`` lists the processes' dates.

The real ``NeighborLoader`` needs ``pyg-lib`` or ``torch_sparse``; without them
:func:`sample_batches` uses a vectorised stand-in with the same conventions (seeds
first, local ids, edges grouped by destination hop by hop). A CPU-only build of
``torch_sparse`` brings a CPU-only ``torch_scatter``, to which PyG then sends CUDA
segment reductions (``segment_csr``: "Not compiled with CUDA support"); install
such a build only where this benchmark runs (``pip install --target DIR`` and
``PYTHONPATH=DIR``), not under the test suite.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.nn import AGNNConv, GATConv, TransformerConv
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

from benchmarks import e2e
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.layout_cache import get_layout
from pyg_dfgnn.loader import layout_variants
from pyg_dfgnn.nn import fuse

VARIANTS = ("native", "native_compile", "fused", "fused_compile")
FEATURES = 128


# ----------------------------------------------------------------------------- data
def load_dataset(name: str, root: Optional[str] = None) -> Data:
    """``"arxiv"`` (ogbn-arxiv, undirected) or ``"github"`` (MUSAE GitHub)."""
    from benchmarks.datasets import musae_github, ogbn_arxiv
    data = ogbn_arxiv(root) if name == "arxiv" else musae_github(root)
    data.name = name
    return data


class StandInSampler:
    """NeighborLoader's conventions, vectorised (used without pyg-lib / torch_sparse)."""

    def __init__(self, edge_index: Tensor, num_nodes: int, seed: int = 0):
        order = torch.sort(edge_index[1], stable=True).indices
        self.nbr = edge_index[0][order]
        self.ptr = torch.cat([torch.zeros(1, dtype=torch.long),
                              torch.bincount(edge_index[1], minlength=num_nodes).cumsum(0)])
        self.num_nodes = num_nodes
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, seeds: Tensor, fanouts: Sequence[int]) -> Data:
        loc = torch.full((self.num_nodes,), -1, dtype=torch.long)
        n_id = seeds.clone()
        loc[seeds] = torch.arange(seeds.numel())
        frontier = torch.arange(seeds.numel())
        rows, cols, nodes, edges = [], [], [seeds.numel()], []
        for k in fanouts:
            g = n_id[frontier]
            deg = self.ptr[g + 1] - self.ptr[g]
            owner = torch.repeat_interleave(torch.arange(g.numel()), deg)
            first = torch.cumsum(deg, 0) - deg
            eid = self.ptr[g][owner] + torch.arange(owner.numel()) - first[owner]
            # k random neighbours per node without replacement: random keys, then
            # the k smallest keys within each node's segment.
            key = owner.double() + torch.rand(owner.numel(), generator=self.gen,
                                              dtype=torch.double)
            order = torch.argsort(key)
            rank = torch.arange(owner.numel()) - first[owner]
            pick = order[rank < k]
            src = self.nbr[eid[pick]]
            dst = frontier[owner[pick]]
            new = src[loc[src] < 0]
            uniq, inv = torch.unique(new, return_inverse=True)
            first_seen = torch.full((uniq.numel(),), new.numel()).scatter_reduce_(
                0, inv, torch.arange(new.numel()), "amin")
            uniq = uniq[torch.argsort(first_seen)]
            loc[uniq] = n_id.numel() + torch.arange(uniq.numel())
            frontier = loc[uniq]
            n_id = torch.cat([n_id, uniq])
            rows.append(loc[src])
            cols.append(dst)
            nodes.append(uniq.numel())
            edges.append(src.numel())
        return Data(edge_index=torch.stack([torch.cat(rows), torch.cat(cols)]), n_id=n_id,
                    num_nodes=n_id.numel(), batch_size=seeds.numel(),
                    num_sampled_nodes=nodes, num_sampled_edges=edges)


def sample_batches(data: Data, num_seeds: int, fanouts: Sequence[int], num_batches: int,
                   seed: int = 0) -> tuple:
    """``(batches, median sampling seconds, sampler name)``: ``num_batches`` batches
    of ``num_seeds`` training seeds each."""
    gen = torch.Generator().manual_seed(seed)
    pool = (data.train_mask.nonzero().flatten() if getattr(data, "train_mask", None) is not None
            else torch.arange(data.num_nodes))
    if WITH_PYG_LIB or WITH_TORCH_SPARSE:
        from torch_geometric.loader import NeighborLoader
        plain = Data(edge_index=data.edge_index, num_nodes=data.num_nodes)
        loader = NeighborLoader(plain, num_neighbors=list(fanouts), input_nodes=pool,
                                batch_size=num_seeds, shuffle=True, generator=gen)
        name, its = "NeighborLoader", [iter(loader)]

        def draw():
            # A large seed count exhausts the training nodes within a few batches:
            # start another epoch then.
            try:
                return next(its[0])
            except StopIteration:
                its[0] = iter(loader)
                return next(its[0])
    else:
        sampler = getattr(data, "_stand_in_sampler", None)
        if sampler is None:  # its CSC is built once per dataset
            sampler = StandInSampler(data.edge_index, data.num_nodes, seed)
            data._stand_in_sampler = sampler
        name = "stand-in sampler"

        def draw():
            return sampler(pool[torch.randperm(pool.numel(), generator=gen)[:num_seeds]], fanouts)
    batches, times = [], []
    for _ in range(num_batches):
        t0 = time.perf_counter()
        batches.append(draw())
        times.append(time.perf_counter() - t0)
    return batches, statistics.median(times), name


# ----------------------------------------------------------------------------- models
class Net(torch.nn.Module):
    """``len(fanouts)`` attention layers, 4 heads: 128 -> 256 -> ... -> classes."""

    def __init__(self, kind: str, num_layers: int, num_classes: int, hidden: int = 256,
                 heads: int = 4):
        super().__init__()
        self.kind = kind
        self.pre = torch.nn.Linear(FEATURES, hidden) if kind == "agnn" else None
        self.post = torch.nn.Linear(hidden, num_classes) if kind == "agnn" else None
        convs = []
        for i in range(num_layers):
            last = i == num_layers - 1
            cin = FEATURES if i == 0 else hidden
            cout = num_classes if last else hidden // heads
            if kind == "gat":
                convs.append(GATConv(cin, cout, heads=heads, concat=not last))
            elif kind == "gt":
                convs.append(TransformerConv(cin, cout, heads=heads, concat=not last))
            else:
                convs.append(AGNNConv())
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        if self.pre is not None:
            x = self.pre(x).relu()
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.elu(x)
        return self.post(x) if self.post is not None else x


# ----------------------------------------------------------------------------- timing
class Timer:
    """Elapsed milliseconds of a region: CUDA events on a GPU (host time included:
    the events bracket everything the host issues), wall time on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3

    def elapsed(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return self.start.elapsed_time(self.end)
        return self.ms


def time_layout(batches: List[dict], loops: bool, warmup: int, device,
                passes: int = 3) -> float:
    """Median ms of a layout build from a fresh ``edge_index``, over ``passes``
    passes of the batches past the warm-up: a build is a tenth of a millisecond
    with a synchronisation, so one pass's median moved with the host (0.12 to
    0.64 ms for the same batches)."""
    times = []
    for _ in range(passes):
        for i, b in enumerate(batches):
            ei = b["edge_index"].clone()
            with Timer(device) as t:
                GraphLayout.from_edge_index(ei, (b["n"], b["n"]), add_self_loops=loops)
            if i >= warmup:
                times.append(t.elapsed())
    return statistics.median(times)


#: Kernel categories of :func:`kernel_categories`, first match wins (lower-case
#: substrings of the kernel name).
CATEGORIES = (
    ("attention", ("dfgnn", "gt_fwd", "gt_bwd", "gat_fwd", "gat_bwd", "softmax_spmm", "l2norm",
                   "layout", "split_merge")),
    ("gemm", ("gemm", "cutlass", "xmma", "cublas", "gemv", "sm90_", "splitk")),
    ("compiled", ("triton",)),
    ("gather_scatter", ("scatter", "gather", "index", "segment", "radix", "sort")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
)


def kernel_category(name: str) -> str:
    """The :data:`CATEGORIES` entry of a kernel name, else ``"other"``."""
    low = name.lower()
    return next((cat for cat, keys in CATEGORIES if any(k in low for k in keys)), "other")


def kernel_categories(step: Callable[[int], object], steps: Sequence[int]) -> dict:
    """GPU milliseconds per step by kernel category over ``steps`` (torch.profiler),
    with the heaviest kernels by name."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in steps:
            step(i)
        torch.cuda.synchronize()
    cats = {name: 0.0 for name, _ in CATEGORIES}
    cats["other"] = 0.0
    kernels = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if us <= 0 or e.key.startswith("ProfilerStep"):
            continue
        cats[kernel_category(e.key)] += us / 1e3 / len(steps)
        kernels[e.key[:120]] = us / 1e3 / len(steps)
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {"gpu_ms": sum(cats.values()), "by_category_ms": cats, "top_kernels_ms": dict(top)}


def run_variant(variant: str, base: torch.nn.Module, batches: List[dict], dtype: str,
                warmup: int, device: torch.device, profile_steps: int = 0,
                adam: str = "foreach") -> dict:
    model = copy.deepcopy(base).to(device)
    fused = variant.startswith("fused")
    if fused:
        fuse(model)
    loops = layout_variants(model)
    if variant.endswith("compile"):
        # Fresh compiler caches: the layers' code objects are shared by every
        # configuration, and past the recompile limit dynamo would run them eagerly.
        torch._dynamo.reset()
        step_model = torch.compile(model, dynamic=True)
    else:
        step_model = model
    opt = e2e.adam(model.parameters(), adam, lr=1e-3)
    # A fresh edge_index per step: the fused step builds its layout every time.
    graphs = [b["edge_index"].clone() for b in batches]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    def step(i: int, ei: Optional[Tensor] = None) -> Tensor:
        b = batches[i]
        ei = b["edge_index"].clone() if ei is None else ei
        if fused and variant.endswith("compile"):
            for lp in loops:  # built eagerly: a compiled region reads the cached layout
                get_layout(ei, (b["n"], b["n"]), add_self_loops=lp)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            out = step_model(b["x"], ei)[:b["batch_size"]]
            loss = F.cross_entropy(out.float(), b["y"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    # A warm pass first, untimed, over every batch: each batch has its own node
    # count, and the first GEMMs of a new shape pay cuBLAS's kernel choice and
    # the lazy load of that kernel. The bf16 GT step's first pass over the
    # arxiv 8192 batches took 7.1 ms, later passes 4.9 (H100), where training
    # runs warm after its first batches.
    for i, b in enumerate(batches):
        step(i, b["edge_index"].clone())
    times = []
    for i, ei in enumerate(graphs):
        with Timer(device) as t:
            loss = step(i, ei)
        if i >= warmup:
            times.append(t.elapsed())
    res = {"step_ms": statistics.median(times), "loss": float(loss.detach())}
    if device.type == "cuda":
        res["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        if profile_steps:
            # Batches past the warm-up again, each with a fresh edge_index.
            res["profile"] = kernel_categories(
                step, [warmup + i % max(1, len(batches) - warmup) for i in range(profile_steps)])
    return res


def run_config(data: Data, emb: Tensor, kind: str, num_seeds: int, fanouts: Sequence[int],
               dtype: str, variants: Sequence[str], steps: int, warmup: int,
               device: torch.device, profile_steps: int = 0,
               sampled: Optional[tuple] = None, adam: str = "foreach") -> dict:
    """One row; ``sampled``: :func:`sample_batches`' result to reuse (every model
    and dtype of a dataset, seed count and fan-out trains on the same batches)."""
    num_classes = int(data.y.max()) + 1
    raw, t_sample, sampler = sampled or sample_batches(data, num_seeds, fanouts, steps + warmup)
    batches = [{"x": emb[b.n_id.to(emb.device)], "edge_index": b.edge_index.to(device),
                "y": data.y[b.n_id[:b.batch_size]].to(device), "n": int(b.num_nodes),
                "batch_size": int(b.batch_size)} for b in raw]
    row = {"dataset": data.name, "model": kind, "seeds": num_seeds, "fanouts": list(fanouts),
           "dtype": dtype, "sampler": sampler, "sampling_ms": t_sample * 1e3,
           "edges": statistics.median(b["edge_index"].size(1) for b in batches),
           "nodes": statistics.median(b["n"] for b in batches), "variants": {}}
    torch.manual_seed(0)
    base = Net(kind, len(fanouts), num_classes)
    row["layout_ms"] = {str(lp): time_layout(batches, lp, warmup, device)
                        for lp in layout_variants(fuse(base, inplace=False).model)}
    for v in variants:
        try:
            row["variants"][v] = run_variant(v, base, batches, dtype, warmup, device,
                                             profile_steps, adam)
        except Exception as e:  # a compiler failure is a result, not a crash
            row["variants"][v] = {"error": f"{type(e).__name__}: {str(e)[:300]}",
                                  "trace": traceback.format_exc(limit=3)[-800:]}
    nat = row["variants"].get("native", {}).get("step_ms")
    for v, r in row["variants"].items():
        if nat and "step_ms" in r:
            r["speedup"] = nat / r["step_ms"]
    return row


# ----------------------------------------------------------------------------- reports
def markdown(rows: List[dict]) -> str:
    head = ("| dataset | model | seeds | fan-out | dtype | edges | sampling ms | layout ms | "
            + " | ".join(f"{v} ms" for v in VARIANTS) + " | fused speed-up | "
            "fused vs native compile | fused compile vs native compile | "
            "peak MiB native / fused |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        v = r["variants"]

        def ms(name):
            x = v.get(name, {})
            return f"{x['step_ms']:.2f}" if "step_ms" in x else ("failed" if x else "-")

        def ratio(a, b):
            if "step_ms" in v.get(a, {}) and "step_ms" in v.get(b, {}):
                return f"{v[a]['step_ms'] / v[b]['step_ms']:.2f}x"
            return "-"

        mem = " / ".join(f"{v[n]['peak_mib']:.0f}" if "peak_mib" in v.get(n, {}) else "-"
                         for n in ("native", "fused"))
        layout = " / ".join(f"{t:.3f}" for t in r["layout_ms"].values())
        lines.append(
            f"| {r['dataset']} | {r['model']} | {r['seeds']} | {r['fanouts']} | {r['dtype']} | "
            f"{r['edges'] / 1e3:.1f}K | {r['sampling_ms']:.1f} | {layout} | "
            + " | ".join(ms(n) for n in VARIANTS)
            + f" | {ratio('native', 'fused')} | {ratio('native_compile', 'fused')} | "
            f"{ratio('native_compile', 'fused_compile')} | "
            f"{mem} |")
    return "\n".join(lines)


def plot(rows: List[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['dataset']} {r['model']}\n{r['seeds']} {r['fanouts']} {r['dtype']}"
              for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
    width = 0.8 / len(VARIANTS)
    for j, v in enumerate(VARIANTS):
        vals = [r["variants"].get(v, {}).get("speedup", 0.0) for r in rows]
        ax.bar([i + j * width for i in range(len(rows))], vals, width, label=v)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels, fontsize=6,
                  rotation=90)
    ax.set_ylabel("step speed-up over native PyG")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def _ints(text: str) -> List[int]:
    return [int(t) for t in text.split(",") if t]


#: ``meta`` entries that a ``--resume`` run and the file it extends must share: a
#: row measured on another GPU or torch, or over other steps, would not compare.
RESUME_SAME = ("device", "torch", "steps", "warmup", "adam")


def row_key(row: dict) -> tuple:
    """The configuration a row measured: (dataset, model, seeds, fan-out, dtype)."""
    return row["dataset"], row["model"], row["seeds"], tuple(row["fanouts"]), row["dtype"]


def resumed_rows(path: Path, meta: dict, variants: Sequence[str]) -> List[dict]:
    """The rows of an earlier run's ``path`` that a ``--resume`` run keeps: those that
    measured every one of ``variants``. ``meta["processes"]`` gets the earlier
    processes' dates and this one's.

    Raises:
        SystemExit: ``path`` was made with other :data:`RESUME_SAME` settings.
    """
    prev = json.loads(path.read_text())
    old = prev.get("meta", {})
    for key in RESUME_SAME:
        if old.get(key) != meta[key]:
            raise SystemExit(f"--resume: {path} was made with {key} = {old.get(key)!r}, "
                             f"this run has {meta[key]!r}")
    meta["processes"] = old.get("processes", [old.get("date")]) + [meta["date"]]
    return [r for r in prev.get("rows", []) if set(variants) <= set(r["variants"])]


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    from benchmarks import cli, datasets
    p = argparse.ArgumentParser(prog="python -m benchmarks.minibatch",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=cli.HelpFormatter)
    p.add_argument("--datasets", default="arxiv,github", help="comma-separated: arxiv,github")
    p.add_argument("--models", default="gat,gt,agnn", help="comma-separated: gat,gt,agnn")
    p.add_argument("--seeds", default="1024,8192",
                   help="seed nodes per batch, comma-separated")
    p.add_argument("--fanouts", default="10,10;25,10;15,10,5", help="';'-separated fan-outs")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32,bf16")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated subset of {','.join(VARIANTS)} (default: all; "
                        "--quick on the CPU: native,fused, as compiling there takes minutes)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps first (compilation)")
    datasets.add_data_argument(p, "ogbn-arxiv/ and MUSAE/GitHub/")
    cli.add_device_argument(p)
    p.add_argument("--quick", action="store_true",
                   help="arxiv, GAT and GT, 1024 seeds, [25, 10], fp32, 10 steps")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="profile STEPS more steps per variant: GPU time by kernel category")
    p.add_argument("--adam", choices=("fused", "foreach"), default=None,
                   help="Adam's implementation (default: fused on CUDA, foreach on CPU)")
    p.add_argument("--out", default=None, help="JSON results (default: a new temporary file)")
    p.add_argument("--plot", default=None, help="PNG speed-up plot (default: next to --out)")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows --out already has (same GPU, torch, steps, warm-up "
                        "and Adam) and run the rest of the grid")
    a = p.parse_args(argv)
    if a.quick:
        a.datasets, a.models, a.seeds, a.fanouts, a.dtypes = "arxiv", "gat,gt", "1024", "25,10", \
            "fp32"
        a.steps, a.warmup = 10, 5
    device = cli.pick_device("benchmarks.minibatch", a.device, a.quick)
    if a.variants is None:
        a.variants = "native,fused" if a.quick and device.type == "cpu" else ",".join(VARIANTS)
    if a.adam is None:
        a.adam = "fused" if device.type == "cuda" else "foreach"
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="minibatch_")) / "minibatch.json"
    rows = []
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "steps": a.steps, "warmup": a.warmup, "adam": a.adam}
    out.parent.mkdir(parents=True, exist_ok=True)
    variants = a.variants.split(",")
    if a.resume and out.exists():
        rows = resumed_rows(out, meta, variants)
    done = {row_key(r) for r in rows}
    models, dtypes = a.models.split(","), a.dtypes.split(",")

    def todo(name, seeds, fan):
        return [(kind, dtype) for kind in models for dtype in dtypes
                if (name, kind, seeds, tuple(_ints(fan)), dtype) not in done]

    for name in a.datasets.split(","):
        if not any(todo(name, seeds, fan) for seeds in _ints(a.seeds)
                   for fan in a.fanouts.split(";")):
            continue
        data = load_dataset(name, a.data)
        gen = torch.Generator().manual_seed(0)
        emb = torch.randn(data.num_nodes, FEATURES, generator=gen).to(device)
        for seeds in _ints(a.seeds):
            for fan in a.fanouts.split(";"):
                configs = todo(name, seeds, fan)
                if not configs:
                    continue
                # Sampled once for every model and dtype: PyG's NeighborLoader
                # without pyg-lib takes 0.4 s per 8,192-seed arxiv batch.
                sampled = sample_batches(data, seeds, _ints(fan), a.steps + a.warmup)
                for kind, dtype in configs:
                    row = run_config(data, emb, kind, seeds, _ints(fan), dtype, variants,
                                     a.steps, a.warmup, device, a.profile, sampled, a.adam)
                    rows.append(row)
                    print(markdown([row]).splitlines()[-1], flush=True)
                    # After every row: a run cut short keeps what it measured.
                    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, cli.out_file(a.plot) if a.plot else out.with_suffix(".png"))
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}, Adam {meta['adam']}\n")
    print(markdown(rows))
    print(f"\nresults: {out}")
    return rows


if __name__ == "__main__":
    from benchmarks.datasets import exit_on_missing_data
    with exit_on_missing_data():
        main()
