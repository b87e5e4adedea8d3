"""The graded notebook of assignment 03 (pipeline parallelism): reference, stubs, mutants, rebuild.

    .venv/bin/python -m pytest -q -s tests/test_pipeline_parallel_notebook.py

(a) the reference submission gets full marks (its in-process grading time is
printed); (b) the untouched release fails every graded cell, each naming its
exercise; (c) every mutant fails each cell of its `must_fail` with a message
that names a rank, a stage or a schedule (only those cells and a few that must
still pass are run; the deadlocking ones end within the checks' 5 s timeout),
and, running every graded cell for every mutant, the failing set is exactly
`must_fail` (a sample in `make test`, all with COURSE_EXHAUSTIVE=1); (d) the
builder reproduces the committed source notebook byte for byte. The release
leak check is tests/test_release.py, the nbgrader run tests/test_pipeline.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
import time

import nbformat
import pytest
from conftest import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from solutions.pipeline_parallel.mutants import MUTANTS  # noqa: E402
from solutions.submissions import (  # noqa: E402
    mutant_submission, notebook_path, reference_submission, run_graded_cells, untouched_submission,
)

A = "03_pipeline_parallel"

# Cells that a mutant must still pass (partial credit, or a failure confined to one behaviour).
MUST_PASS = {
    "loss_summed_not_averaged": {"test_pipeline_memory", "test_1f1b_schedule"},
    "warmup_off_by_one": {"test_run_pipeline_1f1b", "test_pipeline_memory"},
    "gpipe_backward_lifo": {"test_run_pipeline_gpipe"},
    "blocking_sends": {"test_run_pipeline_gpipe"},  # a blocking send never deadlocks GPipe
    "keeps_every_output": {"test_run_pipeline_1f1b"},
    "no_detach_between_own_chunks": {"test_run_pipeline_1f1b"},
    "no_validation": {"test_run_pipeline_gpipe"},
}


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _graded_ids() -> list[str]:
    source = nbformat.read(notebook_path("source", A), as_version=4)
    return [_meta(c)["grade_id"] for c in source.cells if _meta(c).get("grade")]


def test_reference_gets_full_marks():
    import matplotlib.pyplot  # noqa: F401 - imports are paid once per kernel; time the cells themselves

    import autograder.checks.pipeline_parallel  # noqa: F401

    t0 = time.perf_counter()
    results = run_graded_cells(reference_submission(A), A)
    elapsed = time.perf_counter() - t0
    print(f"\n{A}: reference graded in-process in {elapsed:.1f} s (all cells, the pictures included)")
    failed = {k: v.message for k, v in results.items() if not v.passed}
    assert not failed, failed
    assert set(results) == set(_graded_ids())
    assert sum(v.points for v in results.values()) == 100
    # the time is printed, not asserted: benchmarks/runner_overhead.py measures it


def test_untouched_release_fails_every_cell_naming_its_exercise():
    results = run_graded_cells(untouched_submission(A), A)
    passed = [k for k, v in results.items() if v.passed]
    assert not passed, f"cells passing on the stubs: {passed}"
    for k, v in results.items():
        assert re.search(r"Exercise \d", v.message), (k, v.message[:300])
        assert "NotImplementedError" in v.message or "still the stub" in v.message, (k, v.message[:300])


def test_mutants_are_well_formed():
    assert sum(m.demo for m in MUTANTS) == 1
    graded = set(_graded_ids())
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    for m in MUTANTS:
        assert m.must_fail and m.must_fail <= graded, (m.name, m.must_fail - graded)
        assert MUST_PASS.get(m.name, set()).isdisjoint(m.must_fail)
    # the mutants the issue asks for (issue 7)
    assert {"warmup_off_by_one", "gpipe_backward_lifo", "one_f_one_b_lifo_cooldown", "loss_summed_not_averaged",
            "blocking_sends", "keeps_every_output", "gradient_to_wrong_neighbour",
            "interleaved_backward_chunks_not_reversed", "interleaved_chunks_outer_loop"} <= set(names)


@pytest.mark.parametrize("m", sweep(MUTANTS, always={"loss_summed_not_averaged", "warmup_off_by_one",
                                                     "blocking_sends", "keeps_every_output",
                                                     "one_f_one_b_lifo_cooldown", "no_detach_between_own_chunks"}))
def test_mutant_is_caught(m):
    must_pass = MUST_PASS.get(m.name, set())
    t0 = time.perf_counter()
    results = run_graded_cells(mutant_submission(A, m), A, only=set(m.must_fail) | must_pass)
    elapsed = time.perf_counter() - t0
    for gid in sorted(m.must_fail):
        ok, msg = results[gid].passed, results[gid].message
        assert not ok, f"mutant {m.name} ({m.why}) passed {gid}"
        assert re.search(r"ranks? \d|stage \d|_schedule\(|bubble_fraction\(", msg), \
            f"mutant {m.name}: {gid} failed with an unclear message:\n{msg[:800]}"
        if "deadlock" in msg.split("\n", 2)[1]:  # the runner's summary: reported with where each rank waits, and a hint
            assert "Hint: the ranks deadlocked" in msg and re.search(r"ranks? \d", msg), msg[:800]
    for gid in sorted(must_pass):
        ok, msg = results[gid].passed, results[gid].message
        assert ok, f"mutant {m.name} should still pass {gid}: {msg[:500]}"
    # a deadlocking cell costs one 5 s timeout per failing check (not asserted: the machine is shared)
    print(f"\n{m.name}: {len(m.must_fail)} failing + {len(must_pass)} passing cell(s) graded in {elapsed:.1f} s")


def test_builder_reproduces_the_source_notebook():
    spec = importlib.util.spec_from_file_location("_build_pp_nb", os.path.join(ROOT, "assignments", A, "_build_nb.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nb.ipynb")
        module.build().write(path)
        with open(path, "rb") as f, open(notebook_path("source", A), "rb") as g:
            assert f.read() == g.read(), f"source notebook is stale: run assignments/{A}/_build_nb.py"


@pytest.mark.parametrize("m", sweep(MUTANTS, always={"loss_summed_not_averaged"}))
def test_mutant_fails_exactly_its_cells(m):
    """Every graded cell per mutant: the failing cells are exactly `must_fail` (all mutants: COURSE_EXHAUSTIVE=1)."""
    results = run_graded_cells(mutant_submission(A, m), A, only=set(_graded_ids()))
    failed = {k for k, v in results.items() if not v.passed}
    assert failed == set(m.must_fail), (sorted(failed - m.must_fail), sorted(m.must_fail - failed))
