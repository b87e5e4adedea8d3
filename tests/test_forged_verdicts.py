"""Verdicts a notebook could forge in its own process: served by the runtime bound before its cells ran, or flagged.

    .venv/bin/python -m pytest -q tests/test_forged_verdicts.py

The argument-error checks (invalid arguments must raise ValueError, naming
the sizes, before any communication) judge in the grader what the ranks
report: the error's type and message, and the ledger. An unfinished notebook
(every function a stub) whose cell made `run_distributed` return "ValueError
naming every size" for each invalid call scored 02's test_argument_errors (0
-> 5, not flagged). Each submission here is graded in this process
(`grade_notebook`, the student's cells in a plain subprocess: the same
zygote as in the sandbox), on that one cell:
- rebinding the runner by name in the notebook changes nothing the grader
  receives (the zygote serves with the runtime it had before the cells ran):
  0 points;
- replacing the runner's code in place does reach the replies: its points
  are flagged, with the line that did it (the grader reads the notebook's
  code as text, autograder.grading.integrity.scan_notebook);
- a patch the text scan cannot see (a method of the ledger replaced through
  a function's parameter) is flagged from the zygote's own report of what
  the cells replaced (integrity.Guard);
- nothing of the course's own notebooks, reference or mutants, is flagged.
The same attacks run in the class's catalogue (tests/test_attacks.py).
"""

from __future__ import annotations

import copy
import json
import sys
import time

import nbformat
import pytest
from conftest import sample

from course import ROOT, assignments

sys.path.insert(0, ROOT)
from autograder.grading.trusted import _executable_cells  # noqa: E402 - the cells the student's process runs
from solutions import submissions  # noqa: E402

A = "02_tensor_parallel"
CELL = "test_argument_errors"

# The attacks, as a student would append them to an answer cell (tests/test_attacks.py grades the same text).
REBIND_THE_RUNNER = '''
import autograder.runtime.dist as _d
_orig_run = _d.run_distributed
def _forged_run(fn, world_size, *, args=(), **kw):
    if getattr(fn, "__name__", "").endswith("error_rank"):
        return [[{"error": ("ValueError", " ".join(map(str, range(100)))), "records": []} for _ in args[1]]
                for _ in range(world_size)]
    return _orig_run(fn, world_size, args=args, **kw)
_d.run_distributed = _forged_run
'''

REPLACE_THE_RUNNERS_CODE = '''
import autograder.runtime.dist as _d
_d._real_code = _d.run_distributed.__code__
def _forged(fn, world_size, *, args=(), timeout=20.0, backend="gloo", start_method=None, show_output=False,
            check_collectives=True):
    if getattr(fn, "__name__", "").endswith("error_rank"):
        return [[{"error": ("ValueError", " ".join(map(str, range(100)))), "records": []} for _ in args[1]]
                for _ in range(world_size)]
    import types
    real = types.FunctionType(_real_code, globals(), "run_distributed")
    real.__kwdefaults__ = {"args": (), "timeout": 20.0, "backend": "gloo", "start_method": None,
                           "show_output": False, "check_collectives": True}
    return real(fn, world_size, args=args, timeout=timeout, backend=backend, start_method=start_method,
                show_output=show_output, check_collectives=check_collectives)
_d.run_distributed.__code__ = _forged.__code__
'''

# harmless (the method still does what it did), but the ledger's class is no longer the course's
WRAP_A_LEDGER_METHOD = '''
def _wrap(cls, name):
    orig = getattr(cls, name)
    setattr(cls, name, lambda self, *a, **k: orig(self, *a, **k))
_wrap(CommLedger, "outside")
'''


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _grade(base: str, code: str, cells=(CELL,), assignment: str = A):
    """grade_notebook of `base` ("untouched" or "reference") with `code` appended to the answer cell
    tp_mappings, on `cells` only."""
    from autograder.grading.trusted import grade_notebook

    nb = submissions.untouched_submission(assignment) if base == "untouched" else \
        submissions.reference_submission(assignment)
    nb = json.loads(nbformat.writes(copy.deepcopy(nb)))
    for cell in nb["cells"]:
        if _meta(cell).get("grade_id") == "tp_mappings":
            cell["source"] = "".join(cell["source"]) + "\n\n" + code
    with open(submissions.notebook_path("source", assignment), encoding="utf-8") as f:
        source = json.load(f)
    source["cells"] = [c for c in source["cells"] if not _meta(c).get("grade") or _meta(c).get("solution")
                       or _meta(c)["grade_id"] in cells]
    t0 = time.monotonic()
    verdicts, _ = grade_notebook(nb, source)
    print(f"\ngraded in {time.monotonic() - t0:.1f} s")
    return verdicts


def test_rebinding_the_runner_in_the_notebook_forges_nothing():
    v = _grade("untouched", REBIND_THE_RUNNER)[CELL]
    assert v.points == 0 and not v.passed, v.message
    assert "is not done yet" in v.message, v.message  # the stubs, as for any unfinished notebook


def test_replacing_the_runners_code_in_place_is_flagged_with_the_line_that_did_it():
    v = _grade("untouched", REPLACE_THE_RUNNERS_CODE)[CELL]
    if v.points == 0:
        return  # not forged at all: nothing to flag
    assert v.flag, f"{CELL} got {v.points} points from a forged runner, unflagged"
    assert "__code__" in v.flag and "answer cell of Exercise 1 (tp_mappings), line " in v.flag, v.flag


