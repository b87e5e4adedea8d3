"""The course as a Gradescope autograder: grade one uploaded notebook, write Gradescope's results.json.

    make gradescope ASSIGNMENT=02_tensor_parallel    # dist/gradescope-02_tensor_parallel.zip: upload it to Gradescope
    # in Gradescope's container, run_autograder runs:
    python3 -m autograder.grading.gradescope 02_tensor_parallel --course /autograder/source \\
        --submission /autograder/submission --results /autograder/results/results.json

The upload holds the course root without `solutions/` and `tests/`: the
source notebook (the hidden tests), the release notebook, the `autograder`
package, `setup.sh` (installs Python's packages and bubblewrap) and
`run_autograder`. Grading is the course's trusted run (autograder.grading.trusted):
the student's code runs in a separate process, in bubblewrap where the
container allows it, and the verdicts come from the instructor's test cells;
`results.json` has one test per graded cell (autograder.grading.exports).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

__all__ = ["grade_upload", "main"]


def grade_upload(course: str, assignment: str, submission_dir: str, results_path: str, *, budget: float = 1200.0,
                 memory_gib: float = 4.0) -> dict:
    """Grade the notebook in `submission_dir`; write and return Gradescope's results dict."""
    from autograder.grading.classrun import _graded_cells, release_notebook, scrub_record, source_notebook
    from autograder.grading.exports import cell_titles, gradescope_results
    from autograder.grading.intake import check_submission
    from autograder.grading.sandbox import Sandbox, sandbox_status
    from autograder.grading.trusted import grade_notebook

    t0 = time.monotonic()
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
        isolate, why = sandbox_status()
        if not isolate:
            record["warnings"].append(f"graded without bubblewrap here ({why}): the container is the isolation")
        work = tempfile.mkdtemp(prefix="autograder-gradescope-")
        try:
            with Sandbox(course, work, isolate=isolate, memory_bytes=int(memory_gib * 2**30)) as box:
                verdicts, _ = grade_notebook(intake.notebook, source, inputs=work, sandbox=box, budget=budget,
                                             memory_note=f"out of memory (limit {memory_gib:g} GiB)")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record["cells"] = [{"grade_id": v.grade_id, "points": v.points, "max_points": v.max_points,
                            "passed": v.passed, "visible_passed": v.visible_passed, "message": v.message}
                           for v in verdicts.values()]
        scrub_record(record, course, work)
    record["score"] = sum(c["points"] for c in record["cells"])
    record["timings"]["total"] = round(time.monotonic() - t0, 1)
    results = gradescope_results(record, cell_titles(source))
    os.makedirs(os.path.dirname(os.path.abspath(results_path)), exist_ok=True)
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.grading.gradescope", description=__doc__.split("\n\n")[0])
    ap.add_argument("assignment")
    ap.add_argument("--course", default="/autograder/source")
    ap.add_argument("--submission", default="/autograder/submission")
    ap.add_argument("--results", default="/autograder/results/results.json")
    ap.add_argument("--budget", type=float, default=1200.0)
    args = ap.parse_args(argv)
    results = grade_upload(args.course, args.assignment, args.submission, args.results, budget=args.budget)
    print(f"{args.assignment}: {results['score']:g} points; results in {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
