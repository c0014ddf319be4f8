"""Dataset loaders of benchmarks/: sizes from the data folder's README.md, no writes
into the data folder, and the data folder only where it is named (root= or
$PYG_DFGNN_DATA)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch_geometric.utils import degree

from benchmarks import datasets
from conftest import needs_data



def _snapshot(root: Path):
    """Every file and folder under root, with size and mtime of files."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        out[dirpath] = None
        for f in filenames:
            st = os.stat(os.path.join(dirpath, f))
            out[os.path.join(dirpath, f)] = (st.st_size, st.st_mtime_ns)
    return out


def _max_in_degree(data) -> int:
    return int(degree(data.edge_index[1], data.num_nodes).max())


@pytest.fixture(scope="module")
def cora():
    return datasets.planetoid("Cora")


@needs_data
def test_cora(cora):
    assert cora.num_nodes == 2708
    assert cora.edge_index.shape == (2, 10556)
    assert cora.x.shape == (2708, 1433)
    assert int(cora.y.max()) + 1 == 7
    assert [int(cora[f"{s}_mask"].sum()) for s in ("train", "val", "test")] == [140, 500, 1000]
    assert _max_in_degree(cora) == 168
    assert not cora.has_self_loops() and cora.is_undirected()


@needs_data
def test_citeseer():
    data = datasets.load("CiteSeer")
    assert data.num_nodes == 3327
    assert data.edge_index.shape == (2, 9104)
    assert data.x.shape == (3327, 3703)
    assert [int(data[f"{s}_mask"].sum()) for s in ("train", "val", "test")] == [120, 500, 1000]
    assert _max_in_degree(data) == 99


@needs_data
def test_planetoid_transform_and_errors(cora):
    import torch_geometric.transforms as T
    data = datasets.planetoid("cora", transform=T.NormalizeFeatures())
    assert torch.allclose(data.x.sum(-1)[cora.x.sum(-1) > 0], torch.ones(1))
    with pytest.raises(ValueError, match="pubmed_graph"):
        datasets.planetoid("PubMed")
    with pytest.raises(ValueError, match="unknown"):
        datasets.planetoid("Amazon")


@needs_data
def test_pubmed_graph():
    data = datasets.pubmed_graph(num_features=16, seed=1)
    assert data.num_nodes == 19717
    assert data.edge_index.shape == (2, 88648)
    assert data.x.shape == (19717, 16)
    assert torch.bincount(data.y).tolist() == [4103, 7739, 7875]
    assert [int(data[f"{s}_mask"].sum()) for s in ("train", "val", "test")] == [60, 500, 1000]
    assert _max_in_degree(data) == 171
    again = datasets.pubmed_graph(num_features=16, seed=1)
    assert torch.equal(data.x, again.x)  # seeded features


@needs_data
def test_mutag():
    ds = datasets.tu_dataset("MUTAG")
    assert len(ds) == 188
    assert ds.num_features == 7 and ds.num_classes == 2
    assert sum(g.num_nodes for g in ds) == 3371
    assert sum(g.num_edges for g in ds) == 7442


@needs_data
def test_musae_github():
    data = datasets.musae_github()
    assert data.num_nodes == 37700
    assert data.edge_index.shape == (2, 578006)
    assert _max_in_degree(data) == 9458
    assert data.y.shape == (37700,) and int(data.y.max()) == 1
    assert data.x is None  # git.json is not staged


@needs_data
def test_load_dispatch():
    assert {"cora", "citeseer", "pubmed", "mutag", "enzymes", "proteins", "github"} <= set(
        datasets.available())
    assert datasets.load("musae_github").num_nodes == 37700
    with pytest.raises(ValueError, match="available"):
        datasets.load("no-such-graph")


def test_missing_env_dir_fails_loudly(monkeypatch, tmp_path):
    monkeypatch.setenv(datasets.ENV_DATA, str(tmp_path / "nowhere"))
    monkeypatch.setattr(datasets, "_COPIES", {})
    with pytest.raises(FileNotFoundError, match="nowhere"):
        datasets.planetoid("Cora")  # no silent download
    with pytest.raises(FileNotFoundError, match="nowhere"):
        datasets.ogbn_arxiv()


def test_missing_root_fails_loudly(monkeypatch, tmp_path):
    monkeypatch.delenv(datasets.ENV_DATA, raising=False)
    for load in (lambda r: datasets.planetoid("Cora", root=r), lambda r: datasets.musae_github(r),
                 lambda r: datasets.load("mutag", root=r), datasets.ogbn_arxiv):
        with pytest.raises(FileNotFoundError, match="nowhere"):
            load(tmp_path / "nowhere")


