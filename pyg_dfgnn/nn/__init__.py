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
input and one weight GEMM over the concatenated weights; default ``True``).

.. code-block:: python

    from pyg_dfgnn.nn import FusedTransformerConv
    conv = FusedTransformerConv(128, 32, heads=4)
    conv.load_state_dict(native_conv.state_dict())
    out = conv(x, edge_index)

    # or, for an existing model (to_hetero models included):
    from pyg_dfgnn.nn import fuse
    print(fuse(model))
"""
from .agnn_conv import FusedAGNNConv
from .fuse import FuseReport, FusedLayer, fuse
from .gat_conv import FusedGATConv
from .transformer_conv import FusedTransformerConv

__all__ = ["FusedTransformerConv", "FusedGATConv", "FusedAGNNConv", "fuse", "FuseReport",
           "FusedLayer"]
