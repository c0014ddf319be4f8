"""The kernel plan (pyg_dfgnn/ops/plan.py): its decisions on representative graphs,
override(), and the module boundaries it relies on (no policy in cuda/, the layout
below the ops)."""
from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import random_graph
from pyg_dfgnn.layout import GraphLayout
from pyg_dfgnn.ops import plan, spec
from pyg_dfgnn.work_items import DEFAULT_CHUNK, SMALL_GRAPH_CHUNK

ROOT = Path(__file__).resolve().parents[1]
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _layout(n, n_edges, hub=0):
    ei = random_graph(n, num_edges=n_edges)
    if hub:  # a destination longer than any chunk: split rows
        ei = torch.cat([ei, torch.stack([torch.randint(0, n, (hub,)),
                                         torch.zeros(hub, dtype=torch.long)])], 1)
    return GraphLayout.from_edge_index(ei, (n, n))


def _chain(n, deg):
    """``deg`` in-edges per row (rows never split), ``n * deg`` edges."""
    dst = torch.arange(n).repeat_interleave(deg)
    return GraphLayout.from_edge_index(torch.stack([torch.randint(0, n, (n * deg,)), dst]),
                                       (n, n))


# ------------------------------------------------------------------------ decisions
def test_small_graph_plan():
    lay = _layout(300, 3000)
    p = plan.plan_for(lay, F32, 64)
    assert (p.method, p.chunk, p.long_items_first) == ("smmf", SMALL_GRAPH_CHUNK, True)
    assert not p.two_rows and not p.mma and p.dense_cells == 0
    assert p.bwd_one_launch  # under 2^16 edges


def test_large_graph_without_split_rows_runs_two_rows():
    lay = _chain(1 << 15, 8)  # 2^18 edges, in-degree 8
    p = plan.plan_for(lay, F32, 32)
    assert p.chunk == DEFAULT_CHUNK and p.two_rows and not p.bwd_one_launch
    assert plan.plan_for(lay, F32, 32, strategy="pmf").two_rows is False
    gat = plan.plan_for(lay, F32, 32, score="additive")
    assert gat.two_rows and not gat.mma and not gat.bwd_one_launch


def test_lanes_per_row_mirror_the_row_shapes():
    """``dispatch_row_shape``'s G: 16-byte vectors over 4 to 32 lanes, scalar rows 32."""
    assert [plan.lanes_per_row(c, F32) for c in (8, 16, 32, 64, 128, 256, 100, 7)] == [
        4, 4, 8, 16, 32, 32, 32, 32]
    assert [plan.lanes_per_row(c, BF16) for c in (32, 64, 128, 24, 5)] == [4, 8, 16, 4, 32]


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_additive_forward_walk(dtype):
    """The additive score's fp32 SMMF forward runs the shared row walk on graphs
    of low mean in-degree, and on denser ones where a row takes few lanes and no
    row is split; its own walk elsewhere and in half precision. PMF and the scores
    with one SMMF forward never set row_walk, and the plan names the kernel that
    runs."""
    sparse = _chain(4000, 6)  # mean in-degree 6
    dense = _chain(2000, 24)  # 24, no split rows (a row within one 32-edge item)
    hub = _layout(2000, 80_000, hub=500)  # 40, split rows
    cases = [(sparse, 128, True), (sparse, 8, True), (dense, 8, True), (dense, 128, False),
             (hub, 8, False), (hub, 128, False)]
    half = dtype != F32
    for lay, C, want in cases:
        want = want and not half
        p = plan.plan_for(lay, dtype, C, score="additive")
        lanes = plan.lanes_per_row(C, dtype)
        assert p.row_walk == want, (lay.num_edges, C, p.why)
        assert p.row_walk == (not half and (
            lay.num_edges / lay.num_dst <= plan.ROW_WALK_MAX_MEAN_DEGREE
            or (lanes <= plan.ROW_WALK_MAX_LANES and not p.split_rows)))
        assert p.kernels()[0][0] == ("additive:row_smmf" if want else "additive:smmf")
        assert dict(p.why)["row_walk"].startswith("fp16 / bf16" if half else "mean in-degree")
        assert p.flags()["row_walk"] == int(want)
        assert not plan.plan_for(lay, dtype, C, score="additive", strategy="pmf").row_walk
        for other in ("dot", "gatv2", "additive_edge", "cosine"):
            assert not plan.plan_for(lay, dtype, C, score=other).row_walk
        for forced in (True, False):
            with plan.override(row_walk=forced):
                p = plan.plan_for(lay, dtype, C, score="additive")
                assert p.row_walk is forced
                assert dict(p.why)["row_walk"].endswith("(override)")


