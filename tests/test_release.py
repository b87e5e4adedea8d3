"""What students receive: release/ plus the autograder package, and nothing else.

    .venv/bin/python -m pytest -q tests/test_release.py

- every release notebook has a stub in each answer cell, and no solution or
  hidden-test text;
- the student package (a wheel of `autograder`'s runtime, lessons and checks) holds no solutions, no
  hidden tests and not the instructor's layers (grading, authoring);
- with only that package and a release notebook, a student who completed the
  exercises runs every visible test and passes (a clean environment: no repo
  on the path, `solutions` not importable).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import zipfile

import nbformat
import pytest

from conftest import sample
from course import ROOT, assignments, secret_lines

sys.path.insert(0, ROOT)
from solutions import submissions  # noqa: E402

STUB = "raise NotImplementedError()"


def _meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def _secret_lines(assignment: str) -> tuple[list[str], list[str]]:
    return secret_lines(nbformat.read(submissions.notebook_path("source", assignment), as_version=4))


def _visible_text(assignment: str) -> set[str]:
    """Lines that legitimately appear outside secret regions of the source (e.g. a docstring)."""
    source = nbformat.read(submissions.notebook_path("source", assignment), as_version=4)
    out = set()
    for cell in source.cells:
        inside = False
        for line in cell.source.splitlines():
            if "### BEGIN" in line:
                inside = True
            elif "### END" in line:
                inside = False
            elif not inside:
                out.add(line.strip())
    return out


@pytest.mark.parametrize("assignment", assignments())
def test_release_has_stubs_and_no_solution_or_hidden_test_text(assignment):
    release_path = submissions.notebook_path("release", assignment)
    release = nbformat.read(release_path, as_version=4)
    text = open(release_path, encoding="utf-8").read()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"{release_path} contains {marker!r}"
    answer_cells = [c for c in release.cells if _meta(c).get("solution")]
    assert answer_cells, "no answer cells in the release"
    for cell in answer_cells:
        assert STUB in cell.source, f"answer cell {_meta(cell)['grade_id']} has no stub"
    solution, hidden = _secret_lines(assignment)
    assert solution and hidden, "the source notebook should have solution and hidden-test regions"
    allowed = _visible_text(assignment)
    released = {line.strip() for c in release.cells for line in c.source.splitlines()}
    leaked = [line for line in solution + hidden if line in released and line not in allowed]
    assert not leaked, f"secret lines in {release_path}: {leaked[:5]}"


@pytest.mark.parametrize("assignment", assignments())
def test_every_statement_of_every_graded_cell_can_run(assignment):
    """No statement of a test cell (hidden tests included) or an answer cell sits after a return, raise,
    continue or break, and no hidden-test block lands inside a function (06's hidden layout checks once did:
    a helper at column 0 joined with checks indented by four; 21 points graded by the visible cases alone)."""
    from autograder.authoring.nbbuild import unreachable_statements

    source = nbformat.read(submissions.notebook_path("source", assignment), as_version=4)
    dead = {}
    for cell in source.cells:
        meta = _meta(cell)
        if cell.cell_type == "code" and (meta.get("grade") or meta.get("solution")):
            found = unreachable_statements(cell.source)
            if found:
                dead[meta["grade_id"]] = [why for _, why in found]
    assert not dead, dead


def test_the_unreachable_statement_finder_finds_them():
    from autograder.authoring.nbbuild import unreachable_statements

    helper_joined = ("with checking('Exercise 1', 'x'):\n    check(1)\n    ### BEGIN HIDDEN TESTS\n"
                     "    def _helper():\n        return 1\n        check(2)\n    ### END HIDDEN TESTS\n")
    assert [line for line, _ in unreachable_statements(helper_joined)] == [6]
    inside_visible_helper = ("with checking('Exercise 1', 'x'):\n    def _helper():\n        return 1\n"
                             "    ### BEGIN HIDDEN TESTS\n        check(2)\n    ### END HIDDEN TESTS\n")
    assert [line for line, _ in unreachable_statements(inside_visible_helper)] == [4, 5]
    loop = "for i in range(3):\n    if i:\n        continue\n        print(i)\n    break\nprint('done')\n"
    assert [line for line, _ in unreachable_statements(loop)] == [4]
    fine = ("def f(x):\n    if x:\n        return 1\n    return 2\n"
            "try:\n    f(1)\nexcept ValueError:\n    raise\nfinally:\n    pass\n")
    assert unreachable_statements(fine) == []


@pytest.fixture(scope="module")
def student_package(tmp_path_factory):
    """The autograder wheel, as the instructor ships it, in a fresh environment.

    The environment is a new venv that sees the course venv's third-party
    packages (torch, nbclient, ipykernel: a .pth line) but not its editable
    install of this repository: `autograder` comes from the wheel alone.
    """
    from autograder.authoring.package import build_wheel

    tmp = tmp_path_factory.mktemp("student")
    wheel_dir = tmp / "wheel"
    wheels = [build_wheel(ROOT, str(wheel_dir), student=True)]
    assert glob.glob(str(wheel_dir / "*.whl")) == wheels
    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    course_site = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)][0]
    with open(os.path.join(site, "course_third_party.pth"), "w") as f:
        f.write(course_site + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, wheels[0]],
                   check=True, capture_output=True)
    return wheels[0], str(python), site


def test_student_package_holds_no_solutions_or_hidden_tests(student_package):
    wheel = student_package[0]
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("runtime/dist.py", "runtime/ledger.py", "runtime/compare.py", "runtime/report.py",
                   "lessons/volume.py", "checks/__init__.py"):
        assert f"autograder/{module}" in names, names
    for assignment in assignments():  # a package per dimension, with its modules (setuptools finds subpackages)
        dim = assignment.split('_', 1)[1]
        assert f"autograder/checks/{dim}/__init__.py" in names, names
        modules = {f"autograder/checks/{dim}/{os.path.basename(p)}"
                   for p in glob.glob(os.path.join(ROOT, "autograder", "checks", dim, "*.py"))}
        assert len(modules) > 1 and modules <= set(names), sorted(modules - set(names))
    assert not [n for n in names if n.startswith(("solutions/", "tests/", "source/"))], names
    layers = {n.split("/")[1] for n in names if n.startswith("autograder/") and n.count("/") >= 2}
    assert layers == {"runtime", "lessons", "checks"}, f"the student wheel holds {sorted(layers)}"
    assert not [n for n in names if n.startswith("autograder/") and n.count("/") == 1
                and n != "autograder/__init__.py"], names  # not the grading command (autograder/grade.py)
    body = "\n".join(zipfile.ZipFile(wheel).read(n).decode("utf-8", "replace") for n in names if n.endswith(".py"))
    for assignment in assignments():
        solution, hidden = _secret_lines(assignment)
        leaked = [line for line in hidden if line in body]
        assert not leaked, f"hidden-test lines of {assignment} in the student package: {leaked[:3]}"
        # generic short lines (`return module`) may coincide; a substantive solution line may not
        leaked = [line for line in solution if len(line) >= 30 and line in body]
        assert not leaked, f"solution lines of {assignment} in the student package: {leaked[:3]}"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_student_archive_holds_the_notebooks_the_lessons_and_the_wheel_only(tmp_path, lang):
    """dist/llm-parallelism-course.tar.gz: one folder; no solution or hidden-test text in any file of it. The
    Chinese package (`make student-package COURSE_LANG=zh`) holds the Chinese notebooks, the Chinese lessons
    (and the English ones they link while not all are translated) and the Chinese student section."""
    import tarfile

    from autograder.authoring.package import PACKAGE_DIR, build_student_package, student_commands

    archive = build_student_package(ROOT, str(tmp_path), lang)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        names = [m.name for m in members]
        texts = {}
        for m in members:
            data = tar.extractfile(m).read()
            if m.name.endswith(".whl"):
                import io

                with zipfile.ZipFile(io.BytesIO(data)) as whl:
                    for n in whl.namelist():
                        texts[f"{m.name}!{n}"] = whl.read(n).decode("utf-8", "replace")
            else:
                texts[m.name] = data.decode("utf-8", "replace")
    top = {n.split("/")[1] for n in names}
    assert all(n.startswith(PACKAGE_DIR + "/") for n in names)
    assert top == {"README.md", "release", "assignments", "wheels"} | ({"zh"} if lang == "zh" else set()), top
    # its README is the student section in its language, with the English section's commands exactly
    readme = texts[f"{PACKAGE_DIR}/README.md"]
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    english = student_commands(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    assert [line for line in block.splitlines() if line and not line.startswith("#")] == english
    assert bool(re.search(r"[\u4e00-\u9fff]", readme)) == (lang == "zh"), readme[:200]
    for assignment in assignments():
        assert f"{PACKAGE_DIR}/assignments/{assignment}/README.md" in names
        release = f"{PACKAGE_DIR}/release/{assignment}/{os.path.basename(submissions.notebook_path('release', assignment))}"
        assert release in names
        nb = nbformat.reads(texts[release], as_version=4)
        assert nb.metadata.get("course", {}).get("language", "en") == lang, f"{release} is not in {lang}"
        if lang == "zh":
            assert f"{PACKAGE_DIR}/zh/assignments/{assignment}/README.md" in names
            assert re.search(r"[\u4e00-\u9fff]", nb.cells[0].source), f"{release}: its first cell is not Chinese"
        solution, hidden = _secret_lines(assignment)
        allowed = _visible_text(assignment)
        for path, text in texts.items():
            lines = {line.strip() for line in text.splitlines()}
            leaked = [line for line in hidden if line in text and line not in allowed]
            assert not leaked, f"hidden-test text of {assignment} in {path}: {leaked[:3]}"
            leaked = [line for line in solution if len(line) >= 30 and line in lines and line not in allowed]
            # a lesson may quote a formula line that a solution also has (`step_size = lr / bias_correction1`);
            # more than two such lines is a solution in the lesson
            limit = 2 if path.endswith(".md") else 0
            assert len(leaked) <= limit, f"solution text of {assignment} in {path}: {leaked[:5]}"
    assert not [n for n in names if "/solutions/" in n or "/source/" in n or "/tests/" in n]


_STUDENT_RUN = r"""
import sys, nbformat
from nbclient import NotebookClient
try:
    import solutions
    raise SystemExit("solutions is importable in the student environment")
except ImportError:
    pass
import autograder, autograder.checks
assert autograder.__file__.startswith(sys.argv[2]), autograder.__file__
assert autograder.checks.__file__.startswith(sys.argv[2]), autograder.checks.__file__
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
bad = []
for cell in nb.cells:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            bad.append((cell.metadata.get("nbgrader", {}).get("grade_id"), out["ename"], out["evalue"][:300]))
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            bad.append((cell.metadata.get("nbgrader", {}).get("grade_id"), "stderr", out["text"][:300]))
print("ERRORS", bad)
sys.exit(1 if bad else 0)
"""


# a sample in make test (03 and 06 run from the package in JupyterLab too: tests/test_browser.py); all with test-all
@pytest.mark.parametrize("assignment", sample(assignments(), always={"01_data_parallel", "05_expert_parallel"}))
def test_a_student_with_only_the_package_runs_every_visible_test(assignment, student_package, tmp_path):
    _, python, site = student_package
    nb = submissions.reference_submission(assignment)  # the release notebook, completed by a student
    path = tmp_path / "lab.ipynb"
    nbformat.write(nb, str(path))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([python, "-c", _STUDENT_RUN, str(path), site], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
