"""The course's grading command line (instructors and the grading machine).

    python -m autograder.grade autograde 02_tensor_parallel [--jobs N]   # grade submitted/*/02_tensor_parallel
    python -m autograder.grade autograde 02_tensor_parallel --shard 2/3  # a slice: graded/.../shards/shard-2-of-3.json
    python -m autograder.grade merge graded/02_tensor_parallel/shards/shard-*.json
    python -m autograder.grade scores                                    # the gradebook
    python -m autograder.grade export 02_tensor_parallel --gradescope exports/gs --csv exports/02.csv
    python -m autograder.grade export 02_tensor_parallel --canvas exports/02-canvas.csv --canvas-assignment-id 12345
    python -m autograder.grade demo                                      # sample submissions, graded, the table
    python -m autograder.grade student-package [--lang zh]               # dist/llm-parallelism-course.tar.gz
    python -m autograder.grade gradescope-package 02_tensor_parallel     # dist/gradescope-02_tensor_parallel.zip
    python -m autograder.grade k8s-manifest 02_tensor_parallel --shards 8  # the Kubernetes Jobs (cluster/)

Run from the course root (where nbgrader_config.py is). `autograde` grades
each submission in a sandbox, in parallel (autograder.grading.classrun: the
student's cells run once in the sandbox, every check once in the trusted
grader; the submissions of every assignment named in one queue for the
workers), regrades only what changed, writes nbgrader's gradebook (backed up
first, one command at a time), the feedback HTML, and prints the table. It
exits with status 1 when a submission could not be graded for a reason of
the grader's own (a student's bad file is a graded reason, not a failure).
`demo` first writes three sample submissions per assignment (reference
solution, untouched release notebook, one plausible wrong edit); it needs
the instructor-only `solutions` package.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
import time

import nbformat

DEMO_STUDENTS = ("reference", "untouched", "wrong")


def course_root() -> str:
    root = os.getcwd()
    if not os.path.exists(os.path.join(root, "nbgrader_config.py")):
        raise SystemExit(f"autograder.grade: run from the course root (no nbgrader_config.py in {root})")
    return root


def released_assignments(root: str) -> list[str]:
    rel = os.path.join(root, "release")
    if not os.path.isdir(rel):
        return []
    return sorted(a for a in os.listdir(rel) if os.path.isdir(os.path.join(rel, a)) and not a.startswith("."))


def write_demo_submissions(root: str, assignment: str) -> dict[str, str]:
    """submitted/<student>/<assignment>/<notebook>.ipynb for the three demo students."""
    sys.path.insert(0, root)
    from solutions import submissions

    release_nb = submissions.notebook_path("release", assignment)
    nb_name = os.path.basename(release_nb)
    demo = [m for m in submissions.mutants_of(assignment) if m.demo]
    if len(demo) != 1:
        dim = assignment.split("_", 1)[1]
        raise SystemExit(f"solutions/{dim}/mutants.py must mark exactly one mutant demo=True")
    notebooks = {
        "reference": submissions.reference_submission(assignment),
        "untouched": submissions.untouched_submission(assignment),
        "wrong": submissions.mutant_submission(assignment, demo[0]),
    }
    paths = {}
    for student, nb in notebooks.items():
        folder = os.path.join(root, "submitted", student, assignment)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        path = os.path.join(folder, nb_name)
        nbformat.write(nb, path)
        with open(os.path.join(folder, "timestamp.txt"), "w") as f:
            f.write("2026-01-01 00:00:00.000000 UTC")
        paths[student] = path
    return paths


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

def _lost(rec: dict) -> list[str]:
    return [c["grade_id"] for c in rec["cells"] if c["points"] < c["max_points"] and not c.get("inconclusive")]


def needs_regrade_note(cells: list[str]) -> str:
    return (f"NEEDS REGRADE (infrastructure): {', '.join(cells)}: the machine was too busy to decide "
            f"{'this check' if len(cells) == 1 else 'these checks'} (no points yet, not a verdict); the next "
            f"autograde run grades it again")


def print_records(records: list[dict], root: str, *, width: int | None = None,
                  shard_files: list[str] | None = None) -> None:
    """The score table of a run: one row per submission, every lost cell listed (wrapped, never cut).
    `shard_files`: a shard run's, which wrote only those files (its records and feedback are in them)."""
    if not records:
        print("Nothing was graded.")
        return
    from autograder.grading.intake import shown_name

    width = width or max(100, shutil.get_terminal_size((120, 20)).columns)
    w_a = max(len("assignment"), *(len(r["assignment"]) for r in records))
    w_s = max(len("student"), *(len(shown_name(r["student"])) for r in records))
    head = f"{'assignment':<{w_a}}  {'student':<{w_s}}  {'score':>13}  "
    indent = " " * len(head)
    print(f"{head}cells that lost points (and notes)")
    print(f"{'-' * w_a}  {'-' * w_s}  {'-' * 13}  {'-' * 34}")
    for r in sorted(records, key=lambda r: (r["assignment"], r["student"])):
        lost = _lost(r)
        if r["status"] != "graded":
            detail = f"NOT GRADED: {r['reason']}"
        elif not lost:
            detail = "-"
        elif len(lost) == len(r["cells"]) and r["score"] == 0:
            detail = f"{len(lost)} cells (all)"
        else:
            detail = ", ".join(lost)
        notes = [w for w in r.get("warnings", [])]
        if r.get("needs_regrade"):
            notes.insert(0, needs_regrade_note(r["needs_regrade"]))
        backend = [c for c in r.get("cells", []) if c.get("backend_note")]
        if backend:  # the NCCL re-run of a GPU grading node: not graded
            failed = [c for c in backend if "FAILED" in c["backend_note"]]
            shown = backend[0]["backend_note"].split(":", 1)[0]
            notes += ([f"{c['grade_id']}: {c['backend_note']}" for c in failed] if failed
                      else [f"{shown}: every cell passed (not graded)"])
        if r.get("unchanged"):
            notes.append("unchanged since the last run: not regraded")
        room = max(30, width - len(head))
        lines = textwrap.wrap(detail, room) or ["-"]
        for note in notes:
            lines += textwrap.wrap(f"note: {note}", room)
        score = f"{r['score']:6.1f} / {r['max_score']:4.0f}"
        print(f"{r['assignment']:<{w_a}}  {shown_name(r['student']):<{w_s}}  {score}  {lines[0]}")
        for line in lines[1:]:
            print(indent + line)
    if shard_files is not None:
        print(f"\nThis shard wrote {', '.join(shard_files)} only (its records and feedback HTML): nothing in "
              f"gradebook.db, feedback/ or graded/<assignment>/<student>.json until `merge` folds the shard "
              f"files in.")
        return
    print(f"\nGradebook: gradebook.db (nbgrader; backups in backups/). Feedback (HTML, one per student and "
          f"assignment): feedback/<student>/<assignment>/. Records: graded/<assignment>/<student>.json")


