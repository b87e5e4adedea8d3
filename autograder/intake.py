"""Check and normalise one student's submission before anything runs it.

    intake = check_submission(folder, release_nb, release_name, other_releases)
    intake.notebook     # the notebook to grade (dict), or None
    intake.reason       # why it cannot be graded (None if it can)
    intake.warnings     # what was repaired or assumed, for the table

Everything a submission could do to the notebook *file* to break grading for
everyone, or to change how it is graded, is handled here, per student:

- no notebook, or several without the expected name: a named reason;
- one notebook under another name (`..._lab-Copy1.ipynb`): graded, with a warning;
- invalid JSON or not a notebook: a named reason;
- another assignment's notebook: a named reason (which assignment it is);
- a `grade_id` that appears twice (a copied cell): a named reason;
- graded and locked cells are put back as the release has them (a test cell
  deleted, edited, retyped or marked `grade: false` is restored; its points
  cannot be changed); answer cells keep the student's code, under the
  release's metadata; an answer cell that was deleted gets the release stub;
- nbgrader's marker lines (`### BEGIN HIDDEN TESTS`, ...) in the student's
  code are removed (nbgrader would otherwise abort or misread them).
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass, field

__all__ = ["Intake", "check_submission", "notebook_files", "submission_timestamp"]

_MARKER = re.compile(r"^.*### (BEGIN|END) (SOLUTION|HIDDEN TESTS).*$\n?", re.M)
_IGNORED_DIRS = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}


@dataclass
class Intake:
    student: str
    notebook: dict | None = None
    source_name: str = ""
    reason: str | None = None
    warnings: list = field(default_factory=list)


def notebook_files(folder: str) -> list[str]:
    out = []
    for dirpath, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in _IGNORED_DIRS and not d.startswith(".")]
        out += [os.path.relpath(os.path.join(dirpath, n), folder) for n in names
                if n.endswith(".ipynb") and not n.startswith(".")]
    return sorted(out)


def submission_timestamp(folder: str):
    """When the student submitted (naive UTC, as nbgrader's gradebook keeps it), from the `timestamp.txt` that
    nbgrader's `collect` and `zip_collect` write beside the notebook; None without one (or if unreadable)."""
    from nbgrader.utils import parse_utc

    try:
        with open(os.path.join(folder, "timestamp.txt"), encoding="utf-8") as f:
            text = f.read().strip()
        return parse_utc(text) if text else None
    except (OSError, ValueError, OverflowError):
        return None


def _meta(cell) -> dict:
    return (cell.get("metadata") or {}).get("nbgrader") or {}


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else str(s)


def _grade_ids(nb: dict) -> list[str]:
    return [_meta(c)["grade_id"] for c in nb.get("cells", []) if isinstance(c, dict) and _meta(c).get("grade_id")]


def check_submission(folder: str, release: dict, release_name: str, others: dict[str, set],
                     *, student: str = "") -> Intake:
    """Validate and normalise the submission in `folder` against the `release` notebook (see module doc).

    `others` maps every other assignment to its release grade ids (to name a wrong notebook).
    """
    out = Intake(student=student or os.path.basename(os.path.dirname(folder.rstrip(os.sep))))
    files = notebook_files(folder) if os.path.isdir(folder) else []
    if not files:
        out.reason = f"no notebook in the submission (expected {release_name})"
        return out
    if release_name in files:
        chosen = release_name
        if len(files) > 1:
            out.warnings.append(f"graded {release_name}; ignored {', '.join(f for f in files if f != release_name)}")
    elif len(files) == 1:
        chosen = files[0]
        out.warnings.append(f"graded {chosen} as {release_name} (the only notebook, under another name)")
    else:
        out.reason = (f"{len(files)} notebooks ({', '.join(files)}) and none named {release_name}: "
                      f"submit one notebook, {release_name}")
        return out
    out.source_name = chosen
    path = os.path.join(folder, chosen)
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        out.reason = f"{chosen} is not a valid notebook: {type(exc).__name__}: {str(exc)[:200]}"
        return out
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or \
            not all(isinstance(c, dict) and "cell_type" in c for c in nb["cells"]):
        out.reason = f"{chosen} is not a valid notebook (no list of cells)"
        return out
    ids = _grade_ids(nb)
    dupes = sorted({g for g in ids if ids.count(g) > 1})
    if dupes:
        out.reason = (f"{chosen}: the cell(s) {', '.join(dupes)} appear more than once (a copied cell keeps its "
                      f"grading id): delete the copies")
        return out
    release_ids = set(_grade_ids(release))
    answers = {_meta(c)["grade_id"] for c in release["cells"] if _meta(c).get("solution")}

    def likeness(other: set) -> float:
        return len(set(ids) & other) / max(1, len(set(ids) | other))

    best = max(others, key=lambda a: likeness(others[a]), default=None)
    if ids and (not set(ids) & answers or (best is not None and likeness(others[best]) > likeness(release_ids))):
        match = best if best is not None and likeness(others[best]) > 0 else None
        out.reason = (f"{chosen} is " + (f"assignment {match}'s notebook" if match else "another notebook")
                      + f", not {release_name}")
        return out
    out.notebook = _normalise(nb, release, out.warnings)
    return out


def _clean(cell: dict, what: str, warnings: list) -> dict:
    text = _src(cell)
    cleaned = _MARKER.sub("", text)
    if cleaned != text:
        warnings.append(f"removed nbgrader marker lines from {what}")
        cell["source"] = cleaned
    return cell


def _normalise(nb: dict, release: dict, warnings: list) -> dict:
    """The release's graded cells (answer cells with the student's code), and the student's free cells.

    A free cell (the lesson's markdown, scratch code, the student's own notes)
    stays after the graded cell that precedes it in the student's notebook.
    """
    by_id = {_meta(c)["grade_id"]: c for c in nb["cells"] if _meta(c).get("grade_id")}
    graded = []
    for rc in release["cells"]:
        gid = _meta(rc).get("grade_id")
        if not gid:
            continue
        new, sub = copy.deepcopy(rc), by_id.get(gid)
        if _meta(rc).get("solution"):
            if sub is None or sub.get("cell_type") != rc.get("cell_type"):
                warnings.append(f"answer cell {gid} was missing: graded as the release's stub")
            else:
                new["source"] = _src(sub)
                _clean(new, f"answer cell {gid}", warnings)
        elif sub is None:
            warnings.append(f"cell {gid} was missing: restored from the release")
        elif _src(sub) != _src(rc) or _meta(sub) != _meta(rc) or sub.get("cell_type") != rc.get("cell_type"):
            warnings.append(f"cell {gid} was changed: restored from the release")
        if new.get("cell_type") == "code":
            new["outputs"], new["execution_count"] = [], None
        graded.append((gid, new))
    known = {gid for gid, _ in graded}
    after: dict = {}
    anchor = None
    for c in nb["cells"]:
        gid = _meta(c).get("grade_id")
        if gid in known:
            anchor = gid
        else:  # a free cell (an unknown grading id is dropped: the cell is kept, ungraded)
            free = copy.deepcopy(c)
            if gid:
                free.get("metadata", {}).pop("nbgrader", None)
                warnings.append(f"cell {gid} is not part of this assignment: kept, not graded")
            after.setdefault(anchor, []).append(_clean(free, "a free cell", warnings))
    cells = list(after.get(None, []))
    for gid, cell in graded:
        cells.append(cell)
        cells += after.get(gid, [])
    out = copy.deepcopy(release)
    out["cells"] = cells
    return out
