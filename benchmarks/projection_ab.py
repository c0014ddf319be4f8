r"""A/B of ``FusedTransformerConv``'s projections: one fused GT layer's forward and
forward + backward with the query / key / value / skip projections run

* ``separate``: ``fused_projection=False``, one ``F.linear`` (and its backward's two
  GEMMs) per projection;
* ``joined``: ``fused_projection=True``, the layer's path (``_Projections``): a GEMM
  per projection forward, one input and one weight GEMM over the joined gradients
  backward;
* ``joined-fwd``: one forward GEMM over the concatenated weights whose output is
  split into column views (copied to contiguous rows for the kernels), autograd's
  own backward (it concatenates the gradients for the split): the layer's
  ``_joined_linear`` replaced by :func:`joined_forward_gemm` for the variant.

Cases (:class:`benchmarks.layers.Case`): GT layers of ``--in-channels`` (128) inputs
and ``--heads-channels`` (1x128) on ``--graphs`` (PATTERN, ogbn-arxiv; loaded by
:func:`benchmarks.layers.load_graph`), ``x`` requiring a gradient, fp32 and bf16
(``torch.autocast``, fp32 parameters). Each variant is timed as
:func:`benchmarks.kernels.bench` (median ms, CUDA events): ``fwd_ms`` a forward that
autograd records (the projections join only then; the graph is freed unused) and
``fwd_bwd_ms`` forward + backward of a fixed output gradient, the leaves' gradients
set to ``None`` first; the variants of a case interleave over ``--rounds`` rounds
(medians reported), so drift hits them alike. Each variant's output and input
gradient are compared with ``separate``'s (``rel_err``, ``grad_rel_err``); a failing
case or variant is recorded (``error``) and the run goes on. TF32 is off.
About 30 s on an H100 with the defaults, most of it loading ogbn-arxiv.

Usage, from the repository root::

    python -m benchmarks.projection_ab --out out/projection_ab.json
    python -m benchmarks.projection_ab --quick --device cpu --out q.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from benchmarks import kernels, layers, profile_backward
from pyg_dfgnn.nn._projections import joined_gemm

GRAPHS = ("PATTERN", "ogbn-arxiv")
VARIANTS = ("separate", "joined", "joined-fwd")


def joined_forward_gemm(x: Tensor, weights: List[Tensor], biases: List[Optional[Tensor]],
                        rows: Optional[int] = None) -> Sequence[Tensor]:
    """The ``joined-fwd`` variant's projections: one ``F.linear`` over the
    concatenated weights, split into column views of the product (the layer's
    compiled path, :func:`pyg_dfgnn.nn._projections.joined_gemm`, run eagerly;
    every row: ``rows``, the layer's query prefix, is ignored)."""
    return joined_gemm(x, weights, biases)


class Variant:
    """Sets the fused layer up for one variant while in a ``with`` block."""

    def __init__(self, layer, name: str):
        from pyg_dfgnn.nn import transformer_conv
        self.layer, self.name, self.module = layer, name, transformer_conv
        self.saved = transformer_conv._joined_linear

    def __enter__(self):
        self.layer.fused_projection = self.name != "separate"
        if self.name == "joined-fwd":
            self.module._joined_linear = joined_forward_gemm
        return self

    def __exit__(self, *exc):
        self.module._joined_linear = self.saved
        self.layer.fused_projection = True
        return False


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.projection_ab",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="projection_ab.json")
    ap.add_argument("--graphs", default=",".join(GRAPHS),
                    help=f"comma-separated, of {','.join(layers.GRAPHS)}")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32,bf16")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--heads-channels", default="1x128", help="comma-separated HxC")
    ap.add_argument("--in-channels", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--data", default=None, help="data folder of the real graphs")
    ap.add_argument("--quick", action="store_true",
                    help="small generated graphs, short repeats, one round (tests)")
    args = ap.parse_args(argv)
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for name, given, known in (("graph", args.graphs, layers.GRAPHS),
                               ("dtype", args.dtypes, tuple(layers.DTYPES)),
                               ("variant", args.variants, VARIANTS)):
        unknown = set(given.split(",")) - set(known)
        if unknown:
            ap.error(f"unknown {name}(s) {sorted(unknown)}; expected {','.join(known)}")
    if args.quick:
        args.rounds = 1
    return args


def check(case: layers.Case, layer, variants) -> dict:
    """``{variant: {rel_err, grad_rel_err}}`` of the output and ``x``'s gradient
    against ``separate``'s (``status`` ``mismatch`` above the dtype's
    :data:`benchmarks.layers.TOLERANCE`), or ``{error}``."""
    res, ref = {}, None
    tol = layers.TOLERANCE[case.dtype]
    for name in ["separate"] + [v for v in variants if v != "separate"]:
        try:
            with Variant(layer, name):
                case.x.grad = None
                out = case.call(layer)
                out.backward(case.g.to(out.dtype))
            got = (out.detach(), case.x.grad)
            case.x.grad = None
            if name == "separate":
                ref = got
            d = res[name] = {"status": "ok"}
            if ref is not None:
                d["rel_err"] = layers.rel_err(got[0], ref[0])
                d["grad_rel_err"] = layers.rel_err(got[1], ref[1])
                if not max(d["rel_err"], d["grad_rel_err"]) <= tol:
                    d["status"] = "mismatch"
        except Exception as e:  # noqa: BLE001  (recorded, the others still run)
            res[name] = {"status": "error", "error": kernels._first_line(e)}
    for p in layer.parameters():
        p.grad = None
    return {v: res[v] for v in variants}


def time_case(case: layers.Case, variants, timer, rounds: int) -> dict:
    """``{variant: {fwd_ms, fwd_bwd_ms, peak_MB, ...}}`` of one case."""
    layer = case.layers["fused"]
    res = check(case, layer, variants)
    leaves = case.leaves("fused")
    g = None
    times = {v: {"fwd_ms": [], "fwd_bwd_ms": []} for v in variants}
    for _ in range(rounds):
        for name in variants:
            if "error" in res.get(name, {}):
                continue
            try:
                with Variant(layer, name):
                    if g is None:
                        with torch.no_grad():
                            g = case.g.to(case.call(layer).dtype)

                    def fwd():
                        case.call(layer)

                    def fwd_bwd():
                        for t in leaves:
                            t.grad = None
                        case.call(layer).backward(g)
                    times[name]["fwd_ms"].append(timer(fwd))
                    times[name]["fwd_bwd_ms"].append(timer(fwd_bwd))
                    if case.x.is_cuda and "peak_MB" not in res[name]:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                        fwd_bwd()
                        torch.cuda.synchronize()
                        res[name]["peak_MB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            except Exception as e:  # noqa: BLE001
                res[name].update(status="error", error=kernels._first_line(e))
                kernels._free_cache(leaves)
    for t in leaves:
        t.grad = None
    for name, d in times.items():
        for key, vals in d.items():
            if vals and "error" not in res[name]:
                res[name][key] = statistics.median(vals)
                res[name][key + "_rounds"] = vals
    return res


def fmt_table(rows) -> str:
    head = ["graph", "dtype", "HxC"] + [f"{v} {k}" for v in VARIANTS for k in ("fwd", "f+b")]
    lines = [" | ".join(head)]
    for r in rows:
        cells = [r["graph"], r["dtype"], r["HxC"]]
        for v in VARIANTS:
            d = r.get("variants", {}).get(v, {})
            for k in ("fwd_ms", "fwd_bwd_ms"):
                cells.append(f"{d[k]:.3f}" if k in d else ("err" if "error" in d else "-"))
        if "error" in r:
            cells.append("error: " + r["error"])
        sp = r.get("speedup_vs_separate", {})
        cells += [f"{v} {k} {x:.2f}x" for v, d in sp.items() for k, x in d.items()]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def speedups(variants: dict) -> dict:
    """``{variant: {fwd, fwd_bwd}}``: separate's time / the variant's."""
    base = variants.get("separate", {})
    out = {}
    for v, d in variants.items():
        if v == "separate":
            continue
        out[v] = {k[:-3]: base[k] / d[k] for k in ("fwd_ms", "fwd_bwd_ms")
                  if k in base and k in d and d[k] > 0}
    return out


def main(argv=None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    cuda = args.device.type == "cuda"
    reps = layers.QUICK_REPEATS if args.quick else layers.REPEATS
    if cuda:
        def timer(fn):
            return kernels.bench(fn, *reps)
    else:
        def timer(fn):
            return profile_backward.wall_timer(fn, layers.CPU_REPEATS)
    info = {"device": torch.cuda.get_device_name(args.device) if cuda else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d"), "quick": args.quick, "rounds": args.rounds,
            "repeats_ms": list(reps) if cuda else None, **kernels.set_matmul_precision(False),
            "in_channels": args.in_channels, "x_requires_grad": True}
    largs = layers.parse_args(["--device", str(args.device), "--in-channels",
                               str(args.in_channels)])
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    data = args.data or profile_backward.default_data()
    configs = [tuple(int(v) for v in hc.split("x")) for hc in args.heads_channels.split(",")]
    rows = []

    def save():
        with open(args.out, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)

    for gname in args.graphs.split(","):
        t0 = time.perf_counter()
        try:
            graph = layers.load_graph(gname, args.device, args.quick, data)
            gerr = None
        except Exception as e:  # noqa: BLE001  (missing data, say: recorded per row)
            graph, gerr = None, kernels._first_line(e)
        print(f"# {gname} loaded ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        for H, C in configs:
            for dtype in args.dtypes.split(","):
                row = {"graph": gname, "dtype": dtype, "HxC": f"{H}x{C}", "variants": {}}
                rows.append(row)
                if graph is None:
                    row["error"] = f"graph not loaded: {gerr}"
                    save()
                    continue
                row.update(nodes=graph.num_nodes, edges=int(graph.edge_index.size(1)))
                t0 = time.perf_counter()
                try:
                    case = layers.Case(graph, "gt", H, C, dtype, largs)
                    if case.fused_reason:
                        raise RuntimeError(f"fused layer falls back: {case.fused_reason}")
                    row["variants"] = time_case(case, variants, timer, args.rounds)
                    row["speedup_vs_separate"] = speedups(row["variants"])
                except Exception as e:  # noqa: BLE001  (recorded; the other cases still run)
                    row["error"] = kernels._first_line(e)
                case = None
                if cuda:
                    torch.cuda.empty_cache()
                save()
                print(f"# {gname} {dtype} {H}x{C} ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
    save()
    print(f"# {info}")
    print(fmt_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
