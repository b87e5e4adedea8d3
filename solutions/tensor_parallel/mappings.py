"""Reference solution, assignment 02 (part 1): the tensor/sequence-parallel mappings.

The six communication ops between the replicated, tensor-parallel and
sequence-parallel regions of a transformer layer, as in Megatron-LM's
`megatron/core/tensor_parallel/mappings.py`. Activations are `[s, b, h]`.
Every op is an autograd Function whose backward is the conjugate collective,
takes its process group explicitly (`group=`), and issues no communication
for a group of size 1. Layers: solutions/tensor_parallel/layers.py; the loss:
solutions/tensor_parallel/loss.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_tensor_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "copy_to_tensor_model_parallel_region",
    "reduce_from_tensor_model_parallel_region",
    "scatter_to_tensor_model_parallel_region",
    "gather_from_tensor_model_parallel_region",
    "gather_from_sequence_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region",
]


# ---------------------------------------------------------------------------
# Given helpers (no exercise): argument checks and the dim-0 primitives
# ---------------------------------------------------------------------------

def _group_size_rank(group, what: str) -> tuple[int, int]:
    """(size, rank) of `group`; ValueError unless it is a torch.distributed.ProcessGroup."""
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"{what}: the group must be a torch.distributed.ProcessGroup "
                         f"(e.g. dist.group.WORLD or dist.new_group(...)), got {type(group).__name__}")
    return group.size(), group.rank()


def _check_divisible(size: int, group_size: int, what: str) -> None:
    """ValueError unless `size` (a partitioned dimension) is a multiple of the group size."""
    if size % group_size != 0:
        raise ValueError(f"{what} ({size}) is not divisible by the group size ({group_size})")


def _check_min_dims(input_, what: str) -> None:
    if not isinstance(input_, torch.Tensor) or input_.dim() < 1:
        raise ValueError(f"{what}: expected a tensor with at least one dimension, got "
                         f"{tuple(input_.shape) if isinstance(input_, torch.Tensor) else type(input_).__name__}")


def _reduce(input_, group):
    """All-reduce (sum) across `group` into a new tensor; the input is left unchanged.

    Megatron's `mappings._reduce` all-reduces in place; a copy keeps the
    caller's tensor intact (autograd may still need it).
    """
    if group.size() == 1:
        return input_
    output = input_.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(output, op=dist.ReduceOp.SUM, group=group)  # [*] -> [*], summed
    return output


def _split_along_first_dim(input_, group):
    """Keep this rank's chunk of dim 0 (Megatron `mappings._split_along_first_dim`)."""
    size, rank = group.size(), group.rank()
    if size == 1:
        return input_
    local = input_.shape[0] // size
    return input_[rank * local:(rank + 1) * local].contiguous()  # [s, b, h] -> [s/t, b, h]


def _gather_along_first_dim(input_, group):
    """All-gather along dim 0, in rank order (Megatron `mappings._gather_along_first_dim`)."""
    size = group.size()
    if size == 1:
        return input_
    input_ = input_.contiguous()
    output = torch.empty((size * input_.shape[0],) + tuple(input_.shape[1:]),
                         dtype=input_.dtype, device=input_.device)
    dist.all_gather_single(output, input_, group=group)  # [s/t, b, h] -> [s, b, h]
    return output


# ---------------------------------------------------------------------------
# Worked example: scatter to the sequence-parallel region (split dim 0 / all-gather dim 0)
# ---------------------------------------------------------------------------

