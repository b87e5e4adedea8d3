"""The shipped Slurm script on a real single-node Slurm cluster: an array of shards, then `merge` as a dependent job.

    .venv/bin/python -m pytest -q -s tests/test_slurm.py

The test starts its own cluster from Debian's packages (munge, slurmctld,
slurmd; `apt-get install munge slurmctld slurmd slurm-client`), configured
for this machine in a temporary folder (slurm.conf, a munge key, state,
spool and logs, free ports on 127.0.0.1), and stops it afterwards: nothing
is left running. In a fresh copy of a scratch course (tests/grading_course.py:
its committed files only, as a clone has them: no gradebook.db, nothing
graded) with a good, a wrong, an untouched and a broken submission, it runs
the README's Slurm lines as they are written there: `sinfo` (the node's sizes),
`cluster/slurm-autograde.sbatch`, unmodified, as an array of 2 tasks (once
with more CPUs than the node has: `squeue` says PartitionConfig), and the
README's `merge` as a job that depends on it. The first task makes the
gradebook; each task's log names the one file it wrote; the gradebook must
equal the one a single `autograde` of the same class writes. Without Slurm
(or not as root: slurmd launches jobs as root here) that test is skipped with
the reason; CI sets COURSE_REQUIRE_SLURM=1 (.ci/run installs the packages),
where a missing cluster is a failure. The other tests need no cluster: the
round-robin split, the `--shard` forms, `merge` on a fresh clone (the
gradebook made whole, or not at all).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings

import pytest

from course import tracked_files
from grading_course import (A, VENV_BIN, clear_results, edit, env, make_mini_course, needs_sandbox, records,
                            reference, release, run_grade, write_submission)

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
# a plain shell's PATH (the course's .venv is not on it: the script names .venv/bin/python itself)
_SBIN = os.pathsep.join(["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo")
WRONG = ("return _reduce(grad_output, ctx.group), None", "return grad_output, None")  # f's backward forgotten


def _missing() -> str | None:
    absent = [p for p in _PROGRAMS if shutil.which(p, path=_SBIN) is None]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} missing): "
                f"apt-get install munge slurmctld slurmd slurm-client")
    if os.geteuid() != 0:
        return "the single-node test cluster runs slurmd as root (it launches the jobs): run as root"
    return None


_WHY = _missing()
if _WHY and os.environ.get("COURSE_REQUIRE_SLURM") == "1":
    raise RuntimeError(f"COURSE_REQUIRE_SLURM=1 but {_WHY}")
pytestmark = [pytest.mark.timeout(1800)]
needs_slurm = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def _exe(name: str) -> str:
    return shutil.which(name, path=_SBIN)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ok, seconds: float, logs=()) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise AssertionError(f"the test cluster: {what} within {seconds:.0f} s\n" + _tails(logs))


def _tails(paths, n: int = 40) -> str:
    out = []
    for p in paths:
        with contextlib.suppress(OSError), open(p, errors="replace") as f:
            out.append(f"--- {p} (last {n} lines)\n" + "".join(f.readlines()[-n:]))
    return "\n".join(out)


class Cluster:
    """A one-node Slurm cluster (munged, slurmctld, slurmd) in a temporary folder, on loopback ports."""

    def __init__(self):
        # short: munge's socket path must fit a Unix socket's 107 bytes
        self.dir = tempfile.mkdtemp(prefix="slurm-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.procs: list[subprocess.Popen] = []
        self.jobs: list[str] = []
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.logs = [os.path.join(self.dir, n) for n in ("munged.log", "slurmctld.log", "slurmd.log")]
        self.env = {**os.environ, "SLURM_CONF": self.conf, "PATH": _SBIN}

    def _start(self, *cmd: str, log: str) -> subprocess.Popen:
        out = open(os.path.join(self.dir, log + ".out"), "w")
        proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append(proc)
        return proc

    def start(self) -> "Cluster":
        d = self.dir
        for sub in ("munge", "state", "spool"):
            os.makedirs(os.path.join(d, sub), mode=0o755)
        key = os.path.join(d, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.socket = os.path.join(d, "munge", "munge.sock")
        self._start(_exe("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={self.socket}",
                    f"--pid-file={d}/munge/munged.pid", f"--seed-file={d}/munge/munged.seed",
                    f"--log-file={d}/munged.log", log="munged")
        _wait("munged creates its socket", lambda: os.path.exists(self.socket), 30, self.logs)

        # this machine as slurmd sees it (CPUs, sockets, cores, memory), reachable on loopback
        hw = subprocess.run([_exe("slurmd"), "-C"], env=self.env, capture_output=True, text=True, timeout=60)
        node = next((line for line in hw.stdout.splitlines() if line.startswith("NodeName=")), None)
        assert node, f"slurmd -C printed no node line:\n{hw.stdout}{hw.stderr}"
        self.host = node.split()[0].split("=", 1)[1]
        with open(self.conf, "w") as f:
            f.write(f"""\
