"""Public checks of assignment 04, exercises 1, 2 and 4's block backward: attention on one device.

    from autograder.checks.context_parallel import check_attention_with_lse, check_merge_attention
    check_attention_with_lse(attention_with_lse, causal=True, q_offset=4, k_offset=0)
    check_merge_attention(merge_attention)

Attention with its log-sum-exp, the merge of two partial results (the step of ring attention, with large
logits and fully masked rows), and the backward of one attention block: each against the float64
reference of common.py, the student's code run in one rank process.
"""

from __future__ import annotations

import itertools
import math

import torch

from autograder.runtime.compare import CheckFailure, assert_close, dtype_name, fmt_shape, tolerance

from .common import (
    _check_pair, _cpu, _first_nan, _on_a_rank, _qkv, _randn, _visible, reference_attention, reference_attention_grads,
)

__all__ = [
    "check_attention_with_lse", "check_merge_attention", "check_merge_large_logits", "check_merge_fully_masked",
    "check_attention_block_backward",
]


# ---------------------------------------------------------------------------
# Exercise 1: attention with its LSE
# ---------------------------------------------------------------------------

def check_attention_with_lse(attention_with_lse, *, causal: bool, q_offset: int = 0, k_offset: int = 0,
                             batch: int = 2, seq_q: int = 5, seq_k: int = 6, n_heads: int = 3, head_dim: int = 4,
                             dtype=torch.float64, seed: int = 0, logit_scale: float = 1.0,
                             expect_masked_rows: bool = False) -> None:
    """attention_with_lse against the float64 reference: out, lse, and the gradients of out.

    q `[b, seq_q, n, d]`, k and v `[b, seq_k, n, d]`; with `causal`, query i
    sits at global position q_offset + i and key j at k_offset + j. Checked:
    out (q's dtype), lse `[b, seq_q, n]` (-inf exactly for rows without a
    visible key), dq, dk, dv of `out.backward(dout)`, and no NaN anywhere.
    With `expect_masked_rows` the parameters must leave some query without a
    visible key (the check says so if they do not).
    """
    visible = _visible(seq_q, seq_k, causal, q_offset, k_offset)
    masked_rows = [i for i in range(seq_q) if not bool(visible[i].any())]
    if expect_masked_rows and not masked_rows:
        raise ValueError("check parameters: no query is fully masked; choose k_offset > q_offset")
    gen = torch.Generator().manual_seed(seed)
    a = math.sqrt(logit_scale)
    q = _randn(gen, batch, seq_q, n_heads, head_dim, dtype=dtype, scale=a)
    k = _randn(gen, batch, seq_k, n_heads, head_dim, dtype=dtype, scale=a)
    v = _randn(gen, batch, seq_k, n_heads, head_dim, dtype=dtype)
    dout = _randn(gen, batch, seq_q, n_heads, head_dim, dtype=dtype)
    what = (f"attention_with_lse(q {fmt_shape(q.shape)}, k/v {fmt_shape(k.shape)}, causal={causal}, "
            f"q_offset={q_offset}, k_offset={k_offset}), {dtype_name(dtype)}")
    if masked_rows:
        what += f" (queries {masked_rows} see no key)"
    res = _on_a_rank(_attention_job, attention_with_lse, q, k, v, dout, causal, q_offset, k_offset, what)
    out, lse = res["out"], res["lse"]
    _first_nan("out", out, what)
    _first_nan("lse", lse, what)
    ref_out, ref_lse = reference_attention(q, k, v, causal=causal, q_offset=q_offset, k_offset=k_offset)
    dq, dk, dv = reference_attention_grads(q, k, v, dout, causal=causal, q_offset=q_offset, k_offset=k_offset)
    assert_close(out, ref_out.to(dtype), name=f"{what}: out")
    rtol, atol = tolerance(dtype)
    assert_close(lse, ref_lse, name=f"{what}: lse", check_dtype=False, rtol=rtol, atol=atol)
    for name in ("q.grad", "k.grad", "v.grad"):
        _first_nan(name, res[name], what)
    assert_close(res["q.grad"], dq.to(dtype), name=f"{what}: q.grad")
    assert_close(res["k.grad"], dk.to(dtype), name=f"{what}: k.grad")
    assert_close(res["v.grad"], dv.to(dtype), name=f"{what}: v.grad")


def _attention_job(fn, q, k, v, dout, causal, q_offset, k_offset, what):
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = _check_pair(fn(qs, ks, vs, causal=causal, q_offset=q_offset, k_offset=k_offset),
                           what, q.shape, q.shape[:3])
    if not out.requires_grad:
        raise CheckFailure(f"{what}: out does not require grad (the autograd graph was cut: detach(), .data "
                           f"or torch.no_grad()?); Ulysses back-propagates through it")
    if not (torch.isnan(out).any() or torch.isnan(lse).any()):  # NaN is reported (in the parent) as such
        out.backward(dout)
    return {"out": _cpu(out), "lse": _cpu(lse), "q.grad": _cpu(qs.grad), "k.grad": _cpu(ks.grad),
            "v.grad": _cpu(vs.grad)}


