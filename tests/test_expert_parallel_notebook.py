"""The graded notebook of assignment 05 (expert parallelism): reference, stubs, mutants, picture, rebuild.

    .venv/bin/python -m pytest -q -s tests/test_expert_parallel_notebook.py

(a) the reference submission gets full marks (its in-process grading time is
printed); (b) the untouched release fails every graded cell, naming the
exercise; (c) every mutant fails each cell of its `must_fail` with a message
that names a rank, a token or an expert, and still passes the cells listed in
MUST_PASS; with COURSE_EXHAUSTIVE=1 every mutant runs on every cell and the
failing set is exactly `must_fail` (a sample always runs); (d) the picture of
the reference dispatcher is a PNG; (e) the builder reproduces the committed
source notebook byte for byte.
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

from solutions.expert_parallel.mutants import MUTANTS  # noqa: E402
from solutions.submissions import (  # noqa: E402
    mutant_submission, notebook_path, reference_submission, run_graded_cells, untouched_submission,
)

A = "05_expert_parallel"

# Cells that a mutant must still pass: partial credit, and proof that a failure stays with its behaviour.
MUST_PASS = {
    "a2a_backward_same_splits": {"test_dispatch", "test_token_dropping"},
    "dispatch_source_major": {"test_combine", "test_dispatcher_communication"},
    "permute_unstable_sort": {"test_unpermute", "test_dispatcher_communication"},
    "counts_not_exchanged": {"test_all_to_all"},
    "probs_never_applied": {"test_unpermute", "test_dispatch"},
    "combine_wrong_positions": {"test_dispatch", "test_dispatcher_communication"},
    "router_probs_detached": {"test_topk_router"},
    "capacity_drops_highest": {"test_moe_layer"},
    "aux_counts_after_drop": {"test_moe_layer"},
    "a2a_no_split_check": {"test_all_to_all"},
    "router_torch_topk": {"test_load_balancing_loss"},
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


def test_untouched_release_fails_every_cell():
    results = run_graded_cells(untouched_submission(A), A)
    passed = [k for k, v in results.items() if v.passed]
    assert not passed, f"cells passing on the stubs: {passed}"
    for k, v in results.items():
        assert "is not done yet" in v.message and "is still the stub" in v.message, (k, v.message[:300])


def test_mutant_table_is_consistent():
    assert sum(m.demo for m in MUTANTS) == 1
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    source = nbformat.read(notebook_path("source", A), as_version=4)
    graded = {_meta(c)["grade_id"] for c in source.cells if _meta(c).get("grade")}
    answers = {_meta(c)["grade_id"]: c.source for c in source.cells if _meta(c).get("solution")}
    for m in MUTANTS:
        assert m.must_fail <= graded, (m.name, m.must_fail - graded)
        assert m.must_fail != graded, f"{m.name} fails every cell: not a plausible partial mistake"
        assert MUST_PASS.get(m.name, set()).isdisjoint(m.must_fail)
        m.apply(answers[m.cell])  # each patch applies exactly once
    assert set(MUST_PASS) <= {m.name for m in MUTANTS}


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(m):
    must_pass = MUST_PASS.get(m.name, set())
    results = run_graded_cells(mutant_submission(A, m), A, only=set(m.must_fail) | must_pass)
    for gid in sorted(m.must_fail):
        ok, msg = results[gid].passed, results[gid].message
        assert not ok, f"mutant {m.name} ({m.why}) passed {gid}"
        assert any(word in msg for word in ("rank ", "token ", "expert ", "ValueError", "probs ", "gradient")), \
            f"mutant {m.name}: {gid} failed with an unclear message:\n{msg[:800]}"
    for gid in sorted(must_pass):
        ok, msg = results[gid].passed, results[gid].message
        assert ok, f"mutant {m.name} should still pass {gid}: {msg[:500]}"
    if m.demo:
        assert must_pass, "the demo mutant must earn partial credit"


# The demo mutant's exact set is also asserted by tests/test_pipeline.py (real nbgrader): the fast sample is another.
@pytest.mark.parametrize("m", sweep(MUTANTS, always={"dispatch_source_major"}))
def test_mutant_fails_exactly_its_cells(m):
    """The whole notebook per mutant: the failing cells are exactly `must_fail` (all mutants: COURSE_EXHAUSTIVE=1)."""
    results = run_graded_cells(mutant_submission(A, m), A)
    failed = {k for k, v in results.items() if not v.passed}
    assert failed == set(m.must_fail), (sorted(failed - m.must_fail), sorted(m.must_fail - failed))


def test_picture_of_the_reference_dispatcher_is_a_png():
    from autograder.checks.expert_parallel import plot_dispatch
    from solutions.expert_parallel.layers import AllToAllTokenDispatcher

    pic = plot_dispatch(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=24, k=2)
    assert pic.png.startswith(b"\x89PNG\r\n\x1a\n") and len(pic.png) > 10_000
    assert "source rank x expert" in pic.title
    source = nbformat.read(notebook_path("source", A), as_version=4)
    assert any("plot_dispatch(AllToAllTokenDispatcher" in c.source and not _meta(c) for c in source.cells)


def test_builder_reproduces_the_source_notebook():
    spec = importlib.util.spec_from_file_location("_build_ep_nb", os.path.join(ROOT, "assignments", A, "_build_nb.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nb.ipynb")
        module.build().write(path)
        with open(path, "rb") as f, open(notebook_path("source", A), "rb") as g:
            assert f.read() == g.read(), "source notebook is stale: run assignments/05_expert_parallel/_build_nb.py"
