"""Public checks of assignment 05, exercises 3-4: the all-to-all and the token dispatcher.

    from autograder.checks.expert_parallel import check_all_to_all, check_dispatch
    check_dispatch(AllToAllTokenDispatcher, world_size=2)

The worked example's count exchange, the differentiable all-to-all, the error contract of the
assignment's functions (`check_argument_errors`), and the dispatcher: what each expert receives, what
comes back combined, and what is sent (`check_dispatcher_communication`). How every check of the
assignment works: autograder/checks/expert_parallel/__init__.py.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from autograder.checks import expect_value_errors, inputs_only
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape
from autograder.runtime.dist import rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm, format_trace

from .common import (
    _INT_DTYPES, _TIMEOUT, _check_tensor, _cpu, _ep_groups, _ep_named, _my_group, _require, _traced, _unpack,
)
from .routing import _random_routing

__all__ = [
    "check_exchange_token_counts", "check_all_to_all", "check_argument_errors", "check_dispatch", "check_combine",
    "check_dispatcher_communication",
]


# ---------------------------------------------------------------------------
# The worked example and exercise 3: the count exchange and the differentiable all-to-all
# ---------------------------------------------------------------------------

def _counts_rank(rank, world_size, fn, counts, groups, backend):
    group, members = _my_group(rank, groups)
    ledger, guard = _traced()
    with ledger, guard:
        out = fn(counts[rank].to(rank_device(rank, backend)), group=group)
    return {"out": _cpu(out), "records": ledger.records}


def check_exchange_token_counts(exchange_token_counts, *, world_size: int = 2, num_experts: int = 4,
                                ep_size: int | None = None, seed: int = 0, backend: str = "gloo",
                                timeout: float = _TIMEOUT) -> None:
    """The worked example: rank r gets `[w, E/w]`, row s = rank s's counts for r's experts; one int64 all-to-all."""
    groups = _ep_groups(world_size, ep_size)
    ep = len(groups[0])
    _require(num_experts % ep == 0, f"num_experts ({num_experts}) must be divisible by {_ep_named(ep, ep_size)}")
    gen = torch.Generator().manual_seed(seed)
    counts = [torch.randint(0, 9, (num_experts,), generator=gen) for _ in range(world_size)]
    results = run_distributed(_counts_rank, world_size, args=(exchange_token_counts, counts, groups, backend),
                              timeout=timeout, backend=backend)
    local = num_experts // ep
    for members in groups:
        for i, r in enumerate(members):
            want = torch.stack([counts[s][i * local:(i + 1) * local] for s in members])
            got = results[r]["out"]
            _check_tensor(got, "exchange_token_counts", want.shape, dtype=torch.int64, rank=r)
            assert_close(got, want, name="exchange_token_counts: row s = counts rank s sends to my experts", rank=r)


def _splits_matrix(gen, w, pattern):
    """S[i][j] = rows rank i sends to rank j: uneven, with zeros (a rank receiving nothing from someone)."""
    if w == 1:
        return [[3]]
    s = torch.randint(0, 4, (w, w), generator=gen).tolist()
    s[0][w - 1] = 0  # rank 0 sends nothing to the last rank
    s[w - 1][0] = 5  # ... which sends rank 0 more than it gets back
    if pattern == "receive_nothing":
        for i in range(w):
            s[i][1] = 0  # rank 1 receives nothing at all
    return s


def _a2a_rank(rank, world_size, fn, case, backend):
    dev = rank_device(rank, backend)
    group, members = _my_group(rank, case["groups"])
    x = case["x"][rank].to(dev).clone().requires_grad_()
    ledger, guard = _traced()
    with ledger, guard:
        y = fn(x, output_split_sizes=list(case["out"][rank]), input_split_sizes=list(case["in"][rank]), group=group)
        _check_tensor(y, "all_to_all output", torch.Size([sum(case["out"][rank]), x.shape[1]]), rank=rank,
                      grad=True)
        y.backward(case["g"][rank].to(dev))
    return {"y": _cpu(y), "grad": _cpu(x.grad), "records": ledger.records}


def check_all_to_all(all_to_all, *, world_size: int = 2, ep_size: int | None = None, hidden: int = 3,
                     dtype=torch.float64, seed: int = 0, pattern: str = "uneven", backend: str = "gloo",
                     timeout: float = _TIMEOUT) -> None:
    """`all_to_all(x, output_split_sizes=..., input_split_sizes=..., group=...)`: rows, gradients, communication.

    Rank i sends `S[i][j]` rows to rank j (uneven, some zero; pattern
    "receive_nothing": rank 1 receives no row at all). Checked per rank: the
    output (blocks from ranks 0, 1, ... in order), the input gradient (each
    block's gradient comes back from where it went), exactly one all-to-all
    of `[sum_j S[i][j], h]` in forward with those splits, and exactly one in
    backward with the splits swapped; none for a group of one. With `ep_size`
    the group is a subgroup of a larger world (group ranks, not global ranks).
    """
    groups = _ep_groups(world_size, ep_size)
    gen = torch.Generator().manual_seed(seed)
    case = {"groups": groups, "x": [None] * world_size, "g": [None] * world_size, "y": [None] * world_size,
            "in": [None] * world_size, "out": [None] * world_size, "grad": [None] * world_size}
    for members in groups:
        w = len(members)
        s = _splits_matrix(gen, w, pattern)
        xs = [torch.randn(sum(s[i]), hidden, generator=gen, dtype=torch.float64).to(dtype) for i in range(w)]
        blocks = [list(torch.split(xs[i], s[i])) for i in range(w)]  # blocks[i][j]: from i to j
        gs = [torch.randn(sum(s[i][j] for i in range(w)), hidden, generator=gen, dtype=torch.float64).to(dtype)
              for j in range(w)]
        gblocks = [list(torch.split(gs[j], [s[i][j] for i in range(w)])) for j in range(w)]  # gblocks[j][i]
        for i, r in enumerate(members):
            case["x"][r], case["g"][r] = xs[i], gs[i]
            case["in"][r], case["out"][r] = s[i], [s[j][i] for j in range(w)]
            case["y"][r] = torch.cat([blocks[j][i] for j in range(w)])
            case["grad"][r] = torch.cat([gblocks[j][i] for j in range(w)])
    results = run_distributed(_a2a_rank, world_size, args=(all_to_all, inputs_only(case, "y", "grad"), backend),
                              timeout=timeout, backend=backend)
    ctx = (f"all_to_all, world size {world_size}" + (f", EP groups {groups}" if len(groups) > 1 else "")
           + f", rows of {hidden} {dtype_name(dtype)}")
    check_consistent([r["records"] for r in results], context=ctx)
    findings = Findings()
    for rank, res in enumerate(results):
        with findings.numbers():
            assert_close(res["y"], case["y"][rank], name=f"{ctx}: output (the blocks received from ranks 0, 1, ...)",
                         rank=rank)
        with findings.numbers():
            assert_close(res["grad"], case["grad"][rank], name=f"{ctx}: input gradient", rank=rank)
        with findings.communication():
            ins, outs = tuple(case["in"][rank]), tuple(case["out"][rank])
            if len(ins) == 1:
                expect_no_comm(res["records"], rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
            else:
                _expect_a2a_only(res["records"], rank=rank, ctx=ctx, phase="forward",
                                 want=[(ins, outs, (sum(ins), hidden))], dtype=dtype)
                _expect_a2a_only(res["records"], rank=rank, ctx=ctx, phase="backward",
                                 want=[(outs, ins, (sum(outs), hidden))], dtype=dtype,
                                 why="the backward is the same all-to-all with the splits swapped")
    findings.raise_if_any()


def _describe_a2a(ins, outs, shape, dtype) -> str:
    return f"all_to_all of {fmt_shape(shape)} {dtype_name(dtype)} with splits in {list(ins)} out {list(outs)}"


def _expect_a2a_only(records, *, rank, ctx, phase, want, dtype, why=""):
    """Exactly the all-to-alls `want` ((in, out, shape) in order) in `phase`, and no other communication."""
    mine = [r for r in records if r.op != "wait" and r.phase == phase]
    got = [(tuple(r.input_split_sizes or ()), tuple(r.output_split_sizes or ()), tuple(r.shape), r.dtype)
           for r in mine]
    expected = [(tuple(i), tuple(o), tuple(s), dtype_name(dtype)) for i, o, s in want]
    if got != expected:
        lines = "; ".join(_describe_a2a(i, o, s, dtype) for i, o, s in want) or "no communication"
        raise CheckFailure(f"rank {rank} ({ctx}): expected in {phase}: {lines}" + (f" ({why})" if why else "")
                           + f". Communication of rank {rank}:\n{format_trace(records, rank)}")


# ---------------------------------------------------------------------------
# The error contract (spec 3.8)
# ---------------------------------------------------------------------------

def _error_cases():
    """(label, what, kwargs, strings the message must contain), the last exercise first (a stub is named
    in the order a student who works through the notebook meets them)."""
    return [
        ("MoELayer with 5 experts on 2 ranks", "moe", dict(num_experts=5), ["5", "2"]),
        ("MoELayer with a router weight of shape [3, 4] (must be [num_experts, hidden_size] = [4, 3])", "moe",
         dict(router_shape=(3, 4)), ["4", "3"]),
        ("MoELayer(num_experts=4, k=5)", "moe", dict(k=5), ["5"]),
        ("apply_router_token_dropping(capacity_factor=0)", "drop", dict(capacity_factor=0), ["0"]),
        ("AllToAllTokenDispatcher(5 experts) on 2 ranks", "dispatcher", dict(num_experts=5), ["5", "2"]),
        ("AllToAllTokenDispatcher(4 experts).dispatch with a routing map of 6 experts", "dispatch",
         dict(map_experts=6), ["6", "4"]),
        ("all_to_all(x [5, 2], input_split_sizes=[2, 2]): the splits sum to 4, not 5", "a2a",
         dict(rows=5, ins=[2, 2], outs=[2, 2]), ["5", "4"]),
        ("all_to_all with 3 input split sizes on a group of 2", "a2a", dict(rows=4, ins=[2, 1, 1], outs=[2, 2]),
         ["3", "2"]),
        ("all_to_all(..., group=None)", "a2a", dict(rows=4, ins=[2, 2], outs=[2, 2], group=None), []),
        ("permute(tokens [7, 2], routing_map [4, 3])", "permute", dict(), ["7", "4"]),
        ("topk_router(logits [4, 3], k=4): k larger than the number of experts", "topk_router", dict(k=4), ["4", "3"]),
        ("topk_router(logits [4, 3], k=0)", "topk_router", dict(k=0), ["0"]),
        ("load_balancing_loss(logits [4, 3], routing_map [4, 5])", "aux", dict(), ["5"]),
    ]


def _error_rank(rank, world_size, impls, cases, backend):
    dev = rank_device(rank, backend)
    world = dist.group.WORLD
    results = []
    for label, what, kw, _ in cases:
        kw = dict(kw)
        err = None
        ledger = CommLedger()
        with ledger:
            try:
                if what == "topk_router":
                    impls["topk_router"](torch.randn(4, 3, device=dev), k=kw["k"])
                elif what == "aux":
                    impls["load_balancing_loss"](torch.randn(4, 3, device=dev),
                                                 torch.zeros(4, 5, dtype=torch.bool, device=dev), k=1)
                elif what == "permute":
                    impls["permute"](torch.randn(7, 2, device=dev), torch.zeros(4, 3, dtype=torch.bool, device=dev))
                elif what == "a2a":
                    impls["all_to_all"](torch.randn(kw["rows"], 2, device=dev), output_split_sizes=kw["outs"],
                                        input_split_sizes=kw["ins"], group=kw.get("group", world))
                elif what == "dispatcher":
                    impls["AllToAllTokenDispatcher"](kw["num_experts"], ep_group=world)
                elif what == "dispatch":
                    d = impls["AllToAllTokenDispatcher"](4, ep_group=world)
                    m = torch.zeros(4, kw["map_experts"], dtype=torch.bool, device=dev)
                    m[:, 0] = True
                    d.dispatch(torch.randn(4, 3, device=dev), m.float(), m)
                elif what == "moe":
                    e, h = kw.get("num_experts", 4), 3
                    wr = torch.randn(*kw.get("router_shape", (e, h)), device=dev)
                    ws = [(torch.randn(2, h, device=dev), torch.randn(h, 2, device=dev)) for _ in range(e)]
                    impls["MoELayer"](h, 2, e, k=kw.get("k", 1), ep_group=world, master_router_weight=wr,
                                      master_expert_weights=ws)
                elif what == "drop":
                    m = torch.zeros(4, 2, dtype=torch.bool, device=dev)
                    m[:, 0] = True
                    impls["apply_router_token_dropping"](m.float(), m, k=1, capacity_factor=kw["capacity_factor"])
            except NotImplementedError:
                raise  # a stub: reported as such, not as a wrong exception type
            except Exception as exc:  # noqa: BLE001 - the verdict is made in the parent
                err = (type(exc).__name__, str(exc))
        results.append({"error": err, "records": ledger.records})
    return results


def check_argument_errors(impls: dict, *, world_size: int = 2, backend: str = "gloo",
                          timeout: float = _TIMEOUT) -> None:
    """Invalid arguments raise ValueError on every rank before any communication, naming the sizes.

    `impls` maps names to the student's implementations: topk_router,
    load_balancing_loss, permute, all_to_all, AllToAllTokenDispatcher,
    MoELayer, apply_router_token_dropping.
    """
    cases = _error_cases()
    needed = {"topk_router", "load_balancing_loss", "permute", "all_to_all", "AllToAllTokenDispatcher",
              "MoELayer", "apply_router_token_dropping"}
    missing = sorted(needed - set(impls))
    if missing:
        raise ValueError(f"check_argument_errors: impls lacks {', '.join(missing)}")
    sent = [(label, what, kw, None) for label, what, kw, _ in cases]  # what the message must name stays here
    results = run_distributed(_error_rank, world_size, args=(impls, sent, backend), timeout=timeout,
                              backend=backend)
    expect_value_errors(results, [(label, must_mention) for label, _, _, must_mention in cases], world_size)


# ---------------------------------------------------------------------------
# Exercise 4: the dispatcher
# ---------------------------------------------------------------------------

PATTERNS = ("random", "starve_expert", "starve_rank", "one_way", "dropped")


def _dispatch_case(world_size, ep_size, num_experts, num_tokens, k, hidden, dtype, seed, pattern):
    """Per-rank tokens (column 0: source rank, column 1: token index), probs, routing maps, and expectations."""
    _require(pattern in PATTERNS, f"pattern must be one of {PATTERNS}, got {pattern!r}")
    groups = _ep_groups(world_size, ep_size)
    ep = len(groups[0])
    _require(num_experts % ep == 0, f"num_experts ({num_experts}) must be divisible by {_ep_named(ep, ep_size)}")
    _require(hidden >= 2, "hidden must be >= 2 (columns 0 and 1 tag each token)")
    local = num_experts // ep
    gen = torch.Generator().manual_seed(seed)
    x, maps, probs = [None] * world_size, [None] * world_size, [None] * world_size
    for members in groups:
        for i, r in enumerate(members):
            allowed, hot, drop = list(range(num_experts)), None, 0.0
            if pattern == "starve_expert":
                allowed, hot = allowed[:-1], 0  # the last expert gets nothing, expert 0 is hot
            elif pattern == "starve_rank":
                allowed = allowed[:(ep - 1) * local]  # the last rank of the group receives nothing
            elif pattern == "one_way" and ep > 1 and i == 0:
                allowed = [e for e in allowed if not local <= e < 2 * local]  # rank 0 sends nothing to rank 1
            elif pattern == "dropped":
                drop = 0.25  # some tokens have fewer than k experts, some none
            _require(k <= len(allowed), f"k ({k}) too large for pattern {pattern!r}")
            maps[r] = _random_routing(gen, num_tokens, num_experts, k, allowed=allowed, drop=drop, hot=hot)
            xr = torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float64)
            xr[:, 0], xr[:, 1] = float(r), torch.arange(num_tokens, dtype=torch.float64)
            x[r] = xr.to(dtype)
            probs[r] = (torch.rand(num_tokens, num_experts, generator=gen, dtype=torch.float64) + 0.5) * maps[r]
    expected = [None] * world_size
    for members in groups:
        for i, r in enumerate(members):
            tags, per_expert = [], []
            for e in range(local):
                ge = i * local + e
                before = len(tags)
                for s in members:
                    tags += [(s, t, ge) for t in maps[s][:, ge].nonzero().flatten().tolist()]
                per_expert.append(len(tags) - before)
            send = [int(maps[r][:, j * local:(j + 1) * local].sum()) for j in range(ep)]
            recv = [int(maps[s][:, i * local:(i + 1) * local].sum()) for s in members]
            rows = torch.stack([x[s][t] for s, t, _ in tags]) if tags else torch.zeros(0, hidden, dtype=dtype)
            expected[r] = {"tags": tags, "tokens_per_local_expert": per_expert, "send": send, "recv": recv,
                           "expert_input": rows, "group_rank": i}
    return {"groups": groups, "ep": ep, "local": local, "x": x, "maps": maps, "probs": probs,
            "expected": expected, "num_experts": num_experts, "hidden": hidden, "dtype": dtype, "k": k}


def _case_ctx(name, case, world_size, num_tokens, pattern):
    groups = case["groups"]
    return (f"{name}: {case['num_experts']} experts, k={case['k']}, world size {world_size}"
            + (f" (EP groups {groups})" if len(groups) > 1 else "")
            + f", {num_tokens} tokens of {case['hidden']} {dtype_name(case['dtype'])} per rank, pattern {pattern!r}")


def _dispatch_rank(rank, world_size, cls, case, mode, backend):
    dev = rank_device(rank, backend)
    group, members = _my_group(rank, case["groups"])
    dispatcher = cls(case["num_experts"], ep_group=group)
    x = case["x"][rank].to(dev).clone()
    probs = case["probs"][rank].to(device=dev, dtype=case["dtype"]).clone()
    routing_map = case["maps"][rank].to(dev).clone()
    ledger, guard = _traced()
    out = {}
    if mode == "dispatch":
        with ledger, guard:
            expert_input, tokens_per_expert = _unpack(dispatcher.dispatch(x, probs, routing_map), 2,
                                                      "dispatch(hidden, probs, routing_map)", rank)
        out.update(expert_input=_cpu(expert_input), tokens_per_expert=_cpu(tokens_per_expert))
    elif mode == "round_trip":  # probs = 1: combine(dispatch(x)) == x * (experts per token); no gradient
        with ledger, guard:
            ones = routing_map.to(case["dtype"])
            expert_input, _ = _unpack(dispatcher.dispatch(x, ones, routing_map), 2, "dispatch", rank)
            y = dispatcher.combine(expert_input)
        out.update(round_trip=_cpu(y))
        dispatcher = cls(case["num_experts"], ep_group=group)
        ledger, guard = _traced()
        mode = "weighted"
    if mode == "weighted":  # the test plays the experts: 2 z - 1 on every row; gradients of x and probs
        x.requires_grad_()
        probs.requires_grad_()
        g = case["g"][rank].to(dev)
        with ledger, guard:
            expert_input, tokens_per_expert = _unpack(dispatcher.dispatch(x, probs, routing_map), 2, "dispatch", rank)
            y = dispatcher.combine(expert_input * 2.0 - 1.0)
            _check_tensor(y, "combine(expert_output)", x.shape, dtype=case["dtype"], rank=rank, grad=True)
            y.backward(g)
        out.update(y=_cpu(y), x_grad=_cpu(x.grad), probs_grad=_cpu(probs.grad))
    out["records"] = ledger.records
    return out


def _decode(row, num_tokens):
    s, t = row[0], row[1]
    if s == round(s) and t == round(t) and 0 <= t < num_tokens:
        return f"token {int(t)} of rank {int(s)}"
    return f"a row that is no token (columns 0, 1 = {s:.4g}, {t:.4g})"


def _compare_expert_input(rank, got, exp, ctx, num_tokens, local, group_rank):
    want = exp["expert_input"]
    _check_tensor(got, f"{ctx}: expert_input", want.shape, dtype=want.dtype, rank=rank)
    tags = exp["tags"]
    bad = (got.double() != want.double()).any(dim=1).nonzero().flatten() if len(tags) else []
    if len(bad):
        i = int(bad[0])
        s, t, ge = tags[i]
        raise CheckFailure(
            f"rank {rank} ({ctx}): expert_input row {i} is {_decode(got[i].tolist(), num_tokens)}, expected token "
            f"{t} of rank {s} (for global expert {ge}, local expert {ge - group_rank * local}). Rows are grouped by "
            f"local expert (0, 1, ...), within an expert by source rank, then by token index.")


def check_dispatch(AllToAllTokenDispatcher, *, world_size: int = 2, ep_size: int | None = None,
                   num_experts: int = 4, num_tokens: int = 12, k: int = 2, hidden: int = 4,
                   dtype=torch.float64, seed: int = 0, pattern: str = "random", backend: str = "gloo",
                   timeout: float = _TIMEOUT) -> None:
    """`dispatch(hidden, probs, routing_map)`: what every rank receives, in which order, and how it got there.

    Each token row carries its source rank and index (columns 0 and 1), so a
    wrong row is named. Checked per rank: `tokens_per_local_expert` (int64
    `[E/w]`), `expert_input` (grouped by local expert, then source rank, then
    token index), and the forward communication: the integer token counts
    exchanged first (one all-to-all of E counts, or an all-gather of w E), then
    one all-to-all of the permuted tokens `[rows sent, h]` whose splits are the
    rows sent to / received from each rank (optionally one more of the
    probabilities with the same splits), nothing else. Patterns: "random",
    "starve_expert" (an expert gets nothing, another is hot), "starve_rank" (a
    rank receives nothing), "one_way" (rank 0 sends nothing to rank 1),
    "dropped" (tokens with fewer than k experts).
    """
    case = _dispatch_case(world_size, ep_size, num_experts, num_tokens, k, hidden, dtype, seed, pattern)
    results = run_distributed(_dispatch_rank, world_size,
                              args=(AllToAllTokenDispatcher, inputs_only(case, "expected"), "dispatch", backend),
                              timeout=timeout, backend=backend)
    ctx = _case_ctx("dispatch", case, world_size, num_tokens, pattern)
    check_consistent([r["records"] for r in results], context=ctx)
    findings = Findings()
    for rank, res in enumerate(results):
        exp = case["expected"][rank]
        with findings.communication():
            _expect_dispatcher_comm(res["records"], rank=rank, ctx=ctx, case=case, exp=exp, combine=False,
                                    backward=False)
        with findings.numbers():
            tpe = res["tokens_per_expert"]
            _check_tensor(tpe, f"{ctx}: tokens_per_local_expert", (case["local"],), dtype=torch.int64, rank=rank)
            assert_close(tpe, torch.tensor(exp["tokens_per_local_expert"]),
                         name=f"{ctx}: tokens_per_local_expert (tokens each local expert receives from all ranks)",
                         rank=rank)
        with findings.numbers():
            _compare_expert_input(rank, res["expert_input"], exp, ctx, num_tokens, case["local"], exp["group_rank"])
    findings.raise_if_any()
    _check_splits_across_ranks(results, case["groups"], ctx)


def _with_upstream(case, seed):
    gen = torch.Generator().manual_seed(seed + 7919)
    case["g"] = [torch.randn(x.shape, generator=gen, dtype=torch.float64).to(case["dtype"]) for x in case["x"]]
    return case


def check_combine(AllToAllTokenDispatcher, *, world_size: int = 2, ep_size: int | None = None,
                  num_experts: int = 4, num_tokens: int = 12, k: int = 2, hidden: int = 4,
                  dtype=torch.float64, seed: int = 0, pattern: str = "random", backend: str = "gloo",
                  timeout: float = _TIMEOUT) -> None:
    """`combine(dispatch(...))`: the round trip, the probability weighting and the gradients.

    1. probs = 1: `combine(dispatch(x))` equals `x` times the number of experts of
       each token. 2. The test plays the experts (`2 z - 1` on every row, so
       order does not matter here) with random probabilities: each token must be
       `sum_e probs[t, e] (2 x_t - 1)`, with the gradients of `x` and of `probs`
       (zero where a token was not routed) against single-process maths.
    """
    case = _with_upstream(_dispatch_case(world_size, ep_size, num_experts, num_tokens, k, hidden, dtype, seed,
                                         pattern), seed)
    results = run_distributed(_dispatch_rank, world_size,
                              args=(AllToAllTokenDispatcher, inputs_only(case, "expected"), "round_trip", backend),
                              timeout=timeout, backend=backend)
    ctx = _case_ctx("combine", case, world_size, num_tokens, pattern)
    for rank, res in enumerate(results):
        x = case["x"][rank].double()
        m = case["maps"][rank]
        assert_close(res["round_trip"], (x * m.sum(1, keepdim=True)).to(dtype),
                     name=f"{ctx}: round trip combine(dispatch(x)) with probs = 1 (x times its number of experts)",
                     rank=rank)
        leaf = x.clone().requires_grad_()
        p = case["probs"][rank].to(dtype).double().requires_grad_()
        y = p.sum(1, keepdim=True) * (2.0 * leaf - 1.0)  # sum_e p[t, e] (2 x_t - 1)
        y.backward(case["g"][rank].double())
        assert_close(res["y"], y.detach().to(dtype), name=f"{ctx}: combine output, experts computing 2 z - 1 "
                     f"(sum_e probs[t, e] (2 x_t - 1))", rank=rank)
        assert_close(res["x_grad"], leaf.grad.to(dtype), name=f"{ctx}: gradient of the tokens", rank=rank)
        assert_close(res["probs_grad"], (p.grad * m).to(dtype),
                     name=f"{ctx}: gradient of probs (0 where a token is not routed)", rank=rank)


def check_dispatcher_communication(AllToAllTokenDispatcher, *, world_size: int = 2, ep_size: int | None = None,
                                   num_experts: int = 4, num_tokens: int = 12, k: int = 2, hidden: int = 4,
                                   dtype=torch.float64, seed: int = 0, pattern: str = "random",
                                   backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """Dispatch + combine + backward: every float all-to-all of forward is mirrored in backward, splits swapped.

    Forward: the integer count exchange first, the dispatch all-to-all (splits:
    rows sent, rows received), optionally one of the probabilities with the
    same splits, the combine all-to-all (the reverse splits). Backward: the
    mirror of each float all-to-all (the splits swapped), in reverse order,
    and nothing else: no count exchange (integers carry no gradient). The
    splits of every all-to-all agree across ranks. A group of one
    communicates nothing.
    """
    case = _with_upstream(_dispatch_case(world_size, ep_size, num_experts, num_tokens, k, hidden, dtype, seed,
                                         pattern), seed)
    results = run_distributed(_dispatch_rank, world_size,
                              args=(AllToAllTokenDispatcher, inputs_only(case, "expected"), "weighted", backend),
                              timeout=timeout, backend=backend)
    ctx = _case_ctx("dispatch -> combine -> backward", case, world_size, num_tokens, pattern)
    check_consistent([r["records"] for r in results], context=ctx)
    findings = Findings()
    for rank, res in enumerate(results):
        with findings.communication():
            _expect_dispatcher_comm(res["records"], rank=rank, ctx=ctx, case=case, exp=case["expected"][rank],
                                    combine=True, backward=True)
    findings.raise_if_any()
    _check_splits_across_ranks(results, case["groups"], ctx)


def _is_float(r) -> bool:
    return r.dtype not in _INT_DTYPES and r.dtype != "bool"


def _expect_dispatcher_comm(records, *, rank, ctx, case, exp, combine, backward):
    """The dispatcher's communication on one rank (see check_dispatcher_communication)."""
    ep, num_experts, hidden, dtype = case["ep"], case["num_experts"], case["hidden"], dtype_name(case["dtype"])
    trace = f"Communication of rank {rank}:\n{format_trace(records, rank)}"
    if ep == 1:
        expect_no_comm(records, rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
        return
    send, recv = tuple(exp["send"]), tuple(exp["recv"])
    fwd = [r for r in records if r.op != "wait" and r.phase == "forward"]
    ints = [r for r in fwd if r.op in ("all_to_all", "all_gather") and r.dtype in _INT_DTYPES]
    floats = [r for r in fwd if r.op == "all_to_all" and _is_float(r)]
    others = [r for r in fwd if r not in ints and r not in floats]
    if len(ints) != 1:
        raise CheckFailure(
            f"rank {rank} ({ctx}): expected the integer token counts to be exchanged once in forward, before the "
            f"tokens (an all-to-all of the {num_experts} counts, or an all-gather of {ep} x {num_experts}); saw "
            f"{len(ints)} integer collective(s). Without the counts a rank cannot know how many rows to expect "
            f"from each rank. {trace}")
    count_numel = math.prod(ints[0].shape)
    if not ((ints[0].op == "all_to_all" and count_numel == num_experts)
            or (ints[0].op == "all_gather" and count_numel == ep * num_experts)):
        raise CheckFailure(f"rank {rank} ({ctx}): the count exchange should be an all-to-all of the "
                           f"{num_experts} counts or an all-gather of {ep * num_experts}; saw {ints[0].describe()}. "
                           f"{trace}")
    if others:
        raise CheckFailure(f"rank {rank} ({ctx}): unexpected communication in forward: "
                           f"{'; '.join(r.describe() for r in others)}. {trace}")
    dispatch = (send, recv, (sum(send), hidden), dtype)
    got = [(tuple(r.input_split_sizes or ()), tuple(r.output_split_sizes or ()), tuple(r.shape), r.dtype)
           for r in floats]
    # the dispatch side: the tokens, and optionally the probabilities (same splits), in either order
    head = got[:-1] if combine else got
    probs_a2a = [g for g in head if g != dispatch and g[:2] == (send, recv)
                 and g[2] in ((sum(send),), (sum(send), 1))]
    want_head = sorted([dispatch] + probs_a2a[:1])
    want = ([g for g in head if g in want_head] if sorted(head) == want_head else [dispatch] + probs_a2a[:1])
    if combine:
        want.append((recv, send, (sum(recv), hidden), dtype))
    if got != want:
        lines = ["dispatch: " + _describe_a2a(send, recv, (sum(send), hidden), case["dtype"])]
        if combine:
            lines.append("combine: " + _describe_a2a(recv, send, (sum(recv), hidden), case["dtype"]))
        raise CheckFailure(
            f"rank {rank} ({ctx}): expected these float all-to-alls in forward (the splits are the rows this rank "
            f"sends to / receives from each rank; one more of the probabilities with the dispatch splits is "
            f"allowed): {'; '.join(lines)}. {trace}")
    if ints[0].seq > floats[0].seq:
        raise CheckFailure(f"rank {rank} ({ctx}): the token counts must be exchanged before the tokens: the "
                           f"receivers size their buffers from them. {trace}")
    if not backward:
        return
    bwd = [r for r in records if r.op != "wait" and r.phase == "backward"]
    got_b = [(tuple(r.input_split_sizes or ()), tuple(r.output_split_sizes or ()), tuple(r.shape), r.dtype)
             for r in bwd]
    mirrors = [(o, i, (sum(o),) + s[1:], d) for i, o, s, d in reversed(want)]
    ok = got_b == mirrors or (len(want) > 2 and sorted(got_b) == sorted(mirrors)
                              and all(r.op == "all_to_all" for r in bwd))
    if not ok or any(r.op != "all_to_all" for r in bwd):
        lines = "; ".join(_describe_a2a(i, o, s, case["dtype"]) for i, o, s, _ in mirrors)
        raise CheckFailure(
            f"rank {rank} ({ctx}): every float all-to-all of forward must be mirrored in backward with its splits "
            f"swapped (and the count exchange must not: integers carry no gradient). Expected in backward: "
            f"{lines}. {trace}")


def _check_splits_across_ranks(results, groups, ctx) -> None:
    """From the ledgers: for each all-to-all, what rank i sends to j is what j expects from i."""
    for members in groups:
        per_rank = [[r for r in results[g]["records"] if r.op == "all_to_all"] for g in members]
        for n in range(min(len(p) for p in per_rank)):
            recs = [p[n] for p in per_rank]
            if any(not r.input_split_sizes or not r.output_split_sizes for r in recs):
                continue  # equal splits
            for i, ri in enumerate(recs):
                for j, rj in enumerate(recs):
                    if ri.input_split_sizes[j] != rj.output_split_sizes[i]:
                        raise CheckFailure(
                            f"{ctx}: all-to-all #{n + 1} ({ri.phase}): rank {members[i]} sends "
                            f"{ri.input_split_sizes[j]} rows to rank {members[j]}, which expects "
                            f"{rj.output_split_sizes[i]}: the split sizes disagree across ranks.")
