"""What a student sees when a graded test cell runs: one line when it passes, the verdict first when not.

Every graded test cell of a notebook wraps its checks (the builder writes this):

    with checking("Exercise 1", "f: identity forward, one all-reduce of the gradient in backward"):
        check_mapping(copy_to_tensor_model_parallel_region, "copy_to_tensor_model_parallel_region", world_size=2)

- passed: one line, what was checked, the world sizes the checks ran on, the time:
  `✓ Exercise 1 · f: identity forward, ... — passed (world size 2, 0.4 s)`
- a stub: `NotImplementedError: Exercise 3 is not done yet: ColumnParallelLinear.__init__ is
  still the stub ...`, naming the exercise and the function;
- any other failure: the same exception type, its message led by the exercise and
  what was checked, and in IPython only that message and the student's own frames
  (`_render_traceback_`); the course's internals are one flag away:
  `AUTOGRADER_TRACEBACK=full` in the environment, or `show_internals(True)`.

Each notebook's set-up cell ends with `course_notebook({"Exercise 3": ["ring_attention_forward", ...], ...})`
(its builder writes it): a stub is then named with the exercise that owns it even in another exercise's test
("Exercise 3 is not done yet: ... This test uses it: implement Exercise 3 first"), and in a Jupyter kernel a
picture or scratch cell shows the course's errors (a failed run, a check's verdict, a stub) as a test cell
does, and a ValueError by which a course function refuses an argument in one line led by that function
(`ValueError: plot_dispatch: num_experts (8) must be divisible by world_size (3), the EP size`). A spawned rank (macOS) names the kernel's cells as the kernel does (`student_sources`, `install_sources`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import sys
import sysconfig
import time
import traceback
from dataclasses import dataclass, field

from autograder.runtime.messages import localize, set_language

__all__ = ["checking", "show_internals", "note_run", "student_frames", "is_student_file", "describe_location",
           "student_sources", "install_sources", "course_notebook", "exercise_of", "render_outside_check"]

_FULL = {"on": os.environ.get("AUTOGRADER_TRACEBACK", "").lower() == "full"}


def show_internals(on: bool = True) -> None:
    """Show full tracebacks, the course's own frames included (for instructors and debugging)."""
    _FULL["on"] = bool(on)


def internals_shown() -> bool:
    return _FULL["on"]


@dataclass
class _Report:
    label: str
    what: str
    runs: list = field(default_factory=list)  # (world_size, seconds, of which starting the ranks)


_current: contextvars.ContextVar[_Report | None] = contextvars.ContextVar("autograder_check", default=None)


def note_run(world_size: int, seconds: float, startup: float = 0.0) -> None:
    """Called by run_distributed: the world sizes a graded cell ran on (and the time its ranks took to start)
    go into its pass line."""
    report = _current.get()
    if report is not None:
        report.runs.append((world_size, seconds, startup))


# -- which frames are the student's -------------------------------------------------------------

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the whole autograder package
_LIB_DIRS = tuple({os.path.abspath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                               sysconfig.get_paths()["platlib"])})


def is_student_file(filename: str) -> bool:
    """A notebook cell or the student's own file: not the course package, not torch, not the standard library."""
    if not filename or filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):  # "<cell ...>", "<ipython-input-...>", "<string>"
        return True
    path = os.path.abspath(filename)
    if path.startswith(_PKG_DIR + os.sep):
        return False
    return not any(path.startswith(d + os.sep) for d in _LIB_DIRS)


# A spawned rank has no IPython: the kernel's names of its cells (`Cell In[5]`) travel with the rank program
# (student_sources / install_sources), so that a message never names ipykernel's temporary file of a cell.
_LABELS: dict[str, str] = {}


def student_sources() -> dict:
    """The source lines and the kernel's names of the student's cells (linecache entries of code that is not a
    file on disk), for a spawned rank: `{"lines": {filename: text}, "labels": {filename: "Cell In[5]"}}`."""
    import linecache

    lines, labels = {}, {}
    for filename, entry in list(linecache.cache.items()):
        if not isinstance(filename, str) or not is_student_file(filename) or len(entry) < 3:
            continue
        label = _kernel_label(filename)
        if label:
            labels[filename] = label
        if filename.startswith("<") or not os.path.exists(filename):  # a real file: the rank reads it itself
            lines[filename] = "".join(entry[2] or ())
    return {"lines": lines, "labels": labels}


def install_sources(sources: dict) -> None:
    """In a spawned rank: make the parent's cells readable (linecache) and named as the kernel names them."""
    import linecache

    for filename, text in (sources or {}).get("lines", {}).items():
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    _LABELS.update((sources or {}).get("labels", {}))


