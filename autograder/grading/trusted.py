"""Trusted verdicts: grade a submission from a process that never runs the student's code.

    results = grade_notebook(submitted_nb, source_nb, assignment="02_tensor_parallel", sandbox=Sandbox(...))
    # {grade_id: CellVerdict(passed, points, max_points, message, visible_passed)}

Two processes per submission:

- the **grader** (this process, outside any sandbox) reads the submitted
  notebook as JSON, executes only the source notebook's test cells (the
  instructor's code, hidden tests included) with every name the student
  defines bound to a `StudentRef`, and decides every verdict itself;
- the **zygote**, in the sandbox, holds the student's cells, run once, in
  order, and serves the grader's requests. In the course's grading command
  it is the student's own nbgrader kernel, asked once the last cell ran
  (`serve_kernel`, over a Unix socket); otherwise, or when that kernel died,
  hung or cannot serve, a fresh interpreter (`_zygote_main`) that executes
  the notebook's given, answer and scratch cells first. Its requests: run a
  rank program on N ranks (it forks them, as `run_distributed` does) or
  call a student function; it sends back only data, which the grader loads
  with `torch.load(weights_only=True)` (tensors, numbers, strings,
  containers and the ledger's records) or as JSON (errors).

Nothing the student's code does to Python objects can reach the grader: a
patched check, a patched `run_distributed`, an IPython hook or an AST
transformer exist only in the zygote. What the ranks report about themselves
(their outputs and their communication ledger) is produced next to the
student's code, and a submission written to forge it would pass: that is
cheating by design, not a fault the grader can tell from a correct solution,
and the threat model in the README says so.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
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
# The zygote: runs in the sandbox, executes the student's cells, serves requests
# ---------------------------------------------------------------------------

def _cell_filename(meta: dict, index: int) -> str:
    gid = meta.get("grade_id")
    return f"<answer cell {gid}>" if meta.get("solution") else f"<cell {gid or index}>"


def _executable_cells(nb: dict, skip: frozenset = frozenset()) -> list[tuple[str, str]]:
    """(filename, source) of the code cells the zygote runs: everything but graded test cells.

    `skip`: sources of free cells to leave out (the notebook's own pictures and
    scratch examples, as released: they define nothing the student wrote).
    """
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        if meta.get("grade") and not meta.get("solution"):
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        if not meta and src in skip:
            continue
        # IPython-only syntax (magics, shell escapes) has no meaning here
        src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        out.append((_cell_filename(meta, i), src))
    return out


def _zygote_main(workdir: str, notebook_path: str, output_limit: int, skip_path: str = "") -> None:
    """Entry point in the sandbox: run the cells, then serve requests read from stdin (one JSON per line)."""
    import linecache

    # the reply channel gets a private descriptor; fds 1 and 2 (the student's prints, C++ logs) go to a
    # capped log. (Code in this process could still write to the channel: the grader trusts no reply.)
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    log = open(os.path.join(workdir, "zygote.log"), "w", encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = _Capped(log, output_limit)

    import torch  # noqa: F401 - before forking ranks (spec 6)

    import autograder.runtime.agreement  # noqa: F401 - dispatch-mode imports, paid once

    with open(notebook_path, encoding="utf-8") as f:
        nb = json.load(f)
    skip = frozenset()
    if skip_path:
        with open(skip_path, encoding="utf-8") as f:
            skip = frozenset(json.load(f))
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    global _NAMESPACE
    _NAMESPACE = namespace  # StudentRefs arriving here (and in the forked ranks) are the student's objects
    cell_errors = []
    for filename, src in _executable_cells(nb, skip):
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        try:
            exec(compile(src, filename, "exec"), namespace)  # noqa: S102 - the sandbox's purpose
        except BaseException as exc:  # noqa: BLE001 - a cell's error is recorded, the others still run
            if isinstance(exc, KeyboardInterrupt):
                raise
            cell_errors.append({"cell": filename, "error": f"{type(exc).__name__}: {exc}"[:500]})
    _send(reply, {"ready": True, "cell_errors": cell_errors})
    _serve(sys.stdin, reply, workdir, namespace)


def _serve(requests, reply, workdir: str, namespace: dict) -> None:
    """Answer the grader's requests (one JSON per line of `requests`) until it closes the channel."""
    import cloudpickle

    from autograder.runtime import dist
    from autograder.runtime.dist import _exception_record

    for line in requests:
        req = json.loads(line)
        rid = req["id"]
        out_path = os.path.join(workdir, f"res{rid}")
        try:
            with open(os.path.join(workdir, f"req{rid}.pkl"), "rb") as f:
                payload = cloudpickle.load(f)
            if req["op"] == "run":
                fn, world_size, kwargs = payload
                kwargs = dict(kwargs)
                kwargs["args"] = resolve(kwargs.get("args", ()), namespace)
                try:
                    result = dist.run_distributed(fn, world_size, **kwargs)
                    _save(out_path, result)
                    _send(reply, {"id": rid, "ok": True})
                except dist.DistributedError as exc:
                    _send_json(out_path, {"summary": exc.summary,
                                          "failures": [dataclasses.asdict(f) for f in exc.failures]})
                    _send(reply, {"id": rid, "ok": False, "kind": "distributed"})
            else:  # "call": a student function called by a check in the grader
                name, args, kwargs = payload
                try:
                    value = resolve(StudentRef(name), namespace)(*resolve(args, namespace),
                                                                  **resolve(kwargs, namespace))
                    _save(out_path, value)
                    _send(reply, {"id": rid, "ok": True})
                except BaseException as exc:  # noqa: BLE001 - sent back as data
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    _send_json(out_path, _exception_record(exc))
                    _send(reply, {"id": rid, "ok": False, "kind": "call"})
        except BaseException as exc:  # noqa: BLE001 - never die on a bad request
            if isinstance(exc, KeyboardInterrupt):
                raise
            _send_json(out_path, {"type": type(exc).__name__, "message": str(exc)[:2000], "frames": [],
                                  "stub": "", "text": traceback.format_exc()[-4000:]})
            _send(reply, {"id": rid, "ok": False, "kind": "call"})


