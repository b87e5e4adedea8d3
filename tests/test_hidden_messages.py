"""A failed hidden case says which case failed and how, never the case's data.

    .venv/bin/python -m pytest -q -s tests/test_hidden_messages.py                      # the fast sample
    COURSE_EXHAUSTIVE=1 .venv/bin/python -m pytest -q -s tests/test_hidden_messages.py  # every mutant

The hidden part of a test cell calls the visible part's checks with other
world sizes, flags, shapes and tensors; the checks' own messages quote them
(`cap 170 bytes`, `world size 4`, `[s, b] = [3, 2]`, a tensor's worst
element). Each mutant (solutions/<dim>/mutants.py: a plausible wrong edit)
is graded as the class is graded (autograder.grading.trusted.grade_notebook,
in this process, the student's cells in a plain subprocess), on the cells of
its `must_fail`. For every cell whose visible part passes and hidden part
fails, the verdict's message must:
- name the case, `hidden case i of n (check_name)`, i being the check call
  that failed (a call in a `for` over a literal list: one case per item) and
  check_name that call's function;
- say how it failed: one of autograder.grading.redact.KINDS;
- contain none of the hidden call's literals (numbers, strings, flags, dtype
  and class names written in its arguments, or in the item of its loop),
  once the lines the student may see anyway are set aside: the first line
  (the exercise and what is checked: the visible cell's own header), the
  case's name and number, and the student's own frames and code lines (their
  code is theirs: `answer cell of Exercise 4 (...), line 43, in f` and the
  line's text);
- be unflagged (autograder.grading.integrity: no mutant reaches into the
  course's runtime).
The fast sample grades one or two mutants per assignment, chosen to cover the
kinds (wrong values, communication, an exception in the student's code, ...);
the exhaustive sweep grades every mutant and prints which cells failed in
their hidden part.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import sys
import time

import nbformat
import pytest

from course import ROOT, assignments

sys.path.insert(0, ROOT)
from autograder.grading.redact import KINDS, case_count  # noqa: E402
from autograder.grading.trusted import _split_hidden  # noqa: E402
from solutions import submissions  # noqa: E402

# (assignment, mutant) -> the cells it fails in their hidden part (the kind of each in a comment)
SAMPLE = {
    ("01_data_parallel", "bucket_cap_in_mb"): {"test_ddp_buckets"},  # communication (the buckets' sizes)
    ("02_tensor_parallel", "sp_grads_none_not_skipped"): {"test_sequence_parallel_grads"},  # the student's error
    ("03_pipeline_parallel", "no_detach_between_own_chunks"): {"test_run_pipeline_interleaved"},  # p = 1 only
    ("04_context_parallel", "merge_no_max_subtraction"): {"test_ring_forward"},  # wrong values
    ("05_expert_parallel", "moe_global_rank"): {"test_moe_overlap"},  # a check's verdict made in a rank
    ("06_composition", "time_cp_link_in_node"): {"test_step_time", "test_best_layouts"},  # a planner's numbers
}


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _source(assignment: str) -> dict:
    with open(submissions.notebook_path("source", assignment), encoding="utf-8") as f:
        return json.load(f)


def _grade(assignment: str, mutant, cells: set, **options):
    from autograder.grading.trusted import grade_notebook

    source = _source(assignment)
    hidden = {_meta(c)["grade_id"]: _split_hidden("".join(c["source"]))[1] for c in source["cells"]
              if _meta(c).get("grade") and not _meta(c).get("solution")}
    source["cells"] = [c for c in source["cells"] if not _meta(c).get("grade") or _meta(c).get("solution")
                       or _meta(c)["grade_id"] in cells]
    nb = json.loads(nbformat.writes(copy.deepcopy(submissions.mutant_submission(assignment, mutant))))
    verdicts, _ = grade_notebook(nb, source, **options)
    student = {line.strip() for c in nb["cells"] if c.get("cell_type") == "code" and _meta(c).get("solution")
               for line in "".join(c["source"]).splitlines() if line.strip()}
    return verdicts, hidden, student


def _calls(code: str, checks: set) -> list[tuple[ast.Call, list]]:
    """The hidden part's check calls in the order they run (straight-line code, `for` over literal lists
    unrolled): (the call, the nodes of its loop items)."""
    out = []

    def visit(nodes, items):
        for node in nodes:
            if isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.iter, (ast.List, ast.Tuple)):
                for item in node.iter.elts:
                    visit(node.body, items + [item])
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in checks:
                out.append((node, items))
            visit(list(ast.iter_child_nodes(node)), items)

    visit(ast.parse(code).body, [])
    return out


def _literals(code: str, nodes) -> set[str]:
    """What a call writes out: numbers (as written and as Python prints them), strings, True/False/None, and
    attribute names (`torch.float32` -> float32, `torch.optim.SGD` -> SGD); not the variables' names."""
    out = set()
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Constant):
                if isinstance(node.value, str):
                    out.add(node.value)
                else:
                    out.add(repr(node.value))
                    written = ast.get_source_segment(code, node)
                    if written:
                        out.add(written)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                out.add(node.attr)
    return {t for t in out if t.strip()}