ClusterName=coursetest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
# no cgroup plugins: a plain VM or container may not delegate cgroups to Slurm
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
ReturnToService=2
MailProg=/bin/true
InactiveLimit=0
# finished jobs stay visible to scontrol for the whole test
MinJobAge=3600
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=course Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
""")
        self._start(_exe("slurmctld"), "-D", "-f", self.conf, log="slurmctld")
        _wait("slurmctld answers", lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") >= 1, 60,
              self.logs)
        self._start(_exe("slurmd"), "-D", "-f", self.conf, log="slurmd")
        _wait("the node is idle", lambda: self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
              == "idle", 60, self.logs)
        return self

    def run(self, *cmd: str, cwd: str | None = None, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([_exe(cmd[0]), *cmd[1:]], cwd=cwd, env={**(env or os.environ), **self.env_vars()},
                              capture_output=True, text=True, timeout=120)
        if check:
            assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}\n" + _tails(self.logs)
        return proc

    def env_vars(self) -> dict:
        return {"SLURM_CONF": self.conf, "PATH": _SBIN}

    def job_states(self, jid: str) -> list[str]:
        """The state of each task of job `jid` (one for a plain job, one per task of an array)."""
        out = self.run("scontrol", "-o", "show", "job", jid, check=False).stdout
        return re.findall(r"\bJobState=(\S+)", out)

    def describe(self, jid: str) -> str:
        """Each task's id, state and reason (JobLaunchFailure, DependencyNeverSatisfied, ...)."""
        out = self.run("scontrol", "-o", "show", "job", jid, check=False).stdout
        return "\n".join(" ".join(re.findall(r"\b(?:JobId|ArrayTaskId|JobState|Reason|ExitCode)=\S+", line))
                         for line in out.splitlines())

    def wait_done(self, jid: str, seconds: float) -> list[str]:
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                 "DEADLINE", "PREEMPTED"}
        _wait(f"job {jid} ends", lambda: (s := self.job_states(jid)) and set(s) <= final, seconds, self.logs)
        return self.job_states(jid)

    def stop(self) -> None:
        """Cancel what is left, stop the daemons (slurmd, slurmctld, munged): nothing keeps running."""
        with contextlib.suppress(Exception):
            if self.jobs:
                self.run("scancel", *self.jobs, check=False)
                _wait("the cancelled jobs leave the node",
                      lambda: not self.run("squeue", "-h", check=False).stdout.strip(), 60)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        yield c.start()
    finally:
        c.stop()
    for proc in c.procs:
        assert proc.poll() is not None, f"left running: {proc.args}"


def _readme_commands() -> dict[str, str]:
    """The README's Slurm lines, as an instructor copies them: sinfo (the nodes' sizes), the sizes (A=...), the
    array, the dependent merge, squeue (why a task waits)."""
    text = open(README, encoding="utf-8").read()
    found = {
        "sinfo": re.search(r"^sinfo [^\n#]*", text, re.M),
        "sizes": re.search(r"^A=\S+ N=\S+ C=\S+ M=\S+", text, re.M),
        "array": re.search(r"^jid=\$\(sbatch --parsable [^\n]*cluster/slurm-autograde\.sbatch\)$", text, re.M),
        "merge": re.search(r"^sbatch --dependency=afterok:\$jid [^\n]*merge [^\n]*$", text, re.M),
        "squeue": re.search(r"^squeue -j \$jid [^\n#]*", text, re.M),
    }
    missing = [k for k, m in found.items() if m is None]
    assert not missing, f"the README's Slurm section shows the commands {missing} (sinfo, sizes, array, merge, squeue)"
    return {k: m.group(0).strip() for k, m in found.items()}


