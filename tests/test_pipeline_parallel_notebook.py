"""The graded notebook of assignment 03 (pipeline parallelism), in-process.

    .venv/bin/python -m pytest -q -s tests/test_pipeline_parallel_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild); here what is particular to 03: a readable failure
names a rank, a stage, a schedule or the split backward's function, and a
deadlock comes with where each rank waited and a hint (the deadlocking
mutants end within the checks' 5 s timeout, so most of them run only with
COURSE_EXHAUSTIVE=1); the mutants issues 7, 23 and 30 ask for exist; and the
VISIBLE tests alone (the release notebook, as a student runs it) fail every
cell each mutant must fail (issue 20: a direction, peer or order mistake
never passes visibly and loses points in grading), except the mistakes only
a hidden case can show. The nbgrader run is tests/test_pipeline.py's.
"""

import re
import time

import pytest
from conftest import sweep
from notebook_harness import NotebookTests

from solutions.submissions import mutant_submission, mutants_of, run_graded_cells

A = "03_pipeline_parallel"
CAUGHT_IN_MAKE_TEST = {"loss_summed_not_averaged", "warmup_off_by_one", "blocking_sends", "keeps_every_output",
                       "one_f_one_b_lifo_cooldown", "no_detach_between_own_chunks", "w_accumulated_twice",
                       "zb_h1_w_not_deferred", "dualpipev_split_parity_swapped", "zb_keeps_w_state"}
# mistakes that only a case the visible tests cannot reasonably contain shows (and why)
HIDDEN_ONLY = {"no_detach_between_own_chunks": "one rank (p = 1) with chunks: the graph is only cut wrongly there"}
# the visible-test sweep of `make test` (every other mutant with COURSE_EXHAUSTIVE=1)
VISIBLE_SAMPLE = {"backward_receives_with_recv_forward", "zb_h1_w_before_b", "zb_one_tag_for_both_streams",
                  "naive_split", "zb_keeps_outputs"}


class TestPipelineParallelNotebook(NotebookTests):
    assignment = A
    must_pass = {
        "loss_summed_not_averaged": {"test_pipeline_memory", "test_1f1b_schedule", "test_run_pipeline_zb_h1"},
        "warmup_off_by_one": {"test_run_pipeline_1f1b", "test_pipeline_memory"},
        "gpipe_backward_lifo": {"test_run_pipeline_gpipe"},
        "blocking_sends": {"test_run_pipeline_gpipe"},  # a blocking send never deadlocks GPipe
        "keeps_every_output": {"test_run_pipeline_1f1b"},
        "no_detach_between_own_chunks": {"test_run_pipeline_1f1b"},
        "no_validation": {"test_run_pipeline_gpipe"},
        "naive_split": {"test_split_backward", "test_run_pipeline_zb_h1", "test_run_pipeline_dualpipev"},
        "b_computes_weight_grads": {"test_split_backward"},
        "zb_h1_w_not_deferred": {"test_run_pipeline_zb_h1", "test_dualpipev_schedule"},
        "zb_h1_all_w_at_the_end": {"test_run_pipeline_zb_h1"},
        "dualpipev_split_parity_swapped": {"test_run_pipeline_dualpipev"},
        "zb_one_tag_for_both_streams": {"test_pipeline_zb_memory"},  # counts do not depend on the data
        "v_chunk_on_wrong_stage": {"test_run_pipeline_zb_h1"},
        "zb_keeps_outputs": {"test_run_pipeline_zb_h1", "test_run_pipeline_dualpipev"},
        "zb_keeps_inputs": {"test_run_pipeline_zb_h1", "test_run_pipeline_dualpipev"},
        "zb_keeps_w_state": {"test_run_pipeline_zb_h1", "test_run_pipeline_dualpipev"},
        "zb_w_never_run": {"test_pipeline_zb_memory", "test_split_backward"},
        # the demo's whole partial credit is graded by tests/test_pipeline.py (real nbgrader); here the cells next to it
        "w_accumulated_twice": {"test_split_backward_memory", "test_zb_h1_schedule", "test_dualpipev_schedule",
                                "test_pipeline_zb_memory"},
    }
    exact_sample = {"loss_summed_not_averaged"}
    # Exercise 7's ZB-H1 list is run by exercise 9's executor test: it names Exercise 7 while it is a stub
    stub_sample = {"zb_h1"}
    slow_to_catch = {m.name for m in mutants_of(A)} - CAUGHT_IN_MAKE_TEST
    sweep_graded_cells_only = True

    def readable(self, msg):
        if not re.search(r"ranks? \d|stage \d|_schedule\(|bubble_fraction\(|backward_(input|weight)|\.grad", msg):
            return False
        lines = msg.split("\n", 2)
        if len(lines) > 1 and "deadlock" in lines[1]:  # the runner's summary: where each rank waits, and a hint
            return "Hint: the ranks deadlocked" in msg and bool(re.search(r"ranks? \d", msg))
        return True

    def test_the_mutants_issues_7_20_23_and_30_ask_for_exist(self):
        names = {m.name for m in self.mutants}
        assert {"warmup_off_by_one", "gpipe_backward_lifo", "one_f_one_b_lifo_cooldown", "loss_summed_not_averaged",
                "blocking_sends", "keeps_every_output", "gradient_to_wrong_neighbour",
                "interleaved_backward_chunks_not_reversed", "interleaved_chunks_outer_loop"} <= names
        # issue 20: send_forward to the previous rank, a backward that receives with recv_forward
        assert {"activation_to_previous_rank", "backward_receives_with_recv_forward"} <= names
        # issue 23: W accumulated twice or never, B and W swapped in a list, a DualPipeV chunk on the wrong stage
        assert {"w_accumulated_twice", "zb_w_never_run", "zb_h1_w_before_b", "v_chunk_on_wrong_stage"} <= names
        # issue 30: an executor that keeps each micro-batch's input, or its W state, until the step ends
        assert {"zb_keeps_inputs", "zb_keeps_w_state"} <= names
        assert set(HIDDEN_ONLY) <= names

    @pytest.mark.parametrize("m", sweep([m for m in mutants_of(A) if m.must_fail and m.name not in HIDDEN_ONLY],
                                        always=VISIBLE_SAMPLE))
    def test_visible_tests_alone_catch_the_mutant(self, m):
        """Issue 20: the release notebook's own (visible) tests fail every cell the mutant loses in grading."""
        t0 = time.perf_counter()
        results = run_graded_cells(mutant_submission(A, m), only=set(m.must_fail))
        passed = sorted(gid for gid in m.must_fail if results[gid].passed)
        assert not passed, (f"mutant {m.name} ({m.why}) passes the visible tests of {passed} and loses their points "
                            f"only in grading: make the visible case big enough to show it")
        for gid in m.must_fail:
            assert self.readable(results[gid].message), (m.name, gid, results[gid].message[:600])
        print(f"\n{m.name}: visible tests fail {len(m.must_fail)} cell(s) in {time.perf_counter() - t0:.1f} s")
