"""Loads the compiled extension ``pyg_dfgnn._C`` if it was built.

Importing it registers the ``torch.ops.dfgnn`` operators (``TORCH_LIBRARY`` in
``cuda/glue/bindings.cpp``). A missing or unloadable extension is not an error: the
package then runs every op through :mod:`pyg_dfgnn.ops.reference` on the CPU, and
the fused layers hand CUDA inputs to PyG's own ``forward``.

``setup.py`` records in ``_build_info.json`` (next to this file) whether it built
the extension and, if not, why; :func:`missing_reason` reports it.
"""
import importlib.util
import json
import warnings
from pathlib import Path

_LOAD_ERROR = None
# Look for the module first: importing a missing submodule while the package is
# still initialising reports a misleading "circular import".
_BUILT = importlib.util.find_spec(f"{__package__}._C") is not None
if not _BUILT:
    HAS_EXTENSION = False
else:
    try:
        from . import _C  # noqa: F401
        HAS_EXTENSION = True
    except ImportError as e:  # built against another torch (ABI) or CUDA runtime
        HAS_EXTENSION = False
        _LOAD_ERROR = e
        warnings.warn(f"pyg_dfgnn._C exists but failed to load ({e}); rebuild it against "
                      "the installed torch. Falling back to the reference ops.")


def build_info() -> dict:
    """What ``setup.py`` recorded at install time: ``{"extension": bool, "reason":
    str}`` when it was not built, ``{"extension": True, "arch_list": ...,
    "cuda_home": ..., ...}`` when it was; ``{}`` for an install without the record
    (an install by another tool, or a source tree that was never installed)."""
    try:
        return json.loads((Path(__file__).with_name("_build_info.json")).read_text())
    except (OSError, ValueError):
        return {}


def missing_reason() -> str:
    """Why the compiled kernels are missing (``""`` when the extension loaded)."""
    if HAS_EXTENSION:
        return ""
    if _BUILT:
        return f"pyg_dfgnn._C was built but failed to load: {_LOAD_ERROR}"
    info = build_info()
    if info.get("extension") is False:
        return f"pyg_dfgnn._C not built: {info.get('reason')}"
    if info.get("extension"):
        return ("pyg_dfgnn._C not built, although the install set out to build it (an "
                "interrupted build?)")
    return "pyg_dfgnn._C not built (no install record: reinstall to see why)"


if not _BUILT:
    _LOAD_ERROR = ImportError(missing_reason())


def extension_built() -> bool:
    """Whether a compiled ``pyg_dfgnn._C`` exists (loaded or not)."""
    return _BUILT


def load_error():
    """The ``ImportError`` of loading ``pyg_dfgnn._C`` (not built, or built but not
    loadable), or ``None`` when it loaded."""
    return _LOAD_ERROR
