"""examples/train_molhiv.py: the atom and bond encoders, ROC-AUC as OGB computes
it, and training steps of the fused model against the native one (close: every
conv, GATConv, GATv2Conv and TransformerConv, runs fused with its bond
features)."""
from __future__ import annotations

import copy
import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from benchmarks import datasets
from conftest import load_script, needs_data


# A few molecules of HIV.csv's kinds (rings, heteroatoms, charges, stereo bonds).
SMILES = ["CC(=O)Oc1ccccc1C(=O)O", "c1ccc2[nH]ccc2c1", "CN1CCC[C@H]1c1cccnc1", "O=C(O)C=Cc1ccccc1",
          "C/C=C/C(=O)N", "Clc1ccc(cc1)C(c1ccccc1)N1CCNCC1", "CCOC(=O)C1=C(C)NC(C)=C(C1)C(=O)OC",
          "[NH3+]CC([O-])=O", "OC1=CC=CC=C1", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "S=C=Nc1ccccc1",
          "c1ccc2c(c1)ccc1ccccc12", "N#Cc1ccccc1", "CC1=CC(=O)C=CC1=O", "OCC(O)CO",
          "Brc1ccc(N)cc1"]


@pytest.fixture(scope="module")
def mh():
    return load_script("examples/train_molhiv.py")


def _molecules():
    pytest.importorskip("rdkit", reason=f"needs RDKit ({datasets.RDKIT_HINT})")
    from torch_geometric.utils import from_smiles
    out = []
    for i, s in enumerate(SMILES):
        data = from_smiles(s)
        data.y = torch.tensor([[float(i % 3 == 0)]])
        out.append(data)
    return out


def test_encoders_sum_one_table_per_feature_column(mh):
    atoms, bonds = mh.AtomEncoder(8), mh.BondEncoder(8)
    assert [e.num_embeddings for e in atoms.embeddings] == [119, 9, 11, 12, 9, 5, 8, 2, 2]
    assert [e.num_embeddings for e in bonds.embeddings] == [22, 6, 2]
    x = torch.stack([torch.randint(0, n, (30,)) for n in mh.ATOM_VOCAB], 1)
    # the joined gather against an embedding call per column, forward and backward
    grad = torch.randn(30, 8)
    out = atoms(x)
    out.backward(grad)
    got = [e.weight.grad.clone() for e in atoms.embeddings]
    atoms.zero_grad()
    expected = sum(F.embedding(x[:, i], e.weight) for i, e in enumerate(atoms.embeddings))
    expected.backward(grad)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    for g, e in zip(got, atoms.embeddings):
        torch.testing.assert_close(g, e.weight.grad, rtol=1e-6, atol=1e-6)
    assert bonds(torch.tensor([[12, 3, 1]])).shape == (1, 8)
    torch.testing.assert_close(bonds(torch.tensor([[12, 3, 1]]))[0],
                               bonds.embeddings[0].weight[12] + bonds.embeddings[1].weight[3]
                               + bonds.embeddings[2].weight[1], rtol=1e-6, atol=1e-6)
    # the tables are the parameters (state_dict keys as one Embedding per column)
    assert sorted(bonds.state_dict()) == [f"embeddings.{i}.weight" for i in range(3)]


def test_roc_auc_known_values(mh):
    y = torch.tensor([0., 0., 1., 1.])
    s = torch.tensor([0.1, 0.4, 0.35, 0.8])
    assert mh.roc_auc(y, s) == pytest.approx(0.75)  # scikit-learn's documented example
    assert mh.roc_auc(y, -s) == pytest.approx(0.25)
    # a tie between a positive and a negative counts one half: (0.5 + 1 + 1 + 1) / 4
    assert mh.roc_auc(torch.tensor([0., 1., 0., 1.]),
                      torch.tensor([0.5, 0.5, 0.2, 0.9])) == pytest.approx(0.875)


