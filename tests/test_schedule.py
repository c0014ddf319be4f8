"""SMMF/PMF choice (paper §4.2), kernel coverage (pyg_dfgnn.ops.plan) and the work
split (pyg_dfgnn.work_items)."""
from __future__ import annotations

import pytest
import torch

from conftest import random_graph
from pyg_dfgnn import work_items
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import plan
from pyg_dfgnn.ops.plan import MAX_ROW_BYTES, MAX_SCALAR_C, choose_strategy, kernel_supports
from pyg_dfgnn.work_items import split_work


def row_work(lay, chunk):
    return lay.work("row", chunk)


def col_work(lay, chunk):
    return lay.work("col", chunk)


# ----------------------------------------------------------------------------- choose_strategy
@pytest.mark.parametrize("score", ["dot", "cosine"])
@pytest.mark.parametrize("elem_size", [4, 2])
def test_paper_rule_follows_shared_memory(score, elem_size):
    capacity = 2048
    threshold = capacity // elem_size  # paper: max deg >= capacity / bytes per element
    kw = dict(score=score, elem_size=elem_size, capacity=capacity, rule="paper")
    assert choose_strategy(threshold - 1, **kw) == "smmf"
    assert choose_strategy(threshold, **kw) == "pmf"
    assert choose_strategy(10 * threshold, **kw) == "pmf"
    assert choose_strategy(0, **kw) == "smmf"
    # fp16 halves the bytes per element: twice the degree fits before PMF
    if elem_size == 2:
        fp32_threshold = capacity // 4
        assert choose_strategy(fp32_threshold, score=score, elem_size=4,
                               capacity=capacity, rule="paper") == "pmf"
        assert choose_strategy(fp32_threshold, **kw) == "smmf"


