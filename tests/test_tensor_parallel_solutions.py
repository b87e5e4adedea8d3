"""The reference solution of assignment 02 (TP / SP), tested directly.

    .venv/bin/python -m pytest -q tests/test_tensor_parallel_solutions.py

Multi-rank tests run the reference with run_distributed and compare with
single-process PyTorch (through the public checks, and a few direct rank
programs); the validation tests need no process group and are kept apart.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import autograder.checks.tensor_parallel as checks  # noqa: E402
from autograder.runtime.compare import CheckFailure  # noqa: E402
from autograder.runtime.dist import run_distributed  # noqa: E402
from autograder.runtime.ledger import CommLedger  # noqa: E402
from solutions.tensor_parallel import mappings as tp  # noqa: E402
from solutions.tensor_parallel.layers import (  # noqa: E402
    ColumnParallelLinear, LinearWithAsyncAllReduce, ParallelMLP, RowParallelLinear,
    _master_parameters, allreduce_sequence_parallel_grads,
)
from solutions.tensor_parallel.loss import vocab_parallel_cross_entropy  # noqa: E402

MAPPINGS = [name for name in checks.MAPPINGS]


# ---------------------------------------------------------------------------
# Validation: no process group needed
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", MAPPINGS)
@pytest.mark.parametrize("group", [None, 0, "world"])
def test_mapping_rejects_a_non_group(name, group):
    with pytest.raises(ValueError, match="ProcessGroup"):
        getattr(tp, name)(torch.zeros(4, 2, 4), group=group)


@pytest.mark.parametrize("cls", [ColumnParallelLinear, RowParallelLinear])
def test_layers_reject_a_non_group(cls):
    with pytest.raises(ValueError, match="ProcessGroup"):
        cls(4, 4, tp_group=None)


def test_cross_entropy_and_overlap_reject_a_non_group():
    with pytest.raises(ValueError, match="ProcessGroup"):
        vocab_parallel_cross_entropy(torch.zeros(2, 1, 4), torch.zeros(2, 1, dtype=torch.long), tp_group=None)
    with pytest.raises(ValueError, match="ProcessGroup"):
        LinearWithAsyncAllReduce.apply(torch.zeros(2, 1, 3), torch.zeros(2, 3), None, "group")


def test_master_parameters_shapes():
    w, b = _master_parameters("L", 4, 6, True, torch.ones(4, 6), torch.ones(4))
    assert w.shape == (4, 6) and b.shape == (4,)
    with pytest.raises(ValueError, match=r"\[4, 6\].*\(6, 4\)"):
        _master_parameters("L", 4, 6, True, torch.ones(6, 4), None)
    with pytest.raises(ValueError, match=r"\[4\]"):
        _master_parameters("L", 4, 6, True, torch.ones(4, 6), torch.ones(6))
    with pytest.raises(ValueError, match="bias=False"):
        _master_parameters("L", 4, 6, False, torch.ones(4, 6), torch.ones(4))
    w, b = _master_parameters("L", 4, 6, False, None, None)
    assert w.shape == (4, 6) and b is None


def test_check_divisible_names_sizes():
    tp._check_divisible(8, 4, "x")
    with pytest.raises(ValueError, match=r"\(6\).*\(4\)"):
        tp._check_divisible(6, 4, "dim")


# ---------------------------------------------------------------------------
# Multi-rank, through the public checks (numerics against single-process + ledger)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", MAPPINGS)
@pytest.mark.parametrize("world_size,shape,noncontiguous", [(1, (3, 2, 5), False), (4, (8, 3, 12), True)])
def test_mappings(name, world_size, shape, noncontiguous):
    checks.check_mapping(getattr(tp, name), name, world_size=world_size, shape=shape, noncontiguous=noncontiguous)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_column_and_row_layers_every_flag(world_size):
    checks.check_column_parallel_linear(ColumnParallelLinear, world_size=world_size, in_features=5,
                                        out_features=8, seq=4, batch=3)
    checks.check_row_parallel_linear(RowParallelLinear, world_size=world_size, in_features=8,
                                     out_features=5, seq=4, batch=3)


def test_layers_float32():
    checks.check_column_parallel_linear(ColumnParallelLinear, world_size=2, dtype=torch.float32)
    checks.check_row_parallel_linear(RowParallelLinear, world_size=2, dtype=torch.float32)


def test_argument_errors_before_communication():
    impls = {name: getattr(tp, name) for name in MAPPINGS}
    impls.update(ColumnParallelLinear=ColumnParallelLinear, RowParallelLinear=RowParallelLinear)
    checks.check_argument_errors(impls, world_size=2)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_pair_mlp_and_sp_grads(world_size, sp):
    checks.check_tp_pair_communication(ColumnParallelLinear, RowParallelLinear, world_size=world_size,
                                       sequence_parallel=sp, ffn=8, seq=4)
    checks.check_parallel_mlp(ParallelMLP, world_size=world_size, sequence_parallel=sp, seq=4)
    checks.check_sequence_parallel_grads(ParallelMLP, allreduce_sequence_parallel_grads, world_size=world_size,
                                         sequence_parallel=sp, seq=4)


@pytest.mark.parametrize("sp", [False, True])
def test_mlp_without_biases_and_a_marked_parameter_without_grad(sp):
    checks.check_parallel_mlp(ParallelMLP, world_size=2, sequence_parallel=sp, bias=False)
    checks.check_sequence_parallel_grads(ParallelMLP, allreduce_sequence_parallel_grads, world_size=2,
                                         sequence_parallel=sp, unused=True)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_cross_entropy(world_size):
    for extreme in (False, True):
        checks.check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=world_size,
                                                  extreme=extreme, vocab=8)
    checks.check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=2, dtype=torch.float64,
                                              extreme=True, seed=3)


@pytest.mark.parametrize("world_size,biases", [(1, (True,)), (4, (True, False))])
def test_async_allreduce(world_size, biases):
    for bias in biases:
        checks.check_async_allreduce_gradients(LinearWithAsyncAllReduce, world_size=world_size,
                                               out_features=8, bias=bias)
        checks.check_async_allreduce_overlap(LinearWithAsyncAllReduce, world_size=world_size,
                                             out_features=8, bias=bias)


def test_pair_check_accepts_megatron_regather():
    """Re-gathering the SP input in backward (Megatron's choice) is accepted: 2 all-gathers."""

    class RegatherColumn(ColumnParallelLinear):
        def forward(self, input_):
            # forward: gathered input not saved; backward: gathered again (a second all-gather)
            return _RegatherLinear.apply(input_, self.weight, self.bias, self.tp_group)

    checks.check_tp_pair_communication(RegatherColumn, RowParallelLinear, world_size=2, sequence_parallel=True)


class _RegatherLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_, weight, bias, group):
        ctx.save_for_backward(input_, weight)
        ctx.group = group
        total = tp._gather_along_first_dim(input_, group)  # [s/t, b, h] -> [s, b, h]
        return F.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input_, weight = ctx.saved_tensors
        total = tp._gather_along_first_dim(input_, ctx.group)  # re-gathered
        grad_total = grad_output.matmul(weight)
        grad_input = tp._reduce_scatter_along_first_dim(grad_total, ctx.group)
        g2, t2 = grad_output.reshape(-1, grad_output.shape[-1]), total.reshape(-1, total.shape[-1])
        return grad_input, g2.t().matmul(t2), g2.sum(0), None


