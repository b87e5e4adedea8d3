"""Reference solution, assignment 03 (part 2): pipeline schedules as data, and the bubble.

A schedule is a pure function of (number of stages, this stage, number of
micro-batches): the ordered list of actions this stage runs, `("F", mb)` (the
forward of micro-batch `mb`) and `("B", mb)` (its backward); with chunks,
`("F", mb, chunk)` / `("B", mb, chunk)`. No communication and no model: the
executor (solutions/pipeline_parallel/executor.py) runs any such list, and a
test can compare the lists with what Megatron-LM and torch.distributed.pipelining
execute.

- `gpipe_schedule`: all forwards, then all backwards (Huang et al. 2019).
- `one_f_one_b_schedule`: Megatron-LM `forward_backward_pipelining_without_interleaving`:
  `min(p - stage - 1, m)` warm-up forwards, then one forward and one backward
  alternately, then the remaining backwards (PipeDream-Flush, Narayanan et al. 2021).
- `interleaved_1f1b_schedule`: Megatron-LM `forward_backward_pipelining_with_interleaving`
  with `num_chunks` model chunks per rank (virtual stages), micro-batches in
  groups of `p` per chunk, warm-up `(p - stage - 1) * 2 + (v - 1) * p` (`get_pp_rank_microbatches`).
- `bubble_fraction`: the idle fraction (p - 1) / (v m + p - 1) of a rank.

Tested by:  .venv/bin/python -m pytest -q tests/test_pipeline_parallel_solutions.py
"""

from __future__ import annotations

__all__ = ["gpipe_schedule", "one_f_one_b_schedule", "bubble_fraction", "interleaved_1f1b_schedule", "zb_h1_schedule",
           "dualpipev_schedule"]


# ---------------------------------------------------------------------------
# Given helper (no exercise): argument checks shared by the schedules
# ---------------------------------------------------------------------------

