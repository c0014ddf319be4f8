"""The plan names exactly the kernels that run: for every score x dtype x
strategy (and split rows), the dfgnn kernels the profiler sees in a forward and
backward are the ones Plan.kernels() lists, under its names."""
import re

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from pyg_dfgnn import ops
from pyg_dfgnn.layout import GraphLayout

pytestmark = pytest.mark.cuda
DEV = "cuda"

#: The score a functor type serves (scores/<name>.cuh).
FUNCTORS = {"DotScore": "dot", "DotEdgeScore": "dot_edge", "DotEdgeTailScore": "dot_edge_tail",
            "GATv2Score": "gatv2",
            "GATv2EdgeScore": "gatv2_edge", "CosineScore": "cosine",
            "AdditiveScore": "additive", "AdditiveEdgeScore": "additive_edge"}
#: (device function, the plan's name for it; {s}: the functor's score, {call}:
#: the call's, for a kernel that serves several scores without a functor).
ROLES = [
    (r"row_fwd_smmf_kernel<dfgnn::AdditiveRowScore<", "additive:row_smmf"),
    (r"row_fwd_smmf_kernel<dfgnn::(\w+)<", "{s}:smmf"),
    (r"edge_sddmm_kernel<dfgnn::(\w+)<", "{s}:sddmm"),
    (r"softmax_spmm_kernel", "softmax_spmm"),
    (r"gt_fwd_mma_kernel", "dot:fwd_mma"),
    (r"gt_fwd_dense_kernel", "dot:fwd_dense"),
    (r"row_bwd_one_launch_kernel<dfgnn::(\w+)<", "{s}:bwd_one_launch"),
    (r"row_bwd_dq_kernel<dfgnn::(\w+)<", "{s}:dq_walk"),
    (r"row_bwd_dkv_kernel<dfgnn::(\w+)<", "{s}:dkv_walk"),
    (r"gt_bwd_dq_mma_kernel", "dot:dq_mma"),
    (r"gt_bwd_dkv_mma_kernel", "dot:dkv_mma"),
    (r"gt_bwd_dq_dense_kernel", "dot:dq_dense"),
    (r"gt_bwd_dkv_dense_kernel", "dot:dkv_dense"),
    (r"gat_fwd_kernel<dfgnn::(\w+)<", "{s}:smmf"),
    (r"gat_score_kernel<dfgnn::(\w+)<", "{s}:sddmm"),
    (r"gat_bwd_dst_kernel<dfgnn::(\w+)<", "{s}:bwd_dst"),
    (r"gat_split_dsum_kernel", "{call}:split_dsum"),
    (r"gat_bwd_edge_kernel<dfgnn::(\w+)<", "{s}:bwd_edge"),
    (r"gat_bwd_src_kernel<dfgnn::(\w+)<", "{s}:bwd_src"),
    (r"l2norm_fwd_kernel<[^(]*true>", "cosine:normalize"),
    (r"l2norm_fwd_kernel<[^(]*false>", "cosine:rnorm"),
    (r"l2norm_bwd_kernel", "cosine:normalize_bwd"),
    (r"reduce_slots_kernel<[^>]*true>", "merge_softmax_partials"),
    (r"reduce_slots_kernel<[^>]*false>", "combine_partials"),
    (r"out_dsum_kernel", "out_dsum"),
]


def role(name: str, call: str) -> str:
    """The plan's name for the kernel ``name`` that a call of the score ``call``
    ran."""
    for pattern, r in ROLES:
        m = re.search(pattern, name)
        if m:
            return r.format(s=FUNCTORS.get(m.group(1), m.group(1)) if m.groups() else "",
                            call=call)
    return "unknown:" + name[:80]


