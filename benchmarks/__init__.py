"""Benchmarks, dataset loaders and graph generators of the pyg_dfgnn repository.

Not part of the installed package: run from the repository root, e.g.
``python -m benchmarks.kernels --help`` (needs a CUDA GPU).
"""
import warnings

# PyG's import scripts a few classes with torch.jit.script, which recent torch
# deprecates with a FutureWarning. It is PyG's to fix and says nothing about these
# scripts, so their runs do not show it; the examples import this package before
# torch_geometric for the same reason.
warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated",
                        category=FutureWarning)
