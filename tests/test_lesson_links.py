"""Every relative link of the lessons, the README and the notebooks opens something, and every lesson,
deep dive and notebook links the course overview (assignments/README.md) (issue 11)."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from course import ROOT, assignments

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
OVERVIEW = os.path.join(ROOT, "assignments", "README.md")


def _markdown_files():
    return sorted(glob.glob(os.path.join(ROOT, "assignments", "*.md"))
                  + glob.glob(os.path.join(ROOT, "assignments", "*", "*.md"))
                  + [os.path.join(ROOT, "README.md")])


def _notebooks():
    return sorted(glob.glob(os.path.join(ROOT, "source", "*", "*.ipynb")))


def _notebook_markdown(path):
    nb = json.load(open(path))
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def _relative_links(text):
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        yield target.split("#", 1)[0]


def _where_released(notebook):
    # a notebook opens from release/<assignment>/ in the student package, source/<assignment>/ here:
    # the same depth, so a link resolves the same way from both
    return os.path.dirname(notebook)


@pytest.mark.parametrize("path", _markdown_files() + _notebooks(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_opens_a_file(path):
    text = _notebook_markdown(path) if path.endswith(".ipynb") else open(path).read()
    base = _where_released(path) if path.endswith(".ipynb") else os.path.dirname(path)
    broken = [t for t in _relative_links(text) if t and not os.path.exists(os.path.normpath(os.path.join(base, t)))]
    assert not broken, f"{os.path.relpath(path, ROOT)}: links to files that do not exist: {broken}"


def _links_overview(path, text, base):
    return any(os.path.normpath(os.path.join(base, t)) == OVERVIEW for t in _relative_links(text))


@pytest.mark.parametrize("assignment", assignments())
def test_every_lesson_deep_dive_and_notebook_links_the_course_overview(assignment):
    pages = sorted(glob.glob(os.path.join(ROOT, "assignments", assignment, "*.md")))
    assert pages, assignment
    missing = [os.path.relpath(p, ROOT) for p in pages if not _links_overview(p, open(p).read(), os.path.dirname(p))]
    for nb in glob.glob(os.path.join(ROOT, "source", assignment, "*.ipynb")):
        if not _links_overview(nb, _notebook_markdown(nb), _where_released(nb)):
            missing.append(os.path.relpath(nb, ROOT))
    assert not missing, f"these pages do not link the course overview (assignments/README.md): {missing}"


def test_the_overview_links_every_lesson():
    text = open(OVERVIEW).read()
    linked = {os.path.normpath(os.path.join(os.path.dirname(OVERVIEW), t)) for t in _relative_links(text)}
    missing = [a for a in assignments() if os.path.join(ROOT, "assignments", a, "README.md") not in linked]
    assert not missing, f"assignments/README.md does not link the lessons of {missing}"
