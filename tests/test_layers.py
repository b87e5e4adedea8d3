"""The autograder package's layers: imports point one way, and the student package stands on its own.

    .venv/bin/python -m pytest -q tests/test_layers.py

Every module under autograder/ is parsed (never imported) and every import in
it is collected: module-level and function-level statements alike
(`ast.walk`), and imports written as text for another process or a notebook
(`"from autograder.grading.trusted import _zygote_main"`). Then:

- each subpackage has a rank (LAYERS); a module may import its own subpackage
  or a subpackage of a lower rank, never a higher one nor a sibling of the same
  rank (runtime and lessons sit side by side at the bottom);
- the graph of subpackages, and the graph of modules, have no cycle;
- the student package (runtime, lessons, checks) imports nothing but the
  standard library, itself and the dependencies pyproject.toml declares
  (never solutions/, tests/ or the instructor's nbgrader);
- a released notebook imports only the documented names: the runtime's
  public API (autograder.runtime.__all__), and public names of the lessons'
  and checks' modules.
The checker itself is tested on made-up graphs (an upward import, a sideways
one, a cycle), so that these tests can fail.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import sys

import pytest

from course import ROOT

sys.path.insert(0, ROOT)
from autograder.authoring.package import STUDENT_LAYERS  # noqa: E402

PACKAGE = os.path.join(ROOT, "autograder")

# subpackage -> rank: a module imports only its own subpackage and lower ranks
LAYERS = {"runtime": 0, "lessons": 0, "checks": 1, "authoring": 2, "grading": 3}
STUDENT = set(STUDENT_LAYERS)  # what the student's wheel ships (autograder/authoring/package.py)
TOP = "<top>"       # autograder/__init__.py and autograder/grade.py (`python -m autograder.grade`): above all

_TEXT_IMPORT = re.compile(r"\b(?:from|import)\s+(autograder(?:\.\w+)*)")


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _layer(module: str) -> str | None:
    """The subpackage of `autograder.<sub>...`; TOP for the package's top-level modules; None outside."""
    parts = module.split(".")
    if parts[0] != "autograder":
        return None
    if len(parts) == 1 or os.path.isfile(os.path.join(PACKAGE, parts[1] + ".py")):
        return TOP
    return parts[1]


