"""Public checks of assignment 05, exercises 1, 2 and 5: routing on one device.

    from autograder.checks.expert_parallel import check_topk_router, check_permute
    check_topk_router(topk_router)
    check_permute(permute)

The top-k router and the auxiliary load-balancing loss, `permute` and `unpermute`, and token dropping
with a capacity factor: each against the references of common.py, the student's code run in one rank
process.
"""

from __future__ import annotations

import math

import torch

from autograder.runtime.compare import CheckFailure, assert_close, dtype_name
from autograder.runtime.dist import run_distributed

from .common import (
    _TIMEOUT, _check_tensor, _compute_dtype, _cpu, _gaps_ok, _map_from, _ref_aux, _ref_capacity, _ref_probs, _ref_topk,
    _require, _unpack,
)

__all__ = ["check_topk_router", "check_load_balancing_loss", "check_permute", "check_unpermute", "check_token_dropping"]


# ---------------------------------------------------------------------------
# Exercise 1: the router and the auxiliary loss (single process)
# ---------------------------------------------------------------------------

def _router_logits(gen, num_tokens, num_experts, k, ties):
    if ties:  # dyadic values with many exact ties; the first rows all equal, then a tie at the k boundary
        logits = torch.randint(-2, 3, (num_tokens, num_experts), generator=gen).to(torch.float64) / 2
        logits[0] = 0.5
        if num_tokens > 1 and num_experts > k:
            logits[1] = -1.0
            logits[1, num_experts - 1] = 1.0
            logits[1, k - 1] = logits[1, k] = 0.5  # expert k-1 must win the tie against expert k
        return logits
    for _ in range(200):
        logits = torch.randn(num_tokens, num_experts, generator=gen, dtype=torch.float64) * 2
        if all(_gaps_ok(row, k, 1e-3) for row in logits.tolist()):
            return logits
    raise RuntimeError("could not draw logits without near-ties")


def _first_bad_row(got_map: torch.Tensor, want_map: torch.Tensor):
    bad = (got_map != want_map).any(dim=1).nonzero().flatten()
    return int(bad[0]) if len(bad) else None


def _one_rank(program, *args, timeout: float = _TIMEOUT):
    """Run a single-process exercise in one rank process, as every check does: the student's code runs there,
    the data (outputs, gradients) comes back, the verdict is made here (spec 3.2)."""
    return run_distributed(program, 1, args=args, timeout=timeout)[0]


def _router_program(rank, world_size, topk_router, logits, k, g):
    logits = logits.clone().requires_grad_()
    before = logits.detach().clone()
    probs, routing_map = _unpack(topk_router(logits, k=k), 2, "topk_router(logits, k=k)")
    out = {"probs": _cpu(probs), "map": _cpu(routing_map), "modified": not torch.equal(logits.detach(), before),
           "requires_grad": isinstance(probs, torch.Tensor) and probs.requires_grad, "grad": None}
    if g is not None and out["requires_grad"]:
        (grad,) = torch.autograd.grad((probs * g.to(probs.dtype)).sum(), logits, allow_unused=True)
        out["grad"] = _cpu(grad)
    return out


