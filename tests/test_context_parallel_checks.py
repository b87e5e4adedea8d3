"""The public checks of assignment 04 themselves: their reference, their ledger reading, their verdicts.

    .venv/bin/python -m pytest -q tests/test_context_parallel_checks.py

The checks' float64 reference is compared with `F.scaled_dot_product_attention`;
the ledger is shown to record `batch_isend_irecv` ops with group-rank peers (what
the P2P rules read); the FLOP trace agrees with `FlopCounterMode`; and wrong
implementations that are not mutants of the reference (K and V sent as one
tensor, K/V all-gathered, SDPA inside the ring) get the verdict they deserve.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import autograder.checks.context_parallel as checks  # noqa: E402
from autograder.checks.context_parallel import common, ring  # noqa: E402 - their helpers, tested directly
from autograder.runtime.compare import CheckFailure  # noqa: E402
from autograder.runtime.dist import DistributedError, run_distributed  # noqa: E402
from autograder.runtime.ledger import CommLedger, CommRecord  # noqa: E402
from solutions.context_parallel.ring import (  # noqa: E402
    attention_with_lse, merge_attention, ring_attention, ring_attention_forward,
)
from solutions.context_parallel.zigzag import zigzag_ring_attention  # noqa: E402


def _qkv(seed, b=2, s=8, n=3, d=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, n, d, generator=g, dtype=torch.float64) for _ in range(4)]


# ---------------------------------------------------------------------------
# The reference
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("causal,q_offset,k_offset", [(False, 0, 0), (True, 0, 0), (True, 6, 1)])
def test_reference_attention_equals_sdpa(causal, q_offset, k_offset):
    q, k, v, dout = _qkv(0)
    q, dout = q[:, :4], dout[:, :4]
    out, lse = checks.reference_attention(q, k, v, causal=causal, q_offset=q_offset, k_offset=k_offset)
    mask = common._visible(4, 8, causal, q_offset, k_offset)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qr.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2),
                                         attn_mask=mask).transpose(1, 2)
    ref.backward(dout)
    torch.testing.assert_close(out, ref)
    grads = checks.reference_attention_grads(q, k, v, dout, causal=causal, q_offset=q_offset, k_offset=k_offset)
    for mine, theirs in zip(grads, (qr.grad, kr.grad, vr.grad)):
        torch.testing.assert_close(mine, theirs)
    scores = (torch.einsum("bqnd,bknd->bnqk", q, k) / 2.0).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).transpose(1, 2))


def test_reference_fully_masked_rows_are_zero_and_minus_inf():
    q, k, v, dout = _qkv(1)
    out, lse = checks.reference_attention(q, k, v, causal=True, q_offset=0, k_offset=5)
    assert torch.equal(out[:, :5], torch.zeros_like(out[:, :5])) and torch.isinf(lse[:, :5]).all()
    grads = checks.reference_attention_grads(q, k, v, dout, causal=True, q_offset=0, k_offset=5)
    assert not any(torch.isnan(g).any() for g in grads)


def test_layouts():
    x = torch.arange(16)[None]
    assert checks.zigzag_shard(x, 1, 4)[0].tolist() == [2, 3, 12, 13]
    assert checks.contiguous_shard(x, 1, 4)[0].tolist() == [4, 5, 6, 7]
    assert ring._span([0, 1, 2, 3, 12, 13]) == "0-3, 12-13"
    assert ring._cp_groups(4, 2) == [[0, 2], [1, 3]] and ring._cp_groups(3, 3) == [[0, 1, 2]]


# ---------------------------------------------------------------------------
# What the ledger and the FLOP trace see
# ---------------------------------------------------------------------------

def _subgroup_p2p(rank, world_size):
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[rank % 2]
    x = torch.full((2, 3), float(rank))
    buf = torch.empty_like(x)
    with CommLedger() as ledger:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, group=group, group_peer=1 - group.rank()),
                                        dist.P2POp(dist.irecv, buf, group=group, group_peer=1 - group.rank())])
        for w in works:
            w.wait()
    return buf, ledger.records


def test_ledger_records_batched_p2p_with_group_rank_peers():
    results = run_distributed(_subgroup_p2p, 4)
    for rank, (buf, records) in enumerate(results):
        assert buf[0, 0].item() == (rank + 2) % 4  # the partner in the CP group [0, 2] or [1, 3]
        ops = [(r.op, r.peer, r.group_size, r.shape) for r in records if r.op != "wait"]
        assert ops == [("send", 1 - rank // 2, 2, (2, 3)), ("recv", 1 - rank // 2, 2, (2, 3))]
        assert [r.op for r in records].count("wait") == 2


def test_flop_trace_agrees_with_flop_counter_mode():
    q, k, v, _ = _qkv(2)
    with ring._FlopTrace() as trace:
        with FlopCounterMode(display=False) as counter:
            attention_with_lse(q, k, v, causal=True)
    assert sum(trace.flops.values()) == counter.get_total_flops() == 2 * 2 * (2 * 3 * 8 * 8 * 4)


def test_steps_are_cut_at_the_first_wait_after_each_transfer():
    def rec(op, seq):
        return CommRecord(op=op, phase="forward", seq=seq)

    records = [rec("send", 1), rec("recv", 2), rec("wait", 5), rec("wait", 6), rec("send", 7), rec("recv", 8),
               rec("wait", 10)]
    assert [[r.seq for r in g] for g in ring._post_groups(records, "forward")] == [[1, 2], [7, 8]]
    assert ring._steps(records, {3: 10, 4: 5, 9: 7, 11: 1}) == [15, 7, 1]
    # a buffer allocated between a send and its receive (seq 2 is an op without FLOPs) stays one transfer;
    # a matmul between two posts splits them
    records = [rec("send", 1), rec("recv", 3), rec("send", 5), rec("wait", 6)]
    assert [[r.seq for r in g] for g in ring._post_groups(records, "forward", {2: 0, 4: 0})] == [[1, 3, 5]]
    assert [[r.seq for r in g] for g in ring._post_groups(records, "forward", {4: 8})] == [[1, 3], [5]]


# ---------------------------------------------------------------------------
# Wrong implementations that are not mutants of the reference
# ---------------------------------------------------------------------------

def _kv_as_one_tensor(q, k, v, *, cp_group, causal):
    """K and V stacked into one message per step: right numbers, half the sends the check expects."""
    size, rank = cp_group.size(), cp_group.rank()
    s_local = q.shape[1]
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype)
    kv = torch.stack([k, v]).contiguous()
    for step in range(size):
        if step + 1 < size:
            nxt = torch.empty_like(kv)
            works = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, kv, group=cp_group, group_peer=(rank + 1) % size),
                dist.P2POp(dist.irecv, nxt, group=cp_group, group_peer=(rank - 1) % size)])
        src = (rank - step) % size
        if not causal or src <= rank:
            out, lse = merge_attention(out, lse, *attention_with_lse(q, kv[0], kv[1], causal=causal,
                                                                     q_offset=rank * s_local,
                                                                     k_offset=src * s_local))
        if step + 1 < size:
            for w in works:
                w.wait()
            kv = nxt
    return out, lse


def _allgathered_kv(q, k, v, *, cp_group, causal):
    """K/V all-gathered (Megatron's allgather CP): right numbers, but not the ring this exercise asks for."""
    size, rank = cp_group.size(), cp_group.rank()
    full_k = torch.empty(size * k.shape[1], *k.shape[:1], *k.shape[2:], dtype=k.dtype)
    full_v = torch.empty_like(full_k)
    dist.all_gather_single(full_k, k.transpose(0, 1).contiguous(), group=cp_group)
    dist.all_gather_single(full_v, v.transpose(0, 1).contiguous(), group=cp_group)
    return attention_with_lse(q, full_k.transpose(0, 1), full_v.transpose(0, 1), causal=causal,
                              q_offset=rank * q.shape[1], k_offset=0)


def test_k_and_v_in_one_message_fail_on_the_count():
    with pytest.raises(CheckFailure, match=r"expected 2 send\(s\) in forward, saw 1"):
        checks.check_ring_attention(_kv_as_one_tensor, world_size=2, causal=True)


def test_allgathered_kv_fails_as_not_a_ring():
    with pytest.raises(CheckFailure, match=r"unexpected collective\(s\) in forward.*P2P only") as info:
        checks.check_ring_attention(_allgathered_kv, world_size=2, causal=True)
    assert "The numbers are wrong too" not in str(info.value)  # right numbers, wrong communication


def test_a_forward_that_is_not_differentiable_is_named():
    def detached(q, k, v, *, cp_group, causal):
        out, lse = ring_attention_forward(q, k, v, cp_group=cp_group, causal=causal)
        return out.detach(), lse

    with pytest.raises(DistributedError, match="does not require grad"):
        checks.check_ring_attention(detached, world_size=2, causal=True, backward=True)


def test_sdpa_inside_the_ring_is_invisible_to_flop_counting():
    """SDPA counts 0 FLOPs on CPU: the balance check says so instead of passing or failing obscurely."""

    def sdpa_attention(q, k, v, *, causal, q_offset=0, k_offset=0):
        mask = common._visible(q.shape[1], k.shape[1], causal, q_offset, k_offset)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask).transpose(1, 2)
        scores = (q.unsqueeze(2) * k.unsqueeze(1)).sum(-1) / q.shape[-1] ** 0.5  # [b, sq, sk, n], no matmul
        lse = torch.logsumexp(scores.masked_fill(~mask[None, :, :, None], float("-inf")), dim=2)
        return out, lse

    import solutions.context_parallel.ring as cp
    import solutions.context_parallel.zigzag as zz

    originals = cp.attention_with_lse, zz.attention_with_lse
    cp.attention_with_lse = zz.attention_with_lse = sdpa_attention  # the rings look it up by name, as in a notebook
    try:
        checks.check_zigzag_ring_attention(zigzag_ring_attention, world_size=2, backward=False)  # right numbers
        with pytest.raises(CheckFailure, match="counted no FLOPs"):
            checks.check_zigzag_balance(zigzag_ring_attention, ring_attention, world_size=2)
    finally:
        cp.attention_with_lse, zz.attention_with_lse = originals


