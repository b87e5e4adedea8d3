"""Plausible wrong implementations of assignment 06 (the capstone), kept as tests.

Each mutant edits one answer cell of source/06_composition/composition_lab.ipynb;
`must_fail` is exactly the set of graded cells it fails (tests/test_composition_notebook.py
runs them). The demo mutant (`make demo`) counts the norm scales once per TP rank in the
gradient norm: partial credit, the norm and the clipped training both wrong.
"""

from solutions.submissions import mutant

MUTANTS = [
    # -- exercise 1: rank_layout ------------------------------------------------------
    mutant(
        "layout_outer_dimension_fastest", "rank_layout",
        [("offsets = [o + i * strides[d] for i in range(sizes[d]) for o in offsets]",
          "offsets = [o + i * strides[d] for o in offsets for i in range(sizes[d])]")],
        must_fail={"test_rank_layout", "test_rank_layout_expert"},
        why="groups and ranks enumerated with the last dimension varying fastest: the right sets, "
            "in an order that is not Megatron's",
    ),
    mutant(
        "layout_no_pp_last_rule", "rank_layout",
        [("if moe and not (order.lower().endswith(\"pp\") or pp == 1 or edp == dp):",
          "if False:")],
        must_fail={"test_rank_layout_errors"},
        why="an order that does not end in pp accepted while attention and experts have different DP sizes",
    ),
    mutant(
        "layout_dp_ignores_cp", "rank_layout",
        [("        dp = world_size // model\n", "        dp = world_size // (tp * pp)\n")],
        must_fail={"test_rank_layout", "test_rank_layout_expert"},
        why="the default DP size left CP out (world / (tp * pp)): right without CP, wrong groups with it",
    ),
    mutant(
        "layout_embedding_pair_at_pp1", "rank_layout",
        [('layout["embedding"] = [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in layout["pp"]]',
          'layout["embedding"] = [[g[0], g[-1]] for g in layout["pp"]]')],
        must_fail={"test_rank_layout"},
        why="the embedding group of a one-stage pipeline as [r, r] (first and last rank, the same one): "
            "Megatron's is [r]",
    ),
    mutant(
        "layout_dense_order_rejected", "rank_layout",
        [("moe = ep > 1 or etp != tp  # a dense model", "moe = True  # a dense model")],
        must_fail={"test_rank_layout"},
        why="Megatron's expert-order checks applied to a dense model too: the course's order tp-cp-pp-dp "
            "with CP and PP rejected",
    ),
    # -- exercise 2: groups and mesh ----------------------------------------------------
    mutant(
        "groups_my_group_first", "process_groups",
        [("for ranks in layout[name]:", "for ranks in sorted(layout[name], key=lambda g: rank not in g):")],
        must_fail={"test_process_groups"},
        why="each rank creates its own group of a dimension first: ranks call new_group in different "
            "orders and hang (reported with every rank's line, in seconds)",
    ),
    mutant(
        "mesh_not_reversed", "process_groups",
        [("names = tuple(reversed(tokens))  # outermost first", "names = tuple(tokens)  # outermost first")],
        must_fail={"test_device_mesh"},
        why="the order's tokens taken as the mesh's dimensions as they are: the DeviceMesh's last "
            "dimension is its innermost, so TP and DP swap places",
    ),
    # -- exercise 3: data ------------------------------------------------------------------
    mutant(
        "batch_by_global_rank", "local_batch",
        [('d, D = _mesh_coordinate(mesh, "dp")',
          'D = _mesh_coordinate(mesh, "dp")[1]\n    d = dist.get_rank() % D')],
        must_fail={"test_local_batch", "test_dp_tp_training", "test_pipeline_training"},
        why="the DP slice picked with the global rank: the ranks of a TP group get different data",
    ),
    mutant(
        "batch_cp_contiguous", "local_batch",
        [("positions = torch.cat([chunks[c], chunks[2 * C - 1 - c]])", "positions = positions.chunk(C)[c]")],
        must_fail={"test_local_batch"},
        why="contiguous CP chunks instead of Megatron's zigzag: the last CP rank does all the causal work",
    ),
    # -- exercises 4-5: TP plan and FSDP ---------------------------------------------------------
    mutant(
        "tp_colwise_rowwise_swapped", "tensor_parallel",
        [('"feed_forward.w1": ColwiseParallel(),', '"feed_forward.w1": RowwiseParallel(),'),
         ('"feed_forward.w3": ColwiseParallel(),', '"feed_forward.w3": RowwiseParallel(),'),
         ('"feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),',
          '"feed_forward.w2": ColwiseParallel(output_layouts=Shard(1)),')],
        must_fail={"test_tensor_parallel_plan"},
        why="the MLP's plan with ColwiseParallel and RowwiseParallel swapped: DTensor redistributes, so the "
            "numbers stay right (training passes), but the weights are sharded the other way and forward "
            "all-reduces the [b, s, ffn] activation",
    ),
    mutant(
        "tp_head_left_untied", "tensor_parallel",
        [("model.output.weight = model.tok_embeddings.weight  # parallelize_module untied them",
          "pass  # parallelize_module untied them")],
        must_fail={"test_tensor_parallel_plan", "test_dp_tp_training"},
        why="the head not tied again after parallelize_module: two parameters that drift apart",
    ),
    mutant(
        "fsdp_root_only", "fsdp",
        [("        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)\n", "        pass\n")],
        must_fail={"test_dp_tp_training"},
        why="fully_shard on the root only: right numbers, but the whole model is one FSDP unit "
            "(all of it gathered at once)",
    ),
    # -- exercise 6: the loss ------------------------------------------------------------------------
    mutant(
        "logged_loss_averaged_twice", "losses",
        [("dist.all_reduce(local, op=dist.ReduceOp.AVG, group=dp_group)",
          "dist.all_reduce(local, op=dist.ReduceOp.AVG, group=dp_group)\n    local = local / dp_group.size()")],
        must_fail={"test_loss_averaging", "test_pipeline_training"},
        why="the logged loss averaged over the DP ranks twice",
    ),
    mutant(
        "loss_divided_by_world", "losses",
        [("return F.cross_entropy(logits.flatten(0, 1), labels.flatten())",
          "return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) / dist.get_world_size()")],
        must_fail={"test_loss_averaging", "test_pipeline_training"},
        why="the micro-batch loss divided by the number of ranks, although FSDP already averages over DP",
    ),
    # -- exercise 7: the tied embedding -----------------------------------------------------------------
    mutant(
        "tied_grads_allreduce_a_copy", "tied_embedding",
        [("local = grad.to_local() if isinstance(grad, DTensor) else grad",
          "local = grad.full_tensor() if isinstance(grad, DTensor) else grad.clone()")],
        must_fail={"test_tied_embedding_grads", "test_pipeline_training"},
        why="the all-reduce sums a gathered copy that is then dropped: each stage updates its copy of the "
            "tied weight with its own half of the gradient",
    ),
    # -- exercise 8: clipping ------------------------------------------------------------------------------
    mutant(
        "norm_replicas_counted_t_times", "clip_grad_norm",
        [("replica = any(isinstance(pl, Replicate) and c != 0 for pl, c in zip(grad.placements, coordinate))",
          "replica = False")],
        must_fail={"test_clip_grad_norm", "test_pipeline_training"},
        why="replicated norm scales summed on every TP rank: counted t times in the norm",
        demo=True,
    ),
    mutant(
        "clip_per_stage", "clip_grad_norm",
        [("dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=pp_group)  # + the other stages",
          "pass  # + the other stages")],
        must_fail={"test_clip_grad_norm", "test_pipeline_training"},
        why="each pipeline stage clipped by its own norm (what clip_grad_norm_ on a stage returns)",
    ),
    mutant(
        "tied_copy_counted_twice", "clip_grad_norm",
        [('if getattr(p, "shared", False) or replica:', "if replica:")],
        must_fail={"test_clip_grad_norm", "test_pipeline_training"},
        why="the tied head's copy on the last stage counted in the norm as well as the embedding",
    ),
    # -- exercise 9: the pipeline ------------------------------------------------------------------------
    mutant(
        "pipeline_layers_interleaved", "pipeline",
        [("keep = {str(i) for i in range(pp_rank * per_stage, (pp_rank + 1) * per_stage)}",
          "keep = {str(i) for i in range(pp_rank, n_layers, pp_size)}")],
        must_fail={"test_pipeline_training"},
        why="layers dealt round-robin to the stages (0, 2 | 1, 3): the stages run the layers out of order",
    ),
    # -- exercises 10-12: the planner -----------------------------------------------------------------
    mutant(
        "memory_zero_over_dp_only", "planner_memory",
        [("d = layout.dp * layout.cp", "d = layout.dp")],
        must_fail={"test_memory_per_gpu", "test_best_layouts"},
        why="ZeRO shards over the DP ranks only, although the CP ranks hold the same weights",
    ),
    mutant(
        "memory_every_microbatch_in_flight", "planner_memory",
        [("in_flight = min(layout.pp - s, m)", "in_flight = m")],
        must_fail={"test_memory_per_gpu", "test_plan_published", "test_best_layouts"},
        why="every micro-batch kept in flight (GPipe's memory), not 1F1B's min(pp - stage, m): a published "
            "layout no longer fits",
    ),
    mutant(
        "memory_in_flight_ignores_microbatches", "planner_memory",
        [("in_flight = min(layout.pp - s, m)", "in_flight = layout.pp - s")],
        must_fail={"test_memory_per_gpu"},
        why="1F1B's pp - stage micro-batches in flight even when a step has fewer micro-batches than stages",
    ),
    mutant(
        "time_bubble_over_pp", "planner_time",
        [("bubble = compute * (layout.pp - 1) / m", "bubble = compute * (layout.pp - 1) / layout.pp")],
        must_fail={"test_step_time", "test_best_layouts"},
        why="the bubble as a fraction of the stages, not of the micro-batches",
    ),
    mutant(
        "time_tp_recompute_forgotten", "planner_time",
        [("count = 4 + 6 + (4 if full else 0)", "count = 4 + 6")],
        must_fail={"test_step_time"},
        why="full recomputation's forward left out of TP's collectives (10 per layer, not 14)",
    ),
    mutant(
        "time_microbatch_one", "planner_time",
        [("s, b, act = training.seq_len, layout.micro_batch, training.activation_bytes",
          "s, b, act = training.seq_len, 1, training.activation_bytes")],
        must_fail={"test_step_time"},
        why="TP, CP and PP volumes computed for a micro-batch of one sequence whatever the layout's micro-batch",
    ),
    mutant(
        "time_tp_whole_sequence", "planner_time",
        [("vol = tp_layer_bytes(s // layout.cp, b, model.hidden", "vol = tp_layer_bytes(s, b, model.hidden")],
        must_fail={"test_step_time", "test_best_layouts"},
        why="TP's collectives sized for the whole sequence, although a CP rank holds s / cp of it",
    ),
    mutant(
        "time_cp_link_in_node", "planner_time",
        [("cp_total = m * layers * sends * transfer_seconds(block, link(\"cp\"))",
          "cp_total = m * layers * sends * transfer_seconds(block, node.nvlink)")],
        must_fail={"test_step_time", "test_best_layouts"},
        why="the CP ring always on NVLink, even when its group (stride tp) leaves the node",
    ),
    mutant(
        "time_dp_over_dp_only", "planner_time",
        [("    d = layout.dp * layout.cp\n    dp_total = dp = 0.0", "    d = layout.dp\n    dp_total = dp = 0.0")],
        must_fail={"test_step_time", "test_best_layouts"},
        why="DP traffic over the DP ranks only: with DP 1 and CP 2 the gradients are never reduced across CP",
    ),
    mutant(
        "time_pp_link_in_node", "planner_time",
        [('pp = 2 * m * transfer_seconds(one, link("pp"))', "pp = 2 * m * transfer_seconds(one, node.nvlink)")],
        must_fail={"test_step_time", "test_best_layouts"},
        why="pipeline sends always on NVLink, even when the pipeline group (stride tp x cp) leaves the node",
    ),
    mutant(
        "time_dp_share_one_third", "planner_time",
        [("share = 1 / 4 if full else 1 / 3", "share = 1 / 3")],
        must_fail={"test_step_time"},
        why="DP's collectives hidden behind a third of a micro-batch's compute with full recompute too (the "
            "forward is then half of the backward's compute: a quarter of the micro-batch)",
    ),
    mutant(
        "time_zero3_all_hidden", "planner_time",
        [("dp = max(0.0, dp_total - compute)", "dp = 0.0")],
        must_fail={"test_step_time", "test_best_layouts"},
        why="ZeRO-3's traffic taken as always hidden, even when it exceeds the whole step's compute",
    ),
    mutant(
        "plan_mfu_counts_recompute", "planner_search",
        [("model_flops = training.global_batch * training.seq_len * model.flops_per_token(training.seq_len)",
          "model_flops = training.global_batch * training.seq_len * model.flops_per_token(training.seq_len) * (\n"
          "        4 / 3 if layout.recompute == \"full\" else 1)")],
        must_fail={"test_plan_published"},
        why="the recomputed forward counted as model FLOPs: hardware utilisation, not MFU",
    ),
    mutant(
        "plan_no_layers_rule", "planner_search",
        [("    if layout.pp > model.n_layers:\n", "    if False:\n")],
        must_fail={"test_plan_published"},
        why="more pipeline stages than layers not rejected",
    ),
    mutant(
        "plan_mfu_compute_only", "planner_search",
        [('mfu = model_flops / (time["total"] * cluster.num_gpus * cluster.node.peak_flops)',
          'mfu = model_flops / (time["compute"] * cluster.num_gpus * cluster.node.peak_flops)')],
        must_fail={"test_plan_published"},
        why="MFU over the compute time alone: the bubble and exposed communication left out",
    ),
    mutant(
        "plan_batch_ignores_micro_batch", "planner_search",
        [("if layout.microbatches(training) < 1 or training.global_batch % (layout.dp * layout.micro_batch):",
          "if training.global_batch % layout.dp:")],
        must_fail={"test_plan_published", "test_best_layouts"},
        why="the batch rule divides the global batch by DP only: micro-batches that do not fit a DP rank's share "
            "are not rejected",
    ),
    mutant(
        "best_layouts_micro_batch_ignored", "planner_search",
        [("layout = Layout(tp=tp, cp=cp, pp=pp, dp=rest // pp, zero=zero, recompute=rc,\n"
          "                                        micro_batch=micro_batch)",
          "layout = Layout(tp=tp, cp=cp, pp=pp, dp=rest // pp, zero=zero, recompute=rc)")],
        must_fail={"test_best_layouts"},
        why="the candidates are built with the default micro-batch of one sequence, whatever micro_batch says",
    ),
    mutant(
        "best_layouts_cp_below_32", "planner_search",
        [("for cp in (x for x in powers if x <= 32):", "for cp in (x for x in powers if x < 32):")],
        must_fail={"test_best_layouts"},
        why="CP searched up to 16 only (\"up to 32\" read as exclusive): long-context runs lose their best layout",
    ),
    mutant(
        "best_layouts_cp_within_a_node", "planner_search",
        [("for cp in (x for x in powers if x <= 32):", "for cp in (x for x in powers if x <= cluster.node.gpus):")],
        must_fail={"test_best_layouts"},
        why="CP sizes searched only up to a node's GPUs (the course's space goes to 32)",
    ),
    mutant(
        "best_layouts_least_memory_first", "planner_search",
        [('found.sort(key=lambda p: (p.time["total"], p.memory["total"]))',
          'found.sort(key=lambda p: (p.memory["total"], p.time["total"]))')],
        must_fail={"test_best_layouts"},
        why="candidates ranked by memory instead of step time",
    ),
    # -- exercise 13: the checkpoint's keys ---------------------------------------------
    mutant(
        "ckpt_tied_copy_own_key", "checkpoint_state",
        [('        if name == "output.weight" and stage_module.tok_embeddings is None:\n'
          '            name = "tok_embeddings.weight"  # the head\'s copy of the tied embedding: one key for both\n', "")],
        must_fail={"test_checkpoint_state"},
        why="the last stage's head copy saved under its own name, model.output.weight: a checkpoint written "
            "with one stage (where the head is the embedding) has no such key, and a pipeline cannot load it",
    ),
    mutant(
        "ckpt_local_shards", "checkpoint_state",
        [('        state[f"model.{name}"] = param\n', '        state[f"model.{name}"] = param.to_local()\n')],
        must_fail={"test_checkpoint_state"},
        why="each rank's local shard instead of the DTensor: DCP takes it for the whole tensor (every rank "
            "writes a different 'whole' tensor under one key) and loads into a copy",
    ),
    mutant(
        "ckpt_no_optimizer_state", "checkpoint_state",
        [('            state[f"optim.{name}.{key}"] = value\n', '            pass\n')],
        must_fail={"test_checkpoint_state"},
        why="the model only: a resumed run restarts AdamW from zero moments and step 0 (other losses)",
    ),
]
