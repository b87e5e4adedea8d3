"""Reference solution, assignment 04 (part 2): the zigzag layout and causal ring attention on it.

Cut the sequence into 2w chunks; rank r holds chunks r and 2w - 1 - r (one
early, one late), so under the causal mask every rank does the same work
(ring-flash-attention `zigzag_ring_flash_attn.py`: `zigzag_ring_flash_attn_forward`,
`zigzag_ring_flash_attn_backward`; Megatron-LM `get_batch_on_this_cp_rank`;
PyTorch's `_HeadTailLoadBalancer`). Tensors are `[b, s, n, d]`, shards
`[b, s/w, n, d]` = [chunk r, chunk 2w - 1 - r] along dim 1.

Tested by:  .venv/bin/python -m pytest -q tests/test_context_parallel_solutions.py
"""

from __future__ import annotations

import torch

from solutions.context_parallel.ring import (
    _accumulation_dtype,
    _check_qkv,
    _group_size_rank,
    attention_block_backward,
    attention_with_lse,
    merge_attention,
    ring_send_recv,
)

__all__ = ["zigzag_split", "zigzag_ring_attention_forward", "zigzag_ring_attention_backward",
           "zigzag_ring_attention"]


# ---------------------------------------------------------------------------
# Exercise 5: the zigzag layout and the zigzag ring
# ---------------------------------------------------------------------------

def zigzag_split(x, *, cp_rank, cp_size, dim):
    """Rank `cp_rank`'s zigzag shard of `x` along `dim`: chunks cp_rank and 2 cp_size - 1 - cp_rank of 2 cp_size.

    ValueError (naming the sizes) if x.shape[dim] is not divisible by 2 cp_size
    or cp_rank is not in [0, cp_size).
    """
    ### BEGIN SOLUTION
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"zigzag_split: cp_rank ({cp_rank}) must be in [0, cp_size) with cp_size = {cp_size}")
    if x.shape[dim] % (2 * cp_size) != 0:
        raise ValueError(f"zigzag_split: the sequence length ({x.shape[dim]}, dim {dim}) is not divisible by "
                         f"2 * cp_size ({2 * cp_size})")
    chunks = x.chunk(2 * cp_size, dim=dim)  # 2w x [.., s/2w, ..]
    return torch.cat([chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]], dim=dim)  # [.., s/w, ..]
    ### END SOLUTION


def zigzag_ring_attention_forward(q, k, v, *, cp_group):
    """Causal ring attention on zigzag shards `[b, s/w, n, d]`; returns `(out, lse)` in the zigzag layout.

    Step 0: the rank's own block, causal (the local order of the two chunks is
    their global order, so the plain lower-triangular mask is exact). Step
    i > 0, holding the block of src = (r - i) mod w:
    src < r: both my chunks see src's early chunk and none of its late one:
    all my queries against the first half of K/V;
    src > r: my late chunk sees both of src's chunks, my early chunk neither:
    the second half of my queries against all of K/V.
    Every rank computes half a block per step: equal work.
    """
    ### BEGIN SOLUTION
    size, rank = cp_group.size(), cp_group.rank()
    b, s_local, n, d = q.shape
    half = s_local // 2
    acc = _accumulation_dtype(q.dtype)
    out = torch.zeros(b, s_local, n, d, dtype=acc, device=q.device)
    lse = torch.full((b, s_local, n), float("-inf"), dtype=acc, device=q.device)
    k, v = k.contiguous(), v.contiguous()
    for step in range(size):
        if step + 1 < size:
            works, (next_k, next_v) = ring_send_recv([k, v], cp_group=cp_group)
        src = (rank - step) % size
        if step == 0:
            block_out, block_lse = attention_with_lse(q, k, v, causal=True)
            out, lse = merge_attention(out, lse, block_out, block_lse)
        elif src < rank:
            block_out, block_lse = attention_with_lse(q, k[:, :half], v[:, :half], causal=False)
            out, lse = merge_attention(out, lse, block_out, block_lse)
        else:
            block_out, block_lse = attention_with_lse(q[:, half:], k, v, causal=False)
            late_out, late_lse = merge_attention(out[:, half:], lse[:, half:], block_out, block_lse)
            out = torch.cat([out[:, :half], late_out], dim=1)
            lse = torch.cat([lse[:, :half], late_lse], dim=1)
        if step + 1 < size:
            for work in works:
                work.wait()
            k, v = next_k, next_v
    return out.to(q.dtype), lse
    ### END SOLUTION


def zigzag_ring_attention_backward(q, k, v, out, lse, dout, *, cp_group):
    """Backward of the zigzag ring: the ring backward with the forward's three cases; returns `(dq, dk, dv)`."""
    ### BEGIN SOLUTION
    size, rank = cp_group.size(), cp_group.rank()
    half = q.shape[1] // 2
    acc = _accumulation_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    k, v = k.contiguous(), v.contiguous()
    for step in range(size):
        if step + 1 < size:
            kv_works, (next_k, next_v) = ring_send_recv([k, v], cp_group=cp_group)
        src = (rank - step) % size
        if step == 0:
            block_dq, block_dk, block_dv = attention_block_backward(q, k, v, out, dout, lse, causal=True)
            dq = dq + block_dq
        elif src < rank:  # all my queries, the first half of the block's keys
            block_dq, dk0, dv0 = attention_block_backward(q, k[:, :half], v[:, :half], out, dout, lse, causal=False)
            dq = dq + block_dq
            block_dk = torch.cat([dk0, torch.zeros_like(dk0)], dim=1)
            block_dv = torch.cat([dv0, torch.zeros_like(dv0)], dim=1)
        else:  # the second half of my queries, all of the block's keys
            dq1, block_dk, block_dv = attention_block_backward(
                q[:, half:], k, v, out[:, half:], dout[:, half:], lse[:, half:], causal=False)
            dq = torch.cat([dq[:, :half], dq[:, half:] + dq1], dim=1)
        if step == 0:
            dk, dv = block_dk, block_dv
        else:
            for work in dkv_works:
                work.wait()
            dk, dv = next_dk + block_dk, next_dv + block_dv
        if step + 1 < size:
            for work in kv_works:
                work.wait()
            k, v = next_k, next_v
        if size > 1:
            dkv_works, (next_dk, next_dv) = ring_send_recv([dk, dv], cp_group=cp_group)
    if size > 1:
        for work in dkv_works:
            work.wait()
        dk, dv = next_dk, next_dv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Given: the autograd Function and the entry point
# ---------------------------------------------------------------------------

class _ZigzagRingAttention(torch.autograd.Function):
    """Causal ring attention on the zigzag layout (ring-flash-attention `ZigZagRingFlashAttnFunc`).

    Already written (leave it as it is): it calls your two functions.
    """

    @staticmethod
    def forward(ctx, q, k, v, cp_group):
        out, lse = zigzag_ring_attention_forward(q, k, v, cp_group=cp_group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp_group = cp_group
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = zigzag_ring_attention_backward(q, k, v, out, lse, dout, cp_group=ctx.cp_group)
        return dq, dk, dv, None


def zigzag_ring_attention(q, k, v, *, cp_group):
    """Causal attention over the whole sequence from zigzag shards `[b, s/w, n, d]`; returns `(out, lse)`."""
    _group_size_rank(cp_group, "zigzag_ring_attention")
    _check_qkv(q, k, v, "zigzag_ring_attention")
    if q.shape[1] % 2 != 0:
        raise ValueError(f"zigzag_ring_attention: the local sequence length ({q.shape[1]}) must be even "
                         f"(two chunks of s/2w each)")
    return _ZigzagRingAttention.apply(q, k, v, cp_group)
