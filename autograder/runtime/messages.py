"""The language of what a student reads from the course: verdicts, pass lines, hints (issue 30).

    from autograder.runtime.messages import localize, set_language
    set_language("zh")                      # a Chinese notebook's set-up cell does it: course_notebook(..., language="zh")
    localize("rank 1: out: shape [4, 2], expected [4, 3].")   # -> "rank 1: out：形状是 [4, 2]，期望 [4, 3]。"

The checks and the runtime write their messages in English, as f-strings, and never know about languages.
What a student sees of them goes through `localize` (autograder.runtime.report does it for a graded cell's
verdict and pass line, and for a picture or scratch cell's error): in English it is the text itself; in
another language each fixed phrase of the text is looked up in that language's catalogue
(`messages_zh.ZH`) and replaced, and the data in between (ranks, names, shapes, numbers, the student's code
and tracebacks) is kept as it is.

A catalogue is keyed by the English phrase exactly as the code writes it: the literal text of an f-string,
each replacement field written `{}` (`f"{where}: shape {fmt_shape(a)}, expected {fmt_shape(e)}."` is the key
`"{}: shape {}, expected {}."`; a literal brace is doubled), one line of it per key (an f-string with `\\n` is
looked up line by line). Its value is the translation, with the same fields: `{}` in the English order, or
`{0}`, `{1}`, ... to reorder them. A field at the very start or end of a key is the text around the phrase:
it stays where it is (the value starts, or ends, with a plain `{}` there too). tests/test_zh_code_cells.py
checks that every key is still a phrase of the code; which phrases have no translation yet (a new check's
message stays English until someone adds it):

    python -m autograder.authoring.translations messages       # the phrases of the checks not yet translated

The trusted grader (autograder.grading.trusted) decides and records every verdict in English (`pinned("en")`):
its set-up cells call `course_notebook(..., language="zh")` too, and a verdict's words are read by the
grader's own code (which hidden case failed, and how).
"""

from __future__ import annotations

import contextlib
import re
import string

__all__ = ["LANGUAGES", "set_language", "language", "pinned", "localize", "translate", "phrase_pattern", "catalogue"]

LANGUAGES = ("en", "zh")

_STATE = {"lang": "en", "pinned": None}


def set_language(lang: str) -> None:
    """The language of what the student reads from now on in this process (a notebook's set-up cell sets it)."""
    if lang not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, got {lang!r}")
    _STATE["lang"] = lang


def language() -> str:
    """The language messages are shown in: the pinned one (the trusted grader's), else the notebook's."""
    return _STATE["pinned"] or _STATE["lang"]


@contextlib.contextmanager
def pinned(lang: str = "en"):
    """Within the block, messages are in `lang` whatever a notebook's set-up cell asks for (the grader's)."""
    before = _STATE["pinned"]
    _STATE["pinned"] = lang
    try:
        yield
    finally:
        _STATE["pinned"] = before


def localize(text: str) -> str:
    """`text` in the language of the notebook (`language()`): itself in English."""
    lang = language()
    return text if lang == "en" else translate(text, lang)


# ---------------------------------------------------------------------------
# Phrases: an English key with fields `{}` -> a regex that finds it in a message
# ---------------------------------------------------------------------------

_FIELD = "([^\n]*?)"


def _pieces(template: str) -> list[str | None]:
    """The literal texts and fields (None) of a key, in order (`string.Formatter` reads `{{` as a brace)."""
    out: list[str | None] = []
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        if literal:
            out.append(literal)
        if field is not None:
            out.append(None)
    return out


# a field at the very start or end of a key that its translation moves: one word, number or [shape]
_TOKEN = r"(\[[^\]\n]*\]|[^\s,;:()\[\]\uff08\uff09\uff0c\uff1b\uff1a]+)"


def _value_items(value: str) -> list:
    """A translation's literal texts and fields (None for `{}`, the number for `{1}`), in order."""
    items: list = []
    for literal, field, _spec, _conv in string.Formatter().parse(value):
        if literal:
            items.append(literal)
        if field is not None:
            items.append(None if field == "" else int(field))
    return items


