"""benchmarks/layers.py on CPU, end to end on small generated graphs (and a file of
pre-batched molecules): every method per row, positive times, fused against PyG,
compile failures and errors recorded (not raised), a wrong fused output flagged,
--resume keeping what was measured."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import load_benchmark
from pyg_dfgnn import ops


@pytest.fixture(scope="module")
def lb():
    return load_benchmark("layers")


def run(lb, tmp_path, *extra, name="out.json"):
    """A quick CPU run, the compiled methods included (the eager backend compiles
    nothing) unless ``extra`` names its own ``--methods``."""
    out = tmp_path / name
    assert lb.main(["--quick", "--device", "cpu", "--compile-backend", "eager",
                    "--methods", ",".join(lb.METHODS), "--out", str(out), *extra]) == 0
    with open(out) as f:
        return json.load(f)


def test_quick_run_end_to_end(lb, tmp_path, capsys):
    # --out and --plot into folders that do not exist yet: the script makes them
    doc = run(lb, tmp_path, "--graphs", "Reddit-like", "--models", "gt,gat", "--dtypes", "fp32",
              "--heads-channels", "2x16", "--plot", str(tmp_path / "plots" / "p.png"),
              name="out/layers.json")
    rows = {r["key"]: r for r in doc["rows"]}
    assert set(rows) == {"gt/Reddit-like/2x16/fp32", "gat/Reddit-like/2x16/fp32"}
    assert doc["info"]["allow_tf32"] is False and doc["info"]["compile"]["dynamic"] is False
    for key, r in rows.items():
        assert r["nodes"] == 300 and r["edges"] > 300 and r["fused_reason"] == ""
        assert set(r["methods"]) == set(lb.METHODS), key
        for meth, d in r["methods"].items():
            assert d["status"] == "ok", (key, meth, d)
            assert d["fwd_ms"] > 0 and d["fwd_bwd_ms"] > 0
            assert d["rel_err"] < 1e-5, (key, meth, d["rel_err"])
        for meth in lb.COMPILED:
            assert r["methods"][meth]["compile_fwd_s"] > 0
            assert r["methods"][meth]["compile_fwd_bwd_s"] > 0
        sp = r["speedup_vs_pyg_compile"]
        assert set(sp) == {"fused", "fused-compile"} and sp["fused"]["fwd_bwd"] > 0
        best = max(v["fwd_bwd"] for v in sp.values())
        assert r["target"] == {"fwd_bwd": 2.0, "best": best, "met": best >= 2.0}
    text = capsys.readouterr().out
    assert any(line.split()[:4] == ["gt", "Reddit-like", "2×16", "fp32"]
               for line in text.splitlines()) and "not measured" not in text
    assert (tmp_path / "plots" / "p.png").stat().st_size > 0


def test_bf16_autocast(lb, tmp_path):
    doc = run(lb, tmp_path, "--graphs", "Reddit-like", "--models", "gt,agnn", "--dtypes", "bf16",
              "--bf16-models", "gt", "--methods", "pyg,fused")
    (r,) = doc["rows"]  # agnn is not in --bf16-models
    assert r["key"] == "gt/Reddit-like/1x128/bf16"
    for d in r["methods"].values():
        # autocast reaches the layers: outputs differ from fp32 PyG, within bf16 error
        assert d["status"] == "ok" and 1e-4 < d["rel_err"] < 5e-2


def test_batch_graph_and_layer_self_loops(lb, tmp_path):
    doc = run(lb, tmp_path, "--graphs", "PATTERN", "--models", "agnn", "--self-loops", "layer",
              "--in-channels", "16", "--methods", "pyg,fused", "--dtypes", "fp32")
    (r,) = doc["rows"]
    assert r["kind"] == "batch" and r["nodes"] > 8 * 40
    assert set(r["methods"]) == {"pyg", "fused"}
    assert r["methods"]["fused"]["rel_err"] < 1e-5
    assert r["speedup_vs_pyg_compile"] == {}


def test_edge_feature_model(lb, tmp_path):
    """gt_edge: TransformerConv with 16 random features per edge, fused (the
    dot_edge score) on its two graphs and no other; every method matches PyG."""
    doc = run(lb, tmp_path, "--graphs", "PATTERN,Reddit-like,web-NotreDame-like",
              "--models", "gt,gt_edge", "--dtypes", "fp32", "--heads-channels", "2x16",
              "--in-channels", "16")
    rows = {r["key"]: r for r in doc["rows"]}
    assert set(rows) == {"gt/PATTERN/2x16/fp32", "gt/Reddit-like/2x16/fp32",
                         "gt_edge/PATTERN/2x16/fp32", "gt_edge/web-NotreDame-like/2x16/fp32"}
    for key, r in rows.items():
        assert r["fused_reason"] == "", key
        for meth, d in r["methods"].items():
            assert d["status"] == "ok" and d["rel_err"] < 1e-5, (key, meth, d)
    assert rows["gt_edge/web-NotreDame-like/2x16/fp32"]["kind"] == "super"
    gt, edge = (rows[f"{m}/PATTERN/2x16/fp32"]["methods"]["fused"] for m in ("gt", "gt_edge"))
    assert gt["rel_err"] < 1e-5 and edge["fwd_bwd_ms"] > 0
    with pytest.raises(SystemExit, match="gt_edge runs on PATTERN, web-NotreDame-like, HIV"):
        run(lb, tmp_path, "--graphs", "Reddit-like", "--models", "gt_edge")
    case = lb.Case(lb.load_graph("PATTERN", "cpu", quick=True), "gt_edge", 2, 16, "fp32",
                   lb.parse_args(["--quick", "--device", "cpu", "--in-channels", "16"]))
    x, ei, ea = case.inputs()
    assert ea.shape == (ei.size(1), lb.EDGE_DIM) and not ea.requires_grad
    with ops.recording() as records:
        case.eager("fused")()
    # 2 x 16 channels with 16 features: tails move fewer bytes (tails_pay)
    assert [r.score for r in records] == ["dot_edge_tail"]


def _hiv_file(path, sizes=(2, 4), count=3):
    """A file of pre-batched molecules as benchmarks.datasets.hiv_batches reads
    it: ``count`` batches per size of small random molecules (node and bond
    features within PyG's vocabularies), each bond in both directions."""
    gen = torch.Generator().manual_seed(5)
    batches = {}
    for size in sizes:
        batches[size] = []
        for _ in range(count):
            xs, eis, eas, off = [], [], [], 0
            for _ in range(size):
                n = int(torch.randint(3, 8, (1,), generator=gen))
                src = torch.arange(n - 1)
                ei = torch.stack([torch.cat([src, src + 1]), torch.cat([src + 1, src])])
                bonds = torch.stack([torch.randint(0, 22, (n - 1,), generator=gen),
                                     torch.randint(0, 6, (n - 1,), generator=gen),
                                     torch.randint(0, 2, (n - 1,), generator=gen)], 1)
                xs.append(torch.randint(0, 5, (n, 9), generator=gen))
                eis.append(ei + off)
                eas.append(bonds.repeat(2, 1))
                off += n
            batches[size].append({"x": torch.cat(xs), "edge_index": torch.cat(eis, 1),
                                  "edge_attr": torch.cat(eas), "num_graphs": size})
    torch.save(batches, path)
    return batches


def test_hiv_graph_and_gat_edge_models(lb, tmp_path):
    """--hiv-batches adds graph HIV: --hiv-molecules molecules joined into one
    disjoint graph, their bond features embedded; gt_edge, gat_edge and
    gatv2_edge run fused on it (the additive_edge and gatv2_edge scores for the
    GAT models, with the graph's self-loops' features from fill_value "mean" or
    the layer's) and match PyG."""
    from benchmarks import datasets
    path = tmp_path / "hiv.pt"
    batches = _hiv_file(path)
    mol = datasets.hiv_batches(path, 8)  # two batches of 4 molecules
    parts = batches[4][:2]
    assert mol.num_graphs == 8 and mol.num_nodes == sum(b["x"].size(0) for b in parts)
    n0 = parts[0]["x"].size(0)
    assert torch.equal(mol.edge_index[:, parts[0]["edge_index"].size(1):],
                       parts[1]["edge_index"] + n0)
    assert torch.equal(datasets.hiv_batches(path, 6).edge_attr,
                       torch.cat([b["edge_attr"] for b in batches[2]]))
    with pytest.raises(ValueError, match="none divides"):
        datasets.hiv_batches(path, 5)
    with pytest.raises(ValueError, match="are needed"):
        datasets.hiv_batches(path, 16)
    g = lb.load_graph("HIV", "cpu", hiv_batches=path, hiv_molecules=8)
    assert g.kind == "batch" and g.edge_attr.shape == (mol.edge_index.size(1), lb.EDGE_DIM)
    assert torch.equal(g.edge_attr, lb.embed_bonds(mol.edge_attr))
    for loops in ("graph", "layer"):
        doc = run(lb, tmp_path, "--graphs", "HIV,PATTERN",
                  "--models", "gt_edge,gt_edge_rows,gat_edge,gatv2_edge,gat",
                  "--dtypes", "fp32", "--heads-channels", "2x16", "--in-channels", "16",
                  "--methods", "pyg,fused", "--hiv-batches", str(path), "--hiv-molecules", "8",
                  "--self-loops", loops, name=f"hiv_{loops}.json")
        rows = {r["key"]: r for r in doc["rows"]}
        assert set(rows) == {f"{m}/{g}/2x16/fp32" for m in lb.EDGE_MODELS
                             for g in ("HIV", "PATTERN")} | {"gat/PATTERN/2x16/fp32"}
        for key, r in rows.items():
            assert r["fused_reason"] == "", key
            for meth, d in r["methods"].items():
                assert d["status"] == "ok" and d["rel_err"] < 1e-5, (key, meth, d)
    args = lb.parse_args(["--quick", "--device", "cpu", "--in-channels", "16",
                          "--hiv-batches", str(path), "--hiv-molecules", "8"])
    for model, score in (("gat_edge", "additive_edge"), ("gatv2_edge", "gatv2_edge")):
        case = lb.Case(g, model, 2, 16, "fp32", args)
        x, ei, ea = case.inputs()
        assert ea.shape == (ei.size(1), lb.EDGE_DIM)
        assert ei.size(1) == g.edge_index.size(1) + g.num_nodes  # the graph's self-loops
        with ops.recording() as records:
            case.eager("fused")()
        assert [r.score for r in records] == [score]
    with pytest.raises(SystemExit, match="needs --hiv-batches"):
        run(lb, tmp_path, "--graphs", "HIV", "--models", "gat_edge")


def _exploding_compile(*args, **kwargs):
    raise RuntimeError("backend exploded\nsecond line of the trace")


def test_targets(lb):
    def row(dtype, kind, fused, fcomp):
        return {"dtype": dtype, "kind": kind, "speedup_vs_pyg_compile": {
            "fused": {"fwd": 1.0, "fwd_bwd": fused}, "fused-compile": {"fwd_bwd": fcomp}}}
    assert lb.target(row("fp32", "batch", 2.9, 3.1)) == {"fwd_bwd": 3.0, "best": 3.1,
                                                         "met": True}
    assert lb.target(row("fp32", "super", 1.9, 1.2))["met"] is False
    assert lb.target(row("fp32", "super", 2.0, 1.2))["met"] is True
    assert lb.target(row("bf16", "super", 2.5, 2.9)) == {"fwd_bwd": 3.0, "best": 2.9,
                                                         "met": False}
    assert lb.target({"dtype": "fp32", "kind": "batch", "speedup_vs_pyg_compile": {}}) is None
    m = {"pyg-compile": {"fwd_ms": 2.0, "fwd_bwd_ms": 6.0},
         "fused": {"fwd_ms": 0.5, "fwd_bwd_ms": 2.0},
         "fused-compile": {"status": "compile_failed", "error": "x"}}
    assert lb.speedups({"methods": m}) == {"fused": {"fwd": 4.0, "fwd_bwd": 3.0}}


def test_compile_failure_is_recorded(lb, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", _exploding_compile)
    doc = run(lb, tmp_path, "--graphs", "Reddit-like", "--models", "gt", "--dtypes", "fp32")
    (r,) = doc["rows"]
    for meth in lb.COMPILED:
        d = r["methods"][meth]
        assert d["status"] == "compile_failed"
        assert d["error"] == "RuntimeError: backend exploded"
    assert r["methods"]["pyg"]["status"] == r["methods"]["fused"]["status"] == "ok"
    assert r["speedup_vs_pyg_compile"] == {}
    text = capsys.readouterr().out
    assert "pyg-compile: compile_failed: RuntimeError: backend exploded" in text
    assert "cfail" in text


def test_errors_and_wrong_outputs_are_recorded(lb, tmp_path, monkeypatch):
    import pyg_dfgnn.nn.gat_conv as gat_conv
    import pyg_dfgnn.nn.transformer_conv as tconv
    real = tconv.gt_attention

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40 GiB")

    def wrong(*args, **kwargs):
        return real(*args, **kwargs) * 1.01

    monkeypatch.setattr(gat_conv, "gat_attention", out_of_memory)
    monkeypatch.setattr(tconv, "gt_attention", wrong)
    doc = run(lb, tmp_path, "--graphs", "Reddit-like", "--models", "gt,gat", "--dtypes", "fp32",
              "--methods", "pyg,fused")
    rows = {r["model"]: r for r in doc["rows"]}
    gat = rows["gat"]["methods"]
    assert gat["pyg"]["status"] == "ok"
    assert gat["fused"]["status"] == "error" and "out of memory" in gat["fused"]["error"]
    gt = rows["gt"]["methods"]["fused"]
    assert gt["status"] == "mismatch" and gt["rel_err"] > 1e-3 and gt["fwd_ms"] > 0
    assert "mismatch" in lb.failures(doc["rows"])


def test_resume_keeps_measured_methods(lb, tmp_path):
    args = ("--graphs", "Reddit-like", "--models", "gat", "--dtypes", "fp32")
    first = run(lb, tmp_path, *args, "--methods", "pyg")
    second = run(lb, tmp_path, *args, "--methods", "pyg,fused", "--resume")
    (r1,), (r2,) = first["rows"], second["rows"]
    assert set(r2["methods"]) == {"pyg", "fused"}
    assert r2["methods"]["pyg"] == r1["methods"]["pyg"]


def test_unknown_names_and_missing_graphs(lb, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown model"):
        lb.build_layers("gcn", 1, 8, 8, "graph")
    with pytest.raises(ValueError, match="unknown graph"):
        lb.load_graph("NoSuchGraph", "cpu", quick=True)
    with pytest.raises(SystemExit, match="unknown graph"):
        run(lb, tmp_path, "--graphs", "NoSuchGraph")

    def missing(*args, **kwargs):
        raise FileNotFoundError("ogbn-arxiv needs a data folder")
    monkeypatch.setattr(lb.profile_backward, "load_graph", missing)
    doc = run(lb, tmp_path, "--graphs", "ogbn-arxiv", "--models", "gt", "--dtypes", "fp32",
              "--methods", "pyg,fused")
    (r,) = doc["rows"]
    for d in r["methods"].values():
        assert d["status"] == "error"
        assert d["error"] == "graph not loaded: FileNotFoundError: ogbn-arxiv needs a data folder"


@pytest.mark.cuda
def test_quick_run_on_gpu(lb, tmp_path):
    out = tmp_path / "gpu.json"
    assert lb.main(["--quick", "--device", "cuda", "--graphs", "Reddit-like", "--models", "gt",
                    "--dtypes", "fp32", "--compile-backend", "aot_eager", "--out", str(out)]) == 0
    with open(out) as f:
        (r,) = json.load(f)["rows"]
    for meth, d in r["methods"].items():
        assert d["status"] == "ok", (meth, d)
        assert d["fwd_ms"] > 0 and d["fwd_bwd_ms"] > 0 and d["peak_MB"] > 0
        assert d["rel_err"] < 1e-4, (meth, d["rel_err"])


def test_default_grid_runs_every_model_in_both_dtypes(lb):
    cases, methods = lb.plan(lb.parse_args(["--device", "cpu"]))
    # every model on its graphs (lb.MODEL_GRAPHS; the others: all but
    # lb.EDGE_ONLY_GRAPHS), HIV only with --hiv-batches
    pairs = {(c[0], c[1]) for c in cases}
    assert pairs == {(g, m) for m in lb.MODELS for g in lb.GRAPHS if g != "HIV"
                     and g in lb.MODEL_GRAPHS.get(m, set(lb.GRAPHS) - set(lb.EDGE_ONLY_GRAPHS))}
    assert len(cases) == len(pairs) * 2
    for model in lb.EDGE_MODELS:
        assert {g for g, m in pairs if m == model} == {"PATTERN", "web-NotreDame-like"}
    with_hiv, _ = lb.plan(lb.parse_args(["--device", "cpu", "--hiv-batches", "hiv.pt"]))
    assert {(c[0], c[1]) for c in with_hiv} - pairs == {("HIV", m) for m in lb.EDGE_MODELS}
    assert {(c[1], c[4]) for c in cases} == {(m, d) for m in lb.MODELS for d in ("fp32", "bf16")}
    assert methods == ["pyg", "fused"]  # on the CPU compiling takes minutes per case
    _, methods = lb.plan(lb.parse_args(["--device", "cpu", "--methods", "fused-compile,pyg"]))
    assert methods == ["pyg", "fused-compile"]
    narrowed, _ = lb.plan(lb.parse_args(["--device", "cpu", "--bf16-models", "gt"]))
    assert {c[1] for c in narrowed if c[4] == "bf16"} == {"gt"}
