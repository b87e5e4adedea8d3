"""Reference solution, assignment 03 (part 5): `run_pipeline_zb`, an executor of F, B, W and F&B actions.

    loss = run_pipeline_zb(chunks, dualpipev_schedule(p, rank, m), microbatches, targets, loss_fn,
                           pp_group=group, style="v")

`run_pipeline` (executor.py) grown to the zero-bubble schedules: it runs any
list of `("F", mb[, chunk])`, `("B", mb[, chunk])`, `("W", mb[, chunk])` and
`("F&B", ("F", ...), ("B", ...))` actions. A `B` whose `W` comes later in the
list computes the input gradient only (`backward_input`, split_backward.py)
and keeps what its `W` needs; any other `B` is the whole backward. `F&B` runs
its two halves one after the other (on a GPU they would overlap, each one's
communication hidden behind the other's compute; here the order is what is
graded). Chunks are placed on stages in one of torch's two styles
(`generate_stage_to_rank_mapping`): "loop" (chunk c of rank r is stage
c * p + r: interleaving, ZB-H1) or "v" (two chunks, stage r and stage
2p - 1 - r: ZBV, DualPipeV). In the V, the two stages at its bottom (p - 1
and p) and its top (0 and 2p - 1) sit on one rank: the first pair hands its
tensors over locally, and rank 0 holds both the input and the loss.

Deadlock-free on a blocking transport as before: sends are posted, only
receives block, each handle is waited before the step ends. What is new: in
the V, activations and gradients travel between the same two ranks in the
same direction, and the two sides do not post them in the same order (rank r
sends an activation, then a gradient; rank r + 1 wants the gradient first).
gloo matches messages between two ranks in posting order per tag, so each
stream gets its own tag (activations 0, gradients 1) and arrives where it is
expected.

Tested by:  .venv/bin/python -m pytest -q tests/test_pipeline_zero_bubble.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from solutions.pipeline_parallel.p2p import _group_size_rank  # noqa: F401 - the notebook defines it earlier
from solutions.pipeline_parallel.split_backward import backward_input, backward_weight  # noqa: F401

__all__ = ["run_pipeline_zb"]

ACTIVATION_TAG = 0  # the tag of every activation message (forward)
GRADIENT_TAG = 1  # the tag of every input-gradient message (backward)


# ---------------------------------------------------------------------------
# Given helper (no exercise): argument checks of run_pipeline_zb
# ---------------------------------------------------------------------------

def _check_zb_args(stage_module, schedule, microbatches, targets, style, size, what: str = "run_pipeline_zb"):
    """(chunks, actions, deferred): the chunks as a list; the schedule as (kind, mb, chunk) triples with every
    ("F&B", f, b) pair replaced by its two halves f then b; the set of (mb, chunk) whose B has a later W.

    ValueError, naming the sizes, unless: `style` is "loop" or "v" ("v": exactly
    two chunks, a pipeline of at least 2 ranks); microbatches and targets are
    non-empty lists of the same length of one shape and dtype; every action is
    ("F" | "B" | "W", mb[, chunk]) or ("F&B", F action, B action) within range
    (a chunk index required with more than one chunk); every (mb, chunk) is
    forwarded once, then backwarded once, and its W (if any) comes after its B.
    """
    if style not in ("loop", "v"):
        raise ValueError(f"{what}: style must be 'loop' or 'v', got {style!r}")
    chunks = list(stage_module) if isinstance(stage_module, (list, tuple, nn.ModuleList)) else [stage_module]
    if not chunks or not all(callable(c) for c in chunks):
        raise ValueError(f"{what}: stage_module must be a module or a non-empty list of modules (chunks)")
    if style == "v" and (len(chunks) != 2 or size < 2):
        raise ValueError(f"{what}: style 'v' needs exactly 2 chunks per rank and at least 2 ranks; got "
                         f"{len(chunks)} chunk(s) on {size} rank(s)")
    if not isinstance(microbatches, (list, tuple)) or not isinstance(targets, (list, tuple)):
        raise ValueError(f"{what}: microbatches and targets must be lists")
    m, v = len(microbatches), len(chunks)
    if m == 0 or len(targets) != m:
        raise ValueError(f"{what}: {m} micro-batches and {len(targets)} targets (need the same number, at least one)")
    first = microbatches[0]
    for i, x in enumerate(microbatches):
        if not isinstance(x, torch.Tensor) or x.shape != first.shape or x.dtype != first.dtype:
            raise ValueError(f"{what}: micro-batch {i} differs from micro-batch 0 ({list(first.shape)} "
                             f"{first.dtype}) in type, shape or dtype")

    def one(action, i):
        ok = isinstance(action, (tuple, list)) and len(action) in (2, 3) and action[0] in ("F", "B", "W")
        if ok and len(action) == 2 and v > 1:
            raise ValueError(f"{what}: action {i} {tuple(action)} has no chunk, but there are {v} chunks")
        if ok:
            kind, mb, chunk = (*action, 0) if len(action) == 2 else tuple(action)
            ok = all(isinstance(n, int) and not isinstance(n, bool) for n in (mb, chunk))
        if not ok:
            raise ValueError(f"{what}: action {i} is {action!r}; expected ('F' | 'B' | 'W', microbatch[, chunk]) "
                             f"or ('F&B', forward action, backward action)")
        if not (0 <= mb < m and 0 <= chunk < v):
            raise ValueError(f"{what}: action {i} {tuple(action)} is outside {m} micro-batches and {v} chunk(s)")
        return kind, mb, chunk

    actions = []
    for i, action in enumerate(schedule):
        if isinstance(action, (tuple, list)) and len(action) == 3 and action[0] == "F&B":
            f, b = one(action[1], i), one(action[2], i)
            if f[0] != "F" or b[0] != "B":
                raise ValueError(f"{what}: action {i} {action!r}: an F&B pair is a forward then a backward")
            actions += [f, b]
        else:
            actions.append(one(action, i))
    done = {"F": set(), "B": set(), "W": set()}
    for i, (kind, mb, chunk) in enumerate(actions):
        key = (mb, chunk)
        before = {"F": None, "B": "F", "W": "B"}[kind]
        if key in done[kind] or (before and key not in done[before]):
            why = "a second time" if key in done[kind] else f"before its {before}"
            raise ValueError(f"{what}: {kind} of micro-batch {mb}, chunk {chunk} comes {why}")
        done[kind].add(key)
    missing = sorted({(mb, c) for mb in range(m) for c in range(v)} - done["B"])
    if missing:
        raise ValueError(f"{what}: the schedule never backwards (micro-batch, chunk) {missing[:4]}: {m} micro-batches "
                         f"x {v} chunk(s)")
    return chunks, actions, done["W"]


# ---------------------------------------------------------------------------
# Exercise 9: run_pipeline_zb
# ---------------------------------------------------------------------------

def _stage_of(style, size, rank, chunk):
    """The pipeline stage of this rank's `chunk`: "loop" chunk * p + rank, "v" rank then 2p - 1 - rank."""
    ### BEGIN SOLUTION
    if style == "v":
        return rank if chunk == 0 else 2 * size - 1 - rank
    return chunk * size + rank
    ### END SOLUTION


