"""Run a function in N rank processes with torch.distributed initialised.

    from autograder.runtime import run_distributed
    outs = run_distributed(fn, world_size=4, args=(x,))   # fn(rank, world_size, x)

Rank processes are forked on a Linux CPU (cheap: ~0.1 s for 4 ranks) and
spawned elsewhere (macOS, CUDA ranks), in which case the function and its
arguments are sent by value with cloudpickle, so functions and classes
defined in a notebook cell work on both paths.

Whatever happens in the ranks, the caller gets either the list of per-rank
return values or one `DistributedError` that names every failed rank with its
traceback, exit signal, or (on a deadlock) where it was blocked: the chain of
the student's frames, outermost first, and the sends and receives that had no
partner (from each rank's journal of point-to-point ops).

Verdicts do not depend on the machine's load. A failure needs evidence: an
exception, a crash, a rank that used its budget of `timeout` CPU-seconds (CPU
time, not the clock: a busy machine slows a rank without spending its budget),
a deadlock shown by the ranks' stacks (every live rank waiting on its peers
at the same place at two looks, with no progress in between), or a stall
shown by the scheduler's record (for max(`timeout`, 10) s no rank ran, made
progress or waited for a CPU: asleep, not starved). A run that
shows none of these before a generous wall-clock backstop, or whose ranks do
not start, raises `InconclusiveRun`: not a verdict, retried by the grader.
`AUTOGRADER_START_METHOD=spawn` forces the macOS path on Linux. No rank process
outlives the call, and nothing a rank prints reaches the caller's stderr
(nbgrader scores a cell with any stderr output 0): rank output is captured to
files, shown on request (`show_output=True`) or in the error.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import faulthandler
import io
import json
import linecache
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

__all__ = ["run_distributed", "DistributedError", "InconclusiveRun", "RankFailure", "default_start_method",
           "rank_device", "set_executor", "wall_backstop"]

# Where run_distributed runs its ranks: here (None), or, for the trusted grader, in a
# submission's sandboxed process (autograder.grading.trusted.ZygoteClient).
_EXECUTOR = None


def set_executor(executor) -> None:
    """Route every run_distributed call to `executor.run(fn, world_size, kwargs)` (None: run here)."""
    global _EXECUTOR
    _EXECUTOR = executor

# How long the survivors get to report their own error after the first rank fails.
_GRACE_AFTER_FAILURE_S = 1.5
# A deadlock is looked for after this long with no progress, and confirmed after as long again (_DeadlockWatch).
DEADLOCK_IDLE_S = 2.0
# A run in which no rank made progress, used the CPU or waited for one, for max(its budget, this) seconds of the
# clock, has stopped by its own doing: the scheduler's record says the ranks were asleep, not starved (_StallWatch)
STALL_MIN_S = 10.0
# How long the ranks get to start (a spawned rank imports torch: seconds each, more on a loaded machine) before
# the run's budget starts: every rank has then reached the rendezvous. Past it the run is inconclusive.
STARTUP_TIMEOUT_S = 120.0
# How long a rank gets to write its stack after SIGUSR1 (a rank that gets little CPU writes late).
_STACK_DUMP_WAIT_S = 10.0
# How long gloo and the rendezvous store wait on their own before raising in a rank: never, in practice. The
# supervisor decides (on evidence), and a wall-clock limit inside a rank would convict a slow run.
_TRANSPORT_WAIT_S = 7 * 24 * 3600.0
# Characters of each rank's captured output quoted in an error.
_OUTPUT_TAIL_CHARS = 3000


@dataclass
class RankFailure:
    """One failed rank. `kind`: "exception", "crash", "timeout" (a deadlock, or its CPU budget used),
    "killed-after-peer-failure" (still running when another rank failed)."""

    rank: int
    kind: str
    detail: str  # the full traceback, the exit description, or the faulthandler stack
    output_tail: str = ""
    exc_type: str = ""       # for "exception": the exception's class name
    message: str = ""        # for "exception": str(exception)
    frames: list = field(default_factory=list)  # for "exception": [{file, line, name, text, student}], outermost first
    stub: str = ""           # the student function that raised NotImplementedError from its stub, if any

    def student_view(self) -> str:
        """What the student needs: the error and their own frames, or where the rank was waiting."""
        if self.kind == "exception":
            lines = [f"{self.exc_type}: {self.message}".rstrip()] if self.exc_type else [self.detail.rstrip()]
            mine = [f for f in self.frames if f["student"]]
            if not mine and self.frames:
                mine = self.frames[-1:]
            if mine:
                lines.append("  in your code (innermost last):" if mine[0]["student"] else "  raised at:")
                for f in mine:
                    lines.append(f"    {f['where']}")
                    if f["text"]:
                        lines.append(f"      {f['text']}")
            return "\n".join(lines)
        if self.kind == "crash":
            first, _, stack = self.detail.partition("\n")
            where = _blocked_at(stack) if stack else ""
            return first + (f"; it {where}" if where else "")
        if self.detail.startswith(_RETURNED):
            return self.detail
        return _blocked_at(self.detail) or "(no Python stack was written)"

    def describe(self, full: bool | None = None) -> str:
        """The failure as the error message shows it (student view; the full internals with `full`)."""
        full = _full() if full is None else full
        if full:
            head = {
                "exception": f"rank {self.rank} raised an exception",
                "crash": f"rank {self.rank} died: {self.detail.partition(chr(10))[0]}",
                "timeout": f"rank {self.rank} did not finish (deadlocked, or out of CPU budget); its Python stack:",
                "killed-after-peer-failure": f"rank {self.rank} was still running when another rank failed; "
                                             f"its Python stack:",
            }[self.kind]
            body = self.detail if self.kind != "crash" else self.detail.partition("\n")[2]
            parts = [head, _indent(body.rstrip())] if body.strip() else [head]
        elif self.kind == "exception":
            parts = [f"rank {self.rank} raised an exception", _indent(self.student_view())]
        elif self.kind == "crash":
            parts = [f"rank {self.rank} died: {self.student_view()}"]
        else:
            parts = [f"rank {self.rank} {self.student_view()}"]
        if self.output_tail.strip():
            parts.append(f"  rank {self.rank} output (last {_OUTPUT_TAIL_CHARS} characters):")
            parts.append(_indent(self.output_tail.rstrip()))
        return "\n".join(parts)


_RETURNED = "had returned from its rank program and was waiting for the other ranks"


def _full() -> bool:
    from autograder.runtime.report import internals_shown

    return internals_shown()


class InconclusiveRun(RuntimeError):
    """The run could not be judged: it did not start, or it neither finished, failed, used its CPU budget nor
    showed a deadlock before the wall-clock backstop (a machine too busy to tell slow from stuck). Not a
    verdict on the code: graders retry it, and record it as "needs regrade" if it stays inconclusive."""

    def __init__(self, summary: str, failures: list | None = None):
        self.summary = summary
        self.failures = list(failures or [])
        where = _describe_all(self.failures) if self.failures else ""
        super().__init__(summary + (f"\n\nWhere each rank was when it was stopped:\n\n{where}" if where else ""))


class DistributedError(RuntimeError):
    """One or more ranks failed, crashed or hung. `.failures` lists them, root cause first, in rank order."""

    def __init__(self, summary: str, failures: list[RankFailure]):
        self.summary = summary
        self.failures = failures
        super().__init__(f"{summary}\n\n{_describe_all(failures)}")

    @property
    def stub(self) -> str:
        """The stub function every rank that raised is stuck in ("" if the failure is something else)."""
        # a rank that failed only because a peer did (its connection closed) says nothing about stubs
        raised = [f for f in self.failures if f.kind == "exception" and not _secondary(f)]
        if raised and all(f.stub for f in raised) and not [f for f in self.failures if f.kind == "crash"]:
            return raised[0].stub
        return ""


def _describe_all(failures: list[RankFailure]) -> str:
    """Each failure once, in the given order; ranks that failed identically are shown together.

    A rank that failed only because another one did (its connection was
    closed, or it was stopped while waiting) gets one line, not a stack.
    """
    full = _full()
    root_caused = any(f.kind in ("exception", "crash") and not _secondary(f) for f in failures)
    parts, shown = [], set()
    for f in failures:
        if f.rank in shown:
            continue
        if root_caused and not full and (f.kind == "killed-after-peer-failure" or _secondary(f)):
            shown.add(f.rank)
            why = ("its connection to the failed rank was closed" if _secondary(f)
                   else f"it {f.student_view()}")
            parts.append(f"rank {f.rank} did not finish because another rank failed: {why}.")
            continue
        same = [f] + ([g for g in failures if g is not f and g.rank not in shown and _same_failure(f, g)]
                      if not full else [])
        ranks = sorted(g.rank for g in same)
        shown.update(ranks)
        if len(ranks) == 1:
            parts.append(f.describe())
            continue
        others = ", ".join(str(r) for r in ranks[1:])
        if f.kind == "exception":
            hint = f" (`{f.stub}` is still a stub: implement it first)" if f.stub else ""
            parts.append(f"rank {ranks[0]} raised an exception, and rank(s) {others} the same one{hint}\n"
                         f"{_indent(f.student_view())}")
        else:
            parts.append(f"ranks {', '.join(str(r) for r in ranks)}: each {f.student_view()}")
    return "\n\n".join(parts)


def _same_failure(f: RankFailure, g: RankFailure) -> bool:
    """Two ranks a student would read as one failure (same error at the same line, or stuck at one place)."""
    if f.kind != g.kind or f.kind not in ("exception", "timeout") or f.output_tail.strip() or g.output_tail.strip():
        return False
    return f.student_view() == g.student_view()


_SECONDARY = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "failed to pass monitoredBarrier")


def _secondary(f: RankFailure) -> bool:
    return f.kind == "exception" and any(s in f.detail for s in _SECONDARY)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def default_start_method(backend: str = "gloo") -> str:
    """fork on a Linux CPU; spawn on macOS/Windows and for CUDA (never fork after CUDA init).

    `AUTOGRADER_START_METHOD=spawn` in the environment spawns on Linux too (the macOS path, for testing it).
    """
    if backend == "nccl" or not sys.platform.startswith("linux"):
        return "spawn"
    forced = os.environ.get("AUTOGRADER_START_METHOD", "").strip().lower()
    if forced in ("fork", "spawn"):
        return forced
    return "fork"


def rank_device(rank: int, backend: str = "gloo"):
    """Where a rank program puts its tensors: `cuda:<rank>` under NCCL, the CPU otherwise."""
    import torch

    return torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")


def _set_parent_death_signal() -> None:
    """Linux: the kernel kills this rank if the process that started it dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def pickler_keeping_filenames():
    """A cloudpickle Pickler class that keeps each function's file name (cloudpickle >= 3.1 writes
    `<dynamic-code>`): a spawned rank's messages then name the student's cell (`Cell In[5]`, see
    autograder.runtime.report.student_sources), and the course's own code is still told from the student's."""
    import types

    import cloudpickle

    reduce_code = getattr(getattr(cloudpickle, "cloudpickle", None), "_code_reduce", None)

    class KeepFilenames(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, types.CodeType) and reduce_code is not None:
                cls, args = reduce_code(obj)
                return cls, tuple(obj.co_filename if isinstance(a, str) and a == "<dynamic-code>" else a
                                  for a in args)
            return super().reducer_override(obj)

    return KeepFilenames


