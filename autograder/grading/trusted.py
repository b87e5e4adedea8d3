"""Trusted verdicts: grade a submission from a process that never runs the student's code.

    results = grade_notebook(submitted_nb, source_nb, assignment="02_tensor_parallel", sandbox=Sandbox(...))
    # {grade_id: CellVerdict(passed, points, max_points, message, visible_passed)}

Two processes per submission:

- the **grader** (this process, outside any sandbox) reads the submitted
  notebook as JSON, executes only the source notebook's test cells (the
  instructor's code, hidden tests included) with every name the student
  defines bound to a `StudentRef`, and decides every verdict itself;
- the **zygote** (`_zygote_main`), in the sandbox (a fresh interpreter, or in a class run a fork of its
  worker's fork server that made a sandbox of its own: autograder.grading.forkserver), runs
  the notebook's given, answer and scratch cells once, in order (never a
  test cell: the grader runs each check once, here), then serves the
  grader's requests: run a rank program on N ranks (it forks them, as
  `run_distributed` does) or call a student function. Requests and replies
  are length-prefixed frames on the zygote's stdin and stdout, bounded in
  size (a reply over `MAX_REPLY` bytes is refused before it is read). What a
  rank runs is sent by value (`dumps_by_value`: the checks' own functions
  travel as code, never as a name the student's process could have
  rebound), with the check's inputs only: expected results stay here. The
  zygote sends back only data, which the grader loads with
  `torch.load(weights_only=True)` (tensors, numbers, strings, containers
  and the ledger's records) or as JSON (errors).

Nothing the student's code does to Python objects can reach the grader: a
patched check, a patched `run_distributed`, an IPython hook or an AST
transformer exist only in the zygote. What the ranks report about themselves
(their outputs and their communication ledger) is produced next to the
student's code, and a submission written to forge it would pass: that is
cheating by design, not a fault the grader can tell from a correct solution,
and the threat model in the README says so. The zygote serves with the
runtime bound before the student's cells ran, and a notebook whose code
reaches into that runtime has its points flagged for review
(autograder.grading.integrity). A failed hidden case's message says which
case and how, never its data (autograder.grading.redact).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import os
import re
import select
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

from autograder.runtime.plaindata import safe_load

__all__ = ["StudentRef", "ZygoteClient", "CellVerdict", "grade_notebook", "safe_load", "RemoteError"]

_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)[ \t]*$", re.M)


# ---------------------------------------------------------------------------
# Data only, both ways
# ---------------------------------------------------------------------------

# In the zygote (and the ranks it forks): the namespace the student's cells ran in.
_NAMESPACE: dict | None = None


class StudentRef:
    """Stands, in the grader, for a name the student's notebook defines; the real thing in the zygote.

    In the zygote and its ranks it behaves as the student's object of that
    name (calls and attributes go to it), wherever it travelled: an argument,
    a closure of a check's helper, a global of a given cell's function. In
    the grader, calling it runs the student's function in the zygote and
    returns its (data) result; its exceptions come back as the same built-in
    type (a `ValueError` stays a `ValueError`). Nothing else of it is
    available in the grader: checks hand student code to rank programs.
    """

    def __init__(self, name: str):
        self.__name__ = name
        self.__qualname__ = name

    def _target(self):
        try:
            return _NAMESPACE[self.__name__]
        except KeyError:
            raise NameError(f"name {self.__name__!r} is not defined: did the answer cell that defines it run "
                            f"without an error?") from None

    def __repr__(self) -> str:
        return f"<your {self.__name__}>"

    def __call__(self, *args, **kwargs):
        if _NAMESPACE is not None:
            return self._target()(*args, **kwargs)
        client = _CLIENT.get("client")
        if client is None:
            raise RuntimeError(f"{self.__name__} is a stand-in for the student's code; no zygote is running")
        return client.call(self.__name__, args, kwargs)

    def __getattr__(self, attr):
        if attr.startswith("__") or _NAMESPACE is None:
            raise AttributeError(f"{self!r} has no attribute {attr!r} in the grader")
        return getattr(self._target(), attr)

    def __reduce__(self):
        return (StudentRef, (self.__name__,))


def resolve(value, namespace: dict):
    """`value` with every StudentRef replaced by the student's object of that name (in the zygote)."""
    if isinstance(value, StudentRef):
        name = value.__name__
        if name not in namespace:
            raise NameError(f"name {name!r} is not defined: did the answer cell that defines it run without "
                            f"an error?")
        return namespace[name]
    if isinstance(value, tuple):
        return tuple(resolve(v, namespace) for v in value)
    if isinstance(value, list):
        return [resolve(v, namespace) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, namespace) for k, v in value.items()}
    return value


class RemoteError(Exception):
    """A student function called from the grader raised in the zygote; message and frames as data."""

    def __init__(self, record: dict):
        self.record = record
        self.stub = record.get("stub", "")
        super().__init__(f"{record.get('type', 'Error')}: {record.get('message', '')}")


class RemoteNotImplemented(RemoteError, NotImplementedError):
    """RemoteError for a NotImplementedError (a stub, or a deliberately unsupported case)."""


_REMOTE_TYPES: dict = {"NotImplementedError": RemoteNotImplemented}


def remote_exception(record: dict) -> RemoteError:
    """The exception to raise in the grader for one the student's code raised in the zygote: of the same
    built-in type where it was one (a check that expects ValueError sees a ValueError), else RemoteError."""
    import builtins

    name = record.get("type", "")
    cls = _REMOTE_TYPES.get(name)
    if cls is None:
        base = getattr(builtins, name, None)
        if isinstance(base, type) and issubclass(base, Exception) and base not in (BaseException,):
            cls = _REMOTE_TYPES[name] = type(f"Remote{name}", (RemoteError, base), {"__module__": __name__})
        else:
            cls = RemoteError
    exc = cls.__new__(cls)
    RemoteError.__init__(exc, record)
    exc.args = (record.get("message", ""),)
    return exc


