"""Public checks of assignment 04, exercise 6: Ulysses, context parallelism by all-to-all.

    from autograder.checks.context_parallel import check_seq_all_to_all, check_ulysses_attention
    check_seq_all_to_all(seq_all_to_all, world_size=2)
    check_ulysses_attention(ulysses_attention, world_size=2, causal=True)

The sequence all-to-all (scatter one dimension, gather another), attention over it against the float64
reference, and the error contract of both (ValueError naming the sizes, before any communication).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from autograder.checks import expect_value_errors
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape
from autograder.runtime.dist import rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm, format_trace

from .common import _TIMEOUT, _cpu, _qkv, _randn, contiguous_shard, reference_attention, reference_attention_grads

__all__ = ["check_seq_all_to_all", "check_ulysses_attention", "check_ulysses_errors"]


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
