"""Warm ranks (autograder.runtime.pool): what a check's ranks return from the pool is what fresh ranks return,
whatever a check leaves behind, and a graded submission gets the same verdicts with and without the pool.

    .venv/bin/python -m pytest -q tests/test_rank_pool.py                       # the fast sample
    COURSE_EXHAUSTIVE=1 .venv/bin/python -m pytest -q tests/test_rank_pool.py   # every mutant of every assignment

The pool answers only runs that succeed on every rank; anything else (an
exception, a crash, a hang, a rank that computes too long) makes it give the
run back (None) and tear itself down, and the zygote runs the check on fresh
ranks, whose verdicts are the runner's own (autograder.runtime.dist).
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import subprocess
import sys

import cloudpickle
import pytest
import torch

from course import ROOT, assignments

sys.path.insert(0, ROOT)
import autograder.runtime.agreement  # noqa: E402,F401 - imported before forking, as the zygote does
from autograder.grading.trusted import dumps_by_value, resolve  # noqa: E402
from autograder.runtime import run_distributed  # noqa: E402
from autograder.runtime.pool import RankPool  # noqa: E402
from solutions import submissions  # noqa: E402


def _collectives(rank, world_size, scale):
    import torch.distributed as dist

    from torch.distributed import distributed_c10d as c10d

    groups_before = len(c10d._world.pg_map)  # the default group only: the last check's groups are gone
    t = torch.arange(4.0) * (rank + 1) * scale
    dist.all_reduce(t)
    halves = [[r for r in range(world_size) if r % 2 == parity] for parity in (0, 1)]
    pair = [dist.new_group(ranks) for ranks in halves if ranks][rank % 2]
    u = t.clone()
    dist.all_reduce(u, group=pair)
    return {"sum": t, "pair": u, "rand": torch.rand(3), "groups_before": groups_before,
            "dtype": str(torch.get_default_dtype()), "grad": torch.is_grad_enabled()}


def _changes_what_it_should_not(rank, world_size):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.manual_seed(1234 + rank)
    random.seed(99)
    os.chdir("/")
    return rank


def _raises(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 fails")
    return rank


def _deadlocks(rank, world_size):
    import torch.distributed as dist

    if rank == 0:
        dist.recv(torch.zeros(1), src=1)  # rank 1 never sends
    return rank


def _dies(rank, world_size):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def _computes_forever(rank, world_size):
    while True:
        pass


def _computes_without_torch_ops(rank, world_size):
    import time

    t0, x = time.process_time(), 0
    while time.process_time() - t0 < 1.0:  # a CPU-second of plain Python: no torch op dispatched
        x += 1
    return rank


def _pids(rank, world_size):
    return os.getpid()


def _request(fn, world_size, **kwargs):
    return dumps_by_value((fn, world_size, dict(kwargs)))


@pytest.fixture
def pool():
    p = RankPool(cloudpickle.loads, resolve, {})
    yield p
    p.close()


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_the_pool_returns_what_fresh_ranks_return_check_after_check(pool):
    """World sizes in turn (each pool kept warm), the caller's random state moving between checks, a check that
    changes the rank's defaults in between: every result equals a fresh run's, the check's groups are gone."""
    for i, world_size in enumerate([2, 4, 1, 2, 4, 2]):
        torch.manual_seed(i)
        random.seed(i)
        got = pool.run(_request(_collectives, world_size, args=(i + 1,)), world_size, {"args": (i + 1,)})
        fresh = run_distributed(_collectives, world_size, args=(i + 1,))
        assert got is not None, f"check {i} (world size {world_size}) was not served by the pool: {pool.gave_up}"
        for rank, (g, f) in enumerate(zip(got, fresh)):
            assert _same(g, f), f"check {i}, rank {rank}: pool {g} != fresh {f}"
            assert g["groups_before"] == 1, f"check {i}, rank {rank}: a previous check's groups were left"
        assert pool.run(_request(_changes_what_it_should_not, world_size), world_size, {}) == list(range(world_size))
    assert pool.served == 12 and pool.declined == 0


