"""The reference solution of assignment 04 (context parallelism), tested directly and against PyTorch.

    .venv/bin/python -m pytest -q tests/test_context_parallel_solutions.py

Independent references: `F.scaled_dot_product_attention` for single-device
attention, autograd for the block backward, and PyTorch's own (private) ring,
`torch.distributed.tensor.experimental._context_parallel._attention._templated_ring_attention`
and `_templated_ring_attention_backward`, on gloo in float64 (`convert_to_f32=False`),
for the contiguous ring and, with its head-tail load balancing, the zigzag ring.
The validation tests need no process group and are kept apart.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import autograder.checks.context_parallel as checks  # noqa: E402
from autograder.runtime.dist import run_distributed  # noqa: E402
from autograder.runtime.ledger import CommLedger  # noqa: E402
from solutions.context_parallel.ring import (  # noqa: E402
    attention_block_backward, attention_with_lse, merge_attention, ring_attention,
)
from solutions.context_parallel.ulysses import seq_all_to_all, ulysses_attention  # noqa: E402
from solutions.context_parallel.zigzag import zigzag_ring_attention, zigzag_split  # noqa: E402


def _qkv(seed, b=2, s=8, n=3, d=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, n, d, generator=g, dtype=dtype) for _ in range(4)]


def _sdpa(q, k, v, causal, mask=None):
    """SDPA on our [b, s, n, d] layout."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal and mask is None, attn_mask=mask)
    return out.transpose(1, 2)


# ---------------------------------------------------------------------------
# Validation: no process group needed
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [ring_attention, ulysses_attention])
def test_attention_entry_points_reject_a_non_group(fn):
    q = torch.zeros(1, 4, 2, 2)
    with pytest.raises(ValueError, match="ProcessGroup"):
        fn(q, q, q, cp_group=None, causal=True)
    with pytest.raises(ValueError, match="ProcessGroup"):
        zigzag_ring_attention(q, q, q, cp_group=0)


def test_zigzag_split_names_the_sizes():
    x = torch.arange(10.0).reshape(1, 10)
    with pytest.raises(ValueError, match=r"\(10, dim 1\).*\(4\)"):
        zigzag_split(x, cp_rank=0, cp_size=2, dim=1)
    with pytest.raises(ValueError, match="cp_rank"):
        zigzag_split(torch.zeros(1, 8), cp_rank=2, cp_size=2, dim=1)
    assert zigzag_split(torch.arange(8.0), cp_rank=1, cp_size=2, dim=0).tolist() == [2, 3, 4, 5]
    assert zigzag_split(torch.arange(8.0), cp_rank=0, cp_size=2, dim=0).tolist() == [0, 1, 6, 7]


# ---------------------------------------------------------------------------
# Single device, against SDPA and autograd
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_lse_equals_sdpa(causal):
    q, k, v, dout = _qkv(0)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = attention_with_lse(qs, ks, vs, causal=causal)
    out.backward(dout)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = _sdpa(qr, kr, vr, causal)
    ref.backward(dout)
    torch.testing.assert_close(out, ref)
    for a, b in ((qs, qr), (ks, kr), (vs, vr)):
        torch.testing.assert_close(a.grad, b.grad)
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) / 2.0
    if causal:
        scores = scores.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).transpose(1, 2))


def test_attention_offsets_are_global_positions():
    """q at positions 5..7, keys at 2..7: SDPA with the boolean mask of those positions."""
    q, k, v, _ = _qkv(1)
    q = q[:, :3]
    k, v = k[:, :6], v[:, :6]
    out, _ = attention_with_lse(q, k, v, causal=True, q_offset=5, k_offset=2)
    mask = (2 + torch.arange(6))[None, :] <= (5 + torch.arange(3))[:, None]
    torch.testing.assert_close(out, _sdpa(q, k, v, False, mask=mask))


def test_attention_fully_masked_rows_and_large_logits():
    q, k, v, dout = _qkv(2)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = attention_with_lse(qs, ks, vs, causal=True, q_offset=0, k_offset=3)
    out.backward(dout)
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3])) and torch.isinf(lse[:, :3]).all()
    assert not any(torch.isnan(t).any() for t in (out, lse, qs.grad, ks.grad, vs.grad))
    big, _, _, _ = _qkv(3)
    out, lse = attention_with_lse(30 * big, 30 * big, v, causal=False)
    assert float(lse.max()) > 709 and not torch.isnan(out).any()
    torch.testing.assert_close(out, _sdpa(30 * big, 30 * big, v, False))


def test_merge_is_exact_and_symmetric():
    q, k, v, _ = _qkv(4)
    full, full_lse = attention_with_lse(q, k, v, causal=False)
    a = attention_with_lse(q, k[:, :3], v[:, :3], causal=False)
    b = attention_with_lse(q, k[:, 3:], v[:, 3:], causal=False)
    for merged in (merge_attention(*a, *b), merge_attention(*b, *a)):
        torch.testing.assert_close(merged[0], full)
        torch.testing.assert_close(merged[1], full_lse)
    empty = (torch.zeros_like(full), torch.full_like(full_lse, float("-inf")))
    out, lse = merge_attention(*empty, *empty)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all()