def check_topk_router(topk_router, *, num_tokens: int = 8, num_experts: int = 4, k: int = 2,
                      dtype=torch.float64, seed: int = 0, ties: bool = False, timeout: float = _TIMEOUT) -> None:
    """`topk_router(logits, k=k)` against plain-Python top-k selection and a float64 softmax.

    Checked: `routing_map` is bool `[T, E]` with exactly the k largest logits of
    each token (ties toward the lower expert index: `ties=True` draws many exact
    ties); `probs` is `[T, E]` in `promote_types(dtype, float32)`, the softmax
    over the selected logits and 0 elsewhere; for k >= 2 the gradient of the
    logits through `probs` (at k = 1 every probability is exactly 1); the input
    is not modified.
    """
    _require(1 <= k <= num_experts, f"k ({k}) must be in [1, num_experts = {num_experts}]")
    gen = torch.Generator().manual_seed(seed)
    logits64 = _router_logits(gen, num_tokens, num_experts, k, ties)
    ctx = f"topk_router(logits [{num_tokens}, {num_experts}] {dtype_name(dtype)}, k={k})"
    logits = logits64.to(dtype)
    g = torch.randn(num_tokens, num_experts, generator=gen, dtype=torch.float64) if k >= 2 else None
    res = _one_rank(_router_program, topk_router, logits, k, g, timeout=timeout)
    probs, routing_map = res["probs"], res["map"]
    cdtype = _compute_dtype(dtype)
    _check_tensor(routing_map, f"{ctx}: routing_map", (num_tokens, num_experts), dtype=torch.bool)
    selected = _ref_topk(logits.to(torch.float64), k)
    want = _map_from(selected, num_tokens, num_experts)
    t = _first_bad_row(routing_map, want)
    if t is not None:
        got = routing_map[t].nonzero().flatten().tolist()
        raise CheckFailure(f"{ctx}: token {t} is routed to experts {got}, expected {sorted(selected[t])} (its logits "
                           f"{[round(v, 4) for v in logits64[t].tolist()]}: the k largest, ties toward the lower "
                           f"expert index; torch.topk's tie order is undefined, a stable sort is not)")
    _check_tensor(probs, f"{ctx}: probs", (num_tokens, num_experts), dtype=cdtype)
    ref = _ref_probs(logits, selected)
    assert_close(probs, ref.to(cdtype), name=f"{ctx}: probs (softmax over the selected logits, 0 elsewhere)")
    if res["modified"]:
        raise CheckFailure(f"{ctx}: the logits were modified in place")
    if k >= 2:
        if not res["requires_grad"]:
            raise CheckFailure(f"{ctx}: probs does not require grad: the router weight would get no gradient "
                               f"through the probabilities (detach(), .data, or a tensor rebuilt from indices?)")
        if res["grad"] is None:
            raise CheckFailure(f"{ctx}: probs does not depend on the logits in the autograd graph")
        leaf = logits.to(torch.float64).requires_grad_()
        (ref_grad,) = torch.autograd.grad((_ref_probs(leaf, selected) * g).sum(), leaf)
        assert_close(res["grad"], ref_grad.to(dtype), name=f"{ctx}: gradient of the logits through probs")


def _aux_program(rank, world_size, load_balancing_loss, logits, routing_map, k):
    logits = logits.clone().requires_grad_()
    loss = load_balancing_loss(logits, routing_map.clone(), k=k)
    out = {"loss": _cpu(loss), "requires_grad": isinstance(loss, torch.Tensor) and loss.requires_grad, "grad": None}
    if out["requires_grad"] and loss.dim() == 0:
        (grad,) = torch.autograd.grad(loss, logits, allow_unused=True)
        out["grad"] = _cpu(grad)
    return out


