"""The Chinese edition (zh/) stays in step with the English lessons (issue 24).

    .venv/bin/python -m pytest -q tests/test_zh_parity.py          # about a second, no lock needed

Every English lesson under assignments/ (the overview, each README and deep dive) is paired with its
Chinese twin at the same path under zh/ (zh/README.md says why). For every pair the structure must agree,
so that a lesson changed in one language and not the other fails here:

- headings: the same count, order and levels, and the same leading section number (`3.`, `2b.`);
- formulas: every `$...$` and `$$...$$` of one edition, byte for byte, in the other (as multisets);
- code blocks: the same fenced blocks in the same order, byte for byte (comments included: zh/GLOSSARY.md);
- code references: the same set of backticked spans (paths, symbols, shapes, flags);
- links: the same targets, as lessons: a Chinese link to `../02_zero.md` names the twin of the English
  link to `../02_zero.md`; while a target has no twin yet the Chinese file links the English lesson
  instead (then, and only then); every anchor resolves in its own edition (a heading's GitHub slug or an
  explicit `<a id="...">`, which a Chinese heading needs to keep an English anchor working);
- tables: the same shapes (rows x columns) in the same order;
- numbers: the same digits in the prose (every measured figure, size and year survives translation).

An English lesson without a twin is listed as a skip, "not translated yet"; a Chinese file without an
English original fails. The Chinese prose must be Chinese (not an English copy) and must not use the
renderings zh/GLOSSARY.md rules out (e.g. a translated "all-reduce").
"""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from urllib.parse import unquote

import markdown_it
import pytest
from mdit_py_plugins.dollarmath import dollarmath_plugin

from course import ROOT

ZH = "zh"
GLOSSARY = os.path.join(ROOT, ZH, "GLOSSARY.md")
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
SECTION_NUMBER = re.compile(r"^(\d+[a-z]?)[.\s·]")
HTML_ID = re.compile(r"""<a\s[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
MIN_CJK_SHARE = 0.3     # CJK characters / (CJK + Latin letters) of the prose; 0.45-0.61 on the first twins


def english_lessons() -> list[str]:
    """Repository paths of the English lessons, as tests/test_lesson_links.py finds them."""
    paths = glob.glob(os.path.join(ROOT, "assignments", "*.md")) + glob.glob(os.path.join(ROOT, "assignments", "*", "*.md"))
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def chinese_lessons() -> list[str]:
    paths = glob.glob(os.path.join(ROOT, ZH, "assignments", "**", "*.md"), recursive=True)
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def twin(rel: str) -> str:
    return os.path.join(ZH, rel)


def _parser():
    md = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table")
    # the site's MyST settings (docs/conf.py): $...$, $$...$$, inline $$ allowed
    dollarmath_plugin(md, allow_labels=True, allow_space=True, allow_digits=True, double_inline=True)
    return md


MD = _parser()


def github_slug(title: str) -> str:
    """GitHub's heading anchor (and MyST's `github_slugify`): lowercase, punctuation dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