def _fresh_copy(built: str, dest: str) -> str:
    """`built`'s files that git tracks in the course (what a clone of it has), at `dest`: no gradebook.db, no
    graded/, feedback/ or any other build output."""
    for rel in tracked_files():
        src = os.path.join(built, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The cut-down course (tests/grading_course.py) as its committed files would be: source/ and release/ of
    its assignment 02 (built here once, as `make build` would)."""
    return make_mini_course(tmp_path_factory.mktemp("slurmbuilt"))


def _book(root: str) -> dict:
    """student -> what nbgrader's gradebook holds: timestamp, per cell score and manual-grade flag, the comment."""
    from nbgrader.api import Gradebook

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook("sqlite:///" + os.path.join(root, "gradebook.db")) as gb:
            for sub in gb.assignment_submissions(A):
                out[sub.student.id] = {
                    "timestamp": sub.timestamp,
                    "cells": {g.name: (float(g.score), bool(g.needs_manual_grade)) for nb in sub.notebooks
                              for g in nb.grades},
                    "comments": sorted(c.auto_comment or "" for nb in sub.notebooks for c in nb.comments),
                }
    return out


# round-robin over the sorted names, 2 tasks: ana and cleo | ben and dev (a full grading, good or wrong, in each)
STUDENTS = {"ana": "good", "ben": "wrong", "cleo": "untouched", "dev": "broken"}
EXPECTED = {"ana": 12.0, "ben": 6.0, "cleo": 0.0, "dev": 0.0}


@pytest.fixture(scope="module")
def course(built, tmp_path_factory):
    # a fresh clone of the course (no `make build`: no gradebook.db), with its .venv, as the sbatch script
    # expects (`.venv/bin/python`)
    root = _fresh_copy(built, str(tmp_path_factory.mktemp("slurmclass")))
    os.symlink(os.path.dirname(VENV_BIN), os.path.join(root, ".venv"))
    ref = reference(root)
    write_submission(root, "ana", ref)
    write_submission(root, "ben", edit(ref, "tp_mappings", lambda s: s.replace(*WRONG)))
    write_submission(root, "cleo", release(root))
    write_submission(root, "dev", '{"cells": [ truncated upload')
    for i, student in enumerate(STUDENTS):  # what nbgrader collect writes beside each notebook
        with open(os.path.join(root, "submitted", student, A, "timestamp.txt"), "w") as f:
            f.write(f"2026-03-0{i + 1} 12:00:00.000000 UTC")
    return root


def test_round_robin_shards_of_8_students_over_3_tasks_are_3_3_2_in_a_stable_order():
    from autograder.grading.classrun import shard_of

    students = ["hana", "ali", "gus", "bea", "fay", "cy", "eve", "dan"]
    shards = [shard_of(students, i, 3) for i in (1, 2, 3)]
    assert shards == [["ali", "dan", "gus"], ["bea", "eve", "hana"], ["cy", "fay"]]
    assert [len(s) for s in shards] == [3, 3, 2]
    # the same split whatever order the machine lists submitted/ in, and every student in exactly one shard
    assert [shard_of(sorted(students, reverse=True), i, 3) for i in (1, 2, 3)] == shards
    assert sorted(sum(shards, [])) == sorted(students)
    for n in range(1, 10):  # any class over any number of tasks: sizes differ by at most one
        sizes = [len(shard_of(students, i, n)) for i in range(1, n + 1)]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 8


def test_every_shard_entry_point_gives_the_same_slice(monkeypatch, built, tmp_path):
    """`--shard I/N`, `--shard slurm/N` (SLURM_ARRAY_TASK_ID, 1-based) and `--shard k8s/N` (JOB_COMPLETION_INDEX,
    0-based) name the same shard, and the class run takes exactly `shard_of`'s slice of its students (here
    students without a submission: each gets a record saying so, and nothing is graded)."""
    from autograder.grading.classrun import _plan, shard_of
    from autograder.grading.cli import _shard

    everyone = ["ali", "bea", "cy", "dan", "eve"]
    for i in (1, 2, 3):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(i))
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(i - 1))
        assert _shard(f"{i}/3") == _shard("slurm/3") == _shard("k8s/3") == (i, 3)
        plan = _plan(built, A, str(tmp_path / f"work-{i}"), students=everyone, shard=_shard("slurm/3"), force=True,
                     isolate=False, memory_bytes=None, max_pids=None, budget=600.0, second_backend=None)
        assert not plan["todo"] and [r["student"] for r in plan["records"]] == shard_of(everyone, i, 3), plan


