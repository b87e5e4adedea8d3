"""A sandbox per submission: bubblewrap for isolation, cgroups (or resource limits) for size.

    box = Sandbox(course_root, inputs, memory_bytes=4 * 2**30, max_pids=512)
    proc = box.popen([python, "-m", ...], stdout=subprocess.PIPE)
    ...
    box.close()          # every process of the submission is killed, the cgroups removed

What the submission's processes see is built from an empty root: read-only,
only what running Python and torch needs (the system's `/usr`, the
interpreter, the virtual environment, the `autograder` package, a few files
of `/etc`, the grader's `inputs` folder with the submitted notebook), and a
private scratch space of its own (`/tmp` and `/dev/shm`, memory file systems
with a size limit: nothing a submission writes reaches the host's disk). No
other path of the host is there: not the course root, not another checkout,
not other students' files. No network (loopback only, which gloo needs), its
own process, IPC and host-name namespaces.

No privileges: the submission runs as an unprivileged user (uid 1000 inside,
`nobody` outside when the grader is root; the grader's own user otherwise) in
a user namespace of its own, with every capability dropped, `no_new_privs`,
no further user namespaces, and a seccomp filter (`seccomp_program`) that
refuses, with EPERM, the calls a rank never needs: ptrace, mount, bpf,
perf_event_open, userfaultfd, io_uring, the kernel's keyring, modules and
kexec, unshare, setns, clone with a namespace flag, ... (`_DENIED`), and
every call of another ABI (32-bit x86, x32). When the grader runs as root,
an outer bubblewrap builds the file system (root can bind any path), then
drops to the unprivileged user, which starts the inner, unprivileged
bubblewrap that creates the user namespace (so the submission's processes
belong to `nobody` on the host, not to root) and installs the filter last,
just before it runs the submission's command. `probe()` checks all of this
from inside before any submission is graded: zero capabilities, `mount` and
new user namespaces refused, the filter in force (`Seccomp: 2`, one filter
more than the grader's own, which a container's profile may be; ptrace,
bpf, userfaultfd and others failing with EPERM), no path of the course root
visible.

Limits: a memory and a process-count limit for all the submission's
processes together (cgroup v1 `memory` and `pids` controllers, or v2), at
most 1 GiB per file, and a per-process address-space limit where cgroups are
not writable. The cgroups (`autograder/<pid>-<n>-<folder>` in each
controller) are removed by `close`, at the latest when the process exits, and,
when that process was killed (a grading worker, by the kernel's OOM killer),
by the next sandbox made on the machine or the next exit of a grading process
(`sweep_cgroups`: the cgroups in use are locked by their process).

Without bubblewrap, or where it cannot build the sandbox, the grading command
refuses to run unless told `--no-sandbox` (and then says so on every run): see
the README's threat model. Its reason is bubblewrap's message and the setting
that is likely missing in a container (`failure_hints`: README, "For
instructors", the Kubernetes paragraph).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

__all__ = ["Sandbox", "SandboxUnavailable", "ForkServerUnavailable", "sandbox_status", "failure_hints", "SANDBOX_UID",
           "sweep_cgroups", "seccomp_program", "SeccompUnavailable"]

_CG1 = "/sys/fs/cgroup"
_counter = itertools.count()
SANDBOX_UID = 1000  # the submission's uid (and gid) inside its user namespace
_HOST_USER = "nobody"  # who the submission is on the host when the grader is root (AUTOGRADER_SANDBOX_USER)
SCRATCH_BYTES = 512 * 2**20  # /tmp inside the sandbox
SHM_BYTES = 128 * 2**20  # /dev/shm inside the sandbox


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing, cannot create its namespaces here, or its probe found privileges inside."""


class ForkServerUnavailable(SandboxUnavailable):
    """A grading worker's fork server (autograder.grading.forkserver) could not start, failed its probe, or
    cannot fork (stopped, killed or changed by a submission): the submission gets a fresh sandbox instead."""


def _bwrap() -> str | None:
    return shutil.which("bwrap")


_PROBE: dict = {}


