"""A sandbox per submission: bubblewrap for isolation, cgroups (or resource limits) for size.

    box = Sandbox(course_root, workdir, memory_bytes=4 * 2**30, max_pids=512)
    proc = box.popen([python, "-m", ...], stdout=subprocess.PIPE)
    ...
    box.close()          # every process of the submission is killed, the cgroups removed

Inside: the whole file system read-only, a private /tmp, no network (loopback
only, which gloo needs), its own PID namespace (killing the sandbox kills
everything in it, including processes that left their process group), and
no view of the course root: an empty directory is mounted over it, with only
the Python environment and the `autograder` package put back (read-only),
and the submission's own work directory (read-write). So `source/`,
`solutions/`, `tests/`, `gradebook.db` and the other students' submissions
are not there to read.

Limits: a memory and a process-count limit for all the submission's
processes together (cgroup v1 `memory` and `pids` controllers, or v2), and a
per-process address-space limit where cgroups are not writable.

Without bubblewrap the grading command refuses to run unless told
`--no-sandbox` (and then says so on every run): see the README's threat model.
"""

from __future__ import annotations

import itertools
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

__all__ = ["Sandbox", "SandboxUnavailable", "sandbox_status"]

_CG1 = "/sys/fs/cgroup"
_counter = itertools.count()


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this machine."""


def _bwrap() -> str | None:
    return shutil.which("bwrap")


_PROBE: dict = {}


def sandbox_status() -> tuple[bool, str]:
    """(usable, why): whether bubblewrap can run a command here (probed once)."""
    if "result" in _PROBE:
        return _PROBE["result"]
    exe = _bwrap()
    if exe is None:
        result = (False, "bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    else:
        try:
            proc = subprocess.run([exe, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--dev", "/dev",
                                   "--proc", "/proc", "--die-with-parent", "true"],
                                  capture_output=True, text=True, timeout=30)
            result = (proc.returncode == 0, "bubblewrap works" if proc.returncode == 0
                      else f"bubblewrap cannot create its namespaces here: {proc.stderr.strip()[:300]}")
        except (OSError, subprocess.SubprocessError) as exc:
            result = (False, f"bubblewrap failed to start: {exc}")
    _PROBE["result"] = result
    return result


def _under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


class _Cgroups:
    """One cgroup per submission in each controller we can write (v1 memory + pids, or a v2 leaf)."""

    def __init__(self, name: str, memory_bytes: int | None, max_pids: int | None):
        self.dirs: list[str] = []
        v2 = os.path.exists(os.path.join(_CG1, "cgroup.controllers"))
        candidates = [(_CG1, {"memory.max": memory_bytes, "pids.max": max_pids})] if v2 else [
            (os.path.join(_CG1, "memory"), {"memory.limit_in_bytes": memory_bytes}),
            (os.path.join(_CG1, "pids"), {"pids.max": max_pids}),
        ]
        for base, files in candidates:
            path = os.path.join(base, "autograder", name)
            try:
                os.makedirs(path, exist_ok=True)
                for fname, value in files.items():
                    if value is not None:
                        with open(os.path.join(path, fname), "w") as f:
                            f.write(str(value))
                if v2 is False and "memory.limit_in_bytes" in files and memory_bytes is not None:
                    try:  # no swap beyond the limit, where the kernel accounts it
                        with open(os.path.join(path, "memory.memsw.limit_in_bytes"), "w") as f:
                            f.write(str(memory_bytes))
                    except OSError:
                        pass
                self.dirs.append(path)
            except OSError:
                continue

    @property
    def active(self) -> bool:
        return bool(self.dirs)

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    out |= {int(x) for x in f.read().split()}
            except OSError:
                pass
        return out

    def oom_killed(self) -> bool:
        for d in self.dirs:
            for fname in ("memory.failcnt", "memory.events"):
                try:
                    with open(os.path.join(d, fname)) as f:
                        text = f.read()
                except OSError:
                    continue
                if fname == "memory.failcnt" and text.strip() not in ("", "0"):
                    return True
                if fname == "memory.events" and any(line.startswith("oom_kill ") and not line.endswith(" 0")
                                                    for line in text.splitlines()):
                    return True
        return False

    def kill_all(self) -> None:
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(20):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.05)


class Sandbox:
    """Run one submission's processes isolated (bubblewrap) and limited (cgroups); see the module docstring.

    `isolate=False` (the grading command's `--no-sandbox`) keeps the limits and
    the kill-everything-afterwards, without the namespaces.
    """

    def __init__(self, course_root: str, workdir: str, *, isolate: bool = True,
                 memory_bytes: int | None = 4 * 2**30, max_pids: int | None = 512,
                 extra_ro: tuple = (), extra_rw: tuple = ()):
        self.root = os.path.realpath(course_root)
        self.workdir = os.path.realpath(workdir)
        self.isolate = isolate
        self.memory_bytes = memory_bytes
        if isolate:
            ok, why = sandbox_status()
            if not ok:
                raise SandboxUnavailable(why)
        self.cgroups = _Cgroups(f"{os.getpid()}-{next(_counter)}-{os.path.basename(self.workdir)}",
                                memory_bytes, max_pids)
        self.extra_ro = tuple(extra_ro)
        self.extra_rw = tuple(os.path.realpath(p) for p in extra_rw)  # more folders the submission may write
        self.procs: list[subprocess.Popen] = []

    # the paths put back, read-only, over what the sandbox hides: the course root and /tmp (a checkout or a
    # virtual environment under /tmp, as in a CI clone, would otherwise vanish under the private /tmp)
    def _ro_paths(self) -> list[str]:
        import autograder

        keep = [sys.prefix, os.path.dirname(os.path.abspath(autograder.__file__)), *self.extra_ro]
        keep = {os.path.realpath(p) for p in keep}
        return sorted(p for p in keep if _under(p, self.root) or _under(p, "/tmp"))

    def _links(self) -> list[tuple[str, str]]:
        """A symlink under the course root on the way to this interpreter (`.venv -> /opt/venv`, a node-local
        environment beside a shared course): made again inside, where the course root is an empty folder."""
        out = []
        prefix = os.path.abspath(sys.prefix)
        if prefix.startswith(self.root + os.sep):
            parts = os.path.relpath(prefix, self.root).split(os.sep)
            for i in range(1, len(parts) + 1):
                path = os.path.join(self.root, *parts[:i])
                if os.path.islink(path):
                    out.append((path, os.path.realpath(path)))
                    break
        return out

    def argv(self, cmd: list[str], cwd: str | None = None) -> list[str]:
        if not self.isolate:
            return list(cmd)
        args = [_bwrap(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
                "--new-session", "--tmpfs", self.root]
        for p in self._ro_paths():
            args += ["--ro-bind", p, p]
        for link, target in self._links():
            args += ["--symlink", target, link]
        for p in (self.workdir, *self.extra_rw):
            args += ["--bind", p, p]
        args += ["--chdir", cwd or self.workdir, "--"]
        return args + list(cmd)

    def env(self, base: dict | None = None) -> dict:
        env = dict(os.environ if base is None else base)
        env["TMPDIR"] = os.path.join(self.workdir, "tmp")
        os.makedirs(env["TMPDIR"], exist_ok=True)
        env["HOME"] = self.workdir
        if self.isolate:
            # imports inside come from the environment and the autograder package only
            pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__import__("autograder").__file__)))
            env["PYTHONPATH"] = pkg_parent
        return env

    def popen(self, cmd: list[str], *, env: dict | None = None, cwd: str | None = None, **kwargs):
        cgroup_dirs, limit = self.cgroups.dirs, None if self.cgroups.active else self.memory_bytes

        def enter():
            _enter_limits(cgroup_dirs, limit)

        proc = subprocess.Popen(self.argv(cmd, cwd), env=self.env(env), cwd=cwd or self.workdir,
                                preexec_fn=enter, **kwargs)
        self.procs.append(proc)
        return proc

    def command(self, cmd: list[str], *, env: dict | None = None, cwd: str | None = None) -> list[str]:
        """An argv that runs `cmd` in this sandbox when started by code we do not control (jupyter_client
        starting a kernel): a short Python shim does what `popen` does before exec (its own session, the
        cgroups, the file-size and core limits, the environment), then execs bubblewrap (or `cmd`)."""
        spec = {"cgroups": self.cgroups.dirs, "memory": None if self.cgroups.active else self.memory_bytes,
                "env": self.env(env), "argv": self.argv(cmd, cwd), "cwd": cwd or self.workdir}
        n = next(_counter)
        spec["log"] = os.path.join(self.workdir, f"launch-{n}.log")
        path = os.path.join(self.workdir, f"launch-{n}.json")
        import json

        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__import__("autograder").__file__)))
        return [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {pkg_parent!r}); "
                "from autograder.sandbox import _launch; _launch(sys.argv[1])", path]

    def kill_all(self) -> None:
        """Kill every process this sandbox started (the ones `command` launched included, via the cgroups)."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.cgroups.kill_all()

    def run(self, cmd: list[str], *, timeout: float, env: dict | None = None, cwd: str | None = None,
            output_limit: int = 200_000) -> tuple[int | None, str]:
        """Run to completion within `timeout` s; (exit status or None on timeout, the output's tail)."""
        log_path = os.path.join(self.workdir, f"run-{len(self.procs)}.log")
        with open(log_path, "wb") as log:
            proc = self.popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
            self.kill(proc)
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - output_limit))
            tail = f.read().decode("utf-8", "replace")
        return code, tail

    def kill(self, proc: subprocess.Popen) -> None:
        """Kill `proc` and everything it started (its session, and everything in the cgroups)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.cgroups.kill_all()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    @property
    def out_of_memory(self) -> bool:
        return self.cgroups.oom_killed()

    def close(self) -> None:
        for p in self.procs:
            self.kill(p)
        self.cgroups.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _enter_limits(cgroup_dirs: list[str], memory_bytes: int | None) -> None:
    """In a new process, before it execs the submission's command: a session of its own, at most 1 GiB per
    file (Python gets EFBIG, an OSError: SIGXFSZ is ignored), no core dumps, and the submission's cgroups
    (its descendants follow) or, without cgroups, a bound on its address space (`memory_bytes`)."""
    try:
        os.setsid()
    except OSError:  # already a session leader (jupyter_client starts kernels in a new session)
        pass
    for limit_name, value in ((resource.RLIMIT_FSIZE, 2**30), (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(limit_name, (value, value))
        except (ValueError, OSError):
            pass
    for d in cgroup_dirs:
        try:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
    if memory_bytes is not None:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes * 2, memory_bytes * 2))
        except (ValueError, OSError):
            pass


def _launch(spec_path: str) -> None:
    """The shim of `Sandbox.command` (runs in the new process, before exec): see there."""
    import json

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    _enter_limits(spec["cgroups"], spec["memory"])
    os.chdir(spec["cwd"])
    if spec.get("log"):  # what the process prints is not the grader's output
        fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
