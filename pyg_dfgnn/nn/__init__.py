r"""Drop-in fused attention conv layers for PyTorch Geometric.

Each layer subclasses the native PyG conv (same constructor, parameters and
``state_dict``) and overrides only ``forward``, replacing PyG's
``propagate`` (gather -> per-edge messages -> scatter) by one fused
SDDMM -> edge softmax -> SpMM op on a cached :class:`~pyg_dfgnn.layout.GraphLayout`
(DF-GNN paper §3–4). Each takes one extra keyword, ``strategy``
(``"auto" | "smmf" | "pmf"``), and falls back to the native forward for
configurations the fused ops do not cover (documented per class).
:class:`FusedTransformerConv` also takes ``fused_projection`` (while autograd
records, the backward of its query, key, value and skip projections runs one
input and one weight GEMM over the concatenated weights; default ``True``) and
``edge_tails`` (narrow edge features run as per-edge tails, no ``[E, H, C]``
tensor; default ``True``).

.. code-block:: python

    from pyg_dfgnn.nn import FusedTransformerConv
    conv = FusedTransformerConv(128, 32, heads=4)
    conv.load_state_dict(native_conv.state_dict())
    out = conv(x, edge_index)

    # or, for an existing model (to_hetero models included):
    from pyg_dfgnn.nn import fuse
    print(fuse(model))
"""
import importlib as _importlib
import pkgutil as _pkgutil

from ._common import FUSED
from .fuse import FuseReport, FusedLayer, fuse

# Every layer module registers its fused class (FUSED); importing them all here
# means a new layer needs no edit outside its own file.
for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_info.name}")
globals().update({cls.__name__: cls for cls in FUSED.values()})

__all__ = [*sorted(cls.__name__ for cls in FUSED.values()), "fuse", "FuseReport", "FusedLayer"]
