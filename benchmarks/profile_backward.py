"""Where the fused forward + backward's time goes on power-law graphs, against the
bytes each kernel must move.

For each graph (MUSAE GitHub, ogbn-arxiv as one undirected full graph, the generated
Reddit-like graph of :mod:`benchmarks.kernels`) and each case (GT attention 1 x 128
fp32 and bf16, GAT 1 x 128 fp32), on one GPU:

1. ``fwd_ms`` and ``fwd_bwd_ms``: medians of ``triton.testing.do_bench``
   (:func:`benchmarks.kernels.measure`: the forward under ``no_grad``; a training
   step's forward + backward with the leaves' gradients reset), and the peak memory;
2. the GPU time of each kernel of one forward + backward (``torch.profiler``, the
   median over :data:`PROFILE_STEPS` steps, each after an L2 flush): name, launches
   per step, µs per step, share of the step's kernel time;
3. the compulsory bytes of each kernel (:func:`byte_model`: what it must read and
   write at least once, see below) and the floor they set at :data:`FLOOR_TBPS`
   (a device-to-device copy on the H100, ``docs/design.md``), so each kernel and
   phase gets a "x floor";
4. with ``--ncu``, the script runs itself once more under Nsight Compute on one
   graph (``--ncu-graph``) with one launch of each backward kernel
   (:data:`NCU_KERNELS`) and a few counters (:data:`NCU_METRICS`: DRAM and L2
   bytes, SM throughput, L1 hit rate, long-scoreboard stalls), and puts the parsed
   CSV, with each kernel's DRAM bytes against its compulsory bytes, into the JSON.

Compulsory bytes (``N`` nodes, ``E`` edges, ``H`` heads of ``C`` channels, ``s``
bytes per element, indices 4 bytes, work items 12 bytes each):

* GT forward: q, k, v read and out written once (``4 N H C s``), lse written
  (``4 N H``), rowptr, col and the CSR work items read.
* GT dQ kernel (CSR walk): q, dO, k, v and out (fp16 / bf16: the fp32 D instead of
  out) read, lse read, dQ written, rowptr, col and items read, and the saved
  weights (P', dS) written, 8 bytes per edge and head (``docs/design.md``,
  "Backward").
* GT dK / dV kernel (CSC walk): dO and q read, the saved weights read through the
  CSC permutation (8 + 4 bytes per edge and head), colptr, row and the CSC items
  read, dK and dV written.
* GT one-launch backward (graphs under 2^16 edges): both walks without the saved
  weights.
* GAT forward: a_dst, a_src, x read, out and lse written, rowptr, col, items read.
  GAT destination walk: dO, x, a_dst, a_src, lse read, d a_dst and D written.
  GAT source walk: dO, x, a_dst, a_src, lse, D read, dx and d a_src written
  (the permutation only with dropout).

Not compulsory, reported apart (``extra``): the fp32 partial rows of split rows
(written and read once each).

Usage, from the repository root (needs a CUDA GPU and the compiled extension;
real graphs from ``--data``, by default ``$PYG_DFGNN_DATA``, else a PyG download:
:mod:`benchmarks.datasets`)::

    python -m benchmarks.profile_backward --out DIR [--ncu] [--graphs GitHub,...]

``--device cpu --tiny`` runs the same path on a tiny generated graph on the CPU
(the reference ops, wall-clock timing, no kernel table): a check of the script,
not a measurement. Writes ``DIR/profile_backward.json`` (rewritten after every
case) and ``DIR/profile_backward.md``.
"""
from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import glob
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import kernels
from pyg_dfgnn.ops import plan

#: Floor bandwidth in TB/s: a device-to-device copy on the H100 (read + write).
FLOOR_TBPS = 3.0
#: Graphs in run order.
GRAPHS = ("GitHub", "ogbn-arxiv", "Reddit-like")
#: ``(model, dtype)`` cases, of ``HEADS`` heads of ``CHANNELS`` channels unless
#: ``--shape`` says otherwise.
CASES = (("gt", "float32"), ("gt", "bfloat16"), ("gat", "float32"))
HEADS, CHANNELS = 1, 128
#: Steps of the profiled forward + backward (each after an L2 flush).
PROFILE_STEPS = 5
#: Bytes of the L2 flush before each profiled step (the H100's L2 is 50 MB).
FLUSH_BYTES = 256 * 2**20
#: The backward kernels (``cuda/kernels/row_backward.cuh``,
#: ``dot_backward_mma.cu``, ``dot_backward_dense.cu``, ``additive_backward.cu``).
NCU_KERNELS = "row_bwd_dq_kernel|row_bwd_dkv_kernel|" \
              "row_bwd_one_launch_kernel|gt_bwd_dq_mma_kernel|gt_bwd_dkv_mma_kernel|" \
              "gt_bwd_dq_dense_kernel|gt_bwd_dkv_dense_kernel|" \
              "gat_bwd_dst_kernel|gat_bwd_src_kernel"
#: A few counters: each needs replays of the kernel, so the set stays small.
NCU_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "lts__t_bytes.sum", "lts__t_sector_hit_rate.pct", "l1tex__t_sector_hit_rate.pct",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
               "sm__warps_active.avg.pct_of_peak_sustained_active",
               "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
               "launch__registers_per_thread")
