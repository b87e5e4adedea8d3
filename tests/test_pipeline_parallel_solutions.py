"""The reference solution of assignment 03 (pipeline parallelism), tested directly and against PyTorch.

    .venv/bin/python -m pytest -q tests/test_pipeline_parallel_solutions.py

- validation (no process group needed);
- the schedules against the order torch.distributed.pipelining actually EXECUTES
  (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, recorded while they run on
  gloo), not against its `_get_pipeline_order` IR, which is wrong for the last stage;
- run_pipeline against torch.distributed.pipelining: loss and every gradient, float64,
  in a pipeline group inside a larger world;
- the ideal timeline reproduces the bubble formula; p = 2 interleaving never confuses the
  two message streams between the ranks (why the helpers need no tags);
- the reference through the public checks, and the deadlock the course warns about.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import autograder.checks.pipeline_parallel as checks  # noqa: E402
from autograder.checks.pipeline_parallel.executor import _join  # noqa: E402
from autograder.runtime.compare import CheckFailure  # noqa: E402
from autograder.runtime.dist import DistributedError, run_distributed  # noqa: E402
from autograder.lessons.volume import pp_bubble_fraction, pp_peak_outputs  # noqa: E402
from solutions.pipeline_parallel.p2p import (  # noqa: E402
    _check_recv_args, recv_backward, recv_forward, send_backward, send_forward,
)
from solutions.pipeline_parallel.executor import _check_pipeline_args, run_pipeline  # noqa: E402
from solutions.pipeline_parallel.schedules import (  # noqa: E402
    bubble_fraction, gpipe_schedule, interleaved_1f1b_schedule, one_f_one_b_schedule,
)

SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule, "interleaved": interleaved_1f1b_schedule}


def _lists(kind, p, m, v=1):
    fn = SCHEDULES[kind]
    return [fn(p, s, m) if kind != "interleaved" else fn(p, s, m, v) for s in range(p)]


# ---------------------------------------------------------------------------
# Validation: no process group needed
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [gpipe_schedule, one_f_one_b_schedule])
@pytest.mark.parametrize("args,mention", [((2, 2, 4), "2"), ((2, -1, 4), "-1"), ((0, 0, 1), "0"), ((2, 0, 0), "0"),
                                          ((2.0, 0, 1), "2.0")])
def test_schedules_reject_bad_arguments(fn, args, mention):
    with pytest.raises(ValueError, match=mention):
        fn(*args)


@pytest.mark.parametrize("args,mention", [((2, 0, 3, 2), r"\(3\).*\(2\)"), ((2, 0, 4, 1), "num_chunks"),
                                          ((2, 2, 4, 2), "stage 2")])
def test_interleaved_rejects_bad_arguments(args, mention):
    with pytest.raises(ValueError, match=mention):
        interleaved_1f1b_schedule(*args)


def test_bubble_fraction_values_and_errors():
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11, rel=1e-15)
    assert bubble_fraction(4, 8, num_chunks=2) == pytest.approx(3 / 19, rel=1e-15)
    assert bubble_fraction(1, 5) == 0.0
    for bad in ((0, 1), (1, 0), (2, 2, 0), (True, 2)):
        with pytest.raises(ValueError):
            bubble_fraction(*bad)


@pytest.mark.parametrize("fn", [send_forward, send_backward])
def test_sends_reject_a_non_group(fn):
    with pytest.raises(ValueError, match="ProcessGroup"):
        fn(torch.zeros(2), pp_group=None)


@pytest.mark.parametrize("fn", [recv_forward, recv_backward])
def test_receives_reject_a_non_group(fn):
    with pytest.raises(ValueError, match="ProcessGroup"):
        fn((2,), torch.float32, pp_group=0)


def test_recv_argument_checks():
    assert _check_recv_args([2, 3], torch.float64, "x") == (2, 3)
    with pytest.raises(ValueError, match="negative"):
        _check_recv_args((2, -1), torch.float32, "x")
    with pytest.raises(ValueError, match="dtype"):
        _check_recv_args((2,), "float32", "x")
    with pytest.raises(ValueError, match="shape"):
        _check_recv_args(3, torch.float32, "x")


def test_pipeline_argument_checks():
    m = nn.Linear(2, 2)
    xs = [torch.zeros(1, 2)] * 2
    chunks, acts = _check_pipeline_args(m, [("F", 0), ("F", 1), ("B", 0), ("B", 1)], xs, xs)
    assert chunks == [m] and acts == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("B", 1, 0)]
    with pytest.raises(ValueError, match=r"2 micro-batches and 1 targets"):
        _check_pipeline_args(m, [], xs, xs[:1])
    with pytest.raises(ValueError, match="no chunk"):
        _check_pipeline_args([m, m], [("F", 0)], xs, xs)
    with pytest.raises(ValueError, match="before its forward"):
        _check_pipeline_args(m, [("B", 0)], xs, xs)
    with pytest.raises(ValueError, match="never completes"):
        _check_pipeline_args(m, [("F", 0), ("B", 0)], xs, xs)
    with pytest.raises(ValueError, match="micro-batch 1 is"):
        _check_pipeline_args(m, [], [torch.zeros(1, 2), torch.zeros(1, 3)], xs)


# ---------------------------------------------------------------------------
# Schedules: properties, the ideal timeline, and the public checks on the reference
# ---------------------------------------------------------------------------

def test_public_schedule_checks_pass_on_the_reference():
    checks.check_gpipe_schedule(gpipe_schedule, cases=[(2, 3), (4, 2), (1, 2), (5, 7), (3, 1)])
    checks.check_one_f_one_b_schedule(one_f_one_b_schedule, cases=[(2, 3), (4, 6), (3, 2), (1, 3), (5, 3), (4, 9)])
    checks.check_interleaved_schedule(interleaved_1f1b_schedule,
                                      cases=[(2, 4, 2), (4, 8, 2), (3, 3, 3), (4, 12, 3), (1, 3, 2), (2, 6, 4)])
    checks.check_bubble_fraction(bubble_fraction)


@pytest.mark.parametrize("kind,p,m,v", [("gpipe", 4, 8, 1), ("gpipe", 3, 1, 1), ("1f1b", 4, 8, 1),
                                        ("1f1b", 4, 2, 1), ("1f1b", 5, 3, 1), ("1f1b", 1, 4, 1),
                                        ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3),
                                        ("interleaved", 3, 6, 2), ("interleaved", 4, 4, 4)])
def test_ideal_timeline_idle_fraction_is_the_bubble_formula(kind, p, m, v):
    """spec 4.3: an ideal timeline (forward 1, backward 2, no communication) reproduces (p - 1) / (v m + p - 1)."""
    sim = checks.simulate_schedules(_lists(kind, p, m, v), num_chunks=v)
    assert "deadlock" not in sim
    assert sim["idle_fraction"] == pytest.approx(pp_bubble_fraction(p, m, v), rel=1e-12, abs=1e-12)
    assert sim["idle_fraction"] != pytest.approx((p - 1) / (v * m)) or p == 1  # not Narayanan's ratio


@pytest.mark.parametrize("kind,p,m,v", [("gpipe", 3, 5, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1),
                                        ("interleaved", 4, 8, 2), ("interleaved", 3, 9, 3)])
def test_peak_outputs_formula_is_the_schedules_in_flight_peak(kind, p, m, v):
    for s, acts in enumerate(_lists(kind, p, m, v)):
        assert checks.in_flight_peak(acts) == pp_peak_outputs(kind, p, s, m, v)


def test_interleaved_peak_outputs_lesson_figure():
    """README / 03_memory.md: p = 4, m = 8, v = 2 holds 11, 9, 7, 5 chunk outputs."""
    assert [pp_peak_outputs("interleaved", 4, s, 8, 2) for s in range(4)] == [11, 9, 7, 5]


def test_the_simulation_finds_a_deadlock():
    lists = _lists("1f1b", 3, 4)
    lists[1] = [("B", 0)] + [a for a in lists[1] if a != ("B", 0)]  # stage 1 wants a gradient first
    sim = checks.simulate_schedules(lists)
    assert "deadlock" in sim and "stage 1: blocked at action 0 (B0)" in sim["deadlock"]


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (2, 4, 2), (2, 6, 3), (2, 8, 4), (3, 6, 2), (4, 8, 3)])
def test_interleaved_message_streams_match_in_posting_order(p, m, v):
    """With p = 2, forward activations (chunk c -> c + 1, wrap-around) and gradients travel between the same
    two ranks. gloo matches messages between two ranks in posting order; the executor posts a send when the
    producing action runs and a receive when the consuming action runs. Megatron's interleaved order posts
    them in the same order on both sides, so no tags are needed (and none exist under NCCL)."""
    lists = _lists("interleaved", p, m, v)
    last = p * v - 1
    sent = {}  # (src, dst) -> [message ids in posting order]
    received = {}
    for r, acts in enumerate(lists):
        for kind, mb, c in acts:
            vs = c * p + r
            if kind == "F":
                if vs < last:
                    sent.setdefault((r, (r + 1) % p), []).append(("act", mb, vs))
                if vs > 0:
                    received.setdefault(((r - 1) % p, r), []).append(("act", mb, vs - 1))
            else:
                if vs > 0:
                    sent.setdefault((r, (r - 1) % p), []).append(("grad", mb, vs))
                if vs < last:
                    received.setdefault(((r + 1) % p, r), []).append(("grad", mb, vs + 1))
    assert sent == received


# ---------------------------------------------------------------------------
# torch.distributed.pipelining: the independent reference
# ---------------------------------------------------------------------------

def _torch_stage_module(k, h):
    gen = torch.Generator().manual_seed(100 + k)
    return checks.TaggedStage(torch.randn(h, h, generator=gen, dtype=torch.float64) / h ** 0.5,
                              torch.randn(h, generator=gen, dtype=torch.float64))


def _data(m, b, h):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(m * b, h, generator=gen, dtype=torch.float64)
    y = torch.randn(m * b, h, generator=gen, dtype=torch.float64)
    return x, y


def _torch_rank(rank, world_size, kind, p, m, v, pp_ranks, b, h):
    """torch's own schedule on PipelineStage(s); records what it EXECUTES (forward_one_chunk / backward_one_chunk)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    group = _join(rank, [pp_ranks])
    if group is None:
        return None
    r = group.rank()
    x, y = _data(m, b, h)
    order, stages, modules = [], [], []
    for c in range(v):
        k = c * p + r
        module = _torch_stage_module(k, h)
        stage = PipelineStage(module, k, p * v, torch.device("cpu"), group=group)
        fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_one_chunk(mb, *a, _f=fwd, _c=c, **kw):
            order.append(("F", mb, _c))
            return _f(mb, *a, **kw)

        def backward_one_chunk(mb, *a, _b=bwd, _c=c, **kw):
            order.append(("B", mb, _c))
            return _b(mb, *a, **kw)

        stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk
        stages.append(stage)
        modules.append(module)
    loss_fn = nn.MSELoss()  # mean per micro-batch; torch scales gradients by 1/m (scale_grads=True)
    if kind == "gpipe":
        schedule = ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    elif kind == "1f1b":
        schedule = Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    else:
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    losses = []
    if r == 0:
        schedule.step(x, target=y, losses=losses)
    elif r == p - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    grads = [[q.grad.clone() for q in mod.parameters()] for mod in modules]
    loss = sum(loss.item() for loss in losses) / m if losses else None
    return {"order": order, "loss": loss, "grads": grads}


