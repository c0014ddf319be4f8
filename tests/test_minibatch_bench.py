"""benchmarks.minibatch on CPU: the table and JSON of a tiny grid, and the kernel
categories of ``--profile``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks import minibatch


@pytest.mark.parametrize("name, category", [
    ("void dfgnn::row_fwd_smmf_kernel<dfgnn::RowShape<float, 4, 32, 1>>(...)", "attention"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "gemm"),
    ("ampere_sgemm_128x64_nn", "gemm"),
    ("triton_poi_fused_add_elu_0", "compiled"),
    ("void at::native::_scatter_gather_elementwise_kernel<128, 4>(...)", "gather_scatter"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...Adam...>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::elu_kernel>", "other"),
])
def test_kernel_category(name, category):
    assert minibatch.kernel_category(name) == category


def _small_arxiv(tmp_path, n=400):
    """A small random graph in ogbn-arxiv's files under ``tmp_path``."""
    g = torch.Generator().manual_seed(0)
    folder = tmp_path / "ogbn-arxiv"
    folder.mkdir()
    src = torch.randint(0, n, (3000,), generator=g)
    dst = torch.randint(0, n, (3000,), generator=g)
    np.savez(folder / "edges.npz", edge_index=torch.stack([src, dst]).int().numpy())
    np.save(folder / "labels.npy", torch.randint(0, 5, (n,), generator=g).numpy())
    np.save(folder / "split.npy", torch.randint(0, 3, (n,), generator=g).numpy())


def test_tiny_grid_writes_rows(tmp_path, monkeypatch):
    """Two variants of two models on a small graph in ogbn-arxiv's files: a row
    per configuration with a step time, a speed-up and the layout build, and one
    sampling for both models."""
    _small_arxiv(tmp_path)
    out = tmp_path / "mb.json"
    calls = []
    sample = minibatch.sample_batches
    monkeypatch.setattr(minibatch, "sample_batches",
                        lambda *a, **k: calls.append(a) or sample(*a, **k))
    rows = minibatch.main(["--datasets", "arxiv", "--models", "gat,agnn", "--seeds", "16",
                           "--fanouts", "4,3", "--dtypes", "fp32", "--variants", "native,fused",
                           "--steps", "2", "--warmup", "1", "--data", str(tmp_path),
                           "--device", "cpu", "--out", str(out), "--profile", "2"])
    saved = json.loads(out.read_text())["rows"]
    assert len(rows) == len(saved) == 2
    assert json.loads(out.read_text())["meta"]["adam"] == "foreach"  # no fused Adam on CPU
    # both models train on the batches sampled once for their seed count and fan-out
    assert len(calls) == 1
    assert [r["model"] for r in saved] == ["gat", "agnn"]
    row = saved[0]
    assert row["edges"] > 0 and row["layout_ms"]
    for v in ("native", "fused"):
        r = row["variants"][v]
        assert "error" not in r, r
        assert r["step_ms"] > 0 and np.isfinite(r["loss"])
        assert "profile" not in r  # a CPU run has no GPU kernels to categorise
    assert row["variants"]["fused"]["speedup"] > 0


def test_resume_runs_only_the_missing_rows(tmp_path, monkeypatch):
    """--resume keeps the rows --out has and runs the others (sampling only where
    a row is missing); a row without a requested variant runs again; another
    setting is refused."""
    _small_arxiv(tmp_path)
    out = tmp_path / "mb.json"

    def main(models, variants, steps=2, resume=True):
        return minibatch.main(["--datasets", "arxiv", "--seeds", "16", "--fanouts", "4,3",
                               "--dtypes", "fp32", "--steps", str(steps), "--warmup", "1",
                               "--data", str(tmp_path), "--device", "cpu", "--out", str(out),
                               "--models", models, "--variants", variants]
                              + (["--resume"] if resume else []))

    main("gat", "native", resume=False)
    first = json.loads(out.read_text())["rows"]
    runs, samplings = [], []
    run, sample = minibatch.run_config, minibatch.sample_batches
    monkeypatch.setattr(minibatch, "run_config", lambda *a, **k: runs.append(a[2]) or run(*a, **k))
    monkeypatch.setattr(minibatch, "sample_batches",
                        lambda *a, **k: samplings.append(a) or sample(*a, **k))
    main("gat,agnn", "native")
    doc = json.loads(out.read_text())
    assert runs == ["agnn"] and len(samplings) == 1
    assert [r["model"] for r in doc["rows"]] == ["gat", "agnn"]
    assert doc["rows"][0] == first[0]  # kept as measured
    assert len(doc["meta"]["processes"]) == 2
    runs.clear(), samplings.clear()
    main("gat,agnn", "native")  # every row there: nothing sampled or run
    assert runs == [] and samplings == []
    main("gat,agnn", "native,fused")  # the rows lack "fused": both run again
    assert runs == ["gat", "agnn"]
    assert all("fused" in r["variants"] for r in json.loads(out.read_text())["rows"])
    with pytest.raises(SystemExit, match="steps = 2, this run has 3"):
        main("gat", "native", steps=3)
