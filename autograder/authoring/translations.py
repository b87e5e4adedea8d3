"""The notebooks' text in another language (issue 24): a Chinese release with the same cells, gettext-like.

    make build COURSE_LANG=zh                                   # source/ and release/ rebuilt in Chinese
    python -m autograder.authoring.translations status          # which markdown cells lack a current translation
    python -m autograder.authoring.translations sync 03_pipeline_parallel   # after an English change: see below
    python -m autograder.authoring.translations language        # the language release/ is in now (en or zh)
    python -m autograder.authoring.translations messages        # the checks' phrases without a Chinese verdict

The builders (assignments/*/_build_nb.py) write English only and never know about languages.
`NotebookBuilder.write` (nbbuild.py) hands a finished notebook to `translate_notebook` when the
language is not English: each markdown cell's text is looked up, as a whole, in the assignment's
catalog `zh/notebooks/<assignment>.md` and replaced by its translation. The code of code cells (set-up,
answers, tests) and every cell's metadata, id and grading id are untouched, so a Chinese release is graded
exactly as the English one (tests/test_zh_notebooks.py grades both and compares).

The code cells' prose (issue 30: stubs' docstrings, given cells' comments, the test cells' captions, the
helpers' messages) has a catalog of its own, `zh/notebooks/<assignment>.code.md`, in the same format: one
entry per comment block, docstring or string (autograder/authoring/codetext.py says what a unit is and what
stays: the code, the grading ids, the markers, nbgrader's stub line). Only the prose changes, and only
outside solution and hidden-test regions; a unit without a translation stays English (`status` lists them,
tests/test_zh_notebooks.py bounds how many English words are left). The verdicts the checks print at run
time are translated by the runtime (autograder/runtime/messages.py), once the notebook's set-up cell said
`course_notebook(..., language="zh")`.

A catalog is a Markdown file that reads as the notebook's Chinese text. Each entry is the English
text of one cell, kept in an HTML comment headed by a short hash of that text, then its translation:

    <!-- en 3f2a9c1b07
    ## Exercise 1: `all_reduce_gradients(model, *, group)` (6 points)
    ...
    -->

    ## 练习 1：`all_reduce_gradients(model, *, group)`（6 分）
    ...

A cell is translated when its current English text equals an entry's English exactly (the hash names
the entry; it must match). When the English of a cell changes, the old entry no longer matches:
the build keeps that cell in English (and says so), and tests/test_zh_notebooks.py fails, naming the
cell and showing what changed in the English. `sync` then rewrites the catalog in the notebook's cell
order: the new English beside the old translation, marked `<!-- TODO(zh) ... -->` until someone updates
it (a marked entry still counts as missing); entries no cell uses any more are dropped.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass

__all__ = ["LANGUAGES", "course_language", "catalog_path", "code_catalog_path", "load_catalog", "write_catalog",
           "entry_key", "translate_notebook", "english_notebook", "notebook_language", "release_language",
           "english_cells", "english_code_units", "status", "code_status", "sync", "sync_code"]

LANGUAGES = ("en", "zh")
ENV = "COURSE_LANG"
TODO = "<!-- TODO(zh)"
_ENTRY = re.compile(r"^<!-- en ([0-9a-f]{10})$")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(os.path.dirname(_HERE))

_HEADER = """<!--
The Chinese text of the notebook of {assignment} (its markdown cells; code cells stay as they are).
Read by autograder/authoring/translations.py for `make build COURSE_LANG=zh` and the Chinese site.
Each entry: the English text of one cell in a comment headed by its hash, then the Chinese. Do not edit the
English or the hash by hand: after an English change run
    .venv/bin/python -m autograder.authoring.translations sync {assignment}
and update the entries marked TODO(zh). Terms and style: zh/GLOSSARY.md.
-->
"""


_CODE_HEADER = """<!--
The Chinese prose of the code cells of {assignment}: comments, docstrings and strings (captions, messages) a
student reads; the code stays as it is (autograder/authoring/codetext.py). Read by
autograder/authoring/translations.py for `make build COURSE_LANG=zh` and the Chinese site. Each entry: the English
of one unit in a comment headed by its hash, then the Chinese. A comment block's lines are written without `# `;
strings written side by side have one line each, in the English and in the Chinese alike; an f-string keeps its
`{{...}}` fields, in their order. Do not edit the English or the hash by hand: after an English change run
    .venv/bin/python -m autograder.authoring.translations sync {assignment}