def check_load_balancing_loss(load_balancing_loss, *, num_tokens: int = 8, num_experts: int = 4, k: int = 2,
                              dtype=torch.float64, seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """`load_balancing_loss(logits, routing_map, k=k)` = E / (k T^2) sum_i P_i count_i, value and gradient.

    The routing map is NOT the top-k of the logits (as after a different
    routing, or an expert bias): counts must come from the given map. One
    expert receives no token. The loss is a 0-d tensor in
    `promote_types(dtype, float32)`, differentiable w.r.t. the logits.
    """
    _require(1 <= k < num_experts, f"k ({k}) must be in [1, num_experts = {num_experts}) (one expert gets none)")
    gen = torch.Generator().manual_seed(seed)
    logits64 = torch.randn(num_tokens, num_experts, generator=gen, dtype=torch.float64) * 2
    selected = [torch.randperm(num_experts - 1, generator=gen)[:k].tolist() for _ in range(num_tokens)]
    routing_map = _map_from(selected, num_tokens, num_experts)  # expert E-1 gets nothing
    ctx = (f"load_balancing_loss(logits [{num_tokens}, {num_experts}] {dtype_name(dtype)}, a routing map with "
           f"k={k}; counts per expert {routing_map.sum(0).tolist()})")
    logits = logits64.to(dtype)
    res = _one_rank(_aux_program, load_balancing_loss, logits, routing_map, k, timeout=timeout)
    cdtype = _compute_dtype(dtype)
    _check_tensor(res["loss"], ctx, (), dtype=cdtype)
    if not res["requires_grad"]:
        raise CheckFailure(f"{ctx} does not require grad: the autograd graph was cut (detach(), .data, "
                           f"torch.no_grad() or a tensor rebuilt from numbers?)")
    leaf = logits.to(torch.float64).requires_grad_()
    ref = _ref_aux(leaf, routing_map, k)
    (ref_grad,) = torch.autograd.grad(ref, leaf)
    assert_close(res["loss"], ref.detach().to(cdtype), name=f"{ctx}: the loss")
    assert_close(res["grad"], ref_grad.to(dtype), name=f"{ctx}: gradient of the logits")


# ---------------------------------------------------------------------------
# Exercise 2: permute and unpermute (single process)
# ---------------------------------------------------------------------------

def _random_routing(gen, num_tokens, num_experts, k, *, allowed=None, drop=0.0, hot=None):
    """A bool [T, E] map with k distinct experts per token from `allowed`, some selections dropped."""
    allowed = list(range(num_experts)) if allowed is None else list(allowed)
    m = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    for t in range(num_tokens):
        pick = [allowed[i] for i in torch.randperm(len(allowed), generator=gen)[:k].tolist()]
        if hot is not None and hot not in pick and float(torch.rand((), generator=gen)) < 0.6:
            pick[-1] = hot
        for e in pick:
            if drop == 0.0 or float(torch.rand((), generator=gen)) >= drop:
                m[t, e] = True
    return m


def _permute_case(num_tokens, num_experts, k, hidden, dtype, seed, drop):
    _require(1 <= k < num_experts, f"k ({k}) must be below num_experts ({num_experts}): one expert gets none")
    gen = torch.Generator().manual_seed(seed)
    routing_map = _random_routing(gen, num_tokens, num_experts, k, allowed=range(num_experts - 1), drop=drop)
    m = routing_map.tolist()
    order = [(t, e) for e in range(num_experts) for t in range(num_tokens) if m[t][e]]  # expert-major, stable
    tokens = (torch.arange(num_tokens, dtype=torch.float64).unsqueeze(1)
              + torch.arange(hidden, dtype=torch.float64) / (2 * hidden)).to(dtype)  # row t holds t, t + ...
    return gen, routing_map, order, tokens


def _permute_program(rank, world_size, permute, tokens, routing_map, g):
    leaf = tokens.clone().requires_grad_()
    permuted, sorted_indices = _unpack(permute(leaf, routing_map.clone()), 2, "permute(tokens, routing_map)")
    out = {"permuted": _cpu(permuted), "sorted_indices": _cpu(sorted_indices), "grad": None,
           "requires_grad": isinstance(permuted, torch.Tensor) and permuted.requires_grad}
    if out["requires_grad"] and tuple(permuted.shape) == tuple(g.shape):
        (grad,) = torch.autograd.grad(permuted, leaf, g, allow_unused=True)
        out["grad"] = _cpu(grad)
    return out


def check_permute(permute, *, num_tokens: int = 50, num_experts: int = 4, k: int = 2, hidden: int = 3,
                  dtype=torch.float64, seed: int = 0, drop: float = 0.0, timeout: float = _TIMEOUT) -> None:
    """`permute(tokens, routing_map)` -> `(permuted [N, h], sorted_indices [N])`, expert-major and stable.

    Row i of the output is the token `sorted_indices[i]`; rows are grouped by
    expert (0, 1, ...), and within an expert keep the token order. About 100
    rows by default: an unstable sort keeps the order on CPU for ~16 elements,
    not for 100. The last expert gets no token; with `drop` > 0 some tokens
    have fewer than k experts (after capacity drops). Also checked: the
    gradient of the tokens (each token collects the gradients of its rows).
    """
    gen, routing_map, order, tokens = _permute_case(num_tokens, num_experts, k, hidden, dtype, seed, drop)
    n = len(order)
    ctx = f"permute(tokens [{num_tokens}, {hidden}] {dtype_name(dtype)}, routing_map [{num_tokens}, {num_experts}]"\
          f", {n} routed rows)"
    g = torch.randn(n, hidden, generator=gen, dtype=torch.float64).to(dtype)
    res = _one_rank(_permute_program, permute, tokens, routing_map, g, timeout=timeout)
    permuted, sorted_indices = res["permuted"], res["sorted_indices"]
    _check_tensor(sorted_indices, f"{ctx}: sorted_indices", (n,))
    if sorted_indices.dtype not in (torch.int64, torch.int32):
        raise CheckFailure(f"{ctx}: sorted_indices has dtype {dtype_name(sorted_indices.dtype)}, expected int64")
    want = [t for t, _ in order]
    got = sorted_indices.tolist()
    if got != want:
        i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        e = order[i][1]
        first = next(j for j, (_, ee) in enumerate(order) if ee == e)
        raise CheckFailure(
            f"{ctx}: sorted_indices[{i}] is token {got[i]}, expected token {want[i]}. Row {i} is row {i - first} "
            f"of expert {e}, whose tokens are {[t for t, ee in order if ee == e][:12]}...: rows are grouped by "
            f"expert (0, 1, ...), and within an expert the tokens stay in order (sort stably).")
    _check_tensor(permuted, f"{ctx}: permuted", (n, hidden), dtype=dtype)
    if not res["requires_grad"]:
        raise CheckFailure(f"{ctx}: permuted does not require grad: the autograd graph was cut (detach(), .data, "
                           f"torch.no_grad() or a tensor rebuilt from numbers?)")
    assert_close(permuted, tokens[want], name=f"{ctx}: permuted rows (token sorted_indices[i] in row i)")
    ref = torch.zeros(num_tokens, hidden, dtype=torch.float64).index_add(0, torch.tensor(want), g.double())
    assert_close(res["grad"], ref.to(dtype), name=f"{ctx}: gradient of the tokens (the sum of their rows' gradients)")


def _unpermute_program(rank, world_size, unpermute, rows, idx, probs, routing_map, g, tokens):
    out = {}
    for weighted in (True, False):
        r = rows.clone().requires_grad_()
        p = probs.clone().requires_grad_() if weighted else None
        y = unpermute(r, idx.clone(), p, routing_map.clone())
        res = {"out": _cpu(y), "requires_grad": isinstance(y, torch.Tensor) and y.requires_grad,
               "grad_rows": None, "grad_probs": None}
        if res["requires_grad"] and tuple(y.shape) == tuple(g.shape):
            grads = torch.autograd.grad(y, (r, p) if weighted else (r,), g.to(y.dtype), allow_unused=True)
            res["grad_rows"] = _cpu(grads[0])
            res["grad_probs"] = _cpu(grads[1]) if weighted else None
        out[weighted] = res
    out["round_trip"] = _cpu(unpermute(tokens[idx], idx.clone(), routing_map.to(tokens.dtype), routing_map.clone()))
    return out


def check_unpermute(unpermute, *, num_tokens: int = 50, num_experts: int = 4, k: int = 2, hidden: int = 3,
                    dtype=torch.float64, seed: int = 0, drop: float = 0.0, timeout: float = _TIMEOUT) -> None:
    """`unpermute(permuted, sorted_indices, probs, routing_map)` -> `[T, h]`, the weighted sum of each token's rows.

    Row i (token `sorted_indices[i]`, expert from permute's expert-major order)
    is added to its token with weight `probs[token, expert]`; with `probs=None`
    unweighted. Checked: the output, the gradients of the rows and of `probs`,
    the round trip `unpermute(permute(x)) == x * (number of experts of each token)`.
    """
    gen, routing_map, order, tokens = _permute_case(num_tokens, num_experts, k, hidden, dtype, seed, drop)
    n = len(order)
    idx = torch.tensor([t for t, _ in order], dtype=torch.long)
    ctx = f"unpermute({n} rows of {hidden} {dtype_name(dtype)}, routing_map [{num_tokens}, {num_experts}])"
    rows64 = torch.randn(n, hidden, generator=gen, dtype=torch.float64)
    probs64 = torch.rand(num_tokens, num_experts, generator=gen, dtype=torch.float64) * routing_map
    g64 = torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float64)
    results = _one_rank(_unpermute_program, unpermute, rows64.to(dtype), idx, probs64.to(dtype), routing_map,
                        g64.to(dtype), tokens, timeout=timeout)

    def reference(rows, probs):
        out = [torch.zeros(hidden, dtype=torch.float64) for _ in range(num_tokens)]
        for i, (t, e) in enumerate(order):
            out[t] = out[t] + (probs[t, e] if probs is not None else 1.0) * rows[i]
        return torch.stack(out)

    for weighted in (True, False):
        case = f"{ctx}, probs={'given' if weighted else 'None'}"
        res = results[weighted]
        _check_tensor(res["out"], case, (num_tokens, hidden), dtype=dtype)
        if not res["requires_grad"]:
            raise CheckFailure(f"{case}: the output does not require grad: the autograd graph was cut (detach(), "
                               f".data, torch.no_grad() or a tensor rebuilt from numbers?)")
        r_rows = rows64.clone().requires_grad_()
        r_probs = probs64.clone().requires_grad_() if weighted else None
        ref = reference(r_rows, r_probs)
        assert_close(res["out"], ref.detach().to(dtype), name=f"{case}: output (each token's rows summed"
                     + (", weighted by probs[token, expert])" if weighted else ")"))
        ref_grads = torch.autograd.grad(ref, (r_rows, r_probs) if weighted else (r_rows,), g64)
        assert_close(res["grad_rows"], ref_grads[0].to(dtype), name=f"{case}: gradient of the permuted rows")
        if weighted:
            assert_close(res["grad_probs"], ref_grads[1].to(dtype), name=f"{case}: gradient of probs")
    expected = tokens.double() * routing_map.sum(1, keepdim=True).double()
    assert_close(results["round_trip"], expected.to(dtype),
                 name=f"{ctx}: round trip unpermute(permute(x)) with probs = 1 (x times its number of experts)")


