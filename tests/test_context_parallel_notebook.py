"""The graded notebook of assignment 04 (context parallelism): reference, stubs, mutants, release, rebuild.

    .venv/bin/python -m pytest -q -s tests/test_context_parallel_notebook.py

(a) the reference submission gets full marks (its in-process grading time is
printed); (b) the untouched release fails every graded cell, each naming its
exercise; (c) every mutant fails each cell of its `must_fail` with a message
that names a rank or a tensor (only those cells and a few that must still pass
are run), and, running every cell for every mutant, the failing set is exactly
`must_fail` (a sample always, all with COURSE_EXHAUSTIVE=1); (d) the builder
reproduces the committed source notebook byte for byte.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time

import nbformat
import pytest
from conftest import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from solutions.context_parallel.mutants import MUTANTS  # noqa: E402
from solutions.submissions import (  # noqa: E402
    mutant_submission, notebook_path, reference_submission, run_graded_cells, untouched_submission,
)

A = "04_context_parallel"

# Cells that a mutant must still pass (partial credit, or a failure confined to one behaviour).
MUST_PASS = {
    "attention_nan_masked_rows": {"test_attention_with_lse"},
    "merge_no_max_subtraction": {"test_merge_attention", "test_merge_fully_masked"},
    "merge_nan_fully_masked": {"test_merge_large_logits", "test_ring_forward"},
    "ring_post_after_compute": {"test_ring_forward"},
    "causal_local_positions": {"test_ring_overlap", "test_zigzag_ring_attention"},
    "ring_global_rank": {"test_ring_overlap"},
    "backward_block_lse": {"test_ring_forward", "test_attention_block_backward"},
    "dkv_not_returned": {"test_ring_forward"},
    "zigzag_wrong_order": {"test_zigzag_ring_attention"},
    "zigzag_wasted_work": {"test_zigzag_ring_attention"},
    "ulysses_dims_swapped": {"test_seq_all_to_all", "test_ulysses_errors"},
}


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def test_reference_gets_full_marks():
    t0 = time.perf_counter()
    results = run_graded_cells(reference_submission(A), A)
    elapsed = time.perf_counter() - t0
    print(f"\n{A}: reference graded in-process in {elapsed:.1f} s (all cells, the pictures included)")
    failed = {k: v.message for k, v in results.items() if not v.passed}
    assert not failed, failed
    assert sum(v.points for v in results.values()) == 100


def test_untouched_release_fails_every_cell_naming_its_exercise():
    source = nbformat.read(notebook_path("source", A), as_version=4)
    graded = [c.source for c in source.cells if _meta(c).get("grade")]
    results = run_graded_cells(untouched_submission(A), A)
    assert len(results) == len(graded)
    passed = [k for k, v in results.items() if v.passed]
    assert not passed, f"cells passing on the stubs: {passed}"
    for k, v in results.items():
        assert "NotImplementedError" in v.message and "is not done yet" in v.message, (k, v.message[:300])


def test_exactly_one_demo_mutant():
    assert sum(m.demo for m in MUTANTS) == 1
    graded = {_meta(c)["grade_id"] for c in nbformat.read(notebook_path("source", A), as_version=4).cells
              if _meta(c).get("grade")}
    for m in MUTANTS:
        assert m.must_fail <= graded, (m.name, m.must_fail - graded)
        assert MUST_PASS.get(m.name, set()).isdisjoint(m.must_fail)
    assert set(MUST_PASS) <= {m.name for m in MUTANTS}


# The deadlocking mutant costs a 5 s timeout per cell: its fast check is the deadlock test below.
SLOW = {"ring_reversed_one_side"}


@pytest.mark.parametrize("m", [pytest.param(m, id=m.name, marks=pytest.mark.exhaustive if m.name in SLOW else ())
                               for m in MUTANTS])
def test_mutant_is_caught(m):
    must_pass = MUST_PASS.get(m.name, set())
    results = run_graded_cells(mutant_submission(A, m), A, only=set(m.must_fail) | must_pass)
    for gid in sorted(m.must_fail):
        ok, msg = results[gid].passed, results[gid].message
        assert not ok, f"mutant {m.name} ({m.why}) passed {gid}"
        assert "rank " in msg or "CheckFailure" in msg, f"mutant {m.name}: {gid} failed with an unclear message:\n{msg[:500]}"
        assert "Exercise " in msg, msg[:300]
    for gid in sorted(must_pass):
        ok, msg = results[gid].passed, results[gid].message
        assert ok, f"mutant {m.name} should still pass {gid}: {msg[:500]}"
    if m.demo:
        assert must_pass, "the demo mutant must earn partial credit"


def test_deadlocking_ring_is_reported_with_a_hint_within_seconds():
    """A ring reversed on one side hangs at w >= 3: the visible test reports it in seconds, with the fix and
    where each rank waited."""
    m = next(m for m in MUTANTS if m.name == "ring_reversed_one_side")
    t0 = time.perf_counter()
    results = run_graded_cells(mutant_submission(A, m), A, only={"test_ring_forward"})
    elapsed = time.perf_counter() - t0
    msg = results["test_ring_forward"].message
    assert "did not finish" in msg and "(rank - 1) % w" in msg and "deadlock" in msg, msg[:1500]
    assert "ring_attention_forward" in msg and "work.wait()" in msg, msg[:1500]  # where every rank waited
    assert elapsed < 15, elapsed  # the runner sees the ranks idle within seconds (and the cell's timeout is 5 s)


def test_builder_reproduces_the_source_notebook():
    spec = importlib.util.spec_from_file_location("_build_cp_nb", os.path.join(ROOT, "assignments", A, "_build_nb.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nb.ipynb")
        module.build().write(path)
        with open(path, "rb") as f, open(notebook_path("source", A), "rb") as g:
            assert f.read() == g.read(), "source notebook is stale: run assignments/04_context_parallel/_build_nb.py"


@pytest.mark.parametrize("m", sweep(MUTANTS, always={"zigzag_wasted_work"}))
def test_mutant_fails_exactly_its_cells(m):
    """The whole notebook per mutant: the failing cells are exactly `must_fail` (all mutants: COURSE_EXHAUSTIVE=1)."""
    results = run_graded_cells(mutant_submission(A, m), A)
    failed = {k for k, v in results.items() if not v.passed}
    assert failed == set(m.must_fail), (sorted(failed - m.must_fail), sorted(m.must_fail - failed))
