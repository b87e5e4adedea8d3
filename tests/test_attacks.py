"""A catalogue of attacks and faults, each one student's submission, graded together in one class run.

    .venv/bin/python -m pytest -q -s tests/test_attacks.py

Each case is a notebook of the cut-down course (tests/grading_course.py: two
graded cells, 6 points each) with one attack or fault added to an answer
cell, or to the notebook file. After one `autograde --jobs 2` of the whole
class, every case must have its honest score (0 for an unfinished notebook
however it tries to inflate it, 12 for a correct one whatever else it does,
6 where the fault breaks one function), every student must be graded with
feedback or have a named reason, and nothing may be left behind: no
process, no lock, no change to the gradebook after the run, no file the
grader was tricked into writing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from grading_course import (A, edit, gradebook, make_mini_course, needs_sandbox, notebook_name, records,
                            reference, release, run_grade, write_submission)

TOKEN = uuid.uuid4().hex[:8]
CGROUPS = os.access("/sys/fs/cgroup/pids", os.W_OK) or os.path.exists("/sys/fs/cgroup/cgroup.controllers")
CELL = "tp_mappings"  # the answer cell the attacks are written into
ROOT_EXPR = "__import__('os').path.dirname(__import__('os').path.dirname(__import__('autograder').__file__))"

# each test grades a class (or runs the whole catalogue in its fixture)
pytestmark = [pytest.mark.timeout(3600), needs_sandbox]


@dataclass
class Case:
    name: str
    base: str            # "untouched" (honest score 0) or "reference" (honest score 12)
    code: str = ""       # appended to the answer cell
    expected: float = 0.0
    notebook: object = None  # a callable(course) -> the notebook (dict or raw text), instead of base + code
    reason: str = ""     # for a submission that cannot be graded: part of the reason
    zygote: str = ""     # who served the trusted run: "the notebook's kernel" or "an interpreter of its own"


CASES = [
    # -- inflating an unfinished notebook's score (the trusted grader runs none of this) -------------------
    Case("checks_redefined_as_noops", "untouched",
         "check_mapping = lambda *a, **k: None\nchecking = __import__('contextlib').nullcontext"),
    Case("check_code_replaced_in_place", "untouched",
         "import autograder.checks.tensor_parallel as _m\n_m.check_mapping.__code__ = (lambda *a, **k: None).__code__"),
    Case("custom_exc_and_post_run_hook", "untouched",
         "try:\n    _ip = get_ipython()\n    _ip.set_custom_exc((BaseException,), lambda *a, **k: None)\n"
         "    _ip.events.register('post_run_cell', lambda r: setattr(r, 'error_in_exec', None))\n"
         "except NameError:\n    pass"),
    Case("input_transformer_wraps_every_cell", "untouched",
         "try:\n    get_ipython().input_transformers_post.append(lambda lines: ['try:\\n'] + "
         "['    ' + l for l in lines] + ['\\nexcept BaseException:\\n    pass\\n'])\nexcept NameError:\n    pass"),
    Case("ast_transformer_wraps_every_cell", "untouched",
         "import ast as _ast\nclass _Wrap(_ast.NodeTransformer):\n    def visit_Module(self, node):\n"
         "        t = _ast.Try(body=node.body or [_ast.Pass()], handlers=[_ast.ExceptHandler(type=None, name=None, "
         "body=[_ast.Pass()])], orelse=[], finalbody=[])\n        node.body = [t]\n"
         "        return _ast.fix_missing_locations(node)\ntry:\n    get_ipython().ast_transformers.append(_Wrap())\n"
         "except NameError:\n    pass"),
    Case("run_distributed_returns_nothing", "untouched",
         "import autograder.checks.tensor_parallel as _m\n_m.run_distributed = lambda *a, **k: []"),
    Case("comparisons_made_noops", "untouched",
         "import autograder.checks.tensor_parallel as _m\n_m.assert_close = lambda *a, **k: None\n"
         "_m._expect_mapping_comm = lambda *a, **k: None\n_m.check_consistent = lambda *a, **k: None"),
    Case("checking_swallows_failures", "untouched",
         "import contextlib as _c\n@_c.contextmanager\ndef checking(*a, **k):\n    try:\n        yield\n"
         "    except BaseException:\n        pass\nimport autograder.runtime.report as _r\n_r.checking = checking"),
    Case("reference_solutions_read_from_source", "untouched",
         "import glob as _g, json as _j, re as _re\nfor _p in _g.glob(" + ROOT_EXPR + " + '/source/*/*.ipynb'):\n"
         "    for _c in _j.load(open(_p))['cells']:\n        if 'copy_to_tensor' in ''.join(_c['source']):\n"
         "            exec(_re.sub('### (BEGIN|END) SOLUTION', '', ''.join(_c['source'])))"),
    Case("solutions_module_imported", "untouched",
         "import sys as _s\n_s.path.insert(0, " + ROOT_EXPR + ")\ntry:\n"
         "    from solutions.tensor_parallel.mappings import *  # noqa\nexcept ImportError:\n    pass"),
    Case("system_exit_in_the_cell", "untouched", "raise SystemExit(0)"),
    Case("detached_process_rewrites_the_gradebook", "untouched",
         "import subprocess as _sp, sys as _s\n_sp.Popen([_s.executable, '-c', 'import time, sqlite3; time.sleep(4); "
         "db = sqlite3.connect(\"' + " + ROOT_EXPR + " + '/gradebook.db\"); db.execute(\"update grade set "
         "auto_score = 99\"); db.commit()'], start_new_session=True, stdout=_sp.DEVNULL, stderr=_sp.DEVNULL)"),
    Case("forged_replies_on_every_descriptor", "untouched",
         "import os as _o, json as _j\nfor _fd in range(3, 40):\n    for _i in range(1, 30):\n        try:\n"
         "            _o.write(_fd, (_j.dumps({'id': _i, 'ok': True}) + '\\n').encode())\n"
         "        except OSError:\n            break"),
    Case("parent_process_killed", "untouched", "import os as _o, signal as _sg\n_o.kill(_o.getppid(), _sg.SIGKILL)"),
    # -- reading what a submission must not see (a correct notebook: its score stays 12) --------------------
    Case("reads_the_solutions", "reference",
         "try:\n    print(open(" + ROOT_EXPR + " + '/solutions/tensor_parallel/mappings.py').read())\n"
         "except OSError as _e:\n    print('no solutions here:', type(_e).__name__)", 12),
    Case("reads_the_hidden_tests", "reference",
         "import glob as _g\nfor _p in _g.glob(" + ROOT_EXPR + " + '/source/*/*.ipynb'):\n    print(open(_p).read())", 12),
    Case("reads_the_gradebook", "reference",
         "try:\n    print(open(" + ROOT_EXPR + " + '/gradebook.db', 'rb').read()[:100])\n"
         "except OSError as _e:\n    print('no gradebook here:', type(_e).__name__)", 12),
    Case("reads_other_students", "reference",
         "import glob as _g\nprint(_g.glob(" + ROOT_EXPR + " + '/submitted/*/*/*'))", 12),
    Case("reads_the_tests", "reference",
         "import glob as _g\nprint(_g.glob(" + ROOT_EXPR + " + '/tests/*.py'))", 12),
    Case("writes_into_the_course", "reference",
         "for _f in ('/gradebook.db', '/release/PWNED', '/source/PWNED'):\n    try:\n"
         "        open(" + ROOT_EXPR + " + _f, 'w').write('pwned')\n    except OSError:\n        pass", 12),
    Case("reaches_the_network", "reference",
         "import socket as _so\ntry:\n    _so.create_connection(('pypi.org', 443), timeout=3)\n"
         "    print('NETWORK', 'REACHED', sep='_')\nexcept OSError as _e:\n    print('no network:', type(_e).__name__)", 12),
    Case("returns_a_pickle_that_runs_code", "reference",
         "import torch as _t\nclass _Evil(_t.Tensor):\n    def __reduce_ex__(self, proto):\n"
         "        return (open, ('/tmp/pwned-" + TOKEN + "', 'w'))\n_orig_copy = copy_to_tensor_model_parallel_region\n"
         "def copy_to_tensor_model_parallel_region(input_, *, group):\n"
         "    return _orig_copy(input_, group=group).as_subclass(_Evil)", 6),
    # -- breaking the run ----------------------------------------------------------------------------------
    Case("kernel_exits_at_once", "reference", "import os as _o\n_o._exit(0)", 0),
    Case("hangs_ignoring_interrupts", "reference",
         "import signal as _sg\n_sg.signal(_sg.SIGINT, _sg.SIG_IGN)\nwhile True:\n    pass", 0),
    Case("sleeps_in_every_call", "reference",
         "import time as _tm\n_orig_reduce = reduce_from_tensor_model_parallel_region\n"
         "def reduce_from_tensor_model_parallel_region(input_, *, group):\n    _tm.sleep(1000)\n", 6),
    Case("six_gib_in_one_rank", "reference",
         "import torch as _t\n_orig_copy = copy_to_tensor_model_parallel_region\n"
         "def copy_to_tensor_model_parallel_region(input_, *, group):\n"
         "    _t.ones(6 * 2**30, dtype=_t.uint8)\n    return _orig_copy(input_, group=group)", 6),
    # a process-count limit needs a writable cgroup (root does not obey RLIMIT_NPROC): without one, the
    # processes are made and the function still returns the right numbers
    Case("thousands_of_processes", "reference",
         "import subprocess as _sp\n_orig_copy = copy_to_tensor_model_parallel_region\n"
         "def copy_to_tensor_model_parallel_region(input_, *, group):\n"
         "    _ps = [_sp.Popen(['sleep', '60']) for _ in range(3000)]\n    return _orig_copy(input_, group=group)",
         6 if CGROUPS else 12),
    Case("fifty_megabytes_on_one_line", "reference", "print('x' * 50_000_000)", 12),
    Case("fills_the_disk", "reference",
         "try:\n    with open('big.bin', 'wb') as _f:\n        for _ in range(40):\n"
         "            _f.write(b'0' * 100_000_000)\nexcept OSError as _e:\n    print('write stopped:', _e)", 12),
    Case("hidden_test_marker_in_a_comment", "reference", "# ### BEGIN HIDDEN TESTS\n# ### END HIDDEN TESTS", 12),
    # -- the live kernel serves the trusted run: one that cannot, or lies, changes nothing ---------------------
    Case("breaks_the_kernels_serving", "reference", "import autograder.grading.trusted as _t\n_t.serve_kernel = None", 12,
         zygote="an interpreter of its own"),
    # the course's runner, broken in the notebook's own processes: the given cells that run code fail there
    # (as in the student's kernel), and the notebook scores 0, with the reason, not a grader error
    Case("breaks_the_course_runner_it_runs_on", "reference",
         "import sys as _s\n_s.modules['autograder.grading.trusted'] = None", 0, zygote="an interpreter of its own"),
    Case("serving_never_answers", "reference",
         "import autograder.grading.trusted as _t\n_t.serve_kernel = lambda *a, **k: __import__('time').sleep(10**6)", 12,
         zygote="an interpreter of its own"),
    Case("serving_claims_every_request_succeeded", "untouched",
         "import autograder.grading.trusted as _t, json as _j\n"
         "def _forged(stream, message):\n    stream.write(_j.dumps({**message, 'ok': True}) + '\\n')\n"
         "    stream.flush()\n_t._send = _forged", 0, zygote="the notebook's kernel"),
    # -- the notebook file ---------------------------------------------------------------------------------
    Case("test_cell_marked_not_graded", "untouched",
         notebook=lambda course: _retag(release(course), "test_copy_to_region", grade=False)),
    Case("test_cell_points_raised", "reference", expected=12,
         notebook=lambda course: _retag(reference(course), "test_copy_to_region", points=600)),
    Case("duplicate_grade_id", "reference", reason="appear more than once",
         notebook=lambda course: _duplicate(reference(course))),
    Case("invalid_json", "reference", reason="is not a valid notebook", notebook=lambda course: '{"cells": [oops'),
    Case("another_assignments_notebook", "reference", reason="01_data_parallel's notebook",
         notebook=lambda course: json.load(open(os.path.join(course, "release", "01_data_parallel",
                                                             "data_parallel_lab.ipynb")))),
]


def _retag(nb: dict, grade_id: str, **changes) -> dict:
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") == grade_id:
            meta.update(changes)
    return nb


def _duplicate(nb: dict) -> dict:
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == CELL)
    nb["cells"].append(copy.deepcopy(cell))
    return nb


def _student(case: Case) -> str:
    return case.name.replace("_", "-")


def _processes_mentioning(*needles: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if any(n in cmd or cwd.startswith(n) for n in needles):
            out.append(f"{pid}: {cmd[:150]} (in {cwd})")
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = make_mini_course(tmp_path_factory.mktemp("attacks"))
    for case in CASES:
        if case.notebook is not None:
            nb = case.notebook(course)
        else:
            base = reference(course) if case.base == "reference" else release(course)
            nb = edit(base, CELL, lambda s, code=case.code: s + "\n\n" + code + "\n") if case.code else base
        write_submission(course, _student(case), nb)
    write_submission(course, "honest-reference", reference(course))
    t0 = time.monotonic()
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--budget", "30", "--memory", "2", "--quiet",
                     timeout=3600)
    seconds = time.monotonic() - t0
    print(proc.stdout[-6000:])
    print(f"\n{len(CASES) + 1} submissions graded in {seconds:.0f} s")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    db = os.path.join(course, "gradebook.db")
    digest = hashlib.sha256(open(db, "rb").read()).hexdigest()
    time.sleep(6)  # long enough for a detached process to have struck
    return course, records(course), digest, proc.stdout


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_gets_its_honest_score(graded, case):
    course, recs, _, _ = graded
    rec = recs[_student(case)]
    if case.reason:
        assert rec["status"] == "rejected" and case.reason in rec["reason"], rec["reason"]
        assert rec["score"] == 0
        return
    assert rec["status"] == "graded", rec["reason"]
    assert rec["score"] == case.expected, (rec["score"], [(c["grade_id"], c["message"][:300]) for c in rec["cells"]])
    if case.zygote:
        assert rec["trusted_zygote"] == case.zygote, rec["trusted_zygote"]
    feedback = os.path.join(course, "feedback", _student(case), A, notebook_name(course).replace(".ipynb", ".html"))
    assert os.path.exists(feedback), "no feedback"
    html = open(feedback, encoding="utf-8").read()
    assert len(html) < 3_000_000, f"feedback of {len(html)} characters"
    for secret in ["### BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "NETWORK_REACHED", *_secrets(course)]:
        assert secret not in html, f"the feedback of {case.name} shows {secret!r}"


def _secrets(course: str) -> list[str]:
    """Text only the course root holds: the solution module's first line, the hidden tests' lines."""
    import nbformat

    from course import secret_lines

    with open(os.path.join(course, "solutions", "tensor_parallel", "mappings.py"), encoding="utf-8") as f:
        first = f.readline().strip().strip('"')
    source = nbformat.read(os.path.join(course, "source", A, notebook_name(course)), as_version=4)
    return [first] + [line for line in secret_lines(source)[1] if len(line) > 20]


def test_the_honest_reference_among_them_gets_full_marks(graded):
    _, recs, _, _ = graded
    assert recs["honest-reference"]["score"] == 12
    # the fast path: nbgrader's kernel, still alive after the last cell, served the trusted run
    assert recs["honest-reference"]["trusted_zygote"] == "the notebook's kernel"


def test_nothing_is_left_behind_and_nothing_changes_afterwards(graded):
    course, recs, digest, _ = graded
    assert hashlib.sha256(open(os.path.join(course, "gradebook.db"), "rb").read()).hexdigest() == digest, \
        "the gradebook changed after the run ended"
    book = gradebook(course)
    assert all(score <= 6 for cells in book.values() for score in cells.values())
    assert not os.path.exists(f"/tmp/pwned-{TOKEN}"), "the grader ran code sent back by a submission"
    for f in ("release/PWNED", "source/PWNED"):
        assert not os.path.exists(os.path.join(course, f))
    leftover = _processes_mentioning(course)
    assert not leftover, "processes left behind:\n" + "\n".join(leftover)
    lock = open(os.path.join(course, ".autograde.lock")).read()
    assert lock == "", f"the lock is still held: {lock}"


def test_a_gradebook_held_locked_by_another_process_is_waited_for(graded):
    """sqlite has one writer: a process holding the database for 10 s delays the run, it does not break it."""
    course, _, _, _ = graded
    db = sqlite3.connect(os.path.join(course, "gradebook.db"), timeout=1, isolation_level=None,
                         check_same_thread=False)
    db.execute("begin exclusive")
    release_at = time.monotonic() + 10
    threading.Timer(10, lambda: db.execute("commit")).start()
    write_submission(course, "late-student", reference(course))
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.monotonic() >= release_at - 0.5
    assert gradebook(course)["late-student"] == {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0}
    proc = run_grade(course, "scores")
    assert proc.returncode == 0 and "late-student" in proc.stdout


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30
