"""The student package: one folder, one archive, everything a student needs and nothing else.

    python -m autograder.grade student-package          # -> dist/llm-parallelism-course.tar.gz  (make student-package)
    python -m autograder.grade student-package --lang zh                 # the Chinese package (make student-package COURSE_LANG=zh)

The archive unpacks into `llm-parallelism-course/`:

    README.md            the README's "For students" section: the commands, exactly
    release/NN_<dim>/    the notebooks (stubs, visible tests)
    assignments/         the lessons (README.md and deep dives per dimension, the course overview)
    zh/assignments/      in a Chinese package only: the Chinese lessons (the notebooks link them; a lesson not
                         translated yet links its English original in assignments/)
    wheels/              the `autograder` package's student layers: runtime (runner, ledger, comparisons,
                         report), lessons (volumes, figures, the tiny GPT, the planner's types), checks

A package is in the language of release/ (`make build COURSE_LANG=zh` builds a Chinese release), or in the
language asked for: an English release is translated as the Chinese build would (its markdown cells, from
zh/notebooks/), so `make student-package COURSE_LANG=zh` needs no rebuild. A Chinese package's README.md is
the Chinese student section, zh/README.student.md.

so that `jupyter lab` started in that folder shows the notebooks and the
lessons side by side, and every lesson link of a notebook
(`../../assignments/NN_<dim>/README.md`) opens. No solution and no hidden test
is in it, nor the instructor's layers (autograder.grading, autograder.authoring):
tests/test_release.py checks the archive, tests/test_layers.py that the student
layers import nothing else. The Gradescope zip holds the whole package (it grades).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

__all__ = ["PACKAGE_DIR", "STUDENT_LAYERS", "STUDENT_SECTIONS", "student_section", "student_commands",
           "build_wheel", "package_language", "build_student_package", "build_gradescope_package"]

PACKAGE_DIR = "llm-parallelism-course"
# The subpackages of autograder a student's notebook needs (what it imports, and what that imports).
STUDENT_LAYERS = ("runtime", "lessons", "checks")


# The student section of the README in each language: (file, its heading, the package README's title)
STUDENT_SECTIONS = {
    "en": ("README.md", "For students", "# Parallelism for Large-Scale LLM Training: student package"),
    "zh": ("zh/README.student.md", "学生须知", "# 大规模 LLM 训练中的并行：学生包"),
}


def student_section(readme_text: str, lang: str = "en") -> str:
    """The student section of the course README (`## For students`, up to the next `## ` heading), or of its
    Chinese edition (`## 学生须知` in zh/README.student.md)."""
    heading = STUDENT_SECTIONS[lang][1]
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", readme_text, re.S | re.M)
    if not m:
        raise ValueError(f"{STUDENT_SECTIONS[lang][0]} has no '## {heading}' section")
    return m.group(1).strip() + "\n"


def student_commands(readme_text: str, lang: str = "en") -> list[str]:
    """The shell commands of the first ```bash block of the student section (comments dropped)."""
    m = re.search(r"```bash\n(.*?)```", student_section(readme_text, lang), re.S)
    if not m:
        raise ValueError("the README's student section has no ```bash block")
    lines = []
    for line in m.group(1).splitlines():
        line = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if line:
            lines.append(line)
    return lines


def build_wheel(root: str, out: str, *, student: bool) -> str:
    """The course's wheel, written to `out`: the student's (autograder/__init__.py and STUDENT_LAYERS only) or,
    with student=False, the whole package (a Gradescope autograder grades with it). Returns its path."""
    if not student:
        return _pip_wheel(root, out)
    with tempfile.TemporaryDirectory() as stage:
        shutil.copy2(os.path.join(root, "pyproject.toml"), stage)
        os.makedirs(os.path.join(stage, "autograder"))
        shutil.copy2(os.path.join(root, "autograder", "__init__.py"), os.path.join(stage, "autograder"))
        for layer in STUDENT_LAYERS:
            shutil.copytree(os.path.join(root, "autograder", layer), os.path.join(stage, "autograder", layer),
                            ignore=shutil.ignore_patterns("__pycache__"))
        return _pip_wheel(stage, out)


