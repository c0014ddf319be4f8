"""benchmarks/profile_backward.py on CPU: the byte model against hand counts and the
design notes' GitHub forward, the profiler aggregation on made-up activity, the ncu
CSV parser on a made-up CSV, the ncu run through a stand-in ``ncu`` that runs the
child for real, and the whole script on tiny generated graphs (``--device cpu
--tiny``); on a GPU, the kernel table of a tiny graph."""
from __future__ import annotations

import json
import math
import os
import stat
import sys
import textwrap

import pytest
import torch

from conftest import fail_for, load_benchmark


@pytest.fixture(scope="module")
def pb():
    return load_benchmark("profile_backward")


N, E, H, C = 10, 40, 2, 8
ROWS = N * H * C * 4  # one fp32 [N, H, C] tensor
CSR = (N + 1) * 4 + E * 4 + 12 * 12  # rowptr, col, 12 work items
CSC = (N + 1) * 4 + E * 4 + 11 * 12  # colptr, row, 11 work items


def model(pb, m="gt", esize=4, one_launch=False, slots=(0, 0)):
    return pb.byte_model(m, N, N, E, H, C, esize, row_items=12, col_items=11,
                         row_slots=slots[0], col_slots=slots[1], one_launch=one_launch)


def test_gt_byte_model_counts_each_tensor_once(pb):
    ph = model(pb, slots=(3, 5))
    assert set(ph) == {"gt_fwd", "gt_bwd_dq", "gt_bwd_dkv"}
    assert ph["gt_fwd"]["bytes"] == 4 * ROWS + N * H * 4 + CSR
    # q, dO, out, k, v read, dQ written, lse read, (P', dS) written
    assert ph["gt_bwd_dq"]["bytes"] == 6 * ROWS + N * H * 4 + CSR + E * H * 8
    # dO, q read, dK, dV written, (P', dS) read through perm
    assert ph["gt_bwd_dkv"]["bytes"] == 4 * ROWS + E * H * 8 + E * 4 + CSC
    # split rows' fp32 partial rows: written and read, not compulsory
    assert ph["gt_bwd_dq"]["extra"]["partials"] == 3 * 2 * H * C * 4
    assert ph["gt_bwd_dkv"]["extra"]["partials"] == 2 * 5 * 2 * H * C * 4
    tot = pb.summarize_phases(ph)
    assert tot["fwd"] == ph["gt_fwd"]["bytes"]
    assert tot["fwd_bwd"] == sum(p["bytes"] for p in ph.values())


def test_gt_byte_model_half_and_one_launch(pb):
    half = model(pb, esize=2)
    dq = half["gt_bwd_dq"]["read"]
    assert "out" not in dq and dq["D"] == N * H * 4  # fp32 D replaces the bf16 out rows
    assert dq["q"] == ROWS // 2
    assert set(half) == {"gt_fwd", "gt_bwd_dq", "gt_bwd_dkv"}
    # the forward writes its rows in fp32 too (out32: the backward's source of D)
    assert half["gt_fwd"]["write"]["out32"] == N * H * C * 4
    one = model(pb, one_launch=True)
    assert set(one) == {"gt_fwd", "gt_bwd_one_launch"}
    assert "saved_weights" not in one["gt_bwd_one_launch"]["read"]
    assert one["gt_bwd_one_launch"]["bytes"] == 8 * ROWS + N * H * 4 + CSR + CSC


def test_gat_byte_model(pb):
    ph = model(pb, "gat")
    assert set(ph) == {"gat_fwd", "gat_bwd_dst", "gat_bwd_src"}
    a = N * H * 4
    assert ph["gat_fwd"]["bytes"] == 2 * ROWS + 2 * a + N * H * 4 + CSR
    assert ph["gat_bwd_dst"]["bytes"] == 2 * ROWS + 2 * a + N * H * 4 + CSR + 2 * N * H * 4
    assert "perm" not in ph["gat_bwd_src"]["read"]  # read only with dropout
    assert ph["gat_bwd_src"]["bytes"] == 3 * ROWS + 2 * a + 2 * N * H * 4 + CSC + N * H * 4
    with pytest.raises(ValueError):
        pb.byte_model("agnn", N, N, E, H, C, 4, 1, 1)


def test_byte_model_matches_design_notes_github(pb):
    """docs/design.md's roofline table: GitHub (37,700 nodes, 578,006 edges), GT
    forward 1 x 128 fp32, 80 MB compulsory, 27 µs at 3 TB/s (work items and lse
    add 0.6 MB)."""
    ph = pb.byte_model("gt", 37_700, 37_700, 578_006, 1, 128, 4, 38_752, 38_752)
    mb = ph["gt_fwd"]["bytes"] / 1e6
    assert 79.5 < mb < 80.6
    assert round(pb.floor_us(ph["gt_fwd"]["bytes"])) == 27
    assert pb.floor_us(3e6) == pytest.approx(1.0)


