r"""End-to-end training benchmark: native PyG layers vs. the fused pyg_dfgnn layers
(the layout of the DF-GNN paper's Table 2).

For each dataset x model, the same model is built twice from the same seed, once
with :mod:`torch_geometric.nn`'s ``TransformerConv`` / ``GATConv`` / ``AGNNConv``
("native") and once with :mod:`pyg_dfgnn.nn`'s ``FusedTransformerConv`` /
``FusedGATConv`` / ``FusedAGNNConv`` ("fused"); the fused model loads the native
model's ``state_dict``, so both start from identical weights. Each is trained for
a few epochs (Adam, cross-entropy) and every training step is timed in phases:

* **preprocess**: building the fused layers' CSR/CSC layout of the step's graph
  (``pyg_dfgnn.layout_cache.get_layout``, called explicitly before the forward; the
  layers then find it cached on ``edge_index``). A batch of graphs is a new
  ``edge_index`` every step, so its layout is built every step; a full graph
  keeps its ``edge_index``, so its layout is built once (first step, reported
  as ``preprocess_first_ms``) and later steps only look it up. Native PyG needs
  no preprocessing: 0.
* **forward** (model + loss), **backward**, **optimizer** (``step`` +
  ``zero_grad``),

with ``torch.cuda.synchronize()`` around each phase on GPU. Reported: the median
of each phase over the timed steps (after ``--warmup`` steps), the median step
time, peak GPU memory, and per-epoch loss / accuracy (so the speedup is shown on
a model that learns; both implementations compute the same function).

Two modes (``--mode``; default ``both`` on CUDA, ``eager`` on CPU):

* **eager** (the rows' ``impls``): the training loop is plain PyTorch eager
  code, and the only difference between the two implementations is the import
  of the conv class. On a small full graph (Cora, CiteSeer, PubMed) an eager step
  is bound by the host: every dense op (Linear, BatchNorm, ELU, Adam, ...) costs
  tens of microseconds of Python and kernel launch, whatever the GPU does, and
  that overhead is the same for both implementations. So the eager speedup on
  these graphs mostly measures the launch count, not the attention kernels.
* **cudagraph** (the rows' ``cudagraph`` key; full graphs only, whose shapes
  are static: a batch dataset has a new graph every step): both implementations
  run the whole training step (forward, loss, backward, ``optimizer.step``) as
  one captured CUDA graph, with PyTorch's whole-network capture recipe
  (``torch.cuda.graph``; the step is run eagerly ``CAPTURE_WARMUP`` times on a
  side stream first, gradients are set to ``None`` before capture so that the
  captured backward allocates them in the graph's memory pool and refills them
  on every replay, Adam is built with ``capturable=True``). The warm-up steps are
  undone afterwards (initial weights reloaded in place, Adam's state zeroed), so
  the replays train from the same weights as the eager run. What differs from
  eager, for both implementations alike: the loss picks the training nodes with
  ``index_select`` on indices computed once, not with a boolean mask (which
  syncs with the host). What differs for **native** only: PyG's ``GATConv`` /
  ``AGNNConv`` remove and re-add self-loops in every forward with boolean
  masking, a host sync that cannot be captured, so the native model gets an
  ``edge_index`` to which self-loops were added once, before capture
  (``remove_self_loops`` then ``add_self_loops``, exactly what the conv does
  itself), and is built with ``add_self_loops=False``. The fused layers add
  self-loops once in their cached layout (built before capture with
  ``get_layout``), so both compute the same function as in eager mode. Reported
  per implementation: median replay time (``torch.cuda.synchronize()`` around
  each replay, after ``--warmup`` replays, as many replays as eager steps), the
  capture time, peak memory, losses (read from the graph's static loss after
  every replay) and accuracy (evaluated eagerly, ``model.eval()``, no grad). A
  failed capture is recorded as ``{"error": "capture failed: ..."}``.

**Compiled** impls (eager mode only): ``native_compile`` (in the default impls on
CUDA) and ``fused_compile`` train the same model under ``torch.compile`` (whole
model, default mode, ``--compile-backend``; static shapes on a full graph,
``dynamic=True`` on a batch dataset, whose every step is a new graph size; the
compiler's caches reset first). The first step's forward + backward wall time,
tracing and code generation included, is ``compile_ms`` (left out of the medians
with the other warm-up steps); a compiler failure is recorded as ``{"status":
"compile_failed", "error": "compile failed: ..."}``, not raised. Rows get
``speedup_vs_compiled`` (compiled native time / fused eager time: step, forward,
backward). Evaluation runs the module eagerly.

The **projection** impl ``fused_separate`` (eager and cudagraph modes) is the
fused model with ``FusedTransformerConv(fused_projection=False)``: query, key,
value and skip as separate GEMMs, their backward's GEMMs not joined. Only the ``gt`` model
differs from ``fused``; rows get ``projection_speedup`` (``fused_separate`` time
/ ``fused`` time), in ``cudagraph`` too.

TF32 in fp32 matmuls is set explicitly for every impl (``--tf32``; off by default)
and recorded in ``info`` (``allow_tf32``).

The optimizer is Adam, ``--adam fused`` (default on CUDA) or ``foreach``
(default on CPU), the same for both implementations and both modes.

Models (hidden size 128 by default):

* ``gt``: Linear encoder, ``--gt-layers`` graph-transformer layers as in Dwivedi
  & Bresson (multi-head attention ``TransformerConv(128, 32, heads=4,
  root_weight=False)``, output projection, residual, BatchNorm, FFN 128-256-128,
  residual, BatchNorm), Linear classifier.
* ``gat``: Linear encoder, ``--gat-layers`` x ``GATConv(128, 32, heads=4)`` +
  ELU, Linear classifier.
* ``agnn``: Linear, ReLU, ``AGNNConv(requires_grad=False)``,
  ``AGNNConv(requires_grad=True)``, Linear (PyG's AGNN example).

Datasets:

* ``pattern``, ``cluster``: generated SBM graphs (:func:`benchmarks.generators.sbm_dataset`,
  published parameters), node classification, ``--batch-size`` graphs per step
  (1,024 as in the paper) from ``--train-graphs`` training graphs (10,000: 10
  steps per epoch, 100 Adam steps in the default 10 epochs, lr 2e-3); accuracy is
  the class-balanced accuracy of Benchmarking GNNs on ``--test-graphs`` graphs
  generated with another seed.
* ``cora``, ``citeseer``: Planetoid, public split, normalised features; test
  accuracy at the epoch of best validation accuracy.
* ``pubmed``: the real PubMed graph with **random** features
  (:func:`benchmarks.datasets.pubmed_graph`): timing is meaningful, accuracy is not.

Usage::

    python -m benchmarks.e2e                      # everything, GPU, eager + cudagraph
    python -m benchmarks.e2e --quick              # tiny sizes, CPU-friendly (< 2 min)
    python -m benchmarks.e2e --datasets pattern,cora --models gt --out e2e.json
    python -m benchmarks.e2e --datasets cora --mode cudagraph
    python -m benchmarks.e2e --impls native,fused,native_compile --out e2e.json --resume

Writes JSON (``--out``, rewritten after every run) and prints one table per model
(eager phases; CUDA-graph step time, speedup and capture time when measured).

A fault in a compiled model's generated code (compiled native ``GATConv`` has
crashed with a misaligned address) leaves the process without a usable GPU: the
row records the fault as that impl's result and the process stops. ``--resume``
with the same ``--out`` and arguments runs only what the file lacks: the
(dataset, model) rows not in it, and the other impls of a row whose process
lost its context (the fault stays recorded; the row notes it as
``context_lost_earlier``). The file's ``info.processes`` lists each process's
time, arguments and rows; every setting but the datasets, models, impls and
mode must match the file's, and so must the GPU and torch, so that the rows
stay one run's.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DATASETS = ("pattern", "cluster", "cora", "citeseer", "pubmed")
MODELS = ("gt", "gat", "agnn")
IMPLS = ("native", "fused")
#: The same models under ``torch.compile`` (whole model; eager mode only).
COMPILED_IMPLS = ("native_compile", "fused_compile")
#: The fused model with separate projection GEMMs (``fused_projection=False``).
SEPARATE = "fused_separate"
ALL_IMPLS = IMPLS + COMPILED_IMPLS + (SEPARATE,)
PHASES = ("preprocess", "forward", "backward", "optimizer")
LABELS = {"pattern": "PATTERN", "cluster": "CLUSTER", "cora": "Cora", "citeseer": "CiteSeer",
          "pubmed": "PubMed"}
#: Which layout the fused layers of each model read (GAT / AGNN add self-loops).
SELF_LOOPS = {"gt": False, "gat": True, "agnn": True}
MODES = ("eager", "cudagraph")
#: Eager training steps run on a side stream before a capture (PyTorch's recipe;
#: they initialise Adam's state and the autograd / library workspaces). They are
#: undone after the capture: weights reloaded, Adam's state zeroed.
CAPTURE_WARMUP = 3
#: What the ``cudagraph`` key of a batch-dataset row says.
CUDAGRAPH_SKIP = "cudagraph mode applies to full graphs (static shapes)"


# ----------------------------------------------------------------------- models
def conv_classes(impl: str) -> Dict[str, type]:
    """``{"gt": TransformerConv-like, "gat": ..., "agnn": ...}`` of ``impl`` (a
    ``*_compile`` impl uses the classes of its eager counterpart)."""
    impl = base_impl(impl)
    if impl == "native":
        from torch_geometric.nn import AGNNConv, GATConv, TransformerConv
        return {"gt": TransformerConv, "gat": GATConv, "agnn": AGNNConv}
    if impl == "fused":
        from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv
        return {"gt": FusedTransformerConv, "gat": FusedGATConv, "agnn": FusedAGNNConv}
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


#: The phases whose times the speed-up ratios of a row compare.
PHASE_TIMES = ("step", "forward", "backward")


def time_ratios(slow: dict, fast: dict, phases: Sequence[str]) -> Optional[Dict[str, float]]:
    """``{phase: slow time / fast time}`` of two impl results, ``None`` unless both
    have a step time."""
    if "step_ms" not in slow or "step_ms" not in fast:
        return None
    return {p: slow[f"{p}_ms"] / fast[f"{p}_ms"] for p in phases}


def base_impl(impl: str) -> str:
    """``"native"`` / ``"fused"``: the conv classes an impl (compiled or not) uses."""
    if impl == SEPARATE:
        return "fused"
    return impl[:-len("_compile")] if impl.endswith("_compile") else impl


def _norm(kind: str, dim: int) -> nn.Module:
    return nn.BatchNorm1d(dim) if kind == "batch" else nn.LayerNorm(dim)


class GTLayer(nn.Module):
    r"""Graph-transformer layer of Dwivedi & Bresson (2021): multi-head attention
    over the in-neighbours, output projection, residual + norm, FFN (2x width),
    residual + norm."""

    def __init__(self, conv, hidden: int, heads: int, dropout: float, norm: str, **kw):
        super().__init__()
        self.dropout = dropout
        self.attn = conv(hidden, hidden // heads, heads=heads, concat=True, root_weight=False,
                         dropout=0.0, **kw)
        self.proj = nn.Linear(hidden, hidden)
        self.norm1 = _norm(norm, hidden)
        self.ffn1 = nn.Linear(hidden, 2 * hidden)
        self.ffn2 = nn.Linear(2 * hidden, hidden)
        self.norm2 = _norm(norm, hidden)

    def forward(self, h: Tensor, edge_index: Tensor) -> Tensor:
        a = F.dropout(self.attn(h, edge_index), self.dropout, self.training)
        h = self.norm1(h + self.proj(a))
        f = self.ffn2(F.dropout(F.relu(self.ffn1(h)), self.dropout, self.training))
        return self.norm2(h + F.dropout(f, self.dropout, self.training))


class GTNet(nn.Module):
    def __init__(self, conv, in_channels, hidden, out_channels, heads, layers, dropout, norm,
                 **kw):
        super().__init__()
        self.encoder = nn.Linear(in_channels, hidden)
        self.layers = nn.ModuleList(GTLayer(conv, hidden, heads, dropout, norm, **kw)
                                    for _ in range(layers))
        self.classifier = nn.Linear(hidden, out_channels)

    def forward(self, x, edge_index):
        h = self.encoder(x)
        for layer in self.layers:
            h = layer(h, edge_index)
        return self.classifier(h)


class GATNet(nn.Module):
    def __init__(self, conv, in_channels, hidden, out_channels, heads, layers, dropout, **kw):
        super().__init__()
        self.dropout = dropout
        self.encoder = nn.Linear(in_channels, hidden)
        self.convs = nn.ModuleList(conv(hidden, hidden // heads, heads=heads, dropout=0.0, **kw)
                                   for _ in range(layers))
        self.classifier = nn.Linear(hidden, out_channels)

    def forward(self, x, edge_index):
        h = F.dropout(self.encoder(x), self.dropout, self.training)
        for conv in self.convs:
            h = F.dropout(F.elu(conv(h, edge_index)), self.dropout, self.training)
        return self.classifier(h)


class AGNNNet(nn.Module):
    def __init__(self, conv, in_channels, hidden, out_channels, dropout, **kw):
        super().__init__()
        self.dropout = dropout
        self.lin1 = nn.Linear(in_channels, hidden)
        self.prop1 = conv(requires_grad=False, **kw)
        self.prop2 = conv(requires_grad=True, **kw)
        self.lin2 = nn.Linear(hidden, out_channels)

    def forward(self, x, edge_index):
        h = F.relu(self.lin1(F.dropout(x, self.dropout, self.training)))
        h = self.prop2(self.prop1(h, edge_index), edge_index)
        return self.lin2(F.dropout(h, self.dropout, self.training))


def build_model(model: str, impl: str, in_channels: int, out_channels: int, args,
                dropout: float, conv_kw: Optional[Dict[str, object]] = None) -> nn.Module:
    """``model`` with the conv classes of ``impl``; parameters are created in the same
    order for both implementations. ``conv_kw`` goes to every attention conv (the
    cudagraph mode passes ``add_self_loops=False`` to native GAT / AGNN)."""
    conv = conv_classes(impl)[model]
    kw = {"strategy": args.strategy} if base_impl(impl) == "fused" else {}
    if impl == SEPARATE and model == "gt":
        kw["fused_projection"] = False
    kw.update(conv_kw or {})
    if model == "gt":
        return GTNet(conv, in_channels, args.hidden, out_channels, args.heads, args.gt_layers,
                     dropout, args.norm, **kw)
    if model == "gat":
        return GATNet(conv, in_channels, args.hidden, out_channels, args.heads, args.gat_layers,
                      dropout, **kw)
    if model == "agnn":
        return AGNNNet(conv, in_channels, args.hidden, out_channels, dropout, **kw)
    raise ValueError(f"model must be one of {MODELS}, got {model!r}")


# --------------------------------------------------------------------- datasets
class Step:
    """One training step's inputs."""
    __slots__ = ("x", "edge_index", "y", "mask")

    def __init__(self, x, edge_index, y, mask=None):
        self.x, self.edge_index, self.y, self.mask = x, edge_index, y, mask


