"""Public checks of assignment 05, exercise 7: the overlapped MoE layer (two halves hide each other's all-to-alls).

    from autograder.checks.expert_parallel import check_overlapped_moe_layer, check_moe_overlap
    check_overlapped_moe_layer(OverlappedMoELayer, world_size=4, num_experts=8)   # numbers and what is sent
    check_moe_overlap(OverlappedMoELayer, world_size=4, num_experts=8)            # when it is sent and waited

The layer cuts each rank's T tokens in two halves, `hidden_states.tensor_split(2)`
(half 0: the first ceil(T/2) tokens), and each all-to-all of one half must be
in flight while the experts compute the other half, in forward and in backward.

`check_overlapped_moe_layer` grades the numbers against the same dense
single-process MoE as `check_moe_layer` (output, aux loss, input, router and
expert gradients), and the content of the communication: per half a dispatch
and a combine all-to-all with that half's splits, their mirrors in backward.

`check_moe_overlap` grades the schedule, from each rank's ledger in order
(the judgement of 04's `check_ring_overlap` and 02's `check_async_allreduce_overlap`:
an op posted before the compute it must hide behind, and completed after it;
CPU timing proves nothing, gloo moves data on its own threads). Both checks
run the layer on the check's own transport, which HOLDS every asynchronous
float all-to-all (`_OverlapLedger`): gloo moves the rows into a buffer of the
check's, the caller's output buffer holds NaN (the poison) until the caller
completes the work, by `wait()` or any other way (`is_completed()`,
`get_future()`, `synchronize()`, `result()`, ...: `_COMPLETING`; a barrier of
its group), and only then are the rows copied in. So an all-to-all is in
flight, for the layer, exactly from its post to the event that completed it,
wherever the student's code put that event, and rows read before it are NaN
whatever the machine's speed: a race the real transport would win on an idle
machine loses here every time. Recorded in one sequence per rank:

- each all-to-all (the ledger), with `async_op`;
- each `Work.wait()`, with the all-to-all whose `Work` it is (`dist.Work.unbox`
  of the op's result is the very object the caller gets), and each other event
  that completed a held all-to-all (`released`);
- the experts' compute: a forward pre-hook and a forward hook on every local
  expert mark the start and end of each call (with its rows, whose first row
  names the token, hence the half, and whether they hold poison), and tensor
  hooks on the call's output and input mark the start (is the arriving
  gradient poison?) and end of its backward.

Then, per phase: no expert reads poison (its input in forward, its output's
gradient in backward), nor do the layer's output and input gradient; each
half's all-to-all towards the experts is completed before that half's experts
start; and, with F the half whose experts compute first and S the other, the
all-to-all that brings S's rows to the experts (forward: dispatch; backward:
combine's backward) is posted before F's experts start and completed after
they end, the all-to-all that takes F's rows home (forward: combine; backward:
dispatch's backward) posted before S's experts start and completed after they
end. A layer that waits at once computes right and fails only this check; one
whose experts read a buffer before waiting for it fails both.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.distributed as dist

from autograder.runtime.compare import CheckFailure, dtype_name
from autograder.runtime.dist import run_distributed
from autograder.runtime.ledger import CommLedger, check_consistent, expect_no_comm, format_trace

from .common import _INT_DTYPES, _TIMEOUT, _map_from, _ref_capacity, _ref_probs, _ref_topk, _require
from .dispatch import _is_float
from .moe_layer import _compare_moe, _moe_case, _moe_reference, _run_moe_layer

__all__ = ["check_overlapped_moe_layer", "check_moe_overlap", "print_overlap_timeline", "halves"]


def halves(num_tokens: int) -> list[range]:
    """The two halves of T tokens, as `torch.tensor_split(2)` cuts them: the first ceil(T/2), then the rest."""
    cut = math.ceil(num_tokens / 2)
    return [range(0, cut), range(cut, num_tokens)]


# ---------------------------------------------------------------------------
# In the ranks: the ledger that knows which all-to-all a wait is for, and the experts' compute marks
# ---------------------------------------------------------------------------

# The Work methods through which a caller can make an all-to-all complete, or learn that it has: each one releases
# a held all-to-all (delivers its rows) where it is called. `exception` and `source_rank` do neither.
_COMPLETING = ("wait", "synchronize", "get_future", "get_future_result", "result", "is_completed", "is_success",
               "block_current_stream")
_HELD_OPS = ("c10d::alltoall_base_", "c10d::alltoall_")


class _OverlapLedger(CommLedger):
    """CommLedger that also records, in the same sequence, which all-to-all each `Work.wait()` waits for
    (`waited`: wait record seq -> all-to-all record seq, None for another op's Work) and marks (`mark`); and that
    HOLDS every asynchronous float all-to-all until its work is waited (the check's transport).

    Held: the op runs into buffers of the check's own, and the caller's output buffer is filled with poison
    (NaN) at once; the rows are copied into it only when the caller completes the work: `wait()`, or any other
    method of the Work that completes it or says whether it has completed (`_COMPLETING`), or a barrier of its
    group (gloo's barrier waits for every collective in flight). `released`: all-to-all seq -> (seq of that
    event, how). So what the caller sees of an all-to-all does not depend on when gloo moved the data: rows read
    before the release are NaN, whatever the machine's load, and the release is where the caller put it."""

    def __init__(self):
        super().__init__()
        self.marks: list[dict] = []
        self.waited: dict[int, int | None] = {}
        self.functional: list[int] = []  # seqs of all-to-alls of the functional collectives (no Work to wait on)
        self._works: dict[int, tuple] = {}  # id(Work) -> (all-to-all seq, the Work, kept alive so ids stay unique)
        self.held: dict[int, dict] = {}  # id(Work) -> the held all-to-all: seq, group, caller's and own buffers
        self.released: dict[int, tuple[int, str]] = {}  # all-to-all seq -> (seq of the event that completed it, how)
        self._saved: dict[str, object] = {}

    def mark(self, kind: str, call: int, expert: int, rows: int | None = None, first=None, *, poison=False) -> None:
        self.marks.append({"seq": self._next_seq(), "kind": kind, "call": call, "expert": expert,
                           "phase": self._phase(), "rows": rows, "first": first, "poison": bool(poison),
                           "in_flight": self.in_flight()})

    def in_flight(self) -> list[int]:
        """The held all-to-alls posted and not completed yet (their seqs)."""
        return [h["seq"] for h in self.held.values() if h["seq"] not in self.released]

    def _release(self, work, how: str, seq: int | None = None) -> None:
        held = self.held.get(id(work))
        if held is None or held["seq"] in self.released:
            return
        self.released[held["seq"]] = (self._next_seq() if seq is None else seq, how)
        self._orig_wait(held["work"])  # the real transfer, into the check's buffers
        for out, own in zip(held["outputs"], held["own"]):
            out.data.copy_(own)  # as the transport writes: no autograd version bump

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name == "c10d::barrier":
            n = len(self.records)
            out = self._dispatch(func, types, args, kwargs)
            group = self.records[-1].group_name if len(self.records) > n else None
            for held in list(self.held.values()):
                if held["group"] == group:
                    self._release(held["work"], "a barrier of its group (dist.barrier)")
            return out
        by_name = {a.name: v for a, v in zip(func._schema.arguments, args)}
        by_name.update(kwargs)
        outputs = ([by_name.get("output")] if name == "c10d::alltoall_base_"
                   else list(by_name.get("output_tensors") or ()) if name == "c10d::alltoall_" else [])
        if (not outputs or not bool(by_name.get("async_op", True))
                or not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in outputs)):
            return self._dispatch(func, types, args, kwargs)
        own = [torch.empty_like(t) for t in outputs]
        for t in outputs:
            t.data.fill_(float("nan"))  # the poison: what an all-to-all's output holds until it is completed
        key = "output" if name == "c10d::alltoall_base_" else "output_tensors"
        names = [a.name for a in func._schema.arguments]
        args = list(args)
        if key in kwargs:
            kwargs = {**kwargs, key: own[0] if key == "output" else own}
        else:
            args[names.index(key)] = own[0] if key == "output" else own
        n = len(self.records)
        out = self._dispatch(func, types, tuple(args), kwargs)
        if len(self.records) > n:
            record = self.records[-1]
            work = self._work_of(out)
            if work is not None:
                self.held[id(work)] = {"seq": record.seq, "work": work, "outputs": outputs, "own": own,
                                       "group": record.group_name}
        if name == "c10d::alltoall_":
            return (outputs, out[1])  # the caller's tensors, as the op returns them
        return out

    def _dispatch(self, func, types, args, kwargs):
        n = len(self.records)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.records) > n and self.records[-1].op == "all_to_all":
            if func.namespace == "_c10d_functional":
                self.functional.append(self.records[-1].seq)
            work = self._work_of(out)
            if work is not None:
                self._works[id(work)] = (self.records[-1].seq, work)
        return out

    @staticmethod
    def _work_of(out):
        for item in (out if isinstance(out, (tuple, list)) else (out,)):
            if type(item).__name__ == "ScriptObject":
                try:
                    return dist.Work.unbox(item)  # the same Python object the caller receives
                except Exception:  # noqa: BLE001 - not a Work
                    continue
        return None

    def __enter__(self):
        entered = super().__enter__()
        recording = dist.Work.wait  # the CommLedger's wrapper: it appends the wait record
        ledger = self
        self._saved = {name: getattr(dist.Work, name) for name in _COMPLETING}

        def wait(work, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.endswith(("distributed_c10d.py", "c10d_logger.py")):  # a synchronous call's own wait
                return ledger._orig_wait(work, *args, **kwargs)
            n = len(ledger.records)
            result = recording(work, *args, **kwargs)
            seq = None
            for r in ledger.records[n:]:
                if r.op == "wait" and r.seq not in ledger.waited:
                    ledger.waited[r.seq] = ledger._works.get(id(work), (None,))[0]
                    seq = r.seq
                    break
            ledger._release(work, "wait()", seq)
            return result

        def completing(name, orig):
            def method(work, *args, **kwargs):
                ledger._release(work, f"{name}()")
                return orig(work, *args, **kwargs)
            return method

        dist.Work.wait = wait
        for name in _COMPLETING[1:]:
            setattr(dist.Work, name, completing(name, self._saved[name]))
        return entered

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, orig in self._saved.items():
                if name != "wait":  # CommLedger restores its own
                    setattr(dist.Work, name, orig)
            self._saved = {}


def _poisoned(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and bool(torch.isnan(t.detach()).any())


def _mark_experts(layer, ledger) -> None:
    """Hooks on the layer's local experts: each call's forward start/end, and its backward's start (the
    gradient of its output arrives) and end (the gradient of its input is computed); each start says whether
    what the expert reads still holds the held transport's poison."""
    calls = []
    for e, expert in enumerate(layer.local_experts):
        def before(module, args, e=e):
            x = args[0] if args else None
            rows = int(x.shape[0]) if isinstance(x, torch.Tensor) and x.dim() else None
            first = x[0].detach().cpu().tolist() if rows else None
            module._overlap_call = len(calls)
            calls.append(e)
            ledger.mark("forward start", module._overlap_call, e, rows, first, poison=_poisoned(x))

        def after(module, args, output, e=e):
            call = module._overlap_call
            ledger.mark("forward end", call, e)
            x = args[0] if args else None
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad, call=call, e=e: ledger.mark("backward start", call, e,
                                                                              poison=_poisoned(grad)))
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(lambda grad, call=call, e=e: ledger.mark("backward end", call, e))

        expert.register_forward_pre_hook(before)
        expert.register_forward_hook(after)


def _overlap_rank(rank, world_size, cls, case, aux_coeff, backend):
    ledger = _OverlapLedger()
    out = _run_moe_layer(rank, cls, case, aux_coeff, backend, ledger, instrument=_mark_experts)
    out.update(marks=ledger.marks, waited=ledger.waited, functional=ledger.functional, released=ledger.released,
               held=sorted(h["seq"] for h in ledger.held.values()))
    return out


# ---------------------------------------------------------------------------
# In the parent: cases, expectations, the judgement
# ---------------------------------------------------------------------------

def _half_splits(case, kept, members, group_rank, rank):
    """Per half: (rows this rank sends to each rank, rows it receives from each rank), from the kept maps."""
    local = case["local"]
    out = []
    for part in halves(case["num_tokens"]):
        rows = list(part)
        send = tuple(int(kept[rank][rows, j * local:(j + 1) * local].sum()) for j in range(len(members)))
        recv = tuple(int(kept[s][rows, group_rank * local:(group_rank + 1) * local].sum()) for s in members)
        out.append((send, recv))
    return out


def _accept_halves(case_params):
    """A case where the ledger can tell every all-to-all apart, and every rank computes something for each half:
    on every rank the four (input, output) split pairs of the two halves' dispatch and combine differ, and each
    half brings the rank's experts at least one row."""
    world_size, ep_size, num_experts, k, num_tokens, cf = case_params

    def accept(xs, wr):
        ep = ep_size or world_size
        local = num_experts // ep
        kept = []
        for x in xs:
            logits = x @ wr.t()
            sel = _ref_topk(logits, k)
            m = _map_from(sel, num_tokens, num_experts)
            kept.append(m if cf is None else _ref_capacity(_ref_probs(logits, sel).detach(), m, k, cf))
        for g0 in range(0, world_size, ep):
            members = list(range(g0, g0 + ep))
            for i, r in enumerate(members):
                pairs = []
                for part in halves(num_tokens):
                    rows = list(part)
                    send = tuple(int(kept[r][rows, j * local:(j + 1) * local].sum()) for j in range(ep))
                    recv = tuple(int(kept[s][rows, i * local:(i + 1) * local].sum()) for s in members)
                    if ep > 1 and sum(recv) == 0:
                        return False
                    pairs += [(send, recv), (recv, send)]
                if ep > 1 and len(set(pairs)) != 4:
                    return False
        return True
    return accept


def _overlap_case(world_size, ep_size, num_experts, k, hidden, ffn, num_tokens, capacity_factor, dtype, seed,
                  pattern, strict):
    _require(num_tokens >= 2, f"num_tokens ({num_tokens}) must be >= 2: two halves")
    accept = _accept_halves((world_size, ep_size, num_experts, k, num_tokens, capacity_factor)) if strict else None
    case = _moe_case(world_size, ep_size, num_experts, k, hidden, ffn, num_tokens, capacity_factor, dtype, seed,
                     pattern, accept=accept)
    case["num_tokens"] = num_tokens
    case["layer_name"] = "OverlappedMoELayer"
    return case


def _ctx(name, case, world_size, num_tokens, pattern):
    return (f"{name}({case['hidden']}, {case['ffn']}, {case['num_experts']}, k={case['k']}"
            + (f", capacity_factor={case['cf']}" if case["cf"] is not None else "")
            + f"), world size {world_size}" + (f" (EP groups {case['groups']})" if len(case["groups"]) > 1 else "")
            + f", {num_tokens} tokens per rank (halves: tokens {_span(halves(num_tokens)[0])} and "
            f"{_span(halves(num_tokens)[1])}), {dtype_name(case['dtype'])}, pattern {pattern!r}")


def _span(part: range) -> str:
    return f"[{part.start}, {part.stop})"


def _token_a2a(records, phase, hidden):
    """The float all-to-alls of whole token rows in `phase` (a 1-d or [n, 1] one carries probabilities)."""
    return [r for r in records if r.op == "all_to_all" and r.phase == phase and _is_float(r)
            and tuple(r.shape[1:]) == (hidden,)]


def _a2a_key(r):
    return (tuple(r.input_split_sizes or ()), tuple(r.output_split_sizes or ()))


def _expect_overlapped_comm(records, *, rank, ctx, case, members, group_rank, kept):
    """Per half a dispatch all-to-all (send, recv) and a combine (recv, send) of token rows in forward, in any
    order (optionally one more of the probabilities with the dispatch splits), integer count exchanges in
    forward only; in backward exactly the mirror of every float forward all-to-all (splits swapped)."""
    trace = f"Communication of rank {rank}:\n{format_trace(records, rank)}"
    if len(members) == 1:
        expect_no_comm(records, rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
        return
    hidden = case["hidden"]
    pairs = _half_splits(case, kept, members, group_rank, rank)
    comm = [r for r in records if r.op != "wait"]
    fwd = [r for r in comm if r.phase == "forward"]
    ints = [r for r in fwd if r.op in ("all_to_all", "all_gather") and r.dtype in _INT_DTYPES]
    tokens = _token_a2a(records, "forward", hidden)
    probs = [r for r in fwd if r.op == "all_to_all" and _is_float(r) and r not in tokens
             and len(r.shape) in (1, 2) and (len(r.shape) == 1 or r.shape[1] == 1)
             and _a2a_key(r) in [(s, v) for s, v in pairs]]
    others = [r for r in fwd if r not in ints and r not in tokens and r not in probs]
    want = sorted([(s, v) for s, v in pairs] + [(v, s) for s, v in pairs])
    lines = "; ".join(f"half {j}: dispatch all_to_all of [{sum(s)}, {hidden}] with splits in {list(s)} out "
                      f"{list(v)}, combine [{sum(v)}, {hidden}] in {list(v)} out {list(s)}"
                      for j, (s, v) in enumerate(pairs))
    if not ints:
        raise CheckFailure(f"rank {rank} ({ctx}): no integer token counts were exchanged in forward: each half's "
                           f"split sizes come from its counts (exchange_token_counts). {trace}")
    if sorted(_a2a_key(r) for r in tokens) != want or others or len(probs) > 2:
        hint = ""
        if len(tokens) == 4 and not others:
            hint = (" A half's splits are the rows of ITS tokens that the routing of all T tokens sends to (receives "
                    "from) each rank: route, and drop with a capacity factor, over all T tokens, then cut the halves.")
        raise CheckFailure(
            f"rank {rank} ({ctx}): expected in forward, besides the integer counts, these all-to-alls of token rows "
            f"(each half on its own: tokens {_span(halves(case['num_tokens'])[0])} and "
            f"{_span(halves(case['num_tokens'])[1])} of this rank), in any order: {lines}"
            + (f"; unexpected: {'; '.join(r.describe() for r in others)}" if others else "") + f".{hint} {trace}")
    wrong = [r for r in tokens if r.dtype != dtype_name(case["dtype"])]
    if wrong:
        raise CheckFailure(f"rank {rank} ({ctx}): the token rows travel in {wrong[0].dtype}, expected "
                           f"{dtype_name(case['dtype'])} (the dtype of hidden_states). {trace}")
    bwd = [r for r in comm if r.phase == "backward"]
    mirrors = sorted((v, s) for s, v in (_a2a_key(r) for r in tokens + probs))
    if sorted(_a2a_key(r) for r in bwd) != mirrors or any(r.op != "all_to_all" or not _is_float(r) for r in bwd):
        raise CheckFailure(
            f"rank {rank} ({ctx}): every float all-to-all of forward must be mirrored once in backward with its "
            f"splits swapped (the integer counts are not: they carry no gradient): expected "
            f"{'; '.join(f'in {list(s)} out {list(v)}' for s, v in mirrors)}. {trace}")


def check_overlapped_moe_layer(OverlappedMoELayer, *, world_size: int = 2, ep_size: int | None = None,
                               num_experts: int = 4, k: int = 2, hidden: int = 6, ffn: int = 8, num_tokens: int = 12,
                               capacity_factor=None, dtype=torch.float64, seed: int = 0, pattern: str = "random",
                               aux_coeff: float = 0.5, backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """The overlapped layer computes what `MoELayer` computes: numbers, and what each half sends.

    Against `dense_moe_reference`, as `check_moe_layer`: output, aux loss (all T
    tokens, counts before drops), input gradient, router gradient, every local
    expert's gradients. With `capacity_factor` the capacity is that of all T
    tokens of the rank (drop before cutting the halves). Communication per rank:
    integer counts in forward; for each half one dispatch all-to-all of its token
    rows (splits: rows to / from each rank) and one combine (the reverse), in
    any order; in backward each mirrored once with the splits swapped. When
    they are posted and waited: `check_moe_overlap`. On the check's held
    transport (module docstring): rows read before their all-to-all is waited
    are NaN, so a layer that races its own all-to-alls gets wrong numbers here
    every time, not only on a busy machine.
    """
    case = _overlap_case(world_size, ep_size, num_experts, k, hidden, ffn, num_tokens, capacity_factor, dtype, seed,
                         pattern, strict=False)
    ref = _moe_reference(case, aux_coeff)
    results = run_distributed(_overlap_rank, world_size, args=(OverlappedMoELayer, case, aux_coeff, backend),
                              timeout=timeout, backend=backend)
    ctx = _ctx("OverlappedMoELayer", case, world_size, num_tokens, pattern)
    try:
        _compare_moe(case, ref, results, ctx, expect_comm=_expect_overlapped_comm)
    except CheckFailure as exc:
        poisoned = [rank for rank, res in enumerate(results)
                    if any(_poisoned(res.get(key)) for key in ("out", "x_grad"))]
        if poisoned:
            exc.args = (f"{exc.args[0] if exc.args else exc}\nNaN on rank(s) {', '.join(map(str, poisoned))} is "
                        f"the check's poison: rows of an all-to-all were read before its work was waited. "
                        f"{_HELD_NOTE} test_moe_overlap says where (print_overlap_timeline shows the order).",)
        raise


# ---------------------------------------------------------------------------
# The judgement of the schedule
# ---------------------------------------------------------------------------

_NAMES = {"forward": ("dispatch", "combine"), "backward": ("combine's backward", "dispatch's backward")}
_WHERE = {"forward": ("to the experts", "back to the source"),
          "backward": ("to the experts: the output gradient", "back to the source: the input gradient")}


def _token_index(case, members):
    """Row values -> (source rank, token index): an expert's first row names its token, hence its half."""
    index = {}
    for s in members:
        for t, row in enumerate(case["x"][s].tolist()):
            index[tuple(row)] = (s, t)
    return index


def _compute_windows(res, case, members, rank, ctx):
    """Per phase and half: (first seq, last seq, calls) of the local experts' compute on that half's rows."""
    index = _token_index(case, members)
    cut = halves(case["num_tokens"])[1].start
    half_of_call = {}
    for m in res["marks"]:
        if m["kind"] == "forward start" and m["rows"]:
            found = index.get(tuple(m["first"]))
            if found is None:
                raise CheckFailure(
                    f"rank {rank} ({ctx}): local expert {m['expert']} was called on {m['rows']} row(s) whose first "
                    f"is no token of any rank: the experts must receive the token rows themselves (dispatch "
                    f"moves rows unchanged; the probabilities are applied in combine).")
            half_of_call[m["call"]] = 0 if found[1] < cut else 1
    windows = {}
    for m in res["marks"]:
        half = half_of_call.get(m["call"])
        if half is None:
            continue  # a call on zero rows: no compute to hide anything behind
        first, last, calls = windows.get((m["phase"], half), (math.inf, -math.inf, set()))
        windows[(m["phase"], half)] = (min(first, m["seq"]), max(last, m["seq"]), calls | {m["call"]})
    return windows, half_of_call


def _completions(res) -> dict[int, tuple[int, str]]:
    """All-to-all seq -> (seq, how) of the first event that completed it: a held one's release (a wait, another
    completing method of its work, a barrier), another asynchronous one's first wait."""
    done = dict(res.get("released", {}))
    for seq in sorted(res["waited"]):
        target = res["waited"][seq]
        if target is not None and target not in done:
            done[target] = (seq, "wait()")
    return done


def _timeline(res, phase, labels, windows, limit=40) -> str:
    """The rank's events in `phase`, in order: all-to-alls (named), waits (for which), other ways an all-to-all
    was completed, each half's compute."""
    events = []
    seqs = {r.seq: r for r in res["records"]}
    for r in res["records"]:
        if r.phase != phase:
            continue
        if r.op == "wait":
            target = res["waited"].get(r.seq)
            what = labels.get(target, "an all-to-all of the counts or another op" if target else "a Work not "
                              "returned by an all-to-all")
            events.append((r.seq, f"wait for {what}"))
        elif r.op == "all_to_all" and r.seq in labels:
            events.append((r.seq, f"{labels[r.seq]} posted: {r.describe()}"))
        elif r.op in ("all_to_all", "all_gather") and r.dtype in _INT_DTYPES:
            events.append((r.seq, f"token counts exchanged{' (posted)' if r.async_op else ''}: {r.describe()}"))
        else:
            events.append((r.seq, r.describe()))
    for target, (seq, how) in res.get("released", {}).items():
        if how != "wait()" and target in seqs and seqs[target].phase == phase:
            events.append((seq, f"{labels.get(target, f'the all-to-all #{target}')} completed by {how}"))
    for (p, half), (first, last, calls) in windows.items():
        if p == phase:
            events.append((first, f"half {half}: local experts start ({len(calls)} call(s), until #{last})"))
            events.append((last, f"half {half}: local experts end"))
    events.sort()
    lines = [f"    #{seq:<4d} {text}" for seq, text in events]
    if len(lines) > limit:
        lines = lines[:limit] + [f"    ... ({len(lines) - limit} more)"]
    return "\n".join(lines)


def _classify(res, phase, pairs, hidden):
    """The token all-to-alls of `phase` by (half, 0: towards the experts / 1: home), told apart by their splits;
    and a label per record seq for the timeline."""
    keys = {(send, recv): (half, 0) for half, (send, recv) in enumerate(pairs)}
    keys.update({(recv, send): (half, 1) for half, (send, recv) in enumerate(pairs)})
    found, labels = {}, {}
    for r in _token_a2a(res["records"], phase, hidden):
        which = keys.get(_a2a_key(r))
        if which is not None and which not in found:
            found[which] = r
            labels[r.seq] = f"half {which[0]}'s {_NAMES[phase][which[1]]}"
    return found, labels


_HELD_NOTE = ("The check's transport holds every asynchronous all-to-all: until its work is waited (or completed "
              "another way: is_completed(), get_future(), synchronize(), result(), a barrier), its output buffer "
              "holds NaN, the check's poison, whatever the machine's speed.")


def _check_poison(res, *, rank, ctx, labels, done, timelines) -> None:
    """Rows read before the all-to-all that brings them completed: they hold the poison (see `_HELD_NOTE`)."""
    for m in res["marks"]:
        if not m.get("poison") or m["kind"] not in ("forward start", "backward start"):
            continue
        phase = m["phase"]
        waiting = [f"{labels[phase].get(s, f'the all-to-all #{s}')} (posted #{s}"
                   + (f", completed at #{done[s][0]} by {done[s][1]})" if s in done else ", never completed)")
                   for s in m["in_flight"]]
        still = (f" At #{m['seq']} these were still in flight: {'; '.join(waiting)}." if waiting else "")
        note = _HELD_NOTE + still  # one field (two side by side would be matched as one word by the translation)
        if phase == "forward":
            raise CheckFailure(
                f"rank {rank} ({ctx}): forward: local expert {m['expert']} computed (#{m['seq']}) on rows that had "
                f"not arrived: its input held NaN. {note} A half's experts (and anything computed "
                f"from its received buffer) must run after that half's dispatch all-to-all is waited. "
                f"{timelines[phase]}")
        raise CheckFailure(
            f"rank {rank} ({ctx}): backward: local expert {m['expert']}'s backward ran (#{m['seq']}) on an output "
            f"gradient that had not arrived: it held NaN. {note} A half's experts' backward must run "
            f"after that half's combine-backward all-to-all (its output gradient, travelling to the experts) is "
            f"waited. {timelines[phase]}")
    for key, phase, what in (("out", "forward", "the layer's output (what combine brought home)"),
                             ("x_grad", "backward", "the input gradient (what dispatch's backward brought home)")):
        if _poisoned(res.get(key)):
            raise CheckFailure(
                f"rank {rank} ({ctx}): {phase}: {what} held NaN: rows of an all-to-all were read before its work "
                f"was waited. {_HELD_NOTE} Wait for each half's {_NAMES[phase][1]} all-to-all before using what it "
                f"received. {timelines[phase]}")


def _judge(res, *, rank, ctx, case, members, group_rank, kept) -> None:
    if len(members) == 1:
        expect_no_comm(res["records"], rank=rank, context=f"{ctx}; a group of size 1 communicates nothing")
        return
    hidden = case["hidden"]
    pairs = _half_splits(case, kept, members, group_rank, rank)
    done = _completions(res)
    classified = {phase: _classify(res, phase, pairs, hidden) for phase in ("forward", "backward")}
    labels = {phase: classified[phase][1] for phase in classified}
    bare = {phase: f"The {phase} of rank {rank}, in order:\n{_timeline(res, phase, labels[phase], {})}"
            for phase in classified}
    _check_poison(res, rank=rank, ctx=ctx, labels=labels, done=done, timelines=bare)
    windows, _ = _compute_windows(res, case, members, rank, ctx)
    for phase in ("forward", "backward"):
        to_experts, home = _NAMES[phase]
        found, labels = classified[phase]
        trace = f"The {phase} of rank {rank}, in order:\n{_timeline(res, phase, labels, windows)}"
        missing = [f"half {h}'s {_NAMES[phase][kd]}" for h in (0, 1) for kd in (0, 1) if (h, kd) not in found]
        if missing:
            raise CheckFailure(f"rank {rank} ({ctx}): {phase}: no all-to-all of {', '.join(missing)} (each half "
                               f"sends its own rows: its own splits). {trace}")
        for half in (0, 1):
            if (phase, half) not in windows:
                raise CheckFailure(
                    f"rank {rank} ({ctx}): {phase}: no computation of the local experts on half {half}'s rows was "
                    f"seen (call each local expert as a module on the rows, e.g. run_local_experts; in backward "
                    f"the experts' backward runs when the gradient of their output arrives). {trace}")
        for (half, kind), r in sorted(found.items()):
            name = f"half {half}'s {_NAMES[phase][kind]} all-to-all (#{r.seq})"
            if r.async_op and r.seq in res["functional"]:
                raise CheckFailure(f"rank {rank} ({ctx}): {phase}: {name} is a functional collective "
                                   f"(torch.distributed._functional_collectives): the ledger cannot see when its "
                                   f"AsyncCollectiveTensor is waited. Post it with dist.all_to_all_single(..., "
                                   f"async_op=True) and call .wait() on the work it returns. {trace}")
            if r.async_op and r.seq not in done:
                raise CheckFailure(f"rank {rank} ({ctx}): {phase}: {name} was never waited for: call .wait() on "
                                   f"its work before using what it received. {trace}")
        # each half's rows reach its experts only once waited (the poison above shows a read; this, the order)
        for half in (0, 1):
            r, start = found[(half, 0)], windows[(phase, half)][0]
            if r.async_op and done[r.seq][0] > start:
                what = "compute" if phase == "forward" else "run their backward"
                raise CheckFailure(
                    f"rank {rank} ({ctx}): {phase}: half {half}'s {to_experts} all-to-all (#{r.seq}) must be waited "
                    f"before half {half}'s experts {what} on what it brings (from #{start}); it was completed at "
                    f"#{done[r.seq][0]} by {done[r.seq][1]}. {trace}")
        order = sorted((0, 1), key=lambda h: windows[(phase, h)][0])
        first_half, second_half = order
        rules = [(found[(second_half, 0)], first_half, f"half {second_half}'s {to_experts}"),
                 (found[(first_half, 1)], second_half, f"half {first_half}'s {home}")]
        for r, other, name in rules:
            start, end, _ = windows[(phase, other)]
            if not r.async_op:
                raise CheckFailure(f"rank {rank} ({ctx}): {phase}: {name} all-to-all (#{r.seq}) was synchronous: "
                                   f"it returned only once the rows had arrived, so half {other}'s experts could "
                                   f"not run meanwhile. Post it with dist.all_to_all_single(..., async_op=True) and "
                                   f"wait on its work after half {other}'s experts. {trace}")
            posted, (waited, how) = r.seq, done[r.seq]
            if not (posted < start and waited > end):
                late = "posted after they started" if posted > start else f"by {how}, before they ended"
                work = "compute" if phase == "forward" else "run their backward"
                note = "" if how == "wait()" else f" {_HELD_NOTE}"
                raise CheckFailure(
                    f"rank {rank} ({ctx}): {phase}: {name} all-to-all must be in flight while half {other}'s "
                    f"experts {work} (#{start} to #{end}): posted before #{start} and waited after #{end}; it was "
                    f"posted at #{posted} and completed at #{waited} ({late}).{note} "
                    + (f"Post both halves' {to_experts} all-to-alls first, then wait for half {first_half}'s only; "
                       f"post half {first_half}'s {home} as soon as its experts are done, and wait for it after "
                       f"half {second_half}'s experts." if phase == "forward" else
                       f"In backward the same schedule runs in mirror: post both halves' {to_experts} all-to-alls, "
                       f"wait for one, run that half's experts' backward (torch.autograd.backward on its outputs), "
                       f"post its {home} at once, then the other half.") + f" {trace}")


def check_moe_overlap(OverlappedMoELayer, *, world_size: int = 2, ep_size: int | None = None, num_experts: int = 4,
                      k: int = 2, hidden: int = 6, ffn: int = 8, num_tokens: int = 12, dtype=torch.float64,
                      seed: int = 0, aux_coeff: float = 0.5, backend: str = "gloo",
                      timeout: float = _TIMEOUT) -> None:
    """Each all-to-all of one half is in flight while the other half's experts compute, in forward and backward.

    From each rank's ledger (all-to-alls, the waits on their works, the
    experts' compute marked by hooks), on the check's held transport: an
    asynchronous all-to-all completes, and its output stops holding NaN, only
    when the layer completes its work (see the module docstring). Per phase:
    no expert computes on rows (or an output gradient) that had not arrived;
    each half's all-to-all towards the experts is completed before that half's
    experts start; with F the half whose experts compute first and S the
    other, S's all-to-all towards the experts (forward: dispatch; backward:
    combine's backward) is posted (async_op=True) before F's experts start and
    completed after they end, and F's all-to-all home (forward: combine;
    backward: dispatch's backward) is posted before S's experts start and
    completed after they end. Every asynchronous all-to-all is waited. Numbers are not graded here
    (check_overlapped_moe_layer): a layer that computes right but waits at once
    fails only this check. Cases are drawn so that the two halves' all-to-alls
    have different splits on every rank (the ledger tells them apart by the
    splits the routing implies) and each half brings every rank's experts some
    rows; no capacity factor, so that a mistake in token dropping costs the
    numbers cell only.
    """
    case = _overlap_case(world_size, ep_size, num_experts, k, hidden, ffn, num_tokens, None, dtype, seed,
                         "random", strict=True)
    ref = _moe_reference(case, aux_coeff)
    results = run_distributed(_overlap_rank, world_size, args=(OverlappedMoELayer, case, aux_coeff, backend),
                              timeout=timeout, backend=backend)
    ctx = _ctx("OverlappedMoELayer", case, world_size, num_tokens, "random")
    check_consistent([r["records"] for r in results], context=ctx)
    for members in case["groups"]:
        for i, rank in enumerate(members):
            _judge(results[rank], rank=rank, ctx=ctx, case=case, members=members, group_rank=i, kept=ref["kept"])


def print_overlap_timeline(OverlappedMoELayer, *, world_size: int = 2, rank: int = 0, num_experts: int = 4,
                           k: int = 2, num_tokens: int = 12, seed: int = 0, backend: str = "gloo",
                           timeout: float = _TIMEOUT) -> None:
    """Print what one rank of YOUR layer did, in order, in forward and in backward: each all-to-all (which
    half, which direction) when it was posted, each wait (for which all-to-all), and when each half's experts
    computed: the record `check_moe_overlap` judges."""
    _require(0 <= rank < world_size, f"rank ({rank}) must be in [0, {world_size})")
    case = _overlap_case(world_size, None, num_experts, k, 6, 8, num_tokens, None, torch.float64, seed, "random",
                         strict=True)
    ref = _moe_reference(case, 0.5)
    results = run_distributed(_overlap_rank, world_size, args=(OverlappedMoELayer, case, 0.5, backend),
                              timeout=timeout, backend=backend)
    ctx = _ctx("OverlappedMoELayer", case, world_size, num_tokens, "random")
    res, members = results[rank], case["groups"][0]
    pairs = _half_splits(case, ref["kept"], members, rank, rank)
    windows, _ = _compute_windows(res, case, members, rank, ctx)
    print(f"{ctx}, rank {rank}:")
    for phase in ("forward", "backward"):
        _, labels = _classify(res, phase, pairs, case["hidden"])
        print(f"  {phase}:\n{_timeline(res, phase, labels, windows)}")
