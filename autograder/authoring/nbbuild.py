"""Build nbgrader source notebooks from code (used by assignments/*/_build_nb.py).

    nb = NotebookBuilder("02_tensor_parallel")
    nb.markdown("# Tensor parallelism")
    nb.given("setup", "import torch")                         # locked, read-only code
    nb.solution_from("mappings", solutions.tensor_parallel.mappings, "copy_to_tensor_model_parallel_region")
    nb.test("test_mappings_forward", 2, doc="The six mappings' forward on 2 ranks.",
            visible="check_mappings(..., world_size=2)", hidden="check_mappings(..., world_size=4)")
    nb.write("source/02_tensor_parallel/tensor_parallel_lab.ipynb")   # in $COURSE_LANG: en, or zh (translations.py)

Solution text is read from the solution module's source (one source of truth,
spec 3.1); the module itself carries nbgrader's `### BEGIN SOLUTION` /
`### END SOLUTION` markers inside function bodies, so the released stub keeps
each signature and docstring. Cell ids are derived from grade ids, so a
rebuild reproduces the notebook byte for byte.
"""

from __future__ import annotations

import ast
import copy
import inspect
import os
import sys
import textwrap

import nbformat
from nbformat import v4

__all__ = ["NotebookBuilder", "source_of", "unreachable_statements"]

SCHEMA_VERSION = 3


def source_of(module, *names: str) -> str:
    """The exact source text of top-level functions/classes/assignments `names` in `module`."""
    path = inspect.getsourcefile(module)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    tree = ast.parse(text)
    found = {}
    for node in tree.body:
        node_names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node_names = [node.name]
        elif isinstance(node, ast.Assign):
            node_names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            node_names = [node.target.id]
        for n in node_names:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            end = node.end_lineno
            # The AST ends at the last statement: keep the indented `### END SOLUTION`
            # that closes the last body (a comment, invisible to the AST).
            while end < len(lines) and lines[end].startswith((" ", "\t")) and lines[end].strip() == "### END SOLUTION":
                end += 1
            found[n] = "\n".join(lines[start - 1:end])
    missing = [n for n in names if n not in found]
    if missing:
        raise KeyError(f"{module.__name__} ({path}) has no top-level {', '.join(missing)}")
    return "\n\n\n".join(found[n] for n in names)


_TERMINAL = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def unreachable_statements(source: str) -> list[tuple[int, str]]:
    """(line, why) of every statement of a cell that can never run.

    - a statement after `return`, `raise`, `continue` or `break` in the same block;
    - a hidden-test block (between `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS`) whose code lands
      inside a `def` or `class` that starts before the block (a helper written at column 0 joined with
      checks indented by four: the checks become the helper's body, after its `return`).
    """
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block[:-1]):
                if isinstance(stmt, _TERMINAL):
                    nxt = block[i + 1]
                    found.append((nxt.lineno, f"line {nxt.lineno} comes after the "
                                              f"`{type(stmt).__name__.lower()}` of line {stmt.lineno}"))
                    break
    lines = source.splitlines()
    begins = [i + 1 for i, line in enumerate(lines) if "### BEGIN HIDDEN TESTS" in line]
    ends = [i + 1 for i, line in enumerate(lines) if "### END HIDDEN TESTS" in line]
    for begin, end in zip(begins, ends):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and node.lineno < begin < node.end_lineno:
                found.append((begin, f"the hidden tests of lines {begin}-{end} are inside `{node.name}` "
                                     f"(line {node.lineno}): they run only if it is called"))
    return sorted(set(found))


