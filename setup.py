"""Builds ``pyg_dfgnn._C`` where it can; elsewhere installs the pure-PyTorch path.

The extension is built when torch is a CUDA build, a CUDA toolkit with its headers
is found and an architecture list is known: ``TORCH_CUDA_ARCH_LIST``, else the
visible GPUs' compute capabilities. Without a GPU and without
``TORCH_CUDA_ARCH_LIST`` the extension is not built, unless ``FORCE_CUDA=1``: then
it is built for the architectures torch was built for that the toolkit supports.
Otherwise the package installs without it and says why in one line (shown by
``pip install -v``) and in ``pyg_dfgnn/_build_info.json``, stamped with the torch
version and environment prefix it was made for, which ``python -m pyg_dfgnn info``
reads. A built extension carries its own record (``cuda/glue/build_record.cu``).

* ``FORCE_CUDA=1``: a build that cannot compile the extension fails with the reason.
* ``PYG_DFGNN_NO_EXT=1``: installs without the extension, without looking.
* ``CUDA_HOME`` (or ``CUDA_PATH``): the toolkit root; otherwise the toolkit of the
  ``nvcc`` on ``PATH`` (asked where it lives, so wrapper scripts work), then
  ``/usr/local/cuda`` and ``/usr/local/cuda-*``.
* ``PYG_DFGNN_PTXAS_VERBOSE=1``: ptxas prints each kernel's registers and spills.

Install with ``pip install --no-build-isolation .`` so the build uses the torch
already installed (isolation would pull another one).
"""
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_INFO = os.path.join(ROOT, "pyg_dfgnn", "_build_info.json")
# bf16 mma.sync of the tensor-core kernels (cuda/device/mma.cuh) needs sm_80.
MIN_ARCH = (8, 0)
HOW = ("FORCE_CUDA=1 makes this an error, PYG_DFGNN_NO_EXT=1 skips the extension; "
       "see README, 'Troubleshooting the build'")


class NoExtension(Exception):
    """The extension cannot be built here; the message says why."""


def _flag(name):
    return os.environ.get(name, "0") == "1"


def _has_runtime_header(home):
    return bool(home) and os.path.isfile(os.path.join(home, "include", "cuda_runtime.h"))