def dumps_keeping_filenames(obj) -> bytes:
    import pickle

    buf = io.BytesIO()
    with submodules_indexed():
        pickler_keeping_filenames()(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


_SUBMODULES: dict = {"key": None, "index": {}}


def _find_imported_submodules(code, top_level_dependencies):
    """cloudpickle's `_find_imported_submodules` (the same result, in the same order) from an index of
    sys.modules by package and by the first name after it, made again only when sys.modules changes:
    cloudpickle scans all of sys.modules (2,000 names with torch) for each package a function refers to, 0.8 of
    the grader's 1.3 CPU-seconds of one submission of 02 (issue 31). For the 834 functions of the course's checks:
    cloudpickle's scan 0.83 CPU-seconds, an index by package 0.63, by package and first name 0.005."""
    import types

    key = (len(sys.modules), next(reversed(sys.modules), None))
    if _SUBMODULES["key"] != key:
        # package prefix -> the first name after it -> [(place in sys.modules, module name, its names after it)]:
        # a submodule can only be one the code refers to if its first name is among the code's names
        index: dict[str, dict[str, list]] = {}
        for place, name in enumerate(list(sys.modules)):
            if name is None:
                continue
            parts = name.split(".")
            for i in range(1, len(parts)):
                index.setdefault(".".join(parts[:i]) + ".", {}).setdefault(parts[i], []).append(
                    (place, name, frozenset(parts[i:])))
        _SUBMODULES.update(key=key, index=index)
    names = set(code.co_names)
    subimports = []
    for x in top_level_dependencies:
        if isinstance(x, types.ModuleType) and hasattr(x, "__package__") and x.__package__:
            by_first = _SUBMODULES["index"].get(x.__name__ + ".", {})
            found = sorted(entry for first in names.intersection(by_first) for entry in by_first[first]
                           if entry[2] <= names)
            for _, name, _ in found:
                module = sys.modules.get(name)
                if module is not None:
                    subimports.append(module)
    return subimports


@contextlib.contextmanager
def submodules_indexed():
    """While pickling: cloudpickle's scan of sys.modules replaced by `_find_imported_submodules` above."""
    import cloudpickle

    module = getattr(cloudpickle, "cloudpickle", None)
    original = getattr(module, "_find_imported_submodules", None)
    if original is None:  # another cloudpickle: its own scan
        yield
        return
    module._find_imported_submodules = _find_imported_submodules
    try:
        yield
    finally:
        module._find_imported_submodules = original


def _spawn_main() -> None:
    """Entry point of a spawned rank: `python -c ... WORKDIR RANK WORLD_SIZE BACKEND TIMEOUT CHECK STARTUP`."""
    workdir, rank, world_size, backend, timeout, check, startup = sys.argv[1:8]
    _rank_main(None, int(rank), int(world_size), workdir, backend, float(timeout), by_value=True,
               check_collectives=check == "1", startup_timeout=float(startup))


def _rank_main(payload, rank: int, world_size: int, workdir: str, backend: str, timeout: float,
               by_value: bool, check_collectives: bool = True, startup_timeout: float = 120.0) -> None:
    """Body of one rank process. Never returns normally: exits with a status."""
    out_path = os.path.join(workdir, f"rank{rank}.log")
    # Send this process's fd 1 and 2 (Python and C++ alike) to the rank's log file.
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
    _set_parent_death_signal()
    try:  # a process group of its own: whatever the rank starts is killed with it (autograder.runtime.dist._RankProcess)
        os.setpgid(0, 0)
    except OSError:
        pass
    stack_file = open(os.path.join(workdir, f"rank{rank}.stack"), "w")
    faulthandler.enable(file=stack_file, all_threads=True)  # segfaults: write the stack
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    elif sys.platform == "darwin":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0")
    status = 1
    store = None
    try:
        import torch
        import torch.distributed as dist

        # A forked child hangs in its first multi-threaded op if the parent had
        # already used its OpenMP pool (spec 6); one thread per rank avoids it.
        torch.set_num_threads(1)
        if by_value:
            import cloudpickle

            with open(os.path.join(workdir, "payload.pkl"), "rb") as f:
                parent_path, sources, blob = cloudpickle.load(f)
            sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
            from autograder.runtime.report import install_sources

            install_sources(sources)  # the notebook's cells, so that messages quote them as the kernel names them
            fn, args = cloudpickle.loads(blob)
        else:
            fn, args = payload
        if check_collectives:
            from autograder.runtime.agreement import CollectiveAgreement
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.FileStore(os.path.join(workdir, "store"), world_size)
        # Start-up (a spawned rank imports torch: seconds) has its own limit: every rank waits here until
        # all have arrived, so that the process group's rendezvous and the run's timeout start together.
        store.set_timeout(datetime.timedelta(seconds=_TRANSPORT_WAIT_S))  # the parent decides, never the clock
        store.set(_ARRIVED.format(rank=rank), b"1")
        store.wait([_ARRIVED.format(rank=r) for r in range(world_size)])
        finished = False
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=_TRANSPORT_WAIT_S),  # the supervisor decides (on evidence)
        )
        try:
            # Every rank is connected before any runs the program: a rank that
            # fails at once must not break a peer's rendezvous.
            if backend == "nccl":
                dist.barrier(device_ids=[torch.cuda.current_device()])
            else:
                dist.barrier()
            with open(os.path.join(workdir, f"rank{rank}.ready"), "w"):
                pass  # the parent starts the run's timeout once every rank is here
            if check_collectives:
                # Ranks must agree on each collective before it runs (autograder.runtime.agreement):
                # a mismatch raises a clear error on the spot instead of aborting the
                # rank or returning wrong numbers (spec 6). Its journal of sends and receives
                # tells the parent which ones had no partner when the ranks hang.
                agreement = CollectiveAgreement(store, rank, journal=os.path.join(workdir, f"rank{rank}.p2p"),
                                                progress=os.path.join(workdir, f"rank{rank}.progress"))
                with agreement:
                    result = fn(rank, world_size, *args)  # the rank program
                agreement.finish()
            else:
                result = fn(rank, world_size, *args)  # the rank program
                store.set(_DONE.format(rank=rank), b"{}")
            # No rank may close its connections while a peer is still using them
            # (a fast rank exiting early makes a slow one fail with "Connection
            # closed by peer"): wait until every rank has returned.
            _wait_for_all_ranks_to_finish(store, world_size)
            finished = True
        finally:
            # After every rank returned, gloo's connections close with the process (os._exit below):
            # destroying the group first costs ~20 ms a rank for nothing. NCCL's communicators are
            # destroyed, and so is any group after a failure (best effort).
            if backend != "gloo" or not finished:
                try:
                    dist.destroy_process_group()
                except Exception:  # noqa: BLE001 - best effort after a failure
                    pass
        buf = io.BytesIO()
        try:
            torch.save(result, buf)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(
                f"rank {rank}: the rank function returned a value that cannot be sent back "
                f"to the caller ({type(result).__name__}): {exc}. Return tensors, numbers, "
                f"strings, and lists/dicts/dataclasses of them."
            ) from exc
        tmp = os.path.join(workdir, f"rank{rank}.result.tmp")
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, os.path.join(workdir, f"rank{rank}.result"))
        status = 0
    except _PeerFailed:
        status = _EXIT_PEER_FAILED
    except BaseException as exc:  # noqa: BLE001 - report everything, including SystemExit
        try:
            store.set(_FAILED.format(rank=rank), b"1")  # peers waiting at the end stop at once
        except Exception:  # noqa: BLE001 - no store yet (failed before the rendezvous)
            pass
        try:
            record = _exception_record(exc)
        except Exception:  # noqa: BLE001 - e.g. an exception whose str() raises
            record = {"type": type(exc).__name__, "message": "", "frames": [], "stub": "",
                      "text": "".join(traceback.format_exception_only(type(exc), exc))}
        try:
            with open(os.path.join(workdir, f"rank{rank}.error"), "w") as f:
                json.dump(record, f)
        except OSError:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(status)