# ---------------------------------------------------------------------------
# The channel: length-prefixed frames on the zygote's stdin and stdout, bounded in size
# ---------------------------------------------------------------------------

_PREFIX = struct.Struct(">4sIQ")  # magic, header length, blob length
_MAGIC = b"AGZ1"
MAX_HEADER = 1 << 20  # a frame's JSON header
MAX_REPLY = 256 << 20  # a reply's data (the ranks' tensors): more is refused, the process stopped
RESERVE_MB = 32  # scratch space kept for the runner while the student's cells run
# what the zygote's interpreter starts with (and a fork server's, which every fork inherits)
ZYGOTE_ENV = {"TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg"}


# A student function called by a check in the grader: its CPU budget (a verdict past it), and the wall clock
# past which the call is given up as inconclusive (a machine too busy to tell).
CALL_CPU_S = 60.0
CALL_BACKSTOP_S = 900.0
# ... and the seconds in a row its processes may all be asleep (none running, none waiting for a CPU: the
# scheduler's record, autograder.runtime.dist._StallWatch) before that is a verdict: it stopped by its own doing
ASLEEP_S = 30.0


def _process_tree(root: int) -> set[int]:
    """`root` and every process descended from it (Linux /proc; {root} elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {root}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def start_backstop(cpu_budget: float) -> float:
    """Wall-clock seconds after which a zygote still running the notebook's cells is given up (inconclusive)."""
    return max(600.0, 5.0 * cpu_budget)


class StartInconclusive(RuntimeError):
    """The notebook's cells had not finished when the wall clock gave up, within their CPU budget."""


class ChannelError(RuntimeError):
    """The other side closed the channel, broke its framing, sent too much, or did not answer in time."""


def _write_all(fd: int, data: bytes, deadline: float | None = None) -> None:
    view = memoryview(data)
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise ChannelError("the submission's process did not take the grader's request in time")
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        except OSError as exc:
            raise ChannelError(f"the submission's process closed its channel ({exc.strerror})") from None
        view = view[n:]


def send_frame(fd: int, header: dict, blob: bytes = b"", deadline: float | None = None) -> None:
    data = json.dumps(header).encode("utf-8")
    _write_all(fd, _PREFIX.pack(_MAGIC, len(data), len(blob)) + data + bytes(blob), deadline)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ChannelError("timeout")
        try:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise ChannelError("the submission's process closed its channel (it exited or was killed)")
        buf += chunk
    return bytes(buf)


def read_frame(fd: int, deadline: float | None = None, max_blob: int = MAX_REPLY) -> tuple[dict, bytes]:
    """One frame; a frame larger than the limits is refused before anything of it is kept."""
    magic, n_header, n_blob = _PREFIX.unpack(_read_exact(fd, _PREFIX.size, deadline))
    if magic != _MAGIC:
        raise ChannelError("the submission's process wrote something else than the grader's protocol on its "
                           "channel")
    if n_header > MAX_HEADER or n_blob > max_blob:
        raise ChannelError(f"the submission's process sent a reply of {n_header + n_blob:,} bytes (at most "
                           f"{max_blob:,} are accepted): rank programs return small tensors, numbers and strings")
    try:
        header = json.loads(_read_exact(fd, n_header, deadline).decode("utf-8"))
    except ValueError:
        raise ChannelError("the submission's process sent a malformed reply") from None
    if not isinstance(header, dict):
        raise ChannelError("the submission's process sent a malformed reply")
    return header, _read_exact(fd, n_blob, deadline)


# ---------------------------------------------------------------------------
# The zygote: runs in the sandbox, executes the student's cells, serves requests
# ---------------------------------------------------------------------------

_EXERCISE_HEADING = re.compile(r"^#+\s*(Exercise\s+\d+)\b", re.M)


def _cell_filename(meta: dict, index: int, exercise: str | None = None) -> str:
    """The name a cell's code runs under in the zygote; messages show it without the brackets
    (`answer cell of Exercise 3 (ring_forward), line 12, in ring_attention_forward`)."""
    gid = meta.get("grade_id")
    if meta.get("solution"):
        return f"<answer cell of {exercise} ({gid})>" if exercise else f"<answer cell {gid}>"
    if gid:
        return f"<given cell {gid}>"
    return f"<code cell {index}" + (f", after the heading of {exercise}>" if exercise else ">")


def _executable_cells(nb: dict, skip: frozenset = frozenset(), with_ids: bool = False) -> list[tuple]:
    """(filename, source) of the code cells the zygote runs: everything but graded test cells
    ((filename, source, grade id or None) `with_ids`).

    `skip`: sources of free cells to leave out (the notebook's own pictures and
    scratch examples, as released: they define nothing the student wrote).
    """
    out, exercise, code_cells = [], None, 0
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        if cell.get("cell_type") == "markdown":
            found = _EXERCISE_HEADING.findall(src if isinstance(src, str) else "")
            if found:
                exercise = " ".join(found[-1].split())
            continue
        if cell.get("cell_type") != "code":
            continue
        code_cells += 1
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        if meta.get("grade") and not meta.get("solution"):
            continue
        if not meta and src in skip:
            continue
        # IPython-only syntax (magics, shell escapes) has no meaning here
        src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        out.append((_cell_filename(meta, code_cells, exercise), src) + ((meta.get("grade_id"),) if with_ids else ()))
    return out


