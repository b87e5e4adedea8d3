"""The context-parallel lesson's formulas, checked against the reference solutions and the lesson's text.

    .venv/bin/python -m pytest -q tests/test_context_parallel_volume.py

Every formula of assignments/04_context_parallel/README.md (sections 3 and 4)
is computed by autograder/lessons/volume.py; here the bytes are measured from the
ledgers of the reference ring and Ulysses (and of an all-gathered-K/V
attention written below), the FLOPs with FlopCounterMode, and the README's
tables are regenerated and must appear in it verbatim.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from autograder.runtime.dist import run_distributed
from autograder.lessons.hardware import H100_NODE
from autograder.runtime.ledger import CommLedger
from autograder.lessons.volume import (
    attention_flops, cp_allgather_bytes, cp_attention_seconds, cp_bytes_sent, cp_comparison_table,
    cp_ring_bytes, cp_ulysses_bytes, cp_winner_grid, ring_overlap_min_tokens, ring_step_seconds,
)
from solutions.context_parallel.ring import attention_block_backward, attention_with_lse, ring_attention
from solutions.context_parallel.ulysses import ulysses_attention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, S, N, D = 2, 16, 4, 3  # h = kv = N * D = 12, float64: 8 bytes per element


class _AllGatherKV(torch.autograd.Function):
    """All-gather K or V along the sequence in forward, reduce-scatter its gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty(group.size() * x.shape[1], x.shape[0], *x.shape[2:], dtype=x.dtype)
        dist.all_gather_single(out, x.transpose(0, 1).contiguous(), group=group)  # [s, b, n, d]
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        g = grad.transpose(0, 1).contiguous()
        out = torch.empty(g.shape[0] // ctx.group.size(), *g.shape[1:], dtype=g.dtype)
        dist.reduce_scatter_single(out, g, group=ctx.group)
        return out.transpose(0, 1), None


def _program(rank, world_size):
    group = dist.group.WORLD
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(B, S // world_size, N, D, generator=g, dtype=torch.float64).requires_grad_()
                     for _ in range(4))
    ledgers = {}
    for name in ("ring", "ulysses", "allgather"):
        with CommLedger() as ledger:
            if name == "ring":
                out, _ = ring_attention(q, k, v, cp_group=group, causal=True)
            elif name == "ulysses":
                out = ulysses_attention(q, k, v, cp_group=group, causal=True)
            else:
                out, _ = attention_with_lse(q, _AllGatherKV.apply(k, group), _AllGatherKV.apply(v, group),
                                            causal=True, q_offset=rank * q.shape[1])
            out.backward(dout.detach())
        ledgers[name] = ledger.records
    return ledgers


@pytest.mark.parametrize("world_size", [2, 4])
def test_cp_volumes_match_the_ledgers(world_size):
    h = N * D
    for ledgers in run_distributed(_program, world_size):
        expected = {"ring": cp_ring_bytes(S, B, h, world_size, bytes_per_element=8),
                    "ulysses": cp_ulysses_bytes(S, B, h, h, world_size, bytes_per_element=8),
                    # the Function below keeps the gathered K/V for backward (autograd saves them): no re-gather
                    "allgather": cp_allgather_bytes(S, B, h, world_size, bytes_per_element=8, regather=False)}
        for name, records in ledgers.items():
            for phase in ("forward", "backward"):
                assert cp_bytes_sent(records, phase=phase) == pytest.approx(expected[name][phase]), (name, phase)
    te = cp_ring_bytes(S, B, h, 4, bytes_per_element=8, dkv_sends="te")
    assert te["backward"] == 2 * te["forward"]  # K/V again, and dK/dV one step fewer than a full turn
    again = cp_allgather_bytes(S, B, h, 4, bytes_per_element=8)  # TransformerEngine gathers K/V again
    assert again["backward"] == 2 * again["forward"]


def test_attention_flops_match_flop_counter_mode():
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(B, S, N, D, generator=g, dtype=torch.float64) for _ in range(4))
    with FlopCounterMode(display=False) as fwd:
        out, lse = attention_with_lse(q, k, v, causal=False)
    with FlopCounterMode(display=False) as bwd:
        attention_block_backward(q, k, v, out, dout, lse, causal=False)
    assert fwd.get_total_flops() == attention_flops(S, S, B, N * D)
    assert bwd.get_total_flops() == attention_flops(S, S, B, N * D, phase="backward")


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("kv_hidden,work", [(4096, 1.0), (1024, 1.0), (1024, 0.5)])
def test_ring_overlap_threshold_is_where_compute_catches_up(phase, kv_hidden, work):
    for link in (H100_NODE.nvlink, H100_NODE.network):
        x = ring_overlap_min_tokens(4096, kv_hidden, link=link, phase=phase, work_fraction=work)
        at = ring_step_seconds(x, 1, 4096, kv_hidden, link=link, phase=phase, work_fraction=work)
        below = ring_step_seconds(x - 1, 1, 4096, kv_hidden, link=link, phase=phase, work_fraction=work)
        assert at["compute"] >= at["transfer"] and below["compute"] < below["transfer"]


