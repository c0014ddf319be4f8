r"""Mini-batch training on ogbn-arxiv with PyG's NeighborLoader, native PyG and
fused side by side.

A plain PyG model (GATConv, TransformerConv or AGNNConv layers) is built once;
:func:`pyg_dfgnn.nn.fuse` turns a copy of it into the fused model, with the same
initial parameters. Both are trained on the same batches (same seed) and report
validation and test accuracy, which agree within noise, and the time per epoch.

ogbn-arxiv has no node features offline: both models learn a 128-dim embedding per
node (``nn.Embedding``) as their input.

.. code-block:: bash

    python examples/train_minibatch.py --data DIR --epochs 5
    python examples/train_minibatch.py --quick            # a few batches, one epoch

``--data`` (or ``$PYG_DFGNN_DATA``) is the folder holding ``ogbn-arxiv/``; without
either, the ``ogb`` package downloads it. The batches come from PyG's
``NeighborLoader`` where ``pyg-lib`` or ``torch_sparse`` is installed (its sampler
needs one of them), else from a stand-in sampler with the same conventions
(:class:`benchmarks.minibatch.StandInSampler`); the run says which.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from benchmarks import cli  # noqa: E402  (before torch_geometric: quiets its import)
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE  # noqa: E402

from benchmarks.datasets import add_data_argument, exit_on_missing_data, ogbn_arxiv  # noqa: E402
from benchmarks.minibatch import FEATURES, Net, StandInSampler  # noqa: E402
from pyg_dfgnn.nn import fuse  # noqa: E402


class Model(torch.nn.Module):
    """A learned 128-dim embedding per node, then the attention layers (plain PyG
    convs: :class:`benchmarks.minibatch.Net`, 4 heads, hidden 256)."""

    def __init__(self, kind: str, num_nodes: int, num_classes: int, layers: int):
        super().__init__()
        self.emb = torch.nn.Embedding(num_nodes, FEATURES)
        self.net = Net(kind, layers, num_classes)

    def forward(self, n_id, edge_index):
        return self.net(self.emb(n_id), edge_index)


def loader(data, nodes, fanouts, batch_size, shuffle, seed):
    gen = torch.Generator().manual_seed(seed)
    if WITH_PYG_LIB or WITH_TORCH_SPARSE:
        from torch_geometric.loader import NeighborLoader
        return NeighborLoader(data, num_neighbors=fanouts, input_nodes=nodes,
                              batch_size=batch_size, shuffle=shuffle, generator=gen)
    sampler = StandInSampler(data.edge_index, data.num_nodes, seed)
    order = nodes[torch.randperm(nodes.numel(), generator=gen)] if shuffle else nodes

    class Batches:  # drawn lazily, like a loader
        def __len__(self):
            return -(-order.numel() // batch_size)

        def __iter__(self):
            for chunk in order.split(batch_size):
                b = sampler(chunk, fanouts)
                b.y = data.y[b.n_id]
                yield b
    return Batches()


def run_epoch(model, batches, opt, device, train: bool, desc: str, limit: int):
    model.train(train)
    # Sums stay on the device: reading them every step would synchronise it.
    correct = loss_sum = torch.zeros((), device=device)
    total = 0
    t0 = time.perf_counter()
    with torch.set_grad_enabled(train):
        for i, b in enumerate(cli.progress(batches, desc=desc, leave=False,
                                           total=min(len(batches), limit))):
            if i >= limit:
                break
            b = b.to(device)
            out = model(b.n_id, b.edge_index)[:b.batch_size]
            y = b.y[:b.batch_size]
            loss = F.cross_entropy(out, y)
            if train:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            loss_sum = loss_sum + loss.detach() * y.numel()
            correct = correct + (out.argmax(-1) == y).sum()
            total += y.numel()
    loss_sum, correct = float(loss_sum), int(correct)  # one synchronisation per epoch
    return loss_sum / max(total, 1), correct / max(total, 1), time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(prog="examples/train_minibatch.py",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=cli.HelpFormatter)
    add_data_argument(p, "ogbn-arxiv/")
    p.add_argument("--model", choices=["gat", "gt", "agnn"], default="gat",
                   help="gat: GATConv, gt: TransformerConv, agnn: AGNNConv layers")
    p.add_argument("--epochs", type=int, default=5, help="training epochs")
    p.add_argument("--batch-size", type=int, default=1024, help="seed nodes per batch")
    p.add_argument("--fanouts", default="10,10", help="neighbours per hop, one layer per hop")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--quick", action="store_true", help="one epoch of 20 batches")
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is available (use --device cpu)")
    device = torch.device(a.device)
    if a.quick:
        a.epochs = 1
    limit = 20 if a.quick else 1 << 30
    fanouts = [int(f) for f in a.fanouts.split(",")]

    with exit_on_missing_data():
        data = ogbn_arxiv(a.data)  # the data folder holding ogbn-arxiv/
    data.n_id = torch.arange(data.num_nodes)
    num_classes = int(data.y.max()) + 1
    if WITH_PYG_LIB or WITH_TORCH_SPARSE:
        print("batches: PyG's NeighborLoader")
    else:
        print("batches: a stand-in sampler with NeighborLoader's conventions (NeighborLoader "
              "needs pyg-lib or torch_sparse, neither is installed)")

    torch.manual_seed(a.seed)
    native = Model(a.model, data.num_nodes, num_classes, len(fanouts)).to(device)
    report = fuse(copy.deepcopy(native), inplace=False)
    print(report)
    models = {"native": native, "fused": report.model}
    opts = {k: torch.optim.Adam(m.parameters(), lr=a.lr) for k, m in models.items()}
    split = {k: data[f"{k}_mask"].nonzero().flatten() for k in ("train", "val", "test")}

    for epoch in range(1, a.epochs + 1):
        line = [f"epoch {epoch}"]
        for name, model in models.items():
            torch.manual_seed(a.seed + epoch)  # the same batches for both models
            train = loader(data, split["train"], fanouts, a.batch_size, True, a.seed + epoch)
            loss, _, secs = run_epoch(model, train, opts[name], device, True,
                                      f"{name} train", limit)
            accs = []
            for part in ("val", "test"):
                batches = loader(data, split[part], fanouts, 4096, False, a.seed)
                accs.append(run_epoch(model, batches, None, device, False,
                                      f"{name} {part}", limit)[1])
            line.append(f"{name}: loss {loss:.4f} val {accs[0]:.4f} test {accs[1]:.4f} "
                        f"({secs:.1f} s)")
        tqdm.write(" | ".join(line))


if __name__ == "__main__":
    main()