def _zygote_main(inputs: str, workdir: str, output_limit: int) -> None:
    """Entry point in the sandbox: run the cells, then serve the grader's requests (frames on stdin/stdout).

    `inputs` (read-only here) holds the notebook and the free cells to skip, written by the grader;
    `workdir` is the submission's own scratch folder.
    """
    import linecache

    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    # the channel gets private descriptors; fds 0, 1 and 2 (the student's prints, C++ logs) go elsewhere.
    # (Code in this process could still use the channel: the grader takes only data from it.)
    requests, reply = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = open(os.path.join(workdir, "zygote.log"), "w", encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = _Capped(log, output_limit)

    import torch  # noqa: F401 - before forking ranks (spec 6)

    import autograder.runtime.agreement  # noqa: F401 - dispatch-mode imports, paid once
    from autograder.grading.integrity import Guard

    # what serves the grader, bound before the student's cells run (a cell that rebinds any of it by name
    # changes nothing sent back), and a baseline of the runtime to tell the grader what the cells replaced
    guard = Guard()
    guard.tools.update(serve=_serve, send_frame=send_frame, read_frame=read_frame, to_bytes=_to_bytes,
                       resolve=resolve, StudentRef=StudentRef, changed=guard.changed)

    with open(os.path.join(inputs, "submission.ipynb"), encoding="utf-8") as f:
        nb = json.load(f)
    with open(os.path.join(inputs, "skip.json"), encoding="utf-8") as f:
        skip = frozenset(json.load(f))
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    global _NAMESPACE
    _NAMESPACE = namespace  # StudentRefs arriving here (and in the forked ranks) are the student's objects
    cell_errors = []
    # room kept for the runner's own files (rendezvous, rank logs, results) in the scratch space, which a
    # notebook that fills it in its cells would otherwise leave with none: given back once the cells ran
    reserve = os.path.join(tempfile.gettempdir(), ".autograder-reserve")
    with contextlib.suppress(OSError), open(reserve, "wb") as f:
        for _ in range(RESERVE_MB):
            f.write(bytes(1 << 20))
    for filename, src in _executable_cells(nb, skip):
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        try:
            exec(compile(src, filename, "exec"), namespace)  # noqa: S102 - the sandbox's purpose
        except BaseException as exc:  # noqa: BLE001 - a cell's error is recorded, the others still run
            if isinstance(exc, KeyboardInterrupt):
                raise
            cell_errors.append(_cell_error(filename, exc))
        guard.tools["changed"]()  # what this cell replaced; the modules it imported are baselined from here
    with contextlib.suppress(OSError):
        os.remove(reserve)
    tools = guard.tools
    tools["send_frame"](reply, {"ready": True, "cell_errors": cell_errors[:50], "tampered": tools["changed"]()})
    tools["serve"](requests, reply, namespace, tools)


def _cell_error(filename: str, exc: BaseException) -> dict:
    """What the zygote reports of a cell that failed: the cell, the error, and the line of that cell it failed at
    (a SyntaxError's own line: nothing of the cell ran; else the cell's innermost frame: the cell ran up to it)."""
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        return {"cell": filename, "error": f"{type(exc).__name__}: {exc.msg}"[:500], "line": exc.lineno}
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == filename:
            line = frame.lineno
    return {"cell": filename, "error": f"{type(exc).__name__}: {exc}"[:500], "line": line}


def _serve(requests: int, reply: int, namespace: dict, tools: dict) -> None:
    """Answer the grader's requests until it closes the channel, with `tools` (bound before the student's
    cells ran); every reply says what of the runtime is no longer as it was then (`tampered`)."""
    read_frame, loads, resolve, StudentRef = tools["read_frame"], tools["loads"], tools["resolve"], tools["StudentRef"]
    run_distributed, DistributedError = tools["run_distributed"], tools["DistributedError"]
    InconclusiveRun = tools["InconclusiveRun"]
    _exception_record, dumps, asdict = tools["exception_record"], tools["json_dumps"], tools["asdict"]

    # warm ranks across the checks (autograder.runtime.pool): a run it does not decide runs fresh, here
    pool = tools["RankPool"](loads, resolve, namespace) if os.environ.get("AUTOGRADER_RANK_POOL", "1") != "0" else None

    def send_frame(fd, header, blob=b""):
        tools["send_frame"](fd, {**header, "tampered": tools["changed"](),
                                 "pool": [pool.served, pool.declined] if pool is not None else None}, blob)

    def _to_bytes(value):
        return tools["to_bytes"](value, tools["save"])

    while True:
        try:
            req, payload = read_frame(requests, max_blob=1 << 40)
        except ChannelError:
            if pool is not None:
                pool.close()
            return  # the grader is done
        rid = req.get("id")
        try:
            fn_or_name, *rest = loads(payload)
            if req.get("op") == "run":
                world_size, kwargs = rest
                kwargs = dict(kwargs)
                try:
                    result = pool.run(payload, world_size, kwargs) if pool is not None else None
                    if result is None:
                        kwargs["args"] = resolve(kwargs.get("args", ()), namespace)
                        result = run_distributed(fn_or_name, world_size, **kwargs)
                    send_frame(reply, {"id": rid, "ok": True}, _to_bytes(result))
                except InconclusiveRun as exc:
                    send_frame(reply, {"id": rid, "ok": False, "kind": "inconclusive"},
                               dumps({"inconclusive": exc.summary[:4000]}).encode())
                except DistributedError as exc:
                    send_frame(reply, {"id": rid, "ok": False, "kind": "distributed"},
                               dumps({"summary": exc.summary, "failures": [asdict(f) for f in exc.failures]}).encode())
            else:  # "call": a student function called by a check in the grader
                args, kwargs = rest
                try:
                    value = resolve(StudentRef(fn_or_name), namespace)(*resolve(args, namespace),
                                                                        **resolve(kwargs, namespace))
                    send_frame(reply, {"id": rid, "ok": True}, _to_bytes(value))
                except BaseException as exc:  # noqa: BLE001 - sent back as data
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    send_frame(reply, {"id": rid, "ok": False, "kind": "call"},
                               dumps(_exception_record(exc)).encode())
        except ChannelError:
            return
        except BaseException as exc:  # noqa: BLE001 - never die on a bad request
            if isinstance(exc, KeyboardInterrupt):
                raise
            record = {"type": type(exc).__name__, "message": str(exc)[:2000], "frames": [], "stub": "",
                      "text": traceback.format_exc()[-4000:]}
            try:
                send_frame(reply, {"id": rid, "ok": False, "kind": "call"}, json.dumps(record).encode())
            except ChannelError:
                return


def _to_bytes(value, save=None) -> bytes:
    import torch

    buf = io.BytesIO()
    (save or torch.save)(value, buf)
    return buf.getvalue()


class _Capped(io.TextIOBase):
    """A text stream that keeps at most `limit` characters (a print loop cannot fill the disk)."""

    def __init__(self, raw, limit: int):
        self.raw, self.left = raw, limit

    def write(self, s):
        if self.left > 0:
            self.raw.write(s[:self.left])
            self.raw.flush()
            self.left -= len(s)
        return len(s)

    def flush(self):
        self.raw.flush()


# ---------------------------------------------------------------------------
# The grader's side
# ---------------------------------------------------------------------------

_CLIENT: dict = {}
# what a rank program is made of travels by value: the check's own functions (and theirs), never a name the
# student's process looks up (where a notebook could have replaced it)
_BY_VALUE = ("autograder.checks",)


def dumps_by_value(obj) -> bytes:
    """cloudpickle of `obj`, with every function of the course's checks sent by value (its code), not by
    name; classes, modules and the runtime's functions still go by name."""
    import pickle
    import types

    from autograder.runtime.dist import pickler_keeping_filenames, submodules_indexed

    class _ByValue(pickler_keeping_filenames()):
        def reducer_override(self, o):
            if isinstance(o, types.FunctionType) and (getattr(o, "__module__", None) or "").startswith(_BY_VALUE):
                return self._dynamic_function_reduce(o)
            return super().reducer_override(o)

    buf = io.BytesIO()
    with submodules_indexed():
        _ByValue(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class ZygoteClient:
    """The grader's handle on one submission's zygote (started in `sandbox`, if given).

    `inputs` is a folder only the grader writes (the sandbox reads it);
    `workdir` the zygote's scratch folder (inside the sandbox: its private /tmp).
    """

    def __init__(self, notebook: dict, inputs: str, workdir: str, *, sandbox=None, start_timeout: float = 120.0,
                 output_limit: int = 1_000_000, skip_cells=()):
        self.inputs, self.workdir = inputs, workdir
        _write_new(os.path.join(inputs, "submission.ipynb"), json.dumps(notebook))
        _write_new(os.path.join(inputs, "skip.json"), json.dumps(sorted(skip_cells)))
        self.sandbox = sandbox
        self.start_timeout = start_timeout
        self.output_limit = output_limit
        self.proc = None
        self.cell_errors: list = []
        self.tampered: list[str] = []  # what the zygote says the cells replaced in its runtime (integrity.Guard)
        self.starts = 0
        self._next = 0
        self.pool = (0, 0)  # what the zygote says its warm ranks served and left to fresh ranks (its last reply)
        # why each run or call that could not be decided was not (the machine too busy, the channel silent):
        # a cell that fails after one of these is "needs regrade", never a verdict (issue 28)
        self.inconclusive: list[str] = []

    # -- life cycle -----------------------------------------------------------------
    def start(self) -> None:
        self.starts += 1
        cmd = [sys.executable, "-c", "from autograder.grading.trusted import _zygote_main; import sys; "
               "_zygote_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))",
               self.inputs, self.workdir, str(self.output_limit)]
        env = dict(ZYGOTE_ENV)
        if os.environ.get("AUTOGRADER_BACKSTOP_S"):  # the runner's wall-clock backstop (autograder.runtime.dist)
            env["AUTOGRADER_BACKSTOP_S"] = os.environ["AUTOGRADER_BACKSTOP_S"]
        if os.environ.get("AUTOGRADER_RANK_POOL"):  # "0": every check on fresh ranks (autograder.runtime.pool)
            env["AUTOGRADER_RANK_POOL"] = os.environ["AUTOGRADER_RANK_POOL"]
        self.proc = None
        if getattr(self.sandbox, "server", None) is not None:  # forked from the worker's fork server
            from autograder.grading.sandbox import ForkServerUnavailable

            try:
                self.proc = self.sandbox.start_zygote(self.inputs, self.workdir, self.output_limit, env)
            except ForkServerUnavailable:  # (killed or changed by the last submission): a fresh sandbox instead
                self._without_server()
        if self.proc is None and self.sandbox is not None:
            self.proc = self.sandbox.popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.DEVNULL)
        elif self.proc is None:
            os.makedirs(self.workdir, exist_ok=True)
            self.proc = subprocess.Popen(cmd, env={**os.environ, **env, "TMPDIR": self.workdir}, cwd=self.workdir,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        self._out = self.proc.stdout.fileno()
        self._in = self.proc.stdin.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)
        # the cells get `start_timeout` CPU-seconds; the clock only gives up (inconclusive) far later
        waited = self._await_reply(self.start_timeout, start_backstop(self.start_timeout), asleep=ASLEEP_S)
        if waited != "ready":
            self.close()
            if waited == "cpu":
                raise RuntimeError(f"the submission's cells computed for {self.start_timeout:g} CPU-seconds "
                                   f"without finishing (an endless loop in a cell?)")
            if waited == "asleep":
                raise RuntimeError(f"the submission's cells stopped: for {self.asleep_s:.0f} s none of its "
                                   f"processes ran or waited for a CPU (asleep, not slowed by a busy machine: a "
                                   f"`time.sleep`, an `input()`, a wait for something that never comes?)")
            self.inconclusive.append("the submission's cells had not finished when the machine's time ran out")
            raise StartInconclusive(f"not graded yet: the submission's cells had not finished after "
                                    f"{start_backstop(self.start_timeout):g} s on a busy machine, without "
                                    f"using their CPU budget (infrastructure; it will be regraded)")
        try:
            msg, _ = read_frame(self._out, time.monotonic() + self.start_timeout, max_blob=0)
        except ChannelError as exc:
            self.close()
            why = "the submission's process died while running its cells" if str(exc) == "timeout" \
                or "closed" in str(exc) else str(exc)
            raise RuntimeError(why) from None
        if msg.get("fork_error") and getattr(self.sandbox, "server", None) is not None:
            # the fork server's child could not make its sandbox (not the submission's doing): a fresh one
            self.close()
            self._without_server()
            self.starts -= 1
            return self.start()
        if not msg.get("ready"):
            self.close()
            raise RuntimeError("the submission's process did not start serving the grader")
        self._note_tampered(msg)
        errors = msg.get("cell_errors") or []
        self.cell_errors = [{"cell": str(e.get("cell", ""))[:100], "error": str(e.get("error", ""))[:500],
                             "line": e["line"] if type(e.get("line")) is int and 0 < e["line"] < 1 << 30 else None}
                            for e in errors[:50] if isinstance(e, dict)] if isinstance(errors, list) else []

    def _without_server(self) -> None:
        """This submission on in a fresh sandbox; its fork server not forked from again (the class run starts
        another for the next submission)."""
        self.sandbox.server.broken = True
        self.sandbox.server = None

    def _note_tampered(self, header: dict) -> None:
        said = header.get("tampered")
        for item in said[:20] if isinstance(said, list) else []:
            if isinstance(item, str) and item[:200] not in self.tampered and len(self.tampered) < 20:
                self.tampered.append(item[:200])

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self) -> float | None:
        """CPU time the submission's processes have used (the sandbox's cgroup; without one, the zygote's own)."""
        if self.sandbox is not None and hasattr(self.sandbox, "cpu_seconds"):
            used = self.sandbox.cpu_seconds()
            if used is not None:
                return used
        if self.proc is None:
            return None
        from autograder.runtime.dist import _cpu_seconds

        return _cpu_seconds(self.proc.pid)

    def _processes(self) -> set[int]:
        """The submission's processes: the sandbox's cgroup, or the zygote's process tree."""
        pids = self.sandbox.pids() if self.sandbox is not None and hasattr(self.sandbox, "pids") else set()
        return pids or (_process_tree(self.proc.pid) if self.proc is not None else set())

    def _await_reply(self, cpu_budget: float | None, backstop: float, asleep: float | None = None) -> str:
        """Wait until the zygote has something to say ("ready"), its processes have used `cpu_budget`
        CPU-seconds since now ("cpu": a verdict), all been asleep for `asleep` seconds in a row ("asleep": a
        verdict, on the scheduler's record), or `backstop` wall-clock seconds passed ("clock": not one)."""
        from autograder.runtime.dist import _StallWatch

        t0 = time.monotonic()
        cpu0 = self.cpu_seconds()
        watch = _StallWatch(asleep) if asleep else None
        self.asleep_s = 0.0
        while True:
            left = t0 + backstop - time.monotonic()
            if left <= 0:
                return "clock"
            if select.select([self._out], [], [], min(left, 0.5))[0]:
                return "ready"
            if cpu_budget is not None and cpu0 is not None:
                used = self.cpu_seconds()
                if used is not None and used - cpu0 >= cpu_budget:
                    return "cpu"
            if watch is not None:
                now = time.monotonic()
                if now >= watch.next_sample and watch.stalled(now, {p: p for p in self._processes()}):
                    self.asleep_s = watch.seconds(now)
                    return "asleep"
            if self.proc is not None and self.proc.poll() is not None:
                return "ready"  # it died: reading says so

    def close(self) -> None:
        """Stop the zygote and everything it started."""
        if self.proc is None:
            return
        if self.sandbox is not None:
            self.sandbox.kill(self.proc)
        else:
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()
        self.proc = None

    def __enter__(self):
        self.start()
        _CLIENT["client"] = self
        return self

    def __exit__(self, *exc):
        _CLIENT.pop("client", None)
        self.close()

    # -- requests ---------------------------------------------------------------------
    def _request(self, op: str, payload, backstop: float, cpu_budget: float | None = None,
                 asleep: float | None = None):
        """Send one request and wait for its reply: the submission's processes may use `cpu_budget`
        CPU-seconds on it (past that: a TimeoutError record, a verdict); past `backstop` wall-clock seconds
        the request is given up as inconclusive (an "Inconclusive" record: the machine, not the code)."""
        if not self._alive():
            self.close()
            self.start()  # a previous request killed it: a fresh one for the next check
        self._next += 1
        rid = self._next
        t0 = time.monotonic()
        deadline = t0 + backstop
        try:
            send_frame(self._in, {"id": rid, "op": op}, dumps_by_value(payload), deadline)
            while True:
                waited = self._await_reply(cpu_budget, max(0.0, deadline - time.monotonic()), asleep)
                if waited == "cpu":
                    self.close()
                    return None, {"type": "TimeoutError", "message": f"the submission computed for {cpu_budget:g} "
                                  f"CPU-seconds without answering (an endless loop?); it was stopped",
                                  "frames": [], "stub": ""}
                if waited == "asleep":
                    self.close()
                    return None, {"type": "TimeoutError", "message": f"the submission stopped without answering: "
                                  f"for {self.asleep_s:.0f} s none of its processes ran or waited for a CPU (asleep, "
                                  f"not slowed by a busy machine: a `time.sleep`, a wait for something that never "
                                  f"comes?); it was stopped", "frames": [], "stub": ""}
                if waited == "clock":
                    raise ChannelError("timeout")
                header, blob = read_frame(self._out, time.monotonic() + 60.0)
                if header.get("id") == rid:
                    self._note_tampered(header)
                    said = header.get("pool")  # (the zygote's word: for the benchmark's breakdown, never a verdict)
                    if isinstance(said, list) and len(said) == 2 and all(type(n) is int for n in said):
                        self.pool = tuple(said)
                    break
        except ChannelError as exc:
            self.close()
            if str(exc) == "timeout":
                why = (f"the submission's process had not answered after {time.monotonic() - t0:.0f} s on a busy "
                       f"machine, without using its CPU budget: not a verdict (infrastructure)")
                self.inconclusive.append(why)
                return None, {"type": "Inconclusive", "message": why, "frames": [], "stub": ""}
            return None, {"type": "RuntimeError", "message": f"{exc}; it was stopped", "frames": [], "stub": ""}
        try:
            if header.get("ok"):
                return safe_load(blob), None
            err = json.loads(blob.decode("utf-8"))
            if not isinstance(err, dict):
                raise ValueError("not a record")
            return None, err
        except Exception as exc:  # noqa: BLE001 - whatever the submission's process wrote is untrusted
            return None, {"type": "RuntimeError", "message": f"the submission's process sent back no usable "
                          f"result ({type(exc).__name__}: {str(exc)[:200]})", "frames": [], "stub": ""}

    def run(self, fn, world_size: int, kwargs: dict):
        """run_distributed(fn, world_size, **kwargs) in the zygote; the same contract as locally."""
        from autograder.runtime.dist import (STARTUP_TIMEOUT_S, DistributedError, InconclusiveRun, RankFailure,
                                             wall_backstop)

        # the zygote's runner decides (on evidence, or inconclusive at its own backstop); this is a safety net
        backstop = wall_backstop(float(kwargs.get("timeout", 20.0))) + STARTUP_TIMEOUT_S + 60.0
        value, err = self._request("run", (fn, world_size, kwargs), backstop)
        if err is not None and (err.get("type") == "Inconclusive" or "inconclusive" in err):
            # (a submission could claim this of its own runs: that gets it "needs regrade", never points)
            why = str(err.get("inconclusive") or err.get("message"))[:4000]
            if err.get("type") != "Inconclusive":
                self.inconclusive.append(why)
            raise InconclusiveRun(why)
        if err is None:
            if not isinstance(value, list) or len(value) != world_size:
                raise DistributedError(f"run_distributed: expected one result per rank ({world_size}), got "
                                       f"{type(value).__name__}", [])
            return value
        if "summary" in err:
            fields = {f.name for f in dataclasses.fields(RankFailure)}
            try:
                failures = [RankFailure(**{k: v for k, v in f.items() if k in fields}) for f in err["failures"]]
            except (TypeError, AttributeError):
                failures = []
            raise DistributedError(str(err["summary"]), failures)
        raise DistributedError(f"run_distributed: {err.get('type')}: {err.get('message')}", [])

    def call(self, name: str, args, kwargs):
        value, err = self._request("call", (name, args, kwargs), CALL_BACKSTOP_S, cpu_budget=CALL_CPU_S,
                                   asleep=ASLEEP_S)
        if err is None:
            return value
        if err.get("type") == "Inconclusive":
            from autograder.runtime.dist import InconclusiveRun

            raise InconclusiveRun(str(err.get("message")))
        raise remote_exception(err)


