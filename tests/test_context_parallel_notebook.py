"""The graded notebook of assignment 04 (context parallelism), in-process.

    .venv/bin/python -m pytest -q -s tests/test_context_parallel_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild); here what is particular to 04: a readable failure
names a rank or a tensor, and its exercise; a ring reversed on one side
deadlocks, and is reported within seconds with a hint and where each rank
waited (its sweep over every cell runs with COURSE_EXHAUSTIVE=1).
"""

import time

from notebook_harness import NotebookTests

from solutions.submissions import mutant, mutant_submission, run_graded_cells


class TestContextParallelNotebook(NotebookTests):
    assignment = "04_context_parallel"
    must_pass = {
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
    exact_sample = {"zigzag_wasted_work"}
    # Exercise 3's ring is used by the tests of exercises 4 and 5: each names Exercise 3 while it is a stub
    stub_sample = {"ring_forward"}
    # mistakes of direction, peer (a global rank for a group rank) and order: the visible tests see them (w = 4,
    # a CP group inside a larger world); the deadlocking ring's costs 5 s timeouts: COURSE_EXHAUSTIVE=1
    visible_catches = {
        "ring_reversed_one_side": {"test_ring_forward", "test_ring_backward", "test_zigzag_ring_attention"},
        "ring_global_rank": {"test_ring_forward", "test_ring_backward"},
        "ring_stale_block": {"test_ring_forward", "test_ring_backward"},
        "ring_post_after_compute": {"test_ring_overlap"},
        "causal_local_positions": {"test_ring_forward", "test_ring_backward"},
        "dkv_not_returned": {"test_ring_backward"},
        "zigzag_wrong_order": {"test_zigzag_split"},
        "a2a_backward_not_inverse": {"test_seq_all_to_all", "test_ulysses_attention"},
        "ulysses_dims_swapped": {"test_ulysses_attention"},
    }
    # The deadlocking mutant costs a 5 s timeout per cell: its fast check is the deadlock test below.
    slow_to_catch = {"ring_reversed_one_side"}

    def readable(self, msg):
        return ("rank " in msg or "CheckFailure" in msg) and "Exercise " in msg

    def test_deadlocking_ring_is_reported_with_a_hint_within_seconds(self):
        """A ring reversed on one side hangs at w >= 3: the visible test reports it in seconds, with the fix and
        where each rank waited."""
        m = next(m for m in self.mutants if m.name == "ring_reversed_one_side")
        t0 = time.perf_counter()
        results = run_graded_cells(mutant_submission(self.assignment, m), self.assignment, only={"test_ring_forward"})
        elapsed = time.perf_counter() - t0
        msg = results["test_ring_forward"].message
        assert "did not finish" in msg and "(rank - 1) % w" in msg and "deadlock" in msg, msg[:1500]
        assert "ring_attention_forward" in msg and "work.wait()" in msg, msg[:1500]  # where every rank waited
        assert elapsed < 15, elapsed  # the runner sees the ranks idle within seconds (and the cell's timeout is 5 s)

    def test_every_wrong_output_is_named_in_the_first_lines(self):
        """A ring that keeps only its last block: out and lse both wrong; lse is named, not '(1 more wrong
        tensor(s))' behind out's detail."""
        m = mutant("last_block_only", "ring_forward",
                   [("            out, lse = merge_attention(out, lse, block_out, block_lse)\n",
                     "            out, lse = block_out, block_lse\n")], {"test_ring_forward"})
        results = run_graded_cells(mutant_submission(self.assignment, m), self.assignment, only={"test_ring_forward"})
        lines = results["test_ring_forward"].message.splitlines()
        assert lines[1].startswith("Wrong: out on rank 1; lse on rank 1"), lines[:3]
