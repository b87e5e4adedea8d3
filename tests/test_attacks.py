"""A catalogue of attacks and faults, each one student's submission, graded together in one class run.

    .venv/bin/python -m pytest -q -s tests/test_attacks.py

Each case is a notebook of the cut-down course (tests/grading_course.py: two
graded cells, 6 points each, and here also 02's argument-error cell, 5
points, whose verdict rests on what the ranks report) with one attack or
fault added to an answer cell, or to the notebook file. After one
`autograde --jobs 2` of the whole class, every case must have its honest
score on the two cells (0 for an unfinished notebook however it tries to
inflate it, 12 for a correct one whatever else it does, 6 where the fault
breaks one function), the cells a case forges in its own process must score
0 or be flagged for review, every student must be graded with feedback or
have a named reason, and nothing may be left behind: no process, no lock, no
change to the gradebook after the run, no file the grader was tricked into
writing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from autograder.grading.feedback import MAX_FEEDBACK_CHARS, MAX_RECORD_CHARS, page_chars
from grading_course import (A, KEEP, edit, env, gradebook, make_mini_course, needs_sandbox, notebook_name, records,
                            reference, release, run_grade, write_submission)
from test_forged_verdicts import REBIND_THE_RUNNER, REPLACE_THE_RUNNERS_CODE

TOKEN = uuid.uuid4().hex[:8]
CGROUPS = os.access("/sys/fs/cgroup/pids", os.W_OK) or os.path.exists("/sys/fs/cgroup/cgroup.controllers")
CELL = "tp_mappings"  # the answer cell the attacks are written into
ARGS = "test_argument_errors"  # a cell whose verdict rests on what the ranks report (the error's type and words)
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
    message: str = ""    # part of the message of every cell that lost points
    forged: tuple = ()   # cells the attack forges in its own process: 0 points, or flagged


# code run on the process the student's cells run in was forked from: the fork server, where there is one
_ON_THE_SERVER = ("import os as _o, signal as _s, resource as _r\n"
                  "_p = _o.getppid()\n"
                  "if b'_server_main' in open(f'/proc/{{_p}}/cmdline', 'rb').read():\n"
                  "    {}\n")

CASES = [
    # -- inflating an unfinished notebook's score (the trusted grader runs none of this) -------------------
    Case("checks_redefined_as_noops", "untouched",
         "check_mapping = lambda *a, **k: None\nchecking = __import__('contextlib').nullcontext"),
    Case("check_code_replaced_in_place", "untouched",
         "import autograder.checks.tensor_parallel.mappings as _m\n"
         "_m.check_mapping.__code__ = (lambda *a, **k: None).__code__"),
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
         "import autograder.checks.tensor_parallel as _tp\nfor _m in (_tp.mappings, _tp.layers, _tp.loss):\n"
         "    _m.run_distributed = lambda *a, **k: []"),
    Case("comparisons_made_noops", "untouched",
         "import autograder.checks.tensor_parallel.mappings as _m\n_m.assert_close = lambda *a, **k: None\n"
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
    Case("sleeps_in_a_cell", "reference", "import time as _tm\n_tm.sleep(10**6)", 0,
         message="asleep, not slowed by a busy machine"),
    Case("sleeps_in_every_call", "reference",
         "import time as _tm\n_orig_reduce = reduce_from_tensor_model_parallel_region\n"
         "def reduce_from_tensor_model_parallel_region(input_, *, group):\n    _tm.sleep(1000)\n", 6),
    Case("six_gib_in_one_rank", "reference",
         "import torch as _t\n_orig_copy = copy_to_tensor_model_parallel_region\n"
         "def copy_to_tensor_model_parallel_region(input_, *, group):\n"
         "    _t.ones(6 * 2**30, dtype=_t.uint8)\n    return _orig_copy(input_, group=group)", 6,
         message="out of memory (limit 2 GiB)"),
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
    # -- the student's process and its channel to the grader -----------------------------------------------------
    # the course's runner, broken in the notebook's own processes: the given cells that run code fail there
    # (as in the student's kernel), and the notebook scores 0, with the reason, not a grader error
    Case("breaks_the_course_runner_it_runs_on", "reference",
         "import sys as _s\n_s.modules['autograder.runtime.plaindata'] = None", 0),
    Case("replaces_the_checks_rank_program", "untouched",
         "import autograder.checks.tensor_parallel as _tp\nfor _m in (_tp.mappings, _tp.layers, _tp.loss):\n"
         "    for _n in dir(_m):\n        if _n.endswith('_rank') and callable(getattr(_m, _n)):\n"
         "            setattr(_m, _n, lambda rank, world_size, *a, **k: {'forged': True})"),
    # the runner replaced in the notebook's own process so that every invalid call "raised ValueError naming
    # the sizes" (0 -> 5 before): rebound by name it serves nothing (the zygote's runtime is bound before the
    # cells run); its code replaced in place, the cell is flagged (tests/test_forged_verdicts.py)
    Case("forges_argument_errors_by_rebinding_the_runner", "untouched", REBIND_THE_RUNNER, forged=(ARGS,)),
    Case("forges_argument_errors_by_replacing_the_runners_code", "untouched", REPLACE_THE_RUNNERS_CODE,
         forged=(ARGS,)),
    Case("forged_frames_on_every_descriptor", "untouched",
         "import os as _o, json as _j, struct as _st\nfor _fd in range(3, 40):\n    for _i in range(1, 30):\n"
         "        _h = _j.dumps({'id': _i, 'ok': True}).encode()\n        try:\n"
         "            _o.write(_fd, _st.pack('>4sIQ', b'AGZ1', len(_h), 0) + _h)\n        except OSError:\n"
         "            break"),
    # a reply of 1 GiB on the channel (the class run itself is under a memory limit, as in a pod): refused
    # before it is read; the check it answers fails, nothing else
    Case("a_gibibyte_reply_on_the_channel", "reference",
         "import os as _o, struct as _st\n_orig_reduce = reduce_from_tensor_model_parallel_region\n"
         "def reduce_from_tensor_model_parallel_region(input_, *, group):\n"
         "    for _fd in range(3, 40):\n        try:\n"
         "            _o.write(_fd, _st.pack('>4sIQ', b'AGZ1', 2, 2**30) + b'{}' + b'x' * 2**20)\n"
         "        except OSError:\n            pass\n    return _orig_reduce(input_, group=group)", 6),
    # -- privileges and the file system (a correct notebook: an attack that worked would cost it points) -------
    Case("mounts_the_host_root", "untouched",
         "import ctypes as _c, glob as _g, json as _j, os as _o, re as _re\n_libc = _c.CDLL(None, use_errno=True)\n"
         "_o.makedirs('/tmp/hostroot', exist_ok=True)\n"
         "for _src in (b'/', b'/proc/1/root', b'/oldroot'):\n"
         "    if _libc.mount(_src, b'/tmp/hostroot', None, 0x1000 | 0x4000, None) == 0:\n        break\n"
         "_r = '/tmp/hostroot' + " + ROOT_EXPR + "\n"
         "for _p in _g.glob(_r + '/source/*/*.ipynb'):\n    for _cell in _j.load(open(_p))['cells']:\n"
         "        if 'copy_to_tensor' in ''.join(_cell['source']):\n"
         "            exec(_re.sub('### (BEGIN|END) SOLUTION', '', ''.join(_cell['source'])))\n"
         "try:\n    open(_r + '/PWNED-mount', 'w').write('pwned')\nexcept OSError:\n    pass"),
    Case("new_user_namespace_then_mount", "untouched",
         "import subprocess as _sp\n_sp.run(['unshare', '-Urm', 'sh', '-c', 'mount --bind / /tmp && cat /tmp' + "
         + ROOT_EXPR + " + '/source/*/*.ipynb > /tmp/stolen.txt'], capture_output=True)\n"
         "import json as _j, re as _re, os as _o\nif _o.path.exists('/tmp/stolen.txt') and _o.path.getsize('/tmp/stolen.txt'):\n"
         "    for _cell in _j.loads(open('/tmp/stolen.txt').read())['cells']:\n"
         "        if 'copy_to_tensor' in ''.join(_cell['source']):\n"
         "            exec(_re.sub('### (BEGIN|END) SOLUTION', '', ''.join(_cell['source'])))"),
    Case("reads_another_checkout", "untouched",
         "import glob as _g, json as _j, re as _re\nfor _p in _g.glob(__OTHER__ + '/source/*/*.ipynb'):\n"
         "    for _cell in _j.load(open(_p))['cells']:\n        if 'copy_to_tensor' in ''.join(_cell['source']):\n"
         "            exec(_re.sub('### (BEGIN|END) SOLUTION', '', ''.join(_cell['source'])))"),
    Case("reads_classmates_queued_notebooks", "untouched",
         "import glob as _g, json as _j, os as _o\n"
         "for _p in _g.glob('/tmp/**/*.ipynb', recursive=True) + _g.glob(__WORK__ + '/**/*.ipynb', "
         "recursive=True):\n    try:\n        _nb = _j.load(open(_p))\n    except Exception:\n        continue\n"
         "    for _cell in _nb.get('cells', []):\n        if 'def copy_to_tensor' in ''.join(_cell['source']) and "
         "'NotImplementedError()' not in ''.join(_cell['source']):\n"
         "            exec(''.join(_cell['source']))"),
    Case("plants_links_where_the_grader_writes", "reference",
         "import os as _o, glob as _g\n_targets = [" + ROOT_EXPR + " + '/gradebook.db', " + ROOT_EXPR
         + " + '/PWNED-link'] + _g.glob(__WORK__ + '/*/*.ipynb')\n"
         "for _d in ('.', '/tmp', '/tmp/work', _o.path.expanduser('~')):\n"
         "    for _n in ('submission.ipynb', 'skip.json', 'req1.pkl', 'res1.pt', 'res1.json', 'kernel.json', "
         "'zygote.sock', 'launch-1.json', 'launch-1.log', 'zygote.log', 'serve.log', 'run-0.log'):\n"
         "        for _t in _targets[:1]:\n            try:\n                _o.makedirs(_d, exist_ok=True)\n"
         "                _o.symlink(_t, _o.path.join(_d, _n))\n            except OSError:\n                pass\n"
         "for _f in _g.glob('/tmp/autograder*/**', recursive=True):\n    try:\n"
         "        open(_f, 'w').write('pwned')\n    except OSError:\n        pass", 12),
    Case("two_gibibytes_on_disk", "reference",
         "_written = 0\nfor _name in ('/tmp/big-1.bin', 'big-2.bin', '/dev/shm/big-3.bin'):\n    try:\n"
         "        with open(_name, 'wb') as _f:\n            for _ in range(10):\n"
         "                _f.write(b'0' * 100_000_000)\n                _written += 100_000_000\n"
         "    except OSError:\n        pass\n"
         "if _written > 1_000_000_000:  # the writes reached a disk: this notebook then loses g's points\n"
         "    reduce_from_tensor_model_parallel_region = None", 12),
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
    Case("cell_metadata_is_a_list", "reference", reason="its metadata is a list",
         notebook=lambda course: _bad_metadata(reference(course))),
    Case("nbgrader_metadata_is_a_string", "reference", reason="nbgrader metadata is a str",
         notebook=lambda course: _bad_metadata(reference(course), nbgrader=True)),
    Case("notebook_is_a_fifo", "reference", reason="is a FIFO", notebook=lambda course: Special("fifo")),
    Case("notebook_links_to_the_source", "untouched", reason="is a symbolic link",
         notebook=lambda course: Special("symlink", os.path.join(course, "source", A, notebook_name(course)))),
    Case("notebook_links_to_a_classmate", "untouched", reason="is a symbolic link",
         notebook=lambda course: Special("symlink", os.path.join(course, "submitted", "honest-reference", A,
                                                                 notebook_name(course)))),
    Case("folder_links_to_a_classmate", "untouched", reason="is a symbolic link",
         notebook=lambda course: Special("folder-symlink", os.path.join(course, "submitted", "honest-reference", A))),
    # (intake refuses a notebook over 16 MiB with the reason: 10 MB saved in one output is graded, the output capped)
    Case("ten_megabytes_saved_in_an_output", "reference", expected=12,
         notebook=lambda course: _with_saved_output(reference(course), "x" * 10_000_000)),
    # -- the grading worker's fork server (autograder/grading/forkserver.py): the same user on the host, in the
    # same process namespace as the submission's processes. Changing what every fork would inherit (its limits,
    # priority, a stop) costs the next submission nothing: the grader continues it, it refuses to fork
    # changed, and is started anew; killing it kills only the submission's own run (its processes die with it)
    Case("tampers_with_the_fork_server", "reference", _ON_THE_SERVER.format(
        "_r.prlimit(_p, _r.RLIMIT_NOFILE, (20, 20))\n"
        "    _o.setpriority(_o.PRIO_PROCESS, _p, 19); _o.sched_setaffinity(_p, {0})\n"
        "    _o.kill(_p, _s.SIGSTOP)"), 12),
    Case("kills_the_fork_server", "reference", _ON_THE_SERVER.format("_o.kill(_p, _s.SIGKILL)"), 0),
    # -- the feedback page, which the instructor opens in a browser (formgrader) ------------------------------------
    Case("scripts_in_markdown_and_outputs", "reference", expected=12,
         notebook=lambda course: _with_active_content(reference(course))),
    # 2,000 outputs, each within intake's cap of one output: 8 MB in all, twice the page's cap
    Case("thousands_of_large_outputs", "reference", expected=12,
         notebook=lambda course: _with_many_outputs(reference(course), cells=10, per_cell=200, chars=4_000)),
    Case("cell_with_an_empty_grade_id", "reference", expected=12,
         notebook=lambda course: _with_unnamed_graded_cell(reference(course))),
    # -- a fault of the student's own: the answer cell does not compile ----------------------------------------------
    Case("unclosed_parenthesis_in_an_answer_cell", "reference", expected=0,
         notebook=lambda course: edit(reference(course), CELL, lambda s: s.replace(*UNCLOSED)),
         message="SyntaxError: '(' was never closed (answer cell of Exercise 1 (tp_mappings), line "),
]


@dataclass
class Special:
    """A submission that is not a notebook file: a FIFO, or a link to `target` (the notebook or its folder)."""
    kind: str
    target: str = ""


def _bad_metadata(nb: dict, nbgrader: bool = False) -> dict:
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == CELL)
    if nbgrader:
        cell["metadata"]["nbgrader"] = "grade me"
    else:
        cell["metadata"] = ["not", "an", "object"]
    return nb


def _with_saved_output(nb: dict, text: str) -> dict:
    nb = copy.deepcopy(nb)
    nb["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "print('x' * 50_000_000)",
                        "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]})
    return nb


# what a student's notebook can carry that runs in a browser: a script, an event attribute, a javascript: link, in
# markdown (raw HTML and markdown's own link) and in outputs (text/html, text/markdown, SVG, JavaScript)
ALERT = "alert(document.cookie)"
ACTIVE_MARKDOWN = (f"## My notes <script>{ALERT}</script>\n\n<img src=x onerror=\"{ALERT}\">\n\n"
                   f"[a link](javascript:{ALERT}) and <a href=\"javascript:{ALERT}\">another</a>\n\n"
                   f"<iframe src=\"javascript:{ALERT}\"></iframe><svg onload=\"{ALERT}\"></svg>")
ACTIVE_OUTPUTS = [
    {"output_type": "display_data", "metadata": {},
     "data": {"text/html": f"<b onmouseover=\"{ALERT}\">hover</b><script>{ALERT}</script>", "text/plain": "hover"}},
    {"output_type": "display_data", "metadata": {},
     "data": {"image/svg+xml": f"<svg xmlns='http://www.w3.org/2000/svg'><script>{ALERT}</script></svg>"}},
    {"output_type": "display_data", "metadata": {}, "data": {"application/javascript": ALERT, "text/plain": "js"}},
    {"output_type": "display_data", "metadata": {},
     "data": {"text/markdown": f"[click](javascript:{ALERT}) <form action=x><input name=y></form>"}},
    {"output_type": "execute_result", "execution_count": 1, "metadata": {},
     "data": {"text/html": f"<a href=\"javascript:{ALERT}\">result</a>", "text/plain": "result"}},
]


def _with_active_content(nb: dict) -> dict:
    nb = copy.deepcopy(nb)
    nb["cells"][1:1] = [
        {"cell_type": "markdown", "id": "my-notes", "metadata": {}, "source": ACTIVE_MARKDOWN},
        {"cell_type": "code", "id": "my-display", "metadata": {}, "execution_count": 1, "source": "show()",
         "outputs": copy.deepcopy(ACTIVE_OUTPUTS)}]
    return nb


def _with_many_outputs(nb: dict, *, cells: int, per_cell: int, chars: int) -> dict:
    nb = copy.deepcopy(nb)
    line = "y" * 99 + "\n"
    for i in range(cells):
        nb["cells"].append({"cell_type": "code", "id": f"loop-{i}", "metadata": {}, "execution_count": i + 1,
                            "source": f"for _ in range({per_cell}):\n    print('y' * 99 * {chars // 100})",
                            "outputs": [{"output_type": "stream", "name": "stdout", "text": line * (chars // 100)}
                                        for _ in range(per_cell)]})
    return nb


def _with_unnamed_graded_cell(nb: dict) -> dict:
    """A cell of the student's, marked as a graded test cell with an empty grading id (and a saved pass)."""
    nb = copy.deepcopy(nb)
    nb["cells"].append({"cell_type": "code", "id": "unnamed", "execution_count": 1, "source": "print('my own test')",
                        "metadata": {"nbgrader": {"grade": True, "solution": False, "locked": False, "points": 6,
                                                  "grade_id": "", "schema_version": 3}},
                        "outputs": [{"output_type": "stream", "name": "stdout", "text": "my own test passed\n"}]})
    return nb


