"""Grading a class: plain sequential `nbgrader autograde` against `grade autograde --jobs N`, side by side.

    .venv/bin/python benchmarks/grading.py                       # 40 submissions of 01 and 02, --jobs 2
    .venv/bin/python benchmarks/grading.py --assignments 02_tensor_parallel --copies 1 --jobs 2

Generates submissions (the reference, the untouched release and every kept
mutant of each assignment, repeated until there are `--total`), grades them
in two scratch copies of the course, and prints:
- wall time and time per submission of both, and the ratio;
- whether every student's score per cell is the same under both (nbgrader's
  in-kernel verdict of the full source test cells against the trusted
  verdict: they must agree on these honest submissions);
- the breakdown of one submission's time in the course's command (nbgrader's
  run of the notebook, the trusted run, the feedback) and, for plain
  nbgrader, its start-up (an autograde with nothing to grade).
Not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import nbformat  # noqa: E402

from course import copy_course, nbgrader  # noqa: E402
from solutions import submissions  # noqa: E402


def _submissions(assignments: list[str], total: int) -> list[tuple[str, str, object]]:
    """(assignment, student, notebook), cycling through reference, untouched and every mutant."""
    kinds = []
    for a in assignments:
        mutants = importlib.import_module(f"solutions.mutants.{a.split('_', 1)[1]}").MUTANTS
        kinds += [(a, "reference", None), (a, "untouched", None)] + [(a, m.name, m) for m in mutants]
    out, i = [], 0
    while len(out) < total:
        a, kind, m = kinds[i % len(kinds)]
        nb = (submissions.reference_submission(a) if kind == "reference" else
              submissions.untouched_submission(a) if kind == "untouched" else submissions.mutant_submission(a, m))
        out.append((a, f"s{len(out):03d}-{kind.replace('_', '-')}"[:40], nb))
        i += 1
    return out


def _course(subs, assignments) -> str:
    root = tempfile.mkdtemp(prefix="bench-grading-")
    copy_course(root)
    for a in assignments:
        proc = nbgrader(root, "generate_assignment", a, "--force")
        assert proc.returncode == 0, proc.stderr
    for a, student, nb in subs:
        folder = os.path.join(root, "submitted", student, a)
        os.makedirs(folder)
        nbformat.write(nb, os.path.join(folder, os.path.basename(submissions.notebook_path("release", a))))
    return root


def _nbgrader_scores(root: str) -> dict:
    import warnings

    from nbgrader.api import Gradebook

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            for a in gb.assignments:
                for sub in gb.assignment_submissions(a.name):
                    out[(a.name, sub.student.id)] = {g.name: float(g.score) for nb in sub.notebooks for g in nb.grades}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--assignments", nargs="+", default=["01_data_parallel", "02_tensor_parallel"])
    ap.add_argument("--total", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    subs = _submissions(args.assignments, args.total)
    print(f"{len(subs)} submissions of {', '.join(args.assignments)}; {os.cpu_count()} cores")

    plain = _course(subs, args.assignments)
    t0 = time.monotonic()
    nbgrader(plain, "autograde", args.assignments[0], "--student=nobody-at-all")
    startup = time.monotonic() - t0
    t0 = time.monotonic()
    for a in args.assignments:
        proc = nbgrader(plain, "autograde", a, "--force", timeout=24 * 3600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    t_plain = time.monotonic() - t0

    ours = _course(subs, args.assignments)
    env = {**os.environ, "PYTHONPATH": ours, "TORCH_CPP_LOG_LEVEL": "ERROR",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autograder.grade", "autograde", *args.assignments, "--jobs",
                           str(args.jobs), "--quiet"], cwd=ours, env=env, capture_output=True, text=True)
    t_ours = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    a_scores, b_scores = _nbgrader_scores(plain), _nbgrader_scores(ours)
    differ = sorted(k for k in a_scores if a_scores[k] != b_scores.get(k))
    timings = []
    for a in args.assignments:
        for name in os.listdir(os.path.join(ours, "graded", a)):
            with open(os.path.join(ours, "graded", a, name)) as f:
                timings.append(json.load(f).get("timings", {}))
    n = len(subs)
    print(f"\n{'':34}{'wall':>10}{'per submission':>17}")
    print(f"{'nbgrader autograde, sequential':34}{t_plain:9.0f}s{t_plain / n:16.1f}s")
    print(f"{'grade autograde --jobs ' + str(args.jobs):34}{t_ours:9.0f}s{t_ours / n:16.1f}s")
    print(f"speed-up: {t_plain / t_ours:.2f}x")
    print(f"scores identical for every student and cell: {not differ}" + (f" (differ: {differ[:5]})" if differ else ""))
    print(f"\none submission in the course's command (median over {len(timings)}; seconds of one worker):")
    for key in ("kernel_run", "trusted_run", "feedback", "total"):
        vals = [t[key] for t in timings if key in t]
        if vals:
            print(f"  {key:<12} {statistics.median(vals):6.1f}")
    print(f"  (nbgrader's own start-up, an autograde with nothing to grade: {startup:.1f} s)")


if __name__ == "__main__":
    main()
