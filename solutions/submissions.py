"""Make and grade submissions in-process (instructor tooling and the test suite).

    nb = reference_submission("02_tensor_parallel")           # release + reference code
    m = mutants_of("02_tensor_parallel")[0]                    # solutions/tensor_parallel/mutants.py
    nb = mutant_submission("02_tensor_parallel", m)           # release + one wrong edit
    results = run_graded_cells(nb)   # {grade_id: CellResult(passed, points, message)}

A `Mutant` is a plausible wrong implementation kept as a test: a student's
edit of one reference answer cell, written as exact text replacements, so
the same wrong code is graded in-process by the test suite
(tests/test_*_notebook.py) and by real nbgrader in the demo. Each
dimension's mutants are in solutions/<dim>/mutants.py (`MUTANTS`).

`run_graded_cells` executes a notebook's cells in order in this process, like a
kernel would (errors do not stop later cells), with each test cell's hidden
tests taken from the source notebook, as `nbgrader autograde` does. It is the
fast path the mutant tests use; tests/test_pipeline.py runs real nbgrader.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import linecache
import os
import re
import traceback
from dataclasses import dataclass

import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|\Z)", re.M)


@dataclass(frozen=True)
class Mutant:
    name: str                   # short slug, e.g. "mean_not_averaged"
    cell: str                   # grade_id of the solution cell it edits
    patches: tuple              # ((old, new), ...): each `old` must occur exactly once in the cell
    must_fail: frozenset        # grade_ids of test cells that must fail
    why: str = ""               # what a student got wrong, in one line
    demo: bool = False          # the wrong submission that `make demo` grades

    def apply(self, source: str) -> str:
        for old, new in self.patches:
            n = source.count(old)
            if n != 1:
                raise ValueError(f"mutant {self.name!r}: patch text occurs {n} times in cell {self.cell!r} "
                                 f"(must be exactly once): {old!r}")
            source = source.replace(old, new)
        return source


def mutant(name, cell, patches, must_fail, why="", demo=False) -> Mutant:
    return Mutant(name, cell, tuple(tuple(p) for p in patches), frozenset(must_fail), why, demo)


def mutants_of(assignment: str) -> list[Mutant]:
    """`MUTANTS` of an assignment: "02_tensor_parallel" -> solutions/tensor_parallel/mutants.py."""
    return importlib.import_module(f"solutions.{assignment.split('_', 1)[1]}.mutants").MUTANTS


def notebook_path(kind: str, assignment: str) -> str:
    """kind: "source" or "release"; the one notebook of that assignment."""
    folder = os.path.join(ROOT, kind, assignment)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".ipynb"))
    if len(names) != 1:
        raise FileNotFoundError(f"expected one notebook in {folder}, found {names}")
    return os.path.join(folder, names[0])


def _nb_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def strip_markers(source: str) -> str:
    """A solution cell as a student would have written it: the markers removed."""
    return _MARKERS.sub("", source)


def reference_submission(assignment: str):
    """The release notebook with every answer cell filled with the reference code."""
    source = nbformat.read(notebook_path("source", assignment), as_version=4)
    release = nbformat.read(notebook_path("release", assignment), as_version=4)
    answers = {_nb_meta(c)["grade_id"]: c.source for c in source.cells if _nb_meta(c).get("solution")}
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        meta = _nb_meta(cell)
        if meta.get("solution"):
            cell.source = strip_markers(answers[meta["grade_id"]])
    return nb


def mutant_submission(assignment: str, mutant):
    nb = reference_submission(assignment)
    for cell in nb.cells:
        if _nb_meta(cell).get("grade_id") == mutant.cell:
            cell.source = mutant.apply(cell.source)
            return nb
    raise KeyError(f"mutant {mutant.name!r}: no solution cell {mutant.cell!r} in {assignment}")


def untouched_submission(assignment: str):
    return nbformat.read(notebook_path("release", assignment), as_version=4)


@dataclass
class CellResult:
    grade_id: str
    passed: bool
    points: float
    message: str = ""


def run_graded_cells(nb, assignment: str | None = None, *, only=None) -> dict[str, CellResult]:
    """Execute `nb` in a fresh namespace in this process; return each test cell's verdict.

    With `assignment`, test cells are replaced by the source notebook's (hidden
    tests included), as nbgrader's autograde restores locked cells. With
    `only` (grade ids), just those test cells run, after every nbgrader cell
    (set-up, answers) but no scratch or picture cell: a fast partial grading.
    """
    if assignment is not None:
        source = nbformat.read(notebook_path("source", assignment), as_version=4)
        tests = {_nb_meta(c)["grade_id"]: c.source for c in source.cells if _nb_meta(c).get("grade")}
    else:
        tests = {}
    namespace: dict = {"__name__": "__main__"}
    results: dict[str, CellResult] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = _nb_meta(cell)
        if only is not None and (not meta or (meta.get("grade") and meta["grade_id"] not in only)):
            continue
        src = tests.get(meta.get("grade_id"), cell.source) if meta.get("grade") else cell.source
        src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        out = io.StringIO()
        ok, msg = True, ""
        filename = f"<cell {meta.get('grade_id', '?')}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # as IPython does
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(src, filename, "exec"), namespace)
        except BaseException as exc:  # noqa: BLE001 - a cell error is a verdict, not a crash
            if isinstance(exc, KeyboardInterrupt):
                raise
            ok, msg = False, "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if meta.get("grade"):
            results[meta["grade_id"]] = CellResult(meta["grade_id"], ok, float(meta.get("points", 0)), msg)
    return results
