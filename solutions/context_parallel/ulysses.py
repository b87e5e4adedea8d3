"""Reference solution, assignment 04 (part 3): Ulysses, context parallelism by all-to-all.

Each rank holds a sequence shard `[b, s/w, n, d]` of q, k, v. One all-to-all
per tensor trades the sequence split for a head split, `[b, s, n/w, d]`;
attention runs locally on whole sequences for n/w heads; one all-to-all of
the output trades back (DeepSpeed `deepspeed/sequence/layer.py`:
`DistributedAttention`, `_SeqAllToAll`, `single_all_to_all`). Backward: the
inverse all-to-all of each (scatter and gather dims swapped).

Tested by:  .venv/bin/python -m pytest -q tests/test_context_parallel_solutions.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from solutions.context_parallel.ring import _check_divisible, _check_qkv, _group_size_rank, attention_with_lse

__all__ = ["seq_all_to_all", "ulysses_attention"]


# ---------------------------------------------------------------------------
# Exercise 6: the all-to-all and Ulysses attention
# ---------------------------------------------------------------------------

def _all_to_all(x, group, scatter_dim: int, gather_dim: int):
    """Split `x` into w pieces along scatter_dim, piece j to rank j; concatenate the received along gather_dim."""
    ### BEGIN SOLUTION
    size = group.size()
    if size == 1:
        return x
    pieces = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()  # [w, ..., x.shape[scatter]/w, ...]
    received = torch.empty_like(pieces)
    dist.all_to_all_single(received, pieces, group=group)  # received[j]: rank j's piece for me
    return torch.cat(received.unbind(0), dim=gather_dim)  # w pieces side by side along gather_dim
    ### END SOLUTION


class _SeqAllToAll(torch.autograd.Function):
    """All-to-all (scatter_dim -> gather_dim) in forward, the inverse all-to-all in backward.

    DeepSpeed `deepspeed/sequence/layer.py` `_SeqAllToAll`.
    """

    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ### BEGIN SOLUTION
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        return _all_to_all(grad_output, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None
        ### END SOLUTION


def seq_all_to_all(x, *, cp_group, scatter_dim, gather_dim):
    """The Ulysses all-to-all: x.shape[scatter_dim] shrinks by w, x.shape[gather_dim] grows by w.

    E.g. `[b, s/w, n, d]` with scatter_dim=2, gather_dim=1 -> `[b, s, n/w, d]`.
    ValueError (before any communication) unless x.shape[scatter_dim] is
    divisible by the group size.
    """
    ### BEGIN SOLUTION
    size, _ = _group_size_rank(cp_group, "seq_all_to_all")
    if scatter_dim == gather_dim or not (-x.dim() <= scatter_dim < x.dim() and -x.dim() <= gather_dim < x.dim()):
        raise ValueError(f"seq_all_to_all: scatter_dim ({scatter_dim}) and gather_dim ({gather_dim}) must be "
                         f"two different dims of a {x.dim()}-D tensor")
    _check_divisible(x.shape[scatter_dim], size, f"seq_all_to_all: x.shape[{scatter_dim}] (the scattered dim)")
    return _SeqAllToAll.apply(x, cp_group, scatter_dim, gather_dim)
    ### END SOLUTION


def ulysses_attention(q, k, v, *, cp_group, causal):
    """Attention over the whole sequence from contiguous shards `[b, s/w, n, d]`; returns out `[b, s/w, n, d]`.

    q, k, v: sequence-sharded -> head-sharded `[b, s, n/w, d]` (one all-to-all
    each), `attention_with_lse` on the full sequence, out: head-sharded ->
    sequence-sharded (one all-to-all). 4 all-to-alls in forward, 4 in
    backward, none for a group of one. ValueError if n is not divisible by w.
    """
    ### BEGIN SOLUTION
    size, _ = _group_size_rank(cp_group, "ulysses_attention")
    _check_qkv(q, k, v, "ulysses_attention")
    _check_divisible(q.shape[2], size, "ulysses_attention: n_heads")
    qh, kh, vh = (seq_all_to_all(t, cp_group=cp_group, scatter_dim=2, gather_dim=1)  # [b, s/w, n, d] -> [b, s, n/w, d]
                  for t in (q, k, v))
    out, _ = attention_with_lse(qh, kh, vh, causal=causal)  # the whole sequence, n/w heads
    return seq_all_to_all(out, cp_group=cp_group, scatter_dim=1, gather_dim=2)  # [b, s, n/w, d] -> [b, s/w, n, d]
    ### END SOLUTION
