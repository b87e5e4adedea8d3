"""The course as a Gradescope autograder, set up and run as Gradescope does it.

    .venv/bin/python -m pytest -q tests/test_gradescope.py

The zip of the cut-down 02 (tests/grading_course.py, two graded cells of 6
points) is unpacked into a scratch root laid out as Gradescope's /autograder:
source/ (the zip), submission/, results/, the two scripts copied beside them.
Its setup.sh runs as root from source/ and makes a fresh virtual environment,
root/venv: `python3 -m venv` with the system's python3 and pip from the
package index (and this machine's local torch wheel), nothing of the course's
.venv, no PYTHONPATH. run_autograder grades each upload from the root
(Gradescope's working directory):
- a right upload gets every point; a partly right one the score the class
  command (`autograde`) gives the same notebook;
- without its sandbox (bubblewrap not on PATH; a root grader whose bubblewrap
  cannot build its namespaces) it refuses with the class command's message,
  runs nothing, and results.json tells the student the upload was not graded:
  a stub that takes the instructor's solutions from source/ when it runs
  unsandboxed gets no point;
- the sandbox check examines the course it grades, not the working directory.
One environment serves every upload; most of the file's time is setup.sh (pip
writing torch into the fresh venv), the class command grading the partly right
notebook meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

from grading_course import (A, POINTS, edit, make_mini_course, needs_sandbox, records, reference, release, run_grade,
                            write_submission)
from grading_course import env as course_env

WRONG = ("return _reduce(grad_output, ctx.group), None", "return grad_output, None")  # f's backward forgotten
FULL = sum(POINTS.values())
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOT_GRADED = "This upload could not be graded: "

pytestmark = [pytest.mark.timeout(1800), needs_sandbox,
              pytest.mark.skipif(os.geteuid() != 0, reason="Gradescope runs setup.sh as root (apt-get)")]

# A stub (nothing implemented) that, where it runs unsandboxed, takes the instructor's solutions from the source
# notebook the zip puts beside the grader's interpreter (<root>/source/source/<assignment>/): in the sandbox that
# folder is not there, and it stays a stub.
STEAL = """
import glob as _glob, json as _json, os as _os, sys as _sys
for _path in _glob.glob(_os.path.join(_os.path.dirname(_sys.prefix), "source", "source", "*", "*.ipynb")):
    for _cell in _json.load(open(_path))["cells"]:
        if _cell["metadata"].get("nbgrader", {}).get("solution"):
            exec("".join(_cell["source"]))
"""


def _env(**extra) -> dict:
    """What a process of Gradescope's image has: the system's PATH, no PYTHONPATH, no virtual environment of ours;
    this machine's pip settings (its local torch wheel, a mirror) are kept for setup.sh's pip."""
    env = {"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    env.update(extra)
    return env


def _unzip(zip_path: str, dest: str) -> None:
    """Unpack as Gradescope does, the scripts' modes included (zipfile's extractall drops them)."""
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            path = z.extract(info, dest)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(path, stat.S_IMODE(mode))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return make_mini_course(tmp_path_factory.mktemp("gradescope-course"))


def _partly(course: str) -> dict:
    return edit(reference(course), "tp_mappings", lambda s: s.replace(*WRONG))


@pytest.fixture(scope="module")
def autograder(course, tmp_path_factory):
    """The Gradescope layout (a scratch root) with setup.sh run, and the class command's score for the partly right
    notebook (graded meanwhile: setup.sh mostly waits for the disk and the network): {"root", "zip", "class"}."""
    out = tmp_path_factory.mktemp("gradescope-zip")
    proc = run_grade(course, "gradescope-package", A, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    write_submission(course, "partly", _partly(course))
    grading = subprocess.Popen([sys.executable, "-m", "autograder.grade", "autograde", A, "--quiet"], cwd=course,
                               env=course_env(course), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    zip_path = str(out / f"gradescope-{A}.zip")
    root = str(tmp_path_factory.mktemp("gradescope") / "autograder")
    source = os.path.join(root, "source")
    _unzip(zip_path, source)
    for script in ("setup.sh", "run_autograder"):  # Gradescope copies both to /autograder
        shutil.copy2(os.path.join(source, script), os.path.join(root, script))
    # PyTorch's CPU index, setup.sh's default, is not reachable from this machine: pip's own index, where this
    # machine's pip settings add its CPU wheel of the same release
    env = _env(TORCH_INDEX_URL=os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"))
    proc = subprocess.run([os.path.join(source, "setup.sh")], cwd=source, env=env, capture_output=True, text=True,
                          timeout=1500)
    said = grading.communicate(timeout=1500)[0]
    assert proc.returncode == 0, f"setup.sh failed: {_said(proc)}"
    assert grading.returncode == 0, f"the class command failed:\n{said[-3000:]}"
    yield {"root": root, "zip": zip_path, "class": records(course)["partly"]["score"]}
    # about 1 GB of virtual environment, removed in the background: deleting it is bound by the disk (a minute and
    # more on our machine's, for 2 s of CPU), and the run need not wait for it
    subprocess.Popen(["rm", "-rf", "--", root], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _upload(root: str, nb: dict, name: str) -> None:
    """A fresh submission/ and results/, as in each of Gradescope's containers."""
    for folder in ("submission", "results"):
        shutil.rmtree(os.path.join(root, folder), ignore_errors=True)
        os.makedirs(os.path.join(root, folder))
    with open(os.path.join(root, "submission", name), "w", encoding="utf-8") as f:
        json.dump(nb, f)