def _cell_order(root: str, assignment: str) -> dict[str, int]:
    """grade id -> its place in the assignment's release notebook (empty if there is none)."""
    import json

    from autograder.grading.classrun import release_notebook

    try:
        with open(release_notebook(root, assignment), encoding="utf-8") as f:
            cells = json.load(f)["cells"]
    except Exception:  # noqa: BLE001 - no release notebook (any more): the gradebook's names, sorted
        return {}
    ids = [((c.get("metadata") or {}).get("nbgrader") or {}).get("grade_id") for c in cells]
    return {gid: i for i, gid in enumerate(ids) if gid}


def gradebook_rows(root: str, assignments: list[str] | None = None) -> list[dict]:
    """One row per (assignment, student) from nbgrader's gradebook: score, max score, cells that lost points
    (in the order of the notebook, as `autograde` lists them)."""
    from nbgrader.api import Gradebook, MissingEntry

    import warnings

    rows = []
    db = "sqlite:///" + os.path.join(root, "gradebook.db")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(db) as gb:
            for assignment in gb.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                order = _cell_order(root, assignment.name)
                place = lambda g: (g not in order, order.get(g, 0), g)  # noqa: E731 - the notebook's order
                for student in gb.students:
                    try:
                        sub = gb.find_submission(assignment.name, student.id)
                    except MissingEntry:
                        continue
                    lost, regrade = [], []
                    for nb in sub.notebooks:
                        for grade in nb.grades:
                            if grade.max_score and grade.auto_score is None and grade.manual_score is None \
                                    and grade.needs_manual_grade:
                                regrade.append(grade.name)  # not decided (autograder.grading.classrun)
                            elif grade.max_score and (grade.score or 0) < grade.max_score:
                                lost.append(grade.name)
                    rows.append({"assignment": assignment.name, "student": student.id,
                                 "score": float(sub.score), "max_score": float(sub.max_score),
                                 "lost": sorted(lost, key=place), "needs_regrade": sorted(regrade, key=place)})
    return rows


