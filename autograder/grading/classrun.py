"""Grading a class: every submission in its own sandbox, in parallel, incrementally, sharded if asked.

    python -m autograder.grade autograde 02_tensor_parallel --jobs 2        # the course's command
    python -m autograder.grade autograde 02_tensor_parallel --shard 1/3     # one slice, into its own file
    python -m autograder.grade merge graded/02_tensor_parallel/shards/shard-*.json   # fold shard results in

One submission:

1. intake (autograder.grading.intake, in the main process, each student on their
   own, bounded in time by the notebook's size): the student's folder name
   and the notebook file checked (a usable name; a regular file, a notebook
   within the size bounds, this assignment's) and normalised, or a named
   reason why it cannot be graded; every step of one student in the main
   process (intake, the paths named by the student, the work file, saving
   the record) is guarded: what fails costs that student alone;
2. in a worker process: the trusted run (autograder.grading.trusted), every check
   run once: the student's cells run in a fresh interpreter in the sandbox
   (autograder.grading.sandbox: no privileges, an empty root, memory, process and
   time limits), and the worker runs the source notebook's test cells,
   hidden ones included, reaching the student's code only through the
   sandbox; its verdicts are the grade;
3. the feedback: the submitted notebook with each graded cell showing its
   trusted verdict, through nbgrader's `generate_feedback`; where the
   outputs saved in the notebook (what the student last saw) disagree with
   the trusted verdict on the visible checks, the cell is flagged;
4. a result record (JSON): scores per cell, flags, warnings, timings.

A worker that dies is replaced, and its submission graded once more; a
second death is that submission's reason (the others are graded).

The main process then writes the records into nbgrader's gradebook (sqlite,
one writer: only the main process writes), after backing it up, holding the
course's grading lock. A submission is graded again only when its notebook
or the grader (source notebook, autograder package) changed, unless forced.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import datetime
import fcntl
import glob
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

__all__ = ["grade_class", "grade_classes", "merge_results", "course_lock", "read_results", "result_path", "ClassRunError",
           "submissions", "shard_of", "shard_path", "backup_gradebook", "grader_fingerprint", "write_gradebook",
           "no_sandbox_message", "gradebook_holds", "ensure_gradebook"]

# graded/<assignment>/ holds the students' records, <student>.json (and <student>.json.tmp while one is written),
# and the grader's own files in SHARDS/, a name no record can take (a record's name ends in .json)
GRADED = "graded"
SHARDS = "shards"
BACKUPS = "backups"
RESULT_VERSION = 1


class ClassRunError(RuntimeError):
    """The class run cannot start (another run holds the lock, nothing to grade, ...)."""


# ---------------------------------------------------------------------------
# Lock, backup, paths, fingerprints
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def course_lock(root: str, name: str = "autograde"):
    """One writer per course: a second command is told who holds the lock, and stops."""
    path = os.path.join(root, f".{name}.lock")
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise ClassRunError(f"another grading command holds the course's lock ({holder}); wait for it to "
                            f"finish (or stop it), then run this one again") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}, started {datetime.datetime.now():%Y-%m-%d %H:%M:%S}")
    f.flush()
    try:
        yield
    finally:
        f.seek(0)
        f.truncate()
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def backup_gradebook(root: str, keep: int = 10) -> str | None:
    """Copy gradebook.db to backups/ (the `keep` newest are kept); the copy's path."""
    db = os.path.join(root, "gradebook.db")
    if not os.path.exists(db):
        return None
    folder = os.path.join(root, BACKUPS)
    os.makedirs(folder, exist_ok=True)
    dest = os.path.join(folder, f"gradebook-{datetime.datetime.now():%Y%m%d-%H%M%S-%f}.db")
    import sqlite3

    src, dst = sqlite3.connect(db, timeout=60), sqlite3.connect(dest)
    try:
        src.backup(dst)  # a consistent copy, even while another process reads it
    finally:
        src.close()
        dst.close()
    for old in sorted(glob.glob(os.path.join(folder, "gradebook-*.db")))[:-keep]:
        os.remove(old)
    return dest


def _one_notebook(folder: str) -> str:
    names = sorted(n for n in os.listdir(folder) if n.endswith(".ipynb"))
    if len(names) != 1:
        raise ClassRunError(f"expected one notebook in {folder}, found {names}")
    return os.path.join(folder, names[0])


def source_notebook(root: str, assignment: str) -> str:
    return _one_notebook(os.path.join(root, "source", assignment))


def release_notebook(root: str, assignment: str) -> str:
    return _one_notebook(os.path.join(root, "release", assignment))


def grader_fingerprint(root: str, assignment: str) -> str:
    """Changes when anything that decides a grade changes: the source notebook, the autograder package."""
    import autograder

    h = hashlib.sha256()
    for path in (source_notebook(root, assignment), os.path.join(root, "nbgrader_config.py")):
        with open(path, "rb") as f:
            h.update(f.read())
    pkg = os.path.dirname(os.path.abspath(autograder.__file__))
    for path in sorted(glob.glob(os.path.join(pkg, "**", "*.py"), recursive=True)):
        h.update(os.path.relpath(path, pkg).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def result_path(root: str, assignment: str, student: str) -> str:
    return os.path.join(root, GRADED, assignment, f"{student}.json")


def shard_path(root: str, assignment: str, index: int, count: int) -> str:
    """Where `autograde --shard index/count` writes its results (graded/<assignment>/shards/)."""
    return os.path.join(root, GRADED, assignment, SHARDS, f"shard-{index}-of-{count}.json")


def read_results(root: str, assignment: str) -> dict[str, dict]:
    """The students' records in graded/<assignment>/ (a file there that is not a record is passed over: the
    shard files an older version wrote beside the records, graded/<assignment>/shard-I-of-N.json)."""
    out = {}
    folder = os.path.join(root, GRADED, assignment)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue  # unreadable: that student is graded again
        if isinstance(rec, dict) and "records" not in rec and isinstance(rec.get("student"), str):
            out[rec["student"]] = rec
    return out


def submissions(root: str, assignment: str) -> list[str]:
    """Students with a folder submitted/<student>/<assignment>/, sorted."""
    base = os.path.join(root, "submitted")
    if not os.path.isdir(base):
        return []
    return sorted(s for s in os.listdir(base)
                  if not s.startswith(".") and os.path.isdir(os.path.join(base, s, assignment)))


def shard_of(students: list[str], index: int, count: int) -> list[str]:
    """The students of shard `index` (1-based) of `count`: round-robin over the sorted list (shard i gets the
    i-th, (i+N)-th, ... student), so shard sizes differ by at most one, and every machine that lists the same
    submitted/ computes the same split. Every entry point (`--shard I/N`, `slurm/N`, `k8s/N`) comes here."""
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: the index must be between 1 and {count}")
    return sorted(students)[index - 1::count]


# ---------------------------------------------------------------------------
# The scratch course the student's kernel sees: release test cells, stubs, no hidden tests
# ---------------------------------------------------------------------------

_SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.M | re.S)
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[ \t]*\n.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.M | re.S)


