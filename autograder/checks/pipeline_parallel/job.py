"""Assignment 03 as a job: your schedule and run_pipeline train a stack of stages with real P2P.

In the notebook (ranks forked by run_distributed):

    result = pipeline_job(globals(), stages=2, microbatches=4, schedule="1f1b", steps=4)

As a job (autograder/runtime/launch.py):

    python -m autograder.runtime.launch export pipeline_parallel_lab.ipynb --out train_03.py
    torchrun --standalone --nproc-per-node 4 train_03.py --stages 4 --schedule gpipe

Each rank is one stage, the pipeline checks' `TaggedStage`
(`x + mask * tanh(x W^T + b)`, float64, weights from a seed); every step runs
your schedule's actions for this stage through your `run_pipeline` on a new
batch of `microbatches` micro-batches (MSE loss), then SGD on the stage's
parameters. The last stage logs the mean loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .executor import TaggedStage

__all__ = ["pipeline_job", "SCHEDULES"]

SCHEDULES = {"gpipe": "gpipe_schedule", "1f1b": "one_f_one_b_schedule"}


def _job_rank(rank, world_size, run_pipeline, schedule_fn, weights, biases, data, lr):
    from autograder.runtime.launch import job_device

    group = dist.group.WORLD
    device = job_device()  # the CPU on gloo, this rank's GPU on NCCL
    stage = TaggedStage(weights[rank].to(device), biases[rank].to(device))
    schedule = list(schedule_fn(world_size, rank, len(data[0][0])))
    losses = []
    for microbatches, targets in data:
        microbatches, targets = [x.to(device) for x in microbatches], [t.to(device) for t in targets]
        loss = run_pipeline(stage, schedule, microbatches, targets, F.mse_loss, pp_group=group)
        with torch.no_grad():
            for p in stage.parameters():
                p.sub_(lr * p.grad)
                p.grad = None
        losses.append(None if loss is None else float(loss))
    return losses


def pipeline_job(namespace: dict, *, stages: int = 2, microbatches: int = 4, schedule: str = "1f1b",
                 steps: int = 4, batch: int = 2, hidden: int = 8, lr: float = 0.1, seed: int = 0,
                 timeout: float = 60.0, backend: str = "gloo") -> dict:
    """Train `stages` pipeline stages with your schedule and run_pipeline; log each step's loss (last stage).

    `namespace`: where your functions are (the notebook's `globals()`); `backend`: "gloo" (CPU ranks) or
    "nccl" (a GPU per rank; as a job, `--backend`). Returns {"losses": [(step, loss), ...]}.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline_job: schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    needs = ("run_pipeline", SCHEDULES[schedule])
    missing = [n for n in needs if not callable(namespace.get(n))]
    if missing:
        raise ValueError(f"pipeline_job: the job needs your {', '.join(missing)}: define them in their answer "
                         f"cells and run those cells first")
    from autograder.runtime.dist import run_distributed
    from autograder.runtime.launch import running_as_job

    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(hidden, hidden, generator=gen, dtype=torch.float64) / hidden ** 0.5
               for _ in range(stages)]
    biases = [0.5 * torch.randn(hidden, generator=gen, dtype=torch.float64) for _ in range(stages)]
    data = []
    for _ in range(steps):
        xs = [torch.randn(batch, hidden, generator=gen, dtype=torch.float64) for _ in range(microbatches)]
        ts = [torch.randn(batch, hidden, generator=gen, dtype=torch.float64) for _ in range(microbatches)]
        data.append((xs, ts))
    results = run_distributed(_job_rank, stages, timeout=timeout, backend=backend,
                              args=(namespace["run_pipeline"], namespace[SCHEDULES[schedule]], weights, biases, data,
                                    lr))
    losses = [(step + 1, results[-1][step]) for step in range(steps)]
    if not running_as_job() or dist.get_rank() == 0:
        for step, loss in losses:
            print(f"step {step} loss {loss!r}", flush=True)
    return {"losses": losses}
