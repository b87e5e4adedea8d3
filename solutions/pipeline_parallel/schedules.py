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

__all__ = ["gpipe_schedule", "one_f_one_b_schedule", "bubble_fraction", "interleaved_1f1b_schedule"]


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
