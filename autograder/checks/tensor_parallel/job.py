"""Assignment 02 as a job: your tensor-parallel layers and loss train a small MLP language head.

In the notebook (ranks forked by run_distributed):

    result = tensor_parallel_job(globals(), tp=2, sequence_parallel=True, steps=4)

As a job (autograder/runtime/launch.py):

    python -m autograder.runtime.launch export tensor_parallel_lab.ipynb --out train_02.py
    torchrun --standalone --nproc-per-node 2 train_02.py --tp 2 --sequence-parallel true

The model, `[s, b, h]` in float64: `h = x + ParallelMLP(LayerNorm(x))`, then a
`ColumnParallelLinear` head over the vocabulary (its logits stay sharded,
`gather_output=False`) and your `vocab_parallel_cross_entropy`, averaged over
the tokens. With sequence parallelism each rank holds `[s/t, b, h]` of the
input, the LayerNorm's parameters are marked `.sequence_parallel` and summed by
your `allreduce_sequence_parallel_grads` after backward. SGD on the shards;
every TP rank computes the same loss. Weights from a seed (as `master_weight`),
a new batch every step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["tensor_parallel_job", "NEEDS"]

NEEDS = ("ParallelMLP", "ColumnParallelLinear", "vocab_parallel_cross_entropy", "allreduce_sequence_parallel_grads")


def _masters(hidden, ffn, vocab, seed):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=0.5):
        return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)
    return {"ln_weight": 1.0 + randn(hidden, scale=0.1), "ln_bias": randn(hidden, scale=0.1),
            "fc1_weight": randn(ffn, hidden), "fc1_bias": randn(ffn), "fc2_weight": randn(hidden, ffn),
            "fc2_bias": randn(hidden), "head_weight": randn(vocab, hidden)}


def _job_rank(rank, world_size, fns, masters, data, sp, lr):
    from autograder.runtime.launch import job_device

    group = dist.group.WORLD
    device = job_device()  # the CPU on gloo, this rank's GPU on NCCL
    masters = {k: v.to(device) for k, v in masters.items()}
    hidden, ffn, vocab = masters["fc1_weight"].shape[1], masters["fc1_weight"].shape[0], masters["head_weight"].shape[0]
    model = nn.Module()
    model.norm = nn.LayerNorm(hidden, dtype=torch.float64, device=device)
    with torch.no_grad():
        model.norm.weight.copy_(masters["ln_weight"])
        model.norm.bias.copy_(masters["ln_bias"])
    if sp:  # replicated, fed a sequence shard: partial gradients, summed after backward
        model.norm.weight.sequence_parallel = True
        model.norm.bias.sequence_parallel = True
    model.mlp = fns["ParallelMLP"](hidden, ffn, tp_group=group, sequence_parallel=sp,
                                   master_fc1_weight=masters["fc1_weight"], master_fc1_bias=masters["fc1_bias"],
                                   master_fc2_weight=masters["fc2_weight"], master_fc2_bias=masters["fc2_bias"])
    model.head = fns["ColumnParallelLinear"](hidden, vocab, tp_group=group, bias=False, gather_output=False,
                                             sequence_parallel=sp, master_weight=masters["head_weight"])
    losses = []
    for x, target in data:
        x, target = x.to(device), target.to(device)
        if sp:
            x = x.chunk(world_size, dim=0)[rank]  # [s, b, h] -> [s/t, b, h]: this rank's sequence shard
        h = x + model.mlp(model.norm(x))  # [s(/t), b, h]
        logits = model.head(h)  # [s, b, v/t]
        loss = fns["vocab_parallel_cross_entropy"](logits, target, tp_group=group).mean()
        loss.backward()
        if sp:
            fns["allreduce_sequence_parallel_grads"](model, tp_group=group)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(lr * p.grad)
                    p.grad = None
        losses.append(loss.item())
    return losses


def tensor_parallel_job(namespace: dict, *, tp: int = 2, sequence_parallel: bool = True, steps: int = 4,
                        seq: int = 8, batch: int = 2, hidden: int = 8, ffn: int = 16, vocab: int = 16,
                        lr: float = 0.1, seed: int = 0, timeout: float = 60.0, backend: str = "gloo") -> dict:
    """Train a LayerNorm -> ParallelMLP -> vocabulary head with your TP layers on `tp` ranks; log each step's loss.

    `namespace`: where your classes and functions are (the notebook's `globals()`); `backend`: "gloo" (CPU
    ranks) or "nccl" (a GPU per rank; as a job, `--backend`).
    Returns {"losses": [(step, loss), ...]}.
    """
    missing = [n for n in NEEDS if not callable(namespace.get(n))]
    if missing:
        raise ValueError(f"tensor_parallel_job: the job needs your {', '.join(missing)}: define them in their "
                         f"answer cells and run those cells first")
    if ffn % tp or vocab % tp or (sequence_parallel and seq % tp):
        raise ValueError(f"tensor_parallel_job: ffn ({ffn}), vocab ({vocab})"
                         f"{f' and seq ({seq})' if sequence_parallel else ''} must divide by tp ({tp})")
    from autograder.runtime.dist import run_distributed
    from autograder.runtime.launch import running_as_job

    masters = _masters(hidden, ffn, vocab, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    data = [(torch.randn(seq, batch, hidden, generator=gen, dtype=torch.float64),
             torch.randint(0, vocab, (seq, batch), generator=gen)) for _ in range(steps)]
    fns = {n: namespace[n] for n in NEEDS}
    results = run_distributed(_job_rank, tp, timeout=timeout, backend=backend,
                              args=(fns, masters, data, sequence_parallel, lr))
    losses = [(step + 1, results[0][step]) for step in range(steps)]
    if not running_as_job() or dist.get_rank() == 0:
        for step, loss in losses:
            print(f"step {step} loss {loss!r}", flush=True)
    return {"losses": losses}
