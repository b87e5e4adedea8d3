"""Assignment 01 as a job: your BucketedDDP, ZeroShardedOptimizer or fully_shard train a small transformer.

In the notebook (ranks forked by run_distributed):

    result = data_parallel_job(globals(), strategy="ddp", world_size=2, steps=4)

As a job (autograder/runtime/launch.py):

    python -m autograder.runtime.launch export data_parallel_lab.ipynb --out train_01.py
    torchrun --standalone --nproc-per-node 2 train_01.py --strategy zero --world-size 2

The model is the FSDP checks' `TinyTransformer` (tied head, a root parameter),
in float64, from a seed; every step trains on its own global batch, rank r
taking rows `[r*batch, (r+1)*batch)`. The strategies: `ddp` (your BucketedDDP,
torch's AdamW), `zero` (your ZeroShardedOptimizer, AdamW on each rank's
shard), `fsdp` (your fully_shard per block and on the root, torch's AdamW on
the flat shards). The logged loss of a step is the mean of the ranks' local
means: the loss of the global batch (equal local batches).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .fsdp import TinyTransformer

__all__ = ["data_parallel_job", "STRATEGIES"]

# strategy -> the names of your notebook it needs
STRATEGIES = {"ddp": ("BucketedDDP",), "zero": ("ZeroShardedOptimizer",), "fsdp": ("fully_shard",)}
_MODEL = dict(vocab=11, hidden=8, ffn=12, seq=5, layers=2, tied=True)


def _job_rank(rank, world_size, strategy, impl, data, batch, lr, seed, bucket_cap_mb):
    from autograder.runtime.launch import job_device

    group = dist.group.WORLD
    device = job_device()  # the CPU on gloo, this rank's GPU on NCCL
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyTransformer(**_MODEL).double().to(device)
    if strategy == "ddp":
        model = impl(model, group=group, bucket_cap_mb=bucket_cap_mb)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
    elif strategy == "zero":
        opt = impl(model.parameters(), group=group, lr=lr)  # torch.optim.AdamW on this rank's shard
    else:
        for block in model.blocks:
            impl(block, group=group)
        model = impl(model, group=group) or model
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rows = slice(rank * batch, (rank + 1) * batch)
    losses = []
    for tokens, labels in data:
        logits = model(tokens[rows].to(device))  # [batch, seq, vocab]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[rows].to(device).reshape(-1))
        loss.backward()
        if strategy == "ddp":
            model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def data_parallel_job(namespace: dict, *, strategy: str = "ddp", world_size: int = 2, steps: int = 4,
                      batch: int = 2, lr: float = 1e-2, seed: int = 0, bucket_cap_mb: float = 0.0005,
                      timeout: float = 60.0, backend: str = "gloo") -> dict:
    """Train a small transformer with your data parallelism (ddp, zero or fsdp); log each step's loss.

    `namespace`: where your classes are (the notebook's `globals()`); `backend`: "gloo" (CPU ranks) or "nccl"
    (a GPU per rank; as a job, `--backend`). Returns
    {"losses": [(step, loss of the global batch), ...]}.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"data_parallel_job: strategy must be one of {sorted(STRATEGIES)}, got {strategy!r}")
    name = STRATEGIES[strategy][0]
    if not callable(namespace.get(name)):
        raise ValueError(f"data_parallel_job: strategy {strategy!r} needs your {name}: define it in its answer "
                         f"cell and run that cell first")
    if world_size < 1 or steps < 1 or batch < 1:
        raise ValueError(f"data_parallel_job: world_size ({world_size}), steps ({steps}) and batch ({batch}) "
                         f"must be >= 1")
    from autograder.runtime.dist import run_distributed
    from autograder.runtime.launch import running_as_job

    gen = torch.Generator().manual_seed(seed + 1)
    rows = world_size * batch
    data = [(torch.randint(0, _MODEL["vocab"], (rows, _MODEL["seq"]), generator=gen),
             torch.randint(0, _MODEL["vocab"], (rows, _MODEL["seq"]), generator=gen)) for _ in range(steps)]
    results = run_distributed(_job_rank, world_size, timeout=timeout, backend=backend,
                              args=(strategy, namespace[name], data, batch, lr, seed, bucket_cap_mb))
    losses = [(step + 1, sum(r[step] for r in results) / world_size) for step in range(steps)]
    if not running_as_job() or dist.get_rank() == 0:
        for step, loss in losses:
            print(f"step {step} loss {loss!r}", flush=True)
    return {"losses": losses}
