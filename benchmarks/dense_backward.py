"""The dense-tile backward of the dot score against its other forms, side by side
on batch graphs: for which head sizes the plan runs it, and what the per-edge
weights it may save cost.

For each batch graph (1,024 generated PATTERN-, CLUSTER- and MNIST-like graphs:
the batches whose forward runs dense tiles), head shape and dtype, the GT
attention op (``ops.gt_attention`` on random rows from seed 0, every input a
leaf, as :func:`benchmarks.profile_backward.make_case` builds them) runs under
each variant in turn (:data:`VARIANTS`):

* ``sparse``: the tensor-core walks (``plan.override(dense_backward=False)``);
* ``dense_saved``: the dense-tile backward with its dq launch saving each edge's
  (P', dS) (``dense_backward=True, save_weights=True``);
* ``dense``: the dense-tile backward as the plan runs it (``dense_backward=True``;
  on these graphs every transposed block has a window, so nothing is saved).

Per variant, :func:`benchmarks.kernels.measure` (medians of
``triton.testing.do_bench``): ``fwd_ms``, ``fwd_bwd_ms`` and ``peak_MB``, with
``bwd_ms`` their difference (autograd's host time included); and the GPU time of
each kernel of one step (:func:`benchmarks.profile_backward.profile_step`, median
over its steps, an L2 flush before each), as ``kernels_us``.

Usage, from the repository root (a CUDA GPU and the compiled extension)::

    python -m benchmarks.dense_backward --out DIR [--graphs PATTERN,...] [--shapes 1x128,...]

``--device cpu --tiny`` runs the same path on two-graph batches with the
reference ops and a wall clock: a check of the script, whose times say nothing
about the kernels. Writes ``DIR/dense_backward.json`` (``info``: GPU, torch,
date, command), rewritten after every case, and prints a table.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks import half_precision, kernels, profile_backward

#: The batch graphs (:data:`benchmarks.half_precision.BATCH_GRAPHS`) whose forward
#: runs dense tiles.
GRAPHS = ("PATTERN", "CLUSTER", "MNIST")
#: Variant -> the plan overrides it runs under.
VARIANTS = {"sparse": {"dense_backward": False},
            "dense_saved": {"dense_backward": True, "save_weights": True},
            "dense": {"dense_backward": True}}
SHAPES = ("1x128", "2x64", "4x32")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
def run_variant(lay, n: int, H: int, C: int, dtype, variant: str, device, timer,
                profile: bool) -> dict:
    """One variant's times (and kernel table on CUDA) of the GT op on ``lay``."""
    from pyg_dfgnn.ops import plan
    res = {"variant": variant}
    with plan.override(**VARIANTS[variant]):
        if device != "cpu":
            p = plan.plan_for(lay, dtype, C)
            res["plan"] = {"dense_backward": p.dense_backward, "save_weights": p.save_weights}
        f, g, leaves = profile_backward.make_case("gt", lay, n, dtype, device, H, C)
        res.update(kernels.measure(f, g, leaves, timer=timer))
        if isinstance(res.get("fwd_ms"), float) and isinstance(res.get("fwd_bwd_ms"), float):
            res["bwd_ms"] = res["fwd_bwd_ms"] - res["fwd_ms"]
        if profile and device != "cpu" and res["status"] == "ok":
            def step():
                for t in leaves:
                    t.grad = None
                torch.autograd.backward(f(), g)
            prof = profile_backward.profile_step(step)
            res["kernels_us"] = {k["short"]: k["us"] for k in prof["kernels"]}
    return res


def table(rows) -> str:
    """Markdown: one line per case, each variant's backward ms and its kernels."""
    out = ["| graph | shape | dtype | fwd ms | " + " | ".join(
        f"{v} bwd ms" for v in VARIANTS) + " | dense kernels (us) |", "|---" * (5 + len(VARIANTS))
        + "|"]
    for r in rows:
        by = {v["variant"]: v for v in r["variants"]}

        def ms(v, key="bwd_ms"):
            x = by.get(v, {}).get(key)
            return f"{x:.3f}" if isinstance(x, float) else "-"
        ks = by.get("dense", {}).get("kernels_us", {})
        kern = ", ".join(f"{k} {u:.0f}" for k, u in ks.items() if "bwd" in k or "fwd" in k)
        out.append(f"| {r['graph']} | {r['shape']} | {r['dtype']} | {ms('dense', 'fwd_ms')} | "
                   + " | ".join(ms(v) for v in VARIANTS) + f" | {kern} |")
    return "\n".join(out)


def parse_args(argv=None):
    from benchmarks import cli
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dense_backward",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (dense_backward.json)")
    ap.add_argument("--graphs", default=",".join(GRAPHS),
                    help=f"comma-separated subset of {','.join(GRAPHS)}")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    type=lambda s: [profile_backward._shape(x) for x in s.split(",") if x],
                    help="comma-separated heads x channels, C in 32, 64, 128")
    ap.add_argument("--dtypes", default="bf16",
                    help=f"comma-separated subset of {','.join(DTYPES)}")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: only with --tiny, a check of the script")
    ap.add_argument("--tiny", action="store_true",
                    help="two-graph batches (a check of the script, with --device cpu)")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-kernel times")
    ap.add_argument("--rep-ms", type=float, default=kernels.REPEATS[1],
                    help="do_bench repetition time per measurement (ms)")
    args = ap.parse_args(argv)
    for name, known in (("graphs", GRAPHS), ("dtypes", DTYPES), ("variants", VARIANTS)):
        setattr(args, name, half_precision._names(ap, getattr(args, name), known, name))
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if cuda:
        from benchmarks import cli
        cli.require_kernels("benchmarks.dense_backward",
                            "--device cpu --tiny runs it on tiny graphs, a check of the script")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "dense_backward.json"
    info = {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": "python -m benchmarks.dense_backward " + shlex.join(argv),
            "tiny": args.tiny, "rep_ms": args.rep_ms}
    doc = {"info": info, "graphs": {}, "rows": []}

    def timer(fn):
        if cuda:
            return kernels.bench(fn, rep_ms=args.rep_ms)
        return profile_backward.wall_timer(fn, 1)

    for name in args.graphs:
        # half_precision's graphs: 1,024-graph batches (--tiny: 2), the CSC built
        g = half_precision.Graph(name, None, args.device, args.tiny)
        lay, n = g.layout, g.n
        doc["graphs"][name] = g.info()
        for H, C in args.shapes:
            for dt in args.dtypes:
                row = {"graph": name, "shape": f"{H}x{C}", "dtype": dt, "variants": []}
                doc["rows"].append(row)
                for variant in args.variants:
                    row["variants"].append(run_variant(lay, n, H, C, DTYPES[dt], variant,
                                                       args.device, timer,
                                                       not args.no_profile))
                path.write_text(json.dumps(doc, indent=1))
                print(f"# {name} {H}x{C} {dt}: " + ", ".join(
                    f"{v['variant']} {v.get('bwd_ms', v.get('error'))}"
                    for v in row["variants"]), file=sys.stderr)
    print(table(doc["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
