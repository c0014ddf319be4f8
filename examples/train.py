r"""Trains a 2-layer attention GNN on Cora with PyG's native convs and with the
fused pyg_dfgnn convs, and compares accuracy and epoch time.

    python examples/train.py                          # GT (TransformerConv), both impls
    python examples/train.py --model gat --impl fused
    python examples/train.py --help

The two implementations build the same architecture from different conv classes
(``torch_geometric.nn.TransformerConv`` vs.
``pyg_dfgnn.nn.FusedTransformerConv`` and so on) and start from the same
parameters, so they compute the same function; only speed and memory differ. On
the CPU the fused layers run the pure-PyTorch reference path.

Attention dropout (``gt``, ``gat``, ``gatv2``) is where the two runs part: the
fused layers draw the dropout mask themselves (on a GPU inside the kernel, from
a seed taken from torch's generator; on the CPU over the edges in the layout's
order, sorted by destination), so from the same seed they drop other attention
weights than PyG's layers do, and their accuracies differ as two seeds' would
(``--model gat --epochs 50`` on the CPU: test accuracy 0.801 native, 0.831
fused). ``--dropout 0`` turns every dropout off, and the two runs then train
alike (0.812 both).

Models (``--model``):

* ``gt``: 2x TransformerConv (graph transformer attention, dot-product scores):
  8 heads x 8 channels (concatenated), ELU, then 1 head with the class scores;
  dropout 0.6 on the input features and on the attention weights.
* ``gat``: the GAT of Velickovic et al. for Cora, as in PyG's ``examples/gat.py``:
  GATConv(F, 8, heads=8, dropout=0.6), ELU, GATConv(64, C, heads=1,
  concat=False, dropout=0.6), dropout 0.6 on the features.
* ``gatv2``: the same network with GATv2Conv (Brody et al.'s dynamic attention).
* ``agnn``: PyG's ``examples/agnn.py``: Linear(F, 16), ReLU,
  AGNNConv(requires_grad=False), AGNNConv(requires_grad=True), Linear(16, C),
  dropout 0.5.

Test accuracy is reported at the epoch with the best validation accuracy. The
epoch time covers forward, backward and the optimizer step (with
``torch.cuda.synchronize()`` on GPU); evaluation is not timed.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import random
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The dataset loaders live in the repository's benchmarks/ package, not in the
# installed pyg_dfgnn: make the checkout importable when run as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import cli  # noqa: E402  (before torch_geometric: quiets its import)

__all__ = ["MODELS", "IMPLS", "build_model", "conv_classes", "train_one", "parse_args", "main"]

MODELS = ("gt", "gat", "gatv2", "agnn")
IMPLS = ("native", "fused")

#: Per-model defaults for the options left unset on the command line.
_ATTENTION_NET = dict(hidden=8, heads=8, dropout=0.6, lr=0.005)  # PyG's examples/gat.py
DEFAULTS: Dict[str, Dict[str, float]] = {
    "gt": _ATTENTION_NET, "gat": _ATTENTION_NET, "gatv2": _ATTENTION_NET,
    "agnn": dict(hidden=16, heads=1, dropout=0.5, lr=0.01),  # as PyG's examples/agnn.py
}


# ---------------------------------------------------------------- models
def conv_classes(impl: str) -> Dict[str, Type[nn.Module]]:
    r"""The conv classes of an implementation: ``{"gt": ..., "gat": ..., "gatv2": ...,
    "agnn": ...}``.

    ``"native"`` gives :mod:`torch_geometric.nn`'s classes, ``"fused"`` the
    drop-in subclasses of :mod:`pyg_dfgnn.nn`.
    """
    if impl == "native":
        from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, TransformerConv
        return {"gt": TransformerConv, "gat": GATConv, "gatv2": GATv2Conv, "agnn": AGNNConv}
    if impl == "fused":
        try:
            from pyg_dfgnn.nn import (FusedAGNNConv, FusedGATConv, FusedGATv2Conv,
                                      FusedTransformerConv)
        except ImportError as e:
            raise ImportError(f"the fused layers could not be imported ({e}); "
                              "use --impl native") from e
        return {"gt": FusedTransformerConv, "gat": FusedGATConv, "gatv2": FusedGATv2Conv,
                "agnn": FusedAGNNConv}
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


class AttentionNet(nn.Module):
    r"""Two attention convs for node classification (``gt``, ``gat`` or ``gatv2``).

    Args:
        conv (type): the conv class (``TransformerConv``, ``GATConv``,
            ``GATv2Conv`` or their fused subclasses).
        in_channels (int): input feature size :math:`F`.
        hidden (int): channels per head of the first layer.
        heads (int): heads of the first layer (concatenated).
        out_channels (int): number of classes :math:`C`.
        dropout (float): dropout on the input of each layer and on the
            attention weights.
        **conv_kwargs: extra constructor arguments of both convs (e.g.
            ``strategy`` for the fused layers).
    """

    def __init__(self, conv, in_channels: int, hidden: int, heads: int, out_channels: int,
                 dropout: float, **conv_kwargs):
        super().__init__()
        self.dropout = dropout
        self.conv1 = conv(in_channels, hidden, heads=heads, dropout=dropout, **conv_kwargs)
        self.conv2 = conv(hidden * heads, out_channels, heads=1, concat=False,
                          dropout=dropout, **conv_kwargs)

    def forward(self, x: Tensor, edge_index) -> Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


class AGNNNet(nn.Module):
    r"""PyG's AGNN example: Linear, two AGNNConv propagations, Linear.

    Args:
        conv (type): ``AGNNConv`` or ``FusedAGNNConv``.
        in_channels (int), hidden (int), out_channels (int): layer sizes.
        dropout (float): dropout before each Linear.
        **conv_kwargs: extra constructor arguments of both convs.
    """

    def __init__(self, conv, in_channels: int, hidden: int, out_channels: int,
                 dropout: float, **conv_kwargs):
        super().__init__()
        self.dropout = dropout
        self.lin1 = nn.Linear(in_channels, hidden)
        self.prop1 = conv(requires_grad=False, **conv_kwargs)
        self.prop2 = conv(requires_grad=True, **conv_kwargs)
        self.lin2 = nn.Linear(hidden, out_channels)

    def forward(self, x: Tensor, edge_index) -> Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.relu(self.lin1(x))
        x = self.prop1(x, edge_index)
        x = self.prop2(x, edge_index)
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.lin2(x)


def build_model(model: str, impl: str, in_channels: int, out_channels: int, hidden: int,
                heads: int, dropout: float, strategy: str = "auto") -> nn.Module:
    r"""Builds the ``model`` (one of :data:`MODELS`) with the conv
    classes of ``impl`` (``"native"`` or ``"fused"``). The parameters are created
    in the same order for both, so the same seed gives the same initialisation."""
    conv = conv_classes(impl)[model]
    kw = {"strategy": strategy} if impl == "fused" else {}
    if model == "agnn":
        return AGNNNet(conv, in_channels, hidden, out_channels, dropout, **kw)
    return AttentionNet(conv, in_channels, hidden, heads, out_channels, dropout, **kw)


# -------------------------------------------------------------- training
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _evaluate(model: nn.Module, data) -> Dict[str, float]:
    model.eval()
    out = model(data.x, data.edge_index)
    pred = out.argmax(dim=-1)
    res = {}
    for split in ("train", "val", "test"):
        mask = data[f"{split}_mask"]
        res[f"{split}_acc"] = float((pred[mask] == data.y[mask]).float().mean())
    res["val_loss"] = float(F.cross_entropy(out[data.val_mask], data.y[data.val_mask]))
    return res


def train_one(model: nn.Module, data, epochs: int, lr: float, weight_decay: float,
              seed: int, desc: str = "", progress: bool = True) -> Dict[str, object]:
    r"""Trains ``model`` on ``data`` (full batch, Adam, cross-entropy on
    ``train_mask``) and returns its results.

    Returns:
        dict with ``test_acc`` and ``val_acc`` (at the best validation
        accuracy; ties go to the lower validation loss), ``best_epoch``
        (1-based), ``median_epoch_ms``, ``mean_epoch_ms``, ``final_loss`` and
        the per-epoch ``losses``, ``val_accs`` and ``epoch_ms``.
    """
    device = data.x.device
    torch.manual_seed(seed)  # same dropout sequence for every implementation
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses: List[float] = []
    val_accs: List[float] = []
    times: List[float] = []
    best = {"val_acc": -1.0, "val_loss": math.inf, "test_acc": 0.0, "epoch": 0}
    bar = cli.progress(range(1, epochs + 1), show=progress, desc=desc)
    for epoch in bar:
        _sync(device)
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad(set_to_none=True)
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())

        ev = _evaluate(model, data)
        val_accs.append(ev["val_acc"])
        if (ev["val_acc"] > best["val_acc"]
                or (ev["val_acc"] == best["val_acc"] and ev["val_loss"] < best["val_loss"])):
            best = {"val_acc": ev["val_acc"], "val_loss": ev["val_loss"],
                    "test_acc": ev["test_acc"], "epoch": epoch}
        bar.set_postfix(OrderedDict(loss=f"{losses[-1]:.3f}", val_acc=f"{ev['val_acc']:.3f}",
                                    test_at_best_val=f"{best['test_acc']:.3f}",
                                    ms=f"{times[-1]:.1f}"))
    bar.close()
    return {
        "test_acc": best["test_acc"],
        "val_acc": best["val_acc"],
        "best_epoch": best["epoch"],
        "median_epoch_ms": statistics.median(times) if times else float("nan"),
        "mean_epoch_ms": statistics.fmean(times) if times else float("nan"),
        "final_loss": losses[-1] if losses else float("nan"),
        "losses": losses,
        "val_accs": val_accs,
        "epoch_ms": times,
    }


# ------------------------------------------------------------------- CLI
def parse_args(argv: Optional[Sequence[str]] = None,
               prog: Optional[str] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train a 2-layer attention GNN on Cora (public split) with PyG's native "
                    "convs and with the fused pyg_dfgnn convs (same architecture, same initial "
                    "parameters), then print test accuracy and median epoch time of each.",
        epilog="examples:\n"
               "  %(prog)s                         # GT on Cora, native vs. fused\n"
               "  %(prog)s --model gat --impl fused --epochs 300\n"
               "  %(prog)s --model agnn --device cpu --json results/agnn.json\n"
               "  %(prog)s --data DIR              # offline: DIR/Planetoid/Cora/raw/...\n"
               "\nWithout --data or $PYG_DFGNN_DATA, PyG downloads the dataset into "
               "~/.cache/pyg_dfgnn.",
        formatter_class=cli.HelpFormatter)
    p.add_argument("--model", choices=MODELS, default="gt",
                   help="gt: TransformerConv, gat: GATConv, gatv2: GATv2Conv, agnn: AGNNConv "
                        "(default: gt)")
    p.add_argument("--impl", choices=IMPLS + ("both",), default="both",
                   help="native: torch_geometric.nn convs, fused: pyg_dfgnn.nn convs, "
                        "both: train each and compare (default: both)")
    p.add_argument("--dataset", choices=("Cora", "CiteSeer"), default="Cora",
                   help="Planetoid graph, public split (default: Cora)")
    from benchmarks.datasets import add_data_argument
    add_data_argument(p, "Planetoid/<name>/raw/")
    p.add_argument("--epochs", type=int, default=200, help="training epochs (default: 200)")
    p.add_argument("--hidden", type=int, default=None,
                   help="hidden channels per head (default: 8 for gt/gat/gatv2, 16 for agnn)")
    p.add_argument("--heads", type=int, default=None,
                   help="attention heads of the first layer, gt/gat/gatv2 only (default: 8)")
    p.add_argument("--lr", type=float, default=None,
                   help="Adam learning rate (default: 0.005 for gt/gat/gatv2, 0.01 for agnn as in "
                        "PyG's AGNN example)")
    p.add_argument("--weight-decay", type=float, default=5e-4,
                   help="Adam weight decay (default: 5e-4)")
    p.add_argument("--dropout", type=float, default=None,
                   help="dropout on features and attention (default: 0.6 for gt/gat/gatv2, 0.5 "
                        "for agnn)")
    p.add_argument("--strategy", choices=("auto", "smmf", "pmf"), default="auto",
                   help="fusion method of the fused kernels on GPU: smmf (node-parallel), "
                        "pmf (edge-parallel scores) or auto, the package's choice per graph "
                        "(default: auto)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    cli.add_run_arguments(p, "config, per-impl metrics, per-epoch losses")
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.epochs < 1:
        p.error("--epochs must be >= 1")
    args.device = cli.parse_device(p, args.device)
    return args


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> Dict[str, object]:
    r"""Runs the comparison; returns the report (also written with ``--json``)."""
    args = parse_args(argv, prog=prog)
    import torch_geometric
    import torch_geometric.transforms as T

    import pyg_dfgnn
    from benchmarks import datasets

    device = args.device
    impls = list(IMPLS) if args.impl == "both" else [args.impl]

    data = datasets.planetoid(args.dataset, transform=T.NormalizeFeatures(),
                              root=args.data).to(device)
    num_classes = int(data.y.max()) + 1
    if "fused" in impls:
        conv_classes("fused")  # fail early with a clear message
        from pyg_dfgnn.transforms import CacheLayout
        # Build the CSR/CSC layouts once, before timing (the layers would otherwise
        # build them on their first call).
        data = CacheLayout()(data)

    def make(impl: str) -> nn.Module:
        _seed_everything(args.seed)
        return build_model(args.model, impl, data.num_features, num_classes, args.hidden,
                           args.heads, args.dropout, strategy=args.strategy)

    init_state = copy.deepcopy(make("native").state_dict())
    results: Dict[str, Dict[str, object]] = {}
    for impl in impls:
        model = make(impl)
        model.load_state_dict(init_state)  # identical start for both implementations
        model.to(device)
        results[impl] = train_one(model, data, args.epochs, args.lr, args.weight_decay,
                                  args.seed, desc=f"{args.model}/{impl}",
                                  progress=not args.no_progress)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    speedup = None
    if "native" in results and "fused" in results:
        speedup = results["native"]["median_epoch_ms"] / results["fused"]["median_epoch_ms"]

    # The extension is loaded and the data is on a GPU; configurations without a
    # kernel still run the reference path inside the fused layers.
    kernels = pyg_dfgnn.has_cuda_kernels() and device.type == "cuda"
    dev_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else platform.processor() or platform.machine() or "cpu")
    report = {
        "device": str(device),
        "device_name": dev_name,
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "pyg_dfgnn": pyg_dfgnn.__version__,
        "cuda_extension": kernels,
        "dataset": args.dataset,
        "model": args.model,
        "config": {k: getattr(args, k) for k in ("epochs", "hidden", "heads", "lr",
                                                 "weight_decay", "dropout", "strategy", "seed")},
        "results": results,
        "speedup": speedup,
    }

    rows = [["impl", "test acc", "best val acc (epoch)", "median epoch ms",
             "speedup (native/fused)"]]
    for impl, r in results.items():
        sp = f"{speedup:.2f}x" if (impl == "fused" and speedup is not None) else ""
        rows.append([impl, f"{r['test_acc']:.4f}", f"{r['val_acc']:.4f} ({r['best_epoch']})",
                     f"{r['median_epoch_ms']:.2f}", sp])
    print(f"\n{args.model} on {args.dataset}, {args.epochs} epochs, seed {args.seed}")
    print(f"device: {device} ({dev_name}), torch {torch.__version__}, "
          f"torch_geometric {torch_geometric.__version__}")
    if "fused" in results:
        print("fused layers: " + (
            "CUDA kernels of pyg_dfgnn._C" if kernels else
            "pure-PyTorch reference path on the CPU (times say nothing about the kernels)"
            if device.type == "cpu" else
            "PyG's own forward: no compiled kernels (python -m pyg_dfgnn info)"))
    if len(results) == 2 and args.dropout > 0 and args.model != "agnn":
        print(f"attention dropout {args.dropout}: the fused layers draw their own masks, so "
              "the two runs drop different attention weights and their accuracies differ as "
              "two seeds' would (--dropout 0: both train alike)")
    print(cli.table(rows))

    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
        print(f"results written to {path}")
    return report


def run(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Command-line entry point: runs :func:`main`, returns the exit status; a
    dataset it cannot load ends in two lines saying what to pass."""
    from benchmarks.datasets import exit_on_missing_data
    with exit_on_missing_data():
        main(argv, prog=prog)
    return 0


if __name__ == "__main__":
    sys.exit(run())
