r"""Dataset loaders for the examples, tests and benchmarks.

Each loader takes ``root``, a read-only data folder laid out as
``<root>/Planetoid/Cora/raw/...``, ``<root>/MUSAE/GitHub/...``,
``<root>/ogbn-arxiv/...`` and so on. Where it comes from (:func:`data_dir`):

1. ``root``: the scripts' ``--data DIR`` (:func:`add_data_argument`);
2. else the folder named by ``$PYG_DFGNN_DATA``;
3. else none: PyG downloads the dataset into ``$PYG_DFGNN_CACHE`` (default
   ``~/.cache/pyg_dfgnn``).

A folder that is named but lacks the dataset raises :class:`DataUnavailable`
(a :class:`FileNotFoundError`) saying what was expected there, instead of
downloading silently. A failed download raises it too, in two lines (what was
tried, what to pass) and leaves no half-written folder behind; the scripts print
those lines and exit (:func:`exit_on_missing_data`).

PyG writes a ``processed/`` folder next to ``raw/``. So that it never writes into
the data folder, each dataset folder is first copied (once per process) to a
temporary directory, and PyG reads the copy. The copies are removed when the
process exits. Loaders that parse the files themselves (:func:`pubmed_graph`,
:func:`musae`, :func:`ogbn_arxiv`) read the data folder directly and write
nothing.

Example:

.. code-block:: python

    from benchmarks import datasets
    data = datasets.planetoid('Cora', root='/data')  # Data(x=[2708, 1433], ...)
    data = datasets.load('github')            # $PYG_DFGNN_DATA, else a PyG download
"""
from __future__ import annotations

import atexit
import contextlib
import csv
import json
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

__all__ = ["data_dir", "cache_dir", "planetoid", "pubmed_graph", "tu_dataset", "musae",
           "musae_github", "ogbn_arxiv", "actor", "webkb", "load", "available",
           "moleculenet_hiv", "hiv_processed", "process_hiv", "MoleculeStorage",
           "MoleculeFeatures", "murcko_scaffold", "hiv_batch", "hiv_batches", "scaffold_split",
           "random_split", "require_rdkit", "DataUnavailable", "add_data_argument",
           "exit_on_missing_data", "dataset_folder"]

#: Environment variable naming the data folder when no ``root`` is given.
ENV_DATA = "PYG_DFGNN_DATA"
#: Environment variable for the download cache used when there is no data folder.
ENV_CACHE = "PYG_DFGNN_CACHE"

_PathLike = Union[str, os.PathLike]

# source folder (or (folder, limit) for a dataset's first rows) -> its private
# copy, for this process.
_COPIES: Dict[object, Path] = {}
_TMP_ROOT: Optional[Path] = None


class DataUnavailable(FileNotFoundError):
    r"""A dataset is neither in the data folder nor downloadable. ``str(e)`` is
    two lines: what was tried, and what to pass instead."""


# --------------------------------------------------------------------- paths
def data_dir(root: Optional[_PathLike] = None) -> Optional[Path]:
    r"""The data folder: ``root`` if given, else ``$PYG_DFGNN_DATA`` if set,
    else ``None`` (the loaders then download through PyG).

    The folder is returned even if it does not exist, so a wrong path fails
    loudly instead of silently downloading.
    """
    if root is None:
        root = os.environ.get(ENV_DATA) or None
    return None if root is None else Path(root).expanduser().resolve()


def cache_dir() -> Path:
    r"""Where PyG downloads datasets when there is no data folder
    (``$PYG_DFGNN_CACHE``, default ``~/.cache/pyg_dfgnn``)."""
    return Path(os.environ.get(ENV_CACHE) or "~/.cache/pyg_dfgnn").expanduser()


def add_data_argument(parser, what: str = "Planetoid/Cora/raw/, ogbn-arxiv/, MUSAE/GitHub/ "
                      "...") -> None:
    r"""Adds the scripts' ``--data DIR`` option to an :mod:`argparse` parser."""
    parser.add_argument(
        "--data", metavar="DIR", default=None,
        help=f"data folder holding {what} (read only; default: ${ENV_DATA}, else PyG "
             f"downloads into ${ENV_CACHE} or ~/.cache/pyg_dfgnn)")


@contextlib.contextmanager
def exit_on_missing_data() -> Iterator[None]:
    r"""Turns :class:`DataUnavailable` into its two lines on stderr and exit
    status 1, without a traceback: for the scripts' entry points."""
    try:
        yield
    except DataUnavailable as e:
        sys.exit(str(e))


def _named_by(root: Optional[_PathLike]) -> str:
    return "--data" if root is not None else f"${ENV_DATA}"


def dataset_folder(root: Optional[_PathLike], *parts: str) -> Optional[Path]:
    """``data_dir(root)/parts``, or ``None`` without a data folder (a check
    before work starts: the loaders call it too).

    Raises:
        DataUnavailable: the data folder is named but lacks ``parts``.
    """
    base = data_dir(root)
    if base is None:
        return None
    path = base.joinpath(*parts)
    if not path.exists():
        where = "does not exist" if not base.is_dir() else f"has no {'/'.join(parts)}/"
        raise DataUnavailable(
            f"the data folder {base} (from {_named_by(root)}) {where}.\n"
            f"Expected {base}/{'/'.join(parts)}/ (the files PyG downloads); pass another "
            f"--data DIR, or neither --data nor ${ENV_DATA} to download through PyG.")
    return path


def _tmp_root() -> Path:
    global _TMP_ROOT
    if _TMP_ROOT is None:
        _TMP_ROOT = Path(tempfile.mkdtemp(prefix="pyg_dfgnn_data_"))
        atexit.register(shutil.rmtree, _TMP_ROOT, ignore_errors=True)
    return _TMP_ROOT


def _private_copy(root: Optional[_PathLike], *parts: str) -> Optional[Path]:
    r"""A private, writable copy of ``data_dir(root)/parts``, made once per process.

    PyG writes ``processed/`` into the copy, never into the data folder.
    Returns ``None`` without a data folder.
    """
    src = dataset_folder(root, *parts)
    if src is None:
        return None
    if src not in _COPIES:
        dst = _tmp_root().joinpath(str(len(_COPIES)), *parts)
        shutil.copytree(src, dst)
        _COPIES[src] = dst
    return _COPIES[src]


