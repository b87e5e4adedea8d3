"""What a failed hidden case says: which case failed and how, never the case's data.

    ok, message = run_hidden(hidden_code, namespace, "<test test_ring_forward>")   # in the trusted grader

A test cell's hidden part (its lines between `### BEGIN HIDDEN TESTS` and
`### END HIDDEN TESTS`) calls the same checks as its visible part with other
world sizes, flags, shapes, dtypes and tensors. The student never sees that
code; a check's own message, written for the visible cases, quotes those
inputs (`rank 3: expected 3 all_reduce ([27] float64, ...)`, `cap 170 bytes`,
`ring_attention(causal=True) on [2, 16, 3, 4]`, a tensor's worst element).
When a hidden case fails, the verdict (the record, the instructor's table,
the feedback, Gradescope's results) says instead:

    autograder.runtime.compare.CheckFailure: Exercise 3 · ...: FAILED
    hidden case 2 of 3 (check_ring_attention): wrong communication, and wrong values.
    The hidden cases' inputs (world sizes, flags, shapes, tensors) are not shown: ...

- *which* case: the n-th call of a check in the hidden part, counted as it
  runs (a call in a loop is one case per iteration), and how many there are
  (a loop over a literal list counts its items; otherwise "of n" is left out);
- *how*: wrong values; wrong or missing communication (or both); ranks that
  called different collectives; an exception in the student's code, with its
  type and the student's own frames (their code is theirs), not its message
  (torch's messages quote shapes); a deadlock or a run past its time limit,
  with the student's line each rank was blocked on; a rank that died; a stub
  (the usual "Exercise N is not done yet" line); a wrong result of another
  kind (a schedule, a layout, a missing error), or a result the check could
  not use.

Never: a number, shape, dtype, flag or tensor of the hidden call, a rank
number (it tells the world size), nor the check's own text. The visible part's
messages are untouched: the student can read that code.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re

__all__ = ["run_hidden", "describe_hidden_failure", "HiddenCases", "case_count", "KINDS"]

# how a hidden case can fail: each message's `hidden case i of n (check): <kind>` starts with one of these
KINDS = ("a stub", "wrong values", "wrong or missing communication", "the ranks called different collectives",
         "a collective was given a non-contiguous tensor", "your code raised", "a rank raised", "a deadlock",
         "the ranks did not finish in time", "the ranks did not start in time", "a rank's process died",
         "a rank failed", "a wrong result", "the check could not use", "the submission's process did not answer",
         "the ranks' results could not be used", "a failure of another kind", "the run could not be decided")

_NOT_SHOWN = ("The hidden cases' inputs (world sizes, flags, shapes, tensors) are not shown: the visible tests "
              "run the same check on inputs you can read; try yours on other sizes too.")


class HiddenCases:
    """Counts the check calls of one hidden part as they run: `current` is the case running now (1-based),
    `name` its check; `started` how many have started."""

    def __init__(self):
        self.started = 0
        self.current: int | None = None
        self.name = ""

    def wrap(self, name: str, check):
        import functools

        @functools.wraps(check)
        def counted(*args, **kwargs):
            self.started += 1
            self.current, self.name = self.started, name
            result = check(*args, **kwargs)
            self.current = None
            return result

        return counted


def _is_check(name: str, obj) -> bool:
    return (name.startswith("check") and callable(obj)
            and (getattr(obj, "__module__", None) or "").startswith("autograder.checks"))


def case_count(code: str, checks) -> int | None:
    """How many check calls the hidden part makes: each call site once, times the items of every enclosing
    `for` over a literal list or tuple; None where that cannot be told (a loop over anything else, a `while`,
    a comprehension, or a function the part defines that calls a check)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None

    def count(nodes, times: int) -> int | None:
        total = 0
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.While,
                                 ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                if _has_call(node, checks):
                    return None
                continue
            if isinstance(node, (ast.For, ast.AsyncFor)):
                literal = isinstance(node.iter, (ast.List, ast.Tuple)) and \
                    not any(isinstance(e, ast.Starred) for e in node.iter.elts)
                if not literal and _has_call(ast.Module(body=node.body, type_ignores=[]), checks):
                    return None
                parts = [count([node.iter], times),
                         count(node.body, times * len(node.iter.elts)) if literal else 0,
                         count(node.orelse, times)]
            else:
                parts = [count(list(ast.iter_child_nodes(node)), times)]
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in checks:
                    parts.append(times)
            if any(p is None for p in parts):
                return None
            total += sum(parts)
        return total

    return count(tree.body, 1)