def test_overlap_check_reads_waits_and_posts():
    """A ring that waits right after posting computes nothing while the transfer is in flight."""

    def serial_ring(q, k, v, *, cp_group, causal):
        size, rank = cp_group.size(), cp_group.rank()
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype)
        for step in range(size):
            out, lse = merge_attention(out, lse, *attention_with_lse(q, k, v, causal=False))
            if step + 1 < size:
                nk, nv = torch.empty_like(k), torch.empty_like(v)
                works = dist.batch_isend_irecv([
                    dist.P2POp(dist.isend, k.contiguous(), group=cp_group, group_peer=(rank + 1) % size),
                    dist.P2POp(dist.irecv, nk, group=cp_group, group_peer=(rank - 1) % size),
                    dist.P2POp(dist.isend, v.contiguous(), group=cp_group, group_peer=(rank + 1) % size),
                    dist.P2POp(dist.irecv, nv, group=cp_group, group_peer=(rank - 1) % size)])
                for w in works:
                    w.wait()
                k, v = nk, nv
        return out, lse

    checks.check_ring_attention(serial_ring, world_size=3, causal=False, seq=9)  # right numbers and counts
    with pytest.raises(CheckFailure, match="nothing was computed while transfer 0 was in flight"):
        checks.check_ring_overlap(serial_ring, world_size=3, seq=9)