def sandbox_status(course_root: str | None = None) -> tuple[bool, str]:
    """(usable, why): whether the sandbox works here and holds no privileges, and shows none of the files of
    `course_root` (default: the working directory, the grading command's course root); probed once per process
    and course root."""
    key = os.path.realpath(course_root or os.getcwd())
    if key in _PROBE:
        return _PROBE[key]
    if _bwrap() is None:
        result = (False, "bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    else:
        try:
            facts = probe(key)
            problems = probe_problems(facts)
            result = (not problems, "bubblewrap works: no capabilities, mount and user namespaces refused, a "
                                    "seccomp filter, nothing of the host's files but the runtime"
                      if not problems else "the sandbox is not safe to grade in: " + "; ".join(problems))
        except SandboxUnavailable as exc:
            result = (False, str(exc))
    _PROBE[key] = result
    return result


_PROBE_CODE = r"""
import ctypes, json, os, sys
status = {}
for line in open('/proc/self/status'):
    key, _, value = line.partition(':')
    status[key] = value.strip()
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(rc):
    return 0 if rc == 0 else ctypes.get_errno()
facts = {
    'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(),
    'CapEff': status.get('CapEff'), 'CapPrm': status.get('CapPrm'), 'CapAmb': status.get('CapAmb'),
    'NoNewPrivs': status.get('NoNewPrivs'),
    'mount_errno': errno_of(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)),
    'userns_errno': errno_of(libc.unshare(0x10000000)),
    'visible': sorted(p for p in json.loads(sys.argv[1]) if os.path.lexists(p)),
    'root': sorted(os.listdir('/')),
    'Seccomp': status.get('Seccomp'), 'Seccomp_filters': status.get('Seccomp_filters'),
}
# calls the course's seccomp filter refuses, with arguments that make each fail harmlessly without it (ptrace:
# ESRCH, personality: succeeds, then is undone), by the numbers of this machine (argv[2])
libc.syscall.restype = ctypes.c_long
numbers, errnos = json.loads(sys.argv[2]), {}
for name, args in (('ptrace', (3, 0, 0, 0)), ('bpf', (1000, 0, 0)), ('userfaultfd', (0x7ffff000,)),
                   ('perf_event_open', (0, 0, -1, -1, 0)), ('keyctl', (0, -1, 0)), ('setns', (-1, 0)),
                   ('io_uring_setup', (0, 0)), ('personality', (0x0040000,))):
    if name in numbers:
        rc = libc.syscall(ctypes.c_long(numbers[name]), *(ctypes.c_long(a) for a in args))
        errnos[name] = ctypes.get_errno() if rc == -1 else 0
        if name == 'personality' and rc != -1:
            libc.syscall(ctypes.c_long(numbers[name]), ctypes.c_long(rc))
facts['seccomp_errnos'] = errnos
print(json.dumps(facts))
"""


def probe(course_root: str | None = None) -> dict:
    """Facts measured inside a sandbox as every submission gets it (see `probe_problems`)."""
    root = os.path.realpath(course_root or os.getcwd())
    argv, note = probe_argv(root)
    with tempfile.TemporaryDirectory(prefix="autograder-probe-") as inputs:
        box = Sandbox(root, inputs, check=False)
        try:
            code, out = box.run([sys.executable, "-I", "-S", "-c", _PROBE_CODE, *argv], timeout=60)
        finally:
            box.close()
    facts = probe_facts(out, note)
    if facts is None:
        said = out.strip()[-400:].rstrip(".")
        hints = failure_hints(said)
        raise SandboxUnavailable(f"bubblewrap cannot create its sandbox here (exit {code}): {said}"
                                 + (f". Likely cause: {'; '.join(hints)}" if hints else ""))
    return facts


def probe_argv(root: str) -> tuple[list[str], str | None]:
    """The probe's arguments (the course's files that must not be visible, the numbers of the calls the filter
    refuses on this machine) and why there is no filter to probe, if there is none."""
    secrets = [os.path.join(root, p) for p in ("source", "solutions", "tests", "submitted", "gradebook.db",
                                               "nbgrader_config.py")]
    try:
        seccomp_program()
        numbers, note = _SYSCALLS[_machine()], None
    except SeccompUnavailable as exc:
        numbers, note = {}, str(exc)
    return [json.dumps(secrets), json.dumps(numbers)], note


def probe_facts(out: str, note: str | None) -> dict | None:
    """The facts the probe printed last in `out`, with the grader's own seccomp filters (a container's profile:
    the sandbox's must be one more, the course's); None if it printed none."""
    try:
        facts = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if not isinstance(facts, dict):
        return None
    facts["grader_seccomp_filters"] = _status_field("Seccomp_filters")
    if note:
        facts["seccomp_note"] = note
    return facts


def _status_field(key: str) -> str | None:
    """A field of this process's /proc/self/status."""
    for line in _read("/proc/self/status").splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return value.strip()
    return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def failure_hints(said: str, *, status: str | None = None, mountinfo: str | None = None,
                  apparmor: str | None = None, euid: int | None = None, max_userns: str | None = None) -> list[str]:
    """What in the grader's own settings likely made bubblewrap fail with the message `said`, and the setting
    that allows it (README, "For instructors", the Kubernetes paragraph). The keyword arguments default to this
    process's /proc/self/status, /proc/self/mountinfo, AppArmor profile, euid and user.max_user_namespaces.

    The messages, measured in Docker 20.10 (cluster/Containerfile): root without CAP_SYS_ADMIN "Creating new
    namespace failed"; root without CAP_NET_ADMIN "loopback: Failed RTM_NEWADDR"; root under Docker's default
    seccomp profile "pivot_root: Operation not permitted"; unprivileged under that profile "No permissions to
    create new namespace"; unprivileged with a masked /proc "Can't mount proc on /newroot/proc"."""
    status = _read("/proc/self/status") if status is None else status
    fields = {k: v.strip() for k, _, v in (line.partition(":") for line in status.splitlines())}
    caps = int(fields.get("CapEff") or "0", 16)
    seccomp = fields.get("Seccomp") == "2"  # a seccomp filter: a container runtime's profile
    euid = os.geteuid() if euid is None else euid
    hints = []
    if euid == 0:
        needs = [f"{name} ({why})" for bit, name, why in ((21, "CAP_SYS_ADMIN", "to create the namespaces"),
                                                          (12, "CAP_NET_ADMIN", "for the loopback of its network "
                                                                                "namespace"))
                 if not caps >> bit & 1]
        if seccomp and (needs or "pivot_root" in said):
            needs.append("a seccomp profile that allows pivot_root (Docker's and containerd's default profiles "
                         "refuse it, even with CAP_SYS_ADMIN)")
        if needs:
            hints.append(f"bubblewrap run by root needs what this grader lacks: {', '.join(needs)}; or run the "
                         f"grader as an unprivileged user, which needs no capability "
                         f"(cluster/k8s-autograde-job.yaml)")
    else:
        mountinfo = _read("/proc/self/mountinfo") if mountinfo is None else mountinfo
        covered = sorted({f[4] for f in (line.split() for line in mountinfo.splitlines()) if len(f) > 4
                          and f[4].startswith("/proc/") and f[4] != "/proc/sys/fs/binfmt_misc"})
        if "mount proc" in said or (covered and "namespace" in said):  # (the next step's failure, said at once)
            shown = ", ".join(covered[:3]) + (", ..." if len(covered) > 3 else "")
            hints.append("the container's /proc is partly masked" + (f" ({shown} mounted over)" if covered else "")
                         + ", and the kernel lets a user namespace mount a new /proc only where all of /proc is "
                           "visible: Docker --security-opt systempaths=unconfined, Kubernetes procMount: Unmasked")
        max_userns = _read("/proc/sys/user/max_user_namespaces").strip() if max_userns is None else max_userns
        if "namespace" in said and max_userns == "0":
            hints.append("the kernel allows no user namespaces (sysctl user.max_user_namespaces = 0)")
        elif seccomp and any(word in said for word in ("namespace", "hostname", "pivot_root", "mount")):
            hints.append("the grader runs under a seccomp filter (Seccomp: 2 in /proc/self/status), and Docker's "
                         "and containerd's default profiles refuse user namespaces to a process without "
                         "CAP_SYS_ADMIN: Docker --security-opt seccomp=unconfined, Kubernetes seccompProfile: "
                         "Unconfined")
    apparmor = _read("/proc/self/attr/apparmor/current").strip() if apparmor is None else apparmor
    if apparmor and not apparmor.startswith("unconfined"):  # (not measured: no AppArmor where this was written)
        hints.append(f"the grader is confined by the AppArmor profile {apparmor} (Docker's and containerd's "
                     f"default profiles deny mount): Docker --security-opt apparmor=unconfined, Kubernetes "
                     f"appArmorProfile: Unconfined")
    return hints


def probe_problems(facts: dict) -> list[str]:
    """What makes a probed sandbox unsafe to grade in (an empty list: nothing)."""
    problems = []
    if facts.get("uid") == 0 or facts.get("euid") == 0:
        problems.append(f"the submission would run as uid {facts.get('euid')} (root)")
    for key in ("CapEff", "CapPrm", "CapAmb"):
        if facts.get(key) and int(facts[key], 16) != 0:
            problems.append(f"the submission would hold capabilities ({key} {facts[key]})")
    if facts.get("NoNewPrivs") != "1":
        problems.append("no_new_privs is not set")
    if facts.get("mount_errno") == 0:
        problems.append("mount succeeded inside the sandbox")
    if facts.get("userns_errno") == 0:
        problems.append("a new user namespace could be created inside the sandbox")
    if facts.get("visible"):
        problems.append(f"the course's files are visible inside: {', '.join(facts['visible'])}")
    # the course's seccomp filter: in force (one more filter than the grader's own, which a container's profile
    # may be), and the calls it refuses fail with EPERM
    seccomp = []
    inside, outside = facts.get("Seccomp_filters"), facts.get("grader_seccomp_filters")
    if facts.get("Seccomp") != "2":
        seccomp.append(f"no seccomp filter inside the sandbox (Seccomp: {facts.get('Seccomp')})"
                       + (f": {facts['seccomp_note']}" if facts.get("seccomp_note") else ""))
    elif inside and outside and int(inside) <= int(outside):
        seccomp.append(f"the course's seccomp filter is not in force inside (the sandbox has {inside} seccomp "
                       f"filter(s), the grader itself {outside})")
    errnos = facts.get("seccomp_errnos") or {}
    passed = [f"{name} (errno {e})" for name, e in errnos.items() if e != 1]  # 1: EPERM
    if passed:
        seccomp.append(f"calls the seccomp filter refuses did not fail with EPERM inside: {', '.join(passed)}")
    elif not errnos and not seccomp:
        seccomp.append("the calls the seccomp filter refuses were not probed inside")
    return problems + seccomp


# -- the seccomp filter ----------------------------------------------------------------------------------------
# A classic-BPF program for bubblewrap's `--seccomp FD` (the kernel's `struct sock_filter` array, as libseccomp's
# seccomp_export_bpf writes it), built here with struct: no library is needed on the grading machine. (pyseccomp,
# the one binding on PyPI, is a thin ctypes layer over the system's libseccomp, unreleased since 2021, and
# libseccomp 2.5 refuses two comparisons of one argument, which "personality: only 0 or the query" needs.)
# tests/test_sandbox.py checks every number below against libseccomp's own tables where it is installed, and runs
# the program, for both architectures, in a small BPF interpreter (x32, 32-bit calls, each rule).
#
# Each call below fails with EPERM (a student sees "Operation not permitted", not a killed process); a rank never
# needs any of them. clone is refused only with a namespace flag (threads and fork pass: CLONE_NEWTIME is not a
# clone flag, clone's low byte being the exit signal); clone3, whose flags are in memory a filter cannot read,
# fails with ENOSYS, and glibc then falls back to clone (pthread_create, posix_spawn), as under Docker's profile;
# personality allows only the default persona (0) and the query (0xffffffff). Calls from another ABI than the
# machine's own (32-bit x86 `int 0x80`, x32, 32-bit ARM) fail with EPERM whatever they are: their numbers differ.
_DENIED = (
    # other processes' memory and files
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # mounts and namespaces (refused by the missing capabilities too: a second wall)
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    "mount_setattr", "unshare", "setns",
    # the kernel's larger attack surfaces
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "add_key", "request_key", "keyctl", "name_to_handle_at", "open_by_handle_at",
    # the machine's (capabilities guard them; never a rank's)
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "uselib", "iopl", "ioperm", "modify_ldt",
)
# The kernel's numbers (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h for arm64);
# a name an architecture does not have is absent from its table.
_SYSCALLS = {
    "x86_64": {
        "clone": 56, "ptrace": 101, "syslog": 103, "uselib": 134, "personality": 135, "modify_ldt": 154,
        "pivot_root": 155, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
        "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179, "kexec_load": 246,
        "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
        "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
    },
    "aarch64": {
        "umount2": 39, "mount": 40, "pivot_root": 41, "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97,
        "kexec_load": 104, "init_module": 105, "delete_module": 106, "syslog": 116, "ptrace": 117, "reboot": 142,
        "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225,
        "perf_event_open": 241, "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "bpf": 280,
        "userfaultfd": 282, "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
    },
}
# the architecture's AUDIT_ARCH_* (linux/audit.h), the value seccomp_data.arch holds for the machine's own calls
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000  # x86_64: a call of the x32 ABI (same arch value, this bit in its number)
CLONE_NAMESPACES = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                    "CLONE_NEWNET": 0x40000000}
PERSONA_QUERY = 0xFFFFFFFF
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000  # | errno
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|...
_NR, _ARCH, _ARG0_LO = 0, 4, 16  # offsets in struct seccomp_data (little-endian: args[0]'s low 32 bits first)