def _inputs(score, lay, H, C, dtype):
    def t(*shape):
        return torch.randn(*shape, device=DEV, dtype=dtype, requires_grad=True)
    nd, ns = lay.num_dst, lay.num_src
    if score == "dot":
        return lambda s: ops.gt_attention(lay, t(nd, H, C), t(ns, H, C), t(ns, H, C), strategy=s)
    if score == "dot_edge":
        e = t(lay.num_edges, H, C)
        return lambda s: ops.gt_attention(lay, t(nd, H, C), t(ns, H, C), t(ns, H, C), edge=e,
                                          strategy=s)
    if score == "dot_edge_tail":
        a = t(lay.num_edges, 16)  # keys and values: the C - 16 channels the tails complete
        return lambda s: ops.gt_attention(lay, t(nd, H, C), t(ns, H, C - 16), t(ns, H, C - 16),
                                          edge=a, strategy=s)
    if score == "gatv2":
        return lambda s: ops.gatv2_attention(lay, t(ns, H, C), t(nd, H, C), t(H, C), strategy=s)
    if score == "gatv2_edge":  # the layout adds self-loops: the rows in CSR order
        e = t(lay.num_edges, H, C)
        return lambda s: ops.gatv2_attention(lay, t(ns, H, C), t(nd, H, C), t(H, C), edge=e,
                                             edge_order="csr", strategy=s)
    if score == "additive_edge":  # the layout adds self-loops: the terms in CSR order
        e = t(lay.num_edges, H)
        return lambda s: ops.gat_attention(lay, t(ns, H), t(nd, H), t(ns, H, C), edge=e,
                                           edge_order="csr", strategy=s)
    if score == "cosine":
        beta = torch.tensor(1.3, device=DEV, requires_grad=True)
        return lambda s: ops.agnn_attention(lay, t(nd, H, C), None, beta, strategy=s)
    return lambda s: ops.gat_attention(lay, t(ns, H), t(nd, H), t(ns, H, C), strategy=s)


CASES = [(score, dtype, strategy, chunk, row_walk)
         for score in ("dot", "dot_edge", "dot_edge_tail", "gatv2", "gatv2_edge", "cosine",
                       "additive", "additive_edge")
         for dtype in (torch.float32, torch.bfloat16)
         for strategy in ("smmf", "pmf")
         for chunk in (None, 8)
         for row_walk in ((None, True, False) if ops.spec.get(score).row_walk
                          and strategy == "smmf" else (None,))
         if ops.spec.get(score).pmf or strategy == "smmf"]


@pytest.mark.parametrize("score,dtype,strategy,chunk,row_walk", CASES)
def test_plan_names_the_kernels_that_run(score, dtype, strategy, chunk, row_walk,
                                         plan_override):
    g = torch.Generator().manual_seed(0)
    n = 512
    ei = torch.randint(0, n, (2, 8 * n), generator=g)
    ei = torch.cat([ei, torch.stack([torch.arange(64), torch.zeros(64, dtype=torch.long)])], 1)
    lay = GraphLayout.from_edge_index(ei.to(DEV), (n, n),
                                      add_self_loops=not score.startswith("dot_edge"))
    run = _inputs(score, lay, 2, 32, dtype)
    if chunk:
        plan_override(chunk=chunk)  # split rows
    if row_walk is not None:
        plan_override(row_walk=row_walk)  # the additive score's two SMMF forwards
    with ops.recording() as records:
        run(strategy).float().sum().backward()  # builds what the first call builds
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(strategy).float().sum().backward()
        torch.cuda.synchronize()
    plans = [r.plan for r in records if r.plan is not None]
    assert len(plans) == 1, records
    p = plans[0]
    want = {k for k, _ in p.kernels()} | {k for k, _ in p.kernels(backward=True)}
    seen = {role(e.name, p.score) for e in prof.events()
            if e.device_type.name == "CUDA" and "dfgnn::" in e.name}
    assert seen == want, f"plan {sorted(want - seen)} not run; run {sorted(seen - want)} not in plan"


@pytest.mark.parametrize("dense_backward", [None, False])
def test_plan_names_the_dense_tile_kernels(dense_backward, plan_override):
    """A PATTERN-like batch runs the dense-tile forward and, by default, the
    dense-tile backward (dense_backward=False: the sparse tensor-core walks)."""
    from benchmarks.generators import sbm_batch
    ei, batch, _, _ = sbm_batch("pattern", 48, seed=1)
    lay = GraphLayout.from_edge_index(ei.to(DEV), (batch.numel(), batch.numel()))
    if dense_backward is not None:
        plan_override(dense_backward=dense_backward)
    run = _inputs("dot", lay, 1, 128, torch.bfloat16)  # narrow windows: dense by default
    with ops.recording() as records:
        run("smmf").float().sum().backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run("smmf").float().sum().backward()
        torch.cuda.synchronize()
    p = [r.plan for r in records if r.plan is not None][0]
    assert p.dense_cells > 0 and p.dense_backward == (dense_backward is None)
    want = {k for k, _ in p.kernels()} | {k for k, _ in p.kernels(backward=True)}
    seen = {role(e.name, p.score) for e in prof.events()
            if e.device_type.name == "CUDA" and "dfgnn::" in e.name}
    assert seen == want, f"plan {sorted(want - seen)} not run; run {sorted(seen - want)} not in plan"