def _run_autograder(root: str, *, script: str | None = None, cwd: str | None = None, env: dict | None = None,
                    prefix: tuple = ()) -> tuple[subprocess.CompletedProcess, dict | None]:
    proc = subprocess.run([*prefix, script or os.path.join(root, "run_autograder")], cwd=cwd or root,
                          env=env or _env(), capture_output=True, text=True, timeout=900)
    return proc, _results(root)


def _results(root: str) -> dict | None:
    path = os.path.join(root, "results", "results.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _said(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def test_setup_sh_installs_what_grading_imports_and_nothing_of_the_course_tools(autograder):
    """The fresh environment: the wheel and what it declares for grading, none of the instructor's tools."""
    root = autograder["root"]
    with zipfile.ZipFile(autograder["zip"]) as z:
        names = z.namelist()
    assert {"setup.sh", "run_autograder"} <= set(names)
    wheels = [n for n in names if n.startswith("wheels/") and n.endswith(".whl")]
    assert len(wheels) == 1, names
    assert not [n for n in names if n.startswith(("solutions/", "tests/"))], names
    with zipfile.ZipFile(os.path.join(root, "source", wheels[0])) as whl:  # the whole package: it grades
        assert {"autograder/grading/gradescope.py", "autograder/grading/trusted.py", "autograder/runtime/dist.py",
                "autograder/checks/__init__.py"} <= set(whl.namelist())
    cfg = open(os.path.join(root, "venv", "pyvenv.cfg"), encoding="utf-8").read()
    assert "include-system-site-packages = false" in cfg, cfg
    proc = subprocess.run([os.path.join(root, "venv", "bin", "python"), "-m", "pip", "list", "--format", "json"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(proc.stdout)}
    assert {"llm-parallelism-course", "torch", "nbformat", "cloudpickle"} <= installed, sorted(installed)
    assert not installed & {"nbgrader", "jupyterlab", "pytest"}, sorted(installed)


def test_run_autograder_grades_uploads_as_the_class_command_does(autograder, course):
    """A right upload gets every point; a partly right one the class command's score for the same notebook. Run
    as Gradescope runs it (/autograder/run_autograder from /autograder), and the zip's own copy from elsewhere."""
    root, class_score = autograder["root"], autograder["class"]  # the class command's, for the same notebook
    assert 0 < class_score < FULL, records(course)["partly"]

    _upload(root, reference(course), "my_lab.ipynb")  # Gradescope keeps the student's file name
    proc, results = _run_autograder(root)
    assert proc.returncode == 0 and results is not None, _said(proc)
    assert results["score"] == FULL, (results, _said(proc))
    assert len(results["tests"]) == len(POINTS), results
    assert all(t["status"] == "passed" and t["name"].startswith("Exercise 1 \u00b7 ") for t in results["tests"])

    _upload(root, _partly(course), "tensor_parallel_lab.ipynb")
    proc, results = _run_autograder(root, script=os.path.join(root, "source", "run_autograder"), cwd="/")
    assert proc.returncode == 0 and results is not None, _said(proc)
    assert results["score"] == class_score, (results, _said(proc))
    assert sorted(t["score"] for t in results["tests"]) == [0, 6], results["tests"]
    assert root not in json.dumps(results), results  # no path of the grading machine


def _path_without_bwrap(tmp_path) -> str:
    """A PATH with every command of the system's PATH but bubblewrap (an image where it is not installed)."""
    farm = tmp_path / "bin-without-bwrap"
    farm.mkdir()
    for d in SYSTEM_PATH.split(":"):
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if name != "bwrap" and not (farm / name).exists():
                os.symlink(os.path.join(d, name), farm / name)
    return str(farm)


def _assert_refused(proc, results, *, reason: str) -> str:
    assert proc.returncode == 1, _said(proc)
    out = proc.stdout + proc.stderr
    assert f"no sandbox: {reason}" in out and "Nothing was graded" in out, _said(proc)
    assert results is not None, f"no results.json: Gradescope would say only that the autograder failed\n{_said(proc)}"
    assert results["score"] == 0 and results["tests"] == [], results
    assert results["output"].startswith(NOT_GRADED), results
    return out[out.index("no sandbox: "):].splitlines()[0]


def test_without_bubblewrap_run_autograder_refuses_as_the_class_command_does(autograder, course, tmp_path):
    """bubblewrap not on PATH: the class command's refusal, word for word, and a stub that would take the
    solutions unsandboxed gets no point."""
    root = autograder["root"]
    path = _path_without_bwrap(tmp_path)
    stub = edit(release(course), "tp_mappings", lambda s: s + STEAL)
    _upload(root, stub, "tensor_parallel_lab.ipynb")
    proc, results = _run_autograder(root, env=_env(PATH=path))
    said = _assert_refused(proc, results, reason="bubblewrap (bwrap) is not installed")
    # the class command in the same setting
    cls = subprocess.run([sys.executable, "-m", "autograder.grade", "autograde", A, "--quiet"], cwd=course,
                         env={**course_env(course), "PATH": path}, capture_output=True, text=True, timeout=300)
    assert cls.returncode != 0, cls.stdout + cls.stderr
    assert said in cls.stdout + cls.stderr, f"run_autograder said:\n{said}\nthe class command:\n{cls.stderr}"


def test_where_bubblewrap_cannot_build_its_sandbox_run_autograder_refuses(autograder, course):
    """A root grader without CAP_NET_ADMIN (a container's default): bubblewrap fails, nothing is graded."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to drop a capability of a root grader for real")
    root = autograder["root"]
    stub = edit(release(course), "tp_mappings", lambda s: s + STEAL)
    _upload(root, stub, "tensor_parallel_lab.ipynb")
    proc, results = _run_autograder(root, prefix=("setpriv", "--bounding-set", "-net_admin", "--inh-caps",
                                                  "-net_admin"))
    _assert_refused(proc, results, reason="bubblewrap cannot create its sandbox here")


def test_the_sandbox_check_examines_the_course_it_grades_not_the_working_directory(autograder, course):
    """Run from /autograder (Gradescope's working directory) on a course whose files the sandbox would show (here:
    inside the bound virtual environment): the probe looks at that course, finds its hidden tests visible and
    refuses, where a probe of the working directory found nothing and graded."""
    root = autograder["root"]
    exposed = os.path.join(root, "venv", "exposed-course")
    for kind in ("source", "release"):
        shutil.copytree(os.path.join(root, "source", kind), os.path.join(exposed, kind))
    try:
        _upload(root, release(course), "tensor_parallel_lab.ipynb")
        proc = subprocess.run([os.path.join(root, "venv", "bin", "python"), "-m", "autograder.grading.gradescope", A,
                               "--course", exposed, "--submission", os.path.join(root, "submission"),
                               "--results", os.path.join(root, "results", "results.json")],
                              cwd=root, env=_env(), capture_output=True, text=True, timeout=900)
        _assert_refused(proc, _results(root),
                        reason="the sandbox is not safe to grade in: the course's files are visible")
        assert os.path.join(exposed, "source") in proc.stdout, _said(proc)
    finally:
        shutil.rmtree(exposed, ignore_errors=True)
