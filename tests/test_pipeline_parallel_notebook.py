"""The graded notebook of assignment 03 (pipeline parallelism), in-process.

    .venv/bin/python -m pytest -q -s tests/test_pipeline_parallel_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild); here what is particular to 03: a readable failure
names a rank, a stage or a schedule, and a deadlock comes with where each
rank waited and a hint (the deadlocking mutants end within the checks' 5 s
timeout, so most of them run only with COURSE_EXHAUSTIVE=1); the mutants
issue 7 asks for exist. The nbgrader run is tests/test_pipeline.py's.
"""

import re

from notebook_harness import NotebookTests

from solutions.submissions import mutants_of

A = "03_pipeline_parallel"
CAUGHT_IN_MAKE_TEST = {"loss_summed_not_averaged", "warmup_off_by_one", "blocking_sends", "keeps_every_output",
                       "one_f_one_b_lifo_cooldown", "no_detach_between_own_chunks"}


class TestPipelineParallelNotebook(NotebookTests):
    assignment = A
    must_pass = {
        "loss_summed_not_averaged": {"test_pipeline_memory", "test_1f1b_schedule"},
        "warmup_off_by_one": {"test_run_pipeline_1f1b", "test_pipeline_memory"},
        "gpipe_backward_lifo": {"test_run_pipeline_gpipe"},
        "blocking_sends": {"test_run_pipeline_gpipe"},  # a blocking send never deadlocks GPipe
        "keeps_every_output": {"test_run_pipeline_1f1b"},
        "no_detach_between_own_chunks": {"test_run_pipeline_1f1b"},
        "no_validation": {"test_run_pipeline_gpipe"},
    }
    exact_sample = {"loss_summed_not_averaged"}
    slow_to_catch = {m.name for m in mutants_of(A)} - CAUGHT_IN_MAKE_TEST
    sweep_graded_cells_only = True

    def readable(self, msg):
        if not re.search(r"ranks? \d|stage \d|_schedule\(|bubble_fraction\(", msg):
            return False
        lines = msg.split("\n", 2)
        if len(lines) > 1 and "deadlock" in lines[1]:  # the runner's summary: where each rank waits, and a hint
            return "Hint: the ranks deadlocked" in msg and bool(re.search(r"ranks? \d", msg))
        return True

    def test_the_mutants_issue_7_asks_for_exist(self):
        names = {m.name for m in self.mutants}
        assert {"warmup_off_by_one", "gpipe_backward_lifo", "one_f_one_b_lifo_cooldown", "loss_summed_not_averaged",
                "blocking_sends", "keeps_every_output", "gradient_to_wrong_neighbour",
                "interleaved_backward_chunks_not_reversed", "interleaved_chunks_outer_loop"} <= names
