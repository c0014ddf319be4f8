"""``pyg_dfgnn.loader.LayoutPrefetchLoader``: batches whose layouts are built one
step ahead carry the layouts the fused layers would build on their first call, and
train a model to the same outputs and gradients, without a build in the step."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GATConv

from conftest import random_graph
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.layout_cache import get_layout
from pyg_dfgnn.loader import LayoutPrefetchLoader, layout_variants
from pyg_dfgnn.nn import FusedAGNNConv, FusedGATConv, FusedTransformerConv
from test_layout_build import assert_same_layout


def _graphs(count: int = 12, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = 8 + 3 * i
        ei = random_graph(n, num_edges=4 * n, num_self_loops=2, generator=g)
        out.append(Data(x=torch.randn(n, 6, generator=g), edge_index=ei,
                        y=torch.randint(0, 3, (n,), generator=g)))
    return out


class _Net(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv1 = conv(6, 4, heads=2)
        self.conv2 = conv(8, 3, heads=1)

    def forward(self, x, edge_index):
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)


@pytest.mark.parametrize("loops", [(False,), (True,), (False, True)])
def test_prefetched_layouts_equal_the_on_demand_build(loops, build_count):
    loader = DataLoader(_graphs(), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    batches = 0
    for batch in LayoutPrefetchLoader(loader, torch.device("cpu"), loops):
        n = batch.num_nodes
        before = build_count()
        for flag in loops:
            got = get_layout(batch.edge_index, (n, n), flag)
            assert get_layout(batch.edge_index, None, flag) is got  # both keys, as CacheLayout
            want = GraphLayout.from_edge_index(batch.edge_index.clone(), (n, n), flag)
            assert_same_layout(got, want)
        assert build_count() - before == len(loops), "the loader left a layout unbuilt"
        batches += 1
    assert batches == len(loader)


@pytest.mark.parametrize("conv", [FusedGATConv, FusedTransformerConv])
@pytest.mark.parametrize("in_thread", [False, True])
def test_training_on_prefetched_batches_matches_the_on_demand_layouts(conv, in_thread,
                                                                      build_count):
    def run(prefetch: bool):
        torch.manual_seed(0)
        model = _Net(conv)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(_graphs(), batch_size=4, shuffle=True,
                            generator=torch.Generator().manual_seed(2))
        if prefetch:
            loader = LayoutPrefetchLoader(loader, torch.device("cpu"), layout_variants(model),
                                          in_thread=in_thread)
        outs, builds, start = [], 0, build_count()
        for batch in loader:
            if prefetch and in_thread:  # the thread builds the next ones meanwhile
                assert _has_layouts(batch, layout_variants(model))
            before = build_count()
            opt.zero_grad()
            out = model(batch.x, batch.edge_index)
            torch.nn.functional.cross_entropy(out, batch.y).backward()
            builds += build_count() - before
            opt.step()
            outs.append(out.detach())

        return outs, (build_count() - start if prefetch and in_thread else builds), [
            p.detach() for p in model.parameters()]

    want, on_demand_builds, want_params = run(False)
    got, step_builds, got_params = run(True)
    assert on_demand_builds == len(want)  # one build per batch, shared by both convs
    if in_thread:
        assert step_builds == len(got), "a layout was built twice"
    else:
        assert step_builds == 0, "a layout was built inside the training step"
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(got_params, want_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _has_layouts(batch, loops) -> bool:
    """Whether ``batch.edge_index`` arrived with its layouts of every variant."""
    from pyg_dfgnn.layout_cache import _ATTR  # the cache on the tensor
    n = batch.num_nodes
    cache = getattr(batch.edge_index, _ATTR, None)
    return cache is not None and all(((n, n), flag) in cache.layouts for flag in loops)


@pytest.mark.parametrize("loops", [(False,), (True,), (False, True)])
def test_thread_hands_over_batches_in_order_with_their_layouts(loops, build_count):
    loader = DataLoader(_graphs(), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    want = [b.edge_index.clone() for b in loader]
    loader.generator.manual_seed(1)
    got = []
    for batch in LayoutPrefetchLoader(loader, torch.device("cpu"), loops, in_thread=True):
        assert _has_layouts(batch, loops)
        n = batch.num_nodes
        for flag in loops:
            want_layout = GraphLayout.from_edge_index(batch.edge_index.clone(), (n, n), flag)
            assert_same_layout(get_layout(batch.edge_index, (n, n), flag), want_layout)
        got.append(batch.edge_index)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert build_count() == 2 * len(loader) * len(loops)  # the thread + the references
    assert not _producers()


def _producers() -> list:
    import threading
    return [t for t in threading.enumerate() if t.name == "LayoutPrefetchLoader"]


def test_thread_stops_when_the_loop_breaks_and_the_loader_runs_again():
    loader = DataLoader(_graphs(), batch_size=2)
    prefetched = LayoutPrefetchLoader(loader, torch.device("cpu"), (False,), in_thread=True)
    for i, _ in enumerate(prefetched):
        if i == 1:
            break
    assert not _producers(), "the thread outlived the loop"
    assert sum(1 for _ in prefetched) == len(loader)  # a new epoch from the start
    assert not _producers()


class _Failing(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i, g in enumerate(_graphs(6)):
            if i == 3:
                raise RuntimeError("bad sample 3")
            yield g


def test_thread_raises_the_loaders_error_in_the_loop():
    loader = DataLoader(_Failing(), batch_size=1)
    seen = 0
    with pytest.raises(RuntimeError, match="bad sample 3"):
        for _ in LayoutPrefetchLoader(loader, torch.device("cpu"), (True,), in_thread=True):
            seen += 1
    assert seen == 3
    assert not _producers()


def test_layout_variants_follow_the_fused_convs():
    assert layout_variants(_Net(FusedGATConv)) == (True,)
    assert layout_variants(_Net(FusedTransformerConv)) == (False,)
    assert layout_variants(_Net(GATConv)) == ()  # native PyG: nothing to build ahead
    mixed = torch.nn.ModuleList([FusedAGNNConv(add_self_loops=False), FusedGATConv(4, 4)])
    assert layout_variants(mixed) == (False, True)


def test_without_variants_batches_are_only_prefetched(build_count):
    loader = DataLoader(_graphs(4), batch_size=2)
    for batch in LayoutPrefetchLoader(loader, torch.device("cpu"), ()):
        assert not hasattr(batch.edge_index, "_dfgnn_layouts")
    assert build_count() == 0


@pytest.mark.cuda
@pytest.mark.parametrize("conv", [FusedGATConv, FusedTransformerConv])
@pytest.mark.parametrize("in_thread", [False, True])
def test_cuda_prefetch_builds_on_the_side_stream_and_matches(conv, in_thread, build_count):
    """On the GPU the batch arrives with its layout (built by the kernels on the
    prefetcher's stream), equal to the one a first call builds, and the model's
    outputs equal those on batches copied and built in the step."""
    torch.manual_seed(0)
    model = _Net(conv).cuda().eval()
    loader = DataLoader(_graphs(), batch_size=4)
    device = torch.device("cuda", torch.cuda.current_device())
    prefetched = LayoutPrefetchLoader(loader, device, layout_variants(model),
                                      in_thread=in_thread)
    with torch.no_grad():
        for batch, plain in zip(prefetched, loader):
            assert batch.edge_index.is_cuda
            n = batch.num_nodes
            assert _has_layouts(batch, layout_variants(model))
            before = build_count()
            got = model(batch.x, batch.edge_index)
            assert in_thread or build_count() == before  # the thread builds meanwhile
            plain = plain.to(device)
            want = model(plain.x, plain.edge_index)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            for flag in layout_variants(model):
                assert_same_layout(get_layout(batch.edge_index, (n, n), flag),
                                   get_layout(plain.edge_index, (n, n), flag))
