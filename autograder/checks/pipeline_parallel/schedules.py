"""Public checks of assignment 03, exercises 2, 3 and 5: schedules as data (no ranks needed), and the bubble.

    from autograder.checks.pipeline_parallel import check_one_f_one_b_schedule   # re-exported by the package
    check_one_f_one_b_schedule(one_f_one_b_schedule)

A schedule is a list of actions per stage. The checks read every stage's
list for the properties that define GPipe, 1F1B and interleaved 1F1B
(forward and backward order, warm-up length, one forward / one backward
alternation) and run the stages' lists together on an ideal timeline
(`simulate_schedules`) to prove that they cannot deadlock; the same timeline
gives the idle fraction `show_schedules` prints. The executor is checked in
autograder/checks/pipeline_parallel/executor.py.
"""

from __future__ import annotations

from autograder.runtime.compare import CheckFailure
from autograder.lessons.volume import pp_bubble_fraction

__all__ = ["simulate_schedules", "show_schedules", "format_actions", "in_flight_peak", "pending_peak", "stage_of",
           "owner_of", "check_gpipe_schedule",
           "check_one_f_one_b_schedule", "check_interleaved_schedule", "check_bubble_fraction"]


# ---------------------------------------------------------------------------
# Schedules: reading, formatting, simulating
# ---------------------------------------------------------------------------

def _action_text(action) -> str:
    if isinstance(action, (tuple, list)) and len(action) == 3 and action[0] == "F&B":
        return f"{_action_text(action[1])}&{_action_text(action[2])}"
    if isinstance(action, (tuple, list)) and len(action) in (2, 3):
        text = f"{action[0]}{action[1]}"
        return text + (f"c{action[2]}" if len(action) == 3 else "")
    return repr(action)


def format_actions(actions, limit: int = 40) -> str:
    """`F0 F1 B0 F2 B1 B2` (with chunks: `F0c0 F1c0 F0c1 ...`); long lists are cut."""
    items = [_action_text(a) for a in actions]
    if len(items) > limit:
        items = items[:limit] + [f"... ({len(items) - limit} more)"]
    return " ".join(items) if items else "(no actions)"


def _normalize(actions, *, what: str, num_chunks: int, zero_bubble: bool = False) -> list[tuple]:
    """The actions as (kind, mb, chunk); CheckFailure for anything else.

    With `zero_bubble`, kinds "F", "B", "W" and overlapped pairs ("F&B", forward, backward), kept as
    ("F&B", (kind, mb, chunk), (kind, mb, chunk)).
    """
    if not isinstance(actions, (list, tuple)):
        raise CheckFailure(f"{what} returned {type(actions).__name__}; expected a list of actions "
                           f"like ('F', 0) and ('B', 0)")
    size = 2 if num_chunks == 1 else 3
    kinds = ("F", "B", "W") if zero_bubble else ("F", "B")
    example = "('F', microbatch)" if size == 2 else "('F', microbatch, chunk)"
    words = "'F', 'B' or 'W'" if zero_bubble else "'F' or 'B'"

    def one(a, i, allowed=kinds):
        if (not isinstance(a, tuple) or len(a) != size or a[0] not in allowed
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in a[1:])):
            raise CheckFailure(f"{what}: action {i} is {a!r}; every action must be a tuple {example} "
                               f"with kind {words} and int indices"
                               + (", or a pair ('F&B', forward, backward)" if zero_bubble else ""))
        return (a[0], a[1], a[2] if size == 3 else 0)

    out = []
    for i, a in enumerate(actions):
        if zero_bubble and isinstance(a, tuple) and len(a) == 3 and a[0] == "F&B":
            out.append(("F&B", one(a[1], i, ("F",)), one(a[2], i, ("B",))))
        else:
            out.append(one(a, i))
    return out


def _flat(acts) -> list[tuple[str, int, int]]:
    """Normalized actions with every ("F&B", f, b) pair replaced by its two halves, f then b."""
    out = []
    for a in acts:
        out.extend(a[1:] if a[0] == "F&B" else (a,))
    return out


