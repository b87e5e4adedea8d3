"""The graded notebook of assignment 05 (expert parallelism), in-process.

    .venv/bin/python -m pytest -q -s tests/test_expert_parallel_notebook.py

The tests every notebook gets are tests/notebook_harness.py's (reference,
stubs, mutants, rebuild); here what is particular to 05: a readable failure
names a rank, a token or an expert, and the picture of the reference
dispatcher is a PNG that the notebook draws.
"""

import nbformat
from notebook_harness import NotebookTests, nbgrader_meta

from solutions.submissions import notebook_path


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
    exact_sample = {"dispatch_source_major"}

    def readable(self, msg):
        return any(word in msg for word in ("rank ", "token ", "expert ", "ValueError", "probs ", "gradient"))

    def test_picture_of_the_reference_dispatcher_is_a_png(self):
        from autograder.checks.expert_parallel import plot_dispatch
        from solutions.expert_parallel.layers import AllToAllTokenDispatcher

        pic = plot_dispatch(AllToAllTokenDispatcher, world_size=4, num_experts=8, num_tokens=24, k=2)
        assert pic.png.startswith(b"\x89PNG\r\n\x1a\n") and len(pic.png) > 10_000
        assert "source rank x expert" in pic.title
        source = nbformat.read(notebook_path("source", self.assignment), as_version=4)
        assert any("plot_dispatch(AllToAllTokenDispatcher" in c.source and not nbgrader_meta(c) for c in source.cells)
