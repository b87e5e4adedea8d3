"""The course website (`make site`, docs/build_site.py), built once from a clean copy of the course.

    .venv/bin/python -m pytest -q -s tests/test_site.py tests/test_site_browser.py

- it builds from what git would commit (no build outputs, no network), with
  Sphinx's warnings as errors;
- every internal link and anchor of the built HTML opens something;
- no solution text, no hidden-test text and no path of the build machine is
  in any file of it (the release leak check of tests/test_release.py, run on
  the text of every page);
- every code reference of the lessons has an entry in docs/code_refs.json at
  a full 40-hex commit, and the pages link it, naming their commits once;
- the notebooks are the release notebooks, never executed; every exercise has
  a page that links the lesson sections it needs; the figures are drawn;
- the Chinese site (build/site/zh/, issue 24) holds every lesson in Chinese (the
  English original, marked, where no twin exists yet), the notebooks with their
  text translated and an exercise page per exercise; its pages link the same
  code and show the same formulas and figures as their English originals; every
  page of both sites has a language switch to the same page in the other; its
  search index holds Chinese words. The link, leak and formula checks above run
  over both sites.
"""

from __future__ import annotations

import glob
import html
import json
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import pytest

from course import ROOT, assignments, copy_course

sys.path.insert(0, ROOT)
from docs.coderefs import lesson_references, load_table, resolve  # noqa: E402
from test_release import _secret_lines, _visible_text  # noqa: E402  (the release leak check)

pytest.importorskip("sphinx", reason="the site needs the course extra (pip install -e '.[course]')")
pytest.importorskip("myst_nb", reason="the site needs the course extra (pip install -e '.[course]')")

HEX40 = re.compile(r"^[0-9a-f]{40}$")
PERMALINK = re.compile(r"^https://github\.com/([\w.-]+/[\w.-]+)/(blob|tree)/([0-9a-f]+)/?([^#]*)(#L\d+(-L\d+)?)?$")
_BUILT: dict = {}


def built_site(tmp_path_factory) -> dict:
    """Build once per test session (this file and tests/test_site_browser.py share it)."""
    if not _BUILT:
        tmp = tmp_path_factory.mktemp("site")
        clean = copy_course(str(tmp / "course"))
        out = str(tmp / "site")
        env = {**os.environ, "PYTHONPATH": clean, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "docs/build_site.py", "--out", out], cwd=clean, env=env,
                              capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - t0
        assert proc.returncode == 0, f"make site failed from a clean copy:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        print(f"\n{proc.stdout.strip()}\n(the site build took {seconds:.1f} s from a clean copy)")
        _BUILT.update(out=out, clean=clean, stdout=proc.stdout, seconds=seconds)
    return _BUILT


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    return built_site(tmp_path_factory)


def _files(site, *exts):
    return sorted(p for p in glob.glob(os.path.join(site["out"], "**", "*"), recursive=True)
                  if os.path.isfile(p) and p.endswith(exts))