def serve_kernel(socket_path: str, workdir: str, output_limit: int = 1_000_000) -> None:
    """In the student's kernel, after nbgrader ran the notebook: be the zygote of the trusted run.

    The kernel already holds what the zygote would build (the student's cells, run once, in order), so the
    grader asks it instead of starting a second interpreter and running the cells again. Nothing changes for
    trust: the grader takes only data from here, exactly as from a zygote. What ranks print while serving goes
    to a capped log, not to the kernel's output channel.
    """
    import socket

    global _NAMESPACE
    namespace = get_ipython().user_ns  # noqa: F821 - run in the kernel by the grader
    saved = sys.stdout, sys.stderr, os.dup(1), os.dup(2)
    log = open(os.path.join(workdir, "serve.log"), "w", encoding="utf-8", errors="replace")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
        requests, reply = sock.makefile("r", encoding="utf-8"), sock.makefile("w", encoding="utf-8")
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = _Capped(log, output_limit)
        _NAMESPACE = namespace
        _send(reply, {"ready": True, "cell_errors": []})
        _serve(requests, reply, workdir, namespace)
    finally:
        _NAMESPACE = None
        sys.stdout, sys.stderr = saved[0], saved[1]
        os.dup2(saved[2], 1)
        os.dup2(saved[3], 2)
        sock.close()
        log.close()


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


def _save(path: str, value) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    with open(path + ".pt", "wb") as f:
        f.write(buf.getvalue())


def _send_json(path: str, record: dict) -> None:
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(record, f)