def test_data_dir_is_only_what_is_named(monkeypatch, tmp_path):
    """No implicit folder next to the checkout: an argument, the variable, or None
    (then PyG downloads)."""
    monkeypatch.delenv(datasets.ENV_DATA, raising=False)
    assert datasets.data_dir() is None
    assert datasets.data_dir(tmp_path) == tmp_path.resolve()
    monkeypatch.setenv(datasets.ENV_DATA, str(tmp_path / "env"))
    assert datasets.data_dir() == (tmp_path / "env").resolve()
    assert datasets.data_dir(tmp_path) == tmp_path.resolve()  # the argument wins
    monkeypatch.setenv(datasets.ENV_DATA, "")
    assert datasets.data_dir() is None


@needs_data
def test_explicit_root_over_env(monkeypatch, tmp_path):
    root = datasets.data_dir()
    monkeypatch.setenv(datasets.ENV_DATA, str(tmp_path / "nowhere"))
    assert datasets.musae("chameleon", root=root).num_nodes == 2277


@needs_data
def test_ogbn_arxiv():
    data = datasets.ogbn_arxiv()
    n = 169343
    assert data.num_nodes == n and data.x is None
    assert data.edge_index.shape == (2, 2315598) and data.edge_index.dtype == torch.long
    assert data.is_undirected() and not data.has_self_loops()
    assert data.y.shape == (n,) and data.y.dtype == torch.long and int(data.y.max()) == 39
    sizes = [int(data[f"{s}_mask"].sum()) for s in ("train", "val", "test")]
    assert sizes == [90941, 29799, 48603]
    assert not (data.train_mask & data.test_mask).any()
    assert datasets.load("ogbn-arxiv").num_nodes == n


@needs_data
def test_loaders_never_write_into_the_data_folder(monkeypatch):
    root = datasets.data_dir()
    before = _snapshot(root)
    # Fresh per-process state, so the copies are made (and processed) again here.
    monkeypatch.setattr(datasets, "_COPIES", {})
    monkeypatch.setattr(datasets, "_TMP_ROOT", None)
    datasets.planetoid("Cora")
    datasets.planetoid("CiteSeer")
    datasets.tu_dataset("MUTAG")
    datasets.pubmed_graph(num_features=4)
    datasets.musae("chameleon")
    datasets.ogbn_arxiv()
    # PyG processed the private copies, not the originals.
    copy = datasets._COPIES[root / "Planetoid" / "Cora"]
    assert (copy / "processed").is_dir()
    assert not str(copy).startswith(str(root))
    assert not (root / "Planetoid" / "Cora" / "processed").exists()
    assert _snapshot(root) == before


def test_failed_download_keeps_what_was_there(monkeypatch, tmp_path):
    """A failed download removes only the folders it created."""
    from torch_geometric.datasets import TUDataset

    def offline(self):
        raise OSError("Name or service not known")

    monkeypatch.setattr(TUDataset, "download", offline)
    monkeypatch.delenv(datasets.ENV_DATA, raising=False)
    monkeypatch.setenv(datasets.ENV_CACHE, str(tmp_path))
    (tmp_path / "Planetoid").mkdir()  # another dataset's download
    with pytest.raises(datasets.DataUnavailable) as e:
        datasets.tu_dataset("MUTAG")
    assert len(str(e.value).splitlines()) == 2 and "TUDataset/MUTAG/raw/" in str(e.value)
    assert not (tmp_path / "TUDataset").exists() and (tmp_path / "Planetoid").is_dir()
    keep = tmp_path / "TUDataset" / "MUTAG" / "mine.txt"  # a folder there before
    keep.parent.mkdir(parents=True)
    keep.write_text("x")
    with pytest.raises(datasets.DataUnavailable):
        datasets.tu_dataset("MUTAG")
    assert keep.read_text() == "x"


# ------------------------------------------------------------ MoleculeNet HIV
def _rdkit():
    return pytest.importorskip("rdkit", reason=f"needs RDKit ({datasets.RDKIT_HINT})")


def _hiv_rows(root: Path, n: int):
    """The first n rows of HIV.csv whose SMILES RDKit parses into atoms, read
    with the csv module (an independent reading of the file)."""
    import csv
    from rdkit import Chem, RDLogger
    RDLogger.DisableLog("rdApp.*")
    rows = []
    with open(root / "MoleculeNet" / "hiv" / "raw" / "HIV.csv", newline="") as f:
        for row in csv.DictReader(f):
            mol = Chem.MolFromSmiles(row["smiles"])
            if mol is not None and mol.GetNumAtoms() > 0:
                rows.append(row)
            if len(rows) == n:
                return rows


@needs_data
def test_hiv_first_molecules_leave_the_data_folder_alone(monkeypatch):
    _rdkit()
    root = datasets.data_dir()
    before = _snapshot(root)
    monkeypatch.setattr(datasets, "_COPIES", {})
    monkeypatch.setattr(datasets, "_TMP_ROOT", None)
    # Row 137 of HIV.csv gives no atom: the 140 molecules span 141 rows.
    ds = datasets.load("moleculenet-hiv", limit=140)
    rows = _hiv_rows(root, 140)
    assert len(ds) == 140 and list(ds.smiles) == [r["smiles"] for r in rows]
    assert ds.y.view(-1).tolist() == [float(r["HIV_active"]) for r in rows]
    g = ds[139]
    assert g.x.dtype == g.edge_attr.dtype == torch.long
    assert g.x.size(1) == 9 and g.edge_attr.shape == (g.edge_index.size(1), 3)
    assert g.is_undirected() and g.y.shape == (1, 1)
    assert _snapshot(root) == before and not (root / "MoleculeNet" / "hiv" / "processed").exists()


