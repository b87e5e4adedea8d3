"""What a sharded checkpoint costs (assignment 06, 06_to_a_cluster.md): the bytes DCP writes, in all and per rank.

    from autograder.lessons.checkpoint import checkpoint_bytes, CAPSTONE
    from autograder.lessons.planner import LLAMA3_70B, Layout
    checkpoint_bytes(LLAMA3_70B, Layout(tp=8, pp=4, dp=32))   # bf16 weights + AdamW's fp32 state: 14 B/param
    checkpoint_bytes(CAPSTONE, Layout(tp=2, dp=2), param_bytes=8, optim_bytes=16)   # the capstone, float64

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
"""

from __future__ import annotations

from autograder.lessons.planner import Layout, ModelConfig, layers_on_stage

__all__ = ["CAPSTONE", "stage_unique_params", "checkpoint_bytes"]

# The capstone's job model (autograder/checks/composition/job.py: TinyGPT with ModelArgs(n_layers=4)) as a shape.
CAPSTONE = ModelConfig("capstone TinyGPT", n_layers=4, hidden=8, ffn=16, n_heads=2, n_kv_heads=2, vocab=16,
                       swiglu=True, tied_embeddings=True)


def stage_unique_params(model: ModelConfig, layout: Layout, stage: int) -> int:
    """Parameters pipeline stage `stage` writes: its layers, the embedding on stage 0, the final norm and the head
    (unless tied: the last stage's copy of a tied head is the embedding's piece, written once) on the last."""
    params = layers_on_stage(model.n_layers, layout.pp, stage) * model.layer_params()
    if stage == 0:
        params += model.embedding_params()
    if stage == layout.pp - 1:
        params += model.hidden + (0 if model.tied_embeddings else model.embedding_params())
    return params


def checkpoint_bytes(model: ModelConfig, layout: Layout, *, param_bytes: int = 2, optim_bytes: int = 12) -> dict:
    """{"total", "per_rank", "stage"}: the bytes of one checkpoint, and of the fullest stage's ranks (each).

    `total` = unique parameters x (param_bytes + optim_bytes); `per_rank` = the
    fullest stage's parameters x (param_bytes + optim_bytes) / (tp x cp x dp);
    `stage` = that stage.
    """
    per_param = param_bytes + optim_bytes
    stages = [stage_unique_params(model, layout, s) for s in range(layout.pp)]
    fullest = max(range(layout.pp), key=lambda s: stages[s])
    total = sum(stages) * per_param
    assert sum(stages) == model.num_params(), "every parameter belongs to exactly one stage"
    return {"total": total, "per_rank": stages[fullest] * per_param / (layout.tp * layout.cp * layout.dp),
            "stage": fullest}