def test_a_patch_the_text_scan_cannot_see_is_flagged_from_the_zygotes_report():
    from autograder.grading.integrity import scan_notebook

    nb = submissions.reference_submission(A)
    for cell in nb.cells:
        if _meta(cell).get("grade_id") == "tp_mappings":
            cell.source += "\n\n" + WRAP_A_LEDGER_METHOD
    with open(submissions.notebook_path("source", A), encoding="utf-8") as f:
        source = json.load(f)
    cells = _executable_cells(json.loads(nbformat.writes(nb)))
    assert scan_notebook(cells, source) == []  # the text alone shows nothing
    v = _grade("reference", WRAP_A_LEDGER_METHOD)[CELL]
    assert v.passed and v.points == 5, v.message
    assert v.flag and "autograder.runtime.ledger.CommLedger.outside (replaced)" in v.flag, v.flag


def test_an_honest_notebook_is_not_flagged():
    v = _grade("reference", "")[CELL]
    assert v.passed and v.points == 5 and v.flag is None, (v.message, v.flag)


def test_the_text_scan_names_each_way_into_the_process():
    from autograder.grading.integrity import scan_source

    imports = {"CommLedger": "autograder.runtime.ledger.CommLedger", "dist": "torch.distributed",
               "torch": "torch", "<modules>": {"torch", "dist"}}
    attacks = {
        "import autograder.runtime.dist as _d\n_d.run_distributed = print": "replaces autograder.runtime.dist's",
        "import autograder.runtime.dist as _d\nm = _d\nm.run_distributed = print": "replaces autograder.runtime.dist's",
        "import autograder.runtime.dist as _d\nsetattr(_d, 'run_distributed', print)": "setattr on",
        "import autograder.runtime.dist as _d\nvars(_d)['run_distributed'] = print": "namespace (vars)",
        "import autograder.runtime.dist as _d\n_d.__dict__['run_distributed'] = print": "namespace (__dict__)",
        "import autograder.runtime.dist as _d\n_d.run_distributed.__code__ = print.__code__": "__code__",
        "__import__('autograder.runtime.dist').runtime.dist.run_distributed = print": "replaces autograder",
        "CommLedger.__exit__ = lambda *a: True": "replaces autograder.runtime.ledger.CommLedger's __exit__",
        "def p(c):\n    c.__exit__ = lambda *a: True": "assigns __exit__",
        "import autograder.runtime.dist as _d\ndef p(m):\n    m.x = print\np(_d)": "hands the module",
        "dist.all_reduce = lambda *a, **k: None": "replaces torch.distributed's all_reduce",
        "import sys\nsys.modules['autograder.runtime.dist'].run_distributed = print": "sys.modules",
        "import sys\nsys._getframe(1).f_locals": "sys._getframe",
        "from sys import _getframe": "sys._getframe",
        "import builtins\nbuiltins.ValueError = KeyError": "builtins",
        "__builtins__['ValueError'] = KeyError": "__builtins__",
        "import gc\ngc.get_referrers(print)": "gc.get_referrers",
        "import ctypes": "ctypes",
        "import importlib\nimportlib.import_module('x' + 'y')": "importlib",
        "exec('x = 1')": "exec",
        "eval('1')": "eval",
        "import pickle\npickle.loads(b'')": "unpickling",
        "torch.load('f.pt')": "torch.load",
    }
    for code, why in attacks.items():
        found = scan_source(code, dict(imports))
        assert any(why in w for _, w in found), (code, found)
    honest = ("x = getattr(torch, 'float32')\ntorch.backends.cudnn.deterministic = True\nimport gc\ngc.collect()\n"
              "m = __import__('math').lcm(2, 3)\nclass L(torch.nn.Module):\n    def __init__(self, w):\n"
              "        super().__init__()\n        self.w = w\n        setattr(self, 'b', None)\n"
              "def f(ctx, g):\n    ctx.group = g\n    return dist.all_reduce(g, group=ctx.group)\n"
              "f.__name__ = 'g'\nw = torch.load('w.pt', weights_only=True)\n")
    assert scan_source(honest, dict(imports)) == []


def test_the_guard_names_what_was_replaced_in_its_process():
    from autograder.grading.integrity import Guard
    from autograder.runtime import dist, ledger

    guard = Guard()
    assert guard.changed() == []
    run, code, outside = dist.run_distributed, dist.run_distributed.__code__, ledger.CommLedger.outside
    try:
        dist.run_distributed.__code__ = (lambda fn, world_size, **k: []).__code__
        ledger.CommLedger.outside = lambda self: None
        found = guard.changed()
    finally:
        dist.run_distributed.__code__ = code
        ledger.CommLedger.outside = outside
    assert "autograder.runtime.dist.run_distributed (its code replaced)" in found, found
    assert "autograder.runtime.ledger.CommLedger.outside (replaced)" in found, found
    assert dist.run_distributed is run


@pytest.mark.parametrize("assignment", sample(assignments(), always={A}))
def test_no_notebook_of_the_course_is_flagged_by_the_text_scan(assignment):
    """The reference, the release and every mutant (plausible student code) of each assignment: no finding."""
    from autograder.grading.integrity import scan_notebook

    with open(submissions.notebook_path("source", assignment), encoding="utf-8") as f:
        source = json.load(f)
    notebooks = [("reference", submissions.reference_submission(assignment)),
                 ("release", submissions.untouched_submission(assignment))]
    notebooks += [(m.name, submissions.mutant_submission(assignment, m)) for m in submissions.mutants_of(assignment)]
    t0 = time.monotonic()
    found = {name: scan_notebook(_executable_cells(json.loads(nbformat.writes(nb))), source) for name, nb in notebooks}
    print(f"\n{assignment}: {len(notebooks)} notebooks scanned in {time.monotonic() - t0:.1f} s")
    assert not {k: v for k, v in found.items() if v}
