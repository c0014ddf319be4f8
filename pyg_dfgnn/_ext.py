"""Loads the compiled extension ``pyg_dfgnn._C`` if it was built.

Importing it registers the ``torch.ops.dfgnn`` operators (``TORCH_LIBRARY`` in
``cuda/glue/bindings.cpp``). A missing or unloadable extension is not an error: the
package then runs every op through :mod:`pyg_dfgnn.ops.reference`.
"""
import importlib.util
import warnings

_LOAD_ERROR = None
# Look for the module first: importing a missing submodule while the package is
# still initialising reports a misleading "circular import".
_BUILT = importlib.util.find_spec(f"{__package__}._C") is not None
if not _BUILT:
    HAS_EXTENSION = False
    _LOAD_ERROR = ImportError(
        "pyg_dfgnn._C is not built: the package was installed without a CUDA build of "
        "torch or without a CUDA toolkit (or with PYG_DFGNN_NO_EXT=1)")
else:
    try:
        from . import _C  # noqa: F401
        HAS_EXTENSION = True
    except ImportError as e:  # built against another torch (ABI) or CUDA runtime
        HAS_EXTENSION = False
        _LOAD_ERROR = e
        warnings.warn(f"pyg_dfgnn._C exists but failed to load ({e}); rebuild it against "
                      "the installed torch. Falling back to the reference ops.")


def extension_built() -> bool:
    """Whether a compiled ``pyg_dfgnn._C`` exists (loaded or not)."""
    return _BUILT


def load_error():
    """The ``ImportError`` of loading ``pyg_dfgnn._C`` (not built, or built but not
    loadable), or ``None`` when it loaded."""
    return _LOAD_ERROR