def balanced_accuracy(pred: Tensor, y: Tensor, num_classes: int) -> float:
    """Mean per-class recall over the classes present (Benchmarking GNNs' SBM accuracy)."""
    accs = []
    for c in range(num_classes):
        sel = y == c
        if bool(sel.any()):
            accs.append(float((pred[sel] == c).float().mean()))
    return sum(accs) / max(len(accs), 1)


class BatchDataset:
    r"""Generated SBM graphs, pre-collated into batches of ``batch_size`` graphs.
    The training batches are kept on the device (loading is not what is timed);
    every step gets a fresh ``edge_index`` (a clone, made outside the timed
    region), as a new batch from a DataLoader would be, so the fused layout is
    built in every step. The test batches stay on the host and are moved to the
    device one at a time during evaluation, so only one of them is resident."""
    kind = "batch"

    def __init__(self, name: str, args, device):
        from torch_geometric.loader import DataLoader

        from benchmarks.generators import SBM_PARAMS, sbm_dataset
        P = SBM_PARAMS[name]
        train = sbm_dataset(name, args.train_graphs, seed=args.seed)
        test = sbm_dataset(name, args.test_graphs, seed=args.seed + 1)
        gen = torch.Generator().manual_seed(args.seed)
        self.train = [b.to(device) for b in DataLoader(train, batch_size=args.batch_size,
                                                       shuffle=True, generator=gen)]
        self.test = list(DataLoader(test, batch_size=args.batch_size))  # host; see evaluate
        self.device = device
        self.in_channels, self.num_classes = P.vocab, P.num_classes
        self.metric = "balanced accuracy"
        self.features = "one-hot node feature (published construction)"
        self.nodes = statistics.fmean(b.num_nodes for b in self.train)
        self.edges = statistics.fmean(b.edge_index.size(1) for b in self.train)
        self.graphs_per_step = statistics.fmean(b.num_graphs for b in self.train)
        self.steps_per_epoch = len(self.train)

    def steps(self, epoch: int):
        order = torch.randperm(len(self.train), generator=torch.Generator().manual_seed(epoch))
        for i in order.tolist():
            b = self.train[i]
            yield Step(b.x, b.edge_index.clone(), b.y)

    @torch.no_grad()
    def evaluate(self, model) -> Dict[str, float]:
        """Balanced accuracy on the test graphs: one batch on the device at a time,
        only its predicted labels kept."""
        model.eval()
        preds, ys = [], []
        for b in self.test:
            b = b.to(self.device)
            preds.append(model(b.x, b.edge_index).argmax(-1))
            ys.append(b.y)
        model.train()
        return {"test_acc": balanced_accuracy(torch.cat(preds), torch.cat(ys), self.num_classes)}

    def train_acc(self, out: Tensor, step: Step) -> float:
        return balanced_accuracy(out.argmax(-1), step.y, self.num_classes)


