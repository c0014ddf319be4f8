"""pyg_dfgnn: fused attention kernels (DF-GNN) behind drop-in PyG conv layers.

``from pyg_dfgnn.nn import FusedTransformerConv, FusedGATConv, FusedAGNNConv``
"""
import warnings

import torch

with warnings.catch_warnings():
    # PyG's import scripts a few classes with torch.jit.script, which recent torch
    # deprecates with a FutureWarning on every import; it is PyG's, not the user's
    # concern, so it is silenced for the import of PyG that this package triggers.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated",
                            category=FutureWarning)
    import torch_geometric  # noqa: F401

from .extension import HAS_EXTENSION, load_error  # noqa: E402

__version__ = "0.1.0"


def has_cuda_kernels() -> bool:
    """Whether the fused CUDA kernels can run here: the extension is built and
    loaded, and a CUDA device is visible."""
    return HAS_EXTENSION and torch.cuda.is_available()


from . import ops, layout, layout_cache, transforms  # noqa: E402,F401
from .layout import GraphLayout  # noqa: E402,F401
from .layout_cache import get_layout, invalidate  # noqa: E402,F401
from .explain import explain  # noqa: E402,F401

__all__ = ["has_cuda_kernels", "load_error", "explain", "GraphLayout", "get_layout", "invalidate", "ops",
           "layout", "layout_cache", "transforms", "__version__"]