def print_table(rows: list[dict], root: str) -> None:
    """The gradebook's table (`scores`)."""
    print_records([{"assignment": r["assignment"], "student": r["student"], "score": r["score"],
                    "max_score": r["max_score"], "status": "graded", "warnings": [],
                    "needs_regrade": r.get("needs_regrade", []),
                    "cells": [{"grade_id": g, "points": 0, "max_points": 1} for g in r["lost"]]} for r in rows],
                  root)


def _with_gradebook_retry(fn, what: str, seconds: float = 120.0):
    """Run `fn` (which opens gradebook.db); wait while another process holds the database locked."""
    import sqlalchemy.exc

    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except sqlalchemy.exc.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise SystemExit(f"autograder.grade: could not {what}: gradebook.db is locked by another "
                                 f"process ({str(exc).splitlines()[0]}). The results are kept in graded/; run "
                                 f"the command again once the other process is done (nothing is regraded).")
            time.sleep(2)


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------

def _shard(text: str) -> tuple[int, int]:
    """'I/N' (1-based), or from the cluster's array index: 'slurm/N' (SLURM_ARRAY_TASK_ID, 1-based by our
    scripts) or 'k8s/N' (JOB_COMPLETION_INDEX, 0-based)."""
    i, _, n = text.partition("/")
    count = int(n)
    if i == "slurm":
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    elif i == "k8s":
        index = int(os.environ["JOB_COMPLETION_INDEX"]) + 1
    else:
        index = int(i)
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"shard {index}/{count}: the index must be between 1 and {count}")
    return index, count


def _gradebook_first(root: str, assignments: list[str], wait: float = 600.0) -> None:
    """A shard's first step: the gradebook holds the assignments before anything is graded (a fresh clone has
    none: the first task of an array makes it; the others wait for the course's lock, then find it made)."""
    from autograder.grading.classrun import ClassRunError, course_lock, ensure_gradebook, gradebook_holds

    if all(gradebook_holds(root, a) for a in assignments):
        return
    deadline = time.monotonic() + wait
    while True:
        lock = course_lock(root)
        try:
            lock.__enter__()
            break
        except ClassRunError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    try:
        for a in assignments:
            ensure_gradebook(root, a)
    finally:
        lock.__exit__(None, None, None)


def _shard_file(root: str, assignment: str, shard: tuple[int, int], out: str | None) -> str:
    """The file a shard run writes, relative to the course root."""
    from autograder.grading.classrun import shard_path

    return os.path.relpath(out or shard_path(root, assignment, *shard), root)


def _autograde(root: str, assignments: list[str], args) -> list[dict]:
    from autograder.grading.classrun import (ClassRunError, backup_gradebook, course_lock, ensure_gradebook,
                                             grade_classes, write_gradebook)

    if args.no_sandbox:
        print("WARNING: grading WITHOUT a sandbox (--no-sandbox): student code can read and write the course's "
              "files (source/, solutions/, the gradebook) and reach the network. See the README's threat model.")
    second_backend = _nccl_backend(getattr(args, "nccl", "auto"))
    records = []
    lock = course_lock(root) if args.shard is None else course_lock(
        root, f"autograde-shard-{args.shard[0]}-of-{args.shard[1]}")
    try:
        if args.shard is not None:
            _gradebook_first(root, assignments)
        with lock:
            if args.shard is None:  # before grading: a gradebook that cannot be made stops the run here
                for a in assignments:
                    ensure_gradebook(root, a)
            t0 = time.monotonic()
            # every assignment's submissions in one queue for the workers (classrun.grade_classes)
            graded = grade_classes(root, assignments, jobs=args.jobs, shard=args.shard, force=args.force,
                                   isolate=not args.no_sandbox, memory_bytes=int(args.memory * 2**30),
                                   budget=args.budget, progress=not args.quiet, out=args.out,
                                   second_backend=second_backend)
            seconds = time.monotonic() - t0
            for a in assignments:
                recs = graded[a]
                fresh = [r for r in recs if not r.get("unchanged")]
                print(f"{a}: {len(recs)} submission(s), {len(fresh)} graded"
                      + (f" in {seconds:.1f} s" if len(assignments) == 1 else "")
                      + (f" (shard {args.shard[0]}/{args.shard[1]}: wrote {_shard_file(root, a, args.shard, args.out)}"
                         f" only; `merge` it)" if args.shard else ""))
                records += recs
            if len(assignments) > 1:
                print(f"{len(assignments)} assignments graded in {seconds:.1f} s (their submissions in one queue)")
            if args.shard is None and records:
                backup_gradebook(root)
                for a in assignments:
                    if graded[a]:
                        _with_gradebook_retry(lambda a=a: write_gradebook(root, a, graded[a]), "write the gradebook")
    except ClassRunError as exc:
        raise SystemExit(f"autograder.grade: {exc}") from None
    return records


