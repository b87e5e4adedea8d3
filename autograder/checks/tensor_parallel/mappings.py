"""Public checks of assignment 02, exercises 1-2: the six mappings (tensor- and sequence-parallel regions).

    from autograder.checks.tensor_parallel import check_mapping
    check_mapping(copy_to_tensor_model_parallel_region, "copy_to_tensor_model_parallel_region", world_size=2)

Each mapping runs in `world_size` ranks on a seeded input and a seeded output gradient; its forward and
backward are compared with the single-process values, and its communication, phase by phase, with what
`MAPPINGS` says it sends.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from autograder.checks import one_thread
from autograder.runtime.compare import CheckFailure, Findings, assert_close, fmt_shape
from autograder.runtime.dist import rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm

from .common import _TIMEOUT, _check_output_type, _chunk, _cpu, _expect_phase, _randn, _require_divisible

__all__ = ["MAPPINGS", "check_mapping"]


# ---------------------------------------------------------------------------
# The six mappings (and the worked example)
# ---------------------------------------------------------------------------

# name -> (what is split on input: "last"/"first"/None, forward comm, backward comm)
MAPPINGS = {
    "copy_to_tensor_model_parallel_region": "identity / all-reduce",
    "reduce_from_tensor_model_parallel_region": "all-reduce / identity",
    "scatter_to_tensor_model_parallel_region": "split last dim / all-gather last dim",
    "gather_from_tensor_model_parallel_region": "all-gather last dim / split last dim",
    "gather_from_sequence_parallel_region": "all-gather dim 0 / reduce-scatter dim 0",
    "reduce_scatter_to_sequence_parallel_region": "reduce-scatter dim 0 / all-gather dim 0",
    "scatter_to_sequence_parallel_region": "split dim 0 / all-gather dim 0",
}


def _mapping_case(name: str, t: int, shape, dtype, gen):
    """Per-rank inputs and upstream gradients, expected outputs and input gradients, expected comm."""
    s, b, h = shape
    full = lambda *sh: _randn(gen, *sh, dtype=dtype)  # noqa: E731
    per_rank = lambda *sh: [full(*sh) for _ in range(t)]  # noqa: E731
    total = lambda ts: torch.stack(ts).sum(0)  # noqa: E731
    AR, AG, RS = "all_reduce", "all_gather", "reduce_scatter"
    if name == "copy_to_tensor_model_parallel_region":
        x = full(s, b, h)
        xs, gs = [x] * t, per_rank(s, b, h)
        outs, grads = [x] * t, [total(gs)] * t
        fwd, bwd = [], [(AR, {1}, (s, b, h), None, dtype)]
    elif name == "reduce_from_tensor_model_parallel_region":
        xs, gs = per_rank(s, b, h), per_rank(s, b, h)
        outs, grads = [total(xs)] * t, gs
        fwd, bwd = [(AR, {1}, (s, b, h), None, dtype)], []
    elif name == "scatter_to_tensor_model_parallel_region":
        x = full(s, b, h)
        xs, gs = [x] * t, per_rank(s, b, h // t)
        outs = [_chunk(x, t, r, -1) for r in range(t)]
        grads = [torch.cat(gs, dim=-1)] * t
        fwd, bwd = [], [(AG, {1}, None, s * b * h, dtype)]
    elif name == "gather_from_tensor_model_parallel_region":
        x = full(s, b, h)
        xs, gs = [_chunk(x, t, r, -1) for r in range(t)], per_rank(s, b, h)
        outs, grads = [x] * t, [_chunk(gs[r], t, r, -1) for r in range(t)]
        fwd, bwd = [(AG, {1}, None, s * b * h, dtype)], []
    elif name == "gather_from_sequence_parallel_region":
        x = full(s, b, h)
        xs, gs = [_chunk(x, t, r, 0) for r in range(t)], per_rank(s, b, h)
        outs, grads = [x] * t, [_chunk(total(gs), t, r, 0) for r in range(t)]
        fwd, bwd = [(AG, {1}, (s, b, h), None, dtype)], [(RS, {1}, (s, b, h), None, dtype)]
    elif name == "reduce_scatter_to_sequence_parallel_region":
        xs, gs = per_rank(s, b, h), per_rank(s // t, b, h)
        outs = [_chunk(total(xs), t, r, 0) for r in range(t)]
        grads = [torch.cat(gs, dim=0)] * t
        fwd, bwd = [(RS, {1}, (s, b, h), None, dtype)], [(AG, {1}, (s, b, h), None, dtype)]
    elif name == "scatter_to_sequence_parallel_region":
        x = full(s, b, h)
        xs, gs = [x] * t, per_rank(s // t, b, h)
        outs, grads = [_chunk(x, t, r, 0) for r in range(t)], [torch.cat(gs, dim=0)] * t
        fwd, bwd = [], [(AG, {1}, (s, b, h), None, dtype)]
    else:
        raise ValueError(f"unknown mapping {name!r}; one of {', '.join(MAPPINGS)}")
    return xs, gs, outs, grads, fwd, bwd


def _mapping_rank(rank, world_size, fn, name, xs, gs, noncontiguous, backend):
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    data, g = xs[rank].to(dev), gs[rank].to(dev)
    if noncontiguous:  # a [s, b, h] view of [h, b, s] storage: no dim has stride 1 where expected
        leaf = data.permute(2, 1, 0).contiguous().requires_grad_()
        x = leaf.permute(2, 1, 0)
        g = g.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    else:
        leaf = data.clone().requires_grad_()
        x = leaf
    before = x.detach().clone()
    with CommLedger() as ledger:
        out = fn(x, group=group)
        _check_output_type(out, name, rank, g.shape)
        torch.autograd.backward(out, g)
    grad = leaf.grad
    if grad is not None and noncontiguous:
        grad = grad.permute(2, 1, 0)
    return {"out": _cpu(out), "grad": _cpu(grad), "modified": not torch.equal(x.detach(), before),
            "records": ledger.records}


@one_thread
def check_mapping(fn, name: str, *, world_size: int = 2, shape=(4, 3, 6), dtype=torch.float64,
                  seed: int = 0, noncontiguous: bool = False, backend: str = "gloo",
                  timeout: float = _TIMEOUT) -> None:
    """One mapping: forward output and input gradient on every rank, and its collectives.

    `shape` is the full `[s, b, h]`; the split dim (h for the tensor-parallel
    mappings, s for the sequence-parallel ones) must be divisible by world_size.
    With noncontiguous=True the input and the upstream gradient are
    non-contiguous views. Expected communication (spec 4.2): one collective in
    the phase that communicates (all-gathers and reduce-scatters of the full
    `[s, b, h]`), none in the other, none at all for a group of size 1.
    """
    if name not in MAPPINGS:
        raise ValueError(f"unknown mapping {name!r}; one of {', '.join(MAPPINGS)}")
    split_dim = 0 if "sequence" in name else 2
    _require_divisible(shape[split_dim], world_size, f"shape[{split_dim}]")
    gen = torch.Generator().manual_seed(seed)
    xs, gs, outs, grads, fwd, bwd = _mapping_case(name, world_size, tuple(shape), dtype, gen)
    results = run_distributed(_mapping_rank, world_size, args=(fn, name, xs, gs, noncontiguous, backend),
                              timeout=timeout, backend=backend)
    ctx = f"{name}, world size {world_size}, [s, b, h] = {fmt_shape(shape)}"
    check_consistent([r["records"] for r in results], context=ctx)
    findings = Findings()
    for rank, res in enumerate(results):
        with findings.numbers():
            assert_close(res["out"], outs[rank], name=f"{name}: forward output", rank=rank)
            assert_close(res["grad"], grads[rank], name=f"{name}: input gradient (backward)", rank=rank)
        if res["modified"]:
            raise CheckFailure(f"rank {rank}: {name} modified its input in place; it must return a new "
                               f"tensor (clone before an in-place collective)")
        with findings.communication():
            _expect_mapping_comm(res["records"], rank, world_size, fwd, bwd, ctx)
    findings.raise_if_any()


def _expect_mapping_comm(records, rank, world_size, fwd, bwd, ctx) -> None:
    if world_size == 1:
        expect_no_comm(records, rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
        return
    _expect_phase(records, rank=rank, phase="forward", expected=fwd, context=ctx)
    _expect_phase(records, rank=rank, phase="backward", expected=bwd, context=ctx)