def _check_complete(acts, *, m: int, v: int, what: str, shown: str) -> None:
    """Every (mb, chunk) forwarded exactly once, then backwarded exactly once (then at most one W, after its B)."""
    done = {"F": set(), "B": set(), "W": set()}
    before = {"B": ("F", "forward"), "W": ("B", "backward (B)")}
    for i, (kind, mb, c) in enumerate(_flat(acts)):
        label = (kind, mb) if v == 1 else (kind, mb, c)
        if not (0 <= mb < m and 0 <= c < v):
            raise CheckFailure(f"{what}: action {i} ({_action_text(label)}) is "
                               f"outside {m} micro-batches{f' and {v} chunks' if v > 1 else ''}.\n  {shown}")
        key = (mb, c)
        name = {"F": "forwarded", "B": "backwarded", "W": "given its W"}[kind]
        where = f"micro-batch {mb}{f' chunk {c}' if v > 1 else ''}"
        if key in done[kind]:
            raise CheckFailure(f"{what}: {where} is {name} twice.\n  {shown}")
        if kind in before and key not in done[before[kind][0]]:
            raise CheckFailure(f"{what}: {where} is {name} before its {before[kind][1]}.\n  {shown}")
        done[kind].add(key)
    missing = sorted({(mb, c) for mb in range(m) for c in range(v)} - done["B"])
    if missing:
        names = ", ".join(f"{mb}" if v == 1 else f"({mb}, chunk {c})" for mb, c in missing[:5])
        raise CheckFailure(f"{what}: {len(acts)} actions, expected {2 * m * v} (one forward and one backward "
                           f"per micro-batch{' and chunk' if v > 1 else ''}); never completed: {names}.\n  {shown}")


