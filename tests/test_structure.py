"""The package's module structure (docs/architecture.md): no import cycles, no
private name imported from another package, and each score function a unit
(its spec registered under the name its C++ functor registers); and every file,
package name and op that the docs, comments and messages name exists."""
from __future__ import annotations

import ast
import importlib
import re
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


#: ScorePaths field (cuda/host/score_ops.h) -> the plan flags it allows, and the
#: spec's attribute that declares the same path.
_PATHS = {"pmf": (("pmf",), "pmf"), "mma": (("mma", "mma_backward"), "mma"),
          "two_rows": (("two_rows",), "two_rows"),
          "one_launch_backward": (("bwd_one_launch",), "one_launch_backward"),
          "row_walk": (("row_walk",), "row_walk")}


def test_plan_objects_hold_each_score_to_the_paths_its_spec_declares():
    r"""A plan object (``torch.classes.dfgnn.Plan``) that asks a score for a path
    raises exactly where the score's ScoreSpec says it has none: the C++
    registration's ScorePaths and the spec are one table, checked here."""
    import torch

    if not pyg_dfgnn.HAS_EXTENSION:
        pytest.skip("needs the compiled extension pyg_dfgnn._C")
    from pyg_dfgnn.layout import GraphLayout
    from pyg_dfgnn.ops import calls, plan
    lay = GraphLayout.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), (3, 3))
    for spec in pyg_dfgnn.ops.spec.specs():
        tensors, ints, floats = calls.plan_parts(
            lay, plan.plan_for(lay, torch.float32, 8, spec.name), True, True)
        base = {**ints, "pmf": 0, "mma": 0, "mma_backward": 0, "two_rows": 0,
                "bwd_one_launch": 0, "normalize_first": 0, "row_walk": 0}
        for flags, attr in _PATHS.values():
            for flag in flags:
                make = lambda: torch.classes.dfgnn.Plan(spec.name, tensors, {**base, flag: 1},
                                                        floats)
                if getattr(spec, attr):
                    make()
                else:
                    with pytest.raises(RuntimeError, match="has no such path"):
                        make()
        # ScoreOps::keeps_out32 and the spec's: the forward keeps its fp32 rows
        # only where a backward follows (the CSC)
        p32 = plan.plan_for(lay, torch.float32, 8, spec.name)
        assert calls.plan_object(spec, lay, p32, True).keeps_out32() == spec.keeps_out32
        assert not calls.plan_object(spec, lay, p32, False).keeps_out32()


# ------------------------------------------------------- each score is a unit
#: The folders of cuda/ that every score shares; a score's own files are in scores/.
_SHARED = ("device", "glue", "host", "kernels")
#: Short names the kernels give a score after its layer (``gt_bwd_dq_mma_kernel``)
#: or after its own step (``l2norm_fwd_kernel``, the cosine score's normalisation).
_LAYER_NAMES = {"gt": "dot", "gat": "additive", "agnn": "cosine", "l2norm": "cosine"}


def score_named_files(root: Path) -> list:
    """The files of cuda/'s shared folders named after a score: the name it
    registers (``DFGNN_REGISTER_SCORE(<name>`` in cuda/scores/) or its layer's
    short name, alone or as the first part of the name (``gt_forward.cu``)."""
    scores = root / "cuda" / "scores"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(scores.iterdir())
                     if p.suffix in _CPP)
    names = set(re.findall(r"DFGNN_REGISTER_SCORE\((\w+)", text)) | set(_LAYER_NAMES)
    return [str(p.relative_to(root)) for folder in _SHARED
            for p in sorted((root / "cuda" / folder).rglob("*"))
            if p.is_file() and any(p.stem == n or p.stem.startswith(n + "_") for n in names)]


#: An entry point's name after a score's: the score's name, then a direction or
#: ``_cuda`` (``gt_forward_cuda``, ``gt_backward_dq_mma``, ``cosine_forward_cuda``);
#: device helpers such as ``dot_frag`` do not match.
_ENTRY = r"\b((?:{names})_\w*?(?:forward|backward|fwd|bwd|cuda)\w*)\b"


