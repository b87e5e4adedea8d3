"""Verdicts that never flip: the same code gets the same score on every run (issue 15).

    .venv/bin/python -m pytest -q -s tests/test_determinism.py                      # the fast sample
    COURSE_EXHAUSTIVE=1 .venv/bin/python -m pytest -q -s tests/test_determinism.py  # every cell, every mutant

Each run grades in a fresh interpreter with another PYTHONHASHSEED and other
garbage-collector settings (thresholds from "every 10 allocations" to
"almost never", and disabled), inherited by the forked ranks. A cell whose
verdict differs between runs fails the test, which prints the table of
verdicts (cells x runs).

The fast sample (in `make test`) grades, for every assignment, the cells
whose checks depend on memory, timing or order (SENSITIVE below, declared
per assignment) on the reference solution, in the first three runs. The
exhaustive sweep grades every cell of the reference and of every mutant
(correct variants included: mutants with nothing in `must_fail`) in all five
runs, and writes the table to build/determinism-report.txt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from course import ROOT, assignments

sys.path.insert(0, ROOT)
from solutions import submissions  # noqa: E402

# Per assignment, the cells of the fast sample: checks that read memory (weak references, storage
# sizes), timing, or the order of events. (The exhaustive sweep grades every cell.)
SENSITIVE = {
    "01_data_parallel": {"test_fsdp_memory", "test_ddp_buckets", "test_ddp_gradients"},  # weak refs; order; late rank
    "02_tensor_parallel": {"test_async_allreduce_overlap", "test_async_allreduce_gradients"},  # order; async numbers
    "03_pipeline_parallel": {"test_pipeline_memory", "test_run_pipeline_1f1b"},  # weak references; executed order
    "04_context_parallel": {"test_ring_forward", "test_ring_overlap"},  # the ring's order of sends; overlap
    "05_expert_parallel": {"test_dispatch", "test_dispatcher_communication"},  # the order of the collectives
    "06_composition": {"test_tensor_parallel_plan", "test_tied_embedding_grads"},  # verdicts read from the ledger
}

# (PYTHONHASHSEED, collector setting) per run: at least five, all different
RUNS = [("0", [700, 10, 10]), ("1", [10, 2, 2]), ("2", "disabled"), ("3", [100000, 100, 100]), ("4", [50, 5, 5])]


def _mutants(assignment):
    return submissions.mutants_of(assignment)


def _jobs(exhaustive: bool) -> list[dict]:
    jobs = []
    for a in assignments():
        only = None if exhaustive else sorted(SENSITIVE[a])
        jobs.append({"assignment": a, "mutant": None, "only": only})
        if exhaustive:
            jobs += [{"assignment": a, "mutant": m.name, "only": None} for m in _mutants(a)]
    return jobs


def _start(seed: str, gc_setting, jobs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": ROOT, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "determinism_worker.py"),
                             json.dumps({"gc": gc_setting, "jobs": jobs})],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _verdicts(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=7200)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    line = [x for x in out.splitlines() if x.startswith("VERDICTS ")][-1]
    return json.loads(line[len("VERDICTS "):])


def _sweep(exhaustive: bool) -> None:
    jobs = _jobs(exhaustive)
    # the runs go side by side: besides the seeds and collector settings, each sees the others' load
    t0 = time.monotonic()
    procs = [_start(seed, setting, jobs) for seed, setting in (RUNS if exhaustive else RUNS[:3])]
    runs = [_verdicts(p) for p in procs]
    print(f"{len(runs)} runs side by side in {time.monotonic() - t0:.1f} s")
    rows, flips = [], []
    for key in runs[0]:
        for cell in sorted(runs[0][key]):
            verdicts = ["P" if run[key][cell] else "F" for run in runs]
            rows.append(f"{key:<52} {cell:<48} {' '.join(verdicts)}")
            if len(set(verdicts)) > 1:
                flips.append(rows[-1])
    header = (f"{'submission':<52} {'cell':<48} runs (PYTHONHASHSEED / gc): "
              + ", ".join(f"{s}/{g if isinstance(g, str) else g[0]}" for s, g in RUNS[:len(runs)]))
    report = "\n".join([header] + rows)
    print(f"\n{len(rows)} cell verdicts x {len(runs)} runs\n{report}")
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", "determinism-report.txt"), "w") as f:
        f.write(report + "\n")
    assert not flips, "verdicts that changed between runs:\n" + "\n".join(flips)
    for a in assignments():  # (which cells each mutant fails is the notebook tests' business)
        failed = sorted(c for c, ok in runs[0][f"{a}/reference"].items() if not ok)
        assert not failed, f"{a}: the reference failed {failed}"


def test_every_assignment_declares_its_sensitive_cells():
    for a in assignments():
        assert a in SENSITIVE, f"{a}: declare in SENSITIVE the cells whose checks depend on memory, timing or order"


def test_sensitive_verdicts_do_not_flip_across_hash_seeds_and_collector_settings():
    _sweep(exhaustive=False)


@pytest.mark.exhaustive
@pytest.mark.timeout(14400)
def test_no_verdict_flips_for_any_cell_of_any_submission():
    _sweep(exhaustive=True)