def test_short_name_and_dtype(pb):
    dq = ("void dfgnn::(anonymous namespace)::row_bwd_dq_kernel<dfgnn::RowShape<float, 4, 32, 1>,"
          " false>(const float*, const float*, int)")
    assert pb.short_name(dq) == "row_bwd_dq_kernel"
    assert pb.kernel_dtype_size(dq) == 4
    bf = "void dfgnn::row_fwd_smmf_kernel<dfgnn::RowShape<__nv_bfloat16, 8, 16, 1>, false, false>()"
    assert pb.short_name(bf) == "row_fwd_smmf_kernel" and pb.kernel_dtype_size(bf) == 2
    fill = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
    assert pb.short_name(fill) == "vectorized_elementwise_kernel/FillFunctor"
    assert pb.kernel_dtype_size(fill) is None
    assert pb.short_name("Memset (Device)") == "Memset"
    assert pb.short_name("gat_bwd_src_kernel") == "gat_bwd_src_kernel"


def test_aggregate_steps(pb):
    recs = [("warm", 0, 5),  # before the first marker: left out
            ("mark", 10, 2), ("a", 20, 4), ("b", 25, 10), ("a", 40, 6),
            ("mark", 100, 2), ("a", 110, 5), ("b", 116, 12), ("a", 130, 5),
            ("mark", 200, 2), ("a", 210, 3), ("b", 214, 8), ("a", 223, 7)]
    res = pb.aggregate_steps(list(reversed(recs)), lambda n: n == "mark")
    assert res["steps"] == 3
    a, b = {k["name"]: k for k in res["kernels"]}["a"], {k["name"]: k for k in res["kernels"]}["b"]
    assert a["calls"] == 2 and b["calls"] == 1
    assert a["us"] == 10 and b["us"] == 10  # medians of (10, 10, 10) and (10, 12, 8)
    assert res["busy_us"] == 20  # medians of 20, 22, 18
    assert res["span_us"] == 25  # 20..46, 110..135, 210..230: median of 26, 25, 20
    assert a["share"] == pytest.approx(0.5)
    assert pb.aggregate_steps([("a", 0, 1)], lambda n: n == "mark")["steps"] == 0


def test_attach_floors_half_case_uses_fp32_model_for_fp32_kernels(pb):
    half, full = model(pb, esize=2), model(pb, esize=4)
    rows = [{"name": "void dfgnn::row_fwd_smmf_kernel<dfgnn::RowShape<float, 4, 32, 1>>()",
             "short": "row_fwd_smmf_kernel", "calls": 1, "us": 2.0},
            {"name": "void dfgnn::row_fwd_smmf_kernel<dfgnn::RowShape<__nv_bfloat16, 8, 16, 1>>()",
             "short": "row_fwd_smmf_kernel", "calls": 1, "us": 1.0},
            {"name": "void dfgnn::row_bwd_dkv_kernel<dfgnn::RowShape<__nv_bfloat16, 8, 16, 1>>()",
             "short": "row_bwd_dkv_kernel", "calls": 2, "us": 4.0},
            {"name": "Memset (Device)", "short": "Memset", "calls": 1, "us": 1.0}]
    pb.attach_floors(rows, half, full)
    assert rows[0]["MB"] == full["gt_fwd"]["bytes"] / 1e6
    assert rows[1]["MB"] == half["gt_fwd"]["bytes"] / 1e6
    assert rows[2]["x_floor"] == pytest.approx(2.0 / pb.floor_us(half["gt_bwd_dkv"]["bytes"]))
    assert "MB" not in rows[3]


NCU_CSV = textwrap.dedent('''\
    ==PROF== Connected to process 4242 (/usr/bin/python3)
    ==PROF== Profiling "row_bwd_dq_kernel": 0%....50%....100% - 5 passes
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
    "0","4242","python3","127.0.0.1","void dfgnn::(anonymous namespace)::row_bwd_dq_kernel<dfgnn::RowShape<float, 4, 32, 1>, false>(const float *, int)","1","7","(256, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","12,345,678"
    "0","4242","python3","127.0.0.1","void dfgnn::(anonymous namespace)::row_bwd_dq_kernel<dfgnn::RowShape<float, 4, 32, 1>, false>(const float *, int)","1","7","(256, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Mbyte","1.5"
    "0","4242","python3","127.0.0.1","void dfgnn::(anonymous namespace)::row_bwd_dq_kernel<dfgnn::RowShape<float, 4, 32, 1>, false>(const float *, int)","1","7","(256, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","41.5"
    "0","4242","python3","127.0.0.1","void dfgnn::(anonymous namespace)::row_bwd_dq_kernel<dfgnn::RowShape<float, 4, 32, 1>, false>(const float *, int)","1","7","(256, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_sector_hit_rate.pct","%","63.2"
    "1","4242","python3","127.0.0.1","void dfgnn::(anonymous namespace)::gat_bwd_src_kernel<dfgnn::RowShape<float, 4, 32, 1>, false>(const float *, int)","1","7","(256, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","2,048"
    "1","4242","python3","127.0.0.1","void dfgnn::(anonymous namespace)::gat_bwd_src_kernel<dfgnn::RowShape<float, 4, 32, 1>, false>(const float *, int)","1","7","(256, 1, 1)","(10, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","40"
    ==PROF== Disconnected from process 4242
    ''')


