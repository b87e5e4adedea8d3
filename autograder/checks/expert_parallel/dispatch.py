"""Public checks of assignment 05 (expert parallelism, MoE all-to-all): what is graded, readably.

    import autograder.checks.expert_parallel as checks
    checks.check_topk_router(topk_router, num_tokens=8, num_experts=4, k=2)
    checks.check_dispatch(AllToAllTokenDispatcher, world_size=2)

The router, the auxiliary loss, `permute`/`unpermute` and token dropping are
single-process functions: their checks call the student's function here and
compare with an independent reference (plain Python loops for every choice:
which experts, which order, which tokens are kept). The distributed checks
build every rank's tokens, routing and full ("master") weights in this
process, run a rank program with `run_distributed`, and decide here from what
the ranks returned: expert inputs, outputs, every gradient (input, expert
weights, the router weight through the probabilities), and each rank's
communication ledger, against a dense single-process MoE (every token through
its top-k experts, weighted) (spec 4.5). Rank programs also run under an
`AllToAllGuard`, which compares the split sizes of every all-to-all across the
ranks before gloo runs it (gloo returns garbage, or aborts, when they disagree).
Tokens are `[T, h]`; rank r of an EP group of w holds experts `[r E/w, (r+1) E/w)`.
"""

from __future__ import annotations

import json
import time
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.checks import expect_value_errors, inputs_only
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape
from autograder.runtime.dist import rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm, format_trace
from autograder.lessons.volume import all_to_all_traffic

__all__ = [
    "AllToAllGuard", "check_topk_router", "check_load_balancing_loss", "check_permute", "check_unpermute",
    "check_exchange_token_counts", "check_all_to_all", "check_argument_errors", "check_dispatch",
    "check_combine", "check_dispatcher_communication", "check_token_dropping", "check_moe_layer",
    "dense_moe_reference", "plot_dispatch",
]

_TIMEOUT = 20.0
_INT_DTYPES = ("int64", "int32")


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

def _cpu(t):
    """What a rank sends back of a tensor: plain data on the CPU.

    The functional collectives (`torch.distributed._functional_collectives`,
    e.g. `all_to_all_single_autograd`) return an `AsyncCollectiveTensor`: the
    result of a collective that may still be in flight. Its `wait()` gives the
    plain tensor (what any further op on it would do implicitly); a rank can only
    send back plain tensors, so it is waited here instead of being refused.
    """
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    if type(t) is not torch.Tensor and callable(getattr(t, "wait", None)):
        t = t.wait()  # AsyncCollectiveTensor -> torch.Tensor
    return t.cpu()


def _compute_dtype(dtype):
    """The router's dtype: softmax in at least float32 (spec 4.5)."""
    return torch.promote_types(dtype, torch.float32)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"check parameters: {message}")


def _ep_named(ep: int, ep_size: int | None) -> str:
    """The EP size as the caller gave it: `ep_size (4)`, or `world_size (3), the EP size` by default."""
    return f"ep_size ({ep})" if ep_size else f"world_size ({ep}), the EP size"


def _ep_groups(world_size: int, ep_size: int | None) -> list[list[int]]:
    """The EP groups: blocks of `ep_size` consecutive ranks (the whole world by default)."""
    ep = ep_size or world_size
    _require(world_size % ep == 0, f"world_size ({world_size}) must be a multiple of ep_size ({ep})")
    return [list(range(s, s + ep)) for s in range(0, world_size, ep)]


def _my_group(rank: int, groups: list[list[int]]):
    """Inside a rank: every rank creates every group (new_group is collective); returns mine and its ranks."""
    if len(groups) == 1:
        return dist.group.WORLD, groups[0]
    mine = None
    for members in groups:
        g = dist.new_group(members)
        if rank in members:
            mine = (g, members)
    return mine


