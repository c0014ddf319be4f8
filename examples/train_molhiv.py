r"""Trains an attention GNN with bond features on MoleculeNet HIV (the molecules of
OGB's ogbg-molhiv), with PyG's convs and with their ``fuse()``d copy, and
reports test ROC-AUC, the time of a training step and of an epoch, and with
``--sweep-batch-sizes`` the step time by batch size.

    python examples/train_molhiv.py --data DIR               # DIR/MoleculeNet/hiv/raw/HIV.csv
    python examples/train_molhiv.py --conv gat --subset 2000 --epochs 3
    python examples/train_molhiv.py --data DIR --subset 20000 --save-processed OUT  # RDKit
    python examples/train_molhiv.py --data OUT --sweep-batch-sizes 32,128,512,1024  # no RDKit
    python examples/train_molhiv.py --help

The model, as molecule models with attention layers are built (GraphGPS's local
GAT layer, OGB's molecule examples):

* ``AtomEncoder`` / ``BondEncoder``: one embedding table per integer column of
  PyG's atom features ``x`` [N, 9] and bond features ``edge_attr`` [E, 3]
  (vocabularies of :mod:`torch_geometric.utils.smiles` ``x_map`` / ``e_map``),
  summed, as OGB's encoders do over OGB's features;
* ``--layers`` attention convs (``--conv gat|gatv2|transformer``), ``--heads``
  heads of ``hidden / heads`` channels concatenated, the bond embedding as
  ``edge_attr`` (``edge_dim = hidden``); each conv is followed by ReLU, dropout,
  a residual connection and batch norm;
* mean pooling over each molecule's atoms and a linear head: one logit,
  binary cross-entropy.

The fused model is :func:`pyg_dfgnn.nn.fuse` applied to a copy of the native one:
same parameters, same function, on the same batches from the same seed. Their
epochs alternate (:class:`Training`), so that the host's drift in speed reaches
both. With
every ``--conv`` every conv runs fused, bond features included (the
``dot_edge``, ``additive_edge`` and ``gatv2_edge`` scores; ``GATConv`` and
``GATv2Conv`` take their self-loops' bond features from ``fill_value="mean"``,
as PyG does). The run says so before it loads the data: ``fuse()``'s report
lists each conv and why it is not fused.

Split: the scaffold split OGB made ogbg-molhiv's split with (RDKit Murcko
scaffolds, deterministic; :func:`benchmarks.datasets.scaffold_split`), or
``--split random`` (seeded). ROC-AUC as OGB's evaluator computes it; the test
ROC-AUC is the one at the epoch with the best validation ROC-AUC. A step is
forward, backward and Adam on one batch already on the device (synchronised on a
GPU); an epoch is the pass over the training batches, their batching and copies
to the device included; evaluation is not timed. PyG turns the SMILES into
graphs with RDKit (``pip install rdkit``), and RDKit finds their scaffolds:
about 70 s for the 41,127 SMILES on 2 cores, in every run that reads a data
folder (PyG processes a private copy; a download is processed once, in the
cache). ``--subset N`` parses the first N molecules only.

Without RDKit: ``--save-processed DIR``, run once where RDKit is, lets PyG's
``MoleculeNet`` process the molecules (all, or ``--subset N``) into
``DIR/MoleculeNet/hiv/`` (the CSV in ``raw/``, PyG's ``processed/`` files);
``--data DIR`` then reads them with no RDKit, since PyG skips processing where
its processed files exist. PyG stores the integer features as uint8 and each
molecule's Murcko scaffold (:class:`benchmarks.datasets.MoleculeStorage`), so
20,000 molecules take 13 MiB and the scaffold split needs no RDKit either;
``--subset N`` takes the first N of them.

``--sweep-batch-sizes 32,128,512,1024`` times ``--sweep-steps`` steps per batch
size after training, native and fused on the same batches
(:func:`sweep`): the step's wall time and, on a GPU, the time of its kernels
and copies (torch.profiler), so the host's share of each step shows: where the
host dominates, the wall time is far above the GPU time.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The dataset loaders live in the repository's benchmarks/ package, not in the
# installed pyg_dfgnn: make the checkout importable when run as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import cli  # noqa: E402  (before torch_geometric: quiets its import)
from torch_geometric.utils.smiles import e_map, x_map  # noqa: E402

__all__ = ["CONVS", "IMPLS", "AtomEncoder", "BondEncoder", "MoleculeModel", "roc_auc",
           "make_loaders", "Training", "train_one", "sweep", "sweep_table", "parse_args", "main"]

CONVS = ("gat", "gatv2", "transformer")
IMPLS = ("native", "fused")

#: Vocabulary size of each column of PyG's ``x`` and ``edge_attr`` (from_smiles
#: stores each feature as its index in these lists).
ATOM_VOCAB = [len(v) for v in x_map.values()]
BOND_VOCAB = [len(v) for v in e_map.values()]


# ---------------------------------------------------------------- model
class FeatureEncoder(nn.Module):
    r"""One :class:`~torch.nn.Embedding` per integer feature column, their
    outputs summed: ``x`` ``[*, len(vocab)]`` -> ``[*, dim]``. Weights
    initialised with Xavier-uniform, as OGB's ``AtomEncoder`` / ``BondEncoder``.

    The forward reads the tables joined, with one gather for every column, rather
    than calling each ``Embedding``: on CUDA the backward of an embedding call over
    more than a few thousand indices sorts them and sums per index in a chain of
    small kernels, per column and step, host time in a host-bound step, while the
    gather's backward is one accumulation. The parameters are the ``Embedding``
    modules' own."""

    def __init__(self, vocab: Sequence[int], dim: int):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for n in vocab)
        for emb in self.embeddings:
            nn.init.xavier_uniform_(emb.weight)
        # Column i's indices start at the sum of the vocabularies before it.
        starts = torch.tensor([0, *vocab[:-1]]).cumsum(0)
        self.register_buffer("starts", starts, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        weight = torch.cat([emb.weight for emb in self.embeddings])
        rows = weight.index_select(0, (x + self.starts).view(-1))
        return rows.view(*x.shape, -1).sum(-2)


class AtomEncoder(FeatureEncoder):
    r"""Embeds PyG's 9 atom features (atomic number, chirality, degree, formal
    charge, hydrogens, radical electrons, hybridisation, aromatic, in ring)."""

    def __init__(self, dim: int):
        super().__init__(ATOM_VOCAB, dim)


class BondEncoder(FeatureEncoder):
    r"""Embeds PyG's 3 bond features (bond type, stereo, conjugated)."""

    def __init__(self, dim: int):
        super().__init__(BOND_VOCAB, dim)


def make_conv(conv: str, hidden: int, heads: int) -> nn.Module:
    r"""A PyG attention conv ``hidden -> hidden`` (``heads`` heads of
    ``hidden // heads`` channels, concatenated) reading ``edge_attr`` of width
    ``hidden``."""
    from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

    cls = {"gat": GATConv, "gatv2": GATv2Conv, "transformer": TransformerConv}[conv]
    return cls(hidden, hidden // heads, heads=heads, edge_dim=hidden)


class MoleculeModel(nn.Module):
    r"""Atom and bond embeddings, ``layers`` attention convs with edge features
    (each: conv, ReLU, dropout, residual, batch norm), mean pooling, a linear
    head with ``num_tasks`` logits. Plain PyG convs: :func:`pyg_dfgnn.nn.fuse`
    makes the fused model."""

    def __init__(self, conv: str, hidden: int, heads: int, layers: int, dropout: float,
                 num_tasks: int = 1):
        super().__init__()
        self.dropout = dropout
        self.atom_encoder = AtomEncoder(hidden)
        self.bond_encoder = BondEncoder(hidden)
        self.convs = nn.ModuleList(make_conv(conv, hidden, heads) for _ in range(layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, num_tasks)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor,
                num_graphs: Optional[int] = None) -> Tensor:
        from torch_geometric.nn import global_mean_pool

        h = self.atom_encoder(x)
        e = self.bond_encoder(edge_attr)
        for conv, norm in zip(self.convs, self.norms):
            out = F.dropout(F.relu(conv(h, edge_index, e)), self.dropout, self.training)
            h = norm(h + out)
        # num_graphs (the batch's, known on the host): without it the pooling reads
        # batch.max() from the GPU, a synchronisation per step.
        return self.head(global_mean_pool(h, batch, num_graphs))


# ------------------------------------------------------------- metrics
def roc_auc(y_true: Tensor, y_score: Tensor) -> float:
    r"""ROC-AUC as OGB's ``Evaluator('ogbg-molhiv')`` computes it: per task
    (column), over the labelled molecules (NaN labels left out), for the tasks
    with both a positive and a negative, averaged. Each task's AUC is the
    Mann-Whitney U statistic over ``n_pos * n_neg`` (ties count one half), which
    is what scikit-learn's ``roc_auc_score`` computes.

    Returns ``nan`` where no task has both classes (OGB raises there): a small
    ``--subset`` can leave a split without a positive.
    """
    from scipy.stats import mannwhitneyu

    y_true = y_true.detach().double().cpu().view(y_true.size(0), -1)
    y_score = y_score.detach().double().cpu().view(y_true.shape)
    aucs = []
    for t in range(y_true.size(1)):
        labelled = ~torch.isnan(y_true[:, t])
        y, s = y_true[labelled, t], y_score[labelled, t]
        pos, neg = s[y == 1].numpy(), s[y == 0].numpy()
        if len(pos) and len(neg):
            u = mannwhitneyu(pos, neg, method="asymptotic").statistic
            aucs.append(float(u) / (len(pos) * len(neg)))
    return statistics.fmean(aucs) if aucs else math.nan


# -------------------------------------------------------------- training
def make_loaders(dataset, split: Dict[str, Tensor], batch_size: int, seed: int,
                 drop_last: bool = False, workers: int = 0, pin_memory: bool = False):
    r"""PyG ``DataLoader``\ s over the molecules ``split[part]`` of ``dataset`` (a
    PyG dataset or a list of graphs): the training one shuffles with its own
    generator seeded with ``seed``, so every model that calls this with the same
    seed trains on the same batches, and with ``drop_last`` leaves out a last
    batch smaller than ``batch_size``. ``workers`` > 0: each loader collates in
    that many worker processes, kept across epochs; the order is still drawn in
    the main process from the loader's generator (which the workers' seeds draw
    from too), so models given the same ``seed`` and ``workers`` train on the same
    batches. ``pin_memory``: the loaders pin each batch in their own thread, for
    the copy to a GPU."""
    from torch.utils.data import Subset
    from torch_geometric.loader import DataLoader

    gen = torch.Generator().manual_seed(seed)
    return {part: DataLoader(Subset(dataset, idx.tolist()), batch_size=batch_size,
                             shuffle=part == "train", drop_last=drop_last and part == "train",
                             generator=gen if part == "train" else None,
                             num_workers=workers, persistent_workers=workers > 0,
                             pin_memory=pin_memory)
            for part, idx in split.items()}


def on_device(loader, model: nn.Module, device: torch.device, with_csc: bool = True,
              in_thread: bool = False):
    r"""``loader``'s batches copied to ``device`` one step ahead, each with the
    layouts that ``model``'s fused convs read already cached on its
    ``edge_index`` (:class:`~pyg_dfgnn.loader.LayoutPrefetchLoader`; a native
    model's batches are only prefetched). Under ``torch.compile`` a layer that
    finds no cached layout builds one at a graph break, every step, in every
    layer; built here, outside the compiled region, the model stays one graph.
    ``with_csc``: also build the CSC that the backward reads (training);
    ``in_thread``: do all that in a background thread (``--prefetch-thread``)."""
    from pyg_dfgnn.loader import LayoutPrefetchLoader, layout_variants

    return LayoutPrefetchLoader(loader, device, self_loops=layout_variants(model),
                                with_csc=with_csc, in_thread=in_thread)


def _adam(model: nn.Module, lr: float, device: torch.device) -> torch.optim.Adam:
    r"""Adam over ``model``'s parameters; on a GPU its fused form, one kernel for
    every parameter where the multi-tensor form launches several per step, and a
    step that the host bounds pays for each launch (``docs/multi_gpu.md``)."""
    return torch.optim.Adam(model.parameters(), lr=lr,
                            fused=True if device.type == "cuda" else None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loss(model: nn.Module, batch, edge_index: Optional[Tensor] = None) -> Tensor:
    edge_index = batch.edge_index if edge_index is None else edge_index
    out = model(batch.x, edge_index, batch.edge_attr, batch.batch, batch.num_graphs)
    # The mean over the labelled entries (HIV labels every molecule; MoleculeNet
    # may not), weighted rather than selected: a boolean selection waits for the GPU.
    labelled = ~torch.isnan(batch.y)
    loss = F.binary_cross_entropy_with_logits(out, torch.nan_to_num(batch.y), reduction="none")
    return (loss * labelled).sum() / labelled.sum()


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device) -> float:
    r"""ROC-AUC (:func:`roc_auc`) of ``model`` over ``loader``'s molecules."""
    model.eval()
    ys, scores = [], []
    for batch in on_device(loader, model, device, with_csc=False):
        scores.append(model(batch.x, batch.edge_index, batch.edge_attr, batch.batch,
                            batch.num_graphs).cpu())
        ys.append(batch.y.cpu())
    return roc_auc(torch.cat(ys), torch.cat(scores))


class Training:
    r"""One model's training with Adam on ``loaders["train"]``, an epoch at a
    time (:meth:`epoch`), evaluating ROC-AUC on ``loaders["val"]`` and
    ``loaders["test"]`` after each; :meth:`result` reports it.

    Each training keeps its own state of torch's random generators (CPU and
    ``device``'s): seeded with ``seed`` when it is made, set before each of its
    epochs and kept after it, so that two trainings whose epochs alternate
    (:func:`main`) draw the dropout masks each would draw alone. With
    ``compiled`` the model runs under ``torch.compile(dynamic=True)`` (its
    parameters are ``model``'s). ``prefetch_thread``: the training batches are
    prefetched in a background thread (:func:`on_device`).
    """

    def __init__(self, model: nn.Module, loaders, epochs: int, lr: float, seed: int,
                 device: torch.device, desc: str = "", progress: bool = True,
                 compiled: bool = False, prefetch_thread: bool = False):
        torch.manual_seed(seed)  # the same dropout masks for every implementation
        self.device, self.loaders = device, loaders
        self.opt = _adam(model, lr, device)
        self.train_batches = on_device(loaders["train"], model, device,
                                       in_thread=prefetch_thread)
        self.model = torch.compile(model, dynamic=True) if compiled else model
        self.rng = _rng_state(device)
        self.losses: List[float] = []
        self.times: List[float] = []
        self.epoch_loss: List[float] = []
        self.epoch_s: List[float] = []
        self.curves: Dict[str, List[float]] = {"val": [], "test": []}
        self.best = {"val": -math.inf, "test": math.nan, "epoch": 0}
        self.bar = cli.progress(total=epochs * len(loaders["train"]), show=progress, desc=desc)

    def epoch(self) -> None:
        r"""One pass over the training batches, then the evaluation."""
        model, opt, device = self.model, self.opt, self.device
        outer = _rng_state(device)
        _set_rng_state(self.rng, device)
        model.train()
        first = len(self.losses)
        t_epoch = time.perf_counter()
        for batch in self.train_batches:
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = _loss(model, batch)
            loss.backward()
            opt.step()
            _sync(device)
            self.times.append((time.perf_counter() - t0) * 1e3)
            self.losses.append(loss.item())
            self.bar.update(1)
        self.epoch_s.append(time.perf_counter() - t_epoch)
        self.rng = _rng_state(device)
        _set_rng_state(outer, device)
        self.epoch_loss.append(statistics.fmean(self.losses[first:]))
        curves = self.curves
        for part in curves:
            curves[part].append(evaluate(model, self.loaders[part], device))
        if curves["val"][-1] > self.best["val"]:  # nan (no positive) never counts as better
            self.best = {"val": curves["val"][-1], "test": curves["test"][-1],
                         "epoch": len(self.epoch_s)}
        self.bar.set_postfix(OrderedDict(
            loss=f"{self.epoch_loss[-1]:.4f}", val=f"{curves['val'][-1]:.4f}",
            test_at_best_val=f"{self.best['test']:.4f}",
            step_ms=f"{statistics.median(self.times):.1f}"))

    def result(self) -> Dict[str, object]:
        r"""The report of the epochs run (:func:`train_one` returns it)."""
        self.bar.close()
        best = self.best
        return {
            "test_rocauc": best["test"],
            "val_rocauc": best["val"] if best["epoch"] else math.nan,
            "best_epoch": best["epoch"],
            "median_step_ms": statistics.median(self.times),
            "mean_step_ms": statistics.fmean(self.times),
            "median_epoch_s": statistics.median(self.epoch_s),
            "epoch_s": self.epoch_s,
            "losses": self.losses,
            "epoch_loss": self.epoch_loss,
            "val_rocaucs": self.curves["val"],
            "test_rocaucs": self.curves["test"],
        }


def _rng_state(device: torch.device) -> Tuple[Tensor, Optional[Tensor]]:
    return (torch.get_rng_state(),
            torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state: Tuple[Tensor, Optional[Tensor]], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def train_one(model: nn.Module, loaders, epochs: int, lr: float, seed: int,
              device: torch.device, desc: str = "", progress: bool = True,
              compiled: bool = False, prefetch_thread: bool = False) -> Dict[str, object]:
    r"""Trains ``model`` for ``epochs`` epochs (:class:`Training`).

    Returns:
        dict with ``test_rocauc`` and ``val_rocauc`` at the best validation
        ROC-AUC, ``best_epoch`` (1-based), ``median_step_ms``,
        ``mean_step_ms``, ``median_epoch_s``, the per-step ``losses``, and per
        epoch ``epoch_s`` (the pass over ``loaders["train"]``: batching, the
        copies to the device, the fused layers' layouts (:func:`on_device`) and
        the steps; evaluation left out; a step's time leaves out the first
        three, done one step ahead),
        ``epoch_loss``, ``val_rocaucs`` and ``test_rocaucs``.
    """
    run = Training(model, loaders, epochs, lr, seed, device, desc, progress, compiled,
                   prefetch_thread)
    for _ in range(epochs):
        run.epoch()
    return run.result()


def sweep(base: nn.Module, dataset, train_idx: Tensor, batch_sizes: Sequence[int],
          impls: Sequence[str], steps: int, lr: float, seed: int, device: torch.device,
          warmup: int = 5, compiled: bool = False) -> List[Dict[str, object]]:
    r"""Times ``steps`` training steps (after ``warmup`` untimed ones) per batch
    size and implementation, on the same batches of the molecules ``train_idx``,
    each already on the device, from copies of ``base`` (the native model;
    ``fuse()`` makes the fused one): how the step time follows the batch size,
    and where it is the host's rather than the GPU's.

    Every step reads a new ``edge_index`` (a copy made before the timing), so the
    fused step builds its layout in each, as in training, where every batch is
    new: inside the timed step, before the model's call, so outside a compiled
    region (as :func:`on_device` builds them for training, one step ahead). The
    implementations' timed steps alternate, one step each in turn.
    ``compiled``: both under ``torch.compile(dynamic=True)`` (the warm-up steps
    compile). Each batch holds ``batch_size`` molecules; where ``train_idx`` holds
    fewer than ``warmup + steps`` batches, they repeat.

    Returns:
        one row per batch size and implementation: ``batch_size``, ``impl``,
        ``steps``, the mean ``molecules``, ``nodes`` and ``edges`` of a step,
        ``wall_ms`` (median time of a step, synchronised, as
        :func:`train_one` times it), and on a GPU ``event_ms`` (median time
        between CUDA events around the step: everything the host issues in it,
        host gaps included), ``gpu_ms`` (the time the GPU spends in the step's
        kernels and copies, torch.profiler, over a second pass of the same
        steps: the step's time were it not waiting for the host), ``host_ms``
        (``wall_ms - gpu_ms``) and ``host_share`` (``host_ms / wall_ms``); on the
        CPU those are ``None``.
    """
    import itertools

    from torch_geometric.data import Data

    from benchmarks.minibatch import Timer, kernel_categories
    from pyg_dfgnn.loader import layout_variants
    from pyg_dfgnn.nn import fuse
    from pyg_dfgnn.transforms import CacheLayout

    cuda = device.type == "cuda"
    rows: List[Dict[str, object]] = []
    for bs in batch_sizes:
        loader = make_loaders(dataset, {"train": train_idx}, bs, seed, drop_last=True)["train"]
        batches = [b.to(device) for b in itertools.islice(itertools.cycle(loader),
                                                          warmup + steps)]
        timed = range(warmup, warmup + steps)
        runs = {}
        for impl in impls:
            model = copy.deepcopy(base)
            if impl == "fused":
                fuse(model)
            model.train()
            opt = _adam(model, lr, device)
            variants = layout_variants(model)
            if compiled:
                model = torch.compile(model, dynamic=True)
            torch.manual_seed(seed)
            runs[impl] = {"model": model, "opt": opt, "wall": [], "span": [],
                          "cache": CacheLayout(variants) if variants else None,
                          "edges": [b.edge_index.clone() for b in batches]}

        def step_of(run):
            def step(i: int) -> None:
                if run["cache"] is not None:
                    run["cache"](Data(edge_index=run["edges"][i],
                                      num_nodes=batches[i].num_nodes))
                run["opt"].zero_grad(set_to_none=True)
                _loss(run["model"], batches[i], run["edges"][i]).backward()
                run["opt"].step()
            return step

        for impl in impls:
            for i in range(warmup):
                step_of(runs[impl])(i)
        # The implementations alternate step by step (each going first in turn): the
        # host's speed drifts within seconds, and a drift then reaches both alike.
        for n, i in enumerate(timed):
            order = impls if n % 2 == 0 else tuple(reversed(impls))
            for impl in order:
                run = runs[impl]
                _sync(device)
                t0 = time.perf_counter()
                with Timer(device) as t:
                    step_of(run)(i)
                _sync(device)
                run["wall"].append((time.perf_counter() - t0) * 1e3)
                run["span"].append(t.elapsed())
        for impl in impls:
            run = runs[impl]
            gpu = None
            if cuda:
                run["edges"] = [b.edge_index.clone() for b in batches]  # new layouts again
                gpu = kernel_categories(step_of(run), timed)["gpu_ms"]
            row = {"batch_size": bs, "impl": impl, "steps": steps,
                   "molecules": statistics.fmean(batches[i].num_graphs for i in timed),
                   "nodes": statistics.fmean(batches[i].num_nodes for i in timed),
                   "edges": statistics.fmean(batches[i].edge_index.size(1) for i in timed),
                   "wall_ms": statistics.median(run["wall"]),
                   "event_ms": statistics.median(run["span"]) if cuda else None,
                   "gpu_ms": gpu, "host_ms": None, "host_share": None}
            if gpu is not None:
                row["host_ms"] = row["wall_ms"] - gpu
                row["host_share"] = row["host_ms"] / row["wall_ms"]
            rows.append(row)
    return rows


def sweep_table(rows: Sequence[Dict[str, object]]) -> str:
    r"""The rows of :func:`sweep` as a table: per batch size, each
    implementation's step (wall) time with its GPU time, the ratio, and on a
    GPU the host's share of each step."""
    def ms(r):
        return f"{r['wall_ms']:.2f}" + (f" ({r['gpu_ms']:.2f})" if r["gpu_ms"] is not None
                                         else "")

    by = {(r["batch_size"], r["impl"]): r for r in rows}
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    head = ["batch", "molecules"] + [f"{i} step ms (GPU ms)" for i in impls]
    if len(impls) == 2:
        head.append("native/fused")
    gpu = rows[0]["gpu_ms"] is not None
    if gpu:
        head.append("host share " + " / ".join(impls))
    out = [head]
    for bs in dict.fromkeys(r["batch_size"] for r in rows):
        rs = [by[bs, i] for i in impls]
        line = [str(bs), f"{rs[0]['molecules']:.0f}"] + [ms(r) for r in rs]
        if len(impls) == 2:
            line.append(f"{rs[0]['wall_ms'] / rs[1]['wall_ms']:.2f}x")
        if gpu:
            line.append(" / ".join(f"{r['host_share']:.0%}" for r in rs))
        out.append(line)
    return cli.table(out)


# ------------------------------------------------------------------- CLI
def parse_args(argv: Optional[Sequence[str]] = None,
               prog: Optional[str] = None) -> argparse.Namespace:
    from benchmarks.datasets import add_data_argument

    p = argparse.ArgumentParser(
        prog=prog,
        description="Train an attention GNN with bond features on MoleculeNet HIV with PyG's "
                    "convs and with their fuse()d copy (same initial parameters, same "
                    "batches), then print test ROC-AUC and the median training-step time of "
                    "each.",
        epilog="examples:\n"
               "  %(prog)s --data DIR              # DIR/MoleculeNet/hiv/raw/HIV.csv\n"
               "  %(prog)s --conv transformer --subset 2000 --epochs 3 --device cpu\n"
               "  %(prog)s --impl fused --json out/molhiv.json\n"
               "  %(prog)s --data DIR --subset 20000 --save-processed OUT   # with RDKit\n"
               "  %(prog)s --data OUT --sweep-batch-sizes 32,128,512,1024   # without\n"
               "\nNeeds RDKit (pip install rdkit), except with a --data folder that "
               "--save-processed made. Without --data or $PYG_DFGNN_DATA, PyG downloads the "
               "dataset into ~/.cache/pyg_dfgnn.",
        formatter_class=cli.HelpFormatter)
    p.add_argument("--conv", choices=CONVS, default="transformer",
                   help="attention layer: GATConv, GATv2Conv or TransformerConv, each with "
                        "edge_dim")
    p.add_argument("--impl", choices=IMPLS + ("both",), default="both",
                   help="native: the PyG model, fused: its fuse()d copy, both: train each "
                        "and compare")
    add_data_argument(p, "MoleculeNet/hiv/raw/HIV.csv")
    p.add_argument("--split", choices=("scaffold", "random"), default="scaffold",
                   help="scaffold: OGB's scaffold split (deterministic), random: seeded by "
                        "--seed; 80/10/10 either way")
    p.add_argument("--subset", type=int, default=None, metavar="N",
                   help="use the first N molecules only, for quick runs (default: all 41,120)")
    p.add_argument("--epochs", type=int, default=20, help="training epochs")
    p.add_argument("--batch-size", type=int, default=128, help="molecules per batch")
    p.add_argument("--hidden", type=int, default=128,
                   help="width of the embeddings and of each conv's output (heads x channels)")
    p.add_argument("--heads", type=int, default=4, help="attention heads per conv")
    p.add_argument("--layers", type=int, default=4, help="attention convs")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout after each conv")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--compile", action="store_true",
                   help="train and time both models under torch.compile(dynamic=True): "
                        "the step is host-bound at these sizes, and compiled code launches "
                        "fewer kernels (the first steps compile)")
    p.add_argument("--prefetch-thread", action="store_true",
                   help="prefetch the training batches (copies, fused layers' layouts) in a "
                        "background thread: the step never waits on the loader or the layout "
                        "build (LayoutPrefetchLoader's in_thread)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="loader worker processes per loader, collating the next batches "
                        "while the GPU trains: collating 512 molecules takes longer than a "
                        "training step (default: 4 on a GPU, 0 on the CPU)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the parameters, the batch order, dropout and --split random")
    p.add_argument("--sweep-batch-sizes", metavar="LIST", default=None,
                   help="after training, time --sweep-steps training steps at each of these "
                        "batch sizes (comma-separated, e.g. 32,128,512,1024), each impl on the "
                        "same batches: step time and, on a GPU, the GPU's time in it (default: "
                        "no sweep)")
    p.add_argument("--sweep-steps", type=int, default=20,
                   help="timed steps per batch size and impl in the sweep, after 5 warm-up "
                        "steps")
    p.add_argument("--save-processed", metavar="DIR", default=None,
                   help="instead of training: process the molecules (all, or --subset N) "
                        "with RDKit into DIR/MoleculeNet/hiv/ (PyG's processed files, about "
                        "0.66 KiB per molecule), which --data DIR then reads without RDKit; "
                        "DIR/MoleculeNet/hiv must not exist (default: none, train)")
    cli.add_run_arguments(p, "config, fuse() report, per-impl metrics and curves, sweep rows")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "hidden", "heads", "layers", "subset", "sweep_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.sweep_batch_sizes is not None:
        values = args.sweep_batch_sizes.split(",")
        if not all(v.strip().isdigit() and int(v) > 0 for v in values):
            p.error(f"--sweep-batch-sizes {args.sweep_batch_sizes}: positive integers separated "
                    "by commas, e.g. 32,128,512,1024")
        args.sweep_batch_sizes = [int(v) for v in values]
    if args.hidden % args.heads:
        p.error(f"--hidden ({args.hidden}) must be a multiple of --heads ({args.heads})")
    args.device = cli.parse_device(p, args.device)
    if args.workers is None:
        args.workers = 4 if args.device.type == "cuda" else 0
    elif args.workers < 0:
        p.error(f"--workers must be >= 0, got {args.workers}")
    return args


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> Dict[str, object]:
    r"""Runs the comparison; returns the report (also written with ``--json``)."""
    args = parse_args(argv, prog=prog)
    import torch_geometric

    import pyg_dfgnn
    from benchmarks import datasets
    from pyg_dfgnn.nn import fuse

    if args.save_processed:
        return save_processed(args)
    if datasets.hiv_processed(args.data) is None:  # else PyG reads what RDKit made before
        datasets.require_rdkit("examples/train_molhiv.py")
    device = args.device
    impls = list(IMPLS) if args.impl == "both" else [args.impl]

    torch_geometric.seed_everything(args.seed)
    # One logit: HIV labels each molecule active or not. Built before the data,
    # whose parsing takes a while, so that the fuse() report comes first.
    native = MoleculeModel(args.conv, args.hidden, args.heads, args.layers,
                           args.dropout).to(device)
    report = fuse(native, inplace=False)  # a fused copy, same parameters
    print(report)
    if not report.num_fused:
        print("No conv runs fused (reasons above): the fused model runs PyG's own forward, "
              "the native model's code, so the two train alike and their step times compare "
              "PyG with itself.")
    models = {"native": native, "fused": report.model}
    # The sweep's models start from the parameters training starts from.
    sweep_base = copy.deepcopy(native) if args.sweep_batch_sizes else None

    dataset = datasets.moleculenet_hiv(args.data, limit=args.subset)
    # A processed HIV holds each molecule's scaffold (datasets.MoleculeStorage), so
    # the scaffold split needs no RDKit there.
    split = (datasets.scaffold_split(dataset.smiles, scaffolds=getattr(dataset, "scaffold", None))
             if args.split == "scaffold" else datasets.random_split(len(dataset), seed=args.seed))
    sizes = {part: len(idx) for part, idx in split.items()}
    if args.sweep_batch_sizes and max(args.sweep_batch_sizes) > sizes["train"]:
        raise SystemExit(f"--sweep-batch-sizes: {max(args.sweep_batch_sizes):,} molecules per "
                         f"batch, but the training split holds {sizes['train']:,}")

    # The implementations' epochs alternate, each going first in turn: the host's
    # speed drifts over seconds, and the epochs are host-bound, so a drift then
    # reaches both rather than one implementation's whole run.
    runs = {impl: Training(models[impl], make_loaders(dataset, split, args.batch_size, args.seed,
                                                      workers=args.workers,
                                                      pin_memory=device.type == "cuda"),
                           args.epochs, args.lr, args.seed, device, desc=f"{args.conv}/{impl}",
                           progress=not args.no_progress, compiled=args.compile,
                           prefetch_thread=args.prefetch_thread)
            for impl in impls}
    for epoch in range(args.epochs):
        for impl in (impls if epoch % 2 == 0 else impls[::-1]):
            runs[impl].epoch()
    results: Dict[str, Dict[str, object]] = {impl: run.result() for impl, run in runs.items()}
    rows = None
    if args.sweep_batch_sizes:
        rows = sweep(sweep_base, dataset, split["train"], args.sweep_batch_sizes, impls,
                     args.sweep_steps, args.lr, args.seed, device, compiled=args.compile)
    speedup = None
    if len(results) == 2 and report.num_fused:
        speedup = results["native"]["median_step_ms"] / results["fused"]["median_step_ms"]

    kernels = pyg_dfgnn.has_cuda_kernels() and device.type == "cuda"
    dev_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else platform.processor() or platform.machine() or "cpu")
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", *sys.argv]),
        "device": str(device),
        "device_name": dev_name,
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "prefetch_thread": args.prefetch_thread,
        "pyg_dfgnn": pyg_dfgnn.__version__,
        "cuda_extension": kernels,
        "dataset": "MoleculeNet HIV",
        "conv": args.conv,
        "split": args.split,
        "split_sizes": sizes,
        "config": {k: getattr(args, k) for k in ("epochs", "batch_size", "hidden", "heads",
                                                 "layers", "dropout", "lr", "seed", "subset",
                                                 "sweep_batch_sizes", "sweep_steps", "compile",
                                                 "workers")},
        "fuse_report": [layer._asdict() for layer in report],
        "results": results,
        "speedup": speedup,
        "sweep": rows,
    }

    print(f"\n{args.conv} on MoleculeNet HIV ({args.split} split, train / val / test "
          f"{sizes['train']:,} / {sizes['val']:,} / {sizes['test']:,} molecules), "
          f"{args.epochs} epochs, seed {args.seed}")
    print(f"device: {device} ({dev_name}), torch {torch.__version__}, "
          f"torch_geometric {torch_geometric.__version__}")
    if "fused" in results and report.num_fused and device.type == "cpu":
        print("fused layers: pure-PyTorch reference path on the CPU (times say nothing "
              "about the kernels)")
    table = [["impl", "test ROC-AUC", "best val ROC-AUC (epoch)", "median step ms",
              "median epoch s", "speedup (native/fused)"]]
    for impl, r in results.items():
        sp = f"{speedup:.2f}x" if impl == "fused" and speedup is not None else ""
        table.append([impl, f"{r['test_rocauc']:.4f}",
                      f"{r['val_rocauc']:.4f} ({r['best_epoch']})",
                      f"{r['median_step_ms']:.2f}", f"{r['median_epoch_s']:.2f}", sp])
    print(cli.table(table))
    if rows:
        gpu = " (GPU ms: its kernels and copies, torch.profiler)" if device.type == "cuda" else ""
        print(f"\nstep time by batch size, median of {args.sweep_steps} steps{gpu}:")
        print(sweep_table(rows))
    if args.json:
        path = cli.out_file(args.json)
        path.write_text(json.dumps(out, indent=2))
        print(f"results written to {path}")
    return out