def _ours_rank(rank, world_size, kind, p, m, v, pp_ranks, b, h):
    group = _join(rank, [pp_ranks])
    if group is None:
        return None
    r = group.rank()
    x, y = _data(m, b, h)
    modules = [_torch_stage_module(c * p + r, h) for c in range(v)]
    schedule = SCHEDULES[kind](p, r, m) if kind != "interleaved" else interleaved_1f1b_schedule(p, r, m, v)
    loss = run_pipeline(modules if v > 1 else modules[0], schedule, list(x.chunk(m)), list(y.chunk(m)),
                        F.mse_loss, pp_group=group)
    order = [(a[0], a[1], a[2] if len(a) == 3 else 0) for a in schedule]
    return {"order": order, "loss": loss, "grads": [[q.grad.clone() for q in mod.parameters()] for mod in modules]}


TORCH_CASES = [("gpipe", 3, 4, 1), ("1f1b", 3, 5, 1), ("1f1b", 3, 3, 1), ("1f1b", 2, 6, 1),
               ("interleaved", 2, 4, 2), ("interleaved", 3, 6, 2), ("interleaved", 2, 2, 3)]


@pytest.mark.parametrize("kind,p,m,v", TORCH_CASES)
def test_reference_matches_torch_pipelining(kind, p, m, v):
    """Same stages, same micro-batches, in a pipeline group of a 4-rank world: our schedule is the order torch
    executes, and our run_pipeline gives torch's loss and gradients (float64)."""
    pp_ranks = list(range(4 - p, 4))  # group ranks differ from global ranks
    args = (kind, p, m, v, pp_ranks, 2, 4)
    theirs = run_distributed(_torch_rank, 4, args=args, timeout=60, check_collectives=False)
    ours = run_distributed(_ours_rank, 4, args=args, timeout=30, check_collectives=False)
    for g in pp_ranks:
        assert ours[g]["order"] == theirs[g]["order"], (g, ours[g]["order"], theirs[g]["order"])
        for mine, torch_grads in zip(ours[g]["grads"], theirs[g]["grads"]):
            for a, b in zip(mine, torch_grads):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    last = pp_ranks[-1]
    assert ours[last]["loss"] == pytest.approx(theirs[last]["loss"], rel=1e-12)
    assert all(ours[g]["loss"] is None for g in pp_ranks[:-1])