#: The counters every ncu version has: the retry when the full set is refused.
NCU_BASIC_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
#: Kernel name (the function, without namespaces and template arguments) -> phase of
#: :func:`byte_model`.
# The row_* walks are every walked score's (kernels/row_*.cuh); the GT model's
# calls run them over the dot score.
KERNEL_PHASE = {"row_fwd_smmf_kernel": "gt_fwd", "gt_fwd_mma_kernel": "gt_fwd",
                "gt_fwd_dense_kernel": "gt_fwd",
                "row_bwd_dq_kernel": "gt_bwd_dq", "row_bwd_dkv_kernel": "gt_bwd_dkv",
                "row_bwd_one_launch_kernel": "gt_bwd_one_launch",
                "gt_bwd_dq_mma_kernel": "gt_bwd_dq", "gt_bwd_dkv_mma_kernel": "gt_bwd_dkv",
                "gt_bwd_dq_dense_kernel": "gt_bwd_dq", "gt_bwd_dkv_dense_kernel": "gt_bwd_dkv",
                "gat_fwd_kernel": "gat_fwd", "gat_bwd_dst_kernel": "gat_bwd_dst",
                "gat_bwd_src_kernel": "gat_bwd_src"}
FORWARD_PHASES = ("gt_fwd", "gat_fwd")


def phase_of(name: str) -> str | None:
    """The :func:`byte_model` phase of the kernel ``name`` (as the profiler names it),
    or ``None``: by its short name, and the shared row walk's forward over the
    additive score (the GAT model's forward on that walk) as ``gat_fwd``."""
    short = short_name(name)
    if short == "row_fwd_smmf_kernel" and "AdditiveRowScore" in name:
        return "gat_fwd"
    return KERNEL_PHASE.get(short)
REPO = Path(__file__).resolve().parents[1]
IDX = 4  # bytes per index (the kernels' int32)
ITEM = 12  # bytes per work item: (row, first edge, slot), int32


# ------------------------------------------------------------------ byte model
def byte_model(model: str, n_dst: int, n_src: int, E: int, H: int, C: int, esize: int,
               row_items: int, col_items: int, row_slots: int = 0, col_slots: int = 0,
               one_launch: bool = False) -> dict:
    r"""Compulsory bytes of each kernel of a fused forward + backward.

    Args:
        model (str): ``"gt"`` or ``"gat"``.
        n_dst, n_src, E, H, C (int): destination and source nodes, edges, heads,
            channels per head.
        esize (int): bytes per feature element (4 fp32, 2 fp16 / bf16).
        row_items, col_items (int): work items over the CSR and the CSC.
        row_slots, col_slots (int): partial slots of split rows (CSR, CSC).
        one_launch (bool): the GT backward's two walks in one launch.

    Returns:
        ``{phase: {"read": {term: bytes}, "write": {term: bytes}, "extra": {term:
        bytes}, "bytes": int}}`` with ``bytes`` the compulsory total (read +
        write; ``extra`` is not in it). Phases: ``gt_fwd``, ``gt_bwd_dq``,
        ``gt_bwd_dkv`` or ``gt_bwd_one_launch``; ``gat_fwd``, ``gat_bwd_dst``,
        ``gat_bwd_src``. In fp16 / bf16 the GT forward also writes its output in
        fp32 (``out32``), from which two ATen launches (no phase: not our
        kernels) make the dq walk's fp32 D_i = dO_i . O_i.

    Raises:
        ValueError: an unknown ``model``.
    """
    rows_d, rows_s = n_dst * H * C * esize, n_src * H * C * esize
    stat_d, stat_s = n_dst * H * 4, n_src * H * 4  # fp32 per-row statistics (lse, D)
    csr = {"rowptr": (n_dst + 1) * IDX, "col": E * IDX, "row_items": row_items * ITEM}
    csc = {"colptr": (n_src + 1) * IDX, "row": E * IDX, "col_items": col_items * ITEM}
    part = 2 * H * C * 4  # an fp32 partial row, written and read

    def phase(read, write, extra=None):
        return {"read": read, "write": write, "extra": extra or {},
                "bytes": sum(read.values()) + sum(write.values())}

    if model == "gt":
        # half precision: the fp32 D_i (from the forward's fp32 rows) replaces the
        # out rows
        out_or_d = {"out": rows_d} if esize == 4 else {"D": stat_d}
        out32 = {} if esize == 4 else {"out32": n_dst * H * C * 4}
        res = {"gt_fwd": phase({"q": rows_d, "k": rows_s, "v": rows_s, **csr},
                               {"out": rows_d, **out32, "lse": stat_d},
                               {"partials": row_slots * part})}
        dq_read = {"q": rows_d, "dO": rows_d, **out_or_d, "lse": stat_d, "k": rows_s,
                   "v": rows_s, **csr}
        if one_launch:
            res["gt_bwd_one_launch"] = phase(
                {**dq_read, **csc}, {"dq": rows_d, "dk": rows_s, "dv": rows_s},
                {"partials": row_slots * part + 2 * col_slots * part})
            return res
        res["gt_bwd_dq"] = phase(dq_read, {"dq": rows_d, "saved_weights": E * H * 8},
                                 {"partials": row_slots * part})
        res["gt_bwd_dkv"] = phase({"dO": rows_d, "q": rows_d, "saved_weights": E * H * 8,
                                   "perm": E * IDX, **csc},
                                  {"dk": rows_s, "dv": rows_s},
                                  {"partials": 2 * col_slots * part})
        return res
    if model == "gat":
        a_d, a_s = n_dst * H * esize, n_src * H * esize
        return {
            "gat_fwd": phase({"a_dst": a_d, "a_src": a_s, "x": rows_s, **csr},
                             {"out": rows_d, "lse": stat_d}, {"partials": row_slots * part}),
            "gat_bwd_dst": phase({"dO": rows_d, "x": rows_s, "a_dst": a_d, "a_src": a_s,
                                  "lse": stat_d, **csr}, {"da_dst": stat_d, "D": stat_d},
                                 {"partials": row_slots * H * 4 * 2}),
            "gat_bwd_src": phase({"dO": rows_d, "x": rows_s, "a_dst": a_d, "a_src": a_s,
                                  "lse": stat_d, "D": stat_d, **csc},
                                 {"dx": rows_s, "da_src": stat_s},
                                 {"partials": col_slots * (part + H * 4 * 2)}),
        }
    raise ValueError(f"model must be 'gt' or 'gat', got {model!r}")