# ---------------------------------------------------------------------------
# Exercise 2: the merge (the ring attention step)
# ---------------------------------------------------------------------------

def _blocks(q, k, v, bounds, causal):
    """Reference (out, lse) of q against each key block `k[:, a:b]` (global key positions a..b-1)."""
    return [reference_attention(q, k[:, a:b], v[:, a:b], causal=causal, q_offset=0, k_offset=a)
            for a, b in zip(bounds[:-1], bounds[1:])]


def _merge_job(merge_attention, parts, orders, whats, start):
    """Fold `parts` in each order with the student's merge (from `start`, or the first block); the results."""
    results = []
    for order, what in zip(orders, whats):
        acc = start if start is not None else parts[order[0]]
        for i in (order if start is not None else order[1:]):
            res = merge_attention(acc[0], acc[1], parts[i][0], parts[i][1])
            acc = _check_pair(res, f"{what}: merge_attention", parts[i][0].shape, parts[i][1].shape)
        results.append((_cpu(acc[0]), _cpu(acc[1])))
    return results


def _merge_all(merge_attention, parts, orders, whats, start=None):
    """The student's merge folded over every order, in one rank."""
    return _on_a_rank(_merge_job, merge_attention, parts, [list(o) for o in orders], whats, start)


def _compare_merged(merged, ref_out, ref_lse, what, dtype):
    out, lse = merged
    _first_nan("out", out, what)
    _first_nan("lse", lse, what)
    rtol, atol = tolerance(dtype)
    assert_close(out, ref_out, name=f"{what}: out", check_dtype=False, rtol=rtol, atol=atol)
    assert_close(lse, ref_lse, name=f"{what}: lse", check_dtype=False, rtol=rtol, atol=atol)


def check_merge_attention(merge_attention, *, batch: int = 2, seq_q: int = 4, bounds=(0, 3, 5, 9),
                          n_heads: int = 3, head_dim: int = 4, causal: bool = False, dtype=torch.float64,
                          seed: int = 0) -> None:
    """Merging the attentions over key blocks, in EVERY order, gives attention over all keys.

    Keys `[bounds[0], bounds[-1])` are cut at `bounds`; each block's (out, lse)
    comes from the reference; the student's merge folds them in every
    permutation (order independence; with 3 blocks also associativity).
    """
    gen = torch.Generator().manual_seed(seed)
    seq_k = bounds[-1]
    q = _randn(gen, batch, seq_q, n_heads, head_dim, dtype=dtype)
    k = _randn(gen, batch, seq_k, n_heads, head_dim, dtype=dtype)
    v = _randn(gen, batch, seq_k, n_heads, head_dim, dtype=dtype)
    parts = [(o.to(dtype), l.to(torch.promote_types(dtype, torch.float32)))
             for o, l in _blocks(q, k, v, list(bounds), causal)]
    ref_out, ref_lse = reference_attention(q, k, v, causal=causal)
    orders = list(itertools.permutations(range(len(parts))))
    whats = [f"merge_attention over key blocks {list(zip(bounds[:-1], bounds[1:]))} merged in the order "
             f"{list(order)}, q {fmt_shape(q.shape)}, {dtype_name(dtype)}" for order in orders]
    for merged, what in zip(_merge_all(merge_attention, parts, orders, whats), whats):
        _compare_merged(merged, ref_out, ref_lse, what, dtype)


