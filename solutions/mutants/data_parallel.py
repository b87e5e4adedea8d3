"""Plausible wrong submissions of assignment 01 (data parallelism), kept as tests.

Each mutant edits one reference answer cell; `must_fail` lists the graded
cells that must catch it (tests/test_data_parallel_notebook.py checks both
directions for the demo mutant: it fails those and passes others).
"""

from solutions.mutants import mutant

MUTANTS = [
    mutant("average_forgotten", "all_reduce_gradients",
           [("        param.grad.div_(world_size)\n", "")],
           must_fail={"test_all_reduce_gradients"},
           why="all-reduce SUM without dividing by the group size: the sum, not the mean, of the gradients",
           demo=True),
    mutant("no_rank0_broadcast", "bucketed_ddp",
           [("        broadcast_module_states(module, group=group)\n", "")],
           must_fail={"test_ddp_broadcast"},
           why="BucketedDDP forgets to broadcast rank 0's parameters: replicas start (and stay) different"),
    mutant("buckets_launched_after_backward", "bucketed_ddp",
           [("        if not self._require_sync:\n            return\n        if not self._callback_queued:",
             "        return\n        if not self._callback_queued:"),
            ("        for index, (work, flat) in enumerate(self._works):",
             "        self._launch_remaining()\n        for index, (work, flat) in enumerate(self._works):")],
           must_fail={"test_ddp_buckets"},
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
    mutant("zero_full_state_every_rank", "zero_sharded_optimizer",
           [("lo, hi = rank * self.shard_size, (rank + 1) * self.shard_size", "lo, hi = 0, self.padded_size"),
            ("            dist.reduce_scatter_single(shard_grad, flat_grad, op=dist.ReduceOp.SUM, group=self.group)",
             "            dist.all_reduce(flat_grad, op=dist.ReduceOp.SUM, group=self.group)\n"
             "            shard_grad = flat_grad"),
            ("shard_param = torch.zeros(self.shard_size,", "shard_param = torch.zeros(self.padded_size,"),
            ("            dist.all_gather_single(flat_param, shard_param, group=self.group)",
             "            flat_param.copy_(shard_param)")],
           must_fail={"test_zero_state_sharded", "test_zero_comm"},
           why="plain DDP + AdamW: all-reduce, then every rank updates every parameter and keeps all the state"),
    mutant("zero_padding_dropped", "zero_sharded_optimizer",
           [("self.shard_size = -(-total // self.world_size)", "self.shard_size = total // self.world_size")],
           must_fail={"test_zero_matches_adamw", "test_zero_rounding", "test_zero_comm"},
           why="shard size rounded down: when d does not divide the parameter count the tail is lost"),
    mutant("adamw_first_moment_without_lerp", "adamw_update",
           [('    state["exp_avg"].lerp_(grad, 1 - beta1)\n',
             '    state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)\n')],
           must_fail={"test_zero_rounding"},
           why="the first moment as mul_/add_ instead of torch's lerp_: equal in exact arithmetic, not in float32"),
    mutant("fsdp_keeps_full_param", "fully_shard",
           [("        full.untyped_storage().resize_(0)  # free the gathered parameters now (FSDPParam.free_storage)\n",
             "        ctx.full = full  # keep the gathered parameters for backward\n"),
            ("        full = torch.empty(flat_shard.numel() * world_size, dtype=flat_shard.dtype, device=flat_shard.device)\n"
             "        dist.all_gather_single(full, flat_shard, group=ctx.group)  # [padded/d] -> [padded], gathered again\n",
             "        full = ctx.full\n")],
           must_fail={"test_fsdp_frees", "test_fsdp_comm"},
           why="the gathered full parameters stay alive from forward to backward (no re-gather): no memory saved"),
    mutant("fsdp_gradient_summed", "fully_shard",
           [("        grad_shard.div_(world_size)\n", "")],
           must_fail={"test_fsdp_numerics"},
           why="reduce-scatter SUM without averaging: shard gradients d times too large"),
]