def test_roc_auc_tasks_as_ogb(mh):
    """Per column over its labelled rows; columns without both classes left out;
    the mean over the others. None left: nan (OGB raises)."""
    nan = float("nan")
    y = torch.tensor([[0., 1., 1.], [0., 1., nan], [1., 1., 0.], [1., nan, 1.]])
    s = torch.tensor([[0.1, 0.3, 0.9], [0.4, 0.2, 5.0], [0.35, 0.1, 0.2], [0.8, 0.0, 0.3]])
    # column 0: 0.75; column 1: one class only; column 2 (rows 0, 2, 3): 1.0
    assert mh.roc_auc(y, s) == pytest.approx((0.75 + 1.0) / 2)
    assert math.isnan(mh.roc_auc(torch.ones(5, 1), torch.rand(5, 1)))


@pytest.mark.parametrize("conv", ["gat", "gatv2", "transformer"])
def test_fused_and_native_train_alike(mh, conv):
    """Two training steps from the same seed: the fuse()d copy computes the same
    losses and parameters (fp32 round-off once its layers run fused). Every
    forward of the fused copy calls the fused op once per conv, with the edge
    score of that conv (equal losses alone would also hold were it to fall
    back to PyG); the native copy calls none."""
    from pyg_dfgnn import ops
    from pyg_dfgnn.nn import fuse
    from pyg_dfgnn.ops.scores.dot_edge_tail import tails_pay

    mols = _molecules()
    split = {"train": torch.arange(16), "val": torch.arange(8), "test": torch.arange(8, 16)}
    hidden, heads = 16, 2
    torch.manual_seed(0)
    native = mh.MoleculeModel(conv, hidden=hidden, heads=heads, layers=2, dropout=0.1)
    report = fuse(native, inplace=False)
    assert [layer.name for layer in report] == ["convs.0", "convs.1"]
    # TransformerConv's edge features (lin_edge without a bias) run as tails
    # where tails_pay says they move fewer bytes, else as [E, H, C] rows.
    transformer = "dot_edge_tail" if tails_pay(heads, hidden // heads, hidden) else "dot_edge"
    score = {"gat": "additive_edge", "gatv2": "gatv2_edge", "transformer": transformer}[conv]
    edge_convs = [m for m in report.model.convs if m.lin_edge is not None]
    assert len(edge_convs) == 2
    runs, records, forwards = {}, {}, {}
    for impl, model in (("native", native), ("fused", report.model)):
        loaders = mh.make_loaders(mols, split, batch_size=8, seed=0)
        calls = []
        hook = model.register_forward_pre_hook(lambda m, args: calls.append(m.training))
        try:
            with ops.recording() as records[impl]:
                runs[impl] = mh.train_one(model, loaders, epochs=1, lr=1e-2, seed=0,
                                          device=torch.device("cpu"), progress=False)
        finally:
            hook.remove()
        # two training steps, then one evaluation batch each of val and test
        assert calls == [True, True, False, False], impl
        forwards[impl] = calls
    assert records["native"] == []
    got = [(r.score, r.need_grad, r.plan, r.heads, r.dtype) for r in records["fused"]]
    want = [(score, training, None, heads, torch.float32)
            for training in forwards["fused"] for _ in edge_convs]
    assert len(got) == len(edge_convs) * len(forwards["fused"]) == 8
    assert got == want
    a, b = runs["native"], runs["fused"]
    assert len(a["losses"]) == 2 and all(math.isfinite(v) for v in a["losses"])
    torch.testing.assert_close(torch.tensor(b["losses"]), torch.tensor(a["losses"]),
                               rtol=1e-5, atol=1e-6)
    assert [layer.fused for layer in report] == [True] * 2
    lr, steps = 1e-2, len(a["losses"])
    for (name, p), q in zip(native.named_parameters(), report.model.parameters()):
        if ((name.endswith("lin_key.bias") and conv == "transformer")
                or (".lin_r." in name and conv == "gatv2")):
            # Its gradient is 0 in exact arithmetic (the softmax is shift-invariant
            # per row; GATv2's x_r channels whose LeakyReLU takes one branch on
            # every edge of each row add a constant to the row's scores), so each
            # copy's is rounding noise, which Adam scales up to steps of up to
            # about lr: the two copies part by up to that much.
            torch.testing.assert_close(q, p, rtol=0, atol=2 * lr * steps, msg=name)
            continue
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=name)
    assert 0.0 <= b["test_rocauc"] <= 1.0 and b["median_step_ms"] > 0


