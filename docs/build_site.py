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
  source/ and solutions/ are never read);
- `exercises/<a>/`: a page per exercise, generated from the release
  notebook's "Exercise N" headings, linking the lesson sections it needs.

Sphinx runs with warnings as errors: a broken link between pages, a missing
anchor or a formula that does not convert stops the build.
"""

from __future__ import annotations

import argparse
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


def assignments(root: str) -> list[str]:
    base = os.path.join(root, "assignments")
    return sorted(a for a in os.listdir(base) if os.path.exists(os.path.join(base, a, "_build_nb.py")))


def staged_path(repo_path: str) -> str:
    """Where a repository file lives in the staged source tree."""
    return "index.md" if repo_path == OVERVIEW else repo_path


def rewrite_links(text: str, repo_path: str) -> str:
    """Relative links, written for the repository layout, retargeted for the staged tree (the overview moves
    to index.md)."""
    here = os.path.dirname(repo_path)
    new_here = os.path.dirname(staged_path(repo_path))

    def repl(m):
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(here, path))
        new = os.path.relpath(staged_path(dest), new_here or ".")
        return f"[{label}]({new}{'#' + anchor if anchor else ''})"
    return _outside_code(text, lambda chunk: LINK.sub(repl, chunk))


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

def commit_note(links: list[dict], table: dict) -> str:
    pairs = sorted({(l["repo"], l["commit"]) for l in links})
    items = []
    for repo, commit in pairs:
        origin = table["repositories"].get(repo, {}).get(commit, "")
        extra = f" ({origin})" if "torch" in origin and "installed" in origin or "moved" in origin else ""
        items.append(f"[{repo}](https://github.com/{repo}/tree/{commit}) at `{commit}`{extra}")
    unread = sorted({l["unread"] for l in links if l.get("unread")})
    lineless = (f" `{'`, `'.join(unread)}` is linked without line numbers: PyTorch's C++ sources are not in "
                "its wheel and its repository is too large to snapshot for the build." if unread else "")
    return ("```{admonition} Code links on this page\n:class: note\n"
            "Every file and symbol linked on this page points at a fixed commit, with the symbol's lines: "
            + "; ".join(items) + ". Symbols move between versions; the links keep showing what this lesson "
            "was written against." + lineless + "\n```\n")


def insert_commit_note(text: str, note: str) -> str:
    """After the code-map heading, else after the opening Source paragraph, else at the end."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if re.match(r"^#{2,}\s.*code map", line, re.I):
            return "".join(lines[:i + 1]) + "\n" + note + "\n" + "".join(lines[i + 1:])
    for i, line in enumerate(lines):
        if re.match(r"^(?:Exercises? [\d, and-]+\.\s+)?Sources?:", line):
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

EXERCISE = re.compile(r"^##\s+Exercise\s+(\d+)\s*:\s*(.*)$", re.M)


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


def reading_guide(readme: str) -> list[tuple[str, str]]:
    """(first cell, read cell) rows of the README's reading-guide table."""
    rows, inside = [], False
    for line in readme.splitlines():
        if re.match(r"^##\s.*reading guide", line, re.I):
            inside = True
            continue
        if inside and line.startswith("## "):
            break
        if inside and line.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and not cells[0].lower().startswith("before"):
                rows.append((cells[0], cells[1]))
    return rows


def _row_matches(first: str, number: int, names: set[str]) -> bool:
    low = first.lower()
    for m in re.finditer(r"exercises?\s+(\d+)(?:\s*[-–]\s*(\d+))?", low):
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if a <= number <= b:
            return True
    return any(n in names for n in re.findall(r"`([^`]+)`", first))


