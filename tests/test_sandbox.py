"""The grading sandbox, probed from inside: no privileges, an empty root, a size-limited scratch space.

    .venv/bin/python -m pytest -q tests/test_sandbox.py

Every submission's processes run in `autograder.grading.sandbox.Sandbox`. These
tests start real sandboxes (bubblewrap) and look from inside and from the
host: the submission is an unprivileged user with no capability, `mount`
and new user namespaces fail, nothing of the course root or of any other
folder of the host is there, and the grading command refuses to start when
a probe finds otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from course import ROOT
from grading_course import needs_sandbox

pytestmark = [needs_sandbox, pytest.mark.timeout(300)]


def _inside(code: str, argv: tuple = (), timeout: float = 120, **kwargs) -> str:
    from autograder.grading.sandbox import Sandbox

    with tempfile.TemporaryDirectory() as inputs, Sandbox(ROOT, inputs, **kwargs) as box:
        status, out = box.run([sys.executable, "-c", code, *argv], timeout=timeout)
    assert status == 0, out
    return out


def test_the_probe_finds_no_privileges_inside():
    from autograder.grading.sandbox import probe, probe_problems

    facts = probe(ROOT)
    assert probe_problems(facts) == [], facts
    assert facts["uid"] != 0 and facts["euid"] != 0
    assert int(facts["CapEff"], 16) == 0 and int(facts["CapPrm"], 16) == 0
    assert facts["NoNewPrivs"] == "1"
    assert facts["mount_errno"] == 1  # EPERM: mount is refused
    assert facts["userns_errno"] != 0  # no user namespace of its own to gain capabilities in
    assert facts["visible"] == []  # source/, solutions/, tests/, submitted/, the gradebook: not there
    assert facts["Seccomp"] == "2"  # the course's seccomp filter (one more than the grader's own)
    assert int(facts["Seccomp_filters"]) == int(facts["grader_seccomp_filters"]) + 1
    assert facts["seccomp_errnos"] and set(facts["seccomp_errnos"].values()) == {1}, facts["seccomp_errnos"]


def test_mount_and_a_nested_user_namespace_fail_from_a_shell_too():
    out = _inside("import subprocess\n"
                  "for cmd in (['mount', '--bind', '/', '/tmp'], ['unshare', '-Urm', 'true'], ['id', '-u']):\n"
                  "    p = subprocess.run(cmd, capture_output=True, text=True)\n"
                  "    print(cmd[0], p.returncode, (p.stdout + p.stderr).strip().splitlines()[-1:])\n")
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert not lines["mount"].startswith("0 "), out
    assert not lines["unshare"].startswith("0 "), out
    assert lines["id"].startswith("0 ['1000']"), out


def test_on_the_host_the_submission_is_not_root():
    """When the grader is root, the sandboxed processes belong to an unprivileged host user (nobody)."""
    from autograder.grading.sandbox import Sandbox

    if os.geteuid() != 0:
        pytest.skip("the grader is not root here: the submission runs as the grader's own user")
    with tempfile.TemporaryDirectory() as inputs, Sandbox(ROOT, inputs) as box:
        proc = box.popen([sys.executable, "-c", "import time; time.sleep(30)"])
        uids = {}
        deadline = time.monotonic() + 20
        mine = f"{sys.executable} -c import time; time.sleep(30)"
        while time.monotonic() < deadline and not any(c.startswith(mine) for c, _ in uids.values()):
            for pid in box.cgroups.pids() if box.cgroups.active else []:
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
                    uid = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status")
                               if line.startswith("Uid:"))
                except (OSError, StopIteration):
                    continue
                uids[pid] = (cmd, uid)
            time.sleep(0.1)
        box.kill(proc)
    if not uids:
        pytest.skip("no writable cgroups here to find the sandbox's processes by")
    student = [uid for cmd, uid in uids.values() if cmd.startswith(mine)]
    assert student and all(uid == 65534 for uid in student), uids


def test_the_root_is_empty_but_for_the_runtime():
    import autograder

    # the runtime is bound read-only at its own path (the venv, the interpreter, the course's package): its top
    # folders are there (/work here, /check on CI, /home on a laptop), nothing else of the host
    runtime = [os.path.realpath(p) for p in
               (sys.prefix, sys.base_prefix, os.path.dirname(os.path.abspath(autograder.__file__)))]
    tops = {p.split(os.sep)[1] for p in runtime}
    other = tempfile.mkdtemp(prefix="another-checkout-")  # a folder of the host the sandbox must not show
    hidden = [f"{ROOT}/source", f"{ROOT}/solutions", f"{ROOT}/tests", other, "/home", "/root/.ssh", "/etc/shadow",
              "/var", "/sys", "/run"]
    hidden = [p for p in hidden if not any(r == p or r.startswith(p + os.sep) for r in runtime)]
    try:
        out = _inside("import json, os, sys\n"
                      f"paths = {hidden!r}\n"
                      "print(json.dumps({'top': sorted(os.listdir('/')), 'seen': [p for p in paths "
                      "if os.path.lexists(p)], 'etc': sorted(os.listdir('/etc'))}))")
    finally:
        os.rmdir(other)
    facts = json.loads(out.strip().splitlines()[-1])
    assert facts["seen"] == [], facts
    assert set(facts["top"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp",
                                 "usr"} | tops, (facts["top"], runtime)
    assert set(facts["etc"]) <= {"group", "hosts", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
                                 "nsswitch.conf", "passwd"}, facts["etc"]


def test_the_scratch_space_is_private_and_limited():
    out = _inside("import os\nwritten = 0\ntry:\n    with open('/tmp/big', 'wb') as f:\n"
                  "        for _ in range(100):\n            f.write(b'0' * 10_000_000)\n            written += 1\n"
                  "except OSError as e:\n    print('stopped', e.errno, written)\n"
                  "for p in ('/usr/PWNED', '/etc/PWNED', os.path.dirname(os.__file__) + '/PWNED'):\n"
                  "    try:\n        open(p, 'w')\n        print('wrote', p)\n    except OSError as e:\n"
                  "        print('refused', e.errno)\n", scratch_bytes=200 * 2**20)
    assert "stopped 28" in out, out  # ENOSPC at the scratch limit
    written = int(out.split("stopped 28 ")[1].split()[0])
    assert 15 <= written <= 21, out  # about 200 MB of 10 MB writes
    assert "wrote" not in out, out


def test_grading_refuses_a_sandbox_whose_probe_finds_privileges(monkeypatch, tmp_path):
    from autograder.grading import classrun, sandbox

    monkeypatch.setattr(sandbox, "_PROBE", {})
    facts = dict(sandbox.probe(ROOT), CapEff="000001ffffffffff", mount_errno=0)
    monkeypatch.setattr(sandbox, "probe", lambda *a, **k: facts)
    ok, why = sandbox.sandbox_status()
    assert not ok
    assert "capabilities (CapEff 000001ffffffffff)" in why and "mount succeeded" in why
    with pytest.raises(classrun.ClassRunError, match="not safe to grade in"):
        classrun.grade_class(ROOT, "02_tensor_parallel", students=[], progress=False)
    with pytest.raises(sandbox.SandboxUnavailable, match="not safe to grade in"):
        sandbox.Sandbox(ROOT, str(tmp_path))


# -- the seccomp filter ----------------------------------------------------------------------------------------
# The calls the issue named (the filter refuses a few more: autograder/grading/sandbox.py, _DENIED).
NAMED = ("ptrace", "mount", "umount2", "pivot_root", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
         "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
         "open_by_handle_at", "process_vm_readv", "process_vm_writev", "swapon", "swapoff", "reboot", "setns",
         "unshare", "io_uring_setup", "name_to_handle_at", "syslog", "acct", "quotactl")
EPERM, ENOSYS = 1, 38
CLONE_NAMESPACES = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                    "CLONE_NEWNET": 0x40000000}  # linux/sched.h
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # linux/audit.h


# calls every rank makes (libseccomp's numbers, checked below where it is installed)
_ALLOWED = {"x86_64": {"read": 0, "write": 1, "mmap": 9, "getpid": 39, "socket": 41, "connect": 42, "execve": 59,
                       "kill": 62, "futex": 202, "exit_group": 231, "tgkill": 234},
            "aarch64": {"read": 63, "write": 64, "mmap": 222, "getpid": 172, "socket": 198, "connect": 203,
                        "execve": 221, "kill": 129, "futex": 98, "exit_group": 94, "tgkill": 131}}


def _libseccomp():
    """libseccomp (the system's, through ctypes): an independent table of every architecture's numbers."""
    import ctypes

    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return None
    lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    return lib


def _numbers(machine: str) -> dict[str, int]:
    """name -> number on `machine`: libseccomp's where it is installed, else the sandbox's own table."""
    from autograder.grading import sandbox

    lib = _libseccomp()
    if lib is None:
        return {**sandbox._SYSCALLS[machine], **_ALLOWED[machine]}
    names = set(getattr(sandbox, "_DENIED", ())) | set(NAMED) | {"clone", "clone3", "personality"} | set(
        _ALLOWED[machine])
    out = {n: lib.seccomp_syscall_resolve_name_arch(AUDIT_ARCH[machine], n.encode()) for n in names}
    return {n: nr for n, nr in out.items() if nr >= 0}


_INSIDE_SECCOMP = r"""
import ctypes, json, mmap, os, signal, sys, threading
numbers, named, namespaces = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if rc == 0 and nr == numbers['clone']:  # (a child, had a clone passed: gone at once)
        os._exit(0)
    return ctypes.get_errno() if rc == -1 else 0
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
facts = {'Seccomp': status['Seccomp'].strip()}
# harmless arguments where the call would do something without the filter (ptrace: not PTRACE_TRACEME)
args = {'ptrace': (3, 0, 0, 0), 'userfaultfd': (0x7ffff000,)}
facts['named'] = {name: call(numbers[name], *args.get(name, (0, 0, 0, 0, 0, 0))) for name in named}
facts['clone'] = {flag: call(numbers['clone'], bit | signal.SIGCHLD, 0, 0, 0, 0) for flag, bit in namespaces.items()}
facts['clone3'] = call(numbers['clone3'], 0, 0)
facts['personality'] = {hex(p): call(numbers['personality'], p) for p in (0, 0xffffffff, 8, 0x0040000)}
# what a rank does: a thread (glibc: clone3 ENOSYS, then clone), fork, the x32 and 32-bit ABIs refused
t = threading.Thread(target=lambda: None); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
facts['fork'] = os.waitpid(pid, 0)[1] >> 8
if os.uname().machine == 'x86_64':
    facts['x32_getpid'] = call(0x40000000 | numbers['getpid'])
    pid = os.fork()
    if pid == 0:  # getpid through int 0x80, the 32-bit ABI (eax 20): exit 0 if refused, 1 if it ran
        code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        code.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20; int 0x80; ret
        fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))
        os._exit(0 if fn() == -1 else 1)  # -EPERM
    facts['i386_getpid'] = os.waitpid(pid, 0)[1]  # (killed by a signal where the kernel has no 32-bit ABI)
