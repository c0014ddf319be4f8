"""Benchmarks, dataset loaders and graph generators of the pyg_dfgnn repository.

Not part of the installed package: run from the repository root, e.g.
``python -m benchmarks.kernels --help`` (needs a CUDA GPU).
"""
