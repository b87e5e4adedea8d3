"""The nbgrader pipeline end to end, on a scratch copy of the course.

    .venv/bin/python -m pytest -q tests/test_pipeline.py

1. Rebuilding from a clean copy reproduces the committed source/ and release/
   notebooks byte for byte (`make build`'s steps).
2. `python -m autograder.grade demo` (what `make demo` runs) writes three
   submissions per assignment (reference, untouched release, one wrong edit),
   runs real `nbgrader autograde` into the sqlite gradebook and generates
   feedback: full marks, zero, and partial credit with the expected cells failing.
3. The feedback shows the failure messages but no hidden-test source.
4. A submission whose function deadlocks loses that cell only: the kernel
   survives, every other cell is graded, no process is left behind.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time

import nbformat
import pytest

from course import ROOT, assignments, copy_course, nbgrader, secret_lines

sys.path.insert(0, ROOT)
from autograder.grading.cli import gradebook_rows  # noqa: E402
from solutions import submissions  # noqa: E402
from solutions.submissions import mutant  # noqa: E402

# A student's all_reduce_gradients that waits for a message no peer sends.
DEADLOCK = mutant(
    "all_reduce_gradients_deadlocks", "all_reduce_gradients",
    [("dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)",
      "dist.recv(param.grad, src=(dist.get_rank(group) + 1) % world_size, group=group)")],
    must_fail={"test_all_reduce_gradients"}, why="every rank waits to receive: a deadlock")
DEADLOCK_ASSIGNMENT = "01_data_parallel"
# a 1x1 PNG: the picture a student's run saved in the notebook (the feedback is the submitted notebook)
SAVED_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="

# the demo grades every assignment's three sample submissions (and the deadlock) in one fixture
pytestmark = pytest.mark.timeout(3600)


def _processes(root: str) -> set[int]:
    """PIDs of live processes of this course's grading: kernels, ranks, sandboxes, zygotes, workers."""
    pids = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmd = f.read()
                cwd = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                continue
            if cwd.startswith(root) or root.encode() in cmd:
                pids.add(int(name))
    return pids


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("course"))
    copy_course(root)
    for a in assignments():
        for folder in ("source", "release"):
            # build from scratch: nothing generated is carried over
            subprocess.run(["rm", "-rf", os.path.join(root, folder, a)], check=True)
    for a in assignments():
        proc = subprocess.run([sys.executable, os.path.join(root, "assignments", a, "_build_nb.py")], cwd=root,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        proc = nbgrader(root, "generate_assignment", a, "--force")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def _files(base: str, folder: str) -> dict[str, bytes]:
    out = {}
    top = os.path.join(base, folder)
    for dirpath, dirs, names in os.walk(top):
        dirs[:] = [d for d in dirs if d != ".ipynb_checkpoints"]  # JupyterLab's, ignored by git
        for n in names:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, base)] = open(p, "rb").read()
    return out


@pytest.mark.parametrize("folder", ["source", "release"])
def test_rebuild_reproduces_committed_notebooks_byte_for_byte(course, folder):
    built = _files(course, folder)
    committed = _files(ROOT, folder)
    assert sorted(built) == sorted(committed)
    different = [p for p in built if built[p] != committed[p]]
    assert not different, f"rebuilding changes {different}: run `make build` and commit"