def _check_tensor(out, what: str, shape, *, dtype=None, rank=None, grad: bool | None = None) -> None:
    where = f"rank {rank}: {what}" if rank is not None else what
    if not isinstance(out, torch.Tensor):
        raise CheckFailure(f"{where}: expected a tensor of shape {fmt_shape(shape)}, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise CheckFailure(f"{where}: shape {fmt_shape(out.shape)}, expected {fmt_shape(shape)}")
    if dtype is not None and out.dtype != dtype:
        raise CheckFailure(f"{where}: dtype {dtype_name(out.dtype)}, expected {dtype_name(dtype)}")
    if grad and not out.requires_grad:
        raise CheckFailure(f"{where} does not require grad: the autograd graph was cut (detach(), .data, "
                           f"torch.no_grad() or a tensor rebuilt from numbers?)")


def _unpack(out, n: int, what: str, rank=None):
    where = f"rank {rank}: " if rank is not None else ""
    if not isinstance(out, (tuple, list)) or len(out) != n:
        got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
        raise CheckFailure(f"{where}{what} must return a tuple of {n}, got {got}")
    return out


# ---------------------------------------------------------------------------
# The guard: split sizes agree across ranks before gloo runs an all-to-all
# ---------------------------------------------------------------------------

def _unbox_group(value):
    try:
        return dist.ProcessGroup.unbox(value)
    except Exception:  # noqa: BLE001 - already a ProcessGroup
        return value


class AllToAllGuard(TorchDispatchMode):
    """Inside a rank program: compare every all-to-all's split sizes across its group BEFORE it runs.

        with CommLedger() as ledger, AllToAllGuard():
            out = dispatcher.dispatch(hidden, probs, routing_map)

    Rank i sends `input_split_sizes[j]` rows to rank j, which must expect exactly
    that many from i (its `output_split_sizes[i]`); rows must have one shape and
    dtype. gloo does not check: a mismatch returns uninitialised memory or
    aborts the process (the runner's CollectiveAgreement compares op and dtype,
    not splits). The guard posts each rank's splits to the rendezvous store
    (not a collective: the ledger does not see it), reads its peers', and
    raises on every rank with who sends what when they disagree, or when a
    rank of the group returned without this all-to-all. A rank that never
    calls it is left to the runner's deadlock detection (never a clock: a
    verdict must not depend on the machine's load).
    """

    _OPS = ("c10d::alltoall_base_", "c10d::alltoall_", "_c10d_functional::all_to_all_single")

    # guards created by this process: every rank creates them in the same order, so (guard, group, n) keys agree
    _instances = 0

    def __init__(self):
        super().__init__()
        AllToAllGuard._instances += 1
        self._id = AllToAllGuard._instances
        self._count: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name in self._OPS:
            self._check(func, args, kwargs)
        return func(*args, **kwargs)

    def _describe(self, func, by_name):
        """(group, input rows, output rows or None, input splits, output splits, row shape, dtype)."""
        name = func._schema.name
        if name == "c10d::alltoall_":
            ins, outs = list(by_name["input_tensors"]), list(by_name["output_tensors"])
            pg = _unbox_group(by_name["process_group"])
            in_splits = [t.shape[0] if t.dim() else 1 for t in ins]
            out_splits = [t.shape[0] if t.dim() else 1 for t in outs]
            first = ins[0] if ins else torch.empty(0)
            return pg, sum(in_splits), sum(out_splits), in_splits, out_splits, tuple(first.shape[1:]), first.dtype
        if name == "c10d::alltoall_base_":
            pg = _unbox_group(by_name["process_group"])
            inp, out = by_name["input"], by_name["output"]
            in_splits, out_splits = list(by_name["input_split_sizes"]), list(by_name["output_split_sizes"])
            out_rows = out.shape[0] if out.dim() else 1
        else:
            from torch.distributed.distributed_c10d import _resolve_process_group

            pg = _resolve_process_group(by_name["group_name"])
            inp = by_name["input"]
            in_splits, out_splits = list(by_name["input_split_sizes"]), list(by_name["output_split_sizes"])
            out_rows = None
        rows = inp.shape[0] if inp.dim() else 1
        w = pg.size()
        if not in_splits and rows % w == 0:
            in_splits = [rows // w] * w
        if not out_splits:
            total = out_rows if out_rows is not None else rows
            out_splits = [total // w] * w if total % w == 0 else []
        return pg, rows, out_rows, [int(s) for s in in_splits], [int(s) for s in out_splits], \
            tuple(inp.shape[1:]), inp.dtype

    def _wait(self, store, keys, members, me, what) -> None:
        """Until every rank of the group posted its splits (idle: a deadlock still looks idle to the runner).

        A peer that returned from its rank program without this all-to-all is
        reported at once; a peer blocked in another collective is left to the
        runner's deadlock detection, which shows where every rank waits.
        """
        from autograder.runtime.agreement import DONE_KEY

        pauses = (0.0001,) * 20 + (0.001,) * 10
        i = 0
        while True:
            missing = [j for j, k in enumerate(keys) if not store.check([k])]
            if not missing:
                return
            returned = [members[j] for j in missing if store.check([DONE_KEY.format(rank=members[j])])]
            if returned:
                why = f"rank(s) {returned} returned from the rank program without calling it"
                raise CheckFailure(
                    f"rank {members[me]}: {what}: {why}. Every rank of the group must call the same all-to-alls "
                    f"in the same order, also a rank that sends or receives nothing.")
            time.sleep(pauses[i] if i < len(pauses) else 0.02)
            i += 1

    def _check(self, func, args, kwargs) -> None:
        by_name = {a.name: v for a, v in zip(func._schema.arguments, args)}
        by_name.update(kwargs)
        pg, rows, out_rows, ins, outs, row_shape, dtype = self._describe(func, by_name)
        w, me = pg.size(), pg.rank()
        try:
            members = dist.get_process_group_ranks(pg)
        except Exception:  # noqa: BLE001 - an unregistered group: name ranks by group rank
            members = list(range(w))
        n = self._count[pg.group_name] = self._count.get(pg.group_name, 0) + 1
        backward = torch._C._current_graph_task_id() != -1
        what = (f"all-to-all number {n} that this rank issued on the group of ranks {members}"
                + (" (in backward)" if backward else ""))
        problem = ""
        if len(ins) != w or len(outs) != w:
            problem = (f"rank {members[me]}: {what}: needs {w} input and {w} output split sizes (one per rank), "
                       f"got input_split_sizes {ins}, output_split_sizes {outs} for {rows} input rows")
        elif sum(ins) != rows:
            problem = (f"rank {members[me]}: {what}: input_split_sizes {ins} sum to {sum(ins)}, but the input "
                       f"has {rows} rows" + (". In backward the gradient of the output goes back to where it came "
                                             "from: the same all-to-all with the splits swapped" if backward else ""))
        elif out_rows is not None and sum(outs) != out_rows:
            problem = (f"rank {members[me]}: {what}: output_split_sizes {outs} sum to {sum(outs)}, but the "
                       f"output buffer has {out_rows} rows")
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):  # the run's own store: the runner's keys live there
            store = store.underlying_store
        key = f"ep-a2a-guard/{self._id}/{pg.group_name}/{n}"
        store.set(f"{key}/{me}", json.dumps({"in": ins, "out": outs, "row": list(row_shape),
                                             "dtype": dtype_name(dtype), "problem": problem}))
        keys = [f"{key}/{j}" for j in range(w)]
        self._wait(store, keys, members, me, what)
        peers = [json.loads(store.get(k)) for k in keys]
        problems = [p["problem"] for p in peers if p["problem"]]
        if problems:
            raise CheckFailure(problems[0])
        for i in range(w):
            for j in range(w):
                sends, expects = peers[i]["in"][j], peers[j]["out"][i]
                if sends != expects:
                    raise CheckFailure(
                        f"{what}: rank {members[j]} expects {expects} row(s) from rank {members[i]} (its "
                        f"output_split_sizes[{i}] = {expects}), but rank {members[i]} sends it {sends} (its "
                        f"input_split_sizes[{j}] = {sends}). What rank i sends to rank j must be what rank j "
                        f"expects from rank i: exchange the token counts first, then pass output_split_sizes = "
                        f"rows received from each rank, input_split_sizes = rows sent to each rank. "
                        f"Splits: " + "; ".join(f"rank {members[r]} in {p['in']} out {p['out']}"
                                                for r, p in enumerate(peers)))
        for j in range(w):
            if (peers[j]["row"], peers[j]["dtype"]) != (list(row_shape), dtype_name(dtype)):
                raise CheckFailure(
                    f"{what}: rank {members[me]} sends rows of shape {list(row_shape)} {dtype_name(dtype)}, rank "
                    f"{members[j]} rows of shape {peers[j]['row']} {peers[j]['dtype']}: every rank must exchange "
                    f"rows of one shape and dtype.")


def _traced():
    """(ledger, guard) for a rank program: `with ledger, guard:`."""
    return CommLedger(), AllToAllGuard()


# ---------------------------------------------------------------------------
# Independent references: plain-Python choices, float64 arithmetic
# ---------------------------------------------------------------------------

def _ref_topk(logits64: torch.Tensor, k: int) -> list[list[int]]:
    """Each token's k experts: largest logit first, ties toward the lower expert index."""
    return [sorted(range(len(row)), key=lambda e: (-row[e], e))[:k] for row in logits64.tolist()]


def _ref_probs(logits: torch.Tensor, selected: list[list[int]]) -> torch.Tensor:
    """Float64 `[T, E]` probabilities: the softmax over each token's selected logits (differentiable)."""
    idx = torch.tensor(selected, dtype=torch.long).view(logits.shape[0], -1)  # [T, k]
    top = torch.softmax(logits.to(torch.float64).gather(1, idx), dim=-1)
    return torch.zeros(tuple(logits.shape), dtype=torch.float64).scatter(1, idx, top)


def _map_from(selected, num_tokens: int, num_experts: int) -> torch.Tensor:
    m = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    for t, experts in enumerate(selected):
        for e in experts:
            m[t, e] = True
    return m


def _ref_capacity(probs64: torch.Tensor, routing_map: torch.Tensor, k: int, capacity_factor: float) -> torch.Tensor:
    """Kept `[T, E]`: per expert its `ceil(T k / E cf)` highest-probability tokens, the earlier on ties."""
    n_tok, n_exp = routing_map.shape
    cap = math.ceil(n_tok * k / n_exp * capacity_factor)  # Megatron's get_capacity(T k, E, cf)
    p, m = probs64.tolist(), routing_map.tolist()
    kept = torch.zeros_like(routing_map)
    for e in range(n_exp):
        candidates = sorted((t for t in range(n_tok) if m[t][e]), key=lambda t: (-p[t][e], t))
        for t in candidates[:cap]:
            kept[t, e] = True
    return kept


def _ref_aux(logits: torch.Tensor, routing_map: torch.Tensor, k: int) -> torch.Tensor:
    """E / (k T^2) * sum_i (sum_t softmax(logits)[t, i]) * count_i, in float64 (differentiable)."""
    n_tok, n_exp = logits.shape
    scores = torch.softmax(logits.to(torch.float64), dim=-1)
    counts = routing_map.to(torch.float64).sum(0)
    return n_exp / (k * n_tok ** 2) * (scores.sum(0) * counts).sum()


def _gaps_ok(values: list[float], keep: int, eps: float) -> bool:
    """The `keep`-th and `keep+1`-th largest of `values` differ by more than eps (nothing to decide: True)."""
    if keep <= 0 or keep >= len(values):
        return True
    v = sorted(values, reverse=True)
    return v[keep - 1] - v[keep] > eps


def dense_moe_reference(x, router_weight, expert_weights, *, k, capacity_factor=None):
    """The dense single-process MoE the checks compare with: `(output [T, h], aux_loss, kept map)`.

    Every token goes through EVERY expert (`fc2(gelu(fc1 x))`), and the outputs
    are summed with weights that are the top-k softmax probabilities for the
    kept experts and zero for all others: no permutation, no dispatch. Float64
    and differentiable in `x`, `router_weight` and every expert weight.
    """
    logits = x.to(torch.float64) @ router_weight.to(torch.float64).t()  # [T, E]
    n_tok, n_exp = logits.shape
    selected = _ref_topk(logits.detach(), k)
    routing_map = _map_from(selected, n_tok, n_exp)
    probs = _ref_probs(logits, selected)
    aux = _ref_aux(logits, routing_map, k)  # counts before any drop
    kept = routing_map
    if capacity_factor is not None:
        kept = _ref_capacity(probs.detach(), routing_map, k, capacity_factor)
    weights = probs * kept
    out = torch.zeros(n_tok, x.shape[1], dtype=torch.float64)
    for e, (w1, w2) in enumerate(expert_weights):
        y = F.gelu(x.to(torch.float64) @ w1.to(torch.float64).t()) @ w2.to(torch.float64).t()  # [T, h]
        out = out + weights[:, e:e + 1] * y
    return out, aux, kept


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