def test_torch_1f1b_pipeline_order_ir_is_not_what_it_executes():
    """The lesson says: Schedule1F1B._get_pipeline_order (torch 2.13) starts the last stage's steady state at
    micro-batch 1, so an independent reference must record what torch executes (the test above). If torch
    fixes it, this test fails: update 01_schedules_as_data.md."""
    from torch.distributed.pipelining.schedules import Schedule1F1B

    fake = Schedule1F1B.__new__(Schedule1F1B)
    fake._num_stages, fake._n_microbatches = 3, 4
    ir = Schedule1F1B._get_pipeline_order(fake)
    last = [(a.computation_type.name, a.microbatch_index) for a in ir[2] if a is not None
            and a.computation_type.name in ("FORWARD", "FULL_BACKWARD")]
    assert last[0] == ("FORWARD", 1)  # micro-batch 0's forward is missing from the IR
    assert ("FORWARD", 0) not in last


# ---------------------------------------------------------------------------
# The reference through the public checks (numbers, order, ledger, memory)
# ---------------------------------------------------------------------------

def test_p2p_helpers_reference():
    checks.check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, world_size=2)
    checks.check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, world_size=4,
                             pp_ranks=[[0, 1, 3]], shape=(2, 5), dtype=torch.float32, noncontiguous=True)
    checks.check_p2p_helpers(send_forward, recv_forward, send_backward, recv_backward, world_size=4,
                             pp_ranks=[[0, 2], [1, 3]])


