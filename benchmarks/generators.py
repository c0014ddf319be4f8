r"""Seeded, vectorised synthetic graphs with the shapes of the paper's Table 1.

Parameters follow the original generators (as summarised in the data folder's
``README.md``, "Synthetic stand-ins"):

* :func:`sbm_batch` / :func:`sbm_dataset`: SBM **PATTERN** and **CLUSTER** of
  Benchmarking GNNs (Dwivedi et al.), ``generate_SBM_{PATTERN,CLUSTER}.ipynb``.
  PATTERN: 5 communities of U{5..34} nodes, p = 0.5, q = 0.35, plus one planted
  pattern of U{5..34} nodes (internal p = 0.5, pattern-to-SBM q = 0.5); 100 fixed
  pattern instances (edges and node features ``u0`` fixed per instance), graph
  ``i`` carries instance ``i % 100``; node feature in {0, 1, 2}; label 1 on the
  pattern nodes. CLUSTER: 6 communities of U{5..34} nodes, p = 0.55, q = 0.25;
  node feature 0 except one random node per community ``r`` with ``r + 1``;
  label = community. Undirected (both directions stored), no self-loops, nodes
  relabelled by a random permutation per graph.
* :func:`knn_batch` / :func:`knn_dataset`: superpixel-like graphs (MNIST:
  40-75 nodes, about 70.6 on average; CIFAR10: 85-150 nodes), each node with
  ``k = 8`` out-edges to its nearest neighbours, so edges = 8 x nodes; and
  region-graph-like graphs (COCO-SP / PascalVOC-SP: about 477 / 479 nodes,
  average degree about 5.65, low maximum degree).
* :func:`power_law_graph`: Chung-Lu graphs with a given number of nodes,
  average and maximum in-degree (Reddit-, Protein- and ppa-like super-node
  graphs); :func:`power_law_edge_graph` adds random edge features.
* :func:`describe` prints (and returns) nodes, edges and the average / maximum
  in-degree of any generator's output next to the published numbers
  (:data:`PUBLISHED`); :func:`expected_stats` gives what the construction
  implies on average.

Every generator is a pure function of its arguments and ``seed`` (same seed,
same output) and works on whole batches of graphs at once: generating 10,000
graphs takes seconds. Outputs are on the CPU (``int64`` ``edge_index``), except
:func:`power_law_graph` given a ``device``. ``python -m benchmarks.generators``
prints the statistics of every generator.
"""
from __future__ import annotations

import math
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = ["SBM_PARAMS", "KNN_PARAMS", "PUBLISHED", "sbm_graph", "sbm_batch", "sbm_dataset",
           "knn_graph_points", "knn_batch", "knn_dataset", "power_law_graph",
           "power_law_edge_graph", "graph_stats",
           "describe", "expected_stats", "summary"]


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


# ====================================================================== SBM
class SBMParams(NamedTuple):
    num_communities: int
    size_min: int           # community size ~ U{size_min..size_max}
    size_max: int
    p: float                # intra-community edge probability
    q: float                # inter-community edge probability
    vocab: int              # number of distinct node features (one-hot width)
    num_classes: int
    pattern: bool = False   # PATTERN: plant one pattern instance per graph
    pattern_min: int = 5    # pattern size ~ U{pattern_min..pattern_max}
    pattern_max: int = 34
    p_pattern: float = 0.5  # edge probability inside a pattern instance
    q_pattern: float = 0.5  # pattern-node to SBM-node edge probability
    num_patterns: int = 100  # distinct pattern instances


#: Published generation parameters (the data folder's ``README.md``).
SBM_PARAMS: Dict[str, SBMParams] = {
    "pattern": SBMParams(5, 5, 34, 0.5, 0.35, vocab=3, num_classes=2, pattern=True),
    "cluster": SBMParams(6, 5, 34, 0.55, 0.25, vocab=7, num_classes=6),
}

# Graphs per vectorised block: a [chunk, n_max, n_max] draw (n_max <= 204). The
# output depends on it, so it is a constant.
_SBM_CHUNK = 256


def _sbm_params(kind: str) -> SBMParams:
    try:
        return SBM_PARAMS[kind.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"kind must be 'pattern' or 'cluster', got {kind!r}") from None


def _pattern_instances(P: SBMParams, g: torch.Generator) -> Tuple[Tensor, Tensor, Tensor]:
    """``(m [I], W0 [I, M, M] bool symmetric, u0 [I, M])`` for I fixed pattern instances."""
    I, M = P.num_patterns, P.pattern_max
    m = torch.randint(P.pattern_min, P.pattern_max + 1, (I,), generator=g)
    idx = torch.arange(M)
    valid = (idx[None, :] < m[:, None])
    pair = valid[:, :, None] & valid[:, None, :]
    upper = torch.triu(torch.rand(I, M, M, generator=g) < P.p_pattern, diagonal=1) & pair
    W0 = upper | upper.transpose(1, 2)
    u0 = torch.randint(0, P.vocab, (I, M), generator=g)
    return m, W0, u0