@contextlib.contextmanager
def _download(what: str, target: Path, layout: str) -> Iterator[None]:
    r"""Runs a PyG download of ``what`` into ``target``. A failure removes the
    folders the attempt created and raises :class:`DataUnavailable`; a
    dataset already there is not touched."""
    new = target
    while not new.parent.exists():
        new = new.parent
    created = not new.exists()
    try:
        yield
    except BaseException as e:
        if created:
            shutil.rmtree(new, ignore_errors=True)
        if not isinstance(e, OSError):
            raise
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataUnavailable(
            f"could not download {what} through PyG into {target} ({reason}).\n"
            f"Pass --data DIR or set {ENV_DATA}=DIR, where DIR holds {layout} (the files "
            "PyG downloads).") from None


def _pyg_dataset(root: Optional[_PathLike], name: str, sub: str, make: Callable):
    r"""``make(dir)`` for a PyG dataset class that expects ``<dir>/<sub>/raw``
    (Planetoid, TUDataset, WebKB): ``dir`` is the parent of a private copy of
    ``<name>/<sub>``, or, without a data folder, the download cache."""
    copy = _private_copy(root, name, sub)
    if copy is not None:
        return make(str(copy.parent))
    path = cache_dir() / name
    with _download(f"{name}/{sub}", path / sub, f"{name}/{sub}/raw/"):
        return make(str(path))


# ----------------------------------------------------------------- Planetoid
_PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}


def planetoid(name: str, split: str = "public", transform: Optional[Callable] = None,
              root: Optional[_PathLike] = None, **kwargs) -> Data:
    r"""A Planetoid citation graph (Cora or CiteSeer) with its split masks.

    Source: ``Planetoid/<Name>/raw/ind.<name>.*`` (the files of
    ``kimiyoung/planetoid``, the ones :class:`torch_geometric.datasets.Planetoid`
    downloads), loaded by :class:`~torch_geometric.datasets.Planetoid` from a
    private copy.

    Args:
        name (str): ``"Cora"`` or ``"CiteSeer"`` (case-insensitive). PubMed's
            feature file is not in the data folder: use :func:`pubmed_graph`.
        split (str): ``"public"`` (default, the Planetoid split: 20 nodes per
            class for training, 500 validation, 1,000 test) or any other
            ``split`` of :class:`~torch_geometric.datasets.Planetoid`
            (``"geom-gcn"`` gives masks of shape ``[N, 10]``).
        transform (callable, optional): applied to the returned graph, e.g.
            :class:`torch_geometric.transforms.NormalizeFeatures`.
        root (str, optional): the data folder (see :func:`data_dir`).
        **kwargs: passed on to :class:`~torch_geometric.datasets.Planetoid`.

    Returns:
        :class:`~torch_geometric.data.Data` with ``x`` ``[N, F]`` (bag-of-words),
        ``edge_index`` ``[2, E]`` (undirected: each edge in both directions, no
        self-loops), ``y`` ``[N]`` and boolean ``train_mask``, ``val_mask``,
        ``test_mask`` ``[N]``. Cora: N=2,708, E=10,556, F=1,433, 7 classes;
        CiteSeer: N=3,327, E=9,104, F=3,703, 6 classes.
    """
    from torch_geometric.datasets import Planetoid

    key = name.lower()
    if key not in _PLANETOID:
        raise ValueError(f"unknown Planetoid dataset {name!r}; expected Cora, CiteSeer or PubMed")
    name = _PLANETOID[key]
    if name == "PubMed" and data_dir(root) is not None:
        raise ValueError("PubMed's features (ind.pubmed.allx) are not in the data folder; "
                         "use benchmarks.datasets.pubmed_graph() for the graph")
    # The geom-gcn files live under <Name>/geom-gcn/raw, so one copy serves every split.
    ds = _pyg_dataset(root, "Planetoid", name,
                      lambda r: Planetoid(root=r, name=name, split=split, **kwargs))
    data = ds[0]
    return transform(data) if transform is not None else data


def _load_pickle(path: Path):
    import warnings
    with open(path, "rb") as f, warnings.catch_warnings():
        # the 2016 pickles name scipy.sparse.csr.csr_matrix (a deprecated path)
        warnings.simplefilter("ignore", DeprecationWarning)
        return pickle.load(f, encoding="latin1")


def pubmed_graph(num_features: int = 500, seed: int = 0,
                 root: Optional[_PathLike] = None) -> Data:
    r"""The PubMed citation graph with its labels and public split, and **random**
    node features.

    Source: ``Planetoid/PubMed/raw/ind.pubmed.{graph,ally,ty,test.index,...}``
    (``kimiyoung/planetoid``). The 500-d TF-IDF feature matrix ``ind.pubmed.allx``
    is not in the data folder, so ``x`` is drawn from a standard normal
    distribution: use this graph for kernel tests and benchmarks, not to report
    accuracy. Graph, labels and masks are identical to
    ``Planetoid(name='PubMed')``. Without a data folder, the graph is taken from
    a PyG download and ``x`` is still replaced by random features, so the result
    does not depend on where the data came from.

    Args:
        num_features (int): width of the random features (default: 500, as
            PubMed).
        seed (int): seed of the feature generator.
        root (str, optional): the data folder (see :func:`data_dir`).

    Returns:
        :class:`~torch_geometric.data.Data` with ``x`` ``[19717, num_features]``,
        ``edge_index`` ``[2, 88648]``, ``y`` ``[19717]`` (3 classes) and
        ``train_mask`` (60), ``val_mask`` (500), ``test_mask`` (1,000).
    """
    from torch_geometric.io.planetoid import edge_index_from_dict
    from torch_geometric.utils import index_to_mask

    raw = dataset_folder(root, "Planetoid", "PubMed", "raw")
    if raw is None:
        from torch_geometric.datasets import Planetoid
        data = _pyg_dataset(root, "Planetoid", "PubMed",
                            lambda r: Planetoid(root=r, name="PubMed"))[0]
        data = Data(edge_index=data.edge_index, y=data.y, num_nodes=data.num_nodes,
                    train_mask=data.train_mask, val_mask=data.val_mask,
                    test_mask=data.test_mask)
    else:
        def L(s):
            return _load_pickle(raw / f"ind.pubmed.{s}")

        n = 19717
        test = torch.tensor([int(line) for line in open(raw / "ind.pubmed.test.index")])
        ally, ty, x_train = L("ally"), L("ty"), L("x")
        y = np.zeros(n, dtype=np.int64)
        y[:ally.shape[0]] = np.asarray(ally).argmax(1)
        y[test.numpy()] = np.asarray(ty).argmax(1)
        n_train = x_train.shape[0]  # 60: the public training nodes are 0..59
        data = Data(edge_index=edge_index_from_dict(L("graph"), num_nodes=n),
                    y=torch.from_numpy(y), num_nodes=n,
                    train_mask=index_to_mask(torch.arange(n_train), n),
                    val_mask=index_to_mask(torch.arange(n_train, n_train + 500), n),
                    test_mask=index_to_mask(test, n))
    gen = torch.Generator().manual_seed(seed)
    data.x = torch.randn(data.num_nodes, num_features, generator=gen)
    return data