class _Page(HTMLParser):
    """ids, links (href/src) and text of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.text, self._skip = set(), [], [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "use"):
                self.links.append((tag, key, a[key]))
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def _parse(path: str) -> _Page:
    p = _Page()
    p.feed(open(path, encoding="utf-8").read())
    return p


def _page_for(site, repo_path: str) -> str:
    rel = "index.html" if repo_path == "assignments/README.md" else repo_path[:-3] + ".html"
    return os.path.join(site["out"], rel)


# ---------------------------------------------------------------------------
# What is in it
# ---------------------------------------------------------------------------

def test_the_site_holds_the_overview_every_lesson_every_notebook_and_the_exercises(site):
    out = site["out"]
    home = _parse(os.path.join(out, "index.html"))
    assert "the course overview" in "".join(home.text)
    for a in assignments():
        lessons = sorted(glob.glob(os.path.join(ROOT, "assignments", a, "*.md")))
        for lesson in lessons:
            assert os.path.exists(_page_for(site, os.path.relpath(lesson, ROOT))), lesson
        for nb in glob.glob(os.path.join(ROOT, "release", a, "*.ipynb")):
            assert os.path.exists(os.path.join(out, "release", a, os.path.basename(nb)[:-6] + ".html")), nb
        # the lesson's navigation lists the deep dives in their numbered order, then the notebook and exercises
        readme = "".join(_parse(_page_for(site, f"assignments/{a}/README.md")).text)
        deep = [os.path.basename(p) for p in lessons if not p.endswith("README.md")]
        titles = [re.search(r"^#\s+(.*)$", open(os.path.join(ROOT, "assignments", a, d)).read(), re.M).group(1)
                  for d in deep]
        positions = [readme.find(t.replace("`", "")) for t in titles]
        assert all(p >= 0 for p in positions) and positions == sorted(positions), (a, titles)
    for sub in ("search.html", "searchindex.js"):
        assert os.path.exists(os.path.join(out, sub)), sub


def test_it_needs_no_network(site):
    """No page loads anything from another host: scripts, styles, images and fonts are all in the site."""
    remote = []
    for path in _files(site, ".html"):
        for tag, key, url in _parse(path).links:
            if tag != "a" and re.match(r"^(https?:)?//", url):
                remote.append((os.path.relpath(path, site["out"]), url))
    for path in _files(site, ".css", ".js"):
        text = open(path, encoding="utf-8", errors="replace").read()
        remote += [(os.path.relpath(path, site["out"]), m) for m in re.findall(r"url\((['\"]?)(https?:)?//", text)]
    assert not remote, f"resources loaded from the network: {remote[:10]}"


def test_every_internal_link_and_anchor_resolves(site):
    out = site["out"]
    pages = {p: _parse(p) for p in _files(site, ".html")}
    checked, broken = 0, []
    for path, page in pages.items():
        for tag, key, url in page.links:
            parts = urlsplit(url)
            if parts.scheme or url.startswith("//") or url.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = path if not parts.path else os.path.normpath(os.path.join(os.path.dirname(path),
                                                                               unquote(parts.path)))
            checked += 1
            if not os.path.exists(target):
                broken.append(f"{os.path.relpath(path, out)}: {url} (no such file)")
                continue
            if parts.fragment and target.endswith(".html"):
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{os.path.relpath(path, out)}: {url} (no such anchor)")
    print(f"\n{checked} internal links and anchors checked in {len(pages)} pages")
    assert checked > 1000
    assert not broken, f"{len(broken)} broken internal links:\n" + "\n".join(broken[:30])


def test_no_solution_no_hidden_test_no_machine_path_in_the_output(site):
    """The release leak check of tests/test_release.py on the text of every file of the site, plus paths."""
    out = site["out"]
    texts = {}
    for path in _files(site, ".html", ".js", ".txt", ".svg", ".css", ".json", ".inv", ".ipynb"):
        raw = open(path, encoding="utf-8", errors="replace").read()
        body = "".join(_parse(path).text) if path.endswith(".html") else raw
        texts[os.path.relpath(path, out)] = (raw, html.unescape(body))
    assert len(texts) > 80
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "from solutions"):
        hits = [p for p, (raw, body) in texts.items() if marker in body or marker in raw]
        assert not hits, f"{marker!r} in {hits[:5]}"
    # a line any release notebook shows (a given helper of 02 that 05's solution repeats) is public
    public = set().union(*(_visible_text(a) for a in assignments()))
    for assignment in assignments():
        solution, hidden = _secret_lines(assignment)
        assert solution and hidden
        allowed = public
        for path, (_raw, body) in texts.items():
            lines = {line.strip() for line in body.splitlines()}
            # a hidden line as a line of the page, or inside one when it is long enough to be specific
            leaked = [line for line in hidden if line not in allowed
                      and (line in lines or (len(line) >= 30 and line in body))]
            assert not leaked, f"hidden-test text of {assignment} in {path}: {leaked[:3]}"
            leaked = [line for line in solution if len(line) >= 30 and line in lines and line not in allowed]
            # as for the lessons in the student archive: a formula line may coincide, a solution may not
            limit = 2 if path.startswith("assignments/") else 0
            assert len(leaked) <= limit, f"solution text of {assignment} in {path}: {leaked[:5]}"
    machine = {ROOT, site["clean"], os.path.dirname(site["out"]), sys.prefix, os.path.realpath(sys.prefix),
               os.path.expanduser("~") + "/"}
    machine = {m for m in machine if len(m) > 5}
    for path, (raw, _body) in texts.items():
        found = [m for m in machine if m in raw]
        assert not found, f"{path} holds a path of the build machine: {found}"
        assert "/tmp/" not in raw or path.endswith(".js"), f"{path} holds a /tmp/ path"


# ---------------------------------------------------------------------------
# Code references
# ---------------------------------------------------------------------------

def _lessons():
    return sorted(glob.glob(os.path.join(ROOT, "assignments", "*", "*.md"))) + [
        os.path.join(ROOT, "assignments", "README.md")]


def test_every_code_reference_of_the_lessons_has_an_entry_at_a_full_commit():
    table = load_table()
    missing, counted, symbols, with_lines = [], 0, 0, 0
    for path in _lessons():
        lesson = os.path.relpath(path, ROOT)
        for ref in lesson_references(open(path, encoding="utf-8").read()):
            counted += 1
            entry = resolve(table, lesson, ref)
            if entry is None:
                missing.append(f"{lesson}:{ref.line}: `{ref.path}` ({ref.context})")
                continue
            assert HEX40.match(entry["commit"]), f"{lesson}: {ref.path} at {entry['commit']!r}, not a 40-hex hash"
            for name in ref.symbols:
                assert name in entry["symbols"], f"{lesson}:{ref.line}: symbol `{name}` of {ref.path} has no entry"
                symbols += 1
                value = entry["symbols"][name]
                if isinstance(value, dict):
                    assert value["file"] in table["files"] and len(value["lines"]) == 2
                    with_lines += 1
                elif value is not None:
                    assert len(value) == 2 and 1 <= value[0] <= value[1], (name, value)
                    with_lines += 1
    print(f"\n{counted} code references, {symbols} symbols ({with_lines} with line numbers)")
    assert counted > 200
    assert not missing, "code references without an entry (run docs/resolve_code_refs.py):\n" + "\n".join(missing)
    for target, entry in table["files"].items():
        assert HEX40.match(entry["commit"]), target
        assert target == f"{entry['repo']}:{entry['path']}"


def test_every_symbol_the_lessons_attach_to_a_file_resolves():
    """A symbol the lessons attach to a file (a code span after its path) is found at the pinned commit: its
    lines in that file, or a definition in another file the lesson cites. Unresolved pins are either text
    that is not a symbol (a value, a course name: write it without a code span, or before the path) or a
    claim the upstream code no longer supports (issue 20). The only exception is a file whose text is not
    on this machine (PyTorch's C++, `unread`: linked at torch's commit without line numbers)."""
    table = load_table()
    unresolved, unread = [], set()
    for path in _lessons():
        lesson = os.path.relpath(path, ROOT)
        for ref in lesson_references(open(path, encoding="utf-8").read()):
            entry = resolve(table, lesson, ref)
            if entry is None:
                continue   # reported by the test above
            if entry.get("unread"):
                unread.add(entry["id"])
                continue
            for name in ref.symbols:
                if entry["symbols"].get(name) is None:
                    unresolved.append(f"{lesson}:{ref.line}: `{name}` (after `{ref.path}`) is not in "
                                      f"{entry['repo']}:{entry['path']} at {entry['commit'][:7]}")
    assert not unresolved, "pins that do not resolve (fix the lesson, then run docs/resolve_code_refs.py):\n" + \
        "\n".join(unresolved)
    assert unread <= {"pytorch/pytorch:torch/csrc/distributed/c10d/reducer.cpp"}, unread


def test_the_code_links_are_permalinks_and_each_page_names_its_commits_once(site):
    table = load_table()
    pages_with_links = 0
    for path in _lessons():
        lesson = os.path.relpath(path, ROOT)
        refs = lesson_references(open(path, encoding="utf-8").read())
        page = _page_for(site, lesson)
        raw = open(page, encoding="utf-8").read()
        urls = [html.unescape(u) for u in re.findall(r'href="(https://github\.com/[^"]+)"', raw)]
        commits = set()
        for url in urls:
            m = PERMALINK.match(url)
            if m and m.group(2) in ("blob", "tree") and "/" in url.split("github.com/", 1)[1].split("/", 2)[2]:
                assert HEX40.match(m.group(3)), f"{lesson}: {url} is not pinned to a full commit"
                commits.add((m.group(1), m.group(3)))
        # every reference's file is linked on the page
        for ref in refs:
            entry = resolve(table, lesson, ref)
            url_start = f"https://github.com/{entry['repo']}/"
            assert any(u.startswith(url_start) and entry["commit"] in u and
                       (entry["path"].rstrip("/") in u or entry["kind"] == "repo") for u in urls), \
                f"{lesson}:{ref.line}: `{ref.path}` is not linked to {entry['repo']}:{entry['path']}"
        if refs:
            pages_with_links += 1
            notes = raw.count("Code links on this page")
            assert notes == 1, f"{lesson}: the commits should be named once, found {notes} notes"
            note = raw[raw.index("Code links on this page"):]
            note = note[:note.index("</div>")]
            for repo, commit in commits:
                assert commit in note, f"{lesson}: the note does not name {repo} at {commit}"
    assert pages_with_links >= 25


# ---------------------------------------------------------------------------
# Notebooks, exercises, figures, formulas
# ---------------------------------------------------------------------------

def test_the_notebooks_are_the_release_notebooks_never_executed(site):
    for a in assignments():
        for nb_path in glob.glob(os.path.join(ROOT, "release", a, "*.ipynb")):
            nb = json.load(open(nb_path, encoding="utf-8"))
            page = os.path.join(site["out"], "release", a, os.path.basename(nb_path)[:-6] + ".html")
            raw = open(page, encoding="utf-8").read()
            text = html.unescape("".join(_parse(page).text))
            stubs = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
            assert stubs and text.count("raise NotImplementedError()") >= len(stubs), a
            assert "cell_output" not in raw and "output_area" not in raw, f"{page} shows cell outputs"
            tests = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
            first = "".join(tests[0]["source"]).splitlines()[0].strip()
            assert first in text, f"{a}: the visible test {first!r} is not on the notebook page"


def test_every_exercise_has_a_page_that_links_the_lessons_it_needs(site):
    count = 0
    for a in assignments():
        for nb_path in glob.glob(os.path.join(ROOT, "release", a, "*.ipynb")):
            nb = json.load(open(nb_path, encoding="utf-8"))
            numbers = [int(m.group(1)) for c in nb["cells"] if c["cell_type"] == "markdown"
                       for m in [re.match(r"^##\s+Exercise\s+(\d+)", "".join(c["source"]))] if m]
            assert numbers, a
            for n in numbers:
                page = os.path.join(site["out"], "exercises", a, f"exercise-{n}.html")
                assert os.path.exists(page), page
                parsed = _parse(page)
                lesson_links = [u for _t, _k, u in parsed.links
                                if f"assignments/{a}/" in u and u.split("#")[0].endswith(".html")]
                assert lesson_links, f"{a} exercise {n}: the page links no lesson"
                assert any("#" in u for u in lesson_links), f"{a} exercise {n}: no link to a lesson section"
                assert any(f"release/{a}/" in u for _t, _k, u in parsed.links), f"{a} exercise {n}: no notebook link"
                count += 1
    assert count >= 30


def test_the_figures_are_drawn_and_placed(site):
    from docs.figures import FIGURES

    for fig in FIGURES:
        raw = open(_page_for(site, fig.lesson), encoding="utf-8").read()
        srcs = re.findall(r'<img[^>]+src="([^"]*' + re.escape(fig.name) + r'[^"]*\.svg)"', raw)
        assert srcs, f"{fig.name} is not on {fig.lesson}"
        svg = os.path.normpath(os.path.join(os.path.dirname(_page_for(site, fig.lesson)), srcs[0]))
        assert os.path.getsize(svg) > 10_000 and "<path" in open(svg).read(), svg
    src = open(os.path.join(ROOT, "docs", "figures.py"), encoding="utf-8").read()
    assert not re.search(r"^\s*(from|import)\s+solutions", src, re.M), "a figure must not import solutions/"


def test_the_figures_small_functions_follow_their_lessons():
    """What a figure computes itself is the rule its lesson states, checked with the library."""
    from autograder.checks.data_parallel import check_zero_bytes_per_param
    from autograder.checks.pipeline_parallel import in_flight_peak, simulate_schedules
    from autograder.lessons.volume import pp_bubble_fraction
    from docs.figures import gpipe_actions, one_f_one_b_actions, ring_work, zero_bytes_lesson

    check_zero_bytes_per_param(zero_bytes_lesson, cases=[(s, d, {}) for s in range(4) for d in (1, 3, 64)])
    for p, m in ((2, 3), (4, 8), (3, 2), (1, 4)):
        for fn, peak in ((gpipe_actions, m), (one_f_one_b_actions, min(p, m))):
            sim = simulate_schedules([fn(p, s, m) for s in range(p)])
            assert "deadlock" not in sim, (fn.__name__, p, m)
            assert sim["idle_fraction"] == pytest.approx(pp_bubble_fraction(p, m), abs=1e-12), (fn.__name__, p, m)
            assert in_flight_peak(fn(p, 0, m)) == peak, (fn.__name__, p, m)
    for w in (2, 4, 8):      # 03_zigzag.md: rank r computes r + 1 blocks contiguous, (w + 1) / 2 with zigzag
        work = ring_work(w)
        assert [sum(r["steps"]) for r in work["contiguous"]] == [r + 1 for r in range(w)]
        assert all(sum(r["steps"]) == (w + 1) / 2 for r in work["zigzag"])


def test_the_formulas_are_math_in_the_pages(site):
    """The lessons' formulas reach the pages as MathML, with no `$` left in the text."""
    counts = {}
    for path in _files(site, ".html"):
        raw = open(path, encoding="utf-8").read()
        body = re.sub(r"<math.*?</math>", "", raw, flags=re.S)
        # code is code: a shell line's `$(...)` and `$VAR` are not formulas
        body = re.sub(r"<pre\b.*?</pre>|<code\b.*?</code>", "", body, flags=re.S)
        text = "".join(_parse_string(body))
        assert not re.search(r"\$[^$\s][^$]*\$", text), f"{path}: unconverted $...$ in the text"
        counts[os.path.relpath(path, site["out"])] = raw.count("<math ")
    for page, least in (("assignments/01_data_parallel/README.html", 20),
                        ("assignments/02_tensor_parallel/README.html", 10),
                        ("assignments/03_pipeline_parallel/README.html", 10),
                        ("assignments/03_pipeline_parallel/01_schedules_as_data.html", 3)):
        assert counts[page] >= least, (page, counts[page])
    raw = open(os.path.join(site["out"], "assignments/03_pipeline_parallel/README.html"), encoding="utf-8").read()
    assert re.search(r'<math[^>]*display="block"', raw), "the bubble formula should be a displayed formula"