def _resolve(name: str, modules: set[str]) -> str:
    """The longest prefix of a dotted name that is a module of the package (`autograder.runtime.dist.x` -> dist)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i])
    return name


def _imports(path: str, module: str) -> set[str]:
    """Every dotted name `path` imports: statements anywhere in the file, and imports written as text (not the
    usage examples of docstrings)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from autograder.runtime import dist`: a module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.update(_TEXT_IMPORT.findall(node.value))  # code run elsewhere (a subprocess, a kernel, a notebook)
    return out


def package_graph() -> dict[str, set[str]]:
    """module -> the modules and outside names it imports (autograder's modules resolved, the rest as written)."""
    paths = sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True))
    modules = {_module_name(p) for p in paths}
    graph = {}
    for p in paths:
        m = _module_name(p)
        names = _imports(p, m)
        graph[m] = {_resolve(n, modules) if n.split(".")[0] == "autograder" else n for n in names} - {m}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run upward or sideways between layers, and layers the table does not know."""
    out = []
    for module, names in sorted(graph.items()):
        a = _layer(module)
        if a not in LAYERS and a != TOP:
            out.append(f"{module}: its subpackage {a!r} has no rank in LAYERS")
            continue
        for name in sorted(names):
            b = _layer(name)
            if b is None or name == "autograder" or a == b or a == TOP:
                continue
            if b == TOP:
                out.append(f"{module} imports {name}, a top-level module (only the layers' own modules are imported)")
            elif b not in LAYERS:
                out.append(f"{module} imports {name}: its subpackage {b!r} has no rank in LAYERS")
            elif LAYERS[b] >= LAYERS[a]:
                kind = "upward" if LAYERS[b] > LAYERS[a] else "sideways"
                out.append(f"{module} ({a}, rank {LAYERS[a]}) imports {name} ({b}, rank {LAYERS[b]}): {kind}")
    return out


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, names in graph.items():
        a = _layer(module)
        for name in names:
            b = _layer(name)
            if b is not None and name != "autograder" and a != b:
                edges.setdefault(a, set()).add(b)
    return edges


# -- the package as it is -------------------------------------------------------------------------------

def test_every_import_points_down():
    found = violations(package_graph())
    assert not found, "imports against the layering (runtime, lessons < checks < authoring < grading):\n" + \
        "\n".join(found)


def test_no_cycle_between_subpackages_or_between_modules():
    graph = package_graph()
    cycle = find_cycle(layer_edges(graph))
    assert cycle is None, f"the subpackages import each other in a circle: {' -> '.join(cycle)}"
    modules = {m: {n for n in names if n in graph} for m, names in graph.items()}
    cycle = find_cycle(modules)
    assert cycle is None, f"modules import each other in a circle: {' -> '.join(cycle)}"


def test_every_subpackage_is_ranked_and_says_what_it_is_for():
    subpackages = sorted(os.path.basename(os.path.dirname(p))
                         for p in glob.glob(os.path.join(PACKAGE, "*", "__init__.py")))
    assert subpackages == sorted(LAYERS), f"subpackages {subpackages}, ranked {sorted(LAYERS)}"
    for sub in subpackages:
        doc = ast.get_docstring(ast.parse(open(os.path.join(PACKAGE, sub, "__init__.py")).read())) or ""
        assert len(doc.split()) >= 20, f"autograder/{sub}/__init__.py: its docstring should say what it is for"
        assert "used by" in doc.lower(), f"autograder/{sub}/__init__.py: its docstring should say who uses it"
    top = ast.parse(open(os.path.join(PACKAGE, "__init__.py")).read())
    assert not [n for n in ast.walk(top) if isinstance(n, (ast.Import, ast.ImportFrom))], \
        "autograder/__init__.py imports nothing (importing one layer must not import the others)"


def test_the_checks_are_a_package_per_dimension_as_the_solutions_are():
    """autograder/checks/<dim>/ for each solutions/<dim>/, no module over about 1,000 lines, and each package's
    __init__ lists its exercises and re-exports every public name of its modules (a notebook imports from there)."""
    checks = os.path.join(PACKAGE, "checks")
    dims = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(ROOT, "solutions", "*", "__init__.py")))
    packages = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(checks, "*", "__init__.py")))
    assert packages == dims, f"autograder/checks/ holds {packages}; solutions/ {dims}"
    assert [os.path.basename(p) for p in glob.glob(os.path.join(checks, "*.py"))] == ["__init__.py"], \
        "a check module belongs to the package of its dimension"
    long = [f"{os.path.relpath(p, ROOT)} ({n} lines)" for p in glob.glob(os.path.join(checks, "*", "*.py"))
            if (n := len(open(p, encoding="utf-8").read().splitlines())) > 1000]
    assert not long, f"split these along their exercises: {long}"
    for dim in dims:
        init = os.path.join(checks, dim, "__init__.py")
        doc = ast.get_docstring(ast.parse(open(init, encoding="utf-8").read())) or ""
        assert "Exercise -> check" in doc, f"{os.path.relpath(init, ROOT)}: its docstring lists exercise -> check"
        exported = set(_module_all(f"autograder.checks.{dim}") or ())
        for path in sorted(glob.glob(os.path.join(checks, dim, "*.py"))):
            name = os.path.basename(path)[:-3]
            if name == "__init__":
                continue
            missing = set(_module_all(f"autograder.checks.{dim}.{name}") or ()) - exported
            assert not missing, f"autograder/checks/{dim}/__init__.py does not re-export {sorted(missing)} of {name}.py"


def _declared_dependencies() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0].lower().replace("-", "_") for d in deps}


def test_the_student_package_needs_only_its_declared_dependencies():
    allowed = _declared_dependencies() | {"autograder"}
    graph = package_graph()
    bad = []
    for module, names in sorted(graph.items()):
        if _layer(module) not in STUDENT:
            continue
        for name in sorted(names):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in allowed and (_layer(name) in STUDENT | {TOP, None}):
                continue
            bad.append(f"{module} imports {name}")
    assert not bad, (f"the student package ({', '.join(sorted(STUDENT))}) may import only the standard library, "
                     f"itself and {sorted(allowed - {'autograder'})}:\n" + "\n".join(bad))


def _notebook_imports(path: str) -> list[tuple[str, str]]:
    """(module, name) of every `from autograder... import name` in a notebook's code cells."""
    out = []
    for cell in json.load(open(path, encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                out += [(a.name, "") for a in node.names if a.name.split(".")[0] == "autograder"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "autograder":
                out += [(node.module, a.name) for a in node.names]
    return out


def _module_all(module: str) -> list[str] | None:
    """The module's `__all__` (literal lists, `=` then `+=`) if it states one, else None (read from its source; a
    package's from its __init__.py, as the checks' packages state theirs)."""
    path = os.path.join(ROOT, *module.split(".")) + ".py"
    if not os.path.isfile(path):
        path = os.path.join(ROOT, *module.split("."), "__init__.py")
    names = None
    for node in ast.parse(open(path, encoding="utf-8").read()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == "__all__":
            names += list(ast.literal_eval(node.value))
    return names


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "release", "*", "*.ipynb"))),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_a_released_notebook_imports_only_documented_names(path):
    import autograder.runtime

    bad = []
    imports = _notebook_imports(path)
    assert any(m == "autograder.runtime" and n == "checking" for m, n in imports), "no runtime import of checking"
    for module, name in imports:
        if module == "autograder.runtime":
            ok = name in autograder.runtime.__all__
        elif _layer(module) in ("lessons", "checks") and module.count(".") == 2 and name:
            declared = _module_all(module)
            ok = not name.startswith("_") and (declared is None or name in declared)
        else:
            ok = False  # a runtime module by path, the grading or authoring layers, a bare `import autograder...`
        if not ok:
            bad.append(f"from {module} import {name}")
    assert not bad, ("a released notebook imports the runtime's public API (autograder.runtime.__all__) and public "
                     "names of autograder.lessons.<module> and autograder.checks.<module> only; found: "
                     + ", ".join(bad))


# -- the checker can fail ---------------------------------------------------------------------------------

def test_the_checker_finds_upward_and_sideways_imports_and_cycles():
    graph = {
        "autograder.runtime.dist": {"autograder.grading.trusted", "autograder.runtime.report"},  # upward
        "autograder.lessons.volume": {"autograder.runtime.ledger"},                              # sideways
        "autograder.checks.tensor_parallel": {"autograder.runtime.dist", "torch"},                # fine
        "autograder.grading.trusted": {"autograder.runtime.dist"},                                # fine
        "autograder.extras.thing": set(),                                                         # unranked
    }
    found = "\n".join(violations(graph))
    assert "autograder.runtime.dist (runtime, rank 0) imports autograder.grading.trusted (grading, rank 3): upward" \
        in found, found
    assert "imports autograder.runtime.ledger (runtime, rank 0): sideways" in found, found
    assert "'extras' has no rank" in found, found
    assert "tensor_parallel" not in found and "grading.trusted (grading, rank 3) imports" not in found, found
    cycle = find_cycle(layer_edges(graph))
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"runtime", "grading"}, cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_the_checker_sees_function_level_and_text_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Usage: from autograder.checks.composition import plot_rank_layout"""\n'
                   "def f():\n    from autograder.grading import trusted\n"
                   "CMD = 'from autograder.grading.sandbox import _launch; _launch()'\n")
    names = _imports(str(src), "autograder.runtime.m")
    assert {"autograder.grading.trusted", "autograder.grading.sandbox"} <= names, names
    assert "autograder.checks.composition" not in names, names  # a docstring's example is not an import