# ---------------------------------------------------------------------------
# Exercise 5: token dropping (single process)
# ---------------------------------------------------------------------------

def _drop_program(rank, world_size, apply_router_token_dropping, probs, routing_map, k, capacity_factor, g):
    probs = probs.clone().requires_grad_()
    out_probs, kept = _unpack(apply_router_token_dropping(probs, routing_map.clone(), k=k,
                                                          capacity_factor=capacity_factor), 2,
                              "apply_router_token_dropping(probs, routing_map, k=k, capacity_factor=cf)")
    out = {"probs": _cpu(out_probs), "kept": _cpu(kept), "grad": None,
           "requires_grad": isinstance(out_probs, torch.Tensor) and out_probs.requires_grad}
    if out["requires_grad"] and tuple(out_probs.shape) == tuple(g.shape):
        (grad,) = torch.autograd.grad(out_probs, probs, g, allow_unused=True)
        out["grad"] = _cpu(grad)
    return out


def _cut(values: list[float], keep: int, eps: float) -> str:
    """How the `keep` largest of `values` are cut from the rest: "clean" (a gap above eps), "tie" (exactly
    equal values straddle the cut, every other value more than eps away from them), or "near" (values
    within eps but not equal: float32 rounding could reorder them)."""
    if keep <= 0 or keep >= len(values):
        return "clean"
    v = sorted(values, reverse=True)
    at = v[keep - 1]
    close = [x for x in v if abs(x - at) <= eps]
    if len(close) == 1 or (v[keep] != at and all(x == at for x in close)):
        return "clean" if v[keep - 1] - v[keep] > eps else "near"
    return "tie" if all(x == at for x in close) else "near"


