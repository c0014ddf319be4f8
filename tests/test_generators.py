"""Synthetic generators (benchmarks.generators): statistics against the published
numbers (the data folder's README.md, "Synthetic stand-ins") and against what the
construction implies, structure, labels, determinism, PyG Data helpers. CPU only."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import is_undirected

from benchmarks import datasets, generators as G

NUM_SBM = 2000  # graphs for the statistics tests (the published sets have 10,000+)


@pytest.fixture(scope="module")
def pattern():
    return G.sbm_batch("pattern", NUM_SBM, seed=0)


@pytest.fixture(scope="module")
def cluster():
    return G.sbm_batch("cluster", NUM_SBM, seed=0)


def _per_graph(ei, batch):
    npg = torch.bincount(batch)
    epg = torch.bincount(batch[ei[0]], minlength=npg.numel())
    return npg, epg


def _within(value, lo, hi):
    assert lo <= value <= hi, f"{value} not in [{lo}, {hi}]"


# ------------------------------------------------------------------ construction
def test_expected_stats_match_readme():
    # README: "CLUSTER about 117 nodes and about 4,290 directed edges; PATTERN about
    # 117 nodes and about 5,870 directed edges."
    p, c = G.expected_stats("pattern"), G.expected_stats("cluster")
    assert p["nodes"] == pytest.approx(117.0) and p["edges"] == pytest.approx(5870, abs=1)
    assert c["nodes"] == pytest.approx(117.0) and c["edges"] == pytest.approx(4290, abs=1)
    assert G.expected_stats("mnist")["nodes"] == pytest.approx(70.6, abs=0.05)
    assert G.expected_stats("cifar10")["edges"] == 8 * G.expected_stats("cifar10")["nodes"]


@pytest.mark.parametrize("kind", ["pattern", "cluster"])
def test_sbm_statistics(kind, request, capsys):
    ei, batch, x, y = request.getfixturevalue(kind)
    st = G.describe((ei, batch), kind)
    out = capsys.readouterr().out
    assert kind in out and "published" in out and f"{NUM_SBM:,} graphs" in out
    pub, exp = G.PUBLISHED[kind], G.expected_stats(kind)
    assert st["graphs"] == NUM_SBM and st["nodes"] == batch.numel() == x.numel() == y.numel()
    # published numbers (README table; PyG docs) and the construction's, +-5%
    lo_n, hi_n = min(pub["nodes"], exp["nodes"]), max(pub["nodes"], exp["nodes"])
    lo_e, hi_e = min(pub["edges"], exp["edges"]), max(pub["edges"], exp["edges"])
    _within(st["nodes_per_graph"], 0.95 * lo_n, 1.05 * hi_n)
    _within(st["edges_per_graph"], 0.95 * lo_e, 1.05 * hi_e)
    # tighter, against the construction (std of the mean over 2,000 graphs is < 1%)
    assert st["nodes_per_graph"] == pytest.approx(exp["nodes"], rel=0.02)
    assert st["edges_per_graph"] == pytest.approx(exp["edges"], rel=0.03)
    # node count range by construction: 30..204 (README "node count range")
    lo, hi = pub["nodes_range"]
    assert lo <= st["min_nodes"] and st["max_nodes"] <= hi
    assert st["avg_in_degree"] == pytest.approx(exp["avg_degree"], rel=0.03)
    assert st["self_loops"] == 0


@pytest.mark.parametrize("kind", ["pattern", "cluster"])
def test_sbm_structure(kind):
    ei, batch, x, y = G.sbm_batch(kind, 200, seed=3)
    n = batch.numel()
    assert ei.dtype == torch.long and batch.dtype == torch.long
    assert is_undirected(ei, num_nodes=n)                    # both directions stored
    assert not bool((ei[0] == ei[1]).any())                 # no self-loops
    assert torch.unique(ei, dim=1).size(1) == ei.size(1)    # no duplicates
    assert torch.equal(batch[ei[0]], batch[ei[1]])          # no edge between graphs
    g = batch[ei[0]]
    assert bool((g[1:] >= g[:-1]).all())                    # grouped by graph
    assert bool((batch[1:] >= batch[:-1]).all())


def test_pattern_labels_and_features(pattern):
    ei, batch, x, y = pattern
    npg, _ = _per_graph(ei, batch)
    assert set(x.unique().tolist()) <= {0, 1, 2} and set(y.unique().tolist()) == {0, 1}
    m = torch.bincount(batch[y == 1], minlength=npg.numel())
    assert int(m.min()) >= 5 and int(m.max()) <= 34         # pattern size U{5..34}
    # Pattern nodes link to every SBM node with q_pattern = 0.5 > q = 0.35, so they
    # have a larger expected degree (about 60 vs 48): the task is learnable from the
    # structure. Expected degree of a pattern node (size-biased pattern size m):
    # E[m(m-1)]/E[m] * p_pattern + E[n_sbm] * q_pattern = 435.67/19.5 * 0.5 + 97.5 * 0.5.
    deg = torch.bincount(ei[1], minlength=batch.numel()).double()
    d1, d0 = deg[y == 1].mean().item(), deg[y == 0].mean().item()
    P = G.SBM_PARAMS["pattern"]
    exp_d1 = 435.6667 / 19.5 * P.p_pattern + 5 * 19.5 * P.q_pattern
    assert d1 == pytest.approx(exp_d1, rel=0.05)
    assert d1 > 1.1 * d0
    # graphs i and i + 100 carry the same pattern instance: same size, same features
    # multiset and same number of internal pattern edges.
    yb = y == 1
    inside = yb[ei[0]] & yb[ei[1]]
    pe = torch.bincount(batch[ei[0][inside]], minlength=npg.numel())
    for i in (0, 7, 42):
        a, b = i, i + P.num_patterns
        assert m[a] == m[b] and pe[a] == pe[b]
        xa = x[(batch == a) & yb].sort().values
        xb = x[(batch == b) & yb].sort().values
        assert torch.equal(xa, xb)
    # different instances differ somewhere
    assert len({(int(m[i]), int(pe[i])) for i in range(P.num_patterns)}) > 10


def test_cluster_labels_and_features(cluster):
    ei, batch, x, y = cluster
    npg, _ = _per_graph(ei, batch)
    assert set(y.unique().tolist()) == set(range(6))
    # one node per community r carries feature r + 1, all others 0
    marked = x > 0
    assert torch.equal(torch.bincount(batch[marked], minlength=npg.numel()),
                       torch.full((npg.numel(),), 6))
    assert torch.equal(y[marked], x[marked] - 1)
    # community sizes U{5..34}
    sizes = torch.bincount(batch * 6 + y, minlength=6 * npg.numel())
    assert int(sizes.min()) >= 5 and int(sizes.max()) <= 34
    # intra-community edge fraction: C E[s(s-1)]/2 p / (undirected total) = 0.335
    P = G.SBM_PARAMS["cluster"]
    intra = 6 * 435.6667 / 2 * P.p
    frac = (y[ei[0]] == y[ei[1]]).double().mean().item()
    assert frac == pytest.approx(intra / (G.expected_stats("cluster")["edges"] / 2), abs=0.02)


@pytest.mark.parametrize("kind,lo,hi", [("mnist", 40, 75), ("cifar10", 85, 150)])
def test_superpixel_statistics(kind, lo, hi, capsys):
    ei, batch = G.knn_batch(kind, NUM_SBM, seed=0)
    st = G.describe((ei, batch), kind)
    assert kind in capsys.readouterr().out
    npg, epg = _per_graph(ei, batch)
    assert int(npg.min()) >= lo and int(npg.max()) <= hi
    assert torch.equal(epg, 8 * npg)                         # edges = 8 x nodes
    assert torch.equal(torch.bincount(ei[0], minlength=batch.numel()),
                       torch.full((batch.numel(),), 8))     # k = 8 out-edges per node
    assert st["nodes_per_graph"] == pytest.approx(G.PUBLISHED[kind]["nodes"], rel=0.02)
    assert st["edges_per_graph"] == pytest.approx(G.PUBLISHED[kind]["edges"], rel=0.02)
    assert st["self_loops"] == 0 and torch.equal(batch[ei[0]], batch[ei[1]])
    assert torch.unique(ei, dim=1).size(1) == ei.size(1)


@pytest.mark.parametrize("kind", ["coco_sp", "pascalvoc_sp"])
def test_region_graph_statistics(kind):
    ei, batch = G.knn_batch(kind, 300, seed=0)
    st = G.describe((ei, batch), kind, quiet=True)
    pub = G.PUBLISHED[kind]
    assert st["nodes_per_graph"] == pytest.approx(pub["nodes"], rel=0.02)      # ~477 / 479
    assert st["avg_in_degree"] == pytest.approx(pub["avg_degree"], rel=0.15)   # ~5.6
    assert st["edges_per_graph"] == pytest.approx(pub["edges"], rel=0.15)
    assert st["max_in_degree"] <= 16                          # planar-like: low max degree
    assert is_undirected(ei, num_nodes=batch.numel()) and st["self_loops"] == 0
    assert torch.equal(batch[ei[0]], batch[ei[1]])
    assert torch.unique(ei, dim=1).size(1) == ei.size(1)
    assert int(torch.bincount(ei[1], minlength=batch.numel()).min()) >= 1  # connected-ish


@pytest.mark.parametrize("n,avg,mx", [(20_000, 50, 2_000), (5_000, 100, 4_000)])
def test_power_law_statistics(n, avg, mx):
    ei = G.power_law_graph(n, avg, mx, seed=0)
    st = G.describe(ei, "power-law", num_nodes=n, quiet=True)
    assert st["nodes"] == n and int(ei.min()) >= 0 and int(ei.max()) < n
    assert st["avg_in_degree"] == pytest.approx(avg, rel=0.02)
    assert st["max_in_degree"] == pytest.approx(mx, rel=0.15)


def test_power_law_edge_graph():
    """The power-law graph of the edge-feature benchmarks: the same edges as
    power_law_graph, one random D = 16 feature row per edge, seeded."""
    data = G.power_law_edge_graph(2_000, 20, 300, seed=3)
    assert torch.equal(data.edge_index, G.power_law_graph(2_000, 20, 300, seed=3))
    assert data.num_nodes == 2_000
    assert data.edge_attr.shape == (40_000, 16) and data.edge_attr.dtype == torch.float32
    assert data.edge_attr.std().item() == pytest.approx(1.0, rel=0.05)
    assert torch.equal(G.power_law_edge_graph(2_000, 20, 300, seed=3).edge_attr, data.edge_attr)
    other = G.power_law_edge_graph(2_000, 20, 300, edge_dim=4, seed=4)
    assert other.edge_attr.shape == (40_000, 4) and not torch.equal(
        other.edge_attr, data.edge_attr[:, :4])


def test_power_law_rejects_bad_degrees():
    with pytest.raises(ValueError):
        G.power_law_graph(100, 50, 10)


# ----------------------------------------------------------------- determinism
def _flat(ds):
    return tuple(t for d in ds for t in (d.x, d.edge_index, d.y))


@pytest.mark.parametrize("make", [
    lambda s: G.sbm_batch("pattern", 40, seed=s),
    lambda s: G.sbm_batch("cluster", 40, seed=s),
    lambda s: G.knn_batch("mnist", 40, seed=s),
    lambda s: G.knn_batch("coco_sp", 10, seed=s),
    lambda s: (G.power_law_graph(2000, 20, 300, seed=s),),
    lambda s: _flat(G.knn_dataset("cifar10", 5, seed=s)),
    lambda s: _flat(G.sbm_dataset("pattern", 5, seed=s)),
], ids=["pattern", "cluster", "mnist", "coco_sp", "power_law", "knn_dataset", "sbm_dataset"])
def test_same_seed_same_output(make):
    a, b, c = make(1), make(1), make(2)
    assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))
    assert any(u.shape != v.shape or not torch.equal(u, v) for u, v in zip(a, c))


def test_sbm_graph_single():
    g = torch.Generator().manual_seed(0)
    ei, x, y = G.sbm_graph("cluster", g)
    assert x.shape == y.shape and 30 <= x.numel() <= 204
    assert is_undirected(ei, num_nodes=x.numel())


def test_bad_kind():
    with pytest.raises(ValueError):
        G.sbm_batch("zinc", 2)
    with pytest.raises(ValueError):
        G.knn_batch("imagenet", 2)


# ---------------------------------------------------------- PyG Data helpers
def test_sbm_dataset_dataloader():
    from torch_geometric.loader import DataLoader
    ds = G.sbm_dataset("cluster", 50, seed=0)
    ei, batch, x, y = G.sbm_batch("cluster", 50, seed=0)
    assert len(ds) == 50
    d = ds[0]
    assert d.x.shape == (d.num_nodes, 7) and d.x.dtype == torch.float32
    assert torch.equal(d.x.sum(1), torch.ones(d.num_nodes))
    assert d.y.shape == (d.num_nodes,) and d.y.dtype == torch.long
    assert int(d.edge_index.max()) < d.num_nodes and d.is_undirected()
    # the list is the same graphs as the batch
    full = next(iter(DataLoader(ds, batch_size=50, shuffle=False)))
    assert torch.equal(full.edge_index, ei) and torch.equal(full.batch, batch)
    assert torch.equal(full.x.argmax(1), x) and torch.equal(full.y, y)
    ds_int = G.sbm_dataset("pattern", 3, seed=0, one_hot=False)
    assert ds_int[0].x.dtype == torch.long and ds_int[0].x.dim() == 1


@pytest.mark.parametrize("kind,F,C", [("mnist", 3, 10), ("cifar10", 5, 10)])
def test_knn_dataset_superpixels(kind, F, C):
    from torch_geometric.loader import DataLoader
    ds = G.knn_dataset(kind, 20, seed=0)
    d = ds[0]
    assert d.x.shape == (d.num_nodes, F) and d.pos.shape == (d.num_nodes, 2)
    assert torch.equal(d.x[:, -2:], d.pos)                    # normalised centroid last
    assert float(d.x.min()) >= 0 and float(d.x.max()) < 1
    assert d.y.shape == (1,) and 0 <= int(d.y) < C           # synthetic graph label
    assert d.edge_index.size(1) == 8 * d.num_nodes
    b = next(iter(DataLoader(ds, batch_size=8)))
    assert b.y.shape == (8,) and b.num_graphs == 8


def test_knn_dataset_region_graph():
    d = G.knn_dataset("coco_sp", 2, seed=0)[0]
    assert d.x.shape == (d.num_nodes, 14) and d.y.shape == (d.num_nodes,)
    assert int(d.y.max()) < 81


def test_describe_inputs(capsys):
    ds = G.sbm_dataset("pattern", 10, seed=0)
    s1 = G.describe(ds, "pattern")
    ei, batch, _, _ = G.sbm_batch("pattern", 10, seed=0)
    s2 = G.describe(ei, batch=batch)
    s3 = G.describe((ei, batch), "PATTERN")
    from torch_geometric.loader import DataLoader
    s4 = G.describe(next(iter(DataLoader(ds, batch_size=10))), "pattern")
    keys = ("graphs", "nodes", "edges", "nodes_per_graph", "edges_per_graph", "avg_in_degree",
            "max_in_degree", "min_nodes", "max_nodes")
    for s in (s2, s3, s4):
        assert {k: s[k] for k in keys} == {k: s1[k] for k in keys}
    assert s1["graphs"] == 10 and s1["edges"] == ei.size(1)
    assert s1["max_in_degree"] == int(torch.bincount(ei[1]).max())
    assert "published" in s1 and "published" not in s2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and all("in-degree avg" in line for line in out)
    one = G.describe(datasets.load("pattern", num_graphs=1)[0], "one graph")
    assert one["graphs"] == 1


def test_datasets_load_generated():
    for name, n in (("pattern", 4), ("CLUSTER", 4), ("mnist", 4), ("cifar10", 4), ("coco_sp", 2),
                    ("coco-sp", 2), ("pascalvoc_sp", 2)):
        ds = datasets.load(name, num_graphs=n, seed=5)
        assert isinstance(ds, list) and len(ds) == n and ds[0].edge_index.size(1) > 0
    a = datasets.load("pattern", num_graphs=3, seed=5)
    b = datasets.sbm_dataset("pattern", 3, seed=5)
    assert all(torch.equal(u.edge_index, v.edge_index) for u, v in zip(a, b))
    for name in ("pattern", "cluster", "mnist", "cifar10", "cocosp"):
        assert name in datasets.available()
