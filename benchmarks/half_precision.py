r"""Half-precision training at op level: the fused forward and backward in fp32, bf16
and fp16 against FlexAttention, with a roofline line per configuration (issue 50's
record).

For each graph, layer and dtype, on one GPU, the fused attention op
(:func:`benchmarks.profile_backward.make_case`: the op's inputs as leaves that
require grad, drawn from seed 0) is timed by :func:`benchmarks.kernels.measure`
(medians of ``triton.testing.do_bench``):

* ``fwd_ms``: the forward under ``no_grad``;
* ``fused_fwd_bwd_ms``: a training step's forward + backward of a random output
  gradient, the leaves' gradients reset to ``None`` first; ``peak_MB`` its peak
  extra memory;
* ``bwd_ms``: their difference (autograd's host time included).

Graphs (:data:`GRAPHS`): the batches of 1,024 generated PATTERN, CLUSTER, MNIST,
CIFAR10 and COCO-SP-like graphs (:func:`benchmarks.generators.sbm_batch`,
:func:`~benchmarks.generators.knn_batch`, as :mod:`benchmarks.kernels` builds
them) and the power-law graphs GitHub, Reddit-like and ogbn-arxiv (loaded as
:mod:`benchmarks.profile_backward` loads them; real graphs from ``--data``, by
default ``$PYG_DFGNN_DATA``, else a PyG download). Layers (:data:`LAYERS`): the
dot score (``TransformerConv``) at 1 x 128 and 4 x 32, the additive (``GATConv``),
GATv2 (``GATv2Conv``) and cosine (``AGNNConv``) scores at 4 x 32. Dtypes: fp32
(TF32 off), bf16, fp16.

``flex_fwd_bwd_ms``: FlexAttention's forward + backward on the same inputs, in the
same run (:func:`benchmarks.kernels.run_flex`: compiled, a block mask from the
graph, checked against float64 before timing; the fastest of ``--flex-forms``),
for the dot rows of the batch graphs in ``--flex-dtypes``. It is ``null`` where a
mask cannot express the op (another score, a graph that is not a batch, duplicate
edges), and the row's ``flex`` block says why. FlexAttention compiles per shape
(about 20-40 s each), so its cases run after every fused row (a compile running
before an eager measurement slowed host-bound steps:
:func:`benchmarks.kernels.phases`), bf16 only by default, and a case that would
end past ``--time-limit-s`` is skipped (``status: "skipped"``).

``roofline``: the bytes any implementation of the op must move in the forward and
in the backward (:func:`benchmarks.profile_backward.op_bytes`), the run's measured
device-to-device copy bandwidth (:func:`benchmarks.kernels.copy_bandwidth`), the
bandwidth each phase reaches and its fraction of the copy's (``fwd_of_copy``,
``bwd_of_copy``). Ratios where both sides exist: ``bwd_over_fwd``,
``bf16_over_fp32`` / ``fp16_over_fp32`` (the fp32 row's fwd+bwd over this row's)
and ``flex_over_fused`` (FlexAttention's fwd+bwd over ours).

A row whose run fails keeps its error (``status: "error"``) and ``null`` timings;
the run goes on. ``DIR/half_precision.json`` is rewritten after every row, so a run
cut short keeps what finished.

Usage, from the repository root (a CUDA GPU and the compiled extension)::

    python -m benchmarks.half_precision --out DIR [--graphs PATTERN,...]
        [--layers dot-1x128,...] [--dtypes fp32,bf16,fp16] [--quick]

``--quick``: PATTERN and GitHub, dot 1 x 128 and GATv2 4 x 32, bf16 and fp32.
``--device cpu --tiny`` runs the same path on tiny generated graphs on the CPU
(the reference ops, wall-clock timing; FlexAttention has no CPU backward): a
check of the script, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks import flex, generators, kernels, profile_backward
from pyg_dfgnn import ops

#: Graphs in run order: the batches, then the power-law graphs.
BATCH_GRAPHS = {"PATTERN": "pattern", "CLUSTER": "cluster", "MNIST": "mnist",
                "CIFAR10": "cifar10", "COCO-SP-like": "coco_sp"}
GRAPHS = tuple(BATCH_GRAPHS) + ("GitHub", "Reddit-like", "ogbn-arxiv")
#: Layer -> ``(score, model of profile_backward.make_case, PyG layer, H, C)``.
LAYERS = {"dot-1x128": ("dot", "gt", "TransformerConv", 1, 128),
          "dot-4x32": ("dot", "gt", "TransformerConv", 4, 32),
          "additive-4x32": ("additive", "gat", "GATConv", 4, 32),
          "gatv2-4x32": ("gatv2", "gatv2", "GATv2Conv", 4, 32),
          "cosine-4x32": ("cosine", "agnn", "AGNNConv", 4, 32)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: ``--quick``'s subset.
QUICK = {"graphs": ("PATTERN", "GitHub"), "layers": ("dot-1x128", "gatv2-4x32"),
         "dtypes": ("fp32", "bf16")}
#: Graphs per batch (``--tiny``: per tiny batch).
BATCH, TINY_BATCH = 1024, 2
#: Timed wall-clock calls per measurement under ``--tiny`` (after one untimed call).
TINY_REPEATS = 1
#: Default ``--flex-forms`` and ``--flex-dtypes``.
FLEX_FORMS, FLEX_DTYPES = ("flex-seq",), ("bf16",)
#: Default ``--time-limit-s``, full and ``--quick`` (one H200 run: 9 and 3 minutes,
#: less the start).
TIME_LIMIT_S, QUICK_TIME_LIMIT_S = 500.0, 160.0
#: Seconds a FlexAttention case is assumed to take before one has (compiles, mask
#: build, float64 check, timing).
FLEX_CASE_S = 45.0
#: fp32 elements of the copy-bandwidth measurement (``--tiny``: fewer).
COPY_NUMEL, TINY_COPY_NUMEL = 2**28, 2**20
#: The timing keys of a row, ``null`` until measured.
TIMES = ("fwd_ms", "bwd_ms", "fused_fwd_bwd_ms", "flex_fwd_bwd_ms", "flex_fwd_ms", "peak_MB")
RATIOS = ("bwd_over_fwd", "bf16_over_fp32", "fp16_over_fp32", "flex_over_fused")


# ------------------------------------------------------------------- graphs
def load_graph(name: str, data, device, tiny: bool = False):
    """``(edge_index, num_nodes, batch vector or None)`` of one graph on ``device``;
    ``tiny``: :data:`TINY_BATCH`-graph batches, 300-node power-law graphs.

    Raises:
        ValueError: an unknown name.
    """
    if name in BATCH_GRAPHS:
        kind, nb = BATCH_GRAPHS[name], TINY_BATCH if tiny else BATCH
        if kind in ("pattern", "cluster"):
            ei, batch, _, _ = generators.sbm_batch(kind, nb, seed=0)
        else:
            ei, batch = generators.knn_batch(kind, nb, seed=0)
        return ei.to(device), batch.numel(), batch.to(device)
    if name not in GRAPHS:
        raise ValueError(f"unknown graph {name!r}; expected one of {GRAPHS}")
    ei, n = profile_backward.load_graph(name, data, device, tiny)
    return ei, n, None


class Graph:
    """One graph of the run: its edges, batch vector, layout (CSC built, as a cached
    layout's) and work counts."""

    def __init__(self, name: str, data, device, tiny: bool):
        from pyg_dfgnn.layout import GraphLayout
        self.name = name
        self.edge_index, self.n, self.batch = load_graph(name, data, device, tiny)
        self.layout = GraphLayout.from_edge_index(self.edge_index, (self.n, self.n))
        self.layout.colptr  # noqa: B018  (the CSC built before timing)
        self.work = profile_backward.work_counts(self.layout)

    def info(self) -> dict:
        lay = self.layout
        return {"kind": "batch" if self.batch is not None else "power-law", "nodes": self.n,
                "edges": lay.num_edges, "max_in_degree": lay.max_in_degree,
                "graphs": None if self.batch is None else int(self.batch.max()) + 1,
                **self.work}


# --------------------------------------------------------------------- rows
def new_row(graph: str, layer: str, dtype: str) -> dict:
    """A row with every key, timings ``null``."""
    score, _, conv, H, C = LAYERS[layer]
    return {"graph": graph, "layer": layer, "conv": conv, "score": score, "H": H, "C": C,
            "dtype": dtype, "status": "pending", "error": None, **dict.fromkeys(TIMES),
            **dict.fromkeys(RATIOS), "flex": None, "roofline": None}


def roofline(row: dict, g: Graph, copy_gbps) -> dict:
    """The row's ``roofline`` block: compulsory bytes (:func:`profile_backward.op_bytes`),
    the floors they set at the copy bandwidth, and what each phase reached."""
    score, _, _, H, C = LAYERS[row["layer"]]
    ob = profile_backward.op_bytes(score, g.n, g.n, g.layout.num_edges, H, C,
                                   DTYPES[row["dtype"]].itemsize, g.work["row_items"],
                                   g.work["col_items"])
    out = {"copy_GBps": copy_gbps}
    for ph, key in (("fwd", "fwd_ms"), ("bwd", "bwd_ms")):
        nbytes, ms = ob[ph]["bytes"], row[key]
        gbps = nbytes / (ms * 1e-3) / 1e9 if ms and ms > 0 else None
        out.update({f"{ph}_bytes": nbytes,
                    f"{ph}_floor_ms": nbytes / (copy_gbps * 1e9) * 1e3 if copy_gbps else None,
                    f"{ph}_GBps": gbps,
                    f"{ph}_of_copy": gbps / copy_gbps if gbps and copy_gbps else None})
    return out


def run_fused(row: dict, g: Graph, device, timer, copy_gbps) -> None:
    """Times the fused op of ``row`` on ``g`` into it (see the module doc); a failure
    is the row's ``error``."""
    _, model, _, H, C = LAYERS[row["layer"]]
    try:
        f, grad, leaves = profile_backward.make_case(model, g.layout, g.n, DTYPES[row["dtype"]],
                                                     device, H, C)
        res = kernels.measure(f, grad, leaves, timer=timer)
    except Exception as e:  # noqa: BLE001  (recorded: the other rows still run)
        res = {"status": "error", "error": kernels._first_line(e)}
    row["status"], row["error"] = res["status"], res.get("error")
    row["fwd_ms"], row["fused_fwd_bwd_ms"] = res.get("fwd_ms"), res.get("fwd_bwd_ms")
    row["peak_MB"] = res.get("peak_MB")
    if row["status"] == "ok":
        row["bwd_ms"] = row["fused_fwd_bwd_ms"] - row["fwd_ms"]
    row["roofline"] = roofline(row, g, copy_gbps)
    if not kernels.cuda_context_ok(device):
        row["cuda_context_lost"] = True


def flex_status(row: dict, g: Graph, forms, flex_dtypes) -> dict:
    """The row's ``flex`` block before any FlexAttention run: ``pending``, or why
    none runs (``not_applicable``: another score, not a batch, duplicate edges;
    ``not_run``: no ``--flex-forms``, or a dtype outside ``--flex-dtypes``)."""
    if row["score"] != "dot":
        return {"status": "not_applicable", "error": f"{row['score']} score: no mask form"}
    why = flex.not_applicable(g.edge_index, g.batch)
    if why is not None:
        return {"status": "not_applicable", "error": why}
    if not forms:
        return {"status": "not_run", "error": "no --flex-forms"}
    if row["dtype"] not in flex_dtypes:
        return {"status": "not_run", "error": "dtype not in --flex-dtypes"}
    return {"status": "pending"}


def run_flex(row: dict, g: Graph, device, forms) -> None:
    """FlexAttention (:func:`benchmarks.kernels.run_flex`, every form of ``forms``) on
    the row's inputs; ``flex_fwd_bwd_ms`` / ``flex_fwd_ms`` are the fastest form's."""
    _, model, _, H, C = LAYERS[row["layer"]]
    t0 = time.perf_counter()
    try:
        _, grad, (q, k, v) = profile_backward.make_case(model, g.layout, g.n,
                                                        DTYPES[row["dtype"]], device, H, C)
        res = kernels.run_flex(list(forms), g.edge_index, g.batch, g.layout, q, k, v, grad)
    except Exception as e:  # noqa: BLE001
        res = {form: {"status": "error", "error": kernels._first_line(e)} for form in forms}
    ok = {f: r for f, r in res.items()
          if r.get("status") == "ok" and isinstance(r.get("fwd_bwd_ms"), float)}
    best = min(ok, key=lambda f: ok[f]["fwd_bwd_ms"]) if ok else None
    first = next(iter(res.values()))
    row["flex"] = {"status": "ok" if best else first.get("status", "error"),
                   "error": None if best else first.get("error"), "form": best,
                   "wall_s": time.perf_counter() - t0, "forms": res}
    if best:
        row["flex_fwd_bwd_ms"] = ok[best]["fwd_bwd_ms"]
        row["flex_fwd_ms"] = ok[best].get("fwd_ms")


def derive(rows) -> None:
    """The ratios of every row (``null`` where a side is missing)."""
    def ratio(a, b):
        return a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else None
    fp32 = {(r["graph"], r["layer"]): r for r in rows if r["dtype"] == "fp32"}
    for r in rows:
        r["bwd_over_fwd"] = ratio(r["bwd_ms"], r["fwd_ms"])
        r["flex_over_fused"] = ratio(r["flex_fwd_bwd_ms"], r["fused_fwd_bwd_ms"])
        base = fp32.get((r["graph"], r["layer"]), {}).get("fused_fwd_bwd_ms")
        for half in ("bf16", "fp16"):
            r[f"{half}_over_fp32"] = (ratio(base, r["fused_fwd_bwd_ms"])
                                      if r["dtype"] == half else None)


def table(rows) -> str:
    """The rows as a plain-text table."""
    from benchmarks import cli

    def f(v, fmt="{:.3f}"):
        return fmt.format(v) if isinstance(v, float) else "-"
    out = [["graph", "layer", "dtype", "fwd ms", "bwd ms", "f+b ms", "bwd/fwd", "flex f+b",
            "flex/ours", "vs fp32", "fwd % copy", "bwd % copy", "status"]]
    for r in rows:
        rf = r["roofline"] or {}
        vs = r["bf16_over_fp32"] if r["dtype"] == "bf16" else r["fp16_over_fp32"]
        out.append([r["graph"], r["layer"], r["dtype"], f(r["fwd_ms"]), f(r["bwd_ms"]),
                    f(r["fused_fwd_bwd_ms"]), f(r["bwd_over_fwd"], "{:.1f}"),
                    f(r["flex_fwd_bwd_ms"]), f(r["flex_over_fused"], "{:.2f}"),
                    f(vs, "{:.2f}"), f(rf.get("fwd_of_copy"), "{:.0%}"),
                    f(rf.get("bwd_of_copy"), "{:.0%}"),
                    r["status"] + (f": {r['error']}" if r["error"] else "")])
    return cli.table(out)


# --------------------------------------------------------------------- main
def _names(ap, text: str, known, what: str):
    names = [s for s in text.split(",") if s]
    bad = [s for s in names if s not in known]
    if bad:
        ap.error(f"--{what}: unknown {bad}; known: {','.join(known)}")
    return names


def parse_args(argv=None):
    from benchmarks import cli, datasets
    ap = argparse.ArgumentParser(prog="python -m benchmarks.half_precision",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=cli.HelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (half_precision.json)")
    ap.add_argument("--graphs", default=None,
                    help=f"comma-separated subset of {','.join(GRAPHS)} (default: all; "
                         f"--quick: {','.join(QUICK['graphs'])})")
    ap.add_argument("--layers", default=None,
                    help=f"comma-separated subset of {','.join(LAYERS)} (default: all; "
                         f"--quick: {','.join(QUICK['layers'])})")
    ap.add_argument("--dtypes", default=None,
                    help=f"comma-separated subset of {','.join(DTYPES)} (default: all; "
                         f"--quick: {','.join(QUICK['dtypes'])})")
    ap.add_argument("--quick", action="store_true",
                    help="PATTERN and GitHub, dot 1x128 and GATv2 4x32, fp32 and bf16")
    ap.add_argument("--flex-forms", default=",".join(FLEX_FORMS),
                    help=f"FlexAttention forms, comma-separated subset of "
                         f"{','.join(flex.FORMS)}; empty: none")
    ap.add_argument("--flex-dtypes", default=",".join(FLEX_DTYPES),
                    help="dtypes whose dot rows on batch graphs run FlexAttention (each "
                         "shape compiles anew: about 20-40 s)")
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help=f"skip FlexAttention cases that would end past this many seconds "
                         f"of the run (default: {TIME_LIMIT_S:g}; --quick: "
                         f"{QUICK_TIME_LIMIT_S:g})")
    cli.add_override_argument(ap, "row (FlexAttention is not affected)")
    ap.add_argument("--rep-ms", type=float, default=kernels.REPEATS[1],
                    help="do_bench repetition time per measurement (ms)")
    datasets.add_data_argument(ap, "MUSAE/GitHub/ and ogbn-arxiv/")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: only with --tiny, a check of the script")
    ap.add_argument("--tiny", action="store_true",
                    help=f"{TINY_BATCH}-graph batches and 300-node power-law graphs in place "
                         "of the graphs (a check of the script, with --device cpu)")
    args = ap.parse_args(argv)
    for what in ("graphs", "layers", "dtypes"):
        text = getattr(args, what)
        default = QUICK[what] if args.quick else {"graphs": GRAPHS, "layers": LAYERS,
                                                   "dtypes": DTYPES}[what]
        known = {"graphs": GRAPHS, "layers": LAYERS, "dtypes": DTYPES}[what]
        setattr(args, what, _names(ap, text, known, what) if text is not None else list(default))
    args.overrides = cli.parse_overrides(ap, args.override)
    args.flex_forms = _names(ap, args.flex_forms, flex.FORMS, "flex-forms")
    args.flex_dtypes = _names(ap, args.flex_dtypes, DTYPES, "flex-dtypes")
    if args.time_limit_s is None:
        args.time_limit_s = QUICK_TIME_LIMIT_S if args.quick else TIME_LIMIT_S
    if args.device == "cpu" and not args.tiny:
        ap.error("--device cpu times the reference ops: only with --tiny, a check of the "
                 "script")
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t_start = time.perf_counter()
    if args.device == "cuda":
        from benchmarks import cli
        cli.require_kernels("benchmarks.half_precision",
                            "--device cpu --tiny runs it on tiny graphs, a check of the script")
    # run_flex and copy_bandwidth time on kernels' device, at this run's repetitions
    kernels.DEV = torch.device(args.device)
    kernels.REPEATS = (kernels.REPEATS[0], args.rep_ms)
    cuda = args.device == "cuda"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "half_precision.json"

    def timer(fn):
        if cuda:
            return kernels.bench(fn, rep_ms=args.rep_ms)
        return profile_backward.wall_timer(fn, TINY_REPEATS)

    copy_gbps = kernels.copy_bandwidth(TINY_COPY_NUMEL if args.tiny else COPY_NUMEL)
    info = {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": "python -m benchmarks.half_precision " + shlex.join(argv),
            "device": args.device, "tiny": args.tiny, "quick": args.quick,
            "rep_ms": args.rep_ms, **kernels.set_matmul_precision(False),
            "copy_GBps": copy_gbps, "flex_forms": args.flex_forms,
            "flex_dtypes": args.flex_dtypes, "time_limit_s": args.time_limit_s,
            "overrides": {k: repr(v) for k, v in args.overrides.items()}}
    doc = {"info": info, "graphs": {}, "rows": []}

    def save():
        derive(doc["rows"])
        info["wall_s"] = time.perf_counter() - t_start
        path.write_text(json.dumps(doc, indent=1))

    flex_cases = []
    for name in args.graphs:
        rows = [new_row(name, layer, dt) for layer in args.layers for dt in DTYPES
                if dt in args.dtypes]
        doc["rows"] += rows
        try:
            g = Graph(name, args.data, args.device, args.tiny)
            doc["graphs"][name] = g.info()
        except Exception as e:  # noqa: BLE001  (one graph failing leaves the others)
            doc["graphs"][name] = {"error": kernels._first_line(e)}
            for row in rows:
                row.update(status="error", error=f"graph: {kernels._first_line(e)}")
            save()
            continue
        for row in rows:
            with ops.plan.override(**args.overrides):
                run_fused(row, g, args.device, timer, copy_gbps)
            row["flex"] = flex_status(row, g, args.flex_forms, args.flex_dtypes)
            if row["flex"]["status"] == "pending":
                flex_cases.append((row, g))
            save()
            print(f"# {name} {row['layer']} {row['dtype']}: fwd {row['fwd_ms']} ms, "
                  f"f+b {row['fused_fwd_bwd_ms']} ms, {row['status']}", file=sys.stderr)
    # FlexAttention after every fused row: its compiles would slow what follows. One
    # layer on every graph before the next, so a time limit cuts the later layers.
    flex_cases.sort(key=lambda c: (list(LAYERS).index(c[0]["layer"]),
                                   list(DTYPES).index(c[0]["dtype"])))
    longest = FLEX_CASE_S
    for row, g in flex_cases:
        if time.perf_counter() - t_start + longest > args.time_limit_s:
            row["flex"] = {"status": "skipped",
                           "error": f"would end past --time-limit-s {args.time_limit_s:g}"}
        else:
            run_flex(row, g, args.device, args.flex_forms)
            longest = max(longest, row["flex"]["wall_s"])
        save()
        print(f"# {row['graph']} {row['layer']} {row['dtype']} FlexAttention: "
              f"{row['flex_fwd_bwd_ms']} ms, {row['flex']['status']}", file=sys.stderr)
    save()
    print(table(doc["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
