"""The zero-bubble part of assignment 03, tested directly and against PyTorch (torch 2.13, gloo on CPU).

    .venv/bin/python -m pytest -q tests/test_pipeline_zero_bubble.py

- the split backward (solutions/pipeline_parallel/split_backward.py) against one full backward in float64
  and against PyTorch's own `stage_backward_input` / `stage_backward_weight`;
- ZB-H1 and DualPipeV as lists against the order torch EXECUTES (ScheduleInterleavedZeroBubble with one
  stage per rank, ScheduleDualPipeV; ScheduleZBVZeroBubble and the two-chunk ScheduleInterleavedZeroBubble
  for the checks' `torch_schedule`), recorded while it runs on gloo, overlapped pairs included; so the
  checks' oracle (`torch_schedule`, computed by each schedule's `_calculate_single_rank_operations`) is
  what torch runs, not only what a private helper says;
- run_pipeline_zb against torch's loss and gradients on the same stages, and against single-process float64;
- the ZB-H1 bubble formula on the timeline simulator (and where it stops holding), the message streams
  that need one tag each, the lesson's figures, and the public checks on the reference.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from autograder.checks.pipeline_parallel import split_backward as sb, zero_bubble as zb  # noqa: E402
from autograder.checks.pipeline_parallel.schedules import _plain, owner_of, pending_peak, simulate_schedules, stage_of  # noqa: E402,E501
from autograder.lessons.volume import pp_bubble_time, zb_readme_bubble_rate  # noqa: E402
from autograder.runtime.dist import run_distributed  # noqa: E402
from solutions.pipeline_parallel.executor_zb import _check_zb_args, run_pipeline_zb  # noqa: E402
from solutions.pipeline_parallel.schedules import (  # noqa: E402
    dualpipev_schedule, interleaved_1f1b_schedule, one_f_one_b_schedule, zb_h1_schedule,
)
from solutions.pipeline_parallel.split_backward import backward_input, backward_weight  # noqa: E402
from test_pipeline_parallel_solutions import _data as _untagged_data  # noqa: E402
from test_pipeline_parallel_solutions import _torch_stage_module as _stage  # noqa: E402


# ---------------------------------------------------------------------------
# The split backward
# ---------------------------------------------------------------------------

def _mlp(seed, bias=True, norm=False):
    gen = torch.Generator().manual_seed(seed)
    layers = [nn.Linear(4, 6, bias=bias), nn.Tanh()] + ([nn.LayerNorm(6)] if norm else []) + \
        [nn.Linear(6, 6, bias=False), nn.Tanh(), nn.Linear(6, 5, bias=bias)]
    model = nn.Sequential(*layers).double()
    with torch.no_grad():
        for q in model.parameters():
            q.copy_(torch.randn(q.shape, generator=gen, dtype=torch.float64) / 2)
    return model


@pytest.mark.parametrize("where", ["middle", "first", "last"])
@pytest.mark.parametrize("bias,norm", [(True, False), (False, True)])
def test_split_backward_equals_full_backward_and_torch(where, bias, norm):
    """B then W = one full backward (float64) = torch's stage_backward_input then stage_backward_weight."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    g = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    t = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    results = {}
    for how in ("full", "ours", "torch"):
        model = _mlp(0, bias, norm)
        x = x0.clone().requires_grad_(where != "first")
        y = model(x)
        if where == "last":
            y, grad = F.mse_loss(y, t), None
        else:
            grad = g
        inputs = [x] if where != "first" else []
        if how == "full":
            torch.autograd.backward(y, grad)
            dx = [x.grad] if inputs else []
        elif how == "ours":
            dx, state = backward_input(y, grad, inputs, list(model.parameters()))
            assert all(q.grad is None for q in model.parameters())
            del y
            backward_weight(state)
        else:  # torch: input_values of the first stage must still require grad for its param groups
            if not inputs:
                continue
            dx, groups = stage_backward_input([y], None if grad is None else [grad], inputs, model.parameters())
            stage_backward_weight(model.parameters(), groups)
            dx = list(dx)
        results[how] = (dx, [q.grad.clone() for q in model.parameters()])
    for how in results:
        for a, b in zip(results[how][0], results["full"][0]):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)
        for a, b in zip(results[how][1], results["full"][1]):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)