# ---------------------------------------------------------------------------
# Pictures from a run
# ---------------------------------------------------------------------------

def test_pictures_are_images_of_the_measured_work():
    m = checks.measure_ring_layouts(ring_attention, zigzag_ring_attention, world_size=4, seq=16)
    block = m["block"]
    assert [[s / block for s in r["steps"]] for r in m["contiguous"]] == [
        [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert all([s / block for s in r["steps"]] == [1, 0.5, 0.5, 0.5] for r in m["zigzag"])
    for pic in (checks.plot_ring_steps(None, None, measured=m), checks.plot_ring_flops(None, None, measured=m)):
        assert pic.png.startswith(b"\x89PNG") and len(pic.png) > 10_000
        assert pic._repr_png_() == pic.png


def test_the_lessons_trace_is_the_references():
    """02_ring_attention.md quotes rank 0's forward trace at w = 2: it is what the check prints."""
    case, _, results = ring._run_ring(ring_attention, "contiguous", world_size=2, cp_size=None, causal=False,
                                        batch=2, seq=8, n_heads=3, head_dim=4, dtype=torch.float64, seed=0,
                                        logit_scale=1.0, backward=False, backend="gloo", timeout=20)
    lines = ring._timeline(results[0]["records"], results[0]["ops"], results[0]["flops"]).splitlines()
    lesson = open(os.path.join(ROOT, "assignments", "04_context_parallel", "02_ring_attention.md"),
                  encoding="utf-8").read()
    quoted = [line for line in lines if "send" in line or "recv" in line or "bmm" in line]
    assert len(quoted) == 8
    for line in quoted:
        assert line.strip() in lesson, line


def test_plain_isend_irecv_with_buffers_allocated_between_posts_is_accepted():
    """Spec: isend/irecv one by one give the same ledger as batch_isend_irecv; both are accepted."""

    def one_by_one(q, k, v, *, cp_group, causal):
        size, rank = cp_group.size(), cp_group.rank()
        s_local = q.shape[1]
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype)
        for step in range(size):
            if step + 1 < size:
                works = [dist.isend(k.contiguous(), group=cp_group, group_dst=(rank + 1) % size)]
                nk = torch.empty_like(k)  # allocated between the posts
                works.append(dist.irecv(nk, group=cp_group, group_src=(rank - 1) % size))
                works.append(dist.isend(v.contiguous(), group=cp_group, group_dst=(rank + 1) % size))
                nv = torch.empty_like(v)
                works.append(dist.irecv(nv, group=cp_group, group_src=(rank - 1) % size))
            src = (rank - step) % size
            if not causal or src <= rank:
                out, lse = merge_attention(out, lse, *attention_with_lse(q, k, v, causal=causal, q_offset=rank * s_local,
                                                                         k_offset=src * s_local))
            if step + 1 < size:
                for w in works:
                    w.wait()
                k, v = nk, nv
        return out, lse

    checks.check_ring_attention(one_by_one, world_size=3, causal=True, seq=9)
    checks.check_ring_overlap(one_by_one, world_size=3, seq=9)
