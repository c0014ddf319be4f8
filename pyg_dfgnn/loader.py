"""Mini-batch loading for the fused layers: batches copied to the GPU and their
layouts built one step ahead, on a side stream (docs/multi_gpu.md, "The data path")."""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterator, Optional, Sequence

import torch
from torch_geometric.loader import PrefetchLoader

from .layout_cache import get_layout
from .transforms import CacheLayout


class LayoutPrefetchLoader(PrefetchLoader):
    r"""PyG's :class:`~torch_geometric.loader.PrefetchLoader` that also builds each
    batch's :class:`~pyg_dfgnn.layout.GraphLayout` while the previous batch trains.

    For each batch of ``loader`` it pins the batch, copies it to ``device`` with
    non-blocking copies on a side stream (as ``PrefetchLoader``), then applies
    :class:`~pyg_dfgnn.transforms.CacheLayout` on that stream: the layout build
    and its one host synchronisation wait for that batch's copy alone, not for the
    training step queued on the current stream, and the fused layers of the step
    find the layout cached on ``batch.edge_index`` (the layout they would build on
    their first call, built by the same code). Every tensor of the batch and of
    its layouts is marked as used on the current stream
    (:meth:`torch.Tensor.record_stream`, also where no layout is built), so their
    memory is not handed to a later batch's copy while a step still reads it.

    Yielded batches are on ``device``, which must be the current device (as for
    ``PrefetchLoader``); on the CPU the layouts are built in the loop (or the
    thread), ahead of their batch's turn, without streams. Batches without an
    ``edge_index`` (``HeteroData``) are only prefetched. A loader with
    ``pin_memory=True`` (and workers) pins in its own thread; the pin here then
    finds the batch pinned.

    Args:
        loader: a loader of :class:`~torch_geometric.data.Data` batches (PyG's
            ``DataLoader``, ``NeighborLoader``, ...).
        device (torch.device, optional): where batches go (default: the GPU if
            there is one).
        self_loops (sequence of bool): the layout variants to build, as
            :class:`CacheLayout` takes them (``True`` for ``FusedGATConv``,
            ``FusedGATv2Conv`` and ``FusedAGNNConv`` with ``add_self_loops``,
            ``False`` for the others); :func:`layout_variants` reads them off a
            model. Empty: batches are only prefetched.
        with_csc (bool): also build the CSC the backward reads (training).
        in_thread (bool): fetch, copy and build in a background thread, up to
            two batches ahead (one handed over, one in the making), so that the
            loop that consumes them never waits on the layout build's host
            synchronisation or on the loader; each batch's use then waits, on
            the consuming stream, for an event recorded after its copy and
            build. Otherwise in the loop, one batch ahead, as
            ``PrefetchLoader``. Errors of the loader reach the loop.
            (default: :obj:`False`)
    """

    def __init__(self, loader, device: Optional[torch.device] = None,
                 self_loops: Sequence[bool] = (False, True), with_csc: bool = True,
                 in_thread: bool = False):
        super().__init__(loader, device)
        self.self_loops = tuple(bool(s) for s in self_loops)
        self.cache = CacheLayout(self.self_loops, with_csc) if self.self_loops else None
        self.in_thread = bool(in_thread)
        self._consumer = None  # the stream batches are used on (set by __iter__)

    def non_blocking_transfer(self, batch: Any) -> Any:
        batch = super().non_blocking_transfer(batch)  # on the side stream, if any
        graph = self.cache is not None and getattr(batch, "edge_index", None) is not None
        if graph:
            batch = self.cache(batch)
        if self._consumer is not None and hasattr(batch, "record_stream"):
            batch.record_stream(self._consumer)
            if graph:
                n = batch.num_nodes
                for loops in self.self_loops:
                    get_layout(batch.edge_index, (n, n), loops).record_stream(self._consumer)
        return batch

    def __iter__(self):
        # The transfers run inside the side stream's context; the stream the
        # batches are used on is the one current when iteration starts.
        helper = self.device_helper
        self._consumer = helper.module.current_stream() if helper.is_gpu else None
        if self.in_thread:
            yield from self._from_thread()
        else:
            yield from super().__iter__()

    def _from_thread(self) -> Iterator[Any]:
        helper = self.device_helper
        helper.maybe_init_stream()
        # One batch waits in the queue while the thread makes the next.
        ready: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()
        device = None
        if helper.is_gpu:
            device = helper.device.index
            if device is None:
                device = helper.module.current_device()
        thread = threading.Thread(target=self._produce, args=(ready, stop, device),
                                  name="LayoutPrefetchLoader", daemon=True)
        thread.start()
        try:
            while True:
                kind, item, event = ready.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                if event is not None:
                    self._consumer.wait_event(event)
                yield item
        finally:
            # A loop that breaks early: the thread stops at its next batch, and
            # is gone before the loader can be iterated again.
            stop.set()
            while thread.is_alive():
                try:
                    ready.get(timeout=0.05)
                except queue.Empty:
                    pass
            thread.join()

    def _produce(self, ready: queue.Queue, stop: threading.Event,
                 device: Optional[int]) -> None:
        helper = self.device_helper
        try:
            if device is not None:  # a thread starts on device 0
                helper.module.set_device(device)
            for batch in self.loader:
                if stop.is_set():
                    return
                event = None
                with helper.stream_context():
                    batch = self.non_blocking_transfer(batch)
                    if helper.stream is not None:
                        event = helper.module.Event()
                        event.record(helper.stream)
                if not _put(ready, stop, ("batch", batch, event)):
                    return
            _put(ready, stop, ("end", None, None))
        except BaseException as e:  # noqa: BLE001 (re-raised in the loop)
            _put(ready, stop, ("error", e, None))


def _put(ready: queue.Queue, stop: threading.Event, item: tuple) -> bool:
    """Puts ``item`` once there is room; ``False`` if the loop stopped first."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.05)
            return True
        except queue.Full:
            pass
    return False


def layout_variants(model: torch.nn.Module) -> tuple:
    r"""The ``self_loops`` variants the fused convs of ``model`` read: ``True``
    where a conv adds self-loops, ``False`` where it does not; empty without fused
    convs (nothing to build ahead)."""
    from .nn import FusedAGNNConv, FusedGATConv, FusedGATv2Conv, FusedTransformerConv
    fused = (FusedAGNNConv, FusedGATConv, FusedGATv2Conv, FusedTransformerConv)
    return tuple(sorted({bool(getattr(m, "add_self_loops", False))
                         for m in model.modules() if isinstance(m, fused)}))
