"""Exports of the graded records: Gradescope's results.json per submission, a CSV of the gradebook, the LMS.

    python -m autograder.grade export 02_tensor_parallel --gradescope exports/gradescope --csv exports/02.csv
    python -m autograder.grade export 02_tensor_parallel --canvas exports/02-canvas.csv --canvas-assignment-id 12345
    python -m autograder.grade export 02_tensor_parallel --lms-csv exports/02-grades.csv

Canvas's gradebook import and the plain CSV for another LMS: autograder.grading.lms.

Gradescope (its autograder specification, "results.json"): one test per
graded cell, named by its exercise and what it checks, with its score and
maximum. A failure in the visible checks shows the check's message (what the
notebook showed the student); a failure in a hidden case shows only that a
hidden case failed: no test source, no hidden case's data.

The CSV has `nbgrader export`'s columns, one row per submission of the
named assignments only (nbgrader's own export writes every assignment, and a
0 for each student without a submission), and a `late` column: "yes" where
Canvas marked the submission LATE (recorded by `nbgrader zip_collect`:
autograder.grading.canvas) or its timestamp (the student's, from nbgrader's
timestamp.txt) is past the assignment's due date. Files go where the paths
say, folders made as needed; run nothing else in the course root (no
nbgrader log, no scratch file).
"""

from __future__ import annotations

import ast
import csv as csv_module
import json
import os

__all__ = ["gradescope_results", "cell_titles", "export", "csv_rows", "CSV_COLUMNS"]

CSV_COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
               "late_submission_penalty", "score", "max_score", "late")

HIDDEN_FAILURE = ("Passed the visible checks; failed a hidden case (other world sizes, shapes, dtypes or edge "
                  "cases). Re-read the exercise's contract.")


def cell_titles(source: dict) -> dict[str, str]:
    """grade_id -> "Exercise 3 · ColumnParallelLinear equals nn.Linear ..." (from `with checking(label, doc):`)."""
    out = {}
    for cell in source["cells"]:
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if not meta.get("grade") or meta.get("solution"):
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        title = meta["grade_id"]
        try:
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "checking" and len(node.args) >= 2:
                    title = f"{ast.literal_eval(node.args[0])} \u00b7 {ast.literal_eval(node.args[1])}"
                    break
        except (SyntaxError, ValueError):
            pass
        out[meta["grade_id"]] = title
    return out


