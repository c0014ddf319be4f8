r"""PNG bar charts of the kernel and end-to-end benchmark results (matplotlib, Agg).

* ``kernels_speedup.png`` (from ``benchmarks/kernels.py`` JSON): speedup of the
  fused op (``fused-auto``) over native PyG message passing per graph, forward
  and forward + backward, one bar per configuration (heads x channels, dtype),
  one row of panels per model (GT rows, and GAT / AGNN ``score_rows`` when the
  file has them), like the paper's Fig. 9 / 10; where the file has compiled PyG
  (``pyg-compile``), a hatched bar beside each is the speedup over it, where it
  has dense masked SDPA (``dense-sdpa``, batch graphs) a dotted one, and where it
  has FlexAttention (``flex-seq``, ``flex-padded``, batch graphs) a cross-hatched
  and a back-hatched one.
* ``e2e_speedup.png`` (from ``benchmarks/e2e.py`` JSON): training-step speedup
  (native step time / fused step time) per dataset and model; hatched ``×``
  bars: over the compiled native model (``native_compile``) where measured.
* ``e2e_breakdown.png``: per model and dataset, a stacked bar of preprocess /
  forward / backward / optimizer time per step for native PyG and fused
  (the paper's Table 2).

Each figure carries the GPU, torch and CUDA versions and the date of its JSON.

Usage (the committed results, or a run's own JSON)::

    python -m benchmarks.plot --kernels benchmarks/results/kernels_h100.json \
        --e2e benchmarks/results/e2e_h200.json --out-dir out
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = ("preprocess", "forward", "backward", "optimizer")
PHASE_COLORS = {"preprocess": "#9e9e9e", "forward": "#1f77b4", "backward": "#ff7f0e",
                "optimizer": "#2ca02c"}
MODEL_NAMES = {"gt": "GT", "gat": "GAT", "agnn": "AGNN"}


def stamp(info: Dict[str, object]) -> str:
    """``"<GPU> · torch <v> · CUDA <v> · <date>"`` from a result file's ``info``."""
    parts = [str(info.get("gpu", "unknown device")),
             f"torch {info.get('torch', '?')}",
             f"CUDA {info.get('cuda') or 'n/a'}",
             str(info.get("date", "undated"))]
    if info.get("quick"):
        parts.append("--quick")
    if "cuda_kernels" in info and not info["cuda_kernels"]:
        parts.append("fused layers on the reference path")
    return " · ".join(parts)


def _footer(fig, info) -> None:
    fig.text(0.995, 0.005, stamp(info), ha="right", va="bottom", fontsize=7, color="#555555")


def _label_bars(ax, bars, fmt="{:.1f}x") -> None:
    for b in bars:
        h = b.get_height()
        if h and math.isfinite(h):
            ax.annotate(fmt.format(h), (b.get_x() + b.get_width() / 2, h), ha="center",
                        va="bottom", fontsize=6, rotation=90, xytext=(0, 2),
                        textcoords="offset points")


# ------------------------------------------------------------------- kernels
#: ``(method, key suffix)`` of the yardsticks a fused time is divided into.
SERIES = (("pyg", ""), ("pyg-compile", "_compiled"), ("dense-sdpa", "_sdpa"),
          ("flex-seq", "_flex_seq"), ("flex-padded", "_flex_padded"))
#: Bar hatch, legend text and title key of each yardstick but eager PyG.
SERIES_STYLE = {"_compiled": ("//", "vs compiled PyG", "hatched: PyG under torch.compile"),
                "_sdpa": ("..", "vs dense SDPA", "dotted: dense masked SDPA"),
                "_flex_seq": ("xx", "vs FlexAttention, one sequence",
                              "cross-hatched: FlexAttention, the batch as one sequence"),
                "_flex_padded": ("\\\\", "vs FlexAttention, padded",
                                 "back-hatched: FlexAttention, padded per graph")}