def _send(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


# ---------------------------------------------------------------------------
# The grader's side
# ---------------------------------------------------------------------------

_CLIENT: dict = {}


class ZygoteClient:
    """The grader's handle on one submission's zygote (started in `sandbox`, if given)."""

    def __init__(self, notebook: dict, workdir: str, *, sandbox=None, start_timeout: float = 120.0,
                 output_limit: int = 1_000_000, skip_cells=(), kernel: "KernelChannel | None" = None):
        self.workdir = workdir
        self.notebook_path = os.path.join(workdir, "submission.ipynb")
        with open(self.notebook_path, "w", encoding="utf-8") as f:
            json.dump(notebook, f)
        self.skip_path = os.path.join(workdir, "skip.json")
        with open(self.skip_path, "w", encoding="utf-8") as f:
            json.dump(sorted(skip_cells), f)
        self.sandbox = sandbox
        self.start_timeout = start_timeout
        self.output_limit = output_limit
        self.proc = None
        self.cell_errors: list = []
        self._next = 0
        self._lines = None
        self._writer = None
        self.kernel = kernel  # the student's live nbgrader kernel, asked first (once: a restart is a zygote)
        self._sock = None

    # -- life cycle -----------------------------------------------------------------
    def start(self) -> None:
        if self.kernel is not None:
            kernel, self.kernel = self.kernel, None
            sock = kernel.connect()
            if sock is not None:
                self._sock = sock
                self._lines = _LineReader(sock.makefile("rb"))
                self._writer = sock.makefile("w", encoding="utf-8")
                msg = self._lines.get(self.start_timeout)
                if msg is not None and msg.get("ready"):
                    kernel.served = True
                    self.cell_errors = list(kernel.cell_errors)
                    self._kill_kernel = kernel.kill
                    return
                self._close_socket()
            kernel.kill()  # it did not serve: it holds memory and processes the zygote may need
        cmd = [sys.executable, "-c", "from autograder.grading.trusted import _zygote_main; import sys; "
               "_zygote_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])",
               self.workdir, self.notebook_path, str(self.output_limit), self.skip_path]
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "TMPDIR": self.workdir,
               "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg"}
        env.pop("PYTHONSTARTUP", None)
        if self.sandbox is not None:
            self.proc = self.sandbox.popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.DEVNULL, cwd=self.workdir, text=True)
        else:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, cwd=self.workdir, text=True,
                                         start_new_session=True)
        self._lines = _LineReader(self.proc.stdout)
        self._writer = self.proc.stdin
        msg = self._lines.get(self.start_timeout)
        if msg is None or not msg.get("ready"):
            self.close()
            raise RuntimeError("the submission's cells did not finish running within "
                               f"{self.start_timeout:g} s (or its process died)")
        self.cell_errors = msg.get("cell_errors", [])

    def _close_socket(self) -> None:
        import socket

        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # the kernel's serving loop and our reader both see the end
        for f in (self._writer, self._sock):
            try:
                f.close()
            except OSError:
                pass
        self._sock = self._writer = None

    def _alive(self) -> bool:
        if self._sock is not None:
            return not self._lines.closed
        return self.proc is not None and self.proc.poll() is None

    def close(self, kill: bool = True) -> None:
        """Stop the zygote; the student's kernel, when it served, only when `kill` (it stopped answering)."""
        if self._sock is not None:
            self._close_socket()
            if kill:
                self._kill_kernel()
            return
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
        self.proc = None

    def __enter__(self):
        self.start()
        _CLIENT["client"] = self
        return self

    def __exit__(self, *exc):
        _CLIENT.pop("client", None)
        self.close(kill=False)

    # -- requests ---------------------------------------------------------------------
    def _request(self, op: str, payload, timeout: float):
        import cloudpickle

        if not self._alive():
            self.close()
            self.start()  # a previous request killed it: a fresh one for the next check
        self._next += 1
        rid = self._next
        with open(os.path.join(self.workdir, f"req{rid}.pkl"), "wb") as f:
            cloudpickle.dump(payload, f)
        try:
            self._writer.write(json.dumps({"id": rid, "op": op}) + "\n")
            self._writer.flush()
        except (BrokenPipeError, OSError):
            pass
        msg = self._lines.get(timeout)
        while msg is not None and msg.get("id") != rid:
            msg = self._lines.get(timeout)
        base = os.path.join(self.workdir, f"res{rid}")
        if msg is None:
            self.close()
            return None, {"type": "TimeoutError", "message": f"the submission did not answer within {timeout:g} s "
                          f"(or its process died); it was stopped", "frames": [], "stub": ""}
        try:
            if msg.get("ok"):
                return safe_load(_read_own(base + ".pt")), None
            err = json.loads(_read_own(base + ".json").decode("utf-8"))
            if not isinstance(err, dict):
                raise ValueError("not a record")
            return None, err
        except Exception as exc:  # noqa: BLE001 - whatever the submission's process wrote is untrusted
            return None, {"type": "RuntimeError", "message": f"the submission's process sent back no usable "
                          f"result ({type(exc).__name__}: {str(exc)[:200]})", "frames": [], "stub": ""}

    def run(self, fn, world_size: int, kwargs: dict):
        """run_distributed(fn, world_size, **kwargs) in the zygote; the same contract as locally."""
        from autograder.runtime.dist import DistributedError, RankFailure

        timeout = float(kwargs.get("timeout", 20.0)) + 30.0
        value, err = self._request("run", (fn, world_size, kwargs), timeout)
        if err is None:
            if not isinstance(value, list) or len(value) != world_size:
                raise DistributedError(f"run_distributed: expected one result per rank ({world_size}), got "
                                       f"{type(value).__name__}", [])
            return value
        if "summary" in err:
            fields = {f.name for f in dataclasses.fields(RankFailure)}
            failures = [RankFailure(**{k: v for k, v in f.items() if k in fields}) for f in err["failures"]]
            raise DistributedError(err["summary"], failures)
        raise DistributedError(f"run_distributed: {err.get('type')}: {err.get('message')}", [])

    def call(self, name: str, args, kwargs):
        value, err = self._request("call", (name, args, kwargs), 60.0)
        if err is None:
            return value
        raise remote_exception(err)