# ---------------------------------------------------------------- TUDataset
_TU = {"mutag": "MUTAG", "enzymes": "ENZYMES", "proteins": "PROTEINS"}


def tu_dataset(name: str, root: Optional[_PathLike] = None, **kwargs):
    r"""A TU graph-classification dataset: MUTAG, ENZYMES or PROTEINS.

    Source: ``TUDataset/<NAME>/raw/<NAME>_*.txt`` (TU Dortmund benchmark files),
    loaded by :class:`~torch_geometric.datasets.TUDataset` from a private copy.
    PROTEINS was staged from PROTEINS_full without its continuous node
    attributes; with the default ``use_node_attr=False`` its tensors are those
    of the standard PROTEINS.

    Args:
        name (str): ``"MUTAG"``, ``"ENZYMES"`` or ``"PROTEINS"`` (case-insensitive).
        root (str, optional): the data folder (see :func:`data_dir`).
        **kwargs: passed on to :class:`~torch_geometric.datasets.TUDataset`
            (e.g. ``use_node_attr=True`` for ENZYMES' 18 node attributes,
            ``transform``).

    Returns:
        :class:`~torch_geometric.datasets.TUDataset` of
        :class:`~torch_geometric.data.Data` graphs with ``x`` ``[N_i, F]``,
        ``edge_index`` ``[2, E_i]`` and a graph label ``y`` ``[1]``. MUTAG: 188
        graphs, F=7, 2 classes (and ``edge_attr`` ``[E_i, 4]``); ENZYMES: 600,
        F=3, 6 classes; PROTEINS: 1,113, F=3, 2 classes.
    """
    from torch_geometric.datasets import TUDataset

    key = name.lower()
    if key not in _TU:
        raise ValueError(f"unknown TU dataset {name!r}; expected one of {sorted(_TU.values())}")
    name = _TU[key]
    return _pyg_dataset(root, "TUDataset", name, lambda r: TUDataset(root=r, name=name, **kwargs))


# -------------------------------------------------------------------- MUSAE
_MUSAE = {  # name -> (folder, file prefix, label column)
    "github": ("GitHub", "git", "ml_target"),
    "squirrel": ("Wikipedia-squirrel", "squirrel", "target"),
    "chameleon": ("Wikipedia-chameleon", "chameleon", "target"),
}