_WHERE = re.compile(r"(answer cell|given cell|code cell)[^\n]*?, line \d+, in [\w.<>]+")


def _assert_redacted(gid: str, msg: str, hidden: str, student: set, checks: set) -> str:
    """The case's number and check, its kind; no literal of the hidden call. Returns the kind."""
    m = re.search(r"^hidden case (\d+)(?: of (\d+))? \((check\w*)\): (.+?)\.$", msg, re.M)
    assert m, f"{gid}: the message names no hidden case:\n{msg}"
    i, n, name, kind = int(m[1]), m[2], m[3], m[4]
    assert kind.startswith(KINDS), f"{gid}: not a kind of failure: {kind!r}"
    calls = _calls(hidden, checks)
    assert 1 <= i <= len(calls), (gid, i, len(calls))
    if n is not None:
        assert int(n) == len(calls) == case_count(hidden, checks), (gid, n, len(calls))
    call, items = calls[i - 1]
    assert call.func.id == name, f"{gid}: case {i} is a call of {call.func.id}, the message says {name}"
    tokens = _literals(hidden, [*call.args, *(k.value for k in call.keywords), *items])
    # set aside what the student may see anyway: the visible header (first line), the case's own line up to its
    # kind, the student's frames and lines of code
    body = [msg.split("\n", 1)[1] if "\n" in msg else ""]
    body = body[0].replace(m[0][:m[0].index(": ") + 2], "", 1)
    body = _WHERE.sub("", body)
    body = "\n".join(line for line in body.splitlines() if line.strip() not in student)
    leaked = sorted(t for t in tokens if re.search(rf"(?<![\w.]){re.escape(t)}(?![\w.])", body))
    assert not leaked, f"{gid}: the message of hidden case {i} ({name}) shows {leaked} of its call:\n{msg}"
    return kind


def _sweep(assignment: str, mutants) -> list[str]:
    """Grade each mutant's must_fail cells; assert on every hidden failure; one line per hidden failure."""
    rows = []
    for mutant, cells in mutants:
        t0 = time.monotonic()
        verdicts, hidden, student = _grade(assignment, mutant, cells)
        seconds = time.monotonic() - t0
        for gid, v in sorted(verdicts.items()):
            assert v.flag is None, f"{mutant.name}: {gid} flagged: {v.flag}"
            if v.passed or not v.visible_passed:
                continue
            checks = {n.id for n in ast.walk(ast.parse(hidden[gid])) if isinstance(n, ast.Name)
                      and n.id.startswith("check_")}
            kind = _assert_redacted(gid, v.message, hidden[gid], student, checks)
            rows.append(f"{assignment} {mutant.name:<36} {gid:<40} {kind[:60]} ({seconds:.1f} s)")
    return rows


def _mutant(assignment: str, name: str):
    return next(m for m in submissions.mutants_of(assignment) if m.name == name)


def test_the_sample_covers_every_assignment():
    assert {a for a, _ in SAMPLE} == set(assignments())


@pytest.mark.parametrize("assignment", assignments())
def test_a_sample_of_hidden_failures_names_the_case_and_kind_never_the_data(assignment):
    picked = [(_mutant(a, name), cells) for (a, name), cells in SAMPLE.items() if a == assignment]
    t0 = time.monotonic()
    rows = _sweep(assignment, picked)
    print(f"\n{assignment}: {len(picked)} mutant(s) graded in {time.monotonic() - t0:.1f} s\n" + "\n".join(rows))
    failed = {cell for _, cells in picked for cell in cells}
    assert len(rows) == len(failed), f"expected hidden failures in {sorted(failed)}, got:\n" + "\n".join(rows)