def _measured(d: Dict[str, object]) -> bool:
    return "error" not in d and d.get("status", "ok") == "ok"


def kernel_speedups(data: Dict[str, object]) -> Dict[str, Dict[str, Dict[str, Dict[str, float]]]]:
    r"""``{model: {config: {graph: {"fwd": x, "fwd_bwd": y, "fwd_compiled": ...,
    "fwd_bwd_compiled": ..., "fwd_sdpa": ..., "fwd_bwd_sdpa": ...}}}}``: speedup of
    ``fused-auto`` over ``pyg``, (keys ``*_compiled``) over ``pyg-compile``,
    (keys ``*_sdpa``) over ``dense-sdpa`` and (keys ``*_flex_seq``, ``*_flex_padded``)
    over ``flex-seq``, ``flex-padded``; missing, failed, mismatching or not applicable
    measurements (a ``status`` other than ``ok``) are left out."""
    out: Dict[str, Dict[str, Dict[str, Dict[str, float]]]] = {}
    rows = list(data.get("rows", [])) + list(data.get("score_rows", []))
    for r in rows:
        m = r.get("methods", {})
        f = m.get("fused-auto", {})
        model = r.get("model", "gt")
        cfg = f"H={r.get('H')}×C={r.get('C')} {r.get('dtype', '')}".strip()
        sp = {}
        for other, suffix in SERIES:
            p = m.get(other, {})
            for key in ("fwd", "fwd_bwd"):
                a, b = f.get(f"{key}_ms"), p.get(f"{key}_ms")
                if a and b and _measured(f) and _measured(p):
                    sp[key + suffix] = b / a
        if sp:
            out.setdefault(model, {}).setdefault(cfg, {})[r["graph"]] = sp
    return out


def plot_kernels(data: Dict[str, object], path: str, dpi: int = 130) -> str:
    sp = kernel_speedups(data)
    if not sp:
        raise ValueError("no fused-auto / pyg pairs in the kernel results")
    models = [m for m in ("gt", "gat", "agnn") if m in sp] + [m for m in sp if m not in MODEL_NAMES]
    graphs: List[str] = []
    for r in list(data.get("rows", [])) + list(data.get("score_rows", [])):
        if r["graph"] not in graphs:
            graphs.append(r["graph"])
    fig, axes = plt.subplots(2 * len(models), 1, figsize=(max(9, 0.8 * len(graphs) + 5),
                                                          3.3 * 2 * len(models)), squeeze=False)
    shown = set()  # the yardsticks beyond eager PyG that some panel has
    for i, model in enumerate(models):
        cfgs = list(sp[model])
        present = {sfx for sfx in SERIES_STYLE for gs in sp[model].values()
                   for v in gs.values() for k in v if k.endswith(sfx)}
        several = bool(present)  # more than one yardstick: legends and axis name them
        shown |= present
        # one bar per configuration and yardstick: eager PyG, then compiled PyG
        # (hatched), dense SDPA (dotted) and FlexAttention, where the model has them
        suffixes = [""] + [sfx for sfx in SERIES_STYLE if sfx in present]
        series = [(cfg, s) for cfg in cfgs for s in suffixes]
        width = 0.8 / max(len(series), 1)
        for j, (key, title) in enumerate((("fwd", "forward"), ("fwd_bwd", "forward + backward"))):
            ax = axes[2 * i + j][0]
            colors: Dict[str, object] = {}
            for k, (cfg, suffix) in enumerate(series):
                xs = [g + (k - (len(series) - 1) / 2) * width for g in range(len(graphs))]
                ys = [sp[model][cfg].get(g, {}).get(key + suffix, float("nan")) for g in graphs]
                hatch, text, _ = SERIES_STYLE.get(suffix, (None, "vs PyG", None))
                bars = ax.bar(xs, ys, width, color=colors.get(cfg),
                              label=cfg + (" " + text if several else ""),
                              hatch=hatch, edgecolor="white" if suffix else None)
                colors.setdefault(cfg, bars.patches[0].get_facecolor() if bars.patches else None)
                _label_bars(ax, bars)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xticks(range(len(graphs)))
            ax.set_xticklabels(graphs, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel("speedup (×)" if several else "speedup over PyG (×)")
            ax.set_title(f"{MODEL_NAMES.get(model, model)} attention kernel, {title}", fontsize=10)
            ax.margins(y=0.3)
            ax.grid(axis="y", alpha=0.3)
            # beside the panel: nine series would cover the bars
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), framealpha=0.9)
    keys = [style[2] for sfx, style in SERIES_STYLE.items() if sfx in shown]
    fig.suptitle("Fused attention vs. native PyG message passing (time ratio, higher is better)"
                 + ("\nplain: eager PyG; " + "; ".join(keys) if keys else ""), fontsize=11)
    _footer(fig, data.get("info", {}))
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------- e2e
def _ok(d: Optional[Dict[str, object]]) -> bool:
    return bool(d) and "error" not in d and d.get("step_ms") is not None