def _check_schedule_args(num_stages, stage, num_microbatches, what: str) -> None:
    """ValueError unless 1 <= num_stages, 0 <= stage < num_stages and 1 <= num_microbatches (all ints)."""
    for name, value in (("num_stages", num_stages), ("stage", stage), ("num_microbatches", num_microbatches)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{what}: {name} must be an int, got {value!r}")
    if num_stages < 1:
        raise ValueError(f"{what}: num_stages must be >= 1, got {num_stages}")
    if not 0 <= stage < num_stages:
        raise ValueError(f"{what}: stage {stage} is outside 0 .. {num_stages - 1} (num_stages = {num_stages})")
    if num_microbatches < 1:
        raise ValueError(f"{what}: num_microbatches must be >= 1, got {num_microbatches}")


def _check_positive_ints(what: str, **values) -> None:
    """ValueError unless every value is an int >= 1 (bools are not ints here)."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{what}: {name} must be an int >= 1, got {value!r}")


# ---------------------------------------------------------------------------
# Exercise 2: GPipe and 1F1B
# ---------------------------------------------------------------------------

def gpipe_schedule(num_stages, stage, num_microbatches):
    """GPipe: every forward, then every backward, both in micro-batch order (FIFO)."""
    ### BEGIN SOLUTION
    _check_schedule_args(num_stages, stage, num_microbatches, "gpipe_schedule")
    forwards = [("F", mb) for mb in range(num_microbatches)]
    backwards = [("B", mb) for mb in range(num_microbatches)]  # FIFO: micro-batch 0 first
    return forwards + backwards
    ### END SOLUTION


def one_f_one_b_schedule(num_stages, stage, num_microbatches):
    """1F1B: warm-up forwards, then one forward / one backward, then cool-down backwards (FIFO).

    Megatron-LM `forward_backward_pipelining_without_interleaving`: the warm-up
    is `min(p - stage - 1, m)` forwards, so stage s never holds more than
    `min(p - s, m)` micro-batches' activations.
    """
    ### BEGIN SOLUTION
    _check_schedule_args(num_stages, stage, num_microbatches, "one_f_one_b_schedule")
    num_warmup = min(num_stages - stage - 1, num_microbatches)
    actions = [("F", mb) for mb in range(num_warmup)]
    for i in range(num_microbatches - num_warmup):  # steady state: forward mb w + i, backward mb i
        actions.append(("F", num_warmup + i))
        actions.append(("B", i))
    for mb in range(num_microbatches - num_warmup, num_microbatches):  # cool-down, still FIFO
        actions.append(("B", mb))
    return actions
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 3: the bubble
# ---------------------------------------------------------------------------

def bubble_fraction(num_stages, num_microbatches, num_chunks=1):
    """The fraction of a pipeline step that a rank is idle: (p - 1) / (v m + p - 1).

    For GPipe and 1F1B (v = 1) and for interleaved 1F1B with v chunks per rank,
    with every stage equally fast. Not Narayanan's ratio (p - 1) / (v m), which
    divides by the busy time instead of the step time.
    """
    ### BEGIN SOLUTION
    _check_positive_ints("bubble_fraction", num_stages=num_stages, num_microbatches=num_microbatches,
                         num_chunks=num_chunks)
    idle = num_stages - 1  # (p - 1) chunk-times of fill and drain
    busy = num_chunks * num_microbatches  # v m chunk-times of work
    return idle / (busy + idle)
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 5: interleaved 1F1B (virtual pipeline stages)
# ---------------------------------------------------------------------------

def interleaved_1f1b_schedule(num_stages, stage, num_microbatches, num_chunks):
    """Interleaved 1F1B: `num_chunks` model chunks per rank; actions ("F", mb, chunk) / ("B", mb, chunk).

    Megatron-LM `forward_backward_pipelining_with_interleaving` with
    `microbatch_group_size_per_vp_stage = p`: forwards visit micro-batches in
    groups of p, each group through chunk 0, 1, ..., v - 1 (`get_schedule_table`);
    backwards visit the same groups through the chunks in reverse. Warm-up
    `(p - stage - 1) * 2 + (v - 1) * p` forwards, capped at m v
    (`get_pp_rank_microbatches`); then one forward / one backward; then the
    remaining backwards.
    """
    ### BEGIN SOLUTION
    _check_schedule_args(num_stages, stage, num_microbatches, "interleaved_1f1b_schedule")
    if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 2:
        raise ValueError(f"interleaved_1f1b_schedule: num_chunks must be an int >= 2 (one chunk is plain "
                         f"1F1B), got {num_chunks!r}")
    if num_microbatches % num_stages != 0:
        raise ValueError(f"interleaved_1f1b_schedule: num_microbatches ({num_microbatches}) must be a "
                         f"multiple of num_stages ({num_stages})")
    p, v, m = num_stages, num_chunks, num_microbatches
    total = m * v
    # (mb, chunk) in forward order: a group of p micro-batches through chunk 0, then chunk 1, ...
    forward_order = [(mb, chunk) for first in range(0, m, p) for chunk in range(v) for mb in range(first, first + p)]
    backward_order = [(mb, v - 1 - chunk) for mb, chunk in forward_order]  # the chunks in reverse
    num_warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    actions = [("F", *forward_order[k]) for k in range(num_warmup)]
    for k in range(total - num_warmup):  # steady state
        actions.append(("F", *forward_order[num_warmup + k]))
        actions.append(("B", *backward_order[k]))
    for k in range(total - num_warmup, total):  # cool-down
        actions.append(("B", *backward_order[k]))
    return actions
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 7: ZB-H1 (zero bubble, handcrafted, 1F1B's memory)
# ---------------------------------------------------------------------------

def zb_h1_schedule(num_stages, stage, num_microbatches):
    """ZB-H1 (Qi et al. 2024, handcrafted): 1F1B with every backward split into B (input gradient) and W (weights),
    stage s running the W of backward k right after backward k + s (the last s of them at the end).

    Actions `("F", mb)`, `("B", mb)`, `("W", mb)`. The same order as torch's
    `ScheduleInterleavedZeroBubble` with one stage per rank (`_get_1f1b_rank_ops`
    with `enable_zero_bubble`): stage 0 runs each W at once, the last stage
    defers p - 1 of them into what was 1F1B's cool-down bubble.
    """
    ### BEGIN SOLUTION
    _check_schedule_args(num_stages, stage, num_microbatches, "zb_h1_schedule")
    p, s, m = num_stages, stage, num_microbatches
    num_warmup = min(p - s - 1, m)
    order = [("F", mb) for mb in range(num_warmup)]  # 1F1B's order, backward kept whole for now
    for i in range(m - num_warmup):
        order += [("F", num_warmup + i), ("B", i)]
    order += [("B", mb) for mb in range(m - num_warmup, m)]
    actions = []
    for action in order:
        actions.append(action)
        if action[0] == "B" and action[1] >= s:
            actions.append(("W", action[1] - s))  # the W of the backward s steps back
    actions += [("W", mb) for mb in range(max(0, m - s), m)]  # the last s Ws fill the cool-down
    return actions
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 8: DualPipeV (two chunks per rank, in a V)
# ---------------------------------------------------------------------------

def dualpipev_schedule(num_stages, stage, num_microbatches):
    """DualPipeV (DeepSeek's DualPipe, cut to a V): rank r holds chunk 0 = stage r and chunk 1 = stage 2p - 1 - r.

    Actions `("F", mb, c)`, `("B", mb, c)`, `("W", mb, c)` and overlapped pairs
    `("F&B", ("F", mb, c), ("B", mb2, c2))`. A `B` whose `W` comes later in the
    list computes the input gradient only; a `B` without one (inside a pair,
    among others) is the whole backward. The order torch's `ScheduleDualPipeV`
    executes, in its eight steps; needs at least 2p micro-batches.
    """
    ### BEGIN SOLUTION
    _check_schedule_args(num_stages, stage, num_microbatches, "dualpipev_schedule")
    p, r, m = num_stages, stage, num_microbatches
    if m < 2 * p:
        raise ValueError(f"dualpipev_schedule: num_microbatches ({m}) must be at least 2 * num_stages "
                         f"({2 * p}): the V has {2 * p} stages")
    actions = []
    count = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}  # the next micro-batch per kind and chunk
    pending_w = []  # (mb, chunk) of split backwards whose W has not run yet, oldest first

    def take(kind, chunk):
        mb = count[kind, chunk]
        count[kind, chunk] += 1
        return (kind, mb, chunk)

    def forward(chunk):
        actions.append(take("F", chunk))

    def backward(chunk, split=False):
        action = take("B", chunk)
        if split:
            pending_w.append(action[1:])
        actions.append(action)

    def weight():
        if pending_w:
            actions.append(("W", *pending_w.pop(0)))

    def pair(f_chunk, b_chunk):  # one forward overlapped with another micro-batch's whole backward
        actions.append(("F&B", take("F", f_chunk), take("B", b_chunk)))

    for _ in range(2 * (p - r - 1)):  # 1: chunk-0 forwards fill the way down
        forward(0)
    for _ in range(r + 1):  # 2: F0 F1, the bottom of the V reached
        forward(0)
        forward(1)
    for _ in range(p - r - 1):  # 3: B1 W1 F1, zero-bubble style
        backward(1, split=True)
        weight()
        forward(1)
    for i in range(m - 2 * p + r + 1):  # 4: the main step, F0&B1 then F1&B0
        if i == 0 and r == p - 1:  # not overlapped, to shrink the bubble
            forward(0)
            backward(1)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(p - r - 1):  # 5: B1, F1&B0
        backward(1)
        pair(1, 0)
    split = False
    for i in range(r + 1):  # 6: B1 B0, the second half split (zero bubble)
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        backward(1, split)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        backward(0, split)
    for _ in range(p - r - 1):  # 7: W, B0
        weight()
        backward(0, split)
    for _ in range(r + 1):  # 8: the remaining Ws
        weight()
    return actions
    ### END SOLUTION