@pytest.fixture(scope="module")
def graded(course):
    # a fourth student, graded by the same nbgrader run as the demo's three
    nb = submissions.mutant_submission(DEADLOCK_ASSIGNMENT, DEADLOCK)
    # what the student saw when they last ran it: a picture saved in the notebook (the feedback keeps it)
    picture = next(c for c in nb.cells if c.cell_type == "code" and "plot_" in c.source and not c.metadata.get("nbgrader"))
    picture.outputs = [nbformat.v4.new_output("display_data", data={"image/png": SAVED_PNG, "text/plain": "<Figure>"})]
    folder = os.path.join(course, "submitted", "deadlock", DEADLOCK_ASSIGNMENT)
    os.makedirs(folder)
    nbformat.write(nb, os.path.join(folder, os.path.basename(submissions.notebook_path("release", DEADLOCK_ASSIGNMENT))))
    before = _processes(course)
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": course, "TORCH_CPP_LOG_LEVEL": "ERROR",
           "AUTOGRADER_WORKDIR": os.path.join(course, ".grading-work")}  # every process of the run under `course`
    proc = subprocess.run([sys.executable, "-m", "autograder.grade", "demo"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    seconds = time.monotonic() - t0
    print(proc.stdout)
    print(f"demo grading took {seconds:.1f} s")
    rows = {(r["assignment"], r["student"]): r for r in gradebook_rows(course)}
    time.sleep(1)
    return rows, proc.stdout, _processes(course) - before


def _demo_mutant(assignment):
    return [m for m in submissions.mutants_of(assignment) if m.demo][0]


@pytest.mark.parametrize("assignment", assignments())
def test_gradebook_full_zero_and_partial(graded, assignment):
    rows, stdout, _ = graded
    ref, untouched, wrong = (rows[(assignment, s)] for s in ("reference", "untouched", "wrong"))
    assert ref["max_score"] > 0
    assert ref["score"] == ref["max_score"], f"reference lost points on {ref['lost']}"
    assert untouched["score"] == 0
    assert 0 < wrong["score"] < wrong["max_score"]
    mutant = _demo_mutant(assignment)
    assert set(wrong["lost"]) == set(mutant.must_fail), (
        f"the wrong submission ({mutant.name}) lost points on {wrong['lost']}, expected {sorted(mutant.must_fail)}")
    assert assignment in stdout and "reference" in stdout  # the printed table


def _html_text(path: str) -> str:
    raw = open(path, encoding="utf-8").read()
    raw = re.sub(r"<style.*?</style>|<script.*?</script>", "", raw, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", "", raw))
    return re.sub(r"[ \t]+", " ", text)


@pytest.mark.parametrize("assignment", assignments())
def test_feedback_shows_failures_but_no_hidden_test_source(course, graded, assignment):
    source = nbformat.read(submissions.notebook_path("source", assignment), as_version=4)
    hidden = [re.sub(r"[ \t]+", " ", line) for line in secret_lines(source)[1] if len(line) > 15]
    assert hidden
    name = os.path.basename(submissions.notebook_path("release", assignment)).replace(".ipynb", ".html")
    record = json.load(open(os.path.join(course, "graded", assignment, "wrong.json"), encoding="utf-8"))
    assert record["cells"] and all(c["visible_passed"] is not None for c in record["cells"])  # the trusted run
    assert {c["grade_id"] for c in record["cells"] if not c["passed"]} == set(_demo_mutant(assignment).must_fail)
    for student in ("reference", "untouched", "wrong"):
        text = _html_text(os.path.join(course, "feedback", student, assignment, name))
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"feedback of {student} shows hidden-test source: {leaked[:3]}"
    wrong = _html_text(os.path.join(course, "feedback", "wrong", assignment, name))
    assert "CheckFailure" in wrong or "DistributedError" in wrong
    assert re.search(r"rank \d", wrong), "the failure message should name a rank"


def test_a_deadlocking_submission_loses_only_that_cell(course, graded):
    rows, _, leftover = graded
    row = rows[(DEADLOCK_ASSIGNMENT, "deadlock")]
    assert row["lost"] == ["test_all_reduce_gradients"], row
    assert 0 < row["score"] < row["max_score"]
    assert not leftover, f"processes left behind after grading: {sorted(leftover)}"
    raw = open(os.path.join(course, "feedback", "deadlock", DEADLOCK_ASSIGNMENT,
                            os.path.basename(submissions.notebook_path("release", DEADLOCK_ASSIGNMENT))
                            .replace(".ipynb", ".html")), encoding="utf-8").read()
    assert f"data:image/png;base64,{SAVED_PNG}" in raw, "the feedback does not show the submission's saved picture"
    name = os.path.basename(submissions.notebook_path("release", DEADLOCK_ASSIGNMENT)).replace(".ipynb", ".html")
    text = _html_text(os.path.join(course, "feedback", "deadlock", DEADLOCK_ASSIGNMENT, name))
    assert "deadlock" in text and "none made progress in between" in text
    assert "was blocked in recv" in text and "in all_reduce_gradients" in text  # where each rank blocked


def test_scores_command_prints_the_gradebook(course, graded):
    env = {**os.environ, "PYTHONPATH": course}
    proc = subprocess.run([sys.executable, "-m", "autograder.grade", "scores"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for assignment in assignments():
        assert any(line.startswith(assignment) and "reference" in line and "100.0 /  100" in line for line in lines)
    assert any("deadlock" in line and "test_all_reduce_gradients" in line for line in lines)
    assert "Kernel is running over TCP" not in graded[1]  # kernel start-up noise is filtered from the demo
