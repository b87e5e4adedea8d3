"""What the checks of assignment 05 (expert parallelism) share: small helpers, the all-to-all guard, and
the independent references.

`AllToAllGuard` makes the split sizes of an all-to-all agree across ranks before gloo runs it (a
mismatch is reported, not a hang); the references (`dense_moe_reference` and the plain-Python router,
capacity and auxiliary loss) are float64 arithmetic, independent of the student's code.
"""

from __future__ import annotations

import json
import time
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.runtime.compare import CheckFailure, dtype_name, fmt_shape
from autograder.runtime.ledger import CommLedger

__all__ = ["AllToAllGuard", "dense_moe_reference"]


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