def test_row_walk_override_needs_a_score_with_two_walks():
    lay = _layout(300, 3000)
    for score, strategy in (("gatv2", "smmf"), ("additive_edge", "smmf"), ("additive", "pmf")):
        with plan.override(row_walk=True), pytest.raises(ValueError, match="row_walk"):
            plan.plan_for(lay, F32, 32, score=score, strategy=strategy)
    with plan.override(row_walk=False):  # off is always possible
        assert not plan.plan_for(lay, F32, 32, score="gatv2").row_walk
    with pytest.raises(ValueError, match="row_walk must be a bool"):
        with plan.override(row_walk=1):
            pass


def test_split_rows_turn_two_rows_and_tensor_cores_off():
    lay = _layout(2000, 4000, hub=500)
    assert lay.work("row", SMALL_GRAPH_CHUNK).num_slots > 0
    p = plan.plan_for(lay, BF16, 64)
    assert not p.two_rows and not p.mma


@pytest.mark.parametrize("dtype,C,mma", [(F16, 32, True), (BF16, 64, True), (BF16, 128, True),
                                         (BF16, 48, False), (F32, 64, False)])
def test_tensor_core_eligibility(dtype, C, mma):
    lay = _layout(300, 3000)
    with plan.override(chunk=DEFAULT_CHUNK):  # no split rows
        assert plan.plan_for(lay, dtype, C).mma == mma
        assert not plan.plan_for(lay, dtype, C, dropout=True).mma
        assert not plan.plan_for(lay, dtype, C, need_attn=True).mma
        assert not plan.plan_for(lay, dtype, C, strategy="pmf").mma
        assert not plan.plan_for(lay, dtype, C, score="additive").mma
        assert plan.plan_for(lay, dtype, C, score="cosine").mma == mma


def test_cpu_layout_has_no_dense_tiles():
    lay = _layout(300, 3000)
    with plan.override(chunk=DEFAULT_CHUNK, dense_tiles="force"):
        p = plan.plan_for(lay, BF16, 64)
    assert p.mma and p.dense_cells == 0  # the tile plan lives on CUDA layouts only


def test_backward_launches_follow_the_edge_count():
    for E, one in (((1 << 16) - 1, True), (1 << 16, False)):
        lay = GraphLayout.from_edge_index(torch.randint(0, 300, (2, E)), (300, 300))
        assert lay.num_edges == E and plan.plan_for(lay, F32, 32).bwd_one_launch == one


def test_plan_is_kept_per_key():
    lay = _layout(300, 3000)
    p = plan.plan_for(lay, F32, 64)
    assert plan.plan_for(lay, F32, 64) is p
    assert plan.plan_for(lay, F32, 32) is not p
    assert len(lay.derived.plans) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.chunk = 7
    assert not lay.to("meta").derived.plans  # plans depend on the device: not moved


def test_bad_strategy_or_score_raises():
    lay = _layout(50, 200)
    with pytest.raises(ValueError, match="strategy"):
        plan.plan_for(lay, F32, 32, strategy="fast")
    with pytest.raises(ValueError, match="score"):
        plan.plan_for(lay, F32, 32, score="sigmoid")


@pytest.mark.parametrize("score", [s.name for s in spec.specs()])
def test_plans_keep_to_the_score_spec(score):
    """Every registered score's plans, on graphs where the dot score takes each
    variant, take only the variants its spec says its kernels have: a new score
    needs no edit here."""
    sp = spec.get(score)
    chain, small = _chain(1 << 15, 8), _layout(300, 3000)
    assert plan.plan_for(chain, F32, 32, score=score).two_rows == sp.two_rows
    with plan.override(chunk=DEFAULT_CHUNK):  # whole rows
        p = plan.plan_for(small, BF16, 64, score=score)
        assert p.mma == sp.mma and p.dense_cells == 0  # CPU layout: no tile plan
    assert plan.plan_for(small, F32, 64, score=score).bwd_one_launch == sp.one_launch_backward
    if sp.pmf:
        assert plan.plan_for(small, F32, 64, score=score, strategy="pmf").pmf
    else:
        with pytest.raises(ValueError, match="no PMF path"):
            plan.plan_for(small, F32, 64, score=score, strategy="pmf")
    assert plan.choose_strategy(10 ** 7, score, 4, capacity=16, rule="paper") == \
        ("pmf" if sp.pmf_rule else "smmf")