class Lesson:
    """The structure of one markdown file: what the parity rules compare."""

    def __init__(self, rel: str, text: str | None = None):
        """`rel`: the repository path (links are relative to its folder); `text`: its markdown, read from the
        file unless given (a notebook cell's text: tests/test_zh_notebooks.py)."""
        self.rel = rel
        self.text = open(os.path.join(ROOT, rel), encoding="utf-8").read() if text is None else text
        self.headings: list[tuple[int, str]] = []       # (level, plain title)
        self.code_blocks: list[tuple[str, str]] = []     # (info string, content)
        self.math: list[tuple[str, str]] = []            # (inline|display, content)
        self.code_spans: list[str] = []
        self.links: list[str] = []                       # href / src as written
        self.tables: list[tuple[int, int]] = []          # (rows incl. header, columns)
        self.html_ids: set[str] = set()
        self.prose: list[str] = []                       # text outside code, math and link targets
        tokens = MD.parse(self.text)
        table = None
        for i, tok in enumerate(tokens):
            if tok.type == "heading_open":
                self.headings.append((int(tok.tag[1]), self._plain(tokens[i + 1])))
            elif tok.type in ("fence", "code_block"):
                self.code_blocks.append((tok.info.strip(), tok.content))
            elif tok.type.startswith("math_block"):
                self.math.append(("display", tok.content))
            elif tok.type == "html_block":
                self.html_ids |= set(HTML_ID.findall(tok.content))
            elif tok.type == "table_open":
                table = []
            elif tok.type == "tr_open" and table is not None:
                table.append(0)
            elif tok.type in ("th_open", "td_open") and table is not None:
                table[-1] += 1
            elif tok.type == "table_close":
                cols = set(table)
                self.tables.append((len(table), cols.pop() if len(cols) == 1 else -1))
                table = None
            elif tok.type == "inline":
                self._inline(tok.children or [])

    @staticmethod
    def _plain(inline) -> str:
        return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))

    def _inline(self, children) -> None:
        for c in children:
            if c.type == "code_inline":
                self.code_spans.append(c.content)
            elif c.type.startswith("math_inline"):
                kind = "display" if c.type == "math_inline_double" else "inline"
                self.math.append((kind, c.content))
            elif c.type == "link_open":
                self.links.append(c.attrGet("href"))
            elif c.type == "image":
                self.links.append(c.attrGet("src"))
                self.prose.append(c.content)
            elif c.type == "html_inline":
                self.html_ids |= set(HTML_ID.findall(c.content))
            elif c.type == "text":
                self.prose.append(c.content)

    def anchors(self) -> set[str]:
        slugs, seen = set(), Counter()
        for _level, title in self.headings:
            slug = github_slug(title)
            slugs.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
        return slugs | self.html_ids

    def relative_links(self):
        """(href, repository path of the target or None for an anchor in this file, fragment)."""
        for href in self.links:
            if not href or re.match(r"^[a-z][a-z0-9+.-]*:", href):
                continue
            path, _, fragment = (unquote(part) for part in href.partition("#"))    # markdown-it %-encodes
            target = os.path.normpath(os.path.join(os.path.dirname(self.rel), path)) if path else None
            yield unquote(href), target, fragment


_CACHE: dict[str, Lesson] = {}


def lesson(rel: str) -> Lesson:
    if rel not in _CACHE:
        _CACHE[rel] = Lesson(rel)
    return _CACHE[rel]


def _identity(target: str) -> str:
    """A link target as a lesson: the Chinese twin and its English original are the same lesson."""
    return target[len(ZH) + 1:] if target.startswith(ZH + os.sep) else target


def _differences(name: str, en: Counter, zh: Counter) -> list[str]:
    missing, extra = en - zh, zh - en
    out = []
    if missing:
        out.append(f"{name} in English only: {sorted(missing.elements())[:8]}")
    if extra:
        out.append(f"{name} in Chinese only: {sorted(extra.elements())[:8]}")
    return out


def _first_difference(name: str, en: list, zh: list) -> list[str]:
    if en == zh:
        return []
    if len(en) != len(zh):
        head = f"{name}: {len(en)} in English, {len(zh)} in Chinese"
    else:
        head = f"{name}: same count ({len(en)})"
    for i, (a, b) in enumerate(zip(en, zh)):
        if a != b:
            lines = list(zip(a[-1].splitlines() + [""], b[-1].splitlines() + [""])) \
                if isinstance(a, tuple) and isinstance(a[-1], str) else []
            j = next((j for j, (x, y) in enumerate(lines) if x != y), None)
            if j is not None:
                return [f"{head}; #{i + 1} differs at line {j + 1}: English {lines[j][0]!r} vs Chinese {lines[j][1]!r}"]
            return [f"{head}; #{i + 1} differs: English {a!r} vs Chinese {b!r}"]
    return [f"{head}; the first {min(len(en), len(zh))} agree, then: "
            f"{(en if len(en) > len(zh) else zh)[min(len(en), len(zh))]!r}"]


def _heading_shape(doc: Lesson) -> list[tuple[int, str]]:
    return [(level, (SECTION_NUMBER.match(title).group(1) if SECTION_NUMBER.match(title) else ""))
            for level, title in doc.headings]


def structure_differences(en: Lesson, zh: Lesson) -> list[str]:
    problems = []
    shape_en, shape_zh = _heading_shape(en), _heading_shape(zh)
    if shape_en != shape_zh:
        for i in range(max(len(shape_en), len(shape_zh))):
            a = en.headings[i] if i < len(en.headings) else None
            b = zh.headings[i] if i < len(zh.headings) else None
            if a is None or b is None or shape_en[i] != shape_zh[i]:
                problems.append(f"headings: {len(en.headings)} in English, {len(zh.headings)} in Chinese; "
                                f"heading #{i + 1} (level, section number) differs: English "
                                f"{a and ('#' * a[0] + ' ' + a[1])!r} vs Chinese {b and ('#' * b[0] + ' ' + b[1])!r}")
                break
    problems += _differences("formulas", Counter(en.math), Counter(zh.math))
    problems += _first_difference("code blocks", en.code_blocks, zh.code_blocks)
    problems += _differences("code references", Counter(set(en.code_spans)), Counter(set(zh.code_spans)))
    links_en = Counter((_identity(t) if t else None, f) for _h, t, f in en.relative_links())
    links_zh = Counter((_identity(t) if t else None, f) for _h, t, f in zh.relative_links())
    links_en.update(h for h in en.links if h and re.match(r"^[a-z][a-z0-9+.-]*:", h))
    links_zh.update(h for h in zh.links if h and re.match(r"^[a-z][a-z0-9+.-]*:", h))
    problems += _differences("link targets", Counter({str(k): v for k, v in links_en.items()}),
                             Counter({str(k): v for k, v in links_zh.items()}))
    problems += _first_difference("table shapes (rows, columns)", en.tables, zh.tables)
    problems += _differences("numbers in the prose", Counter(NUMBER.findall(" ".join(en.prose))),
                             Counter(NUMBER.findall(" ".join(zh.prose))))
    return problems


