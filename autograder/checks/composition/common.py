"""What the checks of assignment 06 (composition) share: tolerances, running the student's code in ranks,
the single-process reference training, and the shape of a rank layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from autograder.runtime.compare import CheckFailure, assert_close
from autograder.runtime.dist import run_distributed
from autograder.lessons.tinygpt import ModelArgs, TinyGPT

__all__ = ["TOL"]


_TIMEOUT = 60.0
# float64 throughout: a parallel run that computes the same sums in another order is equal to ~1e-15
TOL = 1e-10
LR = 1e-2


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

def _full(t):
    """A detached CPU tensor: the whole tensor for a DTensor (gathered), the tensor itself otherwise."""
    if t is None:
        return None
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu().clone()


def _rank_logging_to_log_file() -> None:
    """In a forked rank: send Python logging to the rank's own log file, as its prints already go.

    torch's logging handlers (DTensor's redistribution notes, c10d's fallbacks) were
    created in the parent, on the parent's stderr: in a notebook kernel that is the
    cell's output stream, so a rank's warning would appear under the test cell. The
    runner captures what a rank writes to its own sys.stderr; repoint the handlers there.
    """
    import logging
    import sys

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
                    and handler.stream not in (sys.stderr, sys.stdout)):
                handler.stream = sys.stderr  # plain assignment: no flush of the parent's stream from here


def _student(fn, *args, what: str, **kwargs):
    """Call the student's `fn`; translate the one DTensor error students meet most into what to do."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        if "sharding strategy" in str(exc) and "c10d" in str(exc):
            raise RuntimeError(
                f"{what}: a torch.distributed collective was called on a DTensor ({exc}). Under TP and FSDP "
                f"parameters and gradients are DTensors: communicate their local shards, "
                f"`dist.all_reduce(grad.to_local(), ...)`.") from exc
        raise


def _run_composed(exercise: int, fn, world_size: int, **kwargs):
    """run_distributed for a test that uses functions of several exercises. A stub of another exercise is named
    with its own exercise by `checking` (the notebook's set-up cell tells it which exercise defines which
    function: autograder.runtime.report.course_notebook)."""
    return run_distributed(fn, world_size, **kwargs)


def _one_rank(program, *args, timeout: float = _TIMEOUT):
    """Run a single-process exercise in one rank process, as every check does: the student's code runs there,
    data comes back, the verdict is made here (spec 3.2; the trusted grader never runs student code itself)."""
    return run_distributed(program, 1, args=args, timeout=timeout)[0]


def _call_program(rank, world_size, fn, args, kwargs):
    return fn(*args, **kwargs)


def _close(got, expected, *, name: str, rank=None) -> None:
    assert_close(got, expected, name=name, rank=rank, rtol=TOL, atol=TOL)


def _batch(args: ModelArgs, batch: int, seq: int, seed: int):
    gen = torch.Generator().manual_seed(seed + 1000)
    tokens = torch.randint(0, args.vocab_size, (batch, seq), generator=gen)
    labels = torch.randint(0, args.vocab_size, (batch, seq), generator=gen)
    return tokens, labels


def _reference_training(args: ModelArgs, state: dict, tokens, labels, *, steps: int, max_norm: float | None):
    """Single-process float64 training on the global batch: losses and the full state after `steps` AdamW steps."""
    model = TinyGPT(args).double()
    model.load_state_dict(state)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], None
    for step in range(steps):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, grads


def _groups_of(layout_groups, rank):
    return next((g for g in layout_groups if rank in g), None)


def _check_layout_shape(name: str, groups, world_size: int, what: str) -> None:
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in groups):
        raise CheckFailure(f"{what}: layout[{name!r}] must be a list of rank lists, got {type(groups).__name__}")
    for g in groups:
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in g):
            raise CheckFailure(f"{what}: layout[{name!r}] holds a group with non-int ranks: {list(g)!r}")
