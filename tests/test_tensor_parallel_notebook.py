"""The graded notebook of assignment 02 (TP / SP), in-process.

    .venv/bin/python -m pytest -q -s tests/test_tensor_parallel_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild); here what is particular to 02: the cells each
mutant must still pass, the sample of the sweep, and what a readable failure
names (a rank or a tensor).
"""

from notebook_harness import NotebookTests


class TestTensorParallelNotebook(NotebookTests):
    assignment = "02_tensor_parallel"
    must_pass = {
        "copy_to_identity_backward": {"test_reduce_from_region", "test_gather_from_region",
                                      "test_row_parallel_linear"},
        "sp_allreduce_then_split": {"test_column_parallel_linear", "test_tp_pair_communication"},
        "scatter_no_divisibility_check": {"test_scatter_to_region"},
        "ce_no_max_subtraction": {"test_vocab_parallel_cross_entropy"},
        "overlap_wait_immediately": {"test_async_allreduce_gradients"},
        "overlap_sync_allreduce": {"test_async_allreduce_gradients"},
        "sp_grads_every_parameter": {"test_parallel_mlp"},
        "mlp_bias_when_master_bias_none": {"test_sequence_parallel_grads"},
        "sp_grads_none_not_skipped": {"test_parallel_mlp"},
    }
    exact_sample = {"sp_allreduce_then_split"}  # the other mutants: make test-all
    # mistakes of direction (forward/backward), order (ranks' chunks) and dimension: the visible tests see them
    visible_catches = {
        "copy_to_identity_backward": {"test_copy_to_region", "test_column_parallel_linear", "test_tp_pair_communication"},
        "reduce_from_backward_allreduce": {"test_reduce_from_region", "test_row_parallel_linear",
                                           "test_tp_pair_communication"},
        "gather_last_dim_reversed": {"test_gather_from_region", "test_scatter_to_region",
                                     "test_column_parallel_linear", "test_row_parallel_linear"},
        "gather_last_dim_reshape": {"test_gather_from_region", "test_scatter_to_region"},
        "column_slices_dim1": {"test_column_parallel_linear"},
        "sp_allreduce_then_split": {"test_gather_from_sequence_parallel_region",
                                    "test_reduce_scatter_to_sequence_parallel_region"},
        "overlap_wait_immediately": {"test_async_allreduce_overlap"},
    }

    def readable(self, msg):
        kind = msg.split(":", 1)[0].rsplit(".", 1)[-1]  # "autograder.runtime.compare.CheckFailure" -> "CheckFailure"
        return "rank " in msg or kind in ("CheckFailure", "ValueError")
