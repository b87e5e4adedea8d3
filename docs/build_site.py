"""Build the course website: `make site`, or

    .venv/bin/python docs/build_site.py [--out build/site]      # then open build/site/index.html

Stages the sources in build/site-src/ and runs Sphinx (MyST-NB, the Furo theme)
on them; nothing is downloaded and no notebook is executed. What is staged:

- `index.md`: the course overview (assignments/README.md), the home page;
- `assignments/<a>/`: each lesson README and its deep dives in their numbered
  order, with every code reference linked to the real file at a pinned commit
  (docs/code_refs.json, the commits named once per page) and the figures of
  docs/figures.py, drawn now by the course's own functions;
- `release/<a>/*.ipynb`: the student notebooks, exactly as released
  (task text, worked examples, visible tests; no solution, no hidden test:
  source/ and solutions/ are never read), their text in the site's language
  whichever language release/ was built in (`make build COURSE_LANG=zh`
  before or after `make site` gives the same two sites: a Chinese release's
  text goes back to English through zh/notebooks/, then to the site's);
- `exercises/<a>/`: a page per exercise, generated from the release
  notebook's "Exercise N" headings, linking the lesson sections it needs.

Sphinx runs with warnings as errors: a broken link between pages, a missing
anchor or a formula that does not convert stops the build.

The Chinese site (issue 24) is built the same way into `<out>/zh/` (staged in
`<out>-src-zh/`), from parallel sources, as the lessons are written: each
lesson's Chinese twin (zh/assignments/..., the English original where no twin
exists yet, under a note saying so), the release notebooks with their text
translated (zh/notebooks/, as `make build COURSE_LANG=zh` would), and exercise
pages generated from those. Sphinx runs with `language = "zh_CN"` (its own
interface strings, and the Chinese search: words cut by jieba, which Sphinx
uses when it is installed, taught the course's terms from zh/GLOSSARY.md, with a
query splitter that cuts a query into the index's words: docs/zh_search.py;
the theme's own words from docs/locale/). Every page of both sites shows a
language switch to the same page in the other language (docs/_templates/).
What the Chinese
lessons need on top: their `<a id="english-slug">` anchors (zh/README.md)
become links to the Chinese heading they stand before, their links to English
lessons outside zh/ open those pages of the Chinese site, and their code
references resolve through the English original's entries in code_refs.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from docs.coderefs import link_references, load_table  # noqa: E402

LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
OVERVIEW = "assignments/README.md"
LANGUAGES = ("en", "zh")
ANCHOR_ID = re.compile(r"""^<a\s+(?:id|name)\s*=\s*["']([^"']+)["']\s*>\s*</a>\s*$""")


class Words:
    """What the generated parts of the site say, and how they read the lessons and notebooks, per language."""

    def __init__(self, lang: str):
        self.lang = lang
        zh = lang == "zh"
        # the notebooks' exercise headings and their points
        self.exercise = re.compile(r"^##\s+(?:练习\s*|Exercise\s+)(\d+)\s*[:：]\s*(.*)$" if zh else
                                   r"^##\s+Exercise\s+(\d+)\s*:\s*(.*)$", re.M)
        # (a notebook cell not translated yet reads as the English one: the Chinese site reads both)
        self.points = re.compile(r"[（(](\d+)\s*(?:分|points?)[）)]" if zh else r"\((\d+)\s+points?\)")
        self.points_suffix = re.compile(r"\s*[（(]\d+\s*(?:分|points?)[）)]\s*$" if zh else r"\s*\(\d+ points?\)\s*$")
        # the lessons' reading guide: its heading, the exercises a row is for, the README sections it names
        self.reading_guide = re.compile(r"阅读指引|阅读指南" if zh else r"reading guide", re.I)
        self.row_exercises = re.compile(r"练习\s*(\d+)(?:\s*[-–]\s*(\d+))?" if zh else
                                        r"exercises?\s+(\d+)(?:\s*[-–]\s*(\d+))?")
        self.section_ref = re.compile(r"(?:§\s*|第\s*)(\d+[a-z]?)" if zh else r"(?:§|sections?\s+)(\d+[a-z]?)")
        self.not_listed = re.compile(r"代码映射|代码对照|参考|延伸阅读" if zh else r"code map|references|further reading",
                                     re.I)
        self.code_map = re.compile(r"^#{2,}\s.*(?:code map|代码映射|代码对照)", re.I)
        self.source = re.compile(r"^(?:Exercises? [\d, and-]+\.\s+)?Sources?:|^(?:练习[\d ，、和-]+。)?(?:来源|出处)：")
        if zh:
            self.lessons, self.exercises, self.notebook = "讲义", "练习", "Notebook"
            self.exercise_title = "练习 {n}：{title}"
            self.from_notebook = "出自 notebook [{title}]({href})（在 JupyterLab 里打开 `{nb}` 来做这个练习）。"
            self.points_note = " {p} 分。"
            self.read_first, self.its_sections, self.task = "先读", "，它的各节：", "任务"
            self.visible, self.visible_intro = "可见测试", "notebook 里这个练习的测试 cell（计分时还会加上隐藏用例）："
            self.test_table = "| 测试 cell | 检查内容 | 分数 |"
            self.index_title = "练习：{title}"
            self.index_intro = ("[notebook]({href}) 的每个练习一页：它的任务、要先读的讲义章节，以及它的可见测试。")
            self.index_table = "| 练习 | 分数 |"
            self.untranslated = ("```{{admonition}} 本篇尚无中文版\n:class: note\n下面是英文原文。中文版写好后放在 "
                                 "`zh/{rel}`，网站和测试会自动改用它。\n```\n")
        else:
            self.lessons, self.exercises, self.notebook = "Lessons", "Exercises", "Notebook"
            self.exercise_title = "Exercise {n}: {title}"
            self.from_notebook = "From the notebook [{title}]({href}) (open `{nb}` in JupyterLab to work on it)."
            self.points_note = " {p} points."
            self.read_first, self.its_sections, self.task = "Read first", ", its sections:", "The task"
            self.visible = "Visible tests"
            self.visible_intro = "The notebook's test cells for this exercise (the graded run adds hidden cases):"
            self.test_table = "| test cell | checks | points |"
            self.index_title = "Exercises: {title}"
            self.index_intro = ("One page per exercise of the [notebook]({href}): its task, the lesson sections to "
                                "read first, and its visible tests.")
            self.index_table = "| exercise | points |"
            self.untranslated = ""


def assignments(root: str) -> list[str]:
    base = os.path.join(root, "assignments")
    return sorted(a for a in os.listdir(base) if os.path.exists(os.path.join(base, a, "_build_nb.py")))


def english_path(repo_path: str) -> str:
    """A Chinese twin's path as its English original's (zh/assignments/x.md -> assignments/x.md)."""
    return repo_path[3:] if repo_path.startswith("zh/") else repo_path


def staged_path(repo_path: str) -> str:
    """Where a repository file lives in the staged source tree (a Chinese twin where its original does: each
    language's site has its own tree)."""
    repo_path = english_path(repo_path)
    return "index.md" if repo_path == OVERVIEW else repo_path


def rewrite_links(text: str, repo_path: str, anchors: dict | None = None) -> str:
    """Relative links, written for the repository layout, retargeted for the staged tree (the overview moves
    to index.md). `anchors`: {staged page: {anchor as written: anchor on the page}} (a Chinese heading's
    English slug, from its `<a id>`, becomes the Chinese heading's own)."""
    here = os.path.dirname(repo_path)
    new_here = os.path.dirname(staged_path(repo_path))

    def repl(m):
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("/"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        dest = staged_path(os.path.normpath(os.path.join(here, path))) if path else staged_path(repo_path)
        anchor = (anchors or {}).get(dest, {}).get(anchor, anchor)
        if not path:
            return f"[{label}](#{anchor})"
        new = os.path.relpath(dest, new_here or ".")
        return f"[{label}]({new}{'#' + anchor if anchor else ''})"
    return _outside_code(text, lambda chunk: LINK.sub(repl, chunk))


def html_anchors(text: str) -> tuple[str, dict[str, str]]:
    """A Chinese lesson without its `<a id="english-slug"></a>` lines, and {english slug: the slug of the heading
    each stood before} (zh/README.md: the English slug keeps links working on GitHub; on the site, links to it
    are retargeted to the Chinese heading)."""
    lines, out, found = text.splitlines(keepends=True), [], {}
    for i, line in enumerate(lines):
        m = ANCHOR_ID.match(line.strip())
        if m:
            nxt = next((l for l in lines[i + 1:] if l.strip()), "")
            h = re.match(r"^#{1,6}\s+(.*)$", nxt)
            if not h:
                raise ValueError(f"<a id={m.group(1)!r}> is not right before a heading")
            found[m.group(1)] = heading_slug(h.group(1))
            continue
        out.append(line)
    return "".join(out), found


def _outside_code(text: str, fn) -> str:
    """Apply fn to the parts of a markdown text outside fenced code blocks."""
    parts = re.split(r"(^```.*?^```[^\n]*$)", text, flags=re.M | re.S)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def heading_slug(title: str) -> str:
    from myst_parser.slugs import github_slugify

    return github_slugify(re.sub(r"[`*]", "", title).strip())


def headings(text: str, level: int = 2) -> list[tuple[str, str]]:
    """(title, slug) of the headings of one level, outside code blocks."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and re.match(rf"^#{{{level}}}\s", line):
            title = line[level:].strip()
            out.append((title, heading_slug(title)))
    return out


def title_of(text: str) -> str:
    m = re.search(r"^#\s+(.*)$", text, re.M)
    return m.group(1).strip() if m else "?"


# ---------------------------------------------------------------------------
# Lessons: code links, commit note, figures, navigation
# ---------------------------------------------------------------------------

def commit_note(links: list[dict], table: dict, lang: str = "en") -> str:
    pairs = sorted({(l["repo"], l["commit"]) for l in links})
    items = []
    for repo, commit in pairs:
        origin = table["repositories"].get(repo, {}).get(commit, "")
        extra = f" ({origin})" if "torch" in origin and "installed" in origin or "moved" in origin else ""
        at = "，提交" if lang == "zh" else " at"
        items.append(f"[{repo}](https://github.com/{repo}/tree/{commit}){at} `{commit}`{extra}")
    unread = sorted({l["unread"] for l in links if l.get("unread")})
    if lang == "zh":
        lineless = (f"`{'`、`'.join(unread)}` 的链接没有行号：PyTorch 的 C++ 源码不在它的 wheel 里，它的仓库又太大，"
                    "无法为构建做快照。" if unread else "")
        return ("```{admonition} 本页的代码链接\n:class: note\n"
                "本页链接的每个文件和符号都指向一个固定的提交，并带有符号所在的行：" + "；".join(items)
                + "。符号会随版本移动；这些链接始终显示本讲写作时依据的代码。" + lineless + "\n```\n")
    lineless = (f" `{'`, `'.join(unread)}` is linked without line numbers: PyTorch's C++ sources are not in "
                "its wheel and its repository is too large to snapshot for the build." if unread else "")
    return ("```{admonition} Code links on this page\n:class: note\n"
            "Every file and symbol linked on this page points at a fixed commit, with the symbol's lines: "
            + "; ".join(items) + ". Symbols move between versions; the links keep showing what this lesson "
            "was written against." + lineless + "\n```\n")


def insert_commit_note(text: str, note: str) -> str:
    """After the code-map heading, else after the opening Source paragraph, else at the end."""
    words = Words("en")
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if words.code_map.match(line):
            return "".join(lines[:i + 1]) + "\n" + note + "\n" + "".join(lines[i + 1:])
    for i, line in enumerate(lines):
        if words.source.match(line):
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            return "".join(lines[:j]) + "\n" + note + "".join(lines[j:])
    return text.rstrip("\n") + "\n\n" + note


def insert_figure(text: str, section: str, block: str, where: str) -> str:
    """`block` at the end of the section whose heading starts with `section`."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.startswith(section)), None)
    if start is None:
        raise ValueError(f"{where}: no heading starting with {section!r} for its figure")
    level = len(section) - len(section.lstrip("#"))
    end, fence = len(lines), False
    for j in range(start + 1, len(lines)):
        if lines[j].lstrip().startswith("```"):
            fence = not fence
        m = re.match(r"^(#+)\s", lines[j])
        if m and not fence and len(m.group(1)) <= level:
            end = j
            break
    return "".join(lines[:end]).rstrip("\n") + "\n\n" + block + "\n" + "".join(lines[end:])


def toctree(entries: list[str], *, caption: str | None = None, hidden: bool = True, maxdepth: int = 1) -> str:
    opts = [f":maxdepth: {maxdepth}"] + ([":hidden:"] if hidden else []) + ([f":caption: {caption}"] if caption else [])
    return "\n```{toctree}\n" + "\n".join(opts) + "\n\n" + "\n".join(entries) + "\n```\n"


# ---------------------------------------------------------------------------
# Exercises: a page each, from the release notebook
# ---------------------------------------------------------------------------

def notebook_sections(nb: dict) -> list[dict]:
    """The notebook cut at its `## ` headings: [{"title", "cells"}]; cells before the first are skipped."""
    sections = []
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "markdown" and re.match(r"^##\s", src):
            sections.append({"title": src.splitlines()[0][2:].strip(), "cells": []})
        if sections:
            sections[-1]["cells"].append({**cell, "source": src})
    return sections


def _visible_tests(cells: list[dict]) -> list[tuple[str, str, float]]:
    out = []
    for c in cells:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if c["cell_type"] == "code" and meta.get("grade"):
            m = re.search(r"checking\(\s*'[^']*'\s*,\s*(['\"])(.*?)\1\s*\)", c["source"])
            out.append((meta.get("grade_id", "?"), m.group(2) if m else "", float(meta.get("points", 0))))
    return out


def reading_guide(readme: str, words: Words | None = None) -> list[tuple[str, str]]:
    """(first cell, read cell) rows of the README's reading-guide table (the rows under its header)."""
    words = words or Words("en")
    rows, inside, body = [], False, False
    for line in readme.splitlines():
        if re.match(r"^##\s", line) and words.reading_guide.search(line):
            inside = True
            continue
        if inside and line.startswith("## "):
            break
        if inside and re.match(r"^\|[\s:|-]+\|$", line.strip()):
            body = True             # the header row is above this line
            continue
        if inside and body and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2:
                rows.append((cells[0], cells[1]))
    return rows


def _row_matches(first: str, number: int, names: set[str], words: Words) -> bool:
    low = first.lower()
    for m in words.row_exercises.finditer(low):
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if a <= number <= b:
            return True
    return any(n in names for n in re.findall(r"`([^`]+)`", first))


def exercise_pages(root: str, assignment: str, nb_rel: str, lesson_texts: dict[str, str], nb: dict | None = None,
                   words: Words | None = None) -> dict[str, str]:
    """{staged path: markdown} for one assignment: an index and a page per exercise.

    `lesson_texts` is keyed by the English repository path of each lesson (its text in the site's language);
    `nb` is the notebook as the site shows it (default: the release notebook at `nb_rel`)."""
    words = words or Words("en")
    zh = words.lang == "zh"
    nb = nb if nb is not None else json.load(open(os.path.join(root, nb_rel), encoding="utf-8"))
    readme_rel = f"assignments/{assignment}/README.md"
    readme = lesson_texts[readme_rel]
    readme_sections = headings(readme)
    guide = reading_guide(readme, words)
    base = f"exercises/{assignment}"
    pages, listing = {}, []
    nb_page = os.path.relpath(nb_rel, base)
    # the reading guide's links are relative to the README as written (a Chinese one under zh/)
    readme_dir = os.path.dirname(("zh/" if zh else "") + readme_rel)
    for sec in notebook_sections(nb):
        m = words.exercise.match("## " + sec["title"])
        if not m:
            continue
        number, rest = int(m.group(1)), m.group(2)
        body_md = "\n\n".join(c["source"] for c in sec["cells"] if c["cell_type"] == "markdown")
        names = set(re.findall(r"`([A-Za-z_][\w.]*)", rest + "\n" + body_md.split("\n\n", 2)[0]))
        names |= {c["metadata"].get("nbgrader", {}).get("grade_id", "") for c in sec["cells"]}
        tests = _visible_tests(sec["cells"])
        points = words.points.search(rest)
        # what to read: the links of the exercise's own text, then the reading guide's rows for it
        reads: list[tuple[str, str]] = []     # (English repo path of a lesson, anchor or "")

        def add(path, anchor=""):
            if (path, anchor) not in reads:
                reads.append((path, anchor))
        for _label, target in LINK.findall(body_md):
            if target.startswith(("http", "#")):
                continue
            path, _, anchor = target.partition("#")
            dest = english_path(os.path.normpath(os.path.join(os.path.dirname(nb_rel), path)))
            if dest.startswith("assignments/") and dest != OVERVIEW:
                add(dest, anchor)
        for first, read in guide:
            if not _row_matches(first, number, names, words):
                continue
            for _label, target in LINK.findall(read):
                add(english_path(os.path.normpath(os.path.join(readme_dir, target.partition("#")[0]))))
            for sec_no in words.section_ref.findall(read):
                hit = next(((t, s) for t, s in readme_sections if re.match(rf"^{re.escape(sec_no)}\.?\s", t)), None)
                if hit:
                    add(readme_rel, hit[1])
            if re.search(r"§\s*1 and §\s*2|§1 and §2", read):
                for t, s in readme_sections:
                    if re.match(r"^2\.?\s", t):
                        add(readme_rel, s)
        # a lesson named with its sections needs no entry of its own
        anchored = {p for p, a in reads if a}
        reads = [(p, a) for p, a in reads if a or p not in anchored]
        lines = [f"# {words.exercise_title.format(n=number, title=rest)}", "",
                 words.from_notebook.format(title=title_of(lesson_texts[readme_rel]),
                                            href=f"{nb_page}#{heading_slug(sec['title'])}", nb=nb_rel)
                 + (words.points_note.format(p=points.group(1)) if points else ""), ""]
        lines += [f"## {words.read_first}", ""]
        if not reads:
            lines += [f"- [{title_of(readme)}]({os.path.relpath(readme_rel, base)})"]
        for path, anchor in reads:
            text = lesson_texts[path]
            rel = os.path.relpath(staged_path(path), base)
            if anchor:
                title = next((t for t, s in headings(text) if s == anchor), anchor)
                lines.append(f"- [{title_of(text)}{'，' if zh else ', '}{_plain(title, words)}]({rel}#{anchor})")
            else:
                lines.append(f"- [{title_of(text)}]({rel}){words.its_sections}")
                for t, s in headings(text):
                    if not words.not_listed.search(t):
                        lines.append(f"  - [{_plain(t, words)}]({rel}#{s})")
        lines += ["", f"## {words.task}", "", _demote(body_md, words), ""]
        if tests:
            lines += [f"## {words.visible}", "", words.visible_intro, "", words.test_table, "|---|---|---|"]
            lines += [f"| `{gid}` | {desc.replace('|', '/')} | {pts:g} |" for gid, desc, pts in tests]
            lines.append("")
        page = f"{base}/exercise-{number}.md"
        # links in the copied task text were written from release/<a>/: same depth as exercises/<a>/
        pages[page] = rewrite_links("\n".join(lines), page)
        listing.append((number, rest, f"exercise-{number}", points.group(1) if points else ""))
    index = [f"# {words.index_title.format(title=title_of(readme))}", "",
             words.index_intro.format(href=nb_page), "", words.index_table, "|---|---|"]
    index += [f"| [{words.exercise_title.format(n=n, title=_plain(t, words))}]({p}.md) | {pts} |"
              for n, t, p, pts in listing]
    index.append(toctree([p for _n, _t, p, _pts in listing]))
    pages[f"{base}/index.md"] = "\n".join(index) + "\n"
    return pages


def _plain(title: str, words: Words | None = None) -> str:
    return (words or Words("en")).points_suffix.sub("", title).replace("|", "/")


def _demote(md: str, words: Words | None = None) -> str:
    """The exercise's notebook text without its `## Exercise N` heading (the page's title)."""
    words = words or Words("en")
    out, fence = [], False
    for line in md.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and words.exercise.match(line):
            continue        # the page's own title; the sub-sections (###) stay under "The task"
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Staging and building
# ---------------------------------------------------------------------------

def _heading_lines(text: str) -> list[str]:
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and re.match(r"^#{1,6}\s", line):
            out.append(line)
    return out


def twin_heading(english: str, chinese: str, section: str, where: str) -> str:
    """The Chinese twin's heading at the place of the English heading starting with `section` (the two have the
    same headings in the same order: tests/test_zh_parity.py)."""
    en, zh = _heading_lines(english), _heading_lines(chinese)
    i = next((i for i, line in enumerate(en) if line.startswith(section)), None)
    if i is None or len(en) != len(zh):
        raise ValueError(f"{where}: no Chinese heading for {section!r} (its headings differ from the English)")
    return zh[i]


def twin_resolver(table: dict, en_rel: str, en_text: str):
    """Resolve a Chinese twin's code references through its English original's: the k-th reference to a path
    in the twin is the English k-th reference to it (the same spans: tests/test_zh_parity.py)."""
    from collections import Counter

    from docs.coderefs import lesson_references, resolve

    english = lesson_references(en_text)
    seen: Counter = Counter()

    def resolver(ref):
        same = [r for r in english if r.path == ref.path]
        k = seen[ref.path]
        seen[ref.path] += 1
        return resolve(table, en_rel, same[min(k, len(same) - 1)]) if same else None
    return resolver


def lesson_paths(root: str) -> list[str]:
    return [OVERVIEW] + [f"assignments/{a}/{f}" for a in assignments(root)
                         for f in sorted(os.listdir(os.path.join(root, "assignments", a))) if f.endswith(".md")]


def stage(root: str, src: str, *, figures: bool = True, lang: str = "en", figure_dir: str | None = None) -> dict:
    """Write the Sphinx source tree of one language; returns what was staged (for the summary and the tests).
    `figure_dir`: figures already drawn (the other language's), copied instead of drawn again."""
    from autograder.authoring.translations import english_notebook, translate_notebook
    from docs.figures import FIGURES, draw_all

    if lang not in LANGUAGES:
        raise ValueError(f"language {lang!r}: the site is built in {', '.join(LANGUAGES)}")
    words = Words(lang)
    zh = lang == "zh"
    if os.path.exists(src):
        shutil.rmtree(src)
    os.makedirs(src)
    shutil.copytree(os.path.join(HERE, "_static"), os.path.join(src, "_static"))
    if zh:      # the theme's words in Chinese (docs/conf.py: locale_dirs)
        shutil.copytree(os.path.join(HERE, "locale"), os.path.join(src, "_locale"),
                        ignore=shutil.ignore_patterns("*.mo"))
    table = load_table()
    names = assignments(root)
    english, texts, twins = {}, {}, set()
    for rel in lesson_paths(root):
        english[rel] = open(os.path.join(root, rel), encoding="utf-8").read()
        texts[rel] = english[rel]
        if zh and os.path.exists(os.path.join(root, "zh", rel)):
            texts[rel] = open(os.path.join(root, "zh", rel), encoding="utf-8").read()
            twins.add(rel)
    # the Chinese twins' <a id="english-slug"> anchors: links to them open the Chinese heading instead
    anchors: dict[str, dict[str, str]] = {}
    for rel in twins:
        texts[rel], found = html_anchors(texts[rel])
        anchors[staged_path(rel)] = found
    if figure_dir:
        shutil.copytree(figure_dir, os.path.join(src, "_figures"))
        fig_paths = {f.name: os.path.join(src, "_figures", f.name + ".svg") for f in FIGURES} if figures else {}
    else:
        fig_paths = draw_all(os.path.join(src, "_figures")) if figures else {}
    report = {"lang": lang, "pages": [], "code_links": [], "figures": sorted(fig_paths), "exercises": 0,
              "untranslated": sorted(set(texts) - twins) if zh else [], "notebook_cells_in_english": 0}

    def write(rel: str, text: str):
        path = os.path.join(src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        report["pages"].append(rel)

    notebooks = {}
    for a in names:
        nbs = sorted(f for f in os.listdir(os.path.join(root, "release", a)) if f.endswith(".ipynb"))
        notebooks[a] = [f"release/{a}/{f}" for f in nbs]

    for rel, text in texts.items():
        twin = rel in twins
        resolver = twin_resolver(table, rel, english[rel]) if twin else None
        out, links = link_references(text, rel, table, resolver=resolver)
        if links:
            out = insert_commit_note(out, commit_note(links, table, lang if twin else "en"))
        report["code_links"] += [{**l, "page": rel} for l in links]
        for fig in FIGURES:
            if fig.lesson == rel and fig.name in fig_paths:
                caption = fig.caption_zh if twin and fig.caption_zh else fig.caption
                section = twin_heading(english[rel], text, fig.section, rel) if twin else fig.section
                block = (f"```{{figure}} /_figures/{fig.name}.svg\n:alt: {re.sub(r'[`$]', '', caption)}\n"
                         f":width: 100%\n\n{caption}\n```\n")
                out = insert_figure(out, section, block, rel)
        out = rewrite_links(out, ("zh/" if twin else "") + rel, anchors)
        if zh and not twin:
            out = re.sub(r"^(#\s.*\n)", lambda m: m.group(1) + "\n" + words.untranslated.format(rel=rel) + "\n",
                         out, count=1, flags=re.M)
        if rel == OVERVIEW:
            out += toctree([f"assignments/{a}/README" for a in names], caption=words.lessons)
        elif rel.endswith("/README.md"):
            a = rel.split("/")[1]
            deep = [os.path.splitext(os.path.basename(r))[0] for r in texts
                    if r.startswith(f"assignments/{a}/") and not r.endswith("README.md")]
            entries = deep + [f"{words.notebook} <{os.path.splitext('/' + nb)[0]}>" for nb in notebooks[a]]
            entries.append(f"{words.exercises} </exercises/{a}/index>")
            out += toctree(entries)
        write(staged_path(rel), out)

    for a in names:
        for nb_rel in notebooks[a]:
            nb = json.load(open(os.path.join(root, nb_rel), encoding="utf-8"))
            # whichever language release/ was built in (make build [COURSE_LANG=zh]): English first, then the
            # site's language, so both orders of `make build COURSE_LANG=zh` and `make site` give both sites
            try:
                english_notebook(nb, root, a)
            except ValueError as exc:
                raise RuntimeError(str(exc)) from None
            if zh:
                report["notebook_cells_in_english"] += len(translate_notebook(nb, root, a, lang))
            shown = copy.deepcopy(nb)
            for cell in shown["cells"]:
                if cell["cell_type"] == "markdown":
                    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                    cell["source"] = rewrite_links(text, nb_rel, anchors)
            write(nb_rel, json.dumps(shown, indent=1, ensure_ascii=False) + "\n")
            for rel, text in exercise_pages(root, a, nb_rel, texts, nb, words).items():
                write(rel, rewrite_links(text, rel, anchors))
                report["exercises"] += rel.endswith(".md") and not rel.endswith("index.md")
    return report


SITE_TITLES = {"en": "LLM parallelism course", "zh": "LLM 并行训练课程"}
SPHINX_LANGUAGE = {"en": "en", "zh": "zh_CN"}


def _sphinx(src: str, out: str, lang: str, quiet: bool) -> None:
    from sphinx.cmd.build import build_main

    warnings = src + "-warnings.txt"
    args = ["-b", "html", "-c", HERE, "-W", "--keep-going", "-w", warnings, "-d", src + "/.doctrees", "-j", "1",
            "-E", "-D", f"language={SPHINX_LANGUAGE[lang]}", "-D", f"html_title={SITE_TITLES[lang]}",
            "-A", f"course_lang={lang}", src, out] + (["-q"] if quiet else [])
    code = build_main(args)
    if code:
        raise RuntimeError(f"sphinx-build failed ({code}, {lang}):\n{open(warnings).read()}")
    shutil.rmtree(os.path.join(out, ".doctrees"), ignore_errors=True)


def build(root: str = ROOT, out: str | None = None, *, quiet: bool = True, langs=LANGUAGES) -> dict:
    """Stage and build every language (English in `out`, the others in `out/<lang>/`); returns a summary of the
    English build with one entry per language under "langs". Raises RuntimeError (with Sphinx's warnings)
    when a build fails."""
    import logging

    try:
        import jieba        # Sphinx's Chinese search cuts words with it; its dictionary-loading notes go to stderr

        jieba.setLogLevel(logging.WARNING)
    except ImportError:
        pass
    out = out or os.path.join(root, "build", "site")
    if os.path.exists(out):
        shutil.rmtree(out)
    reports, t0 = {}, time.perf_counter()
    stage_s = sphinx_s = 0.0
    for lang in langs:
        target = out if lang == "en" else os.path.join(out, lang)
        src = os.path.join(os.path.dirname(out), os.path.basename(out) + "-src" + ("" if lang == "en" else f"-{lang}"))
        t1 = time.perf_counter()
        figure_dir = os.path.join(reports["en"]["src"], "_figures") if "en" in reports else None
        report = stage(root, src, lang=lang, figure_dir=figure_dir)
        t2 = time.perf_counter()
        _sphinx(src, target, lang, quiet)
        t3 = time.perf_counter()
        stage_s, sphinx_s = stage_s + t2 - t1, sphinx_s + t3 - t2
        report.update(src=src, out=target, seconds=t3 - t1, stage_s=t2 - t1, sphinx_s=t3 - t2,
                      html=sum(1 for d, _s, fs in os.walk(target) for f in fs if f.endswith(".html")
                               and os.path.relpath(d, target).split(os.sep)[0] not in LANGUAGES))
        reports[lang] = report
    summary = dict(reports[langs[0]])
    summary.update(out=out, seconds=time.perf_counter() - t0, langs=reports)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Build the course website into a folder (default build/site): English "
                                             "there, Chinese in its zh/ folder.")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "site"))
    ap.add_argument("--lang", choices=LANGUAGES + ("all",), default="all", help="one language only (default: all)")
    args = ap.parse_args(argv)
    langs = LANGUAGES if args.lang == "all" else (args.lang,)
    try:
        r = build(ROOT, os.path.abspath(args.out), langs=langs)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    for lang, rep in r["langs"].items():
        with_lines = sum(1 for l in rep["code_links"] if "#L" in l["url"])
        name = {"en": "site", "zh": "site (中文)"}[lang]
        print(f"{name}: {rep['html']} HTML pages ({len(rep['pages'])} staged sources, {rep['exercises']} exercise "
              f"pages, {len(rep['figures'])} figures, {len(rep['code_links'])} code links, {with_lines} with line "
              f"numbers) in {rep['seconds']:.1f} s (staging and figures {rep['stage_s']:.1f} s, Sphinx "
              f"{rep['sphinx_s']:.1f} s)")
        if lang != "en" and (rep["untranslated"] or rep["notebook_cells_in_english"]):
            print(f"  in English for now: {len(rep['untranslated'])} lesson(s) without a Chinese twin "
                  f"({', '.join(rep['untranslated'])}), {rep['notebook_cells_in_english']} notebook cell(s) "
                  f"without a current translation")
    print(f"open {os.path.relpath(os.path.join(r['out'], 'index.html'))}"
          + (f" (中文: {os.path.relpath(os.path.join(r['out'], 'zh', 'index.html'))})" if "zh" in r["langs"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