def _imports_checking(source: str) -> bool:
    """Whether a cell's code imports `checking` from the runtime (its public name, or its module)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.ImportFrom) and node.module in ("autograder.runtime", "autograder.runtime.report")
               and any(alias.name == "checking" for alias in node.names) for node in ast.walk(tree))


def _course_root(path: str) -> str:
    """The course root above a notebook path (the folder with nbgrader_config.py), else this checkout's."""
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        if os.path.exists(os.path.join(folder, "nbgrader_config.py")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        folder = parent


class NotebookBuilder:
    """Accumulate cells with nbgrader metadata; write a deterministic .ipynb."""

    def __init__(self, name: str):
        self.name = name
        self.cells = []
        self._ids: set[str] = set()
        self._exercise: str | None = None
        self._owned: dict[str, list[str]] = {}  # exercise label -> names its answer cells define

    # -- cells ----------------------------------------------------------------
    def _cell_id(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c in "-_" else "-" for c in base)[:60] or "cell"
        cid, i = base, 1
        while cid in self._ids:
            i += 1
            cid = f"{base}-{i}"
        self._ids.add(cid)
        return cid

    def _meta(self, *, grade_id, grade=False, solution=False, locked=False, points=None):
        meta = {"grade": grade, "grade_id": grade_id, "locked": locked,
                "schema_version": SCHEMA_VERSION, "solution": solution, "task": False}
        if points is not None:
            meta["points"] = points
        return {"nbgrader": meta}

    def markdown(self, text: str) -> None:
        """A plain markdown cell (lesson text)."""
        cell = v4.new_markdown_cell(textwrap.dedent(text).strip("\n"))
        cell.id = self._cell_id(f"md-{len(self.cells)}")
        self.cells.append(cell)

    def code(self, source: str) -> None:
        """A plain, editable code cell (scratch space, examples, pictures).

        Tagged `raises-exception`: it fails while an exercise it uses is a stub,
        and "Run All" goes on past it (JupyterLab honours the tag).
        """
        cell = v4.new_code_cell(textwrap.dedent(source).strip("\n"), metadata={"tags": ["raises-exception"]})
        cell.id = self._cell_id(f"code-{len(self.cells)}")
        self.cells.append(cell)

    def given(self, grade_id: str, source: str) -> None:
        """A locked read-only code cell (set-up, a worked example); autograde restores it."""
        cell = v4.new_code_cell(textwrap.dedent(source).strip("\n"),
                                metadata=self._meta(grade_id=grade_id, locked=True))
        cell.id = self._cell_id(grade_id)
        self.cells.append(cell)

    def solution(self, grade_id: str, source: str, *, names: list[str] | None = None) -> None:
        """An autograded answer cell; `source` must carry BEGIN/END SOLUTION markers."""
        source = source.strip("\n")
        if "### BEGIN SOLUTION" not in source or "### END SOLUTION" not in source:
            raise ValueError(f"solution cell {grade_id!r} has no ### BEGIN/END SOLUTION markers")
        meta = self._meta(grade_id=grade_id, solution=True)
        if names:
            meta["course"] = {"names": list(names)}
        if self._exercise is not None:
            defined = [n.name for n in ast.parse(source).body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            owned = self._owned.setdefault(self._exercise, [])
            owned += [n for n in defined if n not in owned]
        cell = v4.new_code_cell(source, metadata=meta)
        cell.id = self._cell_id(grade_id)
        self.cells.append(cell)

    def solution_from(self, grade_id: str, module, *names: str, prefix: str = "") -> None:
        """An answer cell holding the source of `names` from the solution module."""
        body = source_of(module, *names)
        self.solution(grade_id, (prefix.strip("\n") + "\n\n\n" if prefix else "") + body, names=list(names))

    def exercise(self, number, title: str, text: str = "") -> None:
        """Start exercise `number`: its heading and task text; the test cells after it are labelled with it.

        A stub's failure names the exercise ("Exercise 3 is not done yet: ..."),
        and a passing test cell prints its label.
        """
        self._exercise = f"Exercise {number}"
        body = textwrap.dedent(text).strip("\n")
        self.markdown(f"## Exercise {number}: {title}" + (f"\n\n{body}" if body else ""))

    def test(self, grade_id: str, points: float, *, doc: str, visible: str, hidden: str = "",
             label: str | None = None) -> None:
        """A graded test cell: one behaviour, its points, visible checks, then hidden ones.

        The checks run inside `checking(label, doc)` (autograder.runtime.report): one line
        when they pass, the exercise and the verdict first when they fail. The
        label is the current exercise (see `exercise`) unless given.
        """
        if not doc or "\n" in doc.strip():
            raise ValueError(f"test {grade_id!r}: doc must be one line saying what is checked")
        label = label or self._exercise
        if label is None:
            raise ValueError(f"test {grade_id!r}: no exercise started (call exercise() first, or pass label=)")
        doc = doc.strip()
        body = [textwrap.dedent(visible).strip("\n")]
        if hidden.strip():
            body += ["### BEGIN HIDDEN TESTS", textwrap.dedent(hidden).strip("\n"), "### END HIDDEN TESTS"]
        inner = textwrap.indent("\n".join(p for p in body if p), "    ")
        source = f"with checking({label!r}, {doc!r}):\n{inner}"
        dead = unreachable_statements(source)
        if dead:
            raise ValueError(f"test {grade_id!r}: statements that never run: {'; '.join(w for _, w in dead)}")
        # `raises-exception`: "Run All" goes on past a failing test, so one run shows every exercise's state
        cell = v4.new_code_cell(source, metadata={**self._meta(grade_id=grade_id, grade=True, locked=True,
                                                             points=points), "tags": ["raises-exception"]})
        cell.id = self._cell_id(grade_id)
        self.cells.append(cell)

    def nccl_checks(self, checks_src: str) -> None:
        """The optional, ungraded NCCL cell: `checks_src` is the list given to run_nccl_checks."""
        self.markdown("""
        ## Optional: the same checks on GPUs with NCCL (not graded)

        On a machine with at least two CUDA devices this runs a few checks again
        with `backend="nccl"` (ranks spawned, tensors on `cuda:<rank>`);
        elsewhere each line says it was skipped and why. No points depend on it.
        """)
        self.code("from autograder.runtime import run_nccl_checks\n\nverdicts = run_nccl_checks("
                  + textwrap.dedent(checks_src).strip() + ")")

    # -- output -----------------------------------------------------------------
    def _owners_call(self) -> str:
        """The set-up cell's last lines: which exercise's answer cells define which functions."""
        entries = ""
        for label, names in self._owned.items():
            line = f'    "{label}": ['
            for i, name in enumerate(names):
                item = f'"{name}"' + (", " if i < len(names) - 1 else "")
                if len(line) + len(item) > 110:
                    entries += line.rstrip() + "\n"
                    line = " " * 8
                line += item
            entries += line + "],\n"
        return ("\n\n# Which exercise defines each function you write (a test or a picture that uses one still a stub\n"
                "# names that exercise), and every cell's failure shown as the test cells show theirs.\n"
                "from autograder.runtime import course_notebook\n\n"
                f"course_notebook({{\n{entries}}}, language=\"en\")")

    def notebook(self):
        nb = v4.new_notebook()
        cells = list(self.cells)
        if self._owned:
            for i, cell in enumerate(cells):
                meta = cell.metadata.get("nbgrader", {})
                if cell.cell_type == "code" and meta.get("locked") and not meta.get("grade") \
                        and _imports_checking(cell.source):
                    cells[i] = copy.deepcopy(cell)
                    cells[i].source = cell.source + self._owners_call()
                    break
        nb.cells = cells
        nb.metadata = {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        }
        return nb

    def write(self, path: str, *, lang: str | None = None) -> None:
        """Write the notebook to `path`, in English or, with `lang` (default: $COURSE_LANG), translated.

        A translation replaces markdown text and the code cells' prose (autograder.authoring.translations):
        cells, ids, grading ids and code are those of the English notebook. A markdown cell without a current
        translation stays English, and a line on stderr says which.
        """
        from autograder.authoring.translations import course_language, translate_notebook

        lang = course_language(lang)
        nb = self.notebook()
        tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        imports = any(_imports_checking(c.source)
                      for c in nb.cells if c.metadata.get("nbgrader", {}).get("locked") and c not in tests)
        if tests and not imports:
            raise ValueError("the graded test cells use `checking`: a given (locked) set-up cell must "
                             "`from autograder.runtime import checking`")
        grade_ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
        dupes = {g for g in grade_ids if grade_ids.count(g) > 1}
        if dupes:
            raise ValueError(f"duplicate grade_id(s): {sorted(dupes)}")
        if lang != "en":
            missing = translate_notebook(nb, _course_root(path), self.name, lang)
            if missing:
                print(f"{self.name}: {len(missing)} markdown cell(s) without a current {lang} translation kept in "
                      f"English (python -m autograder.authoring.translations status {self.name})", file=sys.stderr)
        nbformat.validate(nb)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            nbformat.write(nb, f)
