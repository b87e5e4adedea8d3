"""The graded notebook of assignment 06 (the capstone), in-process.

    .venv/bin/python -m pytest -q -s tests/test_composition_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild); here what is particular to 06: a readable failure
is a verdict (FAILED, or a deadlock) that names a rank or what was expected;
a mutant that also fails a cheaper cell is checked there rather than in the
training cells (seconds each); a process-group hang is reported with each
rank's line and the grader goes on.
"""

import time

from notebook_harness import NotebookTests

from solutions.submissions import mutant_submission, run_graded_cells

# The training cells take seconds each: a mutant that also fails a cheaper cell is checked there in `make test`
# (its training cells too with COURSE_EXHAUSTIVE=1, in test_mutant_fails_exactly_its_cells).
TRAINING_CELLS = ("test_dp_tp_training", "test_pipeline_training")  # cheaper first


class TestCompositionNotebook(NotebookTests):
    assignment = "06_composition"
    must_pass = {
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
    exact_sample = {"tied_grads_allreduce_a_copy"}
    # mistakes of order (dimensions, layers, chunks), rank (global vs coordinate) and the layout's rules: the visible
    # tests see them (CP > 1, PP = 1, a 4-layer pipeline); the hang's costs seconds: COURSE_EXHAUSTIVE=1
    visible_catches = {
        "layout_outer_dimension_fastest": {"test_rank_layout", "test_rank_layout_expert"},
        "layout_dp_ignores_cp": {"test_rank_layout"},
        "layout_embedding_pair_at_pp1": {"test_rank_layout"},
        "layout_dense_order_rejected": {"test_rank_layout"},
        "layout_no_pp_last_rule": {"test_rank_layout_errors"},
        "groups_my_group_first": {"test_process_groups"},
        "mesh_not_reversed": {"test_device_mesh"},
        "batch_by_global_rank": {"test_local_batch"},
        "batch_cp_contiguous": {"test_local_batch"},
        "tp_colwise_rowwise_swapped": {"test_tensor_parallel_plan"},
        "pipeline_layers_interleaved": {"test_pipeline_training"},
        "ckpt_tied_copy_own_key": {"test_checkpoint_state"},
    }
    # groups_my_group_first hangs until the check's 20 s bound: in make test it is caught by
    # test_the_hang_is_reported_with_each_rank_line_and_the_grader_goes_on below (and by the sweeps with
    # COURSE_EXHAUSTIVE=1)
    slow_to_catch = {"groups_my_group_first"}

    def readable(self, msg):
        verdict = "FAILED" in msg or "deadlock" in msg
        own_error = msg.startswith("ValueError")  # the student's own ValueError, shown as it is
        return verdict and ("rank " in msg or "expected" in msg or own_error)

    def cells_to_check(self, m):
        cheap = set(m.must_fail) - set(TRAINING_CELLS)
        if cheap:
            return cheap
        return {next(gid for gid in TRAINING_CELLS if gid in m.must_fail)}

    def test_the_hang_is_reported_with_each_rank_line_and_the_grader_goes_on(self):
        m = next(m for m in self.mutants if m.name == "groups_my_group_first")
        t0 = time.perf_counter()
        results = run_graded_cells(mutant_submission(self.assignment, m), self.assignment,
                                   only={"test_process_groups"})
        elapsed = time.perf_counter() - t0
        msg = results["test_process_groups"].message
        assert "deadlock" in msg and "new_group" in msg, msg[:1500]
        assert "build_process_groups" in msg, msg[:1500]  # the student's function, where each rank waits
        # reported by the runner's deadlock detection (about 3 s), or at the check's 20 s timeout at the latest
        assert elapsed < 30, f"the hang took {elapsed:.1f} s to report"
