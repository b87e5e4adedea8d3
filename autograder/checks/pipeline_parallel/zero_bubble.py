"""Public checks of assignment 03, exercises 6-9: the backward split in two, zero-bubble schedules, their executor.

    from autograder.checks.pipeline_parallel import check_split_backward, check_zb_h1_schedule
    check_split_backward(backward_input, backward_weight)

Graded here and in split_backward.py (the exercises after interleaved 1F1B):

- the split backward (`backward_input`, `backward_weight`; split_backward.py): run in a rank
  process on small stages built here (linear layers with and without bias,
  tanh, a layer norm; a middle, first and last stage), against one full
  backward in float64: B returns the input gradients and touches no `.grad`,
  W accumulates exactly the full backward's weight gradients; and what they
  cost: B computes no weight-gradient GEMM and W nothing else (counted with
  `FlopCounterMode`), B releases the output's side of the graph, W leaves
  nothing of the step alive (weak references);
- ZB-H1 and DualPipeV as data: every stage's list against the order PyTorch
  executes (`ScheduleInterleavedZeroBubble` with one stage per rank,
  `ScheduleDualPipeV`; tests/test_pipeline_zero_bubble.py records what
  torch actually runs on gloo and proves it is the order computed here), ZB-H1's
  bubble `(p - 1)(F + B - 2W)` on the course's timeline simulator and its
  activation memory against 1F1B's;
- `run_pipeline_zb` on real gloo ranks: loss and gradients against
  single-process float64, the order in which each stage ran its F, B and W
  (recorded while it ran), its P2P messages, and what it keeps alive.

Stage outputs and costs as in executor.py (TaggedStage: `y = x +
mask * tanh(x W^T + b)`, column 0 carries the micro-batch's number); the
stages run here also record when their weight gradient is computed, so a
weight gradient computed in B (or twice, or never) shows in the executed
order. Rank programs return data; verdicts are computed in this process.
"""

from __future__ import annotations

import gc
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import schedules as _torch_schedules

from autograder.checks import inputs_only
from autograder.runtime.compare import CheckFailure, Findings, assert_close, dtype_name, fmt_shape
from autograder.runtime.dist import DistributedError, rank_device
from autograder.runtime.ledger import CommLedger, format_trace

from .executor import (
    _TIMEOUT, _describe_p2p, _join, _layout, _make_case, _members, _microbatch_tag, _p2p_counts, _portable, _run_ranks,
    _where,
)
from .schedules import (
    _action_text, _check_complete, _expect_value_error, _flat, _normalize, _plain, _schedule_lists, check_picture_runs,
    format_actions, in_flight_peak, owner_of, pending_peak, simulate_schedules, stage_of,
)

__all__ = [
    "torch_schedule", "torch_schedule_fn", "check_zb_h1_schedule", "check_dualpipev_schedule", "check_run_pipeline_zb",
    "check_pipeline_zb_memory", "record_zb_timeline", "plot_zb_timelines",
]


# ---------------------------------------------------------------------------
# PyTorch's own orders (the oracle of the schedule checks)
# ---------------------------------------------------------------------------

_TORCH_CLASSES = {"zb_h1": "ScheduleInterleavedZeroBubble", "zb_interleaved": "ScheduleInterleavedZeroBubble",
                  "dualpipev": "ScheduleDualPipeV", "zbv": "ScheduleZBVZeroBubble"}
_TORCH_KINDS = {"FORWARD": "F", "BACKWARD_INPUT": "B", "FULL_BACKWARD": "B", "BACKWARD_WEIGHT": "W"}


