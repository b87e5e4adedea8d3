"""Public checks of assignment 03, exercises 1 and 4-5: the P2P helpers and `run_pipeline` (the executor).

The schedule checks live in schedules.py (this package); the checks of the
zero-bubble exercises are in split_backward.py (the split backward) and
zero_bubble.py (ZB-H1, DualPipeV, run_pipeline_zb), built on this module.
The package (autograder/checks/pipeline_parallel/__init__.py) re-exports them all.

    import autograder.checks.pipeline_parallel as checks
    checks.check_one_f_one_b_schedule(one_f_one_b_schedule)
    checks.check_run_pipeline(run_pipeline, one_f_one_b_schedule, num_stages=2, num_microbatches=3)

Schedules are pure functions, checked without any rank (schedules.py):
the actions of every stage are read for the properties that define GPipe,
1F1B and interleaved 1F1B, and the stages' lists are run together on an
ideal timeline to prove that they cannot deadlock.

`run_pipeline` is checked by running it in real gloo ranks on a model built
here: every virtual stage is `y = x + mask * tanh(x W^T + b)`, whose column 0
(the micro-batch's number, its tag) passes unchanged, so each stage can tell
which micro-batch it is running. The stage modules the student's executor
gets are wrapped in a probe that records, while it runs, every forward and
backward (micro-batch, chunk, start and end time) and how many stage outputs
are still alive each time a new one is made (weak references; see
`check_pipeline_memory`). The ranks return their loss, their gradients, what
the probe saw and their communication ledger; verdicts are computed in this
process, against a single-process run of the same stages (spec 3.2). Peers in
the ledger are ranks of the pipeline group; tests use a pipeline group inside
a larger world (`pp_ranks`).

A deadlock is a plausible mistake here: the runner reports one when every
rank has been blocked for about 2 s, and the runs use a short hard timeout
(5 s) for anything slower; either way every rank's stack is shown, with a
hint, and the sends and receives that had no partner (each with the line of
the student's code that posted it: a send to the wrong peer is named there).
Runs keep the runner's collective agreement on (`check_collectives=True`): a
pipeline issues no collectives (the ledger checks that there are none), but
the agreement also keeps each rank's journal of sends and receives, which the
runner matches across ranks when they hang.
Rank programs are module-level functions, and tensors go to `cuda:<rank>`
under nccl.
"""

from __future__ import annotations

import gc
import re
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from autograder.checks import expect_value_errors, inputs_only
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape
from autograder.runtime.dist import DistributedError, rank_device, run_distributed
from autograder.runtime.ledger import CommLedger, format_trace
from autograder.lessons.volume import pp_bubble_fraction

from .schedules import (
    _check_complete, _check_feasible, _normalize, _schedule_lists, check_picture_runs, format_actions, in_flight_peak,
)

__all__ = [
    "TaggedStage", "check_p2p_helpers", "check_run_pipeline", "check_pipeline_memory", "check_run_pipeline_errors",
    "record_timeline", "measured_idle_fraction", "plot_pipeline_timelines",
]

_TIMEOUT = 5.0  # seconds: a deadlock is reported within this, with every rank's stack

_HINTS = [  # (what a rank's failure says, what it usually means)
    (("timeout",), (
        "Hint: the ranks deadlocked. With gloo a send completes only once the peer has posted the matching "
        "receive, so a send that blocks (dist.send, or isend(...).wait() straight away) waits for a peer that is "
        "itself blocked sending. Post sends (dist.isend) and return the handle, block only in receives, and wait "
        "each handle once, later (a second wait() on a gloo send never returns). Also check that every send goes "
        "to the neighbour that receives it: activations to the next rank, gradients to the previous one, as "
        "ranks of pp_group.")),
    (("Received data size doesn't match", "op.preamble.length <= op.nbytes"), (
        "Hint: a receive buffer's size differs from what the peer sent (gloo aborts the process): "
        "recv_forward / recv_backward must allocate exactly the given shape and dtype, and the message must be "
        "the one the receiver expects (a micro-batch is [b, h] in the micro-batches' dtype).")),
    (("Pair is not connected",), (
        "Hint: a rank sent to or received from itself (gloo has no connection to itself): the peer was computed "
        "wrongly. Peers are ranks of pp_group (pp_group.rank(), pp_group.size()), not global ranks; and with one "
        "stage there is nobody to talk to.")),
    (("not a leaf Tensor", "does not require grad and does not have a grad_fn",
      "grad can be implicitly created only for scalar outputs"), (
        "Hint: a stage's input must be a leaf that requires grad, so that backward fills its .grad: a received "
        "tensor needs .requires_grad_(); with p = 1 and several chunks, hand chunk c's output to chunk c + 1 as "
        "output.detach().requires_grad_() (a send would have cut the graph there too).")),
    (("is not part of group", "not part of the group", "Invalid rank", "invalid rank"), (
        "Hint: a peer is not a rank of pp_group. Use group ranks (pp_group.rank(), (rank + 1) % pp_group.size()) "
        "and pass them as group_dst= / group_src=; dst= / src= are global ranks.")),
]


def _explained(exc: DistributedError) -> DistributedError:
    """The same error with a hint after its summary when a rank's failure matches a known cause."""
    text = "\n".join(f"{f.kind} {f.detail} {f.output_tail}" for f in exc.failures)
    for needles, hint in _HINTS:
        if any(n == "timeout" and any(f.kind == "timeout" for f in exc.failures) or (n != "timeout" and n in text)
               for n in needles):
            return DistributedError(f"{exc.summary}\n{hint}", exc.failures)
    return exc


_FRAME = re.compile(r'File "[^"]*", line \d+, in (\S+)')