def _owner(style, size, stage):
    """The group rank that holds `stage` (the inverse of _stage_of)."""
    ### BEGIN SOLUTION
    if style == "v":
        return stage if stage < size else 2 * size - 1 - stage
    return stage % size
    ### END SOLUTION


def _zb_forward(state, mb, chunk):
    """("F", mb, chunk): the input (data, a local hand-over, or a tagged receive), the chunk, the output passed on."""
    ### BEGIN SOLUTION
    stage, p, rank = _stage_of(state["style"], state["size"], state["rank"], chunk), state["size"], state["rank"]
    if stage == 0:
        x = state["microbatches"][mb]
    elif _owner(state["style"], p, stage - 1) == rank:
        x = state["local"].pop(("F", mb, stage))  # my other chunk's output, already a new leaf
    else:
        x = torch.empty(state["shape"], dtype=state["dtype"], device=state["device"])
        dist.recv(x, group=state["group"], group_src=_owner(state["style"], p, stage - 1), tag=ACTIVATION_TAG)
        x.requires_grad_()
    y = state["chunks"][chunk](x)  # [b, h] -> [b, h]
    state["inputs"][(mb, chunk)] = x
    if stage == state["last_stage"]:
        loss = state["loss_fn"](y, state["targets"][mb]) / state["num_microbatches"]
        state["losses"].append(loss.item())
        state["outputs"][(mb, chunk)] = loss
    else:
        state["outputs"][(mb, chunk)] = y
        peer = _owner(state["style"], p, stage + 1)
        if peer == rank:
            state["local"][("F", mb, stage + 1)] = y.detach().requires_grad_()  # cut the graph, as a send would
        else:
            state["forward_sends"][(mb, chunk)] = dist.isend(y.contiguous(), group=state["group"], group_dst=peer,
                                                             tag=ACTIVATION_TAG)
    ### END SOLUTION


