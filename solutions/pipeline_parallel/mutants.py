"""Plausible wrong implementations of assignment 03 (pipeline parallelism), kept as tests.

Each mutant edits one answer cell of source/03_pipeline_parallel/pipeline_parallel_lab.ipynb;
`must_fail` is exactly the set of graded cells it fails (tests/test_pipeline_parallel_notebook.py
runs them). The demo mutant (`make demo`) accumulates the deferred weight gradient twice
(W initialises `.grad` with its gradient, then adds it again): the split
backward's own test and every zero-bubble run lose their points, everything
before them keeps full marks.
"""

from solutions.submissions import mutant

RUN_CELLS = ("test_run_pipeline_gpipe", "test_run_pipeline_1f1b", "test_run_pipeline_interleaved")
ZB_RUN_CELLS = ("test_run_pipeline_zb_h1", "test_run_pipeline_dualpipev")

MUTANTS = [
    mutant(
        "loss_summed_not_averaged", "run_pipeline",
        [('loss = state["loss_fn"](y, state["targets"][mb]) / state["num_microbatches"]',
          'loss = state["loss_fn"](y, state["targets"][mb])')],
        must_fail=set(RUN_CELLS),
        why="each micro-batch's loss is not divided by m: the loss and every gradient are m times too large",
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
    # -- the direction mistakes issue 20 names, each caught by the visible tests at 3 or 4 stages
    mutant(
        "activation_to_previous_rank", "p2p",
        [("""    next_rank, _ = _next_and_prev(pp_group)
    return dist.isend(tensor.contiguous(), group=pp_group, group_dst=next_rank)""",
          """    _, next_rank = _next_and_prev(pp_group)
    return dist.isend(tensor.contiguous(), group=pp_group, group_dst=next_rank)""")],
        must_fail={"test_p2p_helpers", "test_run_pipeline_gpipe", "test_run_pipeline_1f1b", "test_pipeline_memory",
                   "test_run_pipeline_interleaved"},
        why="send_forward sends to the previous rank instead of the next one (the same rank at p = 2)",
    ),
    mutant(
        "backward_receives_with_recv_forward", "run_pipeline",
        [('grad = recv_backward(state["shape"], state["dtype"], pp_group=state["group"], device=state["device"])',
          'grad = recv_forward(state["shape"], state["dtype"], pp_group=state["group"], device=state["device"])')],
        must_fail={"test_run_pipeline_gpipe", "test_run_pipeline_1f1b", "test_pipeline_memory",
                   "test_run_pipeline_interleaved"},
        why="_backward_step receives the output's gradient from the previous rank (recv_forward) instead of the "
            "next (the same rank at p = 2)",
    ),

    # -- exercise 6: the split backward
    mutant(
        "w_accumulated_twice", "split_backward",
        [("            param.grad = dw if param.grad is None else param.grad + dw  # accumulate, as a full backward "
          "does",
          "            if param.grad is None:\n                param.grad = dw.clone()  # a first gradient: start from "
          "it\n            param.grad += dw  # accumulate")],
        must_fail={"test_split_backward", *ZB_RUN_CELLS},
        why="W starts an empty .grad with its gradient and then adds it again: twice the weight gradient of the "
            "first micro-batch",
        demo=True,
    ),
    mutant(
        "w_overwrites_grad", "split_backward",
        [("            param.grad = dw if param.grad is None else param.grad + dw  # accumulate, as a full backward "
          "does",
          "            param.grad = dw  # the weight gradient")],
        must_fail={"test_split_backward", *ZB_RUN_CELLS},
        why="W assigns .grad instead of adding to it: only the last micro-batch's weight gradient survives",
    ),
    mutant(
        "b_computes_weight_grads", "split_backward",
        [("""    points = _weight_split_points(output, params)
    edges = [GradientEdge(node, 0) for node, _ in points]  # the gradient of each weighted operation's output
    grads = torch.autograd.grad(output, list(inputs) + edges, grad_outputs=grad_output,
                                retain_graph=True)  # W still needs the saved inputs below these points
    input_grads = list(grads[:len(inputs)])
    w_state = [(node, group, grad) for (node, group), grad in zip(points, grads[len(inputs):])]""",
          """    grads = torch.autograd.grad(output, list(inputs) + list(params), grad_outputs=grad_output)  # all at once
    input_grads = list(grads[:len(inputs)])
    w_state = list(zip(params, grads[len(inputs):]))  # the weight gradients, ready for W to add"""),
         ("""    for node, group, grad in w_state:
        # from this operation's output gradient to its own parameters only: no input gradient again
        weight_grads = torch.autograd.grad([GradientEdge(node, 0)], group, grad_outputs=[grad])
        for param, dw in zip(group, weight_grads):
            param.grad = dw if param.grad is None else param.grad + dw  # accumulate, as a full backward does""",
          """    for param, dw in w_state:
        param.grad = dw if param.grad is None else param.grad + dw  # accumulate""")],
        must_fail={"test_split_backward_memory", *ZB_RUN_CELLS, "test_pipeline_zb_memory"},
        why="B computes the weight gradients too and W only adds them: right numbers, but nothing is left for W "
            "to fill a bubble with (the FLOPs and the executed order show it)",
    ),
    mutant(
        "naive_split", "split_backward",
        [("""    points = _weight_split_points(output, params)
    edges = [GradientEdge(node, 0) for node, _ in points]  # the gradient of each weighted operation's output
    grads = torch.autograd.grad(output, list(inputs) + edges, grad_outputs=grad_output,
                                retain_graph=True)  # W still needs the saved inputs below these points
    input_grads = list(grads[:len(inputs)])
    w_state = [(node, group, grad) for (node, group), grad in zip(points, grads[len(inputs):])]""",
          """    input_grads = (list(torch.autograd.grad(output, list(inputs), grad_outputs=grad_output, retain_graph=True))
                   if inputs else [])
    w_state = [(output, grad_output, list(params))]  # W runs the backward again, from the output"""),
         ("""    for node, group, grad in w_state:
        # from this operation's output gradient to its own parameters only: no input gradient again
        weight_grads = torch.autograd.grad([GradientEdge(node, 0)], group, grad_outputs=[grad])""",
          """    for output, grad_output, group in w_state:
        weight_grads = torch.autograd.grad(output, group, grad_outputs=grad_output)""")],
        must_fail={"test_split_backward_memory", "test_pipeline_zb_memory"},
        why="B keeps the whole graph and the output, and W runs the backward again from the output: right numbers, "
            "but the output stays alive until W and W repeats the input-gradient GEMMs of the layers above",
    ),

    # -- exercise 7: ZB-H1
    mutant(
        "zb_h1_w_before_b", "zb_h1",
        [("""        actions.append(action)
        if action[0] == "B" and action[1] >= s:
            actions.append(("W", action[1] - s))  # the W of the backward s steps back""",
          """        if action[0] == "B" and action[1] >= s:
            actions.append(("W", action[1] - s))  # the W of the backward s steps back
        actions.append(action)""")],
        must_fail={"test_zb_h1_schedule", "test_run_pipeline_zb_h1", "test_pipeline_zb_memory"},
        why="B and W swapped: each W is listed before the backward that releases it (on stage 0, W0 before B0)",
    ),
    mutant(
        "zb_h1_w_not_deferred", "zb_h1",
        [("""        if action[0] == "B" and action[1] >= s:
            actions.append(("W", action[1] - s))  # the W of the backward s steps back""",
          """        if action[0] == "B":
            actions.append(("W", action[1]))  # the W right after its B"""),
         ('    actions += [("W", mb) for mb in range(max(0, m - s), m)]  # the last s Ws fill the cool-down\n', "")],
        must_fail={"test_zb_h1_schedule"},
        why="every W right after its own B on every stage: 1F1B's bubble, nothing fills it",
    ),
    mutant(
        "zb_h1_all_w_at_the_end", "zb_h1",
        [("""        if action[0] == "B" and action[1] >= s:
            actions.append(("W", action[1] - s))  # the W of the backward s steps back""",
          """        pass  # every W waits for the end"""),
         ('    actions += [("W", mb) for mb in range(max(0, m - s), m)]  # the last s Ws fill the cool-down',
          '    actions += [("W", mb) for mb in range(m)]  # all the Ws at the end')],
        must_fail={"test_zb_h1_schedule"},
        why="every W deferred to the end of the step: each stage keeps all m micro-batches' activations (more "
            "than 1F1B's p)",
    ),

    # -- exercise 8: DualPipeV
    mutant(
        "dualpipev_split_parity_swapped", "dualpipev",
        [("        if i == (r + 1) // 2 and r % 2 == 1:\n            split = True\n        backward(1, split)\n"
          "        if i == (r + 1) // 2 and r % 2 == 0:",
          "        if i == (r + 1) // 2 and r % 2 == 0:\n            split = True\n        backward(1, split)\n"
          "        if i == (r + 1) // 2 and r % 2 == 1:")],
        must_fail={"test_dualpipev_schedule"},
        why="step 6 starts splitting the backwards from the wrong chunk (B1 on even ranks, B0 on odd ones)",
    ),
    mutant(
        "dualpipev_pairs_reversed", "dualpipev",
        [("            pair(0, 1)\n        pair(1, 0)", "            pair(1, 0)\n        pair(0, 1)")],
        must_fail={"test_dualpipev_schedule", "test_run_pipeline_dualpipev", "test_pipeline_zb_memory"},
        why="step 4 pairs the chunks the other way round (F1 with B0 first): a chunk-1 forward before its input "
            "exists, the stages deadlock",
    ),

    # -- exercise 9: run_pipeline_zb
    mutant(
        "v_chunk_on_wrong_stage", "run_pipeline_zb",
        [("        return rank if chunk == 0 else 2 * size - 1 - rank", "        return rank if chunk == 0 else size + rank")],
        must_fail={"test_run_pipeline_dualpipev", "test_pipeline_zb_memory"},
        why="in the V, chunk 1 is put on stage p + r (the loop's placement) instead of 2p - 1 - r",
    ),
    mutant(
        "zb_one_tag_for_both_streams", "run_pipeline_zb",
        [("GRADIENT_TAG = 1  # the tag", "GRADIENT_TAG = 0  # the tag")],
        must_fail=set(ZB_RUN_CELLS),
        why="activations and gradients share one tag: in the V (and in torch's interleaved zero-bubble order) a "
            "gradient lands in a receive waiting for an activation (same shape, wrong numbers)",
    ),
    mutant(
        "zb_gradient_to_next_stage", "run_pipeline_zb",
        [('        peer = _owner(state["style"], p, stage - 1)', '        peer = _owner(state["style"], p, stage + 1)')],
        must_fail={*ZB_RUN_CELLS, "test_pipeline_zb_memory"},
        why="B sends the input's gradient to the rank of the next stage instead of the previous one",
    ),
    mutant(
        "zb_global_rank", "run_pipeline_zb",
        [('    size, rank = _group_size_rank(pp_group, "run_pipeline_zb")',
          '    size, rank = _group_size_rank(pp_group, "run_pipeline_zb")[0], dist.get_rank()')],
        must_fail={*ZB_RUN_CELLS, "test_pipeline_zb_memory"},
        why="run_pipeline_zb takes the global rank for its place in the pipeline: wrong as soon as the pipeline "
            "group is not the world",
    ),
    mutant(
        "zb_w_never_run", "run_pipeline_zb",
        [('    backward_weight(state["weights"].pop((mb, chunk)))',
          '    state["weights"].pop((mb, chunk))  # the weights can wait')],
        must_fail=set(ZB_RUN_CELLS),
        why="a W drops its state without running backward_weight: the deferred weight gradients are never "
            "accumulated",
    ),
    mutant(
        "zb_keeps_outputs", "run_pipeline_zb",
        [('    y = state["outputs"].pop((mb, chunk))\n    grad = None', '    y = state["outputs"][(mb, chunk)]\n    grad = None')],
        must_fail={"test_pipeline_zb_memory"},
        why="B never drops the stage output: every output stays alive until the step ends",
    ),
    mutant(
        "zb_keeps_inputs", "run_pipeline_zb",
        [('    x = state["inputs"].pop((mb, chunk))\n', '    x = state["inputs"][(mb, chunk)]\n')],
        must_fail={"test_pipeline_zb_memory"},
        why="B never drops the stage input: every micro-batch's input (what a weight gradient reads) stays alive "
            "until the step ends, long after its W",
    ),
    mutant(
        "zb_keeps_w_state", "run_pipeline_zb",
        [('    backward_weight(state["weights"].pop((mb, chunk)))',
          '    backward_weight(list(state["weights"][(mb, chunk)]))  # a copy: the state stays until the end')],
        must_fail={"test_pipeline_zb_memory"},
        why="W runs on a copy of its state and keeps the state: every micro-batch's weight-gradient inputs (the "
            "output gradient of each weighted layer) stay alive until the step ends",
    ),
]
