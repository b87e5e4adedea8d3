"""Public checks of assignment 04 (context parallelism): what is graded, readably.

    import autograder.checks.context_parallel as checks
    checks.check_attention_with_lse(attention_with_lse, causal=True, q_offset=4, k_offset=0)
    checks.check_ring_attention(ring_attention, world_size=4, causal=True, timeout=5)

Attention tensors are `[b, s, n, d]` (batch, sequence, heads, head_dim) and
the log-sum-exp `lse` is `[b, s, n]`. The single-device exercises (attention,
merge, zigzag split, block backward) are checked in this process. The
distributed ones start ranks with `run_distributed`: every rank runs the
student's code on its shard (contiguous: positions `[r s/w, (r+1) s/w)`;
zigzag: chunks r and 2w-1-r of 2w) and sends back its outputs, gradients,
its communication ledger and, where the order of work matters, a trace of
its compute ops with their FLOPs. Verdicts are made here: element-wise
against a single-process float64 reference (`reference_attention`, explicit
softmax attention; tests/test_context_parallel_checks.py checks it against
`F.scaled_dot_product_attention`), and op by op against the expected
communication (spec 4.4). A check returns None on success and raises
`CheckFailure` (or `DistributedError` when a rank raised, crashed or hung).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from autograder.checks import expect_value_errors
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape, tolerance
from autograder.runtime.dist import DistributedError, rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm, format_trace

__all__ = [
    "reference_attention", "reference_attention_grads", "contiguous_shard", "zigzag_shard",
    "check_attention_with_lse", "check_merge_attention", "check_merge_large_logits",
    "check_merge_fully_masked", "check_ring_all_gather", "check_ring_attention", "check_ring_overlap",
    "check_attention_block_backward", "check_zigzag_split", "check_zigzag_ring_attention",
    "check_zigzag_balance", "check_seq_all_to_all", "check_ulysses_attention", "check_ulysses_errors",
    "measure_ring_layouts", "plot_ring_steps", "plot_ring_flops",
]

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
# The worked example: a ring all-gather by P2P
# ---------------------------------------------------------------------------

def _ring_gather_rank(rank, world_size, fn, xs, backend):
    dev = rank_device(rank, backend)
    with CommLedger() as ledger:
        out = fn(xs[rank].to(dev), cp_group=dist.group.WORLD)
    return {"out": _cpu(out), "records": ledger.records}


def check_ring_all_gather(ring_all_gather, *, world_size: int = 4, shape=(2, 3, 2), seed: int = 0,
                          backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """Every rank ends with all blocks of dim 1 in rank order; w - 1 sends to the next rank, w - 1 receives."""
    gen = torch.Generator().manual_seed(seed)
    xs = [_randn(gen, *shape) for _ in range(world_size)]
    results = run_distributed(_ring_gather_rank, world_size, args=(ring_all_gather, xs, backend),
                              timeout=timeout, backend=backend)
    full = torch.cat(xs, dim=1)
    for rank, res in enumerate(results):
        assert_close(res["out"], full, name="ring_all_gather: output", rank=rank)
        _expect_p2p(res["records"], rank=rank, phase="forward", size=world_size,
                    counts={"send": {world_size - 1}, "recv": {world_size - 1}}, shape=tuple(shape),
                    dtypes={"float64"}, context=f"ring_all_gather, world size {world_size}")


# ---------------------------------------------------------------------------
# Communication of the ring: P2P counts, peers, and the order of posts and compute
# ---------------------------------------------------------------------------

def _expect_p2p(records, *, rank: int, phase: str, size: int, counts: dict, shape, dtypes: set,
                context: str, group_rank: int | None = None) -> None:
    """Exactly `counts[op]` sends/recvs in `phase`, all of `shape` and a dtype in `dtypes`, sends to the next
    group rank and receives from the previous one; no collectives. `rank` is the global rank (messages),
    `group_rank` the rank in the CP group (peers; default: the same)."""
    mine = [r for r in records if r.phase == phase and r.op != "wait"]
    trace = format_trace(mine, rank)
    me = rank if group_rank is None else group_rank
    others = [r for r in mine if r.op not in ("send", "recv")]
    if others:
        raise CheckFailure(f"rank {rank} ({context}): unexpected collective(s) in {phase}: ring attention moves "
                           f"K/V (and dK/dV) by P2P only (batch_isend_irecv). Communication of rank {rank} in "
                           f"{phase}:\n{trace}")
    peers = {"send": (me + 1) % size, "recv": (me - 1) % size}
    for op in ("send", "recv"):
        got = [r for r in mine if r.op == op]
        want = " or ".join(str(c) for c in sorted(counts[op]))
        if len(got) not in counts[op]:
            raise CheckFailure(f"rank {rank} ({context}): expected {want} {op}(s) in {phase}, saw {len(got)}. "
                               f"Communication of rank {rank} in {phase}:\n{trace}")
        for r in got:
            if r.peer != peers[op]:
                direction = "to the next rank" if op == "send" else "from the previous rank"
                raise CheckFailure(
                    f"rank {rank} ({context}): a {op} with group rank {r.peer} in {phase}; blocks travel "
                    f"{direction}, group rank {peers[op]} = ({me} {'+' if op == 'send' else '-'} 1) mod {size}. "
                    f"(Peers are ranks of the CP group: group_peer=, not global ranks.)\n{trace}")
            if tuple(r.shape) != tuple(shape) or r.dtype not in dtypes:
                raise CheckFailure(
                    f"rank {rank} ({context}): a {op} of {fmt_shape(r.shape)} {r.dtype} in {phase}; expected "
                    f"blocks of {fmt_shape(shape)} {' or '.join(sorted(dtypes))} (K and V sent as separate "
                    f"tensors).\n{trace}")


class _FlopTrace(CommLedger):
    """CommLedger(trace_compute=True) that also notes each traced op's FLOPs (torch's own formulas)."""

    def __init__(self):
        super().__init__(trace_compute=True)
        self.flops: dict[int, int] = {}  # OpRecord.seq -> FLOPs (matmul-like ops only)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = len(self.ops)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None and len(self.ops) > before:
            try:
                self.flops[self.ops[-1].seq] = int(formula(*args, **(kwargs or {}), out_val=out))
            except Exception:  # noqa: BLE001 - an op torch cannot count: no FLOPs recorded
                pass
        return out


def _post_groups(records, phase: str, flops: dict | None = None) -> list[list]:
    """The ring transfers of `phase`: runs of send/recv records with no wait and no matmul (an op with FLOPs in
    `flops`) between them; other ops (allocating a receive buffer, a copy) may sit between the posts."""
    matmuls = sorted(seq for seq, f in (flops or {}).items() if f)
    groups, current = [], []
    for r in sorted((r for r in records if r.phase == phase), key=lambda r: r.seq):
        if r.op in ("send", "recv"):
            if current and any(current[-1].seq < m < r.seq for m in matmuls):
                groups.append(current)
                current = []
            current.append(r)
        elif r.op == "wait" and current:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def _steps(records, flops: dict, phase: str = "forward") -> list[int]:
    """FLOPs per ring step: a step ends at the first wait after each transfer is posted."""
    groups = _post_groups(records, phase, flops)
    waits = sorted(r.seq for r in records if r.op == "wait" and r.phase == phase)
    bounds = []
    for g in groups:
        after = [s for s in waits if s > g[-1].seq]
        bounds.append(after[0] if after else math.inf)
    per_step = [0] * (len(groups) + 1)
    for seq, f in flops.items():
        per_step[sum(1 for b in bounds if b < seq)] += f
    return per_step


def _timeline(records, ops, flops, phase="forward", limit=60) -> str:
    events = sorted([(r.seq, r.describe()) for r in records if r.phase == phase]
                    + [(o.seq, f"{o.name} -> {', '.join(fmt_shape(s) for s in o.out_shapes)}  ({flops[o.seq]} FLOPs)")
                       for o in ops if o.phase == phase and flops.get(o.seq)])
    lines = [f"    {seq:5d}  {text}" for seq, text in events]
    if len(lines) > limit:
        lines = lines[:limit] + [f"    ... ({len(lines) - limit} more)"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Exercises 3-5: ring attention (contiguous and zigzag), run on ranks
# ---------------------------------------------------------------------------

def _cp_groups(world_size: int, cp_size: int) -> list[list[int]]:
    """CP groups of a larger world, strided as in a DP x CP layout: [[0, 2], [1, 3]] for 4 ranks and cp 2."""
    if world_size % cp_size:
        raise ValueError(f"check parameters: world_size ({world_size}) must be a multiple of cp_size ({cp_size})")
    n = world_size // cp_size
    return [list(range(g, world_size, n)) for g in range(n)]


def _my_group(rank: int, world_size: int, cp_size: int):
    """(CP group of this rank, index of that group); every rank creates every group, in the same order."""
    layout = _cp_groups(world_size, cp_size)
    if len(layout) == 1:
        return dist.group.WORLD, 0
    groups = [dist.new_group(ranks) for ranks in layout]
    index = next(i for i, ranks in enumerate(layout) if rank in ranks)
    return groups[index], index


def _deadlock_hint(exc: DistributedError, what: str) -> DistributedError:
    """A hung ring (the runner's deadlock detection or its timeout) gets the usual cause and its fix first."""
    if "deadlock" not in exc.summary and "timed out" not in exc.summary:
        return exc
    hint = (f"{what}: the ranks did not finish. In a ring every receive needs a matching send: each rank sends "
            f"to (rank + 1) % w and receives from (rank - 1) % w (group ranks), posted together "
            f"(batch_isend_irecv) and waited after. A blocking dist.send, or a receive from the wrong side, "
            f"hangs at w >= 3 (at w = 2 both neighbours are the same rank).\n")
    return DistributedError(hint + exc.summary, exc.failures)


def _ring_rank(rank, world_size, fn, case, backend):
    dev = rank_device(rank, backend)
    group, index = _my_group(rank, world_size, case["cp_size"])
    r = group.rank()
    data = case["data"][index]
    q, k, v = (data[name][r].to(dev).clone().requires_grad_() for name in ("q", "k", "v"))
    what = case["what"]
    with _FlopTrace() as ledger:
        if case["layout"] == "zigzag":
            res = fn(q, k, v, cp_group=group)
        else:
            res = fn(q, k, v, cp_group=group, causal=case["causal"])
        out, lse = _check_pair(res, what, q.shape, q.shape[:3], rank=rank)
        if case["backward"]:
            if not out.requires_grad:
                raise CheckFailure(f"rank {rank}: {what} returned an out that does not require grad "
                                   f"(the autograd Function was bypassed?)")
            out.backward(data["dout"][r].to(dev))
    return {"out": _cpu(out), "lse": _cpu(lse), "dq": _cpu(q.grad), "dk": _cpu(k.grad), "dv": _cpu(v.grad),
            "records": ledger.records, "ops": ledger.ops, "flops": ledger.flops, "group_rank": r,
            "group_index": index}


def _ring_case(layout, *, world_size, cp_size, causal, batch, seq, n_heads, head_dim, dtype, seed,
               logit_scale, backward):
    cp_size = cp_size or world_size
    parts = 2 * cp_size if layout == "zigzag" else cp_size
    if seq % parts:
        raise ValueError(f"check parameters: seq ({seq}) must be divisible by {parts} for the {layout} layout")
    shard = _shard(layout)
    data, refs = [], []
    for g in range(world_size // cp_size):
        gen = torch.Generator().manual_seed(seed * 1000 + g)
        q, k, v, dout = _qkv(gen, batch, seq, n_heads, head_dim, dtype, logit_scale)
        data.append({name: [shard(t, r, cp_size) for r in range(cp_size)]
                     for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout))})
        out, lse = reference_attention(q, k, v, causal=causal)
        ref = {"out": out, "lse": lse}
        if backward:
            ref["dq"], ref["dk"], ref["dv"] = reference_attention_grads(q, k, v, dout, causal=causal)
        refs.append({name: [shard(t, r, cp_size) for r in range(cp_size)] for name, t in ref.items()})
    fn_name = "zigzag_ring_attention" if layout == "zigzag" else "ring_attention"
    mask = "" if layout == "zigzag" else f", causal={causal}"
    where = f", CP groups {_cp_groups(world_size, cp_size)} of a world of {world_size}" if cp_size < world_size else ""
    what = (f"{fn_name}(q, k, v{mask}) on {layout} shards, CP size {cp_size}{where}, [b, s, n, d] = "
            f"[{batch}, {seq}, {n_heads}, {head_dim}], {dtype_name(dtype)}"
            + (f", logits x{logit_scale:g}" if logit_scale != 1 else ""))
    case = {"layout": layout, "cp_size": cp_size, "causal": causal, "backward": backward, "data": data,
            "what": what}
    return case, refs