def test_split_points_reject_a_parameter_used_twice():
    from solutions.pipeline_parallel.split_backward import _weight_split_points

    w = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = F.linear(torch.tanh(F.linear(x, w)), w)
    with pytest.raises(ValueError, match="used by 2 operations"):
        _weight_split_points(y, [w])


def test_public_split_checks_pass_on_the_reference_every_case():
    cases = list(sb._SPLIT_CASES)
    sb.check_split_backward(backward_input, backward_weight, cases=cases, batch=4, seed=2)
    sb.check_split_backward_memory(backward_input, backward_weight, cases=cases, batch=4, seed=2)


# ---------------------------------------------------------------------------
# torch's executed order (the oracle of the schedule checks)
# ---------------------------------------------------------------------------

def _data(m, b, h):
    x, y = _untagged_data(m, b, h)  # 1F1B's comparison with torch: the same stages and data
    for i in range(m):
        x[i * b:(i + 1) * b, 0] = i
    return x, y


STYLES = {"zb_h1": ("loop", 1), "zb_interleaved": ("loop", 2), "dualpipev": ("v", 2), "zbv": ("v", 2)}


def _torch_rank(rank, world_size, name, p, m, b, h):
    """torch's schedule on PipelineStages; records what it EXECUTES: every forward_one_chunk,
    backward_one_chunk (input-only or whole), backward_weight_one_chunk, and which ran inside an OVERLAP_F_B."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S

    style, v = STYLES[name]
    group = dist.group.WORLD
    order, stages, modules = [], [], []
    for c in range(v):
        k = stage_of(style, p, rank, c)
        module = _stage(k, h)
        stage = PipelineStage(module, k, p * v, torch.device("cpu"), group=group)
        f, bw, ww = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

        def forward_one_chunk(mb, *a, _f=f, _c=c, **kw):
            order.append(("F", mb, _c))
            return _f(mb, *a, **kw)

        def backward_one_chunk(mb, *a, _b=bw, _c=c, **kw):
            order.append(("B" if kw.get("full_backward", True) else "I", mb, _c))
            return _b(mb, *a, **kw)

        def backward_weight_one_chunk(mb, *a, _w=ww, _c=c, **kw):
            order.append(("W", mb, _c))
            return _w(mb, *a, **kw)

        stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        stages.append(stage)
        modules.append(module)
    real = S.record_function

    @contextlib.contextmanager
    def record_function(label):  # the runtime labels each action it runs; a pair's label ends in OVERLAP_F_B
        if label.endswith("OVERLAP_F_B"):
            order.append(("pair",))
        with real(label):
            yield

    S.record_function = record_function
    cls = getattr(S, zb._TORCH_CLASSES[name])
    schedule = cls(stages, m, loss_fn=nn.MSELoss())
    x, y = _data(m, b, h)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    losses = []
    kwargs = {"target": y, "losses": losses} if last else {}
    schedule.step(*((x,) if first else ()), **kwargs)
    return {"order": order, "loss": sum(t.item() for t in losses) / m if losses else None,
            "grads": [[q.grad.clone() for q in mod.parameters()] for mod in modules]}


def _course_format(order, name):
    """torch's recorded order -> the course's list: I -> B (a W follows), B -> B (none follows), pairs."""
    out, i = [], 0
    while i < len(order):
        e = order[i]
        if e[0] == "pair":
            f, b = order[i + 1], order[i + 2]
            assert f[0] == "F" and b[0] == "B", (f, b)
            out.append(("F&B", f, b))
            i += 3
            continue
        out.append(("B" if e[0] == "I" else e[0], e[1], e[2]))
        i += 1
    if name == "zb_h1":
        out = [(a[0], a[1]) for a in out]
    return out


def _ours_rank(rank, world_size, name, p, m, b, h):
    import torch.distributed as dist

    style, v = STYLES[name]
    modules = [_stage(stage_of(style, p, rank, c), h) for c in range(v)]
    x, y = _data(m, b, h)
    fn = {"zb_h1": zb_h1_schedule, "dualpipev": dualpipev_schedule}.get(name) or zb.torch_schedule_fn(name)
    schedule = fn(p, rank, m)
    loss = run_pipeline_zb(modules if v > 1 else modules[0], schedule, list(x.chunk(m)), list(y.chunk(m)),
                           F.mse_loss, pp_group=dist.group.WORLD, style=style)
    return {"schedule": schedule, "loss": loss, "grads": [[q.grad.clone() for q in mod.parameters()]
                                                          for mod in modules]}


TORCH_CASES = [("zb_h1", 4, 6), ("zb_h1", 3, 2), ("zb_h1", 2, 4), ("dualpipev", 2, 5), ("dualpipev", 4, 8),
               ("dualpipev", 3, 7), ("zbv", 2, 4), ("zbv", 3, 6), ("zb_interleaved", 2, 4)]
TORCH_CASES_MORE = [("zb_h1", 4, 8), ("dualpipev", 2, 4), ("dualpipev", 4, 11), ("zbv", 4, 8), ("zb_interleaved", 3, 6)]


@pytest.mark.parametrize("name,p,m", TORCH_CASES + [pytest.param(*c, marks=pytest.mark.exhaustive)
                                                   for c in TORCH_CASES_MORE])
def test_torch_executes_the_checks_order_and_our_executor_matches_its_numbers(name, p, m):
    """What torch RUNS on gloo (recorded) = `torch_schedule` (the checks' oracle) = the course's reference
    list (ZB-H1, DualPipeV); run_pipeline_zb on that list gives torch's loss and gradients (float64)."""
    args = (name, p, m, 2, 4)
    theirs = run_distributed(_torch_rank, p, args=args, timeout=60, check_collectives=False)
    ours = run_distributed(_ours_rank, p, args=args, timeout=30, check_collectives=False)
    oracle = zb.torch_schedule(name, p, m)
    for r in range(p):
        executed = _course_format(theirs[r]["order"], name)
        assert executed == oracle[r], (r, executed, oracle[r])
        assert [tuple(a) for a in ours[r]["schedule"]] == oracle[r], (r, ours[r]["schedule"], oracle[r])
        for mine, torch_grads in zip(ours[r]["grads"], theirs[r]["grads"]):
            for a, b in zip(mine, torch_grads):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    loss_rank = 0 if STYLES[name][0] == "v" else p - 1
    assert ours[loss_rank]["loss"] == pytest.approx(theirs[loss_rank]["loss"], rel=1e-12)
    assert all(ours[r]["loss"] is None for r in range(p) if r != loss_rank)


def test_course_schedules_equal_torchs_order_over_a_sweep():
    """The oracle, for many more sizes than torch is run for above: ZB-H1 for p = 1..6, DualPipeV p = 2..6."""
    for p in range(1, 7):
        for m in range(1, 14):
            if m % max(1, m // p) == 0:  # torch's ZB needs m to split into equal rounds
                assert [zb_h1_schedule(p, s, m) for s in range(p)] == zb.torch_schedule("zb_h1", p, m), (p, m)
            if p >= 2 and m >= 2 * p:
                assert [dualpipev_schedule(p, s, m) for s in range(p)] == zb.torch_schedule("dualpipev", p, m), (p, m)


# ---------------------------------------------------------------------------
# The executor against single-process float64, through the public checks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn,kw", [
    (zb_h1_schedule, dict(num_stages=4, num_microbatches=2, dtype=torch.float32)),
    (zb_h1_schedule, dict(num_stages=3, num_microbatches=5, world_size=4, pp_ranks=[[0, 1, 3]])),
    (zb_h1_schedule, dict(num_stages=1, num_microbatches=3)),
    (dualpipev_schedule, dict(num_stages=2, num_microbatches=4, style="v")),
    (dualpipev_schedule, dict(num_stages=2, num_microbatches=5, style="v", world_size=4, pp_ranks=[[1, 3]])),
    (dualpipev_schedule, dict(num_stages=4, num_microbatches=10, style="v")),
    (one_f_one_b_schedule, dict(num_stages=3, num_microbatches=4)),
    (interleaved_1f1b_schedule, dict(num_stages=2, num_microbatches=4, num_chunks=2)),
])
def test_run_pipeline_zb_reference(fn, kw):
    zb.check_run_pipeline_zb(run_pipeline_zb, fn, **kw)


