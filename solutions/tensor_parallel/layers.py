"""Reference solution, assignment 02 (part 2): column/row-parallel layers, the MLP, the overlap.

`ColumnParallelLinear` and `RowParallelLinear` as in Megatron-LM's
`megatron/core/tensor_parallel/layers.py`, built on the mappings of
solutions/tensor_parallel/mappings.py; `ParallelMLP` (column -> exact GeLU -> row, as
`megatron/core/transformer/mlp.py` MLP); `allreduce_sequence_parallel_grads`
(`megatron/core/distributed/finalize_model_grads.py`
`_allreduce_non_tensor_model_parallel_grads`); and `LinearWithAsyncAllReduce`,
the column layer's backward with its input-gradient all-reduce overlapped with
the weight-gradient matmul (`layers.LinearWithGradAccumulationAndAsyncCommunication`).

Activations are `[s, b, h]`; `master_weight` is the full `[out, in]` weight.
Tested by:  .venv/bin/python -m pytest -q tests/test_tensor_parallel_solutions.py
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from solutions.tensor_parallel.mappings import (
    _check_divisible,
    _group_size_rank,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "allreduce_sequence_parallel_grads", "LinearWithAsyncAllReduce"]


# ---------------------------------------------------------------------------
# Given helpers (no exercise)
# ---------------------------------------------------------------------------

def _master_parameters(what, out_features, in_features, bias, master_weight, master_bias):
    """The full `[out, in]` weight and `[out]` bias (or None) every rank slices its shard from.

    Validates the given master tensors' shapes (ValueError naming them). Without
    a master weight, one is initialised as `nn.Linear` does, from the default
    generator, so every rank must have seeded it identically (Megatron's
    `_initialize_affine_weight_cpu` makes the same assumption); the bias
    starts at zero, as in Megatron.
    """
    if master_weight is None:
        master_weight = torch.empty(out_features, in_features)
        nn.init.kaiming_uniform_(master_weight, a=math.sqrt(5))
    if not isinstance(master_weight, torch.Tensor) or tuple(master_weight.shape) != (out_features, in_features):
        got = tuple(master_weight.shape) if isinstance(master_weight, torch.Tensor) else type(master_weight).__name__
        raise ValueError(f"{what}: master_weight must have shape [out_features, in_features] = "
                         f"[{out_features}, {in_features}], got {got}")
    if not bias:
        if master_bias is not None:
            raise ValueError(f"{what}: master_bias given but bias=False")
        return master_weight.detach(), None
    if master_bias is None:
        master_bias = torch.zeros(out_features, dtype=master_weight.dtype, device=master_weight.device)
    if not isinstance(master_bias, torch.Tensor) or tuple(master_bias.shape) != (out_features,):
        got = tuple(master_bias.shape) if isinstance(master_bias, torch.Tensor) else type(master_bias).__name__
        raise ValueError(f"{what}: master_bias must have shape [out_features] = [{out_features}], got {got}")
    return master_weight.detach(), master_bias.detach()


def _check_last_dim(input_, expected: int, what: str) -> None:
    """ValueError unless `input_` is a tensor whose last dim is `expected`."""
    if not isinstance(input_, torch.Tensor) or input_.dim() < 1 or input_.shape[-1] != expected:
        got = tuple(input_.shape) if isinstance(input_, torch.Tensor) else type(input_).__name__
        raise ValueError(f"{what}: expected an input whose last dim is {expected}, got shape {got}")


# ---------------------------------------------------------------------------
# Exercise 3: the column- and row-parallel layers
# ---------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with A split along its output features (dim 0) across the TP group.

    Megatron-LM `layers.ColumnParallelLinear`. Rank r holds rows
    `[r*out/t, (r+1)*out/t)` of the `[out, in]` master weight and the same slice
    of the bias, in `.weight` `[out/t, in]` and `.bias` `[out/t]`. Input `[s, b, in]`
    (with sequence_parallel: the sequence shard `[s/t, b, in]`, all-gathered first);
    output `[s, b, out/t]`, or `[s, b, out]` with gather_output. Returns a tensor
    (Megatron returns `(output, output_bias)`).
    """

    def __init__(self, in_features, out_features, *, tp_group, bias=True, gather_output=False,
                 sequence_parallel=False, master_weight=None, master_bias=None):
        super().__init__()
        ### BEGIN SOLUTION
        size, rank = _group_size_rank(tp_group, "ColumnParallelLinear tp_group")
        _check_divisible(out_features, size, "ColumnParallelLinear: out_features")
        if gather_output and sequence_parallel:
            raise ValueError("ColumnParallelLinear: gather_output=True is not supported with "
                             "sequence_parallel=True (as in Megatron-LM)")
        master_weight, master_bias = _master_parameters(
            "ColumnParallelLinear", out_features, in_features, bias, master_weight, master_bias)
        self.in_features, self.out_features = in_features, out_features
        self.output_size_per_partition = out_features // size
        self.tp_group = tp_group
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel
        rows = slice(rank * self.output_size_per_partition, (rank + 1) * self.output_size_per_partition)
        self.weight = nn.Parameter(master_weight[rows].clone())  # [out, in] -> [out/t, in]
        if master_bias is not None:
            self.bias = nn.Parameter(master_bias[rows].clone())  # [out] -> [out/t]
        else:
            self.register_parameter("bias", None)
        ### END SOLUTION

    def forward(self, input_):
        ### BEGIN SOLUTION
        _check_last_dim(input_, self.in_features, "ColumnParallelLinear")
        if self.sequence_parallel:
            input_parallel = gather_from_sequence_parallel_region(input_, group=self.tp_group)  # [s/t, b, in] -> [s, b, in]
        else:
            input_parallel = copy_to_tensor_model_parallel_region(input_, group=self.tp_group)  # [s, b, in]
        output_parallel = F.linear(input_parallel, self.weight, self.bias)  # [s, b, in] -> [s, b, out/t]
        if self.gather_output:
            return gather_from_tensor_model_parallel_region(output_parallel, group=self.tp_group)  # -> [s, b, out]
        return output_parallel
        ### END SOLUTION


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with A split along its input features (dim 1) across the TP group.

    Megatron-LM `layers.RowParallelLinear`. Rank r holds columns
    `[r*in/t, (r+1)*in/t)` of the `[out, in]` master weight in `.weight`
    `[out, in/t]` and the WHOLE bias `[out]`, added once after the
    partial products are summed (all-reduce; with sequence_parallel,
    reduce-scatter to `[s/t, b, out]`). Input `[s, b, in/t]` (input_is_parallel)
    or `[s, b, in]` (split here). With sequence_parallel the bias sees only this
    rank's sequence shard, so it is marked `bias.sequence_parallel = True` for
    `allreduce_sequence_parallel_grads`.
    """

    def __init__(self, in_features, out_features, *, tp_group, bias=True, input_is_parallel=True,
                 sequence_parallel=False, master_weight=None, master_bias=None):
        super().__init__()
        ### BEGIN SOLUTION
        size, rank = _group_size_rank(tp_group, "RowParallelLinear tp_group")
        _check_divisible(in_features, size, "RowParallelLinear: in_features")
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel=True requires input_is_parallel=True "
                             "(as in Megatron-LM)")
        master_weight, master_bias = _master_parameters(
            "RowParallelLinear", out_features, in_features, bias, master_weight, master_bias)
        self.in_features, self.out_features = in_features, out_features
        self.input_size_per_partition = in_features // size
        self.tp_group = tp_group
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = sequence_parallel
        cols = slice(rank * self.input_size_per_partition, (rank + 1) * self.input_size_per_partition)
        self.weight = nn.Parameter(master_weight[:, cols].clone())  # [out, in] -> [out, in/t]
        if master_bias is not None:
            self.bias = nn.Parameter(master_bias.clone())  # [out], whole on every rank
            self.bias.sequence_parallel = sequence_parallel
        else:
            self.register_parameter("bias", None)
        ### END SOLUTION

    def forward(self, input_):
        ### BEGIN SOLUTION
        size = self.tp_group.size()
        if self.input_is_parallel:
            _check_last_dim(input_, self.input_size_per_partition, "RowParallelLinear (input_is_parallel)")
            input_parallel = input_  # [s, b, in/t]
        else:
            _check_last_dim(input_, self.in_features, "RowParallelLinear")
            input_parallel = scatter_to_tensor_model_parallel_region(input_, group=self.tp_group)  # [s, b, in] -> [s, b, in/t]
        if self.sequence_parallel:
            _check_divisible(input_.shape[0], size, "RowParallelLinear with sequence_parallel: sequence dim 0")
        output_parallel = F.linear(input_parallel, self.weight)  # [s, b, in/t] -> [s, b, out], partial sum
        if self.sequence_parallel:
            output = reduce_scatter_to_sequence_parallel_region(output_parallel, group=self.tp_group)  # -> [s/t, b, out]
        else:
            output = reduce_from_tensor_model_parallel_region(output_parallel, group=self.tp_group)  # -> [s, b, out]
        if self.bias is not None:
            output = output + self.bias  # added once, after the reduction
        return output
        ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 4: the MLP block and the sequence-parallel gradient all-reduce
# ---------------------------------------------------------------------------

class ParallelMLP(nn.Module):
    """Column -> exact GeLU -> row (Megatron-LM `transformer/mlp.py` MLP with linear_fc1, linear_fc2).

    Without sequence_parallel: input and output `[s, b, h]`, replicated, one
    all-reduce in forward (fc2's g) and one in backward (fc1's f). With it:
    input and output are sequence shards `[s/t, b, h]`.
    """

    def __init__(self, hidden_size, ffn_hidden_size, *, tp_group, sequence_parallel=False,
                 master_fc1_weight, master_fc1_bias, master_fc2_weight, master_fc2_bias):
        super().__init__()
        ### BEGIN SOLUTION
        self.linear_fc1 = ColumnParallelLinear(
            hidden_size, ffn_hidden_size, tp_group=tp_group, bias=master_fc1_bias is not None,
            gather_output=False, sequence_parallel=sequence_parallel,
            master_weight=master_fc1_weight, master_bias=master_fc1_bias)
        self.linear_fc2 = RowParallelLinear(
            ffn_hidden_size, hidden_size, tp_group=tp_group, bias=master_fc2_bias is not None,
            input_is_parallel=True, sequence_parallel=sequence_parallel,
            master_weight=master_fc2_weight, master_bias=master_fc2_bias)
        ### END SOLUTION

    def forward(self, hidden_states):
        ### BEGIN SOLUTION
        intermediate = self.linear_fc1(hidden_states)  # [s(/t), b, h] -> [s, b, ffn/t]
        intermediate = F.gelu(intermediate)  # exact erf GeLU, elementwise on the shard
        return self.linear_fc2(intermediate)  # [s, b, ffn/t] -> [s(/t), b, h]
        ### END SOLUTION


def allreduce_sequence_parallel_grads(module, *, tp_group):
    """Sum, across the TP group, the gradients of parameters marked `.sequence_parallel = True`.

    With sequence parallelism, parameters that are replicated across the group
    but only see this rank's sequence shard (LayerNorm weights, the row layer's
    bias) get partial gradients. Megatron-LM sums them after backward in
    `finalize_model_grads._allreduce_non_tensor_model_parallel_grads`, one
    coalesced all-reduce per dtype. Parameters without a gradient are skipped.
    """
    ### BEGIN SOLUTION
    size, _ = _group_size_rank(tp_group, "allreduce_sequence_parallel_grads tp_group")
    grads = [p.grad for p in module.parameters()
             if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if size == 1 or not grads:
        return
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        coalesced = torch.cat([g.reshape(-1) for g in same])  # [sum of numels]
        dist.all_reduce(coalesced, op=dist.ReduceOp.SUM, group=tp_group)
        offset = 0
        for g in same:
            g.copy_(coalesced[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 6: overlap the input-gradient all-reduce with the weight gradient
# ---------------------------------------------------------------------------

class LinearWithAsyncAllReduce(torch.autograd.Function):
    """Linear in forward; in backward an async all-reduce of the input gradient overlaps the weight-gradient matmul.

    Megatron-LM `layers.LinearWithGradAccumulationAndAsyncCommunication` with
    `allreduce_dgrad=True` (the column layer without sequence parallelism: this
    Function replaces `copy_to_tensor_model_parallel_region` + `F.linear`).
    input `[s, b, in]` (replicated), weight `[out/t, in]`, bias `[out/t]` or None;
    output `[s, b, out/t]`. Backward: dgrad = grad_output @ W, launch its
    all-reduce with `async_op=True`, compute wgrad = grad_output^T @ input while
    it is in flight, then `wait()`.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, tp_group):
        ### BEGIN SOLUTION
        _group_size_rank(tp_group, "LinearWithAsyncAllReduce tp_group")
        ctx.save_for_backward(input, weight)
        ctx.use_bias = bias is not None
        ctx.tp_group = tp_group
        output = torch.matmul(input, weight.t())  # [s, b, in] x [in, out/t] -> [s, b, out/t]
        if bias is not None:
            output = output + bias
        return output
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        input, weight = ctx.saved_tensors
        grad_input = grad_output.matmul(weight)  # [s, b, out/t] x [out/t, in] -> [s, b, in], partial
        handle = None
        if ctx.tp_group.size() > 1:
            handle = dist.all_reduce(grad_input, op=dist.ReduceOp.SUM, group=ctx.tp_group, async_op=True)
        # While the all-reduce is in flight: the weight and bias gradients.
        grad_output_2d = grad_output.reshape(-1, grad_output.shape[-1])  # [s*b, out/t]
        input_2d = input.reshape(-1, input.shape[-1])  # [s*b, in]
        grad_weight = grad_output_2d.t().matmul(input_2d)  # [out/t, s*b] x [s*b, in] -> [out/t, in]
        grad_bias = grad_output_2d.sum(dim=0) if ctx.use_bias else None  # [out/t]
        if handle is not None:
            handle.wait()
        return grad_input, grad_weight, grad_bias, None
        ### END SOLUTION