def _name_stubs(exc: DistributedError) -> None:
    """When every rank that raised hit a stub, name the stub (the innermost frame) for the report."""
    raised = [f for f in exc.failures if f.kind == "exception"]
    if raised and all(f.detail.rstrip().endswith("NotImplementedError") for f in raised):
        for f in raised:
            frames = _FRAME.findall(f.detail)
            if frames and not f.stub:
                f.stub = frames[-1]


def _run_ranks(fn, world_size, *, args, timeout, backend):
    """run_distributed for pipeline checks, hints on failure. The collective agreement stays on: its journal of
    each rank's sends and receives is what a deadlock's report matches across ranks (see the module docstring)."""
    try:
        return run_distributed(fn, world_size, args=args, timeout=timeout, backend=backend)
    except DistributedError as exc:
        _name_stubs(exc)
        new = _explained(exc)
        if new is exc:
            raise
        raise new from None


# ---------------------------------------------------------------------------
# Rank-side machinery: groups, the tagged model, the probe
# ---------------------------------------------------------------------------

def _layout(world_size: int, pp_ranks) -> list[list[int]]:
    groups = [list(range(world_size))] if pp_ranks is None else [sorted(int(r) for r in g) for g in pp_ranks]
    seen = [r for g in groups for r in g]
    if len(seen) != len(set(seen)) or any(not 0 <= r < world_size for r in seen):
        raise ValueError(f"check parameters: pp_ranks {pp_ranks} must be disjoint lists of ranks < {world_size}")
    if len({len(g) for g in groups}) != 1:
        raise ValueError(f"check parameters: every pipeline group in {pp_ranks} must have the same size")
    return groups


def _join(rank: int, layout):
    """Create every pipeline group (all ranks, same order, as torch requires); return this rank's or None."""
    if layout == [list(range(dist.get_world_size()))]:
        return dist.group.WORLD
    mine = None
    for ranks in layout:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