def _forward_order(p: int, m: int, v: int) -> list[tuple[int, int]]:
    """(mb, chunk) in forward order: with chunks, each group of p micro-batches visits chunk 0, 1, ..., v-1."""
    if v == 1:
        return [(mb, 0) for mb in range(m)]
    order = []
    for group in range(m // p):
        for chunk in range(v):
            order.extend((group * p + i, chunk) for i in range(p))
    return order


def _backward_order(p: int, m: int, v: int) -> list[tuple[int, int]]:
    """(mb, chunk) in backward order: FIFO micro-batches; with chunks, the groups visit the chunks in reverse."""
    if v == 1:
        return [(mb, 0) for mb in range(m)]
    order = []
    for group in range(m // p):
        for chunk in reversed(range(v)):
            order.extend((group * p + i, chunk) for i in range(p))
    return order


def _check_orders(acts, *, p, m, v, what, shown) -> None:
    for kind, expected, rule in (
            ("F", _forward_order(p, m, v),
             "micro-batch order" if v == 1 else "groups of p micro-batches, each group through chunk 0, 1, ..., v-1"),
            ("B", _backward_order(p, m, v),
             "micro-batch order (FIFO: the oldest micro-batch first)" if v == 1 else
             "the forward groups, each through the chunks in reverse (v-1, ..., 0), micro-batches FIFO")):
        got = [(mb, c) for k, mb, c in acts if k == kind]
        for i, (g, e) in enumerate(zip(got, expected)):
            if g != e:
                fmt = (lambda t: f"{kind}{t[0]}") if v == 1 else (lambda t: f"{kind}{t[0]}c{t[1]}")
                word = "forward" if kind == "F" else "backward"
                raise CheckFailure(
                    f"{what}: {word} #{i} is {fmt(g)}, expected {fmt(e)}: {word}s run in {rule}.\n"
                    f"  expected {word}s: {' '.join(fmt(t) for t in expected[:24])}"
                    f"{' ...' if len(expected) > 24 else ''}\n  {shown}")


def _check_alternation(acts, *, leading: int, leading_rule: str, what: str, shown: str, v: int = 1) -> None:
    """`leading` forwards, then one backward / one forward alternately while forwards remain, then backwards."""
    first_b = next((i for i, a in enumerate(acts) if a[0] == "B"), len(acts))
    if first_b != leading:
        raise CheckFailure(f"{what}: {first_b} forward(s) before the first backward; expected {leading_rule}.\n"
                           f"  {shown}")
    remaining_f = sum(1 for a in acts[first_b:] if a[0] == "F")
    prev = None
    for i in range(first_b, len(acts)):
        kind = acts[i][0]
        if kind == prev and remaining_f > 0:
            word = "forwards" if kind == "F" else "backwards"
            raise CheckFailure(
                f"{what}: two {word} in a row at actions {i - 1} and {i} "
                f"({_action_text(acts[i - 1] if v > 1 else acts[i - 1][:2])}, "
                f"{_action_text(acts[i] if v > 1 else acts[i][:2])}) while forwards remain: after "
                f"the warm-up the steady state alternates one backward and one forward, then only backwards "
                f"remain (cool-down).\n  {shown}")
        if kind == "F":
            remaining_f -= 1
        prev = kind


def _plain(actions) -> list[tuple[str, int, int]]:
    """(kind, mb, chunk) of every action of a list (checked or not), F&B pairs as their two halves."""
    out = []
    for a in actions:
        for b in (a[1:] if a[0] == "F&B" else (a,)):
            out.append((b[0], b[1], b[2] if len(b) == 3 else 0))
    return out


def in_flight_peak(actions) -> int:
    """The most stage outputs a schedule needs alive at once: max over its forwards of (forwards - backwards) so far."""
    live = peak = 0
    for kind, _, _ in _plain(actions):
        live += {"F": 1, "B": -1}.get(kind, 0)
        peak = max(peak, live)
    return peak


def pending_peak(actions) -> int:
    """The most micro-batches a schedule keeps activations for at once: forwarded, and not yet through their W
    (or their whole backward, for a B without a W). What a zero-bubble schedule holds."""
    flat = _plain(actions)
    deferred = {(mb, c) for kind, mb, c in flat if kind == "W"}
    live = peak = 0
    for kind, mb, c in flat:
        if kind == "F":
            live += 1
        elif kind == "W" or (kind == "B" and (mb, c) not in deferred):
            live -= 1
        peak = max(peak, live)
    return peak


def stage_of(style: str, p: int, rank: int, chunk: int) -> int:
    """The pipeline stage of a rank's chunk: "loop" chunk * p + rank (interleaving), "v" rank, then 2p - 1 - rank."""
    if style == "v":
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def owner_of(style: str, p: int, stage: int) -> int:
    """The rank that holds `stage` (the inverse of stage_of)."""
    if style == "v":
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


PAIR_MODELS = ("sequential", "joint")


def simulate_schedules(schedules, *, num_chunks: int = 1, forward: float = 1.0, backward: float = 2.0,
                       weight: float | None = None, style: str = "loop", pairs: str = "sequential",
                       pair_time: float | None = None) -> dict:
    """Run every stage's action list together on an ideal timeline (no communication time).

    `schedules[r]` is rank r's list. A forward of stage k > 0 starts when the
    same micro-batch's forward of stage k - 1 has finished; a backward of stage
    k < last when stage k + 1's backward (B) of it has; a W after its own B;
    each rank runs its actions in order, one at a time. Costs: `forward` and
    `backward` (the whole backward) per stage and micro-batch, split over the
    chunks; a B whose W comes later in the list costs `backward - weight`, its
    W `weight` (default: half the backward). Chunks are placed by `style`
    ("loop": chunk c of rank r is stage c p + r; "v": stage r and 2p - 1 - r).

    An ("F&B", f, b) pair runs by one of two models (`pairs`):
    - "sequential" (the course's executor, `run_pipeline_zb`): f, then b, each
      starting when its own input is there; f's output leaves when f ends;
    - "joint" (DeepSeek's DualPipe, `_forward_backward_chunk`: both receives,
      then the overlapped computation, then both sends): the pair starts when
      both inputs are there, and both outputs leave when the pair ends. It
      lasts `pair_time` per stage (split over the chunks like the other
      costs; the `F&B` of DualPipe's README), by default f's cost plus b's: no
      overlap. `pair_time` needs pairs="joint" (a pair shorter than its two
      halves is a pair computed as one).

    Returns {"events": per rank [(kind, mb, chunk, start, end)] (a joint pair
    drawn as its f then its b, in proportion to their costs), "makespan",
    "idle_fraction", "idle": per rank idle time}, or {"deadlock": text} when no
    rank can make progress (blocking receives would wait forever).
    """
    if pairs not in PAIR_MODELS:
        raise ValueError(f"simulate_schedules: pairs must be 'sequential' or 'joint', got {pairs!r}")
    if pair_time is not None and pairs != "joint":
        raise ValueError("simulate_schedules: pair_time (an overlapped pair's time) needs pairs='joint'; "
                         "sequential pairs run as their two halves")
    p = len(schedules)
    v = num_chunks
    w_cost = backward / 2 if weight is None else weight
    normalized = [_normalize(list(s), what=f"stage {r}", num_chunks=v, zero_bubble=True) for r, s in
                  enumerate(schedules)]
    deferred = [{(mb, c) for kind, mb, c in _flat(a) if kind == "W"} for a in normalized]
    # the units a rank runs one at a time: an action, or a joint pair (its two halves together)
    units = [[a[1:] if a[0] == "F&B" else (a,) for a in n] if pairs == "joint" else [(a,) for a in _flat(n)]
             for n in normalized]
    last = p * v - 1
    done: dict[tuple, float] = {}
    pos = [0] * p
    free = [0.0] * p
    events = [[] for _ in range(p)]
    total = sum(len(u) for u in units)
    finished = 0

    def dependency_and_cost(r, action):
        kind, mb, c = action
        k = stage_of(style, p, r, c)
        if kind == "F":
            return (("F", mb, k - 1) if k > 0 else None), forward, k
        if kind == "B":
            return (("B", mb, k + 1) if k < last else ("F", mb, k)), (
                backward - w_cost if (mb, c) in deferred[r] else backward), k
        return ("B", mb, k), w_cost, k

    while finished < total:
        progressed = False
        for r in range(p):
            while pos[r] < len(units[r]):
                unit = units[r][pos[r]]
                planned = [dependency_and_cost(r, a) for a in unit]
                inside = {(a[0], a[1], k) for a, (_, _, k) in zip(unit, planned)}
                deps = [dep for dep, _, _ in planned if dep is not None and dep not in inside]
                if any(dep not in done for dep in deps):
                    break
                start = max([free[r]] + [done[dep] for dep in deps])
                costs = [cost / v for _, cost, _ in planned]
                length = sum(costs) if pair_time is None or len(unit) == 1 else pair_time / v
                t = start
                for (kind, mb, c), (_, _, k), cost in zip(unit, planned, costs):
                    share = length * cost / sum(costs) if sum(costs) > 0 else 0.0
                    events[r].append((kind, mb, c, t, t + share))
                    t += share
                    done[(kind, mb, k)] = start + length if len(unit) > 1 else t
                free[r] = start + length
                pos[r] += 1
                finished += 1
                progressed = True
        if not progressed:
            lines = []
            for r in range(p):
                if pos[r] >= len(units[r]):
                    lines.append(f"stage {r}: finished")
                    continue
                unit = units[r][pos[r]]
                deps = [(a, dependency_and_cost(r, a)[0]) for a in unit]
                kind, mb, c = next(a for a, dep in deps if dep is not None and dep not in done)
                k = stage_of(style, p, r, c)
                if kind == "F":
                    need = f"F{mb} of stage {k - 1} (rank {owner_of(style, p, k - 1)})"
                else:
                    need = f"B{mb} of stage {k + 1} (rank {owner_of(style, p, k + 1)})"
                if v == 1 and style == "loop":
                    need = (f"stage {(k - 1) % p}'s F{mb}" if kind == "F" else f"stage {(k + 1) % p}'s B{mb}")
                elif style == "loop":
                    need = (f"stage {(k - 1) % p}'s F{mb} (chunk {(k - 1) // p})" if kind == "F" else
                            f"stage {(k + 1) % p}'s B{mb} (chunk {(k + 1) // p})")
                me = "&".join(_action_text(a[:2] if v == 1 else a) for a in unit)
                lines.append(f"stage {r}: blocked at action {pos[r]} ({me}), waiting for {need}")
            return {"deadlock": "\n  ".join(lines)}
    makespan = max((e[-1][4] for e in events if e), default=0.0)
    busy = [sum(ev[4] - ev[3] for ev in e) for e in events]
    idle = 1.0 - sum(busy) / (p * makespan) if makespan > 0 else 0.0
    return {"events": events, "makespan": makespan, "idle_fraction": idle, "idle": [makespan - b for b in busy]}


def show_schedules(schedule_fn, num_stages: int, num_microbatches: int, num_chunks: int = 1, *,
                   style: str = "loop", weight: float | None = None) -> None:
    """Print every stage's actions, and the idle fraction of the stages run together on an ideal timeline.

    The ideal timeline: a forward takes 1, a whole backward 2 (split over the
    chunks; a B whose W comes later 2 - W, its W `weight`, 1 by default),
    communication takes no time (`simulate_schedules`). For a V schedule
    (`style="v"`: two chunks per rank, called as `schedule_fn(p, stage, m)`)
    give num_chunks=2. Lists with overlapped F&B pairs get both pair models of
    `simulate_schedules`: the course's (sequential) and DualPipe's (joint).
    """
    for name, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches),
                        ("num_chunks", num_chunks)):
        if not _positive_int(value):
            raise ValueError(f"show_schedules: {name} must be a positive int, got {value!r}")
    if style not in ("loop", "v"):
        raise ValueError(f"show_schedules: style must be 'loop' or 'v', got {style!r}")
    p, m, v = num_stages, num_microbatches, num_chunks
    lists = _schedule_lists(schedule_fn, p, m, v, getattr(schedule_fn, "__name__", "schedule"),
                            chunk_arg=v > 1 and style == "loop")
    for s, actions in enumerate(lists):
        print(f"stage {s}: {format_actions(actions, limit=200)}")
    sim = simulate_schedules(lists, num_chunks=v, style=style, weight=weight)
    if "deadlock" in sim:
        print(f"run together, these schedules DEADLOCK:\n  {sim['deadlock']}")
        return
    split = any(a[0] in ("W", "F&B") for acts in lists for a in acts)
    costs = "F = 1, B = 2" + (f" (of which W = {1.0 if weight is None else weight:g})" if split else "")
    line = f"ideal timeline ({costs}, no communication time): idle fraction {sim['idle_fraction']:.4f}"
    if style == "loop" and not split:
        line += f"; (p - 1) / (v m + p - 1) = {pp_bubble_fraction(p, m, v):.4f}"
    if any(a[0] == "F&B" for acts in lists for a in acts):
        joint = simulate_schedules(lists, num_chunks=v, style=style, weight=weight, pairs="joint")
        line += (f" with each F&B pair run as its F then its B (the course's executor); "
                 f"{joint['idle_fraction']:.4f} with each pair waiting for both inputs and sending both outputs "
                 f"when it ends (DeepSeek's DualPipe)")
    print(line)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_picture_runs(runs, fields: tuple, what: str) -> list:
    """A picture's `runs` as the student wrote them: a list of tuples of `fields` (the last one, the number of
    chunks or the style, checked by the caller), num_stages and num_microbatches positive ints; else a ValueError
    that names the run and the field (`plot_pipeline_timelines: runs[1] = ('1F1B', ..., 4, 8) has 4 values`)."""
    try:
        runs = list(runs)
    except TypeError:
        raise ValueError(f"{what}: runs must be a list of ({', '.join(fields)}), got {runs!r}") from None
    if not runs:
        raise ValueError(f"{what}: runs is empty: give at least one ({', '.join(fields)})")
    for i, run in enumerate(runs):
        if not isinstance(run, (tuple, list)) or len(run) != len(fields):
            n = f"has {len(run)} values" if isinstance(run, (tuple, list)) else "is not a tuple"
            raise ValueError(f"{what}: runs[{i}] = {run!r} {n}; each run is ({', '.join(fields)})")
        for name, value in zip(fields, run):
            if name in ("num_stages", "num_microbatches", "num_chunks") and not _positive_int(value):
                raise ValueError(f"{what}: runs[{i}]: {name} must be a positive int, got {value!r}")
    return runs