class SeccompUnavailable(RuntimeError):
    """No seccomp filter for this machine (an architecture the course's filter does not know)."""


def _machine() -> str:
    import platform

    return platform.machine()


def seccomp_program(machine: str | None = None) -> bytes:
    """The course's seccomp filter for `machine` (default: this one), as bubblewrap's `--seccomp` reads it."""
    machine = machine or _machine()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if machine not in _SYSCALLS or sys.byteorder != "little":
        raise SeccompUnavailable(f"the course's seccomp filter knows x86_64 and aarch64, not this machine's "
                                 f"{machine or 'unknown'} architecture")
    table = _SYSCALLS[machine]
    import errno

    eperm, enosys = SECCOMP_RET_ERRNO | errno.EPERM, SECCOMP_RET_ERRNO | errno.ENOSYS
    code: list[tuple] = []  # (opcode, jump if true, jump if false, k): jumps name a label, None is "next"

    def op(opcode, k, jt=None, jf=None):
        code.append((opcode, jt, jf, k))

    op(_LD_W_ABS, _ARCH)
    op(_JEQ_K, AUDIT_ARCH[machine], jf="deny")  # the architecture first: numbers mean nothing on another one
    op(_LD_W_ABS, _NR)
    if machine == "x86_64":
        op(_JEQ_K, 0xFFFFFFFF, jt="allow")  # -1: a call a tracer skipped (the kernel answers ENOSYS), as libseccomp
        op(_JGE_K, _X32_SYSCALL_BIT, jt="deny")  # the x32 ABI
    for name in _DENIED:
        if name in table:
            op(_JEQ_K, table[name], jt="deny")
    op(_JEQ_K, table["clone3"], jt="enosys")
    op(_JEQ_K, table["personality"], jt="personality")
    op(_JEQ_K, table["clone"], jf="allow")
    op(_LD_W_ABS, _ARG0_LO)  # clone: its flags (all the namespace flags are in the low half)
    op(_JSET_K, sum(CLONE_NAMESPACES.values()), jt="deny", jf="allow")
    code.append(("personality",))
    op(_LD_W_ABS, _ARG0_LO)  # (the kernel reads an unsigned int: the low half)
    op(_JEQ_K, 0, jt="allow")
    op(_JEQ_K, PERSONA_QUERY, jt="allow", jf="deny")
    code.append(("allow",))
    op(_RET_K, SECCOMP_RET_ALLOW)
    code.append(("deny",))
    op(_RET_K, eperm)
    code.append(("enosys",))
    op(_RET_K, enosys)

    labels, program = {}, []
    for ins in code:
        if len(ins) == 1:
            labels[ins[0]] = len(program)
        else:
            program.append(ins)
    out = bytearray()
    for i, (opcode, jt, jf, k) in enumerate(program):
        jumps = [0 if j is None else labels[j] - i - 1 for j in (jt, jf)]
        assert all(0 <= j < 256 for j in jumps), (i, jumps)  # classic BPF jumps forward, at most 255
        out += struct.pack("=HBBI", opcode, jumps[0], jumps[1], k)
    return bytes(out)