def test_prefetch_thread_trains_the_same_steps(mh):
    """--prefetch-thread: the batches and their layouts come from a background
    thread; the steps are the same, bit for bit."""
    from pyg_dfgnn.nn import fuse

    mols = _molecules()
    split = {"train": torch.arange(16), "val": torch.arange(8), "test": torch.arange(8, 16)}
    runs = []
    for in_thread in (False, True):
        torch.manual_seed(0)
        model = fuse(mh.MoleculeModel("gat", hidden=16, heads=2, layers=2, dropout=0.1)).model
        loaders = mh.make_loaders(mols, split, batch_size=4, seed=0)
        runs.append(mh.train_one(model, loaders, epochs=2, lr=1e-2, seed=0,
                                 device=torch.device("cpu"), progress=False,
                                 prefetch_thread=in_thread))
    assert len(runs[0]["losses"]) == 8
    assert runs[1]["losses"] == runs[0]["losses"]


def test_alternating_epochs_train_as_alone(mh):
    """Two trainings whose epochs alternate (as main runs native and fused) each
    take the steps, dropout masks included, that they take alone."""
    from pyg_dfgnn.nn import fuse

    mols = _molecules()
    split = {"train": torch.arange(16), "val": torch.arange(8), "test": torch.arange(8, 16)}
    torch.manual_seed(0)
    native = mh.MoleculeModel("transformer", hidden=16, heads=2, layers=2, dropout=0.3)
    models = {"native": native, "fused": fuse(native, inplace=False).model}
    start = {k: copy.deepcopy(m.state_dict()) for k, m in models.items()}
    cpu = torch.device("cpu")
    alone = {k: mh.train_one(m, mh.make_loaders(mols, split, batch_size=4, seed=0), epochs=3,
                             lr=1e-2, seed=0, device=cpu, progress=False)
             for k, m in models.items()}
    for k, m in models.items():
        m.load_state_dict(start[k])
    runs = {k: mh.Training(m, mh.make_loaders(mols, split, batch_size=4, seed=0), 3, 1e-2, 0,
                           cpu, progress=False) for k, m in models.items()}
    torch.manual_seed(123)  # the caller's draws between epochs reach neither
    for order in (["native", "fused"], ["fused", "native"], ["native", "fused"]):
        for k in order:
            runs[k].epoch()
            torch.rand(5)
    for k, run in runs.items():
        got = run.result()
        assert len(got["losses"]) == 12 and got["losses"] == alone[k]["losses"], k
        assert got["test_rocaucs"] == alone[k]["test_rocaucs"], k


def test_without_rdkit_one_line(mh, monkeypatch, tmp_path):
    """A data folder with the SMILES only: they need RDKit, which the run says in
    one line before any work."""
    raw = tmp_path / "MoleculeNet" / "hiv" / "raw"
    raw.mkdir(parents=True)
    (raw / "HIV.csv").write_text("smiles,activity,HIV_active\nCCO,CI,0\n")
    monkeypatch.setitem(sys.modules, "rdkit", None)  # import rdkit raises ImportError
    with pytest.raises(SystemExit) as e:
        mh.run(["--data", str(tmp_path), "--device", "cpu", "--no-progress"])
    msg = str(e.value.code)
    assert "pip install rdkit" in msg and "\n" not in msg and "train_molhiv.py" in msg


@pytest.mark.parametrize("argv,error", [(["--hidden", "30", "--heads", "4"], "multiple"),
                                        (["--subset", "0"], "--subset must be >= 1"),
                                        (["--sweep-batch-sizes", "32,x"], "--sweep-batch-sizes"),
                                        (["--sweep-batch-sizes", "0,32"], "--sweep-batch-sizes"),
                                        (["--sweep-steps", "0"], "--sweep-steps must be")])
def test_bad_options_fail_before_work(mh, argv, error, capsys):
    with pytest.raises(SystemExit) as e:
        mh.parse_args(argv + ["--device", "cpu"])
    assert e.value.code == 2 and error in capsys.readouterr().err