class _Sleep(torch.autograd.Function):
    """Identity that sleeps `forward_s` in forward and `backward_s` in backward (a stage with a known cost)."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        if forward_s:
            time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.backward_s:
            time.sleep(ctx.backward_s)
        return grad, None, None


class TaggedStage(nn.Module):
    """One virtual stage: `y = x + mask * tanh(x W^T + b)`; column 0 (the micro-batch's tag) passes unchanged.

    With `forward_s` / `backward_s` it also sleeps that long in forward and in
    backward, so that a timeline drawn on a shared CPU shows the schedule, not
    the machine's load.
    """

    def __init__(self, weight, bias, *, forward_s: float = 0.0, backward_s: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone())
        mask = torch.ones(weight.shape[0], dtype=weight.dtype, device=weight.device)
        mask[0] = 0
        self.register_buffer("mask", mask)
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x):
        z = F.linear(x, self.weight, self.bias)
        if self.forward_s or self.backward_s:
            z = _Sleep.apply(z, self.forward_s, self.backward_s)
        return x + self.mask * torch.tanh(z)  # [b, h] -> [b, h]


class _BackwardStarts(torch.autograd.Function):
    """Identity on a stage's output whose backward notes that this micro-batch's backward has begun."""

    @staticmethod
    def forward(ctx, y, probe, mb):
        ctx.probe, ctx.mb = probe, mb
        return y.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.probe.log.events.append(["B", ctx.mb, ctx.probe.chunk, time.perf_counter(), None])
        ctx.probe.log.open_backward[ctx.probe.chunk] = len(ctx.probe.log.events) - 1
        return grad, None, None


def _microbatch_tag(x, num_microbatches: int) -> int | None:
    """The micro-batch a stage input belongs to: its first element, a whole number in [0, num_microbatches)."""
    try:
        value = float(x.detach().reshape(-1, x.shape[-1])[0, 0])
    except Exception:  # noqa: BLE001 - not a [b, h] tensor: reported by the order check
        return None
    ok = value == int(value) and 0 <= value < num_microbatches if value == value else False
    return int(value) if ok else None


class _Log:
    def __init__(self, num_microbatches: int, measure_memory: bool):
        self.num_microbatches = num_microbatches
        self.measure_memory = measure_memory
        self.events: list[list] = []  # [kind, mb, chunk, start, end]
        self.open_backward: dict[int, int] = {}
        self.refs: list = []  # weak references to every stage output made so far
        self.held: list[tuple] = []  # (mb, chunk, outputs alive right after this one was made)

    def alive(self) -> int:
        gc.collect()  # cheap after gc.freeze(); no verdict may depend on when the collector last ran
        return sum(ref() is not None for ref in self.refs)


class _Probe(nn.Module):
    """Wraps a chunk: records its forwards and backwards while they run, and the outputs still alive."""

    def __init__(self, inner: nn.Module, chunk: int, log: _Log):
        super().__init__()
        self.inner, self.chunk, self.log = inner, chunk, log
        inner.weight.register_post_accumulate_grad_hook(self._backward_done)

    def _backward_done(self, _param):
        i = self.log.open_backward.pop(self.chunk, None)
        if i is not None:
            self.log.events[i][4] = time.perf_counter()

    def forward(self, x):
        t0 = time.perf_counter()
        mb = _microbatch_tag(x, self.log.num_microbatches)
        y = _BackwardStarts.apply(self.inner(x), self, mb)
        self.log.events.append(["F", mb, self.chunk, t0, time.perf_counter()])
        if self.log.measure_memory:
            self.log.refs.append(weakref.ref(y))
            self.log.held.append((mb, self.chunk, self.log.alive()))
        return y


# ---------------------------------------------------------------------------
# The single-process reference and the case data
# ---------------------------------------------------------------------------

def _make_case(p, m, v, batch, hidden, dtype, seed) -> dict:
    if hidden < 2:
        raise ValueError("check parameters: hidden must be >= 2 (column 0 carries the micro-batch's tag)")
    gen = torch.Generator().manual_seed(seed)
    n = p * v
    weights = [torch.randn(hidden, hidden, generator=gen, dtype=torch.float64) / hidden ** 0.5 for _ in range(n)]
    biases = [0.5 * torch.randn(hidden, generator=gen, dtype=torch.float64) for _ in range(n)]
    xs, ts = [], []
    for mb in range(m):
        x = torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
        t = torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
        x[:, 0] = mb
        t[:, 0] = mb
        xs.append(x.to(dtype))
        ts.append(t.to(dtype))
    # Single-process: the same stages in order, the mean of the micro-batch losses, one backward, float64.
    stages = [TaggedStage(w, b) for w, b in zip(weights, biases)]
    total = 0.0
    for x, t in zip(xs, ts):
        z = x.double()
        for stage in stages:
            z = stage(z)
        loss = F.mse_loss(z, t.double()) / m
        loss.backward()
        total += loss.item()
    grads = [(s.weight.grad.to(dtype), s.bias.grad.to(dtype)) for s in stages]
    return {"weights": [w.to(dtype) for w in weights], "biases": [b.to(dtype) for b in biases],
            "microbatches": xs, "targets": ts, "loss": total, "grads": grads}


def _portable(value):
    """What a rank may send back of the student's return value."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return f"<{type(value).__name__}: {value!r:.80}>"


def _pipeline_rank(rank, world_size, run_pipeline, layout, schedules, case, num_chunks, measure_memory,
                   sleeps, backend):
    group = _join(rank, layout)
    if group is None:
        return None
    dev = rank_device(rank, backend)
    p, r = group.size(), group.rank()
    log = _Log(len(case["microbatches"]), measure_memory)
    probes = []
    for c in range(num_chunks):
        k = c * p + r
        inner = TaggedStage(case["weights"][k].to(dev), case["biases"][k].to(dev),
                            forward_s=sleeps[0] / num_chunks, backward_s=sleeps[1] / num_chunks)
        probes.append(_Probe(inner, c, log))
    stage_module = probes if num_chunks > 1 else probes[0]
    microbatches = [x.to(dev) for x in case["microbatches"]]
    targets = [t.to(dev) for t in case["targets"]]
    schedule = list(schedules[r])
    if measure_memory:
        gc.freeze()  # what exists now is set aside: later collections only look at objects made by the step
    with CommLedger() as ledger:
        loss = run_pipeline(stage_module, schedule, microbatches, targets, F.mse_loss, pp_group=group)
    held_after = log.alive() if measure_memory else None
    if measure_memory:
        gc.unfreeze()
    grads = [(_grad(pr.inner.weight), _grad(pr.inner.bias)) for pr in probes]
    return {"group_rank": r, "loss": _portable(loss), "grads": grads, "events": log.events, "held": log.held,
            "held_after": held_after, "records": ledger.records}


def _grad(param):
    return param.grad.detach().cpu() if param.grad is not None else None


def _probe_rank(rank, world_size, run_pipeline, num_chunks):
    gen = torch.Generator().manual_seed(0)
    chunks = [TaggedStage(torch.randn(2, 2, generator=gen), torch.zeros(2)) for _ in range(num_chunks)]
    x = torch.zeros(1, 2)
    if num_chunks == 1:  # one stage, one micro-batch: the only schedule there is
        schedule, stage = [("F", 0), ("B", 0)], chunks[0]
    else:
        schedule = [("F", 0, c) for c in range(num_chunks)] + [("B", 0, c) for c in reversed(range(num_chunks))]
        stage = chunks
    try:
        run_pipeline(stage, schedule, [x], [x], F.mse_loss, pp_group=dist.group.WORLD)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - only a stub matters here; the real checks judge the rest
        pass
    return None


def _probe_executor(run_pipeline, num_chunks: int, timeout: float) -> None:
    """Raise the runner's stub error if run_pipeline is still the stub (one rank, one micro-batch)."""
    try:
        _run_ranks(_probe_rank, 1, args=(run_pipeline, num_chunks), timeout=timeout, backend="gloo")
    except DistributedError as exc:
        if exc.stub:
            raise


def _run(run_pipeline, schedule_fn, *, num_stages, num_microbatches, num_chunks, world_size, pp_ranks, batch,
         hidden, dtype, seed, measure_memory, sleeps, backend, timeout):
    p, m, v = num_stages, num_microbatches, num_chunks
    world_size = world_size or p
    layout = _layout(world_size, pp_ranks)
    if len(layout[0]) != p:
        raise ValueError(f"check parameters: pipeline groups {layout} do not have num_stages = {p} ranks")
    name = getattr(schedule_fn, "__name__", "schedule")
    try:
        schedules = _schedule_lists(schedule_fn, p, m, v, name)
    except NotImplementedError:
        if v == 1:  # exercise 4: a stub run_pipeline is this cell's own stub, named first
            _probe_executor(run_pipeline, v, timeout)
        raise  # the schedule's stub: named with the exercise that owns it (course_notebook)
    try:  # a schedule that no executor could run is reported here, not as a hang or a wrong gradient
        for s, acts in enumerate(schedules):
            args = (p, s, m) if v == 1 else (p, s, m, v)
            what = f"{name}{args}"
            _check_complete(_normalize(acts, what=what, num_chunks=v), m=m, v=v, what=what,
                            shown=f"stage {s}: {format_actions(acts)}")
        _check_feasible(schedules, p=p, m=m, v=v, name=name)
    except CheckFailure as exc:
        raise CheckFailure(f"run_pipeline is run here with the lists your {name} returns, and they are not a "
                           f"schedule any executor could run; fix {name} first (its own test says more). "
                           f"run_pipeline was not run.\n{exc}") from None
    case = _make_case(p, m, v, batch, hidden, dtype, seed)
    results = _run_ranks(_pipeline_rank, world_size, timeout=timeout, backend=backend,
                         args=(run_pipeline, layout, schedules, inputs_only(case, "loss", "grads"), v,
                               measure_memory, sleeps, backend))
    return layout, schedules, case, results


def _where(layout, world_size) -> str:
    if layout == [list(range(world_size))]:
        return f"world of {world_size}"
    if len(layout) == 1:
        return f"pipeline group {layout[0]} of a world of {world_size}"
    return f"pipeline groups {layout} of a world of {world_size}"


def _ctx(name, p, m, v, layout, world_size, dtype) -> str:
    where = _where(layout, world_size)
    chunks = f", {v} chunks per rank" if v > 1 else ""
    return f"run_pipeline with {name}, p = {p}, m = {m}{chunks}, {where}, {dtype_name(dtype)}"


def _members(layout, results):
    """(global rank, result) of every rank in a pipeline group (every group of the layout), in group-rank order."""
    return [(g, results[g]) for ranks in layout for g in ranks]


# ---------------------------------------------------------------------------
# run_pipeline: numbers, executed order, communication
# ---------------------------------------------------------------------------

def _executed(events) -> list[tuple]:
    return [(e[0], e[1], e[2]) for e in events]


def _check_executed_order(res, schedule, *, v, rank, ctx) -> None:
    expected = [(a[0], a[1], a[2] if len(a) == 3 else 0) for a in schedule]
    got = _executed(res["events"])
    fmt = (lambda t: f"{t[0]}{'?' if t[1] is None else t[1]}") if v == 1 else \
        (lambda t: f"{t[0]}{'?' if t[1] is None else t[1]}c{t[2]}")
    if got == expected:
        return
    i = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    what_got = fmt(got[i]) if i < len(got) else "nothing more"
    what_exp = fmt(expected[i]) if i < len(expected) else "nothing more"
    extra = ""
    if i < len(got) and got[i][1] is None:
        extra = (" ('?': the stage got data that is no micro-batch's: a receive from the wrong peer, or a "
                 "message received out of order)")
    raise CheckFailure(
        f"rank {rank} (group rank {res['group_rank']}, {ctx}): the stage ran {what_got} as its action #{i}, "
        f"but its schedule says {what_exp}{extra}. Executed (recorded while it ran):\n"
        f"    {' '.join(fmt(t) for t in got)}\n  schedule given to run_pipeline:\n"
        f"    {' '.join(fmt(t) for t in expected)}")


def _p2p_counts(records) -> dict:
    """(op, peer, shape, dtype) -> count, for send and recv; everything else listed apart."""
    counts, other = {}, []
    for r in records:
        if r.op == "wait":
            continue
        if r.op in ("send", "recv"):
            key = (r.op, r.peer, tuple(r.shape), r.dtype)
            counts[key] = counts.get(key, 0) + 1
        else:
            other.append(r)
    return counts, other


def _expected_p2p(p, r, m, v, shape, dtype) -> dict:
    """What group rank r sends and receives in one step, by (op, peer)."""
    if p == 1:
        return {}
    nxt, prv = (r + 1) % p, (r - 1) % p
    first_rank_chunks = m * (v - 1) if r == 0 else m * v  # virtual stage 0 receives no activation
    last_rank_chunks = m * (v - 1) if r == p - 1 else m * v  # the last virtual stage sends no activation
    exp = {}

    def add(op, peer, n):
        if n:
            key = (op, peer, tuple(shape), dtype_name(dtype))
            exp[key] = exp.get(key, 0) + n

    add("send", nxt, last_rank_chunks)   # activations forward
    add("recv", prv, first_rank_chunks)  # activations in
    add("send", prv, first_rank_chunks)  # gradients of my inputs, backward
    add("recv", nxt, last_rank_chunks)   # gradients of my outputs
    return exp


def _describe_p2p(key, n) -> str:
    op, peer, shape, dt = key
    direction = "to" if op == "send" else "from"
    return f"{n} {op} {direction} group rank {peer} of {fmt_shape(shape)} {dt}"


def _check_p2p(res, *, p, m, v, shape, dtype, rank, ctx) -> None:
    r = res["group_rank"]
    got, other = _p2p_counts(res["records"])
    trace = f"Communication of rank {rank}:\n{format_trace(res['records'], rank)}"
    if other:
        raise CheckFailure(f"rank {rank} ({ctx}): a pipeline communicates only by P2P sends and receives; "
                           f"saw {other[0].op} ({len(other)} collective op(s)). {trace}")
    exp = _expected_p2p(p, r, m, v, shape, dtype)
    if got == exp:
        return
    if p == 1:
        raise CheckFailure(f"rank {rank} ({ctx}): one stage (p = 1) has no neighbour to talk to: expected no "
                           f"communication (a send to itself crashes gloo; pass tensors between its own "
                           f"chunks directly). {trace}")
    missing = [_describe_p2p(k, n - got.get(k, 0)) for k, n in exp.items() if got.get(k, 0) < n]
    extra = [_describe_p2p(k, n - exp.get(k, 0)) for k, n in got.items() if n > exp.get(k, 0)]
    parts = []
    if missing:
        parts.append("missing " + "; ".join(missing))
    if extra:
        parts.append("unexpected " + "; ".join(extra))
    nxt, prv = (r + 1) % p, (r - 1) % p
    raise CheckFailure(
        f"rank {rank} (group rank {r} of {p}, {ctx}): {', '.join(parts)}. Expected per step: "
        f"{'; '.join(_describe_p2p(k, n) for k, n in exp.items())} (next = group rank {nxt}, previous = "
        f"group rank {prv}; activations go to the next rank, gradients to the previous). {trace}")


def _check_symmetry(members, *, p, ctx) -> None:
    """Every activation a rank sends forward comes back as a gradient of the same shape and dtype (P2P symmetry)."""
    if p == 1:
        return
    sent = {}
    for g, res in members:
        for rec in res["records"]:
            if rec.op == "send":
                sent.setdefault((res["group_rank"], rec.peer), []).append((tuple(rec.shape), rec.dtype))
    for g, res in members:
        r = res["group_rank"]
        nxt = (r + 1) % p
        if p == 2:
            continue  # next and previous are the same rank: the per-rank counts already pin both directions
        fwd = sorted(sent.get((r, nxt), []))
        bwd = sorted(sent.get((nxt, r), []))
        if fwd != bwd:
            raise CheckFailure(
                f"{ctx}: group rank {r} sent {len(fwd)} tensor(s) forward to group rank {nxt}, which sent "
                f"{len(bwd)} gradient(s) back; each activation sent forward must come back as one gradient "
                f"of the same shape and dtype (forward: send_forward, backward: send_backward).")


def _check_loss(loss, expected, *, rank, group_rank, p, m, dtype, ctx) -> None:
    if group_rank != p - 1:
        if loss is not None:
            raise CheckFailure(f"rank {rank} (group rank {group_rank}; {ctx}): run_pipeline returned {loss!r}; only "
                               f"the last stage (group rank {p - 1}) returns the loss, the others None")
        return
    where = f"rank {rank} (group rank {group_rank}, the last stage; {ctx})"
    if not isinstance(loss, float):
        raise CheckFailure(f"{where}: run_pipeline returned {loss!r}; expected the mean loss as a Python float "
                           f"(e.g. with .item())")
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    if abs(loss - expected) > tol * max(1.0, abs(expected)):
        ratio = loss / expected if expected else float("nan")
        why = f" ({m} micro-batches: summed instead of averaged?)" if m > 1 and abs(ratio - m) < 1e-3 * m else ""
        raise CheckFailure(f"{where}: loss {loss:.10g}, expected {expected:.10g}, the mean of the {m} micro-batch "
                           f"losses; ratio {ratio:.6g}{why}")


def check_run_pipeline(run_pipeline, schedule_fn, *, num_stages: int = 2, num_microbatches: int = 3,
                       num_chunks: int = 1, world_size: int | None = None, pp_ranks=None, batch: int = 2,
                       hidden: int = 5, dtype=torch.float64, seed: int = 0, backend: str = "gloo",
                       timeout: float = _TIMEOUT) -> None:
    """run_pipeline(stage or chunks, schedule, microbatches, targets, F.mse_loss, pp_group=...) on every rank.

    The schedule of each rank is `schedule_fn(p, rank, m)` (or `(p, rank, m, v)`
    with `num_chunks` = v > 1, chunks passed as a list). Checked, per rank of
    the pipeline group: the loss (the mean of the micro-batch losses, a Python
    float) on group rank p - 1 and None elsewhere; the gradient of every
    parameter of every chunk against single-process training on the same
    micro-batches (float64 reference); the order in which the stages actually
    ran their forwards and backwards (recorded while they ran) equals the
    schedule they were given; and the communication: only sends and receives
    of `[b, h]` in the tensor's dtype, activations to the next group rank and
    gradients to the previous one, one of each per micro-batch, chunk and
    boundary (peers are ranks of the pipeline group), each activation sent
    forward mirrored by one gradient sent back.
    """
    p, m, v = num_stages, num_microbatches, num_chunks
    world = world_size or p
    layout, schedules, case, results = _run(
        run_pipeline, schedule_fn, num_stages=p, num_microbatches=m, num_chunks=v, world_size=world,
        pp_ranks=pp_ranks, batch=batch, hidden=hidden, dtype=dtype, seed=seed, measure_memory=False,
        sleeps=(0.0, 0.0), backend=backend, timeout=timeout)
    name = getattr(schedule_fn, "__name__", "schedule")
    ctx = _ctx(name, p, m, v, layout, world, dtype)
    members = _members(layout, results)
    findings = Findings()
    for g, res in members:
        r = res["group_rank"]
        with findings.communication():
            _check_executed_order(res, schedules[r], v=v, rank=g, ctx=ctx)
        with findings.communication():
            _check_p2p(res, p=p, m=m, v=v, shape=(batch, hidden), dtype=dtype, rank=g, ctx=ctx)
    for ranks in layout:
        with findings.communication():
            _check_symmetry([(g, results[g]) for g in ranks], p=p, ctx=ctx)
    for g, res in members:  # the loss first: a wrong scale shows there most plainly
        r = res["group_rank"]
        with findings.numbers():
            _check_loss(res["loss"], case["loss"], rank=g, group_rank=r, p=p, m=m, dtype=dtype, ctx=ctx)
    for g, res in members:
        r = res["group_rank"]
        for c in range(v):
            k = c * p + r
            exp_w, exp_b = case["grads"][k]
            got_w, got_b = res["grads"][c]
            where = f"{ctx}: stage {k}" + (f" (chunk {c} of group rank {r})" if v > 1 else "")
            with findings.numbers():
                assert_close(got_w, exp_w, name=f"{where}: weight gradient", rank=g)
                assert_close(got_b, exp_b, name=f"{where}: bias gradient", rank=g)
    findings.raise_if_any()


def check_pipeline_memory(run_pipeline, schedule_fn, *, num_stages: int = 3, num_microbatches: int = 5,
                          num_chunks: int = 1, world_size: int | None = None, pp_ranks=None, batch: int = 2,
                          hidden: int = 4, seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """The stage outputs run_pipeline keeps alive: exactly what its schedule needs, and none after it returns.

    Every time a stage module returns an output, the probe counts the outputs
    of this rank that are still alive (weak references to the tensors the
    stage returned, after `gc.collect()`). The count must equal the schedule's
    own need at that moment (forwards so far minus backwards so far; at most
    min(p - s, m) for 1F1B, m for GPipe), and be 0 once run_pipeline has
    returned. An output is alive while anything references it: the dict entry
    that backward uses (needed), but also a send handle that was not dropped,
    a list never emptied, or a local variable still naming the last output.
    Why the count is deterministic: each rank freezes the objects that exist
    before the step (`gc.freeze()`), and `gc.collect()` runs before every
    count, so cyclic garbage is always gone when counting and only what is
    reachable is counted, whatever the collector did before.
    """
    p, m, v = num_stages, num_microbatches, num_chunks
    world = world_size or p
    layout, schedules, case, results = _run(
        run_pipeline, schedule_fn, num_stages=p, num_microbatches=m, num_chunks=v, world_size=world,
        pp_ranks=pp_ranks, batch=batch, hidden=hidden, dtype=torch.float64, seed=seed, measure_memory=True,
        sleeps=(0.0, 0.0), backend="gloo", timeout=timeout)
    name = getattr(schedule_fn, "__name__", "schedule")
    ctx = _ctx(name, p, m, v, layout, world, torch.float64)
    for g, res in _members(layout, results):
        r = res["group_rank"]
        schedule = schedules[r]
        live, need = 0, []
        for a in schedule:  # the schedule's own need right after each forward
            live += 1 if a[0] == "F" else -1
            if a[0] == "F":
                need.append(live)
        got = [h[2] for h in res["held"]]
        peak_need = in_flight_peak(schedule)
        for i, (want, have) in enumerate(zip(need, got)):
            if have != want:
                mb, c = res["held"][i][0], res["held"][i][1]
                label = f"F{mb}" + (f"c{c}" if v > 1 else "")
                raise CheckFailure(
                    f"rank {g} (group rank {r} of {p}; {ctx}): right after its forward #{i} ({label}) {have} stage "
                    f"outputs were alive, but its schedule needs {want} at that point (forwarded, not yet "
                    f"backwarded; at most {peak_need} for this stage). "
                    + ("Something keeps outputs alive after their backward: an entry never removed from a dict, "
                       "a send handle kept (it keeps its tensor and graph alive), or a local variable still naming "
                       "an earlier output. " if have > want else
                       "An output the schedule still needs for its backward was dropped or never kept. ")
                    + f"Alive after each forward: {got}; needed: {need}.\n  schedule: {format_actions(schedule)}")
        if len(got) != len(need):
            raise CheckFailure(f"rank {g} ({ctx}): the stage ran {len(got)} forwards; its schedule has {len(need)}")
        if res["held_after"]:
            raise CheckFailure(f"rank {g} (group rank {r}; {ctx}): {res['held_after']} stage output(s) still alive "
                               f"after run_pipeline returned: drop every output, input and send handle when the "
                               f"step ends (wait the handles first)")


# ---------------------------------------------------------------------------
# The error contract of run_pipeline
# ---------------------------------------------------------------------------

def _error_rank(rank, world_size, run_pipeline, kind, backend):
    dev = rank_device(rank, backend)
    gen = torch.Generator().manual_seed(0)
    mods = [TaggedStage(torch.randn(3, 3, generator=gen, dtype=torch.float64),
                        torch.zeros(3, dtype=torch.float64)).to(dev) for _ in range(2)]
    xs = [torch.zeros(2, 3, dtype=torch.float64, device=dev) for _ in range(3)]
    ts = [torch.zeros(2, 3, dtype=torch.float64, device=dev) for _ in range(3)]
    stage, pg = mods[0], dist.group.WORLD
    schedule = [("F", i) for i in range(3)] + [("B", i) for i in range(3)]
    if kind == "targets":
        ts = ts[:2]
    elif kind == "group":
        pg = None
    elif kind == "action":
        schedule = schedule[:3] + [("X", 0)] + schedule[4:]
    elif kind == "range":
        schedule = schedule + [("F", 3), ("B", 3)]
    elif kind == "order":
        schedule = [("B", 0)] + [a for a in schedule if a != ("B", 0)]
    elif kind == "chunks":
        stage = mods
    err = None
    with CommLedger() as ledger:
        try:
            run_pipeline(stage, schedule, xs, ts, F.mse_loss, pp_group=pg)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the verdict is made in the parent
            err = (type(exc).__name__, str(exc))
    return {"error": err, "records": ledger.records}


def check_run_pipeline_errors(run_pipeline, *, world_size: int = 2, backend: str = "gloo",
                              timeout: float = _TIMEOUT) -> None:
    """Invalid arguments raise ValueError on every rank before any communication, naming the sizes.

    Cases, each run on its own: 3 micro-batches with 2 targets; a pp_group
    that is not a ProcessGroup; an action that is not ('F' or 'B',
    microbatch); a micro-batch index past the end (3 of 3); a backward before
    its forward; two chunks with actions that name no chunk.
    """
    cases = [("3 micro-batches, 2 targets", "targets", ("3", "2")),
             ("pp_group=None", "group", ()),
             ("an action ('X', 0)", "action", ()),
             ("actions for micro-batch 3 of 3", "range", ("3",)),
             ("('B', 0) before ('F', 0)", "order", ()),
             ("two chunks, actions without a chunk index", "chunks", ("2",))]
    for label, kind, must in cases:
        try:
            results = _run_ranks(_error_rank, world_size, args=(run_pipeline, kind, backend), timeout=timeout,
                                 backend=backend)
        except DistributedError as exc:
            if all(f.kind == "exception" and f.detail.rstrip().endswith("NotImplementedError")
                   for f in exc.failures):
                raise
            raise CheckFailure(f"run_pipeline with {label}: expected ValueError on every rank before any "
                               f"communication; instead the run failed:\n{exc}") from None
        expect_value_errors([[res] for res in results], [(f"run_pipeline with {label}", list(must))], world_size,
                            communication="any send or receive")


# ---------------------------------------------------------------------------
# The P2P helpers
# ---------------------------------------------------------------------------

def _p2p_rank(rank, world_size, fns, layout, payload, shape, dtype, noncontiguous, backend):
    group = _join(rank, layout)
    if group is None:
        return None
    dev = rank_device(rank, backend)
    send_forward, recv_forward, send_backward, recv_backward = fns
    r = group.rank()

    def outgoing(t):
        t = t.to(dev)
        return t.t().contiguous().t() if noncontiguous else t  # a transposed view of [w, b] storage

    act, grad = outgoing(payload["act"][r]), outgoing(payload["grad"][r])
    act_before, grad_before = act.clone(), grad.clone()
    with CommLedger() as ledger:
        h1 = send_forward(act, pp_group=group)
        got_act = recv_forward(shape, dtype, pp_group=group, device=dev)
        waited1 = hasattr(h1, "wait")
        if waited1:
            h1.wait()
        h2 = send_backward(grad, pp_group=group)
        got_grad = recv_backward(shape, dtype, pp_group=group, device=dev)
        waited2 = hasattr(h2, "wait")
        if waited2:
            h2.wait()
    return {"group_rank": r, "act": _portable(got_act), "grad": _portable(got_grad),
            "handles": (type(h1).__name__, waited1, type(h2).__name__, waited2),
            "modified": not (torch.equal(act, act_before) and torch.equal(grad, grad_before)),
            "records": ledger.records}


def check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, *, world_size: int = 2,
                      pp_ranks=None, shape=(3, 4), dtype=torch.float64, noncontiguous: bool = False, seed: int = 0,
                      backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """Each rank of the pipeline group sends forward, receives from the previous rank, sends backward, receives
    from the next (wrapping around), in that order.

    Checked: send_forward / send_backward return a handle with .wait() (a
    non-blocking send: if they blocked, every rank would wait in its send and
    the run would deadlock); recv_forward returns exactly the previous group
    rank's tensor and recv_backward the next group rank's, with the requested
    shape and dtype; the sent tensors are unchanged; the ledger shows one send
    to the next and one receive from the previous group rank, then one send to
    the previous and one receive from the next (peers are ranks of pp_group,
    not global ranks). With noncontiguous=True the tensors sent are
    transposed views.
    """
    layout = _layout(world_size, pp_ranks)
    p = len(layout[0])
    if p < 2:
        raise ValueError("check parameters: the P2P helpers need a pipeline group of at least 2 ranks")
    gen = torch.Generator().manual_seed(seed)
    payload = {"act": [(100 * (i + 1) + torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)
                       for i in range(p)],
               "grad": [(-100 * (i + 1) + torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)
                        for i in range(p)]}
    fns = (send_forward, recv_forward, send_backward, recv_backward)
    results = _run_ranks(_p2p_rank, world_size, timeout=timeout, backend=backend,
                         args=(fns, layout, payload, tuple(shape), dtype, noncontiguous, backend))
    where = _where(layout, world_size)
    ctx = f"P2P helpers, {where}, {fmt_shape(shape)} {dtype_name(dtype)}"
    findings = Findings()

    def whose(t, kind):
        for i, cand in enumerate(payload[kind]):
            if isinstance(t, torch.Tensor) and t.shape == cand.shape and torch.equal(t.to(cand.dtype), cand):
                return i
        return None

    for g, res in _members(layout, results):
        r = res["group_rank"]
        nxt, prv = (r + 1) % p, (r - 1) % p
        with findings.communication():
            name1, ok1, name2, ok2 = res["handles"]
            if not (ok1 and ok2):
                which = "send_forward" if not ok1 else "send_backward"
                got = name1 if not ok1 else name2
                raise CheckFailure(f"rank {g} ({ctx}): {which} returned {got}; expected the handle of a posted "
                                   f"send (what dist.isend returns), so the caller can wait it later")
            if res["modified"]:
                raise CheckFailure(f"rank {g} ({ctx}): a send modified the tensor it was given")
            expected = [("send", nxt), ("recv", prv), ("send", prv), ("recv", nxt)]
            comm = [(x.op, x.peer) for x in res["records"] if x.op != "wait"]
            shapes = {(tuple(x.shape), x.dtype) for x in res["records"] if x.op != "wait"}
            if comm != expected or shapes != {(tuple(shape), dtype_name(dtype))}:
                raise CheckFailure(
                    f"rank {g} (group rank {r} of {p}; {ctx}): expected, in order, a send to group rank {nxt}, a "
                    f"receive from {prv}, a send to {prv}, a receive from {nxt}, each of {fmt_shape(shape)} "
                    f"{dtype_name(dtype)} (peers are ranks of pp_group: pp_group.rank(), not the global rank). "
                    f"Communication of rank {g}:\n{format_trace(res['records'], g)}")
        for kind, fn_name, want, tensor in (("act", "recv_forward", prv, res["act"]),
                                             ("grad", "recv_backward", nxt, res["grad"])):
            with findings.numbers():
                if not isinstance(tensor, torch.Tensor):
                    raise CheckFailure(f"rank {g} ({ctx}): {fn_name} returned {tensor!r}; expected a tensor")
                if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                    raise CheckFailure(f"rank {g} ({ctx}): {fn_name} returned {fmt_shape(tensor.shape)} "
                                       f"{dtype_name(tensor.dtype)}; expected {fmt_shape(shape)} {dtype_name(dtype)}")
                src = whose(tensor, kind)
                if src != want:
                    other = "act" if kind == "grad" else "grad"
                    src_other = whose(tensor, other)
                    what = (f"group rank {src}'s" if src is not None else
                            f"group rank {src_other}'s {'activation' if other == 'act' else 'gradient'}"
                            if src_other is not None else "data that no rank sent")
                    raise CheckFailure(f"rank {g} (group rank {r} of {p}; {ctx}): {fn_name} returned {what}; "
                                       f"expected group rank {want}'s "
                                       f"{'activation (the previous stage)' if kind == 'act' else 'gradient (the next stage)'}")
    findings.raise_if_any()


# ---------------------------------------------------------------------------
# The picture: every rank's executed schedule, recorded while it ran
# ---------------------------------------------------------------------------

def record_timeline(run_pipeline, schedule_fn, *, num_stages: int = 4, num_microbatches: int = 8,
                    num_chunks: int = 1, forward_ms: float = 20.0, backward_ms: float = 40.0, seed: int = 0,
                    timeout: float = 30.0) -> dict:
    """Run run_pipeline on stages that sleep `forward_ms` / `backward_ms` (split over the chunks); return
    {"events": per group rank [(kind, mb, chunk, start_s, end_s)], "held": per rank peak outputs alive}.

    Times are seconds since the first forward began; they come from the probe
    around each chunk while the pipeline ran, not from the schedule lists.
    """
    p, m, v = num_stages, num_microbatches, num_chunks
    layout, schedules, case, results = _run(
        run_pipeline, schedule_fn, num_stages=p, num_microbatches=m, num_chunks=v, world_size=p, pp_ranks=None,
        batch=2, hidden=4, dtype=torch.float64, seed=seed, measure_memory=True,
        sleeps=(forward_ms / 1000.0, backward_ms / 1000.0), backend="gloo", timeout=timeout)
    t0 = min(e[3] for res in results for e in res["events"])
    events, held = [], []
    for res in results:
        evs = [(e[0], e[1], e[2], e[3] - t0, (e[4] if e[4] is not None else e[3]) - t0) for e in res["events"]]
        events.append(evs)
        held.append(max((h[2] for h in res["held"]), default=0))
    return {"events": events, "held": held, "schedules": schedules}


def measured_idle_fraction(events) -> float:
    """1 - busy / (ranks x span), the span from the first start to the last end over all ranks."""
    starts = [e[3] for evs in events for e in evs]
    ends = [e[4] for evs in events for e in evs]
    if not starts:
        return 0.0
    span = max(ends) - min(starts)
    busy = sum(e[4] - e[3] for evs in events for e in evs)
    return 1.0 - busy / (len(events) * span) if span > 0 else 0.0


_F_COLORS = ("#4C72B0", "#8FB3E0", "#2A4A7A")
_B_COLORS = ("#DD8452", "#F2B48C", "#A0522D")


def plot_pipeline_timelines(run_pipeline, runs, *, bubble_fraction=None, forward_ms: float = 20.0,
                            backward_ms: float = 40.0):
    """One panel per run: every rank's forwards and backwards as recorded, idle time shaded.

    `runs`: (title, schedule_fn, num_stages, num_microbatches, num_chunks).
    Each panel's title gives the measured idle fraction beside the formula
    (p - 1) / (v m + p - 1), from `bubble_fraction` when given (yours), and
    each row the most stage outputs its rank held at once. Returns a Picture.
    """
    from matplotlib.patches import Patch

    from autograder.lessons.plots import new_figure, picture

    runs = check_picture_runs(runs, ("title", "schedule_fn", "num_stages", "num_microbatches", "num_chunks"),
                              "plot_pipeline_timelines")
    fig, axes = new_figure(figsize=(12, 2.3 * len(runs)), nrows=len(runs))
    axes = [axes] if len(runs) == 1 else list(axes)
    for ax, (title, fn, p, m, v) in zip(axes, runs):
        rec = record_timeline(run_pipeline, fn, num_stages=p, num_microbatches=m, num_chunks=v,
                              forward_ms=forward_ms, backward_ms=backward_ms)
        events = rec["events"]
        span = max(e[4] for evs in events for e in evs)
        for r, evs in enumerate(events):
            y = p - 1 - r
            ax.barh(y, span, left=0, height=0.8, color="#E6E6E6", hatch="///", edgecolor="#BBBBBB", linewidth=0)
            for kind, mb, c, start, end in evs:
                color = (_F_COLORS if kind == "F" else _B_COLORS)[c % 3]
                ax.barh(y, end - start, left=start, height=0.8, color=color, edgecolor="black", linewidth=0.4)
                if end - start > span / 60:
                    ax.text((start + end) / 2, y, f"{kind}{'?' if mb is None else mb}", ha="center",
                            va="center", fontsize=6, color="white" if c % 3 != 1 else "black")
        ax.set_yticks(range(p))
        ax.set_yticklabels([f"rank {p - 1 - i} (held ≤ {rec['held'][p - 1 - i]})" for i in range(p)], fontsize=8)
        ax.set_xlim(0, span)
        ax.set_xlabel("seconds since the first forward", fontsize=8)
        measured = measured_idle_fraction(events)
        formula = pp_bubble_fraction(p, m, v)
        source = "formula"
        if bubble_fraction is not None:
            try:
                formula = float(bubble_fraction(p, m) if v == 1 else bubble_fraction(p, m, num_chunks=v))
                source = "your bubble_fraction"
            except Exception:  # noqa: BLE001 - a stub or a bug: fall back to the course's formula
                source = "formula (bubble_fraction failed)"
        chunks = f", v = {v}" if v > 1 else ""
        ax.set_title(f"{title}: p = {p}, m = {m}{chunks}. Idle (hatched): measured {measured:.1%}, "
                     f"{source} (p-1)/(vm+p-1) = {formula:.1%}", fontsize=9)
        handles = [Patch(facecolor=(_F_COLORS if k == "F" else _B_COLORS)[c], edgecolor="black",
                         label=f"{'forward' if k == 'F' else 'backward'}" + (f", chunk {c}" if v > 1 else ""))
                   for k in ("F", "B") for c in range(min(v, 3))]
        handles.append(Patch(facecolor="#E6E6E6", hatch="///", edgecolor="#BBBBBB", label="idle"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return picture(fig)

