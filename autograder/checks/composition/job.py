"""Assignment 06 as a job: your functions train the small GPT on a PP x DP x TP mesh, with a sharded checkpoint.

In the notebook (the ranks forked by run_distributed):

    result = composition_job(globals(), pp=2, dp=2, tp=2, steps=4)
    result["losses"]          # [(step, loss), ...] of the global batch, as the last stage logged them

As a job (autograder/runtime/launch.py: `export`, then one process per rank):

    python -m autograder.runtime.launch export composition_lab.ipynb --out train_06.py
    torchrun --standalone --nproc-per-node 8 train_06.py --pp 2 --dp 2 --tp 2 --steps 4
    torchrun --standalone --nproc-per-node 4 --max-restarts 1 train_06.py --pp 1 --dp 2 --tp 2 --steps 6 \\
        --checkpoint-dir ckpt --checkpoint-every 2

The rank program is the one exercise 9's test runs (`_pp_rank` in train.py, the
same calls in the same order), with a different batch at every step and, with
`checkpoint_dir`, a checkpoint written by `torch.distributed.checkpoint` (DCP)
every `checkpoint_every` steps: model and AdamW state under the keys your
`checkpoint_state` (exercise 13) gives them, the same on every layout, so that
a run on another layout (another PP, DP or TP size) loads the same checkpoint,
each rank reading only the pieces it holds. A run that finds a checkpoint in
`checkpoint_dir` resumes from the latest complete one (torchrun restarts the
job after a rank dies: `--max-restarts`). `simulate_failure="RANK:STEP"` kills
rank RANK (SIGKILL, as the kernel's OOM killer would) after step STEP, in the
first attempt only, so that the restart can be seen.

CP is not trained here (PyTorch's context parallelism needs a GPU attention
kernel; spec 4.6): the mesh is PP x DP x TP, as exercise 9's.
"""

from __future__ import annotations

import os
import re
import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from autograder.lessons.tinygpt import ModelArgs, master_state

from .common import LR, _batch, _full, _rank_logging_to_log_file, _student
from .train import PIPELINE_FUNCTIONS, _student_stage

__all__ = ["composition_job", "latest_checkpoint", "JOB_ARGS"]

# The job's model: 4 layers (2 per stage at PP 2, 4 at PP 1), exercise 9's sizes otherwise.
JOB_ARGS = ModelArgs(n_layers=4)
_CKPT = re.compile(r"^step_(\d+)$")


def _init_optimizer_state(optimizer) -> None:
    """AdamW's state as its first step creates it (zeros, step 0), so that a checkpoint can be loaded into it."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p not in optimizer.state or not optimizer.state[p]:
                optimizer.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32),
                                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


def latest_checkpoint(checkpoint_dir: str) -> tuple[int, str] | None:
    """(step, path) of the newest complete checkpoint (DCP writes `.metadata` last), or None."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return None
    found = []
    for entry in os.listdir(checkpoint_dir):
        m = _CKPT.match(entry)
        path = os.path.join(checkpoint_dir, entry)
        if m and os.path.exists(os.path.join(path, ".metadata")):
            found.append((int(m.group(1)), path))
    return max(found) if found else None


