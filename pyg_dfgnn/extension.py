"""Loads the compiled extension ``pyg_dfgnn._C`` if it was built.

Importing it registers the ``torch.ops.dfgnn`` operators (``TORCH_LIBRARY`` in
``cuda/glue/bindings.cpp``). A missing or unloadable extension is not an error: the
package then runs every op through :mod:`pyg_dfgnn.ops.reference` on the CPU, and
the fused layers hand CUDA inputs to PyG's own ``forward``.

What the extension was built against (torch and CUDA versions, GPU architectures)
is compiled into the library itself (``cuda/glue/build_record.cu``), so it travels
with the build: :func:`build_info` reads it from the library file, loaded or not.
Where no extension was built, ``setup.py`` records why in ``_build_info.json``,
stamped with the torch it was made for: a record made for another torch (a second
install from the same source tree into another environment) is reported as such,
not as this environment's reason.
"""
import ctypes
import importlib.util
import json
import mmap
import warnings
from pathlib import Path
from typing import Optional

import torch

#: Prefix of the build record in the library (``cuda/glue/build_record.cu``).
RECORD_MARKER = b"pyg_dfgnn-build-record:"
_RECORD_SYMBOL = "pyg_dfgnn_build_record"
_INSTALL_RECORD = Path(__file__).with_name("_build_info.json")
REBUILD = "pip install --no-build-isolation ."

_SPEC = importlib.util.find_spec(f"{__package__}._C")
# Look for the module first: importing a missing submodule while the package is
# still initialising reports a misleading "circular import".
_BUILT = _SPEC is not None
_LIBRARY: Optional[str] = _SPEC.origin if _BUILT else None
_LOAD_ERROR = None


def _torch_release(version: str) -> str:
    """``"2.14.1"`` of ``"2.14.1+cu130"``: the part a compiled library records."""
    return version.split("+")[0]


def _record_from_bytes(data) -> dict:
    start = data.find(RECORD_MARKER)
    if start < 0:
        return {}
    start += len(RECORD_MARKER)
    end = data.find(b"\0", start)  # the record's end in the file; a C string has none
    end = len(data) if end < 0 else end
    try:
        raw = json.loads(bytes(data[start:end]).decode())
    except ValueError:
        return {}
    cudart = int(raw.get("cudart", 0))
    return {"torch": raw.get("torch"), "cuda": f"{cudart // 1000}.{cudart % 1000 // 10}",
            "nvcc": raw.get("nvcc"), "arch": [f"sm_{a // 10}" for a in raw.get("arch", [])]}


def _read_library_record(path: str) -> dict:
    """The build record of the library at ``path``, found in the file without
    loading it (a library built against another torch does not load)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _record_from_bytes(m)
    except (OSError, ValueError):
        return {}


def _loaded_record(path: str) -> dict:
    """The build record of the loaded library, through its exported symbol (the
    library is mapped already: no file scan)."""
    try:
        lib = ctypes.CDLL(path)
        return _record_from_bytes(ctypes.string_at(
            ctypes.addressof(ctypes.c_char.in_dll(lib, _RECORD_SYMBOL))))
    except (OSError, ValueError):
        return _read_library_record(path)


def torch_mismatch(record: dict) -> str:
    """One line where the build ``record`` (:func:`build_info`) names another torch
    than the running one, else ``""``."""
    built = record.get("torch")
    running = _torch_release(torch.__version__)
    if built and built != running:
        return (f"pyg_dfgnn._C was built against torch {built}, this is torch {running}: "
                f"rebuild it here ({REBUILD})")
    return ""


if _BUILT:
    try:
        from . import _C  # noqa: F401
        HAS_EXTENSION = True
    except ImportError as e:  # built against another torch (ABI) or CUDA runtime
        HAS_EXTENSION = False
        why = torch_mismatch(_read_library_record(_LIBRARY))
        _LOAD_ERROR = ImportError(why or f"pyg_dfgnn._C failed to load ({e}); rebuild it "
                                  f"against the installed torch ({REBUILD})")
        warnings.warn(f"{_LOAD_ERROR}. The fused layers run PyG's own forward on CUDA "
                      "tensors, the reference path on the CPU.")
    else:
        _WARNING = torch_mismatch(_loaded_record(_LIBRARY))
        if _WARNING:
            warnings.warn(_WARNING)
else:
    HAS_EXTENSION = False


def install_record() -> dict:
    """What ``setup.py`` recorded where it did not build the extension: ``{"extension":
    False, "reason": str, "torch": str, "prefix": str}``; ``{}`` without a record."""
    try:
        return json.loads(_INSTALL_RECORD.read_text())
    except (OSError, ValueError):
        return {}


def build_info() -> dict:
    """What the compiled extension was built with, read from the library itself:
    ``{"torch": "2.14.1", "cuda": "13.0", "nvcc": "13.0", "arch": ["sm_90"], "path":
    ...}`` (``cuda``: the CUDA runtime headers compiled against);
    ``{}`` where no extension is built (:func:`missing_reason` says why)."""
    if not _BUILT:
        return {}
    record = _loaded_record(_LIBRARY) if HAS_EXTENSION else _read_library_record(_LIBRARY)
    return {**record, "path": _LIBRARY} if record else {"path": _LIBRARY}


def _from_this_environment(record: dict) -> bool:
    # The torch version, not the prefix, tells: a wheel is built in one
    # environment and installed in another, and its record holds there as long as
    # the torch is the same.
    return record.get("torch", torch.__version__) == torch.__version__


def missing_reason() -> str:
    """Why the compiled kernels are missing (``""`` when the extension loaded)."""
    if HAS_EXTENSION:
        return ""
    if _BUILT:
        return str(_LOAD_ERROR) if _LOAD_ERROR else "pyg_dfgnn._C failed to load"
    record = install_record()
    if not record:
        return f"pyg_dfgnn._C not built (no install record: reinstall to see why: {REBUILD})"
    if not _from_this_environment(record):
        return (f"pyg_dfgnn._C not built for this torch (the install record is from "
                f"torch {record.get('torch')} at {record.get('prefix')}); reinstall here "
                f"({REBUILD})")
    return f"pyg_dfgnn._C not built: {record.get('reason')}"


if not _BUILT:
    _LOAD_ERROR = ImportError(missing_reason())


def load_error():
    """The ``ImportError`` of loading ``pyg_dfgnn._C`` (not built, or built but not
    loadable), or ``None`` when it loaded."""
    return _LOAD_ERROR