def test_paper_rule_default_capacity_is_the_device():
    cap = plan.shared_memory_per_block()
    assert cap > 0
    assert choose_strategy(cap // 4, "dot", 4, rule="paper") == "pmf"
    assert choose_strategy(cap // 4 - 1, "dot", 4, rule="paper") == "smmf"


@pytest.mark.parametrize("score", ["dot", "cosine", "additive"])
def test_measured_rule_is_smmf_and_default(score):
    for deg in (0, 5, 10 ** 5, 10 ** 7):
        assert choose_strategy(deg, score, 4, capacity=16) == "smmf"
        assert choose_strategy(deg, score, 2, capacity=16) == "smmf"
    expect = "smmf" if score == "additive" else "pmf"
    with plan.override(rule="paper"):
        assert choose_strategy(10 ** 7, score, 4, capacity=16) == expect
    assert choose_strategy(10 ** 7, score, 4, capacity=16) == "smmf"


def test_additive_is_always_smmf():
    # paper Fig. 12, and measured on the H100
    for deg in (0, 5, 10 ** 7):
        for rule in ("paper", "measured"):
            for elem in (2, 4):
                assert choose_strategy(deg, "additive", elem, capacity=16, rule=rule) == "smmf"


def test_chunk_default_and_override():
    small = GraphLayout.from_edge_index(random_graph(50, num_edges=100), (50, 50))
    assert work_items.chunk_for(small.num_edges) == work_items.SMALL_GRAPH_CHUNK
    assert work_items.chunk_for(work_items.SMALL_GRAPH_EDGES) == work_items.DEFAULT_CHUNK
    assert plan.plan_for(small, torch.float32, 32).chunk == work_items.SMALL_GRAPH_CHUNK
    with plan.override(chunk=48):
        assert plan.plan_for(small, torch.float32, 32).chunk == 48
    assert row_work(small, 48)[0][:, 1].tolist() == small.rowptr[:-1].tolist()  # row order


@pytest.mark.parametrize("forced", ["smmf", "pmf"])
@pytest.mark.parametrize("score", ["dot", "cosine", "additive"])
def test_forced_strategy_returned(forced, score):
    for deg in (0, 3, 10 ** 6):
        assert choose_strategy(deg, score, 4, forced) == forced


def test_invalid_strategy_or_score():
    with pytest.raises(ValueError, match="strategy"):
        choose_strategy(10, "dot", 4, "fastest")
    with pytest.raises(ValueError, match="strategy"):
        choose_strategy(10, "dot", 4, "SMMF")
    with pytest.raises(ValueError, match="score"):
        choose_strategy(10, "softmax", 4)
    with pytest.raises(ValueError, match="score"):
        choose_strategy(10, "sigmoid", 4, "pmf")
    with pytest.raises(ValueError, match="rule"):
        choose_strategy(10, "dot", 4, rule="fastest")


# ----------------------------------------------------------------------------- kernel_supports
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_supports(dtype):
    esize = torch.empty((), dtype=dtype).element_size()
    vec_c = 16 // esize  # channels per 16-byte vector
    max_vec_c = MAX_ROW_BYTES // esize
    # vectorised: multiples of 16 bytes up to MAX_ROW_BYTES per head row
    assert kernel_supports(vec_c, dtype)
    assert kernel_supports(max_vec_c, dtype)
    # scalar path: any C up to MAX_SCALAR_C
    for c in (1, 3, 7, MAX_SCALAR_C):
        assert kernel_supports(c, dtype)
    # neither: not a 16-byte multiple and above the scalar limit
    odd = MAX_SCALAR_C + 1
    if (odd * esize) % 16 == 0:
        odd += 1
    assert not kernel_supports(odd, dtype)
    # 16-byte multiple but above MAX_ROW_BYTES (and above the scalar limit)
    assert max_vec_c + vec_c > MAX_SCALAR_C
    assert not kernel_supports(max_vec_c + vec_c, dtype)
    assert not kernel_supports(0, dtype)


def test_kernel_supports_rejects_other_dtypes():
    for dtype in (torch.float64, torch.int32, torch.int64, torch.bool):
        assert not kernel_supports(16, dtype)


# ----------------------------------------------------------------------------- work split
def _layout_with_super_node(chunk):
    # destination 0 is a super node (in-degree 3 * chunk + 1), rows 1 and 2 have
    # exactly chunk and chunk + 1 edges, some rows are isolated; source 5 has a
    # large out-degree (the CSC split of the backward).
    n = 12
    base = random_graph(n, n - 3, num_edges=30, num_isolated=4, num_duplicates=0)
    base[1] += 3  # rows 0-2 get only the edges below
    parts = [base]
    parts.append(torch.stack([torch.randint(0, n, (3 * chunk + 1,)),
                              torch.zeros(3 * chunk + 1, dtype=torch.long)]))
    parts.append(torch.stack([torch.randint(0, n, (chunk,)), torch.full((chunk,), 1)]))
    parts.append(torch.stack([torch.randint(0, n, (chunk + 1,)), torch.full((chunk + 1,), 2)]))
    parts.append(torch.stack([torch.full((2 * chunk,), 5), torch.randint(3, n, (2 * chunk,))]))
    ei = torch.cat(parts, 1)
    ei = ei[:, torch.randperm(ei.size(1))]
    return GraphLayout.from_edge_index(ei, (n, n))


def check_split(ptr, items, combine, num_slots, chunk):
    """Items cover every edge exactly once, each row has >= 1 item, split rows'
    slots are contiguous and in edge order, ``combine`` describes exactly them."""
    assert items.dtype == torch.int32 and combine.dtype == torch.int32
    assert items.dim() == 2 and items.size(1) == 3 and combine.size(1) == 3
    ptr = ptr.long()
    deg = ptr[1:] - ptr[:-1]
    E, N = int(ptr[-1]), deg.numel()
    row, start, slot = items.long().unbind(1)
    cover = torch.zeros(E, dtype=torch.long)
    for r, s in zip(row.tolist(), start.tolist()):
        assert ptr[r] <= s <= ptr[r + 1]
        assert s == ptr[r] or s < ptr[r + 1]  # only a degree-0 row has an empty item
        cover[s:min(s + chunk, int(ptr[r + 1]))] += 1
    assert torch.equal(cover, torch.ones(E, dtype=torch.long))
    per_row = torch.bincount(row, minlength=N)
    assert per_row.numel() == N and (per_row >= 1).all()
    assert torch.equal(per_row, torch.clamp((deg + chunk - 1) // chunk, min=1))
    split = per_row > 1
    assert (slot[~split[row]] == -1).all()
    assert torch.equal(combine[:, 0].long(), split.nonzero().flatten())
    assert num_slots == int(per_row[split].sum())
    seen = []
    for r, first, count in combine.long().tolist():
        mine = (row == r).nonzero().flatten()
        assert count == mine.numel() == int(per_row[r])
        order = torch.argsort(start[mine])
        assert torch.equal(slot[mine][order], torch.arange(first, first + count))
        seen.extend(range(first, first + count))
    assert sorted(seen) == list(range(num_slots))
    return per_row


@pytest.mark.parametrize("chunk", [4, 7])
def test_row_work_items(chunk):
    lay = _layout_with_super_node(chunk)
    items, combine, num_slots = row_work(lay, chunk)
    per_row = check_split(lay.rowptr, items, combine, num_slots, chunk)
    assert int(per_row[0]) == 4 and int(per_row[1]) == 1 and int(per_row[2]) == 2
    assert combine.size(0) >= 2


@pytest.mark.parametrize("chunk", [4, 7])
def test_col_work_items(chunk):
    lay = _layout_with_super_node(chunk)
    items, combine, num_slots = col_work(lay, chunk)
    per_col = check_split(lay.colptr, items, combine, num_slots, chunk)
    assert per_col.numel() == lay.num_src
    assert int(per_col[5]) >= 2  # the high out-degree source is split


def test_split_work_on_any_pointer():
    deg = torch.tensor([0, 1, 9, 3, 0, 10])
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), deg.cumsum(0)])
    items, combine, num_slots = split_work(ptr.int(), 3)
    per_row = check_split(ptr, items, combine, num_slots, 3)
    assert per_row.tolist() == [max(1, -(-d // 3)) for d in deg.tolist()]
    # split rows: items longest first, equal lengths in row order (3, 1, 0 edges)
    n_edges = [min(int(ptr[r + 1]) - s, 3) for r, s in items[:, :2].tolist()]
    assert n_edges == sorted(n_edges, reverse=True)
    assert items[:, 0].tolist() == [2, 2, 2, 3, 5, 5, 5, 1, 5, 0, 4]
    in_row_order = split_work(ptr.int(), 3, long_first=False)[0]
    assert in_row_order[:, 0].tolist() == [0, 1, 2, 2, 2, 3, 4, 5, 5, 5, 5]


def test_work_is_cached_per_chunk():
    lay = _layout_with_super_node(4)
    a = row_work(lay, 4)
    assert row_work(lay, 4) is a
    b = row_work(lay, 8)
    assert b is not a and b[0].size(0) < a[0].size(0)
    c = col_work(lay, 4)
    assert col_work(lay, 4) is c and c is not a
    assert row_work(lay, work_items.chunk_for(lay.num_edges))[0].size(0) >= lay.num_dst


def test_work_without_split_rows():
    ei = random_graph(10, num_edges=20)
    lay = GraphLayout.from_edge_index(ei, (10, 10))
    items, combine, num_slots = row_work(lay, chunk=1000)
    assert items.size(0) == 10 and combine.size(0) == 0 and num_slots == 0
    assert torch.equal(items[:, 1].long(), lay.rowptr[:-1].long())  # no split rows: row order
