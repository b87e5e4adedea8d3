"""Reference solution, assignment 04 (part 1): attention with its LSE, the merge, ring attention.

Attention tensors are `[b, s, n, d]` (batch, sequence, heads, head_dim); the
log-sum-exp `lse` is `[b, s, n]` (the layout of q without head_dim). Under
context parallelism each rank of the CP group holds a contiguous sequence
shard `[b, s/w, n, d]` of q, k and v; K and V travel the ring by P2P
(`batch_isend_irecv`) while each rank computes the block it holds, and the
blocks are merged with their LSEs (zhuzilin/ring-flash-attention
`ring_flash_attn.py`: `ring_flash_attn_forward`, `ring_flash_attn_backward`;
`utils.py`: `update_out_and_lse`, `RingComm`). The zigzag layout:
solutions/context_parallel/zigzag.py; Ulysses: solutions/context_parallel/ulysses.py.

Tested by:  .venv/bin/python -m pytest -q tests/test_context_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["attention_with_lse", "merge_attention", "ring_all_gather", "ring_send_recv",
           "ring_attention_forward", "attention_block_backward", "ring_attention_backward", "ring_attention"]


# ---------------------------------------------------------------------------
# Given helpers (no exercise): argument checks
# ---------------------------------------------------------------------------

def _group_size_rank(group, what: str) -> tuple[int, int]:
    """(size, rank) of `group`; ValueError unless it is a torch.distributed.ProcessGroup."""
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"{what}: the group must be a torch.distributed.ProcessGroup "
                         f"(e.g. dist.group.WORLD or dist.new_group(...)), got {type(group).__name__}")
    return group.size(), group.rank()


def _check_divisible(size: int, divisor: int, what: str) -> None:
    """ValueError unless `size` is a multiple of `divisor` (both named in the message)."""
    if size % divisor != 0:
        raise ValueError(f"{what} ({size}) is not divisible by {divisor}")


def _check_qkv(q, k, v, what: str) -> None:
    """ValueError unless q, k, v are 4-D `[b, s, n, d]` tensors of one shape and dtype (self-attention)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{what}: {name} must be a 4-D tensor [b, s, n_heads, head_dim], got {got}")
    if not (q.shape == k.shape == v.shape) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{what}: q, k, v must have one shape and dtype; got q {tuple(q.shape)} {q.dtype}, "
                         f"k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16-bit inputs (flash-attention keeps out and lse in float32), else the input's dtype."""
    return torch.promote_types(dtype, torch.float32)


# ---------------------------------------------------------------------------
# Exercise 1: attention with its log-sum-exp, causal on global positions
# ---------------------------------------------------------------------------

def attention_with_lse(q, k, v, *, causal, q_offset=0, k_offset=0):
    """Softmax attention of q `[b, sq, n, d]` over k, v `[b, sk, n, d]`; returns `(out, lse)`.

    out `[b, sq, n, d]` (q's dtype) = softmax(q k^T / sqrt(d)) v; lse `[b, sq, n]`
    (float32, or float64 for float64 inputs) = log of the softmax's denominator.
    With `causal`, query i (global position `q_offset + i`) sees key j (global
    position `k_offset + j`) iff `k_offset + j <= q_offset + i`. A row with no
    visible key gets out = 0 and lse = -inf, and no NaN anywhere (gradients
    included). Explicit matmuls, so that FlopCounterMode can count them.
    """
    ### BEGIN SOLUTION
    acc = _accumulation_dtype(q.dtype)
    scale = q.shape[-1] ** -0.5
    scores = torch.einsum("bqnd,bknd->bnqk", q.to(acc), k.to(acc)) * scale  # [b, n, sq, sk]
    if causal:
        q_pos = q_offset + torch.arange(q.shape[1], device=q.device)
        k_pos = k_offset + torch.arange(k.shape[1], device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]  # [sq, sk], by global position
        scores = scores.masked_fill(~visible, float("-inf"))
    # Subtract the row max before exp (no overflow); a row with no visible key has max -inf: use 0.
    row_max = scores.amax(dim=-1, keepdim=True).detach()  # [b, n, sq, 1]
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    p = torch.exp(scores - row_max)  # masked entries: exp(-inf) = 0
    denom = p.sum(dim=-1, keepdim=True)  # [b, n, sq, 1]; 0 for a row with no visible key
    p = p / torch.where(denom == 0, torch.ones_like(denom), denom)
    out = torch.einsum("bnqk,bknd->bqnd", p, v.to(acc))  # [b, sq, n, d]
    lse = (row_max + torch.log(denom)).squeeze(-1).transpose(1, 2)  # [b, n, sq] -> [b, sq, n]; log 0 = -inf
    return out.to(q.dtype), lse
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Exercise 2: the ring attention step, merging two partial results by their LSEs
# ---------------------------------------------------------------------------

