"""Grades back to the LMS: Canvas's gradebook import CSV, and a plain CSV for any other LMS or a spreadsheet.

    python -m autograder.grade export 02_tensor_parallel --canvas exports/02-canvas.csv \\
        --canvas-assignment-id 12345 [--canvas-roster exports/canvas-gradebook.csv]
    python -m autograder.grade export 02_tensor_parallel --lms-csv exports/02-grades.csv

The scores are the gradebook's (gradebook.db: what `autograde` or `merge`
wrote, and any manual grade given in nbgrader's formgrader), less nbgrader's
late penalty. A score that is not decided is never exported as one: a cell
recorded as "needs regrade (infrastructure)" (the record's `needs_regrade`
in graded/<assignment>/<student>.json, a grade with neither an automatic nor
a manual score in the gradebook) or a submission the grader failed on
(status "error") leaves that student's score blank, and the command lists
them.

Canvas's gradebook import (Canvas's own parser, lib/gradebook_importer.rb,
and its Gradebook export): a header row `Student, ID, SIS User ID, SIS Login
ID, Section`, then one column per assignment named `<name> (<Canvas
assignment id>)`, which Canvas matches by the id; an optional row whose first
cell is `Points Possible`; then one row per student, whom Canvas finds by
`ID` (its user id), else `SIS User ID`, else `SIS Login ID`, else the name.
Canvas accepts `SIS User ID` only followed by `SIS Login ID`, and needs
`Section` last (its value may be empty). A blank cell is "no grade": Canvas's
import removes a grade it already holds there, and its preview shows that.

Who a student is in Canvas comes from `--canvas-roster`, Canvas's own
gradebook export (Grades > Export > Export Entire Gradebook: its first
columns are those above; its rows are kept as they are), else from the
student's Canvas user id: nbgrader's `lms_user_id` (`nbgrader db student
import` with that column) or what `nbgrader zip_collect` read in a Canvas
download's file names (autograder.grading.canvas). A roster row is a
student's where its ID is their Canvas user id, or its SIS Login ID or SIS
User ID is their nbgrader id, or its SIS Login ID is their email. Students
Canvas would not know are left out, and named.
"""

from __future__ import annotations

import csv
import os
import re
import warnings
from dataclasses import dataclass, field

__all__ = ["CANVAS_COLUMNS", "LMS_COLUMNS", "POINTS_POSSIBLE", "Grade", "assignment_grades", "write_canvas",
           "write_lms_csv", "read_canvas_roster", "canvas_header"]

# Canvas's student columns, in the order its export writes them and its importer reads them
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
POINTS_POSSIBLE = "Points Possible"
# the plain CSV: one row per student who submitted the assignment
LMS_COLUMNS = ("student_id", "first_name", "last_name", "email", "score", "max_score", "late", "needs_regrade")

# Canvas's Assignment.title_and_id: "<title> (<id>)"
_TITLE_AND_ID = re.compile(r"\A(.*)\s\((\d+)\)\Z", re.S)
# Canvas skips these rows: muted / manual-posting markers under the header
_MARKER_ROW = re.compile(r"^\s*(Muted|Manual Posting.*)?\s*$", re.I)


@dataclass
class Grade:
    """One submission of an assignment, as the gradebook holds it."""
    student: str
    first_name: str
    last_name: str
    email: str
    lms_user_id: str
    score: float | None  # None: not decided (needs regrade, or the grader failed): never exported as a score
    max_score: float
    late: bool
    needs_regrade: list[str] = field(default_factory=list)
    grader_failed: str = ""

    @property
    def why_blank(self) -> str:
        if self.grader_failed:
            return "not graded (the grader failed; `autograde` tries again)"
        return "needs regrade (infrastructure): " + ", ".join(self.needs_regrade)

    def canvas_name(self) -> str:
        """Canvas's sortable name, "Last, First", where nbgrader has the names; else the nbgrader id."""
        names = [n for n in (self.last_name, self.first_name) if n]
        return ", ".join(names) or self.student


