"""The helpers shared by the checks of assignment 02 (tensor parallelism): random tensors, shards, the
expected collectives of one phase, and the student's layer run on one input.
"""

from __future__ import annotations

import itertools
import math

import torch

from autograder.runtime.compare import CheckFailure, dtype_name, fmt_shape
from autograder.runtime.ledger import format_trace


_TIMEOUT = 20.0


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

def _randn(gen, *shape, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _cpu(t):
    return t.detach().cpu() if isinstance(t, torch.Tensor) else t


def _chunk(t: torch.Tensor, n: int, i: int, dim: int) -> torch.Tensor:
    return t.chunk(n, dim=dim)[i].contiguous()


def _require_divisible(size: int, n: int, what: str) -> None:
    if size % n:
        raise ValueError(f"check parameters: {what} ({size}) must be divisible by world_size ({n})")


def _expect_phase(records, *, rank: int, phase: str, expected: list, context: str) -> None:
    """Exactly the expected collectives in `phase` (waits aside), nothing else.

    `expected`: (op, allowed counts, shape or None, numel or None, dtype) per kind of op.
    """
    mine = [r for r in records if r.op != "wait" and r.phase == phase]
    matched = 0
    for op, allowed, shape, numel, dtype in expected:
        got = [r for r in mine if r.op == op and r.dtype == dtype_name(dtype)
               and (shape is None or tuple(r.shape) == tuple(shape))
               and (numel is None or math.prod(r.shape) == numel)]
        if len(got) not in allowed:
            what = f"{fmt_shape(shape)} " if shape is not None else f"{numel} elements " if numel else ""
            want = " or ".join(str(a) for a in sorted(allowed))
            raise CheckFailure(
                f"rank {rank} ({context}): expected {want} {op} of {what}{dtype_name(dtype)} in {phase}, "
                f"saw {len(got)}. Communication of rank {rank}:\n{format_trace(records, rank)}")
        matched += len(got)
    if len(mine) != matched:
        want = ", ".join(f"{op}" for op, *_ in expected) or "no communication"
        raise CheckFailure(
            f"rank {rank} ({context}): unexpected communication in {phase} (expected only: {want}); "
            f"saw {len(mine)} op(s). Communication of rank {rank}:\n{format_trace(records, rank)}")


def _check_output_type(out, what: str, rank: int, shape) -> None:
    if not isinstance(out, torch.Tensor):
        raise CheckFailure(f"rank {rank}: {what} returned {type(out).__name__}, expected a tensor of shape "
                           f"{fmt_shape(shape)}")
    if tuple(out.shape) != tuple(shape):
        raise CheckFailure(f"rank {rank}: {what} returned shape {fmt_shape(out.shape)}, expected {fmt_shape(shape)}")
    if not out.requires_grad:
        raise CheckFailure(f"rank {rank}: {what} returned a tensor that does not require grad "
                           f"(the autograd graph was cut: detach(), .data or torch.no_grad()?)")


def _param(module, name: str, what: str, rank: int):
    if not hasattr(module, name):
        raise CheckFailure(f"rank {rank}: {what} has no attribute .{name} (the shards live in .weight and .bias)")
    return getattr(module, name)


def _forward(module, x, what: str, rank: int, expected_weight_shape):
    """Call the layer; on a non-stub error say which shard shapes the layer holds."""
    try:
        return module(x)
    except NotImplementedError:
        raise
    except Exception as exc:
        w = getattr(module, "weight", None)
        got = fmt_shape(w.shape) if isinstance(w, torch.Tensor) else repr(w)
        raise RuntimeError(
            f"rank {rank}: {what} forward failed on input {fmt_shape(x.shape)}: {type(exc).__name__}: {exc}\n"
            f"  (its .weight has shape {got}; expected {fmt_shape(expected_weight_shape)})") from exc


def _combos(**flags) -> list[dict]:
    """Every combination of the given boolean flags (None: both values)."""
    names = list(flags)
    values = [(False, True) if v is None else (bool(v),) for v in flags.values()]
    return [dict(zip(names, vs)) for vs in itertools.product(*values)]