def _code(text: str) -> str:
    """C++ source without its comments and string literals (their lines kept)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"',
                  lambda m: " " + "\n" * m.group(0).count("\n"), text, flags=re.S)


def score_entry_points(root: Path) -> list:
    """``file:line: name`` for each score's entry point (``_ENTRY``) that the code
    of cuda/'s shared folders declares, defines or calls: a score's entry points
    are declared in its header under cuda/scores/ and called from there."""
    scores = root / "cuda" / "scores"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(scores.iterdir())
                     if p.suffix in _CPP)
    names = set(re.findall(r"DFGNN_REGISTER_SCORE\((\w+)", text)) | set(_LAYER_NAMES)
    entry = re.compile(_ENTRY.format(names="|".join(sorted(names, key=len, reverse=True))))
    bad = []
    for folder in _SHARED:
        for p in sorted((root / "cuda" / folder).rglob("*")):
            if p.suffix in _CPP:
                code = _code(p.read_text(encoding="utf-8"))
                bad += [_at(root, p, code, m, m.group(1)) for m in entry.finditer(code)]
    return bad


#: Device helpers of the shared folders whose names start with a score's but
#: mean the dot product of two rows, not the dot score.
_DOT_PRODUCT = {"dot_frag", "dot_packed", "dot_packed2"}


def score_identifiers(root: Path) -> list:
    """``file:line: name`` for each identifier in the code of cuda/'s shared
    folders that starts with a score's name or short name (``gat_score2``,
    ``gt_mma_unit``, ``l2norm_launch``): a score's kernels, device functions and
    entry points live in its files under cuda/scores/."""
    scores = root / "cuda" / "scores"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(scores.iterdir())
                     if p.suffix in _CPP)
    names = set(re.findall(r"DFGNN_REGISTER_SCORE\((\w+)", text)) | set(_LAYER_NAMES)
    ident = re.compile(r"\b(?:{})_\w+".format("|".join(sorted(names, key=len, reverse=True))))
    bad = []
    for folder in _SHARED:
        for p in sorted((root / "cuda" / folder).rglob("*")):
            if p.suffix in _CPP:
                code = _code(p.read_text(encoding="utf-8"))
                bad += [_at(root, p, code, m, m.group(0)) for m in ident.finditer(code)
                        if m.group(0) not in _DOT_PRODUCT]
    return bad


def unity_group_files(root: Path) -> list:
    """``setup.py``'s UNITY_GROUPS entries, read without running it: the files it
    compiles as one translation unit, relative to cuda/."""
    for node in ast.parse((root / "setup.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "UNITY_GROUPS"
                                                for t in node.targets):
            return [f for files in ast.literal_eval(node.value).values() for f in files]
    raise AssertionError("setup.py has no UNITY_GROUPS")


# ----------------------------------------------- what the docs and comments name
#: A path the prose names: from a top-level folder of the repository, or from
#: cuda/ (``scores/dot.cuh``) or pyg_dfgnn/ (``ops/plan.py``).
_PATH = re.compile(r"(?<![\w/.<>*-])((?:[\w.-]+/)+[\w.-]+\.(?:cu|cuh|cpp|h|py|md|sh))\b")
#: A file of cuda/ named without its folder (``dot_forward_mma.cu``).
_CUDA_NAME = re.compile(r"(?<![\w/.<>*-])([\w-]+\.(?:cu|cuh|cpp))\b")
_BASES = ("", "cuda", "pyg_dfgnn", "pyg_dfgnn/ops")
_CPP = (".cu", ".cuh", ".cpp", ".h")


def _sources(root: Path):
    """``(C++ files, docs, Python files)`` of the source tree at ``root``."""
    cpp = sorted(p for p in (root / "cuda").rglob("*") if p.suffix in _CPP)
    docs = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    python = [root / "setup.py"] + sorted(p for top in ("pyg_dfgnn", "benchmarks", "tests",
                                                        "examples")
                                          for p in (root / top).rglob("*.py"))
    return cpp, docs, python


def _prose(path: Path) -> str:
    """The text of ``path`` where it names things: a C++ file's comments (not its
    ``#include`` lines, which the compiler checks), the whole of any other."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in _CPP:
        return "\n".join(line[line.index("//"):] if "//" in line else ""
                         for line in text.splitlines())
    return text


def _at(root: Path, path: Path, text: str, m, name: str) -> str:
    return f"{path.relative_to(root)}:{text.count(chr(10), 0, m.start()) + 1}: {name}"


def stale_references(root: Path) -> list:
    """``file:line: path`` for each file that the docs, the comments of cuda/ or
    the Python sources name and that does not exist under ``root``. Skipped:
    paths whose first folder is none of ours (``torch/library.h``, PyG's
    examples), a script said to be in git history (it left the tree), and files
    that a run writes (results are ``.json``, not matched)."""
    cpp, docs, python = _sources(root)
    cuda_names = {p.name for p in (root / "cuda").rglob("*") if p.is_file()}
    bad = []
    for path in cpp + docs + python:
        text = _prose(path)
        for m in _PATH.finditer(text):
            ref = m.group(1)
            ours = any((root / base / ref.split("/")[0]).is_dir() for base in _BASES)
            if (not ours or "PyG's" in text[max(0, m.start() - 12):m.start()]
                    or "git history" in text[m.end():m.end() + 250]):
                continue
            if not any((root / base / ref).exists() for base in _BASES + (path.parent,)):
                bad.append(_at(root, path, text, m, ref))
        if path.suffix in _CPP:
            bad += [_at(root, path, text, m, m.group(1)) for m in _CUDA_NAME.finditer(text)
                    if m.group(1) not in cuda_names]
    return bad