def _seccomp_fd() -> tuple[int | None, str | None]:
    """A fresh file holding the filter, at offset 0, for one bubblewrap to read (bubblewrap reads to its end,
    so every process gets its own); (None, why) where there is no filter for this machine."""
    try:
        program = seccomp_program()
    except SeccompUnavailable as exc:
        return None, str(exc)
    fd = os.memfd_create("autograder-seccomp")  # (close-on-exec here; Popen's pass_fds hands it to bubblewrap)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd, None


def _under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def _cgroup_candidates(memory_bytes: int | None = None, max_pids: int | None = None) -> list[tuple[str, dict]]:
    """(controller folder, the limits to write) of each cgroup a sandbox makes: v1 memory, pids and cpuacct,
    or one v2 leaf."""
    if os.path.exists(os.path.join(_CG1, "cgroup.controllers")):
        return [(_CG1, {"memory.max": memory_bytes, "pids.max": max_pids})]
    return [(os.path.join(_CG1, "memory"), {"memory.limit_in_bytes": memory_bytes}),
            (os.path.join(_CG1, "pids"), {"pids.max": max_pids}),
            (os.path.join(_CG1, "cpuacct"), {})]  # no limit: what the submission's processes cost, measured


def _cgroup_parents() -> list[str]:
    """The folders holding the course's cgroups, one per controller (`autograder/<pid>-<n>-<folder>` in each)."""
    return [os.path.join(base, "autograder") for base, _ in _cgroup_candidates()]