def _schedule_lists(fn, p: int, m: int, v: int, name: str, *, chunk_arg: bool | None = None) -> list:
    """Every stage's list from the student's schedule function (NotImplementedError passes through).

    `chunk_arg`: whether fn takes the number of chunks (default: when v > 1; a V schedule does not)."""
    out = []
    for s in range(p):
        args = (p, s, m, v) if (v > 1 if chunk_arg is None else chunk_arg) else (p, s, m)
        try:
            out.append(fn(*args))
        except NotImplementedError:
            raise
        except Exception as exc:
            raise CheckFailure(f"{name}{args} raised {type(exc).__name__}: {exc}") from exc
    return out


def _check_feasible(lists, *, p, m, v, name, style: str = "loop") -> None:
    sim = simulate_schedules(lists, num_chunks=v, style=style)
    if "deadlock" in sim:
        shown = "\n  ".join(f"stage {s}: {format_actions(a)}" for s, a in enumerate(lists))
        raise CheckFailure(
            f"{name} with {p} stages and {m} micro-batches{f' and {v} chunks' if v > 1 else ''}: run together, "
            f"the stages deadlock (a stage blocks in a receive that its neighbour only sends after waiting for "
            f"this stage):\n  {sim['deadlock']}\n  {shown}")


def _expect_value_error(fn, args, must_mention, label: str) -> None:
    try:
        fn(*args)
    except ValueError as exc:
        absent = [str(s) for s in must_mention if str(s) not in str(exc)]
        if absent:
            raise CheckFailure(f"{label}: the ValueError should name the sizes involved ({', '.join(map(str, must_mention))}); "
                               f"its message was: {str(exc)!r}") from None
        return
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the wrong exception type is the finding
        raise CheckFailure(f"{label}: expected ValueError, got {type(exc).__name__}: {exc}") from None
    raise CheckFailure(f"{label}: expected ValueError, nothing was raised.")