_DONE = "__rank_done/{rank}"  # autograder.runtime.agreement.DONE_KEY: each rank sets it when its program returns
_ARRIVED = "__rank_arrived/{rank}"  # each rank sets it once started (torch imported, the program loaded)


_FAILED = "__rank_failed/{rank}"
# The exit status of a rank that returned from its program but stopped because a peer failed.
_EXIT_PEER_FAILED = 75


class _PeerFailed(Exception):
    pass


def _wait_for_all_ranks_to_finish(store, world_size: int) -> None:
    """Wait (idle: from 1 ms up to 20 ms between looks) until every rank has returned from its rank program.

    Raises _PeerFailed as soon as another rank reports a failure, so that this
    rank stops at once instead of waiting for the parent to kill it. No clock:
    the supervisor ends a run that never finishes (autograder.runtime.dist._supervise).
    """
    done = [_DONE.format(rank=r) for r in range(world_size)]
    failed = [_FAILED.format(rank=r) for r in range(world_size)]
    pause = 0.001
    while not store.check(done):
        if any(store.check([k]) for k in failed):
            raise _PeerFailed()
        time.sleep(pause)
        pause = min(pause * 1.5, 0.02)


def _exception_record(exc: BaseException) -> dict:
    """What the parent needs to explain an exception: type, message, frames (student's marked), full text."""
    from autograder.runtime.report import STUB_LINE, describe_location, is_student_file

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename != __file__:
            name = getattr(code, "co_qualname", code.co_name)
            frames.append({
                "file": code.co_filename, "line": tb.tb_lineno, "name": name,
                "where": describe_location(code.co_filename, tb.tb_lineno, name),
                "text": linecache.getline(code.co_filename, tb.tb_lineno).strip(),
                "student": is_student_file(code.co_filename),
            })
        tb = tb.tb_next
    stub = ""
    mine = [f for f in frames if f["student"]]
    if isinstance(exc, NotImplementedError) and mine and frames[-1] is mine[-1] \
            and mine[-1]["text"] == STUB_LINE:
        stub = mine[-1]["name"]
    return {"type": type(exc).__name__, "message": str(exc), "frames": frames, "stub": stub,
            "text": _format_user_traceback(exc)}