def _job_rank(rank, world_size, fns, pp, dp, tp, args, state, batches, microbatches, max_norm, checkpoint_dir,
              checkpoint_every, failure, live):
    _rank_logging_to_log_file()
    mesh, pp_group, embedding_group, stage, schedule = _student_stage(rank, fns, pp, dp, tp, args, state,
                                                                      microbatches)
    opt = torch.optim.AdamW(stage.parameters(), lr=LR)
    reporter = (pp_group.rank() == pp - 1 and mesh["dp"].get_local_rank() == 0 and mesh["tp"].get_local_rank() == 0)
    start, resumed = 0, None
    found = latest_checkpoint(checkpoint_dir)
    if found:
        start, path = found
        _init_optimizer_state(opt)
        dcp.load(_student(fns["checkpoint_state"], stage, opt, what="checkpoint_state"), checkpoint_id=path)
        resumed = path
        if live and reporter:
            print(f"resumed from {path} (step {start}) on PP {pp} x DP {dp} x TP {tp}", flush=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    losses, saved = [], []
    for step in range(start, len(batches)):
        tokens, labels = batches[step]
        batch = _student(fns["local_batch"], tokens, labels, mesh=mesh, what="local_batch")
        loss = _student(fns["pipeline_train_step"], schedule, batch, stage_module=stage, optimizer=opt,
                        pp_group=pp_group, dp_group=mesh["dp"].get_group(), embedding_group=embedding_group,
                        max_norm=max_norm, what="pipeline_train_step")
        losses.append((step + 1, loss))
        if live and reporter:
            print(f"step {step + 1} loss {float(loss)!r}", flush=True)
        if checkpoint_dir and checkpoint_every and (step + 1) % checkpoint_every == 0:
            path = os.path.join(checkpoint_dir, f"step_{step + 1}")
            dcp.save(_student(fns["checkpoint_state"], stage, opt, what="checkpoint_state"), checkpoint_id=path)
            saved.append(path)
            if live and rank == 0:
                print(f"saved {path}", flush=True)
        if failure and failure[0] == rank and failure[1] == step + 1 and restart == 0:
            print(f"rank {rank}: killing myself after step {step + 1} (simulate_failure)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    # this stage's parameters, gathered, for the notebook (in a job, only the losses are sent around)
    state = {} if live else {n: _full(p) for n, p in stage.named_parameters()}
    return {"losses": losses if reporter else None, "resumed": resumed, "saved": saved, "state": state}


def _parse_failure(text: str):
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m:
        raise ValueError(f"simulate_failure must be 'RANK:STEP' (for example '1:3'), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def composition_job(namespace: dict, *, pp: int = 2, dp: int = 2, tp: int = 2, steps: int = 4, batch: int = 4,
                    seq: int = 8, microbatches: int = 2, max_norm: float = 1.0, seed: int = 0,
                    checkpoint_dir: str = "", checkpoint_every: int = 0, simulate_failure: str = "",
                    timeout: float = 120.0, backend: str = "gloo") -> dict:
    """Train the small GPT with your exercise 1-9 functions on a PP x DP x TP mesh; log each step's loss.

    `namespace`: where your functions are (the notebook's `globals()`).
    Each step trains on its own global batch (seeded by `seed` and the step);
    the model starts from `master_state(JOB_ARGS, seed=seed)`. Returns
    {"losses": [(step, loss), ...], "resumed": checkpoint or None, "saved": [checkpoints],
    "state": every stage's parameters after training, by name (gathered; empty in a job; with pp > 1 the last
    stage's copy of the tied head is `output.weight`)}.
    """
    if backend != "gloo":
        raise ValueError(f"composition_job: backend {backend!r}: the capstone's job trains on CPU ranks (gloo). "
                         f"Its meshes are 'cpu' meshes and exercise 9's build_schedule places each stage on the CPU, "
                         f"as its task says; on GPUs the model, the batch, init_device_mesh('cuda', ...) and the "
                         f"PipelineStage's device move to cuda:LOCAL_RANK (06_to_a_cluster.md, section 2)")
    needed = PIPELINE_FUNCTIONS + (("checkpoint_state",) if checkpoint_dir else ())
    missing = [n for n in needed if not callable(namespace.get(n))]
    if missing:
        raise ValueError(f"composition_job: the job needs your {', '.join(missing)} (exercises 3-9, and 13 for a "
                         f"checkpoint): define {'it' if len(missing) == 1 else 'them'} in the answer cells, run "
                         f"them, then start the job")
    for what, value in (("pp", pp), ("dp", dp), ("tp", tp), ("steps", steps), ("microbatches", microbatches)):
        if value < 1:
            raise ValueError(f"composition_job: {what} must be >= 1, got {value}")
    if batch % (dp * microbatches):
        raise ValueError(f"composition_job: the batch ({batch}) must divide by DP ({dp}) x micro-batches "
                         f"({microbatches})")
    if checkpoint_every and not checkpoint_dir:
        raise ValueError("composition_job: checkpoint_every needs a checkpoint_dir")
    failure = _parse_failure(simulate_failure)
    args = JOB_ARGS
    if args.n_layers % pp or args.dim % tp or args.n_heads % tp or args.vocab_size % tp or args.ffn_dim % tp:
        raise ValueError(f"composition_job: PP {pp} x TP {tp} does not fit the model ({args}): the layers must "
                         f"divide by PP, and dim, heads, vocab and ffn_dim by TP")
    from autograder.runtime.dist import run_distributed
    from autograder.runtime.launch import running_as_job

    live = running_as_job()
    state = master_state(args, seed=seed)
    batches = [_batch(args, batch, seq, seed + 7919 * step) for step in range(steps)]
    fns = {n: namespace[n] for n in needed}
    results = run_distributed(_job_rank, pp * dp * tp, timeout=timeout,
                              args=(fns, pp, dp, tp, args, state, batches, microbatches, max_norm,
                                    os.path.abspath(checkpoint_dir) if checkpoint_dir else "", checkpoint_every,
                                    failure, live))
    losses = next(r["losses"] for r in results if r["losses"] is not None)
    full = {}
    for r in results:
        full.update(r["state"])
    result = {"losses": losses, "resumed": results[0]["resumed"], "saved": results[0]["saved"], "state": full}
    if not live:
        if result["resumed"]:
            print(f"resumed from {result['resumed']}")
        for step, loss in losses:
            print(f"step {step} loss {float(loss)!r}")
    elif dist.get_rank() == 0:
        print(f"done: {steps} steps on PP {pp} x DP {dp} x TP {tp} ({len(losses)} in this run), final loss "
              f"{float(losses[-1][1])!r}", flush=True)
    return result