def _kernel_label(filename: str) -> str | None:
    """`Cell In[5]` for a cell the running IPython kernel compiled, else None."""
    if filename in _LABELS:
        return _LABELS[filename]
    try:
        # Only where IPython is already loaded (a kernel, and the ranks forked from it): importing it
        # costs ~60 ms, in every rank that reports a call site.
        ipython = sys.modules.get("IPython")
        ip = ipython.get_ipython() if ipython is not None else None
        label = ip.compile.format_code_name(filename) if ip is not None else None
    except Exception:  # noqa: BLE001 - no IPython, or an older one: fall back to the file name
        label = None
    return f"{label[0]} {label[1]}" if label else None


def describe_location(filename: str, lineno: int, name: str) -> str:
    """`Cell In[5], line 12, in forward` for a notebook cell (as IPython names it; in the grader `answer cell
    ring_forward, line 12, in forward`), `file.py:12, in forward` else."""
    label = _kernel_label(filename)
    if label:
        return f"{label}, line {lineno}, in {name}"
    if filename.startswith("<") and filename.endswith(">") and filename not in ("<string>", "<stdin>"):
        return f"{filename[1:-1]}, line {lineno}, in {name}"  # `<answer cell ring_forward>`: the grader's names
    if filename.startswith("<"):
        return f"{filename}, line {lineno}, in {name}"
    return f"{os.path.basename(filename)}:{lineno}, in {name}"


def student_frames(tb) -> list[traceback.FrameSummary]:
    """The frames of a traceback that are in the student's code, outermost first."""
    return [fs for fs in traceback.extract_tb(tb) if is_student_file(fs.filename)]


def _qualname(tb) -> str:
    """`Class.method` of the innermost student frame of a traceback (Python >= 3.11 knows it)."""
    name = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_student_file(code.co_filename):
            name = getattr(code, "co_qualname", code.co_name)
        tb = tb.tb_next
    return name


# The last line of every released stub (nbgrader_config.py's code_stub).
STUB_LINE = "raise NotImplementedError()"


def _stub_name(exc: BaseException) -> str | None:
    """The student function that is still a stub, if `exc` comes from one; None otherwise."""
    if hasattr(exc, "failures"):  # a DistributedError: every rank that raised is stuck in a stub
        return getattr(exc, "stub", "") or None
    if getattr(exc, "record", None) is not None:  # raised by the student's code in the trusted grader's zygote
        return getattr(exc, "stub", "") or None
    if isinstance(exc, NotImplementedError):
        frames = student_frames(exc.__traceback__)
        if frames and (frames[-1].line or "").strip() == STUB_LINE:
            return _qualname(exc.__traceback__) or frames[-1].name
    return None


# -- which exercise owns each function the student writes ----------------------------------------

_EXERCISE_OF: dict[str, str] = {}


def course_notebook(exercises: dict, language: str = "en") -> None:
    """A notebook's set-up (its builder writes the call): `exercises` names the functions each exercise's answer
    cells define, `{"Exercise 3": ["ring_attention_forward", ...], ...}`, so that a test (or a picture) that uses
    a function still a stub names the exercise that owns it, not its own. In a Jupyter kernel it also makes
    every cell, scratch and picture cells included, show the course's errors as the test cells do: the verdict
    and the student's own lines, never the course's frames (`show_internals` shows everything); a course
    function's ValueError (an argument it refuses) is one line, led by the function the cell called.
    `language`: the notebook's ("en", or "zh" in a Chinese notebook): the language of the verdicts, pass lines
    and hints it shows (autograder.runtime.messages).
    """
    set_language(language)
    _EXERCISE_OF.clear()
    for label, names in exercises.items():
        for name in names:
            _EXERCISE_OF[name] = label
    _install_display_hook()


def exercise_of(stub: str) -> str | None:
    """The exercise that defines `ring_attention_forward` (or `RingAttention.backward`: its class), as the
    notebook's set-up said (`course_notebook`); None if it did not."""
    if not stub:
        return None
    return _EXERCISE_OF.get(stub) or _EXERCISE_OF.get(stub.split(".")[0])


def _stub_text(stub: str, label: str | None) -> str:
    """The one-line verdict for a stub: its own exercise named, and where to go."""
    owner = exercise_of(stub)
    if owner and owner != label and label:
        return (f"{owner} is not done yet: {stub} is still the stub (it raises NotImplementedError). This test uses "
                f"it: implement {owner} first, run its answer cell, then run this one again.")
    if owner and owner != label:
        return (f"{owner} is not done yet: {stub} is still the stub (it raises NotImplementedError). This cell uses "
                f"it: implement {owner} first, run its answer cell, then run this one again.")
    if label:
        return (f"{label} is not done yet: {stub} is still the stub (it raises NotImplementedError). "
                f"Implement it in the answer cell of {label}, run that cell, then run this one again.")
    return (f"{stub} is still the stub (it raises NotImplementedError): implement it in its answer cell, run that "
            f"cell, then run this one again.")