def test_readme_numbers_are_computed():
    """The README's section-4 tables are exactly what autograder/lessons/volume.py prints."""
    readme = open(os.path.join(ROOT, "assignments", "04_context_parallel", "README.md"), encoding="utf-8").read()
    tables = [
        cp_comparison_table(seq=131072, batch=1, hidden=4096, kv_hidden=1024, cp=8),
        cp_comparison_table(seq=32768, batch=1, hidden=4096, kv_hidden=4096, cp=16),
        cp_winner_grid(hidden=4096, kv_hidden=4096, seqs=(8192, 32768, 131072), cps=(4, 8, 16, 32),
                       link=H100_NODE.network),
        cp_winner_grid(hidden=4096, kv_hidden=4096, seqs=(8192, 32768, 131072), cps=(4, 8, 16, 32),
                       link=H100_NODE.nvlink),
    ]
    for table in tables:
        assert table in readme, f"README section 4 is stale; regenerate:\n{table}"
    # the prose's thresholds (tokens per rank above which the ring's transfer hides)
    for kv, link, tokens in ((4096, H100_NODE.nvlink, 1245), (4096, H100_NODE.network, 9921),
                             (1024, H100_NODE.nvlink, 585), (1024, H100_NODE.network, 2590)):
        assert ring_overlap_min_tokens(4096, kv, link=link) == tokens
        assert f"{tokens:,}" in readme
    # section 1: attention's FLOPs equal the linear layers' 24 b s h^2 at s = 6h; 34 s b h bytes of activations
    assert attention_flops(6 * 4096, 6 * 4096, 1, 4096) == 24 * (6 * 4096) * 4096 ** 2 and "24,576 tokens" in readme
    assert round(34 * 131072 * 4096 / 2 ** 30) == 17 and "17 GiB" in readme
    for kv, link, tokens in ((4096, H100_NODE.nvlink, 1421), (4096, H100_NODE.network, 11889)):
        assert ring_overlap_min_tokens(4096, kv, link=link, phase="backward") == tokens and f"{tokens:,}" in readme
    # section 3: Ulysses sends w kv / (h + kv) times less than the ring
    for w, kv, ratio in ((2, 4096, 1.0), (8, 4096, 4.0), (8, 1024, 1.6)):
        ring_fwd = cp_ring_bytes(131072, 1, kv, w)["forward"]
        assert ring_fwd / cp_ulysses_bytes(131072, 1, 4096, kv, w)["forward"] == pytest.approx(ratio)
    ring_bwd = cp_ring_bytes(131072, 1, 4096, 8, grad_bytes_per_element=4)
    # "about three times as much": K/V again (1x) plus dK/dV in float32 (2x), one more turn than forward
    assert ring_bwd["backward"] == pytest.approx(3 * ring_bwd["forward"] + 2 * (131072 // 8) * 4096 * 4)
    ring = cp_attention_seconds(8192, 1, 4096, 4096, 8, scheme="ring", link=H100_NODE.network)
    uly = cp_attention_seconds(8192, 1, 4096, 4096, 8, scheme="ulysses", link=H100_NODE.network)
    assert ring["total"] > uly["total"]  # the README's claim: short sequences across nodes favour Ulysses
