"""A small real course for the grading tests: assignment 02 cut down to two graded cells.

    root = make_mini_course(tmp_path)                    # a scratch course, built with nbgrader
    write_submission(root, "alice", reference(root))     # submitted/alice/02_tensor_parallel/<nb>.ipynb
    run_grade(root, "autograde", A, "--jobs", "2")       # the course's command, as an instructor runs it

The two cells (f and g, each with visible and hidden cases) keep every
submission's grading to a few seconds while exercising the whole pipeline:
intake, sandbox, nbgrader's kernel run, the trusted run, feedback, gradebook.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

from autograder.grading.sandbox import sandbox_status
from course import copy_course

A = "02_tensor_parallel"
KEEP = ("test_copy_to_region", "test_reduce_from_region")
POINTS = {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0}
VENV_BIN = os.path.dirname(sys.executable)
_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|\Z)", re.M)


# Grading a class runs every submission in the bubblewrap sandbox. CI sets COURSE_REQUIRE_SANDBOX=1
# (.ci/run installs bubblewrap): there a missing sandbox is a failure; elsewhere these tests are skipped.
_SANDBOX_OK, _SANDBOX_WHY = sandbox_status()
if not _SANDBOX_OK and os.environ.get("COURSE_REQUIRE_SANDBOX") == "1":
    raise RuntimeError(f"COURSE_REQUIRE_SANDBOX=1 but {_SANDBOX_WHY}")
needs_sandbox = pytest.mark.skipif(not _SANDBOX_OK, reason=f"grading a class needs its sandbox: {_SANDBOX_WHY}")


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def env(root: str) -> dict:
    return {**os.environ, "PYTHONPATH": root, "TORCH_CPP_LOG_LEVEL": "ERROR",
            "AUTOGRADER_WORKDIR": os.path.join(root, ".grading-work"),  # every process of a run under `root`
            "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")}


def notebook_name(root: str, assignment: str = A) -> str:
    return next(n for n in os.listdir(os.path.join(root, "release", assignment)) if n.endswith(".ipynb"))


def make_mini_course(dest, keep=KEEP, also: dict[str, tuple[str, ...]] | None = None) -> str:
    """A scratch course whose assignment A keeps the graded cells `keep` (and every given and answer cell);
    `also`: other assignments cut down the same way, assignment -> the graded cells it keeps."""
    root = str(dest)
    copy_course(root)
    for assignment, cells in {A: keep, **(also or {})}.items():
        _cut(root, assignment, cells)
    return root


def _cut(root: str, assignment: str, keep) -> None:
    src_path = os.path.join(root, "source", assignment, notebook_name(root, assignment))
    nb = nbformat.read(src_path, as_version=4)
    cells = []
    for cell in nb.cells:
        meta = _meta(cell)
        if cell.cell_type == "markdown":
            cells.append(cell)
        elif meta.get("grade") and not meta.get("solution"):
            if meta["grade_id"] in keep:
                cells.append(cell)
        elif meta:  # given and answer cells
            cells.append(cell)
    nb.cells = cells
    nbformat.write(nb, src_path)
    proc = subprocess.run([os.path.join(VENV_BIN, "nbgrader"), "generate_assignment", assignment, "--force",
                           "--log-level=ERROR"], cwd=root, env=env(root), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def release(root: str, assignment: str = A) -> dict:
    with open(os.path.join(root, "release", assignment, notebook_name(root, assignment)), encoding="utf-8") as f:
        return json.load(f)


def reference(root: str, assignment: str = A) -> dict:
    """The release notebook with every answer cell filled in from the source, as a student would have it."""
    with open(os.path.join(root, "source", assignment, notebook_name(root, assignment)), encoding="utf-8") as f:
        source = json.load(f)
    answers = {_meta(c)["grade_id"]: _text(c) for c in source["cells"] if _meta(c).get("solution")}
    nb = release(root, assignment)
    for cell in nb["cells"]:
        if _meta(cell).get("solution"):
            cell["source"] = _MARKERS.sub("", answers[_meta(cell)["grade_id"]])
    return nb


def _text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def edit(nb: dict, grade_id: str, fn) -> dict:
    """A copy of `nb` with the source of cell `grade_id` replaced by fn(old source)."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        if _meta(cell).get("grade_id") == grade_id:
            cell["source"] = fn(_text(cell))
            return nb
    raise KeyError(grade_id)


def write_submission(root: str, student: str, nb, *, name: str | None = None, assignment: str = A) -> str:
    folder = os.path.join(root, "submitted", student, assignment)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name or notebook_name(root, assignment))
    with open(path, "w", encoding="utf-8") as f:
        if isinstance(nb, (dict, list)):
            json.dump(nb, f)
        else:
            f.write(nb)
    return path


def run_grade(root: str, *args: str, timeout: float = 1800, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder.grade", *args], cwd=root, env=env(root),
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)


def records(root: str, assignment: str = A) -> dict[str, dict]:
    """The students' records, graded/<assignment>/<student>.json (the shard files are in its shards/)."""
    folder = os.path.join(root, "graded", assignment)
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                rec = json.load(f)
            if "records" not in rec:  # a shard file of an older version (beside the records): not a record
                out[rec["student"]] = rec
    return out


def gradebook(root: str, assignment: str = A) -> dict[str, dict[str, float]]:
    """student -> {cell: score} from nbgrader's gradebook."""
    import warnings

    from nbgrader.api import Gradebook

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            for sub in gb.assignment_submissions(assignment):
                out[sub.student.id] = {g.name: float(g.score) for nb in sub.notebooks for g in nb.grades}
    return out


def clear_results(root: str) -> None:
    for folder in ("graded", "feedback", "backups"):
        shutil.rmtree(os.path.join(root, folder), ignore_errors=True)
    # a fresh gradebook holding the assignment, as after `make build`
    os.remove(os.path.join(root, "gradebook.db"))
    proc = subprocess.run([os.path.join(VENV_BIN, "nbgrader"), "generate_assignment", A, "--force",
                           "--log-level=ERROR"], cwd=root, env=env(root), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