def check_merge_large_logits(merge_attention, *, batch: int = 2, seq_q: int = 4, seq_k: int = 8,
                             n_heads: int = 3, head_dim: int = 4, logit_scale: float = 900.0,
                             seed: int = 0) -> None:
    """float64 logits so large that lse exceeds 709 (e^709 is the largest float64 exponential).

    Block results from the reference; the merged out and lse must equal
    attention over all keys: a merge that exponentiates lse without
    subtracting the max overflows to inf and returns NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    q, k, v, _ = _qkv(gen, batch, seq_k, n_heads, head_dim, torch.float64, logit_scale)
    q = q[:, :seq_q]
    ref_out, ref_lse = reference_attention(q, k, v, causal=False)
    if not float(ref_lse.max()) > 709:
        raise ValueError(f"check parameters: the largest lse is {float(ref_lse.max()):.0f}; raise logit_scale")
    half = seq_k // 2
    parts = _blocks(q, k, v, [0, half, seq_k], False)
    orders = [(0, 1), (1, 0)]
    whats = [f"merge_attention of two key blocks, float64 logits with lse up to {float(ref_lse.max()):.0f} "
             f"(> 709: exp(lse) overflows), merged in the order {list(order)}" for order in orders]
    for merged, what in zip(_merge_all(merge_attention, parts, orders, whats), whats):
        _compare_merged(merged, ref_out, ref_lse, what, torch.float64)


def check_merge_fully_masked(merge_attention, *, batch: int = 2, seq_q: int = 6, n_heads: int = 3,
                             head_dim: int = 4, dtype=torch.float64, seed: int = 0) -> None:
    """Merging with fully masked rows (lse = -inf, out = 0), into them, and starting from the empty state.

    Causal attention of queries at positions 0..5 over the key blocks
    [0, 3), [3, 6), [6, 9): the later blocks mask whole rows (and [6, 9) every
    row). Folded from the empty state (out = 0, lse = -inf: nothing seen yet)
    in every order, the result must be causal attention over all keys, with
    no NaN: e^(-inf - (-inf)) is NaN, so the max of two -inf must be replaced.
    """
    gen = torch.Generator().manual_seed(seed)
    bounds = [0, 3, 6, 9]
    q = _randn(gen, batch, seq_q, n_heads, head_dim, dtype=dtype)
    k = _randn(gen, batch, bounds[-1], n_heads, head_dim, dtype=dtype)
    v = _randn(gen, batch, bounds[-1], n_heads, head_dim, dtype=dtype)
    acc = torch.promote_types(dtype, torch.float32)
    parts = [(o.to(dtype), l.to(acc)) for o, l in _blocks(q, k, v, bounds, True)]
    ref_out, ref_lse = reference_attention(q, k, v, causal=True)
    empty = (torch.zeros(batch, seq_q, n_heads, head_dim, dtype=acc),
             torch.full((batch, seq_q, n_heads), float("-inf"), dtype=acc))
    orders = list(itertools.permutations(range(len(parts))))
    whats = [f"merge_attention of causal key blocks [0, 3), [3, 6), [6, 9) for queries at positions 0..5 "
             f"(rows with no visible key: lse = -inf), starting from the empty state (out 0, lse -inf), "
             f"merged in the order {list(order)}" for order in orders]
    # and two fully masked blocks merged together: still out = 0, lse = -inf
    both = "merge_attention of two blocks whose every row is fully masked"
    merged = _merge_all(merge_attention, parts + [parts[2]], orders + [(2, 3)], whats + [both])
    for res, what in zip(merged[:-1], whats):
        _compare_merged(res, ref_out, ref_lse, what, dtype)
    _compare_merged(merged[-1], torch.zeros_like(ref_out), torch.full_like(ref_lse, float("-inf")), both, dtype)


# ---------------------------------------------------------------------------
# Exercise 4: the block backward (single process)
# ---------------------------------------------------------------------------

def check_attention_block_backward(attention_block_backward, *, causal: bool = True, batch: int = 2, seq: int = 8,
                                   bounds=(0, 3, 8), n_heads: int = 3, head_dim: int = 4, dtype=torch.float64,
                                   seed: int = 0) -> None:
    """Each key block's (dq, dk, dv) from the FINAL out and lse: the dk, dv blocks are slices of the full
    gradients, and the blocks' dq add up to the full dq.

    Queries and keys share positions 0..seq-1; keys are cut at `bounds`; the
    full out, lse and gradients come from the reference.
    """
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = _qkv(gen, batch, seq, n_heads, head_dim, dtype, 1.0)
    out, lse = reference_attention(q, k, v, causal=causal)
    dq, dk, dv = reference_attention_grads(q, k, v, dout, causal=causal)
    total = torch.zeros_like(dq)
    pairs = list(zip(bounds[:-1], bounds[1:]))
    whats = [f"attention_block_backward(q {fmt_shape(q.shape)}, keys {a}..{b - 1}, causal={causal}, q_offset=0, "
             f"k_offset={a}) with the final out and lse, {dtype_name(dtype)}" for a, b in pairs]
    blocks = _on_a_rank(_block_backward_job, attention_block_backward, q, k, v, out.to(dtype), dout, lse, causal,
                        pairs, whats)
    for (a, b), what, (bdq, bdk, bdv) in zip(pairs, whats, blocks):
        for name, t in (("dq", bdq), ("dk", bdk), ("dv", bdv)):
            _first_nan(name, t, what)
        rtol, atol = tolerance(dtype)
        assert_close(bdk, dk[:, a:b], name=f"{what}: dk (keys {a}..{b - 1} of the full k.grad)", check_dtype=False,
                     rtol=rtol, atol=atol)
        assert_close(bdv, dv[:, a:b], name=f"{what}: dv (keys {a}..{b - 1} of the full v.grad)", check_dtype=False,
                     rtol=rtol, atol=atol)
        if tuple(bdq.shape) != tuple(q.shape):
            raise CheckFailure(f"{what}: dq has shape {fmt_shape(bdq.shape)}, expected {fmt_shape(q.shape)}")
        total = total + bdq.double()
    assert_close(total, dq, name=f"the sum of the blocks' dq over key blocks {list(bounds)} (the full q.grad)",
                 check_dtype=False, rtol=tolerance(dtype)[0], atol=tolerance(dtype)[1])


def _block_backward_job(fn, q, k, v, out, dout, lse, causal, pairs, whats):
    results = []
    for (a, b), what in zip(pairs, whats):
        res = fn(q, k[:, a:b], v[:, a:b], out, dout, lse, causal=causal, q_offset=0, k_offset=a)
        if not isinstance(res, (tuple, list)) or len(res) != 3 or not all(isinstance(t, torch.Tensor) for t in res):
            raise CheckFailure(f"{what} returned {type(res).__name__}; expected a tuple (dq, dk, dv) of tensors")
        results.append(tuple(_cpu(t) for t in res))
    return results
