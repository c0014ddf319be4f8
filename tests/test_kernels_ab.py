"""benchmarks/kernels_ab.py: two builds' kernel records compared timing by timing, on
records that benchmarks/kernels.py writes on the CPU (so a change of its format
breaks this test) and on copies of them slowed where the test says."""
from __future__ import annotations

import copy
import json

import pytest

from conftest import load_benchmark
from test_kernels_bench import tiny_batch


@pytest.fixture(scope="module")
def ab():
    return load_benchmark("kernels_ab")


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """A --quick CPU record of benchmarks.kernels on a tiny batch, with a host-bound
    copy of its row (``kind: "full"``) and a GAT score row beside it."""
    kb = load_benchmark("kernels")
    ei, batch = tiny_batch()
    mp = pytest.MonkeyPatch()
    mp.setattr(kb, "load_graphs",
               lambda quick, data=None: {"tiny": (ei, batch.numel(), "batch", batch)})
    for name in ("DEV", "REPEATS"):
        mp.setattr(kb, name, getattr(kb, name))
    out = tmp_path_factory.mktemp("ab") / "k.json"
    try:
        assert kb.main(["--quick", "--device", "cpu", "--models", "gt,gat",
                        "--out", str(out)]) == 0
    finally:
        mp.undo()
    doc = json.loads(out.read_text())
    full = copy.deepcopy(doc["rows"][0])
    full.update(graph="tinyfull", kind="full")
    doc["rows"].append(full)
    assert doc["score_rows"] and doc["score_rows"][0]["model"] == "gat"
    return doc


def scaled(doc, factor, graph=None, method="fused-auto", phase="fwd_ms", section="rows"):
    out = copy.deepcopy(doc)
    for row in out[section]:
        if graph is None or row["graph"] == graph:
            row["methods"][method][phase] *= factor
    return out


def test_every_ok_timing_of_both_sections_is_read(ab, record):
    t = ab.timings(record)
    models = {k[0] for k in t}
    assert models == {"gt", "gat"}
    assert ("gt", "tiny", "1x128", "float32", "fused-auto fwd_bwd_ms") in t
    assert t[("gt", "tinyfull", "1x128", "float32", "fused-auto fwd_ms")][1] == "full"
    bad = copy.deepcopy(record)
    bad["rows"][0]["methods"]["pyg"]["status"] = "error"
    assert ("gt", "tiny", "1x128", "float32", "pyg fwd_ms") not in ab.timings(bad)


