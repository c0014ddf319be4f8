"""The package's module structure (docs/architecture.md): no import cycles, no
private name imported from another package, and each score function a unit
(its spec registered under the name its C++ functor registers)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pyg_dfgnn

PKG = Path(pyg_dfgnn.__file__).resolve().parent
ROOT = PKG.parent


def _modules():
    """Module name -> (path, is_package) for every module of pyg_dfgnn."""
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        is_pkg = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_pkg else parts)
        mods[name] = (path, is_pkg)
    return mods


def _imports(name, path, is_pkg, mods):
    """``(target module, imported name or None, line)`` of each import of pyg_dfgnn code."""
    package = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("pyg_dfgnn"):
                    yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("pyg_dfgnn"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                yield (sub, None, node.lineno) if sub in mods else (target, a.name, node.lineno)


def test_no_import_cycles():
    mods = _modules()
    graph = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        for target, _, _ in _imports(name, path, is_pkg, mods):
            if target in mods and target != name:
                graph[name].add(target)
    # A package's __init__ may import its own submodules (that is what it is
    # for); a cycle is any other way back to a module.
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph[m]):
            if mods[m][1] and t.startswith(m + "."):
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, [m])
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_name_imported_from_another_package():
    mods = _modules()
    bad = []
    for name, (path, is_pkg) in mods.items():
        own = name if is_pkg else name.rpartition(".")[0]
        for target, imported, line in _imports(name, path, is_pkg, mods):
            private = (imported or target.rpartition(".")[2]).startswith("_")
            module = target if target in mods else target.rpartition(".")[0]
            where = module if mods.get(module, (None, False))[1] and imported else \
                module.rpartition(".")[0]
            # _C, the compiled extension, has its name fixed by the build
            if private and where != own and not (target == "pyg_dfgnn._C" or imported == "_C"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported or target}")
    assert not bad, bad


def test_every_score_spec_has_a_kernel_registration():
    import torch

    if not pyg_dfgnn.HAS_EXTENSION:
        pytest.skip("needs the compiled extension pyg_dfgnn._C")
    from pyg_dfgnn.layout import GraphLayout
    lay = GraphLayout.from_edge_index(torch.tensor([[0, 1], [1, 0]]), (2, 2))
    for spec in pyg_dfgnn.ops.spec.specs():
        assert any((ROOT / "cuda" / "scores" / f"{spec.name}{ext}").is_file()
                   for ext in (".cu", ".cpp")), spec.name
        # building a plan object resolves the score in the extension's registry
        from pyg_dfgnn.ops import calls
        obj = calls.plan_object(spec, lay, pyg_dfgnn.ops.plan.plan_for(lay, torch.float32, 8,
                                                                      spec.name), True)
        assert obj.score() == spec.name