def gradescope_results(record: dict, titles: dict[str, str]) -> dict:
    """Gradescope's results.json for one graded record."""
    tests = []
    for i, c in enumerate(record["cells"], 1):
        if c.get("inconclusive"):  # not decided (a machine too busy to tell): no score and no status, not a 0
            tests.append({"name": titles.get(c["grade_id"], c["grade_id"]), "number": str(i),
                          "max_score": c["max_points"], "output": c["message"], "visibility": "visible"})
            continue
        if record["status"] != "graded":
            output = f"Not graded: {record['reason']}"
        elif c["passed"]:
            output = "Passed."
        elif c.get("visible_passed"):
            output = HIDDEN_FAILURE
        else:
            output = c["message"]
        if c.get("backend_note"):  # the cell run again with NCCL on a GPU grading node: not graded
            output += "\n" + c["backend_note"]
        tests.append({"name": titles.get(c["grade_id"], c["grade_id"]), "number": str(i),
                      "score": c["points"], "max_score": c["max_points"], "output": output,
                      "status": "passed" if c["passed"] else "failed", "visibility": "visible"})
    notes = list(record.get("warnings", []))
    undecided = [c["grade_id"] for c in record["cells"] if c.get("inconclusive")]
    if undecided:
        notes.insert(0, f"Not graded yet: the grading machine was too busy to decide {len(undecided)} check(s) "
                        f"({', '.join(titles.get(g, g) for g in undecided)}): they have no score, which is not a "
                        f"grade of your work; ask your course staff to regrade this submission.")
    out = {"score": record["score"], "execution_time": int(record.get("timings", {}).get("total", 0)),
           "output": "\n".join(notes) if notes else "Graded by the course's trusted grader.",
           "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}
    if undecided:
        out["extra_data"] = {"needs_regrade": undecided}
    return out


def export(root: str, assignments: list[str], *, gradescope: str | None = None, csv: str | None = None,
           canvas: str | None = None, canvas_assignment_id: str | None = None, canvas_roster: str | None = None,
           lms_csv: str | None = None):
    """Write the exports asked for; yield a line to print for each (autograder.grading.lms: Canvas, --lms-csv)."""
    from autograder.grading.classrun import read_results, source_notebook

    if (canvas_assignment_id or canvas_roster) and not canvas:
        raise SystemExit("autograder.grade export: --canvas-assignment-id and --canvas-roster go with --canvas FILE "
                         "(Canvas's gradebook import)")
    for option, value in (("--canvas", canvas), ("--lms-csv", lms_csv)):
        if value and len(assignments) != 1:
            raise SystemExit(f"autograder.grade export: {option} writes one assignment's grades: name one "
                             f"assignment (not {len(assignments)}), and run it once per assignment")
    if canvas:  # its errors (no Canvas assignment id, not a Canvas roster) before anything is written
        from autograder.grading.lms import write_canvas

        canvas_lines = write_canvas(root, assignments[0], canvas, canvas_assignment_id=canvas_assignment_id,
                                    roster_path=canvas_roster)

    if gradescope:
        for a in assignments:
            with open(source_notebook(root, a), encoding="utf-8") as f:
                titles = cell_titles(json.load(f))
            records = read_results(root, a)
            for student, rec in records.items():
                folder = os.path.join(gradescope, a, student)
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as f:
                    json.dump(gradescope_results(rec, titles), f, indent=1)
            yield f"{a}: {len(records)} results.json written under {os.path.join(gradescope, a)}/<student>/"
    if csv:
        rows = csv_rows(root, assignments)
        os.makedirs(os.path.dirname(os.path.abspath(csv)) or ".", exist_ok=True)
        with open(csv, "w", newline="", encoding="utf-8") as f:
            writer = csv_module.DictWriter(f, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        late = sum(r["late"] == "yes" for r in rows)
        yield f"wrote {csv}: {len(rows)} submission(s) of {', '.join(assignments)} ({late} late)"
    if canvas:
        yield from canvas_lines
    if lms_csv:
        from autograder.grading.lms import write_lms_csv

        yield from write_lms_csv(root, assignments[0], lms_csv)


def csv_rows(root: str, assignments: list[str]) -> list[dict]:
    """One row per submission of `assignments` in nbgrader's gradebook: nbgrader export's columns, and `late`."""
    import warnings

    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.canvas import late_students

    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            for name in assignments:
                try:
                    assignment = gb.find_assignment(name)
                except MissingEntry:
                    raise SystemExit(f"autograder.grade export: {name} is not in the gradebook (run `make build`, "
                                     f"then grade it)") from None
                canvas_late = late_students(root, name)
                for sub in sorted(gb.assignment_submissions(name), key=lambda s: s.student.id):
                    student, penalty = sub.student, sub.late_submission_penalty or 0.0
                    late = sub.student.id in canvas_late or sub.total_seconds_late > 0
                    rows.append({"assignment": name, "duedate": _text(assignment.duedate),
                                 "timestamp": _text(sub.timestamp), "student_id": student.id,
                                 "last_name": _text(student.last_name), "first_name": _text(student.first_name),
                                 "email": _text(student.email), "raw_score": sub.score,
                                 "late_submission_penalty": penalty, "score": max(0.0, sub.score - penalty),
                                 "max_score": assignment.max_score, "late": "yes" if late else "no"})
    return rows


def _text(value) -> str:
    return "" if value is None else str(value)