def test_zb_memory_reference():
    zb.check_pipeline_zb_memory(run_pipeline_zb, zb_h1_schedule, num_stages=4, num_microbatches=7)
    zb.check_pipeline_zb_memory(run_pipeline_zb, dualpipev_schedule, num_stages=4, num_microbatches=8, style="v")


@pytest.mark.parametrize("fn,p,m,style", [(zb_h1_schedule, 3, 5, "loop"), (dualpipev_schedule, 2, 5, "v")])
def test_zb_memory_sees_inputs_and_w_states_on_the_reference(fn, p, m, style):
    """The two upper bounds of check_pipeline_zb_memory (received stage inputs, W-state gradients) watch tensors
    that exist: on the reference they are reached exactly, so a count that stayed 0 proves nothing is not what
    passes. Stage inputs live until their W (the graph keeps them), a W state from its B to its W."""
    layout, schedules, case, results, v = zb._run_zb(
        run_pipeline_zb, fn, num_stages=p, num_microbatches=m, style=style, num_chunks=None, world_size=p,
        pp_ranks=None, batch=2, hidden=4, dtype=torch.float64, seed=0, measure_memory=True, sleeps=(0.0, 0.0, 0.0),
        backend="gloo", timeout=zb._TIMEOUT)
    peaks = []
    for res in results:
        flat = _plain(schedules[res["group_rank"]])
        deferred = {(mb, c) for kind, mb, c in flat if kind == "W"}
        receives = {c for c in range(v) if stage_of(style, p, res["group_rank"], c) != 0}
        given = pending = 0
        want = []
        for kind, mb, c in flat:
            if kind == "F":
                given += c in receives
                want.append((given, pending))
            elif kind == "B" and (mb, c) in deferred:
                pending += 1
            else:
                given -= c in receives
                pending -= kind == "W"
        assert [tuple(h[4:6]) for h in res["held"]] == want
        assert res["held_after"] == (0, 0, 0, 0)
        peaks.append(max(want))
    assert max(g for g, _ in peaks) > 0
    # ZB-H1 forwards while Ws wait; DualPipeV runs every pending W before its next forward (its bound there is 0)
    assert (max(d for _, d in peaks) > 0) == (style == "loop")