# ------------------------------------------------------------------------ override
def test_overrides_change_the_plan_and_are_part_of_the_key():
    lay = _layout(300, 3000)
    default = plan.plan_for(lay, F32, 64)
    with plan.override(chunk=8, long_items_first=False, bwd_launches=2, rule="paper"):
        p = plan.plan_for(lay, F32, 64)
        assert (p.chunk, p.long_items_first, p.bwd_one_launch) == (8, False, False)
        with plan.override(chunk=None, two_rows=True, bwd_launches=1):  # nested: adds
            q = plan.plan_for(lay, F32, 64)
            assert q.chunk == SMALL_GRAPH_CHUNK and not q.long_items_first
            assert q.two_rows and q.bwd_one_launch
    assert plan.plan_for(lay, F32, 64) is default  # no stale plan outside


def test_override_restores_on_exception():
    assert plan.overrides() == {}
    with pytest.raises(KeyError):
        with plan.override(chunk=16, direct_entry=False):
            assert plan.overrides() == {"chunk": 16, "direct_entry": False}
            assert not plan.direct_entry()
            raise KeyError("boom")
    assert plan.overrides() == {} and plan.direct_entry()


@pytest.mark.parametrize("fields,msg", [
    ({"chunks": 4}, "unknown field"), ({"chunk": 0}, "chunk must be"),
    ({"chunk": 2.5}, "chunk must be"), ({"bwd_launches": 3}, "bwd_launches must be 1 or 2"),
    ({"bwd_launches": "2"}, "bwd_launches must be"), ({"dense_tiles": "on"}, "dense_tiles"),
    ({"dense_tiles": 0}, "dense_tiles"), ({"mma": 1}, "mma must be a bool"),
    ({"mma_backward": 1}, "mma_backward must be a bool"),
    ({"rule": "fastest"}, "rule must be")])
def test_override_rejects_bad_fields(fields, msg):
    with pytest.raises(ValueError, match=msg):
        with plan.override(**fields):
            pass
    assert plan.overrides() == {}


def test_forced_decisions_a_call_cannot_run_raise():
    lay = _layout(2000, 4000, hub=500)  # split rows at the default chunk
    with plan.override(two_rows=True):
        with pytest.raises(ValueError, match="two rows per warp need SMMF, no split rows"):
            plan.plan_for(lay, F32, 32)
    with plan.override(mma=True):
        assert plan.plan_for(lay, BF16, 64).mma  # whole rows: split rows are no obstacle
        with pytest.raises(ValueError, match="tensor-core forward needs"):
            plan.plan_for(lay, F32, 64)
        with pytest.raises(ValueError, match="tensor-core forward needs"):
            plan.plan_for(lay, BF16, 64, dropout=True)
    assert all(not p.two_rows for p in lay.derived.plans.values())  # nothing kept that fails


def test_mma_backward_default_and_override():
    lay = _layout(300, 3000)  # under 2^16 edges: one backward launch by default
    p = plan.plan_for(lay, BF16, 64)
    assert not p.mma_backward and p.bwd_one_launch and p.mma
    big = _chain(3000, 30)  # 90K edges, whole rows: the tensor-core walks by default
    assert plan.plan_for(big, BF16, 64).mma_backward
    assert plan.plan_for(big, F16, 128).mma_backward
    assert not plan.plan_for(big, BF16, 48).mma_backward  # no MMA head size
    assert not plan.plan_for(big, F32, 64).mma_backward
    assert not plan.plan_for(big, BF16, 64, dropout=True).mma_backward
    assert not plan.plan_for(big, BF16, 64, need_attn=True).mma_backward
    with plan.override(bwd_launches=2):  # small graphs stay on the CUDA-core walks
        assert not plan.plan_for(lay, BF16, 64).mma_backward
    with plan.override(mma_backward=True):
        q = plan.plan_for(lay, BF16, 64)
        assert q.mma_backward and not q.bwd_one_launch  # the dq walk feeds the CSC walk
        assert plan.plan_for(lay, F16, 128, score="cosine").mma_backward
        for bad in ({"dtype": F32}, {"dropout": True}, {"need_attn": True},
                    {"strategy": "pmf"}, {"score": "additive"}):
            args = dict(dtype=BF16, head_size=64)
            args.update(bad)
            with pytest.raises(ValueError, match="tensor-core backward needs"):
                plan.plan_for(lay, **args)
        with pytest.raises(ValueError, match="tensor-core backward needs"):
            plan.plan_for(lay, BF16, 48)
        with plan.override(bwd_launches=1):
            with pytest.raises(ValueError, match="two backward launches"):
                plan.plan_for(lay, BF16, 64)
        with plan.override(mma_backward=False):
            assert not plan.plan_for(lay, BF16, 64).mma_backward
    split = _layout(2000, 70000, hub=500)  # past one launch, but split rows: off
    assert plan.plan_for(split, BF16, 64).chunk < 500
    assert not plan.plan_for(split, BF16, 64).mma_backward
    with plan.override(mma_backward=True):  # whole rows: split rows are no obstacle
        assert plan.plan_for(split, BF16, 64).mma_backward