# ---------------------------------------------------------------------------
# Direct rank programs (independent of the checks)
# ---------------------------------------------------------------------------

def _sp_block_rank(rank, world_size, W1, W2, x, g):
    group = dist.group.WORLD
    warnings.simplefilter("error")  # every collective used must be the non-deprecated one
    col = ColumnParallelLinear(W1.shape[1], W1.shape[0], tp_group=group, bias=False, sequence_parallel=True,
                               master_weight=W1)
    row = RowParallelLinear(W2.shape[1], W2.shape[0], tp_group=group, bias=False, sequence_parallel=True,
                            master_weight=W2)
    xs = x.chunk(world_size, dim=0)[rank].clone().requires_grad_()
    with CommLedger() as ledger:
        y = row(F.gelu(col(xs)))
        y.backward(g.chunk(world_size, dim=0)[rank])
        loss = vocab_parallel_cross_entropy(y.detach().chunk(world_size, dim=-1)[rank].contiguous(),
                                            torch.zeros(y.shape[:-1], dtype=torch.long), tp_group=group)
    return y.detach(), xs.grad, col.weight.grad, row.weight.grad, loss, ledger.records


def test_sp_block_direct_against_single_process():
    torch.manual_seed(0)
    W1, W2 = torch.randn(8, 4, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    x, g = torch.randn(4, 3, 4, dtype=torch.float64), torch.randn(4, 3, 4, dtype=torch.float64)
    out = run_distributed(_sp_block_rank, 2, args=(W1, W2, x, g))
    xr, w1, w2 = x.clone().requires_grad_(), W1.clone().requires_grad_(), W2.clone().requires_grad_()
    y = F.linear(F.gelu(F.linear(xr, w1)), w2)
    y.backward(g)
    for rank, (ys, gx, gw1, gw2, loss, records) in enumerate(out):
        torch.testing.assert_close(ys, y.detach().chunk(2, 0)[rank])
        torch.testing.assert_close(gx, xr.grad.chunk(2, 0)[rank])
        torch.testing.assert_close(gw1, w1.grad.chunk(2, 0)[rank])
        torch.testing.assert_close(gw2, w2.grad.chunk(2, 1)[rank])
        assert loss.dtype == torch.float32 and loss.shape == (2, 3)
        ops = [(r.op, r.phase) for r in records if r.op != "wait"]
        assert ops.count(("all_gather", "forward")) == 1 and ops.count(("reduce_scatter", "forward")) == 1
        assert ops.count(("all_reduce", "forward")) == 3  # the loss


def _mutating_rank(rank, world_size):
    x = torch.full((2, 1, 4), float(rank + 1), requires_grad=True)
    y = tp.reduce_from_tensor_model_parallel_region(x, group=dist.group.WORLD)
    return x.detach(), y.detach()


def test_reduce_leaves_its_input_unchanged():
    (x0, y0), (x1, y1) = run_distributed(_mutating_rank, 2)
    assert torch.equal(x0, torch.ones(2, 1, 4)) and torch.equal(x1, torch.full((2, 1, 4), 2.0))
    assert torch.equal(y0, torch.full((2, 1, 4), 3.0)) and torch.equal(y1, y0)


def test_check_reports_a_wrong_gather_order():
    """A mapping that gathers in reverse rank order fails with the rank, the tensor and the index."""

    def reversed_gather(input_, *, group):
        return _Reversed.apply(input_, group)

    with pytest.raises(CheckFailure, match=r"rank 0: gather_from_tensor_model_parallel_region: forward output"):
        checks.check_mapping(reversed_gather, "gather_from_tensor_model_parallel_region", world_size=2)


class _Reversed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_, group):
        ctx.group = group
        out = tp._gather_along_last_dim(input_, group) if hasattr(tp, "_gather_along_last_dim") else input_
        h = input_.shape[-1]
        return torch.cat(out.split(h, dim=-1)[::-1], dim=-1)

    @staticmethod
    def backward(ctx, grad_output):
        return tp._split_along_last_dim(grad_output, ctx.group), None
