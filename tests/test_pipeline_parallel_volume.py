"""Assignment 03's formulas (autograder/lessons/volume.py, pipeline section) against the reference, and the lesson's numbers.

    .venv/bin/python -m pytest -q tests/test_pipeline_parallel_volume.py

Every number in assignments/03_pipeline_parallel/README.md ("Time, not only bytes")
is recomputed here from the functions that produce it, with the stated hardware
figures of autograder/lessons/hardware.py; the byte formulas are checked against the ledger
of the reference run_pipeline.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import autograder.checks.pipeline_parallel as checks
from autograder.runtime.dist import run_distributed
from autograder.lessons.hardware import H100_NODE, compute_seconds, transfer_seconds
from autograder.runtime.ledger import CommLedger
from autograder.lessons.volume import (
    pp_boundary_bytes, pp_bubble_fraction, pp_bubble_seconds, pp_peak_outputs, pp_stage_seconds, pp_step_p2p_bytes,
    pp_step_seconds, ring_factor, transformer_layer_flops,
)
from solutions.pipeline_parallel.executor import run_pipeline
from solutions.pipeline_parallel.schedules import interleaved_1f1b_schedule, one_f_one_b_schedule

MiB = 2 ** 20


def _ledger_rank(rank, world_size, m, v, b, h):
    group = dist.group.WORLD
    p, r = group.size(), group.rank()
    gen = torch.Generator().manual_seed(0)
    mods = [checks.TaggedStage(torch.randn(h, h, generator=gen), torch.randn(h, generator=gen)) for _ in range(v)]
    xs = [torch.randn(b, h, generator=gen) for _ in range(m)]
    schedule = one_f_one_b_schedule(p, r, m) if v == 1 else interleaved_1f1b_schedule(p, r, m, v)
    with CommLedger() as ledger:
        run_pipeline(mods if v > 1 else mods[0], schedule, xs, xs, F.mse_loss, pp_group=group)
    return ledger.records


@pytest.mark.parametrize("p,m,v", [(3, 4, 1), (4, 2, 1), (3, 6, 2), (2, 4, 3)])
def test_step_bytes_match_the_reference_ledger(p, m, v):
    b, h = 2, 6  # float32: [2, 6] = 48 bytes per message
    ledgers = run_distributed(_ledger_rank, p, args=(m, v, b, h), timeout=20, check_collectives=False)
    for r, records in enumerate(ledgers):
        sends = [x for x in records if x.op == "send"]
        expected = pp_step_p2p_bytes(1, b, h, p, r, m, v, bytes_per_element=4)  # s = 1: a micro-batch is [b, h]
        assert sum(x.bytes for x in sends) == expected["total"]
        if p > 2:  # next and previous differ: forward is what goes to the next rank
            assert sum(x.bytes for x in sends if x.peer == (r + 1) % p) == expected["forward"]
            assert sum(x.bytes for x in sends if x.peer == (r - 1) % p) == expected["backward"]
        assert sum(x.bytes for x in records if x.op == "recv") == expected["total"]  # P2P symmetry


def test_boundary_bytes_with_sequence_parallel():
    assert pp_boundary_bytes(4096, 1, 8192) == 64 * MiB
    assert pp_boundary_bytes(4096, 1, 8192, tp=8, sequence_parallel=True) == 8 * MiB
    assert pp_boundary_bytes(4096, 1, 8192, tp=8) == 64 * MiB  # without SP every TP rank holds all of it


def test_bubble_seconds_over_step_seconds_is_the_bubble_fraction():
    for p, m, v in [(4, 8, 1), (8, 32, 1), (8, 32, 5), (2, 1, 1)]:
        f, bwd = 0.018, 0.036
        assert pp_bubble_seconds(p, f, bwd, v) / pp_step_seconds(p, m, f, bwd, v) == \
            pytest.approx(pp_bubble_fraction(p, m, v), rel=1e-12)


def test_peak_outputs_validation():
    with pytest.raises(ValueError, match="schedule"):
        pp_peak_outputs("zb", 4, 0, 8)
    assert pp_peak_outputs("1f1b", 4, 0, 2) == 2  # m < p: the warm-up covers every micro-batch


def test_lesson_time_example():
    """README section 5, "Time, not only bytes": a 70B-class model, h = 8192, 80 layers, s = 4096, b = 1, bf16,
    TP 8 with SP inside a node, PP 8 across nodes (10 layers per stage), m = 32, 50 % MFU on H100."""
    s, b, h, layers, t, p, m = 4096, 1, 8192, 10, 8, 8, 32
    # one layer's forward FLOPs: 24 s b h^2 + 4 s^2 b h
    assert transformer_layer_flops(s, b, h) == 24 * 4096 * 8192 ** 2 + 4 * 4096 ** 2 * 8192
    stage = pp_stage_seconds(layers, s, b, h, tp=t, mfu=0.5)
    assert stage["forward"] == pytest.approx(10 * transformer_layer_flops(s, b, h) / 8 / (0.5 * 989e12))
    assert stage["forward"] == pytest.approx(18.07e-3, rel=1e-3)  # README: 18.1 ms
    assert stage["backward"] == pytest.approx(36.13e-3, rel=1e-3)  # README: 36.1 ms
    # one boundary, one micro-batch, one direction: [s/t, b, h] bf16 = 8 MiB over the GPU's own NIC
    nbytes = pp_boundary_bytes(s, b, h, tp=t, sequence_parallel=True)
    p2p = transfer_seconds(nbytes, H100_NODE.network)
    assert p2p == pytest.approx(8 * MiB / 50e9 + 5e-6)
    assert p2p == pytest.approx(0.1728e-3, rel=1e-3)  # README: 0.17 ms, about 1 % of the stage's forward
    assert p2p / stage["forward"] == pytest.approx(0.00956, rel=1e-2)
    # a stage sends m activations and m gradients per step: 512 MiB, about 11 ms of link time
    step_bytes = pp_step_p2p_bytes(s, b, h, p, 3, m, bytes_per_element=2, tp=t, sequence_parallel=True)["total"]
    assert step_bytes == 2 * 32 * 8 * MiB
    assert 2 * m * p2p == pytest.approx(11.06e-3, rel=1e-3)
    # the bubble: 7/39 of the step, in seconds (p - 1)(t_f + t_b)
    assert pp_bubble_fraction(p, m) == pytest.approx(7 / 39)  # README: 17.9 %
    bubble = pp_bubble_seconds(p, stage["forward"], stage["backward"])
    step = pp_step_seconds(p, m, stage["forward"], stage["backward"])
    assert bubble == pytest.approx(0.3795, rel=1e-3)  # README: 0.38 s
    assert step == pytest.approx(2.114, rel=1e-3)  # README: 2.11 s
    # interleaved, v = 5 (2 layers per chunk): 7/167 of the step, 5x the messages
    assert pp_bubble_fraction(p, m, 5) == pytest.approx(7 / 167)  # README: 4.2 %
    assert pp_bubble_seconds(p, stage["forward"], stage["backward"], 5) == pytest.approx(0.0759, rel=1e-3)
    assert 5 * 2 * m * p2p == pytest.approx(55.3e-3, rel=1e-3)  # README: 55 ms of link time per step
    # against TP: one layer's forward under TP 8 + SP moves 4 (t-1)/t N, N = [s, b, h] bf16 = 64 MiB
    n = s * b * h * 2
    tp_forward_bytes = 2 * 2 * ring_factor("all_gather", t) * n  # 2 all-gathers + 2 reduce-scatters
    assert tp_forward_bytes == 224 * MiB
    assert transfer_seconds(tp_forward_bytes, H100_NODE.nvlink) == pytest.approx(0.522e-3, rel=1e-2)  # NVLink
    assert transfer_seconds(tp_forward_bytes, H100_NODE.network) == pytest.approx(4.70e-3, rel=1e-2)  # over IB
    assert compute_seconds(transformer_layer_flops(s, b, h) / t, mfu=0.5) == pytest.approx(1.807e-3, rel=1e-3)


def test_lesson_memory_example():
    """03_memory.md: the same 70B-class model (a = 64 heads), TP 8 + SP, selective recomputation, PP 8, m = 32."""
    from autograder.lessons.volume import activation_bytes_per_layer, pp_stage_activation_bytes

    s, b, h, a, t = 4096, 1, 8192, 64, 8
    per_layer = activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=True, selective_recompute=True)
    assert per_layer == 34 * s * b * h / t == 136 * MiB
    full = activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=True)
    assert full == s * b * h / t * (34 + 5 * 64 * 4096 / 8192) == 776 * MiB  # without recomputation
    # 1F1B: stage 0 holds p = 8 micro-batches of its 10 layers = all 80 layers' activations of one micro-batch
    assert pp_stage_activation_bytes("1f1b", 8, 0, 32, 10, per_layer) == 80 * 136 * MiB  # 10.6 GiB
    assert pp_stage_activation_bytes("1f1b", 8, 7, 32, 10, per_layer) == 10 * 136 * MiB  # the last stage: 1.3 GiB
    assert pp_stage_activation_bytes("gpipe", 8, 0, 32, 10, per_layer) == 320 * 136 * MiB  # 42.5 GiB
    # interleaved v = 5: 47 chunk outputs of 2 layers = 94 layers' worth, 12.5 GiB
    assert pp_peak_outputs("interleaved", 8, 0, 32, 5) == 2 * 7 + 4 * 8 + 1 == 47
    assert pp_stage_activation_bytes("interleaved", 8, 0, 32, 10, per_layer, num_chunks=5) == 94 * 136 * MiB
    assert pp_stage_activation_bytes("1f1b", 8, 0, 32, 10, full) == 80 * 776 * MiB  # 60.6 GiB without recomputation
    assert activation_bytes_per_layer(s, b, h, a) == s * b * h * (34 + 160)  # no parallelism: 6.1 GiB per layer


@pytest.mark.parametrize("p,v", [(4, 2), (8, 5), (2, 3), (16, 2)])
def test_interleaving_memory_factor(p, v):
    """04_interleaving_and_zero_bubble.md, section 3: with m large, stage 0 holds v p + p - 1 chunk outputs,
    p + (p - 1)/v stage-equivalents, a factor 1 + (p - 1)/(p v) over 1F1B's p."""
    m = 10 * p
    chunks = pp_peak_outputs("interleaved", p, 0, m, v)
    assert chunks == v * p + p - 1
    assert (chunks / v) / pp_peak_outputs("1f1b", p, 0, m) == pytest.approx(1 + (p - 1) / (p * v))