def test_mma_backward_off_with_a_hub_column():
    n, deg = 3000, 30  # 90K edges, whole rows
    dst = torch.arange(n).repeat_interleave(deg)

    def with_hub(rows):  # source 0 first in `rows` rows: a column of `rows` edges
        src = torch.randint(1, n, (n * deg,))
        src[torch.arange(rows) * deg] = 0
        return GraphLayout.from_edge_index(torch.stack([src, dst]), (n, n))

    limit = plan.MMA_BWD_MAX_COLUMN_SHARE * n * deg
    hub = with_hub(int(2 * limit))
    assert hub.max_out_degree > limit and hub.work("row", 128).num_slots == 0
    assert not plan.plan_for(hub, BF16, 64).mma_backward
    with plan.override(mma_backward=True):  # forced on, the walks still run
        assert plan.plan_for(hub, BF16, 64).mma_backward
    below = with_hub(int(limit) - 60)
    assert below.max_out_degree <= limit
    assert plan.plan_for(below, BF16, 64).mma_backward


def test_mma_backward_reaches_the_op_flags():
    from pyg_dfgnn.ops import calls, spec
    dot = spec.get("dot")
    lay = _layout(300, 3000)
    assert calls.prepare(dot, lay, BF16, 64, "auto", False, False, True).plan.flags()[
        "mma_backward"] == 0
    with plan.override(mma_backward=True):
        flags = calls.prepare(dot, lay, BF16, 64, "auto", False, False, True).plan.flags()
    assert (flags["bwd_one_launch"], flags["mma_backward"]) == (0, 1)  # two launches


def test_override_reaches_the_reference_path_rule():
    lay = _layout(50, 200)
    with plan.override(rule="paper"):
        assert plan.choose_strategy(10 ** 7, "dot", 4, capacity=16) == "pmf"
    assert plan.choose_strategy(10 ** 7, "dot", 4, capacity=16) == "smmf"


# ------------------------------------------------------------------ module boundaries
def test_no_getenv_or_tuning_switches_in_cuda():
    for path in sorted(p for p in (ROOT / "cuda").rglob("*") if p.is_file()):
        text = path.read_text()
        assert "getenv" not in text, path.name
        assert not re.search(r"PYG_DFGNN_[A-Z_]+", text), path.name


def test_no_removed_switch_left_in_the_repository():
    removed = re.compile(r"PYG_DFGNN_(DENSE_TILES|BWD_LAUNCHES|NO_MMA)|DIRECT_ENTRY|"
                         r"CHUNK_OVERRIDE|LONG_ITEMS_FIRST|schedule\.RULE")
    for sub in ("pyg_dfgnn", "cuda", "benchmarks", "docs", "examples"):
        for path in (ROOT / sub).rglob("*"):
            if path.suffix in (".py", ".cu", ".cuh", ".cpp", ".h", ".md", ".sh"):
                assert not removed.search(path.read_text()), path
    assert not removed.search((ROOT / "README.md").read_text())


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield "." * node.level + (node.module or "")
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


@pytest.mark.parametrize("name", ["layout.py", "layout_cache.py", "derived.py",
                                  "work_items.py"])