def _sbm(kind: str, num_graphs: int, g: torch.Generator
         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""Core SBM generator. Returns ``(edge_index, batch, x, y, nodes_per_graph,
    edges_per_graph)``; the edges are grouped by graph (graph 0's first).

    Graphs are drawn in blocks of similar size (sorted by node count, so a
    block's ``[graphs, n_max, n_max]`` draw wastes little on padding) and put
    back in their original order at the end. Inside a graph, before the random
    relabelling, the pattern nodes (PATTERN) come first, then the communities.
    """
    P = _sbm_params(kind)
    B, C = int(num_graphs), P.num_communities
    if B < 0:
        raise ValueError(f"num_graphs must be >= 0, got {num_graphs}")
    if P.pattern:
        pat_m, pat_W0, pat_u0 = _pattern_instances(P, g)
    sizes = torch.randint(P.size_min, P.size_max + 1, (B, C), generator=g)
    n_sbm = sizes.sum(1)
    if P.pattern:
        pid = torch.arange(B) % P.num_patterns
        m = pat_m[pid]
    else:
        pid = None
        m = torch.zeros(B, dtype=torch.long)
    n_tot = n_sbm + m
    offsets = torch.cumsum(n_tot, 0) - n_tot
    epg = torch.zeros(B, dtype=torch.long)
    ei_of: List[Optional[Tensor]] = [None] * B
    x_of: List[Optional[Tensor]] = [None] * B
    y_of: List[Optional[Tensor]] = [None] * B

    by_size = torch.sort(n_tot, stable=True).indices
    for s in range(0, B, _SBM_CHUNK):
        gids = by_size[s:s + _SBM_CHUNK]
        nb = gids.numel()
        nt, mm = n_tot[gids], m[gids]
        nmax = int(nt.max())
        idx = torch.arange(nmax)
        cum = torch.cumsum(sizes[gids], 1)                             # [nb, C]
        rel = idx[None, :] - mm[:, None]                               # position among SBM nodes
        block = torch.searchsorted(cum, rel.clamp(min=0).contiguous(), right=True)
        block = torch.where(rel < 0, C, block)                         # C: pattern node
        valid = idx[None, :] < nt[:, None]
        block = torch.where(valid, block, C + 1)                       # C + 1: padding
        bi, bj = block[:, :, None], block[:, None, :]
        prob = torch.where(bi == bj, P.p, P.q)
        if P.pattern:
            prob = torch.where((bi == C) | (bj == C), P.q_pattern, prob)
        draw = torch.rand(nb, nmax, nmax, generator=g) < prob
        draw &= valid[:, :, None] & valid[:, None, :]
        if P.pattern:  # pattern-pattern pairs: the instance's fixed edges W0
            M = min(P.pattern_max, nmax)
            W0 = pat_W0[pid[gids]][:, :M, :M]
            draw[:, :M, :M] = torch.where((bi == C)[:, :M, :] & (bj == C)[:, :, :M], W0,
                                          draw[:, :M, :M])
        upper = torch.triu(draw, diagonal=1)
        sym = upper | upper.transpose(1, 2)

        # random relabelling inside each graph: new id of old local node i
        key = torch.rand(nb, nmax, generator=g).masked_fill_(~valid, 2.0)
        order = torch.argsort(key, dim=1)                              # old id at new position
        inv = torch.empty_like(order)
        inv.scatter_(1, order, idx.expand(nb, nmax).contiguous())
        b, i, j = sym.nonzero(as_tuple=True)                           # sorted by b
        cnt = torch.bincount(b, minlength=nb)
        epg[gids] = cnt
        off = offsets[gids][b]
        e = torch.stack([off + inv[b, i], off + inv[b, j]])

        if P.pattern:
            feat = torch.randint(0, P.vocab, (nb, nmax), generator=g)
            u0 = pat_u0[pid[gids]]
            feat[:, :M] = torch.where(block[:, :M] == C, u0[:, :M], feat[:, :M])
            lab = (block == C).long()
        else:
            first = cum - sizes[gids] + mm[:, None]
            pick = first + (torch.rand(nb, C, generator=g) * sizes[gids]).long()
            feat = torch.zeros(nb, nmax, dtype=torch.long)
            feat.scatter_(1, pick, torch.arange(1, C + 1).expand(nb, C).contiguous())
            lab = block
        feat = torch.gather(feat, 1, order)
        lab = torch.gather(lab, 1, order)
        new_valid = torch.gather(valid, 1, order)
        xs = torch.split(feat[new_valid], nt.tolist())
        ys = torch.split(lab[new_valid], nt.tolist())
        es = torch.split(e, cnt.tolist(), dim=1)
        for k, gi in enumerate(gids.tolist()):
            ei_of[gi], x_of[gi], y_of[gi] = es[k], xs[k], ys[k]

    if B == 0:
        empty = torch.empty(0, dtype=torch.long)
        return torch.empty(2, 0, dtype=torch.long), empty, empty, empty, n_tot, epg
    batch = torch.repeat_interleave(torch.arange(B), n_tot)
    return torch.cat(ei_of, 1), batch, torch.cat(x_of), torch.cat(y_of), n_tot, epg


def sbm_graph(kind: str, g: torch.Generator) -> Tuple[Tensor, Tensor, Tensor]:
    r"""One SBM PATTERN or CLUSTER graph, drawn from the generator ``g``.

    Returns:
        ``(edge_index [2, E], x [N] int64 features, y [N] int64 labels)``: PATTERN
        features in {0, 1, 2}, label 1 for pattern nodes; CLUSTER features 0
        except one node per community ``r`` with ``r + 1``, label = community.
    """
    ei, _, x, y, _, _ = _sbm(kind, 1, g)
    return ei, x, y


def sbm_batch(kind: str, num_graphs: int = 1024, seed: int = 0
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""A batch of ``num_graphs`` SBM PATTERN / CLUSTER graphs as one disjoint graph.

    Args:
        kind (str): ``"pattern"`` or ``"cluster"`` (parameters in
            :data:`SBM_PARAMS`; see the module docstring).
        num_graphs (int): number of graphs (the published training sets have
            10,000).
        seed (int): random seed; the output is a function of ``(kind,
            num_graphs, seed)``.

    Returns:
        ``(edge_index [2, E], batch [N], x [N], y [N])``, all ``int64``: ``x`` the
        integer node feature (PATTERN: 0..2, CLUSTER: 0..6), ``y`` the node label
        (PATTERN: 1 on pattern nodes; CLUSTER: community 0..5). Edges are
        undirected (both directions), without self-loops, grouped by graph.
        PATTERN: about 117 nodes and 5,870 directed edges per graph; CLUSTER:
        about 117 nodes and 4,290 (:func:`expected_stats`).
    """
    ei, batch, x, y, _, _ = _sbm(kind, num_graphs, _gen(seed))
    return ei, batch, x, y


def _split_graphs(ei: Tensor, npg: Tensor, epg: Tensor) -> Tuple[List[Tensor], Tensor]:
    """Splits a graph-grouped disjoint-union ``edge_index`` into per-graph local ones."""
    node_off = torch.cumsum(npg, 0) - npg
    local = ei - torch.repeat_interleave(node_off, epg)[None, :]
    return list(torch.split(local, epg.tolist(), dim=1)), node_off


def sbm_dataset(kind: str, num_graphs: int = 1000, seed: int = 0, one_hot: bool = True) -> list:
    r"""SBM PATTERN / CLUSTER as a list of PyG :class:`~torch_geometric.data.Data`,
    ready for :class:`torch_geometric.loader.DataLoader` (node classification).

    Args:
        kind (str): ``"pattern"`` or ``"cluster"``.
        num_graphs (int): number of graphs (published: 10,000 train, 2,000 /
            1,000 val, 2,000 / 1,000 test); use different seeds for the splits.
        seed (int): random seed.
        one_hot (bool): ``x`` as float one-hot ``[N, 3]`` (PATTERN) / ``[N, 7]``
            (CLUSTER), as PyG's :class:`~torch_geometric.datasets.GNNBenchmarkDataset`;
            otherwise the integer feature ``[N]``.

    Returns:
        list of ``Data(x, edge_index, y)`` with ``y`` ``[N]`` int64 node labels
        (PATTERN: 2 classes, 1 = node of the planted pattern; CLUSTER: 6 classes,
        the community). The task is learnable as in the original datasets.
    """
    from torch_geometric.data import Data

    P = _sbm_params(kind)
    ei, _, x, y, npg, epg = _sbm(kind, num_graphs, _gen(seed))
    if one_hot:
        x = torch.nn.functional.one_hot(x, P.vocab).float()
    eis, _ = _split_graphs(ei, npg, epg)
    xs = torch.split(x, npg.tolist())
    ys = torch.split(y, npg.tolist())
    return [Data(x=xi, edge_index=e, y=yi) for xi, e, yi in zip(xs, eis, ys)]


# ====================================================================== kNN
class KNNParams(NamedTuple):
    nodes_min: int
    nodes_max: int
    k: int
    symmetric: bool       # region graphs: symmetrised kNN on a jittered grid
    num_features: int     # node features of the *_dataset: intensity channels + 2 (centroid)
    num_classes: int
    graph_task: bool      # graph labels (superpixels) or node labels (region graphs)


#: Shapes of the superpixel / region graphs (the data folder's ``README.md``).
KNN_PARAMS: Dict[str, KNNParams] = {
    "mnist": KNNParams(40, 75, 8, False, 3, 10, True),
    "cifar10": KNNParams(85, 150, 8, False, 5, 10, True),
    "coco_sp": KNNParams(430, 524, 5, True, 14, 81, False),
    "pascalvoc_sp": KNNParams(430, 529, 5, True, 14, 21, False),
}

# MNIST: nodes = 75 - floor(Exp(scale)) (clipped at 40): most digits fill the 75
# SLIC segments; mean 75 - 1 / (exp(1 / scale) - 1) = 70.6 as published.
_MNIST_EXP_SCALE = 1.0 / math.log1p(1.0 / 4.4)
_KNN_CHUNK_NODES = 1 << 18  # nodes per vectorised block (the output depends on it)


def _knn_params(kind: str) -> KNNParams:
    try:
        return KNN_PARAMS[kind.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"kind must be one of {sorted(KNN_PARAMS)}, got {kind!r}") from None


def _knn_sizes(kind: str, P: KNNParams, num_graphs: int, g: torch.Generator) -> Tensor:
    if kind == "mnist":
        u = torch.rand(num_graphs, generator=g, dtype=torch.float64)
        drop = torch.floor(-torch.log1p(-u) * _MNIST_EXP_SCALE).long()
        return (P.nodes_max - drop).clamp(min=P.nodes_min)
    return torch.randint(P.nodes_min, P.nodes_max + 1, (num_graphs,), generator=g)


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


def _knn_superpixel(sizes: Tensor, k: int, g: torch.Generator) -> Tuple[Tensor, Tensor]:
    """Uniform random centroids in [0, 1)^2, exact directed kNN per graph, batched
    over graphs padded to the largest. Returns ``(edge_index, pos [N, 2])``."""
    B = sizes.numel()
    offsets = torch.cumsum(sizes, 0) - sizes
    ei_parts, pos_parts = [], []
    nmax_all = int(sizes.max()) if B else 0
    step = max(1, _KNN_CHUNK_NODES // max(nmax_all, 1))
    for s in range(0, B, step):
        e = min(B, s + step)
        nb, n = e - s, sizes[s:e]
        nmax = int(n.max())
        idx = torch.arange(nmax)
        valid = idx[None, :] < n[:, None]                             # [nb, nmax]
        pos = torch.rand(nb, nmax, 2, generator=g)
        d = torch.cdist(pos, pos)
        d.masked_fill_(~valid[:, None, :], float("inf"))
        d.diagonal(dim1=1, dim2=2).fill_(float("inf"))
        kk = min(k, nmax - 1)
        dist, nbr = d.topk(kk, dim=2, largest=False)                  # [nb, nmax, kk]
        keep = valid[:, :, None] & torch.isfinite(dist)               # graphs with <= k nodes
        b, i, t = keep.nonzero(as_tuple=True)
        off = offsets[s:e][b]
        ei_parts.append(torch.stack([off + i, off + nbr[b, i, t]]))
        pos_parts.append(pos[valid])
    if not ei_parts:
        return torch.empty(2, 0, dtype=torch.long), torch.empty(0, 2)
    return torch.cat(ei_parts, 1), torch.cat(pos_parts)


# Neighbour cells searched by the region-graph kNN (5 x 5 window minus the centre).
_WIN = [(dr, dc) for dr in range(-2, 3) for dc in range(-2, 3) if (dr, dc) != (0, 0)]


def _knn_region(sizes: Tensor, k: int, g: torch.Generator) -> Tuple[Tensor, Tensor]:
    """Region-adjacency-like graphs: SLIC places its seeds on a regular grid, so
    the ``n`` centroids of a graph are jittered grid points (cell ``t`` of a
    ``ceil(sqrt(n))``-wide grid, uniform inside the cell); each node is linked to
    its ``k`` nearest centroids among the 24 surrounding cells and the graph is
    symmetrised. ``k = 5`` gives an average degree of about 5.7 and a maximum of
    about 11, like COCO-SP / PascalVOC-SP (5.65). Returns ``(edge_index, pos)``
    with ``pos`` scaled to [0, 1)^2; edges grouped by graph."""
    B = sizes.numel()
    if B == 0 or int(sizes.sum()) == 0:
        return torch.empty(2, 0, dtype=torch.long), torch.empty(0, 2)
    ei_parts, pos_parts = [], []
    step = max(1, _KNN_CHUNK_NODES // max(int(sizes.max()), 1))
    node0 = 0
    for s in range(0, B, step):
        sz = sizes[s:s + step]
        ei, pos = _knn_region_block(sz, k, g)
        ei_parts.append(ei + node0)
        pos_parts.append(pos)
        node0 += int(sz.sum())
    return torch.cat(ei_parts, 1), torch.cat(pos_parts)


def _knn_region_block(sizes: Tensor, k: int, g: torch.Generator) -> Tuple[Tensor, Tensor]:
    """:func:`_knn_region` for one block of graphs (local node ids)."""
    N = int(sizes.sum())
    B = sizes.numel()
    batch = torch.repeat_interleave(torch.arange(B), sizes)
    offsets = torch.cumsum(sizes, 0) - sizes
    t = torch.arange(N) - offsets[batch]                               # cell id in its graph
    width = torch.ceil(torch.sqrt(sizes.double())).long()
    height = (sizes + width - 1) // width
    w, h, n = width[batch], height[batch], sizes[batch]
    row, col = t // w, t % w
    jit = torch.rand(N, 2, generator=g)
    cx, cy = col.float() + jit[:, 0], row.float() + jit[:, 1]         # in cell units
    pos = torch.stack([cx / w, cy / h], 1)                            # [N, 2] in [0, 1)
    dr = torch.tensor([d[0] for d in _WIN], dtype=torch.int32)
    dc = torch.tensor([d[1] for d in _WIN], dtype=torch.int32)
    row, col, w32 = row.int(), col.int(), w.int()[:, None]
    r2, c2 = row[:, None] + dr, col[:, None] + dc                      # [N, 24]
    t2 = r2 * w32 + c2
    ok = (r2 >= 0) & (c2 >= 0) & (c2 < w32) & (t2 < n.int()[:, None])
    cand = torch.where(ok, t2 + offsets[batch].int()[:, None], 0)
    # squared distances in cell units (the grid's aspect, not the unit square's)
    d = (cx[:, None] - cx[cand]).square_() + (cy[:, None] - cy[cand]).square_()
    d.masked_fill_(~ok, float("inf"))
    dist, sel = d.topk(min(k, len(_WIN)), dim=1, largest=False)
    src_i, slot = torch.isfinite(dist).nonzero(as_tuple=True)
    dst = cand[src_i, sel[src_i, slot]].long()
    key = torch.unique(torch.minimum(src_i, dst) * N + torch.maximum(src_i, dst))  # sorted
    a, b = key // N, key % N
    # Both directions, grouped by graph: graph g's (a, b) edges, then its (b, a) edges.
    K = key.numel()
    ug = batch[a]
    cnt = torch.bincount(ug, minlength=B)
    start = torch.cumsum(cnt, 0) - cnt
    fwd = start[ug] + torch.arange(K)          # = 2 * start + position inside the graph
    rev = fwd + cnt[ug]
    ei = torch.empty(2, 2 * K, dtype=torch.long)
    ei[0, fwd], ei[1, fwd] = a, b
    ei[0, rev], ei[1, rev] = b, a
    return ei, pos


def _knn(kind: str, num_graphs: int, g: torch.Generator
         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(edge_index, batch, pos, nodes_per_graph, edges_per_graph)``, edges grouped by graph."""
    kind = kind.lower()
    P = _knn_params(kind)
    if num_graphs < 0:
        raise ValueError(f"num_graphs must be >= 0, got {num_graphs}")
    sizes = _knn_sizes(kind, P, int(num_graphs), g)
    if P.symmetric:
        ei, pos = _knn_region(sizes, P.k, g)
    else:
        ei, pos = _knn_superpixel(sizes, P.k, g)
    batch = torch.repeat_interleave(torch.arange(int(num_graphs)), sizes)
    epg = torch.bincount(batch[ei[0]], minlength=int(num_graphs)) if ei.numel() else \
        torch.zeros(int(num_graphs), dtype=torch.long)
    return ei, batch, pos, sizes, epg


def knn_batch(kind: str, num_graphs: int = 1024, seed: int = 0) -> Tuple[Tensor, Tensor]:
    r"""Superpixel- and region-graph-like batches as one disjoint graph.

    Args:
        kind (str): ``"mnist"`` (40-75 nodes, about 70.6 on average, k = 8
            out-edges per node: 8 x nodes edges), ``"cifar10"`` (85-150 nodes,
            k = 8), ``"coco_sp"`` / ``"pascalvoc_sp"`` (about 477 / 479 nodes,
            sparse planar-like region graphs: symmetrised 5-NN on a jittered
            grid, average degree about 5.7, maximum about 11).
        num_graphs (int): number of graphs.
        seed (int): random seed.

    Returns:
        ``(edge_index [2, E], batch [N])``, ``int64``, edges grouped by graph.
        Superpixel graphs: ``edge_index[0]`` is the node, ``edge_index[1]`` one of
        its 8 nearest neighbours (as ``benchmarking-gnns`` builds them).
    """
    ei, batch, _, _, _ = _knn(kind, num_graphs, _gen(seed))
    return ei, batch


def knn_dataset(kind: str, num_graphs: int = 1000, seed: int = 0) -> list:
    r"""Superpixel / region-graph stand-ins as a list of PyG
    :class:`~torch_geometric.data.Data`, ready for
    :class:`torch_geometric.loader.DataLoader`.

    The graphs are those of :func:`knn_batch`. Node features follow the
    published datasets' layout, with **random** content: mean intensity
    (uniform in [0, 1); 1 channel for MNIST, 3 for CIFAR10; 12 colour statistics
    for the region graphs) followed by the node's centroid normalised to
    [0, 1)^2, which is also stored as ``pos``. So MNIST has 3 features, CIFAR10
    5, COCO-SP / PascalVOC-SP 14.

    **The labels are synthetic** (uniformly random classes, not learnable): a
    graph label ``y`` ``[1]`` (10 classes) for MNIST / CIFAR10, a node label
    ``y`` ``[N]`` for COCO-SP (81 classes) / PascalVOC-SP (21 classes). Use these
    datasets for speed and memory measurements, not for accuracy.

    Args:
        kind (str): ``"mnist"``, ``"cifar10"``, ``"coco_sp"`` or ``"pascalvoc_sp"``.
        num_graphs (int): number of graphs.
        seed (int): random seed.

    Returns:
        list of ``Data(x, edge_index, pos, y)``.
    """
    from torch_geometric.data import Data

    kind = kind.lower()
    P = _knn_params(kind)
    g = _gen(seed)
    ei, batch, pos, npg, epg = _knn(kind, num_graphs, g)
    N = batch.numel()
    x = torch.cat([torch.rand(N, P.num_features - 2, generator=g), pos], 1)
    eis, _ = _split_graphs(ei, npg, epg)
    sizes = npg.tolist()
    xs, ps = torch.split(x, sizes), torch.split(pos, sizes)
    if P.graph_task:  # one label per graph: y [1], so a DataLoader batch has y [B]
        ys = torch.randint(0, P.num_classes, (int(num_graphs), 1), generator=g).unbind(0)
    else:
        ys = torch.split(torch.randint(0, P.num_classes, (N,), generator=g), sizes)
    return [Data(x=xi, edge_index=e, pos=pi, y=yi) for xi, e, pi, yi in zip(xs, eis, ps, ys)]


# ================================================================ power law
def power_law_graph(num_nodes: int, avg_degree: float, max_degree: int, seed: int = 0,
                    device: Optional[torch.device] = None) -> Tensor:
    r"""Chung-Lu graph with a heavy-tailed in-degree: node i gets expected in-degree
    ``w_i = max_degree * (i + 1) ** -a`` with ``a`` solved so that the mean is
    ``avg_degree``; sources are drawn with the same weights. Models the super-node
    graphs of the paper (Reddit: 232K nodes, avg 492, max 21,657; ogbn-proteins:
    132K, 597, 7,750; ogbl-ppa: 576K, 74, 3,241), scaled to fit one GPU.

    The mean in-degree is exactly ``round(num_nodes * avg_degree) / num_nodes``;
    the largest in-degree is ``max_degree`` up to sampling noise
    (:math:`\pm\sqrt{\text{max\_degree}}`). Needs ``avg_degree <= max_degree``.

    Returns:
        ``edge_index`` ``[2, round(num_nodes * avg_degree)]`` (duplicates possible,
        nodes shuffled).
    """
    if not 0 < avg_degree <= max_degree:
        raise ValueError(f"need 0 < avg_degree <= max_degree, got {avg_degree}, {max_degree}")
    idx = torch.arange(1, num_nodes + 1, dtype=torch.float64)
    lo_a, hi_a = 0.0, 5.0
    for _ in range(60):  # bisection on the exponent: mean(w) = avg
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


def power_law_edge_graph(num_nodes: int, avg_degree: float, max_degree: int,
                         edge_dim: int = 16, seed: int = 0,
                         device: Optional[torch.device] = None):
    r""":func:`power_law_graph` with a random feature per edge: the super-node
    graph of the edge-feature benchmarks (``edge_dim = 16``).

    Returns:
        :class:`~torch_geometric.data.Data` with ``edge_index`` (the same as
        ``power_law_graph(num_nodes, avg_degree, max_degree, seed)``),
        ``edge_attr`` ``[E, edge_dim]`` float32 standard normal (from its own
        generator, seeded with ``seed``) and ``num_nodes``.
    """
    from torch_geometric.data import Data

    edge_index = power_law_graph(num_nodes, avg_degree, max_degree, seed, device)
    g = torch.Generator(device=edge_index.device)
    g.manual_seed(seed)
    edge_attr = torch.randn(edge_index.size(1), edge_dim, generator=g, device=edge_index.device)
    return Data(edge_index=edge_index, edge_attr=edge_attr, num_nodes=num_nodes)


# ============================================================== statistics
#: Published statistics (per graph for the batch datasets; ``source`` says where
#: from). ``nodes`` / ``edges`` are means per graph, edges directed.
PUBLISHED: Dict[str, Dict[str, object]] = {
    "pattern": dict(nodes=118.9, edges=6098.9, nodes_range=(30, 204),
                    source="PyG GNNBenchmarkDataset (14,000 graphs)"),
    "cluster": dict(nodes=117.2, edges=4303.9, nodes_range=(30, 204),
                    source="PyG GNNBenchmarkDataset (12,000 graphs)"),
    "mnist": dict(nodes=70.6, edges=564.5, nodes_range=(40, 75),
                  source="PyG GNNBenchmarkDataset (70,000 graphs)"),
    "cifar10": dict(nodes=117.6, edges=941.2, nodes_range=(85, 150),
                    source="PyG GNNBenchmarkDataset (60,000 graphs)"),
    "coco_sp": dict(nodes=476.88, edges=2693.67, avg_degree=5.65,
                    source="PyG LRGBDataset (123,286 graphs)"),
    "pascalvoc_sp": dict(nodes=479.40, edges=2710.48, avg_degree=5.65,
                         source="PyG LRGBDataset (11,355 graphs)"),
    "reddit": dict(nodes=232_965, avg_degree=492, max_degree=21_657, source="DF-GNN Table 1"),
    "protein": dict(nodes=132_534, avg_degree=597, max_degree=7_750, source="DF-GNN Table 1"),
    "ppa": dict(nodes=576_289, avg_degree=74, max_degree=3_241, source="DF-GNN Table 1"),
}


def expected_stats(kind: str) -> Dict[str, float]:
    r"""Mean nodes and directed edges per graph implied by the construction of
    ``kind`` (``"pattern"``, ``"cluster"``, ``"mnist"``, ``"cifar10"``).

    SBM: with community sizes :math:`s \sim U\{a..b\}`,
    :math:`E[s(s-1)] = \mathrm{Var}(s) + E[s]^2 - E[s]`; undirected edges are
    :math:`C \cdot E[s(s-1)]/2 \cdot p + \binom{C}{2} E[s]^2 q` (+ pattern terms);
    directed = 2 x undirected. PATTERN: about 117 nodes, 5,870 edges; CLUSTER:
    117 and 4,290 (the data folder's ``README.md``). kNN: edges = 8 x nodes.
    """
    kind = kind.lower()
    if kind in SBM_PARAMS:
        P = SBM_PARAMS[kind]
        a, b = P.size_min, P.size_max
        es = (a + b) / 2
        var = ((b - a + 1) ** 2 - 1) / 12
        es2 = var + es * es - es           # E[s (s - 1)]
        C = P.num_communities
        nodes = C * es
        und = C * es2 / 2 * P.p + C * (C - 1) / 2 * es * es * P.q
        if P.pattern:
            am, bm = P.pattern_min, P.pattern_max
            em = (am + bm) / 2
            em2 = ((bm - am + 1) ** 2 - 1) / 12 + em * em - em
            nodes += em
            und += em * nodes_sbm_mean(P) * P.q_pattern + em2 / 2 * P.p_pattern
        return {"nodes": nodes, "edges": 2 * und, "avg_degree": 2 * und / nodes}
    if kind in ("mnist", "cifar10"):
        P = KNN_PARAMS[kind]
        if kind == "mnist":
            nodes = P.nodes_max - 1.0 / math.expm1(1.0 / _MNIST_EXP_SCALE)
        else:
            nodes = (P.nodes_min + P.nodes_max) / 2
        return {"nodes": nodes, "edges": P.k * nodes, "avg_degree": float(P.k)}
    if kind in ("coco_sp", "pascalvoc_sp"):
        P = KNN_PARAMS[kind]
        nodes = (P.nodes_min + P.nodes_max) / 2
        return {"nodes": nodes, "edges": 5.7 * nodes, "avg_degree": 5.7}  # measured, k = 5
    raise ValueError(f"no expected statistics for {kind!r}")


def nodes_sbm_mean(P: SBMParams) -> float:
    """Mean number of SBM (non-pattern) nodes of a graph."""
    return P.num_communities * (P.size_min + P.size_max) / 2


def graph_stats(edge_index: Tensor, num_nodes: Optional[int] = None,
                batch: Optional[Tensor] = None) -> Dict[str, float]:
    r"""Statistics of a graph or a disjoint batch of graphs.

    Returns:
        dict with ``graphs``, ``nodes``, ``edges`` (directed ``edge_index``
        columns), ``nodes_per_graph``, ``edges_per_graph``, ``min_nodes`` /
        ``max_nodes`` (per graph), ``avg_in_degree`` (edges / nodes),
        ``max_in_degree``, ``self_loops``.
    """
    if num_nodes is None:
        num_nodes = batch.numel() if batch is not None else (
            int(edge_index.max()) + 1 if edge_index.numel() else 0)
    num_nodes = int(num_nodes)
    E = int(edge_index.size(1))
    indeg = torch.bincount(edge_index[1].cpu(), minlength=num_nodes) if E else \
        torch.zeros(num_nodes, dtype=torch.long)
    if batch is not None and batch.numel():
        npg = torch.bincount(batch.cpu())
    else:
        npg = torch.tensor([num_nodes])
    G = int(npg.numel())
    return {
        "graphs": G,
        "nodes": num_nodes,
        "edges": E,
        "nodes_per_graph": num_nodes / max(G, 1),
        "edges_per_graph": E / max(G, 1),
        "min_nodes": int(npg.min()) if G else 0,
        "max_nodes": int(npg.max()) if G else 0,
        "avg_in_degree": E / max(num_nodes, 1),
        "max_in_degree": int(indeg.max()) if num_nodes else 0,
        "self_loops": int((edge_index[0] == edge_index[1]).sum()) if E else 0,
    }


def _as_graph(obj, batch=None, num_nodes=None):
    """(edge_index, batch, num_nodes) of a tensor, a generator tuple, a Data /
    Batch or a list of Data."""
    if isinstance(obj, Tensor):
        return obj, batch, num_nodes
    if isinstance(obj, tuple):  # (edge_index, batch, ...) of sbm_batch / knn_batch
        return obj[0], obj[1] if len(obj) > 1 else batch, num_nodes
    if isinstance(obj, (list, Sequence)) and len(obj) and hasattr(obj[0], "edge_index"):
        npg = torch.tensor([d.num_nodes for d in obj])
        off = torch.cumsum(npg, 0) - npg
        ei = torch.cat([d.edge_index + o for d, o in zip(obj, off.tolist())], 1)
        return ei, torch.repeat_interleave(torch.arange(len(obj)), npg), int(npg.sum())
    if hasattr(obj, "edge_index"):  # Data or Batch
        return obj.edge_index, getattr(obj, "batch", None), obj.num_nodes
    raise TypeError(f"cannot describe {type(obj)}")


def describe(graphs, name: Optional[str] = None, *, batch: Optional[Tensor] = None,
             num_nodes: Optional[int] = None, file=None, quiet: bool = False
             ) -> Dict[str, float]:
    r"""Prints and returns the statistics of a generator's output.

    Args:
        graphs: an ``edge_index`` tensor, the tuple returned by
            :func:`sbm_batch` / :func:`knn_batch`, a
            :class:`~torch_geometric.data.Data` / ``Batch``, or a list of ``Data``
            (:func:`sbm_dataset`, :func:`knn_dataset`).
        name (str, optional): a key of :data:`PUBLISHED` (``"pattern"``,
            ``"cluster"``, ``"mnist"``, ``"cifar10"``, ``"coco_sp"``,
            ``"pascalvoc_sp"``, ``"reddit"``, ``"protein"``, ``"ppa"``) to print
            the published numbers next to the measured ones, or any label.
        batch (Tensor, optional), num_nodes (int, optional): for a bare
            ``edge_index``.
        file: where to print (default: ``sys.stdout``).
        quiet (bool): only return the statistics.

    Returns:
        the dict of :func:`graph_stats`, plus ``published`` (the
        :data:`PUBLISHED` entry, if ``name`` has one).

    Example::

        >>> describe(sbm_batch("pattern", 1000), "pattern")   # doctest: +SKIP
        pattern: 1000 graphs, 117,412 nodes (117.4/graph, 30-199), 5,891,232 edges
          (5891.2/graph), in-degree avg 50.18 max 104; published: 118.9 nodes, 6098.9 edges/graph
    """
    ei, b, n = _as_graph(graphs, batch, num_nodes)
    st = graph_stats(ei, n, b)
    key = (name or "").lower().replace("-", "_")
    pub = PUBLISHED.get(key)
    if pub is not None:
        st["published"] = pub
    if not quiet:
        line = (f"{name or 'graph'}: {st['graphs']:,} graph{'s' if st['graphs'] != 1 else ''}, "
                f"{st['nodes']:,} nodes")
        if st["graphs"] > 1:
            line += (f" ({st['nodes_per_graph']:.1f}/graph, {st['min_nodes']}-{st['max_nodes']}), "
                     f"{st['edges']:,} edges ({st['edges_per_graph']:.1f}/graph)")
        else:
            line += f", {st['edges']:,} edges"
        line += f", in-degree avg {st['avg_in_degree']:.2f} max {st['max_in_degree']:,}"
        if pub is not None:
            parts = []
            if "nodes" in pub:
                parts.append(f"{pub['nodes']:,} nodes")
            if "edges" in pub:
                parts.append(f"{pub['edges']:,} edges")
            if "avg_degree" in pub:
                parts.append(f"avg deg {pub['avg_degree']}")
            if "max_degree" in pub:
                parts.append(f"max deg {pub['max_degree']:,}")
            per = "/graph" if "edges" in pub else ""
            line += f"; published{per}: " + ", ".join(parts) + f" ({pub['source']})"
        print(line, file=file or sys.stdout)
    return st


def summary(num_graphs: int = 1000, seed: int = 0, file=None) -> Dict[str, Dict[str, float]]:
    r"""Generates every dataset (``num_graphs`` graphs each, and scaled super-node
    graphs) and prints :func:`describe` for each; returns the statistics."""
    out = {}
    for kind in SBM_PARAMS:
        out[kind] = describe(sbm_batch(kind, num_graphs, seed), kind, file=file)
    for kind in KNN_PARAMS:
        out[kind] = describe(knn_batch(kind, num_graphs, seed), kind, file=file)
    for name, (n, avg, mx) in {"reddit": (30_000, 492, 21_657), "protein": (20_000, 597, 7_750),
                               "ppa": (100_000, 74, 3_241)}.items():
        out[name] = describe(power_law_graph(n, avg, mx, seed), name, num_nodes=n, file=file)
    return out


if __name__ == "__main__":  # python -m benchmarks.generators [num_graphs]
    summary(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