class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Split dim 0 in forward, all-gather dim 0 in backward.

    Megatron-LM `mappings._ScatterToSequenceParallelRegion`. The input is
    replicated on every rank; each rank keeps its sequence chunk. In backward
    each rank holds the gradient of its chunk only, so the chunks are gathered
    back into the gradient of the whole (replicated) input.
    """

    @staticmethod
    def forward(ctx, input_, group):
        ctx.group = group
        return _split_along_first_dim(input_, group)  # [s, b, h] -> [s/t, b, h]

    @staticmethod
    def backward(ctx, grad_output):
        return _gather_along_first_dim(grad_output, ctx.group), None  # [s/t, b, h] -> [s, b, h]


def scatter_to_sequence_parallel_region(input_, *, group):
    """Split dim 0 in forward, all-gather dim 0 in backward (Megatron `scatter_to_sequence_parallel_region`)."""
    size, _ = _group_size_rank(group, "scatter_to_sequence_parallel_region")
    _check_min_dims(input_, "scatter_to_sequence_parallel_region")
    _check_divisible(input_.shape[0], size, "scatter_to_sequence_parallel_region: sequence dim 0")
    return _ScatterToSequenceParallelRegion.apply(input_, group)


# ---------------------------------------------------------------------------
# Exercise 1: the tensor-parallel mappings f, g, scatter and gather (last dim)
# ---------------------------------------------------------------------------

def _split_along_last_dim(input_, group):
    """Keep this rank's chunk of the last dim (Megatron `mappings._split_along_last_dim`)."""
    ### BEGIN SOLUTION
    size, rank = group.size(), group.rank()
    if size == 1:
        return input_
    chunk = input_.shape[-1] // size
    return input_[..., rank * chunk:(rank + 1) * chunk].contiguous()  # [s, b, h] -> [s, b, h/t]
    ### END SOLUTION


def _gather_along_last_dim(input_, group):
    """All-gather and concatenate along the last dim, in rank order (Megatron `mappings._gather_along_last_dim`)."""
    ### BEGIN SOLUTION
    size = group.size()
    if size == 1:
        return input_
    input_ = input_.contiguous()
    output = torch.empty((size * input_.shape[0],) + tuple(input_.shape[1:]),
                         dtype=input_.dtype, device=input_.device)
    dist.all_gather_single(output, input_, group=group)  # t x [s, b, h/t] -> [t*s, b, h/t]
    chunks = output.chunk(size, dim=0)  # t x [s, b, h/t], rank order
    return torch.cat(chunks, dim=-1)  # -> [s, b, h]
    ### END SOLUTION


class _CopyToModelParallelRegion(torch.autograd.Function):
    """f: identity in forward, all-reduce in backward (Megatron `mappings._CopyToModelParallelRegion`)."""

    @staticmethod
    def forward(ctx, input_, group):
        ### BEGIN SOLUTION
        ctx.group = group
        return input_  # [s, b, h], replicated
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return _reduce(grad_output, ctx.group), None  # [s, b, h] partial -> [s, b, h] summed
        ### END SOLUTION


def copy_to_tensor_model_parallel_region(input_, *, group):
    """f: identity in forward, all-reduce in backward (Megatron `copy_to_tensor_model_parallel_region`)."""
    ### BEGIN SOLUTION
    _group_size_rank(group, "copy_to_tensor_model_parallel_region")
    return _CopyToModelParallelRegion.apply(input_, group)
    ### END SOLUTION


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """g: all-reduce in forward, identity in backward (Megatron `mappings._ReduceFromModelParallelRegion`)."""

    @staticmethod
    def forward(ctx, input_, group):
        ### BEGIN SOLUTION
        ctx.group = group
        return _reduce(input_, group)  # [s, b, h] partial -> [s, b, h] summed
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return grad_output, None  # the output is replicated: each rank already has the whole gradient
        ### END SOLUTION


def reduce_from_tensor_model_parallel_region(input_, *, group):
    """g: all-reduce in forward, identity in backward (Megatron `reduce_from_tensor_model_parallel_region`)."""
    ### BEGIN SOLUTION
    _group_size_rank(group, "reduce_from_tensor_model_parallel_region")
    return _ReduceFromModelParallelRegion.apply(input_, group)
    ### END SOLUTION


class _ScatterToModelParallelRegion(torch.autograd.Function):
    """Split the last dim in forward, all-gather the last dim in backward (Megatron `mappings._ScatterToModelParallelRegion`)."""

    @staticmethod
    def forward(ctx, input_, group):
        ### BEGIN SOLUTION
        ctx.group = group
        return _split_along_last_dim(input_, group)  # [s, b, h] -> [s, b, h/t]
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return _gather_along_last_dim(grad_output, ctx.group), None  # [s, b, h/t] -> [s, b, h]
        ### END SOLUTION


def scatter_to_tensor_model_parallel_region(input_, *, group):
    """Split the last dim in forward, all-gather it in backward (Megatron `scatter_to_tensor_model_parallel_region`)."""
    ### BEGIN SOLUTION
    size, _ = _group_size_rank(group, "scatter_to_tensor_model_parallel_region")
    _check_min_dims(input_, "scatter_to_tensor_model_parallel_region")
    _check_divisible(input_.shape[-1], size, "scatter_to_tensor_model_parallel_region: last dim")
    return _ScatterToModelParallelRegion.apply(input_, group)
    ### END SOLUTION


