"""The reference solutions of assignment 01 (data parallelism), tested directly.

    .venv/bin/python -m pytest -q tests/test_data_parallel_solutions.py

Multi-rank tests run the public checks (single-process references, ledgers)
on the reference implementations; validation tests need no process group and
stay apart at the bottom.
"""

import os
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from autograder.checks import data_parallel as checks  # noqa: E402
from autograder.dist import run_distributed  # noqa: E402
from autograder.ledger import CommLedger  # noqa: E402
from solutions.data_parallel import (BucketedDDP, all_reduce_gradients, broadcast_module_states,  # noqa: E402
                                     zero_bytes_per_param)
from solutions.data_parallel_sharded import (FullyShardedLinear, ZeroShardedOptimizer, fully_shard,  # noqa: E402
                                             flatten_linear_params, unflatten_linear_params)

ODD = dict(dims=(5, 6, 6, 6, 1), unused=True, frozen=True, tied=True)


# ---------------------------------------------------------------------------
# Multi-rank: the checks on the reference
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_broadcast_and_all_reduce_gradients(world_size):
    checks.check_broadcast_module_states(broadcast_module_states, world_size=world_size)
    checks.check_all_reduce_gradients(all_reduce_gradients, world_size=world_size, **ODD)


@pytest.mark.parametrize("world_size,cap", [(1, 25.0), (2, 150 / 2**20), (4, 1e-9)])
def test_bucketed_ddp(world_size, cap):
    checks.check_ddp_broadcast(BucketedDDP, world_size=world_size)
    checks.check_ddp_gradients(BucketedDDP, world_size=world_size, bucket_cap_mb=cap, **ODD)
    checks.check_ddp_buckets(BucketedDDP, world_size=world_size, bucket_cap_mb=cap, **ODD)
    checks.check_ddp_buckets(BucketedDDP, world_size=world_size, dims=(5, 7, 6, 3), bucket_cap_mb=cap)
    checks.check_ddp_no_sync(BucketedDDP, world_size=world_size, bucket_cap_mb=cap, unused=True)


def test_bucketed_ddp_with_a_late_rank():
    checks.check_ddp_gradients(BucketedDDP, world_size=2, bucket_cap_mb=100 / 2**20, stagger=0.3)


class _Sizes(nn.Module):
    """Parameters of 100, 500, 100, 100, 25 float32 elements (400, 2000, 400, 400, 100 bytes)... reversed below."""

    def __init__(self):
        super().__init__()
        self.p = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in (25, 500, 100, 100, 100)])


def _bucket_rank(rank, world_size):
    model = _Sizes()
    ddp = BucketedDDP(model, group=dist.group.WORLD, bucket_cap_mb=1000 / 2**20)
    names = {p: n for n, p in model.named_parameters()}
    return [[names[p] for p in b] for b in ddp.buckets]


def test_bucket_rule_matches_the_lesson_example():
    # The lesson's example scaled to a 1000-byte cap: 0.4 + 0.4 + 0.4 | 2.0 | 0.1 (x 1000 bytes).
    expected = [["p.4", "p.3", "p.2"], ["p.1"], ["p.0"]]
    assert checks.expected_buckets(_Sizes(), 1000 / 2**20) == expected
    assert run_distributed(_bucket_rank, 2) == [expected, expected]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_zero_sharded_optimizer(world_size):
    checks.check_zero_matches_adamw(ZeroShardedOptimizer, world_size=world_size, lrs=(1e-2, 5e-3, 2e-2), **ODD)
    checks.check_zero_rounding(ZeroShardedOptimizer, world_size=world_size)
    checks.check_zero_state_sharded(ZeroShardedOptimizer, world_size=world_size, **ODD)
    checks.check_zero_comm(ZeroShardedOptimizer, world_size=world_size, **ODD)


def test_zero_float32_state_and_padding():
    checks.check_zero_state_sharded(ZeroShardedOptimizer, world_size=4, dims=(3, 4, 1), dtype=torch.float32)
    checks.check_zero_comm(ZeroShardedOptimizer, world_size=4, dims=(3, 4, 1), dtype=torch.float32)
    # bf16 parameters: float32 state (a master copy of the owned pieces, exp_avg, exp_avg_sq)
    checks.check_zero_state_sharded(ZeroShardedOptimizer, world_size=2, dims=(3, 4, 1), dtype=torch.bfloat16)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_fully_shard(world_size):
    checks.check_fsdp_numerics(fully_shard, world_size=world_size, dims=(3, 5, 2, 4))
    checks.check_fsdp_numerics(fully_shard, world_size=world_size, bias=False, dtype=torch.float32)
    checks.check_fsdp_comm(fully_shard, world_size=world_size)
    checks.check_fsdp_frees(fully_shard, world_size=world_size, dims=(3, 5, 2, 4))


def _invalid_zero_rank(rank, world_size):
    params = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, dtype=torch.float64))]
    with CommLedger() as ledger:
        try:
            ZeroShardedOptimizer(params, group=dist.group.WORLD, lr=1e-3)
        except ValueError as exc:
            return {"error": str(exc), "comm": ledger.records}
    return {"error": None, "comm": ledger.records}


def test_invalid_arguments_raise_on_every_rank_before_communication():
    for out in run_distributed(_invalid_zero_rank, 2):
        assert out["error"] and "dtype" in out["error"] and not out["comm"]


# ---------------------------------------------------------------------------
# No process group needed
# ---------------------------------------------------------------------------

