"""Plausible wrong implementations of assignment 03 (pipeline parallelism), kept as tests.

Each mutant edits one answer cell of source/03_pipeline_parallel/pipeline_parallel_lab.ipynb;
`must_fail` is exactly the set of graded cells it fails (tests/test_pipeline_parallel_notebook.py
runs them). The demo mutant (`make demo`) sums the micro-batch losses instead of averaging
them: every schedule is right, the numbers of every multi-micro-batch run are m times too large.
"""

from solutions.submissions import mutant

RUN_CELLS = ("test_run_pipeline_gpipe", "test_run_pipeline_1f1b", "test_run_pipeline_interleaved")

MUTANTS = [
    mutant(
        "loss_summed_not_averaged", "run_pipeline",
        [('loss = state["loss_fn"](y, state["targets"][mb]) / state["num_microbatches"]',
          'loss = state["loss_fn"](y, state["targets"][mb])')],
        must_fail=set(RUN_CELLS),
        why="each micro-batch's loss is not divided by m: the loss and every gradient are m times too large",
        demo=True,
    ),
    mutant(
        "warmup_off_by_one", "schedules",
        [("num_warmup = min(num_stages - stage - 1, num_microbatches)",
          "num_warmup = min(num_stages - stage, num_microbatches)")],
        must_fail={"test_1f1b_schedule"},
        why="1F1B's warm-up is p - stage forwards instead of p - stage - 1: one more micro-batch held per stage",
    ),
    mutant(
        "gpipe_backward_lifo", "schedules",
        [("backwards = [(\"B\", mb) for mb in range(num_microbatches)]",
          "backwards = [(\"B\", mb) for mb in reversed(range(num_microbatches))]")],
        must_fail={"test_gpipe_schedule"},
        why="GPipe's backwards in LIFO order (the last micro-batch first) instead of FIFO",
    ),
    mutant(
        "one_f_one_b_lifo_cooldown", "schedules",
        [("for mb in range(num_microbatches - num_warmup, num_microbatches):",
          "for mb in reversed(range(num_microbatches - num_warmup, num_microbatches)):")],
        must_fail={"test_1f1b_schedule", "test_run_pipeline_1f1b"},
        why="1F1B's cool-down backwards in LIFO order: gradients arrive FIFO and are applied to the wrong "
            "micro-batches (invisible at p = 2)",
    ),
    mutant(
        "blocking_sends", "run_pipeline",
        [('state["forward_sends"][(mb, chunk)] = send_forward(y, pp_group=state["group"])',
          'send_forward(y, pp_group=state["group"]).wait()  # sent: move on'),
         ('state["forward_sends"].pop((mb, chunk)).wait()', 'pass'),
         ('state["backward_sends"].append(send_backward(x.grad, pp_group=state["group"]))',
          'send_backward(x.grad, pp_group=state["group"]).wait()  # sent: move on')],
        must_fail={"test_run_pipeline_1f1b", "test_pipeline_memory", "test_run_pipeline_interleaved"},
        why="every send is waited right after it is posted: neighbours that both send first wait for each "
            "other forever (1F1B with m >= 2 and interleaved deadlock; GPipe does not)",
    ),
    mutant(
        "keeps_every_output", "run_pipeline",
        [('y = state["outputs"].pop((mb, chunk))', 'y = state["outputs"][(mb, chunk)]')],
        must_fail={"test_pipeline_memory"},
        why="stage outputs are never removed after their backward: 1F1B holds m micro-batches like GPipe",
    ),
    mutant(
        "gradient_to_wrong_neighbour", "p2p",
        [("""    _, prev_rank = _next_and_prev(pp_group)
    return dist.isend(tensor.contiguous(), group=pp_group, group_dst=prev_rank)""",
          """    prev_rank, _ = _next_and_prev(pp_group)
    return dist.isend(tensor.contiguous(), group=pp_group, group_dst=prev_rank)""")],
        must_fail={"test_p2p_helpers", "test_run_pipeline_gpipe", "test_run_pipeline_1f1b", "test_pipeline_memory",
                   "test_run_pipeline_interleaved"},
        why="send_backward sends to the next rank instead of the previous one (invisible at p = 2)",
    ),
    mutant(
        "global_rank_peers", "p2p",
        [("size, rank = pp_group.size(), pp_group.rank()", "size, rank = pp_group.size(), dist.get_rank()")],
        must_fail={"test_p2p_helpers", "test_run_pipeline_gpipe", "test_run_pipeline_1f1b", "test_pipeline_memory",
                   "test_run_pipeline_interleaved"},
        why="neighbours computed from the global rank: wrong as soon as the pipeline group is not the world",
    ),
    mutant(
        "recv_default_dtype", "p2p",
        [("""    next_rank, _ = _next_and_prev(pp_group)
    buffer = torch.empty(dims, dtype=dtype, device=device)""",
          """    next_rank, _ = _next_and_prev(pp_group)
    buffer = torch.empty(dims, device=device)""")],
        must_fail={"test_p2p_helpers", "test_run_pipeline_gpipe", "test_run_pipeline_1f1b", "test_pipeline_memory",
                   "test_run_pipeline_interleaved"},
        why="recv_backward ignores dtype: a float32 buffer for a float64 gradient (gloo aborts the process)",
    ),
    mutant(
        "interleaved_backward_chunks_not_reversed", "interleaved",
        [("backward_order = [(mb, v - 1 - chunk) for mb, chunk in forward_order]",
          "backward_order = [(mb, chunk) for mb, chunk in forward_order]")],
        must_fail={"test_interleaved_schedule", "test_run_pipeline_interleaved"},
        why="the interleaved backwards visit the chunks in forward order (0 first) instead of in reverse",
    ),
    mutant(
        "interleaved_chunks_outer_loop", "interleaved",
        [("for first in range(0, m, p) for chunk in range(v) for mb in range(first, first + p)",
          "for chunk in range(v) for first in range(0, m, p) for mb in range(first, first + p)")],
        must_fail={"test_interleaved_schedule", "test_run_pipeline_interleaved"},
        why="every micro-batch through chunk 0 before any reaches chunk 1 (no groups of p): the chunks are "
            "visited in the wrong order",
    ),
    mutant(
        "no_detach_between_own_chunks", "run_pipeline",
        [('state["local"][("F", mb, chunk + 1)] = y.detach().requires_grad_()',
          'state["local"][("F", mb, chunk + 1)] = y')],
        must_fail={"test_run_pipeline_interleaved"},
        why="with one rank, a chunk's output is handed to the next chunk without cutting the graph "
            "(only visible at p = 1 with chunks)",
    ),
    mutant(
        "loss_returned_as_tensor", "run_pipeline",
        [('return float(sum(state["losses"]))', 'return torch.tensor(sum(state["losses"]))')],
        must_fail=set(RUN_CELLS),
        why="the last stage returns the loss as a tensor, not a Python float",
    ),
    mutant(
        "no_validation", "run_pipeline",
        [('chunks, actions = _check_pipeline_args(stage_module, schedule, microbatches, targets)',
          'chunks = list(stage_module) if isinstance(stage_module, (list, tuple)) else [stage_module]\n'
          '    actions = [(a[0], a[1], a[2] if len(a) == 3 else 0) for a in schedule]')],
        must_fail={"test_run_pipeline_errors"},
        why="run_pipeline skips the argument checks: bad input fails late, after communicating, or not at all",
    ),
]