def _schedule_errors(fn, name: str, extra=()) -> None:
    cases = [((2, 2, 4), (2,), "stage 2 of a 2-stage pipeline"), ((2, -1, 4), (-1,), "stage -1"),
             ((2, 0, 0), (0,), "0 micro-batches"), ((0, 0, 4), (0,), "0 stages")]
    for args, mention, label in list(cases) + list(extra):
        full = args if len(args) == 4 or name != "interleaved_1f1b_schedule" else (*args, 2)
        _expect_value_error(fn, full, mention, f"{name}{full} ({label})")


def _check_schedule_family(fn, name: str, cases, *, kind: str) -> None:
    for case in cases:
        p, m = case[0], case[1]
        v = case[2] if kind == "interleaved" else 1
        lists = _schedule_lists(fn, p, m, v, name)
        for s, actions in enumerate(lists):
            args = (p, s, m) if v == 1 else (p, s, m, v)
            what = f"{name}{args}"
            acts = _normalize(actions, what=what, num_chunks=v)
            shown = f"stage {s}: {format_actions(actions)}"
            _check_complete(acts, m=m, v=v, what=what, shown=shown)
            _check_orders(acts, p=p, m=m, v=v, what=what, shown=shown)
            if kind == "gpipe":
                leading, rule = m, f"all {m} forwards first (GPipe), then the backwards"
            elif kind == "1f1b":
                leading = min(p - s, m)
                rule = (f"min(p - stage, m) = {leading}: a warm-up of min(p - stage - 1, m) = "
                        f"{min(p - s - 1, m)} forward(s), then the first steady-state forward")
                if p - s - 1 >= m:
                    rule = f"all {m} (the warm-up min(p - stage - 1, m) = {m} covers every micro-batch)"
            else:
                warmup = min((p - s - 1) * 2 + (v - 1) * p, m * v)
                leading = min(warmup + 1, m * v)
                rule = (f"{leading}: a warm-up of min((p - stage - 1) * 2 + (v - 1) * p, m v) = {warmup} "
                        f"forward(s){', then the first steady-state forward' if warmup < m * v else ''}")
            _check_alternation(acts, leading=leading, leading_rule=rule, what=what, shown=shown, v=v)
        _check_feasible(lists, p=p, m=m, v=v, name=name)