#: The inputs of each score's op that are read once per node row: ``(name, rows,
#: per-head width)`` with rows ``"dst"`` / ``"src"`` / ``"one"`` (one row in all) and
#: width ``"C"`` (feature rows) or ``1`` (a per-head scalar); the output and its
#: gradient are the op's own.
OP_INPUTS = {"dot": (("q", "dst", "C"), ("k", "src", "C"), ("v", "src", "C")),
             "additive": (("a_dst", "dst", 1), ("a_src", "src", 1), ("x", "src", "C")),
             "gatv2": (("x_r", "dst", "C"), ("x_l", "src", "C"), ("att", "one", "C")),
             "cosine": (("x", "src", "C"),)}


def op_bytes(score: str, n_dst: int, n_src: int, E: int, H: int, C: int, esize: int,
             row_items: int, col_items: int) -> dict:
    r"""Bytes that any implementation of one attention op must move, whatever its
    kernels: the forward reads each input once (:data:`OP_INPUTS`) and the CSR with
    its work items, and writes the output and the fp32 log-sum-exp; the backward
    reads the inputs, the output, its gradient ``dO`` and the log-sum-exp once (the
    output gives flash attention's ``D_i = dO_i . O_i``), the CSR and the CSC with
    their work items, and writes each input's gradient once. Intermediates of a
    kernel split (saved weights, partial rows, a CSC permutation) are not in it:
    :func:`byte_model` counts those per kernel.

    Args:
        score (str): ``"dot"``, ``"additive"``, ``"gatv2"`` or ``"cosine"``.
        n_dst, n_src, E, H, C, esize, row_items, col_items (int): as in
            :func:`byte_model`.

    Returns:
        ``{"fwd": {"read": {term: bytes}, "write": {...}, "bytes": int}, "bwd": ...}``.

    Raises:
        ValueError: an unknown ``score``.
    """
    if score not in OP_INPUTS:
        raise ValueError(f"score must be one of {sorted(OP_INPUTS)}, got {score!r}")
    rows = {"dst": n_dst, "src": n_src, "one": 1}
    inputs = {name: rows[r] * H * (C if w == "C" else 1) * esize
              for name, r, w in OP_INPUTS[score]}
    if score == "cosine":
        inputs["beta"] = 4  # one fp32 temperature
    out, lse = n_dst * H * C * esize, n_dst * H * 4
    csr = {"rowptr": (n_dst + 1) * IDX, "col": E * IDX, "row_items": row_items * ITEM}
    csc = {"colptr": (n_src + 1) * IDX, "row": E * IDX, "col_items": col_items * ITEM}

    def phase(read, write):
        return {"read": read, "write": write,
                "bytes": sum(read.values()) + sum(write.values())}
    return {"fwd": phase({**inputs, **csr}, {"out": out, "lse": lse}),
            "bwd": phase({**inputs, "out": out, "dO": out, "lse": lse, **csr, **csc},
                         {f"d{name}": b for name, b in inputs.items()})}


def floor_us(nbytes: float, tbps: float = FLOOR_TBPS) -> float:
    """Time in µs to move ``nbytes`` at ``tbps`` TB/s."""
    return nbytes / (tbps * 1e12) * 1e6


def summarize_phases(phases: dict) -> dict:
    """``{"fwd": bytes, "bwd": bytes, "fwd_bwd": bytes}`` of :func:`byte_model`'s
    phases (the forward phase, the others, all)."""
    fwd = sum(p["bytes"] for k, p in phases.items() if k in FORWARD_PHASES)
    bwd = sum(p["bytes"] for k, p in phases.items() if k not in FORWARD_PHASES)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}


# ------------------------------------------------------------- kernel names
def short_name(name: str) -> str:
    """The function of a demangled kernel name: ``void ns::(anonymous
    namespace)::row_bwd_dq_kernel<...>(...)`` -> ``row_bwd_dq_kernel``; ATen's
    elementwise and reduction kernels keep their functor
    (``vectorized_elementwise_kernel/FillFunctor``)."""
    s = name.strip().replace("(anonymous namespace)::", "")
    if s.startswith("void "):
        s = s[5:]
    cut = min([i for i in (s.find("<"), s.find("(")) if i >= 0] or [len(s)])
    base = s[:cut].strip().split("::")[-1] or s.strip()
    if base.endswith(("elementwise_kernel", "reduce_kernel")):
        functor = re.search(r"(\w+(?:Functor|_functor|_kernel_cuda))", s[cut:])
        if functor:
            return f"{base}/{functor.group(1)}"
    return base


def kernel_dtype_size(name: str) -> int | None:
    """Bytes per element of a fused kernel's ``RowShape`` (4 float, 2 half / bf16),
    or ``None`` for another kernel."""
    m = re.search(r"RowShape<\s*([\w:]+)", name)
    if not m:
        return None
    return 4 if m.group(1) == "float" else 2