def link_problems(doc: Lesson) -> list[str]:
    """Every relative link opens a file, every anchor resolves, and a Chinese file links the Chinese twin
    of a lesson whenever that twin exists."""
    problems = []
    for href, target, fragment in doc.relative_links():
        dest = target or doc.rel
        if not os.path.exists(os.path.join(ROOT, dest)):
            problems.append(f"link {href!r}: {dest} does not exist")
            continue
        if doc.rel.startswith(ZH + os.sep) and not dest.startswith(ZH + os.sep) \
                and os.path.exists(os.path.join(ROOT, twin(dest))):
            problems.append(f"link {href!r} opens the English {dest}; its Chinese twin {twin(dest)} exists now: "
                            "link that")
        if fragment and dest.endswith(".md") and fragment not in lesson(dest).anchors():
            problems.append(f"link {href!r}: no heading or <a id> with the anchor {fragment!r} in {dest}")
    return problems


def _pairs():
    out = []
    for rel in english_lessons():
        if os.path.exists(os.path.join(ROOT, twin(rel))):
            out.append(pytest.param(rel, id=rel))
        else:
            out.append(pytest.param(rel, id=rel, marks=pytest.mark.skip(
                reason=f"not translated yet: {twin(rel)} does not exist")))
    return out


@pytest.mark.parametrize("rel", _pairs())
def test_the_chinese_twin_has_the_english_structure(rel):
    problems = structure_differences(lesson(rel), lesson(twin(rel)))
    assert not problems, f"{twin(rel)} is out of step with {rel}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("rel", chinese_lessons())
def test_every_chinese_lesson_has_an_english_original(rel):
    original = rel[len(ZH) + 1:]
    assert os.path.exists(os.path.join(ROOT, original)), \
        f"{rel} has no English original {original}: the editions pair file by file (zh/README.md)"


@pytest.mark.parametrize("rel", chinese_lessons() + english_lessons())
def test_links_open_and_anchors_resolve(rel):
    problems = link_problems(lesson(rel))
    assert not problems, f"{rel}:\n  " + "\n  ".join(problems)


def glossary_avoided() -> dict[str, str]:
    """{rendering not to use: the English term it would translate}, from zh/GLOSSARY.md's table."""
    avoided = {}
    for line in open(GLOSSARY, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 4 or set(cells[0]) <= set("-: "):
            continue
        for word in re.split(r"[、,，]", cells[3]):
            word = word.strip().strip("`").strip()
            if word and word not in ("不用", "-", "—"):
                avoided[word] = cells[0]
    return avoided


def test_the_glossary_lists_renderings_to_avoid():
    avoided = glossary_avoided()
    assert len(avoided) >= 10, f"zh/GLOSSARY.md: expected its table's fourth column to list avoided renderings, got {avoided}"
    assert "全归约" in avoided, avoided


@pytest.mark.parametrize("rel", chinese_lessons())
def test_chinese_prose_is_chinese_and_follows_the_glossary(rel):
    doc = lesson(rel)
    prose = " ".join(doc.prose)
    cjk, latin = len(CJK.findall(prose)), len(re.findall(r"[A-Za-z]", prose))
    share = cjk / max(1, cjk + latin)
    assert share >= MIN_CJK_SHARE, (f"{rel}: only {share:.0%} of the prose's letters are Chinese "
                                    f"(at least {MIN_CJK_SHARE:.0%} expected): is it translated?")
    used = {word: term for word, term in glossary_avoided().items() if word in prose}
    assert not used, (f"{rel} uses renderings zh/GLOSSARY.md rules out: "
                      + ", ".join(f"{w!r} (write {t})" for w, t in used.items()))