def torch_schedule(name: str, num_stages: int, num_microbatches: int) -> list[list[tuple]]:
    """Every rank's list, in the course's format, of the order torch.distributed.pipelining runs.

    `name`: "zb_h1" (`ScheduleInterleavedZeroBubble` with one stage per rank: the
    paper's handcrafted ZB-H1, which torch's docstring calls "ZB1P"), "zb_interleaved" (the same with two chunks per rank,
    loop placement), "dualpipev" (`ScheduleDualPipeV`), "zbv"
    (`ScheduleZBVZeroBubble`); the last two place their two chunks in a V. Computed by the schedule's own
    `_calculate_single_rank_operations` (torch 2.13), which for these
    schedules is what its runtime executes, action for action:
    tests/test_pipeline_zero_bubble.py records the executed order on
    gloo and compares. torch's input-only backward (I) is the course's B with
    its W later in the list; torch's full backward (B) a B without one;
    OVERLAP_F_B the pair ("F&B", forward, backward).
    """
    p, m = num_stages, num_microbatches
    cls = getattr(_torch_schedules, _TORCH_CLASSES[name])
    sched = cls.__new__(cls)  # the order needs no stage and no process group
    sched.pp_group_size, sched._n_microbatches = p, m
    if name in ("zb_h1", "zb_interleaved"):
        sched.n_local_stages = 1 if name == "zb_h1" else 2
        sched.number_of_rounds = max(1, m // p)
        sched.microbatches_per_round = m // sched.number_of_rounds
    else:
        sched.num_stages = 2 * p

    def one(a):
        kind = _TORCH_KINDS[a.computation_type.name]
        if name == "zb_h1":
            return (kind, a.microbatch_index)
        chunk = a.stage_index // p if name == "zb_interleaved" else (0 if a.stage_index < p else 1)
        return (kind, a.microbatch_index, chunk)

    out = []
    for r in range(p):
        acts = []
        for a in sched._calculate_single_rank_operations(r):
            if a is None:
                continue
            acts.append(("F&B", one(a.sub_actions[0]), one(a.sub_actions[1])) if a.sub_actions else one(a))
        out.append(acts)
    return out


def torch_schedule_fn(name: str):
    """`torch_schedule(name, ...)` as a schedule function `(num_stages, stage, num_microbatches)` -> that stage's
    list, for the executor's checks (a schedule the course does not ask you to write: ZBV, interleaved ZB)."""
    def schedule(num_stages, stage, num_microbatches, *_chunks):
        return torch_schedule(name, num_stages, num_microbatches)[stage]

    schedule.__name__ = f"torch's {_TORCH_CLASSES[name]}" + (" (two chunks per rank)" if name == "zb_interleaved"
                                                            else "")
    return schedule


# ---------------------------------------------------------------------------
# Exercises: ZB-H1 and DualPipeV as data
# ---------------------------------------------------------------------------

def _first_difference(got, want) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def _show_around(acts, i, width: int = 6) -> str:
    lo = max(0, i - width)
    items = [_action_text(a) for a in acts[lo:i + width]]
    if i - lo < len(items):
        items[i - lo] = f">>{items[i - lo]}<<"
    return ("... " if lo else "") + " ".join(items) + (" ..." if i + width < len(acts) else "")


def _check_order(name, args, got, want, explain: str) -> None:
    if got == want:
        return
    i = _first_difference(got, want)
    what_got = _action_text(got[i]) if i < len(got) else "nothing more"
    what_want = _action_text(want[i]) if i < len(want) else "nothing more"
    raise CheckFailure(
        f"{name}{args}: action #{i} is {what_got}, expected {what_want} (the order torch's {explain} runs).\n"
        f"  yours:    {_show_around(got, i)}\n  expected: {_show_around(want, i)}")


_ZB_COSTS = ((1.0, 2.0, 1.0), (1.0, 3.0, 1.0), (2.0, 3.0, 1.0))


def check_zb_h1_schedule(zb_h1_schedule, *, cases=((4, 8), (3, 5), (4, 3)), costs=_ZB_COSTS) -> None:
    """ZB-H1 (Qi et al. 2024's handcrafted schedule, sec. 2.1), every stage of each (p, m) case.

    In this order: each micro-batch forwarded, backwarded (B) and given its
    W once, W after its B; the stages run together without deadlock; memory:
    no stage holds more micro-batches (forwarded, W not yet run) than 1F1B's
    busiest stage, min(p, m); the bubble: for m >= p and each (F, B, W) of
    `costs` (B the whole backward, W its weight part, W <= F and W <= B - W),
    every rank of the course's ideal timeline idles exactly (p - 1)(F + B - 2W);
    the order: the list torch's ScheduleInterleavedZeroBubble runs with one
    stage per rank (`torch_schedule("zb_h1", p, m)`); ValueError for invalid
    arguments.
    """
    name = "zb_h1_schedule"
    for p, m in cases:
        lists = _schedule_lists(zb_h1_schedule, p, m, 1, name)
        for s, actions in enumerate(lists):
            what = f"{name}({p}, {s}, {m})"
            acts = _normalize(actions, what=what, num_chunks=1, zero_bubble=True)
            if any(a[0] == "F&B" for a in acts):
                raise CheckFailure(f"{what}: ZB-H1 has no overlapped pairs (that is DualPipe's idea)")
            shown = f"stage {s}: {format_actions(actions)}"
            _check_complete(acts, m=m, v=1, what=what, shown=shown)
            missing_w = sorted({mb for k, mb, _ in acts if k == "B"} - {mb for k, mb, _ in acts if k == "W"})
            if missing_w:
                raise CheckFailure(f"{what}: micro-batch {missing_w[0]} has no W: in ZB-H1 every backward is split "
                                   f"into B (input gradient) and a W later.\n  {shown}")
        sim = simulate_schedules(lists)
        if "deadlock" in sim:
            shown = "\n  ".join(f"stage {s}: {format_actions(a)}" for s, a in enumerate(lists))
            raise CheckFailure(f"{name} with {p} stages and {m} micro-batches: run together, the stages deadlock:\n"
                               f"  {sim['deadlock']}\n  {shown}")
        limit = min(p, m)
        for s, actions in enumerate(lists):
            held = pending_peak(actions)
            if held > limit:
                raise CheckFailure(
                    f"{name}({p}, {s}, {m}): stage {s} holds up to {held} micro-batches' activations at once "
                    f"(forwarded, W not yet run); 1F1B's busiest stage holds min(p, m) = {limit}, and ZB-H1 must "
                    f"not hold more: a W deferred too long keeps its micro-batch's activations.\n"
                    f"  stage {s}: {format_actions(actions)}")
        if m >= p:
            for f_cost, b_cost, w_cost in costs:
                idle = simulate_schedules(lists, forward=f_cost, backward=b_cost, weight=w_cost)["idle"]
                want = (p - 1) * (f_cost + b_cost - 2 * w_cost)
                bad = [(r, t) for r, t in enumerate(idle) if abs(t - want) > 1e-9 * max(1.0, want)]
                if bad:
                    r, t = bad[0]
                    one_f_one_b = (p - 1) * (f_cost + b_cost)
                    hint = (" (1F1B's bubble: the Ws do not fill it; stage s defers its W by s backwards)"
                            if abs(t - one_f_one_b) < 1e-9 else "")
                    raise CheckFailure(
                        f"{name} with p = {p}, m = {m}, costs F = {f_cost:g}, B = {b_cost:g} (of which W = "
                        f"{w_cost:g}): on the ideal timeline rank {r} idles {t:g}, expected (p - 1)(F + B - 2W) = "
                        f"{want:g}{hint}. Idle per rank: {[round(x, 6) for x in idle]}")
        want_lists = torch_schedule("zb_h1", p, m)
        for s, actions in enumerate(lists):
            got = [tuple(a) for a in actions]
            _check_order(name, (p, s, m), got, want_lists[s],
                         "ScheduleInterleavedZeroBubble (one stage per rank: ZB-H1) runs: 1F1B, each B's W run "
                         "right after the backward s steps later")
    _zb_schedule_errors(zb_h1_schedule, name)


def _zb_schedule_errors(fn, name, extra=()) -> None:
    cases = [((2, 2, 4), (2,), "stage 2 of a 2-stage pipeline"), ((2, -1, 4), (-1,), "stage -1"),
             ((2, 0, 0), (0,), "0 micro-batches"), ((0, 0, 4), (0,), "0 stages")] + list(extra)
    for args, mention, label in cases:
        _expect_value_error(fn, args, mention, f"{name}{args} ({label})")


def check_dualpipev_schedule(dualpipev_schedule, *, cases=((4, 8), (2, 4), (3, 7))) -> None:
    """DualPipeV, every stage of each (p, m) case: rank r holds chunk 0 = stage r and chunk 1 = stage 2p - 1 - r.

    Each (micro-batch, chunk) forwarded once, backwarded once, its W (if any)
    after its B; the stages run together without deadlock (V placement); the
    list equals, action for action and pair for pair, what torch's
    ScheduleDualPipeV runs (`torch_schedule("dualpipev", p, m)`: a B is
    input-only exactly when its W follows later); ValueError below 2p
    micro-batches and for invalid arguments.
    """
    name = "dualpipev_schedule"
    for p, m in cases:
        lists = _schedule_lists(dualpipev_schedule, p, m, 2, name, chunk_arg=False)
        for s, actions in enumerate(lists):
            what = f"{name}({p}, {s}, {m})"
            acts = _normalize(actions, what=what, num_chunks=2, zero_bubble=True)
            _check_complete(acts, m=m, v=2, what=what, shown=f"stage {s}: {format_actions(actions)}")
        sim = simulate_schedules(lists, num_chunks=2, style="v")
        if "deadlock" in sim:
            shown = "\n  ".join(f"stage {s}: {format_actions(a)}" for s, a in enumerate(lists))
            raise CheckFailure(f"{name} with {p} ranks (a V of {2 * p} stages) and {m} micro-batches: run together, "
                               f"the stages deadlock:\n  {sim['deadlock']}\n  {shown}")
        want_lists = torch_schedule("dualpipev", p, m)
        for s, actions in enumerate(lists):
            got = [("F&B", tuple(a[1]), tuple(a[2])) if a[0] == "F&B" else tuple(a) for a in actions]
            _check_order(name, (p, s, m), got, want_lists[s],
                         "ScheduleDualPipeV (eight steps: F0; F0 F1; B1 W1 F1; F0&B1 F1&B0; B1 F1&B0; B1 B0; "
                         "W B0; W)")
    _zb_schedule_errors(dualpipev_schedule, name,
                        extra=[((2, 0, 3), (3, 4), "3 micro-batches for a V of 4 stages"),
                               ((4, 1, 7), (7, 8), "7 micro-batches for a V of 8 stages")])


# ---------------------------------------------------------------------------
# run_pipeline_zb: the rank side (a stage that records F, B and W while they run)
# ---------------------------------------------------------------------------

class _ZBLog:
    def __init__(self, num_microbatches: int, measure_memory: bool):
        self.num_microbatches = num_microbatches
        self.measure_memory = measure_memory
        self.events: list[list] = []  # [kind, mb, chunk, start, end]
        self.out_refs: list = []  # weak references to every stage output
        self.w_refs: list = []  # ... to every copy of the stage input a weight gradient needs (the graph's)
        self.in_refs: list = []  # ... to every stage input the executor gave the stage (not the data)
        self.dz_refs: list = []  # ... to every output gradient of the weighted layer (what a W state holds)
        # (mb, chunk, outputs, W inputs, stage inputs, W-state gradients alive) right after each forward
        self.held: list[tuple] = []

    def alive(self):
        gc.collect()
        return tuple(sum(r() is not None for r in refs)
                     for refs in (self.out_refs, self.w_refs, self.in_refs, self.dz_refs))


class _Mark(torch.autograd.Function):
    """Identity; its backward records an event (and sleeps): "B" on the output's side, "W" on the weight's."""

    @staticmethod
    def forward(ctx, x, log, kind, mb, chunk, seconds):
        ctx.info = (log, kind, mb, chunk, seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        log, kind, mb, chunk, seconds = ctx.info
        t0 = time.perf_counter()
        if seconds:
            time.sleep(seconds)
        log.events.append([kind, mb, chunk, t0, time.perf_counter()])
        return grad, None, None, None, None, None


class _BEnd(torch.autograd.Function):
    """Identity on the pre-activation; its backward (the input-gradient work, slept) ends the recorded B. The
    gradient it returns is the weighted layer's output gradient, what a W state keeps for its W (watched)."""

    @staticmethod
    def forward(ctx, z, log, seconds):
        ctx.info = (log, seconds)
        return z.clone()

    @staticmethod
    def backward(ctx, grad):
        log, seconds = ctx.info
        if seconds:
            time.sleep(seconds)
        for e in reversed(log.events):  # the B this backward belongs to: the latest B not yet ended
            if e[0] == "B" and e[4] is None:
                e[4] = time.perf_counter()
                break
        if log.measure_memory:
            log.dz_refs.append(weakref.ref(grad))
        return grad, None, None


class _ZBStage(nn.Module):
    """One stage, `y = x + mask * tanh(x W^T + b)` (TaggedStage's numbers), recording its F, B and W.

    The copy of the input that the linear layer saves (what W needs) and the
    output are watched with weak references. With sleeps: forward F, the input
    gradient B - W, the weight gradient W (seconds), for the timeline.
    """

    def __init__(self, weight, bias, chunk: int, log: _ZBLog, sleeps=(0.0, 0.0, 0.0)):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone())
        mask = torch.ones(weight.shape[0], dtype=weight.dtype, device=weight.device)
        mask[0] = 0
        self.register_buffer("mask", mask)
        self.chunk, self.log, self.sleeps = chunk, log, sleeps

    def forward(self, x):
        t0 = time.perf_counter()
        mb = _microbatch_tag(x, self.log.num_microbatches)
        f_s, b_s, w_s = self.sleeps
        kept = x.detach().clone() if not x.requires_grad else _Mark.apply(x, self.log, "", mb, self.chunk, 0.0)
        weight = _Mark.apply(self.weight, self.log, "W", mb, self.chunk, w_s)
        z = _BEnd.apply(F.linear(kept, weight, self.bias), self.log, b_s)
        if f_s:
            time.sleep(f_s)
        y = x + self.mask * torch.tanh(z)  # [b, h] -> [b, h]
        y = _BStart.apply(y, self.log, mb, self.chunk)
        self.log.events.append(["F", mb, self.chunk, t0, time.perf_counter()])
        if self.log.measure_memory:
            self.log.out_refs.append(weakref.ref(y))
            self.log.w_refs.append(weakref.ref(kept))
            if x.requires_grad:  # a received activation (or a hand-over): the executor's to drop
                self.log.in_refs.append(weakref.ref(x))
            self.log.held.append((mb, self.chunk, *self.log.alive()))
        return y


class _BStart(torch.autograd.Function):
    """Identity on a stage's output whose backward notes that this micro-batch's B has begun (once: a W that
    runs the backward again from the output is the split's fault, graded by the split's memory test)."""

    @staticmethod
    def forward(ctx, y, log, mb, chunk):
        ctx.info = (log, mb, chunk)
        ctx.seen = False
        return y.clone()

    @staticmethod
    def backward(ctx, grad):
        log, mb, chunk = ctx.info
        if not ctx.seen:
            ctx.seen = True
            log.events.append(["B", mb, chunk, time.perf_counter(), None])
        return grad, None, None, None


def _zb_rank(rank, world_size, run_pipeline_zb, layout, schedules, case, style, num_chunks, measure_memory,
             sleeps, backend):
    group = _join(rank, layout)
    if group is None:
        return None
    dev = rank_device(rank, backend)
    p, r = group.size(), group.rank()
    log = _ZBLog(len(case["microbatches"]), measure_memory)
    chunks = []
    for c in range(num_chunks):
        k = stage_of(style, p, r, c)
        chunks.append(_ZBStage(case["weights"][k].to(dev), case["biases"][k].to(dev), c, log,
                               tuple(t / num_chunks for t in sleeps)))
    stage_module = chunks if num_chunks > 1 else chunks[0]
    microbatches = [x.to(dev) for x in case["microbatches"]]
    targets = [t.to(dev) for t in case["targets"]]
    if measure_memory:
        # what exists now is set aside, garbage included (none of it is watched): later collections look only
        # at objects made by the step. (A full collection first took 50-150 ms per rank and run.)
        gc.freeze()
    with CommLedger() as ledger:
        loss = run_pipeline_zb(stage_module, list(schedules[r]), microbatches, targets, F.mse_loss, pp_group=group,
                               style=style)
    held_after = log.alive() if measure_memory else None
    if measure_memory:
        gc.unfreeze()
    grads = [(None if c.weight.grad is None else c.weight.grad.detach().cpu(),
              None if c.bias.grad is None else c.bias.grad.detach().cpu()) for c in chunks]
    return {"group_rank": r, "loss": _portable(loss), "grads": grads,
            "events": [e for e in log.events if e[0]], "held": log.held, "held_after": held_after,
            "records": ledger.records}


def _zb_probe_rank(rank, world_size, run_pipeline_zb):
    gen = torch.Generator().manual_seed(0)
    log = _ZBLog(1, False)
    stage = _ZBStage(torch.randn(2, 2, generator=gen), torch.zeros(2), 0, log)
    x = torch.zeros(1, 2)
    try:
        run_pipeline_zb(stage, [("F", 0), ("B", 0)], [x], [x], F.mse_loss, pp_group=dist.group.WORLD)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - only a stub matters here
        pass
    return None


def _run_zb(run_pipeline_zb, schedule_fn, *, num_stages, num_microbatches, style, num_chunks, world_size, pp_ranks,
            batch, hidden, dtype, seed, measure_memory, sleeps, backend, timeout):
    p, m = num_stages, num_microbatches
    v = num_chunks if num_chunks is not None else (2 if style == "v" else 1)
    layout = _layout(world_size or p, pp_ranks)
    if len(layout[0]) != p:
        raise ValueError(f"check parameters: pipeline groups {layout} do not have num_stages = {p} ranks")
    name = getattr(schedule_fn, "__name__", "schedule")
    try:
        schedules = _schedule_lists(schedule_fn, p, m, v, name, chunk_arg=v > 1 and style == "loop")
    except NotImplementedError:
        try:  # the executor's own stub first: it is this cell's exercise
            _run_ranks(_zb_probe_rank, 1, args=(run_pipeline_zb,), timeout=timeout, backend="gloo")
        except DistributedError as exc:
            if exc.stub:
                raise
        raise  # the schedule's stub: named with the exercise that owns it (course_notebook)
    try:
        for s, acts in enumerate(schedules):
            what = f"{name}{(p, s, m)}"
            _check_complete(_normalize(acts, what=what, num_chunks=v, zero_bubble=True), m=m, v=v, what=what,
                            shown=f"stage {s}: {format_actions(acts)}")
        sim = simulate_schedules(schedules, num_chunks=v, style=style)
        if "deadlock" in sim:
            raise CheckFailure(f"run together, the stages deadlock:\n  {sim['deadlock']}")
    except CheckFailure as exc:
        raise CheckFailure(f"run_pipeline_zb is run here with the lists your {name} returns, and they are not a "
                           f"schedule any executor could run; fix {name} first (its own test says more). "
                           f"run_pipeline_zb was not run.\n{exc}") from None
    case = _make_case(p, m, v, batch, hidden, dtype, seed)
    # a stub it calls (backward_input, exercise 6) is named with the exercise that owns it (course_notebook)
    results = _run_ranks(_zb_rank, world_size or p, timeout=timeout, backend=backend,
                         args=(run_pipeline_zb, layout, schedules, inputs_only(case, "loss", "grads"), style, v,
                               measure_memory, sleeps, backend))
    return layout, schedules, case, results, v


def _expected_events(schedule, v):
    """What the stage records for a list: F; a B with a later W records B, its W at the W; a whole B records B, W."""
    flat = _plain(schedule)
    deferred = {(mb, c) for kind, mb, c in flat if kind == "W"}
    out = []
    for kind, mb, c in flat:
        out.append((kind, mb, c))
        if kind == "B" and (mb, c) not in deferred:
            out.append(("W", mb, c))  # the whole backward computes the weight gradient too
    return out


def _check_zb_order(res, schedule, *, v, rank, ctx) -> None:
    expected = _expected_events(schedule, v)
    got = [(e[0], e[1], e[2]) for e in res["events"]]
    if got == expected:
        return
    fmt = (lambda t: f"{t[0]}{'?' if t[1] is None else t[1]}") if v == 1 else \
        (lambda t: f"{t[0]}{'?' if t[1] is None else t[1]}c{t[2]}")
    i = _first_difference(got, expected)
    what_got = fmt(got[i]) if i < len(got) else "nothing more"
    what_exp = fmt(expected[i]) if i < len(expected) else "nothing more"
    extra = ""
    if i < len(got) and got[i][1] is None:
        extra = (" ('?': the stage got data that is no micro-batch's: a receive from the wrong peer or with the "
                 "wrong tag, or a message received out of order)")
    elif i < len(got) and got[i][0] == "W" and i < len(expected) and expected[i][0] != "W":
        extra = (" (a weight gradient computed when the schedule did not ask for one: a B whose W comes later "
                 "must compute the input gradient only)")
    elif i < len(expected) and expected[i][0] == "W":
        extra = " (the weight gradient was not computed here: a W skipped, or a B that did not compute it)"
    raise CheckFailure(
        f"rank {rank} (group rank {res['group_rank']}, {ctx}): the stage ran {what_got} as its computation #{i}, "
        f"but its schedule says {what_exp}{extra}. Executed (recorded while it ran; a whole backward shows as B "
        f"then W):\n    {' '.join(fmt(t) for t in got)}\n  expected from the list given to run_pipeline_zb:\n"
        f"    {' '.join(fmt(t) for t in expected)}")


def _expected_zb_p2p(schedule, *, style, p, r, v, shape, dtype) -> dict:
    last = p * v - 1
    exp = {}

    def add(op, peer):
        key = (op, peer, tuple(shape), dtype_name(dtype))
        exp[key] = exp.get(key, 0) + 1

    for kind, mb, c in _plain(schedule):
        k = stage_of(style, p, r, c)
        if kind == "F":
            if k > 0 and owner_of(style, p, k - 1) != r:
                add("recv", owner_of(style, p, k - 1))
            if k < last and owner_of(style, p, k + 1) != r:
                add("send", owner_of(style, p, k + 1))
        elif kind == "B":
            if k < last and owner_of(style, p, k + 1) != r:
                add("recv", owner_of(style, p, k + 1))
            if k > 0 and owner_of(style, p, k - 1) != r:
                add("send", owner_of(style, p, k - 1))
    return exp


def _check_zb_p2p(res, schedule, *, style, p, v, shape, dtype, rank, ctx) -> None:
    r = res["group_rank"]
    got, other = _p2p_counts(res["records"])
    trace = f"Communication of rank {rank}:\n{format_trace(res['records'], rank)}"
    if other:
        raise CheckFailure(f"rank {rank} ({ctx}): a pipeline communicates only by P2P sends and receives; saw "
                           f"{other[0].op} ({len(other)} collective op(s)). {trace}")
    exp = _expected_zb_p2p(schedule, style=style, p=p, r=r, v=v, shape=shape, dtype=dtype)
    if got == exp:
        return
    missing = [_describe_p2p(k, n - got.get(k, 0)) for k, n in exp.items() if got.get(k, 0) < n]
    extra = [_describe_p2p(k, n - exp.get(k, 0)) for k, n in got.items() if n > exp.get(k, 0)]
    parts = (["missing " + "; ".join(missing)] if missing else []) + (["unexpected " + "; ".join(extra)] if extra
                                                                       else [])
    stages = ", ".join(f"chunk {c} = stage {stage_of(style, p, r, c)}" for c in range(v))
    raise CheckFailure(
        f"rank {rank} (group rank {r} of {p}, {ctx}): {', '.join(parts)}. Expected per step: "
        f"{'; '.join(_describe_p2p(k, n) for k, n in exp.items()) or 'nothing'} (this rank holds {stages}; "
        f"stage k's activation goes to the rank of stage k + 1, its input gradient to the rank of stage k - 1; "
        f"neighbouring stages on one rank hand tensors over without a message). {trace}")


def _check_zb_loss(loss, expected, *, rank, group_rank, loss_rank, m, dtype, ctx) -> None:
    if group_rank != loss_rank:
        if loss is not None:
            raise CheckFailure(f"rank {rank} (group rank {group_rank}; {ctx}): run_pipeline_zb returned {loss!r}; "
                               f"only the rank holding the last stage (group rank {loss_rank}) returns the loss, the "
                               f"others None")
        return
    where = f"rank {rank} (group rank {group_rank}, which holds the last stage; {ctx})"
    if not isinstance(loss, float):
        raise CheckFailure(f"{where}: run_pipeline_zb returned {loss!r}; expected the mean loss as a Python float")
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    if abs(loss - expected) > tol * max(1.0, abs(expected)):
        ratio = loss / expected if expected else float("nan")
        why = f" ({m} micro-batches: summed instead of averaged?)" if m > 1 and abs(ratio - m) < 1e-3 * m else ""
        raise CheckFailure(f"{where}: loss {loss:.10g}, expected {expected:.10g}, the mean of the {m} micro-batch "
                           f"losses; ratio {ratio:.6g}{why}")


def _zb_ctx(name, p, m, style, layout, world_size, dtype) -> str:
    return (f"run_pipeline_zb with {name}, p = {p}, m = {m}, style {style!r}, {_where(layout, world_size)}, "
            f"{dtype_name(dtype)}")


def check_run_pipeline_zb(run_pipeline_zb, schedule_fn, *, num_stages: int = 4, num_microbatches: int = 8,
                          style: str = "loop", num_chunks: int | None = None, world_size: int | None = None,
                          pp_ranks=None, batch: int = 2, hidden: int = 5, dtype=torch.float64, seed: int = 0,
                          backend: str = "gloo", timeout: float = _TIMEOUT) -> None:
    """run_pipeline_zb(stage or chunks, schedule, microbatches, targets, F.mse_loss, pp_group=..., style=...).

    The schedule of each rank is `schedule_fn(p, rank, m)` (or `(p, rank, m, v)`
    for a loop schedule of v > 1 chunks; a V schedule has two chunks). Checked,
    per rank of the pipeline group: the loss (the mean of the micro-batch
    losses, a Python float) on the rank that holds the last stage, None
    elsewhere; every parameter's gradient against single-process float64
    training; the order in which the stage computed its forwards, input
    gradients (B) and weight gradients (W), recorded while it ran (a B whose W
    comes later computes no weight gradient; a B without one computes both);
    the P2P messages: one activation to the rank of the next stage and one
    input gradient to the rank of the previous stage per micro-batch, none
    between stages of one rank, no collective.
    """
    p, m = num_stages, num_microbatches
    world = world_size or p
    layout, schedules, case, results, v = _run_zb(
        run_pipeline_zb, schedule_fn, num_stages=p, num_microbatches=m, style=style, num_chunks=num_chunks,
        world_size=world, pp_ranks=pp_ranks, batch=batch, hidden=hidden, dtype=dtype, seed=seed,
        measure_memory=False, sleeps=(0.0, 0.0, 0.0), backend=backend, timeout=timeout)
    name = getattr(schedule_fn, "__name__", "schedule")
    ctx = _zb_ctx(name, p, m, style, layout, world, dtype)
    members = _members(layout, results)
    loss_rank = owner_of(style, p, p * v - 1)
    findings = Findings()
    for g, res in members:
        r = res["group_rank"]
        with findings.communication():
            _check_zb_order(res, schedules[r], v=v, rank=g, ctx=ctx)
        with findings.communication():
            _check_zb_p2p(res, schedules[r], style=style, p=p, v=v, shape=(batch, hidden), dtype=dtype, rank=g,
                          ctx=ctx)
    for g, res in members:
        with findings.numbers():
            _check_zb_loss(res["loss"], case["loss"], rank=g, group_rank=res["group_rank"], loss_rank=loss_rank, m=m,
                           dtype=dtype, ctx=ctx)
    for g, res in members:
        r = res["group_rank"]
        for c in range(v):
            k = stage_of(style, p, r, c)
            exp_w, exp_b = case["grads"][k]
            got_w, got_b = res["grads"][c]
            where = f"{ctx}: stage {k}" + (f" (chunk {c} of group rank {r})" if v > 1 else "")
            with findings.numbers():
                if got_w is None:
                    raise CheckFailure(f"rank {g}, {where}: the weight has no gradient: a W never run (or a B "
                                       f"that computed no weight gradient and had no W)")
                twice = torch.allclose(got_w.double(), 2 * exp_w.double(), rtol=1e-6, atol=1e-9)
                if twice and not torch.allclose(exp_w.double(), torch.zeros_like(exp_w.double())):
                    raise CheckFailure(f"rank {g}, {where}: the weight gradient is TWICE single-process "
                                       f"training's: the weight gradient was accumulated twice")
                assert_close(got_w, exp_w, name=f"{where}: weight gradient", rank=g)
                assert_close(got_b, exp_b, name=f"{where}: bias gradient", rank=g)
    findings.raise_if_any()


def check_pipeline_zb_memory(run_pipeline_zb, schedule_fn, *, num_stages: int = 4, num_microbatches: int = 8,
                             style: str = "loop", num_chunks: int | None = None, world_size: int | None = None,
                             pp_ranks=None, seed: int = 0, timeout: float = _TIMEOUT) -> None:
    """What run_pipeline_zb keeps alive: exactly what its schedule needs after every forward, and nothing after.

    Four counts per rank, each time a stage makes an output (weak references,
    after gc.collect(); the objects that existed before the step, garbage
    included, are frozen out of the collector):

    - stage outputs alive must equal the forwards minus the Bs so far (B needs
      the output; nothing else does);
    - stage inputs kept for a weight gradient (the copy the stage's layer saves)
      must equal the forwards minus the Ws so far (a B without a W counts as
      both): a W's state is dropped when the W has run;
    - the stage inputs the executor handed to the stage (received activations,
      not the data) at most as many: a weight gradient reads its layer's input,
      so the stage's graph keeps it until that W, and nothing may keep it after;
    - the output gradients of the weighted layers (what `backward_input` leaves
      for W: the W state) at most the Bs whose W has not run yet: W uses them up.

    All four are 0 once run_pipeline_zb returns.
    """
    p, m = num_stages, num_microbatches
    world = world_size or p
    layout, schedules, case, results, v = _run_zb(
        run_pipeline_zb, schedule_fn, num_stages=p, num_microbatches=m, style=style, num_chunks=num_chunks,
        world_size=world, pp_ranks=pp_ranks, batch=2, hidden=4, dtype=torch.float64, seed=seed, measure_memory=True,
        sleeps=(0.0, 0.0, 0.0), backend="gloo", timeout=timeout)
    name = getattr(schedule_fn, "__name__", "schedule")
    ctx = _zb_ctx(name, p, m, style, layout, world, torch.float64)
    for g, res in _members(layout, results):
        r = res["group_rank"]
        flat = _plain(schedules[r])
        deferred = {(mb, c) for kind, mb, c in flat if kind == "W"}
        receives = {c for c in range(v) if stage_of(style, p, r, c) != 0}  # chunks whose input is not the data
        outs = ins = given = pending = 0
        need = []
        for kind, mb, c in flat:
            if kind == "F":
                outs, ins, given = outs + 1, ins + 1, given + (c in receives)
                need.append((outs, ins, given, pending))
            elif kind == "B":
                outs -= 1
                if (mb, c) in deferred:
                    pending += 1
                else:
                    ins, given = ins - 1, given - (c in receives)
            else:
                ins, given, pending = ins - 1, given - (c in receives), pending - 1
        got = [tuple(h[2:6]) for h in res["held"]]
        if len(got) != len(need):
            raise CheckFailure(f"rank {g} ({ctx}): the stage ran {len(got)} forwards; its schedule has {len(need)}")
        shown = (f"Alive after each forward (outputs, W inputs, stage inputs, W-state gradients): {got}; needed "
                 f"(the last two at most): {need}.\n  schedule: {format_actions(schedules[r])}")
        for i, (want, have) in enumerate(zip(need, got)):
            (want_o, want_i, want_x, want_dz), (have_o, have_i, have_x, have_dz) = want, have
            if have_o == want_o and have_i == want_i and have_x <= want_x and have_dz <= want_dz:
                continue
            mb, c = res["held"][i][0], res["held"][i][1]
            label = f"F{mb}" + (f"c{c}" if v > 1 else "")
            if have_o != want_o:
                what = (f"{have_o} stage outputs were alive, but its schedule needs {want_o} (forwarded, B not yet "
                        f"run)")
                why = ("Something keeps outputs alive after their B: a dict entry never removed, a send handle "
                       "kept, a local still naming an output, or a W state that holds the output (B's state needs "
                       "only what the weight gradient needs). " if have_o > want_o else
                       "An output its B still needs was dropped. ")
            elif have_i != want_i:
                what = (f"{have_i} stage inputs kept for a weight gradient were alive, but its schedule needs "
                        f"{want_i} (forwarded, W not yet run)")
                why = ("Something keeps a micro-batch's saved tensors after its W (or its whole B): the W state "
                       "not dropped, a reference kept elsewhere. " if have_i > want_i else
                       "What a later W needs was dropped or never kept. ")
            elif have_x > want_x:
                what = (f"{have_x} stage input(s) it received (activations from the previous stage) were "
                        f"alive, but its schedule needs at most {want_x} (forwarded, W not yet run: the stage's "
                        f"graph keeps an input until the W that reads it, and nothing needs it after)")
                why = ("Something keeps a micro-batch's input after its W (or its whole B): a dict entry read "
                       "instead of removed, a list of inputs, a local still naming one. ")
            else:
                what = (f"{have_dz} output gradient(s) of the stage's weighted layers (what backward_input leaves "
                        f"for W: the W state) were alive, but its schedule needs at most {want_dz} (Bs whose W "
                        f"has not run yet)")
                why = ("Something keeps a W state after its W: the state left in its dict (W run on a copy, or "
                       "read instead of removed), a list of states, a reference kept elsewhere. ")
            raise CheckFailure(f"rank {g} (group rank {r} of {p}; {ctx}): right after its forward #{i} ({label}) "
                               f"{what}. {why}{shown}")
        if any(res["held_after"]):
            outs_after, ins_after, x_after, dz_after = res["held_after"]
            raise CheckFailure(f"rank {g} (group rank {r}; {ctx}): after run_pipeline_zb returned, {outs_after} "
                               f"stage output(s), {ins_after} input(s) kept for a weight gradient, {x_after} "
                               f"received stage input(s) and {dz_after} W-state gradient(s) are still alive: drop "
                               f"every output, input, W state and send handle before the step ends")


# ---------------------------------------------------------------------------
# The picture: the zero-bubble schedules as they ran
# ---------------------------------------------------------------------------

def record_zb_timeline(run_pipeline_zb, schedule_fn, *, num_stages: int = 4, num_microbatches: int = 8,
                       style: str = "loop", forward_ms: float = 20.0, backward_ms: float = 40.0,
                       weight_ms: float = 20.0, seed: int = 0, timeout: float = 30.0) -> dict:
    """Run run_pipeline_zb on stages that sleep F, B - W and W (ms, split over the chunks); the events recorded.

    Returns {"events": per group rank [(kind, mb, chunk, start_s, end_s)], "held": per rank the most
    micro-batches whose activations were kept at once, "schedules"}.
    """
    p, m = num_stages, num_microbatches
    sleeps = (forward_ms / 1000.0, (backward_ms - weight_ms) / 1000.0, weight_ms / 1000.0)
    layout, schedules, case, results, v = _run_zb(
        run_pipeline_zb, schedule_fn, num_stages=p, num_microbatches=m, style=style, num_chunks=None,
        world_size=p, pp_ranks=None, batch=2, hidden=4, dtype=torch.float64, seed=seed, measure_memory=True,
        sleeps=sleeps, backend="gloo", timeout=timeout)
    t0 = min(e[3] for res in results for e in res["events"])
    events, held = [], []
    for res in results:
        events.append([(e[0], e[1], e[2], e[3] - t0, (e[4] if e[4] is not None else e[3]) - t0)
                       for e in res["events"]])
        held.append(max((h[3] for h in res["held"]), default=0))
    return {"events": events, "held": held, "schedules": schedules, "num_chunks": v}


_ZB_COLORS = {"F": ("#4C72B0", "#8FB3E0"), "B": ("#DD8452", "#F2B48C"), "W": ("#55A868", "#9AD0A5")}


def plot_zb_timelines(run_pipeline_zb, runs, *, forward_ms: float = 20.0, backward_ms: float = 40.0,
                      weight_ms: float = 20.0):
    """One panel per run, (title, schedule_fn, num_stages, num_microbatches, style): every rank's F, B and W as
    recorded while your run_pipeline_zb ran; idle time hatched; the measured idle fraction in the title and the
    most micro-batches each rank kept activations for in its label. Returns a Picture."""
    from matplotlib.patches import Patch

    from autograder.lessons.plots import new_figure, picture

    runs = check_picture_runs(runs, ("title", "schedule_fn", "num_stages", "num_microbatches", "style"),
                              "plot_zb_timelines")
    for i, run in enumerate(runs):
        if run[4] not in ("loop", "v"):
            raise ValueError(f"plot_zb_timelines: runs[{i}]: style must be 'loop' or 'v', got {run[4]!r}")
    fig, axes = new_figure(figsize=(12, 2.4 * len(runs)), nrows=len(runs))
    axes = [axes] if len(runs) == 1 else list(axes)
    for ax, (title, fn, p, m, style) in zip(axes, runs):
        rec = record_zb_timeline(run_pipeline_zb, fn, num_stages=p, num_microbatches=m, style=style,
                                 forward_ms=forward_ms, backward_ms=backward_ms, weight_ms=weight_ms)
        events, v = rec["events"], rec["num_chunks"]
        span = max(e[4] for evs in events for e in evs)
        busy = 0.0
        for r, evs in enumerate(events):
            y = p - 1 - r
            ax.barh(y, span, left=0, height=0.8, color="#E6E6E6", hatch="///", edgecolor="#BBBBBB", linewidth=0)
            for kind, mb, c, start, end in evs:
                busy += end - start
                ax.barh(y, end - start, left=start, height=0.8, color=_ZB_COLORS[kind][c % 2], edgecolor="black",
                        linewidth=0.4)
                if end - start > span / 80:
                    ax.text((start + end) / 2, y, f"{kind}{'?' if mb is None else mb}", ha="center", va="center",
                            fontsize=5.5, color="white" if c % 2 == 0 else "black")
        ax.set_yticks(range(p))
        ax.set_yticklabels([f"rank {p - 1 - i} (kept ≤ {rec['held'][p - 1 - i]})" for i in range(p)], fontsize=8)
        ax.set_xlim(0, span)
        ax.set_xlabel("seconds since the first forward", fontsize=8)
        idle = 1.0 - busy / (p * span) if span > 0 else 0.0
        sim = simulate_schedules(rec["schedules"], num_chunks=v, style=style, forward=forward_ms,
                                 backward=backward_ms, weight=weight_ms)
        ax.set_title(f"{title}: p = {p}, m = {m}, F = {forward_ms:g}, B = {backward_ms:g} (W = {weight_ms:g}) ms. "
                     f"Idle (hatched): measured {idle:.1%}, ideal timeline {sim['idle_fraction']:.1%}", fontsize=9)
        handles = [Patch(facecolor=_ZB_COLORS[k][c], edgecolor="black",
                         label={"F": "forward", "B": "backward B", "W": "weights W"}[k]
                         + (f", chunk {c}" if v > 1 else "")) for k in ("F", "B", "W") for c in range(v)]
        handles.append(Patch(facecolor="#E6E6E6", hatch="///", edgecolor="#BBBBBB", label="idle"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return picture(fig)


_ = (in_flight_peak, _flat, fmt_shape)  # re-exported helpers used by tests