class FullDataset:
    """A full graph (Cora, CiteSeer, PubMed) on the device; its ``edge_index`` is
    the same tensor in every step, so the fused layout is built once."""
    kind = "full"

    def __init__(self, name: str, args, device):
        import torch_geometric.transforms as T

        from benchmarks import datasets
        if name == "pubmed":
            data = datasets.pubmed_graph(num_features=500, seed=args.seed, root=args.data)
            self.features = "random (PubMed's feature file is not available offline)"
        else:
            data = datasets.planetoid(LABELS[name], transform=T.NormalizeFeatures(),
                                      root=args.data)
            self.features = "bag-of-words, row-normalised"
        self.data = data.to(device)
        self.in_channels = data.num_features
        self.num_classes = int(data.y.max()) + 1
        self.metric = "accuracy (test, at best validation)"
        self.nodes, self.edges = data.num_nodes, data.edge_index.size(1)
        self.graphs_per_step = 1
        self.steps_per_epoch = 1

    def steps(self, epoch: int):
        d = self.data
        yield Step(d.x, d.edge_index, d.y, d.train_mask)

    @torch.no_grad()
    def evaluate(self, model, edge_index: Optional[Tensor] = None) -> Dict[str, float]:
        """Validation / test accuracy and validation loss; ``edge_index`` replaces
        the graph's own (the native cudagraph model reads one with self-loops)."""
        model.eval()
        d = self.data
        out = model(d.x, d.edge_index if edge_index is None else edge_index)
        model.train()
        pred = out.argmax(-1)
        res = {f"{s}_acc": float((pred[d[f'{s}_mask']] == d.y[d[f'{s}_mask']]).float().mean())
               for s in ("val", "test")}
        res["val_loss"] = float(F.cross_entropy(out[d.val_mask], d.y[d.val_mask]))
        return res

    def train_acc(self, out: Tensor, step: Step) -> float:
        m = step.mask
        return float((out[m].argmax(-1) == step.y[m]).float().mean())


def load_dataset(name: str, args, device):
    return BatchDataset(name, args, device) if name in ("pattern", "cluster") else \
        FullDataset(name, args, device)


# ---------------------------------------------------------------------- running
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seed(seed: int) -> None:
    import random
    random.seed(seed)
    torch.manual_seed(seed)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def adam(params, impl: str, **kwargs) -> torch.optim.Adam:
    r"""Adam in implementation ``impl``: ``"fused"`` (one launch per step) or
    ``"foreach"``; ``kwargs`` go to :class:`torch.optim.Adam` (also used by
    :mod:`benchmarks.minibatch`)."""
    return torch.optim.Adam(params, **({"fused": True} if impl == "fused" else {"foreach": True}),
                            **kwargs)


def make_optimizer(model: nn.Module, hp, args, capturable: bool = False) -> torch.optim.Adam:
    r"""Adam with ``--adam``'s implementation, identical for both conv
    implementations; ``capturable=True`` for a captured step (keeps the step count
    on the device, so ``step`` launches no host work)."""
    return adam(model.parameters(), args.adam, lr=hp["lr"], weight_decay=hp["weight_decay"],
                capturable=capturable)


def reset_training_state(model: nn.Module, opt: torch.optim.Optimizer, init_state) -> None:
    r"""Undoes training steps in place: reloads ``init_state`` into the existing
    parameter and buffer tensors (``load_state_dict`` copies; a captured graph keeps
    pointing at them) and zeroes every tensor of Adam's state (step count, first
    and second moments), which is exactly the state of a new Adam before its first
    step."""
    model.load_state_dict(init_state)
    with torch.no_grad():
        for state in opt.state.values():
            for key, v in state.items():
                if not torch.is_tensor(v):
                    raise TypeError(f"optimizer state {key!r} is not a tensor: cannot reset "
                                    "it in place")
                v.zero_()


