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


def _github_slug(heading: str) -> str:
    """The anchor GitHub (and the site, `myst_heading_anchors`) gives a heading: lower case, punctuation
    dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _thread_anchors():
    text = open(OVERVIEW).read()
    found = {}
    for heading in re.findall(r"^## (.+)$", text, re.M):
        m = re.match(r"(\d+)\. Thread \((a|b)\)", heading)
        if m:
            found[m.group(2)] = _github_slug(heading)
    return found


def test_the_overview_has_its_two_threads_as_sections_3_and_4():
    anchors = _thread_anchors()
    assert set(anchors) == {"a", "b"}, f"assignments/README.md should have '## 3. Thread (a)' and '## 4. Thread (b)'"
    assert anchors["a"].startswith("3-thread-a-") and anchors["b"].startswith("4-thread-b-"), anchors


@pytest.mark.parametrize("assignment", assignments())
def test_every_lesson_and_deep_dive_links_both_threads_of_the_overview(assignment):
    """Not only the breadcrumb: each README and deep dive links section 3 (backward twins) and section 4
    (overlap) of the overview, by their anchors (issue 20)."""
    anchors = _thread_anchors()
    missing = []
    for page in sorted(glob.glob(os.path.join(ROOT, "assignments", assignment, "*.md"))):
        text = open(page).read()
        targets = {t for t in LINK.findall(text)}
        for thread, anchor in sorted(anchors.items()):
            if f"../README.md#{anchor}" not in targets:
                missing.append(f"{os.path.relpath(page, ROOT)}: no link to ../README.md#{anchor} (thread ({thread}))")
    assert not missing, "\n".join(missing)
