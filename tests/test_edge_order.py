"""Per-edge rows into CSR order as a scatter (pyg_dfgnn.edge_order): the same rows
and gradients as the gather it replaces, on layouts with and without added
self-loops, moved and copied layouts included."""
import copy
import pickle

import pytest
import torch

from pyg_dfgnn import edge_order
from pyg_dfgnn.layout import GraphLayout
from conftest import random_graph


def _layout(loops: bool) -> GraphLayout:
    ei = random_graph(50, 40, num_edges=300, num_self_loops=6,
                      generator=torch.Generator().manual_seed(3))
    return GraphLayout.from_edge_index(ei, (50, 40), add_self_loops=loops)


def test_inverse_of_a_permutation():
    perm = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    pos = edge_order.inverse(perm)
    assert torch.equal(pos[perm], torch.arange(1000))
    assert torch.equal(perm[pos], torch.arange(1000))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.bfloat16))
@pytest.mark.parametrize("shape", ((), (3,), (2, 5)))
def test_permute_rows_is_the_gather_with_its_gradient(shape, dtype):
    gen = torch.Generator().manual_seed(1)
    perm = torch.randperm(257, generator=gen)
    x = torch.randn(257, *shape, generator=gen).to(dtype).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    got = edge_order.permute_rows(x, perm, edge_order.inverse(perm))
    want = x_ref.index_select(0, perm)
    assert torch.equal(got, want)
    g = torch.randn(want.shape, generator=gen).to(dtype)
    got.backward(g)
    want.backward(g)
    assert torch.equal(x.grad, x_ref.grad)


@pytest.mark.parametrize("device", ("cpu", pytest.param("cuda", marks=pytest.mark.cuda)))
@pytest.mark.parametrize("loops", (False, True))
def test_to_csr_order_matches_the_gather(loops, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    lay = _layout(loops).to(device)
    e = torch.randn(lay.num_edges, 4, dtype=torch.float64, device=device, requires_grad=True)
    got = lay.to_csr_order(e, loops_appended=loops)
    want = e.index_select(0, lay.edge_perm)
    assert torch.equal(got, want)
    # CSR order back to input order: the identity
    assert torch.equal(lay.to_input_order(got.detach()), e.detach())
    w = torch.arange(got.numel(), device=device).view_as(got)
    (grad,) = torch.autograd.grad((got * w).sum(), e)
    (ref,) = torch.autograd.grad((want * w).sum(), e)
    assert torch.equal(grad, ref)
    # the CUDA scatter keeps the inverse permutation for the next call
    assert (lay.derived.edge_pos is not None) == (device == "cuda")


def test_benchmark_script_on_the_cpu(tmp_path):
    """benchmarks.edge_order runs (its own check: the two ways agree bit for bit)."""
    import json

    from benchmarks import edge_order as bench
    out = tmp_path / "eo.json"
    assert bench.main(["--device", "cpu", "--edges", "2000", "--pattern-graphs", "2",
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["info"]["edges"]["random"] == 2000
    assert [(r["perm"], r["D"], r["dtype"]) for r in doc["rows"]] == \
        [(p, d, str(t).replace("torch.", "")) for p in ("random", "pattern")
         for d, t in bench.WIDTHS]
    assert all(r["scatter_fwd_ms"] > 0 and r["gather_fwd_bwd_ms"] > 0 for r in doc["rows"])


def test_cached_inverse_moves_and_copies_with_the_layout():
    lay = _layout(False)
    lay.derived.edge_pos = edge_order.inverse(lay.edge_perm)  # as a CUDA call leaves it
    e = torch.randn(lay.num_edges, 3)
    want = e.index_select(0, lay.edge_perm)
    for other in (lay.to("cpu"), copy.deepcopy(lay), pickle.loads(pickle.dumps(lay))):
        assert torch.equal(other.derived.edge_pos, lay.derived.edge_pos)
        assert torch.equal(edge_order.permute_rows(e, other.edge_perm, other.derived.edge_pos),
                           want)
    assert any(t is lay.derived.edge_pos for t in lay.derived.tensors())


@pytest.mark.parametrize("dtype", (torch.float64, torch.bfloat16))
def test_compact_is_the_boolean_selection_with_its_gradient(dtype):
    gen = torch.Generator().manual_seed(2)
    ei = torch.randint(0, 20, (2, 300), generator=gen)
    keep = ei[0] != ei[1]
    x = torch.randn(300, 5, generator=gen).to(dtype).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    ei_k, got = edge_order.compact(keep, int(keep.sum()), ei, x)
    want = x_ref[keep]
    assert torch.equal(ei_k, ei[:, keep]) and torch.equal(got, want)
    g = torch.randn(want.shape, generator=gen).to(dtype)
    got.backward(g)
    want.backward(g)
    assert torch.equal(x.grad, x_ref.grad)  # zeros on the dropped rows


def test_compact_keeps_everything_or_nothing():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x = torch.randn(3, 2, requires_grad=True)
    ei_k, got = edge_order.compact(torch.ones(3, dtype=torch.bool), 3, ei, x)
    assert torch.equal(ei_k, ei) and torch.equal(got, x)
    ei_k, got = edge_order.compact(torch.zeros(3, dtype=torch.bool), 0, ei, x)
    assert ei_k.shape == (2, 0) and got.shape == (0, 2)
    got.sum().backward()
    assert torch.equal(x.grad, torch.zeros(3, 2))