def native_graph_edge_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    r"""``edge_index`` with every self-loop removed and one added per node, in the
    order PyG's ``GATConv`` / ``AGNNConv`` build it in their forward
    (``remove_self_loops`` then ``add_self_loops``): what the native cudagraph model
    reads, built once outside the capture."""
    from torch_geometric.utils import add_self_loops, remove_self_loops
    ei, _ = remove_self_loops(edge_index)
    ei, _ = add_self_loops(ei, num_nodes=num_nodes)
    return ei


class CaptureError(RuntimeError):
    """``torch.cuda.graph`` capture of a training step failed."""


class CompileError(RuntimeError):
    """``torch.compile`` of a model failed in its first training step (tracing, the
    backend, or the generated code's first run)."""


def compile_model(model: nn.Module, ds, args) -> nn.Module:
    r"""``torch.compile(model)`` with ``--compile-backend``, default mode: static shapes
    (``dynamic=False``) on a full graph, whose shapes never change; ``dynamic=True``
    on a batch dataset, whose every step is a new graph size (static shapes would
    recompile every step until dynamo's recompile limit, then run eagerly). The
    compiler's caches are reset first, so no earlier run's graphs count against
    that limit."""
    torch._dynamo.reset()
    return torch.compile(model, dynamic=ds.kind != "full", backend=args.compile_backend)


def _chain(e: BaseException) -> List[str]:
    """First line of ``e`` and of every exception it was raised from / during,
    outermost first."""
    lines, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).strip().splitlines()
        lines.append(f"{type(e).__name__}: {text[0][:200] if text else ''}")
        e = e.__cause__ or e.__context__
    return lines


def _timed_run_summary(ds, losses, epochs, best, times, steps, device, mem0) -> Dict[str, object]:
    """Result keys shared by both modes (loss / accuracy / memory / step count)."""
    res: Dict[str, object] = {"step_ms": _median(times), "timed_steps": len(times),
                              "steps": steps}
    res["peak_MB"] = ((torch.cuda.max_memory_allocated(device) - mem0) / 2**20
                      if device.type == "cuda" else None)
    res["first_loss"] = losses[0] if losses else float("nan")
    res["first_epoch_loss"] = epochs[0]["loss"] if epochs else float("nan")
    res["final_loss"] = losses[-1] if losses else float("nan")
    if ds.kind == "full" and best is not None:
        res["test_acc"], res["best_epoch"] = best[1], best[2]
    else:
        res["test_acc"] = epochs[-1]["test_acc"] if epochs else float("nan")
    res["losses"] = losses
    res["epochs"] = epochs
    res["step_times_ms"] = times
    return res


def _better(ds, ev, best, epoch):
    """Tracks the test accuracy at the best validation accuracy (full graphs)."""
    if ds.kind != "full":
        return best
    key = (ev["val_acc"], -ev["val_loss"])
    return (key, ev["test_acc"], epoch + 1) if best is None or key > best[0] else best