def test_layout_modules_do_not_import_ops(name):
    for mod in _imports(ROOT / "pyg_dfgnn" / name):
        assert not re.match(r"(\.|pyg_dfgnn\.)ops\b", mod), (name, mod)


def test_layout_imports_without_ops_in_a_fresh_interpreter():
    """pyg_dfgnn/__init__.py imports ops; here the package is stubbed so that only
    the layout modules load, and no pyg_dfgnn.ops module may follow."""
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('pyg_dfgnn'); pkg.__path__ = [{str(ROOT / 'pyg_dfgnn')!r}]\n"
        "sys.modules['pyg_dfgnn'] = pkg\n"
        "import pyg_dfgnn.layout, pyg_dfgnn.work_items, pyg_dfgnn.derived\n"
        "import torch\n"
        "lay = pyg_dfgnn.layout.GraphLayout.from_edge_index(torch.tensor([[0, 1], [1, 0]]))\n"
        "lay.prepare(); lay.work('row', 4)\n"
        "bad = [m for m in sys.modules if m.startswith('pyg_dfgnn.ops')]\n"
        "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("dtype,strategy,first", [
    (torch.float32, "smmf", False), (torch.float32, "pmf", True),
    (torch.bfloat16, "smmf", True), (torch.float16, "pmf", True)])
def test_cosine_normalizes_first_where_its_spec_says(dtype, strategy, first):
    """The cosine score's one choice (its fp32 SMMF kernel, or the normalisation
    and the dot score's kernels) is the plan's normalize_first, and kernels()
    lists what runs: the normalisation included, the dot kernels by their name."""
    g = torch.Generator().manual_seed(4)
    lay = GraphLayout.from_edge_index(torch.randint(0, 300, (2, 3000), generator=g), (300, 300),
                                      add_self_loops=True)
    p = plan.plan_for(lay, dtype, 32, "cosine", strategy)
    assert p.normalize_first is first and p.flags()["normalize_first"] == int(first)
    fwd = [k for k, _ in p.kernels()]
    bwd = [k for k, _ in p.kernels(backward=True)]
    if first:
        assert fwd[0] == "cosine:normalize" and fwd[1:]
        assert all(k.startswith("dot:") or "softmax" in k or "partials" in k for k in fwd[1:])
        assert bwd[0] != "cosine:normalize"
    else:
        assert fwd == ["cosine:rnorm", "cosine:smmf"]
        assert bwd[0] == "cosine:normalize"  # k, q recomputed from the kept norms
    assert bwd[-1] == "cosine:normalize_bwd"
    assert any(k.startswith("dot:") for k in bwd)
    assert not [k for k in bwd if k.startswith("cosine:") and "normalize" not in k]


def test_only_a_score_with_a_normalised_form_normalizes_first():
    g = torch.Generator().manual_seed(5)
    lay = GraphLayout.from_edge_index(torch.randint(0, 300, (2, 3000), generator=g), (300, 300))
    for s in spec.specs():
        for dtype in (torch.float32, torch.bfloat16):
            p = plan.plan_for(lay, dtype, 32, s.name, "smmf")
            rule = s.normalize_first
            assert p.normalize_first == (rule is not None and rule(dtype, "smmf")), s.name


def test_backward_merge_launch_follows_split_rows_and_columns():
    r"""``combine_partials`` is in the backward's kernel list exactly where a
    walk's split items merge after it: split rows (except the additive score's
    in half precision, whose D and d a_dst merge in ``split_dsum``) or split
    columns (the CSC walk), outside the kernels' own merge."""
    n = 64
    hub_dst = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.long)])
    hub_src = hub_dst.flip(0)
    for ei, rows, cols in ((hub_dst, True, False), (hub_src, False, True)):
        lay = GraphLayout.from_edge_index(ei, (n, n))
        with plan.override(chunk=8):
            for score, dtype in (("dot", torch.float32), ("dot", torch.bfloat16),
                                 ("additive", torch.bfloat16)):
                p = plan.plan_for(lay, dtype, 32, score=score, capturing=True)
                assert (p.split_rows, p.split_cols) == (rows, cols)
                names = [k for k, _ in p.kernels(backward=True)]
                half_additive = score == "additive" and dtype != torch.float32
                want = cols or (rows and not half_additive)
                assert ("combine_partials" in names) == want, (score, dtype, rows, names)
                assert ("additive:split_dsum" in names) == (half_additive and rows)