def exercise_pages(root: str, assignment: str, nb_rel: str, lesson_texts: dict[str, str]) -> dict[str, str]:
    """{staged path: markdown} for one assignment: an index and a page per exercise."""
    nb = json.load(open(os.path.join(root, nb_rel), encoding="utf-8"))
    readme_rel = f"assignments/{assignment}/README.md"
    readme = lesson_texts[readme_rel]
    readme_sections = headings(readme)
    guide = reading_guide(readme)
    base = f"exercises/{assignment}"
    pages, listing = {}, []
    nb_page = os.path.relpath(nb_rel, base)
    for sec in notebook_sections(nb):
        m = EXERCISE.match("## " + sec["title"])
        if not m:
            continue
        number, rest = int(m.group(1)), m.group(2)
        body_md = "\n\n".join(c["source"] for c in sec["cells"] if c["cell_type"] == "markdown")
        names = set(re.findall(r"`([A-Za-z_][\w.]*)", rest + "\n" + body_md.split("\n\n", 2)[0]))
        names |= {c["metadata"].get("nbgrader", {}).get("grade_id", "") for c in sec["cells"]}
        tests = _visible_tests(sec["cells"])
        points = re.search(r"\((\d+)\s+points?\)", rest)
        # what to read: the links of the exercise's own text, then the reading guide's rows for it
        reads: list[tuple[str, str]] = []     # (repo path of a lesson, anchor or "")

        def add(path, anchor=""):
            if (path, anchor) not in reads:
                reads.append((path, anchor))
        for _label, target in LINK.findall(body_md):
            if target.startswith(("http", "#")):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(nb_rel), path))
            if dest.startswith("assignments/") and dest != OVERVIEW:
                add(dest, anchor)
        for first, read in guide:
            if not _row_matches(first, number, names):
                continue
            for _label, target in LINK.findall(read):
                add(os.path.normpath(os.path.join(f"assignments/{assignment}", target.partition("#")[0])))
            for sec_no in re.findall(r"(?:§|sections?\s+)(\d+[a-z]?)", read):
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
        lines = [f"# Exercise {number}: {rest}", "",
                 f"From the notebook [{title_of(lesson_texts[readme_rel])}]({nb_page}#{heading_slug(sec['title'])})"
                 f" (open `{nb_rel}` in JupyterLab to work on it)." + (f" {points.group(1)} points." if points else ""),
                 ""]
        lines += ["## Read first", ""]
        if not reads:
            lines += [f"- [{title_of(readme)}]({os.path.relpath(readme_rel, base)})"]
        for path, anchor in reads:
            text = lesson_texts[path]
            rel = os.path.relpath(staged_path(path), base)
            if anchor:
                title = next((t for t, s in headings(text) if s == anchor), anchor)
                lines.append(f"- [{title_of(text)}, {_plain(title)}]({rel}#{anchor})")
            else:
                lines.append(f"- [{title_of(text)}]({rel}), its sections:")
                for t, s in headings(text):
                    if not re.search(r"code map|references|further reading", t, re.I):
                        lines.append(f"  - [{_plain(t)}]({rel}#{s})")
        lines += ["", "## The task", "", _demote(body_md), ""]
        if tests:
            lines += ["## Visible tests", "",
                      "The notebook's test cells for this exercise (the graded run adds hidden cases):", "",
                      "| test cell | checks | points |", "|---|---|---|"]
            lines += [f"| `{gid}` | {desc.replace('|', '/')} | {pts:g} |" for gid, desc, pts in tests]
            lines.append("")
        page = f"{base}/exercise-{number}.md"
        pages[page] = rewrite_links("\n".join(lines), page).replace(
            "](../../assignments/README.md", "](../../index.md")
        # links in the copied task text were written from release/<a>/: same depth as exercises/<a>/
        listing.append((number, rest, f"exercise-{number}", points.group(1) if points else ""))
    index = [f"# Exercises: {title_of(readme)}", "",
             f"One page per exercise of the [notebook]({nb_page}): its task, the lesson sections to read first, "
             "and its visible tests.", "", "| exercise | points |", "|---|---|"]
    index += [f"| [Exercise {n}: {_plain(t)}]({p}.md) | {pts} |" for n, t, p, pts in listing]
    index.append(toctree([p for _n, _t, p, _pts in listing]))
    pages[f"{base}/index.md"] = "\n".join(index) + "\n"
    return pages


def _plain(title: str) -> str:
    return re.sub(r"\s*\(\d+ points?\)\s*$", "", title).replace("|", "/")


def _demote(md: str) -> str:
    """The exercise's notebook text without its `## Exercise N` heading (the page's title)."""
    out, fence = [], False
    for line in md.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and re.match(r"^##\s+Exercise\s+\d+", line):
            continue        # the page's own title; the sub-sections (###) stay under "The task"
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Staging and building
# ---------------------------------------------------------------------------