def assignment_grades(root: str, assignment: str) -> tuple[list[Grade], float]:
    """Every submission of `assignment` in the gradebook (sorted by student), and the assignment's maximum."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.canvas import late_students
    from autograder.grading.classrun import read_results

    records = read_results(root, assignment)
    canvas_late = late_students(root, assignment)
    grades = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            try:
                max_score = float(gb.find_assignment(assignment).max_score)
            except MissingEntry:
                raise SystemExit(f"autograder.grade export: {assignment} is not in the gradebook (run `make build`, "
                                 f"then grade it)") from None
            for sub in sorted(gb.assignment_submissions(assignment), key=lambda s: s.student.id):
                student = sub.student
                cells = {g.name: g for nb in sub.notebooks for g in nb.grades}
                # not decided: no automatic and no manual score (autograder.grading.classrun.write_gradebook) ...
                undecided = [name for name, g in cells.items() if g.max_score and g.auto_score is None
                             and g.manual_score is None and g.needs_manual_grade]
                rec = records.get(student.id) or {}
                # ... or so recorded in graded/, unless a person has since given the cell a score
                undecided += [c for c in rec.get("needs_regrade") or [] if c not in undecided
                              and (c not in cells or cells[c].manual_score is None)]
                failed = str(rec.get("reason") or "the grader failed") if rec.get("status") == "error" else ""
                penalty = sub.late_submission_penalty or 0.0
                score = None if undecided or failed else max(0.0, float(sub.score) - penalty)
                grades.append(Grade(student=student.id, first_name=student.first_name or "",
                                    last_name=student.last_name or "", email=student.email or "",
                                    lms_user_id=student.lms_user_id or "", score=score, max_score=max_score,
                                    late=student.id in canvas_late or sub.total_seconds_late > 0,
                                    needs_regrade=sorted(undecided), grader_failed=failed))
    return grades, max_score


def points(value: float) -> str:
    """A score as Canvas shows it: at most two decimals, no trailing zeros ("12", "69.5")."""
    text = f"{round(value, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _blank_lines(grades: list[Grade]) -> list[str]:
    lines = []
    regrade = [g for g in grades if g.score is None and not g.grader_failed]
    failed = [g for g in grades if g.grader_failed]
    if regrade:
        lines.append(f"needs regrade (infrastructure), no score exported: {len(regrade)} student(s), their score "
                     f"left blank: " + "; ".join(f"{g.student} ({', '.join(g.needs_regrade)})" for g in regrade)
                     + ". Grade them again (`autograde`), then export again.")
    if failed:
        lines.append(f"not graded (the grader failed, not the student), no score exported: {len(failed)} "
                     f"student(s), their score left blank: " + ", ".join(g.student for g in failed)
                     + ". Run `autograde` again, then export again.")
    return lines


# ---------------------------------------------------------------------------
# The plain CSV
# ---------------------------------------------------------------------------

def write_lms_csv(root: str, assignment: str, path: str) -> list[str]:
    grades, _ = assignment_grades(root, assignment)
    _makedirs(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(LMS_COLUMNS)
        for g in grades:
            if g.grader_failed:
                regrade = "all (the grader failed)"
            else:
                regrade = " ".join(g.needs_regrade)
            writer.writerow([g.student, g.first_name, g.last_name, g.email,
                             "" if g.score is None else points(g.score), points(g.max_score),
                             "yes" if g.late else "no", regrade])
    named = sum(bool(g.first_name or g.last_name or g.email) for g in grades)
    return ([f"wrote {path}: {len(grades)} student(s) of {assignment} ({named} with a name or email in the "
             f"gradebook; {sum(g.late for g in grades)} late)"] + _blank_lines(grades))


# ---------------------------------------------------------------------------
# Canvas
# ---------------------------------------------------------------------------

@dataclass
class Roster:
    """Canvas's gradebook export: its student rows (the five columns), and its assignment columns by Canvas id."""
    path: str
    students: list[dict]
    assignments: dict[str, str]  # Canvas assignment id -> the column's header, as Canvas wrote it
    points_possible: dict[str, str]  # header -> the Points Possible row's value


def read_canvas_roster(path: str) -> Roster:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's byte-order mark is dropped
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise SystemExit(f"autograder.grade export: --canvas-roster {path}: no such file") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise SystemExit(f"autograder.grade export: --canvas-roster {path} is not a CSV file ({exc})") from None
    header = [h.strip() for h in rows[0]] if rows else []
    if len(header) < 3 or header[0] != "Student" or header[1] != "ID" or "Section" not in header:
        raise SystemExit(
            f"autograder.grade export: --canvas-roster {path} is not Canvas's gradebook export: its first row "
            f"starts {', '.join(header[:5]) or '(empty)'}; Canvas's starts {', '.join(CANVAS_COLUMNS)} (in Canvas: "
            f"Grades > Export > Export Entire Gradebook)")
    index = {h: i for i, h in reversed(list(enumerate(header)))}
    students, pp = [], {}
    for row in rows[1:]:
        cells = row + [""] * (len(header) - len(row))
        if not any(c.strip() for c in cells):
            continue
        if POINTS_POSSIBLE in cells[0]:
            pp = {h: cells[i].strip() for i, h in enumerate(header)}
            continue
        if all(_MARKER_ROW.match(c) for c in cells):
            continue
        students.append({col: cells[index[col]].strip() if col in index else "" for col in CANVAS_COLUMNS})
    assignments = {}
    for h in header:
        m = _TITLE_AND_ID.match(h)
        if m:
            assignments.setdefault(m.group(2), h)
    return Roster(path=path, students=students, assignments=assignments, points_possible=pp)


def canvas_header(title: str, canvas_assignment_id: str) -> list[str]:
    return [*CANVAS_COLUMNS, f"{title} ({canvas_assignment_id})"]