def sanitised_source(source: dict) -> dict:
    """The source notebook without what a student must not see: solutions become stubs, hidden tests go."""
    nb = copy.deepcopy(source)
    for cell in nb["cells"]:
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        text = _SOLUTION.sub(lambda m: f"{m.group(1)}### BEGIN SOLUTION\n{m.group(1)}raise NotImplementedError()\n"
                                       f"{m.group(1)}### END SOLUTION", text)
        cell["source"] = _HIDDEN.sub("", text)
    return nb


def _nbgrader_env(root: str) -> dict:
    import autograder

    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore",
            "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(autograder.__file__))),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}


def prepare_template(root: str, assignment: str, dest: str) -> str:
    """A scratch course (config, sanitised source, its own gradebook) to copy for each submission.

    nbgrader's generate_assignment runs here, in this process (nbgrader's own command was a fresh interpreter
    of about 3 CPU-seconds per assignment, most of it imports and `alembic heads`), on a copy of one empty
    gradebook made once per process (`_empty_gradebook`: nbgrader stamps a new gradebook's schema version by
    running alembic, 1.2 s each time)."""
    os.makedirs(os.path.join(dest, "source", assignment), exist_ok=True)
    shutil.copy2(os.path.join(root, "nbgrader_config.py"), dest)
    src = source_notebook(root, assignment)
    with open(src, encoding="utf-8") as f:
        nb = sanitised_source(json.load(f))
    with open(os.path.join(dest, "source", assignment, os.path.basename(src)), "w", encoding="utf-8") as f:
        json.dump(nb, f, indent=1)
    shutil.copy2(_empty_gradebook(), os.path.join(dest, "gradebook.db"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's and nbconvert's notes, as nbgrader's command hid them
        result = _nbgrader_api(dest).generate_assignment(assignment, force=True)
    if not result.get("success"):
        raise ClassRunError(f"could not prepare the scratch course for {assignment}:\n"
                            f"{str(result.get('error') or '')[-2000:]}{str(result.get('log') or '')[-2000:]}")
    return dest


_EMPTY_GRADEBOOK: dict = {}


def _empty_gradebook() -> str:
    """An nbgrader gradebook with nothing in it, its schema version stamped (made once per process)."""
    path = _EMPTY_GRADEBOOK.get(os.getpid())
    if path is None or not os.path.exists(path):
        from nbgrader.api import Gradebook

        folder = tempfile.mkdtemp(prefix="autograder-gradebook-")
        path = os.path.join(folder, "gradebook.db")
        env_path = os.environ.get("PATH", "")
        bin_dir = os.path.dirname(sys.executable)  # nbgrader runs `alembic` from PATH: this interpreter's first
        os.environ["PATH"] = bin_dir + os.pathsep + env_path
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                Gradebook("sqlite:///" + path).close()
        finally:
            os.environ["PATH"] = env_path
        atexit.register(shutil.rmtree, folder, True)
        _EMPTY_GRADEBOOK[os.getpid()] = path
    return path


def _cached_template(root: str, assignment: str, fingerprint: str) -> str:
    """The scratch course template for this grader version, made once (graded/.templates/)."""
    folder = os.path.join(root, GRADED, ".templates")
    path = os.path.join(folder, f"{assignment}-{fingerprint}")
    if not os.path.exists(os.path.join(path, "gradebook.db")):
        tmp = tempfile.mkdtemp(prefix=f".{assignment}-", dir=_ensure(folder))
        prepare_template(root, assignment, tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another run made it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        for old in glob.glob(os.path.join(folder, f"{assignment}-*")):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
    return path


def _ensure(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    return folder


# ---------------------------------------------------------------------------
# One submission (in a worker process)
# ---------------------------------------------------------------------------

def _meta(cell) -> dict:
    return (cell.get("metadata") or {}).get("nbgrader") or {}


def _outputs_failed(cell) -> bool:
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


MAX_VERDICT_CHARS = 20_000  # of one verdict's message in the feedback (a student's exception text can be long)


def _verdict_outputs(v) -> list:
    if getattr(v, "inconclusive", None):  # not a verdict: said as such, never as an error of the student's code
        return [{"output_type": "stream", "name": "stdout", "text": v.message + "\n"}]
    message = v.message or ""
    if len(message) > MAX_VERDICT_CHARS:
        message = f"{message[:MAX_VERDICT_CHARS]}\n... [{len(message) - MAX_VERDICT_CHARS:,} more characters not shown]"
    if v.passed:
        return [{"output_type": "stream", "name": "stdout", "text": (message or "passed") + "\n"}]
    ename, _, evalue = message.partition(": ")
    ename = ename.rsplit(".", 1)[-1] if ename and " " not in ename else "Error"
    return [{"output_type": "error", "ename": ename, "evalue": evalue or message,
             "traceback": [f"{ename}: {evalue or message}"]}]


_PATHS = re.compile(r"/tmp/ipykernel_\d+/\d+\.py|/tmp/[A-Za-z0-9_.-]*autograder[A-Za-z0-9_.-]*(/[^\s\"'<>]*)?")


def scrub_paths(text: str, *prefixes: str) -> str:
    """The grading machine's paths out of what a student reads (feedback HTML, messages)."""
    for p in sorted({p for p in prefixes if p}, key=len, reverse=True):
        text = text.replace(p, "[grading machine]")
    return _PATHS.sub("[grading machine]", text)


def grade_one(job: dict) -> dict:
    """Grade one submission (see the module docstring); never raises: errors become the record's reason."""
    t_start = time.monotonic()
    root, assignment, student = job["root"], job["assignment"], job["student"]
    record = {"version": RESULT_VERSION, "assignment": assignment, "student": student, "hash": job["hash"],
              "fingerprint": job["fingerprint"], "status": "graded", "reason": None,
              "warnings": list(job.get("warnings", [])), "cells": [], "score": 0.0,
              "max_score": job["max_score"], "timings": {}, "graded_at": datetime.datetime.now().isoformat(),
              "submitted_at": job.get("submitted_at"), "second_backend": job.get("second_backend"),
              "feedback": None, "feedback_html": None}
    work = os.path.join(job["workbase"], "work", student)  # work/: apart from the queued notebooks
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        _grade_into(record, job, work)
    except Exception as exc:  # noqa: BLE001 - a grader bug costs one submission, and says so
        record["status"] = "error"
        record["reason"] = f"the grader failed on this submission: {type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-4000:]
    finally:
        if not job.get("keep_work"):
            shutil.rmtree(work, ignore_errors=True)
    record["timings"]["total"] = round(time.monotonic() - t_start, 2)
    from autograder.grading.feedback import cap_record

    return cap_record(scrub_record(record, root, job["workbase"]))


def scrub_record(record: dict, *prefixes: str) -> dict:
    """No path of the grading machine in what a student receives (messages, warnings, reasons, feedback)."""
    import autograder

    known = [*prefixes, sys.prefix, sys.base_prefix, os.path.dirname(os.path.abspath(autograder.__file__)),
             os.path.expanduser("~"), tempfile.gettempdir() + os.sep]
    known = [p for p in known if p and p not in ("/", os.sep)]

    def clean(value):
        if isinstance(value, str):
            return scrub_paths(value, *known)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    for key in ("reason", "warnings", "cells", "cell_errors", "feedback_html"):
        if key in record:
            record[key] = clean(record[key])
    return record


def _grade_into(record: dict, job: dict, work: str) -> None:
    from autograder.grading.sandbox import Sandbox
    from autograder.grading.trusted import grade_notebook

    root, assignment, student = job["root"], job["assignment"], job["student"]
    nb_name = job["notebook_name"]
    with open(job["notebook"], encoding="utf-8") as f:
        notebook = json.load(f)
    with open(source_notebook(root, assignment), encoding="utf-8") as f:
        source = json.load(f)
    memory_gib = job["memory_bytes"] / 2**30

    # 1. The trusted run: the student's cells run once, in the sandbox; every test cell (visible and hidden)
    # runs once, here, with the student's code reached only through the sandbox.
    t0 = time.monotonic()
    gpus = job.get("second_backend") == "nccl"
    server = _fork_server(root, job) if job["isolate"] and not gpus else None
    if server is not None:
        inputs = server.new_inputs(student)  # (removed with the submission's sandbox)
    else:
        inputs = os.path.join(work, "inputs")  # the grader writes it; the sandbox reads it
        os.makedirs(inputs)
    with Sandbox(root, inputs, isolate=job["isolate"], memory_bytes=job["memory_bytes"],
                 max_pids=job["max_pids"], gpus=gpus, server=server) as box:
        verdicts, cell_errors = grade_notebook(notebook, source, inputs=inputs, sandbox=box, budget=job["budget"],
                                               memory_note=f"out of memory (limit {memory_gib:g} GiB)",
                                               second_backend=job.get("second_backend"))
        cpu = box.cpu_seconds()
        if cpu is not None:
            record["timings"]["sandbox_cpu"] = round(cpu, 2)
        # forked from the worker's fork server, or a fresh sandbox (none here, or the server broken meanwhile)
        record["sandbox"] = "forked" if box.server is not None else "fresh"
        if box.out_of_memory:
            record["warnings"].append(f"the submission ran out of memory (limit {memory_gib:g} GiB): the "
                                      f"processes that exceeded it were killed")
    record["timings"]["trusted_run"] = round(time.monotonic() - t0, 2)
    record["cell_errors"] = cell_errors[:20]

    # 2. The record and the feedback: the submitted notebook, each graded cell showing its trusted verdict
    t0 = time.monotonic()
    saw = job.get("saw") or {}
    base = copy.deepcopy(notebook)
    answer_errors = _answer_cell_errors(cell_errors)
    for cell in base["cells"]:
        meta = _meta(cell)
        gid = meta.get("grade_id")
        if meta.get("solution") and cell.get("cell_type") == "code" and gid in answer_errors:
            cell["outputs"] = [answer_errors[gid]]  # the answer cell's own error, as the notebook shows it
        if meta.get("grade") and not meta.get("solution") and gid in verdicts:
            cell["outputs"] = _verdict_outputs(verdicts[gid])
            if verdicts[gid].backend_note:
                cell["outputs"].append({"output_type": "stream", "name": "stdout",
                                        "text": verdicts[gid].backend_note + "\n"})
    disagree = []
    for gid, v in verdicts.items():
        seen = saw.get(gid)
        flagged = seen is not None and v.visible_passed is not None and seen != v.visible_passed \
            and not v.inconclusive
        disagree += [gid] * flagged
        record["cells"].append({"grade_id": gid, "points": v.points, "max_points": v.max_points,
                                "passed": v.passed, "visible_passed": v.visible_passed, "saved_passed": seen,
                                "flagged": flagged or bool(v.flag), "message": v.message[:4000],
                                **({"backend_note": v.backend_note} if v.backend_note else {}),
                                **({"inconclusive": v.inconclusive} if v.inconclusive else {}),
                                **({"flag": v.flag[:1000]} if v.flag else {})})  # integrity: could be forged
    record["needs_regrade"] = [c["grade_id"] for c in record["cells"] if c.get("inconclusive")]
    forged = sorted({v.flag for v in verdicts.values() if v.flag})
    if forged:
        cells = ", ".join(g for g, v in verdicts.items() if v.flag)
        record["warnings"].append(f"{forged[0][:1000]} (flagged: {cells})")
    record["score"] = round(sum(c["points"] for c in record["cells"]), 4)
    record["max_score"] = round(sum(c["max_points"] for c in record["cells"]), 4) or record["max_score"]
    from autograder.grading.trusted import cell_error_line

    for err in cell_errors:  # a cell's error that lost points (a SyntaxError in an answer cell): in the table
        line = cell_error_line(err)
        lost = [c["grade_id"] for c in record["cells"] if not c["passed"] and c["message"].startswith(line)]
        if lost:
            record["warnings"].append(f"{', '.join(lost)}: {line}")
    if disagree:
        record["warnings"].append("the outputs saved in the notebook and the trusted grader disagree on "
                                  + ", ".join(disagree)
                                  + " (the trusted verdict is the grade)")
    course = os.path.join(work, "course")
    shutil.copytree(job["template"], course)
    html = _feedback(course, assignment, student, nb_name, base, record)
    if html is not None:
        record["feedback_html"] = html
    record["timings"]["feedback"] = round(time.monotonic() - t0, 2)


_SERVERS: dict = {}  # this worker's fork server (autograder.grading.forkserver), or why it has none


def _fork_server(root: str, job: dict):
    """This worker's fork server for `root`, started at its first submission and again when a submission
    killed it; None (each submission in a fresh sandbox) where it cannot start here, or where
    AUTOGRADER_FORK_SERVER=0 says so."""
    if os.environ.get("AUTOGRADER_FORK_SERVER", "1") == "0":
        return None
    from autograder.grading.forkserver import ForkServer, ForkServerUnavailable
    from autograder.grading.sandbox import SandboxUnavailable

    key = (root, job["memory_bytes"], job["max_pids"])
    server = _SERVERS.get(key)
    if isinstance(server, str):
        return None  # it could not start in this worker: not tried again for every submission
    if server is not None and server.alive() and not server.broken:
        return server
    if server is not None:
        server.close()
    try:
        server = _SERVERS[key] = ForkServer(root, memory_bytes=job["memory_bytes"], max_pids=job["max_pids"])
    except (ForkServerUnavailable, SandboxUnavailable, OSError) as exc:
        _SERVERS[key] = str(exc)
        return None
    atexit.register(server.close)
    return server


def _nbgrader_api(course: str):
    """nbgrader's API on a scratch course (in this worker process: nbgrader is imported once per worker)."""
    import logging

    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    from autograder.grading.nbgrader_plugins import SafeFeedbackExporter

    config = PyFileConfigLoader("nbgrader_config.py", path=course).load_config()
    # the feedback page with what the student wrote made inert, whatever the course's config says
    config.GenerateFeedback.exporter_class = SafeFeedbackExporter
    config.CourseDirectory.root = course
    config.CourseDirectory.db_url = "sqlite:///" + os.path.join(course, "gradebook.db")
    logging.getLogger("traitlets").setLevel(logging.ERROR)
    return NbGraderAPI(config=config)


_ANSWER_CELL = re.compile(r"^<answer cell (?:of .+ \(([^()]+)\)|(\S+))>$")


def _answer_cell_errors(cell_errors: list) -> dict:
    """grade id -> the error output an answer cell that failed in the trusted run shows in the feedback."""
    from autograder.grading.trusted import cell_error_line

    out = {}
    for err in cell_errors:
        found = _ANSWER_CELL.match(str(err.get("cell", "")))
        if found:
            ename = str(err.get("error", "")).split(":", 1)[0] or "Error"
            line = cell_error_line(err)
            out.setdefault(found.group(1) or found.group(2), {
                "output_type": "error", "ename": ename, "evalue": line.partition(": ")[2], "traceback": [line]})
    return out


def _feedback(course: str, assignment: str, student: str, nb_name: str, nb: dict, record: dict) -> str | None:
    """nbgrader's feedback HTML of `nb`, with the trusted scores in the scratch gradebook.

    What the student wrote is made inert (nbgrader_plugins.SafeFeedbackExporter); the page is at most
    MAX_FEEDBACK_CHARS: `feedback.fit_notebook` leaves out the largest of the student's outputs, then of
    their cells, with a note where each was and one at the top (a warning of the record too); the page is
    measured, and fitted again with less if the estimate fell short."""
    from nbgrader.api import Gradebook

    from autograder.grading.feedback import (MAX_FEEDBACK_CHARS, PAGE_CHARS, fit_notebook, left_out_note, megabytes,
                                             page_chars, with_note)

    notebook_id = os.path.splitext(nb_name)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's "not in session" notes from nbgrader's own queries
        with Gradebook("sqlite:///" + os.path.join(course, "gradebook.db")) as gb:
            gb.update_or_create_student(student)
            gb.update_or_create_submission(assignment, student)
            for c in record["cells"]:
                grade = gb.find_grade(c["grade_id"], notebook_id, assignment, student)
                grade.auto_score = c["points"]
                grade.needs_manual_grade = False
            gb.db.commit()
    keep = {i for i, c in enumerate(nb["cells"]) if _meta(c).get("grade") and not _meta(c).get("solution")}
    released: set = set()
    with contextlib.suppress(OSError, ValueError), \
            open(os.path.join(course, "release", assignment, nb_name), encoding="utf-8") as f:
        released = {"".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                    for c in json.load(f)["cells"]}
    budget = MAX_FEEDBACK_CHARS - PAGE_CHARS
    for attempt in range(3):
        fitted, left = fit_notebook(nb, budget, keep=keep, released=released)
        note = left_out_note(left)
        html = _render_feedback(course, assignment, student, nb_name, with_note(fitted, note) if note else fitted,
                                record)
        size = page_chars(html) if html is not None else 0
        if html is None or size <= MAX_FEEDBACK_CHARS:
            if html is not None and note:
                record["warnings"].append(note)
            return html
        # the estimate fell short (text that escapes to much more HTML, thousands of small cells): less, then none
        budget = int(budget * MAX_FEEDBACK_CHARS / size * 0.8) if attempt == 0 else 0
    record["warnings"].append(f"no feedback page: without the notebook's own outputs and cells it is still over "
                              f"{megabytes(MAX_FEEDBACK_CHARS)}")
    return None


def _render_feedback(course: str, assignment: str, student: str, nb_name: str, nb: dict, record: dict) -> str | None:
    out_dir = os.path.join(course, "autograded", student, assignment)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, nb_name), "w", encoding="utf-8") as f:
        json.dump(nb, f)
    notebook_id = os.path.splitext(nb_name)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbconvert's notes on an output it does not show (JavaScript), on cell ids
        result = _nbgrader_api(course).generate_feedback(assignment, student, force=True)
    path = os.path.join(course, "feedback", student, assignment, notebook_id + ".html")
    if not result.get("success") or not os.path.exists(path):
        record["warnings"].append("nbgrader could not write the feedback: "
                                  + str(result.get("error") or result.get("log"))[-300:])
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------
# The class
# ---------------------------------------------------------------------------

def _rejected(assignment: str, student: str, reason: str, intake_warnings, h: str, fp: str, max_score: float,
              cells: list, submitted_at: str | None = None) -> dict:
    return {"version": RESULT_VERSION, "assignment": assignment, "student": student, "hash": h, "fingerprint": fp,
            "status": "rejected", "reason": reason, "warnings": list(intake_warnings),
            "cells": [{"grade_id": g, "points": 0.0, "max_points": p, "passed": False, "visible_passed": None,
                       "saved_passed": None, "flagged": False, "message": f"not graded: {reason}"}
                      for g, p in cells],
            "score": 0.0, "max_score": max_score, "timings": {}, "graded_at": datetime.datetime.now().isoformat(),
            "submitted_at": submitted_at, "feedback": None, "feedback_html": None}


def still_valid(old: dict | None, notebook_hash: str, fingerprint: str, second_backend: str | None) -> bool:
    """Whether a previous record stands for this run: the same notebook, the same grader, graded, and nothing
    left undecided ("needs regrade": every run grades such a submission again until it is decided)."""
    return bool(old) and old.get("hash") == notebook_hash and old.get("fingerprint") == fingerprint \
        and old.get("status") == "graded" and old.get("second_backend") == second_backend \
        and not old.get("needs_regrade")


def _graded_cells(source: dict) -> list[tuple[str, float]]:
    return [(_meta(c)["grade_id"], float(_meta(c).get("points", 0))) for c in source["cells"]
            if _meta(c).get("grade") and not _meta(c).get("solution")]


def no_sandbox_message(why: str) -> str:
    """The refusal of a grading command (a class's, Gradescope's) where the sandbox does not work (`why`:
    sandbox_status's reason)."""
    return (f"no sandbox: {why.rstrip('.')}. Nothing was graded: fix that, or grade without a sandbox with "
            f"--no-sandbox (student code then sees the course's files: see the README's threat model)")


def grade_class(root: str, assignment: str, *, jobs: int | None = None, shard: tuple[int, int] | None = None,
                force: bool = False, isolate: bool = True, memory_bytes: int = 4 * 2**30, max_pids: int = 512,
                budget: float = 600.0, progress: bool = True, students: list[str] | None = None,
                out: str | None = None, log=print, second_backend: str | None = None) -> list[dict]:
    """Grade submitted/*/<assignment>; write graded/<assignment>/<student>.json (or one shard file).

    Returns the records of this run (including the unchanged ones it kept).
    Writes nothing to the gradebook: `write_gradebook` does (or `merge` for shards).
    `second_backend` ("nccl" on a GPU grading node): every test cell runs again with its checks on that
    backend, a note per cell (table, feedback, results.json), no points.
    """
    return grade_classes(root, [assignment], jobs=jobs, shard=shard, force=force, isolate=isolate,
                         memory_bytes=memory_bytes, max_pids=max_pids, budget=budget, progress=progress,
                         students=students, out=out, log=log, second_backend=second_backend)[assignment]


def grade_classes(root: str, assignments: list[str], *, jobs: int | None = None,
                  shard: tuple[int, int] | None = None, force: bool = False, isolate: bool = True,
                  memory_bytes: int = 4 * 2**30, max_pids: int = 512, budget: float = 600.0, progress: bool = True,
                  students: list[str] | None = None, out: str | None = None, log=print,
                  second_backend: str | None = None) -> dict[str, list[dict]]:
    """`grade_class` for several assignments at once: every submission of every assignment in one queue for
    the workers, the longest first, so a worker is never idle while another assignment waits (a class of a
    few submissions per assignment kept one of two workers idle half the time when the assignments were
    graded one after another). assignment -> its records, as `grade_class` returns them."""
    from autograder.grading.sandbox import sandbox_status

    if isolate:
        ok, why = sandbox_status()
        if not ok:
            raise ClassRunError(no_sandbox_message(why))
    # scratch space for each submission's runs: AUTOGRADER_WORKDIR (a large, fast disk), else the temp folder
    scratch = os.environ.get("AUTOGRADER_WORKDIR") or None
    if scratch:
        os.makedirs(scratch, exist_ok=True)
    options = {"isolate": isolate, "memory_bytes": memory_bytes, "max_pids": max_pids, "budget": budget,
               "second_backend": second_backend}
    plans, workbases = {}, []
    try:
        for a in assignments:
            workbases.append(tempfile.mkdtemp(prefix=f"autograder-{a}-", dir=scratch))
            plans[a] = _plan(root, a, workbases[-1], students=students, shard=shard, force=force, **options)
        todo = _longest_first([job for plan in plans.values() for job in plan["todo"]], root)
        if todo:
            saved = set()  # each record is saved as soon as it is done (not in shard runs: their file is last)

            def on_done(rec):
                if _save_record(root, rec):
                    saved.add(_key(rec))
            workers = jobs or os.cpu_count() or 1
            done = _run_jobs(todo, workers, progress, log, None if shard is not None else on_done)
            # a check the machine was too busy to decide is never a verdict: those submissions are graded again,
            # alone (one worker: the machine less loaded by this run); what is still undecided is recorded as
            # "needs regrade" (no points, flagged in the gradebook) and graded again by the next run
            undecided = {_key(r) for r in done if r.get("needs_regrade")}
            again = [job for job in todo if _key(job) in undecided]
            if again:
                log(f"{', '.join(sorted({j['assignment'] for j in again}))}: {len(again)} submission(s) had "
                    f"checks the machine was too busy to decide; grading them again, one at a time")
                retried = {_key(r): r for r in _run_jobs(again, 1, False, log,
                                                          None if shard is not None else on_done)}
                done = [retried.get(_key(r), r) for r in done]
            for r in done:
                plans[r["assignment"]]["records"].append(dict(r, _saved=True) if _key(r) in saved else r)
        from autograder.grading.intake import shown_name

        result = {}
        for a, plan in plans.items():
            for rec in plan["records"]:
                if rec.get("status") in ("rejected", "error") and not rec.get("unchanged"):
                    log(f"  \u2717 {shown_name(rec['student'])}: {rec['reason']}")
            _save(root, a, plan["records"], shard, out)
            result[a] = sorted(plan["records"], key=lambda r: r["student"])
        return result
    finally:
        for w in workbases:
            shutil.rmtree(w, ignore_errors=True)


def _key(job_or_record: dict) -> tuple[str, str]:
    return job_or_record["assignment"], job_or_record["student"]


def _plan(root: str, assignment: str, workbase: str, *, students, shard, force, isolate, memory_bytes, max_pids,
          budget, second_backend) -> dict:
    """One assignment's intake: {"records": the rejected and unchanged submissions' records, "todo": the jobs
    to grade}. Each student's notebook is written under `workbase` for their worker."""
    from autograder.grading.intake import check_submission

    with open(source_notebook(root, assignment), encoding="utf-8") as f:
        source = json.load(f)
    rel_path = release_notebook(root, assignment)
    with open(rel_path, encoding="utf-8") as f:
        release = json.load(f)
    nb_name = os.path.basename(rel_path)
    cells = _graded_cells(source)
    max_score = sum(p for _, p in cells)
    others = {}
    for a in os.listdir(os.path.join(root, "release")):
        if a != assignment and os.path.isdir(os.path.join(root, "release", a)):
            with contextlib.suppress(Exception), open(release_notebook(root, a), encoding="utf-8") as f:
                others[a] = {(_meta(c) or {}).get("grade_id") for c in json.load(f)["cells"]} - {None}
    fp = grader_fingerprint(root, assignment)
    everyone = students if students is not None else submissions(root, assignment)
    if shard is not None:
        everyone = shard_of(everyone, *shard)
    previous = read_results(root, assignment)
    records, todo = [], []
    for student in everyone:
        try:  # every step of one student here (intake, the paths named by them, the work file): theirs alone
            try:
                intake = check_submission(os.path.join(root, "submitted", student, assignment), release, nb_name,
                                          others, student=student)
            except Exception as exc:  # noqa: BLE001 - one student's file never stops the class
                from autograder.grading.intake import Intake

                intake = Intake(student=student, reason=f"the grader could not read this submission "
                                                        f"({type(exc).__name__}: {str(exc)[:300]})")
            if intake.notebook is None:
                h = hashlib.sha256(intake.reason.encode()).hexdigest()[:16]
                records.append(_rejected(assignment, student, intake.reason, intake.warnings, h, fp, max_score,
                                         cells, intake.submitted_at))
                continue
            text = json.dumps(intake.notebook, sort_keys=True)
            h = hashlib.sha256(text.encode()).hexdigest()[:16]
            old = previous.get(student)
            if not force and still_valid(old, h, fp, second_backend):
                records.append(dict(old, unchanged=True))
                continue
            path = os.path.join(_ensure(os.path.join(workbase, "notebooks")), f"{student}.ipynb")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            todo.append({"root": root, "assignment": assignment, "student": student, "notebook": path,
                         "notebook_name": nb_name, "hash": h, "fingerprint": fp, "warnings": intake.warnings,
                         "max_score": max_score, "cells": cells, "workbase": workbase, "isolate": isolate,
                         "memory_bytes": memory_bytes, "max_pids": max_pids, "budget": budget,
                         "saw": intake.saw, "submitted_at": intake.submitted_at,
                         "second_backend": second_backend})
        except Exception as exc:  # noqa: BLE001 - one student's submission never stops the class
            rec = _rejected(assignment, student, f"the grader failed taking in this submission "
                            f"({type(exc).__name__}: {str(exc)[:300]})", [], "", fp, max_score, cells)
            records.append(dict(rec, status="error"))
    if todo:
        template = _cached_template(root, assignment, fp)
        for job in todo:
            job["template"] = template
    return {"records": records, "todo": todo}


def _longest_first(todo: list[dict], root: str) -> list[dict]:
    """The jobs in the order that ends soonest on a few workers: the assignments whose submissions take
    longest first (each assignment's median time in its last records; an assignment graded never before by
    its number of test cells, 1 s each), each assignment's submissions in the order they were given."""
    cost: dict[str, float] = {}
    for job in todo:
        a = job["assignment"]
        if a not in cost:
            times = sorted(r["timings"]["total"] for r in read_results(root, a).values()
                           if isinstance(r.get("timings"), dict)
                           and isinstance(r["timings"].get("total"), (int, float)))
            cost[a] = times[len(times) // 2] if times else float(len(job["cells"]))
    return sorted(todo, key=lambda job: -cost[job["assignment"]])


# What every grading worker imports (the grader's side of the checks, the sandbox and its fork server, nbgrader's
# feedback): imported once per grading process, by multiprocessing's fork server, which then forks each worker
# (a spawned worker imported all of it again: 1-1.5 CPU-seconds each, at every start of the command).
_WORKER_PRELOAD = ["torch", "autograder.grading.trusted", "autograder.grading.sandbox", "autograder.grading.forkserver",
                   "autograder.grading.feedback", "nbgrader.api", "nbgrader.apps.api"]


def _worker_context():
    """Workers forked from multiprocessing's fork server (a process of its own that imported `_WORKER_PRELOAD`
    and nothing of this process's state), or spawned (`AUTOGRADER_WORKER_START=spawn`, or where there is no
    fork server). Either way a worker starts with this process's sys.path, working folder and, sent with it,
    environment (`_worker`)."""
    if os.environ.get("AUTOGRADER_WORKER_START") == "spawn" \
            or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_WORKER_PRELOAD)
    return ctx


def _worker(conn, environ: dict | None = None) -> None:
    """A grading worker: grade the jobs it is sent, one at a time, until told to stop (None). `environ`: the
    grading process's environment when it started this worker (a forked worker has its fork server's)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
        tempfile.tempdir = None  # the temp folder named there (TMPDIR), not the one its fork server looked up
    try:
        while True:
            try:
                job = conn.recv()
            except EOFError:
                return
            if job is None:
                return
            conn.send(grade_one(job))
    finally:
        # what the worker registered to be undone at its exit (its fork server stopped, its scratch folders
        # removed): a forked multiprocessing process ends with os._exit, which runs no atexit function
        atexit._run_exitfuncs()


def _died(job: dict, why: str) -> dict:
    rec = _rejected(job["assignment"], job["student"], why, job["warnings"], job["hash"], job["fingerprint"],
                    job["max_score"], job.get("cells", []), job.get("submitted_at"))
    rec["status"] = "error"
    return rec


def _run_jobs(todo: list[dict], jobs: int, progress: bool, log, on_done=None) -> list[dict]:
    """Grade the jobs in `jobs` worker processes (`_worker_context`: no state from this process), with a progress
    bar.

    Each worker grades one submission at a time, so the one whose worker dies (killed for its memory,
    a crash of the grader) is known: the worker is replaced and that submission graded once more; if it
    dies again, the record says so and the others are graded all the same."""
    from multiprocessing.connection import wait

    results = []
    bar = None
    if progress:
        from tqdm import tqdm

        names = sorted({job["assignment"] for job in todo})
        bar = tqdm(total=len(todo), unit="notebook", desc=f"grading {names[0]}" if len(names) == 1 else
                   f"grading {len(names)} assignments", dynamic_ncols=True, file=sys.stdout)
    ctx = _worker_context()
    queue = list(todo)
    attempts: dict[tuple[str, str], int] = {}
    busy: dict = {}  # connection -> (process, job or None)

    def start_worker():
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, dict(os.environ)), daemon=True)
        proc.start()
        child.close()
        busy[parent] = (proc, None)

    def finish(rec):
        results.append(rec)
        if on_done is not None:
            on_done(rec)
        if bar is not None:
            if rec.get("status") != "graded":
                where = rec["student"] if len(names) == 1 else f"{rec['student']} ({rec['assignment']})"
                bar.write(f"  \u2717 {where}: {rec['reason']}")
            bar.update(1)

    for _ in range(max(1, min(jobs, len(todo)))):
        start_worker()
    try:
        while queue or any(job is not None for _, job in busy.values()):
            for conn, (proc, job) in list(busy.items()):
                if job is None and queue:
                    job = queue.pop(0)
                    attempts[_key(job)] = attempts.get(_key(job), 0) + 1
                    try:
                        conn.send(job)
                        busy[conn] = (proc, job)
                    except (OSError, ValueError):
                        queue.insert(0, job)
                        attempts[_key(job)] -= 1
            ready = wait([c for c, (_, j) in busy.items() if j is not None]
                         + [p.sentinel for p, j in busy.values() if j is not None])
            for conn, (proc, job) in list(busy.items()):
                if job is None:
                    continue
                rec = None
                if conn in ready:
                    try:
                        rec = conn.recv()
                    except (EOFError, OSError):
                        rec = None
                elif proc.sentinel not in ready:
                    continue
                if rec is not None:
                    busy[conn] = (proc, None)
                    finish(rec)
                    continue
                # the worker died with this submission
                proc.join(5)
                code = proc.exitcode
                del busy[conn]
                conn.close()
                start_worker()
                why = (f"the grading worker died while grading this submission (exit code {code}"
                       + (", killed by signal %d" % -code if code is not None and code < 0 else "") + ")")
                if attempts[_key(job)] < 2:
                    log(f"  ! {job['assignment']}/{job['student']}: {why}; grading it once more")
                    queue.insert(0, job)
                else:
                    finish(_died(job, why + " twice; the other submissions were graded"))
    finally:
        for conn, (proc, _) in busy.items():
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for conn, (proc, _) in busy.items():
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            conn.close()
        if bar is not None:
            bar.close()
    return results


def _save(root: str, assignment: str, records: list[dict], shard, out: str | None) -> None:
    folder = os.path.join(root, GRADED, assignment)
    os.makedirs(folder, exist_ok=True)
    if shard is not None:
        path = out or shard_path(root, assignment, *shard)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"assignment": assignment, "shard": list(shard), "records": records}, f)
        os.replace(path + ".tmp", path)
        return
    for rec in records:
        if not rec.get("unchanged") and not rec.pop("_saved", False):
            _save_record(root, rec)


def _save_record(root: str, rec: dict) -> bool:
    """Write one student's record and feedback (`_write_record`); what fails costs that student alone: the
    record then says why (status "error"). A student rejected for the folder's name has no file that can be
    named by it: the record is in the run's table (and a shard's file) only. True if it was written."""
    from autograder.grading.intake import student_name_problem

    if student_name_problem(rec["student"]):
        return False
    try:
        _write_record(root, rec)
        return True
    except Exception as exc:  # noqa: BLE001 - one student's record never stops the class
        rec.update(status="error", reason=f"the grader could not save this submission's record or feedback "
                                          f"({type(exc).__name__}: {str(exc)[:300]})")
        return False


def _write_record(root: str, rec: dict) -> None:
    rec = {k: v for k, v in rec.items() if k not in ("unchanged", "_saved")}
    html = rec.get("feedback_html")
    if html is not None:
        nb_dir = os.path.join(root, "feedback", rec["student"], rec["assignment"])
        os.makedirs(nb_dir, exist_ok=True)
        name = os.path.splitext(os.path.basename(release_notebook(root, rec["assignment"])))[0] + ".html"
        with open(os.path.join(nb_dir, name), "w", encoding="utf-8") as f:
            f.write(html)
        rec["feedback"] = os.path.relpath(os.path.join(nb_dir, name), root)
    path = result_path(root, rec["assignment"], rec["student"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=1)
    os.replace(path + ".tmp", path)


def merge_results(root: str, files: list[str]) -> list[dict]:
    """Fold shard files into graded/ (and the feedback folders); idempotent. The merged records."""
    bundles = []
    for path in files:  # every file read first: one that is not a shard file stops the merge before it writes
        try:
            with open(path, encoding="utf-8") as f:
                bundle = json.load(f)
        except (OSError, ValueError) as exc:
            raise ClassRunError(f"cannot read the shard file {path}: {exc}") from None
        if not isinstance(bundle, dict) or not isinstance(bundle.get("records"), list):
            raise ClassRunError(f"{path} is not a shard file of `autograde --shard` (no records in it); the shard "
                                f"files are graded/<assignment>/{SHARDS}/shard-I-of-N.json")
        bundles.append(bundle)
    merged = []
    for bundle in bundles:
        for rec in bundle["records"]:
            _save_record(root, rec)
            merged.append(rec)
    return merged


# ---------------------------------------------------------------------------
# The gradebook: the main process is its only writer
# ---------------------------------------------------------------------------

def _gradebook_state(db: str, assignment: str) -> tuple[set[str] | None, bool]:
    """(the tables of sqlite file `db`, or None where there is none; whether it holds `assignment` with its
    notebook), read only: never creates the file (opening nbgrader's Gradebook on a missing file does)."""
    import pathlib
    import sqlite3

    if not os.path.isfile(db):
        return None, False
    try:
        con = sqlite3.connect(pathlib.Path(db).absolute().as_uri() + "?mode=ro", uri=True, timeout=60)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            held = {"alembic_version", "assignment", "notebook"} <= tables and con.execute(
                "SELECT 1 FROM assignment a JOIN notebook n ON n.assignment_id = a.id WHERE a.name = ?",
                (assignment,)).fetchone() is not None
            return tables, held
        finally:
            con.close()
    except sqlite3.Error:
        return None, False


def gradebook_holds(root: str, assignment: str) -> bool:
    """Whether root/gradebook.db is a whole nbgrader gradebook (alembic's version stamped) holding `assignment`."""
    return _gradebook_state(os.path.join(root, "gradebook.db"), assignment)[1]


def ensure_gradebook(root: str, assignment: str, log=print) -> bool:
    """Make gradebook.db hold `assignment` as `make build` leaves it, if it does not yet (a fresh clone:
    release/ and source/ are committed, the gradebook is not). The caller holds the course's lock.

    nbgrader's generate_assignment of source/<assignment> runs in a scratch folder beside the gradebook, on a
    copy of it (its other assignments and grades kept), with this interpreter's bin/ first on PATH (nbgrader
    runs `alembic` from PATH); the result replaces gradebook.db in one rename, after a backup: a failure
    leaves the gradebook as it was, never half-made. True when it was made or changed."""
    if gradebook_holds(root, assignment):
        return False
    src = os.path.join(root, "source", assignment)
    if not glob.glob(os.path.join(src, "*.ipynb")):
        raise ClassRunError(f"{assignment} is not in the gradebook and there is no source/{assignment}/*.ipynb "
                            f"to add it from: run `make build` in the course root first")
    db = os.path.join(root, "gradebook.db")
    tables = _gradebook_state(db, assignment)[0]
    whole = bool(tables) and "alembic_version" in tables  # else none, or half-made by nbgrader without alembic
    work = tempfile.mkdtemp(prefix=".gradebook-", dir=root)
    try:
        shutil.copy2(os.path.join(root, "nbgrader_config.py"), work)
        shutil.copytree(src, os.path.join(work, "source", assignment))
        if whole:  # keep what it holds
            import sqlite3

            con, dst = sqlite3.connect(db, timeout=60), sqlite3.connect(os.path.join(work, "gradebook.db"))
            try:
                con.backup(dst)
            finally:
                con.close()
                dst.close()
        exe = os.path.join(os.path.dirname(sys.executable), "nbgrader")
        proc = subprocess.run([exe if os.path.exists(exe) else "nbgrader", "generate_assignment", assignment,
                               "--force", "--log-level=ERROR"], cwd=work, env=_nbgrader_env(root),
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not gradebook_holds(work, assignment):
            raise ClassRunError(f"could not add {assignment} to the gradebook (nbgrader generate_assignment of "
                                f"source/{assignment}, exit {proc.returncode}); gradebook.db is unchanged:\n"
                                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        backup_gradebook(root)
        os.replace(os.path.join(work, "gradebook.db"), db)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"gradebook.db: {'now holds ' + assignment if whole else 'made'} "
        f"(nbgrader generate_assignment of source/{assignment}, as `make build` does; no grades yet)")
    return True


def write_gradebook(root: str, assignment: str, records: list[dict]) -> None:
    """Scores per cell into nbgrader's gradebook; flags as "needs manual grade" and a comment."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.intake import parse_timestamp, student_name_problem

    # a student rejected for the folder's name is not entered under that name (the run's table shows them)
    records = [r for r in records if not student_name_problem(r["student"])]
    if not records:
        return
    ensure_gradebook(root, assignment)  # never a half-made gradebook.db (nbgrader's own creation needs alembic)
    notebook_id = os.path.splitext(os.path.basename(release_notebook(root, assignment)))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's "not in session" notes from nbgrader's own queries
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            try:
                gb.find_assignment(assignment)
            except MissingEntry:
                raise ClassRunError(f"{assignment} is not in the gradebook: run `make build` (nbgrader "
                                    f"generate_assignment) first") from None
            solution_cells = [c.name for c in gb.find_notebook(notebook_id, assignment).solution_cells]
            for rec in records:
                gb.update_or_create_student(rec["student"])
                # when the student submitted (nbgrader's timestamp.txt, read at intake), as nbgrader's autograde
                # records it; never the grading time
                stamp = parse_timestamp(rec.get("submitted_at"))
                gb.update_or_create_submission(assignment, rec["student"], timestamp=stamp)
                for c in rec["cells"]:
                    try:
                        grade = gb.find_grade(c["grade_id"], notebook_id, assignment, rec["student"])
                    except MissingEntry:
                        continue
                    if c.get("inconclusive"):  # not decided: no score at all (never a 0), for a person or a rerun
                        grade.auto_score = None
                        grade.needs_manual_grade = True
                        continue
                    grade.auto_score = c["points"]
                    grade.needs_manual_grade = bool(c.get("flagged")) or rec["status"] != "graded"
                note = _note(rec)
                if solution_cells:
                    comment = gb.find_comment(solution_cells[0], notebook_id, assignment, rec["student"])
                    comment.auto_comment = note
                gb.db.commit()


def _note(rec: dict) -> str | None:
    if rec["status"] != "graded":
        return f"Not graded: {rec['reason']}"
    if rec.get("needs_regrade"):
        return ("Needs regrade (infrastructure): the grading machine was too busy to decide "
                + ", ".join(rec["needs_regrade"]) + "; the next `autograde` run grades this submission again.")
    forged = [c for c in rec["cells"] if c.get("flag")]
    if forged:
        return (f"Review this submission: {forged[0]['flag']} (flagged: "
                + ", ".join(c["grade_id"] for c in forged) + ").")
    flagged = [c["grade_id"] for c in rec["cells"] if c.get("flagged")]
    if flagged:
        return ("The notebook's own run and the trusted grader disagree on " + ", ".join(flagged)
                + "; the trusted verdict is the grade. Review this submission.")
    return None
