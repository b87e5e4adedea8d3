"""Check and normalise one student's submission before anything runs it.

    intake = check_submission(folder, release_nb, release_name, other_releases)
    intake.notebook     # the notebook to grade (dict), or None
    intake.reason       # why it cannot be graded (None if it can)
    intake.warnings     # what was repaired or assumed, for the table

Everything a submission could do to the notebook *file* to break grading for
everyone, or to change how it is graded, is handled here, per student:

- the student's folder name must be usable as a file name: the records,
  feedback folders and gradebook entry are named by it, so a name over
  `MAX_NAME_BYTES` bytes (UTF-8), not valid UTF-8, with a character that
  cannot be printed (a control character, a newline) or starting with a dot
  is refused with a named reason (`student_name_problem`);
- the submission folder and the notebook must be what they look like: a
  symbolic link, a FIFO, a device or a file over `MAX_BYTES` is refused
  with a named reason, before anything opens it for reading (a FIFO would
  block the grader; a link could point at another student's file or at the
  course's own notebooks);
- intake's work is linear in the notebook's size and bounded: at most
  `MAX_BYTES` bytes are read, and a notebook with more than `MAX_CELLS`
  cells, `MAX_JSON_VALUES` JSON values (lines, strings, numbers, lists and
  objects: what the format's validation walks) or `MAX_GRADE_IDS` distinct
  grading ids is refused with a reason that names the limit and the count,
  before the format is validated;
- no notebook, or several without the expected name: a named reason;
- one notebook under another name (`..._lab-Copy1.ipynb`): graded, with a warning;
- invalid JSON or not a notebook (nbformat's schema), and nbgrader metadata
  of the wrong type: a named reason, saying which cell;
- another assignment's notebook: a named reason (which assignment it is);
- a `grade_id` that appears twice (a copied cell): a named reason;
- nbgrader metadata on a cell the release does not have (an unknown or empty `grade_id`) is dropped: the
  cell is kept, not graded (nbgrader's feedback would find no such cell, and write none);
- graded and locked cells are put back as the release has them (a test cell
  deleted, edited, retyped or marked `grade: false` is restored; its points
  cannot be changed); answer cells keep the student's code, under the
  release's metadata; an answer cell that was deleted gets the release stub;
- nbgrader's marker lines (`### BEGIN HIDDEN TESTS`, ...) in the student's
  code are removed (nbgrader would otherwise abort or misread them);
- outputs kept in the notebook (they are shown in the feedback) are capped:
  at most `MAX_OUTPUT_CHARS` characters and `MAX_OUTPUT_LINES` lines of text
  per output, pictures of at most `MAX_OUTPUT_DATA` bytes;
- what each test cell's saved output showed (passed, failed, or not run) is
  kept in `saw`: the grading flags a cell where it and the trusted verdict
  disagree; nbgrader's `timestamp.txt` (collect, zip_collect) is kept as the
  submission's time.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
import stat
import warnings as _warnings
from dataclasses import dataclass, field

__all__ = ["Intake", "check_submission", "notebook_files", "parse_timestamp", "student_name_problem", "shown_name",
           "duplicate_ids"]

_MARKER = re.compile(r"^.*### (BEGIN|END) (SOLUTION|HIDDEN TESTS).*$\n?", re.M)
_IGNORED_DIRS = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}
# Bounds of one submission, each many times what a real notebook of the course needs (the largest release
# notebook: 87 KB, 57 cells, 32 grading ids, about 1,500 JSON values; a student's saved outputs add to the size
# and the values). Intake's time is linear in the file's size, so these bound it (a few seconds at most).
MAX_BYTES = 16 * 2**20  # a submitted notebook file
MAX_CELLS = 2_000  # cells of a notebook
MAX_GRADE_IDS = 500  # distinct nbgrader grading ids of a notebook
MAX_JSON_VALUES = 200_000  # JSON values of a notebook (what nbformat's validation walks, one by one)
MAX_NAME_BYTES = 128  # a student's folder name, in UTF-8 (records and feedback folders are named by it)
MAX_OUTPUT_CHARS = 20_000  # text kept of one output (feedback)
MAX_OUTPUT_LINES = 200
MAX_OUTPUT_DATA = 2 * 2**20  # one picture (base64) kept of an output


@dataclass
class Intake:
    student: str
    notebook: dict | None = None
    source_name: str = ""
    reason: str | None = None
    warnings: list = field(default_factory=list)
    saw: dict = field(default_factory=dict)  # grade id -> True/False: what the saved output of a test cell showed
    submitted_at: str | None = None  # nbgrader's timestamp.txt, if any


def notebook_files(folder: str) -> list[str]:
    out = []
    for dirpath, dirs, names in os.walk(folder):  # never into a linked folder (followlinks=False)
        dirs[:] = [d for d in dirs if d not in _IGNORED_DIRS and not d.startswith(".")]
        out += [os.path.relpath(os.path.join(dirpath, n), folder) for n in names
                if n.endswith(".ipynb") and not n.startswith(".")]
    return sorted(out)


_KINDS = [(stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder")]


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _read_regular(path: str, name: str) -> tuple[bytes | None, str | None]:
    """(the file's bytes, None) or (None, why it is not read): never through a link, never blocking."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return None, f"{name} cannot be read ({exc.strerror})"
    what = _kind(st.st_mode)
    if what:
        return None, f"{name} is {what}, not a notebook file: submit the notebook itself"
    if st.st_size > MAX_BYTES:
        return None, (f"{name} is {st.st_size / 2**20:.1f} MiB (at most {MAX_BYTES // 2**20} MiB are graded): "
                      f"clear the large outputs (Edit > Clear Outputs of All Cells) and submit again")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"{name} cannot be read ({exc.strerror})"
    with os.fdopen(fd, "rb") as f:
        what = _kind(os.fstat(fd).st_mode)  # it could have been replaced since lstat
        if what:
            return None, f"{name} is {what}, not a notebook file: submit the notebook itself"
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        return None, f"{name} is over {MAX_BYTES // 2**20} MiB (at most that is graded)"
    return data, None


def shown_name(name: str, limit: int = 40) -> str:
    """`name` as it can be printed in a table or a message: escaped if it has characters that cannot be
    printed (or are not UTF-8), cut to `limit` characters."""
    try:
        name.encode("utf-8")
        ok = name.isprintable()
    except UnicodeEncodeError:
        ok = False
    text = name if ok else ascii(name)[1:-1]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def student_name_problem(name: str) -> str | None:
    """Why a student's folder name cannot name their records, feedback folder and gradebook entry (None if it
    can): longer than MAX_NAME_BYTES in UTF-8, not UTF-8, a character that cannot be printed, a leading dot."""
    fix = "rename the student's folder in submitted/ and grade again"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return (f"the student folder name {shown_name(name)} is not valid UTF-8 (position {exc.start} of "
                f"{len(name)}): {fix}")
    if not name:
        return f"the student folder name is empty: {fix}"
    if size > MAX_NAME_BYTES:
        return (f"the student folder name is {len(name):,} characters long ({size:,} bytes in UTF-8; at most "
                f"{MAX_NAME_BYTES} bytes are graded: the records and feedback are named by it): {fix}")
    odd = next(((i, c) for i, c in enumerate(name) if not c.isprintable()), None)
    if odd is not None:
        return (f"the student folder name {shown_name(name)} has a character that cannot be printed "
                f"({ascii(odd[1])} at position {odd[0] + 1} of {len(name)}): {fix}")
    if name.startswith("."):
        return f"the student folder name {shown_name(name)} starts with a dot (a hidden file's name): {fix}"
    return None


def _folder_problem(folder: str) -> str | None:
    """Why the submission folder (or its student folder) is not one (a link, a file): None if it is."""
    for path in (os.path.dirname(folder.rstrip(os.sep)), folder):
        try:
            st = os.lstat(path)
        except OSError:
            return None  # missing: "no notebook" says it
        if stat.S_ISLNK(st.st_mode):
            return f"the submission folder {os.path.basename(path)} is a symbolic link, not a folder"
        if not stat.S_ISDIR(st.st_mode):
            return f"the submission folder {os.path.basename(path)} is {_kind(st.st_mode)}, not a folder"
    return None


def structure_problem(nb) -> str | None:
    """Why `nb` (parsed JSON) is not a notebook this grader can read, naming the cell; None if it is."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return "it is not a notebook (no list of cells)"
    if nb.get("nbformat") != 4:
        return f"it is not a version 4 notebook (nbformat {nb.get('nbformat')!r})"
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict):
            return f"cell {i + 1} is a {type(cell).__name__}, not an object"
        meta = cell.get("metadata", {})
        if not isinstance(meta, dict):
            return f"cell {i + 1}: its metadata is a {type(meta).__name__}, not an object"
        grader = meta.get("nbgrader")
        if grader is None:
            continue
        if not isinstance(grader, dict):
            return f"cell {i + 1}: its nbgrader metadata is a {type(grader).__name__}, not an object"
        if "grade_id" in grader and not isinstance(grader["grade_id"], str):
            return f"cell {i + 1}: its grade_id is a {type(grader['grade_id']).__name__}, not a string"
        if "points" in grader and (isinstance(grader["points"], bool)
                                   or not isinstance(grader["points"], (int, float))):
            return f"cell {i + 1}: its points are a {type(grader['points']).__name__}, not a number"
        for key in ("grade", "solution", "locked", "task"):
            if key in grader and not isinstance(grader[key], bool):
                return f"cell {i + 1}: its nbgrader {key!r} is a {type(grader[key]).__name__}, not true/false"
    import nbformat

    with _warnings.catch_warnings():
        _warnings.simplefilter("ignore")  # nbformat's notes on missing cell ids
        try:
            nbformat.validate(nb, version=4)
        except nbformat.ValidationError as exc:
            where = "/".join(str(p) for p in list(getattr(exc, "absolute_path", []))[:4])
            return f"it does not follow the notebook format ({where or 'top level'}: {str(exc.message)[:200]})"
        except Exception as exc:  # noqa: BLE001 - the validator itself choked on it
            return f"it does not follow the notebook format ({type(exc).__name__})"
    return None


def _count_values(value) -> int:
    """How many JSON values `value` holds (itself included): linear, no recursion."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


def size_problem(nb, release_cells: int | None = None) -> str | None:
    """Why `nb` (parsed JSON) is too large to take in (`MAX_CELLS`, `MAX_JSON_VALUES`), naming the limit and the
    count; None if it is not. Linear in the size of `nb`; run before the format is validated."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None  # structure_problem names it
    cells = len(nb["cells"])
    if cells > MAX_CELLS:
        of = f", the release has {release_cells}" if release_cells is not None else ""
        return (f"it has {cells:,} cells (at most {MAX_CELLS:,} are graded{of}): delete the cells you added "
                f"and submit again")
    values = _count_values(nb)
    if values > MAX_JSON_VALUES:
        return (f"it holds {values:,} JSON values (lines, strings, numbers, lists, objects; at most "
                f"{MAX_JSON_VALUES:,} are graded): clear the outputs (Edit > Clear Outputs of All Cells) and "
                f"submit again")
    return None


def duplicate_ids(ids: list[str]) -> list[str]:
    """The grading ids that appear more than once in `ids`, sorted: one pass (hashing each id once)."""
    return sorted(g for g, n in collections.Counter(ids).items() if n > 1)


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
    problem = student_name_problem(out.student) or _folder_problem(folder)
    if problem:
        out.reason = problem
        return out
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
    data, problem = _read_regular(os.path.join(folder, chosen), chosen)
    if problem:
        out.reason = problem
        return out
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        out.reason = f"{chosen} is not a valid notebook: {type(exc).__name__}: {str(exc)[:200]}"
        return out
    problem = size_problem(nb, len(release.get("cells", [])))
    if problem:
        out.reason = f"{chosen} is too large to grade: {problem}"
        return out
    problem = structure_problem(nb)
    if problem:
        out.reason = f"{chosen} is not a valid notebook: {problem}"
        return out
    stamp, _ = _read_regular(os.path.join(folder, "timestamp.txt"), "timestamp.txt") \
        if os.path.lexists(os.path.join(folder, "timestamp.txt")) else (None, None)
    if stamp is not None:
        out.submitted_at = stamp.decode("utf-8", "replace").strip()[:64] or None
    ids = _grade_ids(nb)
    release_ids = set(_grade_ids(release))
    distinct = set(ids)
    if len(distinct) > MAX_GRADE_IDS:
        out.reason = (f"{chosen} has {len(distinct):,} different grading ids (nbgrader's grade_id; at most "
                      f"{MAX_GRADE_IDS:,} are graded, the release has {len(release_ids)}): submit the "
                      f"assignment's notebook, with only the cells you added besides")
        return out
    dupes = duplicate_ids(ids)
    if dupes:
        shown = ", ".join(dupes[:10]) + (f" and {len(dupes) - 10} more" if len(dupes) > 10 else "")
        out.reason = (f"{chosen}: the cell(s) {shown} appear more than once (a copied cell keeps its "
                      f"grading id): delete the copies")
        return out
    answers = {_meta(c)["grade_id"] for c in release["cells"] if _meta(c).get("solution")}

    def likeness(other: set) -> float:
        return len(distinct & other) / max(1, len(distinct | other))

    best = max(others, key=lambda a: likeness(others[a]), default=None)
    if ids and (not distinct & answers or (best is not None and likeness(others[best]) > likeness(release_ids))):
        match = best if best is not None and likeness(others[best]) > 0 else None
        out.reason = (f"{chosen} is " + (f"assignment {match}'s notebook" if match else "another notebook")
                      + f", not {release_name}")
        return out
    out.notebook = _normalise(nb, release, out.warnings, out.saw)
    return out


def _saw(cell: dict) -> bool | None:
    """What a test cell's saved outputs showed the student: failed (an error), passed (output, no error), or
    nothing (not run, or cleared)."""
    outputs = cell.get("outputs") or []
    if any(o.get("output_type") == "error" for o in outputs):
        return False
    return True if outputs else None


def _cap_text(text: str) -> str:
    lines = text.splitlines(True)
    if len(lines) > MAX_OUTPUT_LINES:
        text = "".join(lines[:MAX_OUTPUT_LINES]) + f"... [{len(lines) - MAX_OUTPUT_LINES} more lines not kept]\n"
    if len(text) > MAX_OUTPUT_CHARS:
        text = text[:MAX_OUTPUT_CHARS] + f"\n... [{len(text) - MAX_OUTPUT_CHARS} more characters not kept]\n"
    return text


def cap_outputs(cell: dict) -> dict:
    """The cell with every output small enough for the feedback (see the module docstring)."""
    kept = []
    for o in cell.get("outputs") or []:
        o = dict(o)
        if "text" in o:
            o["text"] = _cap_text(o["text"] if isinstance(o["text"], str) else "".join(o["text"]))
        if isinstance(o.get("data"), dict):
            data = {}
            for mime, value in o["data"].items():
                value = value if isinstance(value, str) else "".join(value) if isinstance(value, list) else value
                if isinstance(value, str) and (mime.startswith("text/") or mime.endswith("json")):
                    data[mime] = _cap_text(value)
                elif isinstance(value, str) and len(value) > MAX_OUTPUT_DATA:
                    data.setdefault("text/plain", f"[a {mime} output of {len(value):,} bytes, not kept]")
                else:
                    data[mime] = value
            o["data"] = data
        if o.get("output_type") == "error":
            o["evalue"] = _cap_text(str(o.get("evalue", "")))
            o["traceback"] = [_cap_text(str(line)) for line in (o.get("traceback") or [])][:MAX_OUTPUT_LINES]
        kept.append(o)
    if kept:
        cell["outputs"] = kept[:MAX_OUTPUT_LINES]
    return cell


def _clean(cell: dict, what: str, warnings: list) -> dict:
    text = _src(cell)
    cleaned = _MARKER.sub("", text)
    if cleaned != text:
        warnings.append(f"removed nbgrader marker lines from {what}")
        cell["source"] = cleaned
    return cell


def _normalise(nb: dict, release: dict, warnings: list, saw: dict) -> dict:
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
        elif _meta(rc).get("grade") and rc.get("cell_type") == "code":
            seen = _saw(sub)
            if seen is not None:
                saw[gid] = seen
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
        else:  # a free cell (nbgrader metadata of no cell of the release is dropped: the cell is kept, ungraded)
            free = copy.deepcopy(c)
            meta = free.get("metadata", {}).pop("nbgrader", None)
            if gid:
                warnings.append(f"cell {gid} is not part of this assignment: kept, not graded")
            elif isinstance(meta, dict) and any(meta.get(k) for k in ("grade", "solution", "task", "locked")):
                # (an empty or missing grade_id: nbgrader's feedback would find no such cell, and fail)
                warnings.append("a cell marked for grading without a grading id (grade_id "
                                f"{meta.get('grade_id', '')!r}): kept, not graded")
            after.setdefault(anchor, []).append(cap_outputs(_clean(free, "a free cell", warnings)))
    cells = list(after.get(None, []))
    for gid, cell in graded:
        cells.append(cell)
        cells += after.get(gid, [])
    out = copy.deepcopy(release)
    out["cells"] = cells
    return out


def parse_timestamp(text: str | None):
    """When the student submitted (naive UTC, as nbgrader's gradebook keeps it), from the text of the
    `timestamp.txt` that nbgrader's `collect` and `zip_collect` write beside the notebook (read at intake:
    `Intake.submitted_at`); None without one, or if it is not a time."""
    from nbgrader.utils import parse_utc

    try:
        return parse_utc(text) if text else None
    except (ValueError, OverflowError, TypeError):
        return None
