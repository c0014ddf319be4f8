"""CPU checks of benchmarks/sanitize.py's comparisons: AGNN's ``beta`` gradient is
the sum of per-edge terms that cancel, so its check divides by their magnitudes."""
import pytest
import torch

from benchmarks import sanitize
from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout


@pytest.mark.parametrize("kind", ["super_node", "small", "batch"])
def test_beta_terms_add_up_to_the_reference_gradient(kind):
    gen = torch.Generator().manual_seed(2)
    ei, n, _ = sanitize._graph(kind, gen)
    lay = GraphLayout.from_edge_index(ei, (n, n), add_self_loops=True)
    x = torch.randn(n, 32, dtype=torch.float64, generator=gen, requires_grad=True)
    beta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(n, 32, dtype=torch.float64, generator=gen)
    ops.agnn_attention(lay, x, None, beta).backward(g)
    terms = sanitize.beta_terms(lay.col.long(), lay.csr_row.long(), x, 1.3, g, n)
    assert terms.shape == (lay.num_edges,)
    scale = float(terms.abs().sum())
    assert abs(float(terms.sum()) - float(beta.grad)) <= 1e-9 * scale
    assert scale > 5 * abs(float(beta.grad))  # they cancel


def test_check_divides_by_the_floor_where_it_is_larger(monkeypatch):
    monkeypatch.setattr(sanitize, "FAILURES", [])
    want = torch.tensor([0.09])
    got = torch.tensor([0.03])
    sanitize._check("near zero", got, want, 2e-2)  # relative to 0.09: 0.67
    assert [name for name, _ in sanitize.FAILURES] == ["near zero"]
    sanitize._check("scaled", got, want, 2e-2, floor=500.0)  # 0.06 / 500
    assert len(sanitize.FAILURES) == 1
    assert sanitize._rel(got, want, 500.0) == pytest.approx(0.06 / 500)
    assert sanitize._rel(got, want, 0.01) == pytest.approx(0.06 / 0.09)
    assert sanitize._rel(torch.tensor([float("nan")]), want, 500.0) == float("inf")


@pytest.mark.parametrize("count", [1, 3])
def test_shards_run_every_case_once(monkeypatch, count):
    ran = []
    case = sanitize._case(lambda name: ran.append(name))
    for index in range(count):
        monkeypatch.setattr(sanitize, "SHARD", [index, count])
        monkeypatch.setattr(sanitize, "_SEEN", [0])
        for i in range(10):
            case(f"case {i}")
    assert sorted(ran) == sorted(f"case {i}" for i in range(10))


@pytest.mark.parametrize("shard", ["2/2", "1", "a/b", "-1/2"])
def test_bad_shard_is_a_usage_error(shard, capsys):
    with pytest.raises(SystemExit) as err:
        sanitize.main(["--shard", shard])
    assert err.value.code == 2
    assert "--shard" in capsys.readouterr().err


def _race_log(kernels, tail="0 failed\n"):
    reports = "".join(
        f"========= Error: Race reported between Read access at {a}+0xaf0\n"
        f"=========     and Write access at {b}+0x29b0 [8 hazards]\n" for a, b in kernels)
    return ("  gt small fp32 H2C32 out   rel err 1.0e-07 ok\n" + reports + tail +
            f"========= RACECHECK SUMMARY: {len(kernels)} hazards displayed\n")


def test_racecheck_passes_where_every_hazard_is_cublas():
    gemm = "nvjet_sm90_tst_64x32_64x16_1x2_h_bz_NTT"
    passes, reason = sanitize.racecheck_verdict(_race_log([(gemm, gemm), (gemm, gemm)]))
    assert passes and "2 hazard reports" in reason and gemm in reason


@pytest.mark.parametrize("log, why", [
    (_race_log([("nvjet_a", "nvjet_a"), ("gt_bwd_dkv_dense_kernel", "nvjet_a")]),
     "gt_bwd_dkv_dense_kernel"),
    (_race_log([("nvjet_a", "nvjet_a"), ("void dfgnn::(anonymous namespace)::gt_bwd_dq_dense_"
                                         "kernel<__half, (int)32>(dfgnn::DenseBwd<__half>)",
                                         "nvjet_a")]),
     "gt_bwd_dq_dense_kernel<__half, (int)32>"),
    (_race_log([("nvjet_a", "nvjet_a")]) + "========= Error: Race reported in an unknown form\n",
     "1 of 2 hazard reports could not be read"),
    (_race_log([("nvjet_a", "nvjet_a")], tail="1 failed\n"), "0 failed"),
    (_race_log([("nvjet_a", "nvjet_a")], tail="========= Internal Sanitizer Error: x\n0 failed\n"),
     "error"),
    (_race_log([]), "no hazard report"),
])
def test_racecheck_fails_otherwise(log, why):
    passes, reason = sanitize.racecheck_verdict(log)
    assert not passes and why in reason


def test_judge_racecheck_exit_status(tmp_path, capsys):
    good, bad = tmp_path / "good.log", tmp_path / "bad.log"
    good.write_text(_race_log([("nvjet_a", "nvjet_b")]))
    bad.write_text(_race_log([("row_fwd_smmf", "row_fwd_smmf")]))
    assert sanitize.main(["--judge-racecheck", str(good)]) == 0
    assert sanitize.main(["--judge-racecheck", str(bad)]) == 1
    assert "row_fwd_smmf" in capsys.readouterr().out


def test_only_runs_the_named_families(monkeypatch):
    """``--only gat`` runs the cases whose name's first word is ``gat``, not the
    ``gat_edge`` or ``gatv2`` ones, and counts only those into the shards."""
    import benchmarks.sanitize as san
    ran = []
    case = san._case(lambda name: ran.append(name))
    monkeypatch.setattr(san, "ONLY", ["gat"])
    monkeypatch.setattr(san, "_SEEN", [0])
    monkeypatch.setattr(san, "SHARD", [1, 2])
    for name in ("gat small smmf row", "gat_edge small", "gatv2 small", "gat layer small",
                 "gat batch pmf"):
        case(name)
    assert ran == ["gat layer small"] and san._SEEN == [3]