def merge_attention(out, lse, block_out, block_lse):
    """Merge two attentions of the same queries over disjoint key sets: `(out, lse)` of their union.

    out, block_out `[b, s, n, d]`; lse, block_lse `[b, s, n]`. With
    L = log(e^lse + e^block_lse): out' = e^(lse - L) out + e^(block_lse - L) block_out,
    computed with the max subtracted (no overflow for lse > 709 in float64) and
    without NaN when either side (or both) has lse = -inf (a fully masked row).
    Result in float32 at least (ring-flash-attention `utils.update_out_and_lse`).
    """
    ### BEGIN SOLUTION
    acc = torch.promote_types(_accumulation_dtype(out.dtype), block_out.dtype)
    lse, block_lse = lse.to(acc), block_lse.to(acc)
    m = torch.maximum(lse, block_lse)  # [b, s, n]
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both sides fully masked: any finite shift
    w_old, w_new = torch.exp(lse - m), torch.exp(block_lse - m)  # in [0, 1]
    total = w_old + w_new  # 0 only if both rows are fully masked
    new_lse = m + torch.log(total)  # -inf if both are
    total = torch.where(total == 0, torch.ones_like(total), total)
    new_out = (w_old / total).unsqueeze(-1) * out.to(acc) + (w_new / total).unsqueeze(-1) * block_out.to(acc)
    return new_out, new_lse
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Worked example: a ring all-gather by P2P, the skeleton of ring attention
# ---------------------------------------------------------------------------

def ring_all_gather(x, *, cp_group):
    """Every rank's block of dim 1, in rank order, gathered by passing blocks around the ring.

    Step i: post (send my current block to the next rank, receive the previous
    rank's into a fresh buffer) in one `batch_isend_irecv`, use the block I
    hold (here: store it), wait, swap. After w - 1 steps every rank has held
    every block. The block held at step i came from rank (rank - i) mod w.
    Peers are group ranks (`group_peer=`), never global ranks.
    """
    size, rank = _group_size_rank(cp_group, "ring_all_gather")
    blocks = [None] * size
    current = x.contiguous()
    for step in range(size):
        if step + 1 < size:  # post the next transfer first: it runs while we use `current`
            incoming = torch.empty_like(current)
            works = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, current, group=cp_group, group_peer=(rank + 1) % size),
                dist.P2POp(dist.irecv, incoming, group=cp_group, group_peer=(rank - 1) % size),
            ])
        blocks[(rank - step) % size] = current  # "compute" with the block we hold
        if step + 1 < size:
            for work in works:
                work.wait()
            current = incoming
    return torch.cat(blocks, dim=1)  # w x [b, s/w, ...] -> [b, s, ...]


# ---------------------------------------------------------------------------
# Exercise 3: ring attention, forward
# ---------------------------------------------------------------------------

