"""Standalone check of the GPU layout build (``dfgnn::layout_build``) against the
torch build, small enough to run under compute-sanitizer:

.. code-block:: bash

    python -m benchmarks.layout_build_check
    compute-sanitizer --tool memcheck  python -m benchmarks.layout_build_check --quick
    compute-sanitizer --tool racecheck python -m benchmarks.layout_build_check --quick
    compute-sanitizer --tool initcheck python -m benchmarks.layout_build_check --quick

Builds graphs with isolated nodes, duplicates, self-loops, hubs whose rows split
(chunk 32 and 7, longest first and row order) and whose CSC columns take each
ordering path (up to beyond 4,096 edges), bipartite sizes, grouped and shuffled
order, int32 and int64, with and without self-loops and CSC, and out-of-range
input; exits non-zero on the first difference.
"""
from __future__ import annotations

import argparse
import sys

import torch

from pyg_dfgnn import layout_build
from pyg_dfgnn.layout import LayoutIndexError, _build, gpu_build


def _graph(ns: int, nd: int, e: int, hub: int, gen: torch.Generator) -> torch.Tensor:
    ei = torch.stack([torch.randint(0, ns, (e,), generator=gen),
                      torch.randint(0, nd, (e,), generator=gen)])
    m = min(ns, nd)
    loops = torch.randint(0, m, (max(1, m // 20),), generator=gen)
    parts = [ei, ei[:, :10], torch.stack([loops, loops])]
    if hub:
        parts += [torch.stack([torch.randint(0, ns, (hub,), generator=gen),
                               torch.full((hub,), nd // 2)]),
                  torch.stack([torch.full((hub,), ns // 3),
                               torch.randint(0, nd, (hub,), generator=gen)])]
    ei = torch.cat(parts, 1)
    ei = ei[:, torch.randperm(ei.size(1), generator=gen)]
    if nd > 6:
        ei[1][ei[1] < 3] = 3  # destinations 0-2 without in-edges
    return ei


def _same(a, b) -> bool:
    if (a is None) != (b is None):
        return False
    if a is None:
        return True
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def compare(ei: torch.Tensor, ns: int, nd: int, loops: bool, with_csc: bool, chunk=None,
            long_first: bool = True) -> list:
    """Names of the fields where the two builds differ."""
    got = gpu_build(ei, ns, nd, loops, with_csc, chunk, long_first)
    want = _build(ei, ns, nd, loops, with_csc, None, kernel=False)
    if got is None:
        return ["not built"]
    bad = [name for name in ("rowptr", "col", "_csr_row", "_edge_perm", "_csc", "max_in_degree",
                             "num_edges") if not _same(getattr(got, name), getattr(want, name))]
    if not got.derived.work:
        bad.append("no work items")
    bad += [str(k) for k, w in got.derived.work.items() if not _same(w, want.work(*k))]
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.layout_build_check",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="with the CSC and the default work items only (a sixth of the "
                         "cases, every kernel of the build still runs): for racecheck, "
                         "memcheck and initcheck, which run each case many times slower")
    args = ap.parse_args(argv)
    variants = [(True, None, True)] if args.quick else [
        (csc, chunk, first) for csc in (True, False)
        for chunk, first in ((None, True), (7, True), (7, False))]
    if not layout_build.available(torch.device("cuda")) or not torch.cuda.is_available():
        print("needs a GPU and the compiled extension with dfgnn::layout_build")
        return 1
    gen = torch.Generator().manual_seed(0)
    cases = 0
    # Source hubs of about 150 to 5,000 edges: every way the CSC orders a column.
    for ns, nd, e, hub in ((300, 300, 2000, 0), (3000, 3000, 30000, 700), (500, 120, 3000, 200),
                           (90, 2600, 6000, 150), (4000, 4000, 20000, 5000), (1, 1, 5, 0)):
        base = _graph(ns, nd, e, hub, gen)
        for grouped in (False, True):
            ei = base[:, torch.sort(base[1], stable=True).indices] if grouped else base
            for dtype in (torch.int64, torch.int32):
                for loops in (False, True):
                    for with_csc, chunk, long_first in variants:
                        bad = compare(ei.to(dtype).cuda(), ns, nd, loops, with_csc,
                                      chunk, long_first)
                        cases += 1
                        if bad:
                            print(f"MISMATCH ns={ns} nd={nd} grouped={grouped} {dtype} "
                                  f"loops={loops} csc={with_csc} chunk={chunk} "
                                  f"long_first={long_first}: {bad}")
                            return 1
        # a run cut short by a time limit still says how far it got
        print(f"graph ns={ns} nd={nd} e={e} hub={hub}: {cases} cases equal", flush=True)
    for bad_ei in ([[0, 1, 70000], [1, 2, 0]], [[0, -1], [1, 2]], [[0, 1], [1, 5]]):
        try:
            gpu_build(torch.tensor(bad_ei, device="cuda"), 5, 5, True, True)
        except LayoutIndexError:
            cases += 1
        else:
            print(f"no LayoutIndexError for {bad_ei}")
            return 1
    empty = compare(torch.empty(2, 0, dtype=torch.long, device="cuda"), 4, 6, True, True)
    if empty:
        print(f"MISMATCH empty graph: {empty}")
        return 1
    torch.cuda.synchronize()
    print(f"layout_build: {cases + 1} cases equal to the torch build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
