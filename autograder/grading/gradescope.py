"""The course as a Gradescope autograder: grade one uploaded notebook, write Gradescope's results.json.

    python -m autograder.grade gradescope-package 02_tensor_parallel   # dist/gradescope-02_tensor_parallel.zip
    # upload the zip to Gradescope; for every submission its run_autograder runs:
    /autograder/venv/bin/python -m autograder.grading.gradescope 02_tensor_parallel --course /autograder/source \\
        --submission /autograder/submission --results /autograder/results/results.json

The zip (autograder.authoring.package) holds the assignment's source notebook
(the hidden tests) and release notebook, the course's wheel, `setup.sh`
(bubblewrap, and a virtual environment beside the unpacked zip with the wheel
and its `grading` packages) and `run_autograder`, which finds the layout from
its own location (Gradescope runs it from /autograder, not from the zip's
folder). Grading is the course's trusted run (autograder.grading.trusted): the
student's code runs in a separate process in the bubblewrap sandbox, and the
verdicts come from the instructor's test cells; `results.json` has one test per
graded cell (autograder.grading.exports).

Without a working sandbox (bubblewrap missing, or unable to create its
namespaces in the container) nothing is run: the command refuses with the class
command's message (autograder.grading.classrun.no_sandbox_message), exits with
status 1, and writes a results.json that tells the student the upload could not
be graded (a 0 with no test: Gradescope needs a score, and no score comes from
an unsandboxed run). `--no-sandbox` grades anyway, as the class command's does,
announced on every run. The sandbox check probes the course given by
`--course`, never the working directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

__all__ = ["grade_upload", "ungraded_results", "main", "NOT_GRADED"]

NOT_GRADED = ("This upload could not be graded: {what}. The 0 shown is not a grade of your work: your course staff "
              "can see the reason in the autograder's output, and once it is fixed they can regrade your submission "
              "(or you can submit it again then).")


def ungraded_results(what: str, *, seconds: float = 0.0) -> dict:
    """Gradescope's results.json for an upload the autograder could not grade: a score of 0 (the format needs
    one), no test, and a message that says so (no path or detail of the grading machine: those go to stdout,
    which only the course staff see)."""
    return {"score": 0.0, "execution_time": int(seconds), "output": NOT_GRADED.format(what=what),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": [],
            "extra_data": {"graded": False}}


def _write(results_path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(results_path)), exist_ok=True)
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


def grade_upload(course: str, assignment: str, submission_dir: str, results_path: str, *, budget: float = 1200.0,
                 memory_gib: float = 4.0, isolate: bool = True) -> dict:
    """Grade the notebook in `submission_dir`; write and return Gradescope's results dict.

    Raises ClassRunError (the class command's refusal) where `isolate` and the sandbox does not work for
    `course`; the caller writes the ungraded results then (`main`)."""
    from autograder.grading.classrun import (ClassRunError, _graded_cells, no_sandbox_message, release_notebook,
                                             scrub_record, source_notebook)
    from autograder.grading.exports import cell_titles, gradescope_results
    from autograder.grading.intake import check_submission
    from autograder.grading.sandbox import Sandbox, sandbox_status
    from autograder.grading.trusted import grade_notebook

    t0 = time.monotonic()
    if isolate:
        ok, why = sandbox_status(course)  # the course graded here, never the working directory
        if not ok:
            raise ClassRunError(no_sandbox_message(why))
    with open(source_notebook(course, assignment), encoding="utf-8") as f:
        source = json.load(f)
    with open(release_notebook(course, assignment), encoding="utf-8") as f:
        release = json.load(f)
    nb_name = os.path.basename(release_notebook(course, assignment))
    intake = check_submission(submission_dir, release, nb_name, {}, student="gradescope")
    cells = _graded_cells(source)
    record = {"student": "gradescope", "assignment": assignment, "status": "graded", "reason": None,
              "warnings": list(intake.warnings), "cells": [], "timings": {}}
    if intake.notebook is None:
        record.update(status="rejected", reason=intake.reason)
        record["cells"] = [{"grade_id": g, "points": 0.0, "max_points": p, "passed": False, "visible_passed": None,
                            "message": f"not graded: {intake.reason}"} for g, p in cells]
    else:
        for attempt in (1, 2):  # a check the machine was too busy to decide is graded once more, then reported
            work = tempfile.mkdtemp(prefix="autograder-gradescope-")
            try:
                with Sandbox(course, work, isolate=isolate, memory_bytes=int(memory_gib * 2**30)) as box:
                    verdicts, _ = grade_notebook(intake.notebook, source, inputs=work, sandbox=box, budget=budget,
                                                 memory_note=f"out of memory (limit {memory_gib:g} GiB)")
            finally:
                shutil.rmtree(work, ignore_errors=True)
            if not any(v.inconclusive for v in verdicts.values()):
                break
            print(f"attempt {attempt}: check(s) not decided (the machine too busy): "
                  + ", ".join(g for g, v in verdicts.items() if v.inconclusive), flush=True)
        record["cells"] = [{"grade_id": v.grade_id, "points": v.points, "max_points": v.max_points,
                            "passed": v.passed, "visible_passed": v.visible_passed, "message": v.message,
                            **({"inconclusive": v.inconclusive} if v.inconclusive else {})}
                           for v in verdicts.values()]
        scrub_record(record, course, work)
    record["score"] = sum(c["points"] for c in record["cells"])
    record["timings"]["total"] = round(time.monotonic() - t0, 1)
    results = gradescope_results(record, cell_titles(source))
    _write(results_path, results)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.grading.gradescope", description=__doc__.split("\n\n")[0])
    ap.add_argument("assignment")
    ap.add_argument("--course", default="/autograder/source", help="the unpacked zip (default: Gradescope's)")
    ap.add_argument("--submission", default="/autograder/submission")
    ap.add_argument("--results", default="/autograder/results/results.json")
    ap.add_argument("--budget", type=float, default=1200.0)
    ap.add_argument("--no-sandbox", action="store_true",
                    help="grade without bubblewrap (student code then sees the course's files; not recommended)")
    args = ap.parse_args(argv)
    from autograder.grading.classrun import ClassRunError

    if args.no_sandbox:
        print("WARNING: grading WITHOUT a sandbox (--no-sandbox): student code can read and write the course's "
              "files (source/, the hidden tests, this results.json) and reach the network. See the README's threat "
              "model.", flush=True)
    t0 = time.monotonic()
    try:
        results = grade_upload(os.path.abspath(args.course), args.assignment, args.submission, args.results,
                               budget=args.budget, isolate=not args.no_sandbox)
    except ClassRunError as exc:
        print(f"autograder.grading.gradescope: {exc}", flush=True)
        _write(args.results, ungraded_results("the autograder's sandbox does not work on this grading machine, and "
                                              "it runs no submission without one (none of your notebook was run)",
                                              seconds=time.monotonic() - t0))
        return 1
    except Exception as exc:  # noqa: BLE001 - the student is told; the traceback is for the course staff
        traceback.print_exc()
        _write(args.results, ungraded_results(f"the autograder failed ({type(exc).__name__}), not because of "
                                              f"your notebook", seconds=time.monotonic() - t0))
        return 1
    print(f"{args.assignment}: {results['score']:g} points; results in {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
