"""Grading a real class with the course's command: parallel, incremental, sharded, merged, exported.

    .venv/bin/python -m pytest -q -s tests/test_grading.py

On a scratch course whose assignment 02 is cut to two graded cells
(tests/grading_course.py), as an instructor runs it:
- three shards (`--shard i/3 --jobs 1`: one submission at a time each) run as separate processes at
  once, merged, give every student's scores; merging again changes nothing (a student is named like a
  shard file: shard-2-of-3);
- `autograde --jobs 2` gives the same scores, cell by cell, and the same gradebook;
- a second run grades nothing again; a changed notebook is the only one regraded;
- notebooks that cannot be graded get a named reason, and everyone else is graded; so do student folders
  whose name cannot name files (250 characters, a terminal escape), in every later run too;
- Gradescope's results.json per submission: the format, the scores, no hidden test; the CSV of one
  assignment, with the students' submission times and lateness, written where asked, nothing left untracked
  (the Gradescope autograder itself, its zip set up and run as Gradescope does: tests/test_gradescope.py);
- a Canvas download collected with `nbgrader zip_collect` is graded, its LATE marker kept in the CSV;
- grades back to the LMS: Canvas's gradebook import (Canvas's header exactly; a roster in Canvas's export format
  kept with the assignment's column filled; students missing from it named; a needs-regrade score blank, never a
  number; named by the Canvas user ids of a download without a roster), and the plain CSV with the names and
  emails of nbgrader's gradebook;
- a second command waits for nobody: it says who holds the course's lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

from grading_course import (A, clear_results, edit, gradebook, make_mini_course, needs_sandbox, notebook_name,
                            records, reference, release, run_grade, write_submission)

WRONG = ("return _reduce(grad_output, ctx.group), None", "return grad_output, None")  # f's backward forgotten

# each test grades a class (or runs the whole catalogue in its fixture)
pytestmark = [pytest.mark.timeout(3600), needs_sandbox]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = make_mini_course(tmp_path_factory.mktemp("class"))
    ref = reference(root)
    write_submission(root, "alice", ref)
    write_submission(root, "bob", release(root))
    write_submission(root, "carol", edit(ref, "tp_mappings", lambda s: s.replace(*WRONG)))
    write_submission(root, "dave", ref, name="tensor_parallel_lab-Copy1.ipynb")
    write_submission(root, SHARD_NAMED, ref)  # named like the grader's file of shard 2 of 3
    for student, when in STAMPS.items():  # what nbgrader collect writes beside the notebook
        with open(os.path.join(root, "submitted", student, A, "timestamp.txt"), "w") as f:
            f.write(f"{when}.000000 UTC")
    # the course is a git repository, as an instructor keeps it: grading and exports leave no untracked file
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run(["git", *cmd], cwd=root, check=True, capture_output=True)
    return root


STAMPS = {"alice": "2026-01-15 09:30:00", "carol": "2026-01-25 18:00:00"}  # bob and dave: no timestamp.txt
SHARD_NAMED = "shard-2-of-3"  # a student: once, their record overwrote shard 2's file in the merge


def _untracked(root: str) -> list[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    return out.splitlines()


def _csv(path) -> list[dict]:
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _scores(recs: dict) -> dict:
    return {s: {c["grade_id"]: c["points"] for c in r["cells"]} for s, r in recs.items()}


@pytest.fixture(scope="module")
def sequential(course):
    """The class graded one submission at a time: three shards (`--shard i/3 --jobs 1`, a worker each) run as
    separate processes at once, then merged, and merged again. What every other run is held to."""
    shards = [subprocess.Popen([sys.executable, "-m", "autograder.grade", "autograde", A, "--shard", f"{i}/3",
                                "--jobs", "1", "--quiet"], cwd=course, env=__import__("grading_course").env(course),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (1, 2, 3)]
    outs = [p.communicate(timeout=1800)[0] for p in shards]
    assert all(p.returncode == 0 for p in shards), "\n".join(o[-2000:] for o in outs)
    files = [os.path.join(course, "graded", A, "shards", f"shard-{i}-of-3.json") for i in (1, 2, 3)]
    run = {"shard_students": sorted(r["student"] for f in files for r in json.load(open(f))["records"]),
           "book_before_merge": gradebook(course)}
    proc = run_grade(course, "merge", *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run.update(records=records(course), book=gradebook(course))
    proc = run_grade(course, "merge", *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run["book_merged_twice"] = gradebook(course)
    clear_results(course)
    return run


def test_parallel_grading_gives_the_sequential_scores_and_regrades_only_changes(course, sequential):
    seq_records, seq_book = sequential["records"], sequential["book"]
    assert _scores(seq_records) == {"alice": {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0},
                                    "bob": {"test_copy_to_region": 0.0, "test_reduce_from_region": 0.0},
                                    "carol": {"test_copy_to_region": 0.0, "test_reduce_from_region": 6.0},
                                    "dave": {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0},
                                    SHARD_NAMED: {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0}}
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _scores(records(course)) == _scores(seq_records)
    assert gradebook(course) == seq_book
    assert "5 graded" in proc.stdout
    # a warning, graded (the table wraps its notes at the terminal's width)
    assert "graded tensor_parallel_lab-Copy1.ipynb as tensor_parallel_lab.ipynb" in " ".join(proc.stdout.split())
    # the command prints its own lines only: nothing a check, a worked example or a student's kernel printed
    for stray in (": passed", "ipython kernel", "To connect another client"):
        assert stray not in proc.stdout + proc.stderr, f"{stray!r} in the command's output:\n{proc.stdout[-3000:]}"
    for student in ("alice", "bob", "carol", "dave", SHARD_NAMED):
        html = open(os.path.join(course, "feedback", student, A, "tensor_parallel_lab.html"), encoding="utf-8").read()
        assert course not in html and "/tmp/" not in html, f"the feedback of {student} shows a path of this machine"
        # long message lines wrap at the page's edge (nbconvert's <pre> would cut them off there)
        assert "white-space: pre-wrap" in html and "div.output_subarea pre" in html, student
    # nothing changed: nothing is graded again
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0 and "5 submission(s), 0 graded" in proc.stdout, proc.stdout[-2000:]
    # carol fixes her notebook: only hers is graded again
    write_submission(course, "carol", reference(course))
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0 and "5 submission(s), 1 graded" in proc.stdout, proc.stdout[-2000:]
    assert gradebook(course)["carol"] == {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0}
    write_submission(course, "carol", edit(reference(course), "tp_mappings", lambda s: s.replace(*WRONG)))


def test_three_shards_merged_give_the_single_run_and_merging_twice_changes_nothing(sequential):
    # every student in exactly one shard; no shard writes the gradebook; the merge gives the gradebook of a
    # single run (the parallel run above is held to it), and merging again changes nothing
    assert sequential["shard_students"] == ["alice", "bob", "carol", "dave", SHARD_NAMED]
    assert sequential["book_before_merge"] == {}, "a shard must not write the gradebook"
    assert sequential["book"] == {s: {c: float(p) for c, p in cells.items()}
                                  for s, cells in _scores(sequential["records"]).items()}
    assert sequential["book_merged_twice"] == sequential["book"]


def test_submissions_that_cannot_be_graded_get_a_reason_and_the_others_are_graded(course, tmp_path):
    bad = {
        "erin": lambda: [write_submission(course, "erin", reference(course), name="a.ipynb"),
                         write_submission(course, "erin", release(course), name="b.ipynb")],
        "frank": lambda: write_submission(course, "frank", '{"cells": [ this is not json'),
        "grace": lambda: write_submission(course, "grace", json.load(open(
            os.path.join(course, "release", "01_data_parallel", "data_parallel_lab.ipynb")))),
        "heidi": lambda: write_submission(course, "heidi", _duplicate_cell(reference(course))),
        "ivan": lambda: os.makedirs(os.path.join(course, "submitted", "ivan", A), exist_ok=True),
    }
    from autograder.grading.intake import shown_name

    # folder names that cannot name a student's files: 250 characters (a folder can be named so, but not
    # <name>.ipynb or <name>.json.tmp: Errno 36 failed the whole command, and every later run), a terminal escape
    names = {"s" * 250: "the student folder name is 250 characters long (250 bytes in UTF-8; at most 128 bytes "
                        "are graded: the records and feedback are named by it): rename the student's folder in "
                        "submitted/ and grade again",
             "eve\x1b[2J": "the student folder name eve\\x1b[2J has a character that cannot be printed "
                           "('\\x1b' at position 4 of 7): rename the student's folder in submitted/ and grade again"}
    for make in bad.values():
        make()
    for name in names:
        write_submission(course, name, reference(course))
    try:
        for run in ("first", "later"):
            proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
            assert proc.returncode == 0, run + proc.stdout[-3000:] + proc.stderr[-3000:]
            recs = records(course)
            reasons = {s: recs[s]["reason"] for s in bad}
            assert "2 notebooks (a.ipynb, b.ipynb)" in reasons["erin"]
            assert "is not a valid notebook" in reasons["frank"]
            assert "assignment 01_data_parallel's notebook" in reasons["grace"]
            assert "appear more than once" in reasons["heidi"]
            assert "no notebook" in reasons["ivan"]
            table = " ".join(proc.stdout.split())
            for s in bad:
                assert recs[s]["score"] == 0 and recs[s]["status"] == "rejected"
                assert f"NOT GRADED: {reasons[s][:40]}" in table  # the table, wrapped
            for name, reason in names.items():  # the log line and the table, the name shown cut and escaped
                shown = shown_name(name)
                assert f"\u2717 {shown}: {reason}" in proc.stdout, run + proc.stdout[-3000:]
                assert f"{shown} 0.0 / 12 NOT GRADED: {reason}" in table
            assert "\x1b" not in proc.stdout, "a student's folder name wrote a terminal escape"
            # no file is named by them, and no gradebook entry (the others: as always)
            assert sorted(recs) == sorted(["alice", "bob", "carol", "dave", SHARD_NAMED, *bad]), sorted(recs)
            assert not [n for n in os.listdir(os.path.join(course, "feedback")) if n in names]
            assert recs["alice"]["score"] == 12 and recs["alice"]["status"] == "graded"  # everyone else: graded
            book = gradebook(course)
            assert book["frank"] == {"test_copy_to_region": 0.0, "test_reduce_from_region": 0.0}  # gradebook too
            assert not set(names) & set(book)
    finally:
        import shutil

        for s in [*bad, *names]:
            shutil.rmtree(os.path.join(course, "submitted", s))
        for s in bad:
            os.remove(os.path.join(course, "graded", A, f"{s}.json"))


def _duplicate_cell(nb: dict) -> dict:
    import copy

    cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "tp_mappings")
    nb = copy.deepcopy(nb)
    nb["cells"].append(copy.deepcopy(cell))
    return nb


def test_exports_gradescope_results_and_the_csv_of_one_assignment_where_the_instructor_says(course):
    import datetime
    import warnings

    from course import secret_lines
    from nbgrader.api import Gradebook

    import nbformat

    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout[-2000:]
    # the gradebook also holds another assignment (submitted by alice only) and a due date for this one
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(course, "gradebook.db")) as gb:
            gb.update_or_create_assignment("01_data_parallel")
            gb.update_or_create_submission("01_data_parallel", "alice")
            gb.update_or_create_assignment(A, duedate=datetime.datetime(2026, 1, 20, 23, 59))
    proc = run_grade(course, "export", A, "--gradescope", "exports/gradescope", "--csv", "exports/grades.csv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = os.path.join(course, "exports", "gradescope")
    source = nbformat.read(os.path.join(course, "source", A, notebook_name(course)), as_version=4)
    hidden = secret_lines(source)[1]
    assert hidden
    for student in ("alice", "bob", "carol", "dave"):
        with open(os.path.join(out, A, student, "results.json"), encoding="utf-8") as f:
            text = f.read()
        data = json.loads(text)
        # Gradescope's autograder results format: a total, and tests with a name, score and max_score
        assert set(data) >= {"score", "tests"} and isinstance(data["score"], (int, float))
        for t in data["tests"]:
            assert isinstance(t["name"], str) and t["name"].startswith("Exercise 1 \u00b7 ")
            assert isinstance(t["score"], (int, float)) and isinstance(t["max_score"], (int, float))
            assert t["visibility"] in ("visible", "hidden", "after_due_date", "after_published")
            assert 0 <= t["score"] <= t["max_score"]
        assert abs(sum(t["score"] for t in data["tests"]) - data["score"]) < 1e-9
        assert not [line for line in hidden if line in text], f"hidden test text in {student}'s results.json"
    assert json.loads(open(os.path.join(out, A, "alice", "results.json")).read())["score"] == 12
    # the CSV: this assignment's submissions only (the gradebook's), with the student's own submission time
    rows = {r["student_id"]: r for r in _csv(os.path.join(course, "exports", "grades.csv"))}
    assert {r["assignment"] for r in rows.values()} == {A}, "rows of another assignment in the CSV"
    assert set(rows) == set(gradebook(course)), "one row per submission of the assignment"
    assert {s: (rows[s]["timestamp"], float(rows[s]["score"]), rows[s]["late"]) for s in STAMPS | {"bob": 0}} == {
        "alice": ("2026-01-15 09:30:00", 12.0, "no"), "carol": ("2026-01-25 18:00:00", 6.0, "yes"),
        "bob": ("", 0.0, "no")}
    assert "wrote exports/grades.csv:" in proc.stdout
    assert _untracked(course) == [], "files left in the course repository (not ignored by git)"


# Canvas's gradebook import, as Canvas documents and parses it (lib/gradebook_importer.rb): these student
# columns, in this order, then one column per assignment, "<name> (<Canvas assignment id>)"
CANVAS_IMPORT_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
LMS_CSV_COLUMNS = ["student_id", "first_name", "last_name", "email", "score", "max_score", "late", "needs_regrade"]


def _rows(path) -> list[list[str]]:
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


@contextlib.contextmanager
def _gradebook_as(course: str, *, students: dict | None = None, undecided: dict | None = None, duedate=None):
    """The course's gradebook and records changed for one test, then put back as they were: students' fields
    (nbgrader's Student table), cells "needs regrade (infrastructure)" as autograde records them (no score in the
    gradebook, the record's `needs_regrade`), the assignment's due date."""
    import shutil
    import warnings

    from nbgrader.api import Gradebook

    db = os.path.join(course, "gradebook.db")
    saved = {db: open(db, "rb").read()}
    for student in undecided or {}:
        path = os.path.join(course, "graded", A, f"{student}.json")
        saved[path] = open(path, "rb").read()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Gradebook("sqlite:///" + db) as gb:
                for student, fields in (students or {}).items():
                    gb.update_or_create_student(student, **fields)
                for student, cells in (undecided or {}).items():
                    for cell in cells:
                        grade = gb.find_grade(cell, notebook_name(course)[:-6], A, student)
                        grade.auto_score, grade.needs_manual_grade = None, True
                    gb.db.commit()
                if duedate:
                    gb.update_or_create_assignment(A, duedate=duedate)
        for student, cells in (undecided or {}).items():
            path = os.path.join(course, "graded", A, f"{student}.json")
            rec = json.loads(saved[path])
            rec["needs_regrade"] = list(cells)
            for c in rec["cells"]:
                if c["grade_id"] in cells:
                    c.update(points=0, passed=False, inconclusive=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(rec, f)
        yield
    finally:
        for path, data in saved.items():
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            shutil.move(path + ".tmp", path)


def _graded(course: str) -> None:
    """The class graded (incrementally: only what is not graded yet)."""
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_grades_go_back_to_canvas_as_its_gradebook_import_named_by_its_own_export(course, tmp_path):
    """`export --canvas` with Canvas's gradebook export as the roster: Canvas's import header, the roster's Student,
    ID, SIS and Section values kept, the assignment's column filled; a student missing from the roster named; a
    score that needs regrade (infrastructure) left blank and named, never a number."""
    _graded(course)
    roster = tmp_path / "2026-02-01T1200_Grades-LLM_Parallelism.csv"  # Canvas: Grades > Export > Entire Gradebook
    roster.write_text(
        "\ufeffStudent,ID,SIS User ID,SIS Login ID,Section,01 Data parallel (11111),02 Tensor parallel (12345),"
        "Current Points,Final Points,Current Score,Final Score\n"
        "    Points Possible,,,,,100.00,12.00,(read only),(read only),(read only),(read only)\n"
        '"Liddell, Alice",2001,S-0001,alice.l,Section 1,88.00,,88.00,88.00,88.00,88.00\n'  # by ID (lms_user_id)
        '"Builder, Bob",2002,bob,b.builder,Section 2,,,0.00,0.00,0.00,0.00\n'  # by SIS User ID (nbgrader id)
        '"Carroll, Carol",2003,S-0003,carol@uni.edu,Section 1,,,0.00,0.00,0.00,0.00\n'  # by SIS Login ID (email)
        '"Zed, Zoe",2004,S-0004,zoe,Section 2,,,0.00,0.00,0.00,0.00\n'  # enrolled, no submission
        '"Student, Test",2005,,,Section 1,,,0.00,0.00,0.00,0.00\n', encoding="utf-8")  # dave: not enrolled
    out = os.path.join(course, "exports", "canvas-import.csv")
    with _gradebook_as(course, students={"alice": {"lms_user_id": "2001"}, "carol": {"email": "carol@uni.edu"}},
                       undecided={"carol": ["test_reduce_from_region"]}):
        t0 = time.monotonic()
        proc = run_grade(course, "export", A, "--canvas", "exports/canvas-import.csv", "--canvas-assignment-id",
                         "12345", "--canvas-roster", str(roster))
        took = time.monotonic() - t0
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = _rows(out)
        # without the Canvas assignment's id: a clear error, nothing written
        os.remove(out)
        missing_id = run_grade(course, "export", A, "--canvas", "exports/canvas-import.csv")
    assert rows[0] == CANVAS_IMPORT_COLUMNS + ["02 Tensor parallel (12345)"], rows[0]  # Canvas's own column name
    assert rows[1] == ["Points Possible", "", "", "", "", "12"]
    by_id = {r[1]: r for r in rows[2:]}
    assert by_id["2001"] == ["Liddell, Alice", "2001", "S-0001", "alice.l", "Section 1", "12"]
    assert by_id["2002"] == ["Builder, Bob", "2002", "bob", "b.builder", "Section 2", "0"]
    # carol's reduce cell was not decided: no score for her, a blank cell (not the 0 of her other cell)
    assert by_id["2003"] == ["Carroll, Carol", "2003", "S-0003", "carol@uni.edu", "Section 1", ""]
    assert set(by_id) == {"2001", "2002", "2003"}, "only students with a submission; the others Canvas keeps"
    said = " ".join(proc.stdout.split())
    assert "needs regrade (infrastructure), no score exported: 1 student(s), their score left blank: carol " \
           "(test_reduce_from_region)" in said, said
    assert "not exported, Canvas would not know them:" in said and "dave (not in the roster)" in said, said
    assert "in the roster without a submission of 02_tensor_parallel (no row: Canvas keeps what it has): 2 " \
           "student(s): Zed, Zoe; Student, Test" in said, said
    assert missing_id.returncode != 0 and not os.path.exists(out)
    assert "--canvas needs --canvas-assignment-id: the assignment's id in Canvas" in missing_id.stderr
    assert _untracked(course) == [], "files left in the course repository (not ignored by git)"
    print(f"\nexport --canvas with a roster: {took:.1f} s")


def test_the_lms_csv_has_the_gradebook_s_names_and_emails_and_no_undecided_score(course):
    """`export --lms-csv`: one row per student of the assignment, names and emails from nbgrader's gradebook
    (its Student table, as `nbgrader db student import` fills it) where it has them, empty where not."""
    import datetime

    _graded(course)
    alice = {"first_name": "Alice", "last_name": "Liddell", "email": "alice@uni.edu"}
    with _gradebook_as(course, students={"alice": alice}, undecided={"dave": ["test_copy_to_region"]},
                       duedate=datetime.datetime(2026, 1, 20, 23, 59)):
        proc = run_grade(course, "export", A, "--lms-csv", "exports/grades-lms.csv")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(os.path.join(course, "exports", "grades-lms.csv"))
    assert rows[0] == LMS_CSV_COLUMNS
    by_student = {r[0]: r for r in rows[1:]}
    assert by_student["alice"] == ["alice", "Alice", "Liddell", "alice@uni.edu", "12", "12", "no", ""]
    assert by_student["bob"] == ["bob", "", "", "", "0", "12", "no", ""]
    assert by_student["carol"] == ["carol", "", "", "", "6", "12", "yes", ""]  # submitted after the due date
    assert by_student["dave"] == ["dave", "", "", "", "", "12", "no", "test_copy_to_region"]  # no score: blank
    assert "wrote exports/grades-lms.csv:" in proc.stdout
    assert "dave (test_copy_to_region)" in proc.stdout
    assert _untracked(course) == [], "files left in the course repository (not ignored by git)"


def test_a_canvas_export_that_cannot_be_right_is_refused_with_the_reason_before_anything_is_written(tmp_path):
    """No Canvas import written from a roster that is not Canvas's gradebook export, for a Canvas assignment id
    that is not a number or not in the roster (Canvas would make a new assignment of the column), or for two
    assignments at once (an import column has one id). Checked before the gradebook is read: no course needed."""
    from autograder.grading.exports import export

    other_tool = tmp_path / "other.csv"
    other_tool.write_text("Name,Email,Grade\nAlice,alice@uni.edu,12\n", encoding="utf-8")
    canvas = tmp_path / "canvas.csv"
    canvas.write_text("Student,ID,SIS User ID,SIS Login ID,Section,01 Data parallel (11111)\n"
                      '"Liddell, Alice",2001,S-0001,alice,Section 1,88.00\n', encoding="utf-8")
    out = tmp_path / "exports" / "import.csv"
    cases = {
        "is not Canvas's gradebook export: its first row starts Name, Email, Grade; Canvas's starts Student, ID, SIS "
        "User ID, SIS Login ID, Section": ([A], dict(canvas_assignment_id="12345", canvas_roster=str(other_tool))),
        "Canvas assignment 12345 is not a column of --canvas-roster": (
            [A], dict(canvas_assignment_id="12345", canvas_roster=str(canvas))),
        "--canvas-assignment-id 'tp-02': Canvas's assignment ids are numbers": (
            [A], dict(canvas_assignment_id="tp-02")),
        "--canvas needs --canvas-assignment-id": ([A], {}),
        "--canvas writes one assignment's grades: name one assignment (not 2)": (
            [A, "03_pipeline_parallel"], dict(canvas_assignment_id="12345")),
    }
    for message, (assignments, options) in cases.items():
        with pytest.raises(SystemExit) as exc:
            list(export(str(tmp_path), assignments, canvas=str(out), **options))
        assert message in str(exc.value), (message, str(exc.value))
        assert not out.exists()
    with pytest.raises(SystemExit, match="--canvas-assignment-id and --canvas-roster go with --canvas FILE"):
        list(export(str(tmp_path), [A], canvas_roster=str(canvas)))


def test_a_canvas_download_is_collected_with_nbgrader_zip_collect_and_graded(course):
    """Canvas names each file <login>_<user id>_<submission id>_<the student's file name> (LATE_ after the login)."""
    archive = os.path.join(course, "downloaded", A, "archive")
    os.makedirs(archive, exist_ok=True)
    with zipfile.ZipFile(os.path.join(archive, "submissions.zip"), "w") as z:
        z.writestr("judy_123_456_tensor_parallel_lab.ipynb", json.dumps(reference(course)))
        z.writestr("kim_LATE_789_1011_tensor_parallel_lab.ipynb", json.dumps(release(course)))
    env = __import__("grading_course").env(course)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "zip_collect", A, "--force",
                           "--log-level=ERROR"], cwd=course, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for student in ("judy", "kim"):
        assert os.path.exists(os.path.join(course, "submitted", student, A, "tensor_parallel_lab.ipynb")), student
    with open(os.path.join(course, "downloaded", A, "canvas-late.json"), encoding="utf-8") as f:
        assert json.load(f) == {"kim": "kim_LATE_789_1011_tensor_parallel_lab.ipynb"}, "Canvas's LATE marker"
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout[-2000:]
    recs = records(course)
    assert recs["judy"]["score"] == 12 and recs["kim"]["score"] == 0
    proc = run_grade(course, "export", A, "--csv", "exports/canvas.csv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["student_id"]: r for r in _csv(os.path.join(course, "exports", "canvas.csv"))}
    # Canvas gives no submission time: the timestamp stays empty (not the grading time), LATE is kept
    assert {s: (rows[s]["timestamp"], rows[s]["late"], float(rows[s]["score"])) for s in ("judy", "kim")} == {
        "judy": ("", "no", 12.0), "kim": ("", "yes", 0.0)}
    # the grades go back: Canvas's user ids, read from its file names, name the students in its gradebook import
    with open(os.path.join(course, "downloaded", A, "canvas-users.json"), encoding="utf-8") as f:
        assert json.load(f) == {"judy": "123", "kim": "789"}
    proc = run_grade(course, "export", A, "--canvas", "exports/canvas-import.csv", "--canvas-assignment-id", "777")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(os.path.join(course, "exports", "canvas-import.csv"))
    assert rows[0] == CANVAS_IMPORT_COLUMNS + [f"{A} (777)"]
    assert rows[1:] == [["Points Possible", "", "", "", "", "12"], ["judy", "123", "", "", "", "12"],
                        ["kim", "789", "", "", "", "0"]]
    assert "alice (no Canvas user id)" in proc.stdout  # collected otherwise: named, not exported
    assert _untracked(course) == [], "files left in the course repository (not ignored by git)"


def test_a_second_grading_command_is_told_who_holds_the_lock(course):
    from autograder.grading.classrun import course_lock

    with course_lock(course):
        t0 = time.monotonic()
        proc = run_grade(course, "autograde", A, "--quiet")
    assert proc.returncode != 0 and time.monotonic() - t0 < 30
    assert "another grading command holds the course's lock (pid" in proc.stdout + proc.stderr


def _worker_of(student: str) -> int | None:
    """The grading worker (a spawned multiprocessing process) whose sandbox is running `student`'s cells: a
    fork of the worker's fork server, in cgroups named `<worker's pid>-<n>-<n>-<student>`, or a fresh sandbox's
    zygote, whose command line names the student's inputs."""
    for parent in ("/sys/fs/cgroup/pids/autograder", "/sys/fs/cgroup/autograder"):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            owner = name.split("-", 1)[0]
            try:
                running = open(os.path.join(parent, name, "cgroup.procs")).read().split()
                cmd = open(f"/proc/{owner}/cmdline", "rb").read()
            except OSError:
                continue
            if name.endswith(f"-{student}") and running and b"multiprocessing" in cmd:
                return int(owner)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if "_zygote_main" not in cmd or f"/{student}/inputs" not in cmd:
            continue
        p = int(pid)
        for _ in range(12):  # up the chain: inner bubblewrap, the drop, the outer bubblewrap, the worker
            try:
                with open(f"/proc/{p}/stat") as f:
                    p = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if b"multiprocessing" in f.read():
                        return p
            except (OSError, ValueError):
                return None
    return None


def test_a_worker_that_dies_is_replaced_and_its_submission_graded_once_more(course):
    """A worker killed while grading (as the kernel's OOM killer would) costs nothing: its submission is
    graded again by a new worker; a submission whose worker dies twice gets the reason, the others are
    graded, and the command exits non-zero."""
    import signal
    import threading

    slow = edit(reference(course), "tp_mappings", lambda s: s + "\nimport time as _t\n_t.sleep(4)\n")
    for student in ("kill-once", "kill-twice"):
        write_submission(course, student, slow)
    # bob adds a note to his notebook: graded again beside them (the unchanged others are not)
    noted = release(course)
    noted["cells"].append({"cell_type": "code", "execution_count": None, "id": "bobs-note", "metadata": {},
                           "outputs": [], "source": "# bob: try again after the lecture"})
    write_submission(course, "bob", noted)
    kills = {"kill-once": 1, "kill-twice": 2}
    done = threading.Event()

    def killer():
        seen: set = set()
        while not done.is_set():
            for student, left in kills.items():
                pid = _worker_of(student) if left else None
                if pid and pid not in seen:
                    seen.add(pid)
                    kills[student] -= 1
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    finally:
        done.set()
        thread.join()
        for student in kills:
            import shutil

            shutil.rmtree(os.path.join(course, "submitted", student))
    recs = records(course)
    try:
        assert kills == {"kill-once": 0, "kill-twice": 0}, kills
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert recs["kill-once"]["status"] == "graded" and recs["kill-once"]["score"] == 12
        assert "kill-once: the grading worker died while grading this submission" in proc.stdout
        assert recs["kill-twice"]["status"] == "error"
        assert "died while grading this submission" in recs["kill-twice"]["reason"] and \
            "twice" in recs["kill-twice"]["reason"]
        assert "1 submission(s) could not be graded" in proc.stdout and "kill-twice" in proc.stdout
        assert recs["bob"]["status"] == "graded" and recs["bob"]["score"] == 0  # the others: graded
        assert recs["alice"]["score"] == 12
    finally:
        for student in kills:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(course, "graded", A, f"{student}.json"))


