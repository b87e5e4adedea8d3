"""The notebook of assignment 01 (data parallelism), graded in-process.

    .venv/bin/python -m pytest -q -s tests/test_data_parallel_notebook.py

(a) the reference submission gets full marks (and its time is printed);
(b) the untouched release notebook fails every graded cell, each naming its exercise;
(c) each mutant fails its must_fail cells with a readable message (only those
    cells run); the demo mutant also passes the others (partial credit);
    running every cell for every mutant, the failing set is exactly `must_fail`
    (a sample always, all with COURSE_EXHAUSTIVE=1);
(d) each variant (a different correct implementation) passes every cell;
(e) the builder is deterministic: rebuilding gives the committed source notebook.
The release notebook's leaks are checked for every assignment by tests/test_release.py.
"""

import os
import sys
import time

import nbformat
import pytest
from conftest import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from solutions.data_parallel.mutants import MUTANTS, VARIANTS  # noqa: E402
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
    import autograder.checks.data_parallel_fsdp  # noqa: F401

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
    for k, r in results.items():
        assert "is not done yet" in r.message and "Exercise " in r.message, (k, r.message[:300])


WRONG = [m for m in MUTANTS if m.must_fail]  # VARIANTS (correct edits) have an empty must_fail


def test_exactly_one_demo_mutant():
    assert sum(m.demo for m in MUTANTS) == 1
    ids = set(_graded_ids())
    for m in MUTANTS:
        assert m.must_fail <= ids, m.name
        assert bool(m.must_fail) == (m not in VARIANTS), m.name
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)


def _readable(message: str) -> bool:
    first = message.splitlines()[0] if message else ""
    kind = first.split(":", 1)[0].rsplit(".", 1)[-1]
    return kind in ("CheckFailure", "DistributedError", "ValueError") and ("rank" in message or "grad" in message)


@pytest.mark.parametrize("m", WRONG, ids=[m.name for m in WRONG])
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


@pytest.mark.parametrize("m", sweep(MUTANTS, always={"bucket_ignores_dtype", "zero_gradient_not_averaged",
                                                      "fsdp_autograd_keeps_full_param"}))
def test_mutant_fails_exactly_its_cells(m):
    """The whole notebook per mutant: the failing cells are exactly `must_fail` (all mutants: COURSE_EXHAUSTIVE=1)."""
    results = run_graded_cells(mutant_submission(A, m), A)
    failed = {k for k, v in results.items() if not v.passed}
    assert failed == set(m.must_fail), (sorted(failed - m.must_fail), sorted(m.must_fail - failed))


@pytest.mark.parametrize("v", VARIANTS, ids=[v.name for v in VARIANTS])
def test_variant_passes_its_exercise(v):
    """A correct implementation that differs from the reference (padding to lcm(d, 128)) passes every cell."""
    exercise_cells = {"zero_sharded_optimizer": {"test_zero_matches_optimizer", "test_zero_rounding",
                                                 "test_zero_state_sharded", "test_zero_comm"},
                      "fully_shard": {"test_fsdp_numerics", "test_fsdp_comm", "test_fsdp_memory",
                                      "test_fsdp_mixed_precision", "test_gather_full_params"}}[v.cell]
    results = run_graded_cells(mutant_submission(A, v), A, only=exercise_cells)
    failed = {k: r.message[:800] for k, r in results.items() if not r.passed}
    assert not failed, f"variant {v.name} ({v.why}) fails: {failed}"


def test_builder_is_deterministic(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_dp_build", os.path.join(ROOT, "assignments", A, "_build_nb.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "nb.ipynb"
    mod.build().write(str(out))
    with open(notebook_path("source", A), encoding="utf-8") as f:
        committed = f.read()
    assert out.read_text(encoding="utf-8") == committed