def test_public_schedule_checks_pass_on_the_reference():
    zb.check_zb_h1_schedule(zb_h1_schedule, cases=[(4, 8), (3, 5), (4, 3), (2, 2), (5, 9), (6, 6), (3, 1),
                                                       (1, 3)])
    zb.check_dualpipev_schedule(dualpipev_schedule, cases=[(4, 8), (2, 4), (3, 7), (2, 5), (4, 11), (5, 10),
                                                               (6, 13)])


def test_zb_argument_checks():
    m = nn.Linear(2, 2)
    xs = [torch.zeros(1, 2)] * 2
    chunks, acts, deferred = _check_zb_args([m, m], [("F", 0, 0), ("F&B", ("F", 0, 1), ("B", 0, 1)), ("W", 0, 1),
                                                     ("B", 0, 0)], xs[:1], xs[:1], "v", 2)
    assert acts == [("F", 0, 0), ("F", 0, 1), ("B", 0, 1), ("W", 0, 1), ("B", 0, 0)] and deferred == {(0, 1)}
    for bad, match in [([("W", 0), ("F", 0), ("B", 0)], "before its B"), ([("F", 0), ("B", 0), ("B", 0)], "second"),
                       ([("F", 0)], "never backwards"), ([("F&B", ("B", 0), ("F", 0))], "forward then a backward")]:
        with pytest.raises(ValueError, match=match):
            _check_zb_args(m, bad, xs[:1], xs[:1], "loop", 2)
    with pytest.raises(ValueError, match="2 chunks"):
        _check_zb_args(m, [], xs, xs, "v", 2)
    with pytest.raises(ValueError, match="style"):
        _check_zb_args(m, [], xs, xs, "w", 2)


# ---------------------------------------------------------------------------
# The bubble, the streams, the lesson's figures
# ---------------------------------------------------------------------------

def test_zb_h1_bubble_formula_holds_exactly_when_every_w_fits():
    """04 §6: every rank idles (p - 1)(F + B - 2W) iff W <= F and W <= B - W (m >= p); B = the whole backward."""
    for p, m in [(2, 2), (3, 3), (4, 4), (4, 7), (5, 9), (6, 6)]:
        lists = [zb_h1_schedule(p, s, m) for s in range(p)]
        for f, b_in, w in itertools.product([0.5, 1, 1.5, 2, 3], repeat=3):
            idle = simulate_schedules(lists, forward=f, backward=b_in + w, weight=w)["idle"]
            formula = (p - 1) * (f + b_in - w)
            holds = all(abs(t - formula) < 1e-9 for t in idle)
            assert holds == (w <= f and w <= b_in), (p, m, f, b_in, w, idle, formula)