def _format_user_traceback(exc: BaseException) -> str:
    """The traceback without the runner's own frames (they say nothing about the bug)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _read_tail(path: str, limit: int = _OUTPUT_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read().decode("utf-8", "replace")
        if size > limit:
            data = f"[... {size - limit} earlier bytes not shown]\n" + data
        return data
    except OSError:
        return ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        extra = " (segmentation fault)" if -code == signal.SIGSEGV else ""
        return f"killed by {name}{extra}"
    return f"exited with status {code} without returning (os._exit or sys.exit in native code?)"


class _RankProcess:
    """One rank: a forked multiprocessing.Process or a spawned interpreter (subprocess)."""

    def __init__(self, rank, method, payload, world_size, workdir, backend, timeout, check_collectives,
                 startup_timeout):
        self.rank = rank
        if method == "fork":
            ctx = multiprocessing.get_context("fork")
            self._proc = ctx.Process(
                target=_rank_main, name=f"rank{rank}", daemon=True,
                args=(payload, rank, world_size, workdir, backend, timeout, False, check_collectives,
                      startup_timeout),
            )
            self._proc.start()
            self._popen = None
            self.pid = self._proc.pid
        else:
            # A fresh interpreter that never imports the caller's __main__ (a
            # script without a main guard, or a notebook kernel, both work):
            # the rank function arrives by value in payload.pkl.
            code = "from autograder.runtime.dist import _spawn_main; _spawn_main()"
            self._proc = None
            self._popen = subprocess.Popen(
                [sys.executable, "-c", code, workdir, str(rank), str(world_size), backend, str(timeout),
                 "1" if check_collectives else "0", str(startup_timeout)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            self.pid = self._popen.pid

    @property
    def exitcode(self):
        if self._proc is not None:
            return self._proc.exitcode
        return self._popen.poll()

    def kill(self):
        """Kill the rank and every process it started (its process group), finished or not."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            if self._proc is not None:
                if self._proc.is_alive():
                    self._proc.kill()
            elif self._popen.poll() is None:
                self._popen.kill()
        except (ProcessLookupError, OSError):
            pass

    def join(self, timeout=None):
        if self._proc is not None:
            self._proc.join(timeout)
        else:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass


