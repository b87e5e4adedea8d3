"""Grading a class: plain sequential `nbgrader autograde` against `grade autograde --jobs N`, side by side.

    .venv/bin/python benchmarks/grading.py                       # 40 submissions of 01 and 02, --jobs 2
    .venv/bin/python benchmarks/grading.py --assignments 02_tensor_parallel --total 14 --jobs 2
    .venv/bin/python benchmarks/grading.py --assignments all --total 6 --no-pool-too --no-server-too   # one of each

Generates submissions (the reference, the untouched release and every kept
mutant of each assignment, repeated until there are `--total`), grades them
in scratch copies of the course, and prints:
- wall time and time per submission of plain nbgrader sequential, plain
  nbgrader two at a time (two processes on disjoint halves of the class,
  each with its own copy of the course and gradebook, merged: what an
  instructor with two cores would do) and the course's command, and the ratios; the machine's
  busy CPU-seconds per submission during each (from /proc/stat: the machine
  should be otherwise idle), which says how much work each does, apart from
  how well it spreads over the cores; and, with `--jobs1`, the course's
  command with one worker too (how much of the speed-up is parallelism);
  with `--no-pool-too`, with every check on fresh ranks too (what the warm
  ranks of autograder.runtime.pool save); with `--no-server-too`, with a
  fresh sandbox per submission too (what the workers' fork servers save);
- whether every student's score per cell is the same under both (nbgrader's
  in-kernel verdict of the full source test cells against the trusted
  verdict: they must agree on these honest submissions);
- the breakdown of one submission's time in the course's command (the
  trusted run: the student's cells in the sandbox and every check once;
  the feedback) and, for plain nbgrader, its start-up (an autograde with
  nothing to grade).
Not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
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
    """(assignment, student, notebook): the assignments in turn, each cycling through its reference, its
    untouched release and every mutant (so any `total` >= the number of assignments gives each some)."""
    if total < len(assignments):
        raise SystemExit(f"--total {total}: fewer submissions than assignments ({len(assignments)})")
    kinds = {a: [(a, "reference", None), (a, "untouched", None)] + [(a, m.name, m) for m in submissions.mutants_of(a)]
             for a in assignments}
    out, i = [], 0
    while len(out) < total:
        a = assignments[i % len(assignments)]
        a, kind, m = kinds[a][(i // len(assignments)) % len(kinds[a])]
        nb = (submissions.reference_submission(a) if kind == "reference" else
              submissions.untouched_submission(a) if kind == "untouched" else submissions.mutant_submission(a, m))
        out.append((a, f"s{len(out):03d}-{kind.replace('_', '-')}"[:40], nb))
        i += 1
    return out


def _course(subs, assignments, prefix: str = "bench-grading-") -> str:
    root = tempfile.mkdtemp(prefix=prefix)
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


def _busy_cpu_seconds() -> float | None:
    """CPU-seconds the whole machine spent not idle so far (Linux /proc/stat); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _plain_two_wide(subs, assignments) -> tuple[float, float | None, dict]:
    """Plain nbgrader as an instructor would run it on two cores: two processes at once on disjoint halves of
    the class, each in its own copy of the course with its own gradebook; the scores merged."""
    from concurrent.futures import ThreadPoolExecutor

    split = [[], []]  # each assignment's submissions dealt out in turn
    for a in assignments:
        for j, sub in enumerate(x for x in subs if x[0] == a):
            split[j % 2].append(sub)
    halves = [(_course(part, assignments, f"bench-grading-half{i}-"),
               [a for a in assignments if any(sub[0] == a for sub in part)]) for i, part in enumerate(split)]

    def grade_half(half) -> list[int]:  # one instructor's process: the assignments one after the other
        root, mine = half
        return [nbgrader(root, "autograde", a, "--force", timeout=24 * 3600).returncode for a in mine]

    c0, t0 = _busy_cpu_seconds(), time.monotonic()
    with ThreadPoolExecutor(2) as pool:  # each call is an nbgrader process: two run at once
        codes = list(pool.map(grade_half, halves))
    wall, c1 = time.monotonic() - t0, _busy_cpu_seconds()
    assert all(c == 0 for cs in codes for c in cs), f"plain nbgrader two at a time failed: exit codes {codes}"
    halves = [root for root, _ in halves]
    scores = {**_nbgrader_scores(halves[0]), **_nbgrader_scores(halves[1])}
    return wall, (c1 - c0 if c0 is not None else None), scores