LESSON_04 = os.path.join("assignments", "03_pipeline_parallel", "04_interleaving_and_zero_bubble.md")


def _section(rel: str, number: int) -> str:
    """The text of section `number` (`## number. ...` up to the next `## `) of a lesson, English or Chinese."""
    text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
    found = re.search(rf"^## {number}\.[^\n]*\n(.*?)(?=^## )", text, re.S | re.M)
    assert found, f"{rel}: no section {number}"
    return found.group(1)


def _percents(text: str) -> list[str]:
    return re.findall(r"(\d+(?:\.\d+)?) %", text)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _lesson_numbers():
    """What 04 §6-7 print, computed: p = 4, m = 8, F = 1, B = 2 (whole backward), W = 1 per stage."""
    p, m = 4, 8
    one = [one_f_one_b_schedule(p, s, m) for s in range(p)]
    zbh1 = [zb_h1_schedule(p, s, m) for s in range(p)]
    dpv = [dualpipev_schedule(p, s, m) for s in range(p)]
    v = dict(num_chunks=2, style="v", weight=1.0)
    sims = {"1f1b": simulate_schedules(one), "zb-h1": simulate_schedules(zbh1, weight=1.0),
            "sequential": simulate_schedules(dpv, **v), "joint": simulate_schedules(dpv, pairs="joint", **v),
            "joint 2.5": simulate_schedules(dpv, pairs="joint", pair_time=2.5, **v)}
    held = {"1f1b": max(pending_peak(a) for a in one), "zb-h1": max(pending_peak(a) for a in zbh1),
            "dualpipev": max(pending_peak(a) for a in dpv) / 2}
    return p, m, sims, held


