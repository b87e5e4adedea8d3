"""The notebook of assignment 01 (data parallelism), graded in-process.

    .venv/bin/python -m pytest -q -s tests/test_data_parallel_notebook.py

(a) the reference submission gets full marks (and its time is printed);
(b) the untouched release notebook fails every graded cell;
(c) each mutant fails its must_fail cells with a readable message; the demo
    mutant also passes some cell (partial credit);
(d) the release notebook holds no solution text and no hidden test text;
(e) the builder is deterministic: rebuilding gives the committed source notebook.
"""

import os
import sys
import time

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from solutions.mutants.data_parallel import MUTANTS  # noqa: E402
from solutions.submissions import (mutant_submission, notebook_path, reference_submission,  # noqa: E402
                                   run_graded_cells, untouched_submission)

A = "01_data_parallel"


def _meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def _graded_ids():
    source = nbformat.read(notebook_path("source", A), as_version=4)
    return [_meta(c)["grade_id"] for c in source.cells if _meta(c).get("grade")]


def test_reference_gets_full_marks():
    # Imports (torch, matplotlib) are paid once per kernel; time the cells themselves.
    import matplotlib.pyplot  # noqa: F401

    import autograder.checks.data_parallel  # noqa: F401

    t0 = time.monotonic()
    results = run_graded_cells(reference_submission(A), A)
    elapsed = time.monotonic() - t0
    print(f"\n{A}: reference graded in-process in {elapsed:.1f} s "
          f"({sum(r.points for r in results.values()):g} points)")
    failed = {k: r.message for k, r in results.items() if not r.passed}
    assert not failed, failed
    assert set(results) == set(_graded_ids())
    assert sum(r.points for r in results.values()) == 100
    # the time is printed, not asserted: benchmarks/runner_overhead.py measures it


def test_untouched_release_fails_every_graded_cell():
    results = run_graded_cells(untouched_submission(A), A)
    passed = [k for k, r in results.items() if r.passed]
    assert not passed, f"cells passing on the stub: {passed}"
    assert set(results) == set(_graded_ids())


def test_exactly_one_demo_mutant():
    assert sum(m.demo for m in MUTANTS) == 1
    ids = set(_graded_ids())
    for m in MUTANTS:
        assert m.must_fail and m.must_fail <= ids, m.name


def _readable(message: str) -> bool:
    first = message.splitlines()[0] if message else ""
    return ("CheckFailure" in first or "DistributedError" in first or "ValueError" in first) and (
        "rank" in message or "grad" in message)


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(m):
    keep = set(m.must_fail)
    if m.demo:
        keep |= set(_graded_ids())
    results = run_graded_cells(mutant_submission(A, m), A, only=keep)
    for cell in m.must_fail:
        r = results[cell]
        assert not r.passed, f"mutant {m.name} ({m.why}) passes {cell}"
        assert _readable(r.message), f"mutant {m.name}: unclear failure in {cell}: {r.message[:500]}"
    if m.demo:
        passed = [k for k, r in results.items() if r.passed]
        assert passed, "the demo mutant must get partial credit"
        assert set(results) - set(passed) == set(m.must_fail)


def test_builder_is_deterministic(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "assignments", A))
    import importlib.util

    spec = importlib.util.spec_from_file_location("_dp_build", os.path.join(ROOT, "assignments", A, "_build_nb.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "nb.ipynb"
    mod.build().write(str(out))
    with open(notebook_path("source", A), encoding="utf-8") as f:
        committed = f.read()
    assert out.read_text(encoding="utf-8") == committed