def _write_new(path: str, text: str) -> None:
    """Create `path` (it must not exist: never through a link) with `text`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


# ---------------------------------------------------------------------------
# Grading a notebook
# ---------------------------------------------------------------------------

@dataclass
class CellVerdict:
    grade_id: str
    passed: bool
    points: float
    max_points: float
    message: str = ""
    visible_passed: bool | None = None  # the visible part alone (what the student's own run showed)
    backend_note: str | None = None  # the cell run again on a second backend (NCCL): not graded
    inconclusive: str | None = None  # why this cell could not be decided (the machine, not the code): no verdict
    flag: str | None = None  # why its points could rest on what the student's process forged (integrity)


def _meta(cell) -> dict:
    return (cell.get("metadata", {}) or {}).get("nbgrader", {}) or {}


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _split_hidden(source: str) -> tuple[str, str | None]:
    """(the visible test cell, the hidden-only test cell or None) of a source test cell."""
    lines = source.splitlines()
    begin = [i for i, line in enumerate(lines) if "BEGIN HIDDEN TESTS" in line]
    if not begin:
        return source, None
    b = begin[0]
    e = next(i for i, line in enumerate(lines) if "END HIDDEN TESTS" in line)
    visible = "\n".join(lines[:b] + lines[e + 1:])
    # the cell's `with checking(...):` header (everything before the first indented check) + the hidden lines
    header = [line for line in lines[:b] if not line.startswith((" ", "\t"))]
    hidden = "\n".join(header + lines[b + 1:e])
    return visible, hidden


def _student_names(nb: dict) -> set[str]:
    """Top-level names the student's cells may define (functions, classes, assignments)."""
    import ast

    names: set[str] = set()
    for _, src in _executable_cells(nb):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