print('FACTS ' + json.dumps(facts), flush=True)

# gloo ranks, forked and spawned, talking over the loopback; a hung rank's stack (faulthandler, SIGUSR1)
import torch
import torch.distributed as dist
from autograder.runtime.dist import DistributedError, run_distributed

def total(rank, world):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()

def stuck_here(rank, world):
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)  # both ranks wait for the other: a deadlock, convicted on their stacks

ranks = {'fork': run_distributed(total, 2), 'spawn': run_distributed(total, 2, start_method='spawn')}
try:
    run_distributed(stuck_here, 2, timeout=20)
    hung = 'no error'
except DistributedError as exc:
    hung = str(exc)
print('RANKS ' + json.dumps({'ranks': ranks, 'hung': hung}), flush=True)
"""


def test_inside_the_seccomp_filter_refuses_the_named_calls_and_gloo_ranks_still_work():
    import platform

    machine = platform.machine()
    numbers = _numbers(machine)
    named = [n for n in NAMED if n in numbers]
    # (32 to 47 s here, 2 cores shared with other test runs: torch imported three times; 150 s at a load of 40)
    out = _inside(_INSIDE_SECCOMP, argv=[json.dumps(numbers), json.dumps(named), json.dumps(CLONE_NAMESPACES)],
                  timeout=280)
    facts = json.loads(out.split("FACTS ", 1)[1].splitlines()[0])
    assert facts["Seccomp"] == "2", facts
    assert facts["named"] == {n: EPERM for n in named}, facts["named"]
    assert facts["clone"] == {flag: EPERM for flag in CLONE_NAMESPACES}, facts["clone"]
    assert facts["clone3"] == ENOSYS  # glibc falls back to clone: the thread below ran
    assert facts["personality"] == {"0x0": 0, "0xffffffff": 0, "0x8": EPERM, "0x40000": EPERM}
    assert facts["fork"] == 7
    if machine == "x86_64":
        assert facts["x32_getpid"] == EPERM
        assert facts["i386_getpid"] in (0, 11), facts  # refused (0), or no 32-bit ABI in this kernel (SIGSEGV)
    ranks = json.loads(out.split("RANKS ", 1)[1].splitlines()[0])
    assert ranks["ranks"] == {"fork": [3.0, 3.0], "spawn": [3.0, 3.0]}, ranks
    assert "deadlock" in ranks["hung"] and "stuck_here" in ranks["hung"], ranks["hung"]  # stacks, on SIGUSR1


def test_the_filter_program_for_each_architecture():
    """The program itself, run in a classic-BPF interpreter for x86_64 and aarch64 (this machine runs only one):
    the named calls refused, clone only with a namespace flag, clone3 ENOSYS, personality 0 and the query only,
    every call of another ABI refused; everything else a rank does allowed."""
    import struct

    from autograder.grading.sandbox import (_DENIED, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SeccompUnavailable,
                                            seccomp_program)

    def run(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
        data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
        pc, acc = 0, 0
        for _ in range(len(program) // 8):  # forward jumps only: at most one pass
            code, jt, jf, k = struct.unpack_from("=HBBI", program, pc * 8)
            if code == 0x20:
                acc = struct.unpack_from("<I", data, k)[0]
                pc += 1
            elif code in (0x15, 0x35, 0x45):
                taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
                pc += 1 + (jt if taken else jf)
            elif code == 0x06:
                return k
            else:
                raise AssertionError(f"opcode {code:#x} at {pc}")
        raise AssertionError("ran off the program")

    allow, eperm, enosys = SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ERRNO | ENOSYS
    thread_flags, fork_flags = 0x003D0F00, 17  # pthread_create's clone flags; fork: SIGCHLD
    for machine, other in (("x86_64", "aarch64"), ("aarch64", "x86_64")):
        program, arch, nr = seccomp_program(machine), AUDIT_ARCH[machine], _numbers(machine)
        assert len(program) % 8 == 0 and len(program) // 8 < 256
        for name in set(_DENIED) | set(NAMED):
            if name in nr:
                assert run(program, arch, nr[name]) == eperm, (machine, name)
        for name in _ALLOWED[machine]:
            assert run(program, arch, nr[name]) == allow, (machine, name)
        assert run(program, arch, nr["clone"], thread_flags) == allow
        assert run(program, arch, nr["clone"], fork_flags) == allow
        for flag, bit in CLONE_NAMESPACES.items():
            assert run(program, arch, nr["clone"], bit | fork_flags) == eperm, (machine, flag)
        assert run(program, arch, nr["clone3"]) == enosys
        assert [run(program, arch, nr["personality"], p) for p in (0, 0xFFFFFFFF, 8, 0x0040000, 1 << 32 | 8)] \
            == [allow, allow, eperm, eperm, eperm]
        for foreign in (0x40000003, 0x40000028, AUDIT_ARCH[other]):  # i386, 32-bit ARM, the other one
            assert run(program, foreign, nr["getpid"]) == eperm, (machine, hex(foreign))
        if machine == "x86_64":
            assert run(program, arch, 0x40000000 | nr["getpid"]) == eperm  # x32
            assert run(program, arch, 0xFFFFFFFF - 2**32) == allow  # -1: a call a tracer skipped
    with pytest.raises(SeccompUnavailable, match="knows x86_64 and aarch64, not this machine's riscv64"):
        seccomp_program("riscv64")


def test_the_filter_s_numbers_are_libseccomp_s():
    from autograder.grading import sandbox
    from autograder.grading.sandbox import _DENIED, _SYSCALLS

    lib = _libseccomp()
    if lib is None:
        pytest.skip("libseccomp is not installed here")
    for machine, table in _SYSCALLS.items():
        theirs = {n: lib.seccomp_syscall_resolve_name_arch(AUDIT_ARCH[machine], n.encode()) for n in
                  set(_DENIED) | set(table) | {"clone", "clone3", "personality"}}
        assert {n: nr for n, nr in theirs.items() if nr >= 0} == table, machine  # absent: not on that machine
        assert {n: lib.seccomp_syscall_resolve_name_arch(AUDIT_ARCH[machine], n.encode())
                for n in _ALLOWED[machine]} == _ALLOWED[machine]
    assert set(NAMED) <= set(_DENIED)
    assert sandbox.AUDIT_ARCH == AUDIT_ARCH and sandbox.CLONE_NAMESPACES == CLONE_NAMESPACES


def test_grading_refuses_a_sandbox_without_the_seccomp_filter(monkeypatch, tmp_path):
    """A machine the filter does not know (riscv64 here): bubblewrap runs without it, the probe finds
    Seccomp 0 and the calls allowed, and nothing is graded."""
    from autograder.grading import classrun, sandbox

    monkeypatch.setattr(sandbox, "_PROBE", {})
    monkeypatch.setattr(sandbox, "_machine", lambda: "riscv64", raising=False)
    ok, why = sandbox.sandbox_status()
    assert not ok, why
    assert "no seccomp filter inside the sandbox (Seccomp: 0): the course's seccomp filter knows x86_64 and " \
           "aarch64, not this machine's riscv64 architecture" in why, why
    with pytest.raises(classrun.ClassRunError, match="no seccomp filter inside"):
        classrun.grade_class(ROOT, "02_tensor_parallel", students=[], progress=False)
    with pytest.raises(sandbox.SandboxUnavailable, match="no seccomp filter inside"):
        sandbox.Sandbox(ROOT, str(tmp_path))


_UNDER_A_FILTER = r"""
import ctypes, json, struct, sys
from autograder.grading import sandbox
# the grader under a seccomp filter of its own, as a container's profile puts it (this one refuses acct only)
arch, nr = int(sys.argv[2]), int(sys.argv[3])
code = b"".join(struct.pack("=HBBI", *i) for i in (
    (0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, 0x7FFF0000), (0x20, 0, 0, 0), (0x15, 0, 1, nr),
    (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7FFF0000)))