def _merge(root: str, *files: str) -> subprocess.CompletedProcess:
    """`merge` as the README's merge job runs it: `.venv/bin/python` with a plain shell's PATH (no venv on it)."""
    return subprocess.run([os.path.join(root, ".venv", "bin", "python"), "-m", "autograder.grade", "merge", *files],
                          cwd=root, env={**env(root), "PATH": _SBIN}, capture_output=True, text=True, timeout=600)


def _shard_file(root: str, students: list[str]) -> str:
    """A shard file as a task writes it, of students whose notebooks could not be read (no sandbox needed)."""
    from autograder.grading.classrun import _rejected, shard_path

    cells = [("test_copy_to_region", 6.0), ("test_reduce_from_region", 6.0)]
    recs = [_rejected(A, s, "no notebook", [], "0" * 16, "0" * 16, 12.0, cells) for s in students]
    path = shard_path(root, A, 1, 1)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"assignment": A, "shard": [1, 1], "records": recs}, f)
    return os.path.relpath(path, root)


def test_merge_on_a_fresh_clone_makes_the_gradebook_whole_or_not_at_all(built, tmp_path):
    """No `make build`, no venv on PATH (a Slurm job's shell): merge makes the gradebook (nbgrader's alembic
    found in the venv) and writes the grades; where it cannot, it says why and leaves no gradebook.db at all."""
    from grading_course import gradebook

    root = _fresh_copy(built, str(tmp_path / "good"))
    os.symlink(os.path.dirname(VENV_BIN), os.path.join(root, ".venv"))
    assert not os.path.exists(os.path.join(root, "gradebook.db"))
    proc = _merge(root, _shard_file(root, ["zoe", "yan"]))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gradebook.db: made (nbgrader generate_assignment of source/" in proc.stdout
    assert gradebook(root) == {s: {"test_copy_to_region": 0.0, "test_reduce_from_region": 0.0} for s in ("yan", "zoe")}
    assert not [n for n in os.listdir(root) if n.startswith(".gradebook-")], "no scratch folder left"
    again = _merge(root, _shard_file(root, ["zoe", "yan"]))  # the gradebook is there: used as it is
    assert again.returncode == 0 and "gradebook.db: made" not in again.stdout, again.stdout + again.stderr

    root = _fresh_copy(built, str(tmp_path / "broken"))
    os.symlink(os.path.dirname(VENV_BIN), os.path.join(root, ".venv"))
    src = next(os.path.join(root, "source", A, n) for n in os.listdir(os.path.join(root, "source", A)))
    with open(src, "w") as f:
        f.write("{ not a notebook")
    proc = _merge(root, _shard_file(root, ["zoe"]))
    assert proc.returncode != 0
    assert f"could not add {A} to the gradebook" in proc.stderr and "gradebook.db is unchanged" in proc.stderr, \
        proc.stderr[-3000:]
    assert not os.path.exists(os.path.join(root, "gradebook.db")), "no half-made gradebook"
    assert not [n for n in os.listdir(root) if n.startswith(".gradebook-")]


def _oversized_tasks_wait_with_a_reason(cluster, course, cmds: dict, job_env: dict) -> None:
    """The README's array with C above the node's CPUs: Slurm takes it and never starts it; the README's squeue
    line says why (PartitionConfig). Then cancelled."""
    cpus = int(cluster.run("sinfo", "-h", "-N", "-o", "%c").stdout.split()[0])
    script = f"A={A} N=2 C={cpus + 1} M=1G\n{cmds['array']}\necho \"array job $jid\"\n"
    proc = subprocess.run(["bash", "-euc", script], cwd=course, env=job_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jid = re.search(r"^array job (\d+)$", proc.stdout, re.M).group(1)
    cluster.jobs.append(jid)
    squeue = f"jid={jid}\n{cmds['squeue']}"
    seen = ""
    for _ in range(60):
        seen = subprocess.run(["bash", "-euc", squeue], env=job_env, capture_output=True, text=True,
                              timeout=60).stdout
        if "PartitionConfig" in seen:
            break
        time.sleep(0.5)
    assert re.search(rf"^{jid}_\[1-2\] PENDING PartitionConfig$", seen, re.M), seen
    cluster.run("scancel", jid)
    _wait("the oversized array leaves the queue", lambda: not cluster.run("squeue", "-h", check=False).stdout.strip(),
          60, cluster.logs)


@needs_sandbox
@needs_slurm
def test_the_readme_slurm_commands_grade_a_fresh_clone_as_an_array_and_merge_gives_the_single_run(cluster, course):
    """In a fresh copy of the course (no `make build`, no gradebook.db), the README's Slurm lines as they stand:
    the tasks make the gradebook first, grade round-robin slices, write only their shard files (and say so),
    and `merge` gives the gradebook a single `autograde` run gives."""
    from autograder.grading.classrun import shard_of

    cmds = _readme_commands()
    n = 2
    assert not os.path.exists(os.path.join(course, "gradebook.db")), "a fresh clone: no gradebook yet"
    assert not os.path.exists(os.path.join(course, "graded")), "a fresh clone: nothing graded yet"
    job_env = {**env(course), **cluster.env_vars()}
    nodes = subprocess.run(["bash", "-euc", cmds["sinfo"]], env=job_env, capture_output=True, text=True, timeout=60)
    assert re.search(rf"^{cluster.host} \d+ \d+$", nodes.stdout, re.M), nodes.stdout + nodes.stderr
    _oversized_tasks_wait_with_a_reason(cluster, course, cmds, job_env)
    # the README's commands, with this machine's sizes: N tasks of C CPUs and M memory each
    script = f"A={A} N={n} C=1 M=3G\n{cmds['array']}\necho \"array job $jid\"\n{cmds['merge']}"
    proc = subprocess.run(["bash", "-euc", script], cwd=course, env=job_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    array_id = re.search(r"^array job (\d+)$", proc.stdout, re.M).group(1)
    merge_id = re.search(r"^Submitted batch job (\d+)$", proc.stdout, re.M).group(1)
    cluster.jobs += [array_id, merge_id]
    states = cluster.wait_done(array_id, 900)
    logs = [os.path.join(course, f) for f in sorted(os.listdir(course)) if f.startswith("slurm-")]
    assert states == ["COMPLETED"] * n, f"the array:\n{cluster.describe(array_id)}\n" + _tails(logs + cluster.logs)
    states = cluster.wait_done(merge_id, 300)
    assert states == ["COMPLETED"], f"the merge:\n{cluster.describe(merge_id)}\n" + _tails(logs + cluster.logs)
    for i in range(1, n + 1):
        path = os.path.join(course, "graded", A, "shards", f"shard-{i}-of-{n}.json")
        assert os.path.exists(path), f"shard {i} of {n}"
    # each task's log is where the script says, in the course root (ignored by git), and says what it wrote
    task_logs = [f for f in logs if re.search(rf"slurm-autograde-{array_id}_\d\.out$", f)]
    assert len(task_logs) == n, logs
    texts = {f: open(f).read() for f in task_logs}
    for f, text in texts.items():
        i = int(re.search(r"_(\d)\.out$", f).group(1))
        named = re.findall(r"^This shard wrote (\S+) only \(its records and feedback HTML\)", text, re.M)
        assert len(named) == 1 and f"wrote {named[0]} only; `merge` it" in text, text
        with open(os.path.join(course, named[0])) as fh:
            bundle = json.load(fh)
        assert bundle["shard"] == [i, n], "the file the log names is this task's shard file"
        assert named[0] == f"graded/{A}/shards/shard-{i}-of-{n}.json", named
        assert sorted(r["student"] for r in bundle["records"]) == shard_of(list(STUDENTS), i, n) \
            == sorted(STUDENTS)[i - 1::n]
        assert "Gradebook: gradebook.db" not in text, text
    made = [f for f, t in texts.items() if "gradebook.db: made (nbgrader generate_assignment" in t]
    assert len(made) == 1, "the first task made the gradebook, the other found it:\n" + "\n".join(texts.values())
    assert not [f for f in os.listdir(course) if f.startswith(".gradebook-")], "no scratch folder left"
    slurm_book = _book(course)
    got = {s: r["score"] for s, r in records(course).items()}
    assert got == EXPECTED, "the scores graded under Slurm:\n" + "\n".join(
        f"{s}: {r['score']} {r['status']} {r['reason'] or ''} " + "; ".join(c["message"] or "" for c in r["cells"])
        for s, r in records(course).items())

    clear_results(course)
    proc = run_grade(course, "autograde", A, "--jobs", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    single_book = _book(course)
    assert set(single_book) == set(STUDENTS)
    assert {s: sum(v for v, _ in b["cells"].values()) for s, b in single_book.items()} == EXPECTED
    assert single_book["dev"]["cells"]["test_copy_to_region"][1], "the broken notebook is flagged for review"
    assert single_book["ana"]["timestamp"] == datetime.datetime(2026, 3, 1, 12, 0), "the submission's time"
    assert slurm_book == single_book
