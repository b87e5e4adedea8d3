"""Public checks of assignment 05, exercise 6: the MoE layer against the dense reference, and the picture
of its dispatch.

    from autograder.checks.expert_parallel import check_moe_layer
    check_moe_layer(MoELayer, world_size=2, num_experts=4, k=2)

Every rank runs the student's layer on its tokens; output, auxiliary loss and every gradient are compared
with `dense_moe_reference` (one process, float64), and the communication with what the routing implies.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from autograder.checks import inputs_only
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name
from autograder.runtime.dist import rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent
from autograder.lessons.volume import all_to_all_traffic

from .common import (
    AllToAllGuard, _TIMEOUT, _check_tensor, _compute_dtype, _cpu, _ep_groups, _ep_named, _gaps_ok, _map_from, _my_group,
    _ref_probs, _ref_topk, _require, _unpack, dense_moe_reference,
)
from .dispatch import _check_splits_across_ranks, _dispatch_case, _expect_dispatcher_comm

__all__ = ["check_moe_layer", "plot_dispatch"]


# ---------------------------------------------------------------------------
# Exercise 6: the MoE layer against the dense reference
# ---------------------------------------------------------------------------

def _moe_case(world_size, ep_size, num_experts, k, hidden, ffn, num_tokens, capacity_factor, dtype, seed, pattern,
              accept=None):
    """Tokens, router and expert weights of every rank, drawn until no near-tie decides a routing (and
    `accept(xs, router_weight)`, float64 drafts, agrees: exercise 7 needs more of a case)."""
    groups = _ep_groups(world_size, ep_size)
    ep = len(groups[0])
    local = num_experts // ep
    _require(num_experts % ep == 0, f"num_experts ({num_experts}) must be divisible by {_ep_named(ep, ep_size)}")
    _require(pattern in ("random", "starve_expert", "starve_rank", "ties"), f"unknown pattern {pattern!r}")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(200):
        if pattern == "ties":  # exact dyadic arithmetic: duplicated router rows tie exactly, in any dtype
            wr = torch.randint(-4, 5, (num_experts, hidden), generator=gen).to(torch.float64) / 4
            wr[1] = wr[0]
            wr[num_experts - 1] = wr[num_experts - 2]
            xs = [torch.randint(-2, 3, (num_tokens, hidden), generator=gen).to(torch.float64) / 2
                  for _ in range(world_size)]
        else:
            wr = torch.randn(num_experts, hidden, generator=gen, dtype=torch.float64)
            xs = [torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float64) for _ in range(world_size)]
            starved = [num_experts - 1] if pattern == "starve_expert" else \
                list(range((ep - 1) * local, num_experts)) if pattern == "starve_rank" else []
            if starved:
                _require(k <= num_experts - len(starved), f"k ({k}) too large for pattern {pattern!r}")
                for x in xs:
                    x[:, 0] = 1.0  # a constant feature: the starved experts' logits are pushed far down
                wr[starved, 0] = -30.0
        ok = True
        for x in xs:
            logits = x @ wr.t()
            if pattern != "ties" and not all(_gaps_ok(row, k, 1e-3) for row in logits.tolist()):
                ok = False
            if capacity_factor is not None and ok:
                sel = _ref_topk(logits, k)
                m, p = _map_from(sel, num_tokens, num_experts), _ref_probs(logits, sel)
                cap = math.ceil(num_tokens * k / num_experts * capacity_factor)
                ok = all(_gaps_ok([v for v, b in zip(col, mc) if b], cap, 1e-4)
                         for col, mc in zip(p.t().tolist(), m.t().tolist()))
        if ok and accept is not None:
            ok = accept(xs, wr)
        if ok:
            break
    else:
        if accept is not None:
            raise RuntimeError(f"check parameters: no case of {num_tokens} tokens, {num_experts} experts, k={k} "
                               f"on {world_size} ranks found in 200 draws (seed {seed}): try another seed")
    experts = [(torch.randn(ffn, hidden, generator=gen, dtype=torch.float64) / math.sqrt(hidden),
                torch.randn(hidden, ffn, generator=gen, dtype=torch.float64) / math.sqrt(ffn))
               for _ in range(num_experts)]
    gs = [torch.randn(num_tokens, hidden, generator=gen, dtype=torch.float64) for _ in range(world_size)]
    return {"groups": groups, "ep": ep, "local": local, "num_experts": num_experts, "k": k, "hidden": hidden,
            "ffn": ffn, "cf": capacity_factor, "dtype": dtype, "wr": wr.to(dtype),
            "experts": [(a.to(dtype), b.to(dtype)) for a, b in experts],
            "x": [x.to(dtype) for x in xs], "g": [g.to(dtype) for g in gs]}


def _moe_reference(case, aux_coeff):
    """Per rank: output, aux loss, input grad, router grad (its own tokens); per expert: grads summed over its group."""
    ref = {"out": {}, "aux": {}, "x_grad": {}, "router_grad": {}, "expert_grads": {}, "kept": {}}
    for members in case["groups"]:
        ews = [(a.double().clone().requires_grad_(), b.double().clone().requires_grad_()) for a, b in case["experts"]]
        for r in members:
            x = case["x"][r].double().clone().requires_grad_()
            wr = case["wr"].double().clone().requires_grad_()
            out, aux, kept = dense_moe_reference(x, wr, ews, k=case["k"], capacity_factor=case["cf"])
            ((out * case["g"][r].double()).sum() + aux_coeff * aux).backward()
            ref["out"][r], ref["aux"][r], ref["kept"][r] = out.detach(), aux.detach(), kept
            ref["x_grad"][r], ref["router_grad"][r] = x.grad, wr.grad
        for r in members:
            ref["expert_grads"][r] = [(a.grad, b.grad) for a, b in ews]
    return ref


def _moe_layer_on_rank(rank, cls, case, dev):
    """The student's layer on this rank, built from the case's master weights; (layer, router weight, experts)."""
    group, members = _my_group(rank, case["groups"])
    layer = cls(case["hidden"], case["ffn"], case["num_experts"], k=case["k"], ep_group=group,
                master_router_weight=case["wr"].to(dev),
                master_expert_weights=[(a.to(dev), b.to(dev)) for a, b in case["experts"]],
                capacity_factor=case["cf"])
    router = getattr(getattr(layer, "router", None), "weight", None)
    experts = getattr(layer, "local_experts", None)
    if not isinstance(router, torch.Tensor) or experts is None \
            or not all(hasattr(e, "linear_fc1") and hasattr(e, "linear_fc2") for e in experts):
        raise CheckFailure(f"rank {rank}: MoELayer must hold the router as .router (with .weight [E, h]) and its "
                           f"{case['local']} local experts as .local_experts, a list of ExpertMLP (each with "
                           f".linear_fc1 and .linear_fc2)")
    i = members.index(rank)
    if len(experts) != case["local"]:
        raise CheckFailure(f"rank {rank} (rank {i} of its EP group {members}): MoELayer.local_experts holds "
                           f"{len(experts)} experts, expected {case['local']}: experts [{i * case['local']}, "
                           f"{(i + 1) * case['local']}) of the {case['num_experts']} (use the rank in ep_group, "
                           f"not the global rank)")
    return layer, router, experts


def _run_moe_layer(rank, cls, case, aux_coeff, backend, ledger, instrument=None):
    """Build the layer, run forward and backward under `ledger` (and the guard); the data to send back.
    `instrument(layer, ledger)`, if given, runs first (exercise 7 marks the experts' compute)."""
    dev = rank_device(rank, backend)
    layer, router, experts = _moe_layer_on_rank(rank, cls, case, dev)
    if instrument is not None:
        instrument(layer, ledger)
    name = case.get("layer_name", "MoELayer")
    x = case["x"][rank].to(dev).clone().requires_grad_()
    with ledger, AllToAllGuard():
        output, aux = _unpack(layer(x), 2, f"{name}.forward", rank)
        _check_tensor(output, f"{name} output", x.shape, dtype=case["dtype"], rank=rank, grad=True)
        _check_tensor(aux, f"{name} aux_loss", (), rank=rank, grad=True)
        ((output * case["g"][rank].to(dev)).sum() + aux_coeff * aux).backward()
    grad = lambda p: _cpu(p.grad)  # noqa: E731
    return {"out": _cpu(output), "aux": _cpu(aux), "x_grad": _cpu(x.grad), "router_grad": grad(router),
            "expert_grads": [(grad(e.linear_fc1.weight), grad(e.linear_fc2.weight)) for e in experts],
            "records": ledger.records}


def _moe_rank(rank, world_size, cls, case, aux_coeff, backend):
    return _run_moe_layer(rank, cls, case, aux_coeff, backend, CommLedger())


def check_moe_layer(MoELayer, *, world_size: int = 2, ep_size: int | None = None, num_experts: int = 4, k: int = 2,
                    hidden: int = 6, ffn: int = 8, num_tokens: int = 12, capacity_factor=None, dtype=torch.float64,
                    seed: int = 0, pattern: str = "random", aux_coeff: float = 0.5, backend: str = "gloo",
                    timeout: float = _TIMEOUT) -> None:
    """The MoE layer on every rank against `dense_moe_reference`, numbers and communication.

    Each rank runs `output, aux = layer(x_r)` on its own tokens and back-propagates
    `<output, g_r> + aux_coeff * aux`. Checked per rank: output, aux loss,
    input gradient, the router weight's gradient (this rank's tokens only: the
    router is replicated, its gradient all-reduced elsewhere; through the
    probabilities and the aux loss), and each local expert's fc1/fc2 weight
    gradient (the sum over every rank's tokens routed to it; zero, not None,
    for an expert that gets nothing). Communication: one integer count
    exchange, the dispatch and the combine all-to-alls in forward, their
    mirrors in backward. Patterns: "random", "starve_expert", "starve_rank",
    "ties" (duplicated router rows: exact ties, lower expert index wins).
    With `capacity_factor` each expert keeps at most ceil(T k / E cf) tokens
    per source rank, the highest probabilities (no ties at the boundary).
    """
    case = _moe_case(world_size, ep_size, num_experts, k, hidden, ffn, num_tokens, capacity_factor, dtype, seed,
                     pattern)
    ref = _moe_reference(case, aux_coeff)
    results = run_distributed(_moe_rank, world_size, args=(MoELayer, case, aux_coeff, backend), timeout=timeout,
                              backend=backend)
    ctx = (f"MoELayer({hidden}, {ffn}, {num_experts}, k={k}"
           + (f", capacity_factor={capacity_factor}" if capacity_factor is not None else "")
           + f"), world size {world_size}" + (f" (EP groups {case['groups']})" if len(case["groups"]) > 1 else "")
           + f", {num_tokens} tokens per rank, {dtype_name(dtype)}, pattern {pattern!r}")
    _compare_moe(case, ref, results, ctx, expect_comm=_expect_moe_comm)


def _compare_moe(case, ref, results, ctx, *, expect_comm) -> None:
    """Every rank's numbers against the dense reference and its communication (`expect_comm(records, rank=,
    ctx=, case=, members=, group_rank=, kept=)`), reported together; then the splits across ranks."""
    check_consistent([r["records"] for r in results], context=ctx)
    dtype = case["dtype"]
    cd = _compute_dtype(dtype)
    findings = Findings()
    for members in case["groups"]:
        for i, rank in enumerate(members):
            res = results[rank]
            with findings.communication():
                expect_comm(res["records"], rank=rank, ctx=ctx, case=case, members=members, group_rank=i,
                            kept=ref["kept"])
            with findings.numbers():
                items = [("output", res["out"], ref["out"][rank].to(dtype)),
                         ("aux_loss (counts before drops)", res["aux"], ref["aux"][rank].to(cd)),
                         ("input gradient", res["x_grad"], ref["x_grad"][rank].to(dtype)),
                         ("router.weight.grad (this rank's tokens, through probs and aux_loss)", res["router_grad"],
                          ref["router_grad"][rank].to(dtype))]
                for e in range(case["local"]):
                    ge = i * case["local"] + e
                    for which, got, want in zip(("linear_fc1", "linear_fc2"), res["expert_grads"][e],
                                                ref["expert_grads"][rank][ge]):
                        items.append((f"local_experts[{e}].{which}.weight.grad (global expert {ge}: every rank's "
                                      f"tokens for it; zeros if none)", got, want.to(dtype)))
                _compare_all(items, rank=rank, ctx=ctx)
    findings.raise_if_any()
    _check_splits_across_ranks(results, case["groups"], ctx)


def _compare_all(items, *, rank, ctx) -> None:
    """Compare every (name, got, expected); on failure, the first mismatch and which tensors are right or wrong."""
    wrong, right, first = [], [], None
    for name, got, want in items:
        try:
            assert_close(got, want, name=f"{ctx}: {name}", rank=rank)
            right.append(name.split(" (")[0])
        except CheckFailure as exc:
            wrong.append(name.split(" (")[0])
            first = first or str(exc)
    if first:
        hint = ""
        if "output" in right and "router.weight.grad" in wrong and not any("local_experts" in w for w in wrong):
            hint = (" The output is right but the router's gradient is not: the gradient through the probabilities "
                    "is lost or wrong (probs computed from detached logits?).")
        raise CheckFailure(f"{first}\n  On rank {rank}, wrong: {', '.join(wrong)}; right: "
                           f"{', '.join(right) or 'nothing'}.{hint}")


def _expect_moe_comm(records, *, rank, ctx, case, members, group_rank, kept):
    """The layer's communication is its dispatcher's: expectations from the reference's kept routing maps."""
    local = case["local"]
    send = [int(kept[rank][:, j * local:(j + 1) * local].sum()) for j in range(len(members))]
    recv = [int(kept[s][:, group_rank * local:(group_rank + 1) * local].sum()) for s in members]
    exp = {"send": send, "recv": recv}
    _expect_dispatcher_comm(records, rank=rank, ctx=ctx, case=case, exp=exp, combine=True, backward=True)


# ---------------------------------------------------------------------------
# The picture: who sends how many tokens where, and the bytes of dispatch and combine
# ---------------------------------------------------------------------------

def _picture_rank(rank, world_size, cls, case, backend):
    dev = rank_device(rank, backend)
    dispatcher = cls(case["num_experts"], ep_group=dist.group.WORLD)
    x = case["x"][rank].to(dev)
    with CommLedger() as d_ledger, AllToAllGuard():
        expert_input, tokens_per_expert = dispatcher.dispatch(x, case["probs"][rank].to(dev, x.dtype),
                                                              case["maps"][rank].to(dev))
    with CommLedger() as c_ledger, AllToAllGuard():
        dispatcher.combine(expert_input)
    return {"expert_input": _cpu(expert_input), "tokens_per_expert": _cpu(tokens_per_expert),
            "dispatch": d_ledger.records, "combine": c_ledger.records}


def plot_dispatch(AllToAllTokenDispatcher, *, world_size: int = 4, num_experts: int = 8, num_tokens: int = 24,
                  k: int = 2, hidden: int = 64, dtype=torch.float32, seed: int = 1, backend: str = "gloo",
                  timeout: float = _TIMEOUT):
    """Draw one dispatch of YOUR dispatcher: the token-count matrix and each rank's all-to-all bytes.

    Left: how many tokens each source rank sent to each expert, read from what
    every rank's `expert_input` actually holds (each row is tagged with its
    source rank). Expert 0 is hot, the last expert gets nothing. Right: bytes
    each rank sent to and received from OTHER ranks in dispatch and in combine,
    from the ledgers (autograder.lessons.volume.all_to_all_traffic). Returns a Picture.
    """
    from autograder.lessons.plots import matplotlib_missing, new_figure, picture

    missing = matplotlib_missing()
    if missing:
        print(missing)
        return None
    case = _dispatch_case(world_size, None, num_experts, num_tokens, k, hidden, dtype, seed, "starve_expert")
    results = run_distributed(_picture_rank, world_size,
                              args=(AllToAllTokenDispatcher, inputs_only(case, "expected"), backend),
                              timeout=timeout, backend=backend)
    local = case["local"]
    matrix = torch.zeros(world_size, num_experts, dtype=torch.int64)
    for r, res in enumerate(results):
        rows, counts = res["expert_input"], [int(c) for c in res["tokens_per_expert"].tolist()]
        for e, chunk in enumerate(torch.split(rows, counts)):
            for src in chunk[:, 0].round().to(torch.int64).tolist():
                if 0 <= src < world_size:
                    matrix[src, r * local + e] += 1
    traffic = {}
    for phase in ("dispatch", "combine"):
        traffic[phase] = [[sum(v) for v in zip(*[all_to_all_traffic(rec, r) for rec in res[phase]
                                                  if rec.op == "all_to_all"] or [(0, 0)])]
                          for r, res in enumerate(results)]
    fig, (ax0, ax1) = new_figure(figsize=(11, 3.8), ncols=2)
    ax0.imshow(matrix.numpy(), cmap="Blues", aspect="auto")
    top = max(int(matrix.max()), 1)
    for s in range(world_size):
        for e in range(num_experts):
            ax0.text(e, s, str(int(matrix[s, e])), ha="center", va="center", fontsize=8,
                     color="white" if matrix[s, e] > top / 2 else "black")
    for r in range(1, world_size):
        ax0.axvline(r * local - 0.5, color="black", linewidth=1)
    ax0.set_xticks(range(num_experts), [f"{e}\n(r{e // local})" for e in range(num_experts)], fontsize=7)
    ax0.set_yticks(range(world_size), [f"rank {s}" for s in range(world_size)])
    ax0.set_xlabel("expert (and the rank that holds it)")
    ax0.set_title(f"tokens sent, source rank x expert ({num_tokens} tokens/rank, k={k})", fontsize=10)
    width = 0.2
    labels = [("dispatch", 0, "sent"), ("dispatch", 1, "received"), ("combine", 0, "sent"), ("combine", 1, "received")]
    colors = ["#4C72B0", "#8DA0CB", "#C44E52", "#E5989B"]
    for n, ((phase, col, word), color) in enumerate(zip(labels, colors)):
        ax1.bar([r + (n - 1.5) * width for r in range(world_size)], [traffic[phase][r][col] for r in range(world_size)],
                width, label=f"{phase}: {word}", color=color)
    ax1.set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)])
    ax1.set_ylabel("bytes to/from other ranks")
    ax1.set_title(f"all-to-all bytes per rank ({hidden} x {dtype_name(dtype)} per row)", fontsize=10)
    ax1.legend(fontsize=8)
    return picture(fig)