def _memory_baseline(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def train_impl(ds, model_name: str, impl: str, init_state, args, device, hp) -> Dict[str, object]:
    r"""Eager mode: trains one implementation and times every step in phases.
    Returns its results."""
    from pyg_dfgnn.layout_cache import get_layout

    _seed(args.seed)
    model = build_model(model_name, impl, ds.in_channels, ds.num_classes, args, hp["dropout"])
    model.load_state_dict(init_state)
    model.to(device).train()
    opt = make_optimizer(model, hp, args)
    compiled = impl in COMPILED_IMPLS
    # the compiled model trains; evaluation (untimed) runs the same module eagerly
    step_model = compile_model(model, ds, args) if compiled else model
    compile_ms = None
    loops = SELF_LOOPS[model_name]
    mem0 = _memory_baseline(device)
    _seed(args.seed + 1)  # same dropout masks for both implementations
    times: Dict[str, List[float]] = {p: [] for p in PHASES + ("step",)}
    losses: List[float] = []
    epochs: List[Dict[str, float]] = []
    first_pre = None
    best = None
    step_i = 0
    for epoch in range(hp["epochs"]):
        ep_loss, ep_acc = [], []
        for st in ds.steps(epoch):
            n = st.x.size(0)
            _sync(device)
            t0 = time.perf_counter()
            if base_impl(impl) == "fused":
                get_layout(st.edge_index, (n, n), add_self_loops=loops)
                _sync(device)
            t1 = time.perf_counter()
            try:
                out = step_model(st.x, st.edge_index)
                loss = F.cross_entropy(out if st.mask is None else out[st.mask],
                                       st.y if st.mask is None else st.y[st.mask])
                _sync(device)
                t2 = time.perf_counter()
                loss.backward()
                _sync(device)
            except Exception as e:
                if compiled and compile_ms is None:
                    raise CompileError(_chain(e)[0]) from e
                raise
            t3 = time.perf_counter()
            if compiled and compile_ms is None:
                compile_ms = (t3 - t1) * 1e3
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(device)
            t4 = time.perf_counter()
            if first_pre is None:
                first_pre = (t1 - t0) * 1e3
            if step_i >= hp["warmup"]:
                for p, dt in zip(PHASES + ("step",), (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                    times[p].append(dt * 1e3)
            step_i += 1
            losses.append(loss.item())
            ep_loss.append(losses[-1])
            with torch.no_grad():
                ep_acc.append(ds.train_acc(out.detach(), st))
            del out, loss
        ev = ds.evaluate(model)
        epochs.append({"epoch": epoch + 1, "loss": statistics.fmean(ep_loss),
                       "train_acc": statistics.fmean(ep_acc), **ev})
        best = _better(ds, ev, best, epoch)
    res: Dict[str, object] = {f"{p}_ms": _median(times[p]) for p in PHASES}
    fused = base_impl(impl) == "fused"
    if not fused:
        res["preprocess_ms"] = 0.0  # nothing to build: PyG works on edge_index directly
    summary = _timed_run_summary(ds, losses, epochs, best, times["step"], step_i, device, mem0)
    res["step_ms"] = summary.pop("step_ms")
    res["sum_ms"] = sum(res[f"{p}_ms"] for p in PHASES)
    res["preprocess_first_ms"] = first_pre if fused else 0.0
    if compiled:
        # the first step's forward + backward: tracing and code generation included
        res["compile_ms"] = compile_ms
        res["compile"] = {"dynamic": ds.kind != "full", "mode": "default",
                          "backend": str(args.compile_backend)}
    res["status"] = "ok"
    res.update(summary)
    del model, opt, step_model
    return res


def train_impl_cudagraph(ds, model_name: str, impl: str, init_state, args, device, hp,
                         capture: bool = True) -> Dict[str, object]:
    r"""Cudagraph mode (full graphs): captures one whole training step (forward,
    loss, backward, Adam step) of ``impl`` in a CUDA graph and trains by replaying
    it, one replay per epoch, timing each replay.

    Capture follows PyTorch's whole-network recipe: the inputs are the graph's own
    device tensors (they never change, so they are the static inputs); Adam is
    ``capturable``; ``CAPTURE_WARMUP`` eager steps run on a side stream; gradients
    are set to ``None`` just before capture, so the captured backward allocates
    them in the graph's pool and each replay overwrites them (no ``zero_grad``
    between replays). :func:`reset_training_state` then undoes the warm-up steps,
    so the first replay starts from ``init_state`` like the eager run. Everything
    data-dependent is done once before the capture: the fused layout
    (``get_layout``), the native model's self-loops
    (:func:`native_graph_edge_index`, conv built with ``add_self_loops=False``)
    and the training-node indices of the loss.

    Besides the keys of :func:`train_impl` that are not per phase, the result has
    ``capture_ms`` (the ``torch.cuda.graph`` block: capture + instantiation),
    ``capture_warmup_ms`` (the side-stream warm-up steps), ``setup_ms`` (once,
    before capture: the fused layout lookup, a cache hit when the eager run built
    it, or the native self-loop insertion), ``edges`` (of the ``edge_index`` the
    model reads) and ``self_loops`` (where they are added).

    ``capture=False`` runs the same step function eagerly (``zero_grad`` before
    each call) in place of the replays; only used to test this bookkeeping on CPU.

    Raises:
        CaptureError: the capture failed (for example a host sync inside the step).
    """
    from pyg_dfgnn.layout_cache import get_layout

    if ds.kind != "full":
        raise ValueError(CUDAGRAPH_SKIP)
    if capture and device.type != "cuda":
        raise ValueError("CUDA graph capture needs a CUDA device")
    loops = SELF_LOOPS[model_name]
    native_loops = impl == "native" and loops
    _seed(args.seed)
    model = build_model(model_name, impl, ds.in_channels, ds.num_classes, args, hp["dropout"],
                        conv_kw={"add_self_loops": False} if native_loops else None)
    model.load_state_dict(init_state)
    model.to(device).train()
    opt = make_optimizer(model, hp, args, capturable=capture)
    mem0 = _memory_baseline(device)

    st = next(iter(ds.steps(0)))
    n = st.x.size(0)
    _sync(device)
    t0 = time.perf_counter()
    fused = base_impl(impl) == "fused"
    if fused:
        get_layout(st.edge_index, (n, n), add_self_loops=loops)
        edge_index = st.edge_index
    else:
        edge_index = native_graph_edge_index(st.edge_index, n) if native_loops else st.edge_index
    _sync(device)
    prep_ms = (time.perf_counter() - t0) * 1e3
    x = st.x
    idx = None if st.mask is None else st.mask.nonzero().view(-1)
    target = st.y if idx is None else st.y.index_select(0, idx)

    def train_step():
        out = model(x, edge_index)
        loss = F.cross_entropy(out if idx is None else out.index_select(0, idx), target)
        loss.backward()
        opt.step()
        return out, loss

    _seed(args.seed + 1)
    res: Dict[str, object] = {
        "captured": bool(capture), "setup_ms": prep_ms, "edges": int(edge_index.size(1)),
        "self_loops": (None if not loops else "fused layout (get_layout, before capture)"
                       if fused else "pre-added to edge_index before capture; "
                                     "conv built with add_self_loops=False")}
    static: Dict[str, Tensor] = {}
    graph = None
    if capture:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        _sync(device)
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP):
                opt.zero_grad(set_to_none=True)
                train_step()
        torch.cuda.current_stream(device).wait_stream(side)
        _sync(device)
        res["capture_warmup_ms"] = (time.perf_counter() - t0) * 1e3
        res["capture_warmup_steps"] = CAPTURE_WARMUP
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # the captured backward allocates the grads
        main_stream = torch.cuda.current_stream(device)
        t0 = time.perf_counter()
        try:
            with torch.cuda.graph(graph):
                static["out"], static["loss"] = train_step()
            _sync(device)
        except Exception as e:  # noqa: BLE001  (reported per impl by the caller)
            # a failing capture_end leaves torch.cuda.graph's capture stream current
            torch.cuda.set_stream(main_stream)
            raise CaptureError(_chain(e)[-1]) from e
        res["capture_ms"] = (time.perf_counter() - t0) * 1e3
        reset_training_state(model, opt, init_state)  # undo the warm-up steps

        def run():
            graph.replay()
    else:
        res["capture_ms"] = None

        def run():
            opt.zero_grad(set_to_none=True)
            static["out"], static["loss"] = train_step()

    times: List[float] = []
    losses: List[float] = []
    epochs: List[Dict[str, float]] = []
    best = None
    for epoch in range(hp["epochs"]):
        _sync(device)
        t0 = time.perf_counter()
        run()
        _sync(device)
        t1 = time.perf_counter()
        if epoch >= hp["warmup"]:
            times.append((t1 - t0) * 1e3)
        losses.append(float(static["loss"].detach().item()))
        with torch.no_grad():
            acc = ds.train_acc(static["out"].detach(), st)
        ev = ds.evaluate(model, edge_index=edge_index)
        epochs.append({"epoch": epoch + 1, "loss": losses[-1], "train_acc": acc, **ev})
        best = _better(ds, ev, best, epoch)
    res.update(_timed_run_summary(ds, losses, epochs, best, times, hp["epochs"], device, mem0))
    static.clear()
    del graph, model, opt
    return res


def _hparams(ds, args) -> Dict[str, float]:
    batch = ds.kind == "batch"
    pick = (lambda v, b, f: v if v is not None else (b if batch else f))
    return {"epochs": args.epochs if batch else args.full_epochs,
            "lr": pick(args.lr, 2e-3, 5e-3),
            "weight_decay": pick(args.weight_decay, 0.0, 5e-4),
            "dropout": pick(args.dropout, 0.0, 0.5),
            "warmup": args.warmup}


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


# ------------------------------------------------------------------------- report
def _info(device: torch.device, args, argv) -> Dict[str, object]:
    import torch_geometric

    import pyg_dfgnn
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = f"CPU ({platform.processor() or platform.machine() or 'unknown'}, " \
              f"{torch.get_num_threads()} threads)"
    return {"gpu": gpu, "device": str(device), "torch": torch.__version__,
            "cuda": torch.version.cuda, "torch_geometric": torch_geometric.__version__,
            "pyg_dfgnn": pyg_dfgnn.__version__,
            "cuda_kernels": bool(pyg_dfgnn.has_cuda_kernels() and device.type == "cuda"),
            "date": time.strftime("%Y-%m-%d"), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": platform.node(), "quick": bool(args.quick), "argv": list(argv)}


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _has_eager(r) -> bool:
    return bool(r.get("impls"))


def format_tables(report: Dict[str, object]) -> str:
    r"""One table per model in the layout of the paper's Table 2: ``fused (native)``
    per dataset. Eager phases when eager results exist; then, when any row has a
    ``cudagraph`` key, the captured step time, its speedup, capture time and test
    accuracy (``skipped`` for batch datasets, ``err`` for a failed run); then, for
    the compiled impls present, their step, forward / backward and compile time
    (``cfail``: the compiler failed) and fused's speedup over compiled native."""
    out = []
    rows = report["rows"]
    for model in dict.fromkeys(r["model"] for r in rows):
        mrows = [r for r in rows if r["model"] == model]
        head = ["ms / step: fused (native)"] + [r["dataset"] for r in mrows]
        lines = [head]

        def pair(fu, na, fn):
            a = "err" if "error" in fu else fn(fu)
            b = "err" if "error" in na else fn(na)
            return f"{a} ({b})"

        def cell(r, fn):
            imp = r["impls"]
            return pair(imp.get("fused", {}), imp.get("native", {}), fn)

        def cg_cell(r, fn):
            cg = r.get("cudagraph")
            if cg is None:
                return "-"
            if "skipped" in cg:
                return "skipped"
            return pair(cg.get("fused", {}), cg.get("native", {}), fn)

        if any(_has_eager(r) for r in mrows):
            for p in PHASES:
                lines.append([p.capitalize()] + [cell(r, lambda d, p=p: _f(d.get(f"{p}_ms")))
                                                 for r in mrows])
            lines.append(["Step (median)"] + [cell(r, lambda d: _f(d.get("step_ms")))
                                              for r in mrows])
            lines.append(["Speedup"] + [_f(r.get("speedup", {}).get("step"), "{:.2f}x")
                                        for r in mrows])
            lines.append(["Peak memory MB"] + [cell(r, lambda d: _f(d.get("peak_MB"), "{:.0f}"))
                                               for r in mrows])
            lines.append(["Test acc"] + [cell(r, lambda d: _f(d.get("test_acc"), "{:.3f}"))
                                         for r in mrows])
            lines.append(["Final loss"] + [cell(r, lambda d: _f(d.get("final_loss"), "{:.3f}"))
                                           for r in mrows])
        for impl, label in (("native_compile", "native"), ("fused_compile", "fused")):
            if not any(impl in r.get("impls", {}) for r in mrows):
                continue

            def one(r, fn, impl=impl):
                d = r.get("impls", {}).get(impl)
                if d is None:
                    return "-"
                return "cfail" if d.get("status") == "compile_failed" else \
                    "err" if "error" in d else fn(d)
            lines.append([f"Compiled {label}: step"] + [one(r, lambda d: _f(d.get("step_ms")))
                                                        for r in mrows])
            lines.append([f"Compiled {label}: fwd / bwd"]
                         + [one(r, lambda d: f"{_f(d.get('forward_ms'))} / "
                                             f"{_f(d.get('backward_ms'))}") for r in mrows])
            lines.append([f"Compiled {label}: compile s"]
                         + [one(r, lambda d: _f((d.get("compile_ms") or float("nan")) / 1e3,
                                                "{:.1f}")) for r in mrows])
            if impl == "native_compile":
                lines.append(["Speedup vs compiled native"]
                             + [_f(r.get("speedup_vs_compiled", {}).get("step"), "{:.2f}x")
                                for r in mrows])
        if any(SEPARATE in r.get("impls", {}) for r in mrows):
            lines.append(["Separate projections: step"] + [
                "-" if d is None else "err" if "error" in d else _f(d.get("step_ms"))
                for d in (r.get("impls", {}).get(SEPARATE) for r in mrows)])
            lines.append(["Joined projection speedup"] + [
                _f(r.get("projection_speedup", {}).get("step"), "{:.2f}x") for r in mrows])
        if any("cudagraph" in r for r in mrows):
            lines.append(["CUDA graph: step (median)"]
                         + [cg_cell(r, lambda d: _f(d.get("step_ms"))) for r in mrows])

            def cg_speedup(r):
                sp = (r.get("cudagraph") or {}).get("speedup", {}).get("step")
                return "skipped" if "skipped" in (r.get("cudagraph") or {}) else \
                    _f(sp, "{:.2f}x")

            lines.append(["CUDA graph: speedup"] + [cg_speedup(r) for r in mrows])
            if any("projection_speedup" in (r.get("cudagraph") or {}) for r in mrows):
                lines.append(["CUDA graph: joined proj. speedup"] + [_f(
                    (r.get("cudagraph") or {}).get("projection_speedup", {}).get("step"),
                    "{:.2f}x") for r in mrows])
            lines.append(["CUDA graph: capture ms"]
                         + [cg_cell(r, lambda d: _f(d.get("capture_ms"), "{:.1f}"))
                            for r in mrows])
            lines.append(["CUDA graph: peak memory MB"]
                         + [cg_cell(r, lambda d: _f(d.get("peak_MB"), "{:.0f}")) for r in mrows])
            lines.append(["CUDA graph: test acc"]
                         + [cg_cell(r, lambda d: _f(d.get("test_acc"), "{:.3f}"))
                            for r in mrows])
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
        out.append(f"\n{model.upper()} model, {report['info']['gpu']}, torch "
                   f"{report['info']['torch']}, {report['info']['date']}")
        for k, line in enumerate(lines):
            out.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths)))
            if k == 0:
                out.append("  ".join("-" * w for w in widths))
        errors = [f"  {r['dataset']} {mode}/{impl}: {group[impl]['error']}"
                  for r in mrows for mode, group in (("eager", r.get("impls", {})),
                                                     ("cudagraph", r.get("cudagraph") or {}))
                  for impl in ALL_IMPLS
                  if isinstance(group.get(impl), dict) and "error" in group[impl]]
        if errors:
            out.append("errors:")
            out.extend(errors)
    return "\n".join(out)