def test_a_forked_worker_has_the_environment_of_its_run_not_of_its_fork_server(course, tmp_path, monkeypatch):
    """The workers are forked from multiprocessing's fork server (it imported torch and the grader once), which
    keeps the environment it started with; each worker gets the grading process's own at its start. Two runs in
    one process: the second, with AUTOGRADER_FORK_SERVER=0, grades on a fresh sandbox, from the same server.
    A forked worker ends without Python's exit functions: it stops its sandbox's fork server and removes its
    scratch folders itself (in TMPDIR, here a folder of the test's own)."""
    import multiprocessing.forkserver as mp_forkserver

    from autograder.grading.classrun import grade_class

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))

    def run(name):
        return grade_class(course, A, jobs=1, shard=(1, 1), out=str(tmp_path / name), students=["alice"],
                           progress=False, force=True)[0]

    first = run("first.json")
    server = mp_forkserver._forkserver._forkserver_pid
    assert server is not None, "the worker was not forked from multiprocessing's fork server"

    def ours():  # (torch keeps its compile cache there too: torchinductor_<user>)
        return sorted(p.name for p in scratch.iterdir() if p.name.startswith("autograder-"))

    left = ours()
    monkeypatch.setenv("AUTOGRADER_FORK_SERVER", "0")
    second = run("second.json")
    assert mp_forkserver._forkserver._forkserver_pid == server
    assert (first["sandbox"], second["sandbox"]) == ("forked", "fresh")
    assert first["score"] == second["score"] == 12
    assert left == [] and ours() == [], f"a worker's scratch folders outlived it: {left or ours()}"


