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
- numbers: every number of the English prose is in the Chinese (every measured figure, size and year
  survives translation); the Chinese may write a number the English spells out ("two", "April") in digits,
  and no other number of its own.

An English lesson without a twin is listed as a skip, "not translated yet"; a Chinese file without an
English original fails. The Chinese prose must be Chinese (not an English copy) and must not use the
renderings zh/GLOSSARY.md rules out (e.g. a translated "all-reduce", 滑动 for a running max, 反向孪生); a
paragraph is one line in the source (a line break between two Chinese characters shows as a stray space);
and the edition as a whole keeps the translationese markers the review counted (a bare 一个 for "a", 它的 for
"its") near the rate of native technical Chinese.

The student section of the README and its Chinese edition (zh/README.student.md) are held to the same
structure rules, paragraph by paragraph (notes the Chinese adds are marked `> 中文版注：`).
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
    problems += number_differences(en, zh)
    return problems


# numbers the English spells out, which the Chinese may write in digits (zh/GLOSSARY.md: "数字")
NUMBER_WORDS = {w: n for n, ws in enumerate([
    "zero", "one once first", "two twice second both", "three thrice third", "four fourth", "five fifth",
    "six sixth", "seven seventh", "eight eighth", "nine ninth", "ten tenth", "eleven", "twelve", "thirteen",
    "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]) for w in ws.split()}
NUMBER_WORDS.update({m: i + 1 for i, m in enumerate(
    "january february march april may june july august september october november december".split())})
NUMBER_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "hundred": 100, "thousand": 1000, "half": 2,
                     "double": 2, "halves": 2, "dozen": 12, "pair": 2, "single": 1, "quarter": 4})


def number_differences(en: Lesson, zh: Lesson) -> list[str]:
    """Every number of the English prose must be in the Chinese; the Chinese may add only numbers the English
    spells out in words (`two`, `twice`, `April`: written 2, 2 次, 4 月 in Chinese)."""
    en_prose, zh_prose = " ".join(en.prose), " ".join(zh.prose)
    en_n, zh_n = Counter(NUMBER.findall(en_prose)), Counter(NUMBER.findall(zh_prose))
    problems = []
    missing = en_n - zh_n
    if missing:
        problems.append(f"numbers in the prose in English only: {sorted(missing.elements())[:8]}")
    spelled = Counter(str(NUMBER_WORDS[w]) for w in re.findall(r"[a-z]+", en_prose.lower()) if w in NUMBER_WORDS)
    # (a digit the English writes as a word or not at all, e.g. "a third" -> 1/3, is allowed up to that count)
    extra = (zh_n - en_n) - spelled
    if extra:
        problems.append(f"numbers in the prose in Chinese only: {sorted(extra.elements())[:8]} (a number the English "
                        "spells out may be written in digits; any other must be in the English too)")
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


def glossary_rules() -> list[tuple[str, str, tuple[str, ...]]]:
    """(rendering not to use, the English term it would translate, phrases it may still appear in), from
    zh/GLOSSARY.md's table: its fourth column lists them, `滑动（只用于“滑动窗口”）` allowing a phrase."""
    rules = []
    for line in open(GLOSSARY, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 4 or set(cells[0]) <= set("-: "):
            continue
        for word in re.split(r"[、,，](?![^（]*）)", cells[3]):
            word = word.strip().strip("`").strip()
            allowed = ()
            m = re.match(r"^(.+?)（只用于(.+)）$", word)
            if m:
                word, allowed = m.group(1).strip(), tuple(re.findall(r"“([^”]+)”", m.group(2)))
            if word and word not in ("不用", "-", "—"):
                rules.append((word, cells[0], allowed))
    return rules


def glossary_avoided() -> dict[str, str]:
    """{rendering not to use: the English term it would translate}, from zh/GLOSSARY.md's table."""
    return {word: term for word, term, _allowed in glossary_rules()}


def glossary_violations(text: str) -> dict[str, str]:
    """{rendering zh/GLOSSARY.md rules out that `text` uses: the English term}."""
    found = {}
    for word, term, allowed in glossary_rules():
        rest = text
        for phrase in allowed:
            rest = rest.replace(phrase, "")
        if word in rest:
            found[word] = term
    return found


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
    used = glossary_violations(prose)
    assert not used, (f"{rel} uses renderings zh/GLOSSARY.md rules out: "
                      + ", ".join(f"{w!r} (write {t})" for w, t in used.items()))


# ---------------------------------------------------------------------------
# Native Chinese: wrapped lines, and the translationese markers a Chinese-first review counted (issue 30)
# ---------------------------------------------------------------------------

CJK_CHAR = r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef“”‘’]"
# the markdown a wrapped line may start or end with around its Chinese text (emphasis, a link's bracket)
_EDGE = r"[*_\[\]()]*"
FULL_WIDTH = r"[\u3000-\u303f\uff00-\uffef“”‘’]"
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
# per 1,000 Chinese characters of the edition's prose (lessons and notebook text). Before the editing pass of
# issue 30: 8.5 and 4.3 (the review: "2.8x" and "4.8x" the rate of the Chinese overview the course grew from);
# after it: 3.1 and 0.5. A ceiling a little above that, so that new text written as a translation shows. A
# "bare" 一个 is an article, not a count: 每一个, 同一个, 另一个, 最后一个, 下一个, 只有一个... are not counted.
BARE_YIGE = re.compile(r"(?<![同另每哪任第唯单这那某后下上有独])一个(?![一个])")
MARKER_CEILINGS = {"bare 一个 (an article: 'a rank' is 'rank')": (BARE_YIGE, 3.5),
                   "它的 ('its': drop it or name the noun)": (re.compile("它的"), 0.8)}


def chinese_texts() -> list[tuple[str, str]]:
    """(where, markdown) of every Chinese prose text: the lessons, and the notebooks' translations (one per
    markdown cell). Not the code cells' catalogues (zh/notebooks/*.code.md): their line breaks are the lines of
    a comment or a docstring, and their terse register is a code comment's (tests/test_zh_code_cells.py)."""
    out = [(rel, lesson(rel).text) for rel in chinese_lessons()]
    for path in sorted(glob.glob(os.path.join(ROOT, ZH, "notebooks", "*.md"))):
        if path.endswith(".code.md"):
            continue
        text = open(path, encoding="utf-8").read()
        # the translations only: each entry's English is in an HTML comment (autograder/authoring/translations.py)
        # (blanked line for line, so that line numbers stay the file's)
        out.append((os.path.relpath(path, ROOT), re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"),
                                                       text, flags=re.S)))
    return out