def _ours(root: str, assignments: list[str], jobs: int, pool: bool = True, server: bool = True,
          spawn: bool = False) -> tuple[float, float | None]:
    env = {**os.environ, "PYTHONPATH": root, "TORCH_CPP_LOG_LEVEL": "ERROR", "AUTOGRADER_RANK_POOL": "1" if pool else "0",
           "AUTOGRADER_FORK_SERVER": "1" if server else "0", "AUTOGRADER_WORKER_START": "spawn" if spawn else "fork",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    c0, t0 = _busy_cpu_seconds(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autograder.grade", "autograde", *assignments, "--jobs",
                           str(jobs), "--quiet", "--force"], cwd=root, env=env, capture_output=True, text=True)
    wall, c1 = time.monotonic() - t0, _busy_cpu_seconds()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return wall, (c1 - c0 if c0 is not None else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--assignments", nargs="+", default=["01_data_parallel", "02_tensor_parallel"])
    ap.add_argument("--total", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--jobs1", action="store_true", help="also time the course's command with one worker")
    ap.add_argument("--no-pool-too", action="store_true",
                    help="also time the course's command with every check on fresh ranks (AUTOGRADER_RANK_POOL=0)")
    ap.add_argument("--no-server-too", action="store_true",
                    help="also time the course's command with a fresh sandbox per submission instead of forks of "
                         "each worker's fork server (AUTOGRADER_FORK_SERVER=0)")
    ap.add_argument("--spawned-workers-too", action="store_true",
                    help="also time the course's command with its workers spawned (each importing torch and the "
                         "grader) instead of forked (AUTOGRADER_WORKER_START=spawn)")
    args = ap.parse_args()
    if args.assignments == ["all"]:
        args.assignments = sorted(d for d in os.listdir(os.path.join(ROOT, "source")) if d[:2].isdigit())
    subs = _submissions(args.assignments, args.total)
    print(f"{len(subs)} submissions of {', '.join(args.assignments)}; {os.cpu_count()} cores")

    plain = _course(subs, args.assignments)
    t0 = time.monotonic()
    nbgrader(plain, "autograde", args.assignments[0], "--student=nobody-at-all")
    startup = time.monotonic() - t0
    c0, t0 = _busy_cpu_seconds(), time.monotonic()
    for a in args.assignments:  # every assignment has submissions (_submissions)
        proc = nbgrader(plain, "autograde", a, "--force", timeout=24 * 3600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    t_plain, cpu_plain = time.monotonic() - t0, _busy_cpu_seconds()
    cpu_plain = cpu_plain - c0 if c0 is not None else None

    t_wide, cpu_wide, wide_scores = _plain_two_wide(subs, args.assignments)

    ours = _course(subs, args.assignments)
    rows = []
    if args.jobs1:
        rows.append(("grade autograde --jobs 1", *_ours(ours, args.assignments, 1)))
    if args.no_pool_too:
        rows.append((f"grade autograde --jobs {args.jobs}, no pool", *_ours(ours, args.assignments, args.jobs, False)))
    if args.no_server_too:
        rows.append((f"grade autograde --jobs {args.jobs}, no server",
                     *_ours(ours, args.assignments, args.jobs, server=False)))
    if args.spawned_workers_too:
        rows.append((f"grade autograde --jobs {args.jobs}, spawned", *_ours(ours, args.assignments, args.jobs,
                                                                            spawn=True)))
    t_ours, cpu_ours = _ours(ours, args.assignments, args.jobs)
    rows.append((f"grade autograde --jobs {args.jobs}", t_ours, cpu_ours))

    a_scores, b_scores = _nbgrader_scores(plain), _nbgrader_scores(ours)
    differ = sorted(k for k in a_scores if a_scores[k] != b_scores.get(k) or a_scores[k] != wide_scores.get(k))
    timings, sandboxes = [], []
    for a in args.assignments:
        for name in os.listdir(os.path.join(ours, "graded", a)):
            with open(os.path.join(ours, "graded", a, name)) as f:
                rec = json.load(f)
            timings.append(rec.get("timings", {}))
            sandboxes.append(rec.get("sandbox"))
    n = len(subs)
    print(f"\n{'':34}{'wall':>10}{'per submission':>17}{'busy CPU per submission':>26}")
    for label, wall, cpu in [("nbgrader autograde, sequential", t_plain, cpu_plain),
                             ("nbgrader autograde, two at a time", t_wide, cpu_wide)] + rows:
        cpu_text = f"{cpu / n:25.1f}s" if cpu is not None else f"{'-':>26}"
        print(f"{label:34}{wall:9.0f}s{wall / n:16.1f}s{cpu_text}")
    print(f"speed-up: {t_plain / t_ours:.2f}x against sequential nbgrader, {t_wide / t_ours:.2f}x against "
          f"nbgrader two at a time")
    if cpu_plain and cpu_ours:
        print(f"busy CPU per submission: {cpu_ours / cpu_plain:.2f}x plain sequential nbgrader's")
    print(f"scores identical for every student and cell: {not differ}" + (f" (differ: {differ[:5]})" if differ else ""))
    print(f"\none submission in the course's command (median over {len(timings)}; seconds of one worker):")
    for key in ("trusted_run", "sandbox_cpu", "feedback", "total"):
        vals = [t[key] for t in timings if key in t]
        if vals:
            print(f"  {key:<12} {statistics.median(vals):6.1f}")
    print(f"  (nbgrader's own start-up, an autograde with nothing to grade: {startup:.1f} s)")
    print(f"  sandboxes: {sandboxes.count('forked')} forked from a worker's fork server, "
          f"{len(sandboxes) - sandboxes.count('forked')} fresh")
    _cell_breakdown(plain, subs)


def _cell_breakdown(root: str, subs) -> None:
    """Each cell's time in plain nbgrader's run of the first reference submission (nbgrader records it)."""
    import datetime

    a, student, _ = next(s for s in subs if s[1].endswith("reference"))
    folder = os.path.join(root, "autograded", student, a)
    nb = nbformat.read(os.path.join(folder, os.listdir(folder)[0]), as_version=4)
    rows = []
    for cell in nb.cells:
        ex = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type != "code" or "iopub.execute_input" not in ex:
            continue
        t = [datetime.datetime.fromisoformat(ex[k].replace("Z", "+00:00"))
             for k in ("iopub.execute_input", "shell.execute_reply")]
        name = cell.metadata.get("nbgrader", {}).get("grade_id") or "(free cell)"
        rows.append(((t[1] - t[0]).total_seconds(), name, bool(cell.metadata.get("nbgrader", {}).get("grade"))))
    print(f"\nplain nbgrader's run of {student} ({a}), {len(rows)} code cells, {sum(r[0] for r in rows):.1f} s:")
    print(f"  test cells {sum(r[0] for r in rows if r[2]):.1f} s, the rest {sum(r[0] for r in rows if not r[2]):.1f} s; "
          f"the slowest:")
    for secs, name, _ in sorted(rows, reverse=True)[:6]:
        print(f"  {name:<44} {secs:5.2f} s")


if __name__ == "__main__":
    main()
