r"""Command line of pyg_dfgnn: ``python -m pyg_dfgnn <command> ...`` or ``pyg-dfgnn <command> ...``.

Commands:

* ``train``: train a 2-layer attention GNN (TransformerConv, GATConv or
  AGNNConv) on Cora with PyG's native convs and with the fused ones, and compare
  accuracy and epoch time (:mod:`pyg_dfgnn.train`, same as ``examples/train.py``).
* ``bench``: run a benchmark script of a source checkout: ``bench kernels``
  (``benchmarks/kernels.py``, the default), ``bench e2e`` (``benchmarks/e2e.py``,
  end-to-end training steps, native PyG vs. fused, eager and as captured CUDA
  graphs) or ``bench plot``
  (``benchmarks/plot.py``, PNG charts of their JSON).
* ``info``: versions, whether the CUDA extension is loaded, and the GPU.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Optional, Sequence

PROG = "python -m pyg_dfgnn"
BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
BENCH_SCRIPT = BENCH_DIR / "kernels.py"  # the default benchmark

_COMMANDS = {
    "train": "train an attention GNN on Cora, native PyG convs vs. fused pyg_dfgnn convs",
    "bench": "run a benchmark: kernels (default), e2e (training steps) or plot (PNG charts); "
             "needs a source checkout",
    "info": "show versions, whether the CUDA kernels are available, and the device",
}

#: ``bench`` sub-benchmarks: name -> (script, one-line description).
_BENCHES = {
    "kernels": ("kernels.py", "fused attention op vs. native PyG message passing, forward and "
                              "forward+backward per graph (GPU only)"),
    "e2e": ("e2e.py", "end-to-end training step (preprocess / forward / backward / optimizer), "
                      "GT, GAT and AGNN models, native PyG vs. fused, plus loss and accuracy; "
                      "on CUDA also each full-graph step replayed as a captured CUDA graph "
                      "(--mode)"),
    "plot": ("plot.py", "PNG bar charts of the kernels / e2e JSON results (matplotlib)"),
}


def _train(argv: Sequence[str]) -> int:
    from .train import cli
    return cli(list(argv), prog=f"{PROG} train")


def _bench_help() -> str:
    lines = [f"usage: {PROG} bench [kernels|e2e|plot] [options of the script]", "",
             "Runs a benchmark script of the source checkout (benchmarks/). Without a name, "
             "'kernels' runs.", "", "benchmarks:"]
    lines += [f"  {k:<8} {desc}" for k, (_, desc) in _BENCHES.items()]
    lines += ["", "examples:",
              f"  {PROG} bench --quick                     # kernels, small graphs",
              f"  {PROG} bench e2e --quick --out e2e.json  # training steps, CPU-friendly",
              f"  {PROG} bench plot --kernels kernels.json --e2e e2e.json --out-dir plots",
              "", f"Run '{PROG} bench <name> --help' for the options of a benchmark."]
    return "\n".join(lines)


def _bench(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_bench_help())
        return 0
    if argv and argv[0] in _BENCHES:
        name = argv.pop(0)
    else:
        name = "kernels"
    script = BENCH_SCRIPT if name == "kernels" else BENCH_DIR / _BENCHES[name][0]
    if not script.is_file():
        print(f"{PROG} bench: no benchmark script at {script}.\n"
              "The benchmarks ship with the source repository, not with the installed "
              "package: run this from a source checkout (pip install -e .).", file=sys.stderr)
        return 2
    old_argv = sys.argv
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:  # the script's own sys.exit(...)
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = old_argv
    return 0


def _info(argv: Sequence[str]) -> int:
    argparse.ArgumentParser(prog=f"{PROG} info", description=_COMMANDS["info"]).parse_args(argv)
    import torch
    import torch_geometric

    import pyg_dfgnn

    print(f"pyg_dfgnn        {pyg_dfgnn.__version__} ({Path(pyg_dfgnn.__file__).parent})")
    print(f"torch            {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    print(f"torch_geometric  {torch_geometric.__version__}")
    err = pyg_dfgnn.load_error()
    loaded = pyg_dfgnn._ext.HAS_EXTENSION
    print("extension _C     " + ("loaded" if loaded else f"not loaded ({err})"))
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"GPU              {p.name} (sm_{p.major}{p.minor})")
    else:
        print("GPU              none (the fused layers run the pure-PyTorch reference path)")
    print("fused kernels    " + ("yes" if pyg_dfgnn.has_cuda_kernels() else "no"))
    from . import datasets
    where = datasets.data_dir() or f"none (PyG downloads to {datasets.cache_dir()})"
    print(f"data folder      {where}")
    return 0


_HANDLERS = {"train": _train, "bench": _bench, "info": _info}


def main(argv: Optional[Sequence[str]] = None) -> int:
    r"""Entry point of ``python -m pyg_dfgnn`` and of the ``pyg-dfgnn`` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="pyg_dfgnn: fused attention kernels (DF-GNN: SDDMM -> edge softmax -> SpMM "
                    "in one kernel) behind drop-in PyTorch Geometric layers "
                    "(FusedTransformerConv, FusedGATConv, FusedAGNNConv).",
        epilog="commands:\n" + "\n".join(f"  {k:<7} {v}" for k, v in _COMMANDS.items())
               + f"\n\nRun '{PROG} <command> --help' for the options of a command, e.g.\n"
               f"  {PROG} train --model gat --epochs 200",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=sorted(_COMMANDS), metavar="command",
                        help="one of: " + ", ".join(_COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="options of the command (see '<command> --help')")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    ns = parser.parse_args(argv[:1])
    return _HANDLERS[ns.command](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