def _module_names(path: Path) -> set:
    """The names a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def stale_dotted_names(root: Path) -> list:
    """``file:line: name`` for each ``pyg_dfgnn.<module>.<name>`` named in the
    docs, the comments of cuda/ or the Python sources whose module is not a file
    of the package, or whose first name after the module is neither defined
    there nor set on import (as ``pyg_dfgnn.nn`` sets its layers).
    ``pyg_dfgnn._C`` is the compiled extension; a name in quotes is data (a
    torch op's name: ``"pyg_dfgnn.dot_attention.default"``)."""
    cpp, docs, python = _sources(root)
    bad = []
    for path in cpp + docs + python:
        text = _prose(path)
        for m in re.finditer(r"(?<![\w.:/\"'])pyg_dfgnn((?:\.\w+)+)", text):
            parts = m.group(1)[1:].split(".")
            mod = root / "pyg_dfgnn"
            while parts and parts[0] != "_C" and (
                    (mod / parts[0]).with_suffix(".py").is_file()
                    or (mod / parts[0] / "__init__.py").is_file()):
                mod = mod / parts.pop(0)
            if not parts or parts[0] == "_C":
                continue
            file = mod / "__init__.py" if mod.is_dir() else mod.with_suffix(".py")
            if parts[0] in _module_names(file):
                continue
            try:
                module = importlib.import_module(".".join(mod.relative_to(root).parts))
                if hasattr(module, parts[0]):
                    continue
            except ImportError:
                pass
            bad.append(_at(root, path, text, m, "pyg_dfgnn" + m.group(1)))
    return bad


def stale_op_names(root: Path) -> list:
    """``file:line: name`` for each ``dfgnn::<name>`` in a string of cuda/ (the
    error messages) or in backticks in the docs, and each ``ops.dfgnn.<name>``
    anywhere, that is neither an op the extension defines (``m.def``) nor one of
    its autograd nodes: a message or doc naming an op the user cannot find."""
    cpp, docs, python = _sources(root)
    glue = "\n".join(p.read_text(encoding="utf-8") for p in cpp if p.suffix == ".cpp")
    known = set(re.findall(r"m\.def\(\s*\"(\w+)\(", glue))
    known |= set(re.findall(r"name\(\) const override \{ return \"dfgnn::(\w+)\"", glue))
    bad = []
    for path in cpp + docs + python:
        text = path.read_text(encoding="utf-8")
        found = list(re.finditer(r"ops\.dfgnn\.(\w+)", text))
        if path in cpp:
            found += re.finditer(r"\"dfgnn::(\w+)", text)
        elif path in docs:
            found += re.finditer(r"`dfgnn::(\w+)", text)
        bad += [_at(root, path, text, m, m.group(1)) for m in found if m.group(1) not in known]
    return bad


@pytest.fixture
def tree():
    root = Path(__file__).resolve().parents[1]
    if not (root / "cuda").is_dir() or not (root / "docs").is_dir():
        pytest.skip("needs the source tree (cuda/, docs/)")
    return root


def test_named_files_exist(tree):
    bad = stale_references(tree)
    assert not bad, "files named in docs or comments that do not exist:\n" + "\n".join(bad)


def test_named_python_names_exist(tree):
    bad = stale_dotted_names(tree)
    assert not bad, "pyg_dfgnn names in docs or comments that do not exist:\n" + "\n".join(bad)


def test_named_ops_exist(tree):
    bad = stale_op_names(tree)
    assert not bad, "dfgnn ops named in messages or docs that do not exist:\n" + "\n".join(bad)


def test_only_the_score_folders_name_a_score(tree):
    """Every score is a unit (docs/architecture.md): its kernels are files of
    cuda/scores/, instantiations of the shared walks, so no file of the shared
    folders is named after one."""
    bad = score_named_files(tree)
    assert not bad, "files outside cuda/scores/ named after a score:\n" + "\n".join(bad)


def test_only_the_score_folders_declare_a_score_entry_point(tree):
    """A score's host entry points (``gt_forward_cuda``, ``gat_backward_cuda``,
    ``cosine_forward_cuda``) are declared in its own header under cuda/scores/,
    so no shared file declares, defines or calls one."""
    bad = score_entry_points(tree)
    assert not bad, "score entry points outside cuda/scores/:\n" + "\n".join(bad)


def test_only_the_score_folders_name_a_score_in_code(tree):
    """No kernel, device function or entry point of the shared folders carries a
    score's name: each is code of one score, so it lives in that score's files."""
    bad = score_identifiers(tree)
    assert not bad, "score names in the code outside cuda/scores/:\n" + "\n".join(bad)


def test_unity_groups_name_existing_files(tree):
    """setup.py compiles each UNITY_GROUPS file inside a generated unit, not
    alone: a moved file it still names would fail the build, not a test run."""
    missing = [f for f in unity_group_files(tree) if not (tree / "cuda" / f).is_file()]
    assert not missing, f"UNITY_GROUPS in setup.py names missing files: {missing}"