buf = ctypes.create_string_buffer(code)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
prog = Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
facts = sandbox.probe(sys.argv[1])
print(json.dumps({"status": sandbox.sandbox_status(), "inside": facts.get("Seccomp_filters"),
                  "grader": facts.get("grader_seccomp_filters"), "problems": sandbox.probe_problems(facts)}))
"""


def test_the_filter_stacks_on_a_container_s_own():
    """A grader already under a seccomp filter (Docker's or containerd's profile): the course's is installed on
    top (the kernel allows stacking), and the probe sees one more filter inside than the grader has."""
    import platform

    import autograder

    acct = {"x86_64": 163, "aarch64": 89}.get(platform.machine())
    if acct is None:
        pytest.skip("no filter for this machine")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(autograder.__file__)))}
    proc = subprocess.run([sys.executable, "-c", _UNDER_A_FILTER, ROOT, str(AUDIT_ARCH[platform.machine()]),
                           str(acct)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"][0] is True and out["problems"] == [], out
    assert (out["grader"], out["inside"]) == ("1", "2"), out


# -- no cgroup left behind -------------------------------------------------------------------------------------
# Every sandbox makes a cgroup per controller, autograder/<pid>-<n>-<folder> (the pid of the process that made
# it). The grading worker killed while grading (test_grading's kill-once and kill-twice: the OOM killer in a
# real class) never reached close(), and a Sandbox never closed left its cgroups too: both are removed now.

def _cgroups_of(*pids: int) -> list[str]:
    """The course's sandbox cgroups on this machine made by the processes `pids` (by their name's prefix)."""
    prefixes = tuple(f"{pid}-" for pid in pids)
    out = []
    for parent in [f"/sys/fs/cgroup/{c}/autograder" for c in ("memory", "pids", "cpuacct")] + [
            "/sys/fs/cgroup/autograder"]:  # cgroup v1's controllers, v2
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        out += [os.path.join(parent, n) for n in names if n.startswith(prefixes)
                and os.path.isdir(os.path.join(parent, n))]
    return sorted(out)


@pytest.fixture(autouse=True)
def _no_cgroup_of_this_process_left():
    """Every test of this file: the sandboxes it made (in this process) left no cgroup."""
    before = _cgroups_of(os.getpid())
    yield
    assert _cgroups_of(os.getpid()) == before == [], "cgroups left: " + ", ".join(_cgroups_of(os.getpid()))


_OWNER = """
import sys
from autograder.grading.sandbox import Sandbox
box = Sandbox(sys.argv[1], sys.argv[3], check=False)
box.popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(" ".join(box.cgroups.dirs), flush=True)
if sys.argv[2] == "killed":
    sys.stdin.read()  # until the test kills this process
