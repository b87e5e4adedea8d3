"""When bubblewrap cannot build the sandbox, the grading command refuses and says which setting is missing.

    .venv/bin/python -m pytest -q tests/test_sandbox_hints.py

`failure_hints` reads the grader's own privileges (capabilities, seccomp,
/proc masks, AppArmor) beside bubblewrap's message. The cases are the
settings measured in Docker 20.10 with cluster/Containerfile (README,
"Kubernetes"): each message and /proc/self/status as the container had
them, and the hint must name the setting that made the difference there,
and none that was already right. The last tests drop a capability of a root
grader for real (setpriv) and run the probe and the grading command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from course import ROOT, copy_course

# /proc of a container with Docker's default masks (what --security-opt systempaths=unconfined removes)
MASKED = """84 83 0:43 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
59 84 0:43 /bus /proc/bus ro,nosuid,nodev,noexec,relatime - proc proc rw
63 84 0:49 / /proc/acpi ro,relatime - tmpfs tmpfs ro
64 84 0:44 /null /proc/keys rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
"""
UNMASKED = "84 83 0:43 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
NO_NEWNS = ("bwrap: No permissions to create new namespace, likely because the kernel does not allow "
            "non-privileged user namespaces")


def _status(cap_eff: str, seccomp: int) -> str:
    return f"Name:\tpython\nCapEff:\t{cap_eff}\nSeccomp:\t{seccomp}\n"


def hints(said, *, cap_eff="0000000000000000", seccomp=0, mountinfo=UNMASKED, euid=1000, apparmor="",
          max_userns="96363") -> str:
    from autograder.grading.sandbox import failure_hints

    return " | ".join(failure_hints(said, status=_status(cap_eff, seccomp), mountinfo=mountinfo, euid=euid,
                                    apparmor=apparmor, max_userns=max_userns))


def test_unprivileged_with_a_masked_proc_names_systempaths_and_procmount():
    out = hints("bwrap: Can't mount proc on /newroot/proc: Operation not permitted", mountinfo=MASKED)
    assert "systempaths=unconfined" in out and "procMount: Unmasked" in out, out
    assert "/proc/acpi" in out, out  # what covers /proc, as the grader sees it
    assert "seccomp" not in out and "CAP_" not in out, out


def test_unprivileged_under_a_seccomp_filter_names_the_seccomp_profile():
    out = hints(NO_NEWNS, seccomp=2)
    assert "seccomp=unconfined" in out and "seccompProfile: Unconfined" in out, out
    assert "procMount" not in out and "user.max_user_namespaces" not in out, out


def test_unprivileged_under_docker_defaults_names_both_settings_at_once():
    out = hints(NO_NEWNS, seccomp=2, mountinfo=MASKED)
    assert "seccompProfile: Unconfined" in out and "procMount: Unmasked" in out, out


def test_a_kernel_without_user_namespaces_is_named_not_seccomp():
    out = hints(NO_NEWNS, max_userns="0")
    assert "user.max_user_namespaces = 0" in out and "seccomp" not in out, out


def test_root_with_cap_sys_admin_only_names_cap_net_admin_and_pivot_root():
    out = hints("bwrap: loopback: Failed RTM_NEWADDR: No child processes", cap_eff="00000000a82425fb",
                seccomp=2, euid=0)
    assert "CAP_NET_ADMIN" in out and "pivot_root" in out, out
    assert "CAP_SYS_ADMIN (" not in out, out  # it has that one
    assert "unprivileged user" in out, out


def test_root_with_both_capabilities_under_docker_seccomp_names_pivot_root_only():
    out = hints("bwrap: pivot_root: Operation not permitted", cap_eff="00000000a82435fb", seccomp=2, euid=0)
    assert "pivot_root" in out and "CAP_NET_ADMIN (" not in out and "CAP_SYS_ADMIN (" not in out, out


def test_root_with_docker_defaults_names_both_capabilities():
    out = hints("bwrap: Creating new namespace failed: Operation not permitted", cap_eff="00000000a80425fb",
                seccomp=2, euid=0)
    assert "CAP_SYS_ADMIN (" in out and "CAP_NET_ADMIN (" in out and "pivot_root" in out, out


def test_an_apparmor_profile_is_named_and_unconfined_is_not():
    assert "appArmorProfile: Unconfined" in hints("bwrap: Failed to make / slave: Permission denied",
                                                  apparmor="docker-default (enforce)")
    assert hints("bwrap: Failed to make / slave: Permission denied", apparmor="unconfined") == ""


def test_nothing_is_blamed_where_the_grader_has_what_bubblewrap_needs():
    assert hints("bwrap: execvp /opt/venv/bin/python: No such file or directory") == ""
    assert hints("bwrap: execvp /opt/venv/bin/python: No such file or directory", cap_eff="000001ffffffffff",
                 euid=0) == ""


def test_the_class_run_refuses_and_says_nothing_was_graded(monkeypatch):
    from autograder.grading import classrun, sandbox

    monkeypatch.setattr(sandbox, "sandbox_status", lambda: (False, "bwrap: it failed here."))
    with pytest.raises(classrun.ClassRunError) as info:
        classrun.grade_class(ROOT, "02_tensor_parallel", students=[], progress=False)
    message = str(info.value)
    assert message.startswith("no sandbox: bwrap: it failed here. Nothing was graded"), message
    assert ".." not in message and "Install bubblewrap" not in message, message


def _drop(*caps: str) -> list[str]:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("bwrap"):
        pytest.skip("needs root, setpriv and bubblewrap: a root grader loses a capability for real")
    spec = ",".join(f"-{c}" for c in caps)
    return ["setpriv", "--bounding-set", spec, "--inh-caps", spec]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("caps,named", [(("net_admin",), "CAP_NET_ADMIN (for the loopback"),
                                        (("sys_admin",), "CAP_SYS_ADMIN (to create the namespaces)")])
def test_a_root_grader_without_a_capability_gets_the_reason_from_the_probe(caps, named):
    code = "from autograder.grading.sandbox import sandbox_status; print(sandbox_status())"
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    proc = subprocess.run([*_drop(*caps), sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("(False, 'bubblewrap cannot create its sandbox here"), proc.stdout
    assert named in proc.stdout, proc.stdout


@pytest.mark.timeout(300)
def test_the_grading_command_refuses_loudly_and_grades_nothing(tmp_path):
    drop = _drop("net_admin")
    root = copy_course(str(tmp_path / "course"))
    os.makedirs(os.path.join(root, "submitted", "alice", "02_tensor_parallel"))
    shutil.copy(next(os.path.join(root, "release", "02_tensor_parallel", n)
                     for n in os.listdir(os.path.join(root, "release", "02_tensor_parallel")) if n.endswith(".ipynb")),
                os.path.join(root, "submitted", "alice", "02_tensor_parallel"))
    env = {**os.environ, "PYTHONPATH": root, "TORCH_CPP_LOG_LEVEL": "ERROR",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.run([*drop, sys.executable, "-m", "autograder.grade", "autograde", "02_tensor_parallel",
                           "--quiet"], cwd=root, env=env, capture_output=True, text=True, timeout=250)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "no sandbox: bubblewrap cannot create its sandbox here (exit 1): bwrap: loopback" in out, out
    assert "Likely cause: bubblewrap run by root needs what this grader lacks: CAP_NET_ADMIN" in out, out
    assert "Nothing was graded" in out and "Traceback" not in out, out
    assert not os.path.exists(os.path.join(root, "graded")), os.listdir(root)
