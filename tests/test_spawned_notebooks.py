"""Every solved notebook's visible tests with the ranks spawned, in a real kernel: the macOS path, proven on Linux.

    .venv/bin/python -m pytest -q tests/test_spawned_notebooks.py                    # one notebook
    COURSE_EXHAUSTIVE=1 .venv/bin/python -m pytest -q tests/test_spawned_notebooks.py  # all six

On macOS the runner spawns its ranks (a fresh interpreter per rank, which
imports torch: seconds each) and sends the notebook's code by value; Linux
forks them. `AUTOGRADER_START_METHOD=spawn` forces the macOS path here. Each
release notebook, its answer cells filled with the reference, runs in a
Jupyter kernel (its set-up, answer and test cells: the visible tests a
student runs): every test cell must print its pass line and nothing else, and
the pass lines must say that starting the ranks took time (they were spawned).
A run's timeout starts once every rank has started, so a correct notebook
passes however slowly its ranks start (within the runner's start-up limit).
"""

from __future__ import annotations

import copy
import sys
import time

import pytest
from nbclient import NotebookClient

from course import ROOT, assignments

sys.path.insert(0, ROOT)
from solutions import submissions  # noqa: E402

# the notebook run in `make test` (the cheapest with spawned ranks: about 40 s on 2 cores); the others with
# COURSE_EXHAUSTIVE=1 (02 about 45 s, 04 70 s, 06 100 s)
ALWAYS = "01_data_parallel"


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


@pytest.mark.parametrize("assignment", [pytest.param(a, marks=() if a == ALWAYS else pytest.mark.exhaustive)
                                        for a in assignments()])
def test_the_solved_notebook_passes_its_visible_tests_with_spawned_ranks(assignment, monkeypatch):
    monkeypatch.setenv("AUTOGRADER_START_METHOD", "spawn")  # the kernel inherits it: every run spawns its ranks
    nb = copy.deepcopy(submissions.reference_submission(assignment))
    nb.cells = [c for c in nb.cells if c.cell_type == "code" and _meta(c)]  # set-up, answers, tests
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True)
    t0 = time.monotonic()
    client.execute()
    elapsed = time.monotonic() - t0
    tests = [c for c in nb.cells if _meta(c).get("grade") and not _meta(c).get("solution")]
    problems, started = {}, 0
    for cell in nb.cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        stderr = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")
        if errors or stderr:
            problems[_meta(cell)["grade_id"]] = (errors[0].ename + ": " + errors[0].evalue[:1500]) if errors \
                else f"stderr: {stderr[:500]}"
    for cell in tests:
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        if not (text.startswith("\u2713 ") and "passed (" in text):
            problems.setdefault(_meta(cell)["grade_id"], f"no pass line: {text[:300]!r}")
        started += "s of it starting the ranks" in text
    assert not problems, problems
    assert started, "no pass line says the ranks took time to start: were they spawned?"
    print(f"\n{assignment}: {len(tests)} visible tests with spawned ranks in {elapsed:.0f} s (kernel start included)")