def phrase_pattern(key: str, value: str) -> tuple[re.Pattern, list]:
    """(the regex that finds a key's phrase in a message, the pieces its translation is made of: literal texts,
    and the index of each field of the match it places).

    A field at the very start or end of a key is the text around the phrase when the translation starts, or
    ends, with a plain `{}` there too: it is not part of the match and stays where it is. Otherwise the
    translation moves it, and it is matched as one word, number or `[shape]`. The translation's `{}` are the
    fields of the match in the English order; `{0}`, `{1}` name them (counted without the fields kept in place)."""
    pieces = _pieces(key)
    items = _value_items(value)
    lead = bool(pieces) and pieces[0] is None
    trail = len(pieces) > 1 and pieces[-1] is None
    # kept in place: the translation starts (ends) with a plain `{}` there; `{1}` there is a field it moves
    lead_kept = lead and bool(items) and items[0] is None
    trail_kept = trail and len(items) > 1 and items[-1] is None
    if lead_kept:
        pieces, items = pieces[1:], items[1:]
    if trail_kept:
        pieces, items = pieces[:-1], items[:-1]
    if not any(isinstance(p, str) and p.strip() for p in pieces):
        raise ValueError(f"the key {key!r} has no text of its own")
    regex, fields = "", 0
    for i, piece in enumerate(pieces):
        if piece is None:
            if (i == 0 and lead and not lead_kept) or (i == len(pieces) - 1 and trail and not trail_kept) \
                    or (i + 1 < len(pieces) and pieces[i + 1] is None):
                regex += _TOKEN  # moved by the translation, or the first of two fields side by side (`{rank}{ctx}`)
            elif i == len(pieces) - 1:
                regex += "([^\n]*)"  # a field that ends the phrase (before the text after it): the rest of the line
            else:
                regex += _FIELD
            fields += 1
        else:
            regex += re.escape(piece)
    parts: list[str | int] = []
    auto = 0
    for item in items:  # `{}` numbered in order; a literal text or `{1}` as it is
        if item is None:
            item, auto = auto, auto + 1
        parts.append(item)
    used = [p for p in parts if isinstance(p, int)]
    if sorted(set(used)) != list(range(fields)) or len(used) != fields:
        raise ValueError(f"the translation {value!r} places fields {used}; its key {key!r} has {fields} to place, "
                         f"each once")
    return re.compile(regex), parts


class _Phrase:
    __slots__ = ("key", "value", "regex", "parts", "weight", "opening")

    def __init__(self, key: str, value: str):
        self.key, self.value = key, value
        self.regex, self.parts = phrase_pattern(key, value)
        pieces = _pieces(key)
        self.weight = sum(len(p) for p in pieces if p)
        # where a match can start: the key's first text (after a field kept in place, as in `{}: {} of {}`)
        start = 1 if pieces[0] is None and self.regex.pattern.startswith(re.escape(pieces[1] or "")) else 0
        self.opening = pieces[start] if isinstance(pieces[start], str) else None

    def sub(self, text: str) -> str:
        """Each occurrence replaced; of the matches that overlap, the one that starts last (the innermost: the
        phrase ` ({} {} in {} with ...)` in `rank 0 (ctx): ... saw 0 (2 all_reduce in ...)` starts at `(2`, and
        `{}: {} of {} elements` in `rank 1: out: 3 of 12 elements` at the second `: `)."""
        out, pos = [], 0
        while True:
            m = self.regex.search(text, pos)
            if m is None:
                break
            if self.opening:
                i = text.find(self.opening, m.start() + 1)
                while i != -1 and i < m.end():
                    later = self.regex.match(text, i)
                    if later is not None and later.end() <= m.end():
                        m = later
                    i = text.find(self.opening, i + 1)
            out.append(text[pos:m.start()])
            groups = m.groups()
            out.append("".join(groups[p] if isinstance(p, int) else p for p in self.parts))
            pos = m.end() if m.end() > m.start() else m.end() + 1
            if m.end() == m.start():
                out.append(text[m.start():pos])
        out.append(text[pos:])
        return "".join(out)


_COMPILED: dict[str, list[_Phrase]] = {}


def catalogue(lang: str) -> dict[str, str]:
    """The catalogue of `lang`: {English key: translation}."""
    if lang == "zh":
        from autograder.runtime.messages_zh import ZH

        return ZH
    return {}


def _phrases(lang: str) -> list[_Phrase]:
    if lang not in _COMPILED:
        phrases = [_Phrase(k, v) for k, v in catalogue(lang).items() if v]
        # the longest phrase first: a phrase inside a longer one is replaced only where the longer one is not
        phrases.sort(key=lambda p: (-p.weight, p.key))
        _COMPILED[lang] = phrases
    return _COMPILED[lang]


def translate(text: str, lang: str) -> str:
    """`text` with every phrase of `lang`'s catalogue replaced by its translation (the data in between kept)."""
    if lang == "en" or not text:
        return text
    for phrase in _phrases(lang):
        if phrase.regex.search(text):
            text = phrase.sub(text)
    return text