def test_zero_bytes_per_param_values():
    assert [zero_bytes_per_param(s, 1) for s in range(4)] == [16.0] * 4
    assert [zero_bytes_per_param(s, 8) for s in range(4)] == [16.0, 4 + 12 / 8, 2 + 14 / 8, 16 / 8]
    assert zero_bytes_per_param(1, 4, param_bytes=4, grad_bytes=4, optim_bytes=8) == 10.0
    checks.check_zero_bytes_per_param(zero_bytes_per_param)


@pytest.mark.parametrize("stage,dp_size", [(4, 2), (-1, 2), (1.5, 2), (True, 2), (1, 0), (1, 2.0), (0, -3)])
def test_zero_bytes_per_param_rejects_bad_arguments(stage, dp_size):
    with pytest.raises(ValueError, match="stage|dp_size"):
        zero_bytes_per_param(stage, dp_size)


def test_bucketed_ddp_rejects_a_bad_cap():
    for cap in (0, -1.0, "25"):
        with pytest.raises(ValueError, match="bucket_cap_mb"):
            BucketedDDP(nn.Linear(2, 2), group=None, bucket_cap_mb=cap)


@pytest.mark.parametrize("kwargs,match", [(dict(lr=-1.0), "learning rate"), (dict(eps=-1e-8), "eps"),
                                          (dict(betas=(1.0, 0.9)), "betas"), (dict(weight_decay=-0.1), "weight_decay")])
def test_zero_optimizer_rejects_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ZeroShardedOptimizer([nn.Parameter(torch.zeros(3))], group=None, **kwargs)


def test_zero_optimizer_rejects_mixed_dtypes_and_several_groups():
    with pytest.raises(ValueError, match="dtype"):
        ZeroShardedOptimizer([nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2).double())], group=None)
    with pytest.raises(ValueError, match="one parameter group"):
        ZeroShardedOptimizer([{"params": [nn.Parameter(torch.zeros(3))]}, {"params": [nn.Parameter(torch.zeros(2))]}],
                             group=None)


def test_fully_shard_rejects_parameters_outside_linear_layers():
    with pytest.raises(ValueError, match="only nn.Linear"):
        fully_shard(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), group=None)
    with pytest.raises(ValueError, match="nn.Linear"):
        FullyShardedLinear(nn.LayerNorm(4), group=None)


def test_flat_linear_layout_round_trip():
    lin = nn.Linear(3, 5)
    flat = flatten_linear_params(lin.weight, lin.bias, 4)  # 20 elements -> 20
    assert flat.shape == (20,)
    flat = flatten_linear_params(lin.weight, lin.bias, 3)  # 20 -> 21, one zero of padding
    assert flat.shape == (21,) and flat[-1] == 0
    w, b = unflatten_linear_params(flat, 5, 3, True)
    assert torch.equal(w, lin.weight.detach()) and torch.equal(b, lin.bias.detach())
    w, b = unflatten_linear_params(flatten_linear_params(lin.weight, None, 2), 5, 3, False)
    assert torch.equal(w, lin.weight.detach()) and b is None


# ---------------------------------------------------------------------------
# Honest checks: another correct design passes them too
# ---------------------------------------------------------------------------

class TorchAdamWOnPieces(torch.optim.Optimizer):
    """ZeRO the Megatron way: one shard tensor per parameter range, torch's own AdamW on them."""

    def __init__(self, params, *, group, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.group = group
        self.params_ = [p for p in self.param_groups[0]["params"] if p.requires_grad]
        d, r = dist.get_world_size(group), dist.get_rank(group)
        total = sum(p.numel() for p in self.params_)
        self.shard = -(-total // d)
        lo, hi = r * self.shard, (r + 1) * self.shard
        self.pieces, offset = [], 0
        for p in self.params_:
            a, b = max(offset, lo), min(offset + p.numel(), hi)
            if a < b:
                self.pieces.append((p, a - offset, b - offset, a - lo,
                                    nn.Parameter(p.detach().reshape(-1)[a - offset:b - offset].clone())))
            offset += p.numel()
        self.inner = torch.optim.AdamW([t for *_, t in self.pieces] or [nn.Parameter(torch.zeros(1))],
                                       lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        d = dist.get_world_size(self.group)
        like = self.params_[0]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params_])
        flat = torch.cat([flat, flat.new_zeros(self.shard * d - flat.numel())])
        grad = torch.empty(self.shard, dtype=like.dtype)
        if d > 1:
            dist.reduce_scatter_single(grad, flat, op=dist.ReduceOp.AVG, group=self.group)
        else:
            grad.copy_(flat)
        out = torch.zeros(self.shard, dtype=like.dtype)
        for p, a, b, pos, t in self.pieces:
            t.copy_(p.reshape(-1)[a:b])
            t.grad = None if p.grad is None else grad[pos:pos + b - a].clone()
        self.inner.param_groups[0]["lr"] = self.param_groups[0]["lr"]
        self.inner.step()
        for p, a, b, pos, t in self.pieces:
            out[pos:pos + b - a] = t
        full = torch.empty(self.shard * d, dtype=like.dtype)
        if d > 1:
            dist.all_gather_single(full, out, group=self.group)
        else:
            full.copy_(out)
        offset = 0
        for p in self.params_:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_adamw_on_pieces_passes_the_zero_checks(world_size):
    checks.check_zero_matches_adamw(TorchAdamWOnPieces, world_size=world_size, lrs=(1e-2, 5e-3), **ODD)
    checks.check_zero_rounding(TorchAdamWOnPieces, world_size=world_size)
    checks.check_zero_state_sharded(TorchAdamWOnPieces, world_size=world_size, **ODD)
    checks.check_zero_comm(TorchAdamWOnPieces, world_size=world_size, **ODD)
