"""The lessons' communication-volume formulas, checked against the ledger of the reference solutions.

    .venv/bin/python -m pytest -q tests/test_volume.py

Every formula in a lesson is computed by code that a test checks (STYLE.md):
autograder/lessons/volume.py holds the formulas; here the same quantity is measured
from what the reference implementations actually issued, and the lessons'
worked examples are recomputed.
"""

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from autograder.runtime.dist import run_distributed
from autograder.runtime.ledger import CommLedger, select
from autograder.lessons.hardware import H100_NODE
from autograder.lessons.volume import (bytes_sent, dp_step_bytes, dp_step_seconds, ring_factor, tp_layer_bytes,
                               tp_layer_seconds, tp_pair_bytes, transformer_layer_flops,
                               transformer_layer_step_flops)
from solutions.data_parallel.ddp import all_reduce_gradients, zero_bytes_per_param
from solutions.data_parallel.fsdp import fully_shard
from solutions.data_parallel.zero import ZeroShardedOptimizer
from solutions.tensor_parallel.layers import ParallelMLP

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
    layer = fully_shard(nn.Linear(5, 7), group=dist.group.WORLD)
    with CommLedger() as ledger:
        layer(x.requires_grad_()).sum().backward()
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


# ---------------------------------------------------------------------------
# Time, not only bytes: the FLOP counts against torch's own counter, then the lessons' numbers
# ---------------------------------------------------------------------------

