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


def _inside(code: str, **kwargs) -> str:
    from autograder.grading.sandbox import Sandbox

    with tempfile.TemporaryDirectory() as inputs, Sandbox(ROOT, inputs, **kwargs) as box:
        status, out = box.run([sys.executable, "-c", code], timeout=120)
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
