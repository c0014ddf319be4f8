r"""Command line of pyg_dfgnn: ``python -m pyg_dfgnn <command> ...`` or ``pyg-dfgnn <command> ...``.

Commands:

* ``train``: train a 2-layer attention GNN (TransformerConv, GATConv or
  AGNNConv) on Cora with PyG's native convs and with the fused ones, and compare
  accuracy and epoch time (:mod:`pyg_dfgnn.train`, same as ``examples/train.py``).
* ``bench``: run the kernel benchmarks (``benchmarks/kernels.py`` of a source
  checkout).
* ``info``: versions, whether the CUDA extension is loaded, and the GPU.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Optional, Sequence

PROG = "python -m pyg_dfgnn"
BENCH_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels.py"

_COMMANDS = {
    "train": "train an attention GNN on Cora, native PyG convs vs. fused pyg_dfgnn convs",
    "bench": "run the fused-kernel benchmarks (benchmarks/kernels.py, needs a source checkout)",
    "info": "show versions, whether the CUDA kernels are available, and the device",
}


def _train(argv: Sequence[str]) -> int:
    from .train import cli
    return cli(list(argv), prog=f"{PROG} train")


def _bench(argv: Sequence[str]) -> int:
    if not BENCH_SCRIPT.is_file():
        print(f"{PROG} bench: no benchmark script at {BENCH_SCRIPT}.\n"
              "The benchmarks ship with the source repository, not with the installed "
              "package: run this from a source checkout (pip install -e .).", file=sys.stderr)
        return 2
    old_argv = sys.argv
    sys.argv = [str(BENCH_SCRIPT), *argv]
    try:
        runpy.run_path(str(BENCH_SCRIPT), run_name="__main__")
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