def test_a_second_backend_run_is_a_note_per_cell_never_points(course, tmp_path):
    """On a GPU grading node every test cell runs again with NCCL (`--nccl`): a note per cell in the table,
    the feedback and results.json, never points. The same machinery, run here with gloo as the second backend
    (no GPU on this machine), shows the notes reach every place and leave the scores alone."""
    import io
    from contextlib import redirect_stdout

    from autograder.grading.classrun import grade_class
    from autograder.grading.cli import print_records
    from autograder.grading.exports import cell_titles, gradescope_results

    recs = {r["student"]: r for r in grade_class(course, A, jobs=2, shard=(1, 1), out=str(tmp_path / "s.json"),
                                                  students=["alice", "carol"], progress=False, force=True,
                                                  second_backend="gloo")}
    assert recs["alice"]["score"] == 12 and recs["carol"]["score"] == 6  # the same points as without it
    notes = {s: {c["grade_id"]: c.get("backend_note") for c in r["cells"]} for s, r in recs.items()}
    assert all(n.startswith("gloo: passed (") and n.endswith("not graded)") for n in notes["alice"].values())
    assert notes["carol"]["test_copy_to_region"].startswith("gloo: FAILED (not graded): ")
    assert notes["carol"]["test_reduce_from_region"].startswith("gloo: passed")
    assert "gloo: FAILED (not graded)" in recs["carol"]["feedback_html"]
    source = json.load(open(os.path.join(course, "source", A, notebook_name(course))))
    out = gradescope_results(recs["carol"], cell_titles(source))
    assert any("gloo: FAILED (not graded)" in t["output"] for t in out["tests"])
    buf = io.StringIO()
    with redirect_stdout(buf):
        print_records(list(recs.values()), course)
    table = " ".join(buf.getvalue().split())
    assert "note: test_copy_to_region: gloo: FAILED (not graded)" in table
    assert "note: gloo: every cell passed (not graded)" in table


