"""Reference solution, assignment 03 (part 3): `run_pipeline`, the executor of a schedule.

    loss = run_pipeline(stage, one_f_one_b_schedule(p, rank, m), microbatches, targets, loss_fn, pp_group=group)

Every rank calls `run_pipeline` with its own stage module (or list of model
chunks) and its own action list; all ranks get the same `microbatches` and
`targets` lists (stage 0 reads the inputs, the last stage the targets). Each
stage maps a micro-batch `[b, h]` to `[b, h]`, so a receiver knows the shape
and dtype without a handshake. With chunks, chunk c of rank r is virtual
stage c * p + r, and the loss sits on rank p - 1's last chunk.

How it avoids deadlock on a blocking transport: sends are posted
(`send_forward` / `send_backward` return a handle), only receives block,
and every handle is waited and dropped before the step ends: a forward send
as soon as its gradient has come back (by then the next stage has long
received it), a backward send at the end. How it keeps memory at what the
schedule needs: each action runs in its own function (`_forward_step`,
`_backward_step`, as Megatron-LM's `forward_step` / `backward_step`), so no
local variable outlives it, and a stage output is dropped right after its
backward. P2P helpers: solutions/pipeline_parallel/p2p.py; schedules:
solutions/pipeline_parallel/schedules.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_pipeline_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.nn as nn

from solutions.pipeline_parallel.p2p import (  # noqa: F401 - the notebook defines these in earlier cells
    _group_size_rank, recv_backward, recv_forward, send_backward, send_forward,
)

__all__ = ["run_pipeline"]


# ---------------------------------------------------------------------------
# Given helper (no exercise): argument checks of run_pipeline
# ---------------------------------------------------------------------------

def _check_pipeline_args(stage_module, schedule, microbatches, targets, what: str = "run_pipeline"):
    """(chunks, actions): the model chunks as a list, and the schedule as (kind, mb, chunk) triples.

    ValueError, naming the sizes, unless: `microbatches` and `targets` are
    non-empty lists of the same length; the micro-batches are tensors of one
    shape and dtype; every action is ("F" or "B", mb) or ("F" or "B", mb, chunk)
    with 0 <= mb < len(microbatches) and 0 <= chunk < len(chunks) (with more
    than one chunk the chunk is required); and every (mb, chunk) is forwarded
    once and then backwarded once.
    """
    if isinstance(stage_module, (list, tuple, nn.ModuleList)):
        chunks = list(stage_module)
    else:
        chunks = [stage_module]
    if not chunks or not all(callable(c) for c in chunks):
        raise ValueError(f"{what}: stage_module must be a module or a non-empty list of modules (chunks)")
    if not isinstance(microbatches, (list, tuple)) or not isinstance(targets, (list, tuple)):
        raise ValueError(f"{what}: microbatches and targets must be lists, got "
                         f"{type(microbatches).__name__} and {type(targets).__name__}")
    m = len(microbatches)
    if m == 0 or len(targets) != m:
        raise ValueError(f"{what}: {m} micro-batches and {len(targets)} targets "
                         f"(need the same number, at least one)")
    first = microbatches[0]
    for i, x in enumerate(microbatches):
        if not isinstance(x, torch.Tensor) or x.shape != first.shape or x.dtype != first.dtype:
            got = f"{list(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{what}: micro-batch {i} is {got}; every micro-batch must be a tensor "
                             f"of micro-batch 0's shape {list(first.shape)} and dtype {first.dtype}")
    v = len(chunks)
    actions, forwarded, backwarded = [], set(), set()
    for i, action in enumerate(schedule):
        ok = isinstance(action, (tuple, list)) and len(action) in (2, 3) and action[0] in ("F", "B")
        if ok and len(action) == 2 and v > 1:
            raise ValueError(f"{what}: action {i} {tuple(action)} has no chunk, but there are {v} chunks: "
                             f"use (kind, microbatch, chunk)")
        if ok:
            kind, mb, chunk = (*action, 0) if len(action) == 2 else action
            ok = all(isinstance(n, int) and not isinstance(n, bool) for n in (mb, chunk))
        if not ok:
            raise ValueError(f"{what}: action {i} is {action!r}; expected ('F' or 'B', microbatch) or "
                             f"('F' or 'B', microbatch, chunk)")
        if not (0 <= mb < m and 0 <= chunk < v):
            raise ValueError(f"{what}: action {i} {tuple(action)} is outside {m} micro-batches and {v} chunk(s)")
        key = (mb, chunk)
        if kind == "F":
            if key in forwarded:
                raise ValueError(f"{what}: action {i} forwards micro-batch {mb} of chunk {chunk} a second time")
            forwarded.add(key)
        else:
            if key not in forwarded or key in backwarded:
                why = "before its forward" if key not in forwarded else "a second time"
                raise ValueError(f"{what}: action {i} backwards micro-batch {mb} of chunk {chunk} {why}")
            backwarded.add(key)
        actions.append((kind, mb, chunk))
    missing = sorted({(mb, c) for mb in range(m) for c in range(v)} - backwarded)
    if missing:
        raise ValueError(f"{what}: the schedule never completes (micro-batch, chunk) {missing[:4]}"
                         f"{' ...' if len(missing) > 4 else ''}: {m} micro-batches x {v} chunk(s) need "
                         f"{2 * m * v} actions, got {len(actions)}")
    return chunks, actions


# ---------------------------------------------------------------------------
# Exercise 4: run_pipeline
# ---------------------------------------------------------------------------

def _forward_step(state, mb, chunk):
    """Run ("F", mb, chunk): get the input, run the chunk, keep what backward needs, pass the output on.

    `state` is whatever run_pipeline keeps between actions (here a dict: the
    group, the chunks, the data, the inputs and outputs kept for backward,
    the send handles). Change the signature as you like: only run_pipeline
    is called by the tests.
    """
    ### BEGIN SOLUTION
    p, rank = state["size"], state["rank"]
    vstage = chunk * p + rank
    if vstage == 0:
        x = state["microbatches"][mb]  # the first virtual stage reads the data
    elif p == 1:
        x = state["local"].pop(("F", mb, chunk))  # my previous chunk's output, already a new leaf
    else:
        x = recv_forward(state["shape"], state["dtype"], pp_group=state["group"], device=state["device"])
        x.requires_grad_()  # a leaf of this stage's graph: its .grad goes back to the previous stage
    y = state["chunks"][chunk](x)  # [b, h] -> [b, h]
    state["inputs"][(mb, chunk)] = x
    if vstage == state["last_vstage"]:
        loss = state["loss_fn"](y, state["targets"][mb]) / state["num_microbatches"]  # mean over micro-batches
        state["losses"].append(loss.item())
        state["outputs"][(mb, chunk)] = loss  # its graph holds y until backward
    else:
        state["outputs"][(mb, chunk)] = y
        if p == 1:  # the next virtual stage is on this rank: cut the graph as a send would
            state["local"][("F", mb, chunk + 1)] = y.detach().requires_grad_()
        else:
            state["forward_sends"][(mb, chunk)] = send_forward(y, pp_group=state["group"])
    ### END SOLUTION


def _backward_step(state, mb, chunk):
    """Run ("B", mb, chunk): get the output's gradient, backward through the chunk, pass the input's gradient back."""
    ### BEGIN SOLUTION
    p, rank = state["size"], state["rank"]
    vstage = chunk * p + rank
    x = state["inputs"].pop((mb, chunk))
    y = state["outputs"].pop((mb, chunk))
    if vstage == state["last_vstage"]:
        torch.autograd.backward(y)  # y is this micro-batch's loss / m
    else:
        if p == 1:
            grad = state["local"].pop(("B", mb, chunk))
        else:
            grad = recv_backward(state["shape"], state["dtype"], pp_group=state["group"], device=state["device"])
            # The gradient came back, so the next stage received our output long ago: the send is done.
            state["forward_sends"].pop((mb, chunk)).wait()
        torch.autograd.backward(y, grad)
    if vstage != 0:
        if p == 1:
            state["local"][("B", mb, chunk - 1)] = x.grad
        else:
            state["backward_sends"].append(send_backward(x.grad, pp_group=state["group"]))
    ### END SOLUTION


def run_pipeline(stage_module, schedule, microbatches, targets, loss_fn, *, pp_group):
    """Execute this rank's `schedule` with real P2P; return the mean loss (a float) on the last stage, else None.

    `stage_module`: this rank's module, or a list of its model chunks (chunk c
    is virtual stage c * p + rank). `schedule`: this rank's actions, ("F", mb) /
    ("B", mb), or ("F", mb, chunk) / ("B", mb, chunk). The loss of each
    micro-batch is `loss_fn(output, target) / m`, so the parameters'
    gradients are those of the mean loss, as in single-process training with
    the same micro-batches (`forward_backward_no_pipelining`).
    """
    ### BEGIN SOLUTION
    size, rank = _group_size_rank(pp_group, "run_pipeline")
    chunks, actions = _check_pipeline_args(stage_module, schedule, microbatches, targets)
    first = microbatches[0]
    state = {
        "size": size, "rank": rank, "group": pp_group, "chunks": chunks, "loss_fn": loss_fn,
        "microbatches": microbatches, "targets": targets, "num_microbatches": len(microbatches),
        "shape": tuple(first.shape), "dtype": first.dtype, "device": first.device,
        "last_vstage": len(chunks) * size - 1,
        "inputs": {}, "outputs": {},  # (mb, chunk) -> what backward needs, dropped by backward
        "forward_sends": {}, "backward_sends": [],  # handles of posted sends, waited before returning
        "local": {},  # p == 1: tensors passed between this rank's own chunks
        "losses": [],
    }
    for kind, mb, chunk in actions:
        if kind == "F":
            _forward_step(state, mb, chunk)
        else:
            _backward_step(state, mb, chunk)
    for work in state["backward_sends"]:
        work.wait()
    state["backward_sends"].clear()
    if rank == size - 1:  # owns the last virtual stage
        return float(sum(state["losses"]))
    return None
    ### END SOLUTION