def wrapped_lines(text: str) -> list[tuple[int, str]]:
    """(line number, the two lines' meeting point) wherever a paragraph breaks its line between two Chinese
    characters: Markdown shows the break as a space (GitHub, Jupyter and the site alike)."""
    lines, out, fence = text.split("\n"), [], False
    for i, (a, b) in enumerate(zip(lines, lines[1:])):
        if a.lstrip().startswith("```"):
            fence = not fence
        if fence or not a.strip() or not b.strip() or b.lstrip().startswith("```"):
            continue
        if re.match(r"\s*([-*+]\s|\d+\.\s|\||#|<|>)", b):        # a new item, row, heading, tag or quote
            continue
        # as the reader sees them: a link shows its text, not its target
        end, start = LINK_TARGET.sub("]", a).rstrip(), LINK_TARGET.sub("]", b).lstrip()
        end_zh, start_zh = re.search(CJK_CHAR + _EDGE + "$", end), re.match(_EDGE + CJK_CHAR, start)
        # a space is wrong between two Chinese characters, and beside full-width punctuation whatever the other side
        if (end_zh and start_zh) or re.search(FULL_WIDTH + "$", end) or re.match(FULL_WIDTH, start):
            out.append((i + 1, f"{a.rstrip()[-12:]}⏎{b.strip()[:12]}"))
    return out


@pytest.mark.parametrize("where", [w for w, _t in chinese_texts()])
def test_a_chinese_paragraph_is_not_wrapped_between_two_chinese_characters(where):
    text = dict(chinese_texts())[where]
    found = wrapped_lines(text)
    assert not found, (f"{where}: a line break between two Chinese characters shows as a space; join the lines "
                       f"(zh/GLOSSARY.md, 换行): " + "; ".join(f"line {n}: {s!r}" for n, s in found[:10]))


