"""The course's grading command line (instructors and the grading machine).

    python -m autograder.grade demo                 # sample submissions -> nbgrader -> gradebook table
    python -m autograder.grade autograde 02_tensor_parallel   # grade submitted/*/02_tensor_parallel
    python -m autograder.grade scores               # print the gradebook
    python -m autograder.grade student-package      # dist/llm-parallelism-course.tar.gz for students

Run from the course root (where nbgrader_config.py is). `autograde` wraps
`nbgrader autograde` and `nbgrader generate_feedback`, then prints each
student's score and the cells they lost points on, read from the sqlite
gradebook. `demo` first writes three sample submissions per assignment
(reference solution, untouched release notebook, one plausible wrong edit);
it needs the instructor-only `solutions` package.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
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


# Lines that every kernel start prints and that say nothing about the grading.
_NBGRADER_NOISE = ("Kernel is running over TCP without encryption",)


def _nbgrader(root: str, *args: str) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "nbgrader")
    # ERROR: nbgrader warns, for every submission, that each test cell with hidden
    # tests "has changed" (the release copy lacks them) before it restores the
    # source copy; that is expected, and it buries the score table.
    cmd = [exe if os.path.exists(exe) else "nbgrader", *args, "--log-level=ERROR"]
    # nbgrader runs `alembic` (and the kernel) from PATH: put this interpreter's bin first
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if not any(noise in line for noise in _NBGRADER_NOISE):
            print(line, end="", flush=True)
    proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"autograder.grade: `{' '.join(cmd)}` failed with status {proc.returncode}")


def write_demo_submissions(root: str, assignment: str) -> dict[str, str]:
    """submitted/<student>/<assignment>/<notebook>.ipynb for the three demo students."""
    sys.path.insert(0, root)
    from solutions import submissions
    import importlib

    release_nb = submissions.notebook_path("release", assignment)
    nb_name = os.path.basename(release_nb)
    dim = assignment.split("_", 1)[1]
    mutants = importlib.import_module(f"solutions.mutants.{dim}").MUTANTS
    demo = [m for m in mutants if m.demo]
    if len(demo) != 1:
        raise SystemExit(f"solutions/mutants/{dim}.py must mark exactly one mutant demo=True")
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


def autograde(root: str, assignment: str) -> float:
    """nbgrader autograde + generate_feedback for every submission of `assignment`; seconds taken."""
    t0 = time.monotonic()
    _nbgrader(root, "autograde", assignment, "--force")
    elapsed = time.monotonic() - t0
    _nbgrader(root, "generate_feedback", assignment, "--force")
    return elapsed


def gradebook_rows(root: str, assignments: list[str] | None = None) -> list[dict]:
    """One row per (assignment, student): score, max score, and the test cells that lost points."""
    from nbgrader.api import Gradebook, MissingEntry

    rows = []
    db = "sqlite:///" + os.path.join(root, "gradebook.db")
    with Gradebook(db) as gb:
        for assignment in gb.assignments:
            if assignments and assignment.name not in assignments:
                continue
            for student in gb.students:
                try:
                    sub = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    continue
                lost = []
                for nb in sub.notebooks:
                    for grade in nb.grades:
                        if grade.max_score and (grade.score or 0) < grade.max_score:
                            lost.append(grade.name)
                rows.append({"assignment": assignment.name, "student": student.id,
                             "score": float(sub.score), "max_score": float(sub.max_score), "lost": sorted(lost)})
    return rows


def print_table(rows: list[dict], root: str) -> None:
    if not rows:
        print("The gradebook has no graded submissions yet.")
        return
    w_a = max(len("assignment"), *(len(r["assignment"]) for r in rows))
    w_s = max(len("student"), *(len(r["student"]) for r in rows))
    print(f"{'assignment':<{w_a}}  {'student':<{w_s}}  {'score':>13}  cells that lost points")
    print(f"{'-' * w_a}  {'-' * w_s}  {'-' * 13}  {'-' * 22}")
    for r in rows:
        lost = ", ".join(r["lost"]) if r["lost"] else "-"
        if len(lost) > 90:
            lost = f"{len(r['lost'])} cells (all)" if r["score"] == 0 else lost[:87] + "..."
        print(f"{r['assignment']:<{w_a}}  {r['student']:<{w_s}}  {r['score']:6.1f} / {r['max_score']:4.0f}  {lost}")
    print(f"\nGradebook: {os.path.join(root, 'gradebook.db')}")
    print(f"Feedback (HTML, one per student and assignment): {os.path.join(root, 'feedback')}/<student>/<assignment>/")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.grade", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_demo = sub.add_parser("demo", help="grade the sample submissions of every released assignment")
    p_demo.add_argument("assignments", nargs="*")
    p_auto = sub.add_parser("autograde", help="autograde submitted/*/ASSIGNMENT and generate feedback")
    p_auto.add_argument("assignments", nargs="+")
    sub.add_parser("scores", help="print the gradebook")
    p_pkg = sub.add_parser("student-package", help="write the student archive (notebooks, lessons, wheel)")
    p_pkg.add_argument("--out", default="dist", help="folder for the archive (default: dist)")
    args = parser.parse_args(argv)
    root = course_root()

    if args.cmd == "student-package":
        from autograder.package import build_student_package

        archive = build_student_package(root, os.path.join(root, args.out))
        print(f"wrote {os.path.relpath(archive, root)}: unpack it, then follow its README.md")
        return 0
    if args.cmd == "scores":
        print_table(gradebook_rows(root), root)
        return 0
    assignments = args.assignments or released_assignments(root)
    if not assignments:
        raise SystemExit("autograder.grade: nothing in release/; run `make build` first")
    if args.cmd == "demo":
        for a in assignments:
            write_demo_submissions(root, a)
            print(f"{a}: wrote submissions of {', '.join(DEMO_STUDENTS)} to submitted/")
    for a in assignments:
        print(f"{a}: autograding with nbgrader ...", flush=True)
        seconds = autograde(root, a)
        print(f"{a}: autograded in {seconds:.1f} s", flush=True)
    print()
    print_table(gradebook_rows(root, assignments), root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