def save_processed(args: argparse.Namespace) -> Dict[str, object]:
    r"""``--save-processed DIR``: PyG's processed HIV (the molecules ``--data``
    and ``--subset`` select) written into ``DIR/MoleculeNet/hiv``
    (:func:`benchmarks.datasets.process_hiv`), with the size of each file."""
    from benchmarks import datasets

    datasets.require_rdkit("examples/train_molhiv.py --save-processed")
    dataset = datasets.process_hiv(args.save_processed, root=args.data, limit=args.subset)
    root = Path(args.save_processed).expanduser().resolve()
    files = {str(f.relative_to(root)): f.stat().st_size
             for f in sorted((root / "MoleculeNet" / "hiv").rglob("*")) if f.is_file()}
    print(cli.table([["file", "MiB"]] + [[f, f"{n / 2**20:.2f}"] for f, n in files.items()]))
    print(f"{len(dataset):,} molecules, {sum(files.values()) / 2**20:.2f} MiB in {root}: "
          f"--data {root} reads them without RDKit")
    return {"data": str(root), "molecules": len(dataset), "files": files}


def run(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    r"""Command-line entry point: runs :func:`main`, returns the exit status. A
    dataset it cannot load ends in two lines saying what to pass, a missing
    RDKit in one line saying what to install."""
    from benchmarks.datasets import exit_on_missing_data
    try:
        with exit_on_missing_data():
            main(argv, prog=prog)
    except ModuleNotFoundError as e:
        if e.name != "rdkit":
            raise
        sys.exit(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(run())