def check_gpipe_schedule(gpipe_schedule, *, cases=((2, 3), (4, 2), (1, 2))) -> None:
    """GPipe: for every stage, each micro-batch forwarded once then backwarded once; all forwards first,
    in micro-batch order, then all backwards in micro-batch order (FIFO); the stages run together
    without deadlock; ValueError for a stage outside 0..p-1, p < 1 or m < 1. `cases`: (p, m) pairs."""
    _check_schedule_family(gpipe_schedule, "gpipe_schedule", cases, kind="gpipe")
    _schedule_errors(gpipe_schedule, "gpipe_schedule")


def check_one_f_one_b_schedule(one_f_one_b_schedule, *, cases=((2, 3), (4, 6), (3, 2), (1, 3))) -> None:
    """1F1B (Megatron's forward_backward_pipelining_without_interleaving), for every stage s of p:
    micro-batches forwarded and backwarded in order (FIFO); min(p - s, m) forwards before the first
    backward (the warm-up of min(p - s - 1, m), then the first steady-state forward); then one backward /
    one forward alternately while forwards remain, then the remaining backwards; the stages run together
    without deadlock; ValueError for invalid arguments. `cases`: (p, m) pairs."""
    _check_schedule_family(one_f_one_b_schedule, "one_f_one_b_schedule", cases, kind="1f1b")
    _schedule_errors(one_f_one_b_schedule, "one_f_one_b_schedule")