_UNDEFINED = re.compile(r"name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


def _top_level_names(src: str) -> set[str]:
    """Every name a cell's code binds at its top level (functions, classes, assignments, imports)."""
    import ast

    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def cell_error_line(err: dict) -> str:
    """A failed cell's error in one line, the cell named as the notebook names it (the feedback, the table):
    `SyntaxError: '(' was never closed (answer cell of Exercise 1 (all_reduce_gradients), line 12)`."""
    cell = str(err.get("cell", ""))
    where = cell[1:-1] if cell.startswith("<") and cell.endswith(">") else cell
    if err.get("line"):
        where += f", line {err['line']}"
    first, *_ = (str(err.get("error", "")) or "Error").splitlines() or ["Error"]
    return f"{first} ({where})"


def _lead_with_cell_errors(verdicts: dict, source: dict, submitted: dict, cell_errors: list,
                           skip: frozenset = frozenset()) -> dict:
    """A failed verdict that says a name is not defined, where a cell that defines it failed (the answer cell
    of Exercise 1 does not even compile, say), leads with that cell's error: which cell, which line, what
    error, the line itself; then what the test said. Which cell should define a name: the instructor's answer
    cell of that grade id (the source notebook), else any failed cell whose text defines it."""
    from autograder.runtime.report import defines_name

    if not cell_errors:
        return verdicts
    cells = _executable_cells(submitted, skip, with_ids=True)
    sources = {filename: src for filename, src, _ in cells}
    failed = {e["cell"]: e for e in cell_errors if e.get("cell") in sources}
    if not failed:
        return verdicts
    answer_cell = {gid: filename for filename, _, gid in cells if gid}
    should: dict[str, str] = {}  # name -> the submitted cell that should have defined it
    for c in source.get("cells", []):
        gid = _meta(c).get("grade_id")
        if c.get("cell_type") == "code" and _meta(c).get("solution") and gid in answer_cell:
            for name in _top_level_names(_src(c)):
                should.setdefault(name, answer_cell[gid])
    for v in verdicts.values():
        if v.passed:
            continue
        for name in dict.fromkeys(_UNDEFINED.findall(v.message)):
            cell = should.get(name)
            if cell not in failed:
                cell = next((f for f in failed if defines_name(sources[f], name)), None)
            if cell is None:
                continue
            err = failed[cell]
            lines = sources[cell].splitlines()
            line = err.get("line")
            code = lines[line - 1].strip()[:300] if line and line <= len(lines) else ""
            syntax = str(err.get("error", "")).startswith(("SyntaxError", "IndentationError", "TabError"))
            why = "Nothing of that cell ran" if syntax else "That cell stopped at this error"
            v.message = (cell_error_line(err) + (f"\n    {code}" if code else "")
                         + f"\n{why}, so {name} was never defined:\n{v.message}")
            break
    return verdicts


def _exec_test(code: str, namespace: dict, label: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        from contextlib import redirect_stdout

        with redirect_stdout(out):
            exec(compile(code, label, "exec"), namespace)  # noqa: S102 - the instructor's test code
        return True, out.getvalue().strip()
    except BaseException as exc:  # noqa: BLE001 - a failure is a verdict
        if isinstance(exc, KeyboardInterrupt):
            raise
        return False, "".join(traceback.format_exception_only(type(exc), exc)).strip()


class _BackendSkip(Exception):
    """This machine cannot run a check on the second backend (too few GPUs for its world size)."""


def _on_backend(namespace: dict, backend: str) -> tuple[dict, list]:
    """`namespace` with every check that takes a `backend` run on `backend` instead (NCCL: ranks spawned,
    tensors on `cuda:<rank>`), and the list each such call is counted in."""
    import functools
    import inspect

    calls: list = []
    out = dict(namespace)
    for name, obj in namespace.items():
        if not callable(obj) or not (getattr(obj, "__module__", None) or "").startswith("autograder.checks"):
            continue
        try:
            takes = "backend" in inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        if takes:
            def on_backend(*args, __check=obj, __sig=inspect.signature(obj), **kwargs):
                if backend == "nccl":
                    from autograder.runtime.gpu import nccl_status

                    size = kwargs.get("world_size", __sig.parameters.get("world_size", None))
                    size = getattr(size, "default", size)
                    ok, why = nccl_status(int(size) if isinstance(size, int) else 2)
                    if not ok:
                        calls.append(None)  # (a skip, not a check that ran)
                        raise _BackendSkip(why.split(" (")[0])
                calls.append(__check.__name__)
                kwargs["backend"] = backend
                return __check(*args, **kwargs)

            out[name] = functools.wraps(obj)(on_backend)
    return out, calls


def _backend_note(code: str, namespace: dict, backend: str, label: str) -> str:
    """The cell's checks run again on `backend` (both parts, visible and hidden): a note, never points."""
    shown = {"nccl": "NCCL"}.get(backend, backend)
    ns, calls = _on_backend(namespace, backend)
    t0 = time.monotonic()
    visible, hidden = _split_hidden(code)
    ok, msg = _exec_test(visible, ns, label)
    in_hidden = ok and hidden is not None and not (calls and calls[-1] is None)
    if in_hidden:  # a hidden case's failure: which and how, not its data (autograder.grading.redact)
        from autograder.grading.redact import run_hidden

        ok, msg = run_hidden(hidden, ns, label)
    if calls and calls[-1] is None:
        why = "a hidden case needs more GPUs than this machine has" if in_hidden else msg.split(': ', 1)[-1]
        return f"{shown}: skipped after {len(calls) - 1} check(s): {why}"
    if not calls:
        return f"{shown}: no distributed check in this cell"
    if ok:
        return f"{shown}: passed ({len(calls)} check(s), {time.monotonic() - t0:.1f} s; not graded)"
    lines = msg.strip().splitlines()
    first = (lines[1] if in_hidden and len(lines) > 1 else lines[-1]) if lines else "failed"
    return f"{shown}: FAILED (not graded): {first[:400]}"


def _not_graded(tests: list, why: str, inconclusive: bool = False) -> dict[str, CellVerdict]:
    """Every test cell failed, for one reason, before any check could run (or, `inconclusive`, was not decided)."""
    return {_meta(c)["grade_id"]: CellVerdict(_meta(c)["grade_id"], False, 0.0, float(_meta(c).get("points", 0)),
                                              why, False, inconclusive=why if inconclusive else None)
            for c in tests}


NOT_DECIDED = ("not graded yet: the grading machine was too busy to decide this check (not a verdict on your "
               "code); it will be graded again")


def grade_notebook(submitted: dict, source: dict, *, inputs: str | None = None, sandbox=None,
                   budget: float = 600.0, memory_note: str = "out of memory",
                   second_backend: str | None = None, backstop_factor: float = 6.0
                   ) -> tuple[dict[str, CellVerdict], list]:
    """Trusted verdicts of every graded cell of `submitted` (dicts of the notebooks' JSON).

    Test cells come from `source` (hidden tests included) and run here; the
    student's cells run only in the zygote, a fresh interpreter in `sandbox`
    (or a plain subprocess without one). `inputs` is a folder only the grader
    writes (made here if not given). Returns (verdicts by grade id, the
    student's cell errors). `budget` bounds the whole notebook in CPU-seconds of the submission's processes
    (the cells past it: not graded, 0); the wall clock gives up only at `backstop_factor` x `budget`, and the
    cells it leaves are inconclusive. A cell whose failure came with an inconclusive run (a machine too busy
    to tell slow from stuck) is inconclusive too: `CellVerdict.inconclusive`, no points, never a verdict.
    A check during which the sandbox killed a process for its memory says so
    first (`memory_note`), whatever the process's death looked like from here.
    With `second_backend` ("nccl" on a GPU grading node), each test cell runs
    again with its checks on that backend: a note per cell, no points.
    """
    from autograder.runtime.messages import pinned

    # every verdict decided and recorded in English: a Chinese notebook's set-up cell, run here too, asks for
    # Chinese messages (course_notebook(..., language="zh")), and the grader reads a verdict's words
    with pinned("en"):
        return _grade_notebook(submitted, source, inputs=inputs, sandbox=sandbox, budget=budget,
                               memory_note=memory_note, second_backend=second_backend,
                               backstop_factor=backstop_factor)


def _grade_notebook(submitted: dict, source: dict, *, inputs, sandbox, budget, memory_note, second_backend,
                    backstop_factor) -> tuple[dict[str, CellVerdict], list]:
    from autograder.grading.redact import run_hidden
    from autograder.runtime import dist
    from autograder.runtime.report import show_internals  # noqa: F401 - the checks' messages, as in the notebook

    own = inputs is None
    inputs = inputs or tempfile.mkdtemp(prefix="autograder-inputs-")
    scratch = None
    if sandbox is not None:
        workdir = sandbox.scratch
    else:
        scratch = tempfile.mkdtemp(prefix="autograder-zygote-")
        workdir = scratch
    verdicts: dict[str, CellVerdict] = {}
    tests = [c for c in source["cells"] if c.get("cell_type") == "code" and _meta(c).get("grade")
             and not _meta(c).get("solution")]
    setup = [c for c in source["cells"] if c.get("cell_type") == "code" and _meta(c).get("locked")
             and not _meta(c).get("grade")]
    deadline = time.monotonic() + budget * backstop_factor
    try:
        released_free = {_src(c) for c in source["cells"] if c.get("cell_type") == "code" and not _meta(c)}
        client = ZygoteClient(copy.deepcopy(submitted), inputs, workdir, sandbox=sandbox,
                              start_timeout=min(120.0, budget), skip_cells=released_free)
        def oom_kills() -> int:
            return sandbox.oom_kills() if sandbox is not None and hasattr(sandbox, "oom_kills") else 0

        try:
            client.__enter__()
        except StartInconclusive as exc:
            return _not_graded(tests, str(exc), inconclusive=True), []
        except RuntimeError as exc:
            why = f"{memory_note} while running the notebook's cells; " if oom_kills() else ""
            return _not_graded(tests, f"not graded: {why}{exc}"), []
        dist.set_executor(client)
        try:
            namespace: dict = {"__name__": "__grader__"}
            for c in setup:  # the set-up cells bind the checks, exactly as the notebook does
                gid = _meta(c).get("grade_id")
                try:
                    with contextlib.redirect_stdout(io.StringIO()):  # what a worked example prints is not ours
                        exec(compile(_src(c), f"<setup {gid}>", "exec"), namespace)  # noqa: S102 - instructor code
                except (dist.DistributedError, RemoteError) as exc:
                    # a given cell that runs code in the student's process (a worked example) failed there:
                    # the notebook broke what the course's own cells need (in the student's kernel too)
                    return _not_graded(tests, f"not graded: the course's given cell {gid} failed when run with "
                                              f"this notebook's code: {str(exc).splitlines()[0][:500]}"), \
                        client.cell_errors
                except Exception as exc:  # noqa: BLE001 - the instructor's cell itself is broken
                    raise RuntimeError(f"the source notebook's set-up cell {gid} failed in the grader: "
                                       f"{type(exc).__name__}: {exc}") from exc
            given = set(namespace)
            for name in _student_names(submitted) - given:
                namespace[name] = StudentRef(name)
            cpu0 = client.cpu_seconds()
            for c in tests:
                m = _meta(c)
                gid, points = m["grade_id"], float(m.get("points", 0))
                used = client.cpu_seconds()
                if cpu0 is not None and used is not None and used - cpu0 > budget:
                    verdicts[gid] = CellVerdict(gid, False, 0.0, points, f"not graded: the submission's processes "
                                                f"used the notebook's budget of {budget:g} CPU-seconds")
                    continue
                if time.monotonic() > deadline:
                    why = (f"{NOT_DECIDED} (the machine's time for this notebook, {budget * backstop_factor:g} s, ran "
                           f"out before this cell)")
                    verdicts[gid] = CellVerdict(gid, False, 0.0, points, why, inconclusive=why)
                    continue
                visible, hidden = _split_hidden(_src(c))
                killed = oom_kills()
                undecided = len(client.inconclusive)
                ok_v, msg_v = _exec_test(visible, namespace, f"<test {gid}>")
                ok, msg = ok_v, msg_v
                if ok_v and hidden is not None:
                    ok, msg_h = run_hidden(hidden, namespace, f"<test {gid}>")  # which case and how, not its data
                    msg = msg_h if not ok else msg_v
                if not ok and (len(client.inconclusive) > undecided
                               or msg.partition(":")[0].endswith("InconclusiveRun")):
                    # a run of this cell could not be decided: its failure is the machine's, not a verdict
                    why = client.inconclusive[-1] if len(client.inconclusive) > undecided else msg
                    why = msg if ok_v and hidden is not None else why  # a hidden case's: which and how, no data
                    verdicts[gid] = CellVerdict(gid, False, 0.0, points, f"{NOT_DECIDED}. {why[:1500]}",
                                                ok_v or None,
                                                inconclusive=why[:1500])
                    continue
                if not ok and oom_kills() > killed:
                    msg = f"{memory_note}: the submission's processes were killed during this check. {msg}"
                note = None
                if second_backend and time.monotonic() < deadline:
                    # the whole cell, visible and hidden (its marker lines are comments)
                    note = _backend_note(_src(c), namespace, second_backend, f"<test {gid}>")
                verdicts[gid] = CellVerdict(gid, ok, points if ok else 0.0, points, msg, ok_v, note)
            from autograder.grading.integrity import flag_verdicts, scan_notebook

            flag_verdicts(verdicts, scan_notebook(_executable_cells(submitted), source), client.tampered)
        finally:
            dist.set_executor(None)
            client.__exit__(None, None, None)
        return _lead_with_cell_errors(verdicts, source, submitted, client.cell_errors, released_free), \
            client.cell_errors
    finally:
        import shutil

        if own:
            shutil.rmtree(inputs, ignore_errors=True)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