def stage(root: str, src: str, *, figures: bool = True) -> dict:
    """Write the Sphinx source tree; returns what was staged (for the summary and the tests)."""
    from docs.figures import FIGURES, draw_all

    if os.path.exists(src):
        shutil.rmtree(src)
    os.makedirs(src)
    shutil.copytree(os.path.join(HERE, "_static"), os.path.join(src, "_static"))
    table = load_table()
    names = assignments(root)
    texts = {}
    for rel in [OVERVIEW] + [f"assignments/{a}/{f}" for a in names
                             for f in sorted(os.listdir(os.path.join(root, "assignments", a))) if f.endswith(".md")]:
        texts[rel] = open(os.path.join(root, rel), encoding="utf-8").read()
    fig_paths = draw_all(os.path.join(src, "_figures")) if figures else {}
    report = {"pages": [], "code_links": [], "figures": sorted(fig_paths), "exercises": 0}

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
        out, links = link_references(text, rel, table)
        if links:
            out = insert_commit_note(out, commit_note(links, table))
        report["code_links"] += [{**l, "page": rel} for l in links]
        for fig in FIGURES:
            if fig.lesson == rel and fig.name in fig_paths:
                block = (f"```{{figure}} /_figures/{fig.name}.svg\n:alt: {re.sub(r'[`$]', '', fig.caption)}\n"
                         f":width: 100%\n\n{fig.caption}\n```\n")
                out = insert_figure(out, fig.section, block, rel)
        out = rewrite_links(out, rel)
        if rel == OVERVIEW:
            out += toctree([f"assignments/{a}/README" for a in names], caption="Lessons")
        elif rel.endswith("/README.md"):
            a = rel.split("/")[1]
            deep = [os.path.splitext(os.path.basename(r))[0] for r in texts
                    if r.startswith(f"assignments/{a}/") and not r.endswith("README.md")]
            entries = deep + [f"Notebook <{os.path.splitext('/' + nb)[0]}>" for nb in notebooks[a]]
            entries.append(f"Exercises </exercises/{a}/index>")
            out += toctree(entries)
        write(staged_path(rel), out)

    for a in names:
        for nb_rel in notebooks[a]:
            nb = json.load(open(os.path.join(root, nb_rel), encoding="utf-8"))
            for cell in nb["cells"]:
                if cell["cell_type"] == "markdown":
                    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                    cell["source"] = rewrite_links(text, nb_rel)
            write(nb_rel, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            for rel, text in exercise_pages(root, a, nb_rel, texts).items():
                write(rel, text)
                report["exercises"] += rel.endswith(".md") and not rel.endswith("index.md")
    return report


def build(root: str = ROOT, out: str | None = None, *, quiet: bool = True) -> dict:
    """Stage and build; returns a summary. Raises RuntimeError (with Sphinx's warnings) when the build fails."""
    from sphinx.cmd.build import build_main

    out = out or os.path.join(root, "build", "site")
    src = os.path.join(os.path.dirname(out), os.path.basename(out) + "-src")
    t0 = time.perf_counter()
    report = stage(root, src)
    t1 = time.perf_counter()
    warnings = os.path.join(os.path.dirname(out), os.path.basename(out) + "-warnings.txt")
    if os.path.exists(out):
        shutil.rmtree(out)
    args = ["-b", "html", "-c", HERE, "-W", "--keep-going", "-w", warnings, "-d", src + "/.doctrees", "-j", "1",
            "-E", src, out] + (["-q"] if quiet else [])
    code = build_main(args)
    if code:
        raise RuntimeError(f"sphinx-build failed ({code}):\n{open(warnings).read()}")
    shutil.rmtree(os.path.join(out, ".doctrees"), ignore_errors=True)
    report.update(out=out, stage_s=t1 - t0, sphinx_s=time.perf_counter() - t1,
                  html=sum(1 for _d, _s, fs in os.walk(out) for f in fs if f.endswith(".html")))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Build the course website into a folder (default build/site).")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "site"))
    args = ap.parse_args(argv)
    try:
        r = build(ROOT, os.path.abspath(args.out))
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    with_lines = sum(1 for l in r["code_links"] if "#L" in l["url"])
    print(f"site: {r['html']} HTML pages ({len(r['pages'])} staged sources, {r['exercises']} exercise pages, "
          f"{len(r['figures'])} figures, {len(r['code_links'])} code links, {with_lines} with line numbers) in "
          f"{r['stage_s'] + r['sphinx_s']:.1f} s (staging and figures {r['stage_s']:.1f} s, Sphinx {r['sphinx_s']:.1f} s)")
    print(f"open {os.path.relpath(os.path.join(r['out'], 'index.html'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