def defines_name(src: str, name: str) -> bool:
    """Whether a cell's text defines `name` at its top level (`def name`, `class name`, `name = ...`): read as
    text, so that a cell that does not even compile (an unclosed parenthesis) is still known as its definer."""
    name = re.escape(name)
    return re.search(rf"^(?:async[ \t]+)?(?:def|class)[ \t]+{name}\b|^{name}[ \t]*(?::[^=\n]*)?=(?!=)", src,
                     re.M) is not None


def _kernel_error_defining(name: str) -> str | None:
    """The kernel's last error, if it is that of a cell that defines `name` (`SyntaxError: '(' was never closed
    (Cell In[5], line 3)`): the reason why `name` is not defined. None elsewhere (IPython keeps its last error
    in sys.last_value; a plain interpreter, the grader, has none of a notebook cell)."""
    import linecache

    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if isinstance(last, SyntaxError):
        filename, lineno, text = last.filename or "", last.lineno, f"{type(last).__name__}: {last.msg}"
    elif isinstance(last, Exception):
        cells = [fs for fs in traceback.extract_tb(last.__traceback__) if _kernel_label(fs.filename)]
        if not cells:
            return None
        filename, lineno = cells[0].filename, cells[0].lineno
        text = (f"{type(last).__name__}: {last}".splitlines() or [""])[0][:300]
    else:
        return None
    label = _kernel_label(filename)
    if not label or not defines_name("".join(linecache.getlines(filename)), name):
        return None
    return f"{text} ({label}, line {lineno})"


def _undefined_hint(exc: BaseException) -> str:
    """What to add to Python's `name 'all_reduce_gradients' is not defined` in a test: the kernel's error of the
    cell that defines it (a SyntaxError, say), else which exercise's answer cell defines it and has not run."""
    if not isinstance(exc, NameError):
        return ""
    found = re.fullmatch(r"name '([A-Za-z_]\w*)' is not defined", str(exc).strip())
    if not found:
        return ""
    name = found.group(1)
    failed = _kernel_error_defining(name)
    if failed:
        return f"\nThe cell that defines it failed: {failed}. Fix it, run it again, then run this test."
    owner = exercise_of(name)
    if owner:
        return (f"\n{name} is defined by the answer cell of {owner}: run that cell (and fix the error it shows, "
                f"if any), then run this test again.")
    return ""


def render_outside_check(exc: BaseException) -> list[str] | None:
    """What a scratch or picture cell shows for one of the course's errors (a failed run, a check's verdict, a
    stub reached through the course's code, a ValueError raised by the course's code): the verdict and the
    student's frames, as a test cell shows them (a course function called straight from the cell: one line).
    None for any other error (the student's own, shown as Python shows it)."""
    if internals_shown():
        return None
    stub = _stub_name(exc)
    if stub is not None:
        return [f"NotImplementedError: {localize(_stub_text(stub, None))}"]
    from autograder.runtime.compare import CheckFailure

    if isinstance(exc, CheckFailure) or _is_distributed_error(exc):
        return _render(exc, localize(str(exc)))
    if isinstance(exc, ValueError) and _raised_by_course(exc.__traceback__):
        return _render(exc, localize(_argument_text(exc)))
    return None


def _is_course_file(filename: str) -> bool:
    return bool(filename) and not filename.startswith("<") and \
        os.path.abspath(filename).startswith(_PKG_DIR + os.sep)


def _raised_by_course(tb) -> bool:
    """Whether the innermost frame of a traceback that is not the standard library's or an installed package's
    is the course's own code (a course function refusing an argument, or a library it called refusing one),
    not the student's."""
    last = None
    for fs in traceback.extract_tb(tb):
        if _is_course_file(fs.filename):
            last = "course"
        elif is_student_file(fs.filename):
            last = "student"
    return last == "course"


def _course_entry(tb) -> str:
    """The course function the student's code called (the outermost frame of the course's code)."""
    for fs in traceback.extract_tb(tb):
        if _is_course_file(fs.filename):
            return fs.name
    return ""


_NAMED = re.compile(r"^[A-Za-z_][\w.]*(\(.*?\))?: ")


def _argument_text(exc: BaseException) -> str:
    """A course function's ValueError as a picture or scratch cell shows it: led by the function the cell called
    (`plot_dispatch: num_experts (8) must be divisible by world_size (3), the EP size`). A check's own word for
    its arguments, `check parameters:`, becomes that function's name: in such a cell they are the student's."""
    text = str(exc)
    entry = _course_entry(exc.__traceback__)
    if not entry or entry.startswith("_"):
        return text
    if text.startswith("check parameters: "):
        return f"{entry}: {text[len('check parameters: '):]}"
    if not _NAMED.match(text):
        return f"{entry}: {text}"
    return text