def test_equal_records_pass(ab, record, tmp_path):
    res = ab.compare([record, record], [record])
    s = res["summary"]
    assert s["gpu_bound"]["timings"] > 0 and s["host_bound"]["timings"] > 0
    assert s["gpu_bound"]["median"] == s["gpu_bound"]["max"] == 1.0
    assert not s["gpu_bound"]["over"] and s["unmatched"] == 0
    paths = []
    for name, doc in (("a", record), ("b", record)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    out = tmp_path / "ab.json"
    assert ab.main(["--base", str(paths[0]), "--new", str(paths[1]), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["gpu_bound"]["max"] == 1.0


def test_a_slower_gpu_bound_timing_fails_and_is_named(ab, record, tmp_path):
    slow = scaled(record, 1.05, graph="tiny")
    res = ab.compare([record], [slow], tolerance=0.03)
    (over,) = res["summary"]["gpu_bound"]["over"]
    assert (over["model"], over["graph"], over["timing"]) == ("gt", "tiny", "fused-auto fwd_ms")
    assert over["ratio"] == pytest.approx(1.05)
    assert ab.compare([record], [slow], tolerance=0.06)["summary"]["gpu_bound"]["over"] == []
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(record))
    b.write_text(json.dumps(slow))
    assert ab.main(["--base", str(a), "--new", str(b), "--out", str(tmp_path / "o.json")]) == 1


def test_host_bound_timings_are_kept_apart(ab, record):
    res = ab.compare([record], [scaled(record, 1.5, graph="tinyfull")])
    s = res["summary"]
    assert not s["gpu_bound"]["over"]
    assert [r["graph"] for r in s["host_bound"]["over"]] == ["tinyfull"]


def test_best_run_of_each_side_and_its_spread(ab, record):
    slow_run = scaled(record, 2.0)
    res = ab.compare([record, slow_run], [slow_run, record])
    row = next(r for r in res["rows"] if (r["model"], r["graph"], r["timing"])
               == ("gt", "tiny", "fused-auto fwd_ms"))
    assert row["ratio"] == 1.0
    assert row["base_spread"] == pytest.approx(2.0) and row["new_spread"] == pytest.approx(2.0)


def test_timings_of_one_side_only_are_counted(ab, record):
    fewer = copy.deepcopy(record)
    fewer["score_rows"] = []
    res = ab.compare([record], [fewer])
    assert res["summary"]["unmatched"] == len(
        [k for k in ab.timings(record) if k[0] == "gat"])
    assert all(r["model"] == "gt" for r in res["rows"])


def test_a_missing_or_foreign_file_says_what_to_pass(ab, record, tmp_path, capsys):
    good = tmp_path / "a.json"
    good.write_text(json.dumps(record))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"meta": {}}))
    for bad in (tmp_path / "missing.json", other):
        with pytest.raises(SystemExit) as e:
            ab.main(["--base", str(good), "--new", str(bad), "--out", str(tmp_path / "o.json")])
        assert e.value.code == 2
        msg = capsys.readouterr().err.strip()
        assert str(bad) in msg and "benchmarks.kernels --out" in msg
        assert len(msg.splitlines()) == 2


def test_layer_records_are_read_too(ab, tmp_path):
    lb = load_benchmark("layers")
    out = tmp_path / "layers.json"
    # The edge models run on the edge graph (web-NotreDame-like) only.
    assert lb.main(["--quick", "--device", "cpu", "--methods", "pyg,fused", "--models",
                    "gt_edge,gat", "--graphs", "web-NotreDame-like,Reddit-like",
                    "--dtypes", "fp32", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    t = ab.timings(doc)
    assert {k[0] for k in t} == {"gt_edge", "gat"}
    assert ("gt_edge", "web-NotreDame-like", "1x128", "fp32", "fused fwd_bwd_ms") in t
    slow = copy.deepcopy(doc)
    for row in slow["rows"]:
        if row["model"] == "gt_edge":
            row["methods"]["fused"]["fwd_bwd_ms"] *= 1.1
    (over,) = ab.compare([doc], [slow])["summary"]["gpu_bound"]["over"]
    assert (over["model"], over["timing"]) == ("gt_edge", "fused fwd_bwd_ms")


def test_half_precision_records_are_read_too(ab, tmp_path):
    hp = load_benchmark("half_precision")
    assert hp.main(["--out", str(tmp_path / "hp"), "--device", "cpu", "--tiny", "--graphs",
                    "PATTERN", "--layers", "dot-1x128,gatv2-4x32", "--dtypes", "bf16"]) == 0
    doc = json.loads((tmp_path / "hp" / "half_precision.json").read_text())
    t = ab.timings(doc)
    assert set(t) == {(layer, "PATTERN", hc, "bf16", f"fused {phase}")
                      for layer, hc in (("dot-1x128", "1x128"), ("gatv2-4x32", "4x32"))
                      for phase in ("fwd_ms", "fwd_bwd_ms")}
    slow = copy.deepcopy(doc)
    slow["rows"][1]["fused_fwd_bwd_ms"] *= 1.1
    (over,) = ab.compare([doc], [slow])["summary"]["gpu_bound"]["over"]
    assert (over["model"], over["timing"]) == ("gatv2-4x32", "fused fwd_bwd_ms")
    failed = copy.deepcopy(doc)
    failed["rows"][0]["status"] = "error"
    assert not any(k[0] == "dot-1x128" for k in ab.timings(failed))
