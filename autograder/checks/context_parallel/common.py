"""The single-process reference of assignment 04 (context parallelism) and what its checks share.

`reference_attention` (explicit softmax attention in float64, with its LSE) and its gradients, the two
layouts of a sequence over the ranks (`contiguous_shard`, `zigzag_shard`), and `_on_a_rank`: the student's
code of a single-device exercise runs in one rank process too, never in the grading process.
"""

from __future__ import annotations

import math

import torch

from autograder.runtime.compare import CheckFailure, dtype_name, fmt_shape
from autograder.runtime.dist import run_distributed

__all__ = ["reference_attention", "reference_attention_grads", "contiguous_shard", "zigzag_shard"]


_TIMEOUT = 20.0


# ---------------------------------------------------------------------------
# The single-process reference and the layouts
# ---------------------------------------------------------------------------

def _visible(sq: int, sk: int, causal: bool, q_offset: int, k_offset: int) -> torch.Tensor:
    """[sq, sk] bool: query i (position q_offset + i) sees key j (position k_offset + j)."""
    if not causal:
        return torch.ones(sq, sk, dtype=torch.bool)
    return (k_offset + torch.arange(sk))[None, :] <= (q_offset + torch.arange(sq))[:, None]


def reference_attention(q, k, v, *, causal, q_offset=0, k_offset=0):
    """Softmax attention in float64, `(out [b, sq, n, d], lse [b, sq, n])`; a row with no key: 0 and -inf."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
    visible = _visible(q.shape[1], k.shape[1], causal, q_offset, k_offset)
    has_key = visible.any(dim=-1)[:, None]  # [sq, 1]
    scores = torch.where(visible, scores, torch.full_like(scores, -math.inf))
    lse = torch.logsumexp(scores, dim=-1)  # [b, n, sq]; -inf where no key
    probs = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key
    out = torch.einsum("bnqk,bknd->bqnd", probs, v)
    return out, lse.transpose(1, 2)


def reference_attention_grads(q, k, v, dout, *, causal, q_offset=0, k_offset=0):
    """(dq, dk, dv) of <reference_attention(q, k, v).out, dout>, float64."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = reference_attention(q, k, v, causal=causal, q_offset=q_offset, k_offset=k_offset)
    out.backward(dout.double())
    return q.grad, k.grad, v.grad


def contiguous_shard(x: torch.Tensor, rank: int, size: int, dim: int = 1) -> torch.Tensor:
    """Positions `[rank s/w, (rank + 1) s/w)` of dim `dim`."""
    return x.chunk(size, dim=dim)[rank].contiguous()


def zigzag_shard(x: torch.Tensor, rank: int, size: int, dim: int = 1) -> torch.Tensor:
    """Chunks `rank` and `2 size - 1 - rank` of 2 size along `dim`, in that order."""
    chunks = x.chunk(2 * size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=dim).contiguous()


def _shard(layout: str):
    return zigzag_shard if layout == "zigzag" else contiguous_shard


def _positions(layout: str, rank: int, size: int, seq: int) -> list[int]:
    """The global positions a rank holds, in its local order."""
    return _shard(layout)(torch.arange(seq)[None], rank, size, dim=1)[0].tolist()


def _randn(gen, *shape, dtype=torch.float64, scale=1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)


def _qkv(gen, b, s, n, d, dtype, logit_scale):
    """q, k, v, dout `[b, s, n, d]`; q and k scaled by sqrt(logit_scale): scores grow by logit_scale."""
    a = math.sqrt(logit_scale)
    return (_randn(gen, b, s, n, d, dtype=dtype, scale=a), _randn(gen, b, s, n, d, dtype=dtype, scale=a),
            _randn(gen, b, s, n, d, dtype=dtype), _randn(gen, b, s, n, d, dtype=dtype))


def _cpu(t):
    return t.detach().cpu() if isinstance(t, torch.Tensor) else t


def _acc_dtypes(dtype) -> set:
    return {dtype_name(dtype), dtype_name(torch.promote_types(dtype, torch.float32))}


def _first_nan(name: str, t, what: str) -> None:
    if isinstance(t, torch.Tensor) and t.is_floating_point() and bool(torch.isnan(t).any()):
        idx = tuple(int(i) for i in torch.isnan(t).nonzero()[0])
        raise CheckFailure(f"{what}: {name} has NaN (first at index {idx}). NaN comes from exp overflowing "
                           f"(inf / inf: subtract the max before exp) or from a row that sees no key "
                           f"(exp(-inf - (-inf)), 0 / 0: such a row must give out = 0 and lse = -inf).")


def _lse_shape_hint(lse, expected_shape) -> str:
    if isinstance(lse, torch.Tensor) and lse.dim() == 3 and tuple(lse.shape) == (
            expected_shape[0], expected_shape[2], expected_shape[1]):
        return (" It looks transposed: lse is [b, s, n_heads] in this course (the layout of q without "
                "head_dim); flash-attn and SDPA use [b, n_heads, s].")
    return ""


def _check_pair(res, what: str, out_shape, lse_shape, *, rank=None):
    """A function's `(out, lse)` return value: a pair of tensors of the right shapes."""
    where = f"rank {rank}: " if rank is not None else ""
    if not isinstance(res, (tuple, list)) or len(res) != 2 or not all(isinstance(t, torch.Tensor) for t in res):
        got = type(res).__name__ if not isinstance(res, (tuple, list)) else f"{type(res).__name__} of {len(res)}"
        raise CheckFailure(f"{where}{what} returned {got}; expected a pair (out, lse) of tensors")
    out, lse = res
    if tuple(out.shape) != tuple(out_shape):
        raise CheckFailure(f"{where}{what}: out has shape {fmt_shape(out.shape)}, expected {fmt_shape(out_shape)}")
    if tuple(lse.shape) != tuple(lse_shape):
        raise CheckFailure(f"{where}{what}: lse has shape {fmt_shape(lse.shape)}, expected "
                           f"{fmt_shape(lse_shape)} [b, s, n_heads].{_lse_shape_hint(lse, out_shape)}")
    return out, lse


# ---------------------------------------------------------------------------
# The student's code runs in a rank, also for the single-device exercises
# ---------------------------------------------------------------------------

def _job_rank(rank, world_size, job, args):
    try:
        return {"value": job(*args)}
    except CheckFailure as exc:  # a verdict reached next to the student's code: sent back as data
        return {"failure": str(exc)}


def _on_a_rank(job, *args, timeout: float = _TIMEOUT):
    """`job(*args)` (which calls the student's function) in one rank process; its data back, or its verdict.

    Single-device exercises run this way too, never in the grading process: a
    grader that keeps student code out of its own process (autograder.grading.trusted)
    runs them like every other rank program, and autograd and exceptions stay
    next to the student's code, where they happen.
    """
    res = run_distributed(_job_rank, 1, args=(job, args), timeout=timeout)[0]
    if "failure" in res:
        raise CheckFailure(res["failure"])
    return res["value"]
