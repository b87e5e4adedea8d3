"""What a sharded checkpoint costs (assignment 06, 06_to_a_cluster.md): the bytes DCP writes, in all and per rank.

    from autograder.lessons.checkpoint import checkpoint_bytes, CAPSTONE
    checkpoint_bytes(LLAMA3_70B, Layout(tp=8, pp=4, dp=32), stages)  # bf16 weights + AdamW's fp32 state: 14 B/param
    checkpoint_bytes(CAPSTONE, Layout(tp=2, dp=2), [CAPSTONE.num_params()], param_bytes=8, optim_bytes=16)

A checkpoint written with `torch.distributed.checkpoint` (DCP) holds every
distinct piece of the model and optimizer state once: a shard is written by
the rank that holds it, a piece held by several ranks (a weight replicated
over DP without ZeRO-3, a norm scale replicated over TP, the tied head's copy
on the last pipeline stage) by one of them (`dedup_save_plans`). So the total
is the model's parameters times the bytes saved per parameter (the weights,
`param_bytes`, and the optimizer's state, `optim_bytes`: AdamW's fp32 master
copy and two moments in mixed precision, or its two moments for a model
trained in float32/float64), whatever the layout; gradients are not saved.
Per rank: the ranks of one pipeline stage (tp x cp x dp of them) share what
the stage holds; `per_rank` is the fullest stage's share, assuming the
replicated pieces are spread evenly (DCP's planner gives each one to the rank
with the least to write so far, which comes close). Not counted: AdamW's step
counters (one scalar per parameter tensor), the metadata file, and the
format's few bytes per tensor.

Each stage's parameter count is an argument: counting it is exercise 10 of
assignment 06 (`stage_params`), and this module ships to students. The
lesson's numbers are checked with the reference's count (tests/test_jobs.py).
"""

from __future__ import annotations

from autograder.lessons.planner import Layout, ModelConfig

__all__ = ["CAPSTONE", "checkpoint_bytes"]

# The capstone's job model (autograder/checks/composition/job.py: TinyGPT with ModelArgs(n_layers=4)) as a shape.
CAPSTONE = ModelConfig("capstone TinyGPT", n_layers=4, hidden=8, ffn=16, n_heads=2, n_kv_heads=2, vocab=16,
                       swiglu=True, tied_embeddings=True)


def checkpoint_bytes(model: ModelConfig, layout: Layout, stage_params: list[int], *, param_bytes: int = 2,
                     optim_bytes: int = 12) -> dict:
    """{"total", "per_rank", "stage"}: the bytes of one checkpoint, and of the fullest stage's ranks (each).

    `stage_params[s]` is the number of parameters pipeline stage s writes: what
    the stage holds in all (assignment 06's exercise 10 counts it per GPU), the
    last stage's copy of a tied head left out (it is the embedding's piece,
    written once). `total` = their sum x (param_bytes + optim_bytes); `per_rank`
    = the fullest stage's x (param_bytes + optim_bytes) / (tp x cp x dp);
    `stage` = that stage.
    """
    if len(stage_params) != layout.pp:
        raise ValueError(f"stage_params: one count per pipeline stage ({layout.pp}), got {len(stage_params)}")
    if sum(stage_params) != model.num_params():
        raise ValueError(f"stage_params sum to {sum(stage_params):,}, the model has {model.num_params():,} "
                         f"parameters: every parameter belongs to exactly one stage")
    per_param = param_bytes + optim_bytes
    fullest = max(range(layout.pp), key=lambda s: stage_params[s])
    return {"total": sum(stage_params) * per_param,
            "per_rank": stage_params[fullest] * per_param / (layout.tp * layout.cp * layout.dp), "stage": fullest}