def ring_send_recv(tensors, *, cp_group):
    """Post one ring transfer: send each tensor to the next rank, receive one of each from the previous.

    Returns `(works, received)`: the work handles of one `batch_isend_irecv`
    (the caller waits on every one of them) and fresh tensors shaped like
    `tensors`, filled once the works complete (ring-flash-attention
    `RingComm.send_recv`). Never called for a group of one.
    """
    ### BEGIN SOLUTION
    size, rank = cp_group.size(), cp_group.rank()
    send_to, recv_from = (rank + 1) % size, (rank - 1) % size
    received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]  # contiguous buffers
    ops = []
    for t, r in zip(tensors, received):
        ops.append(dist.P2POp(dist.isend, t.contiguous(), group=cp_group, group_peer=send_to))
        ops.append(dist.P2POp(dist.irecv, r, group=cp_group, group_peer=recv_from))
    return dist.batch_isend_irecv(ops), received
    ### END SOLUTION


def ring_attention_forward(q, k, v, *, cp_group, causal):
    """Ring attention forward on contiguous shards `[b, s/w, n, d]`; returns `(out, lse)`.

    Rank r holds the sequence positions `[r s/w, (r + 1) s/w)`. At step i it
    holds the K/V block of rank (r - i) mod w: it posts the transfer of that
    block to the next rank BEFORE computing with it, merges the block's
    result into its running (out, lse), then waits and swaps. Under `causal`,
    a block whose keys all follow the rank's queries is skipped. Forward
    sends: 2(w - 1) (K and V separately); none for a group of one.
    """
    ### BEGIN SOLUTION
    size, rank = cp_group.size(), cp_group.rank()
    b, s_local, n, d = q.shape
    acc = _accumulation_dtype(q.dtype)
    out = torch.zeros(b, s_local, n, d, dtype=acc, device=q.device)
    lse = torch.full((b, s_local, n), float("-inf"), dtype=acc, device=q.device)
    k, v = k.contiguous(), v.contiguous()
    for step in range(size):
        if step + 1 < size:  # the next block travels while this one is computed
            works, (next_k, next_v) = ring_send_recv([k, v], cp_group=cp_group)
        src = (rank - step) % size  # whose K/V block we hold now
        if not causal or src <= rank:  # src > rank: every key follows every query, fully masked
            block_out, block_lse = attention_with_lse(q, k, v, causal=causal, q_offset=rank * s_local,
                                                      k_offset=src * s_local)
            out, lse = merge_attention(out, lse, block_out, block_lse)
        if step + 1 < size:
            for work in works:
                work.wait()
            k, v = next_k, next_v
    return out.to(q.dtype), lse
    ### END SOLUTION


# ---------------------------------------------------------------------------
# Given: the autograd Function that ties forward and backward together
# ---------------------------------------------------------------------------

