"""Plausible wrong implementations of assignment 05 (expert parallelism), kept as tests.

Each mutant edits one answer cell of source/05_expert_parallel/expert_parallel_lab.ipynb;
`must_fail` is exactly the set of graded cells it fails (tests/test_expert_parallel_notebook.py
runs them); `VARIANTS` are different but correct edits (an empty `must_fail`). The demo mutant (`make demo`) is the overlapped layer that waits for
every all-to-all at once: right numbers, no overlap, partial credit.
"""

from solutions.submissions import mutant

LAYER_CELLS = ("test_moe_layer", "test_moe_capacity")
# Exercise 7's OverlappedMoELayer is built on the student's router, permutation, capacity and MoELayer's experts
# (not on the dispatcher: it posts its own all-to-alls), so a mistake there fails test_overlapped_moe_layer too

MUTANTS = [
    # -- the list ------------------------------------------------------------
    mutant(
        "a2a_splits_swapped_forward", "all_to_all",
        [("output_split_sizes=output_split_sizes,\n                               "
          "input_split_sizes=input_split_sizes, group=group)",
          "output_split_sizes=input_split_sizes,\n                               "
          "input_split_sizes=output_split_sizes, group=group)")],
        must_fail={"test_all_to_all", "test_dispatch", "test_combine", "test_dispatcher_communication", *LAYER_CELLS},
        why="input and output split sizes swapped in the forward all-to-all",
    ),
    mutant(
        "counts_not_exchanged", "dispatcher",
        [("counts = exchange_token_counts(num_local_tokens_per_expert, group=self.ep_group)  # [w, E/w]",
          "counts = num_local_tokens_per_expert.view(w, local)  # [w, E/w]")],
        must_fail={"test_dispatch", "test_combine", "test_dispatcher_communication", *LAYER_CELLS},
        why="no count exchange: each rank assumes it receives from rank s what it sends to rank s",
    ),
    mutant(
        "permute_unstable_sort", "permutation",
        [("torch.argsort(expert_ids, stable=True)", "torch.argsort(expert_ids, stable=False)")],
        must_fail={"test_permute", "test_dispatch", "test_combine", *LAYER_CELLS},
        why="an unstable sort: the tokens of one expert come out of order (and unpermute's weights no longer match)",
    ),
    mutant(
        "probs_applied_twice", "permutation",
        [("permuted_tokens = permuted_tokens * permuted_probs.unsqueeze(-1)  # [N, h]",
          "permuted_tokens = permuted_tokens * permuted_probs.unsqueeze(-1) ** 2  # [N, h]")],
        must_fail={"test_unpermute", "test_combine", *LAYER_CELLS, "test_overlapped_moe_layer"},
        why="the probabilities are applied twice (squared)",
    ),
    mutant(
        "probs_never_applied", "dispatcher",
        [('output = unpermute(x, st["sorted_indices"], st["probs"], st["routing_map"])  # [T, h]',
          'output = unpermute(x, st["sorted_indices"], None, st["routing_map"])  # [T, h]')],
        must_fail={"test_combine", *LAYER_CELLS},
        why="combine sums the expert outputs without weighting them by the probabilities",
    ),
    mutant(
        "combine_wrong_positions", "dispatcher",
        [('x = sort_chunks_by_idxs(expert_output, counts.t().reshape(-1).tolist(), to_source_major)',
          'x = sort_chunks_by_idxs(expert_output, counts.reshape(-1).tolist(), to_source_major)')],
        must_fail={"test_combine", *LAYER_CELLS},
        why="combine cuts the expert-major rows with the source-major chunk sizes: outputs summed into wrong tokens",
    ),
    mutant(
        "a2a_backward_same_splits", "all_to_all",
        [("_AllToAll.apply(grad_output, ctx.input_split_sizes, ctx.output_split_sizes, ctx.group)",
          "_AllToAll.apply(grad_output, ctx.output_split_sizes, ctx.input_split_sizes, ctx.group)")],
        must_fail={"test_all_to_all", "test_combine", "test_dispatcher_communication", *LAYER_CELLS},
        why="the backward all-to-all reuses the forward's splits instead of swapping them",
    ),
    mutant(
        "router_probs_detached", "moe_layer",
        [("probs, routing_map = topk_router(logits, k=self.k)",
          "probs, routing_map = topk_router(logits.detach(), k=self.k)")],
        must_fail=set(LAYER_CELLS),
        why="the probabilities are computed from detached logits: the router learns only from the aux loss",
    ),
    mutant(
        "capacity_drops_highest", "token_dropping",
        [('scores = probs.detach().masked_fill(~routing_map, float("-inf"))',
          'scores = probs.detach().masked_fill(~routing_map, float("inf"))'),
         ("descending=True, stable=True", "descending=False, stable=True")],
        must_fail={"test_token_dropping", "test_moe_capacity", "test_overlapped_moe_layer"},
        why="capacity keeps the lowest-probability tokens (drops the highest)",
    ),
    mutant(
        "dispatch_source_major", "dispatcher",
        [("expert_input = sort_chunks_by_idxs(received, counts.reshape(-1).tolist(), to_expert_major)",
          "expert_input = received"),
         ('x = sort_chunks_by_idxs(expert_output, counts.t().reshape(-1).tolist(), to_source_major)',
          "x = expert_output")],
        must_fail={"test_dispatch", *LAYER_CELLS},
        why="local experts' rows left source-major: expert e gets other experts' tokens (the round trip still works)",
    ),
    # -- more ways to be wrong ---------------------------------------------------------
    mutant(
        "router_torch_topk", "router",
        [("top_indices = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]  # [T, k]",
          "top_indices = torch.topk(logits, k, dim=-1).indices  # [T, k]")],
        must_fail={"test_topk_router", "test_moe_layer", "test_overlapped_moe_layer"},
        why="torch.topk: ties are not broken toward the lower expert index",
    ),
    mutant(
        "router_probs_no_grad", "router",
        [("top_probs = torch.softmax(logits.gather(1, top_indices).to(compute_dtype), dim=-1)  # [T, k]",
          "top_probs = torch.softmax(logits.detach().gather(1, top_indices).to(compute_dtype), dim=-1)  # [T, k]")],
        must_fail={"test_topk_router", *LAYER_CELLS, "test_overlapped_moe_layer"},
        why="the router's probabilities are built from detached logits",
    ),
    mutant(
        "aux_loss_softmax_over_topk", "router",
        [("scores = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # [T, E]",
          "scores = topk_router(logits, k=k)[0]  # [T, E]")],
        must_fail={"test_load_balancing_loss", *LAYER_CELLS, "test_overlapped_moe_layer"},
        why="the aux loss uses the top-k probabilities instead of the softmax over all experts",
    ),
    mutant(
        "unpermute_overwrites", "permutation",
        [("return output.index_add(0, sorted_indices, permuted_tokens)",
          "return output.index_copy(0, sorted_indices, permuted_tokens)")],
        must_fail={"test_unpermute", "test_combine", *LAYER_CELLS, "test_overlapped_moe_layer"},
        why="the k copies of a token overwrite each other instead of being summed",
    ),
    mutant(
        "aux_counts_after_drop", "moe_layer",
        [("        aux_loss = load_balancing_loss(logits, routing_map, k=self.k)  # counts before any drop, as Megatron\n",
          ""),
         ("        expert_input, tokens_per_expert = self.token_dispatcher.dispatch(",
          "        aux_loss = load_balancing_loss(logits, routing_map, k=self.k)\n"
          "        expert_input, tokens_per_expert = self.token_dispatcher.dispatch(")],
        must_fail={"test_moe_capacity"},
        why="the aux loss counts the tokens after capacity drops (Megatron counts before)",
    ),
    mutant(
        "moe_global_rank", "moe_layer",
        [('size, rank = _group_size_rank(ep_group, "MoELayer")',
          'size, _ = _group_size_rank(ep_group, "MoELayer")\n        rank = dist.get_rank()')],
        must_fail={*LAYER_CELLS, "test_overlapped_moe_layer", "test_moe_overlap"},
        why="local experts chosen by the global rank: wrong on an EP group that is a subgroup",
    ),
    mutant(
        "capacity_unstable_sort", "token_dropping",
        [("descending=True, stable=True", "descending=True, stable=False")],
        must_fail={"test_token_dropping"},
        why="an unstable sort: among equal probabilities across the capacity cut the later token may be kept",
    ),
    mutant(
        "capacity_topk", "token_dropping",
        [("    order = torch.sort(scores, dim=0, descending=True, stable=True).indices  # [T, E]: token at each position\n"
          "    position = torch.empty_like(order).scatter_(\n"
          "        0, order, torch.arange(num_tokens, device=order.device).unsqueeze(1).expand(num_tokens, num_experts))\n"
          "    kept = routing_map & (position < capacity)  # [T, E]\n",
          "    top = torch.topk(scores, k=min(capacity, num_tokens), dim=0, sorted=False).indices  # Megatron's way\n"
          "    kept = routing_map & torch.zeros_like(routing_map).scatter(0, top, True)  # [T, E]\n")],
        must_fail={"test_token_dropping"},
        why="torch.topk over each expert's column, as Megatron: which of two equal probabilities it keeps is undefined",
    ),
    mutant(
        "dispatch_chunk_order_transposed", "dispatcher",
        [("to_expert_major = torch.arange(w * local).view(w, local).t()",
          "to_expert_major = torch.arange(w * local).view(local, w).t()"),
         ("to_source_major = torch.arange(local * w).view(local, w).t()",
          "to_source_major = torch.arange(local * w).view(w, local).t()")],
        must_fail={"test_dispatch", "test_combine", *LAYER_CELLS},
        why="the local expert order with the chunk grid's dimensions swapped: right only when w == E/w",
    ),
    mutant(
        "a2a_no_split_check", "all_to_all",
        [("    if sum(input_split_sizes) != input_.shape[0]:\n", "    if False:\n")],
        must_fail={"test_argument_errors"},
        why="input_split_sizes that do not cover the input are not rejected",
    ),
    # -- exercise 7: the overlapped layer ----------------------------------------------
    mutant(
        "overlap_waits_at_once", "moe_overlap",
        [("input_split_sizes=list(input_split_sizes), group=group, async_op=True)\n    return output, work",
          "input_split_sizes=list(input_split_sizes), group=group, async_op=True)\n    work.wait()\n"
          "    return output, work")],
        must_fail={"test_moe_overlap"},
        why="every all-to-all waited right after it is posted: the numbers are right, nothing overlaps",
        demo=True,
    ),
    mutant(
        "overlap_combine_waited_at_once", "moe_overlap",
        [("input_split_sizes=plan[\"recv\"], group=group))  # -> [N_send_j, h]\n",
          "input_split_sizes=plan[\"recv\"], group=group))  # -> [N_send_j, h]\n"
          "            if combined[-1][1] is not None:\n"
          "                combined[-1][1].wait()\n")],
        must_fail={"test_moe_overlap"},
        why="each half's combine waited before the other half's experts run: only the dispatch is hidden",
    ),
    mutant(
        "overlap_backward_waited_at_once", "moe_overlap",
        [("        home = {}\n",
          "        for _, work in arrived.values():\n"
          "            if work is not None:\n"
          "                work.wait()\n"
          "        home = {}\n")],
        must_fail={"test_moe_overlap"},
        why="in backward both combine-backward all-to-alls waited before any expert's backward: forward only overlaps",
    ),
    mutant(
        "overlap_completed_before_experts", "moe_overlap",
        [("input_split_sizes=list(input_split_sizes), group=group, async_op=True)\n    return output, work",
          "input_split_sizes=list(input_split_sizes), group=group, async_op=True)\n"
          "    work.get_future().wait()  # the rows are there before anything reads them\n"
          "    return output, work")],
        must_fail={"test_moe_overlap"},
        why="every all-to-all completed through its future as soon as it is posted, then .wait() called where the "
            "reference calls it: the ledger's waits are in place, nothing overlaps",
    ),
    mutant(
        "overlap_barrier_after_dispatch", "moe_overlap",
        [("                      for x, p in zip(rows, plans)]  # [N_send_j, h] -> [N_recv_j, h]\n",
          "                      for x, p in zip(rows, plans)]  # [N_send_j, h] -> [N_recv_j, h]\n"
          "        dist.barrier(group=group)  # every rank's rows have arrived\n")],
        must_fail={"test_overlapped_moe_layer", "test_moe_overlap"},
        why="a barrier after posting both dispatches: it waits for them (gloo's barrier waits for every collective "
            "in flight), so half 1's dispatch is over before half 0's experts start",
    ),
    mutant(
        "overlap_experts_before_wait", "moe_overlap",
        [("            if work is not None:\n"
          "                work.wait()\n"
          "            # The boundary (Megatron's ScheduleNode): autograd stops here, backward() picks up from here.\n"
          "            received = received.detach().requires_grad_()\n"
          "            with torch.enable_grad():\n"
          "                out = experts_on_received(local_experts, received, plan)\n",
          "            # The boundary (Megatron's ScheduleNode): autograd stops here, backward() picks up from here.\n"
          "            received = received.detach().requires_grad_()\n"
          "            with torch.enable_grad():\n"
          "                out = experts_on_received(local_experts, received, plan)\n"
          "            if work is not None:\n"
          "                work.wait()\n")],
        must_fail={"test_overlapped_moe_layer", "test_moe_overlap"},
        why="each half's experts run on its receive buffer before its dispatch is waited: a race that a fast "
            "machine usually wins",
    ),
    mutant(
        "overlap_backward_experts_before_wait", "moe_overlap",
        [("            if work is not None:\n"
          "                work.wait()\n"
          "            # The experts' backward: the input gradient, and the weight gradients into .grad.\n"
          "            torch.autograd.backward(ctx.outputs[j], grad_out)\n",
          "            # The experts' backward: the input gradient, and the weight gradients into .grad.\n"
          "            torch.autograd.backward(ctx.outputs[j], grad_out)\n"
          "            if work is not None:\n"
          "                work.wait()\n")],
        must_fail={"test_overlapped_moe_layer", "test_moe_overlap"},
        why="in backward each half's experts' backward runs on the output gradient before its all-to-all is waited",
    ),
    mutant(
        "overlap_halves_recombined_swapped", "moe_overlap",
        [("return torch.cat(outs).to(hidden_states.dtype), aux_loss",
          "return torch.cat(outs[::-1]).to(hidden_states.dtype), aux_loss")],
        must_fail={"test_overlapped_moe_layer"},
        why="the two halves' outputs concatenated in the wrong order",
    ),
    mutant(
        "overlap_no_weight_grads", "moe_overlap",
        [("torch.autograd.backward(ctx.outputs[j], grad_out)",
          "ctx.received[j].grad = torch.autograd.grad(ctx.outputs[j], ctx.received[j], grad_out)[0]")],
        must_fail={"test_overlapped_moe_layer"},
        why="the experts' backward by torch.autograd.grad w.r.t. their input only: no weight gradients",
    ),
    mutant(
        "overlap_capacity_per_half", "moe_overlap",
        [("        if self.capacity_factor is not None:  # capacity per source rank, over all T tokens (as MoELayer)\n"
          "            probs, routing_map = apply_router_token_dropping(probs, routing_map, k=self.k,\n"
          "                                                             capacity_factor=self.capacity_factor)\n",
          "        if self.capacity_factor is not None:  # the capacity of each half\n"
          "            dropped = [apply_router_token_dropping(p, m, k=self.k, capacity_factor=self.capacity_factor)\n"
          "                       for p, m in zip(probs.tensor_split(2), routing_map.tensor_split(2))]\n"
          "            probs, routing_map = torch.cat([p for p, _ in dropped]), torch.cat([m for _, m in dropped])\n")],
        must_fail={"test_overlapped_moe_layer"},
        why="tokens dropped per half (capacity of T/2 tokens) instead of over the rank's T tokens",
    ),
]

# Different but correct edits: they must pass every cell (a check that fails one of them is wrong).
VARIANTS = [
    mutant(
        "overlap_backward_half0_first", "moe_overlap",
        [("order = (1, 0)  # the last half of forward comes back first", "order = (0, 1)")],
        must_fail=set(),
        why="the backward runs half 0 first: the mirror is not required, only that each all-to-all is hidden",
    ),
]

MUTANTS += VARIANTS