# ----------------------------------------------------------------------------- CLI
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    from benchmarks import cli, datasets
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.e2e",
        description="End-to-end training benchmark (DF-GNN paper Table 2): the same GT / GAT / "
                    "AGNN model with native PyG convs and with the fused pyg_dfgnn convs, same "
                    "initial weights; median time per training step split into preprocess "
                    "(layout), forward, backward and optimizer, peak memory, loss and accuracy.",
        epilog="modes:\n"
               "  eager      plain PyTorch training loop; the two runs differ only in the conv\n"
               "             class imported. On small full graphs (Cora, CiteSeer, PubMed) the\n"
               "             step is bound by Python / kernel-launch overhead of the dense ops,\n"
               "             which is the same for both implementations.\n"
               "  cudagraph  full graphs only: both implementations replay their whole training\n"
               "             step (forward, loss, backward, Adam step) as one captured CUDA\n"
               "             graph, which removes that overhead. Changes, for both: the loss\n"
               "             indexes the training nodes with precomputed indices instead of a\n"
               "             boolean mask; Adam is capturable. For native GAT / AGNN only: the\n"
               "             self-loops the conv would add in every forward (a host sync) are\n"
               "             added to edge_index once, before capture, and the conv is built\n"
               "             with add_self_loops=False (the same graph and function).\n"
               "  both       eager, then cudagraph (default on CUDA; CPU: eager only)\n"
               "\n"
               "examples:\n"
               "  python -m benchmarks.e2e --out e2e.json\n"
               "  python -m benchmarks.e2e --quick                  # CPU smoke run, tiny sizes\n"
               "  python -m benchmarks.e2e --datasets pattern,cora --models gt --epochs 5\n"
               "  python -m benchmarks.e2e --datasets cora,citeseer,pubmed --mode cudagraph\n"
               "  python -m benchmarks.e2e --models gt --impls fused,fused_separate\n"
               "  python -m benchmarks.plot --e2e e2e.json --out-dir plots",
        formatter_class=cli.HelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (64 train graphs, batch 32, hidden 32, 2 layers, 2 epochs): "
                        "a CPU smoke run in well under 2 minutes")
    p.add_argument("--out", default="e2e.json", help="JSON output path (default: e2e.json)")
    datasets.add_data_argument(p, "Planetoid/Cora, CiteSeer and PubMed")
    p.add_argument("--datasets", default=",".join(DATASETS),
                   help=f"comma-separated subset of {','.join(DATASETS)} (default: all)")
    p.add_argument("--models", default=",".join(MODELS),
                   help="comma-separated subset of gt,gat,agnn (default: all)")
    p.add_argument("--impls", default=None,
                   help=f"comma-separated subset of {','.join(ALL_IMPLS)}; *_compile is the "
                        "whole model under torch.compile, eager mode only; fused_separate is "
                        "fused with separate projection GEMMs (default: "
                        "native,fused,native_compile on CUDA; native,fused on CPU)")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 in fp32 matmuls, for every impl alike (default: off)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend of the *_compile impls (default: inductor)")
    cli.add_device_argument(p)
    p.add_argument("--mode", choices=("eager", "cudagraph", "both"), default=None,
                   help="eager training steps, captured CUDA-graph steps (full graphs only), or "
                        "both (default: both on CUDA, eager on CPU; cudagraph needs CUDA)")
    p.add_argument("--adam", choices=("foreach", "fused"), default=None,
                   help="Adam implementation, the same for both convs and both modes "
                        "(default: fused on CUDA, foreach on CPU)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs on the batch datasets (default: 10, i.e. 100 steps with the "
                        "default graphs and batch size; --quick: 2)")
    p.add_argument("--full-epochs", type=int, default=None,
                   help="epochs (= steps) on the full graphs (default: 100; --quick: 3)")
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the medians (default: 5; --quick: 1)")
    p.add_argument("--train-graphs", type=int, default=None,
                   help="generated training graphs for pattern/cluster "
                        "(default: 10000; --quick: 64)")
    p.add_argument("--test-graphs", type=int, default=None,
                   help="generated test graphs (default: 1024; --quick: 32)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="graphs per step (default: 1024 as in the paper; --quick: 32)")
    p.add_argument("--hidden", type=int, default=None,
                   help="hidden size (default: 128; --quick: 32)")
    p.add_argument("--heads", type=int, default=4, help="attention heads of GT/GAT (default: 4)")
    p.add_argument("--gt-layers", type=int, default=None, help="GT layers (default: 4; --quick: 2)")
    p.add_argument("--gat-layers", type=int, default=None,
                   help="GAT layers (default: 3; --quick: 2)")
    p.add_argument("--norm", choices=("batch", "layer"), default="batch",
                   help="normalisation in the GT layers (default: batch)")
    p.add_argument("--dropout", type=float, default=None,
                   help="feature dropout (default: 0 on batch datasets, 0.5 on full graphs); "
                        "attention dropout is always 0")
    p.add_argument("--lr", type=float, default=None,
                   help="Adam learning rate (default: 2e-3 batch, 5e-3 full)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="Adam weight decay (default: 0 batch, 5e-4 full)")
    p.add_argument("--strategy", choices=("auto", "smmf", "pmf"), default="auto",
                   help="fusion method of the fused layers (default: auto)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    cli.add_progress_argument(p)
    p.add_argument("--resume", action="store_true",
                   help="keep the rows of --out and run only what it lacks (module docstring)")
    args = p.parse_args(argv)
    defaults = dict(epochs=(2, 10), full_epochs=(3, 100), warmup=(1, 5), train_graphs=(64, 10000),
                    test_graphs=(32, 1024), batch_size=(32, 1024), hidden=(32, 128),
                    gt_layers=(2, 4), gat_layers=(2, 3))
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    args.datasets = [d.strip().lower() for d in args.datasets.split(",") if d.strip()]
    args.models = [m.strip().lower() for m in args.models.split(",") if m.strip()]
    args.device = str(cli.pick_device("benchmarks.e2e", args.device, args.quick))
    cuda = torch.device(args.device).type == "cuda"
    if args.impls is None:
        args.impls = ",".join(IMPLS + (("native_compile",) if cuda else ()))
    args.impls = [i.strip().lower() for i in args.impls.split(",") if i.strip()]
    for name, vals, ok in (("--datasets", args.datasets, DATASETS),
                           ("--models", args.models, MODELS), ("--impls", args.impls, ALL_IMPLS)):
        bad = [v for v in vals if v not in ok]
        if bad or not vals:
            p.error(f"{name}: unknown {bad or 'empty list'}; choose from {','.join(ok)}")
    if args.hidden % args.heads:
        p.error("--hidden must be divisible by --heads")
    if args.epochs < 1 or args.full_epochs < 1:
        p.error("--epochs and --full-epochs must be >= 1")
    if args.mode is None:
        args.mode = "both" if cuda else "eager"
    if args.mode != "eager" and not cuda:
        p.error(f"--mode {args.mode}: CUDA-graph capture needs a CUDA device "
                f"(device is {args.device}); use --mode eager")
    if args.adam is None:
        args.adam = "fused" if cuda else "foreach"
    args.modes = list(MODES) if args.mode == "both" else [args.mode]
    return args


#: Settings a ``--resume`` run may change: what it runs, not how.
RESUME_FREE = ("datasets", "models", "impls", "mode")
#: ``info`` entries a resumed file and the new process must share.
RESUME_SAME = ("gpu", "torch", "cuda", "torch_geometric", "pyg_dfgnn", "cuda_kernels",
               "allow_tf32", "float32_matmul_precision")


def _row_key(row: Dict[str, object]) -> Tuple[str, str]:
    return row["key"], row["model"]


def _complete(row: Optional[Dict[str, object]]) -> bool:
    """Whether a recorded row needs no more runs (its process kept a usable GPU)."""
    return row is not None and not row.get("cuda_context_lost")


def resume_report(path: str, report: Dict[str, object]) -> Dict[Tuple[str, str], dict]:
    r"""The rows of the earlier report at ``path`` by ``(dataset key, model)``, after
    checking it against this run's ``report`` (settings other than
    :data:`RESUME_FREE`, and :data:`RESUME_SAME` of ``info``). ``report`` takes
    the file's ``info`` with a ``processes`` list (each process's time, argv and
    rows, this one last) and the union of the datasets, models, impls and modes.
    Raises ``ValueError`` where the file and this run differ."""
    with open(path) as f:
        prev = json.load(f)
    info, config = report["info"], report["config"]
    for key in RESUME_SAME:
        if prev["info"].get(key) != info.get(key):
            raise ValueError(f"--resume: {path} was made with {key} = "
                             f"{prev['info'].get(key)!r}, this run has {info.get(key)!r}")
    for key, value in config.items():
        if key not in RESUME_FREE and key in prev["config"] and prev["config"][key] != value:
            raise ValueError(f"--resume: {path} was made with {key} = "
                             f"{prev['config'][key]!r}, this run has {value!r}")
    processes = prev["info"].get("processes") or [
        {"time": prev["info"].get("time"), "argv": prev["info"].get("argv"),
         "rows": [f"{r['dataset']}/{r['model']}" for r in prev["rows"]]}]
    first = {k: v for k, v in prev["info"].items() if k not in ("time", "argv", "processes")}
    report["info"] = {**first, "processes": processes + [
        {"time": info["time"], "argv": info["argv"], "rows": []}]}
    for key, names in (("datasets", DATASETS), ("models", MODELS), ("impls", ALL_IMPLS)):
        both = set(prev["config"].get(key, ())) | set(config[key])
        config[key] = [n for n in names if n in both]
    modes = {m for c in (prev["config"], config) for m in
             (MODES if c.get("mode") == "both" else (c.get("mode"),))}
    config["mode"] = "both" if set(MODES) <= modes else config["mode"]
    config.update({k: v for k, v in prev["config"].items() if k not in config})
    return {_row_key(r): r for r in prev["rows"]}


def _guarded(fn, device: torch.device) -> Dict[str, object]:
    r"""``fn()``, or ``{"error": ...}`` when it fails on CUDA (or runs out of memory
    anywhere), so one failing run does not lose the others. A failed capture is
    ``{"error": "capture failed: <root cause>", "error_chain": [...]}``."""
    try:
        return fn()
    except CaptureError as e:
        return {"error": f"capture failed: {e}", "error_chain": _chain(e.__cause__)}
    except CompileError as e:
        return {"status": "compile_failed", "error": f"compile failed: {e}",
                "error_chain": _chain(e.__cause__)}
    except Exception as e:  # noqa: BLE001  (recorded, not dropped)
        if not (_is_oom(e) or device.type == "cuda"):
            raise
        return {"error": _chain(e)[0]}
    finally:
        if device.type == "cuda":
            try:
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001  (a lost context is recorded by the caller)
                pass


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    r"""Runs the benchmark; returns the report (also written to ``--out``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from benchmarks import cli
    from benchmarks.kernels import cuda_context_ok, set_matmul_precision

    device = torch.device(args.device)
    report: Dict[str, object] = {
        "info": {**_info(device, args, argv), **set_matmul_precision(args.tf32)},
        "config": {k: getattr(args, k) for k in (
            "datasets", "models", "impls", "mode", "adam", "epochs", "full_epochs", "warmup",
            "train_graphs", "test_graphs", "batch_size", "hidden", "heads", "gt_layers",
            "gat_layers", "norm", "dropout", "lr", "weight_decay", "strategy", "seed",
            "compile_backend")},
        "rows": [],
    }
    if "cudagraph" in args.modes:
        report["config"]["capture_warmup_steps"] = CAPTURE_WARMUP
    out_path = args.out
    rows: Dict[Tuple[str, str], dict] = {}
    if args.resume and out_path and os.path.exists(out_path):
        try:
            rows = resume_report(out_path, report)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    # (dataset, model) pairs this process runs
    todo = [(d, m) for d in args.datasets for m in args.models if not _complete(rows.get((d, m)))]

    def order_rows():
        report["rows"] = sorted(rows.values(), key=lambda r: (DATASETS.index(r["key"]),
                                                              MODELS.index(r["model"])))

    def add_row(row):
        rows[_row_key(row)] = row
        order_rows()
        if "processes" in report["info"]:
            report["info"]["processes"][-1]["rows"].append(f"{row['dataset']}/{row['model']}")
        save()

    order_rows()

    def save():
        if out_path:
            d = os.path.dirname(os.path.abspath(out_path))
            os.makedirs(d, exist_ok=True)
            with open(out_path, "w") as f:
                json.dump(report, f, indent=1)

    eager = "eager" in args.modes
    graphed = "cudagraph" in args.modes
    graph_impls = [i for i in args.impls if i not in COMPILED_IMPLS]  # captured: eager models
    runs = sum(len(args.impls) * eager
               + len(graph_impls) * (graphed and d not in ("pattern", "cluster"))
               for d, _ in todo)
    bar = cli.progress(total=runs, show=not args.no_progress, desc="e2e")

    def progress(r):
        if "error" not in r:
            bar.set_postfix(step_ms=f"{r['step_ms']:.2f}", acc=f"{r['test_acc']:.3f}")
        bar.update(1)

    stopped = False
    for dname in args.datasets:
        models = [m for d, m in todo if d == dname]
        if not models:
            continue
        bar.set_description(f"e2e {LABELS[dname]}: loading")
        ds = load_dataset(dname, args, device)
        hp = _hparams(ds, args)
        for model_name in models:
            row = {"dataset": LABELS[dname], "key": dname, "kind": ds.kind, "model": model_name,
                   "nodes": ds.nodes, "edges": ds.edges, "graphs_per_step": ds.graphs_per_step,
                   "steps_per_epoch": ds.steps_per_epoch, "metric": ds.metric,
                   "features": ds.features, "hparams": hp, "impls": {}}
            lost = (rows.get((dname, model_name)) or {}).get("cuda_context_lost")
            if lost:  # the fault of an earlier process stays this impl's result
                row["impls"][lost] = rows[(dname, model_name)]["impls"][lost]
                row["context_lost_earlier"] = lost
            _seed(args.seed)
            native = build_model(model_name, "native", ds.in_channels, ds.num_classes, args,
                                 hp["dropout"])
            init_state = copy.deepcopy(native.state_dict())
            del native
            for impl in args.impls if eager else ():
                if impl in row["impls"]:
                    continue
                bar.set_description(f"e2e {LABELS[dname]}/{model_name}/{impl}")
                row["impls"][impl] = _guarded(
                    lambda: train_impl(ds, model_name, impl, init_state, args, device, hp), device)
                progress(row["impls"][impl])
                if "error" in row["impls"][impl] and not cuda_context_ok(device):
                    # a fault in generated code leaves the process without a usable GPU
                    row["cuda_context_lost"] = impl
                    break
            impls = row["impls"]
            na, fu = impls.get("native", {}), impls.get("fused", {})
            ratios = {"speedup": ("native", ("step", "forward", "backward", "sum")),
                      # fused (eager) against the compiled native model: the yardstick
                      "speedup_vs_compiled": ("native_compile", PHASE_TIMES),
                      "projection_speedup": (SEPARATE, PHASE_TIMES)}
            for key, (slow, phases) in ratios.items():
                r = time_ratios(impls.get(slow, {}), fu, phases)
                if r:
                    row[key] = r
            if "speedup" in row and na.get("peak_MB") and fu.get("peak_MB"):
                row["memory_ratio"] = na["peak_MB"] / fu["peak_MB"]
            if row.get("cuda_context_lost"):
                add_row(row)
                print(f"# {LABELS[dname]}/{model_name}/{row['cuda_context_lost']} left the CUDA "
                      "context unusable (recorded); stopping: run the same command with "
                      "--resume in a new process for the rest", file=sys.stderr)
                stopped = True
                break
            if graphed and ds.kind != "full":
                row["cudagraph"] = {"skipped": CUDAGRAPH_SKIP}
            elif graphed:
                cg: Dict[str, object] = {}
                for impl in graph_impls:
                    bar.set_description(f"e2e {LABELS[dname]}/{model_name}/{impl}/cudagraph")
                    cg[impl] = _guarded(lambda: train_impl_cudagraph(
                        ds, model_name, impl, init_state, args, device, hp), device)
                    progress(cg[impl])
                for key, slow in (("speedup", "native"), ("projection_speedup", SEPARATE)):
                    r = time_ratios(cg.get(slow, {}), cg.get("fused", {}), ("step",))
                    if r:
                        cg[key] = r
                # how much capture saves each implementation against its eager step
                cg["vs_eager"] = {impl: row["impls"][impl]["step_ms"] / cg[impl]["step_ms"]
                                  for impl in graph_impls
                                  if "step_ms" in row["impls"].get(impl, {})
                                  and "step_ms" in cg[impl]}
                row["cudagraph"] = cg
            add_row(row)
        del ds
        if stopped:
            break
    bar.close()
    info = report["info"]
    print(f"# e2e: {info['gpu']}, torch {info['torch']} (CUDA {info['cuda']}), "
          f"fused kernels: {'yes' if info['cuda_kernels'] else 'no (reference path)'}, "
          f"Adam {args.adam}, mode {args.mode}, {info['date']}")
    print(format_tables(report))
    save()
    if out_path:
        print(f"\nresults written to {out_path}")
    return report


if __name__ == "__main__":
    from benchmarks.datasets import exit_on_missing_data
    with exit_on_missing_data():
        main()
    sys.exit(0)