def _dropping_case(gen, num_tokens, num_experts, k, limit, ties):
    """Logits whose routing has no near-tie anywhere (top-k or capacity cut), and with `ties` an exact tie
    across the capacity cut of at least one expert: a later token repeats the logits of the last token an
    expert keeps, so the two have bit-identical probabilities on both sides of the cut (in any dtype)."""
    for _ in range(500):
        logits = torch.randn(num_tokens, num_experts, generator=gen, dtype=torch.float64) * 2
        if ties:
            selected = _ref_topk(logits, k)
            probs64 = _ref_probs(logits, selected).tolist()
            e = int(torch.randint(num_experts, (), generator=gen))
            ranked = sorted((t for t in range(num_tokens) if e in selected[t]), key=lambda t: (-probs64[t][e], t))
            if len(ranked) <= limit:
                continue
            last_kept = ranked[limit - 1]
            later = [t for t in range(last_kept + 1, num_tokens) if t not in ranked[:limit]]
            if not later:
                continue
            logits[later[int(torch.randint(len(later), (), generator=gen))]] = logits[last_kept]
        if not all(_gaps_ok(row, k, 1e-3) for row in logits.tolist()):
            continue
        selected = _ref_topk(logits, k)
        routing_map = _map_from(selected, num_tokens, num_experts)
        probs64 = _ref_probs(logits, selected)
        cuts = [_cut([p for p, m in zip(col, mc) if m], limit, 1e-4)
                for col, mc in zip(probs64.t().tolist(), routing_map.t().tolist())]
        if "near" not in cuts and (("tie" in cuts) == ties):
            return routing_map, probs64, [e for e, c in enumerate(cuts) if c == "tie"]
    raise RuntimeError("could not draw a routing with the requested capacity cut")


