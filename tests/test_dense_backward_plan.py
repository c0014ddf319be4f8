"""CPU tests of what the dense-tile backward (cuda/scores/dot_backward_dense.cu)
reads and how the kernel plan picks it: the transposed graph's tile plan, the
map from an edge's rank in its row to its CSR position, the windows test, the
plan fields dense_backward and save_weights (rule, override, flags, kernel
names, why) and the plan object's parts, and the C++ plan object's checks of
them (with the extension). The tile plans live on CUDA layouts only, so the
plan tests stand in tile plans for a CPU layout."""
import pytest
import torch
from torch_geometric.utils import coalesce

import pyg_dfgnn
from pyg_dfgnn.derived import BackwardTiles, Derived
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import calls, plan, tiles

BF16 = torch.bfloat16


def _batch(gen, n_graphs=30, density=0.3, bipartite=False):
    """Small random graphs one after the other (edges in random order, so rows
    are not sorted by source), duplicates in the first ones, a few far edges
    (windows over 512 wide), isolated nodes; (edge_index, N_src, N_dst)."""
    src, dst, os_, od = [], [], 0, 0
    for i in range(n_graphs):
        ns = int(torch.randint(20, 120, (1,), generator=gen))
        nd = int(torch.randint(20, 120, (1,), generator=gen)) if bipartite else ns
        cells = torch.randperm(ns * (nd - 1), generator=gen)[:int(density * ns * nd)]
        s, d = cells % ns + os_, cells // ns + od  # destination nd - 1: no in-edges
        src += [s, s[::7]] if i < 2 else [s]
        dst += [d, d[::7]] if i < 2 else [d]
        os_, od = os_ + ns, od + nd
    far = torch.randint(0, min(os_, od), (5,), generator=gen)
    src.append((far + os_ // 2) % os_)
    dst.append(far)
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    ei = ei[:, torch.randperm(ei.size(1), generator=gen)]
    return ei, os_ + 3, od + 5  # and isolated nodes past the graphs


def _transposed(lay):
    got = tiles.transposed_tile_plan(lay)
    # the sources from the column pointers are those of col through the CSC's perm
    src = lay.col[lay.perm.long()]
    want = tiles.build_tile_plan(lay.colptr, lay.row, src, lay.num_src, lay.num_dst)
    assert (got is None) == (want is None) and (got is None or torch.equal(got, want))
    return got


def _decode(plan_t, n_rows):
    """The (row, key) pairs of the plan's dense blocks, and those blocks' rows."""
    meta = plan_t[:tiles.META_INTS * ((n_rows + 63) // 64)].view(-1, tiles.META_INTS)
    pairs, rows = set(), set()
    for b, (lo, width, edges, off, *_rest) in enumerate(meta.tolist()):
        if lo < 0:
            continue
        count = 0
        for c in range((width + 31) // 32):
            for r in range(64):
                word = int(plan_t[off + 64 * c + r]) & 0xFFFFFFFF
                for j in range(32):
                    if word >> j & 1:
                        pairs.add((64 * b + r, lo + 32 * c + j))
                        count += 1
        assert count == edges
        rows.update(range(64 * b, min(64 * b + 64, n_rows)))
    return pairs, rows


@pytest.mark.parametrize("bipartite", [False, True])
def test_transposed_tile_plan_is_the_plan_of_the_reversed_graph(bipartite):
    gen = torch.Generator().manual_seed(3)
    ei, ns, nd = _batch(gen, bipartite=bipartite)
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    plan_t = _transposed(lay)
    # The plan is a function of the edge set: the transposed graph's plan is the
    # plan of the graph with its edges reversed (whose CSR is this CSC).
    rev = GraphLayout.from_edge_index(ei.flip(0), (nd, ns))
    want = tiles.build_tile_plan(rev.rowptr, rev.col, rev.csr_row, rev.num_dst, rev.num_src)
    assert torch.equal(plan_t, want)
    # Its dense blocks hold each out-edge of their sources once; blocks with a
    # duplicate edge or a far edge run sparse; both kinds are there.
    pairs, rows = _decode(plan_t, ns)
    edges = {(s, d) for s, d in ei.t().tolist() if s in rows}
    assert pairs == edges
    lo = plan_t[:tiles.META_INTS * ((ns + 63) // 64)].view(-1, tiles.META_INTS)[:, 0]
    assert (lo >= 0).any() and (lo < 0).any()


def test_rank_positions_order_each_row_by_source():
    gen = torch.Generator().manual_seed(4)
    ei, ns, nd = _batch(gen, n_graphs=10)
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    rp = tiles.rank_positions(lay.col, lay.csr_row, lay.num_src)
    assert rp is not None and rp.dtype == torch.int32
    rp = rp.long()
    assert torch.equal(rp.sort().values, torch.arange(lay.num_edges))  # a permutation
    assert torch.equal(lay.csr_row[rp], lay.csr_row)  # within the rows
    key = lay.csr_row.long() * lay.num_src + lay.col[rp].long()
    assert (key[1:] >= key[:-1]).all()  # by source within a row
    # Rows sorted by source: the identity, no tensor.
    order = torch.argsort(ei[1] * ns + ei[0])
    srt = GraphLayout.from_edge_index(ei[:, order], (ns, nd))
    assert tiles.rank_positions(srt.col, srt.csr_row, srt.num_src) is None


def test_cpu_layout_has_no_transposed_plan():
    gen = torch.Generator().manual_seed(5)
    ei, ns, nd = _batch(gen, n_graphs=4)
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    assert tiles.layout_tiles_t(lay) is None
    assert not plan.plan_for(lay, BF16, 64).dense_backward


def test_derived_moves_and_lists_the_backward_tiles():
    d = Derived()
    t, r = torch.arange(16, dtype=torch.int32), torch.arange(4, dtype=torch.int32)
    d.tile_plan_t = BackwardTiles(t, r)
    moved = d.to(torch.device("cpu"))
    assert torch.equal(moved.tile_plan_t.tiles_t, t) and torch.equal(moved.tile_plan_t.rank_pos, r)
    assert any(x is t for x in d.tensors()) and any(x is r for x in d.tensors())
    d.tile_plan_t = BackwardTiles(t, None)
    assert d.to(torch.device("cpu")).tile_plan_t.rank_pos is None


@pytest.fixture
def tiled(monkeypatch):
    """A CPU layout past the one-launch backward whose calls see tile plans, as a
    CUDA layout's would (the dense-tile rule holds); `tiled.tiles_t` is what the
    transposed plan's build returns."""
    gen = torch.Generator().manual_seed(6)
    n = 4000  # 20 in-edges a row: no split rows, no hub column
    src = torch.randint(0, n, (20 * n,), generator=gen)
    dst = torch.arange(n).repeat(20)
    lay = GraphLayout.from_edge_index(torch.stack([src, dst]), (n, n))
    fake = torch.zeros(tiles.META_INTS * ((n + 63) // 64), dtype=torch.int32)
    state = type("Tiled", (), {})()
    state.lay, state.tiles_t = lay, BackwardTiles(fake, torch.arange(lay.num_edges,
                                                                     dtype=torch.int32))
    monkeypatch.setattr(plan, "_dense_cells",
                        lambda layout, mode: (0.0 if mode == "off" else
                                              plan.DENSE_BLOCK_MAX_CELLS, True))
    state.median_cells = 5.0  # a PATTERN-like batch's
    monkeypatch.setattr(plan, "_median_cells", lambda layout: state.median_cells)
    monkeypatch.setattr(plan, "layout_tiles_t", lambda layout: state.tiles_t)
    monkeypatch.setattr(calls, "layout_tiles_t", lambda layout: state.tiles_t)
    monkeypatch.setattr(calls, "layout_rank_pos", lambda layout: state.tiles_t.rank_pos)
    monkeypatch.setattr(calls, "tile_plan", lambda layout: fake)
    return state


def test_dense_backward_follows_the_dense_forward(tiled):
    lay = tiled.lay
    p = plan.plan_for(lay, BF16, 128)
    assert p.dense_cells > 0 and p.mma_backward and p.dense_backward
    assert p.flags()["dense_backward"] == 1
    names = [k for k, _ in p.kernels(backward=True)]
    # D comes from the dq launch (no out_dsum pass)
    assert names == ["dot:dq_dense", "dot:dkv_dense"]
    assert [k for k, _ in p.kernels()] == ["dot:fwd_dense"]
    assert dict(p.why)["dense_backward"].startswith("dense tiles in the backward")
    # Where the forward has no dense tiles or the backward no tensor cores: off.
    with plan.override(dense_tiles="off"):
        assert not plan.plan_for(lay, BF16, 128).dense_backward
    with plan.override(mma_backward=False):
        q = plan.plan_for(lay, BF16, 128)
        assert not q.dense_backward and q.flags()["dense_backward"] == 0
    assert not plan.plan_for(lay, BF16, 128, dropout=True).dense_backward
    assert not plan.plan_for(lay, torch.float32, 128).dense_backward
    assert not plan.plan_for(lay, BF16, 48).dense_backward
    # The cosine score in half precision normalises first and runs the dot
    # score's kernels, dense tiles included; the additive score has none.
    p = plan.plan_for(lay, BF16, 128, score="cosine")
    assert p.normalize_first and p.dense_cells > 0 and p.dense_backward
    assert [k for k, _ in p.kernels()][-1] == "dot:fwd_dense"
    names = [k for k, _ in p.kernels(backward=True)]
    assert "dot:dq_dense" in names and "dot:dkv_dense" in names
    assert not plan.plan_for(lay, BF16, 128, score="additive").dense_backward


def test_dense_backward_override(tiled):
    lay = tiled.lay
    with plan.override(dense_backward=False):
        p = plan.plan_for(lay, BF16, 64)
        assert p.mma_backward and not p.dense_backward
        assert [k for k, _ in p.kernels(backward=True)] == ["dot:dq_mma",
                                                            "dot:dkv_mma"]
        assert dict(p.why)["dense_backward"] == "off (override)"
    assert plan.plan_for(lay, BF16, 128).dense_backward  # the override is part of the key
    with plan.override(dense_backward=True):
        assert plan.plan_for(lay, BF16, 64).dense_backward
        with plan.override(mma_backward=False), pytest.raises(ValueError, match="dense_backward"):
            plan.plan_for(lay, BF16, 64)
    with pytest.raises(ValueError, match="dense_backward must be a bool"):
        with plan.override(dense_backward=1):
            pass


def test_dense_backward_by_default_where_the_windows_are_narrow(tiled):
    """On by default for every head size where the forward's median window is
    narrow (PATTERN-like); off where it holds more cells per edge than
    DENSE_BACKWARD_MAX_CELLS (MNIST-like: the sparse walks measured faster);
    the override forces it there."""
    for C in (32, 64, 128):
        assert plan.plan_for(tiled.lay, BF16, C).dense_backward
    tiled.median_cells = plan.DENSE_BACKWARD_MAX_CELLS + 5.6
    tiled.lay.derived.plans.clear()
    for C in (32, 64, 128):
        p = plan.plan_for(tiled.lay, BF16, C)
        assert p.dense_cells > 0 and p.mma_backward and not p.dense_backward
        assert dict(p.why)["dense_backward"].startswith("off: the median window holds 17.6")
        with plan.override(dense_backward=True):
            assert plan.plan_for(tiled.lay, BF16, C).dense_backward


def test_dense_backward_off_without_a_dense_transposed_block(tiled):
    tiled.tiles_t = BackwardTiles(None, None)
    p = plan.plan_for(tiled.lay, BF16, 128)
    assert p.dense_cells > 0 and p.mma_backward and not p.dense_backward
    assert "no 64-source block" in dict(p.why)["dense_backward"]
    with plan.override(dense_backward=True), pytest.raises(ValueError, match="64-source"):
        plan.plan_for(tiled.lay, BF16, 128)


def test_plan_parts_carry_the_transposed_plan_with_the_csc(tiled):
    lay = tiled.lay
    p = plan.plan_for(lay, BF16, 128)
    tensors, ints, _ = calls.plan_parts(lay, p, need_grad=True)
    assert tensors["tiles_t"] is tiled.tiles_t.tiles_t
    assert tensors["rank_pos"] is tiled.tiles_t.rank_pos
    assert ints["dense_backward"] == 1
    tensors, ints, _ = calls.plan_parts(lay, p, need_grad=False)  # no backward, no CSC
    assert "tiles_t" not in tensors and "rank_pos" not in tensors and "colptr" not in tensors
    tiled.tiles_t = tiled.tiles_t._replace(rank_pos=None)  # rows sorted by source
    tensors, _, _ = calls.plan_parts(lay, p, need_grad=True)
    assert "tiles_t" in tensors and "rank_pos" not in tensors


@pytest.mark.parametrize("sort", [False, True])
def test_mask_ranks_find_each_edges_csr_position(sort):
    """What the dq launch's dense blocks compute per mask bit (row r, key lo + 32 c
    + j): rowptr[r] + the row's bits in chunks before c + its bits below j, mapped
    through rank_pos where defined, is the CSR position of that very edge."""
    gen = torch.Generator().manual_seed(7)
    ei, ns, nd = _batch(gen, n_graphs=12)
    if sort:
        ei = ei[:, torch.argsort(ei[1] * ns + ei[0])]
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    plan_f = tiles.build_tile_plan(lay.rowptr, lay.col, lay.csr_row, nd, ns)
    rank_pos = tiles.rank_positions(lay.col, lay.csr_row, ns)
    assert (rank_pos is None) == sort
    meta = plan_f[:tiles.META_INTS * ((nd + 63) // 64)].view(-1, tiles.META_INTS)
    seen = 0
    for b, (lo, width, _, off, *_rest) in enumerate(meta.tolist()):
        if lo < 0:
            continue
        for r in range(64 * b, min(64 * b + 64, nd)):
            rank = 0
            for c in range((width + 31) // 32):
                word = int(plan_f[off + 64 * c + r - 64 * b]) & 0xFFFFFFFF
                for j in range(32):
                    if word >> j & 1:
                        pos = int(lay.rowptr[r]) + rank + bin(word & ((1 << j) - 1)).count("1")
                        if rank_pos is not None:
                            pos = int(rank_pos[pos])
                        assert int(lay.csr_row[pos]) == r and int(lay.col[pos]) == lo + 32 * c + j
                        seen += 1
                rank += bin(word).count("1")
    assert seen > lay.num_edges // 2  # most edges sit in dense blocks


@pytest.mark.skipif(not pyg_dfgnn.HAS_EXTENSION,
                    reason="needs the compiled extension pyg_dfgnn._C")
def test_plan_object_checks_the_transposed_plan(tiled):
    """The C++ plan object takes tiles_t exactly where dense_backward is set and
    the CSC comes (a call that records a backward), and checks it and rank_pos."""
    lay = tiled.lay
    p = plan.plan_for(lay, BF16, 128)
    t, ints, floats = calls.plan_parts(lay, p, need_grad=True)

    def build(tensors=t, flags=ints):
        return torch.classes.dfgnn.Plan("dot", tensors, flags, floats)
    build()  # well formed
    build(*calls.plan_parts(lay, p, need_grad=False)[:2])  # no backward: no tiles_t
    no_t = {k: v for k, v in t.items() if k not in ("tiles_t", "rank_pos")}
    with pytest.raises(RuntimeError, match="tiles_t"):
        build(no_t)
    with pytest.raises(RuntimeError, match="tiles_t"):
        build(flags={**ints, "dense_backward": 0})
    with pytest.raises(RuntimeError, match="needs mma_backward=1"):
        build(flags={**ints, "mma_backward": 0})
    with pytest.raises(RuntimeError, match="rank_pos is the dense-tile backward's"):
        build({**no_t, "rank_pos": t["rank_pos"]}, {**ints, "dense_backward": 0})
    with pytest.raises(RuntimeError, match="tiles_t must hold"):
        build({**t, "tiles_t": t["tiles_t"][:8].clone()})
    with pytest.raises(RuntimeError, match="rank_pos must have"):
        build({**t, "rank_pos": t["rank_pos"][:-1].clone()})
    with pytest.raises(RuntimeError, match="tiles_t must be 16-byte aligned"):
        build({**t, "tiles_t": torch.zeros(t["tiles_t"].numel() + 1, dtype=torch.int32)[1:]})


def test_every_block_windowed():
    """True where every block with edges has a window (a batch graph without
    duplicates or far edges); False where a duplicate or a far edge sends a
    block to the sparse units; blocks without edges do not count."""
    gen = torch.Generator().manual_seed(8)
    ei, ns, nd = _batch(gen, n_graphs=12)
    lay = GraphLayout.from_edge_index(ei, (ns, nd))
    assert not tiles.every_block_windowed(_transposed(lay), ns)
    # Without the duplicates (first two graphs) and the far edges (the last 5):
    # every block with edges has a window, the isolated nodes' blocks included.
    ei = coalesce(ei[:, (ei[0] - ei[1]).abs() < 200])  # graphs hold under 120 nodes
    clean = GraphLayout.from_edge_index(ei, (ns + 200, nd))
    plan_t = _transposed(clean)
    meta = plan_t[:tiles.META_INTS * ((ns + 200 + 63) // 64)].view(-1, tiles.META_INTS)
    assert (meta[:, 2] == 0).any()  # blocks without edges (sources past the graphs)
    assert tiles.every_block_windowed(plan_t, ns + 200)


def test_dense_backward_saves_no_weights_where_every_block_has_a_window(tiled):
    lay = tiled.lay
    rank = torch.arange(lay.num_edges, dtype=torch.int32)
    tiled.tiles_t = BackwardTiles(tiled.tiles_t.tiles_t, rank, windowed=True)
    p = plan.plan_for(lay, BF16, 128)
    assert p.dense_backward and not p.save_weights
    assert p.flags()["save_weights"] == 0
    assert dict(p.why)["save_weights"].startswith("off: every 64-source block")
    kernels = dict(p.kernels(backward=True))
    assert list(kernels) == ["dot:dq_dense", "dot:dkv_dense"]
    assert "saves" not in kernels["dot:dq_dense"]
    tensors, ints, _ = calls.plan_parts(lay, p, need_grad=True)
    assert "tiles_t" in tensors and "rank_pos" not in tensors and ints["save_weights"] == 0
    # Forced on, the weights are saved and the rank map comes with them.
    with plan.override(save_weights=True):
        q = plan.plan_for(lay, BF16, 128)
        assert q.save_weights and dict(q.why)["save_weights"] == "on (override)"
        assert "saves" in dict(q.kernels(backward=True))["dot:dq_dense"]
        tensors, ints, _ = calls.plan_parts(lay, q, need_grad=True)
        assert tensors["rank_pos"] is rank and ints["save_weights"] == 1
    # Without the dense backward the weights are always saved.
    with plan.override(dense_backward=False):
        assert plan.plan_for(lay, BF16, 128).save_weights


def test_dense_backward_saves_weights_where_a_block_has_no_window(tiled):
    p = plan.plan_for(tiled.lay, BF16, 128)  # the fixture's entry: not windowed
    assert p.dense_backward and p.save_weights
    assert dict(p.why)["save_weights"].startswith("on: a 64-source block has no window")
    with plan.override(save_weights=False), pytest.raises(ValueError, match="has no window"):
        plan.plan_for(tiled.lay, BF16, 128)


def test_derived_moves_the_backward_tiles_flags():
    d = Derived()
    t = torch.arange(16, dtype=torch.int32)
    d.tile_plan_t = BackwardTiles(t, None, windowed=True, ranked=False)
    moved = d.to(torch.device("cpu")).tile_plan_t
    assert moved.windowed and not moved.ranked and moved.rank_pos is None
    assert list(d.tensors()) == [t]


@pytest.mark.skipif(not pyg_dfgnn.HAS_EXTENSION,
                    reason="needs the compiled extension pyg_dfgnn._C")
def test_plan_object_takes_save_weights_only_with_the_dense_backward(tiled):
    lay = tiled.lay
    tiled.tiles_t = BackwardTiles(tiled.tiles_t.tiles_t, None, windowed=True)
    p = plan.plan_for(lay, BF16, 128)
    t, ints, floats = calls.plan_parts(lay, p, need_grad=True)
    torch.classes.dfgnn.Plan("dot", t, ints, floats)  # well formed
    with plan.override(dense_backward=False):
        q = plan.plan_for(lay, BF16, 128)
    t, ints, floats = calls.plan_parts(lay, q, need_grad=True)
    with pytest.raises(RuntimeError, match="save_weights=0 needs dense_backward=1"):
        torch.classes.dfgnn.Plan("dot", t, {**ints, "save_weights": 0}, floats)