def test_lesson_figures():
    """04 §6-7, every number the lesson prints about idle time, computed: for p = 4, m = 8, F = 1, B = 2, W = 1
    1F1B 27.3 %, ZB-H1 11.1 % (the README's rates R = 27.3 % and R/3 = 9.1 %), DualPipeV 5.9 % with the course's
    sequential pairs and 11.1 % with DeepSeek's joint ones; 24.5 against 27 with pairs of 2.5; the busiest
    rank's activations; in the English lesson and its Chinese twin."""
    p, m, sims, held = _lesson_numbers()
    assert [_pct(sims[k]["idle_fraction"]) for k in ("1f1b", "zb-h1", "sequential", "joint")] == \
        ["27.3", "11.1", "5.9", "11.1"]
    assert sims["zb-h1"]["idle_fraction"] == pytest.approx((p - 1) / (3 * m + p - 1))
    rate, third = zb_readme_bubble_rate("1f1b", p, m), zb_readme_bubble_rate("zb1p", p, m)
    assert rate == pytest.approx(sims["1f1b"]["idle_fraction"]) and _pct(third) == "9.1"
    # joint = the README's formula (PP = 2p stages of half a stage each), = ZB-H1's bubble; sequential = half of it
    # the family table's ZB-H2 row: (p - 1)(F + B - 3W), the paper's (p - 1)(T_F + T_B - 2 T_W) with T_B = B - W
    assert pp_bubble_time("zb-h2", p, forward=1, backward=2, weight=1) == 0
    assert pp_bubble_time("zb-h2", p, forward=2, backward=5, weight=1) == (p - 1) * (2 + (5 - 1) - 2 * 1)
    dualpipe = pp_bubble_time("dualpipe", 2 * p, forward=0.5, backward=1.0, weight=0.5)
    assert dualpipe == 3.0 == pp_bubble_time("zb-h1", p, forward=1, backward=2, weight=1)
    assert sims["joint"]["idle"] == [dualpipe] * p and sims["sequential"]["idle"] == [dualpipe / 2] * p
    # overlap: pairs of 2.5 instead of 3; the most idle ranks idle the README's bubble with F&B = 2.5
    assert (sims["joint 2.5"]["makespan"], sims["zb-h1"]["makespan"]) == (24.5, 27.0)
    assert _pct(1 - 24.5 / 27.0) == "9.3"
    assert max(sims["joint 2.5"]["idle"]) == pp_bubble_time("dualpipe", 8, forward=0.5, backward=1.0, weight=0.5,
                                                            pair=1.25)
    # W < F: F = B - W = 2, W = 1 (B = 3): joint DualPipeV 7.5, ZB-H1 9 stage-times per rank
    dpv = [dualpipev_schedule(p, s, m) for s in range(p)]
    wide = simulate_schedules(dpv, num_chunks=2, style="v", forward=2, backward=3, weight=1, pairs="joint")["idle"]
    zb_wide = simulate_schedules([zb_h1_schedule(p, s, m) for s in range(p)], forward=2, backward=3, weight=1)["idle"]
    assert wide == [7.5] * p and zb_wide == [9.0] * p and 9.0 - 7.5 == (p - 1) * (2 - 1) / 2
    assert held == {"1f1b": 4, "zb-h1": 4, "dualpipev": 4.5}
    for rel in (LESSON_04, os.path.join("zh", LESSON_04)):
        six, seven = _section(rel, 6), _section(rel, 7)
        assert set(_percents(six)) == {"27.3", "11.1", "9.1"}, (rel, _percents(six))
        rows = [_percents(line) for line in seven.splitlines() if line.startswith("|") and " % |" in line]
        assert rows == [["27.3"], ["11.1"], ["5.9"], ["11.1"]], (rel, rows)
        table = [line for line in seven.splitlines() if line.startswith("|") and " % |" in line]
        assert [re.match(r"[\d.]+", line.rstrip(" |").rsplit("| ", 1)[1]).group() for line in table] == \
            ["4", "4", "4.5", "4.5"], rel
        assert set(_percents(seven)) == {"27.3", "11.1", "5.9", "9.3"}, (rel, _percents(seven))
        for number in ("24.5", "27", "7.5", "9", "2.5"):
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d.])", seven), (rel, number)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 11), (5, 10), (6, 12)])
def test_only_joint_pairs_reproduce_dualpipes_formula(p, m):
    """04 §7: with DeepSeek's pair model (both inputs before the pair, both outputs after it) every rank of
    DualPipeV idles DualPipe's README bubble (PP/2 - 1)(F&B + B - 3W) whenever F = B - W >= W (15 cost pairs);
    with the course's (the forward's output sent before the backward half) it idles half of it at
    F = B - W = W. With joint pairs shorter than F + B (overlap, down to max(F, B)) the ranks with the most
    pairs idle exactly the formula with that F&B, the others less."""
    lists = [dualpipev_schedule(p, s, m) for s in range(p)]
    pairs_per_rank = [sum(a[0] == "F&B" for a in acts) for acts in lists]
    for f, w in itertools.product([0.5, 1, 1.5, 2, 3], repeat=2):
        if w > f:
            continue
        b = f + w  # the whole backward: input gradient f, weight gradient w
        costs = dict(num_chunks=2, style="v", forward=f, backward=b, weight=w)
        for share in (1.0, 0.9, 0.75):
            pair = share * (f + b)
            if pair < max(f, b):
                continue
            idle = simulate_schedules(lists, pairs="joint", pair_time=pair, **costs)["idle"]
            want = pp_bubble_time("dualpipe", 2 * p, forward=f / 2, backward=b / 2, weight=w / 2, pair=pair / 2)
            most = [r for r, n in enumerate(pairs_per_rank) if n == max(pairs_per_rank)]
            assert all(abs(idle[r] - want) < 1e-9 for r in most), (f, w, pair, idle, want)
            assert all(t <= want + 1e-9 for t in idle), (f, w, pair, idle, want)
            if share == 1.0:
                assert all(abs(t - want) < 1e-9 for t in idle), (f, w, idle, want)
        if f == w:
            full = pp_bubble_time("dualpipe", 2 * p, forward=f / 2, backward=b / 2, weight=w / 2)
            sequential = simulate_schedules(lists, **costs)["idle"]
            assert all(abs(t - full / 2) < 1e-9 for t in sequential), (f, w, sequential, full)


def test_show_schedules_prints_both_pair_models(capsys):
    """The notebook's DualPipeV scratch cell: the idle fraction with the course's pairs and with DeepSeek's."""
    from autograder.checks.pipeline_parallel import show_schedules

    show_schedules(dualpipev_schedule, num_stages=4, num_microbatches=8, num_chunks=2, style="v")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "idle fraction 0.0588 with each F&B pair run as its F then its B" in last, last
    assert "0.1111 with each pair waiting for both inputs and sending both outputs" in last, last
    show_schedules(zb_h1_schedule, num_stages=4, num_microbatches=8)
    assert "DualPipe" not in capsys.readouterr().out