class _flocked:
    """flock(2) on a folder for a `with` block (a cgroup folder's too: the kernel releases it when the process
    holding it dies, however it dies). Not held where the folder cannot be opened."""

    def __init__(self, path: str, how: int):
        self.path, self.how, self.fd = path, how, None

    def __enter__(self):
        import fcntl

        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(self.fd, self.how)
        except OSError:
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)


def _gone(pid: int) -> bool:
    """Whether process `pid` has exited (or is a zombie, whose files are closed)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def sweep_cgroups() -> list[str]:
    """Remove the course's cgroups that nothing uses any more: those of a process that died without closing
    its sandbox (a grading worker killed while grading; its processes, if any are left, are killed), and this
    process's own that an earlier close could not remove. The cgroups of a sandbox in use are never touched:
    the process that made it holds a lock on each (`flock`, released by the kernel when that process dies,
    however it dies), and only those of a dead process, or of this one, are tried at all (a grader of an
    older version holds no lock). Run whenever a sandbox is made and when a process that can make one exits.
    The cgroups removed."""
    import fcntl

    removed = []
    for parent in _cgroup_parents():
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        stale = []
        for name in names:
            owner = name.split("-", 1)[0]
            if owner.isdigit() and (int(owner) == os.getpid() or _gone(int(owner))) \
                    and os.path.isdir(os.path.join(parent, name)):
                stale.append(os.path.join(parent, name))
        if not stale:
            continue
        with _flocked(parent, fcntl.LOCK_EX):  # (waits while another process makes a cgroup and locks it)
            for path in stale:
                with _flocked(path, fcntl.LOCK_EX | fcntl.LOCK_NB) as lock:
                    if lock.fd is None:
                        continue  # in use (or gone already)
                    if _rmdir_emptied([path], timeout=2.0) == []:
                        removed.append(path)
    return removed


def _rmdir_emptied(dirs: list[str], timeout: float) -> list[str]:
    """Kill every process in the cgroups `dirs` and remove them, retrying for up to `timeout` seconds while
    processes are still on their way out (a large process takes time to exit on a busy machine). Those left."""
    left = list(dirs)
    deadline = time.monotonic() + timeout
    while left:
        for d in list(left):
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.rmdir(d)
                left.remove(d)
            except FileNotFoundError:
                left.remove(d)
            except OSError:
                pass
        if left and time.monotonic() < deadline:
            time.sleep(0.05)
        else:
            break
    return left


_OPEN_CGROUPS: set = set()  # this process's cgroups not yet removed: a Sandbox never closed, removed at exit


def _at_exit() -> None:
    for cgroups in list(_OPEN_CGROUPS):
        if cgroups.owner == os.getpid():  # (not a forked child's to remove: its parent's)
            cgroups.remove()
    sweep_cgroups()


class _Cgroups:
    """One cgroup per submission in each controller we can write (v1 memory + pids, or a v2 leaf), locked by this
    process (`sweep_cgroups`) until `remove`."""

    def __init__(self, name: str, memory_bytes: int | None, max_pids: int | None):
        import fcntl

        self.dirs: list[str] = []
        self._locks: list[int] = []
        self.owner = os.getpid()
        sweep_cgroups()  # what a process killed while grading left (the worker this one replaces)
        v2 = os.path.exists(os.path.join(_CG1, "cgroup.controllers"))
        for base, files in _cgroup_candidates(memory_bytes, max_pids):
            parent = os.path.join(base, "autograder")
            path = os.path.join(parent, name)
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError:
                continue
            fd = None
            with _flocked(parent, fcntl.LOCK_SH):  # (a sweep waits until the new cgroup is locked)
                try:
                    try:
                        os.mkdir(path)
                    except FileExistsError:
                        pass  # one a process of the same pid left
                    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    if fd is not None:
                        os.close(fd)
                    continue
            try:
                for fname, value in files.items():
                    if value is not None:
                        with open(os.path.join(path, fname), "w") as f:
                            f.write(str(value))
            except OSError:  # (a v2 parent without the controller): not this one
                _rmdir_emptied([path], timeout=1.0)
                os.close(fd)
                continue
            if v2 is False and "memory.limit_in_bytes" in files and memory_bytes is not None:
                try:  # no swap beyond the limit, where the kernel accounts it
                    with open(os.path.join(path, "memory.memsw.limit_in_bytes"), "w") as f:
                        f.write(str(memory_bytes))
                except OSError:
                    pass
            self.dirs.append(path)
            self._locks.append(fd)
        if self.dirs:
            _OPEN_CGROUPS.add(self)

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

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) all the submission's processes used, where a cgroup accounts it."""
        for d in self.dirs:
            for fname, scale in (("cpuacct.usage", 1e-9), ("cpu.stat", 1e-6)):
                try:
                    with open(os.path.join(d, fname)) as f:
                        text = f.read()
                except OSError:
                    continue
                if fname == "cpuacct.usage":
                    return int(text) * scale
                usage = [line.split()[1] for line in text.splitlines() if line.startswith("usage_usec ")]
                if usage:
                    return int(usage[0]) * scale
        return None

    def oom_kills(self) -> int:
        """How many of the submission's processes the kernel killed for exceeding the memory limit."""
        total = 0
        for d in self.dirs:
            for fname in ("memory.oom_control", "memory.events"):
                try:
                    with open(os.path.join(d, fname)) as f:
                        lines = f.read().splitlines()
                except OSError:
                    continue
                total += sum(int(line.split()[1]) for line in lines if line.startswith("oom_kill "))
        return total

    def oom_killed(self) -> bool:
        if self.oom_kills():
            return True
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
        """Kill every process in the cgroups and remove them. One still busy after 10 s (processes that take
        that long to exit) is unlocked and left to the next `sweep_cgroups` of this process or another."""
        self.kill_all()
        try:
            _rmdir_emptied(self.dirs, timeout=10.0)
        finally:
            for fd in self._locks:
                os.close(fd)
            self._locks = []
            _OPEN_CGROUPS.discard(self)


