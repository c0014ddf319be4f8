"""The dense-tile plan (pyg_dfgnn/ops/tiles.py) against a direct per-block count
(CPU: the plan is built with tensor ops, the same on any device)."""
import pytest
import torch

from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import plan, tiles


def _graph(seed, n_dst, n_src):
    """Block-diagonal-ish graph: local edges, a duplicate pair, empty rows, one
    block with a window over MAX_WIDTH keys."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n_dst, (8 * n_dst,), generator=g)
    src = (dst * n_src // n_dst + torch.randint(-40, 40, dst.shape, generator=g)).clamp(0, n_src - 1)
    keep = dst % 97 != 5  # rows without in-edges
    key = torch.unique(dst[keep] * n_src + src[keep])  # no duplicates but the one below
    dst, src = key // n_src, key % n_src
    # a duplicate edge in block 1, a far edge in block 2 (window > MAX_WIDTH)
    dst = torch.cat([dst, torch.tensor([70, 70, 130])])
    src = torch.cat([src, torch.tensor([60, 60, 0])])
    return torch.stack([src, dst])


def _expected(lay):
    rowptr, col = lay.rowptr.tolist(), lay.col.tolist()
    out = []
    for b in range((lay.num_dst + 63) // 64):
        rows = range(64 * b, min(64 * b + 64, lay.num_dst))
        pairs = [(r - 64 * b, col[e]) for r in rows for e in range(rowptr[r], rowptr[r + 1])]
        if not pairs:
            out.append(None)
            continue
        lo = min(c for _, c in pairs)
        width = max(c for _, c in pairs) - lo + 1
        dup = len(set(pairs)) != len(pairs)
        out.append((lo, width, len(pairs), dup, set((r, c - lo) for r, c in pairs)))
    return out


@pytest.mark.parametrize("seed,n_dst,n_src", [(0, 300, 1200), (1, 200, 900), (2, 300, 300)])
def test_tile_plan_matches_direct_count(seed, n_dst, n_src):
    lay = GraphLayout.from_edge_index(_graph(seed, n_dst, n_src), (n_src, n_dst))
    plan = tiles.build_tile_plan(lay.rowptr, lay.col, lay.csr_row, n_dst, n_src)
    assert plan is not None and plan.dtype == torch.int32
    meta = plan[: 8 * ((n_dst + 63) // 64)].view(-1, 8).tolist()
    checked = 0
    for b, want in enumerate(_expected(lay)):
        lo, width, edges, off, w01, w23 = meta[b][:6]
        if want is None:
            assert lo == -1 and edges == 0
            continue
        wlo, wwidth, wedges, dup, pairs = want
        assert (width, edges) == (wwidth, wedges)
        if dup or wwidth > tiles.MAX_WIDTH:
            assert lo == -1, (b, dup, wwidth)
            continue
        assert lo == wlo
        n_chunks = (width + 31) // 32
        words = plan[off: off + 64 * n_chunks].view(n_chunks, 64)
        got = set()
        for c in range(n_chunks):
            for r in range(64):
                w = int(words[c, r]) & 0xFFFFFFFF
                got.update((r, 32 * c + j) for j in range(32) if w >> j & 1)
        assert got == pairs
        bits = [(w01 & 0xFFFF), (w01 >> 16) & 0xFFFF, (w23 & 0xFFFF), (w23 >> 16) & 0xFFFF]
        for w in range(4):
            want_bits = sum(1 << c for c in {k // 32 for r, k in pairs if r // 16 == w})
            assert bits[w] == want_bits
        checked += 1
    assert checked > 0
    # The duplicate pair (row 70) and the wide window (row 130) exclude blocks 1 and 2.
    if n_src > 512:
        assert meta[1][0] == -1 and meta[2][0] == -1


def test_tile_plan_none_without_dense_blocks():
    ei = torch.tensor([[0, 999], [0, 1]])  # one block, window 1000 keys
    lay = GraphLayout.from_edge_index(ei, (1000, 2))
    assert tiles.build_tile_plan(lay.rowptr, lay.col, lay.csr_row, 2, 1000) is None
    empty = GraphLayout.from_edge_index(torch.empty(2, 0, dtype=torch.long), (5, 5))
    assert tiles.build_tile_plan(empty.rowptr, empty.col, empty.csr_row, 5, 5) is None
    assert tiles.tile_plan(lay) is None  # CPU layout: no plan


@pytest.mark.parametrize("kind,dense", [("pattern", True), ("mnist", True), ("cifar10", False),
                                        ("coco_sp", False)])
def test_default_rule_on_batch_generators(kind, dense):
    """The default rule's statistic (median window cells per edge) puts the
    benchmark's batch graphs on the side of plan.DENSE_MAX_MEDIAN_CELLS where the H100 runs
    them faster (docs/kernels.md, "Rule: per graph")."""
    from benchmarks import generators
    if kind == "pattern":
        ei, batch, _, _ = generators.sbm_batch(kind, 64, seed=1)
    else:
        ei, batch = generators.knn_batch(kind, 128, seed=1)
    n = batch.numel()
    lay = GraphLayout.from_edge_index(ei, (n, n))
    tp = tiles.build_tile_plan(lay.rowptr, lay.col, lay.csr_row, n, n)
    frac, med = tiles.plan_cells_per_edge(tp, n)
    assert frac > 0.9
    assert (med <= plan.DENSE_MAX_MEDIAN_CELLS) == dense, med


def test_tile_plan_gives_up_below_min_fraction():
    """``min_fraction``: the build stops after the window widths where too few
    blocks could run dense (a sampled mini-batch: neighbours anywhere in the
    batch), and builds as before where enough could."""
    g = torch.Generator().manual_seed(4)
    n = 4096
    wide = torch.stack([torch.randint(0, n, (8 * n,), generator=g),
                        torch.randint(0, n, (8 * n,), generator=g)])
    lay = GraphLayout.from_edge_index(wide, (n, n))
    full = tiles.build_tile_plan(lay.rowptr, lay.col, lay.csr_row, n, n)
    frac = 0.0 if full is None else tiles.plan_cells_per_edge(full, n)[0]
    assert frac < plan.DENSE_MIN_FRACTION
    assert tiles.build_tile_plan(lay.rowptr, lay.col, lay.csr_row, n, n,
                                 plan.DENSE_MIN_FRACTION) is None
    local = GraphLayout.from_edge_index(_graph(0, 300, 1200), (1200, 300))
    want = tiles.build_tile_plan(local.rowptr, local.col, local.csr_row, 300, 1200)
    got = tiles.build_tile_plan(local.rowptr, local.col, local.csr_row, 300, 1200,
                                plan.DENSE_MIN_FRACTION)
    assert got is not None and torch.equal(got, want)


@pytest.mark.cuda
def test_layout_tiles_rebuilds_a_given_up_plan_when_forced():
    """The kernel plan's default rule builds under DENSE_MIN_FRACTION and keeps the
    given-up entry; a forced dense-tile call builds the whole plan after it."""
    g = torch.Generator().manual_seed(5)
    n = 2048
    ei = torch.stack([torch.randint(0, n, (6 * n,), generator=g),
                      torch.randint(0, n, (6 * n,), generator=g)])
    ei = torch.cat([ei, torch.stack([torch.arange(8), torch.arange(8)])], 1)  # one local block
    lay = GraphLayout.from_edge_index(ei.cuda(), (n, n))
    first = tiles.layout_tiles(lay, plan.DENSE_MIN_FRACTION)
    assert first.tiles is None and first.min_fraction == plan.DENSE_MIN_FRACTION
    assert tiles.layout_tiles(lay, plan.DENSE_MIN_FRACTION) is first  # kept
    forced = tiles.layout_tiles(lay)
    assert forced is not first and forced.min_fraction == 0.0
    want = tiles.build_tile_plan(lay.rowptr, lay.col, lay.csr_row, n, n)
    assert (forced.tiles is None) == (want is None)
    if want is not None:
        assert torch.equal(forced.tiles, want)


@pytest.mark.cuda
def test_layout_tiles_gives_up_on_empty_tail_rows_without_device_work(monkeypatch):
    """Blocks past ``dst_extent`` have no edge: where they leave fewer than
    ``min_fraction`` of the blocks, the plan is given up without a build."""
    n, extent = 4096, 1024
    g = torch.Generator().manual_seed(6)
    dst = torch.randint(0, extent, (4 * extent,), generator=g)
    ei = torch.stack([dst, dst]).cuda()  # local: every block with edges is dense
    lay = GraphLayout.from_edge_index(ei, (n, n))
    assert lay.dst_extent <= extent
    calls = []
    monkeypatch.setattr(tiles, "build_tile_plan", lambda *a: calls.append(a))
    entry = tiles.layout_tiles(lay, plan.DENSE_MIN_FRACTION)
    assert entry.tiles is None and entry.dense_fraction == 0.0 and not calls
    tiles.layout_tiles(lay)  # forced: builds
    assert len(calls) == 1