def _zb_backward(state, mb, chunk):
    """("B", mb, chunk): the output's gradient; B only (W kept for later) if the list has this W, else the whole
    backward; the input's gradient passed back."""
    ### BEGIN SOLUTION
    stage, p, rank = _stage_of(state["style"], state["size"], state["rank"], chunk), state["size"], state["rank"]
    x = state["inputs"].pop((mb, chunk))
    y = state["outputs"].pop((mb, chunk))
    grad = None  # the last stage's output is its loss
    if stage != state["last_stage"]:
        peer = _owner(state["style"], p, stage + 1)
        if peer == rank:
            grad = state["local"].pop(("B", mb, stage))
        else:
            grad = torch.empty(state["shape"], dtype=state["dtype"], device=state["device"])
            dist.recv(grad, group=state["group"], group_src=peer, tag=GRADIENT_TAG)
            state["forward_sends"].pop((mb, chunk)).wait()  # its gradient is back: the activation arrived long ago
    inputs = [x] if stage != 0 else []  # the first stage's input is data: no gradient
    if (mb, chunk) in state["deferred"]:
        input_grads, state["weights"][(mb, chunk)] = backward_input(y, grad, inputs,
                                                                    list(state["chunks"][chunk].parameters()))
    else:
        torch.autograd.backward(y, grad)
        input_grads = [x.grad] if stage != 0 else []
    del y, grad
    if stage != 0:
        peer = _owner(state["style"], p, stage - 1)
        if peer == rank:
            state["local"][("B", mb, stage - 1)] = input_grads[0]
        else:
            state["backward_sends"].append(dist.isend(input_grads[0].contiguous(), group=state["group"],
                                                      group_dst=peer, tag=GRADIENT_TAG))
    ### END SOLUTION


def _zb_weight(state, mb, chunk):
    """("W", mb, chunk): the weight gradients its B left, accumulated; what B kept for it is dropped."""
    ### BEGIN SOLUTION
    backward_weight(state["weights"].pop((mb, chunk)))
    ### END SOLUTION


def run_pipeline_zb(stage_module, schedule, microbatches, targets, loss_fn, *, pp_group, style="loop"):
    """Execute this rank's F / B / W / F&B `schedule` with real P2P; the mean loss (a float) on the rank that
    holds the last stage (group rank p - 1 in the loop, rank 0 in the V), None elsewhere."""
    ### BEGIN SOLUTION
    size, rank = _group_size_rank(pp_group, "run_pipeline_zb")
    chunks, actions, deferred = _check_zb_args(stage_module, schedule, microbatches, targets, style, size)
    first = microbatches[0]
    state = {
        "style": style, "size": size, "rank": rank, "group": pp_group, "chunks": chunks, "loss_fn": loss_fn,
        "microbatches": microbatches, "targets": targets, "num_microbatches": len(microbatches),
        "shape": tuple(first.shape), "dtype": first.dtype, "device": first.device,
        "last_stage": len(chunks) * size - 1, "deferred": deferred,
        "inputs": {}, "outputs": {},  # (mb, chunk) -> what B needs, dropped by B
        "weights": {},  # (mb, chunk) -> what W needs (backward_input's state), dropped by W
        "forward_sends": {}, "backward_sends": [], "local": {}, "losses": [],
    }
    steps = {"F": _zb_forward, "B": _zb_backward, "W": _zb_weight}
    for kind, mb, chunk in actions:
        steps[kind](state, mb, chunk)
    for work in state["backward_sends"]:
        work.wait()
    state["backward_sends"].clear()
    if _owner(style, size, state["last_stage"]) == rank:
        return float(sum(state["losses"]))
    return None
    ### END SOLUTION
