"""Reference solution, assignment 03 (part 1): the point-to-point helpers of a pipeline.

A pipeline stage talks to two neighbours only: it receives activations from
the previous stage and sends its output to the next one (forward), and sends
the gradient of its input back to the previous stage (backward). These are
Megatron-LM's `send_forward`, `recv_forward`, `send_backward` and
`recv_backward` (`megatron/core/pipeline_parallel/p2p_communication.py`,
`P2PCommunicator`). Peers are ranks *of the pipeline group* and wrap around
(rank p - 1's next is rank 0, which interleaved schedules use); the executor
(solutions/pipeline_parallel/executor.py) decides when not to call them.

The course's rule for a blocking transport (gloo): sends are posted with
`isend` and return their handle, only receives block, and every handle is
waited and dropped before the step ends. Schedules: solutions/pipeline_parallel/schedules.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_pipeline_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["send_forward", "recv_forward", "send_backward", "recv_backward", "forward_backward_no_pipelining"]


# ---------------------------------------------------------------------------
# Given helpers (no exercise): argument checks
# ---------------------------------------------------------------------------

def _group_size_rank(group, what: str) -> tuple[int, int]:
    """(size, rank) of `group`; ValueError unless it is a torch.distributed.ProcessGroup."""
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"{what}: pp_group must be a torch.distributed.ProcessGroup "
                         f"(e.g. dist.group.WORLD or dist.new_group(...)), got {type(group).__name__}")
    return group.size(), group.rank()


def _check_recv_args(shape, dtype, what: str) -> tuple[int, ...]:
    """The receive buffer's shape as a tuple of ints; ValueError for a bad shape or dtype."""
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError:
        raise ValueError(f"{what}: shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{what}: shape {list(dims)} has a negative size")
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{what}: dtype must be a torch.dtype, got {dtype!r}")
    return dims


# ---------------------------------------------------------------------------
# Worked example: the no-pipelining baseline (Megatron forward_backward_no_pipelining)
# ---------------------------------------------------------------------------

def forward_backward_no_pipelining(model, microbatches, targets, loss_fn):
    """Gradient accumulation over micro-batches on one rank: what every pipeline schedule must equal.

    Megatron-LM `schedules.forward_backward_no_pipelining`: forward and
    backward one micro-batch at a time, each loss divided by the number of
    micro-batches, so the accumulated gradients are those of the mean loss.
    Returns the mean loss as a Python float.
    """
    if len(microbatches) != len(targets) or not microbatches:
        raise ValueError(f"forward_backward_no_pipelining: {len(microbatches)} micro-batches and "
                         f"{len(targets)} targets (need the same number, at least one)")
    num_microbatches = len(microbatches)
    total = 0.0
    for x, target in zip(microbatches, targets):
        loss = loss_fn(model(x), target) / num_microbatches  # the mean, one micro-batch at a time
        loss.backward()  # accumulates into .grad; frees this micro-batch's graph
        total += loss.item()
    return total


# ---------------------------------------------------------------------------
# Exercise 1: the P2P helpers
# ---------------------------------------------------------------------------

def _next_and_prev(pp_group) -> tuple[int, int]:
    """(next, previous) rank of this rank in `pp_group`, as group ranks, wrapping around."""
    ### BEGIN SOLUTION
    size, rank = pp_group.size(), pp_group.rank()
    return (rank + 1) % size, (rank - 1) % size
    ### END SOLUTION


def send_forward(tensor, *, pp_group):
    """Post a send of `tensor` (this stage's output) to the next rank of `pp_group`; return its handle.

    Megatron-LM `P2PCommunicator.send_forward`. Non-blocking: a gloo send
    completes only once the peer has posted the matching receive, so the
    caller keeps the handle and waits it later.
    """
    ### BEGIN SOLUTION
    _group_size_rank(pp_group, "send_forward")
    next_rank, _ = _next_and_prev(pp_group)
    return dist.isend(tensor.contiguous(), group=pp_group, group_dst=next_rank)  # [b, h] -> next stage
    ### END SOLUTION


def recv_forward(shape, dtype, *, pp_group, device=None):
    """Receive the previous rank's activation of `shape` and `dtype`; blocks until it has arrived.

    Megatron-LM `P2PCommunicator.recv_forward`. The receiver must know the
    shape and dtype in advance (a buffer of the wrong size aborts the process
    or silently receives garbage). `device`: where the tensor lives (the CPU
    by default; a CUDA device under NCCL).
    """
    ### BEGIN SOLUTION
    _group_size_rank(pp_group, "recv_forward")
    dims = _check_recv_args(shape, dtype, "recv_forward")
    _, prev_rank = _next_and_prev(pp_group)
    buffer = torch.empty(dims, dtype=dtype, device=device)
    dist.recv(buffer, group=pp_group, group_src=prev_rank)  # [b, h] <- previous stage
    return buffer
    ### END SOLUTION


def send_backward(tensor, *, pp_group):
    """Post a send of `tensor` (the gradient of this stage's input) to the previous rank; return its handle.

    Megatron-LM `P2PCommunicator.send_backward`: the mirror of `send_forward`,
    same shape and dtype, opposite direction.
    """
    ### BEGIN SOLUTION
    _group_size_rank(pp_group, "send_backward")
    _, prev_rank = _next_and_prev(pp_group)
    return dist.isend(tensor.contiguous(), group=pp_group, group_dst=prev_rank)  # [b, h] -> previous stage
    ### END SOLUTION


def recv_backward(shape, dtype, *, pp_group, device=None):
    """Receive the gradient of this stage's output from the next rank; blocks until it has arrived.

    Megatron-LM `P2PCommunicator.recv_backward`.
    """
    ### BEGIN SOLUTION
    _group_size_rank(pp_group, "recv_backward")
    dims = _check_recv_args(shape, dtype, "recv_backward")
    next_rank, _ = _next_and_prev(pp_group)
    buffer = torch.empty(dims, dtype=dtype, device=device)
    dist.recv(buffer, group=pp_group, group_src=next_rank)  # [b, h] <- next stage
    return buffer
    ### END SOLUTION
