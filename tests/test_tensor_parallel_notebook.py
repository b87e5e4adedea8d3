"""The graded notebook of assignment 02 (TP / SP): reference, stubs, mutants, release, rebuild.

    .venv/bin/python -m pytest -q -s tests/test_tensor_parallel_notebook.py

(a) the reference submission gets full marks (its in-process grading time is
printed); (b) the untouched release fails every graded cell; (c) every mutant
fails each cell of its `must_fail` with a message that names a rank or a
tensor (only those cells and a few that must still pass are run), and, running
every cell for every mutant, the failing set is exactly `must_fail`;
(d) the release notebook holds no solution or hidden-test text; (e) the
builder reproduces the committed source notebook byte for byte.
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

from solutions.tensor_parallel.mutants import MUTANTS  # noqa: E402
from solutions.submissions import (  # noqa: E402
    mutant_submission, notebook_path, reference_submission, run_graded_cells, untouched_submission,
)

A = "02_tensor_parallel"

# Cells that a mutant must still pass (partial credit, or a failure confined to one behaviour).
MUST_PASS = {
    "copy_to_identity_backward": {"test_reduce_from_region", "test_gather_from_region", "test_row_parallel_linear"},
    "sp_allreduce_then_split": {"test_column_parallel_linear", "test_tp_pair_communication"},
    "scatter_no_divisibility_check": {"test_scatter_to_region"},
    "ce_no_max_subtraction": {"test_vocab_parallel_cross_entropy"},
    "overlap_wait_immediately": {"test_async_allreduce_gradients"},
    "overlap_sync_allreduce": {"test_async_allreduce_gradients"},
    "sp_grads_every_parameter": {"test_parallel_mlp"},
    "mlp_bias_when_master_bias_none": {"test_sequence_parallel_grads"},
    "sp_grads_none_not_skipped": {"test_parallel_mlp"},
}


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def test_reference_gets_full_marks():
    t0 = time.perf_counter()
    results = run_graded_cells(reference_submission(A), A)
    elapsed = time.perf_counter() - t0
    print(f"\n{A}: reference graded in-process in {elapsed:.1f} s (all cells, the picture included)")
    failed = {k: v.message for k, v in results.items() if not v.passed}
    assert not failed, failed
    total = sum(v.points for v in results.values())
    assert total == 100, total
    # the time is printed, not asserted: benchmarks/runner_overhead.py measures it


def test_untouched_release_fails_every_cell():
    results = run_graded_cells(untouched_submission(A), A)
    passed = [k for k, v in results.items() if v.passed]
    assert not passed, f"cells passing on the stubs: {passed}"
    for k, v in results.items():
        assert "NotImplementedError" in v.message or "ValueError" in v.message, (k, v.message[:300])


def test_exactly_one_demo_mutant():
    assert sum(m.demo for m in MUTANTS) == 1
    graded = {_meta(c)["grade_id"] for c in nbformat.read(notebook_path("source", A), as_version=4).cells
              if _meta(c).get("grade")}
    for m in MUTANTS:
        assert m.must_fail <= graded, (m.name, m.must_fail - graded)
        assert MUST_PASS.get(m.name, set()).isdisjoint(m.must_fail)


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(m):
    must_pass = MUST_PASS.get(m.name, set())
    results = run_graded_cells(mutant_submission(A, m), A, only=set(m.must_fail) | must_pass)
    for gid in sorted(m.must_fail):
        ok, msg = results[gid].passed, results[gid].message
        kind = msg.split(":", 1)[0].rsplit(".", 1)[-1]  # "autograder.runtime.compare.CheckFailure" -> "CheckFailure"
        assert not ok, f"mutant {m.name} ({m.why}) passed {gid}"
        assert "rank " in msg or kind in ("CheckFailure", "ValueError"), \
            f"mutant {m.name}: {gid} failed with an unclear message:\n{msg[:500]}"
    for gid in sorted(must_pass):
        ok, msg = results[gid].passed, results[gid].message
        assert ok, f"mutant {m.name} should still pass {gid}: {msg[:500]}"
    if m.demo:
        assert must_pass, "the demo mutant must earn partial credit"


def test_builder_reproduces_the_source_notebook():
    spec = importlib.util.spec_from_file_location("_build_tp_nb", os.path.join(ROOT, "assignments", A, "_build_nb.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nb.ipynb")
        module.build().write(path)
        with open(path, "rb") as f, open(notebook_path("source", A), "rb") as g:
            assert f.read() == g.read(), "source notebook is stale: run assignments/02_tensor_parallel/_build_nb.py"


@pytest.mark.parametrize("m", sweep(MUTANTS, always={"copy_to_identity_backward", "sp_allreduce_then_split"}))
def test_mutant_fails_exactly_its_cells(m):
    """The whole notebook per mutant: the failing cells are exactly `must_fail` (all mutants: COURSE_EXHAUSTIVE=1)."""
    results = run_graded_cells(mutant_submission(A, m), A)
    failed = {k for k, v in results.items() if not v.passed}
    assert failed == set(m.must_fail), (sorted(failed - m.must_fail), sorted(m.must_fail - failed))

