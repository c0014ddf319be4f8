"""CPU check of benchmarks/dense_backward.py (--device cpu --tiny: the reference
ops on two-graph batches, a wall clock): the record's rows, one per graph, shape
and dtype with every variant in it, and its errors on unknown names."""
import json

import pytest

from benchmarks import dense_backward


def test_tiny_run_writes_every_variant(tmp_path, capsys):
    assert dense_backward.main(["--out", str(tmp_path), "--device", "cpu", "--tiny",
                                "--graphs", "MNIST,PATTERN", "--shapes", "4x32,1x128",
                                "--no-profile"]) == 0
    doc = json.loads((tmp_path / "dense_backward.json").read_text())
    assert doc["info"]["command"].startswith("python -m benchmarks.dense_backward --out")
    assert set(doc["graphs"]) == {"MNIST", "PATTERN"}
    assert [(r["graph"], r["shape"], r["dtype"]) for r in doc["rows"]] == [
        ("MNIST", "4x32", "bf16"), ("MNIST", "1x128", "bf16"),
        ("PATTERN", "4x32", "bf16"), ("PATTERN", "1x128", "bf16")]
    for row in doc["rows"]:
        assert [v["variant"] for v in row["variants"]] == list(dense_backward.VARIANTS)
        for v in row["variants"]:
            assert v["status"] == "ok"
            assert v["bwd_ms"] == pytest.approx(v["fwd_bwd_ms"] - v["fwd_ms"])
    table = capsys.readouterr().out
    assert table.count("| MNIST |") == 2 and "dense_saved bwd ms" in table


@pytest.mark.parametrize("flag,value", [("--graphs", "Cora"), ("--variants", "flex"),
                                        ("--dtypes", "fp32")])
def test_unknown_names_are_refused(tmp_path, flag, value):
    with pytest.raises(SystemExit):
        dense_backward.parse_args(["--out", str(tmp_path), flag, value])