class _GatherFromModelParallelRegion(torch.autograd.Function):
    """All-gather the last dim in forward, split it in backward (Megatron `mappings._GatherFromModelParallelRegion`)."""

    @staticmethod
    def forward(ctx, input_, group):
        ### BEGIN SOLUTION
        ctx.group = group
        return _gather_along_last_dim(input_, group)  # [s, b, h/t] -> [s, b, h]
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return _split_along_last_dim(grad_output, ctx.group), None  # [s, b, h] -> [s, b, h/t]
        ### END SOLUTION


def gather_from_tensor_model_parallel_region(input_, *, group):
    """All-gather the last dim in forward, split it in backward (Megatron `gather_from_tensor_model_parallel_region`)."""
    ### BEGIN SOLUTION
    _group_size_rank(group, "gather_from_tensor_model_parallel_region")
    _check_min_dims(input_, "gather_from_tensor_model_parallel_region")
    return _GatherFromModelParallelRegion.apply(input_, group)
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 2: the sequence-parallel mappings (dim 0)
# ---------------------------------------------------------------------------

def _reduce_scatter_along_first_dim(input_, group):
    """Sum across ranks and keep this rank's chunk of dim 0 (Megatron `mappings._reduce_scatter_along_first_dim`)."""
    ### BEGIN SOLUTION
    size = group.size()
    if size == 1:
        return input_
    input_ = input_.contiguous()
    output = torch.empty((input_.shape[0] // size,) + tuple(input_.shape[1:]),
                         dtype=input_.dtype, device=input_.device)
    dist.reduce_scatter_single(output, input_, op=dist.ReduceOp.SUM, group=group)  # [s, b, h] -> [s/t, b, h]
    return output
    ### END SOLUTION


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather dim 0 in forward, reduce-scatter dim 0 in backward (Megatron `mappings._GatherFromSequenceParallelRegion`)."""

    @staticmethod
    def forward(ctx, input_, group):
        ### BEGIN SOLUTION
        ctx.group = group
        return _gather_along_first_dim(input_, group)  # [s/t, b, h] -> [s, b, h]
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        # The gathered tensor feeds a tensor-parallel region: each rank holds a
        # partial gradient of the whole sequence. Sum them, keep my chunk.
        return _reduce_scatter_along_first_dim(grad_output, ctx.group), None  # [s, b, h] -> [s/t, b, h]
        ### END SOLUTION


def gather_from_sequence_parallel_region(input_, *, group):
    """All-gather dim 0 in forward, reduce-scatter dim 0 in backward (Megatron `gather_from_sequence_parallel_region`)."""
    ### BEGIN SOLUTION
    _group_size_rank(group, "gather_from_sequence_parallel_region")
    _check_min_dims(input_, "gather_from_sequence_parallel_region")
    return _GatherFromSequenceParallelRegion.apply(input_, group)
    ### END SOLUTION


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter dim 0 in forward, all-gather dim 0 in backward (Megatron `mappings._ReduceScatterToSequenceParallelRegion`)."""

    @staticmethod
    def forward(ctx, input_, group):
        ### BEGIN SOLUTION
        ctx.group = group
        return _reduce_scatter_along_first_dim(input_, group)  # [s, b, h] -> [s/t, b, h]
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return _gather_along_first_dim(grad_output, ctx.group), None  # [s/t, b, h] -> [s, b, h]
        ### END SOLUTION


def reduce_scatter_to_sequence_parallel_region(input_, *, group):
    """Reduce-scatter dim 0 in forward, all-gather dim 0 in backward (Megatron `reduce_scatter_to_sequence_parallel_region`)."""
    ### BEGIN SOLUTION
    size, _ = _group_size_rank(group, "reduce_scatter_to_sequence_parallel_region")
    _check_min_dims(input_, "reduce_scatter_to_sequence_parallel_region")
    _check_divisible(input_.shape[0], size, "reduce_scatter_to_sequence_parallel_region: sequence dim 0")
    return _ReduceScatterToSequenceParallelRegion.apply(input_, group)
    ### END SOLUTION