def _pip_wheel(project: str, out: str) -> str:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", out, project], check=True, cwd=project)
    wheels = glob.glob(os.path.join(out, "*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def package_language(root: str, lang: str | None = None) -> str:
    """The language of the package: `lang`, else the language release/ is in. ValueError when release/ is in
    another language than English and `lang` asks for a different one (only English is translated on the fly)."""
    from autograder.authoring.translations import course_language, release_language

    found = release_language(root)
    lang = course_language(lang) if lang else found
    if lang != found and found != "en":
        raise ValueError(f"release/ is in {found!r}: build it in {lang!r} first (make build COURSE_LANG={lang})")
    return lang


def _copy_release(root: str, dest: str, lang: str) -> None:
    """release/ into `dest`, its notebooks translated when release/ is English and `lang` is not."""
    import nbformat

    from autograder.authoring.translations import release_language, translate_notebook

    shutil.copytree(os.path.join(root, "release"), dest, ignore=shutil.ignore_patterns(".ipynb_checkpoints",
                                                                                        "__pycache__"))
    if lang == release_language(root):
        return
    for path in sorted(glob.glob(os.path.join(dest, "*", "*.ipynb"))):
        assignment = os.path.basename(os.path.dirname(path))
        nb = nbformat.read(path, as_version=4)
        missing = translate_notebook(nb, root, assignment, lang)
        if missing:
            print(f"{assignment}: {len(missing)} markdown cell(s) without a current {lang} translation kept in "
                  f"English", file=sys.stderr)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            nbformat.write(nb, f)


def build_student_package(root: str, out_dir: str, lang: str | None = None) -> str:
    """Write `<out_dir>/llm-parallelism-course.tar.gz` (and the wheel beside it); return the archive's path.

    `lang`: the package's language (default: the language release/ is in)."""
    lang = package_language(root, lang)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        top = os.path.join(tmp, PACKAGE_DIR)
        os.makedirs(os.path.join(top, "wheels"))
        wheel = build_wheel(root, os.path.join(top, "wheels"), student=True)
        shutil.copy2(wheel, out_dir)
        _copy_release(root, os.path.join(top, "release"), lang)
        lessons = sorted(glob.glob(os.path.join(root, "assignments", "*.md"))
                         + glob.glob(os.path.join(root, "assignments", "*", "*.md")))
        if lang != "en":
            lessons += sorted(glob.glob(os.path.join(root, lang, "assignments", "*.md"))
                              + glob.glob(os.path.join(root, lang, "assignments", "*", "*.md")))
        for md in lessons:
            rel = os.path.relpath(md, root)
            os.makedirs(os.path.join(top, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(md, os.path.join(top, rel))
        readme, _heading, title = STUDENT_SECTIONS[lang]
        with open(os.path.join(root, readme), encoding="utf-8") as f:
            section = student_section(f.read(), lang)
        with open(os.path.join(top, "README.md"), "w", encoding="utf-8") as f:
            f.write(title + "\n\n" + section)
        archive = os.path.join(out_dir, PACKAGE_DIR + ".tar.gz")
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(top, arcname=PACKAGE_DIR)
    return archive


# Both scripts find the layout from their own location, never from the working directory: Gradescope unpacks the
# zip in /autograder/source (the folder with wheels/) and copies the scripts to /autograder too, runs setup.sh
# once as root from /autograder/source, and run_autograder for every upload from /autograder.
_FIND_LAYOUT = """here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -d "$here/wheels" ]; then source_dir="$here"; else source_dir="$here/source"; fi  # the unpacked zip
root="$(dirname "$source_dir")"  # /autograder on Gradescope
"""

_SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): bubblewrap (the sandbox of
# every upload) and a Python environment beside the unpacked zip, /autograder/venv, with the course's wheel and
# the packages grading imports (its `grading` extra).
set -euo pipefail
""" + _FIND_LAYOUT + """apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip bubblewrap >/dev/null
python3 -m venv "$root/venv"
# PyTorch's CPU build of the course's release (PyPI's default is a multi-GB CUDA build); a site with its own
# mirror sets TORCH_INDEX_URL
"$root/venv/bin/pip" install -q torch==2.13.0 --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
wheels=("$source_dir"/wheels/*.whl)
"$root/venv/bin/pip" install -q "${wheels[0]}[grading]"
"""

_RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every upload, from /autograder: the student's files are in /autograder/submission,
# the results go to /autograder/results/results.json.
set -euo pipefail
""" + _FIND_LAYOUT + """exec "$root/venv/bin/python" -m autograder.grading.gradescope {assignment} \\
    --course "$source_dir" --submission "$root/submission" --results "$root/results/results.json"
"""


def build_gradescope_package(root: str, assignment: str, out_dir: str) -> str:
    """dist/gradescope-<assignment>.zip: what Gradescope's "Zip file upload" of an autograder takes.

    setup.sh and run_autograder at the top; the source and release notebooks of
    the assignment (the hidden tests: instructor-only, never given to
    students) and the course's whole wheel (the grading layer included), which
    setup.sh installs with its `grading` extra (what grading imports beyond the
    runtime). No solutions, no course tests.
    """
    import zipfile

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"gradescope-{assignment}.zip")
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(root, os.path.join(tmp, "wheels"), student=False)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in (("setup.sh", _SETUP_SH),
                               ("run_autograder", _RUN_AUTOGRADER.replace("{assignment}", assignment))):
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o755 << 16
                z.writestr(info, text)
            z.write(wheel, os.path.join("wheels", os.path.basename(wheel)))
            for kind in ("source", "release"):
                folder = os.path.join(root, kind, assignment)
                for n in sorted(os.listdir(folder)):
                    if n.endswith(".ipynb"):
                        z.write(os.path.join(folder, n), os.path.join(kind, assignment, n))
    return path
