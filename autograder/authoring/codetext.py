"""The prose of a notebook's code cells in another language (issue 30): comments, docstrings, messages.

    units = prose_units(cell_source)                 # [Unit(kind, english, ...)], in order
    new, problems = translate_code(cell_source, table, "zh", secret=True)   # table: {English: translation}

A code cell's text a student reads (a stub's docstring, a given cell's comments, a test's caption
`with checking("Exercise 3", "ColumnParallelLinear equals nn.Linear ...")`, a helper's error message) is
cut into *units*, each looked up, as a whole, in the assignment's code catalogue
(`zh/notebooks/<assignment>.code.md`, the format of the markdown catalogue: autograder/authoring/translations.py):

- a comment block: consecutive comment-only lines at one indentation (the key: their text without `# `), or
  one comment after code on its line;
- a docstring (the key: its text without the quotes and the indentation of its lines);
- a string, or a run of strings written side by side (implicitly concatenated: the key is their texts, one
  per line, and a translation has as many lines: each goes where its string was, with its quotes and prefix).
  An f-string's replacement fields are part of its text: a translation keeps them, in the same order.

Two fixed rules need no catalogue: an exercise's label `"Exercise 3"` becomes `"练习 3"` (the test cells'
`checking(...)` and the set-up cell's `course_notebook({...})` alike), and the set-up cell's
`course_notebook(..., language="en")` says `"zh"`. The markers (`### BEGIN SOLUTION`, ...) and nbgrader's
stub line stay as they are, and nothing inside a solution or hidden-test region is looked up (a source
notebook's secrets never reach a catalogue). The code itself is never touched: `code_signature` of the
cell (its syntax tree with every string's text left out, an f-string's fields kept) is the English one's,
which `translate_code` checks for every cell it changes.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass

__all__ = ["Unit", "prose_units", "translate_code", "code_signature", "prose_words", "is_prose",
           "english_prose_words", "MARKERS", "STUB_COMMENT", "LABELS"]

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
# nbgrader_config.py's stub: one fixed, searchable wording, quoted by the lessons of both languages
STUB_COMMENT = "# TODO: implement (see the task description above)."
# an exercise's label, in each language
LABELS = {"zh": "练习 {}"}
_LABEL = re.compile(r"Exercise (\d+[a-z]?)")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")


@dataclass
class Unit:
    kind: str            # "comment", "docstring" or "string"
    english: str         # the key: the unit's text (see the module's docstring)
    spans: list          # [(start offset, end offset)] of the source text each piece replaces
    rebuild: object      # translation -> [replacement text per span] (ValueError if it does not fit)
    line: int            # the unit's first line (1-based)


def _offsets(source: str) -> list[int]:
    """The offset in `source` of the start of each line (1-based rows: index 0 unused)."""
    out = [0, 0]
    for line in source.splitlines(keepends=True):
        out.append(out[-1] + len(line))
    return out


def _secret_rows(source: str) -> set[int]:
    """The rows (1-based) inside a solution or hidden-test region, markers included."""
    rows, inside = set(), False
    for i, line in enumerate(source.splitlines(), start=1):
        s = line.strip()
        if s in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
            inside = True
        if inside:
            rows.add(i)
        if s in ("### END SOLUTION", "### END HIDDEN TESTS"):
            inside = False
    return rows


def _is_marker(comment: str) -> bool:
    text = comment.strip()
    return text in MARKERS or text == STUB_COMMENT or text.startswith("#!")


_STRING = re.compile(r"^([A-Za-z]*)('''|\"\"\"|'|\")(.*)\2$", re.S)


def _split_string(token: str) -> tuple[str, str, str]:
    m = _STRING.match(token)
    if not m:
        raise ValueError(f"not a string token: {token[:40]!r}")
    return m.group(1), m.group(2), m.group(3)


def _docstring_starts(tree) -> set[tuple[int, int]]:
    """(row, col) of every docstring of a cell (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add((first.value.lineno, first.value.col_offset))
    return out


def _comment_units(toks, source, offsets, lines) -> list[Unit]:
    units, block = [], []

    def close():
        if block:
            units.append(_comment_block(block, offsets))
            block.clear()

    for tok in toks:
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start
        own_line = lines[row - 1][:col].strip() == ""
        if _is_marker(tok.string):
            close()
            continue
        if not own_line:
            close()
            units.append(_comment_block([tok], offsets))
            continue
        if block and (block[-1].start[0] != row - 1 or block[-1].start[1] != col):
            close()
        block.append(tok)
    close()
    return [u for u in units if u is not None]


def _comment_block(toks, offsets) -> Unit | None:
    col = toks[0].start[1]
    texts = []
    for tok in toks:
        s = tok.string
        if s == "#":
            texts.append("")
        elif s.startswith("# "):
            texts.append(s[2:])
        else:
            return None  # `#x`: not a comment we could write back as it was
    start = offsets[toks[0].start[0]] + col
    end = offsets[toks[-1].end[0]] + toks[-1].end[1]

    def rebuild(text: str) -> list[str]:
        out = [("# " + t if t else "#") for t in text.split("\n")]
        return [("\n" + " " * col).join(out)]

    return Unit("comment", "\n".join(texts), [(start, end)], rebuild, toks[0].start[0])


def _docstring_unit(tok, offsets) -> Unit | None:
    prefix, quote, body = _split_string(tok.string)
    indent = " " * tok.start[1]
    lines = body.split("\n")
    own_line_close = len(lines) > 1 and lines[-1] == indent
    inner = lines[1:-1] if own_line_close else lines[1:]
    rest = []
    for line in inner:
        if line.strip() == "":
            if line:
                return None  # trailing spaces on a blank line: not written back as it was
            rest.append("")
        elif line.startswith(indent):
            rest.append(line[len(indent):])
        else:
            return None
    english = "\n".join([lines[0]] + rest)

    def rebuild(text: str) -> list[str]:
        if quote in text or text.endswith(quote[0]):
            raise ValueError(f"the translation has the docstring's quotes {quote}")
        tl = text.split("\n")
        new = tl[0] + "".join("\n" + (indent + line if line else "") for line in tl[1:])
        if own_line_close:
            new += "\n" + indent
        return [prefix + quote + new + quote]

    if rebuild(english) != [tok.string]:
        return None
    start = offsets[tok.start[0]] + tok.start[1]
    end = offsets[tok.end[0]] + tok.end[1]
    return Unit("docstring", english, [(start, end)], rebuild, tok.start[0])


def _string_unit(run, offsets) -> Unit | None:
    parts = [_split_string(t.string) for t in run]
    if len(run) > 1 and any(len(q) == 3 for _, q, _ in parts):
        return None
    english = "\n".join(body for _, _, body in parts)

    def rebuild(text: str) -> list[str]:
        pieces = [text] if len(run) == 1 else text.split("\n")
        if len(pieces) != len(run):
            raise ValueError(f"{len(run)} strings side by side: the translation needs {len(run)} lines, "
                             f"one per string, not {len(pieces)}")
        out = []
        for (prefix, quote, _), piece in zip(parts, pieces):
            if len(quote) == 1 and ("\n" in piece or quote in piece.replace("\\" + quote, "")):
                raise ValueError(f"the translation {piece!r} does not fit between {quote} quotes")
            out.append(prefix + quote + piece + quote)
        return out

    spans = [(offsets[t.start[0]] + t.start[1], offsets[t.end[0]] + t.end[1]) for t in run]
    return Unit("string", english, spans, rebuild, run[0].start[0])


@dataclass
class _Tok:
    type: int
    string: str
    start: tuple
    end: tuple


def _tokens(source: str) -> list:
    """The cell's tokens, an f-string one STRING token (as Python 3.11 reads it; 3.12 cuts it into parts)."""
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    start_type = getattr(tokenize, "FSTRING_START", None)
    if start_type is None:
        return toks
    end_type = tokenize.FSTRING_END
    offsets = _offsets(source)
    out, depth, first = [], 0, None
    for tok in toks:
        if tok.type == start_type:
            depth += 1
            if depth == 1:
                first = tok
            continue
        if depth:
            if tok.type == end_type:
                depth -= 1
                if depth == 0:
                    text = source[offsets[first.start[0]] + first.start[1]:offsets[tok.end[0]] + tok.end[1]]
                    out.append(_Tok(tokenize.STRING, text, first.start, tok.end))
            continue
        out.append(tok)
    return out


def prose_units(source: str) -> list[Unit]:
    """The units of a code cell's text, in the order they appear ([] for a cell that does not parse)."""
    try:
        toks = _tokens(source)
        tree = ast.parse(source)
    except (SyntaxError, tokenize.TokenError, IndentationError):
        return []
    offsets, lines = _offsets(source), source.splitlines()
    docs = _docstring_starts(tree)
    units = _comment_units(toks, source, offsets, lines)
    run: list = []

    def close():
        if run:
            if len(run) == 1 and run[0].start in docs:
                unit = _docstring_unit(run[0], offsets)
            else:
                unit = _string_unit(list(run), offsets)
            if unit is not None:
                units.append(unit)
            run.clear()

    for tok in toks:
        if tok.type == tokenize.STRING:
            run.append(tok)
        elif tok.type != tokenize.NL:
            close()
    close()
    return sorted(units, key=lambda u: u.spans[0][0])


def _rule(source: str, toks, unit: Unit, lang: str) -> str | None:
    """The translation of a unit by a fixed rule (an exercise's label, the notebook's language), else None."""
    if unit.kind != "string" or len(unit.spans) != 1:
        return None
    m = _LABEL.fullmatch(unit.english)
    if m and lang in LABELS:
        return LABELS[lang].format(m.group(1))
    if unit.english == "en" and "course_notebook(" in source:
        before = source[:unit.spans[0][0]].rstrip()
        if re.search(r"\blanguage\s*=$", before):
            return lang
    return None


def code_signature(source: str) -> str:
    """A cell's code without its prose: the syntax tree with every string's text left out (an f-string's
    replacement fields kept, in order). Comments are not in the tree."""
    tree = ast.parse(source)

    class Blank(ast.NodeTransformer):
        def visit_JoinedStr(self, node):
            node.values = [self.visit(v) for v in node.values if not isinstance(v, ast.Constant)]
            return node

        def visit_Constant(self, node):
            if isinstance(node.value, str):
                return ast.copy_location(ast.Constant(""), node)
            return node

    return ast.dump(Blank().visit(tree), include_attributes=False)


def _rule_back(source: str, toks, unit: Unit, lang: str) -> str | None:
    """`_rule` undone: the English of a unit a fixed rule translated into `lang`, else None."""
    if unit.kind != "string" or len(unit.spans) != 1:
        return None
    if lang in LABELS:
        m = re.fullmatch(re.escape(LABELS[lang]).replace(re.escape("{}"), r"(\d+)"), unit.english)
        if m:
            return f"Exercise {m.group(1)}"
    if unit.english == lang and "course_notebook(" in source:
        before = source[:unit.spans[0][0]].rstrip()
        if re.search(r"\blanguage\s*=$", before):
            return "en"
    return None


def english_code(source: str, back: dict, lang: str) -> str:
    """`translate_code` undone: `source` (a code cell built in `lang`) with each unit's English back, from `back`
    ({translation: English}, the code catalogue read backwards) and the fixed rules. ValueError where that
    changes the code."""
    return translate_code(source, back, lang, secret=False, _rule=_rule_back)[0]


def translate_code(source: str, table: dict, lang: str, *, secret: bool = True,
                   _rule=_rule) -> tuple[str, list[str]]:
    """`source` with each unit found in `table` (and each fixed rule) replaced. Returns (the new source, the
    English of the prose units left untranslated). Units in a solution or hidden-test region are left alone
    (`secret`: regions marked in a source notebook). ValueError when a translation does not fit its place or
    changes the code (`code_signature`)."""
    units = prose_units(source)
    if not units:
        return source, []
    rows = _secret_rows(source) if secret else set()
    toks = _tokens(source)
    edits, missing = [], []
    for unit in units:
        if unit.line in rows:
            continue
        new = _rule(source, toks, unit, lang)
        if new is None:
            new = table.get(unit.english)
        if new is None:
            if is_prose(unit.english):
                missing.append(unit.english)
            continue
        for span, text in zip(unit.spans, unit.rebuild(new)):
            edits.append((span, text))
    if not edits:
        return source, missing
    out = source
    for (start, end), text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    try:
        same = code_signature(out) == code_signature(source)
    except SyntaxError as exc:
        raise ValueError(f"the translated cell does not parse: {exc}\n{out}") from None
    if not same:
        raise ValueError(f"a translation changed the code of this cell (a replacement field of an f-string?):\n"
                         f"{out}")
    return out, missing


# ---------------------------------------------------------------------------
# Counting the English a student reads in code cells
# ---------------------------------------------------------------------------

_WORD = re.compile(r"^[A-Za-z][a-z]*$")
_PUNCT = "()[]{}<>,.;:!?\"'`*"


def prose_words(text: str) -> list[str]:
    """The English words of a text: alphabetic words outside `code spans` and `[shapes]`, not identifiers (no
    `_`, no digit, no inner capital), `a` and `I` included."""
    text = re.sub(r"`[^`\n]*`|\[[^\]\n]*\]", " ", text)  # code spans and shapes (`[s, b, h]`) are not prose
    words = []
    for raw in text.split():
        w = raw.strip(_PUNCT)
        w = w[:-2] if w.endswith("'s") else w
        if _WORD.match(w) and (len(w) > 1 or w in ("a", "A", "I")):
            words.append(w)
    return words


def is_prose(text: str) -> bool:
    """English prose (a sentence, a caption): at least 3 English words and no Chinese character."""
    return not _CJK.search(text) and len(prose_words(text)) >= 3


def english_prose_words(source: str) -> int:
    """How many English words of prose a code cell shows (in its units that are English prose)."""
    return sum(len(prose_words(u.english)) for u in prose_units(source) if is_prose(u.english))