def _nvcc_top(nvcc):
    """The toolkit root that ``nvcc`` itself reports (``#$ TOP=...`` of a dry run):
    right for symlinks and for wrapper scripts that ``exec`` the real nvcc."""
    try:
        res = subprocess.run([nvcc, "-dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", res.stdout + res.stderr, re.M)
    return os.path.realpath(m.group(1).strip()) if m else None


def find_cuda_home():
    """The CUDA toolkit root holding ``include/cuda_runtime.h``.

    Raises:
        NoExtension: ``CUDA_HOME`` / ``CUDA_PATH`` names a folder without the
            headers, or no toolkit is found.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            if _has_runtime_header(home):
                return os.path.realpath(home)
            raise NoExtension(f"{var}={home} has no include/cuda_runtime.h")
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if _has_runtime_header(home):
            return home
        home = _nvcc_top(nvcc)
        if _has_runtime_header(home):
            return home
    versioned = sorted(glob.glob("/usr/local/cuda-*"), reverse=True,
                       key=lambda p: [int(x) for x in re.findall(r"\d+", os.path.basename(p))])
    for home in ["/usr/local/cuda"] + versioned:
        if _has_runtime_header(home) and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.realpath(home)
    raise NoExtension("no CUDA toolkit found (no nvcc with include/cuda_runtime.h; set "
                      "CUDA_HOME to the toolkit root)")


def _toolkit_version(home):
    """``"13.0"`` from ``CUDART_VERSION`` in the toolkit's headers, or ``None``."""
    try:
        with open(os.path.join(home, "include", "cuda_runtime_api.h")) as f:
            m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    if not m:
        return None
    v = int(m.group(1))
    return f"{v // 1000}.{v % 1000 // 10}"


def _library_include_dirs(home):
    """Include folders holding the cuSPARSE and cuBLAS headers that torch's CUDA
    headers include: the toolkit's, else those of the ``nvidia-*`` wheels that a
    CUDA build of torch installs."""
    needed = ("cusparse.h", "cublas_v2.h")
    if all(os.path.isfile(os.path.join(home, "include", h)) for h in needed):
        return []
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec else []
    dirs = []
    for h in needed:
        if os.path.isfile(os.path.join(home, "include", h)):
            continue
        found = [os.path.dirname(p) for r in roots for p in sorted(glob.glob(
            os.path.join(r, "*", "include", h)))]
        if not found:
            raise NoExtension(f"no {h} in {home}/include nor in the nvidia-* packages of "
                              "torch (install the toolkit's cuSPARSE / cuBLAS headers)")
        if found[0] not in dirs:
            dirs.append(found[0])
    return dirs


def _arch(s):
    m = re.match(r"^(\d+)\.(\d+)", s.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _fmt(arches):
    """``TORCH_CUDA_ARCH_LIST`` text, PTX for the newest: ``"8.0;9.0+PTX"``."""
    names = [f"{a}.{b}" for a, b in sorted(set(arches))]
    names[-1] += "+PTX"
    return ";".join(names)


def _torch_arches(torch):
    return sorted({(int(s[3:-1]), int(s[-1])) for s in torch.cuda.get_arch_list()
                   if re.fullmatch(r"sm_\d+", s)})


def arch_list(torch, home, force):
    """The architectures to compile for, as ``TORCH_CUDA_ARCH_LIST`` text.

    ``TORCH_CUDA_ARCH_LIST`` if set; else the visible GPUs' compute capabilities
    (capped at torch's newest, as torch does); else, with ``force``, the
    architectures torch was built for that the toolkit's nvcc supports. Always
    a non-empty list of architectures >= ``MIN_ARCH``.

    Raises:
        NoExtension: an architecture below ``MIN_ARCH``, or no GPU and no list.
    """
    given = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if given:
        old = [a for a in re.split(r"[;\s]+", given) if _arch(a) and _arch(a) < MIN_ARCH]
        if old:
            raise NoExtension(f"TORCH_CUDA_ARCH_LIST={given} names {', '.join(old)}; the "
                              f"kernels need compute capability {MIN_ARCH[0]}.{MIN_ARCH[1]} "
                              "or newer")
        return given
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        newest = max(_torch_arches(torch), default=(99, 9))
        caps = {min(torch.cuda.get_device_capability(i), newest)
                for i in range(torch.cuda.device_count())}
        ok = [c for c in caps if c >= MIN_ARCH]
        if not ok:
            raise NoExtension(f"the GPU (sm_{max(caps)[0]}{max(caps)[1]}) is older than the "
                              f"kernels need (sm_{MIN_ARCH[0]}{MIN_ARCH[1]})")
        return _fmt(ok)
    if not force:
        raise NoExtension("no GPU visible and TORCH_CUDA_ARCH_LIST is not set (set it to the "
                          "target GPU's compute capability, e.g. TORCH_CUDA_ARCH_LIST=9.0)")
    try:
        out = subprocess.run([os.path.join(home, "bin", "nvcc"), "--list-gpu-arch"],
                             capture_output=True, text=True, timeout=60).stdout
        nvcc_arches = {(int(n) // 10, int(n) % 10) for n in re.findall(r"compute_(\d+)", out)}
    except (OSError, subprocess.SubprocessError):
        nvcc_arches = set()
    arches = [a for a in _torch_arches(torch)
              if a >= MIN_ARCH and (not nvcc_arches or a in nvcc_arches)]
    if not arches:
        raise NoExtension("no GPU visible, TORCH_CUDA_ARCH_LIST is not set and torch's "
                          "architectures are not ones the toolkit and the kernels share")
    return _fmt(arches)


def _configure():
    """``(build info, extension kwargs or None)``: whether and how to build."""
    if _flag("PYG_DFGNN_NO_EXT"):
        if _flag("FORCE_CUDA"):
            raise SystemExit("pyg_dfgnn: FORCE_CUDA=1 and PYG_DFGNN_NO_EXT=1 contradict each "
                             "other; unset one")
        raise NoExtension("PYG_DFGNN_NO_EXT=1 was set")
    import torch

    if getattr(torch.version, "hip", None):
        raise NoExtension(f"torch {torch.__version__} is a ROCm build; the kernels are CUDA")
    if not torch.version.cuda:
        raise NoExtension(f"torch {torch.__version__} is a CPU build (install a CUDA build "
                          "of torch, see README, 'Install')")
    home = find_cuda_home()
    version = _toolkit_version(home)
    if version and version.split(".")[0] != torch.version.cuda.split(".")[0]:
        raise NoExtension(f"the CUDA toolkit at {home} is CUDA {version}, torch "
                          f"{torch.__version__} was built with CUDA {torch.version.cuda} "
                          "(set CUDA_HOME to a matching toolkit)")
    includes = _library_include_dirs(home)
    arches = arch_list(torch, home, _flag("FORCE_CUDA"))
    # torch.utils.cpp_extension reads CUDA_HOME when it is imported, and derives
    # the -gencode flags from TORCH_CUDA_ARCH_LIST.
    os.environ["CUDA_HOME"] = home
    os.environ["TORCH_CUDA_ARCH_LIST"] = arches
    info = {"extension": True, "cuda_home": home, "cuda": version, "arch_list": arches,
            "torch": torch.__version__}
    return info, includes


# .cu files that compile as one translation unit: a generated file under build/
# that includes them. nvcc parses a .cu file's torch headers three times
# (cudafe++, cicc, the host compiler), about 13 s of one core per file, more than
# these files' own kernels take; the files that instantiate many kernels (the
# scores' walks) stay translation units of their own, so that a parallel build
# keeps them apart (docs/build.md has the measurements).
UNITY_GROUPS = {
    "support": ["host/plan_checks.cu", "host/split_merge.cu", "host/out_dsum.cu",
                "scores/cosine_normalize.cu",
                "kernels/softmax_spmm.cu", "glue/build_record.cu"],
    "dot_tensor_cores": ["scores/dot_forward_mma.cu", "scores/dot_forward_dense.cu",
                         "scores/dot_backward_mma.cu", "scores/dot_backward_dense.cu"],
    "layout_cosine": ["kernels/layout_build.cu", "scores/cosine.cu"],
}


def cuda_sources():
    """The .cu translation units: each file of cuda/ not in a UNITY_GROUPS group,
    then one generated file per group (rewritten only when its text changes, so
    that ninja does not rebuild it)."""
    grouped = {f for files in UNITY_GROUPS.values() for f in files}
    missing = sorted(f for f in grouped if not os.path.isfile(os.path.join(ROOT, "cuda", f)))
    if missing:
        raise SystemExit(f"pyg_dfgnn: UNITY_GROUPS in setup.py names missing files: {missing}")
    alone = [f for f in sorted(glob.glob(os.path.join("cuda", "**", "*.cu"), recursive=True))
             if os.path.relpath(f, "cuda") not in grouped]
    units = []
    for name, files in UNITY_GROUPS.items():
        path = os.path.join("build", "unity", f"{name}.cu")
        text = "// Generated by setup.py (UNITY_GROUPS): one translation unit.\n" + "".join(
            f'#include "{f}"\n' for f in files)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.isfile(path) or open(path).read() != text:
            with open(path, "w") as out:
                out.write(text)
        units.append(path)
    return alone + units


def _extensions():
    try:
        info, includes = _configure()
    except NoExtension as e:
        reason = str(e)
        if _flag("FORCE_CUDA"):
            raise SystemExit(f"pyg_dfgnn: FORCE_CUDA=1 but the CUDA extension cannot be "
                             f"built: {reason}") from None
        # An earlier in-place build (pip install -e) would otherwise still load.
        stale = glob.glob(os.path.join(ROOT, "pyg_dfgnn", "_C*.so"))
        for path in stale:
            os.remove(path)
        removed = f" (removed the earlier build {os.path.basename(stale[0])})" if stale else ""
        print(f"pyg_dfgnn: installing without the CUDA extension: {reason}{removed}; {HOW}",
              file=sys.stderr)
        _write_info({"extension": False, "reason": reason, "prefix": sys.prefix,
                     "torch": _torch_version()})
        return [], {}
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = info["cuda_home"]  # in case it was imported before
    print(f"pyg_dfgnn: building the CUDA extension for {info['arch_list']} with CUDA "
          f"{info['cuda']} at {info['cuda_home']} (a few minutes per architecture)",
          file=sys.stderr)
    # The library records what it was built with; a record of an earlier
    # install without it would contradict that.
    if os.path.exists(BUILD_INFO):
        os.remove(BUILD_INFO)
    # cuda/ holds the torch glue (glue/), host code (host/), device building blocks
    # (device/, headers only), one file per kernel family (kernels/) and the score
    # functions (scores/).
    srcs = cuda_sources() + sorted(glob.glob(os.path.join("cuda", "**", "*.cpp"),
                                             recursive=True))
    # TORCH_ASSERT_ONLY_METHOD_OPERATORS: a .cu file that includes ATen's
    # all-operator headers fails to compile (host/tensor.h says why).
    nvcc = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-DTORCH_ASSERT_ONLY_METHOD_OPERATORS"]
    if _flag("PYG_DFGNN_PTXAS_VERBOSE"):
        nvcc.append("-Xptxas=-v")
    # The wheels' headers are searched after the toolkit's (-isystem after -I), as
    # CPATH would: their cuda_runtime.h must not shadow the toolkit's.
    system = [flag for d in includes for flag in ("-isystem", d)]
    ext = cpp_extension.CUDAExtension(
        name="pyg_dfgnn._C",
        sources=srcs,
        include_dirs=[os.path.join(ROOT, "cuda")],
        # -g0: Python's CFLAGS carry -g, and the debug information of torch's
        # headers made the .cpp files' objects most of the library's size and slowed
        # their compile.
        extra_compile_args={"cxx": ["-O3", "-g0"] + system, "nvcc": nvcc + system},
    )
    return [ext], {"build_ext": _in_tree_build_temp(
        cpp_extension.BuildExtension.with_options(use_ninja=True))}


def _in_tree_build_temp(build_ext):
    """``build_ext`` with its objects in ``build/temp.<platform>-<python>`` in the
    source tree, where a plain ``setup.py build_ext`` or ``pip install .`` puts
    them, also for an editable install (PEP 660), which otherwise compiles into a
    temporary folder and discards the objects: a later build of the same tree
    then recompiles only what changed (ninja compares sources and commands), e.g.
    the wheel ``pip install .`` builds after ``make``'s editable install (the
    extension takes minutes on 2 cores)."""
    import sysconfig

    class BuildExt(build_ext):
        def finalize_options(self):
            super().finalize_options()
            self.build_temp = os.path.join(
                ROOT, "build", f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")

    return BuildExt


def _torch_version():
    """The installed torch's version (``torch.__version__``), or ``None``."""
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def _write_info(info):
    with open(BUILD_INFO, "w") as f:
        json.dump(info, f, indent=1)


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