@pytest.mark.parametrize("fn,kw", [
    (gpipe_schedule, dict(num_stages=3, num_microbatches=1, world_size=4, pp_ranks=[[1, 2, 3]])),
    (one_f_one_b_schedule, dict(num_stages=4, num_microbatches=2, dtype=torch.float32)),
    (one_f_one_b_schedule, dict(num_stages=1, num_microbatches=3)),
    (one_f_one_b_schedule, dict(num_stages=2, num_microbatches=4, world_size=4, pp_ranks=[[0, 2], [1, 3]])),
    (interleaved_1f1b_schedule, dict(num_stages=1, num_microbatches=2, num_chunks=3)),
    (interleaved_1f1b_schedule, dict(num_stages=4, num_microbatches=8, num_chunks=2)),
    (interleaved_1f1b_schedule, dict(num_stages=3, num_microbatches=3, num_chunks=3, world_size=4,
                                     pp_ranks=[[1, 2, 3]])),
])
def test_run_pipeline_reference(fn, kw):
    checks.check_run_pipeline(run_pipeline, fn, **kw)


@pytest.mark.parametrize("fn,p,m,v", [(gpipe_schedule, 3, 5, 1), (one_f_one_b_schedule, 4, 7, 1),
                                      (one_f_one_b_schedule, 4, 2, 1), (interleaved_1f1b_schedule, 4, 8, 2)])