def test_parse_ncu_csv(pb):
    rows = pb.parse_ncu_csv(NCU_CSV)
    assert [r["short"] for r in rows] == ["row_bwd_dq_kernel", "gat_bwd_src_kernel"]
    m = rows[0]["metrics"]
    assert m["dram__bytes_read.sum"] == 12_345_678
    assert m["dram__bytes_write.sum"] == pytest.approx(1.5e6)
    assert m["gpu__time_duration.sum"] == pytest.approx(41_500)  # ns
    assert m["l1tex__t_sector_hit_rate.pct"] == pytest.approx(63.2)
    assert rows[1]["metrics"]["gpu__time_duration.sum"] == 2048
    assert rows[1]["metrics"]["launch__registers_per_thread"] == 40
    phases = model(pb)
    pb.ncu_against_model(rows[:1], phases)
    b = phases["gt_bwd_dq"]["bytes"]
    assert rows[0]["dram_x_compulsory"] == pytest.approx((12_345_678 + 1.5e6) / b)
    assert rows[0]["time_x_floor"] == pytest.approx(41.5 / pb.floor_us(b))
    assert pb.parse_ncu_csv("==ERROR== the profiler failed\n") == []


#: A stand-in for ncu: writes NCU_CSV to --log-file, then runs the profiled command
#: (the script's child on a tiny CPU graph), failing as ncu would if it fails.
FAKE_NCU = '''#!{python}
import subprocess, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
cmd = args[args.index("--log-file") + 2:]
metrics = args[args.index("--metrics") + 1]
assert args[args.index("--kernel-name") + 1].startswith("regex:")
open(log, "w").write(open({csv!r}).read() if "lts__t_bytes.sum" in metrics else "")
sys.exit(subprocess.run(cmd).returncode)
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    csv_path = tmp_path / "ncu.csv"
    csv_path.write_text(NCU_CSV)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, csv=str(csv_path)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return exe


def run_main(pb, out, *extra):
    assert pb.main(["--out", str(out), "--device", "cpu", "--tiny", *extra]) == 0
    return json.loads((out / "profile_backward.json").read_text())


def test_main_on_cpu_tiny_with_fake_ncu(pb, tmp_path, fake_ncu):
    doc = run_main(pb, tmp_path / "out", "--graphs", "GitHub,Reddit-like", "--cases",
                   "gt:float32,gat:float32", "--ncu", "--ncu-graph", "Reddit-like")
    assert set(doc["graphs"]) == {"GitHub", "Reddit-like"}
    assert [(r["graph"], r["model"]) for r in doc["rows"]] == [
        ("GitHub", "gt"), ("GitHub", "gat"), ("Reddit-like", "gt"), ("Reddit-like", "gat")]
    for r in doc["rows"]:
        assert r["status"] == "ok", r
        assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0
        assert r["floor_us"]["fwd_bwd"] > r["floor_us"]["fwd"] > 0
        assert math.isclose(r["fwd_x_floor"], r["fwd_ms"] * 1e3 / r["floor_us"]["fwd"])
    nc = doc["ncu"]
    assert nc["returncode"] == 0, nc  # the child ran on the CPU graph
    assert "--ncu-child" in nc["command"] and "--tiny" in nc["command"]
    assert [k["short"] for k in nc["kernels"]] == ["row_bwd_dq_kernel", "gat_bwd_src_kernel"]
    # the tiny graph's GT backward is one launch: no dq kernel in its model
    assert "compulsory_MB" not in nc["kernels"][0]
    assert nc["kernels"][1]["compulsory_MB"] > 0
    md = (tmp_path / "out" / "profile_backward.md").read_text()
    assert "| Reddit-like | GAT 1×128 float32 |" in md and "ncu on Reddit-like" in md


def test_shape_sets_heads_and_channels_of_every_case(pb, tmp_path):
    """--shape 4x32: the rows, their byte model and the table are of 4 heads of 32."""
    doc = run_main(pb, tmp_path / "out", "--graphs", "GitHub", "--cases",
                   "gat:float32,gat:bfloat16", "--shape", "4x32")
    assert [(r["H"], r["C"], r["status"]) for r in doc["rows"]] == [(4, 32, "ok")] * 2
    assert doc["info"]["command"].endswith("--cases gat:float32,gat:bfloat16 --shape 4x32")
    wide = run_main(pb, tmp_path / "wide", "--graphs", "GitHub", "--cases", "gat:float32")
    # the same H x C elements: the [N, H, C] rows move as many bytes, the per-head
    # logits and softmax terms four times as many
    assert doc["rows"][0]["bytes"]["fwd"] > wide["rows"][0]["bytes"]["fwd"]
    assert "| GitHub | GAT 4×32 float32 |" in (tmp_path / "out" / "profile_backward.md").read_text()
    for bad in ("4", "0x32", "fourx32"):
        with pytest.raises(SystemExit):
            pb.parse_args(["--out", str(tmp_path), "--shape", bad])


def test_ncu_timeout_ends_ncu_and_child(pb, tmp_path, monkeypatch):
    exe = tmp_path / "ncu"
    exe.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(pb, "find_ncu", lambda: str(exe))
    doc = run_main(pb, tmp_path / "out", "--ncu-only", "--ncu-graph", "GitHub",
                   "--ncu-timeout", "2")
    assert "ran past" in doc["ncu"]["error"] and doc["ncu"]["wall_s"] < 10


def test_ncu_failure_is_recorded(pb, tmp_path, monkeypatch):
    monkeypatch.setattr(pb, "find_ncu", lambda: None)
    doc = run_main(pb, tmp_path / "out", "--ncu-only", "--ncu-graph", "GitHub")
    assert doc["rows"] == [] and "ncu not found" in doc["ncu"]["error"]


def test_one_failing_graph_leaves_the_others(pb, tmp_path, monkeypatch):
    fail_for(monkeypatch, pb, "load_graph", "GitHub", FileNotFoundError("no MUSAE here"))
    doc = run_main(pb, tmp_path / "out", "--graphs", "GitHub,ogbn-arxiv", "--cases",
                   "gt:bfloat16")
    assert "no MUSAE here" in doc["graphs"]["GitHub"]["error"]
    assert [(r["graph"], r["status"]) for r in doc["rows"]] == [("ogbn-arxiv", "ok")]
    r = doc["rows"][0]
    assert r["bwd_one_launch"]  # 3,600 edges: the kernel plan's one-launch backward
    assert "D" in r["phases"]["gt_bwd_one_launch"]["read"]  # bf16: fp32 D, not out


def test_phase_of_the_row_walk_names_the_score(pb):
    """The shared row walk's forward is the GT model's over the dot score and the
    GAT model's over the additive score (the plan's row_walk)."""
    row = "void dfgnn::row_fwd_smmf_kernel<dfgnn::{}<dfgnn::RowShape<float, 4, 8, 1>>, false>()"
    assert pb.phase_of(row.format("DotScore")) == "gt_fwd"
    assert pb.phase_of(row.format("AdditiveRowScore")) == "gat_fwd"
    assert pb.phase_of("void dfgnn::gat_fwd_kernel<dfgnn::AdditiveScore<float>>()") == "gat_fwd"
    assert pb.phase_of("void at::native::vectorized_elementwise_kernel<4>()") is None


@pytest.mark.cuda
def test_kernel_table_on_gpu(pb, tmp_path):
    assert pb.main(["--out", str(tmp_path), "--tiny", "--graphs", "GitHub", "--cases",
                    "gt:float32,gt:bfloat16,gat:float32", "--rep-ms", "5"]) == 0
    doc = json.loads((tmp_path / "profile_backward.json").read_text())
    want = {"gt": {"gt_fwd", "gt_bwd_one_launch"}, "gat": {"gat_fwd", "gat_bwd_dst",
                                                            "gat_bwd_src"}}
    for r in doc["rows"]:
        assert r["status"] == "ok", r
        ks = r["profile"]["kernels"]
        assert want[r["model"]] <= {k.get("phase") for k in ks}
        assert all(k["x_floor"] > 0 for k in ks if "phase" in k)
        assert not any("bitwise_not" in k["name"] for k in ks)  # the flush is not counted


def test_refuses_without_kernels(pb, tmp_path):
    import pyg_dfgnn
    if pyg_dfgnn.has_cuda_kernels():
        pytest.skip("the kernels are here")
    with pytest.raises(SystemExit) as e:  # the reference would be profiled
        pb.main(["--out", str(tmp_path)])
    assert "needs a CUDA GPU" in str(e.value.code)
    assert not (tmp_path / "profile_backward.json").exists()
