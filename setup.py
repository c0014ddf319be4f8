"""Builds ``pyg_dfgnn._C``.

A ``CUDAExtension`` when torch was built with CUDA and a CUDA toolkit is found
(or ``FORCE_CUDA=1``); otherwise the package installs without the extension and
every op runs through the pure-PyTorch reference (``pyg_dfgnn.ops.reference``).
Install with ``pip install --no-build-isolation .`` so the build uses the torch
already installed (isolation would pull another one).
"""
import glob
import os

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _extensions():
    if os.environ.get("PYG_DFGNN_NO_EXT", "0") == "1":
        return [], {}
    import torch
    from torch.utils import cpp_extension

    force = os.environ.get("FORCE_CUDA", "0") == "1"
    if not (force or (torch.version.cuda and cpp_extension.CUDA_HOME)):
        print("pyg_dfgnn: no CUDA toolkit/torch CUDA build: installing the reference (CPU) path only")
        return [], {}
    # cuda/ holds the torch glue (glue/), host code (host/), device building blocks
    # (device/, headers only) and one file per kernel family (kernels/).
    srcs = sorted(glob.glob(os.path.join("cuda", "**", "*.cu"), recursive=True)) + \
        sorted(glob.glob(os.path.join("cuda", "**", "*.cpp"), recursive=True))
    nvcc = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    if os.environ.get("PYG_DFGNN_PTXAS_VERBOSE") == "1":
        nvcc.append("-Xptxas=-v")
    ext = cpp_extension.CUDAExtension(
        name="pyg_dfgnn._C",
        sources=srcs,
        include_dirs=[os.path.join(ROOT, "cuda")],
        extra_compile_args={"cxx": ["-O3"], "nvcc": nvcc},
    )
    return [ext], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