UNCLOSED = ("return _reduce(grad_output, ctx.group), None", "return _reduce(grad_output, ctx.group, None")


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
    course = make_mini_course(tmp_path_factory.mktemp("attacks"), keep=KEEP + (ARGS,))
    other = str(tmp_path_factory.mktemp("another-checkout"))  # a second copy of the course on the machine
    shutil.copytree(os.path.join(course, "source"), os.path.join(other, "source"))
    write_submission(course, "honest-reference", reference(course))
    for case in CASES:
        nb = case.notebook(course) if case.notebook is not None else None
        if isinstance(nb, Special):
            _write_special(course, _student(case), nb)
            continue
        if nb is None:
            base = reference(course) if case.base == "reference" else release(course)
            code = case.code.replace("__OTHER__", repr(other)).replace("__WORK__", repr(env(course)[
                "AUTOGRADER_WORKDIR"]))
            nb = edit(base, CELL, lambda s, code=code: s + "\n\n" + code + "\n") if code else base
        write_submission(course, _student(case), nb)
    t0 = time.monotonic()
    with _memory_cgroup(4 * 2**30) as enter:  # the whole command under a memory limit, as in a pod
        proc = run_grade(course, "autograde", A, "--jobs", "2", "--budget", "30", "--memory", "2", "--quiet",
                         timeout=3600, preexec_fn=enter)
        peak = enter.peak()
    seconds = time.monotonic() - t0
    print(proc.stdout[-6000:])
    print(f"\n{len(CASES) + 1} submissions graded in {seconds:.0f} s; the command's peak memory (without the "
          f"sandboxes): {peak / 2**30:.2f} GiB")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    db = os.path.join(course, "gradebook.db")
    digest = hashlib.sha256(open(db, "rb").read()).hexdigest()
    time.sleep(6)  # long enough for a detached process to have struck
    return course, records(course), digest, proc.stdout


