"""The sandbox's start paid once per grading worker: a fork server, and each submission forked from it.

    server = ForkServer(course_root)                     # per worker: bubblewrap, Python, torch imported once
    box = Sandbox(course_root, server.new_inputs(), server=server)      # per submission: its cgroups
    proc = box.start_zygote(inputs, workdir, output_limit, env)         # forked, isolated, then the zygote

Every submission used to start its own sandbox: bubblewrap, a Python
interpreter, `import torch` and `torch._dynamo` (about 2.3 CPU-seconds of the
5.4 a median submission's sandbox used), before the first of the student's
cells ran. The fork server is a process in a sandbox of its own, built like
a submission's (`Sandbox`: the same read-only file system from an empty root,
its own process, network, IPC and host-name namespaces, an unprivileged user,
no capabilities), that imports what a zygote imports and then only forks.
It never runs a student's code and never sees a notebook: it is told the
folder the grader wrote and the two ends of the channel, and nothing else.

Each fork (`_child`) becomes a sandbox of its own before anything of the
submission runs:
- the grader moves it into the submission's cgroups (memory, processes, CPU
  accounting) while it waits for one byte on its channel;
- a new user namespace (uid 1000, mapped to the server's one user), and in it
  new mount, IPC, network (the loopback up), host-name and cgroup
  namespaces; a private `/tmp` and `/dev/shm` mounted over the server's
  (memory file systems, the same sizes as a fresh sandbox's): nothing one
  submission wrote is there for the next;
- every capability dropped (bounding, ambient, effective, permitted,
  inheritable), `no_new_privs`, and the course's seccomp filter
  (`sandbox.seccomp_program`) installed last, as bubblewrap's `--seccomp`
  does: no mount, no new namespace, no ptrace after that.
The server itself is not dumpable (no process of the same user can read or
write its memory through /proc), holds no file but its channel to the
grader, and its own `/tmp` and `/dev/shm` are 1 MiB (each fork mounts its
own). A submission that kills it (the same user on the host) only loses its
own run: the server is started again for the next one. `ForkServer` probes a
fork with the same probe as a fresh sandbox (`sandbox.probe_problems`) before
it is used, and the grader falls back to a fresh sandbox per submission
where the server cannot start or fails its probe (`AUTOGRADER_FORK_SERVER=0`
asks for that).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

from autograder.grading.sandbox import ForkServerUnavailable  # (in sandbox: trusted catches it too)
from autograder.grading.trusted import ZYGOTE_ENV  # (the server starts as a zygote would: every fork inherits it)

__all__ = ["ForkServer", "ForkServerUnavailable", "ForkedProcess"]

SERVER_SCRATCH_BYTES = 1 << 20  # the server's own /tmp and /dev/shm: it writes nothing; each fork mounts its own


# ---------------------------------------------------------------------------
# In the sandbox: the server and each fork
# ---------------------------------------------------------------------------

def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return libc


_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 22, 2, 47, 4
_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 32, 4096, 0x4000, 1 << 18


def _check(rc: int, what: str) -> None:
    import ctypes

    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _isolate(libc, program: bytes, scratch_bytes: int, shm_bytes: int, keep: list[str],
             links: list) -> None:
    """This fork's own namespaces, scratch space, no capabilities and the seccomp filter (see the docstring).
    What the server's sandbox binds read-only under /tmp or /dev/shm (`keep`: a course, a virtual environment
    or the grader's inputs in a temp folder; bubblewrap binds them over its /tmp too) is bound again where it
    was, read-only, with the folders on the way to it, and the symbolic links `links` made again."""
    import ctypes
    import fcntl
    import struct

    from autograder.grading.sandbox import SANDBOX_UID

    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWNET | _CLONE_NEWUTS
                        | _CLONE_NEWCGROUP), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{SANDBOX_UID} {uid} 1")
    _write("/proc/self/gid_map", f"{SANDBOX_UID} {gid} 1")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making the mounts private")
    held, tops = [], set()
    for path in keep:  # (opened before the new /tmp hides them)
        for top in ("/tmp", "/dev/shm"):
            if path.startswith(top + "/"):
                held.append((path, os.open(path, os.O_PATH)))
                tops.add(os.path.join(top, path[len(top) + 1:].split("/")[0]))
    for where, size in ((b"/tmp", scratch_bytes), (b"/dev/shm", shm_bytes)):
        _check(libc.mount(b"tmpfs", where, b"tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={size}".encode()),
               f"a private {where.decode()}")
    for path, fd in held:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.makedirs(path, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
            open(path, "a").close()  # noqa: SIM115 - a file to bind over
        _check(libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND, None), f"binding {path}")
        _check(libc.mount(None, path.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                          None), f"{path} read-only")
        os.close(fd)
    for link, target in links:
        if any(link.startswith(top + "/") for top in ("/tmp", "/dev/shm")):
            os.makedirs(os.path.dirname(link), 0o755, exist_ok=True)
            os.symlink(target, link)
    for top in sorted(tops):  # the folders made on the way read-only too (a mount point cannot be renamed)
        _check(libc.mount(top.encode(), top.encode(), None, _MS_BIND | _MS_REC, None), f"binding {top}")
        _check(libc.mount(None, top.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                          None), f"{top} read-only")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the loopback up (gloo needs it)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0))[:18])[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
    _check(libc.sethostname(b"sandbox", 7), "sethostname")
    # no capability left: the bounding set, the ambient set, then effective, permitted and inheritable
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing the ambient capabilities")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    _check(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")  # _LINUX_CAPABILITY_VERSION_3
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(program, len(program))
    fprog = Program(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "the seccomp filter")


def _child(control: socket.socket, request: dict, fds: list[int], program: bytes, server_pid: int) -> None:
    """A fork: the channel on fds 0 and 1, nothing else open; wait for the grader's byte (the cgroups are
    set), isolate, then run the zygote (or the probe). Never returns."""
    code, started = 1, False
    try:
        control.detach()  # (its descriptor is closed below with the others)
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
            if fd > 2:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if os.read(0, 1) != b"G":  # the grader gave up on this fork
            os._exit(1)
        libc = _libc()
        _check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
        if os.getppid() != server_pid:
            os._exit(1)
        os.setsid()
        # dumpable again (the server is not): its own /proc files its own, to write its user namespace's maps,
        # and the submission's processes as a fresh sandbox's are
        _check(libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
        _isolate(libc, program, request["scratch_bytes"], request["shm_bytes"], request["keep"], request["links"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir("/tmp")
        if request["op"] == "probe":
            from autograder.grading import sandbox

            sys.argv = ["-c", *request["argv"]]
            exec(compile(sandbox._PROBE_CODE, "<probe>", "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            from autograder.grading.trusted import _zygote_main

            started = True
            _zygote_main(request["inputs"], request["workdir"], int(request["output_limit"]))
        code = 0
    except BaseException as exc:  # noqa: BLE001 - said on the channel (the probe reads it), then gone
        text = f"{type(exc).__name__}: {exc}"[:2000]
        with contextlib.suppress(Exception):  # (on 1, the channel, until the zygote puts its log there)
            if request.get("op") != "zygote":
                os.write(1, f"\nfork server: {text}\n".encode())
            elif not started:  # the fork, not the submission: the grader starts a fresh sandbox instead
                from autograder.grading.trusted import send_frame

                send_frame(1, {"fork_error": text})
            # (an error of the zygote itself: gone, as a fresh sandbox's zygote would be)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(code)


def _state() -> dict:
    """What of the server another process of its user could change, and every fork would inherit: its
    resource limits, priority, scheduling policy and CPUs (a submission's processes run as the same user on
    the host; signals are the grader's to undo: it sends SIGCONT before each fork, and starts a dead server
    again)."""
    import resource

    out = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")}
    out.update(priority=os.getpriority(os.PRIO_PROCESS, 0), policy=os.sched_getscheduler(0),
               sched_priority=os.sched_getparam(0).sched_priority, cpus=sorted(os.sched_getaffinity(0)))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def _server_main(control_fd: int) -> None:
    """The server, in its sandbox: import what a zygote imports, then fork on request until the grader
    closes the channel."""
    libc = _libc()
    _check(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
    control = socket.socket(fileno=control_fd)
    try:
        import torch  # noqa: F401 - what every zygote imports before the student's cells (trusted._zygote_main)

        import autograder.runtime.agreement  # noqa: F401
        from autograder.grading import integrity, trusted  # noqa: F401
        from autograder.grading.sandbox import seccomp_program

        program = seccomp_program()
    except Exception as exc:  # noqa: BLE001 - said to the grader, which then grades without the server
        control.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        return
    control.send(json.dumps({"ready": True}).encode())
    me, pristine = os.getpid(), _state()
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not select.select([control], [], [], 0.5)[0]:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        except OSError:
            return
        if not msg:
            return  # the grader closed the channel
        try:
            request = json.loads(msg)
            if len(fds) != 2:
                raise ValueError(f"{len(fds)} descriptors")
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": f"malformed request ({exc})"}).encode())
            continue
        changed = sorted(k for k, v in _state().items() if pristine.get(k) != v)
        if changed:  # a submission (the same user) changed what every fork would inherit: stop, to be started anew
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": f"the fork server's {', '.join(changed)} changed"}).encode())
            return
        pid = os.fork()
        if pid == 0:
            _child(control, request, fds, program, me)
        for fd in fds:
            os.close(fd)
        control.send(json.dumps({"pid": pid}).encode())


# ---------------------------------------------------------------------------
# In the grader
# ---------------------------------------------------------------------------

def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat): tells it from a later process of the same pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _nspid(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


class ForkedProcess:
    """A fork of the server, as the grader holds it: what ZygoteClient uses of a Popen (pid, stdin, stdout,
    poll, wait)."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int):
        self.pid = pid
        self.args = ["fork server", pid]
        self._started = _start_time(pid)
        self.stdin = open(stdin_fd, "wb", buffering=0)  # noqa: SIM115 - closed by the client
        self.stdout = open(stdout_fd, "rb", buffering=0)  # noqa: SIM115
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            from autograder.grading.sandbox import _gone

            if _gone(self.pid) or _start_time(self.pid) != self._started:
                self.returncode = -signal.SIGKILL  # (the server reaps it: the status is not the grader's to read)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


