"""Intake's bounds and the grader's own namespace, without grading anything (each test a few seconds).

    .venv/bin/python -m pytest -q tests/test_intake.py

- a notebook too large to take in (cells, JSON values, distinct grading ids, bytes) is refused quickly, with a
  reason that names what is wrong, the limit and the count; finding copied cells is one pass over the ids;
- a student folder whose name cannot name files (too long, a character that cannot be printed, not UTF-8) is
  refused with the reason, before any path is built from it;
- shard files live apart from the students' records: a student named like one is merged like anyone, merging
  twice changes nothing, and a record never stands in for a shard file;
- `scores` lists the cells that lost points in the notebook's order, as `autograde` does.

The class runs with these students (real nbgrader, the sandbox) are in tests/test_grading.py.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time

import pytest

from autograder.grading import classrun, intake
from course import ROOT

A = "02_tensor_parallel"
NB = "tensor_parallel_lab.ipynb"


def _release() -> dict:
    with open(os.path.join(ROOT, "release", A, NB), encoding="utf-8") as f:
        return json.load(f)


def _cell(i: int, grade_id: str | None = None) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": f"x{i}",
            "metadata": {"nbgrader": {"grade_id": grade_id}} if grade_id else {}, "outputs": [], "source": ""}


def _submit(tmp_path, nb, student: str = "alice") -> str:
    folder = tmp_path / "submitted" / student / A
    folder.mkdir(parents=True)
    (folder / NB).write_text(nb if isinstance(nb, str) else json.dumps(nb), encoding="utf-8")
    return str(folder)


def _check(folder: str, student: str = "alice") -> intake.Intake:
    return intake.check_submission(folder, _release(), NB, {}, student=student)


@pytest.mark.timeout(120)
def test_a_notebook_of_80000_distinct_grading_ids_is_refused_at_once_by_its_cell_count(tmp_path):
    """The red team's notebook (150,000 cells, each a distinct grade id, 22.8 MB: now over the size bound)
    stalled intake for good: finding copied cells counted every id in the whole list (quadratic). Under the size
    bound, the cell count refuses it before anything per cell. (The old code does not finish: 63 s at 40,000.)"""
    nb = _release()
    nb["cells"] += [_cell(i, f"g{i}") for i in range(80_000)]
    text = json.dumps(nb)
    assert len(text) < intake.MAX_BYTES  # under the size bound: the cells are what is refused
    out = _check(_submit(tmp_path, text))
    assert out.notebook is None
    assert out.reason == (f"{NB} is too large to grade: it has {len(nb['cells']):,} cells (at most "
                          f"{intake.MAX_CELLS:,} are graded, the release has {len(_release()['cells'])}): delete the "
                          f"cells you added and submit again")


@pytest.mark.timeout(120)
def test_more_distinct_grading_ids_than_the_bound_are_refused_naming_the_limit_and_the_count(tmp_path):
    nb = _release()
    extra = intake.MAX_GRADE_IDS + 100
    nb["cells"] += [_cell(i, f"g{i}") for i in range(extra)]
    assert len(nb["cells"]) <= intake.MAX_CELLS
    out = _check(_submit(tmp_path, nb))
    release_ids = sum(1 for c in _release()["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id"))
    assert out.notebook is None
    assert out.reason.startswith(f"{NB} has {release_ids + extra:,} different grading ids (nbgrader's grade_id; "
                                 f"at most {intake.MAX_GRADE_IDS:,} are graded, the release has {release_ids})")


@pytest.mark.timeout(120)
def test_a_notebook_at_the_bounds_is_graded(tmp_path):
    """Just under every bound (cells, distinct ids): taken in, the release's cells graded, the rest kept."""
    nb = _release()
    ids = sum(1 for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id"))
    nb["cells"] += [_cell(i, f"g{i}" if i < intake.MAX_GRADE_IDS - ids else None)
                    for i in range(intake.MAX_CELLS - len(nb["cells"]))]
    out = _check(_submit(tmp_path, nb))
    assert out.reason is None and out.notebook is not None
    assert len(out.notebook["cells"]) == intake.MAX_CELLS


class _CountedId(str):
    """A grading id that counts how often it is compared or hashed (the work of finding duplicates)."""

    calls = 0

    def __eq__(self, other):
        type(self).calls += 1
        return str.__eq__(self, other)

    def __hash__(self):
        type(self).calls += 1
        return str.__hash__(self)


@pytest.mark.timeout(120)
def test_finding_copied_cells_is_one_pass_over_the_ids():
    """Counted, not timed: with n ids, a constant number of comparisons and hashes per id (the old code compared
    every id with every other: n * n)."""
    for n in (1_000, 4_000):
        ids = [_CountedId(f"g{i}") for i in range(n)] + [_CountedId("g7"), _CountedId("g3")]
        _CountedId.calls = 0
        assert intake.duplicate_ids(ids) == ["g3", "g7"]
        assert _CountedId.calls <= 4 * len(ids), (n, _CountedId.calls)


@pytest.mark.timeout(120)
def test_a_notebook_of_too_many_json_values_is_refused_before_validation(tmp_path):
    """Few cells, but an output of 250,000 lines: nbformat's validation walks each (tens of seconds)."""
    nb = _release()
    cell = _cell(0)
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["a\n"] * 250_000}]
    nb["cells"].append(cell)
    out = _check(_submit(tmp_path, nb))
    assert out.notebook is None
    assert out.reason.startswith(f"{NB} is too large to grade: it holds ")
    assert f"JSON values (lines, strings, numbers, lists, objects; at most {intake.MAX_JSON_VALUES:,} are graded)" \
        in out.reason


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path):
    folder = _submit(tmp_path, "{}")
    with open(os.path.join(folder, NB), "r+b") as f:
        f.truncate(intake.MAX_BYTES + 2**20)  # sparse: nothing to read, and it is never read
    out = _check(folder)
    assert out.reason.startswith(f"{NB} is {(intake.MAX_BYTES + 2**20) / 2**20:.1f} MiB (at most "
                                 f"{intake.MAX_BYTES // 2**20} MiB are graded)")