def _nccl_backend(mode: str) -> str | None:
    """"nccl" when the NCCL cases run (`--nccl on`, or `auto` on a machine with >= 2 CUDA devices), else
    None, after one line that says why they are skipped."""
    from autograder.runtime.gpu import nccl_status

    if mode == "off":
        return None
    ok, why = nccl_status(2)
    if ok:
        print(f"NCCL cases: every test cell runs again with NCCL on this machine's GPUs ({why}); notes, no points")
        return "nccl"
    why = why.split(" (")[0]
    if mode == "on":
        raise SystemExit(f"autograder.grade: --nccl on, but {why}")
    print(f"NCCL cases: skipped: {why}; every check runs with gloo on the CPU (the only graded run)", flush=True)
    return None


def _shard_assignment(path: str) -> str | None:
    """The assignment of a shard file (None: not one; merge_results then refuses it, before anything is written)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            bundle = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(bundle, dict) and isinstance(bundle.get("records"), list)
    return bundle["assignment"] if ok and isinstance(bundle.get("assignment"), str) else None


def _merge(root: str, files: list[str]) -> list[dict]:
    from autograder.grading.classrun import (ClassRunError, backup_gradebook, course_lock, ensure_gradebook,
                                             merge_results, write_gradebook)

    try:
        with course_lock(root):
            made = [_shard_assignment(f) for f in files]
            for a in sorted(set(made)) if None not in made else []:  # the gradebook first, before anything else
                ensure_gradebook(root, a)
            records = merge_results(root, files)
            backup_gradebook(root)
            for a in sorted({r["assignment"] for r in records}):
                recs = [r for r in records if r["assignment"] == a]
                _with_gradebook_retry(lambda: write_gradebook(root, a, recs), "write the gradebook")
    except ClassRunError as exc:
        raise SystemExit(f"autograder.grade: {exc}") from None
    return records


def main(argv=None) -> int:
    # nbgrader runs `alembic` from PATH when it makes or upgrades a gradebook: the one beside this interpreter
    here = os.path.dirname(sys.executable)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    parser = argparse.ArgumentParser(prog="python -m autograder.grade", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    def grading_options(p):
        p.add_argument("--jobs", type=int, default=None, help="worker processes (default: the cores available)")
        p.add_argument("--force", action="store_true", help="regrade every submission, changed or not")
        p.add_argument("--no-sandbox", action="store_true",
                       help="grade without bubblewrap (student code sees the course's files; see the README)")
        p.add_argument("--memory", type=float, default=4.0, help="GiB for one submission's processes (default 4)")
        p.add_argument("--budget", type=float, default=600.0,
                       help="seconds for one submission: its cells and every check (default 600)")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--nccl", choices=("auto", "on", "off"), default="auto",
                       help="run every test cell again with NCCL on CUDA devices, as ungraded notes (auto: where "
                            "the machine has at least 2 GPUs; default auto)")

    p_demo = sub.add_parser("demo", help="grade the sample submissions of every released assignment")
    p_demo.add_argument("assignments", nargs="*")
    grading_options(p_demo)
    p_auto = sub.add_parser("autograde", help="grade submitted/*/ASSIGNMENT, write the gradebook and feedback")
    p_auto.add_argument("assignments", nargs="+")
    grading_options(p_auto)
    p_auto.add_argument("--shard", type=_shard, default=None,
                        help="I/N: grade only slice I of N into graded/ASSIGNMENT/shards/shard-I-of-N.json "
                             "('slurm/N' or 'k8s/N' read the array index of the cluster's job)")
    p_auto.add_argument("--out", default=None, help="the shard's result file (with --shard)")
    p_merge = sub.add_parser("merge", help="fold shard result files into the gradebook (idempotent)")
    p_merge.add_argument("files", nargs="+")
    sub.add_parser("scores", help="print the gradebook")
    p_exp = sub.add_parser("export", help="Gradescope results.json per submission; a CSV of the assignments' grades; "
                                          "Canvas's gradebook import; a CSV for any LMS")
    p_exp.add_argument("assignments", nargs="+")
    p_exp.add_argument("--gradescope", default=None, help="folder for <student>/results.json")
    p_exp.add_argument("--csv", default=None,
                       help="this file: one row per submission of the assignments (nbgrader export's columns, the "
                            "student's submission time, and `late`)")
    p_exp.add_argument("--canvas", default=None, metavar="FILE",
                       help="this file: Canvas's gradebook import CSV for the assignment (Grades > Import in Canvas): "
                            "Student, ID, SIS User ID, SIS Login ID, Section and the assignment's column; a score "
                            "not decided (needs regrade) is left blank and listed")
    p_exp.add_argument("--canvas-assignment-id", default=None, metavar="ID",
                       help="with --canvas: the assignment's id in Canvas (.../courses/<course>/assignments/<ID>)")
    p_exp.add_argument("--canvas-roster", default=None, metavar="PATH",
                       help="with --canvas: Canvas's gradebook export (Grades > Export), whose Student, ID, SIS "
                            "and Section values the import keeps (default: the Canvas user ids zip_collect read)")
    p_exp.add_argument("--lms-csv", default=None, metavar="FILE",
                       help="this file: one row per student of the assignment: student_id, first_name, last_name, "
                            "email (nbgrader's gradebook), score, max_score, late, needs_regrade")
    p_pkg = sub.add_parser("student-package", help="write the student archive (notebooks, lessons, wheel)")
    p_pkg.add_argument("--out", default="dist", help="folder for the archive (default: dist)")
    p_pkg.add_argument("--lang", default=None, help="en or zh (default: the language release/ is in)")
    p_gs = sub.add_parser("gradescope-package", help="a Gradescope autograder zip for one assignment")
    p_gs.add_argument("assignment")
    p_gs.add_argument("--out", default="dist", help="folder for the zip (default: dist)")
    from autograder.grading import k8s
    k8s.add_parser(sub)  # k8s-manifest ASSIGNMENT --shards N: the Kubernetes Jobs (autograder/grading/k8s.py)
    args = parser.parse_args(argv)
    if args.cmd == "k8s-manifest":
        return k8s.run(args)
    root = course_root()

    if args.cmd == "student-package":
        from autograder.authoring.package import build_student_package

        try:
            archive = build_student_package(root, os.path.join(root, args.out), args.lang)
        except ValueError as exc:
            raise SystemExit(f"autograder.grade: {exc}") from None
        print(f"wrote {os.path.relpath(archive, root)}: unpack it, then follow its README.md")
        return 0
    if args.cmd == "gradescope-package":
        from autograder.authoring.package import build_gradescope_package

        path = build_gradescope_package(root, args.assignment, os.path.join(root, args.out))
        print(f"wrote {os.path.relpath(path, root)}: upload it as the assignment's autograder on Gradescope")
        return 0
    if args.cmd == "scores":
        rows = _with_gradebook_retry(lambda: gradebook_rows(root), "read the gradebook")
        print_table(rows, root)
        return 0
    if args.cmd == "merge":
        print_records(_merge(root, args.files), root)
        return 0
    if args.cmd == "export":
        from autograder.grading.exports import export

        for line in export(root, args.assignments, gradescope=args.gradescope, csv=args.csv, canvas=args.canvas,
                           canvas_assignment_id=args.canvas_assignment_id, canvas_roster=args.canvas_roster,
                           lms_csv=args.lms_csv):
            print(line)
        return 0
    assignments = args.assignments or released_assignments(root)
    if not assignments:
        raise SystemExit("autograder.grade: nothing in release/; run `make build` first")
    if args.cmd == "demo":
        args.shard, args.out = None, None
        if not args.no_sandbox:
            from autograder.grading.sandbox import sandbox_status

            ok, why = sandbox_status()
            if not ok:  # the demo's submissions are the course's own: grading them unsandboxed is safe
                print(f"note: {why}; the demo grades its own sample submissions without a sandbox "
                      f"(a class's submissions are graded in one: see the README's threat model)")
                args.no_sandbox = True
        for a in assignments:
            write_demo_submissions(root, a)
            print(f"{a}: wrote submissions of {', '.join(DEMO_STUDENTS)} to submitted/")
    records = _autograde(root, assignments, args)
    print()
    print_records(records, root, shard_files=None if args.shard is None else
                  [_shard_file(root, a, args.shard, args.out) for a in assignments])
    from autograder.grading.intake import shown_name

    ungraded = [r for r in records if r.get("status") == "error"]
    if ungraded:
        print(f"\n{len(ungraded)} submission(s) could not be graded (the grader failed, not the student): "
              + ", ".join(f"{r['assignment']}/{shown_name(r['student'])}" for r in ungraded)
              + ". Their reasons are in the table; run the command again to retry them.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
