"""benchmarks/e2e.py --quick on CPU, in-process: JSON structure, finite losses, and
native / fused computing the same function (same weights, dropout 0); the
cudagraph mode's options, tables and bookkeeping on CPU (the step run eagerly),
and the captured mode itself on a GPU (``cuda`` marker)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import ROOT, load_benchmark
from benchmarks import datasets


@pytest.fixture(scope="module")
def e2e():
    return load_benchmark("e2e")


@pytest.fixture(scope="module")
def quick(e2e, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "e2e.json"
    report = e2e.main(["--quick", "--datasets", "pattern", "--models", "gt", "--dropout", "0",
                       "--device", "cpu", "--no-progress", "--out", str(out)])
    return report, out


def _finite(xs):
    return all(isinstance(x, float) and math.isfinite(x) for x in xs)


def test_json_structure(quick, e2e):
    report, out = quick
    on_disk = json.loads(out.read_text())
    assert on_disk["rows"] == json.loads(json.dumps(report["rows"]))
    info = on_disk["info"]
    for key in ("gpu", "device", "torch", "cuda", "torch_geometric", "pyg_dfgnn", "cuda_kernels",
                "date", "quick"):
        assert key in info
    assert info["device"] == "cpu" and info["quick"] is True and info["cuda_kernels"] is False
    assert info["allow_tf32"] is False and info["float32_matmul_precision"] == "highest"
    assert on_disk["config"]["batch_size"] == 32 and on_disk["config"]["train_graphs"] == 64
    assert on_disk["config"]["adam"] == "foreach" and on_disk["config"]["mode"] == "eager"
    (row,) = on_disk["rows"]
    assert (row["dataset"], row["kind"], row["model"]) == ("PATTERN", "batch", "gt")
    assert row["graphs_per_step"] == 32 and row["steps_per_epoch"] == 2
    assert set(row["impls"]) == {"native", "fused"}
    for impl, r in row["impls"].items():
        assert "error" not in r
        for p in e2e.PHASES:
            assert r[f"{p}_ms"] >= 0.0
        assert r["step_ms"] > 0 and r["forward_ms"] > 0 and r["backward_ms"] > 0
        assert r["sum_ms"] == pytest.approx(sum(r[f"{p}_ms"] for p in e2e.PHASES))
        assert r["steps"] == 4 and r["timed_steps"] == 3          # 2 epochs x 2, warmup 1
        assert len(r["losses"]) == 4 and len(r["epochs"]) == 2
        assert r["peak_MB"] is None                               # CPU: no CUDA memory stats
        assert _finite(r["losses"]) and _finite([e["loss"] for e in r["epochs"]])
        assert 0.0 <= r["test_acc"] <= 1.0
    assert row["impls"]["native"]["preprocess_ms"] == 0.0
    assert row["impls"]["fused"]["preprocess_ms"] > 0.0           # layout built every step
    assert set(row["speedup"]) == {"step", "forward", "backward", "sum"}
    assert "cudagraph" not in row                                 # eager mode only


def test_same_function(quick):
    (row,) = quick[0]["rows"]
    na, fu = row["impls"]["native"], row["impls"]["fused"]
    # identical weights, dropout 0: the first loss is the same function's value
    assert fu["first_loss"] == pytest.approx(na["first_loss"], rel=1e-5)
    assert fu["first_epoch_loss"] == pytest.approx(na["first_epoch_loss"], rel=1e-4)
    for a, b in zip(fu["losses"], na["losses"]):
        assert a == pytest.approx(b, rel=1e-3)


def test_tables(quick, e2e):
    text = e2e.format_tables(quick[0])
    for word in ("GT model", "PATTERN", "Preprocess", "Forward", "Backward", "Optimizer",
                 "Speedup", "Test acc"):
        assert word in text


@pytest.mark.skipif(datasets.data_dir() is None, reason="no data folder ($PYG_DFGNN_DATA)")
def test_full_graph_agnn(e2e, tmp_path):
    report = e2e.main(["--quick", "--datasets", "cora", "--models", "agnn", "--dropout", "0",
                       "--device", "cpu", "--no-progress", "--full-epochs", "2",
                       "--out", str(tmp_path / "e.json")])
    (row,) = report["rows"]
    assert row["kind"] == "full" and row["nodes"] == 2708
    na, fu = row["impls"]["native"], row["impls"]["fused"]
    assert fu["first_loss"] == pytest.approx(na["first_loss"], rel=1e-5)
    assert fu["preprocess_first_ms"] > 0.0    # the layout is built once, on the first step
    assert "best_epoch" in fu and _finite(fu["losses"])


def test_plot_from_e2e_json(quick, tmp_path):
    plot = load_benchmark("plot")
    kernels = ROOT / "benchmarks" / "results" / "kernels_h100.json"
    written = plot.main(["--kernels", str(kernels), "--e2e", str(quick[1]),
                         "--out-dir", str(tmp_path)])
    assert len(written) == 3
    for w in written:
        assert Path(w).stat().st_size > 10 * 1024


def test_bad_arguments(e2e):
    for argv in (["--datasets", "zinc"], ["--models", "gcn"], ["--hidden", "30", "--heads", "4"]):
        with pytest.raises(SystemExit):
            e2e.parse_args(argv)


# ------------------------------------------------------------------ cudagraph mode, CPU
def test_mode_adam_and_batch_defaults(e2e):
    a = e2e.parse_args(["--device", "cpu"])
    assert (a.mode, a.modes, a.adam) == ("eager", ["eager"], "foreach")
    assert (a.train_graphs, a.epochs, a.test_graphs, a.batch_size) == (10000, 10, 1024, 1024)
    q = e2e.parse_args(["--device", "cpu", "--quick"])
    assert (q.train_graphs, q.epochs, q.batch_size) == (64, 2, 32)
    for mode in ("cudagraph", "both"):
        with pytest.raises(SystemExit):               # capture needs CUDA
            e2e.parse_args(["--device", "cpu", "--mode", mode])
    assert e2e.parse_args(["--device", "cpu", "--adam", "fused"]).adam == "fused"
    for bad in (["--adam", "sgd"], ["--mode", "graph"]):
        with pytest.raises(SystemExit):
            e2e.parse_args(["--device", "cpu", *bad])
    batch, full = type("B", (), {"kind": "batch"})(), type("F", (), {"kind": "full"})()
    assert e2e._hparams(batch, a)["lr"] == 2e-3 and e2e._hparams(full, a)["lr"] == 5e-3


def test_adam_recorded(e2e, tmp_path):
    report = e2e.main(["--quick", "--datasets", "pattern", "--models", "gat", "--impls", "fused",
                       "--epochs", "1", "--adam", "fused", "--device", "cpu", "--no-progress",
                       "--out", str(tmp_path / "e.json")])
    assert report["config"]["adam"] == "fused"
    assert json.loads((tmp_path / "e.json").read_text())["config"]["adam"] == "fused"
    (row,) = report["rows"]
    assert _finite(row["impls"]["fused"]["losses"])


def test_separate_projection_impl(e2e, tmp_path):
    """``fused_separate``: the fused GT model with ``fused_projection=False``, same
    weights and function as ``fused``, timed side by side."""
    report = e2e.main(["--quick", "--datasets", "pattern", "--models", "gt", "--impls",
                       "fused,fused_separate", "--epochs", "1", "--dropout", "0",
                       "--device", "cpu", "--no-progress", "--out", str(tmp_path / "e.json")])
    (row,) = report["rows"]
    fu, sep = row["impls"]["fused"], row["impls"]["fused_separate"]
    for a, b in zip(sep["losses"], fu["losses"]):
        assert a == pytest.approx(b, rel=1e-4)
    assert set(row["projection_speedup"]) == {"step", "forward", "backward"}
    assert "Joined projection speedup" in e2e.format_tables(report)
    args = e2e.parse_args(["--quick", "--device", "cpu"])
    for impl, joined in (("fused", True), ("fused_separate", False)):
        model = e2e.build_model("gt", impl, 4, 2, args, 0.0)
        assert all(layer.attn.fused_projection is joined for layer in model.layers)
    e2e.build_model("gat", "fused_separate", 4, 2, args, 0.0)  # GAT: nothing to separate


def _fake_report():
    def res(step, acc, **kw):
        return {"step_ms": step, "capture_ms": 12.5, "timed_steps": 95, "peak_MB": 90.0,
                "test_acc": acc, "losses": [1.9, 1.5], "epochs": [], "final_loss": 1.5,
                "preprocess_ms": 0.0, "forward_ms": step / 2, "backward_ms": step / 3,
                "optimizer_ms": step / 6, **kw}
    info = {"gpu": "FakeGPU", "torch": "x", "date": "2026-01-01"}
    full = {"dataset": "Cora", "model": "gt", "kind": "full",
            "impls": {"native": res(16.3, 0.80), "fused": res(13.0, 0.81)},
            "speedup": {"step": 16.3 / 13.0},
            "cudagraph": {"native": res(4.25, 0.79), "fused": res(1.70, 0.80),
                          "speedup": {"step": 2.5}, "vs_eager": {"native": 3.8, "fused": 7.6}}}
    batch = {"dataset": "PATTERN", "model": "gt", "kind": "batch",
             "impls": {"native": res(317.2, 0.8), "fused": res(35.8, 0.8)},
             "speedup": {"step": 8.86}, "cudagraph": {"skipped": e2e_skip()}}
    broken = {"dataset": "PubMed", "model": "gt", "kind": "full", "impls": {},
              "cudagraph": {"native": {"error": "capture failed: RuntimeError: sync"},
                            "fused": res(2.0, 0.4)}}
    graph_only = {"dataset": "Cora", "model": "gat", "kind": "full", "impls": {},
                  "cudagraph": {"native": res(3.0, 0.8), "fused": res(1.5, 0.8),
                                "speedup": {"step": 2.0}}}
    return {"info": info, "rows": [full, batch, broken, graph_only]}


def e2e_skip():
    return "cudagraph mode applies to full graphs (static shapes)"


def test_format_tables_cudagraph(e2e):
    assert e2e.CUDAGRAPH_SKIP == e2e_skip()
    text = e2e.format_tables(_fake_report())
    gt, gat = text.split("GAT model")
    for word in ("GT model", "Step (median)", "13.00 (16.30)", "1.25x", "CUDA graph: step",
                 "1.70 (4.25)", "2.50x", "CUDA graph: capture ms", "12.5 (12.5)", "skipped",
                 "2.00 (err)", "capture failed: RuntimeError: sync", "CUDA graph: test acc"):
        assert word in gt, word
    # a model with cudagraph results only: no eager phase lines
    assert "CUDA graph: step" in gat and "1.50 (3.00)" in gat and "2.00x" in gat
    assert "Forward" not in gat and "Preprocess" not in gat
    # eager-only reports print no cudagraph lines
    rep = _fake_report()
    for r in rep["rows"]:
        r.pop("cudagraph")
    assert "CUDA graph" not in e2e.format_tables({"info": rep["info"], "rows": rep["rows"][:2]})


def test_native_self_loops_preadded_same_function(e2e):
    """Native GAT / AGNN in cudagraph mode read an edge_index with self-loops added
    once and are built with add_self_loops=False: the same function as the conv
    adding them itself."""
    from conftest import random_graph, rel_err
    from torch_geometric.nn import AGNNConv, GATConv
    n = 30
    ei = random_graph(n, num_edges=90, num_self_loops=4)
    looped = e2e.native_graph_edge_index(ei, n)
    assert looped.size(1) == ei.size(1) - int((ei[0] == ei[1]).sum()) + n
    x = torch.randn(n, 16)
    for make in (lambda **kw: GATConv(16, 8, heads=2, **kw), lambda **kw: AGNNConv(**kw)):
        torch.manual_seed(0)
        a = make()
        torch.manual_seed(0)
        b = make(add_self_loops=False)
        b.load_state_dict(a.state_dict())
        assert rel_err(b(x, looped), a(x, ei)) < 1e-6


@pytest.mark.parametrize("adam", ["foreach", "fused"])
def test_reset_training_state(e2e, adam):
    """Reloading the weights and zeroing Adam's state after some steps gives the same
    next step as a new model and a new Adam (what undoes the capture warm-up)."""
    args = e2e.parse_args(["--device", "cpu", "--adam", adam])
    hp = {"lr": 1e-2, "weight_decay": 5e-4}
    x, y = torch.randn(20, 8), torch.randint(0, 3, (20,))

    def new_model():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                   torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def step(model, opt):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    init = {k: v.clone() for k, v in new_model().state_dict().items()}
    ref, used = new_model(), new_model()
    ref_opt, used_opt = e2e.make_optimizer(ref, hp, args), e2e.make_optimizer(used, hp, args)
    for _ in range(3):
        step(used, used_opt)
    params = [p.data_ptr() for p in used.parameters()]
    e2e.reset_training_state(used, used_opt, init)
    assert [p.data_ptr() for p in used.parameters()] == params        # in place
    for _ in range(2):
        assert step(used, used_opt) == pytest.approx(step(ref, ref_opt), rel=1e-6)
    for a, b in zip(used.state_dict().values(), ref.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(datasets.data_dir() is None, reason="no data folder ($PYG_DFGNN_DATA)")
def test_cudagraph_bookkeeping_on_cpu(e2e):
    """The cudagraph run's step function, run eagerly (``capture=False``): the same
    losses as the eager run for both implementations (native with pre-added
    self-loops), same step and timing counts."""
    args = e2e.parse_args(["--quick", "--device", "cpu", "--dropout", "0", "--full-epochs", "3"])
    dev = torch.device("cpu")
    ds = e2e.load_dataset("cora", args, dev)
    hp = e2e._hparams(ds, args)
    e2e._seed(args.seed)
    init = e2e.build_model("gat", "native", ds.in_channels, ds.num_classes, args,
                           hp["dropout"]).state_dict()
    eager = e2e.train_impl(ds, "gat", "native", init, args, dev, hp)
    for impl in e2e.IMPLS:
        r = e2e.train_impl_cudagraph(ds, "gat", impl, init, args, dev, hp, capture=False)
        assert r["captured"] is False and r["capture_ms"] is None
        assert (r["steps"], r["timed_steps"]) == (eager["steps"], eager["timed_steps"])
        assert r["step_ms"] > 0 and len(r["epochs"]) == 3 and "best_epoch" in r
        for a, b in zip(r["losses"], eager["losses"]):
            assert a == pytest.approx(b, rel=1e-5)
        loops = int((ds.data.edge_index[0] == ds.data.edge_index[1]).sum())
        assert r["edges"] == (ds.edges if impl == "fused" else ds.edges - loops + ds.nodes)
    with pytest.raises(ValueError):
        e2e.train_impl_cudagraph(ds, "gat", "fused", init, args, dev, hp, capture=True)


# ------------------------------------------------------------------ cudagraph mode, GPU
@pytest.mark.cuda
@pytest.mark.skipif(datasets.data_dir() is None, reason="no data folder ($PYG_DFGNN_DATA)")
def test_cudagraph_mode_cuda(e2e, tmp_path):
    """Both implementations captured on Cora (GAT): positive replay times, finite
    losses, and the first captured loss equal to the eager one (same weights, same
    data, dropout 0)."""
    report = e2e.main(["--quick", "--datasets", "cora", "--models", "gat", "--mode", "both",
                       "--dropout", "0", "--device", "cuda", "--no-progress",
                       "--out", str(tmp_path / "e.json")])
    assert report["config"]["mode"] == "both" and report["config"]["adam"] == "fused"
    (row,) = report["rows"]
    cg = row["cudagraph"]
    eager_first = row["impls"]["native"]["first_loss"]
    for impl in e2e.IMPLS:
        r, e = cg[impl], row["impls"][impl]
        assert "error" not in r, r
        assert "error" not in e, e
        assert r["captured"] is True and r["capture_ms"] > 0 and r["step_ms"] > 0
        assert r["timed_steps"] == e["timed_steps"] and r["peak_MB"] > 0
        assert _finite(r["losses"]) and len(r["losses"]) == len(e["losses"])
        assert r["first_loss"] == pytest.approx(eager_first, rel=1e-4)
        assert r["first_loss"] == pytest.approx(e["first_loss"], rel=1e-4)
        for a, b in zip(r["losses"], e["losses"]):
            assert a == pytest.approx(b, rel=1e-3)
    assert cg["speedup"]["step"] > 0 and set(cg["vs_eager"]) == set(e2e.IMPLS)
    assert "CUDA graph: step" in e2e.format_tables(report)


# ------------------------------------------------------------------ compiled impls, CPU
def _fail_backend(gm, example_inputs):
    raise RuntimeError("deliberately failing compiler\nsecond line")


def test_compiled_native_recorded(e2e, tmp_path):
    """``native_compile`` (dynamo with the eager backend on CPU) trains the same
    function as native, with its compile time, and fused gets its speedup over it."""
    report = e2e.main(["--quick", "--datasets", "pattern", "--models", "gt", "--dropout", "0",
                       "--impls", "native,fused,native_compile", "--compile-backend", "eager",
                       "--epochs", "1", "--device", "cpu", "--no-progress",
                       "--out", str(tmp_path / "e.json")])
    (row,) = json.loads((tmp_path / "e.json").read_text())["rows"]
    assert report["config"]["compile_backend"] == "eager"
    nc, na = row["impls"]["native_compile"], row["impls"]["native"]
    assert nc["status"] == "ok" and nc["compile_ms"] > 0 and nc["preprocess_ms"] == 0.0
    assert nc["compile"] == {"dynamic": True, "mode": "default", "backend": "eager"}
    assert "compile_ms" not in na
    assert nc["first_loss"] == pytest.approx(na["first_loss"], rel=1e-5)
    assert set(row["speedup_vs_compiled"]) == {"step", "forward", "backward"}
    assert row["speedup_vs_compiled"]["step"] == pytest.approx(
        nc["step_ms"] / row["impls"]["fused"]["step_ms"])
    text = e2e.format_tables(report)
    for word in ("Compiled native: step", "Compiled native: compile s",
                 "Speedup vs compiled native"):
        assert word in text


def test_compile_failure_recorded(e2e, tmp_path):
    """A compiler that raises: the run is recorded as compile_failed, the others run."""
    from torch._dynamo import list_backends, register_backend
    if "yard_fail" not in list_backends(exclude_tags=()):
        register_backend(_fail_backend, name="yard_fail")
    report = e2e.main(["--quick", "--datasets", "pattern", "--models", "gat", "--epochs", "1",
                       "--impls", "fused,native_compile", "--compile-backend", "yard_fail",
                       "--device", "cpu", "--no-progress", "--out", str(tmp_path / "e.json")])
    (row,) = report["rows"]
    r = row["impls"]["native_compile"]
    assert r["status"] == "compile_failed" and r["error"].startswith("compile failed: ")
    assert "deliberately failing compiler" in " ".join(r["error_chain"])
    assert "second line" not in r["error"]
    assert "step_ms" in row["impls"]["fused"] and "speedup_vs_compiled" not in row
    text = e2e.format_tables(report)
    assert "cfail" in text and "native_compile: compile failed" in text


@pytest.mark.cuda
def test_compiled_native_cuda(e2e, tmp_path):
    """native_compile with inductor on the GPU (in the default impls there): it trains
    the same function as native and fused gets a speedup over it."""
    report = e2e.main(["--quick", "--datasets", "pattern", "--models", "gt", "--dropout", "0",
                       "--epochs", "1", "--device", "cuda", "--no-progress",
                       "--out", str(tmp_path / "e.json")])
    assert report["config"]["impls"] == ["native", "fused", "native_compile"]
    for row in report["rows"]:
        nc, na = row["impls"]["native_compile"], row["impls"]["native"]
        assert nc["status"] == "ok", nc
        assert nc["compile_ms"] > 0 and nc["compile"]["backend"] == "inductor"
        assert nc["first_loss"] == pytest.approx(na["first_loss"], rel=1e-4)
        assert row["speedup_vs_compiled"]["step"] > 0


# ----------------------------------------------------------------------------- --resume
def _counting(e2e, monkeypatch):
    """Wraps ``train_impl``: the ``(model, impl)`` of every run, in order."""
    calls, real = [], e2e.train_impl

    def train_impl(ds, model_name, impl, *args, **kwargs):
        calls.append((model_name, impl))
        return real(ds, model_name, impl, *args, **kwargs)

    monkeypatch.setattr(e2e, "train_impl", train_impl)
    return calls


def _resume_args(out, models, *extra):
    # generated graphs: no data folder needed
    return ["--quick", "--datasets", "pattern", "--models", models, "--impls", "native,fused",
            "--dropout", "0", "--epochs", "1", "--device", "cpu", "--no-progress",
            "--out", str(out), "--resume", *extra]


def test_resume_runs_only_missing_rows(e2e, tmp_path, monkeypatch):
    out = tmp_path / "e.json"
    first = e2e.main(_resume_args(out, "agnn"))     # no file yet: an ordinary run
    assert "processes" not in first["info"]
    calls = _counting(e2e, monkeypatch)
    report = e2e.main(_resume_args(out, "gat,agnn"))
    assert calls == [("gat", "native"), ("gat", "fused")]
    assert [(r["key"], r["model"]) for r in report["rows"]] == [("pattern", "gat"),
                                                                ("pattern", "agnn")]
    assert report["rows"][1] == first["rows"][0]     # kept as it was, not run again
    assert report["config"]["models"] == ["gat", "agnn"]
    procs = report["info"]["processes"]
    assert [p["rows"] for p in procs] == [["PATTERN/agnn"], ["PATTERN/gat"]]
    assert all("--resume" in p["argv"] for p in procs)
    assert json.loads(out.read_text()) == report
    calls.clear()
    again = e2e.main(_resume_args(out, "gat,agnn"))  # nothing left to run
    assert calls == [] and again["rows"] == report["rows"]
    assert [p["rows"] for p in again["info"]["processes"]] == [["PATTERN/agnn"],
                                                               ["PATTERN/gat"], []]


def test_resume_reruns_the_row_that_lost_the_gpu(e2e, tmp_path, monkeypatch):
    out = tmp_path / "e.json"
    report = e2e.main(_resume_args(out, "agnn"))
    # as a process stops after a fault in generated code: the faulting impl's
    # result recorded, the impls after it never run
    row = report["rows"][0]
    crash = {"error": "AcceleratorError: CUDA error: misaligned address"}
    row["impls"] = {"native": crash}
    row["cuda_context_lost"] = "native"
    out.write_text(json.dumps(report))
    calls = _counting(e2e, monkeypatch)
    resumed = e2e.main(_resume_args(out, "agnn"))
    assert calls == [("agnn", "fused")]
    (row,) = resumed["rows"]
    assert row["impls"]["native"] == crash and "step_ms" in row["impls"]["fused"]
    assert row["context_lost_earlier"] == "native" and "cuda_context_lost" not in row
    assert "speedup" not in row                       # no native time to divide
    calls.clear()
    e2e.main(_resume_args(out, "agnn"))               # complete now
    assert calls == []


def test_resume_refuses_other_settings(e2e, tmp_path):
    out = tmp_path / "e.json"
    e2e.main(_resume_args(out, "agnn"))
    with pytest.raises(SystemExit, match="hidden = 32, this run has 16"):
        e2e.main(_resume_args(out, "gat", "--hidden", "16", "--heads", "2"))
    data = json.loads(out.read_text())
    data["info"]["gpu"] = "another GPU"
    out.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="gpu = 'another GPU'"):
        e2e.main(_resume_args(out, "gat"))