def _read_own(path: str) -> bytes:
    """A file the submission's process wrote, never through a link it planted (to a file only the grader
    could read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


class KernelChannel:
    """The grader's way into the student's live kernel (see `serve_kernel`).

    `execute(code)` sends code to the kernel without waiting; `failed()` is
    true once the kernel answered that request with an error (the student's
    code broke what it needs: then a zygote of its own serves instead);
    `kill()` stops the kernel and everything it started.
    """

    def __init__(self, socket_dir: str, workdir: str, execute, failed, kill, *, cell_errors=(),
                 timeout: float = 10.0):
        self.socket_path = os.path.join(socket_dir, "zygote.sock")
        self.workdir, self.execute, self.failed, self.kill = workdir, execute, failed, kill
        self.cell_errors = list(cell_errors)
        self.timeout = timeout
        self.served = False  # whether the kernel answered (else a zygote of its own served)

    def connect(self):
        """The connected socket, or None if the kernel did not connect within the timeout."""
        import socket

        with contextlib.suppress(FileNotFoundError):
            os.remove(self.socket_path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.socket_path)
            server.listen(1)
            server.settimeout(0.1)
            self.execute(f"import autograder.grading.trusted as __trusted; __trusted.serve_kernel({self.socket_path!r}, "
                         f"{self.workdir!r}); del __trusted")
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    if self.failed():
                        return None
                    continue
                conn.settimeout(None)
                return conn
            return None
        finally:
            server.close()


class _LineReader:
    """Lines from a pipe, with a timeout (a thread reads; the grader waits on a condition)."""

    def __init__(self, stream):
        self.lines: list = []
        self.cond = threading.Condition()
        self.closed = False
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        for raw in stream:
            line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not a message (the zygote's own stdout is redirected; defensive)
            with self.cond:
                self.lines.append(msg)
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def get(self, timeout: float):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.lines:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return None
                self.cond.wait(left)
            return self.lines.pop(0)


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
    visible_passed: bool | None = None  # the visible part alone (what the student's kernel ran)


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


def _not_graded(tests: list, why: str) -> dict[str, CellVerdict]:
    """Every test cell failed, for one reason, before any check could run."""
    return {_meta(c)["grade_id"]: CellVerdict(_meta(c)["grade_id"], False, 0.0, float(_meta(c).get("points", 0)),
                                              why, False) for c in tests}


def grade_notebook(submitted: dict, source: dict, *, workdir: str | None = None, sandbox=None,
                   budget: float = 600.0, kernel: KernelChannel | None = None) -> tuple[dict[str, CellVerdict], list]:
    """Trusted verdicts of every graded cell of `submitted` (dicts of the notebooks' JSON).

    Test cells come from `source` (hidden tests included); the student's
    cells run only in the zygote (the student's live kernel, if `kernel` is given and it answers; a fresh
    interpreter in `sandbox` otherwise). Returns (verdicts by grade id, the
    student's cell errors). `budget` bounds the whole notebook (seconds).
    """
    from autograder.runtime import dist
    from autograder.runtime.report import show_internals  # noqa: F401 - the checks' messages, as in the notebook

    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="autograder-trusted-")
    verdicts: dict[str, CellVerdict] = {}
    tests = [c for c in source["cells"] if c.get("cell_type") == "code" and _meta(c).get("grade")
             and not _meta(c).get("solution")]
    setup = [c for c in source["cells"] if c.get("cell_type") == "code" and _meta(c).get("locked")
             and not _meta(c).get("grade")]
    deadline = time.monotonic() + budget
    try:
        released_free = {_src(c) for c in source["cells"] if c.get("cell_type") == "code" and not _meta(c)}
        client = ZygoteClient(copy.deepcopy(submitted), workdir, sandbox=sandbox, start_timeout=min(120.0, budget),
                              skip_cells=released_free, kernel=kernel)
        try:
            client.__enter__()
        except RuntimeError as exc:
            return _not_graded(tests, f"not graded: {exc}"), []
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
            for c in tests:
                m = _meta(c)
                gid, points = m["grade_id"], float(m.get("points", 0))
                if time.monotonic() > deadline:
                    verdicts[gid] = CellVerdict(gid, False, 0.0, points,
                                                f"not graded: the notebook's time budget ({budget:g} s) ran out")
                    continue
                visible, hidden = _split_hidden(_src(c))
                ok_v, msg_v = _exec_test(visible, namespace, f"<test {gid}>")
                ok, msg = ok_v, msg_v
                if ok_v and hidden is not None:
                    ok, msg_h = _exec_test(hidden, namespace, f"<test {gid}>")
                    msg = msg_h if not ok else msg_v
                verdicts[gid] = CellVerdict(gid, ok, points if ok else 0.0, points, msg, ok_v)
        finally:
            dist.set_executor(None)
            client.__exit__(None, None, None)
        return verdicts, client.cell_errors
    finally:
        if own:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