@pytest.mark.parametrize("name, words", [
    ("x" * 250, "is 250 characters long (250 bytes in UTF-8; at most 128 bytes are graded"),
    ("\u5f20" * 50, "is 50 characters long (150 bytes in UTF-8; at most 128 bytes are graded"),
    ("eve\x1b[2J", "has a character that cannot be printed ('\\x1b' at position 4 of 7)"),
    ("bob\nalice", "has a character that cannot be printed ('\\n' at position 4 of 9)"),
    ("carol\udcff", "is not valid UTF-8 (position 5 of 6)"),
    (".hidden", "starts with a dot"),
], ids=["250-chars", "150-bytes", "escape", "newline", "not-utf8", "dot"])
def test_a_student_folder_name_that_cannot_name_files_is_refused_with_the_reason(tmp_path, name, words):
    why = intake.student_name_problem(name)
    assert why is not None and words in why and "rename the student's folder in submitted/" in why, why
    shown = intake.shown_name(name)
    assert len(shown) <= 40 and shown.isprintable()
    shown.encode("utf-8")


def test_usual_student_names_are_fine():
    for name in ("alice", "s123456", "j.doe@uni.example.org", "Zhang San", "\u5f20\u4e09", "shard-2-of-2",
                 "kill-once", "a" * 128):
        assert intake.student_name_problem(name) is None, name


def test_a_250_character_student_folder_is_refused_before_a_path_is_built_from_it(tmp_path):
    name = "s" * 250  # a folder can be named so (255 bytes at most), but not <name>.ipynb or <name>.json.tmp
    out = _check(_submit(tmp_path, _release(), student=name), student=name)
    assert out.notebook is None and "is 250 characters long" in out.reason


def _rejected(student: str) -> dict:
    return classrun._rejected(A, student, "a reason", [], "h", "fp", 12.0, [("test_copy_to_region", 6.0)])