def run_distributed(fn, world_size: int, *, args: tuple = (), timeout: float = 20.0,
                    backend: str = "gloo", start_method: str | None = None,
                    show_output: bool = False, check_collectives: bool = True) -> list:
    """Run `fn(rank, world_size, *args)` in `world_size` processes; return their results.

    The default process group is initialised in every rank (`backend`, a fresh
    FileStore rendezvous per call). `timeout` is each rank's budget in CPU-seconds,
    counted from when every rank has started (reached the rendezvous): a rank that
    uses it all is stopped with every rank's Python stack (an endless loop). A
    deadlock is convicted on the ranks' stacks, a stall (every rank asleep) on the
    scheduler's record (see the module docstring).
    Raises `DistributedError` when any rank raises, crashes, hangs or uses its
    budget; `InconclusiveRun` when the ranks do not start within `STARTUP_TIMEOUT_S`
    or the run reaches `wall_backstop(timeout)` wall-clock seconds undecided.
    With `show_output=True` each rank's stdout/stderr is printed (to stdout) afterwards.
    `start_method` is "fork" or "spawn"; by default fork on a Linux CPU, spawn elsewhere.
    `check_collectives` fingerprints each collective across ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL)
    so that ranks calling one collective with different shapes or dtypes fail with a clear error.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    method = start_method or default_start_method(backend)
    if method not in ("fork", "spawn"):
        raise ValueError(f"start_method must be 'fork' or 'spawn', got {method!r}")
    if not callable(fn):
        raise TypeError(f"run_distributed: fn must be callable, got {type(fn).__name__}")

    if _EXECUTOR is not None:
        from autograder.runtime.report import note_run

        t0 = time.monotonic()
        try:
            return _EXECUTOR.run(fn, world_size, dict(args=tuple(args), timeout=timeout, backend=backend,
                                                      start_method=start_method, show_output=show_output,
                                                      check_collectives=check_collectives))
        finally:
            note_run(world_size, time.monotonic() - t0)
    if check_collectives:
        import autograder.runtime.agreement  # noqa: F401 - its imports are paid once here, not in every forked rank

    workdir = tempfile.mkdtemp(prefix="autograder-dist-")
    procs: list[_RankProcess] = []
    try:
        payload = (fn, tuple(args))
        if method != "fork":
            import cloudpickle

            from autograder.runtime.report import student_sources

            with open(os.path.join(workdir, "payload.pkl"), "wb") as f:
                cloudpickle.dump((list(sys.path), student_sources(), dumps_keeping_filenames(payload)), f)
            payload = None
        # Flush so buffered parent output is not duplicated into forked children.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        t0 = time.monotonic()
        started: dict = {}
        for rank in range(world_size):
            procs.append(_RankProcess(rank, method, payload, world_size, workdir, backend, timeout,
                                      check_collectives, STARTUP_TIMEOUT_S))
        try:
            return _supervise(procs, workdir, timeout, show_output, startup_timeout=STARTUP_TIMEOUT_S,
                              started=started)
        finally:
            from autograder.runtime.report import note_run

            note_run(world_size, time.monotonic() - t0, started.get("seconds", 0.0))
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join(timeout=5)
        shutil.rmtree(workdir, ignore_errors=True)


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, every thread) a process has used so far; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, ValueError, IndexError):
        pass
    try:  # macOS and other systems without /proc
        out = subprocess.run(["ps", "-o", "time=", "-p", str(pid)], capture_output=True, text=True,
                             timeout=2).stdout.strip()
        if not out:
            return None
        days, _, rest = out.rpartition("-")
        parts = [float(x) for x in rest.split(":")]
        seconds = 0.0
        for x in parts:
            seconds = seconds * 60 + x
        return seconds + (int(days) * 86400 if days else 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


try:
    _CLK_TCK = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):  # pragma: no cover
    _CLK_TCK = 100


def _progress(workdir: str, rank: int) -> tuple[int, bool] | None:
    """(how many torch ops the rank has dispatched so far, whether it is inside a communication op now), as
    autograder.runtime.agreement counts them; None where the rank keeps no count (check_collectives=False)."""
    try:
        with open(os.path.join(workdir, f"rank{rank}.progress"), "rb") as f:
            data = f.read(16)
    except OSError:
        return None
    if len(data) != 16:
        return None
    return int.from_bytes(data[:8], sys.byteorder), bool(int.from_bytes(data[8:], sys.byteorder))


def _stack_tail(workdir: str, rank: int, offset: int) -> str:
    """What a rank's stack file holds past `offset` (the dump written after the last SIGUSR1)."""
    try:
        with open(os.path.join(workdir, f"rank{rank}.stack"), "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _stack_size(workdir: str, rank: int) -> int:
    try:
        return os.path.getsize(os.path.join(workdir, f"rank{rank}.stack"))
    except OSError:
        return 0


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the autograder package


def _waiting_in_communication(stack: str, in_comm: bool = False) -> str | None:
    """Where a faulthandler dump shows a rank waiting on its peers, or None if it shows something else.

    Waiting on peers means: the innermost Python frame is in torch.distributed (a collective, a send or
    receive, a barrier), in the collective agreement's wait for the other ranks' next collective, a
    `.wait()` on a request (Work.wait has no Python frame of its own), or the runner's wait for the other
    ranks to return. (A function of the course's own package whose name starts with `_wait` waits on peers:
    the agreement's `_wait_for`, the checks' waits for the group's splits.)
    """
    frames = _stack_frames(stack)
    if not frames:
        return None
    file, line, name = frames[0]
    if in_comm and file.startswith(_PACKAGE + os.sep) and name == "__torch_dispatch__":
        return f"dispatch:{file}:{line}"  # a communication op blocking under the course's dispatch modes
    if file.startswith(_PACKAGE + os.sep) and name == "wait":
        return f"wait:{file}:{line}"  # the course's wrappers of Work.wait (the ledgers)
    if file == __file__ and name == "_wait_for_all_ranks_to_finish":
        return "returned"
    if "torch" + os.sep + "distributed" + os.sep in file:
        return f"{name}:{line}"
    if file.startswith(_PACKAGE + os.sep) and name.startswith("_wait"):
        return f"course:{name}"  # the collective agreement's, or a check's, idle wait for the other ranks
    if re.search(r"\.wait\(", linecache.getline(file, line)):
        return f"wait:{file}:{line}"
    return None


class _DeadlockWatch:
    """Convicts a deadlock on evidence only, never on time or idleness alone (issue 28).

    A run is a deadlock when, at two looks `window` seconds apart, every live rank's Python stack shows it
    waiting on its peers (a torch.distributed call, the collective agreement's wait, a request's `.wait()`,
    or the runner's final wait) at the same place, and in between none of them made progress: no torch op
    dispatched (the agreement's counter) and no more CPU than waiting costs. A rank that computes, however
    slowly, moves its counter or its CPU time or its stack; a rank that waits for a CPU on a loaded machine
    is slow, and eventually moves. Looks are paid only after `window` seconds of quiet.

    States: "quiet" (measuring), "dump1"/"dump2" (a stack dump asked for, waiting for it to be written: a
    rank that gets little CPU writes it late, and is waited for), "confirm" (the second window).
    """

    def __init__(self, procs, workdir: str, window: float = DEADLOCK_IDLE_S, busy: float = 0.05,
                 sample: float = 0.25):
        self.procs, self.workdir, self.window, self.busy, self.sample = procs, workdir, window, busy, sample
        self.next_sample = 0.0
        self.unwritten = 0  # dumps that never came (a rank too starved, or without faulthandler)
        self.evidence: dict[int, str] = {}  # rank -> its last dump, once convicted
        self._reset(frozenset())

    def _reset(self, live) -> None:
        self.state, self.live, self.since, self.cpu0, self.prog0 = "quiet", frozenset(live), None, None, None
        self.places: dict[int, str] = {}
        self.offsets: dict[int, int] = {}

    def _measure(self):
        cpu, prog = 0.0, {}
        for rank in self.live:
            t = _cpu_seconds(self.procs[rank].pid)
            if t is None:
                return None, None
            cpu += t
            prog[rank] = _progress(self.workdir, rank)
        return cpu, prog

    def _quiet_since_start(self, now, cpu, prog) -> bool:
        return (cpu - self.cpu0) < self.busy * max(now - self.since, self.sample) + 2.0 / _CLK_TCK \
            and prog == self.prog0

    def _ask_stacks(self, now) -> None:
        self.offsets = {r: _stack_size(self.workdir, r) for r in self.live}
        for rank in self.live:
            try:
                os.kill(self.procs[rank].pid, signal.SIGUSR1)
            except (ProcessLookupError, OSError):
                pass
        self.asked = now

    def _read_stacks(self, now):
        """{rank: dump} once every live rank wrote one; None while waiting; {} when they never came."""
        dumps = {r: _stack_tail(self.workdir, r, self.offsets[r]) for r in self.live}
        if all(d.endswith("\n") and "File " in d for d in dumps.values()):
            time.sleep(0.02)  # the last lines of a dump
            return {r: _stack_tail(self.workdir, r, self.offsets[r]) for r in self.live}
        if now - self.asked > _STACK_DUMP_WAIT_S:
            self.unwritten += 1
            return {}
        return None

    def deadlocked(self, now: float, live: set[int]) -> bool:
        if now < self.next_sample:
            return False
        self.next_sample = now + self.sample
        if frozenset(live) != self.live:  # a rank finished: start again
            self._reset(live)
        if self.state in ("dump1", "dump2"):
            dumps = self._read_stacks(now)
            if dumps is None:
                return False
            comm = {r: (_progress(self.workdir, r) or (0, False))[1] for r in dumps}
            places = {r: _waiting_in_communication(d, comm[r]) for r, d in dumps.items()}
            if not dumps or any(p is None for p in places.values()) or all(p == "returned" for p in places.values()):
                self._reset(live)
                return False
            if self.state == "dump1":
                self.places, self.state = places, "confirm"
                self.since, (self.cpu0, self.prog0) = now, self._measure()
                return False
            if places == self.places:
                self.evidence = dumps
                return True
            self._reset(live)
            return False
        cpu, prog = self._measure()
        if cpu is None:
            return False  # cannot tell: the wall-clock backstop ends it, as inconclusive
        if self.since is None:
            self.since, self.cpu0, self.prog0 = now, cpu, prog
            return False
        if not self._quiet_since_start(now, cpu, prog):
            self._reset(live)
            self.since, self.cpu0, self.prog0 = now, cpu, prog
            return False
        if now - self.since >= self.window:
            self._ask_stacks(now)
            self.state = "dump1" if self.state == "quiet" else "dump2"
        return False


class _Settled:
    """After a rank failed: are the survivors just waiting (no CPU for a short window)? Then they are stopped
    at once instead of after the grace period. Not a verdict: the failed rank is the finding."""

    def __init__(self, procs, window: float = 0.3):
        self.procs, self.window, self.history, self.live = procs, window, [], frozenset()

    def quiet(self, now: float, live: set[int]) -> bool:
        if frozenset(live) != self.live:
            self.live, self.history = frozenset(live), []
        total = 0.0
        for rank in live:
            t = _cpu_seconds(self.procs[rank].pid)
            if t is None:
                return False
            total += t
        self.history.append((now, total))
        while len(self.history) > 1 and now - self.history[1][0] >= self.window:
            self.history.pop(0)
        t0, c0 = self.history[0]
        return now - t0 >= self.window and total - c0 < 0.05 * (now - t0) + 1.0 / _CLK_TCK


def _sched(pid: int) -> tuple[float, float, bool] | None:
    """(seconds run on a CPU, seconds spent runnable but waiting for a CPU, whether a thread is in uninterruptible
    sleep: a page fault or disk I/O), summed over the process's threads, from the scheduler's own accounting
    (/proc/<pid>/task/*/schedstat and stat); None where the system does not keep it."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    ran = waited = 0
    disk = False
    seen = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # a thread that has just ended
        try:
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
        except (ValueError, IndexError):
            return None
        disk = disk or state == "D"
        seen += 1
    return (ran / 1e9, waited / 1e9, disk) if seen else None


class _StallWatch:
    """A run that stopped by its own doing: for `limit` seconds of the clock in a row, no rank dispatched a torch
    op, none used the CPU beyond what waiting costs (5% per rank), none waited for a CPU beyond what its
    occasional wake-ups cost (25% per rank), and none was in uninterruptible sleep. The scheduler's record
    (schedstat) tells a rank that sleeps (`time.sleep`, a wait on something that never comes) from one that is
    ready to run and starved by a busy machine: a runnable rank runs or waits for a CPU all the time (a
    starved one: it ran under 5% of the time only where it waited for a CPU most of it), and resets the
    count. So this is evidence, not idleness alone: on a loaded machine a slow correct
    run never stalls, it waits for a CPU. Where the system keeps no such record, nothing is convicted here.
    """

    def __init__(self, limit: float, progress=None, sample: float = 1.0, busy: float = 0.05,
                 starved: float = 0.25):
        self.limit, self.progress = limit, progress or (lambda key: None)
        self.sample, self.busy, self.starved = sample, busy, starved
        self.next_sample, self.last, self.since = 0.0, None, None

    def _measure(self, pids: dict):
        got = {}
        for key, pid in sorted(pids.items()):
            sched = _sched(pid)
            if sched is None or sched[2]:
                return None
            got[key] = (sched[0], sched[1], self.progress(key))
        return got

    def stalled(self, now: float, pids: dict) -> bool:
        """Whether the processes `pids` ({name: pid}) have been asleep for `limit` seconds in a row."""
        if now < self.next_sample:
            return False
        self.next_sample = now + self.sample
        cur = self._measure(pids) if pids else None
        last, self.last = self.last, (now, cur)
        if cur is None or last is None or last[1] is None or set(last[1]) != set(cur):
            self.since = None
            return False
        dt = now - last[0]
        # each process on its own: one that wants the CPU is runnable all the time (ran + waited = dt); a
        # sleeping one's own threads (gloo's, the runner's) wake now and then, and on a busy machine wait a
        # little each time
        quiet = all(c[0] - b[0] < self.busy * dt + 2.0 / _CLK_TCK and c[1] - b[1] < self.starved * dt
                    and c[2] == b[2] for c, b in ((cur[k], last[1][k]) for k in cur))
        if not quiet:
            self.since = None
            return False
        if self.since is None:
            self.since = last[0]
        return now - self.since >= self.limit

    def seconds(self, now: float) -> float:
        return now - self.since if self.since is not None else 0.0


def wall_backstop(timeout: float) -> float:
    """Wall-clock seconds after which a run that has neither finished, failed, used its CPU budget nor shown
    a deadlock is given up as inconclusive (the machine too busy to tell): never a verdict.
    `AUTOGRADER_BACKSTOP_S` in the environment sets it (seconds; the grader passes it to the sandbox)."""
    given = os.environ.get("AUTOGRADER_BACKSTOP_S", "").strip()
    if given:
        try:
            return max(0.1, float(given))
        except ValueError:
            pass
    return max(10.0 * timeout, timeout + 60.0)


def _supervise(procs: list[_RankProcess], workdir: str, timeout: float, show_output: bool,
               startup_timeout: float = STARTUP_TIMEOUT_S, started: dict | None = None) -> list:
    """Wait for the ranks: first until every one has reached the rendezvous (`startup_timeout`), then for
    their programs. A verdict needs evidence: an exception, a crash, a rank that used `timeout` CPU-seconds,
    a deadlock shown by the ranks' stacks (_DeadlockWatch), or a stall (_StallWatch). A run that reaches none of these within the
    wall-clock backstop (or does not start) is inconclusive: InconclusiveRun, never a failure.
    `started["seconds"]`: how long the start took."""
    world_size = len(procs)
    launched = time.monotonic()
    start = None  # when every rank had reached the rendezvous: the budgets start there
    backstop = None
    ready = [os.path.join(workdir, f"rank{r}.ready") for r in range(world_size)]
    first_failure_at = None
    pending = set(range(world_size))
    failed: set[int] = set()
    watch = _DeadlockWatch(procs, workdir)
    stall = _StallWatch(max(timeout, STALL_MIN_S), progress=lambda rank: _progress(workdir, rank))
    stalled = 0.0  # the seconds of a stall (see _StallWatch), once convicted
    settled = _Settled(procs)  # after a failure: are the others just waiting?
    deadlock, inconclusive = False, None
    over_budget: list[int] = []
    cpu0: dict[int, float] = {}
    next_budget_look = 0.0
    poll_s = 0.002
    while pending:
        now = time.monotonic()
        if start is None and all(os.path.exists(p) for p in ready):
            start = now
            backstop = start + wall_backstop(timeout)
            cpu0 = {r: _cpu_seconds(procs[r].pid) or 0.0 for r in range(world_size)}
            if started is not None:
                started["seconds"] = start - launched
        if first_failure_at is not None and now >= first_failure_at + _GRACE_AFTER_FAILURE_S:
            break
        if first_failure_at is None and start is None and now >= launched + startup_timeout:
            inconclusive = "start"
            break
        if first_failure_at is None and start is not None and now >= backstop:
            inconclusive = "backstop"
            break
        for rank in sorted(pending):
            code = procs[rank].exitcode
            if code is None:
                continue
            pending.discard(rank)
            if code != 0:
                failed.add(rank)
                if first_failure_at is None:
                    first_failure_at = time.monotonic()
        if pending and start is not None and first_failure_at is None:
            if now >= next_budget_look:  # the budget: CPU-seconds per rank, the same on a busy machine
                next_budget_look = now + 0.25
                over_budget = [r for r in sorted(pending)
                               if (_cpu_seconds(procs[r].pid) or 0.0) - cpu0.get(r, 0.0) >= timeout]
                if over_budget:
                    break
            if watch.deadlocked(now, pending):
                deadlock = True
                break
            if stall.stalled(now, {r: procs[r].pid for r in pending}):
                stalled = stall.seconds(now)
                break
        if pending and first_failure_at is not None and settled.quiet(now, pending):
            break  # the survivors are blocked waiting for the failed rank: no need to wait out the grace
        if pending:
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 0.02)

    stuck = sorted(pending)
    stacks: dict[int, str] = dict(watch.evidence) if deadlock else {}
    cpu_used = {r: max(0.0, c - cpu0.get(r, 0.0)) for r in stuck
                if (c := _cpu_seconds(procs[r].pid)) is not None} if start is not None else {}
    if stuck:
        if not deadlock:
            # Ask the stuck ranks for their Python stacks (faulthandler writes from its signal handler, even in a
            # rank blocked in C++; a rank that gets little CPU writes late: waited for, within a bound), then kill.
            offsets = {r: _stack_size(workdir, r) for r in stuck}
            for rank in stuck:
                try:
                    os.kill(procs[rank].pid, signal.SIGUSR1)
                except (ProcessLookupError, OSError):
                    pass
            wait = _STACK_DUMP_WAIT_S if first_failure_at is None and start is not None else 0.5
            stack_deadline = time.monotonic() + wait
            while time.monotonic() < stack_deadline and not all(
                    _stack_size(workdir, r) > offsets[r] for r in stuck):
                time.sleep(0.01)
            time.sleep(0.02)  # let the last lines land
            stacks = {r: _stack_tail(workdir, r, offsets[r]) for r in stuck}
        for rank in stuck:
            procs[rank].kill()
        for rank in stuck:
            procs[rank].join(timeout=5)


    def log(rank):
        return os.path.join(workdir, f"rank{rank}.log")

    if not failed and not stuck:
        results = []
        import torch

        from autograder.runtime.plaindata import safe_load

        for rank in range(world_size):
            with open(os.path.join(workdir, f"rank{rank}.result"), "rb") as f:
                data = f.read()
            try:  # data only (weights_only): what a rank sends back cannot run code in the caller
                results.append(safe_load(data))
            except Exception as exc:  # noqa: BLE001 - an object that is not plain data
                raise DistributedError(
                    f"run_distributed: rank {rank} sent back something that is not plain data "
                    f"({str(exc).splitlines()[0][:300]}). Rank programs return tensors, numbers, strings, "
                    f"and lists, tuples and dicts of them.", []) from None
        if show_output:
            _print_outputs(workdir, world_size)
        return results

    failures: list[RankFailure] = []
    for rank in range(world_size):
        if rank in failed:
            err = _read(os.path.join(workdir, f"rank{rank}.error"))
            record = None
            if err:
                try:
                    record = json.loads(err)
                except ValueError:
                    record = {"text": err, "type": "", "message": "", "frames": [], "stub": ""}
            if procs[rank].exitcode == _EXIT_PEER_FAILED:
                failures.append(RankFailure(rank, "killed-after-peer-failure", _RETURNED, _read_tail(log(rank))))
            elif record:
                failures.append(RankFailure(rank, "exception", record["text"], _read_tail(log(rank)),
                                            exc_type=record["type"], message=record["message"],
                                            frames=record["frames"], stub=record.get("stub", "")))
            else:
                detail = _describe_exit(procs[rank].exitcode)
                stack = _last_dump(_read(os.path.join(workdir, f"rank{rank}.stack"))).strip()
                if stack:
                    detail += "\n" + _filter_stack(stack)
                failures.append(RankFailure(rank, "crash", detail, _read_tail(log(rank))))
        elif rank in stuck:
            kind = "timeout" if first_failure_at is None else "killed-after-peer-failure"
            stack = stacks.get(rank, "").strip() or "(no stack was written)"
            failures.append(RankFailure(rank, kind, _filter_stack(stack), _read_tail(log(rank))))

    # Root causes first (an exception or a crash that is not a consequence of a
    # peer's failure), then deadlocked ranks, then the ranks that failed only
    # because another did; in rank order within each (the same on every run).
    def order(f: RankFailure):
        if f.kind in ("exception", "crash") and not _secondary(f):
            return 0
        return 1 if f.kind == "timeout" else 2

    failures.sort(key=lambda f: (order(f), f.rank))
    names = ", ".join(str(r) for r in sorted(f.rank for f in failures))
    if inconclusive is not None:
        if inconclusive == "start":
            late = ", ".join(str(r) for r in range(world_size) if not os.path.exists(ready[r]))
            what = (f"the ranks did not all start within {startup_timeout:g} s (each rank's interpreter, "
                    f"`import torch`, the rendezvous; your code had not begun): rank(s) {late} had not reached "
                    f"the rendezvous")
        else:
            used = ", ".join(f"rank {r}: {cpu_used[r]:.1f}" for r in stuck if r in cpu_used)
            what = (f"after {time.monotonic() - start:.0f} s the ranks {names} had neither finished nor failed, "
                    f"nor used their budget of {timeout:g} CPU-seconds each, nor shown a deadlock (every rank "
                    f"waiting on its peers, twice, with no progress)" + (f"; CPU-seconds used: {used}" if used else ""))
        raise InconclusiveRun(
            f"run_distributed: inconclusive (world size {world_size}): {what}. The machine is too busy to tell a "
            f"slow run from a hang: this is not a verdict on your code. Run it again when the machine is less "
            f"loaded.", failures)
    if deadlock:
        summary = (f"run_distributed: deadlock: every rank still running ({names}) was waiting on its peers at "
                   f"the same place at two looks {DEADLOCK_IDLE_S:g} s apart, and none made progress in between "
                   f"(world size {world_size}). Where each rank was waiting is below; every rank was stopped.")
    elif stalled and all(_waiting_in_communication(stacks.get(r, "")) for r in stuck):
        # every rank asleep, each waiting on its peers (its stack): a deadlock shown by both records
        summary = (f"run_distributed: deadlock: every rank still running ({names}) was waiting on its peers, and "
                   f"for {stalled:.0f} s none of them ran, made progress or waited for a CPU (world size "
                   f"{world_size}). Where each rank was waiting is below; every rank was stopped.")
    elif stalled:
        summary = (f"run_distributed: rank(s) {names} stopped: for {stalled:.0f} s none of them ran, made progress "
                   f"or waited for a CPU (the operating system's record: they were asleep, not slowed by a busy "
                   f"machine) (world size {world_size}). A `time.sleep`, or a wait for something that never comes? "
                   f"Each rank's stack is below; every rank was stopped.")
    elif first_failure_at is None:
        busy = ", ".join(str(r) for r in over_budget)
        summary = (f"run_distributed: rank(s) {busy} computed for {timeout:g} CPU-seconds without finishing (the "
                   f"run's budget; a correct solution needs a small part of it, on a busy machine too: the budget "
                   f"counts CPU time, not the clock) (world size {world_size}). An endless loop? Each rank's stack "
                   f"is below; every rank was stopped.")
    else:
        summary = f"run_distributed: rank(s) {names} failed (world size {world_size})."
    if stuck or any(f.kind == "crash" for f in failures):
        unmatched = _unmatched_p2p(workdir, world_size)
        if unmatched:
            summary += "\n" + unmatched
    if show_output:
        _print_outputs(workdir, world_size)
    raise DistributedError(summary, failures)


def _last_dump(text: str) -> str:
    """The last faulthandler dump in a rank's stack file (a crash's, after any dumps asked for earlier)."""
    at = text.rfind("Fatal Python error")
    return text[at:] if at >= 0 else text


def _read_journal(path: str) -> list[dict]:
    """A rank's sends and receives, in the order it posted them (autograder.runtime.agreement writes them)."""
    out = []
    for line in _read(path).splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut off when the rank was killed
        if isinstance(rec, dict) and rec.get("op") in ("send", "recv"):
            out.append(rec)
    return out


