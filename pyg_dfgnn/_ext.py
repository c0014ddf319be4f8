"""Loads the compiled extension ``pyg_dfgnn._C`` if it was built.

Importing it registers the ``torch.ops.dfgnn`` operators (``TORCH_LIBRARY`` in
``cuda/bindings.cpp``). A missing or unloadable extension is not an error: the
package then runs every op through :mod:`pyg_dfgnn.ops.reference`.
"""
import warnings

_LOAD_ERROR = None
try:
    from . import _C  # noqa: F401
    HAS_EXTENSION = True
except ImportError as e:  # not built (CPU-only install) or ABI mismatch
    HAS_EXTENSION = False
    _LOAD_ERROR = e
    if "undefined symbol" in str(e):
        warnings.warn(f"pyg_dfgnn._C exists but failed to load ({e}); rebuild it against "
                      "the installed torch. Falling back to the reference ops.")


def load_error():
    """The ``ImportError`` raised when loading ``pyg_dfgnn._C``, or ``None``."""
    return _LOAD_ERROR