def _layer_step_flops(s, b, h, ffn):
    """Matmul FLOPs of one transformer layer's forward + backward, counted by torch.utils.flop_counter."""
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(0)
    w = {k: torch.randn(*shape, generator=g, requires_grad=True)
         for k, shape in dict(q=(h, h), k=(h, h), v=(h, h), o=(h, h), fc1=(ffn, h), fc2=(h, ffn)).items()}
    x = torch.randn(b, s, h, generator=g, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        q, k, v = x @ w["q"].t(), x @ w["k"].t(), x @ w["v"].t()
        a = torch.softmax(q @ k.transpose(-1, -2) / h**0.5, dim=-1) @ v
        y = x + a @ w["o"].t()
        y = y + torch.nn.functional.gelu(y @ w["fc1"].t()) @ w["fc2"].t()
        y.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("s,b,h,ffn", [(8, 2, 16, 64), (5, 3, 12, 20)])
def test_transformer_layer_flops_equal_torchs_flop_counter(s, b, h, ffn):
    assert transformer_layer_step_flops(s, b, h, ffn=ffn) == _layer_step_flops(s, b, h, ffn)
    # with the usual 4h MLP, a step is 3 forwards of the pipeline lesson's count
    assert transformer_layer_step_flops(s, b, h) == 3 * transformer_layer_flops(s, b, h)


def test_six_flops_per_parameter_per_token():
    """dp_step_seconds counts 6 FLOPs per parameter per token: what torch counts for bias-free linear layers."""
    from torch.utils.flop_counter import FlopCounterMode

    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Linear(16, 4, bias=False))
    tokens = 10
    x = torch.randn(tokens, 8, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    params = sum(p.numel() for p in model.parameters())
    assert counter.get_total_flops() == 6 * params * tokens
    t = dp_step_seconds(params, 2, tokens, link=H100_NODE.network)
    assert t["compute"] == pytest.approx(6 * params * tokens / H100_NODE.peak_flops)


def test_tp_time_lesson_numbers():
    """assignments/02_tensor_parallel/README.md, "Time, not only bytes": s=4096, b=1, h=8192, bf16, t=8."""
    assert transformer_layer_step_flops(4096, 1, 8192) == pytest.approx(72 * 4096 * 8192**2 * (1 + 4096 / (6 * 8192)))
    nvlink = tp_layer_seconds(4096, 1, 8192, 8, link=H100_NODE.nvlink)
    infiniband = tp_layer_seconds(4096, 1, 8192, 8, link=H100_NODE.network)
    assert nvlink["compute"] * 1e3 == pytest.approx(2.71, abs=0.005)
    assert nvlink["communication"] * 1e3 == pytest.approx(1.21, abs=0.005)
    assert infiniband["communication"] * 1e3 == pytest.approx(9.68, abs=0.005)
    assert nvlink["ratio"] == pytest.approx(0.45, abs=0.005)
    assert infiniband["ratio"] == pytest.approx(3.57, abs=0.005)
    assert infiniband["ratio"] / nvlink["ratio"] == pytest.approx(8.0, abs=0.05)  # 9x the bandwidth, latency aside
    # the communication does not shrink with t: compute does (1/t), so the ratio grows with t
    assert tp_layer_seconds(4096, 1, 8192, 4, link=H100_NODE.nvlink)["ratio"] < nvlink["ratio"]


def test_dp_time_lesson_numbers():
    """assignments/01_data_parallel/README.md, "Time, not only bytes": 7B parameters, d = 64 over InfiniBand."""
    ib = H100_NODE.network
    ratios = {k: dp_step_seconds(7e9, 64, 4096, link=ib, microbatches=k)["ratio"] for k in (1, 4, 8)}
    assert ratios[1] == pytest.approx(3.17, abs=0.005)
    assert ratios[4] == pytest.approx(0.79, abs=0.005)
    assert ratios[8] == pytest.approx(0.40, abs=0.005)
    one = dp_step_seconds(7e9, 64, 4096, link=ib)
    assert one["compute"] == pytest.approx(0.174, abs=0.0005)
    assert one["communication"] == pytest.approx(0.552, abs=0.0005)
    assert dp_step_seconds(7e9, 64, 4096, link=ib, microbatches=4)["compute"] == pytest.approx(0.70, abs=0.005)
    assert dp_step_seconds(7e9, 64, 4096, link=ib, microbatches=8)["compute"] == pytest.approx(1.39, abs=0.005)
    node = dp_step_seconds(7e9, 8, 4096, link=H100_NODE.nvlink)  # d = 8 inside one node
    assert node["communication"] == pytest.approx(0.054, abs=0.0005)
    assert node["ratio"] == pytest.approx(0.31, abs=0.005)
    # the model size cancels out of the ratio: 2(d-1)/d * B * peak / (6 * tokens * bandwidth)
    assert dp_step_seconds(70e9, 64, 4096, link=ib)["ratio"] == pytest.approx(ratios[1], rel=2e-3)  # latency aside
    assert ratios[1] == pytest.approx(2 * 63 / 64 * 2 * H100_NODE.peak_flops / (6 * 4096 * ib.bytes_per_s), rel=2e-3)
    # fp32 gradients (grad_reduce_in_fp32) double it; ZeRO-3 adds half again
    assert dp_step_seconds(7e9, 64, 4096, link=ib, bytes_per_element=4)["ratio"] == pytest.approx(6.34, abs=0.005)
    assert dp_step_seconds(7e9, 64, 4096, link=ib, microbatches=8, scheme="fsdp")["ratio"] == pytest.approx(
        0.59, abs=0.005)


@pytest.mark.parametrize("path,numbers", [
    ("assignments/02_tensor_parallel/README.md", ["2.71 ms", "1.21 ms", "9.68 ms", "0.45", "3.57"]),
    ("assignments/01_data_parallel/README.md", ["0.174 s", "0.552 s", "3.17", "0.79", "0.40", "6.34", "0.59",
                                                "0.70 s", "1.39 s", "0.054 s", "0.31"]),
])
def test_lessons_state_the_computed_numbers(path, numbers):
    import os

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path), encoding="utf-8") as f:
        text = f.read()
    missing = [n for n in numbers if n not in text]
    assert not missing, f"{path} no longer states {missing} (recompute with autograder/lessons/volume.py)"
