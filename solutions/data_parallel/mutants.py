"""Plausible wrong submissions of assignment 01 (data parallelism), kept as tests.

Each mutant edits one reference answer cell; `must_fail` is exactly the set of
graded cells it fails (tests/test_data_parallel_notebook.py checks both
directions: every cell of `must_fail` fails with a readable message, and in
the full sweep no other cell does). `VARIANTS` are different but correct
edits with an empty `must_fail`: they must pass every cell (a check that fails
them is wrong); they are part of MUTANTS, so every sweep grades them too.
"""

from solutions.submissions import mutant

ZERO_CELLS = {"test_zero_matches_optimizer", "test_zero_rounding", "test_zero_state_sharded", "test_zero_comm"}

MUTANTS = [
    # -- exercise 1 --------------------------------------------------------------------
    mutant("average_forgotten", "all_reduce_gradients",
           [("        param.grad.div_(world_size)\n", "")],
           must_fail={"test_all_reduce_gradients"},
           why="all-reduce SUM without dividing by the group size: the sum, not the mean, of the gradients",
           demo=True),
    # -- exercise 2 --------------------------------------------------------------------
    mutant("no_rank0_broadcast", "bucketed_ddp",
           [("        broadcast_module_states(module, group=group)\n", "")],
           must_fail={"test_ddp_broadcast"},
           why="BucketedDDP forgets to broadcast rank 0's parameters: replicas start (and stay) different"),
    mutant("bucket_closes_above_cap", "bucketed_ddp",
           [("            if size >= cap_bytes:", "            if size > cap_bytes:")],
           must_fail={"test_ddp_buckets"},
           why="a bucket closes only once it holds MORE than the cap (DDP: at least the cap)"),
    mutant("bucket_cap_in_mb", "bucketed_ddp",
           [("cap_bytes = bucket_cap_mb * 2**20", "cap_bytes = bucket_cap_mb * 10**6")],
           must_fail={"test_ddp_buckets"},
           why="the cap read as MB (10**6 bytes) instead of MiB (2**20 bytes)"),
    mutant("bucket_ignores_dtype", "bucketed_ddp",
           [("            if bucket and param.dtype != bucket[0].dtype:  # one dtype per bucket (DDP keys buckets by dtype)\n"
             "                self.buckets.append(bucket)\n"
             "                bucket, size = [], 0\n", "")],
           must_fail={"test_ddp_buckets"},
           why="parameters of two dtypes share a bucket: torch.cat promotes, one all-reduce in the wider dtype"),
    mutant("buckets_launched_after_backward", "bucketed_ddp",
           [("        if not self._require_sync:\n            return\n        if not self._callback_queued:",
             "        return\n        if not self._callback_queued:"),
            ("        for index, (work, flat) in enumerate(self._works):",
             "        self._launch_remaining()\n        for index, (work, flat) in enumerate(self._works):")],
           must_fail={"test_ddp_buckets", "test_ddp_no_sync"},
           why="every bucket all-reduced in finish_gradient_synchronization(): right numbers, no overlap at all"),
    mutant("buckets_launched_at_end_of_backward", "bucketed_ddp",
           [("        while self._next_bucket < len(self.buckets) and self._pending[self._next_bucket] == 0:\n"
             "            self._launch(self._next_bucket)\n", "")],
           must_fail={"test_ddp_buckets"},
           why="full buckets wait for the end-of-backward callback: in backward, but after all computation"),
    mutant("grads_written_before_wait", "bucketed_ddp",
           [("            if work is not None:\n                work.wait()\n            self._copy_back(index, flat)",
             "            self._copy_back(index, flat)\n            if work is not None:\n                work.wait()")],
           must_fail={"test_ddp_gradients"},
           why="the bucket is copied into .grad before its async all-reduce has finished"),
    mutant("no_sync_ignored", "bucketed_ddp",
           [("        self._require_sync = False\n", "")],
           must_fail={"test_ddp_no_sync"},
           why="no_sync() does not stop the hooks: every micro-step all-reduces"),
    # -- exercise 3 --------------------------------------------------------------------
    mutant("zero2_gradients_replicated", "zero_bytes_per_param",
           [("2: p + (g + o) / d", "2: p + g + o / d")],
           must_fail={"test_zero_bytes_per_param"},
           why="stage 2 costed like stage 1: the gradients are sharded too"),
    # -- exercise 4 --------------------------------------------------------------------
    mutant("zero_full_state_every_rank", "zero_sharded_optimizer",
           [("lo, hi = rank * self.shard_size, (rank + 1) * self.shard_size", "lo, hi = 0, self.padded_size"),
            ("            dist.reduce_scatter_single(shard_grad, flat_grad, op=dist.ReduceOp.SUM, group=self.group)",
             "            dist.all_reduce(flat_grad, op=dist.ReduceOp.SUM, group=self.group)\n"
             "            shard_grad = flat_grad"),
            ("shard_grad = torch.empty(self.shard_size,", "shard_grad = torch.empty(self.padded_size,"),
            ("shard_param = torch.zeros(self.shard_size,", "shard_param = torch.zeros(self.padded_size,"),
            ("            dist.all_gather_single(flat_param, shard_param, group=self.group)",
             "            flat_param.copy_(shard_param)")],
           must_fail={"test_zero_state_sharded", "test_zero_comm"},
           why="plain DDP + the optimizer: all-reduce, then every rank updates every parameter and keeps all the state"),
    mutant("zero_padding_dropped", "zero_sharded_optimizer",
           [("self.shard_size = -(-total // self.world_size)", "self.shard_size = total // self.world_size")],
           must_fail=ZERO_CELLS,
           why="shard size rounded down: when d does not divide the parameter count the tail is lost"),
    mutant("zero_gradient_not_averaged", "zero_sharded_optimizer",
           [("            shard_grad.div_(self.world_size)\n", "")],
           must_fail={"test_zero_matches_optimizer", "test_zero_rounding"},
           why="reduce-scatter SUM without dividing: d times the gradient (Adam nearly hides it, SGD does not)"),
    mutant("zero_lr_schedule_ignored", "zero_sharded_optimizer",
           [("            inner.update({k: v for k, v in outer.items() if k != \"params\"})\n",
             "            pass  # the hyperparameters were copied in the constructor\n")],
           must_fail={"test_zero_matches_optimizer", "test_zero_rounding"},
           why="hyperparameters copied once: a learning-rate schedule written to param_groups is ignored"),
    mutant("zero_missing_grad_as_zero", "zero_sharded_optimizer",
           [("piece.grad = None if param.grad is None else shard_grad", "piece.grad = shard_grad")],
           must_fail={"test_zero_matches_optimizer", "test_zero_rounding"},
           why="a parameter without gradient stepped with zeros: weight decay and momentum still move it"),
    mutant("zero_one_param_group", "zero_sharded_optimizer",
           [("self.optimizer = optimizer_class(inner_groups, **defaults)",
             "self.optimizer = optimizer_class([p for g in inner_groups for p in g[\"params\"]], **defaults)")],
           must_fail={"test_zero_matches_optimizer"},
           why="all owned pieces in one inner parameter group: every group gets the first group's lr and weight decay"),
    mutant("zero_master_in_float64", "zero_sharded_optimizer",
           [("                    if param.dtype not in (torch.float32, torch.float64):\n"
             "                        view = view.float()  # an fp32 master copy of the piece\n",
             "                    view = view.double()  # more precision is better?\n")],
           must_fail={"test_zero_rounding", "test_zero_state_sharded"},
           why="float64 master copies of float32 parameters: float64 state, and not torch's float32 rounding"),
    # -- exercise 5 --------------------------------------------------------------------
    mutant("fsdp_gradient_summed", "fully_shard",
           [("        shard.div_(self.world_size)\n", "")],
           must_fail={"test_fsdp_numerics", "test_fsdp_mixed_precision"},
           why="reduce-scatter SUM without averaging: shard gradients d times too large"),
    mutant("fsdp_autograd_keeps_full_param", "fully_shard",
           [("        if self.reshard_after_forward:  # autograd must not keep the gathered buffer alive",
             "        if False:  # autograd must not keep the gathered buffer alive")],
           must_fail={"test_fsdp_comm", "test_fsdp_memory"},
           why="the gathered buffer dropped by the module but saved by autograd: alive until backward, "
               "no second all-gather, ZeRO-2 memory"),
    mutant("fsdp_reshard_flag_ignored", "fully_shard",
           [("        if self.reshard_after_forward:  # autograd must not keep the gathered buffer alive",
             "        if True:  # autograd must not keep the gathered buffer alive")],
           must_fail={"test_fsdp_comm"},
           why="reshard_after_forward=False ignored: the parameters are gathered again in backward anyway"),
    mutant("fsdp_full_kept_after_forward", "fully_shard",
           [("        self.full = None  # with reshard_after_forward=False", "        pass  # with reshard_after_forward=False")],
           must_fail={"test_fsdp_memory"},
           why="the unit keeps a reference to the gathered buffer after forward: it is never resharded"),
    mutant("fsdp_regathered_never_freed", "fully_shard",
           [("        unit.regathered = None  # post-backward", "        pass  # post-backward")],
           must_fail={"test_fsdp_memory", "test_fsdp_numerics"},
           why="the buffer gathered again for backward stays alive after the reduce-scatter: memory, and the "
               "next step's backward reuses last step's parameters"),
    mutant("fsdp_gather_ignores_param_dtype", "fully_shard",
           [("        dtype = self.mp_policy.param_dtype or flat_shard.dtype\n",
             "        dtype = flat_shard.dtype\n")],
           must_fail={"test_fsdp_mixed_precision"},
           why="the parameters all-gathered (and computed) in float32 while the inputs are cast to param_dtype"),
    mutant("fsdp_reduce_in_param_dtype", "fully_shard",
           [("        dtype = self.mp_policy.reduce_dtype or grad_full.dtype\n", "        dtype = grad_full.dtype\n")],
           must_fail={"test_fsdp_mixed_precision"},
           why="gradients reduce-scattered in bfloat16 (the compute dtype) instead of reduce_dtype"),
    mutant("fsdp_master_in_param_dtype", "fully_shard",
           [("self.flat_param = nn.Parameter(flat[rank * self.shard_size:(rank + 1) * self.shard_size].clone())",
             "self.flat_param = nn.Parameter(flat[rank * self.shard_size:(rank + 1) * self.shard_size].clone().to(\n"
             "                self.mp_policy.param_dtype or flat.dtype))")],
           must_fail={"test_fsdp_mixed_precision"},
           why="the sharded master weights kept in bfloat16: small updates round away"),
    mutant("fsdp_shard_is_a_view", "fully_shard",
           [("self.flat_param = nn.Parameter(flat[rank * self.shard_size:(rank + 1) * self.shard_size].clone())",
             "self.flat_param = nn.Parameter(flat[rank * self.shard_size:(rank + 1) * self.shard_size])")],
           must_fail={"test_fsdp_memory"},
           why="the shard is a view of the full flat buffer: right numbers, but every rank keeps the whole buffer"),
    mutant("fsdp_inputs_not_cast", "fully_shard",
           [("        if dtype is not None:  # FSDP2 MixedPrecisionPolicy.cast_forward_inputs",
             "        if False:  # FSDP2 MixedPrecisionPolicy.cast_forward_inputs")],
           must_fail={"test_fsdp_mixed_precision"},
           why="float inputs not cast to param_dtype: a float32 input meets bfloat16 weights"),
    mutant("gather_full_params_one_name_per_tied", "fully_shard",
           [("        for (_, _, name), index in zip(unit.slots, unit.layout.slot_index):\n"
             "            result[prefix",
             "        for (_, _, name), index in list(zip(unit.slots, unit.layout.slot_index))[:len(views)]:\n"
             "            result[prefix")],
           must_fail={"test_gather_full_params"},
           why="gather_full_params lists each distinct parameter once: a tied weight loses its second name"),
]

VARIANTS = [
    mutant("zero_padded_to_lcm_128", "zero_sharded_optimizer",
           [("self.shard_size = -(-total // self.world_size)  # ceil: pad the buffer to a multiple of d",
             "multiple = __import__('math').lcm(self.world_size, 128)  # Megatron's pad_bucket_end\n"
             "        self.shard_size = -(-total // multiple) * multiple // self.world_size")],
           must_fail=set(),
           why="padding to lcm(d, 128) as Megatron does: correct, a larger multiple of d"),
    mutant("fsdp_padded_to_lcm_128", "fully_shard",
           [("self.layout = FlatLayout(slots, self.world_size)  # padded to a multiple of d",
             "self.layout = FlatLayout(slots, __import__('math').lcm(self.world_size, 128))  # Megatron's padding")],
           must_fail=set(),
           why="each unit padded to lcm(d, 128): correct, a larger multiple of d"),
]

MUTANTS += VARIANTS
