r"""Command line of pyg_dfgnn: ``python -m pyg_dfgnn info`` or ``pyg-dfgnn info``.

``info`` prints the versions, whether the compiled extension loaded (and why
not), and the GPU: what decides whether the fused layers run CUDA kernels or the
pure-PyTorch reference path here.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

PROG = "python -m pyg_dfgnn"


def _extension_line() -> str:
    from pyg_dfgnn import extension

    if not extension.HAS_EXTENSION:
        return extension.missing_reason()
    record = extension.build_info()
    if not record.get("torch"):
        return "loaded (the library holds no build record: rebuilt by another tool?)"
    line = (f"loaded: built against torch {record['torch']}, CUDA {record['cuda']}, for "
            f"{', '.join(record['arch'])}")
    mismatch = extension.torch_mismatch(record)
    return f"{line}\n                 {mismatch}" if mismatch else line


def info() -> int:
    r"""Prints versions, the extension's state and the GPU; returns 0."""
    import torch
    import torch_geometric

    import pyg_dfgnn
    from pyg_dfgnn import extension

    print(f"pyg_dfgnn        {pyg_dfgnn.__version__} ({Path(pyg_dfgnn.__file__).parent})")
    print(f"torch            {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    print(f"torch_geometric  {torch_geometric.__version__}")
    print(f"extension _C     {_extension_line()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"GPU              {p.name} (sm_{p.major}{p.minor})")
    else:
        print("GPU              none")
    if pyg_dfgnn.has_cuda_kernels():
        print("fused kernels    yes")
    elif extension.HAS_EXTENSION:
        print("fused kernels    no GPU: the fused layers run the pure-PyTorch reference path")
    else:
        print("fused kernels    no: on CUDA tensors the fused layers run PyG's own forward, "
              "on the CPU the pure-PyTorch reference path; README, 'Troubleshooting the "
              "build', says how to build the kernels")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    r"""Entry point of ``python -m pyg_dfgnn`` and of the ``pyg-dfgnn`` script."""
    # The layers register themselves in FUSED as pyg_dfgnn.nn imports them; the
    # package's own import (torch, PyG) has run already, this adds milliseconds.
    from pyg_dfgnn.nn import FUSED

    layers = ", ".join(sorted(cls.__name__ for cls in FUSED.values()))
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="pyg_dfgnn: fused attention kernels (DF-GNN: SDDMM -> edge softmax -> SpMM "
                    f"in one kernel) behind drop-in PyTorch Geometric layers ({layers}).",
        epilog="The training example and the benchmarks are scripts of the source "
               "repository: python examples/train.py --help, python -m benchmarks.kernels "
               "--help.")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    sub.add_parser("info", help="show versions, whether the CUDA kernels are available, "
                                "and the GPU")
    parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    return info()


if __name__ == "__main__":
    sys.exit(main())