def _has_call(node, checks) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in checks
               for n in ast.walk(node))


def _header(code: str) -> str | None:
    """`Exercise 3 · what: FAILED` from the part's `with checking("Exercise 3", "what."):`, as `checking` writes
    it; None if the header is not two literal strings."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "checking" and len(call.args) >= 2 \
                        and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args[:2]):
                    label, what = call.args[0].value, call.args[1].value.strip().rstrip(".\u3002")
                    return f"{label} \u00b7 {what}: FAILED"
    return None


def run_hidden(code: str, namespace: dict, label: str) -> tuple[bool, str]:
    """Run a test cell's hidden part (its `with checking(...)` header and hidden lines) in a copy of
    `namespace` with every check counted; (passed, message), the message redacted on failure."""
    cases = HiddenCases()
    ns = dict(namespace)
    checks = {name for name, obj in namespace.items() if _is_check(name, obj)}
    for name in checks:
        ns[name] = cases.wrap(name, namespace[name])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, label, "exec"), ns)  # noqa: S102 - the instructor's test code
        return True, out.getvalue().strip()
    except BaseException as exc:  # noqa: BLE001 - a failure is a verdict
        if isinstance(exc, KeyboardInterrupt):
            raise
        return False, describe_hidden_failure(exc, cases, case_count(code, checks), _header(code))


# ---------------------------------------------------------------------------
# The kind of failure, from the exception object (its text is read, never shown)
# ---------------------------------------------------------------------------

def _type_name(exc: BaseException) -> str:
    """The exception's name as the visible part's messages write it (`traceback.format_exception_only`)."""
    cls = type(exc)
    mod = cls.__module__
    return cls.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{cls.__qualname__}"


def _frames_text(frames: list[dict]) -> list[str]:
    """The student's frames of an exception record (`where`, `text`, `student`), innermost last."""
    mine = [f for f in frames if isinstance(f, dict) and f.get("student")]
    if not mine:
        return []
    lines = ["  in your code (innermost last):"]
    for f in mine[-8:]:
        lines.append(f"    {f.get('where', '')}")
        if f.get("text"):
            lines.append(f"      {f['text']}")
    return lines


def _blocked_lines(failures) -> list[str]:
    """Where the ranks were blocked (the student's lines), each place once, without rank numbers."""
    from autograder.runtime.dist import _RETURNED, _blocked_at

    seen: list[str] = []
    for f in failures:
        if f.kind != "timeout":
            continue
        where = _blocked_at(f.detail)
        if where and where != _RETURNED and where not in seen:
            seen.append(where)
    out = []
    for where in seen[:3]:
        out.append(f"  a rank {where}".replace("\n      ", "\n    "))
    return out


# a check's own message about communication (read here, never shown): the ledger's trace (`format_trace`) or a
# count of collectives
_COMMUNICATION = re.compile(r"Communication of rank|\(no communication\)| \| group of \d+ \||expected \d+ (all_reduce|"
                            r"all_gather|reduce_scatter|all_to_all|broadcast|send|recv|isend|irecv|collective)")


def _check_failure_kind(exc: BaseException) -> str:
    kinds = getattr(exc, "kinds", None)
    if kinds:
        comm, values = "communication" in kinds, "values" in kinds
        if comm and values:
            return "wrong or missing communication, and wrong values"
        return "wrong or missing communication" if comm else "wrong values"
    if getattr(exc, "subject", ""):
        return "wrong values"
    tb, module = exc.__traceback__, ""
    while tb is not None:  # the innermost frame of the course's code that raised it
        name = tb.tb_frame.f_globals.get("__name__", "")
        if name.startswith("autograder."):
            module = name
        tb = tb.tb_next
    if module == "autograder.runtime.compare":
        return "wrong values"
    if module == "autograder.runtime.ledger" or _COMMUNICATION.search(str(exc)):
        return "wrong or missing communication"
    return "a wrong result (its values, its structure, or an error it should raise)"


