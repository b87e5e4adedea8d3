"""The graded notebook of assignment 05 (expert parallelism), in-process.

    .venv/bin/python -m pytest -q -s tests/test_expert_parallel_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild); here what is particular to 05: a readable failure
names a rank, a token or an expert; the visible tests alone (what a student
runs) catch every mutant in the cells of its own exercise, so a student whose
visible tests pass loses points only on cases they could not contain (issue
20); and the picture of the reference dispatcher is a PNG that the notebook
draws.
"""

import re
import time

import nbformat
import pytest
from notebook_harness import NotebookTests, nbgrader_meta

from solutions.submissions import mutant_submission, mutants_of, notebook_path, run_graded_cells

ASSIGNMENT = "05_expert_parallel"
# the error contract of every exercise is one cell (after exercise 6): a mutant of any exercise may fail it
EVERY_EXERCISE = {"test_argument_errors"}


def exercise_of_cells(assignment: str = ASSIGNMENT) -> dict[str, int]:
    """grade_id -> exercise number: an answer cell belongs to the `## Exercise N` heading above it, a test cell
    to the exercise its `checking('Exercise N', ...)` names."""
    source = nbformat.read(notebook_path("source", assignment), as_version=4)
    current, owner = None, {}
    for cell in source.cells:
        if cell.cell_type == "markdown":
            m = re.match(r"## Exercise (\d+)", cell.source)
            current = int(m.group(1)) if m else current
            continue
        meta = nbgrader_meta(cell)
        if meta.get("solution"):
            owner[meta["grade_id"]] = current
        elif meta.get("grade"):
            owner[meta["grade_id"]] = int(re.search(r"checking\('Exercise (\d+)'", cell.source).group(1))
    return owner


def own_cells(m, owner: dict[str, int]) -> set[str]:
    """The cells of `m.must_fail` that belong to the exercise whose answer cell the mutant edits."""
    return {c for c in m.must_fail if owner[c] == owner[m.cell] or c in EVERY_EXERCISE}


class TestExpertParallelNotebook(NotebookTests):
    assignment = "05_expert_parallel"
    must_pass = {
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
    # The demo mutant's exact set is also asserted by tests/test_pipeline.py (real nbgrader): the fast sample is
    # another.
    exact_sample = {"overlap_backward_waited_at_once"}
    # Exercise 1's router is used by the layers of exercises 6 and 7: each names Exercise 1 while it is a stub
    stub_sample = {"router"}

    def readable(self, msg):
        return any(word in msg for word in ("rank ", "token ", "expert ", "ValueError", "probs ", "gradient"))

    @pytest.mark.parametrize("m", [pytest.param(m, id=m.name) for m in mutants_of(ASSIGNMENT) if m.must_fail])
    def test_visible_tests_catch_the_mutant_in_its_own_exercise(self, m):
        """Graded with the RELEASE notebook's test cells (the visible checks only, as a student runs them):
        every cell of the mutant's own exercise that grading fails must already fail here. Split, order and
        placement mistakes need world size >= 2, E/w >= 2 and E/w != w (a swapped chunk grid is invisible when
        w == E/w), and an EP group that is a subgroup (group rank vs global rank): the visible tests run
        4 ranks with 8 experts, and 2 groups of 2 ranks."""
        owner = exercise_of_cells()
        own = own_cells(m, owner)
        assert own, f"mutant {m.name} loses no point in its own exercise ({owner[m.cell]}): a student could not see it"
        t0 = time.perf_counter()
        results = run_graded_cells(mutant_submission(ASSIGNMENT, m), None, only=own)  # None: visible tests only
        passed = sorted(c for c in own if results[c].passed)
        assert not passed, (f"mutant {m.name} ({m.why}) passes the visible tests of {passed}, which grading fails: "
                            f"the visible tests cannot show this mistake")
        for c in own:
            assert self.readable(results[c].message), results[c].message[:600]
        print(f"\n{m.name}: visible tests fail {sorted(own)} in {time.perf_counter() - t0:.1f} s")

    def test_picture_of_the_reference_dispatcher_is_a_png(self):
        from autograder.checks.expert_parallel import plot_dispatch
        from solutions.expert_parallel.layers import AllToAllTokenDispatcher

        pic = plot_dispatch(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=24, k=2)
        assert pic.png.startswith(b"\x89PNG\r\n\x1a\n") and len(pic.png) > 10_000
        assert "source rank x expert" in pic.title
        source = nbformat.read(notebook_path("source", self.assignment), as_version=4)
        assert any("plot_dispatch(AllToAllTokenDispatcher" in c.source and not nbgrader_meta(c) for c in source.cells)