def _write_special(course: str, student: str, special: Special) -> None:
    folder = os.path.join(course, "submitted", student, A)
    if special.kind == "folder-symlink":
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        os.symlink(special.target, folder)
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, notebook_name(course))
    if special.kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(special.target, path)


class _memory_cgroup:
    """A cgroup v1 memory limit for the grading command itself (its workers and main process; the sandboxes
    move to cgroups of their own). A no-op where cgroups are not writable."""

    def __init__(self, limit: int):
        self.path = f"/sys/fs/cgroup/memory/autograder-class-{TOKEN}"
        self.limit = limit
        self.active = False

    def __enter__(self):
        try:
            os.makedirs(self.path, exist_ok=True)
            with open(os.path.join(self.path, "memory.limit_in_bytes"), "w") as f:
                f.write(str(self.limit))
            self.active = True
        except OSError:
            pass
        return self

    def __call__(self):  # preexec_fn: the command joins the cgroup
        if self.active:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def peak(self) -> int:
        try:
            with open(os.path.join(self.path, "memory.max_usage_in_bytes")) as f:
                return int(f.read())
        except OSError:
            return 0

    def __exit__(self, *exc):
        if self.active:
            for _ in range(50):
                try:
                    os.rmdir(self.path)
                    break
                except OSError:
                    time.sleep(0.1)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_gets_its_honest_score(graded, case):
    course, recs, _, _ = graded
    rec = recs[_student(case)]
    if case.reason:
        assert rec["status"] == "rejected" and case.reason in rec["reason"], rec["reason"]
        assert rec["score"] == 0
        return
    assert rec["status"] == "graded", rec["reason"]
    # on an idle machine every check is decided: a submission that sleeps is stopped on the scheduler's record
    assert not rec.get("needs_regrade"), [(c["grade_id"], c.get("inconclusive")) for c in rec["cells"]]
    score = sum(c["points"] for c in rec["cells"] if c["grade_id"] in KEEP)  # the two cells every case is about
    assert score == case.expected, (score, [(c["grade_id"], c["message"][:300]) for c in rec["cells"]])
    for c in rec["cells"]:
        if c["grade_id"] in case.forged:
            assert c["points"] == 0 or c["flagged"] and c.get("flag"), \
                f"{case.name}: {c['grade_id']} got {c['points']} points from a forgery, unflagged"
        if case.message and c["grade_id"] in KEEP and c["points"] < c["max_points"]:
            assert case.message in c["message"], (c["grade_id"], c["message"][:500])
    feedback = os.path.join(course, "feedback", _student(case), A, notebook_name(course).replace(".ipynb", ".html"))
    assert os.path.exists(feedback), "no feedback"
    html = open(feedback, encoding="utf-8").read()
    assert page_chars(html) <= MAX_FEEDBACK_CHARS, f"feedback of {len(html)} characters"
    assert len(json.dumps(rec)) <= MAX_RECORD_CHARS, f"a record of {len(json.dumps(rec))} characters"
    for secret in ["### BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "NETWORK_REACHED", *_secrets(course)]:
        assert secret not in html, f"the feedback of {case.name} shows {secret!r}"
    for path in (course, sys.prefix, os.path.realpath(sys.base_prefix), env(course)["AUTOGRADER_WORKDIR"]):
        assert path not in html, f"the feedback of {case.name} shows the grading machine's path {path}"
        assert path not in json.dumps(rec), f"the record of {case.name} shows the grading machine's path {path}"


def _secrets(course: str) -> list[str]:
    """Text only the course root holds: the solution module's first line, the hidden tests' lines."""
    import nbformat

    from course import secret_lines

    with open(os.path.join(course, "solutions", "tensor_parallel", "mappings.py"), encoding="utf-8") as f:
        first = f.readline().strip().strip('"')
    source = nbformat.read(os.path.join(course, "source", A, notebook_name(course)), as_version=4)
    return [first] + [line for line in secret_lines(source)[1] if len(line) > 20]


def _feedback_page(course: str, case: str) -> str:
    """The feedback page of a case's student (`case`: its name, e.g. "thousands_of_large_outputs")."""
    name = notebook_name(course).replace(".ipynb", ".html")
    with open(os.path.join(course, "feedback", case.replace("_", "-"), A, name), encoding="utf-8") as f:
        return f.read()


class _Active(__import__("html.parser").parser.HTMLParser):
    """What in a page would run in a browser: script-like elements, event attributes, javascript: URLs."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "iframe", "object", "embed", "svg", "form", "base", "meta", "link", "style"):
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if name in ("href", "src", "action", "formaction", "data") and value and \
                    "".join(value.split()).lower().startswith(("javascript:", "vbscript:", "data:text")):
                self.found.append(f"<{tag} {name}={value[:40]}>")


def _active_in_body(page: str) -> list[str]:
    """The active content of a feedback page's body (its head is the template's: styles and MathJax)."""
    parser = _Active()
    parser.feed(page[page.index("<body"):])
    return parser.found


def test_what_the_student_wrote_runs_nowhere_in_the_feedback_and_the_verdicts_stay(graded):
    """Markdown and outputs with <script>, onerror= and javascript: links: shown as text, never active; the
    instructor-visible verdicts are as the grader wrote them."""
    course, recs, _, _ = graded
    page = _feedback_page(course, "scripts_in_markdown_and_outputs")
    assert _active_in_body(page) == [], _active_in_body(page)
    assert page.count("<script") == page[:page.index("<body")].count("<script"), "a script in the page's body"
    import html as _html

    text = _html.unescape(page)
    assert f"<script>{ALERT}</script>" in text, "what the student wrote is no longer shown (as text)"
    assert "## My notes" not in text and "My notes" in text, "the student's markdown is no longer rendered"
    rec = recs["scripts-in-markdown-and-outputs"]
    for c in rec["cells"]:  # the trusted verdicts, passing here: as the grader wrote them
        assert c["passed"] and c["message"] in page, c["message"]


def test_thousands_of_large_outputs_keep_the_feedback_and_the_record_under_their_caps(graded):
    """2,000 outputs, each within intake's cap: the page and the record stay under their caps, the largest outputs
    left out first, each with a note where it was, one note at the top and one in the table."""
    course, recs, _, stdout = graded
    rec = recs["thousands-of-large-outputs"]
    page = _feedback_page(course, "thousands_of_large_outputs")
    assert page_chars(page) <= MAX_FEEDBACK_CHARS and len(json.dumps(rec)) <= MAX_RECORD_CHARS
    assert page_chars(page) > MAX_FEEDBACK_CHARS // 2, "more was left out than the cap asks"
    note = next(w for w in rec["warnings"] if w.startswith("the feedback leaves out "))
    assert " outputs of the notebook's cells (" in note and "capped at 4.0 MB" in note, note
    assert "<strong>Note:</strong> The feedback leaves out " in page
    assert page.count("not shown: the feedback page is capped at 4.0 MB") >= 1
    assert "note: the feedback leaves out" in " ".join(stdout.split())  # the table
    for c in rec["cells"]:
        assert c["passed"] and c["message"] in page, c["message"]


def test_a_cell_with_an_empty_grade_id_gets_feedback_as_a_cell_of_the_students(graded):
    course, recs, _, _ = graded
    rec = recs["cell-with-an-empty-grade-id"]
    assert rec["feedback_html"] and sum(c["points"] for c in rec["cells"] if c["grade_id"] in KEEP) == 12
    assert "a cell marked for grading without a grading id (grade_id ''): kept, not graded" in rec["warnings"]
    page = _feedback_page(course, "cell_with_an_empty_grade_id")
    assert "my own test passed" in page and '<a name=""' not in page  # shown as the student's cell, not graded


def test_an_unclosed_parenthesis_is_named_with_its_cell_and_line_in_the_record_the_table_and_the_feedback(graded):
    """The answer cell does not compile: every test that needed its functions says so first (the cell as the
    notebook names it, the line, the SyntaxError), not only `name ... is not defined`."""
    import html as _html

    course, recs, _, stdout = graded
    cell = next(c for c in reference(course)["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == CELL)
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    line = next(i for i, text in enumerate(source.splitlines(), 1) if UNCLOSED[0] in text)
    first = f"SyntaxError: '(' was never closed (answer cell of Exercise 1 (tp_mappings), line {line})"
    rec = recs["unclosed-parenthesis-in-an-answer-cell"]
    for c in rec["cells"]:
        if c["grade_id"] not in KEEP:
            continue  # (the argument-error cell needs the broken cell's functions too)
        assert c["message"].startswith(first + "\n    " + UNCLOSED[1]), c["message"][:400]
        assert "was never defined:\nNameError: Exercise 1 " in c["message"], c["message"][:600]
    lost = [c["grade_id"] for c in rec["cells"] if c["message"].startswith(first)]
    assert f"note: {', '.join(lost)}: {first}" in " ".join(stdout.split())  # the table
    page = _html.unescape(_feedback_page(course, "unclosed_parenthesis_in_an_answer_cell"))
    assert page.count(first) == 1 + len(lost), "the answer cell and each test cell name the error"


def test_the_honest_reference_among_them_gets_full_marks(graded):
    _, recs, _, _ = graded
    assert recs["honest-reference"]["score"] == 17  # the two cells and the argument-error cell
    assert not any(c["flagged"] for c in recs["honest-reference"]["cells"])


def test_nothing_is_left_behind_and_nothing_changes_afterwards(graded):
    course, recs, digest, _ = graded
    assert hashlib.sha256(open(os.path.join(course, "gradebook.db"), "rb").read()).hexdigest() == digest, \
        "the gradebook changed after the run ended"
    book = gradebook(course)
    assert all(score <= 6 for cells in book.values() for score in cells.values())
    assert not os.path.exists(f"/tmp/pwned-{TOKEN}"), "the grader ran code sent back by a submission"
    for f in ("release/PWNED", "source/PWNED", "PWNED-mount", "PWNED-link"):
        assert not os.path.exists(os.path.join(course, f)), f"a submission wrote {f} into the course"
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
    assert gradebook(course)["late-student"] == {"test_copy_to_region": 6.0, "test_reduce_from_region": 6.0, ARGS: 5.0}
    proc = run_grade(course, "scores")
    assert proc.returncode == 0 and "late-student" in proc.stdout


@pytest.mark.skipif(not CGROUPS, reason="the fork server needs cgroups to account each submission apart")
def test_the_catalogue_ran_on_the_fork_server(graded):
    """Every case but those graded after one that broke their worker's fork server was forked from it (the
    rest: a fresh sandbox each, as without one); the cases that tampered with it and killed it were its forks."""
    _, recs, _, _ = graded
    graded_recs = {s: r for s, r in recs.items() if r["status"] == "graded"}
    forked = sorted(s for s, r in graded_recs.items() if r.get("sandbox") == "forked")
    assert len(forked) >= len(graded_recs) - 4, sorted(set(graded_recs) - set(forked))
    for case in ("tampers_with_the_fork_server", "kills_the_fork_server"):
        assert recs[case.replace("_", "-")]["sandbox"] == "forked", recs[case.replace("_", "-")].get("sandbox")


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30