def _p2p_what(rec: dict) -> str:
    shape = "[" + ", ".join(str(d) for d in rec.get("shape", [])) + "]"
    return f"{shape} {rec.get('dtype', '')}, tag {rec.get('tag', 0)}"


def _unmatched_p2p(workdir: str, world_size: int) -> str:
    """The sends and receives that had no partner when the ranks stopped, and matched pairs whose tensors
    differ: from each rank's journal, the k-th send from a to b (same tag) pairs with b's k-th receive from a.

    Per rank, in the order it posted them (one op repeated on one channel from one line is one entry:
    `sends #1-#4 to rank 3`); then, where a rank sent to a peer that waits for someone else, that pairing
    (one of the two names the wrong peer); then each line of the student's code that posted one, quoted.
    """
    sends: dict[tuple, list] = {}
    recvs: dict[tuple, list] = {}
    for rank in range(world_size):
        for seq, rec in enumerate(_read_journal(os.path.join(workdir, f"rank{rank}.p2p"))):
            peer = rec.get("peer")
            if not isinstance(peer, int):
                continue  # a receive from any source: no channel to match it on
            rec = dict(rec, seq=seq)
            if rec["op"] == "send":
                sends.setdefault((rank, peer, rec.get("tag", 0)), []).append(rec)
            else:
                recvs.setdefault((peer, rank, rec.get("tag", 0)), []).append(rec)
    differ = []  # (rank, seq, text)
    lone = []  # (rank, seq, op, peer, number, record, partner)
    for key in sorted(set(sends) | set(recvs)):
        src, dst, _ = key
        s, r = sends.get(key, []), recvs.get(key, [])
        for a, b in zip(s, r):
            if (a.get("shape"), a.get("dtype")) != (b.get("shape"), b.get("dtype")):
                differ.append((src, a["seq"], f"  rank {src} sends {_p2p_what(a)} to rank {dst} (at {a.get('where')}), "
                                              f"but rank {dst} receives {_p2p_what(b)} from rank {src} "
                                              f"(at {b.get('where')})"))
        for i, a in enumerate(s[len(r):], len(r) + 1):
            partner = f"rank {dst} never receives from rank {src}" if not r else \
                f"rank {dst} posted only {len(r)} receive(s) from rank {src}"
            lone.append((src, a["seq"], "send", dst, i, a, partner))
        for i, b in enumerate(r[len(s):], len(s) + 1):
            partner = f"rank {src} never sends to rank {dst}" if not s else \
                f"rank {src} posted only {len(s)} send(s) to rank {dst}"
            lone.append((dst, b["seq"], "recv", src, i, b, partner))
    if not differ and not lone:
        return ""
    lone.sort(key=lambda x: (x[0], x[1]))
    runs: list[list] = []  # the lone ops of one rank on one channel from one line, numbered in a row: one entry
    open_runs: dict[tuple, list] = {}
    for item in lone:
        rank, _, op, peer, number, rec, partner = item
        key = (rank, op, peer, partner, rec.get("tag"), str(rec.get("shape")), rec.get("dtype"), rec.get("where"))
        run = open_runs.get(key)
        if run is not None and run[-1][4] + 1 == number:
            run.append(item)
        else:
            open_runs[key] = [item]
            runs.append(open_runs[key])
    lines = [t for _, _, t in sorted(differ)]
    for run in runs:
        rank, _, op, peer, first, rec, partner = run[0]
        last = run[-1][4]
        if op == "send":
            what = f"send #{first} to" if len(run) == 1 else f"sends #{first}-#{last} to"
        else:
            what = f"receive #{first} from" if len(run) == 1 else f"receives #{first}-#{last} from"
        lines.append(f"  rank {rank}: {what} rank {peer} ({_p2p_what(rec)}) at {rec.get('where')}: {partner}")
    shown = lines[:16]
    if len(lines) > 16:
        shown.append(f"  ... and {len(lines) - 16} more")
    # a send that went to a rank which waits for another sender: the likely wrong peer, either side
    crossed, seen = [], set()
    for rank, _, op, peer, _, rec, _ in lone:
        if op != "send":
            continue
        for other in lone:
            o_rank, _, o_op, o_peer, _, o_rec, _ = other
            if o_op != "recv" or o_rank != peer or o_peer == rank or \
                    (o_rec.get("tag"), o_rec.get("shape"), o_rec.get("dtype")) != \
                    (rec.get("tag"), rec.get("shape"), rec.get("dtype")):
                continue
            pair = (rec.get("where"), o_rec.get("where"))
            if pair not in seen and len(crossed) < 3:
                seen.add(pair)
                where = (f"the send (at {rec.get('where')}) or the receive (at {o_rec.get('where')})"
                         if pair[0] != pair[1] else f"the send or the receive (both at {pair[0]})")
                crossed.append(f"  rank {rank} sends to rank {peer}, which waits to receive from rank {o_peer} instead "
                               f"({_p2p_what(rec)} on both sides): {where} names the wrong peer")
            break
    quoted, where_seen = [], set()
    for _, _, _, _, _, rec, _ in sorted(lone, key=lambda x: (x[2] != "send", x[0], x[1])):
        where = rec.get("where")
        if not rec.get("line") or where in where_seen:
            continue
        where_seen.add(where)
        caller = f" (called from {rec['caller']})" if rec.get("caller") else ""
        quoted.append(f"  {where}{caller}\n    {rec['line']}")
    text = ("Sends and receives without a partner when the ranks stopped (global ranks; the k-th send from a "
            "to b pairs with b's k-th receive from a):\n" + "\n".join(shown + crossed))
    if quoted:
        text += "\nThe lines of your code that posted them (sends first):\n" + "\n".join(quoted[:6])
    return text