class _RingAttention(torch.autograd.Function):
    """Ring attention: K/V around the ring in forward; K/V again, and dK/dV home, in backward.

    Already written (leave it as it is): it calls your two functions.
    ring-flash-attention `ring_flash_attn.RingFlashAttnFunc`. The backward needs
    the final `out` and `lse` of forward, so they are saved; `lse` is returned
    for inspection and is not differentiable.
    """

    @staticmethod
    def forward(ctx, q, k, v, cp_group, causal):
        out, lse = ring_attention_forward(q, k, v, cp_group=cp_group, causal=causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp_group, ctx.causal = cp_group, causal
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_attention_backward(q, k, v, out, lse, dout, cp_group=ctx.cp_group, causal=ctx.causal)
        return dq, dk, dv, None, None


def ring_attention(q, k, v, *, cp_group, causal):
    """Attention over the whole sequence from contiguous shards `[b, s/w, n, d]`; returns `(out, lse)`."""
    _group_size_rank(cp_group, "ring_attention")
    _check_qkv(q, k, v, "ring_attention")
    return _RingAttention.apply(q, k, v, cp_group, causal)


# ---------------------------------------------------------------------------
# Exercise 4: ring attention, backward
# ---------------------------------------------------------------------------

def attention_block_backward(q, k, v, out, dout, lse, *, causal, q_offset=0, k_offset=0):
    """The gradients of one block of attention, from the FINAL out and lse; returns `(dq, dk, dv)`.

    q, out, dout `[b, sq, n, d]` and lse `[b, sq, n]` are the queries' final
    results over ALL keys; k, v `[b, sk, n, d]` one block of keys. With
    P = exp(q k^T / sqrt(d) - lse) (this block's columns of the full softmax),
    D = rowsum(dout * out): dv = P^T dout, dS = P * (dout v^T - D),
    dq = dS k / sqrt(d) (this block's share), dk = dS^T q / sqrt(d).
    The FlashAttention-2 backward (Dao 2023, Algorithm 2); masked as in
    `attention_with_lse`. Results in float32 at least.
    """
    ### BEGIN SOLUTION
    acc = _accumulation_dtype(q.dtype)
    q, k, v, out, dout = (t.to(acc) for t in (q, k, v, out, dout))
    scale = q.shape[-1] ** -0.5
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) * scale  # [b, n, sq, sk]
    p = torch.exp(scores - lse.to(acc).transpose(1, 2).unsqueeze(-1))  # the full softmax's columns of this block
    if causal:
        q_pos = q_offset + torch.arange(q.shape[1], device=q.device)
        k_pos = k_offset + torch.arange(k.shape[1], device=q.device)
        p = p.masked_fill(~(k_pos[None, :] <= q_pos[:, None]), 0.0)  # also clears NaN of rows with lse = -inf
    dv = torch.einsum("bnqk,bqnd->bknd", p, dout)  # [b, sk, n, d]
    dp = torch.einsum("bqnd,bknd->bnqk", dout, v)  # [b, n, sq, sk]
    delta = (dout * out).sum(dim=-1).transpose(1, 2).unsqueeze(-1)  # [b, n, sq, 1]
    ds = p * (dp - delta)
    dq = torch.einsum("bnqk,bknd->bqnd", ds, k) * scale  # [b, sq, n, d]
    dk = torch.einsum("bnqk,bqnd->bknd", ds, q) * scale  # [b, sk, n, d]
    return dq, dk, dv
    ### END SOLUTION


def ring_attention_backward(q, k, v, out, lse, dout, *, cp_group, causal):
    """Ring attention backward; returns `(dq, dk, dv)` of this rank's shards.

    K/V travel the ring again (posted before each block's backward); the dK/dV
    accumulator of each block travels with it: at step i the rank adds its
    share to the accumulator of the block it holds and passes it on, and after
    w sends (one full turn) every accumulator is back with the block's owner
    (ring-flash-attention `ring_flash_attn_backward`). Every block uses the
    final `out` and `lse`. Sends: 2(w - 1) for K/V plus 2w for dK/dV.
    """
    ### BEGIN SOLUTION
    size, rank = cp_group.size(), cp_group.rank()
    s_local = q.shape[1]
    acc = _accumulation_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    k, v = k.contiguous(), v.contiguous()
    for step in range(size):
        if step + 1 < size:
            kv_works, (next_k, next_v) = ring_send_recv([k, v], cp_group=cp_group)
        src = (rank - step) % size
        if not causal or src <= rank:
            block_dq, block_dk, block_dv = attention_block_backward(
                q, k, v, out, dout, lse, causal=causal, q_offset=rank * s_local, k_offset=src * s_local)
            dq = dq + block_dq
        else:  # fully masked: this rank adds nothing to the block's gradients
            block_dk = torch.zeros(k.shape, dtype=acc, device=k.device)
            block_dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        if step == 0:
            dk, dv = block_dk, block_dv  # the accumulator of my own block starts here
        else:  # the accumulator of the block I hold arrived from the previous rank
            for work in dkv_works:
                work.wait()
            dk, dv = next_dk + block_dk, next_dv + block_dv
        if step + 1 < size:
            for work in kv_works:
                work.wait()
            k, v = next_k, next_v
        if size > 1:  # pass the accumulator on with its block; after w sends it is home
            dkv_works, (next_dk, next_dv) = ring_send_recv([dk, dv], cp_group=cp_group)
    if size > 1:
        for work in dkv_works:
            work.wait()
        dk, dv = next_dk, next_dv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    ### END SOLUTION