@pytest.mark.parametrize("causal", [False, True])
def test_block_backward_equals_autograd_on_full_attention(causal):
    q, k, v, dout = _qkv(5)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = _sdpa(qr, kr, vr, causal)
    ref.backward(dout)
    out, lse = attention_with_lse(q, k, v, causal=causal)
    dq = torch.zeros_like(q)
    for a, b in ((0, 3), (3, 8)):
        bdq, bdk, bdv = attention_block_backward(q, k[:, a:b], v[:, a:b], out, dout, lse, causal=causal,
                                                 q_offset=0, k_offset=a)
        torch.testing.assert_close(bdk, kr.grad[:, a:b])
        torch.testing.assert_close(bdv, vr.grad[:, a:b])
        dq += bdq
    torch.testing.assert_close(dq, qr.grad)


# ---------------------------------------------------------------------------
# Multi-rank, through the public checks (numbers against single-process + ledger)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("world_size,causal", [(1, True), (2, False), (3, True), (4, True)])
def test_ring_forward_and_backward(world_size, causal):
    seq = 12 if world_size == 3 else 8
    checks.check_ring_attention(ring_attention, world_size=world_size, causal=causal, seq=seq, backward=True)


def test_ring_in_a_subgroup_with_large_logits_and_float32():
    checks.check_ring_attention(ring_attention, world_size=4, cp_size=2, causal=True, backward=True,
                                logit_scale=900.0)
    checks.check_ring_attention(ring_attention, world_size=2, causal=True, backward=True, dtype=torch.float32)
    checks.check_ring_overlap(ring_attention, world_size=3, seq=9)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_zigzag(world_size):
    checks.check_zigzag_ring_attention(zigzag_ring_attention, world_size=world_size, seq=4 * world_size)
    checks.check_zigzag_split(zigzag_split, cp_size=world_size, shape=(2, 4 * world_size, 3))


def test_zigzag_balance_and_a_subgroup():
    checks.check_zigzag_balance(zigzag_ring_attention, ring_attention, world_size=4, seq=16)
    checks.check_zigzag_ring_attention(zigzag_ring_attention, world_size=4, cp_size=2, dtype=torch.float32)


@pytest.mark.parametrize("world_size,causal", [(1, True), (2, False), (4, True)])
def test_ulysses(world_size, causal):
    checks.check_ulysses_attention(ulysses_attention, world_size=world_size, causal=causal, n_heads=4)
    checks.check_seq_all_to_all(seq_all_to_all, world_size=world_size, shape=(2, 4, 8, 3))
    checks.check_ulysses_errors(ulysses_attention, seq_all_to_all, world_size=max(world_size, 2))


# ---------------------------------------------------------------------------
# Independent reference: PyTorch's own ring (private API, torch 2.13)
# ---------------------------------------------------------------------------

def _torch_ring_rank(rank, world_size, q, k, v, dout, causal, zigzag):
    """Ours and PyTorch's ring on the same shards; PyTorch's layout is [b, n, s, d] with lse [b, n, s]."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    cp_attention._cp_options.convert_to_f32 = False  # float64 stays float64 (else it is cast to float32)
    cp_attention._cp_options.enable_load_balance = zigzag  # its round-robin layout = chunks r and 2w-1-r
    group = dist.group.WORLD
    shard = (lambda t: zigzag_split(t, cp_rank=rank, cp_size=world_size, dim=1)) if zigzag else \
        (lambda t: t.chunk(world_size, dim=1)[rank].contiguous())
    ql, kl, vl, dl = (shard(t) for t in (q, k, v, dout))
    aten = torch.ops.aten
    tq, tk, tv, td = (t.transpose(1, 2).contiguous() for t in (ql, kl, vl, dl))
    t_out, t_lse, *_ = cp_attention._templated_ring_attention(
        group, 2, aten._scaled_dot_product_flash_attention_for_cpu, tq, tk, tv, is_causal=causal)
    t_dq, t_dk, t_dv, *_ = cp_attention._templated_ring_attention_backward(
        group, 2, aten._scaled_dot_product_flash_attention_for_cpu_backward, td, "grad_out", tq, tk, tv, t_out,
        t_lse, is_causal=causal, dropout_p=0.0)
    qs, ks, vs = (t.clone().requires_grad_() for t in (ql, kl, vl))
    with CommLedger() as ledger:
        if zigzag:
            out, lse = zigzag_ring_attention(qs, ks, vs, cp_group=group)
        else:
            out, lse = ring_attention(qs, ks, vs, cp_group=group, causal=causal)
        out.backward(dl)
    theirs = [t_out.transpose(1, 2), t_lse.transpose(1, 2), t_dq.transpose(1, 2), t_dk.transpose(1, 2),
              t_dv.transpose(1, 2)]
    return [out.detach(), lse, qs.grad, ks.grad, vs.grad], theirs, ledger.records


@pytest.mark.parametrize("world_size,causal,zigzag", [(2, False, False), (3, True, False), (2, True, True),
                                                      (3, True, True)])
def test_ring_equals_pytorchs_templated_ring_attention(world_size, causal, zigzag):
    q, k, v, dout = _qkv(6, s=4 * world_size)
    results = run_distributed(_torch_ring_rank, world_size, args=(q, k, v, dout, causal, zigzag))
    for rank, (ours, theirs, records) in enumerate(results):
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), ours, theirs):
            torch.testing.assert_close(a, b, msg=f"rank {rank}: {name} differs from PyTorch's ring")
        # PyTorch rotates with collectives (all-gather / all-to-all); ours sends only P2P: 2(w-1) + 4w - 2
        ops = [r.op for r in records if r.op != "wait"]
        assert set(ops) == {"send", "recv"} and ops.count("send") == 2 * (world_size - 1) + 4 * world_size - 2