def _host_ids() -> tuple[int, int]:
    """The unprivileged host user the submission runs as when the grader is root."""
    import pwd

    name = os.environ.get("AUTOGRADER_SANDBOX_USER", _HOST_USER)
    try:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


# Dropping from root to the unprivileged host user, between the outer and the inner bubblewrap (run by the
# sandbox's own interpreter in isolated mode: no site, no environment, no student code has run yet).
_DROP = ("import os, sys; os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1])); "
         "os.execv(sys.argv[3], sys.argv[3:])")


class Sandbox:
    """Run one submission's processes isolated (bubblewrap) and limited (cgroups); see the module docstring.

    `inputs` is a folder the grader made and fills (the notebook to run): the
    submission reads it, read-only, at the same path, and never writes it.
    Inside, the submission's scratch folder is `scratch` (in the private /tmp; the process makes it).
    `isolate=False` (the grading command's `--no-sandbox`) keeps the limits and
    the kill-everything-afterwards, without the namespaces; its scratch space
    is then a folder of the host's temp folder.
    """

    def __init__(self, course_root: str, inputs: str, *, isolate: bool = True,
                 memory_bytes: int | None = 4 * 2**30, max_pids: int | None = 512,
                 scratch_bytes: int = SCRATCH_BYTES, extra_ro: tuple = (), check: bool = True, gpus: bool = False,
                 shm_bytes: int = SHM_BYTES, server=None, runs_server: bool = False):
        self.root = os.path.realpath(course_root)
        # `server`: a ForkServer (autograder.grading.forkserver) this submission's zygote is forked from, into
        # namespaces of its own; `runs_server`: this sandbox runs such a server (no seccomp filter and new user
        # namespaces allowed: its forks make their own, then install the filter themselves)
        self.server = server
        self.runs_server = runs_server
        self.shm_bytes = shm_bytes
        self.inputs = os.path.realpath(inputs)
        os.chmod(self.inputs, 0o755)  # the grader's folder: the submission (another user) reads it, never writes
        self.isolate = isolate
        self.memory_bytes = memory_bytes
        self.scratch_bytes = scratch_bytes
        if isolate:
            if _bwrap() is None:
                raise SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
            if check:
                ok, why = sandbox_status(self.root)
                if not ok:
                    raise SandboxUnavailable(why)
            self.scratch = "/tmp/work"
            self._host_scratch = None
        else:
            self._host_scratch = tempfile.mkdtemp(prefix="autograder-scratch-")
            self.scratch = self._host_scratch
        self.cgroups = _Cgroups(f"{os.getpid()}-{next(_counter)}-{os.path.basename(self.inputs)}",
                                memory_bytes, max_pids)
        self.extra_ro = tuple(os.path.realpath(p) for p in extra_ro)
        self.gpus = gpus  # the NVIDIA devices too (the NCCL cases of a GPU grading node)
        self.procs: list[subprocess.Popen] = []

    # -- what the sandbox sees ------------------------------------------------------------------------------
    def _ro_paths(self) -> list[str]:
        """Host paths bound read-only at the same place: the runtime, nothing of the course but its package."""
        import autograder

        keep = ["/usr", sys.base_prefix, sys.prefix, os.path.dirname(os.path.abspath(autograder.__file__)),
                self.inputs, *self.extra_ro]
        for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
            if os.path.exists(f):
                keep.append(f)
        out = []
        for p in sorted({os.path.realpath(p) for p in keep}):
            if not any(_under(p, q) and p != q for q in out):
                out.append(p)
        return out

    def _links(self, binds: list[str]) -> list[tuple[str, str]]:
        """Symbolic links on the way to the interpreter or the package (`.venv -> /opt/venv`: a node-local
        environment beside a course on a shared volume), made again inside: the paths are bound where they
        really are, and the processes are started by the paths they were found by."""
        import autograder

        out = []
        for path in (os.path.abspath(sys.prefix), os.path.dirname(os.path.abspath(autograder.__file__))):
            parts = path.strip(os.sep).split(os.sep)
            for i in range(1, len(parts) + 1):
                p = os.sep + os.path.join(*parts[:i])
                if os.path.islink(p):
                    inside = any(p == b or p.startswith(b + os.sep) for b in binds)  # (seen there as it is)
                    if not inside and (p, os.path.realpath(p)) not in out:
                        out.append((p, os.path.realpath(p)))
                    break
        return out

    def _etc_files(self) -> dict[str, str]:
        """Small files the runtime looks for, written by the grader (never the host's own)."""
        return {
            "/etc/passwd": f"root:x:0:0::/:/usr/sbin/nologin\nstudent:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp/home:"
                           f"/bin/sh\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n",
            "/etc/group": f"root:x:0:\nstudent:x:{SANDBOX_UID}:\nnogroup:x:65534:\n",
            "/etc/hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
            "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
        }

    def _filesystem(self) -> list[str]:
        """bubblewrap's arguments that build the sandbox's file system from an empty root."""
        args = ["--dev", "/dev", "--proc", "/proc",
                "--perms", "1777", "--size", str(self.scratch_bytes), "--tmpfs", "/tmp",
                # NCCL's shared-memory transport needs room in /dev/shm
                "--perms", "1777", "--size", str(self.shm_bytes * (8 if self.gpus else 1)), "--tmpfs", "/dev/shm"]
        if self.gpus:
            import glob

            for dev in sorted(glob.glob("/dev/nvidia*")):
                if not os.path.isdir(dev):
                    args += ["--dev-bind", dev, dev]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        binds = self._ro_paths()
        etc_dir = os.path.join(self.inputs, ".etc")
        os.makedirs(etc_dir, exist_ok=True)
        files = []
        for dest, text in self._etc_files().items():
            src = os.path.join(etc_dir, os.path.basename(dest))
            with open(src, "w", encoding="utf-8") as f:
                f.write(text)
            files.append((src, dest))
        links = self._links(binds)
        dirs = set()
        for dest in binds + [d for _, d in files] + [link for link, _ in links]:
            parent = os.path.dirname(dest)
            while parent not in ("/", ""):
                dirs.add(parent)
                parent = os.path.dirname(parent)
        for d in sorted(dirs, key=lambda p: (p.count("/"), p)):
            if not any(_under(d, b) for b in binds):
                args += ["--perms", "0755", "--dir", d]  # a parent folder bubblewrap would make 0700 as root
        for p in binds:
            args += ["--ro-bind", p, p]
        for src, dest in files:
            args += ["--ro-bind", src, dest]
        for link, target in links:
            args += ["--symlink", target, link]
        return args

    def argv(self, cmd: list[str], cwd: str | None = None, *, seccomp_fd: int | None = None) -> list[str]:
        """The command line that runs `cmd` in this sandbox, in `cwd` (inside; default /tmp, where the
        submission's processes make their scratch folder), under the seccomp filter in the file `seccomp_fd`
        (`popen` makes it; bubblewrap loads it last, just before it runs `cmd`)."""
        cwd = cwd or ("/tmp" if self.isolate else self.scratch)
        if not self.isolate:
            return list(cmd)
        bwrap = _bwrap()
        namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                      "--hostname", "sandbox", "--die-with-parent", "--new-session"]
        # the filter goes to the bubblewrap that runs `cmd` (as root: the inner one, which still needs unshare,
        # mount and pivot_root to build the user namespace, and installs the filter after that)
        unprivileged = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                        *([] if self.runs_server else ["--disable-userns"]), "--cap-drop", "ALL", "--die-with-parent",
                        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else [])]
        if os.geteuid() == 0:
            # outer (root): the file system; then the unprivileged host user; inner: the user namespace
            uid, gid = _host_ids()
            inner = [bwrap, *unprivileged, "--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--chdir", cwd,
                     "--", *cmd]
            return [bwrap, *namespaces, *self._filesystem(), "--chdir", "/", "--",
                    sys.executable, "-I", "-S", "-c", _DROP, str(uid), str(gid), *inner]
        return [bwrap, *namespaces, *unprivileged, *self._filesystem(), "--chdir", cwd, "--", *cmd]

    def env(self, base: dict | None = None) -> dict:
        """The submission's environment: only what the runtime needs (no variable of the grader's own)."""
        import autograder

        base = dict(base or {})
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(autograder.__file__)))
        if self.isolate:
            home = "/tmp/home"
            tmp = "/tmp"
        else:
            home = tmp = self.scratch
        env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
               "HOME": home, "TMPDIR": tmp, "USER": "student", "LOGNAME": "student", "LANG": "C.UTF-8",
               "PYTHONPATH": pkg_parent, "PYTHONNOUSERSITE": "1", "MPLBACKEND": "Agg",
               "MPLCONFIGDIR": os.path.join(home, ".matplotlib"), "TORCH_CPP_LOG_LEVEL": "ERROR"}
        env.update({k: v for k, v in base.items() if k in _PASSED})
        return env

    def popen(self, cmd: list[str], *, env: dict | None = None, cwd: str | None = None, **kwargs):
        cgroup_dirs, limit = self.cgroups.dirs, None if self.cgroups.active else self.memory_bytes

        def enter():
            _enter_limits(cgroup_dirs, limit)

        # the seccomp filter: missing only where this machine has none (the probe then refuses to grade)
        fd = _seccomp_fd()[0] if self.isolate and not self.runs_server else None
        try:
            if fd is not None:
                kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), fd)
            proc = subprocess.Popen(self.argv(cmd, cwd, seccomp_fd=fd), env=self.env(env),
                                    cwd="/" if self.isolate else self.scratch, preexec_fn=enter, **kwargs)
        finally:
            if fd is not None:
                os.close(fd)
        self.procs.append(proc)
        return proc

    def start_zygote(self, inputs: str, workdir: str, output_limit: int, env: dict | None = None):
        """The submission's zygote (trusted._zygote_main) forked from `self.server` into this sandbox's cgroups
        and namespaces of its own: a Popen-like handle (forkserver.ForkedProcess)."""
        proc = self.server.fork({"op": "zygote", "inputs": inputs, "workdir": workdir, "output_limit": output_limit,
                                 "env": self.env(env)}, self.cgroups.dirs)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        """Kill every process this sandbox started (and everything they started, via the cgroups)."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.cgroups.kill_all()

    def run(self, cmd: list[str], *, timeout: float, env: dict | None = None, cwd: str | None = None,
            output_limit: int = 200_000) -> tuple[int | None, str]:
        """Run to completion within `timeout` s; (exit status or None on timeout, the output's tail)."""
        with tempfile.TemporaryFile() as log:
            proc = self.popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
            self.kill(proc)
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - output_limit))
            tail = log.read().decode("utf-8", "replace")
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

    def oom_kills(self) -> int:
        return self.cgroups.oom_kills()

    def cpu_seconds(self) -> float | None:
        return self.cgroups.cpu_seconds()

    def close(self) -> None:
        try:
            for p in self.procs:
                self.kill(p)
        finally:
            self.cgroups.remove()
            if self.server is not None:  # the folder in the fork server's inputs: this submission's, gone with it
                shutil.rmtree(self.inputs, ignore_errors=True)
            if self._host_scratch:
                shutil.rmtree(self._host_scratch, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# variables a caller may pass through to the submission's processes (nothing else of the grader's environment)
_PASSED = {"TORCH_CPP_LOG_LEVEL", "PYTHONHASHSEED", "PYTHONWARNINGS", "OMP_NUM_THREADS", "MPLBACKEND",
           "AUTOGRADER_TRACEBACK", "CUDA_VISIBLE_DEVICES", "AUTOGRADER_BACKSTOP_S",
           "AUTOGRADER_RANK_POOL"}


def _enter_limits(cgroup_dirs: list[str], memory_bytes: int | None) -> None:
    """In a new process, before it execs the submission's command: a session of its own, at most 1 GiB per
    file (Python gets EFBIG, an OSError: SIGXFSZ is ignored), no core dumps, and the submission's cgroups
    (its descendants follow) or, without cgroups, a bound on its address space (`memory_bytes`)."""
    try:
        os.setsid()
    except OSError:  # already a session leader
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


atexit.register(_at_exit)