def _parse_string(raw: str) -> list[str]:
    p = _Page()
    p.feed(raw)
    return p.text


def test_the_site_build_time_is_reported(site):
    """Measured, not asserted: printed for the record (make test runs one build)."""
    m = re.search(r"in ([\d.]+) s", site["stdout"])
    assert m, site["stdout"]
    print(f"\nsite build: {site['seconds']:.1f} s wall from a clean copy; {site['stdout'].splitlines()[0]}")


def test_the_readme_says_how_to_build_and_open_the_site_and_shows_it():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = readme[readme.index("## The course as a website"):]
    section = section[:section.index("\n## ", 3)]
    assert "make site" in section and "build/site/index.html" in section and "Sphinx" in section
    shots = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", section)
    assert shots, "the README's site section shows no screenshot"
    png = open(os.path.join(ROOT, shots[0]), "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, shots[0]
    assert re.search(r"^site:", open(os.path.join(ROOT, "Makefile")).read(), re.M), "no `site` target"


# ---------------------------------------------------------------------------
# The Chinese site (build/site/zh/)
# ---------------------------------------------------------------------------

ZH_TWIN = re.compile(r"[\u4e00-\u9fff]")


def _zh(site, rel: str) -> str:
    return os.path.join(site["out"], "zh", rel)


def _english_pages(site) -> list[str]:
    zh = os.path.join(site["out"], "zh") + os.sep
    return [p for p in _files(site, ".html") if not p.startswith(zh)]


def _twins() -> list[str]:
    return [os.path.relpath(p, ROOT) for p in _lessons() if os.path.exists(os.path.join(ROOT, "zh", os.path.relpath(p, ROOT)))]


def test_the_chinese_site_holds_every_lesson_every_notebook_and_the_exercises(site):
    home = _parse(_zh(site, "index.html"))
    assert "课程总览" in "".join(home.text)
    twins = set(_twins())
    assert len(twins) >= 25, twins
    for path in _lessons():
        rel = os.path.relpath(path, ROOT)
        page = _page_for(site, rel).replace(site["out"], os.path.join(site["out"], "zh"), 1)
        assert os.path.exists(page), page
        text = "".join(_parse(page).text)
        source = open(os.path.join(ROOT, "zh", rel) if rel in twins else path, encoding="utf-8").read()
        title = re.search(r"^#\s+(.*)$", source, re.M).group(1).replace("`", "")
        assert title in text, f"{page}: the title {title!r} of {'zh/' + rel if rel in twins else rel} is not on it"
        # a lesson not translated yet is the English original under a note that says so
        assert ("本篇尚无中文版" in text) == (rel not in twins), page
    for a in assignments():
        for nb_path in glob.glob(os.path.join(ROOT, "release", a, "*.ipynb")):
            nb = json.load(open(nb_path, encoding="utf-8"))
            page = _zh(site, f"release/{a}/{os.path.basename(nb_path)[:-6]}.html")
            text = html.unescape("".join(_parse(page).text))
            stubs = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
            assert text.count("raise NotImplementedError()") >= len(stubs), a    # the same code cells
            # (a cell whose English changed stays English until translated: tests/test_zh_notebooks.py says which)
            assert len(ZH_TWIN.findall(text)) > 500, f"{page}: the notebook's text is not in Chinese"
            numbers = [int(m.group(1)) for c in nb["cells"] if c["cell_type"] == "markdown"
                       for m in [re.match(r"^##\s+Exercise\s+(\d+)", "".join(c["source"]))] if m]
            for n in numbers:
                assert os.path.exists(_zh(site, f"exercises/{a}/exercise-{n}.html")), (a, n)


def test_every_page_has_a_language_switch_to_the_same_page(site):
    out, checked = site["out"], 0
    for path in _files(site, ".html"):
        raw = open(path, encoding="utf-8").read()
        m = re.search(r'<nav class="lang-switch".*?</nav>', raw, re.S)
        assert m, f"{os.path.relpath(path, out)} has no language switch"
        href = re.search(r'class="lang-other" href="([^"]+)"', m.group(0)).group(1)
        target = os.path.normpath(os.path.join(os.path.dirname(path), href))
        rel = os.path.relpath(path, out)
        expected = rel[3:] if rel.startswith("zh" + os.sep) else os.path.join("zh", rel)
        assert os.path.relpath(target, out) == expected, f"{rel}: the switch opens {href}"
        assert os.path.exists(target), f"{rel}: the switch opens {href}, which does not exist"
        checked += 1
    assert checked == 2 * len(_english_pages(site)), "the two sites should have the same pages"


def test_the_chinese_pages_link_the_same_code_and_show_the_same_formulas_and_figures(site):
    from docs.figures import FIGURES

    figures = {f.lesson: [] for f in FIGURES}
    for f in FIGURES:
        figures[f.lesson].append(f)
    for rel in _twins():
        en_page = _page_for(site, rel)
        zh_page = en_page.replace(site["out"], os.path.join(site["out"], "zh"), 1)
        en_raw, zh_raw = (open(p, encoding="utf-8").read() for p in (en_page, zh_page))
        code = [sorted(set(html.unescape(u) for u in re.findall(r'href="(https://github\.com/[^"]+)"', raw)))
                for raw in (en_raw, zh_raw)]
        assert code[0] == code[1], (f"zh/{rel} links other code than {rel}: only English "
                                    f"{sorted(set(code[0]) - set(code[1]))[:3]}, only Chinese {sorted(set(code[1]) - set(code[0]))[:3]}")
        assert zh_raw.count("本页的代码链接") == en_raw.count("Code links on this page"), rel
        assert zh_raw.count("<math ") == en_raw.count("<math "), f"zh/{rel}: not the formulas of {rel}"
        for fig in figures.get(rel, []):
            assert re.search(r'<img[^>]+src="[^"]*' + re.escape(fig.name) + r'\.svg"', zh_raw), (rel, fig.name)
            opening = re.search(r"[\u4e00-\u9fff]{4,}", fig.caption_zh)     # the caption's first Chinese words
            assert opening and opening.group(0) in "".join(_parse(zh_page).text), (rel, fig.name)


def test_the_chinese_lessons_anchors_and_links_to_english_lessons_work_on_the_site(site):
    """zh/README.md: a Chinese heading keeps its English anchor with `<a id>`; on the site the link opens the
    Chinese heading. A Chinese lesson linking an English one (no twin yet) opens that page of the Chinese site."""
    readme = _zh(site, "assignments/01_data_parallel/README.html")
    links = [u for _t, _k, u in _parse(readme).links if u.startswith("../../index.html#")]
    assert len(links) >= 2, links
    home = _parse(_zh(site, "index.html"))
    for u in links:
        assert u.split("#", 1)[1] in home.ids, u
    assert '<a id="3-thread-a' not in open(_zh(site, "index.html"), encoding="utf-8").read()
    english_only = [rel for rel in (os.path.relpath(p, ROOT) for p in _lessons()) if rel not in _twins()]
    for rel in english_only:
        page = _page_for(site, rel).replace(site["out"], os.path.join(site["out"], "zh"), 1)
        linked = [p for p in _files(site, ".html") if p.startswith(os.path.join(site["out"], "zh"))
                  and os.path.basename(page) in open(p, encoding="utf-8").read()]
        assert linked, f"no page of the Chinese site links {rel}"


def test_the_chinese_search_index_holds_chinese_words(site):
    raw = open(_zh(site, "searchindex.js"), encoding="utf-8").read()
    index = json.loads(raw[raw.index("(") + 1:raw.rindex(")")])
    for word in ("流水线", "梯度", "通信", "死锁", "reduc"):
        assert word in index["terms"], f"{word!r} is not in the Chinese search index"
    # the language data names a stemmer it defines (Sphinx 9.0.4 named ChineseStemmer: every search failed)
    data = open(_zh(site, "_static/language_data.js"), encoding="utf-8").read()
    name = re.search(r"window\.Stemmer = (\w+);", data).group(1)
    assert f"var {name}=" in data.replace(" ", "") or f"{name}=function" in data.replace(" ", ""), name


def _staged(root: str, out: str, lang: str) -> tuple[dict, dict[str, bytes]]:
    """Stage one language's Sphinx sources (no Sphinx, no figures): (the report, {path: bytes})."""
    from docs.build_site import stage

    report = stage(root, out, figures=False, lang=lang)
    files = {}
    for d, _dirs, names in os.walk(out):
        for name in names:
            path = os.path.join(d, name)
            files[os.path.relpath(path, out)] = open(path, "rb").read()
    return report, files


def test_both_sites_are_the_same_whichever_language_release_was_built_in(tmp_path):
    """`make site` after `make build COURSE_LANG=zh` gave an English site without exercise pages and reported 86
    notebook cells untranslated (issue 30): the site read release/ as it found it. It now takes the notebooks in
    English whatever release/ is in, then the site's language: both orders of the two commands stage, byte for
    byte, the same two sites (Sphinx then builds the same pages from them)."""
    import nbformat

    from autograder.authoring.translations import release_language, translate_notebook

    clean = copy_course(str(tmp_path / "course"))
    t0 = time.perf_counter()
    before = {lang: _staged(clean, str(tmp_path / f"en-release-{lang}"), lang) for lang in ("en", "zh")}
    # release/ as `make build COURSE_LANG=zh` writes it (the on-the-fly translation is that build, byte for byte:
    # tests/test_zh_notebooks.py)
    for a in assignments():
        for path in glob.glob(os.path.join(clean, "release", a, "*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            assert not translate_notebook(nb, clean, a, "zh"), a
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                nbformat.write(nb, f)
    assert release_language(clean) == "zh"
    after = {lang: _staged(clean, str(tmp_path / f"zh-release-{lang}"), lang) for lang in ("en", "zh")}
    for lang in ("en", "zh"):
        (rep_before, files_before), (rep_after, files_after) = before[lang], after[lang]
        assert rep_after["exercises"] == rep_before["exercises"] >= 30, (lang, rep_before["exercises"],
                                                                          rep_after["exercises"])
        assert rep_after["notebook_cells_in_english"] == rep_before["notebook_cells_in_english"] == 0, lang
        assert sorted(files_after) == sorted(files_before), lang
        differ = [rel for rel in files_before if files_before[rel] != files_after[rel]]
        assert not differ, f"the {lang} site differs after `make build COURSE_LANG=zh`: {differ[:5]}"
    print(f"\nstaged both sites from both releases in {time.perf_counter() - t0:.1f} s")


def test_a_chinese_release_older_than_its_catalog_stops_the_build_saying_so(tmp_path):
    """A Chinese release whose text zh/notebooks/ no longer has (edited after `make build COURSE_LANG=zh`) cannot be
    turned back into English: the build stops and says to rebuild release/, rather than show stale Chinese text."""
    import nbformat

    from autograder.authoring.translations import catalog_path, translate_notebook
    from docs.build_site import stage

    clean = copy_course(str(tmp_path / "course"))
    a = assignments()[0]
    path = glob.glob(os.path.join(clean, "release", a, "*.ipynb"))[0]
    nb = nbformat.read(path, as_version=4)
    translate_notebook(nb, clean, a, "zh")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        nbformat.write(nb, f)
    catalog = catalog_path(clean, "zh", a)
    text = open(catalog, encoding="utf-8").read()
    with open(catalog, "w", encoding="utf-8") as f:      # the first translation's heading reworded
        f.write(text.replace("\n\n# ", "\n\n# （改）", 1))
    with pytest.raises(RuntimeError, match=r"make build"):
        stage(clean, str(tmp_path / "src"), figures=False, lang="en")
