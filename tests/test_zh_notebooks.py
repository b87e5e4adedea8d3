"""The Chinese notebooks (issue 24): every cell's text translated, the same cells, the same grades.

    .venv/bin/python -m pytest -q tests/test_zh_notebooks.py                      # ~1 min: catalogs, one graded
    COURSE_EXHAUSTIVE=1 .venv/bin/python -m pytest -q tests/test_zh_notebooks.py  # every assignment graded

`make build COURSE_LANG=zh` writes source/ and release/ with each markdown cell's text taken from
zh/notebooks/<assignment>.md (autograder/authoring/translations.py). Here:

- every markdown cell the builders make (English) has a current translation; an English change fails
  here, naming the cell and showing what changed (`translations sync` then marks the entry TODO);
- each translation keeps its cell's structure, as the lessons' twins do (tests/test_zh_parity.py):
  headings, formulas, code blocks and code spans, links, tables, the numbers of the prose; its links
  open the Chinese lesson wherever one exists; its prose is Chinese and follows zh/GLOSSARY.md;
- a Chinese notebook is the English one with only its text changed, the markdown and the code cells'
  prose (cells, ids, grading ids, code, metadata: tests/test_zh_code_cells.py checks the code token by
  token), and the on-the-fly translation (student package, site) is the Chinese build, byte for byte;
- the release leak check of tests/test_release.py holds for the Chinese release and the catalogs;
- grading: the Chinese release built with nbgrader, graded by `python -m autograder.grade demo`
  (reference, untouched and wrong submissions), gets exactly the English release's scores, cell by
  cell: every point, none, and all but the cells the wrong submission's mistake fails, which is what
  tests/test_pipeline.py's demo holds the English release to (one assignment in `make test`, all six
  with COURSE_EXHAUSTIVE=1).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time

import nbformat
import pytest

from course import ROOT, VENV_BIN, assignments, copy_course
from test_zh_parity import CJK, MIN_CJK_SHARE, Lesson, glossary_violations, link_problems, structure_differences

sys.path.insert(0, ROOT)
from autograder.authoring.translations import (  # noqa: E402
    catalog_path, english_cells, load_catalog, status, translate_notebook,
)
from solutions import submissions  # noqa: E402

# the assignment graded in both languages by `make test` (the others with COURSE_EXHAUSTIVE=1): the quickest
GRADED_ALWAYS = "02_tensor_parallel"


@pytest.fixture(scope="module")
def cells():
    """{assignment: the builder's markdown texts, in order}."""
    return {a: english_cells(ROOT, a) for a in assignments()}


def _release_rel(assignment: str) -> str:
    return os.path.relpath(submissions.notebook_path("release", assignment), ROOT)


@pytest.mark.parametrize("assignment", assignments())
def test_every_markdown_cell_has_a_current_translation(assignment, cells):
    problems = status(ROOT, assignment, "zh", cells[assignment])
    assert not problems, (
        f"the Chinese notebook text of {assignment} is out of step with its builder:\n\n"
        + "\n\n".join(problems)
        + f"\n\nThen run `.venv/bin/python -m autograder.authoring.translations sync {assignment}` (it writes each "
          "new English text beside the old translation, marked TODO(zh)) and update the Chinese.")


def _pairs(assignment: str, cells) -> list[tuple[int, str, str]]:
    table = {e.english: e.text for e in load_catalog(catalog_path(ROOT, "zh", assignment)) if not e.todo}
    return [(i, en, table[en]) for i, en in enumerate(cells[assignment]) if en in table]


@pytest.mark.parametrize("assignment", assignments())
def test_each_translation_keeps_its_cells_structure_and_links(assignment, cells):
    rel = _release_rel(assignment)       # the links of a cell are relative to the notebook's folder
    pairs = _pairs(assignment, cells)
    assert pairs, f"no translated cell in {catalog_path(ROOT, 'zh', assignment)}"
    problems = []
    for i, en, zh in pairs:
        where = f"markdown cell {i + 1} ({en.splitlines()[0][:70]!r})"
        en_doc, zh_doc = Lesson(rel, en), Lesson(rel, zh)
        problems += [f"{where}: {p}" for p in structure_differences(en_doc, zh_doc)]
        problems += [f"{where}: {p}" for p in link_problems(zh_doc)]
        for href, target, _fragment in zh_doc.relative_links():     # the Chinese twin whenever one exists
            if target and target.startswith("assignments/") and os.path.exists(os.path.join(ROOT, "zh", target)):
                problems.append(f"{where}: link {href!r} opens the English {target}; its Chinese twin "
                                f"zh/{target} exists: link that")
    assert not problems, f"zh/notebooks/{assignment}.md:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("assignment", assignments())
def test_the_chinese_text_is_chinese_and_follows_the_glossary(assignment, cells):
    prose = []
    for i, _en, zh in _pairs(assignment, cells):
        doc = Lesson(_release_rel(assignment), zh)
        text = " ".join(doc.prose)
        prose.append(text)
        used = glossary_violations(text)
        assert not used, (f"zh/notebooks/{assignment}.md, markdown cell {i + 1} uses renderings zh/GLOSSARY.md "
                          "rules out: " + ", ".join(f"{w!r} (write {t})" for w, t in used.items()))
    text = " ".join(prose)
    cjk, latin = len(CJK.findall(text)), len(re.findall(r"[A-Za-z]", text))
    assert cjk / max(1, cjk + latin) >= MIN_CJK_SHARE, f"{assignment}: the Chinese text is mostly not Chinese"


def test_the_lesson_links_of_a_chinese_notebook_open_chinese_lessons(cells):
    """The rule of link_problems, made visible: a Chinese notebook links zh/assignments/ (the twins)."""
    zh_links = en_links = 0
    for a in assignments():
        for _i, _en, zh in _pairs(a, cells):
            for _h, target, _f in Lesson(_release_rel(a), zh).relative_links():
                zh_links += bool(target and target.startswith("zh/assignments/"))
                en_links += bool(target and target.startswith("assignments/"))
    assert zh_links > 20 and zh_links > 4 * en_links, (zh_links, en_links)


# ---------------------------------------------------------------------------
# The same notebook, only the text translated
# ---------------------------------------------------------------------------

def _build_source(assignment: str, lang: str, dest: str) -> str:
    """Write the source notebook of `assignment` as its builder makes it, in `lang`, to `dest`."""
    import importlib.util

    path = os.path.join(ROOT, "assignments", assignment, "_build_nb.py")
    spec = importlib.util.spec_from_file_location(f"_zh_test_build_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    module.build().write(dest, lang=lang)
    return dest


def _skeleton(nb) -> list:
    """What grading sees of a notebook: every cell but its text (the markdown, and the code cells' prose: their
    code without comments and strings' text, codetext.code_signature), and the notebook's metadata."""
    from autograder.authoring.codetext import code_signature

    meta = {k: v for k, v in nb.metadata.items() if k != "course"}
    return [meta] + [(c.cell_type, c.get("id"), c.metadata,
                      code_signature(c.source) if c.cell_type == "code" else None) for c in nb.cells]


def _translated(path: str, assignment: str) -> str:
    """The notebook at `path` translated on the fly (as the student package and the site do), as written."""
    nb = nbformat.read(path, as_version=4)
    translate_notebook(nb, ROOT, assignment, "zh")
    buf = io.StringIO()
    nbformat.write(nb, buf)
    return buf.getvalue()


@pytest.mark.parametrize("assignment", assignments())
def test_a_chinese_notebook_is_the_english_one_with_its_text_translated(assignment, tmp_path):
    en_path = _build_source(assignment, "en", str(tmp_path / "en" / "lab.ipynb"))
    zh_path = _build_source(assignment, "zh", str(tmp_path / "zh" / "lab.ipynb"))
    en, zh = (nbformat.read(p, as_version=4) for p in (en_path, zh_path))
    assert _skeleton(en) == _skeleton(zh), "the Chinese build changed more than the text of a cell"
    assert zh.metadata["course"] == {"language": "zh"} and "course" not in en.metadata
    same = [c.source.splitlines()[0] for c, d in zip(en.cells, zh.cells) if c.cell_type == "markdown"
            and c.source == d.source]
    assert not same, f"markdown cells left in English: {same}"
    # the student package and the site translate the English notebook instead of rebuilding: the same bytes
    assert _translated(en_path, assignment) == open(zh_path, encoding="utf-8").read()


def _leaks(text: str, assignment: str) -> list[str]:
    """Solution or hidden-test lines of the assignment's source notebook in `text` (tests/test_release.py's rule)."""
    from test_release import _secret_lines, _visible_text

    solution, hidden = _secret_lines(assignment)
    allowed = _visible_text(assignment)
    lines = {line.strip() for line in text.splitlines()}
    return [line for line in hidden + [s for s in solution if len(s) >= 30]
            if line in lines and line not in allowed]


@pytest.mark.parametrize("assignment", assignments())
def test_no_solution_or_hidden_test_text_in_the_chinese_release_or_its_catalog(assignment):
    release = _translated(submissions.notebook_path("release", assignment), assignment)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in release
    nb = nbformat.reads(release, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert not _leaks(text, assignment), f"the Chinese release of {assignment} shows secret lines"
    catalog = open(catalog_path(ROOT, "zh", assignment), encoding="utf-8").read()
    leaked = _leaks(catalog, assignment)
    assert not leaked, f"zh/notebooks/{assignment}.md holds solution or hidden-test text: {leaked[:3]}"


# ---------------------------------------------------------------------------
# Graded in both languages: the same scores, cell by cell
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zh_course(tmp_path_factory):
    """A scratch copy of the course whose release will be rebuilt in Chinese."""
    return copy_course(str(tmp_path_factory.mktemp("zh-grading") / "zh"))


def _english_cells(assignment: str) -> dict[str, list[tuple]]:
    """What the English release gets, cell by cell: the reference every point, the untouched notebook none,
    the wrong submission all but the cells its mistake fails (the demo of tests/test_pipeline.py grades
    the English release and holds it to exactly this)."""
    source = nbformat.read(submissions.notebook_path("source", assignment), as_version=4)
    cells = [(c.metadata["nbgrader"]["grade_id"], float(c.metadata["nbgrader"]["points"])) for c in source.cells
             if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")
             and not c.metadata["nbgrader"].get("solution")]
    wrong = next(m for m in submissions.mutants_of(assignment) if m.demo).must_fail
    passes = {"reference": lambda gid: True, "untouched": lambda gid: False, "wrong": lambda gid: gid not in wrong}
    return {student: [(gid, pts if ok(gid) else 0.0, pts, ok(gid)) for gid, pts in cells]
            for student, ok in passes.items()}


def _env(root: str, lang: str) -> dict:
    return {**os.environ, "PYTHONPATH": root, "TORCH_CPP_LOG_LEVEL": "ERROR", "COURSE_LANG": lang,
            "AUTOGRADER_WORKDIR": os.path.join(root, ".grading-work"),
            "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")}


def _build_and_grade(root: str, lang: str, assignment: str) -> dict:
    """`make build COURSE_LANG=lang` for one assignment, then `make demo`'s grading of it: {student: record}."""
    proc = subprocess.run([sys.executable, os.path.join("assignments", assignment, "_build_nb.py")], cwd=root,
                          env=_env(root, lang), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stdout + proc.stderr
    proc = subprocess.run([os.path.join(VENV_BIN, "nbgrader"), "generate_assignment", assignment, "--force",
                           "--log-level=ERROR"], cwd=root, env=_env(root, lang), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "autograder.grade", "demo", assignment, "--quiet"], cwd=root,
                          env=_env(root, lang), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = {}
    for student in ("reference", "untouched", "wrong"):
        with open(os.path.join(root, "graded", assignment, f"{student}.json"), encoding="utf-8") as f:
            records[student] = json.load(f)
    return records


def _cells(record: dict) -> list[tuple]:
    return [(c["grade_id"], c["points"], c["max_points"], c["passed"]) for c in record["cells"]]


def _graded_params():
    return [pytest.param(a, id=a, marks=() if a == GRADED_ALWAYS else pytest.mark.exhaustive)
            for a in assignments()]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("assignment", _graded_params())
def test_the_chinese_release_grades_exactly_as_the_english(assignment, zh_course):
    t0 = time.monotonic()
    graded = _build_and_grade(zh_course, "zh", assignment)
    seconds = time.monotonic() - t0
    release = submissions.notebook_path("release", assignment).replace(ROOT, zh_course)
    built = open(release, encoding="utf-8").read()
    assert json.loads(built)["metadata"]["course"]["language"] == "zh"
    # the nbgrader-built Chinese release is the English release translated on the fly (package, site)
    assert built == _translated(submissions.notebook_path("release", assignment), assignment)
    assert not _leaks(built, assignment) and "BEGIN SOLUTION" not in built and "HIDDEN TESTS" not in built
    english = _english_cells(assignment)
    for student in ("reference", "untouched", "wrong"):
        zh = graded[student]
        assert zh["status"] == "graded", zh.get("reason")
        assert _cells(zh) == english[student], f"{student}: the Chinese release grades differently"
        assert (zh["score"], zh["max_score"]) == (sum(c[1] for c in english[student]),
                                                  sum(c[2] for c in english[student]))
    ref, untouched, wrong = (graded[s] for s in ("reference", "untouched", "wrong"))
    assert ref["score"] == ref["max_score"] > 0 and untouched["score"] == 0 < wrong["score"] < wrong["max_score"]
    # the feedback a Chinese student reads is the Chinese notebook, with the grader's (English) verdicts
    name = os.path.basename(release).replace(".ipynb", ".html")
    feedback = open(os.path.join(zh_course, "feedback", "wrong", assignment, name), encoding="utf-8").read()
    first = nbformat.reads(built, as_version=4).cells[0].source.splitlines()[0].lstrip("# ").strip()
    assert CJK.search(first) and first in feedback, first
    print(f"\n{assignment}: built and graded in Chinese in {seconds:.1f} s; scores "
          + ", ".join(f"{s} {graded[s]['score']:g}" for s in ("reference", "untouched", "wrong")))


# ---------------------------------------------------------------------------
# The commands: the release's language chooses what demo and the package build
# ---------------------------------------------------------------------------

def _make_n(root, *args) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_LANG", "MAKEFLAGS", "MAKELEVEL")}
    proc = subprocess.run(["make", "-n", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_make_builds_demos_and_packages_in_the_language_asked_or_found(tmp_path):
    """`make build COURSE_LANG=zh` builds Chinese, `make build` English; `make demo` rebuilds in the language
    release/ is in (or COURSE_LANG); `make student-package` packages that language (dry runs, on a copy whose
    release/ notebooks say they are Chinese)."""
    root = tmp_path / "course"
    root.mkdir()
    for name in ("Makefile", "nbgrader_config.py", "pyproject.toml"):
        shutil.copy2(os.path.join(ROOT, name), root / name)
    for name in (".venv", "autograder", "assignments"):
        os.symlink(os.path.join(ROOT, name), root / name)
    assert "COURSE_LANG=zh " in _make_n(root, "build", "COURSE_LANG=zh")
    assert "COURSE_LANG=en " in _make_n(root, "build")
    for a in assignments():
        path = submissions.notebook_path("release", a)
        nb = json.load(open(path, encoding="utf-8"))
        nb["metadata"]["course"] = {"language": "zh"}
        dest = root / "release" / a / os.path.basename(path)
        dest.parent.mkdir(parents=True)
        dest.write_text(json.dumps(nb), encoding="utf-8")
    demo = _make_n(root, "demo")
    assert "COURSE_LANG=zh " in demo and "autograder.grade demo" in demo, demo
    assert "COURSE_LANG=en " in _make_n(root, "demo", "COURSE_LANG=en")
    assert "--lang" not in _make_n(root, "student-package")          # the release's own language
    assert "--lang zh" in _make_n(root, "student-package", "COURSE_LANG=zh")
    assert "--lang zh" in _make_n(root, "lab", "COURSE_LANG=zh")


def test_the_chinese_readmes_links_open_and_the_student_commands_are_the_englishs():
    from autograder.authoring.package import student_commands

    for rel in ("zh/README.md", "zh/README.student.md"):
        # (zh/README.md is the edition's own guide, not a twin of the course README: the twin rule does not apply)
        problems = [p for p in link_problems(Lesson(rel)) if "Chinese twin" not in p]
        assert not problems, f"{rel}:\n  " + "\n  ".join(problems)
    english = student_commands(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    chinese = student_commands(open(os.path.join(ROOT, "zh", "README.student.md"), encoding="utf-8").read(), "zh")
    assert chinese == english, "the Chinese student section's commands differ from the README's"