def musae(name: str, root: Optional[_PathLike] = None) -> Data:
    r"""A MUSAE social/web graph: ``"github"``, ``"squirrel"`` or ``"chameleon"``.

    Source: ``MUSAE/<folder>/<k>_edges.csv``, ``<k>_target.csv`` and ``<k>.json``
    (``benedekrozemberczki/MUSAE``, GPL-3.0), parsed directly (nothing is
    written). The edge list is symmetrized with
    :func:`~torch_geometric.utils.to_undirected`. These graphs have **super
    nodes** (GitHub: maximum in-degree 9,458; squirrel: 1,903), the case DF-GNN's
    PMF schedule is for.

    Args:
        name (str): ``"github"``, ``"squirrel"`` or ``"chameleon"``
            (case-insensitive).
        root (str, optional): the data folder (see :func:`data_dir`).

    Returns:
        :class:`~torch_geometric.data.Data` with ``edge_index`` ``[2, E]``,
        ``num_nodes`` and:

        * GitHub (37,700 nodes, 578,006 edges): ``y`` ``[N]`` (2 classes, web vs.
          machine-learning developer); no ``x`` (the features file is not
          in the data folder).
        * squirrel (5,201 nodes, 396,846 edges incl. 140 self-loops) and
          chameleon (2,277 nodes, 62,792 edges incl. 50 self-loops): ``x``
          ``[N, F]`` multi-hot features and ``y`` ``[N]`` float traffic counts
          (a regression target).

        Without a data folder, GitHub is downloaded through
        :class:`torch_geometric.datasets.GitHub` (same topology, 128-d ``x``);
        the Wikipedia graphs raise :class:`DataUnavailable`.
    """
    from torch_geometric.utils import to_undirected

    key = name.lower()
    if key not in _MUSAE:
        raise ValueError(f"unknown MUSAE dataset {name!r}; expected one of {sorted(_MUSAE)}")
    folder, k, label = _MUSAE[key]
    src = dataset_folder(root, "MUSAE", folder)
    if src is None:
        if key == "github":
            from torch_geometric.datasets import GitHub
            path = cache_dir() / "GitHub"
            with _download("GitHub", path, "MUSAE/GitHub/git_edges.csv and git_target.csv"):
                return GitHub(root=str(path))[0]
        raise DataUnavailable(f"MUSAE/{folder} needs a data folder: PyG has no loader for it.\n"
                              f"Pass --data DIR or set {ENV_DATA}=DIR, where DIR holds "
                              f"MUSAE/{folder}/{k}_edges.csv and {k}_target.csv.")
    with open(src / f"{k}_target.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    n = len(rows)
    with open(src / f"{k}_edges.csv", encoding="utf-8") as f:
        reader = csv.reader(f)
        next(reader)  # header
        e = torch.tensor([[int(a), int(b)] for a, b in reader], dtype=torch.long).t()
    data = Data(edge_index=to_undirected(e, num_nodes=n), num_nodes=n)
    ids = torch.tensor([int(r["id"]) for r in rows])
    if key == "github":
        classes = sorted({r[label] for r in rows})
        data.y = torch.empty(n, dtype=torch.long)
        data.y[ids] = torch.tensor([classes.index(r[label]) for r in rows])
    else:
        data.y = torch.empty(n, dtype=torch.float)
        data.y[ids] = torch.tensor([float(r[label]) for r in rows])
    feat = src / f"{k}.json"
    if feat.exists():
        with open(feat, encoding="utf-8") as f:
            active = json.load(f)
        width = 1 + max(max(v) for v in active.values() if v)
        data.x = torch.zeros(n, width)
        for i, v in active.items():
            if v:
                data.x[int(i), torch.tensor(v)] = 1.0
    return data


def musae_github(root: Optional[_PathLike] = None) -> Data:
    r"""The MUSAE GitHub developer graph: 37,700 nodes, 578,006 (directed)
    edges, maximum in-degree 9,458 (21 nodes above 1,000): a real graph with
    super nodes. ``y`` ``[N]`` has 2 classes; there is no ``x`` in the data
    folder (PyG's download has a 128-d ``x``).

    Source: ``MUSAE/GitHub/git_edges.csv`` and ``git_target.csv``. See
    :func:`musae`.

    Returns:
        :class:`~torch_geometric.data.Data` with ``edge_index`` ``[2, 578006]``,
        ``y`` ``[37700]`` and ``num_nodes=37700``.
    """
    return musae("github", root=root)


# --------------------------------------------------------------- ogbn-arxiv
def ogbn_arxiv(root: Optional[_PathLike] = None) -> Data:
    r"""The ogbn-arxiv citation graph (Open Graph Benchmark) with its labels and
    the OGB time split, and **no** node features.

    Source: ``ogbn-arxiv/edges.npz`` (``edge_index`` int32 ``[2, 1166243]``,
    citing -> cited), ``labels.npy`` and ``split.npy`` (0 train, 1 valid, 2 test),
    read directly (nothing is written). Without a data folder the graph comes
    from the ``ogb`` package's download, if it is installed, reduced to the same
    fields. Give the nodes stand-in features (random, or a learned
    :class:`torch.nn.Embedding`).

    Args:
        root (str, optional): the data folder (see :func:`data_dir`).

    Returns:
        :class:`~torch_geometric.data.Data` with ``num_nodes=169343``,
        ``edge_index`` ``[2, 2315598]`` (undirected:
        :func:`~torch_geometric.utils.to_undirected`), ``y`` ``[N]`` int64 (40
        classes) and boolean ``train_mask`` (90,941), ``val_mask`` (29,799),
        ``test_mask`` (48,603).

    Raises:
        DataUnavailable: no data folder and no ``ogb`` package, a data folder
            without ``ogbn-arxiv/``, or a failed download.
    """
    from torch_geometric.utils import index_to_mask, to_undirected

    src = dataset_folder(root, "ogbn-arxiv")
    if src is None:
        try:
            from ogb.nodeproppred import PygNodePropPredDataset
        except ImportError:
            raise DataUnavailable(
                "ogbn-arxiv needs a data folder or the ogb package to download it.\n"
                f"Pass --data DIR or set {ENV_DATA}=DIR, where DIR holds ogbn-arxiv/edges.npz, "
                "labels.npy and split.npy, or pip install ogb.") from None
        path = cache_dir() / "ogb"
        with _download("ogbn-arxiv", path / "ogbn_arxiv",
                       "ogbn-arxiv/edges.npz, labels.npy and split.npy"):
            ds = PygNodePropPredDataset("ogbn-arxiv", root=str(path))
        n = ds[0].num_nodes
        edge_index, y = ds[0].edge_index, ds[0].y.view(-1).long()
        masks = {k: index_to_mask(v, n) for k, v in ds.get_idx_split().items()}
        masks["val"] = masks.pop("valid")
    else:
        edge_index = torch.from_numpy(np.load(src / "edges.npz")["edge_index"]).long()
        y = torch.from_numpy(np.load(src / "labels.npy").astype(np.int64))
        split = torch.from_numpy(np.load(src / "split.npy"))
        n = y.numel()
        masks = {"train": split == 0, "val": split == 1, "test": split == 2}
    return Data(edge_index=to_undirected(edge_index, num_nodes=n), y=y, num_nodes=n,
                train_mask=masks["train"], val_mask=masks["val"], test_mask=masks["test"])


# -------------------------------------------------------- Geom-GCN graphs
def actor(root: Optional[_PathLike] = None, **kwargs) -> Data:
    r"""The Actor (film) co-occurrence graph from Geom-GCN: 7,600 nodes, 30,019
    directed edges (with self-loops, as PyG keeps them), 932 features, 5
    classes, masks ``[N, 10]`` (the 10 geom-gcn splits). Maximum in-degree
    1,296. Source: ``Actor/raw/`` via :class:`~torch_geometric.datasets.Actor`.

    Args:
        root (str, optional): the data folder (see :func:`data_dir`).
        **kwargs: passed on to :class:`~torch_geometric.datasets.Actor`.
    """
    from torch_geometric.datasets import Actor

    path = _private_copy(root, "Actor")  # Actor(root) expects <root>/raw
    if path is not None:
        return Actor(root=str(path), **kwargs)[0]
    path = cache_dir() / "Actor"
    with _download("Actor", path, "Actor/raw/"):
        return Actor(root=str(path), **kwargs)[0]


def webkb(name: str, root: Optional[_PathLike] = None, **kwargs) -> Data:
    r"""A WebKB page graph from Geom-GCN: ``"cornell"`` (183 nodes, 298 edges),
    ``"texas"`` (183, 325) or ``"wisconsin"`` (251, 515); 1,703 features, 5
    classes, masks ``[N, 10]``. Directed, with self-loops. Source:
    ``WebKB/<name>/raw/`` via :class:`~torch_geometric.datasets.WebKB`.

    Args:
        name (str): ``"cornell"``, ``"texas"`` or ``"wisconsin"``.
        root (str, optional): the data folder (see :func:`data_dir`).
        **kwargs: passed on to :class:`~torch_geometric.datasets.WebKB`.
    """
    from torch_geometric.datasets import WebKB

    key = name.lower()
    if key not in ("cornell", "texas", "wisconsin"):
        raise ValueError(f"unknown WebKB dataset {name!r}; expected cornell, texas or wisconsin")
    return _pyg_dataset(root, "WebKB", key, lambda r: WebKB(root=r, name=key, **kwargs))[0]


# --------------------------------------------------------------- MoleculeNet
#: What to install for the molecule datasets (one line, for errors and skips).
RDKIT_HINT = "pip install rdkit"


def require_rdkit(what: str = "MoleculeNet HIV") -> None:
    r"""Raises :class:`ModuleNotFoundError` with one line saying what to install
    unless RDKit can be imported: PyG turns SMILES into graphs with RDKit."""
    try:
        import rdkit  # noqa: F401
    except ImportError:
        raise ModuleNotFoundError(f"{what} needs RDKit to turn SMILES into graphs: "
                                  f"{RDKIT_HINT}", name="rdkit") from None


def _first_molecules(src: Path, dst: Path, limit: int) -> None:
    r"""Writes the header and the first ``limit`` rows of ``src`` whose SMILES RDKit
    turns into at least one atom to ``dst``: the rows PyG's ``MoleculeNet`` keeps,
    so that the result is the full dataset's first ``limit`` graphs while RDKit
    parses only those (all 41,127 SMILES take 40-50 s on 2 cores)."""
    import re

    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")  # as PyG's from_smiles: no per-SMILES warnings
    header, *rows = src.read_text().split("\n")
    kept = []
    for row in rows:
        if len(kept) == limit:
            break
        # MoleculeNet.process reads a row so: quoted fields removed, SMILES first
        smiles = re.sub(r"\".*\"", "", row).split(",")[0]
        mol = Chem.MolFromSmiles(smiles) if row else None
        if mol is not None and mol.GetNumAtoms() > 0:
            kept.append(row)
    dst.parent.mkdir(parents=True)
    dst.write_text("\n".join([header, *kept, ""]))


def murcko_scaffold(smiles: str) -> str:
    r"""The Bemis-Murcko scaffold of a molecule as SMILES (RDKit, chirality
    included): the key :func:`scaffold_split` groups molecules by, as OGB's
    ``scaffold_split`` does. ``""`` for an acyclic molecule."""
    require_rdkit("the scaffold split")
    from rdkit import Chem, RDLogger
    from rdkit.Chem.Scaffolds import MurckoScaffold

    RDLogger.DisableLog("rdApp.*")
    return MurckoScaffold.MurckoScaffoldSmiles(mol=Chem.MolFromSmiles(smiles),
                                               includeChirality=True)


class MoleculeStorage(BaseTransform):
    r"""The ``pre_transform`` of :func:`moleculenet_hiv`, what PyG's
    ``MoleculeNet`` stores of each molecule: ``x``, ``edge_index`` and
    ``edge_attr`` as uint8, and the molecule's scaffold
    (:func:`murcko_scaffold`) as ``scaffold``.

    The features are indices into :data:`torch_geometric.utils.smiles.x_map` /
    ``e_map`` (at most 118), and PyG stores each molecule's ``edge_index`` with
    the molecule's own atom numbers (HIV's largest molecule has 222 atoms), so
    uint8 holds them: the processed HIV takes 25.5 MiB instead of 162 MiB, which
    makes a processed copy small enough to carry to a machine without RDKit
    (:func:`process_hiv`). The stored scaffold lets :func:`scaffold_split` run
    there too. :class:`MoleculeFeatures` widens the integers on each access.

    Raises:
        ValueError: a molecule with more than 256 atoms.
    """

    KEYS = ("x", "edge_index", "edge_attr")

    def forward(self, data: Data) -> Data:
        if data.num_nodes > 256:
            raise ValueError(f"{data.smiles}: {data.num_nodes} atoms, more than uint8 atom "
                             "numbers hold")
        for key in self.KEYS:
            data[key] = data[key].to(torch.uint8)
        data.scaffold = murcko_scaffold(data.smiles)
        return data


class MoleculeFeatures(BaseTransform):
    r"""The ``transform`` of :func:`moleculenet_hiv`: the integers
    :class:`MoleculeStorage` stores as uint8 back to int64, as
    :func:`~torch_geometric.utils.from_smiles` makes them. Message passing and
    :class:`~torch.nn.Embedding` index with int64, and batching adds each
    molecule's atom offset to ``edge_index``, which uint8 would overflow."""

    def forward(self, data: Data) -> Data:
        for key in MoleculeStorage.KEYS:
            data[key] = data[key].long()
        return data


def _hiv(folder: _PathLike, transform: Optional[Callable] = None, **kwargs):
    r"""PyG's ``MoleculeNet(folder, "HIV")`` with :class:`MoleculeStorage` and
    :class:`MoleculeFeatures` (then ``transform``)."""
    from torch_geometric.datasets import MoleculeNet
    from torch_geometric.transforms import Compose

    widen = MoleculeFeatures() if transform is None else Compose([MoleculeFeatures(), transform])
    return MoleculeNet(str(folder), "HIV", transform=widen, pre_transform=MoleculeStorage(),
                       **kwargs)


def _first(dataset, limit: Optional[int]):
    # A copy, not a view (dataset[:limit]): a view's dataset.smiles and
    # dataset.scaffold collate every molecule anew on each access.
    return dataset if limit is None else dataset.copy(slice(0, limit))


def hiv_processed(root: Optional[_PathLike] = None) -> Optional[Path]:
    r"""The processed HIV of the data folder, ``MoleculeNet/hiv/processed/data.pt``
    (made by :func:`process_hiv`), or ``None`` where the data folder has none or
    there is no data folder. Where it is, :func:`moleculenet_hiv` needs no
    RDKit."""
    base = data_dir(root)
    path = None if base is None else base / "MoleculeNet" / "hiv" / "processed" / "data.pt"
    return path if path is not None and path.is_file() else None


def moleculenet_hiv(root: Optional[_PathLike] = None, limit: Optional[int] = None, **kwargs):
    r"""MoleculeNet HIV: 41,127 SMILES with a binary HIV-activity label, the set
    OGB's ogbg-molhiv is built from, as graphs with integer atom and bond
    features (:func:`torch_geometric.utils.from_smiles`, which needs RDKit).

    Source: ``MoleculeNet/hiv/raw/HIV.csv``, loaded by
    :class:`torch_geometric.datasets.MoleculeNet` from a private copy; without a
    data folder, PyG downloads and processes it once into the cache. A data
    folder that holds ``MoleculeNet/hiv/processed/`` too (:func:`process_hiv`)
    is read without RDKit: PyG skips processing where its processed files
    exist.

    Args:
        root (str, optional): the data folder (see :func:`data_dir`).
        limit (int, optional): only the first ``limit`` molecules (the full
            dataset's first ``limit`` graphs), for quick runs and batches: RDKit
            then parses those rows only.
        **kwargs: passed on to :class:`~torch_geometric.datasets.MoleculeNet`
            (e.g. ``transform``).

    Returns:
        :class:`~torch_geometric.datasets.MoleculeNet` of 41,120 graphs (PyG
        skips the 7 SMILES RDKit gives no atom for), each with ``x`` ``[N_i, 9]``
        and ``edge_attr`` ``[E_i, 3]`` int64 (the columns of
        :data:`torch_geometric.utils.smiles.x_map` / ``e_map``), ``edge_index``
        (each bond in both directions), ``y`` ``[1, 1]`` float, ``smiles`` and
        ``scaffold`` (:class:`MoleculeStorage`, which stores the integers as
        uint8; :class:`MoleculeFeatures` widens them on access). About 25.5
        atoms and 55 directed edges per molecule.

    Raises:
        ModuleNotFoundError: RDKit is not installed and the molecules need
            processing (one line: what to install).
        DataUnavailable: the data folder lacks ``MoleculeNet/hiv/``, its
            processed HIV holds fewer than ``limit`` molecules, or the download
            failed.
    """
    raw = dataset_folder(root, "MoleculeNet", "hiv", "raw")
    processed = hiv_processed(root)
    if processed is not None:
        # PyG skips process() where its processed files exist: no RDKit here
        ds = _hiv(_private_copy(root, "MoleculeNet", "hiv").parent, **kwargs)
        if limit is not None and limit > len(ds):
            raise DataUnavailable(
                f"the processed HIV in {processed.parent} holds {len(ds):,} molecules, "
                f"fewer than the {limit:,} asked for.\n"
                f"Ask for {len(ds):,} or fewer, or pass a data folder with more molecules.")
        return _first(ds, limit)
    require_rdkit()
    if raw is None:
        path = cache_dir() / "MoleculeNet"
        with _download("MoleculeNet HIV", path / "hiv", "MoleculeNet/hiv/raw/HIV.csv"):
            return _first(_hiv(path, **kwargs), limit)
    if limit is None:
        return _hiv(_private_copy(root, "MoleculeNet", "hiv").parent, **kwargs)
    key = (raw, limit)
    if key not in _COPIES:
        _COPIES[key] = _tmp_root() / f"hiv-first-{limit}-{len(_COPIES)}"
        _first_molecules(raw / "HIV.csv", _COPIES[key] / "hiv" / "raw" / "HIV.csv", limit)
    return _hiv(_COPIES[key], **kwargs)


def process_hiv(dest: _PathLike, root: Optional[_PathLike] = None,
                limit: Optional[int] = None):
    r"""Makes ``dest`` a data folder holding a processed MoleculeNet HIV, for
    :func:`moleculenet_hiv` on a machine without RDKit: PyG's ``MoleculeNet``
    processes ``dest/MoleculeNet/hiv/raw/HIV.csv`` (all the molecules of the data
    folder's, or the first ``limit``) into ``dest/MoleculeNet/hiv/processed/``,
    PyG's own files, with :class:`MoleculeStorage`. PyG needs the raw file
    beside the processed ones (without it, it downloads), so both are written.
    Size: about 0.66 KiB per molecule, the CSV included (12.9 MiB for 20,000,
    27.6 MiB for all 41,120).

    Args:
        dest (str): the new data folder; its ``MoleculeNet/hiv`` must not exist.
        root (str, optional): the data folder the SMILES come from (see
            :func:`data_dir`); without one, PyG downloads ``HIV.csv``.
        limit (int, optional): the first ``limit`` molecules only.

    Returns:
        the processed dataset (:func:`moleculenet_hiv`'s, read from ``dest``).

    Raises:
        FileExistsError: ``dest/MoleculeNet/hiv`` exists.
        ModuleNotFoundError: RDKit is not installed.
    """
    require_rdkit()
    folder = Path(dest).expanduser().resolve() / "MoleculeNet"
    if (folder / "hiv").exists():
        raise FileExistsError(f"{folder / 'hiv'} exists: remove it, or name another folder")
    raw = dataset_folder(root, "MoleculeNet", "hiv", "raw")
    if raw is None:
        from torch_geometric.data import download_url
        from torch_geometric.datasets import MoleculeNet

        raw = _tmp_root() / "hiv-download"
        with _download("MoleculeNet HIV", raw, "MoleculeNet/hiv/raw/HIV.csv"):
            download_url(MoleculeNet.url.format("HIV.csv"), str(raw), log=False)
    csv_path = folder / "hiv" / "raw" / "HIV.csv"
    if limit is None:
        csv_path.parent.mkdir(parents=True)
        shutil.copyfile(raw / "HIV.csv", csv_path)
    else:
        _first_molecules(raw / "HIV.csv", csv_path, limit)
    return _hiv(folder)


def hiv_batch(num_molecules: int = 1024, root: Optional[_PathLike] = None):
    r"""The first ``num_molecules`` molecules of MoleculeNet HIV
    (:func:`moleculenet_hiv`) as one :class:`~torch_geometric.data.Batch`: the
    molecule batches of the edge-feature benchmarks (128 and 1,024 molecules).
    ``x`` ``[N, 9]`` and ``edge_attr`` ``[E, 3]`` are integer features: embed them
    first (``examples/train_molhiv.py``'s ``AtomEncoder`` / ``BondEncoder``)."""
    from torch_geometric.data import Batch

    return Batch.from_data_list(list(moleculenet_hiv(root, limit=num_molecules)))


def hiv_batches(path: _PathLike, num_molecules: int = 512) -> Data:
    r"""A batch of ``num_molecules`` MoleculeNet HIV molecules from a file of
    pre-batched molecules: the molecule graphs where RDKit, which
    :func:`moleculenet_hiv` needs to parse the SMILES, is not installed.

    The file (:func:`torch.load`, ``weights_only``) maps a batch size to a list
    of batches, each a dict with ``x`` ``[N, 9]``, ``edge_index`` ``[2, E]``,
    ``edge_attr`` ``[E, 3]`` (int64, as :func:`hiv_batch` makes them) and
    ``num_graphs``. Batches of the largest size up to ``num_molecules`` are
    joined in file order into one disjoint graph (node indices offset by the
    nodes before), as :class:`~torch_geometric.data.Batch` joins molecules.

    Args:
        path (str): the file.
        num_molecules (int): molecules in the batch; a multiple of a batch size
            the file holds.

    Returns:
        :class:`~torch_geometric.data.Data` with ``x``, ``edge_index``,
        ``edge_attr`` (int64), ``num_nodes`` and ``num_graphs``.

    Raises:
        FileNotFoundError: no file at ``path``. ValueError: the file holds no
            batch size dividing ``num_molecules``, or too few such batches.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file of HIV molecule batches at {path}")
    batches = {int(k): v for k, v in torch.load(path, weights_only=True).items()}
    sizes = [k for k in batches if k <= num_molecules and num_molecules % k == 0]
    if not sizes:
        raise ValueError(f"{path} holds batches of {sorted(batches)} molecules: none divides "
                         f"{num_molecules}")
    size = max(sizes)
    count = num_molecules // size
    if len(batches[size]) < count:
        raise ValueError(f"{path} holds {len(batches[size])} batches of {size} molecules, "
                         f"{count} are needed for {num_molecules}")
    parts = batches[size][:count]
    offsets = np.cumsum([0] + [b["x"].size(0) for b in parts])
    return Data(x=torch.cat([b["x"] for b in parts]),
                edge_index=torch.cat([b["edge_index"] + int(o) for b, o in zip(parts, offsets)],
                                     1),
                edge_attr=torch.cat([b["edge_attr"] for b in parts]),
                num_nodes=int(offsets[-1]), num_graphs=sum(int(b["num_graphs"]) for b in parts))


def save_hiv_batches(path: _PathLike, sizes: Sequence[int] = (128, 1024), count: int = 4,
                     root: Optional[_PathLike] = None) -> None:
    r"""Writes the file :func:`hiv_batches` reads: for each batch size in
    ``sizes``, ``count`` batches of consecutive MoleculeNet HIV molecules (from
    the first), so that a machine without RDKit gets the benchmarks' molecule
    graphs. Needs RDKit (:func:`moleculenet_hiv`).

    Args:
        path (str): the file to write.
        sizes (sequence of int): molecules per batch.
        count (int): batches of each size.
        root (str, optional): the data folder (:func:`moleculenet_hiv`).
    """
    from torch_geometric.data import Batch

    mols = list(moleculenet_hiv(root, limit=max(sizes) * count))
    out = {}
    for size in sizes:
        out[int(size)] = []
        for k in range(count):
            b = Batch.from_data_list(mols[k * size:(k + 1) * size])
            out[int(size)].append({"x": b.x, "edge_index": b.edge_index,
                                   "edge_attr": b.edge_attr, "num_graphs": b.num_graphs})
    torch.save(out, path)


def scaffold_split(smiles, frac_train: float = 0.8, frac_val: float = 0.1,
                   scaffolds=None) -> Dict[str, torch.Tensor]:
    r"""The scaffold split OGB made ogbg-molhiv's split with (``scaffold_split`` of
    the pretrain-gnns code): molecules grouped by their Bemis-Murcko scaffold
    (RDKit, chirality included), groups sorted by size, largest first (ties:
    the group whose first molecule comes later first), and filled into train
    until it would exceed ``frac_train``, then validation, then test. Unseen
    scaffolds end up in validation and test, which makes it harder than a random
    split. Deterministic: no seed.

    Args:
        smiles (list of str): one SMILES per molecule; unread where
            ``scaffolds`` is given (``None`` then).
        frac_train (float), frac_val (float): target fractions (test: the rest).
        scaffolds (list of str, optional): each molecule's scaffold
            (:func:`murcko_scaffold`), as a processed HIV stores them
            (``dataset.scaffold``, :class:`MoleculeStorage`): no RDKit needed.

    Returns:
        ``{"train": idx, "val": idx, "test": idx}``, int64 index tensors that are
        disjoint and together cover ``range(len(scaffolds))``.
    """
    if scaffolds is None:
        scaffolds = [murcko_scaffold(m) for m in smiles]
    groups: Dict[str, list] = {}
    for i, scaffold in enumerate(scaffolds):
        groups.setdefault(scaffold, []).append(i)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    n = len(scaffolds)
    parts: Dict[str, list] = {"train": [], "val": [], "test": []}
    for group in ordered:
        if len(parts["train"]) + len(group) <= frac_train * n:
            parts["train"] += group
        elif len(parts["train"]) + len(parts["val"]) + len(group) <= (frac_train + frac_val) * n:
            parts["val"] += group
        else:
            parts["test"] += group
    return {k: torch.tensor(sorted(v), dtype=torch.long) for k, v in parts.items()}


def random_split(num: int, seed: int = 0, frac_train: float = 0.8,
                 frac_val: float = 0.1) -> Dict[str, torch.Tensor]:
    r"""A seeded random split of ``range(num)``
    (:func:`torch.utils.data.random_split`): ``{"train", "val", "test"}`` int64
    index tensors of ``round(frac_train * num)``, ``round(frac_val * num)`` and
    the remaining molecules, disjoint and covering, the same for the same
    ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [round(frac_train * num), round(frac_val * num)]
    sizes.append(num - sum(sizes))
    parts = torch.utils.data.random_split(range(num), sizes, generator=gen)
    return {k: torch.tensor(sorted(p.indices), dtype=torch.long)
            for k, p in zip(("train", "val", "test"), parts)}