# ------------------------------------------------------- profiler aggregation
def aggregate_steps(records, is_marker) -> dict:
    """Per-kernel GPU time of a profiled loop of steps, each step preceded by one
    marker kernel (the L2 flush).

    Args:
        records: ``(name, start_us, duration_us)`` of every GPU activity, any order.
        is_marker: ``name -> bool``: the marker kernel.

    Returns:
        ``{"steps": n, "span_us": median step span (first start to last end),
        "busy_us": median kernel time per step, "kernels": [{"name", "short",
        "calls", "us", "share"}]}`` (``calls`` and ``us`` per step, medians over the
        steps, ``share`` of ``busy_us``), the kernels by time, most first. Activity
        before the first marker is left out.
    """
    steps, cur = [], None
    for name, start, dur in sorted(records, key=lambda r: r[1]):
        if is_marker(name):
            cur = []
            steps.append(cur)
        elif cur is not None:
            cur.append((name, start, dur))
    steps = [s for s in steps if s]
    if not steps:
        return {"steps": 0, "span_us": float("nan"), "busy_us": float("nan"), "kernels": []}
    names = sorted({n for s in steps for n, _, _ in s})
    per = {n: ([], []) for n in names}
    for s in steps:
        calls, us = collections.Counter(), collections.Counter()
        for n, _, d in s:
            calls[n] += 1
            us[n] += d
        for n in names:
            per[n][0].append(calls[n])
            per[n][1].append(us[n])
    spans = [max(st + d for _, st, d in s) - min(st for _, st, _ in s) for s in steps]
    busy = [sum(d for _, _, d in s) for s in steps]
    busy_med = statistics.median(busy)
    rows = [{"name": n[:240], "short": short_name(n), "calls": statistics.median(c),
             "us": statistics.median(u)} for n, (c, u) in per.items()]
    for r in rows:
        r["share"] = r["us"] / busy_med if busy_med else float("nan")
    rows.sort(key=lambda r: -r["us"])
    return {"steps": len(steps), "span_us": statistics.median(spans), "busy_us": busy_med,
            "kernels": rows}


def profile_step(step, steps: int = PROFILE_STEPS) -> dict:
    """:func:`aggregate_steps` of ``steps`` calls of ``step`` under
    ``torch.profiler`` (CUDA activity), each after an L2 flush (a ``bitwise_not``
    over :data:`FLUSH_BYTES`, a kernel the fused ops never launch)."""
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            torch.bitwise_not(flush, out=flush)
            step()
        torch.cuda.synchronize()
    recs = [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]
    del flush
    return aggregate_steps(recs, lambda n: "bitwise_not" in n)


def attach_floors(kernel_rows, phases: dict, phases32: dict | None = None) -> None:
    """Adds ``phase``, ``MB`` (compulsory), ``extra_MB`` (split rows' partials),
    ``floor_us`` and ``x_floor`` (per launch) to each kernel row of a fused kernel
    with a model; ``phases32`` (the fp32 model) serves
    the fp32 kernels of a half-precision case (the GAT backward's forward re-run for
    split rows)."""
    for r in kernel_rows:
        ph = phase_of(r["name"])
        table = phases
        if phases32 is not None and kernel_dtype_size(r["name"]) == 4:
            table = phases32
        if ph is None or ph not in table:
            continue
        b = table[ph]["bytes"]
        r.update(phase=ph, MB=b / 1e6, extra_MB=sum(table[ph]["extra"].values()) / 1e6,
                 floor_us=floor_us(b),
                 x_floor=r["us"] / r["calls"] / floor_us(b) if r["calls"] else float("nan"))


# ------------------------------------------------------------------ ncu CSV
_UNIT = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12, "b": 1,
         "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
         "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1, "us": 1e3,
         "ms": 1e6, "s": 1e9}


def _value(text: str, unit: str) -> float | str:
    """An ncu metric value in base units (bytes, ns; percentages and counts as
    given); text that is not a number stays text."""
    t = text.strip().replace(",", "")
    try:
        v = float(t)
    except ValueError:
        return text.strip()
    return v * _UNIT.get(unit.strip().lower(), 1)