"""


def _owner(how: str, inputs: str) -> tuple[subprocess.Popen, list[str]]:
    """A process that makes a sandbox, starts a process in it, and is killed or exits without closing it."""
    import autograder

    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(autograder.__file__)))}
    proc = subprocess.Popen([sys.executable, "-c", _OWNER, ROOT, how, inputs], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    dirs = proc.stdout.readline().split()
    if not dirs:
        proc.kill()
        proc.wait()
        pytest.skip("no writable cgroups here")
    return proc, dirs


def _remove_left(dirs: list[str]) -> None:
    """(What a failing test leaves, removed: its processes killed, then the folders.)"""
    import signal

    for d in dirs:
        try:
            for pid in open(os.path.join(d, "cgroup.procs")).read().split():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.5)
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:
            pass


def test_the_cgroups_of_a_killed_grading_process_are_removed_by_the_next_sandbox(tmp_path):
    """A worker killed while grading (SIGKILL: no close()) leaves its sandbox's cgroups; the next sandbox made on
    the machine (the worker that replaces it, or the next run) removes them, and any process still in them."""
    from autograder.grading.sandbox import Sandbox

    owner, dirs = _owner("killed", str(tmp_path))
    try:
        assert dirs and all(os.path.isdir(d) for d in dirs) and _cgroups_of(owner.pid) == sorted(dirs)
        owner.kill()
        owner.wait()
        with tempfile.TemporaryDirectory() as inputs, Sandbox(ROOT, inputs):
            pass
        assert _cgroups_of(owner.pid) == [], "left after the owner was killed"
    finally:
        _remove_left(_cgroups_of(owner.pid))


def test_a_sandbox_never_closed_leaves_no_cgroup_when_its_process_exits(tmp_path):
    """A Sandbox its process never closed: its processes are killed and its cgroups removed when that process
    exits."""
    owner, dirs = _owner("exits", str(tmp_path))
    try:
        assert dirs and _cgroups_of(owner.pid) == sorted(dirs)
        assert owner.wait(30) == 0
        assert _cgroups_of(owner.pid) == [], "left after the owner exited without closing its sandbox"
    finally:
        _remove_left(_cgroups_of(owner.pid))


# -- the fork server (autograder/grading/forkserver.py): one per grading worker, each submission forked from it ---

_FIRST = r'''
import os, socket, subprocess
def leave_traces():
    open('/tmp/left-behind', 'w').write('first')
    open('/dev/shm/left-behind', 'w').write('first')
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(0x5eed, 4096, 0o1666)  # IPC_CREAT | 0666: a SysV segment outlives its process
    s = socket.socket(); s.bind(('127.0.0.1', 45678)); s.listen()
    globals()['_kept'] = s
    sleeper = subprocess.Popen(['sleep', '600'], start_new_session=True)
    return [shm, sleeper.pid, os.getuid(), socket.gethostname()]
'''

_SECOND = r'''
import os, socket, resource
def look():
    try:
        socket.create_connection(('127.0.0.1', 45678), timeout=2).close()
        port = 'open'
    except OSError:
        port = 'closed'
    shm = [line.split()[0] for line in open('/proc/sysvipc/shm').read().splitlines()[1:]]
    procs = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]
    status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())
    return {'tmp': os.path.exists('/tmp/left-behind'), 'shm_file': os.path.exists('/dev/shm/left-behind'),
            'sysv': shm, 'port': port, 'sleepers': sum(c.startswith(b'sleep') for c in procs),
            'uid': os.getuid(), 'CapEff': status['CapEff'].strip(), 'NoNewPrivs': status['NoNewPrivs'].strip(),
            'Seccomp': status['Seccomp'].strip(), 'nofile': list(resource.getrlimit(resource.RLIMIT_NOFILE)),
            'server_pid_parent': b'_server_main' in open(f'/proc/{os.getppid()}/cmdline', 'rb').read()}
'''


def _served(server, code: str, name: str, env_off: bool = False):
    """`name()` of a one-cell notebook defining it, called in a zygote forked from `server`; and how it ran."""
    from autograder.grading.sandbox import Sandbox
    from autograder.grading.trusted import ZygoteClient

    nb = {"cells": [{"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    with Sandbox(ROOT, server.new_inputs(), server=server) as box, \
            ZygoteClient(nb, box.inputs, box.scratch, sandbox=box) as zygote:
        assert not zygote.cell_errors, zygote.cell_errors
        return zygote.call(name, (), {}), ("forked" if box.server is not None else "fresh")


@pytest.mark.skipif(not os.access("/sys/fs/cgroup", os.W_OK), reason="the fork server needs writable cgroups")
def test_a_fork_of_the_server_finds_nothing_of_the_submission_before_it_and_no_privilege():
    from autograder.grading.forkserver import ForkServer

    server = ForkServer(ROOT)  # (it probes a fork as `probe` does a fresh sandbox, and refuses to start otherwise)
    try:
        first, how = _served(server, _FIRST, "leave_traces")
        assert how == "forked" and first[0] >= 0 and first[2:] == [1000, "sandbox"], first
        second, how = _served(server, _SECOND, "look")
        assert how == "forked"
    finally:
        server.close()
    assert second["server_pid_parent"]  # the same server forked both
    assert not second["tmp"] and not second["shm_file"], second  # a private /tmp and /dev/shm each
    assert second["sysv"] == [] and second["port"] == "closed", second  # IPC and network namespaces of its own
    assert second["sleepers"] == 0, second  # the first submission's processes were killed with its cgroups
    assert (second["uid"], second["CapEff"], second["NoNewPrivs"], second["Seccomp"]) == \
        (1000, "0000000000000000", "1", "2"), second


@pytest.mark.skipif(not os.access("/sys/fs/cgroup", os.W_OK), reason="the fork server needs writable cgroups")
def test_a_server_changed_by_a_submission_is_not_forked_again():
    """A submission's processes are the server's user on the host: one that lowers the server's limits (which
    every fork would inherit) and stops it leaves the next submission a fresh sandbox, with its own limits."""
    from autograder.grading.forkserver import ForkServer

    server = ForkServer(ROOT)
    try:
        _, how = _served(server, "import os, signal, resource\ndef tamper():\n    p = os.getppid()\n"
                                 "    resource.prlimit(p, resource.RLIMIT_NOFILE, (20, 20))\n"
                                 "    os.kill(p, signal.SIGSTOP)\n", "tamper")
        assert how == "forked"
        second, how = _served(server, _SECOND, "look")
        assert how == "fresh" and server.broken, how
        assert second["nofile"] != [20, 20] and not second["server_pid_parent"], second
    finally:
        server.close()


@pytest.mark.skipif(not os.access("/sys/fs/cgroup", os.W_OK), reason="the fork server needs writable cgroups")
def test_a_fork_that_cannot_make_its_sandbox_leaves_the_submission_a_fresh_one():
    """A fork that fails before the submission's code runs (here: a folder to bind again that is gone) says so
    on the channel; the grader starts a fresh sandbox for the submission, and forks no more from that server."""
    from autograder.grading.forkserver import ForkServer

    server = ForkServer(ROOT)
    try:
        binds = server.box._ro_paths
        server.box._ro_paths = lambda: binds() + ["/tmp/autograder-gone-" + os.urandom(4).hex()]
        second, how = _served(server, _SECOND, "look")
    finally:
        server.close()
    assert how == "fresh" and server.broken
    assert (second["uid"], second["CapEff"], second["Seccomp"]) == (1000, "0000000000000000", "2"), second