# ---------------------------------------------------------------- dispatch
_LOADERS: Dict[str, Callable] = {
    "cora": lambda **kw: planetoid("Cora", **kw),
    "citeseer": lambda **kw: planetoid("CiteSeer", **kw),
    "pubmed": lambda **kw: pubmed_graph(**kw),
    "mutag": lambda **kw: tu_dataset("MUTAG", **kw),
    "enzymes": lambda **kw: tu_dataset("ENZYMES", **kw),
    "proteins": lambda **kw: tu_dataset("PROTEINS", **kw),
    "github": lambda **kw: musae("github", **kw),
    "squirrel": lambda **kw: musae("squirrel", **kw),
    "chameleon": lambda **kw: musae("chameleon", **kw),
    "arxiv": lambda **kw: ogbn_arxiv(**kw),
    "actor": lambda **kw: actor(**kw),
    "cornell": lambda **kw: webkb("cornell", **kw),
    "texas": lambda **kw: webkb("texas", **kw),
    "wisconsin": lambda **kw: webkb("wisconsin", **kw),
    "hiv": lambda **kw: moleculenet_hiv(**kw),
}


def available() -> list:
    r"""Names accepted by :func:`load`."""
    return sorted(_LOADERS)


def load(name: str, **kwargs):
    r"""Loads a dataset by name (case-insensitive; ``-``/``_`` ignored).

    Args:
        name (str): one of :func:`available`: ``cora``, ``citeseer``,
            ``pubmed`` (graph + random features, :func:`pubmed_graph`),
            ``mutag``, ``enzymes``, ``proteins`` (:func:`tu_dataset`),
            ``github``, ``squirrel``, ``chameleon`` (:func:`musae`), ``arxiv``
            (:func:`ogbn_arxiv`), ``actor``, ``cornell``, ``texas``,
            ``wisconsin``, ``hiv`` (:func:`moleculenet_hiv`, needs RDKit).
            ``musae_github``, ``ogbn-arxiv``, ``moleculenet-hiv`` and
            ``wikipedia-squirrel`` style aliases work too. Generated (seeded,
            :mod:`benchmarks.generators`): ``pattern``, ``cluster``
            (:func:`sbm_dataset`), ``mnist``, ``cifar10``, ``coco_sp``,
            ``pascalvoc_sp`` (:func:`knn_dataset`, synthetic labels); these take
            ``num_graphs`` (default 1,000) and ``seed`` (default 0).
        **kwargs: passed on to the loader (``root`` for the real graphs).

    Returns:
        A :class:`~torch_geometric.data.Data` for node-level datasets, a
        :class:`~torch_geometric.datasets.TUDataset` or
        :class:`~torch_geometric.datasets.MoleculeNet` for the graph datasets, a list
        of :class:`~torch_geometric.data.Data` (for
        :class:`torch_geometric.loader.DataLoader`) for the generated ones.
    """
    key = name.lower().replace("-", "").replace("_", "")
    for prefix in ("musae", "wikipedia", "planetoid", "tu", "ogbn", "moleculenet"):
        if key.startswith(prefix) and key[len(prefix):] in _LOADERS:
            key = key[len(prefix):]
    if key == "film":
        key = "actor"
    if key not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(available())}")
    return _LOADERS[key](**kwargs)


