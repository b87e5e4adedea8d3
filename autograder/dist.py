"""Run a function in N rank processes with torch.distributed initialised.

    from autograder.dist import run_distributed
    outs = run_distributed(fn, world_size=4, args=(x,))   # fn(rank, world_size, x)

Rank processes are forked on a Linux CPU (cheap: ~0.1 s for 4 ranks) and
spawned elsewhere (macOS, CUDA ranks), in which case the function and its
arguments are sent by value with cloudpickle, so functions and classes
defined in a notebook cell work on both paths.

Whatever happens in the ranks, the caller gets either the list of per-rank
return values or one `DistributedError` that names every failed rank with its
traceback, exit signal, or (on a deadlock) its Python stack. No rank process
outlives the call, and nothing a rank prints reaches the caller's stderr
(nbgrader scores a cell with any stderr output 0): rank output is captured to
files, shown on request (`show_output=True`) or in the error.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import io
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

__all__ = ["run_distributed", "DistributedError", "RankFailure", "default_start_method", "rank_device"]

# How long the survivors get to report their own error after the first rank fails.
_GRACE_AFTER_FAILURE_S = 1.5
# How long a rank gets to write its stack after SIGUSR1.
_STACK_DUMP_WAIT_S = 0.5
# Characters of each rank's captured output quoted in an error.
_OUTPUT_TAIL_CHARS = 3000


@dataclass
class RankFailure:
    rank: int
    kind: str  # "exception", "crash", "timeout", "killed-after-peer-failure"
    detail: str  # traceback, signal description, or stack
    output_tail: str = ""

    def describe(self) -> str:
        head = {
            "exception": f"rank {self.rank} raised an exception",
            "crash": f"rank {self.rank} died: {self.detail}",
            "timeout": f"rank {self.rank} did not finish in time (deadlock?); its Python stack:",
            "killed-after-peer-failure": f"rank {self.rank} was still running when another rank failed; its Python stack:",
        }[self.kind]
        parts = [head]
        if self.kind != "crash" and self.detail:
            parts.append(_indent(self.detail.rstrip()))
        if self.output_tail.strip():
            parts.append(f"  rank {self.rank} output (last {_OUTPUT_TAIL_CHARS} characters):")
            parts.append(_indent(self.output_tail.rstrip()))
        return "\n".join(parts)


class DistributedError(RuntimeError):
    """One or more ranks failed, crashed or hung. `.failures` lists them by rank."""

    def __init__(self, summary: str, failures: list[RankFailure]):
        self.summary = summary
        self.failures = failures
        super().__init__(f"{summary}\n\n{_describe_all(failures)}")


def _describe_all(failures: list[RankFailure]) -> str:
    """Each failure once; ranks that raised the very same traceback are shown together."""
    parts, shown = [], set()
    for f in failures:
        if f.rank in shown:
            continue
        same = [g for g in failures if g.kind == "exception" and f.kind == "exception" and g.detail == f.detail
                and not g.output_tail.strip() and not f.output_tail.strip()]
        if len(same) > 1:
            ranks = sorted(g.rank for g in same)
            shown.update(ranks)
            others = ", ".join(str(r) for r in ranks[1:])
            hint = ""
            if f.detail.rstrip().endswith("NotImplementedError"):
                hint = " (a function that is still a stub: implement it first)"
            parts.append(f"rank {ranks[0]} raised an exception, and rank(s) {others} the same one{hint}\n"
                         f"{_indent(f.detail.rstrip())}")
        else:
            shown.add(f.rank)
            parts.append(f.describe())
    return "\n\n".join(parts)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def default_start_method(backend: str = "gloo") -> str:
    """fork on a Linux CPU; spawn on macOS/Windows and for CUDA (never fork after CUDA init)."""
    if backend == "nccl" or not sys.platform.startswith("linux"):
        return "spawn"
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


def _spawn_main() -> None:
    """Entry point of a spawned rank: `python -c ... WORKDIR RANK WORLD_SIZE BACKEND TIMEOUT CHECK`."""
    workdir, rank, world_size, backend, timeout, check = sys.argv[1:7]
    _rank_main(None, int(rank), int(world_size), workdir, backend, float(timeout), by_value=True,
               check_collectives=check == "1")


def _rank_main(payload, rank: int, world_size: int, workdir: str, backend: str, timeout: float,
               by_value: bool, check_collectives: bool = True) -> None:
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
    try:
        import torch
        import torch.distributed as dist

        # A forked child hangs in its first multi-threaded op if the parent had
        # already used its OpenMP pool (spec 6); one thread per rank avoids it.
        torch.set_num_threads(1)
        if by_value:
            import cloudpickle

            with open(os.path.join(workdir, "payload.pkl"), "rb") as f:
                parent_path, blob = cloudpickle.load(f)
            sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
            fn, args = cloudpickle.loads(blob)
        else:
            fn, args = payload
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        if check_collectives:
            # Fingerprint every collective across ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL):
            # a mismatch raises "Detected mismatch between collectives on ranks ..." on
            # the spot instead of aborting the rank or returning wrong numbers (spec 6).
            dist.set_debug_level(dist.DebugLevel.DETAIL)
        store = dist.FileStore(os.path.join(workdir, "store"), world_size)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout + 5.0),
        )
        def barrier():
            if backend == "nccl":
                dist.barrier(device_ids=[torch.cuda.current_device()])
            else:
                dist.barrier()

        try:
            # Every rank is connected before any runs the program: a rank that
            # fails at once must not break a peer's rendezvous.
            barrier()
            result = fn(rank, world_size, *args)  # the rank program
            # No rank may close its connections while a peer is still using
            # them (a fast rank exiting early makes a slow one fail with
            # "Connection closed by peer"): meet once more before tearing down.
            barrier()
        finally:
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
    except BaseException as exc:  # noqa: BLE001 - report everything, including SystemExit
        tb = _format_user_traceback(exc)
        try:
            with open(os.path.join(workdir, f"rank{rank}.error"), "w") as f:
                f.write(tb)
        except OSError:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(status)


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

    def __init__(self, rank, method, payload, world_size, workdir, backend, timeout, check_collectives):
        self.rank = rank
        if method == "fork":
            ctx = multiprocessing.get_context("fork")
            self._proc = ctx.Process(
                target=_rank_main, name=f"rank{rank}", daemon=True,
                args=(payload, rank, world_size, workdir, backend, timeout, False, check_collectives),
            )
            self._proc.start()
            self._popen = None
            self.pid = self._proc.pid
        else:
            # A fresh interpreter that never imports the caller's __main__ (a
            # script without a main guard, or a notebook kernel, both work):
            # the rank function arrives by value in payload.pkl.
            code = "from autograder.dist import _spawn_main; _spawn_main()"
            self._proc = None
            self._popen = subprocess.Popen(
                [sys.executable, "-c", code, workdir, str(rank), str(world_size), backend, str(timeout),
                 "1" if check_collectives else "0"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            self.pid = self._popen.pid

    @property
    def exitcode(self):
        if self._proc is not None:
            return self._proc.exitcode
        return self._popen.poll()

    def kill(self):
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
    FileStore rendezvous per call). `timeout` (seconds) bounds the whole run:
    past it every rank's Python stack is collected and all ranks are killed.
    Raises `DistributedError` when any rank raises, crashes or hangs.
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

    workdir = tempfile.mkdtemp(prefix="autograder-dist-")
    procs: list[_RankProcess] = []
    try:
        payload = (fn, tuple(args))
        if method != "fork":
            import cloudpickle

            with open(os.path.join(workdir, "payload.pkl"), "wb") as f:
                cloudpickle.dump((list(sys.path), cloudpickle.dumps(payload)), f)
            payload = None
        # Flush so buffered parent output is not duplicated into forked children.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        t0 = time.monotonic()
        for rank in range(world_size):
            procs.append(_RankProcess(rank, method, payload, world_size, workdir, backend, timeout,
                                      check_collectives))
        try:
            return _supervise(procs, workdir, timeout, show_output)
        finally:
            from autograder.report import note_run

            note_run(world_size, time.monotonic() - t0)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join(timeout=5)
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(procs: list[_RankProcess], workdir: str, timeout: float, show_output: bool) -> list:
    world_size = len(procs)
    deadline = time.monotonic() + timeout
    first_failure_at = None
    pending = set(range(world_size))
    failed: set[int] = set()
    exit_order: dict[int, int] = {}
    poll_s = 0.002
    while pending:
        now = time.monotonic()
        limit = deadline if first_failure_at is None else min(deadline, first_failure_at + _GRACE_AFTER_FAILURE_S)
        if now >= limit:
            break
        for rank in sorted(pending):
            code = procs[rank].exitcode
            if code is None:
                continue
            pending.discard(rank)
            exit_order[rank] = len(exit_order)
            if code != 0:
                failed.add(rank)
                if first_failure_at is None:
                    first_failure_at = time.monotonic()
        if pending:
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 0.02)

    stuck = sorted(pending)
    if stuck:
        # Ask the stuck ranks for their Python stacks, then kill them.
        for rank in stuck:
            try:
                os.kill(procs[rank].pid, signal.SIGUSR1)
            except (ProcessLookupError, OSError):
                pass
        time.sleep(_STACK_DUMP_WAIT_S)
        for rank in stuck:
            procs[rank].kill()
        for rank in stuck:
            procs[rank].join(timeout=5)

    def log(rank):
        return os.path.join(workdir, f"rank{rank}.log")

    if not failed and not stuck:
        results = []
        import torch

        for rank in range(world_size):
            with open(os.path.join(workdir, f"rank{rank}.result"), "rb") as f:
                results.append(torch.load(io.BytesIO(f.read()), weights_only=False))
        if show_output:
            _print_outputs(workdir, world_size)
        return results

    failures: list[RankFailure] = []
    for rank in range(world_size):
        if rank in failed:
            err = _read(os.path.join(workdir, f"rank{rank}.error"))
            if err:
                failures.append(RankFailure(rank, "exception", err, _read_tail(log(rank))))
            else:
                detail = _describe_exit(procs[rank].exitcode)
                stack = _read(os.path.join(workdir, f"rank{rank}.stack")).strip()
                if stack:
                    detail += "\n" + _filter_stack(stack)
                failures.append(RankFailure(rank, "crash", detail, _read_tail(log(rank))))
        elif rank in stuck:
            kind = "timeout" if first_failure_at is None else "killed-after-peer-failure"
            stack = _read(os.path.join(workdir, f"rank{rank}.stack")).strip() or "(no stack was written)"
            failures.append(RankFailure(rank, kind, _filter_stack(stack), _read_tail(log(rank))))

    # Order: root causes first. A rank whose error is only a consequence of a
    # peer's death (connection reset, closed pipe) is listed after the others.
    def secondary(f: RankFailure) -> bool:
        return f.kind == "exception" and any(
            s in f.detail for s in ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
                                    "failed to pass monitoredBarrier")
        )

    failures.sort(key=lambda f: (f.kind in ("timeout", "killed-after-peer-failure"), secondary(f),
                                 exit_order.get(f.rank, world_size), f.rank))
    names = ", ".join(str(f.rank) for f in failures)
    if first_failure_at is None:
        summary = (f"run_distributed: timed out after {timeout:g} s with rank(s) {names} still running "
                   f"(world size {world_size}). A deadlock? Each rank's stack is below; every rank was killed.")
    else:
        summary = f"run_distributed: rank(s) {names} failed (world size {world_size})."
    if show_output:
        _print_outputs(workdir, world_size)
    raise DistributedError(summary, failures)


def _filter_stack(stack: str) -> str:
    """Cut a faulthandler dump below the rank program: the runner's and multiprocessing's frames."""
    out = []
    for line in stack.splitlines():
        if __file__ in line and "_rank_main" in line:
            out.append("  (rank started by autograder.dist.run_distributed)")
            continue
        if out and out[-1] == "  (rank started by autograder.dist.run_distributed)" and line.startswith("  File "):
            continue
        out.append(line)
    return "\n".join(out)


def _print_outputs(workdir: str, world_size: int) -> None:
    for rank in range(world_size):
        text = _read_tail(os.path.join(workdir, f"rank{rank}.log"), 100_000)
        if text.strip():
            print(f"----- rank {rank} output -----")
            print(text.rstrip())