def _distributed_kind(exc) -> tuple[str, list[str]]:
    if type(exc).__name__ == "InconclusiveRun":
        return "the run could not be decided (the grading machine was too busy to tell slow from stuck)", []
    failures = list(getattr(exc, "failures", []) or [])
    summary = str(getattr(exc, "summary", "") or "")
    if not failures:
        if "TimeoutError" in summary or "did not answer" in summary:
            return "the submission's process did not answer in time (it was stopped)", []
        return "the ranks' results could not be used (not one plain result per rank)", []
    if summary.startswith("run_distributed: deadlock"):
        return "a deadlock: every rank was blocked, none computing", _blocked_lines(failures)
    if summary.startswith("run_distributed: timed out") or any(f.kind == "timeout" for f in failures):
        return "the ranks did not finish in time (a deadlock, or a very slow rank)", _blocked_lines(failures)
    if summary.startswith("run_distributed: the ranks did not all start"):
        return "the ranks did not start in time (the grading machine was overloaded)", []
    root = failures[0]
    root.exc_type = str(root.exc_type or "")[:80]  # a name the student's process sent: theirs, kept short
    if root.kind == "crash":
        first = root.detail.partition("\n")[0]
        how = first if first.startswith("killed by ") else "exited without returning"
        return f"a rank's process died ({how})", []
    if root.kind != "exception":
        return "a rank failed", _blocked_lines(failures)
    frames = _frames_text(root.frames if isinstance(root.frames, list) else [])
    if root.exc_type == "CollectiveMismatch":
        return "the ranks called different collectives (or one collective with different shapes or dtypes)", frames
    if root.exc_type == "NonContiguousTensor":
        return "a collective was given a non-contiguous tensor", frames
    if frames:
        return f"your code raised {root.exc_type or 'an exception'} (its message is not shown)", frames
    if root.exc_type in ("CheckFailure", "AssertionError"):  # the check's own verdict, made in a rank
        return "a wrong result (found in a rank)", []
    return (f"a rank raised {root.exc_type or 'an exception'} outside your own lines (in torch or in the check's "
            f"code), from what your code set up or returned"), []


def _kind(exc: BaseException) -> tuple[str, list[str]]:
    """(how the case failed, the student's lines that show where) for the exception a hidden case raised."""
    from autograder.runtime.compare import CheckFailure

    if getattr(exc, "record", None) is not None:  # a student function the grader called raised in the zygote
        record = exc.record if isinstance(exc.record, dict) else {}
        name = str(record.get("type") or "an exception")[:80]
        if name in ("TimeoutError", "RuntimeError") and not record.get("frames"):
            return "the submission's process did not answer (it was stopped)", []
        return f"your code raised {name} (its message is not shown)", _frames_text(record.get("frames") or [])
    if hasattr(exc, "failures") and isinstance(exc, RuntimeError):
        return _distributed_kind(exc)
    if isinstance(exc, CheckFailure):
        return _check_failure_kind(exc), []
    if isinstance(exc, AssertionError):
        return "a wrong result", []
    return (f"the check could not use what your code returned ({type(exc).__name__} in the check's code)"), []


def describe_hidden_failure(exc: BaseException, cases: HiddenCases, total: int | None,
                            header: str | None = None) -> str:
    """The verdict of a failed hidden part: the exercise, which case, how; none of the case's data."""
    text = str(exc)
    of = f" of {total}" if total and cases.current and total >= cases.current else ""
    if isinstance(exc, NotImplementedError) and getattr(exc, "record", None) is None \
            and " is not done yet: " in text.partition("\n")[0]:  # `checking`'s line for a stub: no data in it
        case = f"\nhidden case {cases.current}{of} ({cases.name}): a stub." if cases.current else ""
        return f"NotImplementedError: {text.partition(chr(10))[0]}{case}"
    head = header or (text.partition("\n")[0] if text.partition("\n")[0].endswith(": FAILED") else "FAILED")
    if cases.current is None:
        where = ("the hidden tests' own set-up failed before their first case" if cases.started == 0
                 else f"the hidden tests failed after case {cases.started}, outside any check")
        return f"{_type_name(exc)}: {head}\n{where}. {_NOT_SHOWN}"
    try:
        how, lines = _kind(exc)
    except Exception:  # noqa: BLE001 - what the student's process sent back (frames, stacks) is untrusted data
        how, lines = "a failure of another kind", []
    body = [f"hidden case {cases.current}{of} ({cases.name}): {how}."] + lines + [_NOT_SHOWN]
    return f"{_type_name(exc)}: {head}\n" + "\n".join(body)