and update the entries marked TODO(zh). Terms and style: zh/GLOSSARY.md.
-->
"""


def course_language(value: str | None = None) -> str:
    """The language asked for (argument, else $COURSE_LANG, else English); ValueError for one we do not have."""
    lang = (value if value is not None else os.environ.get(ENV, "")).strip() or "en"
    if lang not in LANGUAGES:
        raise ValueError(f"{ENV}={lang!r}: the course's languages are {', '.join(LANGUAGES)}")
    return lang


def entry_key(english: str) -> str:
    """The short hash that names an entry: the first 10 hex digits of the SHA-256 of the English text."""
    return hashlib.sha256(english.encode("utf-8")).hexdigest()[:10]


def catalog_path(root: str, lang: str, assignment: str) -> str:
    return os.path.join(root, lang, "notebooks", f"{assignment}.md")


def code_catalog_path(root: str, lang: str, assignment: str) -> str:
    """The catalog of the code cells' prose (comments, docstrings, strings)."""
    return os.path.join(root, lang, "notebooks", f"{assignment}.code.md")


@dataclass
class Entry:
    english: str
    text: str           # the translation ("" when none was written)
    line: int = 0       # where the entry starts in its file (1-based)

    @property
    def key(self) -> str:
        return entry_key(self.english)

    @property
    def todo(self) -> bool:
        return TODO in self.text or not self.text.strip()


class CatalogError(ValueError):
    pass