class ForkServer:
    """One grading worker's fork server (see the module docstring)."""

    def __init__(self, course_root: str, *, memory_bytes: int | None = 4 * 2**30, max_pids: int | None = 512,
                 start_timeout: float = 600.0):
        from autograder.grading.sandbox import Sandbox

        self.root = os.path.realpath(course_root)
        self.inputs_root = tempfile.mkdtemp(prefix="autograder-server-")
        self._count = 0
        self.broken = False  # a fork failed: not used again (classrun starts another)
        self.proc = None
        self.sock = None
        self.box = Sandbox(self.root, self.inputs_root, memory_bytes=memory_bytes, max_pids=max_pids,
                           scratch_bytes=SERVER_SCRATCH_BYTES, shm_bytes=SERVER_SCRATCH_BYTES, runs_server=True)
        try:
            if not self.box.cgroups.active:
                raise ForkServerUnavailable("no cgroups to put each fork in (the server needs them to account "
                                            "each submission's processes apart)")
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.sock = ours
            self._log = tempfile.TemporaryFile()
            try:
                self.proc = self.box.popen(
                    [sys.executable, "-c", "import sys; from autograder.grading.forkserver import _server_main; "
                     "_server_main(int(sys.argv[1]))", str(theirs.fileno())],
                    env=ZYGOTE_ENV, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                    stdout=self._log, stderr=self._log)
            finally:
                theirs.close()
            said = self._receive(start_timeout)
            if not said.get("ready"):
                raise ForkServerUnavailable(f"the fork server did not start: {said.get('error') or said}")
            self._probe()
        except BaseException:
            self.close()
            raise

    # -- the channel ------------------------------------------------------------------
    def _receive(self, timeout: float) -> dict:
        if not select.select([self.sock], [], [], timeout)[0]:
            raise ForkServerUnavailable(f"the fork server did not answer within {timeout:g} s")
        msg = self.sock.recv(1 << 16)
        if not msg:
            self._log.seek(0)
            said = self._log.read().decode("utf-8", "replace").strip()[-600:]
            raise ForkServerUnavailable("the fork server exited" + (f": {said}" if said else ""))
        return json.loads(msg)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def new_inputs(self, name: str = "") -> str:
        """A fresh folder for one submission's inputs, where the server's sandbox sees it (`name`: a student's,
        in the folder's name and so in the submission's cgroups' names, as a fresh sandbox's inputs are)."""
        self._count += 1
        path = os.path.join(self.inputs_root, f"{self._count}-{name}" if name else str(self._count))
        os.mkdir(path, 0o755)
        return path

    def fork(self, request: dict, cgroup_dirs: list[str] | None, timeout: float = 60.0) -> ForkedProcess:
        """Fork the server for `request` (op "zygote" or "probe"), put the fork in `cgroup_dirs`, let it go."""
        from autograder.grading.sandbox import SCRATCH_BYTES, SHM_BYTES

        if not self.alive():
            raise ForkServerUnavailable("the fork server is not running")
        for pid in self.box.cgroups.pids():  # a submission may have stopped it (the same user): running again
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        binds = self.box._ro_paths()
        request = {"scratch_bytes": SCRATCH_BYTES, "shm_bytes": SHM_BYTES, "keep": binds,
                   "links": self.box._links(binds), **request}
        r_req, w_req = os.pipe()
        r_rep, w_rep = os.pipe()
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode()], [r_req, w_rep])
        except OSError as exc:
            for fd in (r_req, w_req, r_rep, w_rep):
                os.close(fd)
            raise ForkServerUnavailable(f"the fork server's channel is closed ({exc.strerror})") from None
        os.close(r_req)
        os.close(w_rep)
        proc = None
        try:
            said = self._receive(timeout)
            if "pid" not in said:
                raise ForkServerUnavailable(f"the fork server refused: {said.get('error') or said}")
            host = self._host_pid(int(said["pid"]))
            proc = ForkedProcess(host, w_req, r_rep)
            for d in cgroup_dirs or []:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(host))
            os.write(w_req, b"G")
            return proc
        except BaseException:
            self.broken = True
            if proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.stdin.close()
                proc.stdout.close()
            else:
                os.close(w_req)
                os.close(r_rep)
            raise

    def _host_pid(self, nspid: int) -> int:
        """The grader's pid of the server's child `nspid` (its pid in the server's namespace)."""
        for _ in range(100):
            for pid in self.box.cgroups.pids():
                ids = _nspid(pid)
                if len(ids) > 1 and ids[-1] == nspid and ids[0] == pid:
                    return pid
            time.sleep(0.01)
        raise ForkServerUnavailable(f"the fork server's child {nspid} is not in its cgroup")

    def _probe(self) -> None:
        """A fork probed as a fresh sandbox is (`sandbox.probe`): refused unless it is as safe."""
        from autograder.grading import sandbox

        argv, note = sandbox.probe_argv(self.root)
        proc = self.fork({"op": "probe", "argv": argv, "env": self.box.env(ZYGOTE_ENV)}, None)
        out = b""
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if not select.select([proc.stdout], [], [], 1.0)[0]:
                    continue
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                out += chunk
        finally:
            proc.stdin.close()
            proc.stdout.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        text = out.decode("utf-8", "replace")
        facts = sandbox.probe_facts(text, note)
        if facts is None:
            raise ForkServerUnavailable(f"a fork of the server could not be probed: {text.strip()[-400:]}")
        problems = sandbox.probe_problems(facts)
        if problems:
            raise ForkServerUnavailable("a fork of the server is not safe to grade in: " + "; ".join(problems))

    def close(self) -> None:
        """Stop the server (its forks, each in its submission's cgroups, are the submissions' to stop)."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
        if self.proc is not None:
            self.box.kill(self.proc)
            self.proc = None
        self.box.close()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.inputs_root, ignore_errors=True)