def parse_ncu_csv(text: str) -> list:
    """Kernels of ``ncu --csv`` output (one row per kernel launch and metric, after
    any ``==PROF==`` lines).

    Returns:
        ``[{"id", "name", "short", "metrics": {metric: value}}]`` in launch order,
        byte metrics in bytes and times in ns (whatever unit ncu printed).
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    launches: dict = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("Metric Name") or row.get("ID") is None:
            continue
        k = launches.setdefault(row["ID"], {"id": int(row["ID"]) if row["ID"].isdigit()
                                            else row["ID"], "name": row.get("Kernel Name", ""),
                                            "metrics": {}})
        k["metrics"][row["Metric Name"]] = _value(row.get("Metric Value", ""),
                                                  row.get("Metric Unit", ""))
    out = list(launches.values())
    for k in out:
        k["short"] = short_name(k["name"])
    return out


def ncu_against_model(ncu_rows: list, phases: dict) -> None:
    """Adds each kernel's compulsory bytes and ``dram_x_compulsory`` (DRAM read +
    write over the model's bytes) and ``time_x_floor`` to the rows of
    :func:`parse_ncu_csv`."""
    for k in ncu_rows:
        ph = phase_of(k["name"])
        if ph is None or ph not in phases:
            continue
        m, b = k["metrics"], phases[ph]["bytes"]
        k.update(phase=ph, compulsory_MB=b / 1e6)
        rd, wr = m.get("dram__bytes_read.sum"), m.get("dram__bytes_write.sum")
        if isinstance(rd, float) and isinstance(wr, float) and b:
            k["dram_x_compulsory"] = (rd + wr) / b
        t = m.get("gpu__time_duration.sum")
        if isinstance(t, float) and b:
            k["time_x_floor"] = t / 1e3 / floor_us(b)


def find_ncu() -> str | None:
    """The ``ncu`` executable: on the PATH, in the CUDA toolkit or under
    ``/opt/nvidia/nsight-compute``."""
    found = shutil.which("ncu")
    if found:
        return found
    for pat in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                "/usr/local/cuda*/bin/ncu"):
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


def ncu_command(ncu: str, log: str, metrics, child_args: list, kernels_re: str = NCU_KERNELS,
                count: int = 8) -> list:
    """The ``ncu`` command line that profiles the child's first ``count`` launches
    of ``kernels_re`` (the child launches each once) at the clocks the timings ran
    at (``--clock-control none``), with the caches flushed before each replay."""
    return [ncu, "--target-processes", "all", "--clock-control", "none", "--cache-control",
            "all", "--kernel-name", f"regex:{kernels_re}", "--launch-skip", "0",
            "--launch-count", str(count), "--metrics", ",".join(metrics), "--csv",
            "--print-units", "base", "--log-file", log,
            sys.executable, "-m", "benchmarks.profile_backward", *child_args]


def run_ncu(args, out_dir: Path, phases_by_model: dict) -> dict:
    """Runs this script under ncu on ``args.ncu_graph`` (``--ncu-child``), at most
    twice (the basic counters if the full set gives no kernel), and parses it."""
    res = {"graph": args.ncu_graph, "kernels_regex": args.ncu_kernels}
    ncu = find_ncu()
    if ncu is None:
        res["error"] = "ncu not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"
        return res
    child = ["--ncu-child", "--graphs", args.ncu_graph, "--out", str(out_dir), "--device",
             args.device] + (["--tiny"] if args.tiny else [])
    if args.data:
        child += ["--data", args.data]
    deadline = time.perf_counter() + args.ncu_timeout
    for attempt, metrics in enumerate((NCU_METRICS, NCU_BASIC_METRICS)):
        log = str(out_dir / f"ncu_{attempt}.csv")
        cmd = ncu_command(ncu, log, metrics, child, args.ncu_kernels)
        res["command"] = " ".join(cmd)
        left = deadline - time.perf_counter()
        if left < 1:
            res.setdefault("error", "no time left for ncu")
            break
        t0 = time.perf_counter()
        # its own session: on a timeout, ncu and the profiled child end together
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=REPO, start_new_session=True)
        try:
            out_text, err_text = p.communicate(timeout=left)
            res["returncode"] = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out_text, err_text = p.communicate()
            res["error"] = f"ncu ran past {left:.0f} s"
        res["output_tail"] = (out_text + err_text)[-2000:]
        res["wall_s"] = time.perf_counter() - t0
        text = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
        rows = parse_ncu_csv(text) or parse_ncu_csv(out_text)
        if rows:
            res.pop("error", None)
            res["metrics"] = list(metrics)
            for k in rows:
                model = "gat" if k["short"].startswith("gat_") else "gt"
                ncu_against_model([k], phases_by_model.get(model, {}))
            res["kernels"] = rows
            return res
        res["error"] = res.get("error") or "ncu gave no kernel rows: " + text[-600:]
    return res


# ------------------------------------------------------------------- graphs
def load_graph(name: str, data: str | None, device: str, tiny: bool = False):
    """``(edge_index on device, num_nodes)`` of one graph. ``tiny``: every name is a
    300-node power-law graph (seeded by the name's position in :data:`GRAPHS`)."""
    from benchmarks import datasets, generators
    if tiny:
        seed = GRAPHS.index(name) if name in GRAPHS else 0
        return generators.power_law_graph(300, 12, 200, seed, device), 300
    if name == "GitHub":
        d = datasets.musae_github(data)
    elif name == "ogbn-arxiv":
        d = datasets.ogbn_arxiv(data)  # undirected (to_undirected in the loader)
    elif name in kernels.POWER_LAW:
        n, avg, mx, seed = kernels.POWER_LAW[name]
        return generators.power_law_graph(n, avg, mx, seed, device), n
    else:
        raise ValueError(f"unknown graph {name!r}; expected one of {GRAPHS}")
    return d.edge_index.to(device), int(d.num_nodes)


def graph_layout(name: str, args):
    """``(layout with its CSC, num_nodes)`` of one graph of the run."""
    from pyg_dfgnn.layout import GraphLayout
    ei, n = load_graph(name, args.data, args.device, args.tiny)
    lay = GraphLayout.from_edge_index(ei, (n, n))
    lay.colptr  # noqa: B018  (the CSC built before timing, as a cached layout's)
    return lay, n


def work_counts(lay, pl=None) -> dict:
    """Work items and partial slots over the CSR and the CSC of a layout, at the
    chunk and item order of the kernel plan ``pl`` (default: the default chunk,
    longest items first)."""
    from pyg_dfgnn.work_items import chunk_for
    chunk = pl.chunk if pl is not None else chunk_for(lay.num_edges)
    first = pl.long_items_first if pl is not None else True
    rw, cw = lay.work("row", chunk, first), lay.work("col", chunk, first)
    return {"row_items": int(rw.items.size(0)), "col_items": int(cw.items.size(0)),
            "row_slots": int(rw.num_slots), "col_slots": int(cw.num_slots)}


# -------------------------------------------------------------------- cases
def make_case(model: str, lay, n: int, dtype: torch.dtype, device: str, H: int = HEADS,
              C: int = CHANNELS):
    """``(f, grad, leaves)``: the fused op's call, the output gradient, the leaves, of
    ``model`` (``gt``: dot, ``gat``: additive, ``gatv2``, ``agnn``: cosine) on
    ``[n, H, C]`` rows drawn from seed 0 (the same inputs at every call)."""
    from pyg_dfgnn import ops
    torch.manual_seed(0)
    leaf = dict(device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(n, H, C, device=device, dtype=dtype)
    if model == "gt":
        q, k, v = (torch.randn(n, H, C, **leaf) for _ in range(3))
        return (lambda: ops.gt_attention(lay, q, k, v)), g, (q, k, v)
    if model == "gat":
        a_src, a_dst = (torch.randn(n, H, **leaf) for _ in range(2))
        x = torch.randn(n, H, C, **leaf)
        return (lambda: ops.gat_attention(lay, a_src, a_dst, x)), g, (a_src, a_dst, x)
    if model == "gatv2":
        x_l, x_r = (torch.randn(n, H, C, **leaf) for _ in range(2))
        att = torch.randn(H, C, **leaf)
        return (lambda: ops.gatv2_attention(lay, x_l, x_r, att)), g, (x_l, x_r, att)
    if model == "agnn":
        x = torch.randn(n, H, C, **leaf)
        # AGNNConv's temperature is an fp32 parameter whatever the features' dtype
        beta = torch.ones((), device=device, dtype=torch.float32, requires_grad=True)
        return (lambda: ops.agnn_attention(lay, x, None, beta)), g, (x, beta)
    raise ValueError(f"model must be 'gt', 'gat', 'gatv2' or 'agnn', got {model!r}")


def wall_timer(fn, reps: int = 3) -> float:
    """Median wall time of ``fn`` in ms (the CPU stand-in for ``do_bench``)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def case_plan(lay, model: str, dtype: torch.dtype, C: int = CHANNELS):
    """The kernel plan of a case's call (``C`` channels per head), or ``None``
    where there is none (the CPU reference path)."""
    try:
        return plan.plan_for(lay, dtype, C, {"gt": "dot", "gat": "additive"}[model])
    except Exception:  # noqa: BLE001
        return None


def case_bytes(lay, model: str, dtype: torch.dtype, H: int = HEADS, C: int = CHANNELS):
    """``(plan, work counts, byte_model phases)`` of a case's call on ``lay``
    (``H`` heads of ``C`` channels)."""
    pl = case_plan(lay, model, dtype, C)
    wc = work_counts(lay, pl)
    phases = byte_model(model, lay.num_dst, lay.num_src, lay.num_edges, H, C,
                        dtype.itemsize, one_launch=bool(pl is not None and pl.bwd_one_launch),
                        **wc)
    return pl, wc, phases


def run_case(graph: str, model: str, dtype_name: str, lay, n: int, device: str,
             profile: bool = True, timer=None, H: int = HEADS, C: int = CHANNELS) -> dict:
    """Times, per-kernel table and byte model of one case (see the module doc) of
    ``H`` heads of ``C`` channels; ``timer`` (callable -> ms) replaces ``do_bench``."""
    dtype = getattr(torch, dtype_name)
    pl, wc, phases = case_bytes(lay, model, dtype, H, C)
    phases32 = case_bytes(lay, model, torch.float32, H, C)[2] if dtype.itemsize != 4 else None
    res = {"graph": graph, "model": model, "dtype": dtype_name, "H": H, "C": C,
           "plan": None if pl is None else dataclasses.asdict(pl),
           "bwd_one_launch": bool(pl is not None and pl.bwd_one_launch), "work": wc}
    tot = summarize_phases(phases)
    res["phases"] = phases
    res["bytes"] = tot
    res["floor_us"] = {k: floor_us(v) for k, v in tot.items()}
    f, g, leaves = make_case(model, lay, n, dtype, device, H, C)
    res.update(kernels.measure(f, g, leaves, timer=timer))
    for key, ph in (("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd_bwd")):
        if isinstance(res.get(key), float):
            res[f"{ph}_x_floor"] = res[key] * 1e3 / res["floor_us"][ph]
    if isinstance(res.get("fwd_ms"), float) and isinstance(res.get("fwd_bwd_ms"), float):
        res["bwd_ms"] = res["fwd_bwd_ms"] - res["fwd_ms"]  # includes autograd's host time
        res["bwd_x_floor"] = res["bwd_ms"] * 1e3 / res["floor_us"]["bwd"]
    if profile and device != "cpu" and res["status"] == "ok":
        def step():
            for t in leaves:
                t.grad = None
            torch.autograd.backward(f(), g)
        try:
            prof = profile_step(step)
            attach_floors(prof["kernels"], phases, phases32)
            res["profile"] = prof
        except Exception as e:  # noqa: BLE001  (recorded: the timings still stand)
            res["profile_error"] = kernels._first_line(e)
    return res


def ncu_child(args) -> int:
    """Under ncu: one GT fp32 and one GAT fp32 forward + backward on one graph, no
    warm-up (each backward kernel launches once: ncu's ``--launch-count`` counts
    them)."""
    lay, n = graph_layout(args.graphs.split(",")[0], args)
    for model in ("gt", "gat"):
        try:
            f, g, _ = make_case(model, lay, n, torch.float32, args.device)
            torch.autograd.backward(f(), g)
            if args.device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"ncu child: {model}: {kernels._first_line(e)}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------- tables
def _f(v, fmt="{:.3f}"):
    return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def markdown(doc: dict) -> str:
    """The case table, the per-kernel tables and the ncu table."""
    out = [f"# Fused forward + backward against the compulsory bytes "
           f"(floor at {doc['info'].get('floor_TBps', FLOOR_TBPS)} TB/s)", ""]
    if doc.get("graphs"):
        out += ["| graph | nodes | edges | max in-deg | row items / slots | col items / slots |",
                "|---|---|---|---|---|---|"]
        for name, g in doc["graphs"].items():
            if "error" in g:
                out.append(f"| {name} | error: {g['error']} | | | | |")
                continue
            out.append(f"| {name} | {g['nodes']:,} | {g['edges']:,} | {g['max_in_degree']:,} | "
                       f"{g['row_items']:,} / {g['row_slots']:,} | "
                       f"{g['col_items']:,} / {g['col_slots']:,} |")
        out.append("")
    out += ["| graph | case | fwd ms | fwd floor µs | × | f+b ms | f+b floor µs | × | "
            "bwd ms (f+b − f) | bwd floor µs | × | peak MB | top backward kernel |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        case = f"{r['model'].upper()} {r['H']}×{r['C']} {r['dtype']}"
        if r.get("status") != "ok":
            out.append(f"| {r['graph']} | {case} | {r.get('status', 'error')}: "
                       f"{r.get('error', '')} |" + " |" * 10)
            continue
        fl = r["floor_us"]
        top = next((k for k in r.get("profile", {}).get("kernels", [])
                    if k.get("phase") and k["phase"] not in FORWARD_PHASES), None)
        top_s = f"{top['short']} {top['us']:.0f} µs ({top['share']:.0%})" if top else "-"
        out.append(f"| {r['graph']} | {case} | {_f(r.get('fwd_ms'))} | {_f(fl['fwd'], '{:.1f}')} | "
                   f"{_f(r.get('fwd_x_floor'), '{:.1f}')} | {_f(r.get('fwd_bwd_ms'))} | "
                   f"{_f(fl['fwd_bwd'], '{:.1f}')} | {_f(r.get('fwd_bwd_x_floor'), '{:.1f}')} | "
                   f"{_f(r.get('bwd_ms'))} | {_f(fl['bwd'], '{:.1f}')} | "
                   f"{_f(r.get('bwd_x_floor'), '{:.1f}')} | {_f(r.get('peak_MB'), '{:.0f}')} | "
                   f"{top_s} |")
    for r in doc["rows"]:
        prof = r.get("profile")
        if not prof:
            continue
        out += ["", f"## {r['graph']}, {r['model'].upper()} {r['H']}×{r['C']} {r['dtype']}: "
                f"one forward + backward, {prof['steps']} steps, kernel time "
                f"{prof['busy_us']:.0f} µs of a {prof['span_us']:.0f} µs GPU span", "",
                "| kernel | calls | µs | share | compulsory MB | extra MB | floor µs | × floor |",
                "|---|---|---|---|---|---|---|---|"]
        for k in prof["kernels"]:
            out.append(f"| {k['short']} | {k['calls']:g} | {k['us']:.1f} | {k['share']:.0%} | "
                       f"{_f(k.get('MB'), '{:.1f}')} | {_f(k.get('extra_MB'), '{:.1f}')} | "
                       f"{_f(k.get('floor_us'), '{:.1f}')} | "
                       f"{_f(k.get('x_floor'), '{:.1f}')} |")
    nc = doc.get("ncu")
    if nc:
        out += ["", f"## ncu on {nc.get('graph')} (one launch each, caches flushed, clocks "
                "not locked)", ""]
        if nc.get("error") and not nc.get("kernels"):
            out.append(f"ncu failed: {nc['error']}")
        if nc.get("kernels"):
            out += ["| kernel | µs | × floor | DRAM rd MB | DRAM wr MB | DRAM / compulsory | "
                    "L2 MB | L2 hit % | L1 hit % | SM % | mem % | warps % | long-sb stall % | "
                    "regs |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for k in nc["kernels"]:
                m = k["metrics"]

                def g(key, scale=1.0, fmt="{:.1f}"):
                    v = m.get(key)
                    return _f(v / scale, fmt) if isinstance(v, float) else "-"
                out.append(
                    f"| {k['short']} | {g('gpu__time_duration.sum', 1e3)} | "
                    f"{_f(k.get('time_x_floor'), '{:.1f}')} | {g('dram__bytes_read.sum', 1e6)} | "
                    f"{g('dram__bytes_write.sum', 1e6)} | "
                    f"{_f(k.get('dram_x_compulsory'), '{:.2f}')} | {g('lts__t_bytes.sum', 1e6)} | "
                    f"{g('lts__t_sector_hit_rate.pct')} | {g('l1tex__t_sector_hit_rate.pct')} | "
                    f"{g('sm__throughput.avg.pct_of_peak_sustained_elapsed')} | "
                    f"{g('gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed')} | "
                    f"{g('sm__warps_active.avg.pct_of_peak_sustained_active')} | "
                    f"{g('smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct')} | "
                    f"{g('launch__registers_per_thread', 1.0, '{:.0f}')} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------- main
def _shape(text: str) -> tuple:
    """``"HxC"`` -> ``(H, C)``, both positive."""
    try:
        H, C = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected heads x channels such as 4x32, got "
                                          f"{text!r}") from None
    if H < 1 or C < 1:
        raise argparse.ArgumentTypeError(f"heads and channels must be positive, got {text!r}")
    return H, C


def parse_args(argv=None):
    from benchmarks import cli, datasets
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_backward",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (JSON and markdown)")
    ap.add_argument("--graphs", default=",".join(GRAPHS),
                    help=f"comma-separated subset of {','.join(GRAPHS)}")
    ap.add_argument("--cases", default=",".join(f"{m}:{d}" for m, d in CASES),
                    help="comma-separated model:dtype cases (gt:float32, gt:bfloat16, "
                         "gat:float32)")
    datasets.add_data_argument(ap, "MUSAE/GitHub/ and ogbn-arxiv/")
    ap.add_argument("--shape", default=f"{HEADS}x{CHANNELS}", type=_shape,
                    help="heads x channels per head of every case, e.g. 4x32")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: only with --tiny, a check of the script")
    ap.add_argument("--tiny", action="store_true",
                    help="a 300-node generated graph in place of each graph (a check of "
                         "the script, with --device cpu)")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-kernel table")
    ap.add_argument("--mma-backward", action="store_true",
                    help="fp16 / bf16 GT cases with plan.override(mma_backward=True) (the "
                         "tensor-core backward walks)")
    ap.add_argument("--rep-ms", type=float, default=kernels.REPEATS[1],
                    help="do_bench repetition time per measurement (ms)")
    ap.add_argument("--ncu", action="store_true",
                    help="also run the backward kernels of --ncu-graph under ncu")
    ap.add_argument("--ncu-only", action="store_true", help="only the ncu run (implies --ncu)")
    ap.add_argument("--ncu-graph", default="Reddit-like", help="the graph of the ncu run")
    ap.add_argument("--ncu-kernels", default=NCU_KERNELS, help="ncu --kernel-name regex")
    ap.add_argument("--ncu-timeout", type=float, default=90.0,
                    help="seconds for the ncu run(s) in all")
    ap.add_argument("--ncu-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.ncu = args.ncu or args.ncu_only
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.ncu_child:
        return ncu_child(args)
    if args.device == "cuda":
        # without the kernels the ops run the reference: nothing here to profile
        from benchmarks import cli
        cli.require_kernels("benchmarks.profile_backward",
                            "--device cpu --tiny runs it on a tiny graph, a check of the script")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "profile_backward.json", out_dir / "profile_backward.md"
    info = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": "python -m benchmarks.profile_backward " + shlex.join(
                sys.argv[1:] if argv is None else list(argv)),
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "floor_TBps": FLOOR_TBPS, "tiny": args.tiny, "data": args.data,
            "rep_ms": args.rep_ms, "profile_steps": PROFILE_STEPS}
    doc = {"info": info, "graphs": {}, "rows": []}
    cases = [tuple(c.split(":")) for c in args.cases.split(",") if c]
    names = [args.ncu_graph] if args.ncu_only else [g for g in args.graphs.split(",") if g]
    t_start = time.perf_counter()

    def timer(fn):
        if args.device == "cpu":
            return wall_timer(fn)
        return kernels.bench(fn, rep_ms=args.rep_ms)

    def save():
        info["wall_s"] = time.perf_counter() - t_start
        json_path.write_text(json.dumps(doc, indent=1))
        md_path.write_text(markdown(doc))

    def ncu_phases(lay):  # what the ncu child runs: GT and GAT in fp32
        return {m: case_bytes(lay, m, torch.float32)[2] for m in ("gt", "gat")}

    phases_ncu = None
    for name in names:
        try:
            lay, n = graph_layout(name, args)
            gi = {"nodes": n, "edges": lay.num_edges, "max_in_degree": lay.max_in_degree,
                  **work_counts(lay)}
            doc["graphs"][name] = gi
        except Exception as e:  # noqa: BLE001  (one graph failing leaves the others)
            doc["graphs"][name] = {"error": kernels._first_line(e)}
            save()
            continue
        for model, dtype_name in cases:
            if args.ncu_only:
                break
            tc = args.mma_backward and model == "gt" and dtype_name != "float32"
            try:
                with plan.override(mma_backward=True if tc else None):
                    row = run_case(name, model, dtype_name, lay, n, args.device,
                                   not args.no_profile, timer, *args.shape)
            except Exception as e:  # noqa: BLE001
                row = {"graph": name, "model": model, "dtype": dtype_name, "H": args.shape[0],
                       "C": args.shape[1], "status": "error", "error": kernels._first_line(e)}
            if not kernels.cuda_context_ok(args.device):
                row["cuda_context_lost"] = True
            doc["rows"].append(row)
            save()
            print(f"# {name} {model} {dtype_name}: fwd {_f(row.get('fwd_ms'))} ms, "
                  f"fwd+bwd {_f(row.get('fwd_bwd_ms'))} ms, {row.get('status')}",
                  file=sys.stderr)
        if name == args.ncu_graph:
            phases_ncu = ncu_phases(lay)
        del lay
    if args.ncu:
        if phases_ncu is None:  # the ncu graph was not among --graphs: model it here
            try:
                phases_ncu = ncu_phases(graph_layout(args.ncu_graph, args)[0])
            except Exception as e:  # noqa: BLE001
                doc["ncu"] = {"error": f"graph: {kernels._first_line(e)}"}
        if "ncu" not in doc:
            if args.device == "cuda":
                torch.cuda.empty_cache()
            doc["ncu"] = run_ncu(args, out_dir, phases_ncu)
        save()
    save()
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