def load_catalog(path: str) -> list[Entry]:
    """The entries of a catalog file, in order ([] when the file does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    entries: list[Entry] = []
    i = 0
    while i < len(lines):
        m = _ENTRY.match(lines[i])
        if not m:
            if entries:
                entries[-1].text += lines[i] + "\n"
            i += 1
            continue
        start, key = i + 1, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j] != "-->":
            j += 1
        if j == len(lines):
            raise CatalogError(f"{path}:{start}: the English of entry {key} is not closed by a line `-->`")
        english = "\n".join(lines[i + 1:j])
        if entry_key(english) != key:
            raise CatalogError(f"{path}:{start}: entry {key} does not match its English text (hash "
                               f"{entry_key(english)}): the English was edited by hand; run `python -m "
                               f"autograder.authoring.translations sync` instead")
        entries.append(Entry(english, "", start))
        i = j + 1
    for e in entries:
        e.text = e.text.strip("\n")
    return entries


def write_catalog(path: str, assignment: str, entries: list[Entry], header: str = _HEADER) -> None:
    parts = [header.format(assignment=assignment)]
    for e in entries:
        if "\n-->\n" in f"\n{e.english}\n":
            raise CatalogError(f"{assignment}: a markdown cell has a line `-->`, which ends a catalog entry")
        parts.append(f"<!-- en {e.key}\n{e.english}\n-->\n\n{e.text.strip()}\n")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(parts))


def _text(cell) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def _checksum(cell) -> str:
    """nbgrader's checksum of a cell (`nbgrader.utils.compute_checksum`): a release's graded and locked cells carry
    it, so a cell whose prose was translated gets the one `nbgrader generate_assignment` writes for it."""
    import hashlib

    meta = cell["metadata"].get("nbgrader", {})
    grade, solution = bool(meta.get("grade", False)), bool(meta.get("solution", False))
    locked = False if solution else (True if grade else bool(meta.get("locked", False)))
    m = hashlib.md5()
    for part in (_text(cell), cell["cell_type"], str(grade), str(solution), str(locked), meta["grade_id"]):
        m.update(part.encode("utf-8"))
    if grade:
        m.update(str(float(meta["points"])).encode("utf-8"))
    return m.hexdigest()


def _table(path: str) -> dict[str, str]:
    return {e.english: e.text for e in load_catalog(path) if not e.todo}


def translate_notebook(nb, root: str, assignment: str, lang: str, code_missing: list | None = None) -> list[str]:
    """Replace, in place, each markdown cell's text and the prose of each code cell by its translation, and mark
    the notebook's language.

    Returns the English texts of markdown cells that have no current translation (those cells stay English);
    `code_missing`, if given, gets the English of the code cells' prose units left untranslated. English is a
    no-op. Code, metadata, ids and grading ids stay as they are (codetext.translate_code checks the code).
    """
    from autograder.authoring.codetext import translate_code

    lang = course_language(lang)
    if lang == "en":
        return []
    table = _table(catalog_path(root, lang, assignment))
    code_table = _table(code_catalog_path(root, lang, assignment))
    missing = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            try:
                new, left = translate_code(_text(cell), code_table, lang)
            except ValueError as exc:
                gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or cell.get("id")
                raise ValueError(f"{code_catalog_path(root, lang, assignment)}: code cell {gid}: {exc}") from None
            if new != _text(cell):
                cell["source"] = new
                if "checksum" in cell["metadata"].get("nbgrader", {}):  # a release notebook's (nbgrader's)
                    cell["metadata"]["nbgrader"]["checksum"] = _checksum(cell)
            if code_missing is not None:
                code_missing += left
            continue
        if cell["cell_type"] != "markdown":
            continue
        english = _text(cell)
        if english in table:
            cell["source"] = table[english]
        else:
            missing.append(english)
    nb["metadata"].setdefault("course", {})["language"] = lang
    return missing


def english_notebook(nb, root: str, assignment: str) -> None:
    """Undo `translate_notebook` in place: each markdown cell of a translated notebook gets its English text back
    (a cell left in English stays as it is), each code cell the English of its comments, docstrings and strings and the language mark goes, so the notebook is the English build's,
    byte for byte. English is a no-op. ValueError when a cell is a translation the catalog no longer has (release/
    was built before the catalog changed: build it again)."""
    from autograder.authoring.codetext import english_code

    lang = notebook_language(nb)
    if lang == "en":
        return
    entries = load_catalog(catalog_path(root, lang, assignment))
    english = {e.english for e in entries}      # (a cell whose English changed stays English in the build)
    back = {e.text: e.english for e in entries if not e.todo}
    code_back = {text: en for en, text in _table(code_catalog_path(root, lang, assignment)).items()}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":  # the prose of its comments, docstrings and strings
            new = english_code(_text(cell), code_back, lang)
            if new != _text(cell):  # in the form it was read in (nbformat's JSON keeps a list of lines)
                cell["source"] = new.splitlines(keepends=True) if isinstance(cell["source"], list) else new
                if "checksum" in cell["metadata"].get("nbgrader", {}):  # nbgrader's, of the English cell
                    cell["metadata"]["nbgrader"]["checksum"] = _checksum(cell)
            continue
        if cell["cell_type"] != "markdown":
            continue
        text = _text(cell)
        if text in back:
            cell["source"] = back[text]
        elif text not in english and _HAN.search(text):
            raise ValueError(f"{assignment}: markdown cell {i + 1} ({_first_line(text)!r}) of the {lang} notebook is "
                             f"not in {os.path.relpath(catalog_path(root, lang, assignment), root)} any more: "
                             f"rebuild release/ (make build COURSE_LANG={lang}, or make build)")
    meta = nb["metadata"]
    meta.get("course", {}).pop("language", None)
    if "course" in meta and not meta["course"]:
        del meta["course"]


def notebook_language(nb) -> str:
    return nb.get("metadata", {}).get("course", {}).get("language", "en")


def release_language(root: str, folder: str = "release") -> str:
    """The language the notebooks under `folder` are in; ValueError when they mix languages."""
    found = {}
    base = os.path.join(root, folder)
    for a in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        for name in sorted(os.listdir(os.path.join(base, a))) if os.path.isdir(os.path.join(base, a)) else []:
            if name.endswith(".ipynb"):
                with open(os.path.join(base, a, name), encoding="utf-8") as f:
                    found[f"{folder}/{a}/{name}"] = notebook_language(json.load(f))
    langs = sorted(set(found.values()))
    if len(langs) > 1:
        raise ValueError(f"{folder}/ mixes languages ({', '.join(f'{p}: {l}' for p, l in found.items())}): "
                         f"rebuild it in one (make build COURSE_LANG=...)")
    return langs[0] if langs else "en"


# ---------------------------------------------------------------------------
# Keeping catalogs in step with the builders
# ---------------------------------------------------------------------------

def assignments(root: str) -> list[str]:
    base = os.path.join(root, "assignments")
    return sorted(a for a in os.listdir(base) if os.path.exists(os.path.join(base, a, "_build_nb.py")))


def english_cells(root: str, assignment: str) -> list[str]:
    """The markdown texts of an assignment's notebook as its builder makes them (English), in order."""
    path = os.path.join(root, "assignments", assignment, "_build_nb.py")
    spec = importlib.util.spec_from_file_location(f"_course_build_nb_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [c.source for c in module.build().cells if c.cell_type == "markdown"]


def english_code_units(root: str, assignment: str, nb=None) -> list[str]:
    """The English prose units of the code cells of an assignment's notebook as its builder makes it (outside
    solution and hidden-test regions), in order, each once."""
    from autograder.authoring.codetext import is_prose, prose_units, _secret_rows

    if nb is None:
        path = os.path.join(root, "assignments", assignment, "_build_nb.py")
        spec = importlib.util.spec_from_file_location(f"_course_build_nb_{assignment}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        nb = module.build().notebook()
    out, seen = [], set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        secret = _secret_rows(cell.source)
        for unit in prose_units(cell.source):
            if unit.line not in secret and is_prose(unit.english) and unit.english not in seen:
                seen.add(unit.english)
                out.append(unit.english)
    return out


def _first_line(text: str) -> str:
    line = next((l for l in text.splitlines() if l.strip()), "")
    return line if len(line) <= 90 else line[:87] + "..."


def _closest(english: str, candidates: list[Entry]) -> Entry | None:
    best, score = None, 0.0
    for e in candidates:
        s = difflib.SequenceMatcher(None, english, e.english, autojunk=False).ratio()
        if s > score:
            best, score = e, s
    return best if score >= 0.5 else None


def status(root: str, assignment: str, lang: str = "zh", cells: list[str] | None = None) -> list[str]:
    """Problems of one catalog, each a readable paragraph: cells without a current translation (with the
    English diff when an older translation exists), entries marked TODO, entries no cell uses."""
    cells = english_cells(root, assignment) if cells is None else cells
    path = catalog_path(root, lang, assignment)
    rel = os.path.relpath(path, root)
    try:
        entries = load_catalog(path)
    except CatalogError as exc:
        return [str(exc)]
    by_english = {e.english: e for e in entries}
    unused = [e for e in entries if e.english not in set(cells)]
    problems = []
    for i, english in enumerate(cells):
        e = by_english.get(english)
        where = f"markdown cell {i + 1} ({_first_line(english)!r})"
        if e is not None and not e.todo:
            continue
        if e is not None:
            problems.append(f"{rel}:{e.line}: {where}: entry {e.key} is marked TODO: update its translation "
                            f"and remove the marker")
            continue
        old = _closest(english, unused)
        if old is None:
            problems.append(f"{rel}: {where} has no translation (new English text, hash {entry_key(english)})")
            continue
        diff = "\n".join(difflib.unified_diff(old.english.splitlines(), english.splitlines(),
                                              "English when translated", "English now", lineterm="", n=1))
        problems.append(f"{rel}:{old.line}: {where}: the English changed since entry {old.key} was "
                        f"translated:\n{diff}")
    used_by_problem = {p.split("entry ")[1].split(" ")[0] for p in problems if "since entry " in p}
    for e in unused:
        if e.key not in used_by_problem:
            problems.append(f"{rel}:{e.line}: entry {e.key} ({_first_line(e.english)!r}) is the text of no "
                            f"markdown cell any more")
    return problems


def code_status(root: str, assignment: str, lang: str = "zh", units: list[str] | None = None) -> list[str]:
    """The code cells' prose units without a current translation, and the entries no unit uses any more."""
    units = english_code_units(root, assignment) if units is None else units
    path = code_catalog_path(root, lang, assignment)
    rel = os.path.relpath(path, root)
    try:
        entries = load_catalog(path)
    except CatalogError as exc:
        return [str(exc)]
    by_english = {e.english: e for e in entries}
    problems = []
    for english in units:
        e = by_english.get(english)
        if e is None:
            problems.append(f"{rel}: no translation of {_first_line(english)!r} (hash {entry_key(english)})")
        elif e.todo:
            problems.append(f"{rel}:{e.line}: entry {e.key} ({_first_line(english)!r}) is marked TODO")
    used = set(units)
    problems += [f"{rel}:{e.line}: entry {e.key} ({_first_line(e.english)!r}) is the text of no code cell any more"
                 for e in entries if e.english not in used]
    return problems


def sync_code(root: str, assignment: str, lang: str = "zh") -> tuple[int, int]:
    """Rewrite a code catalog in the notebook's order of units. Returns (entries kept, entries marked TODO)."""
    return sync(root, assignment, lang, code=True)


def sync(root: str, assignment: str, lang: str = "zh", *, code: bool = False) -> tuple[int, int]:
    """Rewrite a catalog in the notebook's cell order (`code`: the code catalog, in the order of the units).
    Returns (entries kept, entries marked TODO)."""
    cells = english_code_units(root, assignment) if code else english_cells(root, assignment)
    path = (code_catalog_path if code else catalog_path)(root, lang, assignment)
    entries = load_catalog(path)
    by_english = {e.english: e for e in entries}
    unused = [e for e in entries if e.english not in set(cells)]
    out, seen, kept, todo = [], set(), 0, 0
    for english in cells:
        if english in seen:
            continue
        seen.add(english)
        e = by_english.get(english)
        if e is not None:
            out.append(Entry(english, e.text))
            kept += not e.todo
            todo += e.todo
            continue
        old = _closest(english, unused)
        if old is not None:
            unused.remove(old)
            diff = "\n".join(difflib.unified_diff(old.english.splitlines(), english.splitlines(), lineterm="",
                                                  n=0))
            note = (f"{TODO} the English changed; update the Chinese below, then delete this comment:\n"
                    + diff.replace("-->", "- ->") + "\n-->")
            out.append(Entry(english, note + "\n\n" + old.text))
        else:
            what = "text" if code else "cell"
            out.append(Entry(english, f"{TODO} a new {what}: translate it, then delete this comment -->\n\n{english}"))
        todo += 1
    write_catalog(path, assignment, out, _CODE_HEADER if code else _HEADER)
    return kept, todo


# ---------------------------------------------------------------------------
# The runtime's message catalogue (autograder/runtime/messages_zh.py) against the code's phrases
# ---------------------------------------------------------------------------

def _template(node) -> str | None:
    """A string's or an f-string's literal text, each field `{}` and a literal brace doubled (a catalogue key)."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value.replace("{", "{{").replace("}", "}}") if isinstance(v, ast.Constant) else "{}"
                       for v in node.values)
    return None


def code_phrases(root: str = PACKAGE_ROOT) -> dict[str, str]:
    """{phrase: where} of every line of every string and f-string of autograder/runtime (its catalogue left out)
    and autograder/checks: what a key of the message catalogue may be."""
    import ast
    import glob

    paths = sorted(p for p in glob.glob(os.path.join(root, "autograder", "runtime", "*.py"))
                   if not os.path.basename(p).startswith("messages"))
    paths += sorted(glob.glob(os.path.join(root, "autograder", "checks", "**", "*.py"), recursive=True))
    out: dict[str, str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        parts |= {id(n.body[0].value) for n in ast.walk(tree)  # docstrings: never a message
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            text = None if id(node) in parts else _template(node)
            for line in (text or "").split("\n"):
                if line:
                    out.setdefault(line, f"{os.path.relpath(path, root)}:{node.lineno}")
    return out


def message_status(root: str = PACKAGE_ROOT, lang: str = "zh") -> tuple[list[str], list[str]]:
    """(keys of the catalogue that are no phrase of the code any more, phrases of the checks and the runtime
    with at least three English words and no translation: `file:line: 'phrase'`)."""
    from autograder.authoring.codetext import prose_words
    from autograder.runtime.messages import catalogue

    phrases = code_phrases(root)
    table = catalogue(lang)
    stale = [k for k in table if k not in phrases]
    missing = [f"{where}: {phrase!r}" for phrase, where in phrases.items()
               if phrase not in table and len(prose_words(phrase.replace("{}", " "))) >= 3]
    return stale, sorted(missing)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.authoring.translations",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("status", "sync"):
        p = sub.add_parser(name)
        p.add_argument("assignments", nargs="*")
        p.add_argument("--lang", default="zh")
    sub.add_parser("language", help="print the language release/ is in")
    sub.add_parser("messages", help="the checks' and the runtime's phrases without a translation "
                                    "(autograder/runtime/messages_zh.py), and its stale keys")
    args = ap.parse_args(argv)
    root = os.getcwd() if os.path.exists("nbgrader_config.py") else PACKAGE_ROOT
    if args.cmd == "language":
        print(release_language(root))
        return 0
    if args.cmd == "messages":
        stale, missing = message_status(root)
        for key in stale:
            print(f"stale key (no phrase of the code any more): {key!r}")
        print("\n".join(missing))
        print(f"{len(missing)} phrase(s) of three or more English words without a translation (figure labels and "
              f"texts a check matches stay English); {len(stale)} stale key(s)")
        return 1 if stale else 0
    names = args.assignments or assignments(root)
    bad = 0
    for a in names:
        if args.cmd == "sync":
            for code, path in ((False, catalog_path), (True, code_catalog_path)):
                kept, todo = sync(root, a, args.lang, code=code)
                print(f"{os.path.relpath(path(root, args.lang, a), root)}: {kept} translated, {todo} marked TODO")
        else:
            problems = status(root, a, args.lang)
            bad += len(problems)
            print(f"{a}: " + ("every markdown cell translated" if not problems else f"{len(problems)} problem(s)"))
            for p in problems:
                print("  " + p.replace("\n", "\n    "))
            problems = code_status(root, a, args.lang)
            bad += len(problems)
            print(f"{a}: " + ("the code cells' prose translated" if not problems
                             else f"{len(problems)} problem(s) in the code cells' prose"))
            for p in problems:
                print("  " + p.replace("\n", "\n    "))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