_RUNNER_MARK = "  (rank started by autograder.runtime.dist.run_distributed)"


def _stack_frames(stack: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the current thread's frames in a faulthandler dump, innermost first.

    The current thread is the one that took the signal (the main thread, as Linux delivers it there first);
    if the dump marks none (a signal taken by a thread without Python), the main thread: listed last."""
    blocks, frames, current = [], None, False
    for line in stack.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            frames = []
            blocks.append((line.startswith("Current thread"), frames))
            continue
        m = re.match(r'\s*File "(.*)", line (\d+) in (.*)$', line)
        if m and frames is not None:
            frames.append((m.group(1), int(m.group(2)), m.group(3).strip()))
    for current, frames in blocks:
        if current:
            return frames
    return blocks[-1][1] if blocks else []


def _blocked_at(stack: str) -> str:
    """Where a rank was, from a faulthandler dump: the torch.distributed call it was blocked in, and the chain
    of the student's frames that led there, outermost first:

        was blocked in recv (torch.distributed), called from your code (outermost first):
          Cell In[7], line 40, in run_pipeline
            _backward_step(...)
          Cell In[4], line 9, in recv_forward
            dist.recv(buf, src=prev, group=pp_group)
    """
    from autograder.runtime.report import describe_location, is_student_file

    frames = _stack_frames(stack)
    if any(f[0] == __file__ and f[2] == "_wait_for_all_ranks_to_finish" for f in frames):
        return _RETURNED
    mine = [i for i, f in enumerate(frames) if is_student_file(f[0])]
    if not mine:
        return ""
    inner = [f for f in frames[:mine[0]] if "torch" + os.sep + "distributed" in f[0]
             and f[2] not in ("wrapper", "__torch_dispatch__")]
    op = inner[-1][2] if inner else ""
    chain = []
    shown = list(reversed(mine))  # outermost first
    if len(shown) > 10:  # deep recursion: the way in and the innermost frames
        shown = shown[:3] + [None] + shown[-6:]
    for i in shown:
        if i is None:
            chain.append(f"      ... {len(mine) - 9} more frame(s) of your code ...")
            continue
        file, line, name = frames[i]
        text = linecache.getline(file, line).strip()
        chain.append(f"      {describe_location(file, line, name)}" + (f"\n        {text}" if text else ""))
    if len(chain) == 1:
        head = f"was blocked in {op} (torch.distributed), called at " if op else "was at "
        return head + chain[0].strip().replace("\n        ", "\n      ", 1)
    head = (f"was blocked in {op} (torch.distributed), called from your code (outermost first):" if op
            else "was in your code (outermost first):")
    return head + "\n" + "\n".join(chain)


def _filter_stack(stack: str, student_only: bool = False) -> str:
    """A faulthandler dump without the runner's frames; with `student_only`, where the rank was blocked."""
    if student_only:
        return _blocked_at(stack) or _filter_stack(stack)
    out = []
    for line in stack.splitlines():
        if __file__ in line and "_rank_main" in line:
            out.append(_RUNNER_MARK)
            continue
        if out and out[-1] == _RUNNER_MARK and line.startswith("  File "):
            continue
        out.append(line)
    return "\n".join(out)


def _print_outputs(workdir: str, world_size: int) -> None:
    for rank in range(world_size):
        text = _read_tail(os.path.join(workdir, f"rank{rank}.log"), 100_000)
        if text.strip():
            print(f"----- rank {rank} output -----")
            print(text.rstrip())