def _e2e_grid(data: Dict[str, object]):
    """``(rows, datasets, models)`` of an e2e result, in first-seen order."""
    rows = data.get("rows", [])
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not datasets:
        raise ValueError("no rows in the e2e results")
    return rows, datasets, models


def plot_e2e_speedup(data: Dict[str, object], path: str, dpi: int = 130) -> str:
    rows, datasets, models = _e2e_grid(data)
    # Eager bars, plus hatched bars for the CUDA-graph mode where it ran (full graphs).
    modes = ["impls"] + (["cudagraph"] if any(_ok((r.get("cudagraph") or {}).get("fused"))
                                               for r in rows) else []) \
        + (["compiled"] if any(_ok(r.get("impls", {}).get("native_compile")) for r in rows)
           else [])
    series = [(m, mode) for mode in modes for m in models]
    fig, ax = plt.subplots(figsize=(max(7, 0.8 * len(series) * len(datasets) / 3 + 3), 4.2))
    width = 0.8 / max(len(series), 1)
    colors = {}
    for k, (model, mode) in enumerate(series):
        xs, ys = [], []
        for i, ds in enumerate(datasets):
            r = next((r for r in rows if r["dataset"] == ds and r["model"] == model), None)
            res = (r or {}).get("impls" if mode == "compiled" else mode) or {}
            na, fu = res.get("native_compile" if mode == "compiled" else "native"), res.get("fused")
            ys.append(na["step_ms"] / fu["step_ms"] if _ok(na) and _ok(fu) else float("nan"))
            xs.append(i + (k - (len(series) - 1) / 2) * width)
        label = MODEL_NAMES.get(model, model) + {"cudagraph": " (CUDA graph, both)",
                                                 "compiled": " vs compiled native"}.get(mode, "")
        hatch = {"cudagraph": "//", "compiled": "xx"}.get(mode)
        bars = ax.bar(xs, ys, width, label=label, color=colors.get(model), hatch=hatch,
                      edgecolor="white" if hatch else None)
        colors.setdefault(model, bars.patches[0].get_facecolor() if bars.patches else None)
        _label_bars(ax, bars, "{:.2f}x")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels(datasets)
    ax.set_ylabel("training-step speedup over PyG (×)")
    ax.set_title("End-to-end training step: native PyG time / fused time"
                 + (" (xx: native under torch.compile)" if "compiled" in modes else "")
                 + " (higher is better)", fontsize=10)
    ax.margins(y=0.18)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _footer(fig, data.get("info", {}))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_e2e_breakdown(data: Dict[str, object], path: str, dpi: int = 130) -> str:
    rows, datasets, models = _e2e_grid(data)
    fig, axes = plt.subplots(len(models), len(datasets),
                             figsize=(2.3 * len(datasets) + 1, 2.9 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        for j, ds in enumerate(datasets):
            ax = axes[i][j]
            r = next((r for r in rows if r["dataset"] == ds and r["model"] == model), None)
            impls = [("native", "PyG"), ("fused", "fused")]
            for x, (impl, label) in enumerate(impls):
                d = r["impls"].get(impl) if r else None
                if not _ok(d):
                    ax.text(x, 0, "error" if d else "n/a", ha="center", va="bottom", fontsize=7,
                            color="red")
                    continue
                bottom = 0.0
                for p in PHASES:
                    v = float(d.get(f"{p}_ms") or 0.0)
                    ax.bar(x, v, 0.6, bottom=bottom, color=PHASE_COLORS[p],
                           label=p if (i == 0 and j == 0 and x == 0) else None)
                    bottom += v
                ax.annotate(f"{bottom:.1f}", (x, bottom), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 1), textcoords="offset points")
            ax.set_xticks(range(len(impls)))
            ax.set_xticklabels([lab for _, lab in impls], fontsize=8)
            sp = (r or {}).get("speedup", {}).get("step")
            ax.set_title(f"{MODEL_NAMES.get(model, model)} · {ds}"
                         + (f" · {sp:.2f}x" if sp else ""), fontsize=8)
            ax.margins(y=0.15)
            ax.tick_params(axis="y", labelsize=7)
            if j == 0:
                ax.set_ylabel("ms per training step", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS[p]) for p in PHASES]
    fig.legend(handles, PHASES, loc="upper right", ncol=4, fontsize=8)
    fig.suptitle("Training step breakdown (median ms), native PyG vs. fused", fontsize=10,
                 x=0.02, ha="left")
    _footer(fig, data.get("info", {}))
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> List[str]:
    r"""Writes the figures; returns their paths."""
    from benchmarks import cli
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.plot",
        description="Bar charts (PNG) of benchmarks/kernels.py and benchmarks/e2e.py results: "
                    "kernel speedup over PyG per graph (forward, forward+backward), end-to-end "
                    "training-step speedup per dataset and model, and the per-step time "
                    "breakdown (preprocess / forward / backward / optimizer).",
        epilog="example (the committed results):\n  python -m benchmarks.plot "
               "--kernels benchmarks/results/kernels_h100.json "
               "--e2e benchmarks/results/e2e_h200.json --out-dir out",
        formatter_class=cli.HelpFormatter)
    p.add_argument("--kernels", metavar="JSON",
                   help="output of benchmarks/kernels.py (default: no kernel figure)")
    p.add_argument("--e2e", metavar="JSON",
                   help="output of benchmarks/e2e.py (default: no end-to-end figures)")
    p.add_argument("--out-dir", default="plots", help="folder for the PNGs")
    p.add_argument("--dpi", type=int, default=130, help="resolution")
    args = p.parse_args(argv)
    if not args.kernels and not args.e2e:
        p.error("nothing to plot: pass --kernels JSON (from benchmarks.kernels) and/or --e2e "
                "JSON (from benchmarks.e2e); benchmarks/results/ holds committed ones")
    for flag, path in (("--kernels", args.kernels), ("--e2e", args.e2e)):
        if path and not os.path.isfile(path):
            p.error(f"{flag} {path}: no such file")
    os.makedirs(args.out_dir, exist_ok=True)
    written = []
    if args.kernels:
        with open(args.kernels) as f:
            k = json.load(f)
        written.append(plot_kernels(k, os.path.join(args.out_dir, "kernels_speedup.png"), args.dpi))
    if args.e2e:
        with open(args.e2e) as f:
            e = json.load(f)
        written.append(plot_e2e_speedup(e, os.path.join(args.out_dir, "e2e_speedup.png"), args.dpi))
        written.append(plot_e2e_breakdown(e, os.path.join(args.out_dir, "e2e_breakdown.png"),
                                          args.dpi))
    for w in written:
        print(w)
    return written


if __name__ == "__main__":
    main()
    sys.exit(0)
