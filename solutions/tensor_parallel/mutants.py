"""Plausible wrong implementations of assignment 02 (tensor/sequence parallelism), kept as tests.

Each mutant edits one answer cell of source/02_tensor_parallel/tensor_parallel_lab.ipynb;
`must_fail` is exactly the set of graded cells it fails (tests/test_tensor_parallel_notebook.py
runs them). The demo mutant (`make demo`) forgets f's backward all-reduce: partial credit.
"""

from solutions.submissions import mutant

MAPPING_CELLS = ("test_copy_to_region", "test_reduce_from_region", "test_scatter_to_region",
                 "test_gather_from_region", "test_gather_from_sequence_parallel_region",
                 "test_reduce_scatter_to_sequence_parallel_region")

MUTANTS = [
    mutant(
        "copy_to_identity_backward", "tp_mappings",
        [("return _reduce(grad_output, ctx.group), None", "return grad_output, None")],
        must_fail={"test_copy_to_region", "test_column_parallel_linear", "test_tp_pair_communication",
                   "test_parallel_mlp", "test_sequence_parallel_grads"},
        why="f's backward left as identity: the input gradient misses the other ranks' contributions",
        demo=True,
    ),
    mutant(
        "reduce_from_backward_allreduce", "tp_mappings",
        [("return grad_output, None  # the output is replicated",
          "return _reduce(grad_output, ctx.group), None  # the output is replicated")],
        must_fail={"test_reduce_from_region", "test_row_parallel_linear", "test_tp_pair_communication",
                   "test_parallel_mlp", "test_sequence_parallel_grads"},
        why="g all-reduces in backward too: the replicated output's gradient is counted t times",
    ),
    mutant(
        "gather_last_dim_reshape", "tp_mappings",
        [("return torch.cat(chunks, dim=-1)  # -> [s, b, h]",
          "return output.reshape(*input_.shape[:-1], -1)  # -> [s, b, h]")],
        must_fail={"test_scatter_to_region", "test_gather_from_region", "test_column_parallel_linear",
                   "test_row_parallel_linear"},
        why="the all-gathered [t*s, b, h/t] reshaped to [s, b, h] instead of concatenated on the last dim",
    ),
    mutant(
        "gather_last_dim_reversed", "tp_mappings",
        [("chunks = output.chunk(size, dim=0)  # t x [s, b, h/t], rank order",
          "chunks = output.chunk(size, dim=0)[::-1]  # t x [s, b, h/t], rank order")],
        must_fail={"test_scatter_to_region", "test_gather_from_region", "test_column_parallel_linear",
                   "test_row_parallel_linear"},
        why="the gathered chunks concatenated in reverse rank order",
    ),
    mutant(
        "scatter_no_divisibility_check", "tp_mappings",
        [('_check_divisible(input_.shape[-1], size, "scatter_to_tensor_model_parallel_region: last dim")',
          "pass")],
        must_fail={"test_argument_errors"},
        why="a last dim not divisible by the group size silently drops the remainder",
    ),
    mutant(
        "sp_allreduce_then_split", "sp_mappings",
        [("dist.reduce_scatter_single(output, input_, op=dist.ReduceOp.SUM, group=group)",
          "output = _reduce(input_, group).chunk(size, dim=0)[group.rank()].contiguous()")],
        must_fail={"test_gather_from_sequence_parallel_region", "test_reduce_scatter_to_sequence_parallel_region",
                   "test_sp_pair_communication"},
        why="reduce-scatter done as all-reduce then split: right numbers, twice the traffic",
    ),
    mutant(
        "column_slices_dim1", "column_row",
        [("self.weight = nn.Parameter(master_weight[rows].clone())",
          "self.weight = nn.Parameter(master_weight[:, rows].clone())")],
        must_fail={"test_column_parallel_linear", "test_tp_pair_communication", "test_sp_pair_communication",
                   "test_parallel_mlp", "test_sequence_parallel_grads"},
        why="the column layer sliced the weight's input features (dim 1) instead of its output features",
    ),
    mutant(
        "row_bias_before_reduction", "column_row",
        [("output_parallel = F.linear(input_parallel, self.weight)  #",
          "output_parallel = F.linear(input_parallel, self.weight, self.bias)  #"),
         ("output = output + self.bias  # added once", "output = output  # added once")],
        must_fail={"test_row_parallel_linear", "test_tp_pair_communication", "test_sp_pair_communication",
                   "test_parallel_mlp", "test_sequence_parallel_grads"},
        why="the row layer adds the whole bias on every rank before the reduction: t times the bias",
    ),
    mutant(
        "column_without_copy_to", "column_row",
        [("input_parallel = copy_to_tensor_model_parallel_region(input_, group=self.tp_group)",
          "input_parallel = input_")],
        must_fail={"test_column_parallel_linear", "test_tp_pair_communication", "test_parallel_mlp",
                   "test_sequence_parallel_grads"},
        why="the column layer skips f: no all-reduce of the input gradient",
    ),
    mutant(
        "mlp_tanh_gelu", "parallel_mlp",
        [("F.gelu(intermediate)", 'F.gelu(intermediate, approximate="tanh")')],
        must_fail={"test_parallel_mlp", "test_sequence_parallel_grads"},
        why="the tanh approximation of GeLU instead of the exact one",
    ),
    mutant(
        "sp_grads_every_parameter", "parallel_mlp",
        [('if getattr(p, "sequence_parallel", False) and p.grad is not None]', "if p.grad is not None]")],
        must_fail={"test_sequence_parallel_grads"},
        why="all-reduces every gradient, tensor-parallel shards included",
    ),
    mutant(
        "mlp_bias_when_master_bias_none", "parallel_mlp",
        [("hidden_size, ffn_hidden_size, tp_group=tp_group, bias=master_fc1_bias is not None,",
          "hidden_size, ffn_hidden_size, tp_group=tp_group, bias=True,")],
        must_fail={"test_parallel_mlp"},
        why="fc1 always gets a bias (zeros when the master bias is None): a parameter the model does not have",
    ),
    mutant(
        "sp_grads_none_not_skipped", "parallel_mlp",
        [('if getattr(p, "sequence_parallel", False) and p.grad is not None]',
          'if getattr(p, "sequence_parallel", False)]')],
        must_fail={"test_sequence_parallel_grads"},
        why="a marked parameter without a gradient is not skipped: its None reaches torch.cat",
    ),
    mutant(
        "ce_no_max_subtraction", "cross_entropy",
        [("logits = logits - logits_max.unsqueeze(-1)  #", "logits = logits  #")],
        must_fail={"test_cross_entropy_extreme_logits"},
        why="softmax without subtracting the max: exp overflows for logits near 1e4",
    ),
    mutant(
        "ce_target_not_masked", "cross_entropy",
        [("predicted_logits = predicted_logits.masked_fill(target_mask, 0.0)", "pass")],
        must_fail={"test_vocab_parallel_cross_entropy", "test_cross_entropy_extreme_logits"},
        why="every rank contributes a 'target logit', also for targets outside its vocab partition",
    ),
    mutant(
        "overlap_wait_immediately", "overlap",
        [("group=ctx.tp_group, async_op=True)", "group=ctx.tp_group, async_op=True)\n            handle.wait()")],
        must_fail={"test_async_allreduce_overlap"},
        why="waits right after launching the all-reduce, before the weight gradient: nothing overlaps",
    ),
    mutant(
        "overlap_sync_allreduce", "overlap",
        [("group=ctx.tp_group, async_op=True)", "group=ctx.tp_group)")],
        must_fail={"test_async_allreduce_overlap"},
        why="a synchronous all-reduce (handle is None, never waited): correct numbers, no overlap",
    ),
    mutant(
        "gather_noncontiguous_view", "tp_mappings",
        [("    input_ = input_.contiguous()\n", "")],
        must_fail={"test_scatter_to_region", "test_gather_from_region"},
        why="the last-dim gather hands its input (a view) straight to all_gather_single: gloo copies it, "
            "NCCL refuses it; the runner names the line",
    ),
]

