"""The notebook of assignment 01 (data parallelism), graded in-process.

    .venv/bin/python -m pytest -q -s tests/test_data_parallel_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild). Particular to 01: the demo mutant must pass every
cell outside its must_fail, and each variant (a different correct
implementation, padding to lcm(d, 128)) passes every cell of its exercise.
"""

import pytest
from notebook_harness import NotebookTests

from solutions.data_parallel.mutants import VARIANTS
from solutions.submissions import mutant_submission, run_graded_cells

EXERCISE_CELLS = {
    "zero_sharded_optimizer": {"test_zero_matches_optimizer", "test_zero_rounding", "test_zero_state_sharded",
                               "test_zero_comm"},
    "fully_shard": {"test_fsdp_numerics", "test_fsdp_comm", "test_fsdp_memory", "test_fsdp_mixed_precision",
                    "test_gather_full_params"},
}


class TestDataParallelNotebook(NotebookTests):
    assignment = "01_data_parallel"
    exact_sample = {"fsdp_autograd_keeps_full_param"}  # the other mutants: make test-all
    # mistakes of order and source rank: the visible tests see them (a bucket copied back before its wait()
    # too, deterministically: the visible late-rank case)
    visible_catches = {
        "no_rank0_broadcast": {"test_ddp_broadcast"},
        "buckets_launched_after_backward": {"test_ddp_buckets", "test_ddp_no_sync"},
        "buckets_launched_at_end_of_backward": {"test_ddp_buckets"},
        "grads_written_before_wait": {"test_ddp_gradients"},
    }

    def readable(self, msg):
        kind = (msg.splitlines()[0] if msg else "").split(":", 1)[0].rsplit(".", 1)[-1]
        return kind in ("CheckFailure", "DistributedError", "ValueError") and ("rank" in msg or "grad" in msg)

    @pytest.mark.parametrize("v", VARIANTS, ids=[v.name for v in VARIANTS])
    def test_variant_passes_its_exercise(self, v):
        """A correct implementation that differs from the reference (padding to lcm(d, 128)) passes every cell."""
        results = run_graded_cells(mutant_submission(self.assignment, v), self.assignment,
                                   only=EXERCISE_CELLS[v.cell])
        failed = {k: r.message[:800] for k, r in results.items() if not r.passed}
        assert not failed, f"variant {v.name} ({v.why}) fails: {failed}"
