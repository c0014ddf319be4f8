"""PyG transforms of pyg_dfgnn."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.transforms import BaseTransform

from .layout_cache import attach_layout, get_layout


class CacheLayout(BaseTransform):
    r"""Builds the :class:`~pyg_dfgnn.layout.GraphLayout` (CSR by destination, CSC
    for the backward, in-degree statistics) of ``data.edge_index`` once and caches
    it on that tensor, where every fused layer looks first; also stores it as
    ``data.dfgnn_layout``.

    Apply it after moving the data to the GPU (e.g. after
    :class:`~torch_geometric.transforms.ToDevice`): a ``.to()`` copy of
    ``edge_index`` is a new tensor and gets its own layout on first use. Batches
    from a ``DataLoader`` are new tensors too: their layout is built on the first
    layer's call and shared by the other layers of the model, or one step ahead
    by :class:`pyg_dfgnn.loader.LayoutPrefetchLoader`. Layouts built under
    ``torch.inference_mode`` hold plain tensors, so training can reuse them. The
    cached layout follows later edits of ``edge_index`` as described in
    docs/layout_cache.md (``data.dfgnn_layout`` keeps the layout of the edges it
    was built from).

    Args:
        self_loops (sequence of bool): which variants to build: ``False`` for
            :class:`FusedTransformerConv`, ``True`` for :class:`FusedGATConv` /
            :class:`FusedAGNNConv` (self-loops added once here, as those layers
            would in every forward). Default: both.
        with_csc (bool): also build the CSC used by the backward pass.
    """

    def __init__(self, self_loops: Sequence[bool] = (False, True), with_csc: bool = True):
        self.self_loops = tuple(bool(s) for s in self_loops)
        self.with_csc = with_csc

    def forward(self, data: Data) -> Data:
        if isinstance(data, HeteroData):
            raise TypeError("CacheLayout supports homogeneous Data objects")
        n = data.num_nodes
        layout: Optional[object] = None
        for loops in self.self_loops:
            layout = get_layout(data.edge_index, (n, n), add_self_loops=loops)
            attach_layout(data.edge_index, layout, None, loops)
            if self.with_csc:
                # Plain tensors even under inference_mode: training reuses them.
                with torch.inference_mode(False):
                    layout.colptr  # noqa: B018  (builds the CSC)
            if not loops or layout is None:
                data.dfgnn_layout = layout
        if getattr(data, "dfgnn_layout", None) is None:
            data.dfgnn_layout = layout
        return data

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(self_loops={self.self_loops})"
