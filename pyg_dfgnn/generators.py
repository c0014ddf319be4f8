r"""Seeded synthetic graphs with the shapes of the paper's Table 1.

Parameters follow ``../shared/data/README.md`` ("Synthetic stand-ins"):

* :func:`sbm_batch`: SBM **PATTERN** (5 communities of U{5..34} nodes, p = 0.5,
  q = 0.35, plus one planted pattern of U{5..34} nodes, internal p = 0.5,
  pattern-to-SBM q = 0.5) and **CLUSTER** (6 communities, p = 0.55, q = 0.25),
  undirected, no self-loops;
* :func:`knn_batch`: superpixel-like graphs, each node with k = 8 out-edges to
  its nearest neighbours (MNIST: 40-75 nodes, CIFAR10: 85-150 nodes), and
  region-graph-like graphs (COCO-SP / PascalVOC-SP: ~477 nodes, avg degree ~5.6);
* :func:`power_law_graph`: Chung-Lu graphs with a given number of nodes, average
  and maximum in-degree (Reddit-, Protein- and ppa-like super-node graphs).

All generators are vectorised per graph and return int64 ``edge_index`` (on CPU,
except :func:`power_law_graph` given a ``device``).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _sym_upper(prob: Tensor, g: torch.Generator) -> Tensor:
    """Samples an undirected graph from an edge-probability matrix; [2, E] both directions."""
    n = prob.size(0)
    draw = torch.rand(n, n, generator=g) < prob
    upper = torch.triu(draw, diagonal=1)
    i, j = upper.nonzero(as_tuple=True)
    return torch.stack([torch.cat([i, j]), torch.cat([j, i])])


def sbm_graph(kind: str, g: torch.Generator) -> Tuple[Tensor, Tensor, Tensor]:
    r"""One SBM PATTERN or CLUSTER graph.

    Returns:
        ``(edge_index [2, E], x [N] int64 features, y [N] int64 labels)``: PATTERN
        features in {0, 1, 2}, label 1 for pattern nodes; CLUSTER features 0
        except one node per community r with r + 1, label = community.
    """
    if kind == "pattern":
        n_comm, p, q = 5, 0.5, 0.35
    elif kind == "cluster":
        n_comm, p, q = 6, 0.55, 0.25
    else:
        raise ValueError(f"kind must be 'pattern' or 'cluster', got {kind!r}")
    sizes = torch.randint(5, 35, (n_comm,), generator=g)
    block = torch.repeat_interleave(torch.arange(n_comm), sizes)
    prob = torch.where(block[:, None] == block[None, :], p, q)
    if kind == "pattern":
        m = int(torch.randint(5, 35, (1,), generator=g))
        n_sbm = block.numel()
        n = n_sbm + m
        full = torch.full((n, n), 0.5)  # pattern-pattern p = 0.5, pattern-SBM q = 0.5
        full[:n_sbm, :n_sbm] = prob
        prob = full
        x = torch.randint(0, 3, (n,), generator=g)
        y = torch.zeros(n, dtype=torch.long)
        y[n_sbm:] = 1
    else:
        n = block.numel()
        x = torch.zeros(n, dtype=torch.long)
        first = torch.cumsum(sizes, 0) - sizes
        pick = first + (torch.rand(n_comm, generator=g) * sizes).long()
        x[pick] = torch.arange(1, n_comm + 1)
        y = block
    ei = _sym_upper(prob, g)
    perm = torch.randperm(n, generator=g)  # relabel nodes
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    return inv[ei], x[perm], y[perm]


def _batch(graphs: List[Tuple[Tensor, int]]) -> Tuple[Tensor, Tensor]:
    sizes = torch.tensor([n for _, n in graphs])
    offsets = torch.cumsum(sizes, 0) - sizes
    ei = torch.cat([e + o for (e, _), o in zip(graphs, offsets.tolist())], 1)
    batch = torch.repeat_interleave(torch.arange(len(graphs)), sizes)
    return ei, batch


def sbm_batch(kind: str, num_graphs: int = 1024, seed: int = 0):
    r"""A batch of ``num_graphs`` SBM PATTERN / CLUSTER graphs as one disjoint graph.

    Returns:
        ``(edge_index [2, E], batch [N], x [N], y [N])``.
    """
    g = _gen(seed)
    parts = [sbm_graph(kind, g) for _ in range(num_graphs)]
    ei, batch = _batch([(e, x.numel()) for e, x, _ in parts])
    return ei, batch, torch.cat([x for _, x, _ in parts]), torch.cat([y for _, _, y in parts])


def knn_graph_points(pos: Tensor, k: int) -> Tensor:
    """Directed kNN: each node gets ``k`` out-edges to its nearest other nodes
    (a complete graph without loops when it has ``k`` or fewer others)."""
    n = pos.size(0)
    kk = min(k, n - 1)
    d = torch.cdist(pos, pos)
    d.fill_diagonal_(float("inf"))
    nbr = d.topk(kk, largest=False).indices  # [n, kk]
    src = torch.arange(n).repeat_interleave(kk)
    return torch.stack([src, nbr.flatten()])


def knn_batch(kind: str, num_graphs: int = 1024, seed: int = 0) -> Tuple[Tensor, Tensor]:
    r"""Superpixel- and region-graph-like batches.

    Args:
        kind (str): ``"mnist"`` (40-75 nodes, k = 8), ``"cifar10"`` (85-150 nodes,
            k = 8), ``"coco_sp"`` / ``"pascalvoc_sp"`` (about 477 nodes, sparse
            planar-like region graphs: symmetrised 3-NN, avg degree ~5.6).

    Returns:
        ``(edge_index [2, E], batch [N])``.
    """
    g = _gen(seed)
    lo, hi, k, sym = {"mnist": (40, 76, 8, False), "cifar10": (85, 151, 8, False),
                      "coco_sp": (430, 525, 3, True), "pascalvoc_sp": (430, 530, 3, True)}[kind]
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(lo, hi, (1,), generator=g))
        ei = knn_graph_points(torch.rand(n, 2, generator=g), k)
        if sym:
            ei = torch.unique(torch.cat([ei, ei.flip(0)], 1), dim=1)
        graphs.append((ei, n))
    return _batch(graphs)


def power_law_graph(num_nodes: int, avg_degree: float, max_degree: int, seed: int = 0,
                    device: Optional[torch.device] = None) -> Tensor:
    r"""Chung-Lu graph with a heavy-tailed in-degree: node i gets expected in-degree
    ``w_i = max_degree * (i + 1) ** -a`` with ``a`` solved so that the mean is
    ``avg_degree``; sources are drawn with the same weights. Models the super-node
    graphs of the paper (Reddit: 232K nodes, avg 492, max 21,657; ogbn-proteins:
    132K, 597, 7,750; ogbl-ppa: 576K, 74, 3,241), scaled to fit one GPU.

    Returns:
        ``edge_index`` ``[2, round(num_nodes * avg_degree)]`` (duplicates possible,
        nodes shuffled).
    """
    idx = torch.arange(1, num_nodes + 1, dtype=torch.float64)
    lo_a, hi_a = 0.0, 5.0
    for _ in range(60):  # bisection on the exponent: mean(min(w, max)) = avg
        a = (lo_a + hi_a) / 2
        mean = (max_degree * idx.pow(-a)).mean().item()
        lo_a, hi_a = (a, hi_a) if mean > avg_degree else (lo_a, a)
    device = torch.device("cpu") if device is None else torch.device(device)
    w = (max_degree * idx.pow(-a)).float().to(device)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    E = int(round(num_nodes * avg_degree))
    dst = torch.multinomial(w, E, replacement=True, generator=g)
    src = torch.multinomial(w, E, replacement=True, generator=g)
    perm = torch.randperm(num_nodes, generator=g, device=device)
    return torch.stack([perm[src], perm[dst]])
