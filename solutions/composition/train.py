"""Reference solution, assignment 06 (part 2): training the small GPT on DP x TP and PP x DP x TP with PyTorch's APIs.

The pieces, in the order a training script applies them (torchtitan's
`parallelize_llama` and `pipeline_llama`, Megatron's `finalize_model_grads` and
`get_grad_norm_fp32` for the glue):

    stage = split_model_for_pipeline(model, pp_rank=..., pp_size=...)   # PP: this rank's layers
    apply_tensor_parallel(stage, mesh["tp"])                            # TP + SP plan, head re-tied
    apply_fsdp(stage, mesh["dp"])                                       # FSDP2 over the DP dimension
    schedule = build_schedule(stage, pp_group=..., n_microbatches=..., loss_fn=pipeline_loss_fn)
    loss = pipeline_train_step(schedule, batch, stage_module=stage, optimizer=..., ...)

`pipeline_train_step` runs the schedule inside one `loss_parallel()`, then
the glue: tied-embedding gradients all-reduced between the first and last stage
(`allreduce_tied_embedding_grads`), gradients clipped by the norm of the whole
model across the mesh (`clip_grad_norm_`), the optimizer step, and the loss
averaged over micro-batches and DP ranks exactly once (`reduce_loss_for_logging`).

Tested by:  .venv/bin/python -m pytest -q tests/test_composition_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module,
)

__all__ = [
    "apply_tensor_parallel", "apply_fsdp", "pipeline_loss_fn", "reduce_loss_for_logging",
    "allreduce_tied_embedding_grads", "clip_grad_norm_", "split_model_for_pipeline", "build_schedule",
    "pipeline_train_step",
]


# ---------------------------------------------------------------------------
# Exercise 4: the tensor-parallel plan (with sequence parallelism)
# ---------------------------------------------------------------------------

def apply_tensor_parallel(model, tp_mesh):
    """Shard `model` (a TinyGPT, or one pipeline stage of it) over `tp_mesh` with TP + SP; return it.

    Megatron's layout with PyTorch's styles (torchtitan's `apply_tp`):
    q, k, v and w1, w3 column-parallel; wo and w2 row-parallel with their output
    reduce-scattered along the sequence (`Shard(1)`); the norms sequence-parallel;
    each block's attention and feed-forward inputs all-gathered (`Shard(1)` ->
    `Replicate()`); the embedding row-parallel over the vocabulary with its output
    sequence-sharded; the output head column-parallel over the vocabulary, its
    logits left as a `Shard(-1)` DTensor for `loss_parallel()`. Parts that are
    `None` on a pipeline stage are skipped. `parallelize_module` replaces each
    parameter by a new DTensor Parameter, which unties the head from the
    embedding: tie them again after it (before FSDP).
    """
    ### BEGIN SOLUTION
    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
    if model.tok_embeddings is not None and model.output is not None:
        model.output.weight = model.tok_embeddings.weight  # parallelize_module untied them
    return model
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 5: FSDP2 over the data-parallel dimension
# ---------------------------------------------------------------------------

def apply_fsdp(model, dp_mesh, *, reshard_after_forward: bool = True):
    """`fully_shard` every transformer block, then the root (embedding, final norm, head), over `dp_mesh`; return it.

    One FSDP unit per block: each block's parameters are all-gathered just before
    its forward (and again for its backward) and its gradients reduce-scattered
    right after its backward, so at most a block or two are ever unsharded. On a
    tensor-parallel model the parameters are already DTensors on the TP mesh;
    FSDP2 shards them again over `dp_mesh` (2-D: `(Shard(0), Shard(k))`).
    """
    ### BEGIN SOLUTION
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    return model
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 6: the loss, averaged exactly once
# ---------------------------------------------------------------------------

def pipeline_loss_fn(logits, labels):
    """The loss the pipeline schedule calls on each micro-batch: mean cross-entropy over its tokens.

    `logits` `[b, s, vocab]` (a `Shard(-1)` DTensor under `loss_parallel()`),
    `labels` `[b, s]`. Averaged over this micro-batch's tokens only: the schedule
    divides the gradients by the number of micro-batches (`scale_grads=True`)
    and FSDP averages them over the DP ranks, so dividing here too would
    average twice.
    """
    ### BEGIN SOLUTION
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    ### END SOLUTION


def reduce_loss_for_logging(losses, *, dp_group) -> float:
    """The loss of the global batch from the last stage's per-micro-batch losses: one number, every DP rank.

    `losses`: the list the schedule filled (one 0-d loss per micro-batch, tensors
    or DTensors). Mean over the micro-batches, then the mean over the DP group
    (`all_reduce` with `ReduceOp.AVG`): each is averaged exactly once. Returns a
    Python float.
    """
    ### BEGIN SOLUTION
    values = [loss.full_tensor() if isinstance(loss, DTensor) else loss for loss in losses]
    local = torch.stack([v.detach().reshape(()) for v in values]).mean()
    dist.all_reduce(local, op=dist.ReduceOp.AVG, group=dp_group)
    return local.item()
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 7: the tied embedding across pipeline stages
# ---------------------------------------------------------------------------

def allreduce_tied_embedding_grads(stage_module, *, embedding_group) -> None:
    """Sum the gradient of the embedding (first stage) and of its copy, the head (last stage).

    Megatron's `finalize_model_grads._allreduce_word_embedding_grads`: the first
    and last stages hold identical copies of the tied weight; after the pipeline
    step, before clipping, their gradients are all-reduced over the embedding
    group (the first and last rank of this pipeline group), so both copies take
    the same update. `embedding_group` is None on a middle stage (nothing to
    do); a group of one (no pipeline: the weight is tied in one module) communicates nothing.
    Gradients are DTensors under TP/FSDP: all-reduce their local shards.
    """
    ### BEGIN SOLUTION
    if embedding_group is None or embedding_group.size() == 1:
        return
    if stage_module.tok_embeddings is not None:
        weight = stage_module.tok_embeddings.weight
    else:
        weight = stage_module.output.weight
    grad = weight.grad
    local = grad.to_local() if isinstance(grad, DTensor) else grad
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=embedding_group)
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 8: gradient clipping by the norm of the whole model
# ---------------------------------------------------------------------------

def clip_grad_norm_(parameters, max_norm: float, *, pp_group) -> torch.Tensor:
    """Clip this stage's gradients by the 2-norm of ALL the model's gradients; return that norm (0-d, float64).

    The parameters are this stage's, with DTensor gradients on one mesh (FSDP over
    DP, TP). Megatron's `get_grad_norm_fp32`: every distinct gradient element
    counted once, i.e. each sharded piece once and a piece replicated over a mesh
    dimension (the norm scales under sequence parallelism: `Replicate()` over TP)
    once, not once per replica; the squared norms of all pipeline stages summed
    over `pp_group`; a parameter marked `.shared = True` (the tied head's copy on
    the last stage) not counted (Megatron's `param_is_not_shared`), though it is
    clipped. Then, as `torch.nn.utils.clip_grads_with_norm_`: multiply every
    gradient by `max_norm / (total_norm + 1e-6)` if that is below 1. The
    returned norm is the same on every rank.
    """
    ### BEGIN SOLUTION
    params = [p for p in parameters if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64)
    mesh = None
    for p in params:
        grad = p.grad
        if isinstance(grad, DTensor):
            mesh = grad.device_mesh
            coordinate = mesh.get_coordinate()
            replica = any(isinstance(pl, Replicate) and c != 0 for pl, c in zip(grad.placements, coordinate))
            grad = grad.to_local()
        else:
            replica = False
        if getattr(p, "shared", False) or replica:
            continue  # counted elsewhere: on the first stage, or on the rank at coordinate 0
        squares = squares + grad.detach().double().pow(2).sum()
    if mesh is not None:  # every distinct piece of this stage, summed over the whole mesh
        for dim in range(mesh.ndim):
            dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=mesh.get_group(dim))
    dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=pp_group)  # + the other stages
    total = squares.sqrt()
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1.0:
        for p in params:
            p.grad.mul_(coef)
    return total
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 9: the pipeline
# ---------------------------------------------------------------------------

def split_model_for_pipeline(model, *, pp_rank: int, pp_size: int):
    """Keep only pipeline stage `pp_rank`'s part of `model` (in place); return it.

    The layers are split evenly and in order: stage r keeps layers
    `[r*L/p, (r+1)*L/p)` (deleted from the `ModuleDict`, so the kept ones keep
    their global names); the first stage keeps `tok_embeddings`, the last keeps
    `norm` and `output` (which still holds the tied weight: with p > 1 the last
    stage owns a copy of the embedding, Megatron's way); every other part is set
    to None. ValueError if L is not divisible by p or pp_rank is out of range.
    """
    ### BEGIN SOLUTION
    n_layers = len(model.layers)
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"split_model_for_pipeline: pp_rank ({pp_rank}) must be in [0, {pp_size})")
    if n_layers % pp_size:
        raise ValueError(f"split_model_for_pipeline: the {n_layers} layers are not divisible by pp_size ({pp_size})")
    per_stage = n_layers // pp_size
    keep = {str(i) for i in range(pp_rank * per_stage, (pp_rank + 1) * per_stage)}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if pp_rank != 0:
        model.tok_embeddings = None
    if pp_rank != pp_size - 1:
        model.norm = None
        model.output = None
    return model
    ### END SOLUTION


def build_schedule(stage_module, *, pp_group, n_microbatches: int, loss_fn):
    """A 1F1B schedule for this rank's stage: `PipelineStage` on the CPU, stage index = rank in `pp_group`."""
    ### BEGIN SOLUTION
    stage = PipelineStage(stage_module, pp_group.rank(), pp_group.size(), torch.device("cpu"), group=pp_group)
    return Schedule1F1B(stage, n_microbatches, loss_fn=loss_fn)
    ### END SOLUTION


def pipeline_train_step(schedule, batch: dict, *, stage_module, optimizer, pp_group, dp_group, embedding_group,
                        max_norm: float):
    """One training step of the pipeline; the loss of the global batch on the last stage, None elsewhere.

    `batch` is this rank's `local_batch` (tokens go in at the first stage, labels
    at the last). The order matters: the schedule runs inside ONE
    `loss_parallel()` (it cannot be nested, and the loss's backward runs inside
    `step`); then the tied embedding's gradients are summed between the first and
    last stage; then the head's copy is marked `.shared = True` (after TP and FSDP,
    which replaced the parameter objects) and the gradients are clipped by the
    norm of the whole model; then the optimizer steps and the gradients are zeroed.
    """
    ### BEGIN SOLUTION
    first, last = pp_group.rank() == 0, pp_group.rank() == pp_group.size() - 1
    losses = []
    with loss_parallel():
        if first and last:
            schedule.step(batch["tokens"], target=batch["labels"], losses=losses)
        elif first:
            schedule.step(batch["tokens"])
        elif last:
            schedule.step(target=batch["labels"], losses=losses)
        else:
            schedule.step()
    allreduce_tied_embedding_grads(stage_module, embedding_group=embedding_group)
    if last and not first:
        stage_module.output.weight.shared = True  # the copy: clipped, not counted in the norm
    clip_grad_norm_(stage_module.parameters(), max_norm, pp_group=pp_group)
    optimizer.step()
    optimizer.zero_grad()
    return reduce_loss_for_logging(losses, dp_group=dp_group) if last else None
    ### END SOLUTION