def test_the_nccl_cases_say_why_they_are_skipped_in_one_line(course):
    """No CUDA device here: `auto` grades as usual after one line saying why; `on` refuses with the reason."""
    proc = run_grade(course, "autograde", A, "--quiet")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("NCCL cases:")]
    assert skipped == ["NCCL cases: skipped: no CUDA device on this machine; every check runs with gloo on the CPU "
                       "(the only graded run)"], proc.stdout
    proc = run_grade(course, "autograde", A, "--quiet", "--nccl", "on")
    assert proc.returncode != 0 and "--nccl on, but no CUDA device on this machine" in proc.stderr


def _tree_sums(root: str, *names: str) -> dict[str, str]:
    """relative path -> sha256 of every file under root/<name> (a file or a folder)."""
    import hashlib

    out = {}
    for name in names:
        top = os.path.join(root, name)
        paths = [top] if os.path.isfile(top) else [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs]
        for path in paths:
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_the_gpu_node_script_stops_at_once_saying_why_without_gpus(tmp_path):
    """cluster/gpu-check.sh, as an instructor runs it, in a copy of a course in use (a gradebook, records,
    feedback): on this machine's CPU-only torch it stops at once with exit status 2, saying it is a CPU-only
    build and which wheel to install, and builds and grades nothing; the course's gradebook.db, graded/ and
    feedback/ are byte for byte as before, and no scratch copy is left in the temporary folder."""
    import torch

    from course import VENV_BIN, copy_course

    root = copy_course(str(tmp_path / "course"))
    os.symlink(os.path.dirname(VENV_BIN), os.path.join(root, ".venv"))
    for rel, text in (("gradebook.db", "the course's gradebook"), (f"graded/{A}/alice.json", '{"score": 12}'),
                      (f"feedback/alice/{A}/tensor_parallel_lab.html", "<html>feedback</html>")):
        os.makedirs(os.path.dirname(os.path.join(root, rel)) or root, exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    before = _tree_sums(root, "gradebook.db", "graded", "feedback")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    t0 = time.monotonic()
    proc = subprocess.run(["bash", os.path.join(root, "cluster", "gpu-check.sh")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "MAKEFLAGS": "", "TMPDIR": str(scratch)})
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    if torch.version.cuda is None:  # this machine: PyTorch's CPU wheel
        assert proc.returncode == 2, out
        assert f"GPU node check: stopped: this torch ({torch.__version__}) is a CPU-only build" in proc.stdout, out
        assert "--index-url https://download.pytorch.org/whl/cu" in proc.stdout, out
    elif torch.cuda.device_count() == 0:
        assert proc.returncode == 2 and "build but sees no CUDA device" in proc.stdout, out
    else:
        pytest.skip("this machine has a GPU: cluster/gpu-check.sh is the GPU node's check (run it by hand)")
    assert "Nothing was built or graded." in proc.stdout and "Traceback" not in out, out
    assert took < 120, f"it stops at once ({took:.0f} s)"
    assert _tree_sums(root, "gradebook.db", "graded", "feedback") == before, "the course's results are untouched"
    assert not os.path.exists(os.path.join(root, "submitted")) and os.listdir(scratch) == []


def _with_saved_outputs(nb: dict, outputs: dict) -> dict:
    """`nb` as saved after the student ran its test cells: grade id -> the outputs the cell showed."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in outputs:
            cell["outputs"] = outputs[gid]
    return nb


def test_a_cell_whose_saved_output_disagrees_with_the_trusted_verdict_is_flagged(course):
    """The flag needs no second run: what the student saw when they last ran the notebook (its saved outputs)
    against the trusted verdict of the visible checks. Disagreeing cells need a manual look; the trusted
    verdict is the grade."""
    passed = [{"output_type": "stream", "name": "stdout", "text": "\u2713 Exercise 1 \u00b7 ... passed\n"}]
    failed = [{"output_type": "error", "ename": "NotImplementedError", "evalue": "Exercise 1 is not done yet",
               "traceback": []}]
    ref = reference(course)
    wrong = edit(ref, "tp_mappings", lambda s: s.replace(*WRONG))
    write_submission(course, "saw-fail-now-right", _with_saved_outputs(
        ref, {"test_copy_to_region": failed, "test_reduce_from_region": failed}))
    write_submission(course, "saw-pass-now-wrong", _with_saved_outputs(
        wrong, {"test_copy_to_region": passed, "test_reduce_from_region": passed}))
    write_submission(course, "saw-what-it-gets", _with_saved_outputs(
        wrong, {"test_copy_to_region": failed, "test_reduce_from_region": passed}))
    students = ("saw-fail-now-right", "saw-pass-now-wrong", "saw-what-it-gets")
    try:
        proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        recs = records(course)
        flags = {s: {c["grade_id"]: c["flagged"] for c in recs[s]["cells"]} for s in students}
        assert flags["saw-fail-now-right"] == {"test_copy_to_region": True, "test_reduce_from_region": True}
        assert flags["saw-pass-now-wrong"] == {"test_copy_to_region": True, "test_reduce_from_region": False}
        assert flags["saw-what-it-gets"] == {"test_copy_to_region": False, "test_reduce_from_region": False}
        assert recs["saw-pass-now-wrong"]["score"] == 6  # the trusted verdict is the grade
        assert "disagree on test_copy_to_region" in " ".join(proc.stdout.split())
        import warnings

        from nbgrader.api import Gradebook

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Gradebook("sqlite:///" + os.path.join(course, "gradebook.db")) as gb:
                grade = gb.find_grade("test_copy_to_region", notebook_name(course)[:-6], A, "saw-pass-now-wrong")
                assert grade.needs_manual_grade
                grade = gb.find_grade("test_copy_to_region", notebook_name(course)[:-6], A, "saw-what-it-gets")
                assert not grade.needs_manual_grade
    finally:
        import shutil

        for s in students:
            shutil.rmtree(os.path.join(course, "submitted", s), ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(course, "graded", A, f"{s}.json"))


def test_the_assignments_of_one_command_share_one_queue(tmp_path):
    """`autograde 01 02 --jobs 2`: every assignment's submissions go to the same two workers, so a class of
    one submission per assignment keeps both busy (graded one assignment after another, one worker idled
    while the other graded the last submission of each). The records, the gradebook and the table are per
    assignment as before; a submission of one assignment and one of the other are graded at the same time."""
    import datetime

    dp = "01_data_parallel"
    root = make_mini_course(tmp_path / "course", also={dp: ("test_all_reduce_gradients",)})
    write_submission(root, "alice", reference(root))
    write_submission(root, "alice", reference(root, dp), assignment=dp)
    write_submission(root, "bob", release(root, dp), assignment=dp)
    proc = run_grade(root, "autograde", dp, A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = " ".join(proc.stdout.split())
    assert f"{dp}: 2 submission(s), 2 graded" in table and f"{A}: 1 submission(s), 1 graded" in table, table
    assert "2 assignments graded in" in table and "(their submissions in one queue)" in table, table
    tp, ddp = records(root), records(root, dp)
    assert {s: r["score"] for s, r in tp.items()} == {"alice": 12.0}, tp
    assert {s: r["score"] for s, r in ddp.items()} == {"alice": 6.0, "bob": 0.0}, ddp
    assert gradebook(root) == {"alice": {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0}}
    assert gradebook(root, dp) == {"alice": {"test_all_reduce_gradients": 6.0},
                                   "bob": {"test_all_reduce_gradients": 0.0}}

    def span(rec):
        start = datetime.datetime.fromisoformat(rec["graded_at"]).timestamp()
        return start, start + rec["timings"]["total"]

    (s2, e2), spans = span(tp["alice"]), [span(r) for r in ddp.values()]
    assert any(s1 < e2 and s2 < e1 for s1, e1 in spans), (
        f"{A}'s submission ({s2:.1f}-{e2:.1f}) was graded alone, not beside one of {dp}'s: {spans}")


def test_an_undecided_check_is_graded_again_alone_then_needs_regrade_never_a_zero(tmp_path):
    """A check that neither finishes, fails, uses its CPU budget nor shows a deadlock before the runner's
    wall-clock backstop (here a student function idle in `time.sleep`, with the backstop cut to 2 s as a
    machine too busy to finish would reach it) is no verdict: the class command grades that submission again,
    alone, then records the cell as "needs regrade (infrastructure)": no points and no zero in the gradebook
    (nbgrader's "needs manual grade"), named in the table, `scores` and the record, "not graded yet" in the
    feedback, and graded again by the next run."""
    from autograder.grading.cli import gradebook_rows

    root = make_mini_course(tmp_path / "course")
    slow = edit(reference(root), "tp_mappings", lambda s: s.replace(
        '_group_size_rank(group, "copy_to_tensor_model_parallel_region")',
        'import time; time.sleep(3600)  # idle: neither computing nor communicating', 1))
    write_submission(root, "erin", slow)
    env = {**__import__("grading_course").env(root), "AUTOGRADER_BACKSTOP_S": "2"}

    def autograde():
        proc = subprocess.run([sys.executable, "-m", "autograder.grade", "autograde", A, "--jobs", "2", "--quiet"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return " ".join(proc.stdout.split())

    table = autograde()
    assert "1 submission(s) had checks the machine was too busy to decide; grading them again, one at a time" in table
    rec = records(root)["erin"]
    cells = {c["grade_id"]: c for c in rec["cells"]}
    assert rec["needs_regrade"] == ["test_copy_to_region"], rec["needs_regrade"]
    undecided = cells["test_copy_to_region"]
    assert undecided["points"] == 0 and undecided["inconclusive"] and not undecided["flagged"]
    assert undecided["message"].startswith("not graded yet: the grading machine was too busy"), undecided["message"]
    assert "inconclusive" in undecided["message"] and "deadlock:" not in undecided["message"]
    assert cells["test_reduce_from_region"]["points"] == 6.0  # the other cell is graded as usual
    assert "NEEDS REGRADE (infrastructure): test_copy_to_region" in table, table
    row = next(r for r in gradebook_rows(root) if r["student"] == "erin")
    assert row["needs_regrade"] == ["test_copy_to_region"] and row["lost"] == [], row
    assert gradebook(root)["erin"]["test_copy_to_region"] == 0.0  # nbgrader's sum counts no score as 0 ...
    import warnings

    from nbgrader.api import Gradebook

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            grade = gb.find_grade("test_copy_to_region", notebook_name(root)[:-6], A, "erin")
            assert grade.auto_score is None and grade.needs_manual_grade  # ... but no 0 was given: to be graded
    scores = " ".join(run_grade(root, "scores").stdout.split())
    assert "NEEDS REGRADE (infrastructure): test_copy_to_region" in scores, scores
    html_text = open(os.path.join(root, rec["feedback"]), encoding="utf-8").read()
    assert "not graded yet: the grading machine was too busy" in html_text
    # Gradescope's results (the export, and an upload graded there): the undecided test has no score and no status
    from autograder.grading.exports import cell_titles, gradescope_results

    source = json.load(open(os.path.join(root, "source", A, notebook_name(root)), encoding="utf-8"))
    results = gradescope_results(rec, cell_titles(source))
    tests = {t["name"]: t for t in results["tests"]}
    undecided_test = tests[cell_titles(source)["test_copy_to_region"]]
    assert "score" not in undecided_test and "status" not in undecided_test, undecided_test
    assert undecided_test["output"].startswith("not graded yet")
    assert results["output"].startswith("Not graded yet: the grading machine was too busy to decide 1 check(s)")
    assert results["extra_data"] == {"needs_regrade": ["test_copy_to_region"]} and results["score"] == 6.0
    # the next run grades it again: the rule that keeps an unchanged submission's record does not keep this one
    from autograder.grading.classrun import still_valid

    assert not still_valid(rec, rec["hash"], rec["fingerprint"], None)
    assert still_valid(dict(rec, needs_regrade=[]), rec["hash"], rec["fingerprint"], None)