@pytest.mark.exhaustive
@pytest.mark.timeout(14400)
@pytest.mark.parametrize("assignment", assignments())
def test_every_mutants_hidden_failures_name_the_case_and_kind_never_the_data(assignment):
    wrong = [(m, set(m.must_fail)) for m in submissions.mutants_of(assignment) if m.must_fail]
    t0 = time.monotonic()
    rows = _sweep(assignment, wrong)
    print(f"\n{assignment}: {len(wrong)} mutants graded in {time.monotonic() - t0:.1f} s; "
          f"{len({r.split()[2] for r in rows})} cell(s) failed in their hidden part:\n" + "\n".join(rows))


def test_the_second_backends_note_names_the_case_not_its_data():
    """The note of a cell run again on a second backend (NCCL on a GPU node; gloo here, the same path) quotes the
    hidden case's line, as the verdict does."""
    a, name = "04_context_parallel", "merge_no_max_subtraction"
    verdicts, hidden, student = _grade(a, _mutant(a, name), {"test_ring_forward"}, second_backend="gloo")
    v = verdicts["test_ring_forward"]
    assert v.backend_note.startswith("gloo: FAILED (not graded): hidden case "), v.backend_note
    checks = {n.id for n in ast.walk(ast.parse(hidden["test_ring_forward"])) if isinstance(n, ast.Name)
              and n.id.startswith("check_")}
    _assert_redacted("test_ring_forward", "header\n" + v.backend_note.split(": FAILED (not graded): ", 1)[1],
                     hidden["test_ring_forward"], student, checks)


def test_cases_are_counted_as_they_run():
    """Each call site once, a `for` over a literal list once per item; unknown where a loop hides the count."""
    checks = {"check_a", "check_b"}
    assert case_count("with checking('E', 'w'):\n    check_a(f, 2)\n    x = 3\n    check_b(f, x)", checks) == 2
    assert case_count("with c:\n    for w in [1, 2, 3]:\n        check_a(f, w)\n    check_b(f)", checks) == 4
    assert case_count("with c:\n    for w in range(3):\n        check_a(f, w)", checks) is None
    assert case_count("with c:\n    def g():\n        check_a(f)\n    g()", checks) is None
    assert case_count("with c:\n    def g():\n        return 1\n    check_a(f, g())", checks) == 1


def test_a_failure_is_described_by_its_kind_whatever_the_process_sent_back():
    """What the student's process sends back (frames, stacks, names) is data it chose: a malformed record still
    gives the case and a kind, and no message of the exception."""
    from autograder.grading.redact import HiddenCases, describe_hidden_failure
    from autograder.grading.trusted import remote_exception
    from autograder.runtime.dist import DistributedError, RankFailure

    cases = HiddenCases()
    cases.started = cases.current = 2
    cases.name = "check_x"
    bad = DistributedError("run_distributed: rank(s) 0 failed (world size 4).", [RankFailure(0, "exception", "x")])
    bad.failures[0].frames, bad.failures[0].kind, bad.failures[0].detail = 7, "timeout", 5
    msg = describe_hidden_failure(bad, cases, 3, "Exercise 1 · w: FAILED")
    assert msg.splitlines()[:2] == ["autograder.runtime.dist.DistributedError: Exercise 1 · w: FAILED",
                                    "hidden case 2 of 3 (check_x): a failure of another kind."], msg
    msg = describe_hidden_failure(remote_exception({"type": "ValueError", "message": "shape [4, 8]", "frames": "z"}),
                                  cases, None, None)
    assert "hidden case 2 (check_x): your code raised ValueError" in msg and "[4, 8]" not in msg, msg
    msg = describe_hidden_failure(NotImplementedError("Exercise 3 is not done yet: f is still the stub"), cases, 3)
    assert msg == ("NotImplementedError: Exercise 3 is not done yet: f is still the stub\n"
                   "hidden case 2 of 3 (check_x): a stub."), msg
