"""The language of what a student reads from the course: verdicts, pass lines, hints (issue 30).

    from autograder.runtime.messages import localize, set_language
    set_language("zh")                      # a Chinese notebook's set-up cell does it: course_notebook(..., language="zh")
    localize("rank 1: out: shape [4, 2], expected [4, 3].")   # -> "rank 1: out：形状为 [4, 2]，应为 [4, 3]。"

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
it stays where it is (the value starts, or ends, with `{}` there too). tests/test_zh_messages.py checks that
every key is still a phrase of the code, and which phrases have no translation yet:

    python -m autograder.authoring.translations messages       # the phrases of the checks not yet translated

The trusted grader (autograder.grading.trusted) decides and records every verdict in English (`pinned("en")`):
its set-up cells call `course_notebook(..., language="zh")` too, and a verdict's words are read by the
grader's own code (which hidden case failed, and how).
"""

from __future__ import annotations

import contextlib
import re
import string

__all__ = ["LANGUAGES", "set_language", "language", "pinned", "localize", "translate", "phrase_pattern"]

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


def phrase_pattern(template: str) -> tuple[re.Pattern, int, bool, bool]:
    """(the regex of a key's phrase, its number of inner fields, whether it starts with a field, whether it ends
    with one). The fields at either end are not part of the phrase: the text around it stays in place."""
    pieces = _pieces(template)
    lead = bool(pieces) and pieces[0] is None
    trail = len(pieces) > 1 and pieces[-1] is None
    core = pieces[lead:len(pieces) - trail] if trail else pieces[lead:]
    regex, fields = "", 0
    for piece in core:
        if piece is None:
            regex += _FIELD
            fields += 1
        else:
            regex += re.escape(piece)
    return re.compile(regex), fields, lead, trail


def _value_pieces(value: str, lead: bool, trail: bool) -> list[str | int]:
    """A translation's literal texts and, for each inner field it places, its index (`{}` in the English order,
    or `{0}`, `{1}`: the inner fields, counted from 0). The fields at the ends of a key that has them (the text
    around the phrase) are not replaced: the translation starts, or ends, with `{}` there, and it is dropped."""
    items: list[str | int | None] = []  # literal texts, and None for each field, explicit numbers kept
    for literal, field, _spec, _conv in string.Formatter().parse(value):
        if literal:
            items.append(literal)
        if field is not None:
            items.append(None if field == "" else int(field))
    if lead:
        if not items or isinstance(items[0], str):
            raise ValueError(f"the translation {value!r} must start with the field its English key starts with")
        items = items[1:]
    if trail:
        if not items or isinstance(items[-1], str):
            raise ValueError(f"the translation {value!r} must end with the field its English key ends with")
        items = items[:-1]
    out: list[str | int] = []
    auto = 0
    for item in items:
        if item is None:
            out.append(auto)
            auto += 1
        else:
            out.append(item)
    return out


class _Phrase:
    __slots__ = ("key", "value", "regex", "fields", "lead", "trail", "parts", "weight")

    def __init__(self, key: str, value: str):
        self.key, self.value = key, value
        self.regex, self.fields, self.lead, self.trail = phrase_pattern(key)
        self.parts = _value_pieces(value, self.lead, self.trail)
        self.weight = sum(len(p) for p in _pieces(key) if p)

    def sub(self, text: str) -> str:
        def one(m: re.Match) -> str:
            groups = m.groups()
            return "".join(groups[p] if isinstance(p, int) else p for p in self.parts)
        return self.regex.sub(one, text)


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