def check_token_dropping(apply_router_token_dropping, *, num_tokens: int = 12, num_experts: int = 4, k: int = 2,
                         capacity_factor: float = 1.0, dtype=torch.float64, seed: int = 0,
                         ties: bool = False, timeout: float = _TIMEOUT) -> None:
    """`apply_router_token_dropping(probs, routing_map, k=k, capacity_factor=cf)` -> `(probs * kept, kept)`.

    Each expert keeps its `ceil(T k / E cf)` highest-probability tokens, the
    earlier token among equal probabilities. With `ties=True` at least one
    expert has an exact tie across its capacity cut: a later token repeats the
    logits of the last token the expert keeps, so their probabilities are
    bit-identical in any dtype, one kept and one dropped (a sort that is not
    stable, or `torch.topk`, may keep the later one; more than 16 tokens make
    CPU sorts leave their insertion sort). Otherwise, and everywhere else, no
    two probabilities are within 1e-4 of each other across a cut, so rounding
    cannot reorder them. Kept probabilities are not renormalised; the gradient
    reaches `probs` only where kept.
    """
    gen = torch.Generator().manual_seed(seed)
    limit = math.ceil(num_tokens * k / num_experts * capacity_factor)  # what each expert keeps
    routing_map, probs64, tied = _dropping_case(gen, num_tokens, num_experts, k, limit, ties)
    ctx = (f"apply_router_token_dropping(probs [{num_tokens}, {num_experts}] {dtype_name(dtype)}, k={k}, "
           f"capacity_factor={capacity_factor}): capacity {limit} per expert")
    g = torch.randn(num_tokens, num_experts, generator=gen, dtype=torch.float64).to(dtype)
    res = _one_rank(_drop_program, apply_router_token_dropping, probs64.to(dtype), routing_map, k, capacity_factor,
                    g, timeout=timeout)
    out_probs, kept = res["probs"], res["kept"]
    want = _ref_capacity(probs64, routing_map, k, capacity_factor)
    _check_tensor(kept, f"{ctx}: the kept routing map", want.shape, dtype=torch.bool)
    if not torch.equal(kept.cpu(), want):
        e = int((kept.cpu() != want).any(0).nonzero()[0])
        cand = [(t, round(probs64[t, e].item(), 4)) for t in range(num_tokens) if routing_map[t, e]]
        raise CheckFailure(
            f"{ctx}: expert {e} keeps tokens {kept[:, e].nonzero().flatten().tolist()}, expected "
            f"{want[:, e].nonzero().flatten().tolist()}. Its candidates (token, probability): {cand}: keep the "
            f"{limit} highest probabilities, the earlier token among equal ones"
            + (" (this expert has an exact tie across its cut: sort with stable=True; torch.topk's order among "
               "equal values is undefined)." if e in tied else "."))
    _check_tensor(out_probs, f"{ctx}: probs", tuple(probs64.shape), dtype=dtype)
    if not res["requires_grad"]:
        raise CheckFailure(f"{ctx}: the returned probs do not require grad: the router would get no gradient "
                           f"through them (detach() or a tensor rebuilt from numbers?)")
    assert_close(out_probs, (probs64 * want).to(dtype), name=f"{ctx}: probs (kept ones unchanged, not "
                 f"renormalised; 0 for dropped)")
    assert_close(res["grad"], g * want, name=f"{ctx}: gradient of probs (only where kept)")