def _run_ring(fn, layout, *, world_size, cp_size, causal, batch, seq, n_heads, head_dim, dtype, seed,
              logit_scale, backward, backend, timeout):
    case, refs = _ring_case(layout, world_size=world_size, cp_size=cp_size, causal=causal, batch=batch, seq=seq,
                            n_heads=n_heads, head_dim=head_dim, dtype=dtype, seed=seed,
                            logit_scale=logit_scale, backward=backward)
    try:
        results = run_distributed(_ring_rank, world_size, args=(fn, case, backend), timeout=timeout,
                                  backend=backend)
    except DistributedError as exc:
        raise _deadlock_hint(exc, case["what"]) from None
    check_consistent([r["records"] for r in results], context=case["what"])
    return case, refs, results


def _check_ring_results(case, refs, results, *, dtype, batch, seq, n_heads, head_dim) -> None:
    """Numbers against the reference and P2P communication, reported together (communication first)."""
    findings = Findings()
    size = case["cp_size"]
    what = case["what"]
    block = (batch, seq // size, n_heads, head_dim)
    rtol, atol = tolerance(dtype)
    positions = {r: _positions(case["layout"], r, size, seq) for r in range(size)}
    for rank, res in enumerate(results):
        r, ref = res["group_rank"], refs[res["group_index"]]
        tag = f"{what}, group rank {r} (positions {_span(positions[r])})"
        with findings.communication():
            if size == 1:
                expect_no_comm(res["records"], rank=rank, context=f"{tag}; a group of one communicates nothing")
            else:
                _expect_p2p(res["records"], rank=rank, group_rank=r, phase="forward", size=size,
                            counts={"send": {2 * (size - 1)}, "recv": {2 * (size - 1)}}, shape=block,
                            dtypes={dtype_name(dtype)}, context=f"{tag}: forward sends K "
                            f"and V, 2(w - 1) = {2 * (size - 1)} sends")
                if case["backward"]:
                    kv, dkv_ring, dkv_te = 2 * (size - 1), 2 * size, 2 * (size - 1)
                    _expect_p2p(res["records"], rank=rank, group_rank=r, phase="backward", size=size,
                                counts={"send": {kv + dkv_ring, kv + dkv_te}, "recv": {kv + dkv_ring, kv + dkv_te}},
                                shape=block, dtypes=_acc_dtypes(dtype),
                                context=f"{tag}: backward sends K/V again, 2(w - 1) = {kv}, "
                                f"and the dK/dV accumulators home, 2w = {dkv_ring} (a full turn) or 2(w - 1) = "
                                f"{dkv_te}")
        # each tensor on its own: a wrong lse is named even when out is wrong too
        with findings.numbers():
            assert_close(res["out"], ref["out"][r].to(dtype), name=f"{tag}: out", rank=rank)
        with findings.numbers():
            assert_close(res["lse"], ref["lse"][r], name=f"{tag}: lse", rank=rank, check_dtype=False,
                         rtol=rtol, atol=atol)
        if case["backward"]:
            for name in ("dq", "dk", "dv"):
                with findings.numbers():
                    assert_close(res[name], ref[name][r].to(dtype), name=f"{tag}: {name[1]}.grad", rank=rank)
    findings.raise_if_any()
    if case["layout"] == "contiguous" and case["causal"] and size > 1:
        for phase in ("forward", "backward") if case["backward"] else ("forward",):
            _check_causal_work(case, results, phase)


def _phase_flops(res, phase: str) -> int:
    """The FLOPs a rank's traced matmuls did in `phase` (FlopCounterMode's formulas, per op)."""
    phase_of = {o.seq: o.phase for o in res["ops"]}
    return sum(f for seq, f in res["flops"].items() if phase_of.get(seq) == phase)


def _check_causal_work(case, results, phase: str) -> None:
    """Causal ring on contiguous shards: group rank r's queries see the keys of group ranks 0..r only, so it does
    at most (r + 1) / w of the last rank's work (the blocks of later ranks are fully masked: skipped). Measured
    from the traced matmuls; no exact counts (the diagonal block may be computed whole or only its visible part)."""
    size = case["cp_size"]
    for index in sorted({res["group_index"] for res in results}):
        group = {res["group_rank"]: (rank, _phase_flops(res, phase)) for rank, res in enumerate(results)
                 if res["group_index"] == index}
        last = group[size - 1][1]
        if last <= 0:
            continue  # no matmul was traced (SDPA counts 0): test_ring_overlap and the zigzag balance say so
        table = ", ".join(f"group rank {r}: {group[r][1]}" for r in range(size))
        for r in range(size - 1):
            rank, flops = group[r]
            if flops > (r + 1) / size * last * 1.01:
                raise CheckFailure(
                    f"rank {rank}: {case['what']}, group rank {r}: {flops} FLOPs in {phase}, more than "
                    f"(r + 1) / w = {r + 1}/{size} of the last group rank's {last}. With the causal mask the "
                    f"queries of group rank {r} see only the keys of group ranks 0..{r}: the K/V blocks of later "
                    f"ranks are fully masked, skip them instead of computing them (FlopCounterMode counts a "
                    f"masked block as full work). FLOPs per group rank in {phase}: {table}.")


def _span(pos: list[int]) -> str:
    """[0, 1, 2, 3, 12, 13, 14, 15] -> '0-3, 12-15'."""
    runs, start = [], pos[0]
    for a, b in zip(pos, pos[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ", ".join(runs)


def check_ring_attention(ring_attention, *, world_size: int = 2, causal: bool = True, cp_size: int | None = None,
                         batch: int = 2, seq: int = 8, n_heads: int = 3, head_dim: int = 4, dtype=torch.float64,
                         seed: int = 0, logit_scale: float = 1.0, backward: bool = False, backend: str = "gloo",
                         timeout: float = _TIMEOUT) -> None:
    """ring_attention on contiguous shards against single-process attention, and its P2P communication.

    Every rank of a CP group of `cp_size` (default: the whole world; smaller:
    several strided groups of a larger world, each with its own data) gets
    positions `[r s/w, (r + 1) s/w)` of q, k, v. Checked: out and lse of every
    rank; with `backward`, dq, dk, dv of `out.backward(dout)`. Communication:
    forward exactly 2(w - 1) sends of `[b, s/w, n, d]` to the next group rank
    and 2(w - 1) receives from the previous one (K and V separately), nothing
    else; backward 2(w - 1) K/V sends plus 2w or 2(w - 1) dK/dV sends, the
    mirror of forward; a group of one communicates nothing.
    """
    case, refs, results = _run_ring(ring_attention, "contiguous", world_size=world_size, cp_size=cp_size,
                                    causal=causal, batch=batch, seq=seq, n_heads=n_heads, head_dim=head_dim,
                                    dtype=dtype, seed=seed, logit_scale=logit_scale, backward=backward,
                                    backend=backend, timeout=timeout)
    _check_ring_results(case, refs, results, dtype=dtype, batch=batch, seq=seq, n_heads=n_heads, head_dim=head_dim)


def check_zigzag_ring_attention(zigzag_ring_attention, *, world_size: int = 2, cp_size: int | None = None,
                                batch: int = 2, seq: int = 8, n_heads: int = 3, head_dim: int = 4,
                                dtype=torch.float64, seed: int = 0, logit_scale: float = 1.0,
                                backward: bool = True, backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """zigzag_ring_attention (causal) on zigzag shards against single-process causal attention.

    Rank r holds chunks r and 2w - 1 - r of 2w (this check's own split, so a
    wrong `zigzag_split` does not fail it). Checked: out, lse (in the zigzag
    layout), dq, dk, dv, and the same P2P communication as the contiguous ring.
    """
    case, refs, results = _run_ring(zigzag_ring_attention, "zigzag", world_size=world_size, cp_size=cp_size,
                                    causal=True, batch=batch, seq=seq, n_heads=n_heads, head_dim=head_dim,
                                    dtype=dtype, seed=seed, logit_scale=logit_scale, backward=backward,
                                    backend=backend, timeout=timeout)
    _check_ring_results(case, refs, results, dtype=dtype, batch=batch, seq=seq, n_heads=n_heads, head_dim=head_dim)


def check_ring_overlap(ring_attention, *, world_size: int = 2, batch: int = 2, seq: int = 8, n_heads: int = 3,
                       head_dim: int = 4, seed: int = 0, backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """The next K/V transfer is posted BEFORE the current block is computed, judged from the op trace.

    Non-causal, so that every rank computes a block at every step (under the
    causal mask a contiguous rank skips the blocks that follow it: nothing to
    overlap there).

    From each rank's forward trace (communication and compute ops, in order):
    the w - 1 transfers are each one batch of posts (sends and receives with no
    compute between them), and between posting a transfer and the first wait
    that follows it the rank computes attention (matmuls, FLOPs > 0): the
    transfer is in flight while a block is computed. Posting after the
    compute, or waiting right after posting, leaves nothing to overlap. (CPU
    timing proves nothing: gloo moves data on its own threads.)
    """
    case, _, results = _run_ring(ring_attention, "contiguous", world_size=world_size, cp_size=None, causal=False,
                                 batch=batch, seq=seq, n_heads=n_heads, head_dim=head_dim, dtype=torch.float64,
                                 seed=seed, logit_scale=1.0, backward=False, backend=backend, timeout=timeout)
    what = case["what"]
    for rank, res in enumerate(results):
        recs, flops = res["records"], res["flops"]
        if world_size == 1:
            expect_no_comm(recs, rank=rank, context=f"{what}; a group of one communicates nothing")
            continue
        trace = f"Forward of rank {rank}, in order (compute ops with FLOPs only):\n{_timeline(recs, res['ops'], flops)}"
        if not any(flops.values()):
            raise CheckFailure(f"rank {rank} ({what}): no matmul was traced in forward: compute attention with "
                               f"explicit matmuls (torch.matmul / einsum in attention_with_lse).\n{trace}")
        groups = _post_groups(recs, "forward", flops)
        if len(groups) != world_size - 1:
            raise CheckFailure(
                f"rank {rank} ({what}): expected {world_size - 1} ring transfers in forward (one batch of posts "
                f"per step but the last: send K and V to the next rank, receive the next K and V, with no "
                f"attention and no wait between them), saw {len(groups)} batch(es) of sends/receives.\n{trace}")
        waits = sorted(r.seq for r in recs if r.op == "wait" and r.phase == "forward")
        for i, g in enumerate(groups):
            after = [s for s in waits if s > g[-1].seq]
            if not after:
                raise CheckFailure(f"rank {rank} ({what}): transfer {i} was never waited for (call .wait() on every "
                                   f"work handle before using the received blocks).\n{trace}")
            overlapped = [s for s, f in flops.items() if f and g[-1].seq < s < after[0]]
            if not overlapped:
                raise CheckFailure(
                    f"rank {rank} ({what}): nothing was computed while transfer {i} was in flight (between its "
                    f"posts, #{g[0].seq}-#{g[-1].seq}, and the next wait, #{after[0]}). Post the next transfer "
                    f"first, then compute the block you hold, then wait.\n{trace}")


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


# ---------------------------------------------------------------------------
# Exercise 5: the zigzag split and the balance of work
# ---------------------------------------------------------------------------

def check_zigzag_split(zigzag_split, *, cp_size: int = 2, shape=(2, 8, 3), dim: int = 1, seed: int = 0) -> None:
    """Every rank's zigzag shard (chunks r and 2w - 1 - r of 2w, in that order), and ValueError for a
    sequence not divisible by 2w (the message names both sizes)."""
    gen = torch.Generator().manual_seed(seed)
    x = _randn(gen, *shape)
    seq = shape[dim]
    pos_shape = [1] * len(shape)
    pos_shape[dim] = seq
    positions = torch.arange(seq, dtype=torch.float64).reshape(pos_shape).expand(*shape).contiguous()
    bad = list(shape)
    bad[dim] = 2 * cp_size * 2 + cp_size  # divisible by w, not by 2w
    res = _on_a_rank(_zigzag_split_job, zigzag_split, x, positions, cp_size, dim, bad)
    for r, (got, held) in enumerate(res["shards"]):
        what = f"zigzag_split(x {fmt_shape(shape)}, cp_rank={r}, cp_size={cp_size}, dim={dim})"
        want = zigzag_shard(x, r, cp_size, dim)
        if not isinstance(got, torch.Tensor):
            raise CheckFailure(f"{what} returned {type(got).__name__}, expected a tensor of shape {fmt_shape(want.shape)}")
        if tuple(got.shape) == tuple(want.shape) and not torch.equal(got, want) and isinstance(held, torch.Tensor):
            held = [int(p) for p in held.movedim(dim, 0).reshape(held.shape[dim], -1)[:, 0]]
            raise CheckFailure(f"{what}: the shard holds positions {_span(held)}, expected "
                               f"{_span(_positions('zigzag', r, cp_size, seq))} (chunks {r} and "
                               f"{2 * cp_size - 1 - r} of {2 * cp_size}, in that order)")
        assert_close(got, want, name=f"{what}: the shard")
    what = f"zigzag_split(x {fmt_shape(bad)}, cp_rank=0, cp_size={cp_size}, dim={dim})"
    error = res["error"]
    if error is None:
        raise CheckFailure(f"{what}: expected ValueError (length {bad[dim]} is not divisible by 2w = "
                           f"{2 * cp_size}), nothing was raised")
    kind, msg = error
    if kind != "ValueError":
        raise CheckFailure(f"{what}: expected ValueError (length {bad[dim]} is not divisible by 2w = "
                           f"{2 * cp_size}), got {kind}: {msg}")
    if str(bad[dim]) not in msg or str(2 * cp_size) not in msg:
        raise CheckFailure(f"{what}: the ValueError should name the sequence length ({bad[dim]}) and "
                           f"2 * cp_size ({2 * cp_size}); its message was {msg!r}")


def _zigzag_split_job(fn, x, positions, cp_size, dim, bad_shape):
    shards = [(_cpu(fn(x, cp_rank=r, cp_size=cp_size, dim=dim)), _cpu(fn(positions, cp_rank=r, cp_size=cp_size,
                                                                       dim=dim)))
              for r in range(cp_size)]
    error = None
    try:
        fn(torch.zeros(bad_shape), cp_rank=0, cp_size=cp_size, dim=dim)
    except NotImplementedError:
        raise  # a stub: reported as such
    except Exception as exc:  # noqa: BLE001 - the verdict (in the parent) names it
        error = (type(exc).__name__, str(exc))
    return {"shards": shards, "error": error}


def _flops_rank(rank, world_size, fns, case, backend):
    """Per layout: FLOPs per ring step in forward (from the trace) and FlopCounterMode totals, fwd and bwd."""
    dev = rank_device(rank, backend)
    group = dist.group.WORLD
    out = {}
    for layout, fn in fns.items():
        data = case[layout]
        q, k, v = (data[name][rank].to(dev).clone().requires_grad_() for name in ("q", "k", "v"))
        with _FlopTrace() as trace:
            with FlopCounterMode(display=False) as fwd:
                res = fn(q, k, v, cp_group=group) if layout == "zigzag" else fn(q, k, v, cp_group=group, causal=True)
        o, _ = _check_pair(res, f"{layout} ring attention", q.shape, q.shape[:3], rank=rank)
        with FlopCounterMode(display=False) as bwd:
            o.backward(data["dout"][rank].to(dev))
        out[layout] = {"forward": int(fwd.get_total_flops()), "backward": int(bwd.get_total_flops()),
                       "steps": _steps(trace.records, trace.flops)}
    return out


def measure_ring_layouts(ring_attention, zigzag_ring_attention, *, world_size: int = 4, batch: int = 1,
                         seq: int = 32, n_heads: int = 2, head_dim: int = 8, seed: int = 0, backend: str = "gloo",
                         timeout: float = _TIMEOUT) -> dict:
    """Run both causal rings on one world; per layout and rank: FLOPs per forward step, and the forward and
    backward FLOPs counted by `torch.utils.flop_counter.FlopCounterMode`.

    Returns `{"contiguous": [per rank {"forward", "backward", "steps"}], "zigzag": [...], "block": FLOPs of one
    full forward block (the rank's queries against one rank's keys, unmasked)}`.
    """
    if seq % (2 * world_size):
        raise ValueError(f"check parameters: seq ({seq}) must be divisible by 2 * world_size ({2 * world_size})")
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = _qkv(gen, batch, seq, n_heads, head_dim, torch.float64, 1.0)
    case = {layout: {name: [_shard(layout)(t, r, world_size) for r in range(world_size)]
                     for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout))}
            for layout in ("contiguous", "zigzag")}
    fns = {"contiguous": ring_attention, "zigzag": zigzag_ring_attention}
    try:
        results = run_distributed(_flops_rank, world_size, args=(fns, case, backend), timeout=timeout, backend=backend)
    except DistributedError as exc:
        raise _deadlock_hint(exc, f"causal ring attention, contiguous and zigzag, world size {world_size}") from None
    s_local = seq // world_size
    block = 2 * (2 * batch * n_heads * s_local * s_local * head_dim)  # q k^T and p v, one full block
    return {"contiguous": [r["contiguous"] for r in results], "zigzag": [r["zigzag"] for r in results],
            "block": block, "world_size": world_size, "shape": (batch, seq, n_heads, head_dim)}


def check_zigzag_balance(zigzag_ring_attention, ring_attention, *, world_size: int = 2, batch: int = 1,
                         seq: int = 16, n_heads: int = 2, head_dim: int = 4, seed: int = 0, backend: str = "gloo",
                         timeout: float = _TIMEOUT) -> None:
    """Equal work per rank with zigzag, measured with FlopCounterMode (forward and backward separately).

    Causal attention on both layouts: every rank does some work (FLOPs > 0),
    the zigzag ranks' FLOPs are equal (within 1 %), and the busiest zigzag
    rank does less than the busiest contiguous one. FlopCounterMode counts
    matmuls only (0 for SDPA on CPU), and a masked block as a full one: skip
    fully masked blocks and compute only the visible half of a half-masked one.
    """
    m = measure_ring_layouts(ring_attention, zigzag_ring_attention, world_size=world_size, batch=batch, seq=seq,
                             n_heads=n_heads, head_dim=head_dim, seed=seed, backend=backend, timeout=timeout)
    shape = f"world size {world_size}, causal, [b, s, n, d] = {fmt_shape(m['shape'])}"
    for phase in ("forward", "backward"):
        zig = [r[phase] for r in m["zigzag"]]
        con = [r[phase] for r in m["contiguous"]]
        table = (f"FLOPs per rank in {phase} (FlopCounterMode): contiguous {con}, zigzag {zig}")
        for name, flops in (("zigzag_ring_attention", zig), ("ring_attention", con)):
            idle = [r for r, f in enumerate(flops) if f <= 0]
            if idle:
                raise CheckFailure(f"{name}, {shape}: rank(s) {idle} counted no FLOPs in {phase}. FlopCounterMode "
                                   f"counts matmuls (mm, bmm); F.scaled_dot_product_attention counts 0 on CPU: "
                                   f"compute attention with explicit matmuls. {table}")
        if max(zig) > 1.01 * min(zig):
            busiest = max(range(world_size), key=lambda r: zig[r])
            raise CheckFailure(f"zigzag_ring_attention, {shape}: unequal work in {phase}: rank {busiest} does "
                               f"{max(zig)} FLOPs, rank {min(range(world_size), key=lambda r: zig[r])} "
                               f"{min(zig)}. {table}")
        if world_size > 1 and not max(zig) < max(con):
            raise CheckFailure(f"zigzag_ring_attention, {shape}: its busiest rank ({max(zig)} FLOPs in {phase}) is "
                               f"not below the contiguous layout's ({max(con)}): skip the fully masked blocks and "
                               f"compute only the visible half of the others. {table}")


# ---------------------------------------------------------------------------
# Pictures, from the student's own run
# ---------------------------------------------------------------------------

_STEP_COLORS = {"computed": "#4C72B0", "diagonal": "#DD8452", "part": "#8FB3DE", "skipped": "#E5E5E5"}


def _classify(step: int, fraction: float) -> str:
    if fraction < 1e-9:
        return "skipped"
    if step == 0:
        return "diagonal"
    return "computed" if fraction > 0.99 else "part"


def plot_ring_steps(ring_attention, zigzag_ring_attention, *, world_size: int = 4, measured: dict | None = None,
                    **kwargs):
    """Each rank's attention work per ring step, contiguous vs zigzag, measured from the forward op trace.

    A cell is one (rank, step): the fraction of a full block's FLOPs the rank
    computed while holding the K/V block of rank (r - step) mod w: the
    diagonal block under the causal mask, a full block, part of one (zigzag:
    half), or none (skipped). Pass `measured` (from `measure_ring_layouts`)
    to reuse a run. Returns a picture (displayed by the notebook).
    """
    from autograder.lessons.plots import new_figure, picture

    m = measured or measure_ring_layouts(ring_attention, zigzag_ring_attention, world_size=world_size, **kwargs)
    w = m["world_size"]
    fig, axes = new_figure(figsize=(11, 1.0 + 0.75 * w), ncols=2)
    for ax, layout in zip(axes, ("contiguous", "zigzag")):
        for r, res in enumerate(m[layout]):
            steps = (res["steps"] + [0] * w)[:w] if len(res["steps"]) <= w else res["steps"]
            for i, f in enumerate(steps):
                frac = f / m["block"]
                kind = _classify(i, frac)
                ax.add_patch(_rect(i, r, _STEP_COLORS[kind]))
                label = f"K/V of {(r - i) % w}\n{frac:.2g}" if i < w else f"extra\n{frac:.2g}"
                ax.text(i + 0.5, r + 0.5, label, ha="center", va="center", fontsize=8,
                        color="white" if kind in ("computed", "diagonal") else "black")
            ax.text(len(steps) + 0.1, r + 0.5, f"total {sum(steps) / m['block']:.2g}", va="center", fontsize=8)
        ax.set_xlim(0, w + 1.2)
        ax.set_ylim(w, 0)
        ax.set_xticks([i + 0.5 for i in range(w)], [f"step {i}" for i in range(w)], fontsize=8)
        ax.set_yticks([r + 0.5 for r in range(w)], [f"rank {r}" for r in range(w)], fontsize=8)
        ax.set_title(f"{layout}: forward work per ring step (x one full block)", fontsize=10)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    from matplotlib.patches import Patch

    names = {"diagonal": "diagonal block (causal mask inside)", "computed": "full block",
             "part": "part of a block (only the visible part)", "skipped": "skipped (fully masked)"}
    fig.legend(handles=[Patch(color=_STEP_COLORS[k], label=v) for k, v in names.items()],
               loc="outside lower center", ncol=4, fontsize=8)
    fig.suptitle(f"Causal ring attention, world size {w}, [b, s, n, d] = {fmt_shape(m['shape'])}: measured from "
                 f"your run (FLOPs of the matmuls between waits)", fontsize=10)
    return picture(fig)


def _rect(x, y, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.04, y + 0.06), 0.92, 0.88, facecolor=color, edgecolor="white")


def plot_ring_flops(ring_attention, zigzag_ring_attention, *, world_size: int = 4, measured: dict | None = None,
                    **kwargs):
    """FLOPs per rank (FlopCounterMode), forward and backward, contiguous vs zigzag, from your run."""
    from autograder.lessons.plots import new_figure, picture

    m = measured or measure_ring_layouts(ring_attention, zigzag_ring_attention, world_size=world_size, **kwargs)
    w = m["world_size"]
    fig, axes = new_figure(figsize=(11, 3.6), ncols=2)
    colors = {"contiguous": "#C44E52", "zigzag": "#55A868"}
    for ax, phase in zip(axes, ("forward", "backward")):
        for j, layout in enumerate(("contiguous", "zigzag")):
            values = [r[phase] / 1e3 for r in m[layout]]
            xs = [r + (j - 0.5) * 0.38 for r in range(w)]
            ax.bar(xs, values, width=0.36, color=colors[layout], label=layout)
            for x, val in zip(xs, values):
                ax.text(x, val, f"{val:.3g}", ha="center", va="bottom", fontsize=7)
        con = max(r[phase] for r in m["contiguous"])
        zig = max(r[phase] for r in m["zigzag"])
        ax.set_xticks(range(w), [f"rank {r}" for r in range(w)], fontsize=8)
        ax.set_ylabel("kFLOPs", fontsize=8)
        ax.set_title(f"{phase}: busiest rank {con / 1e3:.3g} (contiguous) vs {zig / 1e3:.3g} kFLOPs (zigzag)",
                     fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"Causal ring attention, world size {w}, [b, s, n, d] = {fmt_shape(m['shape'])}: FLOPs per rank "
                 f"counted by FlopCounterMode in your run", fontsize=10)
    return picture(fig)


# ---------------------------------------------------------------------------
# Exercise 6: Ulysses
# ---------------------------------------------------------------------------

def _a2a_rank(rank, world_size, fn, xs, gs, scatter_dim, gather_dim, backend):
    dev = rank_device(rank, backend)
    x = xs[rank].to(dev).clone().requires_grad_()
    with CommLedger() as ledger:
        y = fn(x, cp_group=dist.group.WORLD, scatter_dim=scatter_dim, gather_dim=gather_dim)
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(gs[rank].shape):
            got = fmt_shape(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise CheckFailure(f"rank {rank}: seq_all_to_all(x {fmt_shape(x.shape)}, scatter_dim={scatter_dim}, "
                               f"gather_dim={gather_dim}) returned {got}, expected {fmt_shape(gs[rank].shape)}")
        try:
            y.backward(gs[rank].to(dev))
        except RuntimeError as exc:
            if "invalid gradient" not in str(exc):
                raise
            raise CheckFailure(f"rank {rank}: the backward of seq_all_to_all(x {fmt_shape(x.shape)}, scatter_dim="
                               f"{scatter_dim}, gather_dim={gather_dim}) returned a gradient that does not fit x: "
                               f"{exc}. Backward is the INVERSE all-to-all (scatter and gather dims swapped).") from None
    return {"out": _cpu(y), "grad": _cpu(x.grad), "records": ledger.records}


def _expect_a2a(records, *, rank, counts: dict, numel: int, context: str) -> None:
    """Exactly `counts[phase]` all-to-alls of `numel` elements in each phase, and no other communication."""
    for phase, count in counts.items():
        mine = [r for r in records if r.phase == phase and r.op != "wait"]
        a2a = [r for r in mine if r.op == "all_to_all" and math.prod(r.shape) == numel]
        if len(a2a) != count or len(mine) != count:
            raise CheckFailure(f"rank {rank} ({context}): expected {count} all_to_all of {numel} elements in "
                               f"{phase} and nothing else, saw {len(a2a)} (and {len(mine) - len(a2a)} other op(s)). "
                               f"Communication of rank {rank}:\n{format_trace(records, rank)}")


def check_seq_all_to_all(seq_all_to_all, *, world_size: int = 2, shape=(2, 4, 6, 3), scatter_dim: int = 2,
                         gather_dim: int = 1, dtype=torch.float64, seed: int = 0, backend: str = "gloo",
                         timeout: float = _TIMEOUT) -> None:
    """Rank r ends with piece r (along scatter_dim) of every rank's input, concatenated along gather_dim in
    rank order; backward is the inverse all-to-all. One all-to-all in forward, one in backward."""
    w = world_size
    gen = torch.Generator().manual_seed(seed)
    xs = [_randn(gen, *shape, dtype=dtype).requires_grad_() for _ in range(w)]
    ys = [torch.cat([x.chunk(w, dim=scatter_dim)[r] for x in xs], dim=gather_dim) for r in range(w)]
    gs = [_randn(gen, *y.shape, dtype=dtype) for y in ys]
    torch.autograd.backward(ys, gs)
    results = run_distributed(_a2a_rank, w, args=(seq_all_to_all, [x.detach() for x in xs], gs, scatter_dim,
                                                   gather_dim, backend), timeout=timeout, backend=backend)
    ctx = f"seq_all_to_all(x {fmt_shape(shape)}, scatter_dim={scatter_dim}, gather_dim={gather_dim}), world size {w}"
    check_consistent([r["records"] for r in results], context=ctx)
    findings = Findings()
    for rank, res in enumerate(results):
        with findings.communication():
            if w == 1:
                expect_no_comm(res["records"], rank=rank, context=f"{ctx}; a group of one communicates nothing")
            else:
                _expect_a2a(res["records"], rank=rank, counts={"forward": 1, "backward": 1},
                            numel=math.prod(shape), context=ctx)
        with findings.numbers():
            assert_close(res["out"], ys[rank].detach(), name=f"{ctx}: output", rank=rank)
        with findings.numbers():
            assert_close(res["grad"], xs[rank].grad, name=f"{ctx}: input gradient (the inverse all-to-all)",
                         rank=rank)
    findings.raise_if_any()


def _ulysses_rank(rank, world_size, fn, data, causal, backend):
    dev = rank_device(rank, backend)
    q, k, v = (data[name][rank].to(dev).clone().requires_grad_() for name in ("q", "k", "v"))
    with CommLedger() as ledger:
        out = fn(q, k, v, cp_group=dist.group.WORLD, causal=causal)
        if isinstance(out, (tuple, list)):
            raise CheckFailure(f"rank {rank}: ulysses_attention returned a {type(out).__name__}; it returns out only")
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
            got = fmt_shape(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise CheckFailure(f"rank {rank}: ulysses_attention returned {got}, expected {fmt_shape(q.shape)} "
                               f"(the rank's sequence shard, all heads)")
        out.backward(data["dout"][rank].to(dev))
    return {"out": _cpu(out), "dq": _cpu(q.grad), "dk": _cpu(k.grad), "dv": _cpu(v.grad), "records": ledger.records}


def check_ulysses_attention(ulysses_attention, *, world_size: int = 2, causal: bool = True, batch: int = 2,
                            seq: int = 8, n_heads: int = 4, head_dim: int = 3, dtype=torch.float64, seed: int = 0,
                            backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """ulysses_attention on contiguous shards against single-process attention; 4 all-to-alls each way.

    Checked per rank: out, dq, dk, dv; exactly 4 all-to-alls of `b s/w n d`
    elements in forward (q, k, v, out) and 4 in backward (their inverses),
    nothing else; none for a group of one.
    """
    w = world_size
    if seq % w:
        raise ValueError(f"check parameters: seq ({seq}) must be divisible by world_size ({w})")
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = _qkv(gen, batch, seq, n_heads, head_dim, dtype, 1.0)
    data = {name: [contiguous_shard(t, r, w) for r in range(w)] for name, t in (("q", q), ("k", k), ("v", v),
                                                                               ("dout", dout))}
    out, _ = reference_attention(q, k, v, causal=causal)
    grads = reference_attention_grads(q, k, v, dout, causal=causal)
    results = run_distributed(_ulysses_rank, w, args=(ulysses_attention, data, causal, backend), timeout=timeout,
                              backend=backend)
    ctx = (f"ulysses_attention(causal={causal}), world size {w}, [b, s, n, d] = [{batch}, {seq}, {n_heads}, "
           f"{head_dim}], {dtype_name(dtype)}")
    check_consistent([r["records"] for r in results], context=ctx)
    findings = Findings()
    for rank, res in enumerate(results):
        with findings.communication():
            if w == 1:
                expect_no_comm(res["records"], rank=rank, context=f"{ctx}; a group of one communicates nothing")
            else:
                _expect_a2a(res["records"], rank=rank, counts={"forward": 4, "backward": 4},
                            numel=batch * (seq // w) * n_heads * head_dim,
                            context=f"{ctx}: q, k, v and out, each [b, s/w, n, d] <-> [b, s, n/w, d]")
        with findings.numbers():
            assert_close(res["out"], contiguous_shard(out, rank, w).to(dtype), name=f"{ctx}: out", rank=rank)
        for name, g in zip(("dq", "dk", "dv"), grads):
            with findings.numbers():
                assert_close(res[name], contiguous_shard(g, rank, w).to(dtype), name=f"{ctx}: {name[1]}.grad",
                             rank=rank)
    findings.raise_if_any()


def _ulysses_errors_rank(rank, world_size, impls, cases, backend):
    dev = rank_device(rank, backend)
    results = []
    for label, name, kwargs, shape, _ in cases:
        kwargs = dict(kwargs)
        group = kwargs.pop("group", "world")
        group = dist.group.WORLD if group == "world" else group
        err = None
        with CommLedger() as ledger:
            try:
                x = torch.randn(*shape, device=dev, dtype=torch.float64)
                if name == "ulysses_attention":
                    impls[name](x, x.clone(), x.clone(), cp_group=group, **kwargs)
                else:
                    impls[name](x, cp_group=group, **kwargs)
            except NotImplementedError:
                raise  # a stub: reported as such, not as a wrong error
            except Exception as exc:  # noqa: BLE001 - the verdict is made in the parent
                err = (type(exc).__name__, str(exc))
        results.append({"error": err, "records": ledger.records})
    return results


def check_ulysses_errors(ulysses_attention, seq_all_to_all, *, world_size: int = 2, backend: str = "gloo",
                         timeout: float = _TIMEOUT) -> None:
    """ValueError on every rank before any communication, naming the sizes: heads not divisible by the group
    size (Ulysses' limit), a scattered dim not divisible, a cp_group that is not a ProcessGroup."""
    w = world_size
    cases = [
        (f"ulysses_attention with 3 heads on {w} ranks", "ulysses_attention", {"causal": True},
         (2, 4, 3, 2), ["3", str(w)]),
        (f"seq_all_to_all of [2, 4, 3, 2] with scatter_dim=2 (3) on {w} ranks", "seq_all_to_all",
         {"scatter_dim": 2, "gather_dim": 1}, (2, 4, 3, 2), ["3", str(w)]),
        ("ulysses_attention with cp_group=None", "ulysses_attention", {"causal": False, "group": None},
         (2, 4, 4, 2), []),
        ("seq_all_to_all with cp_group=0 (a rank, not a ProcessGroup)", "seq_all_to_all",
         {"scatter_dim": 2, "gather_dim": 1, "group": 0}, (2, 4, 4, 2), []),
    ]
    impls = {"ulysses_attention": ulysses_attention, "seq_all_to_all": seq_all_to_all}
    sent = [(label, name, kwargs, shape, None) for label, name, kwargs, shape, _ in cases]  # names stay here
    results = run_distributed(_ulysses_errors_rank, w, args=(impls, sent, backend), timeout=timeout,
                              backend=backend)
    expect_value_errors(results, [(label, must_mention) for label, _, _, _, must_mention in cases], w)