def check_interleaved_schedule(interleaved_1f1b_schedule, *, cases=((2, 4, 2), (4, 8, 2), (3, 3, 3))) -> None:
    """Interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving), stage s of p, v chunks:
    forwards in groups of p micro-batches, each group through chunk 0..v-1; backwards through the same
    groups with the chunks reversed (FIFO within a group); min(w + 1, m v) forwards before the first
    backward, w = min((p - s - 1) * 2 + (v - 1) * p, m v); then one backward / one forward alternately,
    then the remaining backwards; no deadlock across stages; ValueError when m is not a multiple of p,
    for v < 2, and for invalid stages. `cases`: (p, m, v)."""
    _check_schedule_family(interleaved_1f1b_schedule, "interleaved_1f1b_schedule", cases, kind="interleaved")
    _schedule_errors(interleaved_1f1b_schedule, "interleaved_1f1b_schedule",
                     extra=[((2, 0, 3, 2), (3, 2), "3 micro-batches on 2 stages"),
                            ((4, 1, 6, 2), (6, 4), "6 micro-batches on 4 stages"),
                            ((2, 0, 4, 1), (1,), "1 chunk")])


def check_bubble_fraction(bubble_fraction, *, cases=((4, 8, 1), (2, 1, 1), (8, 32, 1), (4, 8, 2), (1, 5, 1),
                                                    (3, 6, 3))) -> None:
    """bubble_fraction(p, m, num_chunks=v) = (p - 1) / (v m + p - 1) for each (p, m, v) (rtol 1e-12);
    `bubble_fraction(p, m)` means v = 1; ValueError for p, m or v below 1."""
    for p, m, v in cases:
        try:
            got = bubble_fraction(p, m) if v == 1 else bubble_fraction(p, m, num_chunks=v)
        except NotImplementedError:
            raise
        except Exception as exc:
            raise CheckFailure(f"bubble_fraction({p}, {m}, num_chunks={v}) raised {type(exc).__name__}: {exc}") from exc
        want = pp_bubble_fraction(p, m, v)
        if not isinstance(got, (int, float)) or abs(float(got) - want) > 1e-12 * max(1.0, abs(want)):
            raise CheckFailure(f"bubble_fraction({p}, {m}, num_chunks={v}) = {got!r}; expected (p - 1) / (v m + p - 1) "
                               f"= {p - 1} / {v * m + p - 1} = {want:.6f} (the idle share of the whole step, "
                               f"not of the busy time: (p - 1) / (v m) = {(p - 1) / (v * m):.6f})")
    for args, mention in (((0, 4), (0,)), ((4, 0), (0,)), ((4, 4, 0), (0,))):
        call = (lambda a=args: bubble_fraction(*a[:2], num_chunks=a[2])) if len(args) == 3 else \
            (lambda a=args: bubble_fraction(*a))
        _expect_value_error(call, (), mention, f"bubble_fraction{args}")
