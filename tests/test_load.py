"""Verdicts that do not depend on the machine (issue 28): the same notebook gets the same grade on a busy node.

Every assignment's reference and one wrong submission (03's `blocking_sends`: neighbours that both send
first wait for each other forever, a deadlock through `Work.wait()`) are graded by the trusted run in real
sandboxes, all at once, while 6x as many CPU burners as cores run beside them, each burner in a session of
its own (tests/load.py: Linux's autogroup shares the CPU between sessions). The scores must be the idle ones,
cell by cell: the reference every point, the wrong submission all but exactly its mutant's cells, and no
cell undecided. Beside them, a solved notebook runs in a real Jupyter kernel, as a student on a busy laptop
runs it: every visible test cell passes.

Marked `timing` (tests/conftest.py): `make test` runs it after the rest, so that its burners slow nothing
else. `make test-all` grades every mutant the same way (tests/test_determinism.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from course import ROOT, assignments
from load import burners

sys.path.insert(0, ROOT)
from solutions import submissions  # noqa: E402

pytestmark = [pytest.mark.timing, pytest.mark.timeout(3600)]

WRONG = ("03_pipeline_parallel", "blocking_sends")
KERNEL = "03_pipeline_parallel"  # the notebook whose reference lost points at load ~20


def _sandbox_required():
    from autograder.grading.sandbox import sandbox_status

    ok, why = sandbox_status()
    if not ok and os.environ.get("COURSE_REQUIRE_SANDBOX") == "1":
        raise RuntimeError(f"COURSE_REQUIRE_SANDBOX=1 but {why}")


def _kernel_run(assignment: str, out: str, where: str) -> subprocess.Popen:
    """The solved notebook in a real kernel (nbclient), every cell in order, as a student runs it."""
    code = (
        "import sys, json, nbformat\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from nbclient import NotebookClient\n"
        "from solutions import submissions\n"
        f"nb = submissions.reference_submission({assignment!r})\n"
        "NotebookClient(nb, timeout=3000, kernel_name='python3', allow_errors=True,\n"
        f"               resources={{'metadata': {{'path': {where!r}}}}}).execute()\n"
        "cells = []\n"
        "for c in nb.cells:\n"
        "    if c.cell_type != 'code': continue\n"
        "    gid = (c.metadata.get('nbgrader') or {}).get('grade_id')\n"
        "    errs = [o.get('ename', '') + ': ' + o.get('evalue', '')[:1500] for o in c.outputs if o.output_type == 'error']\n"
        "    text = ''.join(o.get('text', '') for o in c.outputs if o.output_type == 'stream')\n"
        "    cells.append({'grade_id': gid, 'errors': errs, 'text': text[-500:]})\n"
        f"json.dump(cells, open({out!r}, 'w'))\n")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONPATH": ROOT},
                            start_new_session=True)  # a student's Jupyter: a session of its own


def _grade_under_load(jobs, tmp_path, kernel: str | None = None, at_once: int = 8) -> list[str]:
    """Grade `jobs` [(assignment, "reference" or a mutant's name)], `at_once` at a time, beside 6 burners per
    core (and run `kernel`'s solved notebook in a Jupyter kernel); what differs from the idle scores, as lines."""
    n = 6 * (os.cpu_count() or 1)
    t0 = time.monotonic()
    with burners(n):
        procs, logs = {}, {}
        for i, (a, kind) in enumerate(jobs):
            if i >= at_once:  # the oldest of the running ones first (memory: a sandbox and a grader each)
                key, (_, p) = list(procs.items())[i - at_once]
                logs[key] = p.communicate(timeout=3000)[0].decode(errors="replace")
            out = str(tmp_path / f"{a}-{kind}.json")
            # each grading process (the grader's side: it computes the expected results) in a session of its own,
            # as the workers of several classes' grading commands are; the ranks judged run in the sandbox's
            # session (bubblewrap's --new-session), one session's share of the CPU among 6 burners per core
            procs[(a, kind)] = (out, subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "tests", "load.py"), a, kind, out], cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONPATH": ROOT}))
        if kernel:
            kernel_out = str(tmp_path / "kernel.json")
            kernel_proc = _kernel_run(kernel, kernel_out, str(tmp_path))
        logs.update({key: p.communicate(timeout=3000)[0].decode(errors="replace")
                     for key, (_, p) in procs.items() if key not in logs})
        if kernel:
            kernel_log = kernel_proc.communicate(timeout=3000)[0].decode(errors="replace")
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
    seconds = time.monotonic() - t0
    print(f"graded {len(jobs)} submission(s){f' and ran {kernel} in a kernel' if kernel else ''} beside {n} "
          f"burners in {seconds:.0f} s (load average {' '.join(load)})")
    problems = []
    for (a, kind), (out, p) in procs.items():
        assert p.returncode == 0, f"{a} {kind}: the grading process failed:\n{logs[(a, kind)][-3000:]}"
        with open(out, encoding="utf-8") as f:
            verdicts = json.load(f)
        undecided = {g: v[4][:300] for g, v in verdicts.items() if v[3]}
        lost = {g for g, v in verdicts.items() if not v[0]}
        expected = set() if kind == "reference" else \
            next(m for m in submissions.mutants_of(a) if m.name == kind).must_fail
        if undecided:
            problems.append(f"{a} {kind}: undecided under load: {undecided}")
        if lost != expected:
            problems.append(f"{a} {kind}: lost {sorted(lost)}, idle it loses {sorted(expected)}:\n"
                            + "\n".join(f"  {g}: {verdicts[g][4][:600]}" for g in sorted(lost ^ expected)
                                        if g in verdicts))
        points = sum(v[1] for v in verdicts.values())
        full = sum(v[2] for v in verdicts.values())
        if kind == "reference" and points != full:
            problems.append(f"{a} reference: {points} of {full} points")
    if not kernel:
        return problems
    assert kernel_proc.returncode == 0, kernel_log[-3000:]
    with open(kernel_out, encoding="utf-8") as f:
        cells = json.load(f)
    failing = [c for c in cells if c["errors"]]
    tests = [c for c in cells if c["grade_id"] and c["grade_id"].startswith("test_")]
    if failing:
        problems.append(f"{kernel}'s solved notebook under load: {len(failing)} cell(s) failed: "
                        + "\n".join(f"  {c['grade_id']}: {c['errors'][0][:600]}" for c in failing))
    if not tests or not all("passed" in c["text"] for c in tests):
        problems.append(f"{kernel}'s visible tests did not all print their pass line: "
                        + ", ".join(c["grade_id"] for c in tests if "passed" not in c["text"]))
    return problems


def _deadlock(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.zeros(1)
    dist.recv(t, src=(rank + 1) % world_size)  # every rank waits to receive: a deadlock


def _slow_but_working(rank, world_size):
    import torch
    import torch.distributed as dist

    x = torch.randn(200, 200)
    for _ in range(40):  # compute between collectives: a starved rank is slow, never stuck
        x = torch.tanh(x @ x.T / 200)
        t = torch.ones(1)
        dist.all_reduce(t)
    return float(t)


def _one_rank_computes_long(rank, world_size):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if rank == 0:  # 2.5 CPU-seconds: beside the burners, far longer than the stall rule's 10 s on the clock
        x, t0 = torch.randn(200, 200), time.process_time()
        while time.process_time() - t0 < 2.5:
            x = torch.tanh(x @ x.T / 200)
    dist.all_reduce(torch.ones(1))  # the other ranks wait here, asleep, all that time
    return rank


def _one_rank_sleeps(rank, world_size):
    import torch
    import torch.distributed as dist

    if rank == 1:
        time.sleep(1000)
    dist.all_reduce(torch.ones(1))


def test_the_runner_under_load_convicts_a_deadlock_and_passes_a_slow_run():
    """The runner itself beside 6 burners per core (forked ranks, as a student's kernel forks them): a real
    deadlock is still convicted on its stacks, and a run that computes slowly between collectives is neither
    convicted nor given up, though it takes longer on the clock than its budget of CPU-seconds (a wall-clock
    limit convicted it: 03's reference lost its zero-bubble memory cell so)."""
    from autograder.runtime.dist import DistributedError, InconclusiveRun, run_distributed

    with burners(6 * (os.cpu_count() or 1)):
        with pytest.raises(DistributedError) as info:
            run_distributed(_deadlock, 4, timeout=20)
        # a budget of 2 CPU-seconds per rank: the run uses a small part of it, and far more than 2 s of the clock
        assert run_distributed(_slow_but_working, 4, timeout=2) == [4.0] * 4
        # three ranks asleep in a collective for longer than the stall rule's 10 s, while the fourth, starved,
        # computes: the scheduler's record shows it waiting for a CPU, so this is no stall
        t0 = time.monotonic()
        assert run_distributed(_one_rank_computes_long, 4, timeout=5) == [0, 1, 2, 3]
        long_wait = time.monotonic() - t0
        # a rank asleep: the stall is still told from a starved rank beside the burners (or, were the machine so
        # busy that its wake-ups waited for a CPU most of the time, left undecided: never a CPU-budget verdict)
        with pytest.raises((DistributedError, InconclusiveRun)) as asleep:
            run_distributed(_one_rank_sleeps, 4, timeout=5)
    assert long_wait > 10, f"the computing rank finished in {long_wait:.1f} s: the burners did not slow it"
    assert isinstance(asleep.value, InconclusiveRun) or "none of them ran, made progress or waited for a CPU" \
        in str(asleep.value), str(asleep.value)
    msg = str(info.value)
    assert "deadlock: every rank still running (0, 1, 2, 3) was waiting on its peers" in msg, msg
    assert "dist.recv(t, src=(rank + 1) % world_size)" in msg


def test_the_pool_under_load_gives_up_a_deadlock_within_seconds_and_serves_a_slow_check():
    """Warm ranks (autograder.runtime.pool) beside 6 burners per core: a deadlocked check is given back within
    seconds (its ranks dispatch no op; their polling peers' wake-ups wait for a CPU, which kept the pool waiting
    for its wall-clock limit of a minute per deadlocked check: 03's deadlocking mutant took 258 s to grade here,
    80 s since), and a check that computes between collectives, starved, is still served by the pool."""
    import cloudpickle

    import autograder.runtime.agreement  # noqa: F401 - imported before forking, as the zygote does
    from autograder.grading.trusted import dumps_by_value, resolve
    from autograder.runtime.pool import GIVE_UP_WALL_S, RankPool

    def request(fn, **kwargs):
        return dumps_by_value((fn, 4, kwargs)), 4, kwargs

    pool = RankPool(cloudpickle.loads, resolve, {})
    try:
        with burners(6 * (os.cpu_count() or 1)):
            assert pool.run(*request(_slow_but_working, timeout=2)) == [4.0] * 4, pool.gave_up
            t0 = time.monotonic()
            assert pool.run(*request(_deadlock, timeout=20)) is None
            given_up, why = time.monotonic() - t0, pool.gave_up
            slow = pool.run(*request(_slow_but_working, timeout=2))
            served_slow, why_slow = slow == [4.0] * 4, pool.gave_up
    finally:
        pool.close()
    assert "no rank made progress" in why, why
    assert given_up < GIVE_UP_WALL_S / 4, f"the deadlocked check was given up after {given_up:.0f} s ({why})"
    assert served_slow, f"a slow, working check was given up under load: {why_slow}"


def test_idle_scores_with_six_burners_per_core_beside_the_grading(tmp_path):
    _sandbox_required()
    problems = _grade_under_load([(a, "reference") for a in assignments()] + [WRONG], tmp_path, kernel=KERNEL)
    assert not problems, "\n".join(problems)


@pytest.mark.exhaustive
@pytest.mark.parametrize("assignment", assignments())
def test_every_mutant_gets_its_idle_score_under_load(assignment, tmp_path):
    """make test-all: every mutant of the assignment (correct variants included) graded beside 6 burners per
    core loses exactly its `must_fail` cells, none undecided."""
    _sandbox_required()
    problems = _grade_under_load([(assignment, m.name) for m in submissions.mutants_of(assignment)], tmp_path)
    assert not problems, "\n".join(problems)