@needs_data
def test_hiv_batch():
    _rdkit()
    batch = datasets.hiv_batch(128)
    assert batch.num_graphs == 128 and batch.y.shape == (128, 1)
    assert batch.edge_attr.shape == (batch.edge_index.size(1), 3)
    assert batch.x.shape == (batch.num_nodes, 9)
    assert 15 < batch.num_nodes / 128 < 40  # about 25.5 atoms per molecule in HIV


@needs_data
def test_hiv_batches_join_as_pygs_batch(tmp_path):
    """A file of batches written from hiv_batch's molecules (as a machine with
    RDKit writes it for one without) gives the graph of hiv_batch: the batches
    joined with PyG's Batch offsets."""
    _rdkit()
    from torch_geometric.data import Batch
    mols = list(datasets.moleculenet_hiv(limit=12))
    parts = [Batch.from_data_list(mols[i:i + 4]) for i in (0, 4, 8)]
    torch.save({4: [{"x": b.x, "edge_index": b.edge_index, "edge_attr": b.edge_attr,
                     "num_graphs": b.num_graphs} for b in parts]}, tmp_path / "hiv.pt")
    got, want = datasets.hiv_batches(tmp_path / "hiv.pt", 12), datasets.hiv_batch(12)
    assert got.num_graphs == 12 and got.num_nodes == want.num_nodes
    for key in ("x", "edge_index", "edge_attr"):
        assert torch.equal(got[key], want[key]), key
    with pytest.raises(FileNotFoundError):
        datasets.hiv_batches(tmp_path / "none.pt")


def test_hiv_failed_download_is_two_lines(monkeypatch, tmp_path):
    _rdkit()
    from torch_geometric.datasets import MoleculeNet

    def offline(self):
        raise OSError("Name or service not known")

    monkeypatch.setattr(MoleculeNet, "download", offline)
    monkeypatch.delenv(datasets.ENV_DATA, raising=False)
    monkeypatch.setenv(datasets.ENV_CACHE, str(tmp_path))
    with pytest.raises(datasets.DataUnavailable) as e:
        datasets.moleculenet_hiv(limit=10)
    assert len(str(e.value).splitlines()) == 2
    assert "MoleculeNet/hiv/raw/HIV.csv" in str(e.value)
    assert not (tmp_path / "MoleculeNet").exists()


def test_hiv_without_rdkit_says_what_to_install(monkeypatch, tmp_path):
    """SMILES without a processed copy need RDKit (a data folder with the raw file
    only: one with processed files is read without RDKit)."""
    raw = tmp_path / "MoleculeNet" / "hiv" / "raw"
    raw.mkdir(parents=True)
    (raw / "HIV.csv").write_text("smiles,activity,HIV_active\nCCO,CI,0\n")
    monkeypatch.setitem(sys.modules, "rdkit", None)  # import rdkit raises ImportError
    with pytest.raises(ModuleNotFoundError) as e:
        datasets.moleculenet_hiv(tmp_path)
    assert "pip install rdkit" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ModuleNotFoundError, match="pip install rdkit"):
        datasets.scaffold_split(["CCO"])


def test_scaffold_split_groups_scaffolds_as_ogb():
    """OGB's rule on 11 molecules: scaffold groups largest first (benzene 4,
    acyclic 3, pyridine 2, then naphthalene and cyclohexane, 1 each, the later
    first molecule first), each into train while train stays <= 80 % (8.8),
    else into validation while train + validation stays <= 90 % (9.9), else
    into test."""
    _rdkit()
    smiles = ["Cc1ccccc1", "CCO", "Cc1ccncc1", "Oc1ccccc1", "CC1CCCCC1", "CCN",
              "Nc1ccccc1", "Oc1ccncc1", "Cc1ccc2ccccc2c1", "CCCC", "CCc1ccccc1"]
    # benzene 0 3 6 10, acyclic 1 5 9, pyridine 2 7, cyclohexane 4, naphthalene 8
    split = datasets.scaffold_split(smiles)
    assert {k: v.tolist() for k, v in split.items()} == {
        "train": [0, 1, 3, 5, 6, 8, 9, 10], "val": [2, 7], "test": [4]}
    again = datasets.scaffold_split(smiles)
    assert all(torch.equal(split[k], again[k]) for k in split)


def test_random_split_is_seeded_disjoint_and_covering():
    a, b, c = (datasets.random_split(1000, seed=s) for s in (1, 1, 2))
    assert [len(a[k]) for k in ("train", "val", "test")] == [800, 100, 100]
    assert torch.equal(torch.cat(list(a.values())).sort().values, torch.arange(1000))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["test"], c["test"])
