"""The lessons' communication-volume formulas, checked against the ledger of the reference solutions.

    .venv/bin/python -m pytest -q tests/test_volume.py

Every formula in a lesson is computed by code that a test checks (STYLE.md):
autograder/volume.py holds the formulas; here the same quantity is measured
from what the reference implementations actually issued, and the lessons'
worked examples are recomputed.
"""

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from autograder.dist import run_distributed
from autograder.ledger import CommLedger, select
from autograder.volume import bytes_sent, dp_step_bytes, ring_factor, tp_layer_bytes, tp_pair_bytes
from solutions.data_parallel import all_reduce_gradients, zero_bytes_per_param
from solutions.data_parallel_sharded import FullyShardedLinear, ZeroShardedOptimizer
from solutions.tensor_parallel_layers import ParallelMLP

MiB = 2**20


def _mlp_program(rank, world_size, s, b, h, ffn, sp, weights):
    group = dist.group.WORLD
    mlp = ParallelMLP(h, ffn, tp_group=group, sequence_parallel=sp, **weights)
    x = torch.randn(s, b, h, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if sp:
        x = x.chunk(world_size, dim=0)[rank].contiguous()
    x.requires_grad_()
    with CommLedger() as ledger:
        mlp(x).sum().backward()
    return ledger.records


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_tp_pair_volume_matches_the_ledger(world_size, sp):
    s, b, h, ffn = 8, 2, 12, 16
    g = torch.Generator().manual_seed(1)
    weights = dict(master_fc1_weight=torch.randn(ffn, h, dtype=torch.float64, generator=g),
                   master_fc1_bias=torch.randn(ffn, dtype=torch.float64, generator=g),
                   master_fc2_weight=torch.randn(h, ffn, dtype=torch.float64, generator=g),
                   master_fc2_bias=torch.randn(h, dtype=torch.float64, generator=g))
    ledgers = run_distributed(_mlp_program, world_size, args=(s, b, h, ffn, sp, weights))
    for records in ledgers:
        regather = len(select(records, op="all_gather", phase="backward")) == 2
        expected = tp_pair_bytes(s, b, h, world_size, bytes_per_element=8, sequence_parallel=sp, regather=regather)
        assert bytes_sent(records, phase="forward") == pytest.approx(expected["forward"])
        assert bytes_sent(records, phase="backward") == pytest.approx(expected["backward"])


def test_tp_lesson_worked_example():
    """assignments/02_tensor_parallel/README.md section 3: s=4096, b=1, h=8192, bf16, t=8."""
    n = 4096 * 1 * 8192 * 2
    assert n == 64 * MiB
    assert ring_factor("all_reduce", 8) * n == 112 * MiB
    assert ring_factor("all_gather", 8) * n == 56 * MiB
    tp = tp_layer_bytes(4096, 1, 8192, 8)
    assert (tp["forward"], tp["backward"]) == (224 * MiB, 224 * MiB)
    sp = tp_layer_bytes(4096, 1, 8192, 8, sequence_parallel=True, regather=True)
    assert (sp["forward"], sp["backward"]) == (224 * MiB, 336 * MiB)
    assert tp_layer_bytes(4096, 1, 8192, 8, sequence_parallel=True, regather=False)["total"] == tp["total"]


def _dp_program(rank, world_size, model_state, padded):
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3))
    model.load_state_dict(model_state)
    x = torch.randn(4, 5)
    out = {}
    with CommLedger() as ledger:
        model(x).sum().backward()
        all_reduce_gradients(model, group=dist.group.WORLD)
    out["ddp"] = ledger.records
    opt = ZeroShardedOptimizer(model.parameters(), group=dist.group.WORLD, lr=0.1)
    with CommLedger() as ledger:
        with ledger.outside():
            opt.step()
    out["zero"] = ledger.records
    layer = FullyShardedLinear(nn.Linear(5, 7), group=dist.group.WORLD)
    with CommLedger() as ledger:
        layer(x).sum().backward()
    out["fsdp"] = ledger.records
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_dp_step_volume_matches_the_ledger(world_size):
    model = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3))
    num_params = sum(p.numel() for p in model.parameters())  # 42 + 24 = 66
    padded = math.ceil(num_params / world_size) * world_size
    results = run_distributed(_dp_program, world_size, args=(model.state_dict(), padded))
    fsdp_padded = math.ceil((5 * 7 + 7) / world_size) * world_size
    for out in results:
        assert bytes_sent(out["ddp"]) == pytest.approx(dp_step_bytes(num_params, world_size, scheme="ddp"))
        assert bytes_sent(out["zero"]) == pytest.approx(dp_step_bytes(padded, world_size, scheme="zero"))
        assert bytes_sent(out["fsdp"]) == pytest.approx(dp_step_bytes(fsdp_padded, world_size, scheme="fsdp"))


def test_dp_lesson_worked_examples():
    """assignments/01_data_parallel/README.md: communication and memory for the ZeRO paper's model."""
    psi, d = 7.5e9, 64
    assert dp_step_bytes(psi, d, bytes_per_element=2, scheme="ddp") / 1e9 == pytest.approx(29.5, abs=0.05)
    assert dp_step_bytes(psi, d, bytes_per_element=2, scheme="fsdp") / 1e9 == pytest.approx(44.3, abs=0.05)
    assert dp_step_bytes(psi, d, bytes_per_element=2, scheme="zero") == dp_step_bytes(psi, d, bytes_per_element=2)
    gb = [zero_bytes_per_param(stage, d) * psi / 1e9 for stage in range(4)]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)