@pytest.mark.parametrize("fn", [_raises, _deadlocks, _dies, _computes_forever], ids=lambda f: f.__name__)
def test_a_check_that_does_not_succeed_is_given_back_and_its_pool_rebuilt(pool, fn):
    """Whatever breaks a check's ranks: None (the zygote runs it fresh, where the verdict is made), no pool left
    standing, and the next check of that size gets new ranks that work."""
    before = pool.run(_request(_pids, 2), 2, {})
    assert before is not None
    assert pool.run(_request(fn, 2, timeout=4.0), 2, {"timeout": 4.0}) is None
    if fn is _raises:  # the reason given names the rank and quotes its log (the traceback)
        assert "rank 1" in pool.gave_up and "ValueError: rank 1 fails" in pool.gave_up, pool.gave_up
    assert pool._pools == {}, "a pool that failed a check is kept"
    for pid in before:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: not left running
    after = pool.run(_request(_pids, 2), 2, {})
    assert after is not None and set(after).isdisjoint(before), "the next check ran on the broken ranks"
    assert pool.declined == 1


def test_ranks_that_compute_without_torch_ops_are_not_given_up(pool):
    """More ranks than cores, each computing a CPU-second in plain Python (no op counted): each runs a fraction
    of the time, the ranks together all of it, and the pool serves the check instead of giving it up as idle."""
    assert pool.run(_request(_computes_without_torch_ops, 8), 8, {}) == list(range(8)), pool.gave_up


def test_runs_the_pool_does_not_serve_go_to_fresh_ranks(pool):
    for kwargs in ({"show_output": True}, {"start_method": "spawn"}, {"backend": "nccl"}):
        assert pool.run(_request(_pids, 2, **kwargs), 2, kwargs) is None
    assert pool.run(_request(_pids, 64), 64, {}) is None  # more ranks than the pool keeps warm
    assert pool._pools == {} and pool.served == 0


def test_closing_leaves_no_process(pool):
    pids = pool.run(_request(_pids, 4), 4, {}) + pool.run(_request(_pids, 2), 2, {})
    pool.close()
    left = subprocess.run(["ps", "-o", "pid=", "--ppid", str(os.getpid())], capture_output=True, text=True).stdout
    assert not set(pids) & {int(p) for p in left.split()}


# -- graded submissions: the same verdicts with and without the pool ------------------------------------------------

ALWAYS = {("02_tensor_parallel", "sp_grads_none_not_skipped"), ("05_expert_parallel", "moe_global_rank")}


def _mutants():
    """(assignment, mutant) of every kept mutant: those in ALWAYS in `make test`, the others with
    COURSE_EXHAUSTIVE=1."""
    return [pytest.param(a, m, id=f"{a[:2]}-{m.name}", marks=() if (a, m.name) in ALWAYS else pytest.mark.exhaustive)
            for a in assignments() for m in submissions.mutants_of(a)]


def _grade(assignment: str, nb: dict, pool: bool) -> dict:
    from autograder.grading.trusted import grade_notebook

    with open(submissions.notebook_path("source", assignment), encoding="utf-8") as f:
        source = json.load(f)
    old = os.environ.get("AUTOGRADER_RANK_POOL")
    os.environ["AUTOGRADER_RANK_POOL"] = "1" if pool else "0"
    try:
        verdicts, _ = grade_notebook(copy.deepcopy(nb), source)
    finally:
        if old is None:
            os.environ.pop("AUTOGRADER_RANK_POOL")
        else:
            os.environ["AUTOGRADER_RANK_POOL"] = old
    return {k: (v.passed, v.points, v.inconclusive) for k, v in verdicts.items()}


@pytest.mark.parametrize("assignment, m", _mutants())
def test_a_mutant_gets_the_same_verdicts_with_and_without_the_pool(assignment, m):
    import nbformat

    nb = json.loads(nbformat.writes(submissions.mutant_submission(assignment, m)))
    warm, fresh = _grade(assignment, nb, pool=True), _grade(assignment, nb, pool=False)
    differ = {k: (warm.get(k), fresh.get(k)) for k in fresh.keys() | warm.keys() if warm.get(k) != fresh.get(k)}
    assert not differ, f"{assignment} {m.name}: (passed, points, inconclusive) with / without the pool: {differ}"
    assert any(not passed for passed, _, _ in fresh.values()) and any(passed for passed, _, _ in fresh.values()), \
        f"{m.name}: every cell passed or every cell failed: not a test of the checks' verdicts ({fresh})"