def test_wrapped_lines_are_found():
    assert wrapped_lines("梯度在反向里\n累加到 `.grad`。\n") == [(1, "梯度在反向里⏎累加到 `.grad`。")]
    assert wrapped_lines("见 **讲义**\n里的表。") and not wrapped_lines("梯度 all-reduce\n之后。\n\n下一段")
    assert not wrapped_lines("一段。\n- 列表项\n| 表 |") and not wrapped_lines("```\n中文\n中文\n```")
    assert wrapped_lines("见[讲义](a.md)\n里的表") and wrapped_lines("讲义：\n[README.md](a.md)")
    assert not wrapped_lines("见 `x`\n和 y")


def _marker_rates() -> dict[str, tuple[int, int]]:
    """{marker: (occurrences, Chinese characters)} over the edition's prose (code, formulas, English excluded)."""
    prose = []
    for where, text in chinese_texts():
        rel = where if where.startswith(os.path.join(ZH, "assignments")) else "release/x/x.ipynb"
        prose.append(" ".join(Lesson(rel, text).prose))
    text = "\n".join(prose)
    chars = len(CJK.findall(text))
    return {name: (len(pattern.findall(text)), chars) for name, (pattern, _ceiling) in MARKER_CEILINGS.items()}


def test_the_edition_reads_as_chinese_not_as_a_translation():
    """The review's counts (issue 30): the edition used a bare 一个 and 它的 at several times the rate of native
    technical Chinese. Each stays under its ceiling per 1,000 Chinese characters."""
    over = []
    for name, (count, chars) in _marker_rates().items():
        rate = 1000 * count / max(1, chars)
        if rate > MARKER_CEILINGS[name][1]:
            over.append(f"{name}: {count} in {chars} Chinese characters, {rate:.1f} per 1,000 "
                        f"(at most {MARKER_CEILINGS[name][1]})")
    assert not over, "the Chinese reads translated again:\n  " + "\n  ".join(over)


# ---------------------------------------------------------------------------
# The student section: README.md's "For students" and zh/README.student.md's "学生须知"
# ---------------------------------------------------------------------------

ZH_NOTE = re.compile(r"^> 中文版注：.*?(?=\n\n|\Z)", re.S | re.M)


def _blocks(doc: Lesson) -> list[str]:
    """The kinds of the section's top-level blocks, in order (paragraph, code, list, table, quote)."""
    kinds, depth = [], 0
    for tok in MD.parse(doc.text):
        if tok.nesting == 1 and depth == 0:
            kinds.append(tok.type.replace("_open", ""))
        elif tok.nesting == 0 and depth == 0 and tok.type in ("fence", "code_block", "math_block", "hr"):
            kinds.append(tok.type)
        depth += tok.nesting
    return kinds


def student_sections() -> tuple[Lesson, Lesson]:
    from autograder.authoring.package import student_section

    en = student_section(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(), "en")
    zh = student_section(open(os.path.join(ROOT, ZH, "README.student.md"), encoding="utf-8").read(), "zh")
    return Lesson("README.md", en), Lesson(os.path.join(ZH, "README.student.md"), ZH_NOTE.sub("", zh).strip() + "\n")


def test_the_chinese_student_section_has_the_english_structure():
    """Paragraph by paragraph, the rules of the lessons' twins: the same code blocks, code spans, links, tables,
    numbers; the Chinese adds only notes marked `> 中文版注：` (dropped before comparing)."""
    en, zh = student_sections()
    problems = structure_differences(en, zh)
    problems += _first_difference("blocks (paragraphs, code, lists)", [(k,) for k in _blocks(en)],
                                  [(k,) for k in _blocks(zh)])
    used = glossary_violations(" ".join(zh.prose))
    problems += [f"uses {w!r} (zh/GLOSSARY.md: write {t})" for w, t in used.items()]
    problems += [f"line {n}: a line break between two Chinese characters: {s!r}" for n, s in wrapped_lines(zh.text)]
    assert not problems, ("zh/README.student.md's 学生须知 is out of step with README.md's For students:\n  "
                          + "\n  ".join(problems))
