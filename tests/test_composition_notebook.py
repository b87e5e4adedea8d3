"""The graded notebook of assignment 06 (the capstone): reference, stubs, mutants, rebuild.

    .venv/bin/python -m pytest -q -s tests/test_composition_notebook.py

(a) the reference submission gets full marks (its in-process grading time is
printed); (b) the untouched release fails every graded cell, each naming its
exercise's stub; (c) every mutant fails each cell of its `must_fail` with a
message that names a rank or what is wrong, and still passes the cells listed
in MUST_PASS (only those cells run); with COURSE_EXHAUSTIVE=1, running every
cell for every mutant, the failing set is exactly `must_fail`; (d) the builder
reproduces the committed source notebook byte for byte. The release notebook's
leak check is tests/test_release.py's (parametrised over every assignment).
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

from solutions.composition.mutants import MUTANTS  # noqa: E402
from solutions.submissions import (  # noqa: E402
    mutant_submission, notebook_path, reference_submission, run_graded_cells, untouched_submission,
)

A = "06_composition"

# Cells a mutant must still pass: its failure stays confined to the behaviour it breaks (partial credit).
MUST_PASS = {
    "norm_replicas_counted_t_times": {"test_tied_embedding_grads", "test_loss_averaging"},
    "fsdp_root_only": {"test_tensor_parallel_plan"},
    "tp_head_left_untied": {"test_local_batch"},
    "layout_no_pp_last_rule": {"test_rank_layout", "test_rank_layout_expert"},
    "memory_zero_over_dp_only": {"test_plan_published"},
    "time_bubble_over_pp": {"test_memory_per_gpu"},
    "batch_cp_contiguous": {"test_device_mesh"},
    "mesh_not_reversed": {"test_process_groups"},
}

# Sampled in `make test` (the full sweep, one whole notebook per mutant, runs with COURSE_EXHAUSTIVE=1).
ALWAYS = {"tied_grads_allreduce_a_copy"}


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def test_reference_gets_full_marks():
    t0 = time.perf_counter()
    results = run_graded_cells(reference_submission(A), A)
    elapsed = time.perf_counter() - t0
    print(f"\n{A}: reference graded in-process in {elapsed:.1f} s (all cells, the pictures included)")
    failed = {k: v.message for k, v in results.items() if not v.passed}
    assert not failed, failed
    total = sum(v.points for v in results.values())
    assert total == 100, total


def test_untouched_release_fails_every_cell_naming_its_exercise():
    results = run_graded_cells(untouched_submission(A), A)
    passed = [k for k, v in results.items() if v.passed]
    assert not passed, f"cells passing on the stubs: {passed}"
    for k, v in results.items():
        assert "is not done yet" in v.message and "is still the stub" in v.message, (k, v.message[:400])


def test_mutants_are_well_formed():
    assert sum(m.demo for m in MUTANTS) == 1
    graded = {_meta(c)["grade_id"] for c in nbformat.read(notebook_path("source", A), as_version=4).cells
              if _meta(c).get("grade")}
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    for m in MUTANTS:
        assert m.must_fail and m.must_fail <= graded, (m.name, m.must_fail - graded)
        assert MUST_PASS.get(m.name, set()).isdisjoint(m.must_fail), m.name
        mutant_submission(A, m)  # every patch applies exactly once
    assert set(MUST_PASS) <= set(names)


# The training cells take seconds each: a mutant that also fails a cheaper cell is checked there in `make test`
# (its training cells too with COURSE_EXHAUSTIVE=1, in test_mutant_fails_exactly_its_cells).
TRAINING_CELLS = ("test_dp_tp_training", "test_pipeline_training")  # cheaper first


def _cells_to_check(m) -> set:
    cheap = set(m.must_fail) - set(TRAINING_CELLS)
    if cheap:
        return cheap
    return {next(gid for gid in TRAINING_CELLS if gid in m.must_fail)}


# groups_my_group_first hangs until the check's 20 s bound: in make test it is caught by
# test_the_hang_is_reported_with_each_rank_line_and_the_grader_goes_on below (and by the sweep here with
# COURSE_EXHAUSTIVE=1)
@pytest.mark.parametrize("m", [pytest.param(m, id=m.name, marks=pytest.mark.exhaustive
                                            if m.name == "groups_my_group_first" else ()) for m in MUTANTS])
def test_mutant_is_caught(m):
    must_pass = MUST_PASS.get(m.name, set())
    check = _cells_to_check(m)
    results = run_graded_cells(mutant_submission(A, m), A, only=check | must_pass)
    for gid in sorted(check):
        ok, msg = results[gid].passed, results[gid].message
        assert not ok, f"mutant {m.name} ({m.why}) passed {gid}"
        assert "FAILED" in msg or "deadlock" in msg, f"mutant {m.name}: {gid} failed without a verdict:\n{msg[:800]}"
        own_error = msg.startswith("ValueError")  # the student's own ValueError, shown as it is
        assert "rank " in msg or "expected" in msg or own_error, \
            f"mutant {m.name}: {gid} failed with an unclear message:\n{msg[:800]}"
    for gid in sorted(must_pass):
        ok, msg = results[gid].passed, results[gid].message
        assert ok, f"mutant {m.name} should still pass {gid}: {msg[:800]}"


def test_the_hang_is_reported_with_each_rank_line_and_the_grader_goes_on():
    m = next(m for m in MUTANTS if m.name == "groups_my_group_first")
    t0 = time.perf_counter()
    results = run_graded_cells(mutant_submission(A, m), A, only={"test_process_groups"})
    elapsed = time.perf_counter() - t0
    msg = results["test_process_groups"].message
    assert "deadlock" in msg and "new_group" in msg, msg[:1500]
    assert "build_process_groups" in msg, msg[:1500]  # the student's function, where each rank waits
    # reported by the runner's deadlock detection (about 3 s), or at the check's 20 s timeout at the latest
    assert elapsed < 30, f"the hang took {elapsed:.1f} s to report"


def test_builder_reproduces_the_source_notebook():
    spec = importlib.util.spec_from_file_location("_build_06_nb", os.path.join(ROOT, "assignments", A, "_build_nb.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nb.ipynb")
        module.build().write(path)
        with open(path, "rb") as f, open(notebook_path("source", A), "rb") as g:
            assert f.read() == g.read(), "source notebook is stale: run assignments/06_composition/_build_nb.py"


@pytest.mark.parametrize("m", sweep(MUTANTS, always=ALWAYS))
def test_mutant_fails_exactly_its_cells(m):
    """The whole notebook per mutant: the failing cells are exactly `must_fail` (all mutants: COURSE_EXHAUSTIVE=1)."""
    results = run_graded_cells(mutant_submission(A, m), A)
    failed = {k for k, v in results.items() if not v.passed}
    unexpected = {k: results[k].message[:600] for k in failed - m.must_fail}
    assert failed == set(m.must_fail), (sorted(m.must_fail - failed), unexpected)