# ------------------------------------------------------ synthetic generators
# Seeded stand-ins for the datasets that are not in the data folder (SBM PATTERN /
# CLUSTER, MNIST / CIFAR10 superpixels, COCO-SP / PascalVOC-SP region graphs,
# super-node graphs): see benchmarks.generators.
from .generators import (describe, knn_batch, knn_dataset, power_law_edge_graph,  # noqa: E402
                         power_law_graph, sbm_batch, sbm_dataset)

__all__ += ["sbm_batch", "sbm_dataset", "knn_batch", "knn_dataset", "power_law_graph",
            "power_law_edge_graph", "describe"]


def _synthetic(fn, kind):
    def load_synthetic(num_graphs: int = 1000, seed: int = 0, root=None, **kw):
        del root  # generated: no data folder
        return fn(kind, num_graphs=num_graphs, seed=seed, **kw)
    load_synthetic.__doc__ = (f"``{fn.__name__}({kind!r}, num_graphs=1000, seed=0)``: a list "
                              "of generated Data graphs.")
    return load_synthetic


_LOADERS.update({
    "pattern": _synthetic(sbm_dataset, "pattern"),
    "cluster": _synthetic(sbm_dataset, "cluster"),
    "mnist": _synthetic(knn_dataset, "mnist"),
    "cifar10": _synthetic(knn_dataset, "cifar10"),
    "cocosp": _synthetic(knn_dataset, "coco_sp"),
    "pascalvocsp": _synthetic(knn_dataset, "pascalvoc_sp"),
})