def _match(grades: list[Grade], roster: Roster, user_ids: dict[str, str]):
    """(grade, roster row) pairs, and the grades no roster row is for."""
    by_id, by_login, by_sis = {}, {}, {}
    for row in roster.students:
        if row["ID"]:
            by_id.setdefault(row["ID"], row)
        if row["SIS Login ID"]:
            by_login.setdefault(row["SIS Login ID"].lower(), row)
        if row["SIS User ID"]:
            by_sis.setdefault(row["SIS User ID"].lower(), row)
    pairs, missing, taken = [], [], {}
    for g in grades:
        row = None
        for uid in (g.lms_user_id, user_ids.get(g.student, "")):
            row = row or (by_id.get(uid) if uid else None)
        key = g.student.lower()
        row = row or by_login.get(key) or by_sis.get(key) or (by_login.get(g.email.lower()) if g.email else None)
        if row is None:
            missing.append((g, "not in the roster"))
        elif id(row) in taken:
            missing.append((g, f"the roster's row of {taken[id(row)]} matches them too"))
        else:
            taken[id(row)] = g.student
            pairs.append((g, row))
    return pairs, missing


def write_canvas(root: str, assignment: str, path: str, *, canvas_assignment_id: str | None,
                 roster_path: str | None = None) -> list[str]:
    """Canvas's gradebook import CSV for one assignment; the lines to print."""
    from autograder.grading.canvas import canvas_user_ids

    if not canvas_assignment_id:
        raise SystemExit("autograder.grade export: --canvas needs --canvas-assignment-id: the assignment's id in "
                         "Canvas, the number at the end of its page's address (.../courses/<course>/assignments/<id>)"
                         "; Canvas matches the import's column by it")
    canvas_assignment_id = str(canvas_assignment_id).strip()
    if not canvas_assignment_id.isdigit():
        raise SystemExit(f"autograder.grade export: --canvas-assignment-id {canvas_assignment_id!r}: Canvas's "
                         f"assignment ids are numbers (the end of .../courses/<course>/assignments/<id>)")
    roster = read_canvas_roster(roster_path) if roster_path else None
    if roster is not None and canvas_assignment_id not in roster.assignments:
        known = ", ".join(sorted(roster.assignments.values())) or "none"
        raise SystemExit(f"autograder.grade export: Canvas assignment {canvas_assignment_id} is not a column of "
                         f"--canvas-roster {roster_path} (its assignments: {known}). Check the id: Canvas would "
                         f"make a new assignment of a column it does not know.")
    grades, max_score = assignment_grades(root, assignment)
    user_ids = canvas_user_ids(root, assignment)
    lines = []
    if roster is not None:
        header = [*CANVAS_COLUMNS, roster.assignments[canvas_assignment_id]]  # Canvas's own name for the column
        pairs, missing = _match(grades, roster, user_ids)
        rows = [([row[c] for c in CANVAS_COLUMNS], g) for g, row in pairs]
        matched = {id(row) for _, row in pairs}
        absent = [r for r in roster.students if id(r) not in matched]
        source = f"the roster {roster_path}"
    else:
        header = canvas_header(assignment, canvas_assignment_id)
        rows, missing, absent = [], [], []
        for g in grades:
            uid = g.lms_user_id or user_ids.get(g.student, "")
            if uid:
                rows.append(([g.canvas_name(), uid, "", "", ""], g))
            else:
                missing.append((g, "no Canvas user id"))
        source = "their Canvas user ids (zip_collect's Canvas download, or nbgrader's lms_user_id)"
    _makedirs(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerow([POINTS_POSSIBLE, "", "", "", "", points(max_score)])
        for identity, g in rows:
            writer.writerow([*identity, "" if g.score is None else points(g.score)])
    scored = sum(g.score is not None for _, g in rows)
    lines.append(f"wrote {path}: Canvas's gradebook import of {assignment}, column \"{header[-1]}\": {len(rows)} "
                 f"student(s) named by {source}, {scored} with a score")
    lines += _blank_lines([g for _, g in rows])
    if missing:
        hint = ("their Canvas user id as nbgrader's lms_user_id, their nbgrader id as the roster's SIS Login ID "
                "or SIS User ID, or their email as its SIS Login ID; or enrol them in Canvas" if roster is not None
                else "pass Canvas's gradebook export as --canvas-roster, or give them nbgrader's lms_user_id")
        lines.append(f"not exported, Canvas would not know them: {len(missing)} student(s): "
                     + "; ".join(f"{g.student} ({why})" for g, why in missing) + f". To include them: {hint}.")
    if absent:
        lines.append(f"in the roster without a submission of {assignment} (no row: Canvas keeps what it has): "
                     f"{len(absent)} student(s): " + "; ".join(r["Student"] or r["ID"] for r in absent))
    if roster is not None:
        theirs = roster.points_possible.get(header[-1], "")
        try:
            differs = theirs not in ("", "(read only)") and float(theirs) != max_score
        except ValueError:
            differs = False
        if differs:
            lines.append(f"note: Canvas has {theirs} points possible for this assignment, the course "
                         f"{points(max_score)}: the import's Points Possible row sets Canvas's to "
                         f"{points(max_score)} (its preview shows it)")
    lines.append("next: in Canvas, Grades > Import, choose the file, check the preview (a blank cell removes a "
                 "grade Canvas holds), then Upload")
    return lines


def _makedirs(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