@needs_data
def test_main_on_the_first_hiv_molecules(mh, tmp_path, capsys):
    pytest.importorskip("rdkit", reason=f"needs RDKit ({datasets.RDKIT_HINT})")
    out = tmp_path / "molhiv.json"
    report = mh.main(["--subset", "300", "--epochs", "1", "--conv", "transformer",
                      "--hidden", "16", "--heads", "2", "--layers", "2", "--device", "cpu",
                      "--no-progress", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert sum(saved["split_sizes"].values()) == 300 and saved["split"] == "scaffold"
    assert [layer["cls"] for layer in saved["fuse_report"]] == ["TransformerConv"] * 2
    assert saved["results"]["native"]["losses"] == report["results"]["native"]["losses"]
    steps = math.ceil(saved["split_sizes"]["train"] / 128)  # --batch-size 128
    assert len(saved["results"]["fused"]["losses"]) == steps
    torch.testing.assert_close(torch.tensor(saved["results"]["fused"]["losses"]),
                               torch.tensor(saved["results"]["native"]["losses"]),
                               rtol=1e-5, atol=1e-6)
    printed = capsys.readouterr().out
    assert "fuse():" in printed and "test ROC-AUC" in printed and "median step ms" in printed
    # TransformerConv's edge features run fused (the dot_edge score): a speed-up is shown
    assert [layer["fused"] for layer in saved["fuse_report"]] == [True, True]
    assert "No conv runs fused" not in printed and saved["speedup"] is not None


def test_sweep_rows(mh):
    """One row per batch size and impl, each over batches of that many molecules,
    from copies of the model it is given; on the CPU no GPU columns."""
    mols = _molecules()
    torch.manual_seed(0)
    base = mh.MoleculeModel("transformer", hidden=16, heads=2, layers=2, dropout=0.1)
    before = [p.clone() for p in base.parameters()]
    rows = mh.sweep(base, mols, torch.arange(16), [4, 8], ["native", "fused"], steps=3,
                    lr=1e-2, seed=0, device=torch.device("cpu"), warmup=1)
    assert [(r["batch_size"], r["impl"]) for r in rows] == [
        (4, "native"), (4, "fused"), (8, "native"), (8, "fused")]
    for r in rows:
        assert set(r) == {"batch_size", "impl", "steps", "molecules", "nodes", "edges",
                          "wall_ms", "event_ms", "gpu_ms", "host_ms", "host_share"}
        assert r["steps"] == 3 and r["molecules"] == r["batch_size"] and r["wall_ms"] > 0
        assert r["nodes"] > r["molecules"] and r["edges"] > 0
        assert r["event_ms"] is r["gpu_ms"] is r["host_ms"] is r["host_share"] is None
    assert all(torch.equal(p, q) for p, q in zip(base.parameters(), before))
    table = mh.sweep_table(rows).splitlines()
    assert table[0].split(" | ")[0].strip() == "batch" and len(table) == 2 + 2
    assert "native/fused" in table[0] and "host share" not in table[0]


# ------------------------------------------------ a processed HIV, without RDKit
N_PROCESSED = 200


@pytest.fixture(scope="module")
def processed(tmp_path_factory):
    """A data folder holding a processed HIV: the data folder's first 200
    molecules processed here where RDKit is installed, else the data folder
    itself where it holds one (as the processed copy carried to a machine
    without RDKit does)."""
    try:
        import rdkit  # noqa: F401
    except ImportError:
        if datasets.hiv_processed() is None:
            pytest.skip(f"needs RDKit ({datasets.RDKIT_HINT}) or a processed HIV in the data "
                        "folder")
        return datasets.data_dir()
    if datasets.data_dir() is None or not datasets.data_dir().is_dir():
        pytest.skip("no data folder ($PYG_DFGNN_DATA; make test sets it)")
    dest = tmp_path_factory.mktemp("processed")
    datasets.process_hiv(dest, limit=N_PROCESSED)
    return dest


def _files(folder):
    return {f: (f.stat().st_size, f.stat().st_mtime_ns)
            for f in (folder / "MoleculeNet" / "hiv").rglob("*") if f.is_file()}


def test_processed_hiv_trains_without_rdkit(mh, processed, monkeypatch, tmp_path, capsys):
    """--data on a processed HIV: PyG reads the processed files, the scaffold
    split reads the stored scaffolds, and nothing imports RDKit; the sweep
    writes its rows into the JSON; the data folder is left as it was."""
    before = _files(processed)
    monkeypatch.setitem(sys.modules, "rdkit", None)  # import rdkit raises ImportError
    out = tmp_path / "molhiv.json"
    mh.main(["--data", str(processed), "--subset", "200", "--epochs", "1", "--conv", "gat",
             "--hidden", "16", "--heads", "2", "--layers", "2", "--device", "cpu",
             "--no-progress", "--sweep-batch-sizes", "16,64", "--sweep-steps", "2",
             "--json", str(out)])
    saved = json.loads(out.read_text())
    assert sum(saved["split_sizes"].values()) == 200 and saved["split"] == "scaffold"
    native, fused = saved["results"]["native"], saved["results"]["fused"]
    assert len(native["epoch_s"]) == 1 and native["median_epoch_s"] > 0
    torch.testing.assert_close(torch.tensor(fused["losses"]), torch.tensor(native["losses"]),
                               rtol=1e-5, atol=1e-6)
    rows = saved["sweep"]
    assert [(r["batch_size"], r["impl"]) for r in rows] == [
        (16, "native"), (16, "fused"), (64, "native"), (64, "fused")]
    assert all(r["molecules"] == r["batch_size"] and r["steps"] == 2 for r in rows)
    assert saved["config"]["sweep_batch_sizes"] == [16, 64]
    printed = capsys.readouterr().out
    assert "median epoch s" in printed and "step time by batch size" in printed
    assert _files(processed) == before


@pytest.mark.parametrize("argv,error", [
    (["--subset", "100000"], "fewer than the 100,000 asked for"),
    (["--subset", "200", "--sweep-batch-sizes", "32,1024"], "but the training split holds")])
def test_processed_hiv_refusals(mh, processed, monkeypatch, argv, error):
    """More molecules than the processed copy holds (two lines: what, what to
    do) and a sweep batch beyond the training split end the run before training."""
    monkeypatch.setitem(sys.modules, "rdkit", None)
    with pytest.raises(SystemExit) as e:
        mh.run(["--data", str(processed), "--device", "cpu", "--no-progress"] + argv)
    assert error in str(e.value.code)


def test_processed_hiv_is_what_rdkit_parses(processed):
    """The processed copy holds PyG's from_smiles graphs, stored as uint8 and
    read back as int64, and each molecule's scaffold: its scaffold split is the
    one RDKit computes from the SMILES. Under 1 KiB per molecule."""
    pytest.importorskip("rdkit", reason=f"needs RDKit ({datasets.RDKIT_HINT})")
    from torch_geometric.utils import from_smiles

    ds = datasets.moleculenet_hiv(processed, limit=N_PROCESSED)
    assert len(ds) == N_PROCESSED
    for i in range(0, N_PROCESSED, 7):
        g, want = ds[i], from_smiles(ds[i].smiles)
        for key in ("x", "edge_index", "edge_attr"):
            assert g[key].dtype == torch.long and torch.equal(g[key], want[key]), (i, key)
            assert ds.get(i)[key].dtype == torch.uint8  # as stored
        assert g.scaffold == datasets.murcko_scaffold(g.smiles)
    stored = datasets.scaffold_split(None, scaffolds=ds.scaffold)
    computed = datasets.scaffold_split(ds.smiles)
    assert all(torch.equal(stored[k], computed[k]) for k in computed)
    size = datasets.hiv_processed(processed).stat().st_size
    assert size < 1024 * len(datasets.moleculenet_hiv(processed))
    with pytest.raises(FileExistsError):
        datasets.process_hiv(processed, limit=10)


def test_compile_wraps_both_models_in_training_and_sweep(mh, monkeypatch):
    """--compile: every model that trains or is timed runs through
    torch.compile(dynamic=True); the parameters trained are the model's own."""
    calls = []

    def fake_compile(model, **kwargs):
        calls.append((type(model).__name__, kwargs))
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    mols = _molecules()
    torch.manual_seed(0)
    base = mh.MoleculeModel("gat", hidden=16, heads=2, layers=2, dropout=0.1)
    rows = mh.sweep(base, mols, torch.arange(16), [4], ["native", "fused"], steps=2,
                    lr=1e-2, seed=0, device=torch.device("cpu"), warmup=1, compiled=True)
    assert len(rows) == 2 and len(calls) == 2
    model = mh.MoleculeModel("gat", hidden=16, heads=2, layers=2, dropout=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    n = len(mols)
    loaders = mh.make_loaders(mols, {"train": torch.arange(n // 2),
                                     "val": torch.arange(n // 2, 3 * n // 4),
                                     "test": torch.arange(3 * n // 4, n)}, 4, 0)
    mh.train_one(model, loaders, 1, 1e-2, 0, torch.device("cpu"), progress=False,
                 compiled=True)
    assert calls[-1] == ("MoleculeModel", {"dynamic": True}) and len(calls) == 3
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))


def _random_molecules(mh, sizes):
    """Chains of random atoms and bonds (no RDKit): what the encoders read."""
    from torch_geometric.data import Data
    out = []
    for i, n in enumerate(sizes):
        ei = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        ei = torch.cat([ei, ei.flip(0)], 1)
        x = torch.stack([torch.randint(0, v, (n,)) for v in mh.ATOM_VOCAB], 1)
        ea = torch.stack([torch.randint(0, v, (ei.size(1),)) for v in mh.BOND_VOCAB], 1)
        out.append(Data(x=x, edge_index=ei, edge_attr=ea, y=torch.tensor([[float(i % 2)]])))
    return out


@pytest.mark.parametrize("conv", ["gat", "gatv2", "transformer"])
def test_on_device_batches_keep_the_compiled_fused_model_one_graph(mh, conv):
    """A fresh batch's layouts, built by on_device ahead of the step, are found
    by every fused conv inside torch.compile: the model traces as one graph. A
    batch straight from the loader makes each layer build its layout at a graph
    break."""
    from torch_geometric.loader import DataLoader

    from pyg_dfgnn.nn import fuse

    torch.manual_seed(0)
    model = mh.MoleculeModel(conv, hidden=16, heads=2, layers=2, dropout=0.0)
    fuse(model)
    loader = DataLoader(_random_molecules(mh, [5, 7, 9, 4]), batch_size=4)

    def run(m, b):
        return m(b.x, b.edge_index, b.edge_attr, b.batch, b.num_graphs).sum()

    torch._dynamo.reset()
    plain = torch._dynamo.explain(run)(model, next(iter(loader)))
    torch._dynamo.reset()
    ahead = torch._dynamo.explain(run)(model, next(iter(mh.on_device(
        loader, model, torch.device("cpu")))))
    assert plain.graph_break_count >= 2
    assert (ahead.graph_count, ahead.graph_break_count) == (1, 0)


def test_adam_is_fused_on_gpus_only(mh):
    """One fused kernel per step on a GPU (the step is host-bound); the default
    form elsewhere."""
    model = torch.nn.Linear(3, 2)
    assert mh._adam(model, 1e-3, torch.device("cuda")).defaults["fused"] is True
    assert mh._adam(model, 1e-3, torch.device("cpu")).defaults["fused"] is None


def test_loader_workers_give_every_model_the_same_batches(mh):
    """Two models' loaders with the same seed and workers yield the same
    batches epoch after epoch (the workers' seeds draw from the shuffle's
    generator); the workers stay across epochs."""
    torch.manual_seed(0)
    mols = _random_molecules(mh, [3 + i % 5 for i in range(24)])
    split = {"train": torch.arange(24)}

    def epochs(loader, n=2):
        return [[b.x.clone() for b in loader] for _ in range(n)]

    a, b = (mh.make_loaders(mols, split, batch_size=5, seed=3, workers=2)["train"]
            for _ in range(2))
    assert a.persistent_workers and a.num_workers == 2
    ea, eb = epochs(a), epochs(b)
    assert len(ea[0]) == 5
    for xa, xb in zip(ea[0] + ea[1], eb[0] + eb[1]):
        assert torch.equal(xa, xb)
    assert not all(torch.equal(x, y) for x, y in zip(ea[0], ea[1]))  # reshuffled


def test_workers_default_follows_the_device(mh):
    assert mh.parse_args(["--device", "cpu"]).workers == 0
    assert mh.parse_args(["--device", "cpu", "--workers", "3"]).workers == 3
    with pytest.raises(SystemExit):
        mh.parse_args(["--device", "cpu", "--workers", "-1"])