def _is_distributed_error(exc: BaseException) -> bool:
    """autograder.runtime.dist.DistributedError (which imports this module: named, not imported)."""
    return isinstance(exc, RuntimeError) and type(exc).__name__ == "DistributedError" and hasattr(exc, "failures")


def _is_inconclusive(exc: BaseException) -> bool:
    """autograder.runtime.dist.InconclusiveRun (named, not imported: dist imports this module)."""
    return any(t.__name__ == "InconclusiveRun" and t.__module__ == "autograder.runtime.dist"
               for t in type(exc).__mro__)


def _display_hook(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for the course's errors in any cell (course_notebook installs it)."""
    render = getattr(value, "_render_traceback_", None)
    stb = None
    if callable(render):
        stb = render()
    if stb is None:
        stb = render_outside_check(value)
    if stb is None:
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    shell._showtraceback(etype, value, stb)
    return stb


def _install_display_hook() -> None:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    from autograder.runtime.compare import CheckFailure

    # RuntimeError: DistributedError's base; ValueError: a course function refusing the student's argument (one
    # line); any other error of these types (the student's own) is shown as IPython shows it
    shell.set_custom_exc((RuntimeError, CheckFailure, NotImplementedError, ValueError), _display_hook)


def _render(exc: BaseException, text: str) -> list[str]:
    """The lines IPython shows for a failed graded cell: the verdict, then the student's own frames.

    The test cell's own frame (the outermost) is left out: it is the check's
    call, not the student's code. Frames of the course's checks and of torch
    are left out too (`show_internals` shows everything).
    """
    lines = [f"{type(exc).__name__}: {text}"]
    frames = student_frames(exc.__traceback__)[1:]
    if frames:
        lines.append("")
        lines.append(localize("In your code (innermost last):"))
        for fs in frames:
            lines.append(f"  {describe_location(fs.filename, fs.lineno, fs.name)}")
            if fs.line:
                lines.append(f"    {fs.line.strip()}")
    return lines


def _attach_rendering(exc: BaseException, text: str) -> None:
    if internals_shown():
        return
    try:
        exc._render_traceback_ = lambda: _render(exc, text)
    except (AttributeError, TypeError):  # an exception type without a __dict__
        pass


def _ran_on(runs) -> str:
    sizes = sorted({w for w, _, _ in runs})
    if not sizes:
        return ""
    word = "world size" if len(sizes) == 1 else "world sizes"
    return f"{word} {', '.join(str(s) for s in sizes)}"


def _starting(runs) -> str:
    """`, 5.8 s of it starting the ranks` where starting them was a noticeable part (spawned ranks)."""
    startup = sum(s for _, _, s in runs)
    return f", {startup:.1f} s of it starting the ranks" if startup >= 0.5 else ""


@contextlib.contextmanager
def checking(label: str, what: str):
    """A graded cell: print one line on success; on failure re-raise with the exercise and the verdict first."""
    what = what.strip().rstrip(".\u3002")  # a caption's full stop, English or Chinese
    report = _Report(label, what)
    token = _current.set(report)
    t0 = time.perf_counter()
    try:
        yield report
    except BaseException as exc:  # noqa: BLE001 - re-raised below, never swallowed
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        if _is_inconclusive(exc):  # the machine's fault, not a verdict: said so, first
            text = localize(f"{label} \u00b7 {what}: NOT DECIDED (not a verdict on your code)\n{exc}")
            exc.args = (text,)
            _attach_rendering(exc, text)
            raise
        stub = _stub_name(exc)
        if stub is not None:
            text = localize(_stub_text(stub, label))
            new = NotImplementedError(text)
            _attach_rendering(new, text)
            raise new from None
        text = localize(f"{label} · {what}: FAILED\n{exc}{_undefined_hint(exc)}")
        try:
            exc.args = (text,)
        except (AttributeError, TypeError):
            pass
        if str(exc) != text:  # an exception type whose str() ignores args: say it in a note
            text = localize(f"{label} · {what}: FAILED\n{exc}")
        _attach_rendering(exc, text)
        raise
    finally:
        _current.reset(token)
    seconds = time.perf_counter() - t0
    ran = _ran_on(report.runs)
    detail = f"{ran}, {seconds:.1f} s{_starting(report.runs)}" if ran else f"{seconds:.1f} s"
    print(localize(f"\u2713 {label} \u00b7 {what} \u2014 passed ({detail})"))
    sys.stdout.flush()
