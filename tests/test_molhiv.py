"""examples/train_molhiv.py: the atom and bond encoders, ROC-AUC as OGB computes
it, and training steps of the fused model against the native one (close: every
conv, GATConv, GATv2Conv and TransformerConv, runs fused with its bond
features)."""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch

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
    expected = sum(atoms.embeddings[i].weight[x[:, i]] for i in range(9))
    torch.testing.assert_close(atoms(x), expected, rtol=0, atol=0)
    assert bonds(torch.tensor([[12, 3, 1]])).shape == (1, 8)


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
    losses and parameters (fp32 round-off once its layers run fused)."""
    from pyg_dfgnn.nn import fuse

    mols = _molecules()
    split = {"train": torch.arange(16), "val": torch.arange(8), "test": torch.arange(8, 16)}
    torch.manual_seed(0)
    native = mh.MoleculeModel(conv, hidden=16, heads=2, layers=2, dropout=0.1)
    report = fuse(native, inplace=False)
    assert [layer.name for layer in report] == ["convs.0", "convs.1"]
    runs = {}
    for impl, model in (("native", native), ("fused", report.model)):
        loaders = mh.make_loaders(mols, split, batch_size=8, seed=0)
        runs[impl] = mh.train_one(model, loaders, epochs=1, lr=1e-2, seed=0,
                                  device=torch.device("cpu"), progress=False)
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


def test_without_rdkit_one_line(mh, monkeypatch):
    monkeypatch.setitem(sys.modules, "rdkit", None)  # import rdkit raises ImportError
    with pytest.raises(SystemExit) as e:
        mh.run(["--device", "cpu", "--no-progress"])
    msg = str(e.value.code)
    assert "pip install rdkit" in msg and "\n" not in msg and "train_molhiv.py" in msg


@pytest.mark.parametrize("argv,error", [(["--hidden", "30", "--heads", "4"], "multiple"),
                                        (["--subset", "0"], "--subset must be >= 1")])
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
