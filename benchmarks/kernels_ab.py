r"""Two builds' kernel benchmark records side by side: is any timing slower?

Reads the JSON that :mod:`benchmarks.kernels` writes, or :mod:`benchmarks.layers`
(its rows have the same fields: a layer's methods instead of the op's), or
:mod:`benchmarks.half_precision` (one fused op per row: its ``fwd_ms`` and
``fused_fwd_bwd_ms`` as the method ``fused``), several runs of each build (run
alternating in one session on one GPU, so that clocks and heat drift alike), and
compares each timing's best run: ``new / base`` per graph, model, heads ×
channels, dtype, method and phase (``fwd_ms``, ``fwd_bwd_ms``). The best of a few
runs is the figure two builds share the least noise in; each side's spread (its
slowest run over its fastest) says how far apart two runs of one build land.

Timings of the host-bound full graphs (``kind: "full"``: Cora, CiteSeer, PubMed,
where a step is tens of microseconds of host work around a few microseconds of
kernels) are kept apart from the GPU-bound ones: their runs of one build differ by
more than any kernel change moves them.

Usage, from the repository root::

    python -m benchmarks.kernels_ab --base A_1.json A_2.json --new B_1.json B_2.json \
        --out ab.json [--tolerance 0.03]

Writes ``--out`` (``info``: both sides' records' ``info``; ``rows``: one per timing
with ``base_ms``, ``new_ms``, ``ratio``, ``base_spread``, ``new_spread``,
``host_bound``; ``summary``: per group the count, the median, smallest and largest
ratio, and the rows over ``1 + tolerance``) and prints the summary. Exits with 1
when a GPU-bound timing is slower than the tolerance allows, with 2 when a file is
missing or not such a record.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Dict, Iterable, List, Tuple

from benchmarks import cli

PHASES = ("fwd_ms", "fwd_bwd_ms")

Key = Tuple[str, str, str, str, str]


def _methods(row: dict) -> dict:
    # A benchmarks.half_precision row is one fused op: its status and timings
    # under the kernel records' names.
    if "methods" in row or "layer" not in row:
        return row.get("methods", {})
    return {"fused": {"status": row.get("status"), "fwd_ms": row.get("fwd_ms"),
                      "fwd_bwd_ms": row.get("fused_fwd_bwd_ms")}}


def timings(record: dict) -> Dict[Key, Tuple[float, str]]:
    r"""``(model, graph, HxC, dtype, method + phase) -> (ms, kind)`` of one
    :mod:`benchmarks.kernels`, :mod:`benchmarks.layers` or
    :mod:`benchmarks.half_precision` record (its layer as the model), the methods
    whose status is ``ok``."""
    out = {}
    for section, default_model in (("rows", "gt"), ("score_rows", None)):
        for row in record.get(section, []):
            model = row.get("model", row.get("layer", default_model))
            for method, res in _methods(row).items():
                if res.get("status") != "ok":
                    continue
                for phase in PHASES:
                    ms = res.get(phase)
                    if isinstance(ms, (int, float)) and ms > 0:
                        key = (model, row["graph"], f"{row['H']}x{row['C']}", row["dtype"],
                               f"{method} {phase}")
                        out[key] = (float(ms), row.get("kind", ""))
    return out


def best_of(records: Iterable[dict]) -> Dict[Key, Tuple[float, float, str]]:
    r"""``key -> (best ms, slowest / fastest, kind)`` over runs of one build; a
    timing counts when every run has it."""
    runs = [timings(r) for r in records]
    if not runs:
        raise ValueError("no records")
    keys = set(runs[0]).intersection(*runs[1:])
    out = {}
    for k in keys:
        ms = [r[k][0] for r in runs]
        out[k] = (min(ms), max(ms) / min(ms), runs[0][k][1])
    return out


def compare(base: List[dict], new: List[dict], tolerance: float = 0.03) -> dict:
    r"""The comparison record of two builds' runs (the module docstring says what
    it holds). Timings that only one side has are counted in ``summary.unmatched``."""
    b, n = best_of(base), best_of(new)
    rows = []
    for k in sorted(set(b) & set(n)):
        (bm, bs, kind), (nm, ns, _) = b[k], n[k]
        model, graph, hc, dtype, what = k
        rows.append({"model": model, "graph": graph, "HxC": hc, "dtype": dtype,
                     "timing": what, "base_ms": bm, "new_ms": nm, "ratio": nm / bm,
                     "base_spread": bs, "new_spread": ns, "host_bound": kind == "full"})
    summary = {"tolerance": tolerance, "unmatched": len(set(b) ^ set(n))}
    for name, group in (("gpu_bound", [r for r in rows if not r["host_bound"]]),
                        ("host_bound", [r for r in rows if r["host_bound"]])):
        ratios = [r["ratio"] for r in group]
        summary[name] = {
            "timings": len(group),
            "median": statistics.median(ratios) if ratios else None,
            "min": min(ratios) if ratios else None,
            "max": max(ratios) if ratios else None,
            "over": [r for r in group if r["ratio"] > 1 + tolerance]}
    return {"info": {"base": [r.get("info", {}) for r in base],
                     "new": [r.get("info", {}) for r in new]},
            "rows": rows, "summary": summary}


def _fail(msg: str):
    print(msg, file=sys.stderr)
    sys.exit(2)


def _load(paths):
    """The records at ``paths``; a file that is missing or not a record ends the
    script (exit status 2) with two lines that say which and what to pass."""
    out = []
    for p in paths:
        try:
            with open(p) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            _fail(f"python -m benchmarks.kernels_ab: cannot read {p}: {e}\n"
                     "Pass the JSON files that python -m benchmarks.kernels --out wrote.")
        if not isinstance(doc, dict) or not ("rows" in doc or "score_rows" in doc):
            _fail(f"python -m benchmarks.kernels_ab: {p} is not a benchmarks.kernels, "
                     "layers or half_precision record (no rows)\nPass the JSON files that "
                     "python -m benchmarks.kernels --out wrote.")
        out.append(doc)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels_ab",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--base", nargs="+", required=True, help="the base build's records")
    ap.add_argument("--new", nargs="+", required=True, help="the new build's records")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="largest slowdown that passes, as a fraction")
    ap.add_argument("--out", default="kernels_ab.json", help="JSON comparison")
    args = ap.parse_args(argv)
    res = compare(_load(args.base), _load(args.new), args.tolerance)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    s = res["summary"]
    for name in ("gpu_bound", "host_bound"):
        g = s[name]
        if not g["timings"]:
            continue
        print(f"{name}: {g['timings']} timings, new / base median {g['median']:.3f}, "
              f"{g['min']:.3f} to {g['max']:.3f}; over {1 + args.tolerance:.2f}: "
              f"{len(g['over'])}")
        for r in g["over"]:
            print(f"  {r['model']} {r['graph']} {r['HxC']} {r['dtype']} {r['timing']}: "
                  f"{r['base_ms']:.4f} -> {r['new_ms']:.4f} ms ({r['ratio']:.3f}; spreads "
                  f"{r['base_spread']:.3f} / {r['new_spread']:.3f})")
    if s["unmatched"]:
        print(f"timings in one side only: {s['unmatched']}")
    return 1 if s["gpu_bound"]["over"] else 0


if __name__ == "__main__":
    sys.exit(main())