def test_a_student_named_like_a_shard_file_is_merged_like_anyone_and_merging_twice_changes_nothing(tmp_path):
    """Students named shard-2-of-2 and shards: the shard files are in graded/<assignment>/shards/, a name no
    record can take (a record's name ends in .json). Before, shard 1's record of student shard-2-of-2 was written
    over shard 2's file, whose students then got no record, and every merge after failed."""
    root = str(tmp_path)
    shard_of = {"shard-2-of-2": (1, 2), "shards": (1, 2), "bob": (2, 2), "x" * 250: (2, 2)}
    for shard in ((1, 2), (2, 2)):
        classrun._save(root, A, [_rejected(s) for s, k in shard_of.items() if k == shard], shard, None)
    files = [classrun.shard_path(root, A, i, 2) for i in (1, 2)]
    assert all(os.path.exists(f) for f in files) and os.path.dirname(files[0]) == os.path.join(
        root, "graded", A, "shards")
    for _ in range(2):
        merged = classrun.merge_results(root, files)
        assert sorted(r["student"] for r in merged) == sorted(shard_of)
        # every student with a usable name has a record; the 250-character one is in the merge's table only
        assert sorted(classrun.read_results(root, A)) == ["bob", "shard-2-of-2", "shards"]
        assert sorted(os.listdir(os.path.join(root, "graded", A))) == [
            "bob.json", "shard-2-of-2.json", "shards", "shards.json"]
    # a record given to merge is refused before anything is written, naming the shard files
    with pytest.raises(classrun.ClassRunError, match=r"bob\.json is not a shard file .*graded/<assignment>/shards/"):
        classrun.merge_results(root, [files[0], os.path.join(root, "graded", A, "bob.json")])


def test_records_are_read_beside_the_shard_files_an_older_version_wrote(tmp_path):
    """graded/<assignment>/ of an older version: shard files beside the records. The records are read (a run
    regrades only what changed), the shard files passed over (and still merge when named)."""
    root = str(tmp_path)
    folder = os.path.join(root, "graded", A)
    os.makedirs(folder)
    for student in ("alice", "bob"):
        with open(os.path.join(folder, f"{student}.json"), "w", encoding="utf-8") as f:
            json.dump(_rejected(student), f)
    with open(os.path.join(folder, "shard-1-of-2.json"), "w", encoding="utf-8") as f:
        json.dump({"assignment": A, "shard": [1, 2], "records": [_rejected("carol")]}, f)
    assert sorted(classrun.read_results(root, A)) == ["alice", "bob"]
    classrun.merge_results(root, [os.path.join(folder, "shard-1-of-2.json")])
    assert sorted(classrun.read_results(root, A)) == ["alice", "bob", "carol"]


def test_scores_lists_lost_cells_in_the_notebooks_order(tmp_path):
    """`python -m autograder.grade scores` (the gradebook) lists the cells as `autograde` does: in the order of
    the notebook (it sorted them by name)."""
    import warnings

    from nbgrader.api import Gradebook

    from autograder.grading.cli import gradebook_rows

    root = str(tmp_path)
    os.makedirs(os.path.join(root, "release", A))
    shutil.copy(os.path.join(ROOT, "release", A, NB), os.path.join(root, "release", A, NB))
    graded = [c["metadata"]["nbgrader"] for c in _release()["cells"]
              if c["metadata"].get("nbgrader", {}).get("grade") and c["metadata"]["nbgrader"].get("points")]
    order = [g["grade_id"] for g in graded]
    assert order != sorted(order), "the notebook's order is not alphabetical: the test would show nothing"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            gb.add_assignment(A)
            gb.add_notebook(NB[:-6], A)
            for g in sorted(graded, key=lambda g: g["grade_id"]):  # entered alphabetically
                gb.add_grade_cell(g["grade_id"], NB[:-6], A, max_score=g["points"], cell_type="code")
            gb.add_student("alice")
            gb.add_submission(A, "alice")
            for g in graded:  # every cell graded, and every cell lost its points
                grade = gb.find_grade(g["grade_id"], NB[:-6], A, "alice")
                grade.auto_score, grade.needs_manual_grade = 0.0, False
            gb.db.commit()
    rows = gradebook_rows(root)
    assert [r["lost"] for r in rows] == [order]