def test_held_outputs_equal_the_formula(fn, p, m, v):
    """Measured (weak references, while the reference ran): the most outputs each rank held = pp_peak_outputs."""
    rec = checks.record_timeline(run_pipeline, fn, num_stages=p, num_microbatches=m, num_chunks=v,
                                 forward_ms=0, backward_ms=0)
    kind = {gpipe_schedule: "gpipe", one_f_one_b_schedule: "1f1b", interleaved_1f1b_schedule: "interleaved"}[fn]
    assert rec["held"] == [pp_peak_outputs(kind, p, s, m, v) for s in range(p)]
    checks.check_pipeline_memory(run_pipeline, fn, num_stages=p, num_microbatches=m, num_chunks=v)


def test_run_pipeline_errors_reference():
    checks.check_run_pipeline_errors(run_pipeline, world_size=2)


def test_the_timeline_is_recorded_while_running():
    """Events come from the probe: every rank's executed actions, in its schedule's order, with real durations."""
    rec = checks.record_timeline(run_pipeline, one_f_one_b_schedule, num_stages=3, num_microbatches=4,
                                 forward_ms=10, backward_ms=20)
    for r, events in enumerate(rec["events"]):
        assert [(e[0], e[1]) for e in events] == one_f_one_b_schedule(3, r, 4)
        for kind, _, _, start, end in events:
            assert end - start >= (0.009 if kind == "F" else 0.019)
    idle = checks.measured_idle_fraction(rec["events"])
    assert pp_bubble_fraction(3, 4) - 0.02 < idle < 0.9  # at least the bubble; communication only adds


# ---------------------------------------------------------------------------
# The deadlock the course warns about
# ---------------------------------------------------------------------------

def _blocking_rank(rank, world_size, m):
    """1F1B where every send is waited as soon as it is posted (the mistake)."""
    group = dist.group.WORLD
    x = torch.zeros(1, 2)
    for kind, mb in one_f_one_b_schedule(world_size, rank, m):
        if kind == "F" and rank < world_size - 1:
            send_forward(x, pp_group=group).wait()
        if kind == "F" and rank > 0:
            recv_forward((1, 2), torch.float32, pp_group=group)
        if kind == "B" and rank > 0:
            send_backward(x, pp_group=group).wait()
        if kind == "B" and rank < world_size - 1:
            recv_backward((1, 2), torch.float32, pp_group=group)
    return True


def test_blocking_sends_deadlock_1f1b_and_are_reported_with_stacks():
    with pytest.raises(DistributedError) as info:
        run_distributed(_blocking_rank, 2, args=(3,), timeout=10, check_collectives=False)
    text = str(info.value)
    assert "deadlock" in info.value.summary  # found by the runner's idleness watch, well before the timeout
    assert all(f.kind == "timeout" for f in info.value.failures)
    # each rank's stack shows where it blocked: in _blocking_rank, at a send's wait() (a C++ call, no frame of its own)
    assert all("_blocking_rank" in f.detail for f in info.value.failures), text


def test_a_schedule_that_cannot_run_is_reported_before_running():
    def bad(p, s, m):
        acts = one_f_one_b_schedule(p, s, m)
        return [("B", 0)] + [a for a in acts if a != ("B", 0)] if s == 1 else acts

    with pytest.raises(CheckFailure, match="not a schedule any executor could run"):
        checks.check_run_pipeline(run_pipeline, bad, num_stages=3, num_microbatches=3)
