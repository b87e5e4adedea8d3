"""The Chinese site's search: the course's own terms found as the reader types them (issue 30).

Sphinx indexes Chinese text with jieba (`cut_for_search`), which knows general Chinese, not the course:
数据并行 was cut into 数据 + 并行 in the index, while the reader's query 数据并行 stayed one word that no page
had, so the search found nothing. Two fixes, used by docs/conf.py:

- the index side: every term of zh/GLOSSARY.md's second column (its Chinese runs of two characters or more:
  数据并行, 进程组, 重计算, 通信域, ...) is added to jieba's dictionary before the pages are indexed, so the
  index holds the term itself beside its parts (`cut_for_search` keeps both);
- the query side: `SPLITTER_JS` is the search page's `splitQuery` (Sphinx's hook for a language's query
  splitter). A run of Chinese characters that the index does not hold as a word is cut into the longest
  words the index does hold (forward maximum matching), so any query written without spaces finds the
  pages a query with spaces finds; a single character the index lacks is dropped, as jieba's index drops
  single characters.

    .venv/bin/python -m pytest -q tests/test_site_browser.py -k glossary    # every term, in Chromium
"""

from __future__ import annotations

import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
GLOSSARY = os.path.join(os.path.dirname(HERE), "zh", "GLOSSARY.md")
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]{2,}")


def glossary_terms(path: str = GLOSSARY) -> list[str]:
    """The Chinese terms of the glossary's table, in order: its second column ("中文写法") split at 、 and ；,
    notes (in full-width parentheses) and code left out; only terms with Chinese characters."""
    terms: list[str] = []
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 4 or set(cells[0]) <= set("-: ") or cells[0] == "English":
            continue
        column = re.sub(r"（[^（）]*）|`[^`]*`", "", re.sub(r"（[^（）]*（[^（）]*）[^（）]*）", "", cells[1]))
        for term in re.split(r"[、；]", column):
            term = term.strip()
            if HAN.search(term) and term not in terms:
                terms.append(term)
    return terms


def dictionary_words(terms: list[str] | None = None) -> list[str]:
    """The words jieba must know: each run of two or more Chinese characters of the terms."""
    words: list[str] = []
    for term in glossary_terms() if terms is None else terms:
        for run in HAN.findall(term):
            if run not in words:
                words.append(run)
    return words


def add_to_jieba(words: list[str] | None = None) -> None:
    """Teach jieba (Sphinx's Chinese splitter) the course's terms; no-op without jieba."""
    try:
        import jieba
    except ImportError:
        return
    for word in dictionary_words() if words is None else words:
        jieba.add_word(word)


# The search page's query splitter (Sphinx puts it in _static/language_data.js, before searchtools.js, whose
# default splitter it replaces); it reads the loaded index through searchtools' `Search` when it runs.
SPLITTER_JS = r"""
/* The course's Chinese query splitter (docs/zh_search.py): a run of Chinese characters the index does not
   hold as a word is cut into the longest words it holds. */
var splitQuery = (query) => {
  const parts = query.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu).filter((term) => term);
  const index = typeof Search === "undefined" ? null : Search._index;
  if (!index) return parts;
  const has = (word) => Object.prototype.hasOwnProperty.call(index.terms, word)
    || Object.prototype.hasOwnProperty.call(index.titleterms, word);
  const words = [];
  parts.forEach((part) => {
    (part.match(/\p{Script=Han}+|[^\p{Script=Han}]+/gu) || []).forEach((run) => {
      if (!/\p{Script=Han}/u.test(run) || has(run.toLowerCase())) {
        words.push(run);
        return;
      }
      for (let i = 0; i !== run.length;) {
        let j = Math.min(run.length, i + 12);
        while (j - i > 1 && !has(run.slice(i, j))) j -= 1;
        if (j - i > 1 || has(run.slice(i, j))) words.push(run.slice(i, j));
        i = j;
      }
    });
  });
  return words;
};
"""