def test_pair_model_arguments():
    lists = [dualpipev_schedule(2, s, 4) for s in range(2)]
    with pytest.raises(ValueError, match="pairs must be"):
        simulate_schedules(lists, num_chunks=2, style="v", pairs="overlapped")
    with pytest.raises(ValueError, match="needs pairs='joint'"):
        simulate_schedules(lists, num_chunks=2, style="v", pair_time=2.0)
    # a list without pairs runs the same under both models
    zbh1 = [zb_h1_schedule(3, s, 5) for s in range(3)]
    assert simulate_schedules(zbh1, pairs="joint") == simulate_schedules(zbh1)
    for name, bad in (("1f1b", dict(schedule="zb")), ("dualpipe", dict(num_stages=3))):
        kwargs = dict(schedule=name, num_stages=4, forward=1.0, backward=2.0)
        kwargs.update(bad)
        with pytest.raises(ValueError):
            pp_bubble_time(**kwargs)
    with pytest.raises(ValueError):
        zb_readme_bubble_rate("zbh1", 4, 8)


def _streams(lists, p, style, v, tagged):
    """(src, dst[, stream]) -> messages in posting order, as senders post them and as receivers consume them."""
    last = p * v - 1
    sent, received = {}, {}
    for r, acts in enumerate(lists):
        for kind, mb, c in _plain(acts):
            k = stage_of(style, p, r, c)
            owner = lambda s: owner_of(style, p, s)  # noqa: E731
            if kind == "F":
                if k < last and owner(k + 1) != r:
                    sent.setdefault((r, owner(k + 1), "act" if tagged else ""), []).append(("act", mb, k))
                if k > 0 and owner(k - 1) != r:
                    received.setdefault((owner(k - 1), r, "act" if tagged else ""), []).append(("act", mb, k - 1))
            elif kind == "B":
                if k > 0 and owner(k - 1) != r:
                    sent.setdefault((r, owner(k - 1), "grad" if tagged else ""), []).append(("grad", mb, k))
                if k < last and owner(k + 1) != r:
                    received.setdefault((owner(k + 1), r, "grad" if tagged else ""), []).append(("grad", mb, k + 1))
    return sent, received


def test_which_schedules_need_a_tag_per_stream():
    """04 §8: with one tag, gloo matches a rank's messages in posting order, so the orders of the two sides must
    agree. They do for 1F1B, ZB-H1 and Megatron's interleaving (run_pipeline needs no tag); they do not in the V
    (DualPipeV, ZBV: p = 3, m = 6 is the lesson's example) nor in torch's interleaved zero-bubble order, and do with
    one tag per stream, which run_pipeline_zb uses."""
    def agree(lists, p, style, v, tagged):
        sent, received = _streams(lists, p, style, v, tagged)
        return sent == received

    for p, m in [(2, 4), (3, 6), (4, 8), (4, 2)]:
        assert agree([one_f_one_b_schedule(p, s, m) for s in range(p)], p, "loop", 1, False)
        assert agree([zb_h1_schedule(p, s, m) for s in range(p)], p, "loop", 1, False)
    for p, m, v in [(2, 4, 2), (3, 6, 2), (4, 8, 3)]:
        assert agree([interleaved_1f1b_schedule(p, s, m, v) for s in range(p)], p, "loop", v, False)
    lists = zb.torch_schedule("zb_interleaved", 2, 4)  # torch's interleaved zero-bubble order at p = 2 needs them too
    assert not agree(lists, 2, "loop", 2, False) and agree(lists, 2, "loop", 2, True)
    assert agree(zb.torch_schedule("zb_interleaved", 3, 6), 3, "loop", 2, True)
    for p, m in [(3, 6), (4, 8), (4, 11)]:
        lists = [dualpipev_schedule(p, s, m) for s in range(p)]
        assert not agree(lists, p, "v", 2, False) and agree(lists, p, "v", 2, True), (p, m)
        lists = zb.torch_schedule("zbv", p, m)
        assert not agree(lists, p, "v", 2, False) and agree(lists, p, "v", 2, True), (p, m)
    sent, received = _streams([dualpipev_schedule(3, s, 6) for s in range(3)], 3, "v", 2, False)
    assert sent[(0, 1, "")][4:6] == [("act", 4, 0), ("grad", 0, 5)]
    assert received[(0, 1, "")][4:6] == [("grad", 0, 5), ("act", 4, 0)]
