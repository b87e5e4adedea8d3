"""The Chinese notebooks' code cells and verdicts (issue 30): Chinese where a student reads it most.

    .venv/bin/python -m pytest -q -p no:xdist tests/test_zh_code_cells.py      # about 2 minutes on 2 cores

`make build COURSE_LANG=zh` translates, besides the markdown cells, the prose of the code cells (the stubs'
docstrings, the given cells' comments and messages, the test cells' captions: autograder/authoring/codetext.py,
from zh/notebooks/<assignment>.code.md), and the set-up cell says `course_notebook(..., language="zh")`: the
runtime then shows a graded cell's verdict, its pass line and the checks' hints in Chinese
(autograder/runtime/messages.py, the phrases in messages_zh.py), the data in them as they are. Here:

- the code is the English code: every code cell's tokens but its comments and strings, every f-string's
  fields, every grading id and cell id, and the solution and hidden-test regions byte for byte;
- the English prose left in the code cells of the Chinese release is a small fraction of the English
  release's (a bound, with the counts printed); the code catalogs hold no solution or hidden-test text;
- every key of the message catalogue is a phrase of the runtime or the checks, and every translation places
  each of its fields once;
- a translated verdict keeps its data: every number, shape and dotted or underscored name of the English one;
- a Chinese student who runs the solved notebook, the untouched one and a broken one (02's demo mutant, 03's
  deadlocking sends) sees the cells pass and fail as in English, with the verdicts in Chinese, in this
  process as in a Jupyter kernel;
- the grader decides in English whatever a notebook's set-up cell asks for (`pinned`), so a Chinese release
  grades as the English one (tests/test_zh_notebooks.py grades both).
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import linecache
import os
import re
import subprocess
import sys
import tokenize
import traceback

import nbformat
import pytest

from course import ROOT, assignments
from test_zh_notebooks import _build_source

sys.path.insert(0, ROOT)
from autograder.authoring.codetext import code_signature, english_prose_words, prose_units  # noqa: E402
from autograder.authoring.translations import english_notebook, translate_notebook  # noqa: E402
from autograder.runtime import messages  # noqa: E402
from solutions import submissions  # noqa: E402

# the English prose words the Chinese release's code cells may keep, as a share of the English release's
MAX_ENGLISH_SHARE = 0.05
CJK = re.compile(r"[\u4e00-\u9fff]")
# the English words of prose a Chinese verdict may keep, as a share of the English verdict's
MAX_VERDICT_ENGLISH = 0.35


@pytest.fixture(autouse=True)
def _english_afterwards():
    """A Chinese notebook run in this process sets the runtime's language: later tests read English."""
    yield
    messages.set_language("en")


# ---------------------------------------------------------------------------
# The code stays the English code
# ---------------------------------------------------------------------------

_SKIPPED = {tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
_SKIPPED |= {getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)}


def _code_tokens(source: str) -> list[tuple[int, str]]:
    """A cell's tokens without its comments and strings (and the line structure they may change)."""
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in _SKIPPED]


def _regions(source: str) -> list[str]:
    """The solution and hidden-test regions of a cell, markers included."""
    out, inside = [], None
    for line in source.splitlines():
        if line.strip() in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
            inside = []
        if inside is not None:
            inside.append(line)
        if line.strip() in ("### END SOLUTION", "### END HIDDEN TESTS"):
            out.append("\n".join(inside))
            inside = None
    return out


@pytest.mark.parametrize("assignment", assignments())
def test_the_chinese_build_keeps_the_code_and_the_grading_ids(assignment, tmp_path):
    en = nbformat.read(_build_source(assignment, "en", str(tmp_path / "en" / "lab.ipynb")), as_version=4)
    zh = nbformat.read(_build_source(assignment, "zh", str(tmp_path / "zh" / "lab.ipynb")), as_version=4)
    assert [(c.cell_type, c.id, c.metadata) for c in en.cells] == [(c.cell_type, c.id, c.metadata) for c in zh.cells]
    ids = [c.metadata["nbgrader"]["grade_id"] for c in zh.cells if "nbgrader" in c.metadata]
    assert ids and ids == [c.metadata["nbgrader"]["grade_id"] for c in en.cells if "nbgrader" in c.metadata]
    changed = 0
    for e, z in zip(en.cells, zh.cells):
        if e.cell_type != "code":
            continue
        where = e.metadata.get("nbgrader", {}).get("grade_id") or e.id
        assert _code_tokens(z.source) == _code_tokens(e.source), f"{assignment}, cell {where}: the code changed"
        assert code_signature(z.source) == code_signature(e.source), f"{assignment}, cell {where}: an f-string's fields"
        assert _regions(z.source) == _regions(e.source), f"{assignment}, cell {where}: a solution or hidden test changed"
        changed += z.source != e.source
    assert changed >= 10, f"{assignment}: only {changed} code cells translated"
    setup = next(c.source for c in zh.cells if "course_notebook(" in c.source)
    assert 'language="zh")' in setup and '"练习 1": [' in setup, setup[-300:]


@pytest.mark.parametrize("assignment", assignments())
def test_a_chinese_release_reads_back_into_the_english_one(assignment):
    """The site reads release/ in English whichever language it was built in (docs/build_site.py): undoing the
    translation gives every cell back, code cells' comments, docstrings, strings and nbgrader checksums included."""
    path = submissions.notebook_path("release", assignment)
    english = nbformat.read(path, as_version=4)
    nb = nbformat.read(path, as_version=4)
    assert not translate_notebook(nb, ROOT, assignment, "zh")
    assert any(a.source != b.source for a, b in zip(nb.cells, english.cells) if a.cell_type == "code")
    english_notebook(nb, ROOT, assignment)
    differ = [i for i, (a, b) in enumerate(zip(nb.cells, english.cells)) if a != b]
    assert not differ and nb.metadata == english.metadata, (
        f"cells {differ[:5]} of {assignment} differ after the round trip: {nb.cells[differ[0]].source[:300]!r}"
        if differ else "the notebook's metadata differs")


@pytest.mark.parametrize("assignment", assignments())
def test_no_solution_or_hidden_test_text_in_the_code_catalog(assignment):
    """The code catalog is made of the release's text only: no solution or hidden-test line of the source notebook,
    English or in a translation that kept it (tests/test_release.py's rule)."""
    from autograder.authoring.translations import code_catalog_path
    from test_zh_notebooks import _leaks

    catalog = open(code_catalog_path(ROOT, "zh", assignment), encoding="utf-8").read()
    leaked = _leaks(catalog, assignment)
    assert not leaked, f"zh/notebooks/{assignment}.code.md holds solution or hidden-test text: {leaked[:3]}"
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in catalog


def _english_words(nb) -> tuple[int, int]:
    """(English prose words of the code cells' comments, docstrings and strings; every alphabetic word there)."""
    prose = raw = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            prose += english_prose_words(cell.source)
            raw += sum(len(re.findall(r"[A-Za-z]{2,}", u.english)) for u in prose_units(cell.source))
    return prose, raw


def test_the_english_left_in_the_code_cells_is_a_small_fraction():
    rows, total_en, total_zh = [], 0, 0
    for a in assignments():
        en = nbformat.read(submissions.notebook_path("release", a), as_version=4)
        zh = nbformat.read(submissions.notebook_path("release", a), as_version=4)
        left: list[str] = []
        translate_notebook(zh, ROOT, a, "zh", code_missing=left)
        (en_prose, en_raw), (zh_prose, zh_raw) = _english_words(en), _english_words(zh)
        rows.append(f"{a:22} English prose words {en_prose:5} -> {zh_prose:4}   alphabetic words {en_raw:5} -> {zh_raw:5}")
        total_en, total_zh = total_en + en_prose, total_zh + zh_prose
        assert zh_prose <= 2 * MAX_ENGLISH_SHARE * en_prose, (
            f"{a}: {zh_prose} of {en_prose} English words of prose left in the Chinese code cells; untranslated "
            f"(python -m autograder.authoring.translations sync {a}, then translate the TODO(zh) entries of "
            f"zh/notebooks/{a}.code.md):\n  " + "\n  ".join(t.splitlines()[0][:100] for t in left[:10]))
    print("\n" + "\n".join(rows) + f"\n{'all':22} English prose words {total_en:5} -> {total_zh:4}")
    assert total_zh <= MAX_ENGLISH_SHARE * total_en


# ---------------------------------------------------------------------------
# The message catalogue
# ---------------------------------------------------------------------------

def test_the_message_catalogue_is_phrases_of_the_code():
    from autograder.authoring.translations import message_status
    from autograder.runtime.messages_zh import ZH

    stale, missing = message_status(ROOT)
    assert not stale, ("keys of autograder/runtime/messages_zh.py that are no phrase of autograder/runtime or "
                       "autograder/checks any more (reword them as the code now writes them):\n  "
                       + "\n  ".join(repr(k) for k in stale))
    print(f"\n{len(ZH)} phrases translated; {len(missing)} of three words or more not "
          f"(python -m autograder.authoring.translations messages)")
    for key, value in ZH.items():
        messages.phrase_pattern(key, value)  # ValueError: a field placed twice, or not at all
        assert value != key and re.search(r"[\u4e00-\u9fff\u3002\uff08\uff09\uff0c\uff1a\uff1b]", value), \
            f"{key!r}: its translation {value!r} is not Chinese (not even its punctuation)"
    assert len(ZH) > 400


_DATA = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|\[[^\]\n]*\]|[A-Za-z_][\w.]*_[\w.]*|[A-Za-z]\w*\.\w+")


def _data(text: str) -> collections.Counter:
    """The data of a message: numbers, [shapes], names with `_` or `.`; not the line numbers of a notebook's cells
    (a translated docstring or comment may take other lines than the English)."""
    return collections.Counter(t.rstrip(".") for t in _DATA.findall(re.sub(r"\bline \d+", "", text)))


def _missing_data(english: str, chinese: str) -> list[str]:
    return sorted((_data(english) - _data(chinese)).elements())


def test_a_translated_message_keeps_its_data():
    import torch

    from autograder.runtime.compare import CheckFailure, Findings, assert_close
    from autograder.runtime.ledger import expect_comm

    findings = Findings()
    with findings.numbers():
        assert_close(torch.ones(3, 4) * 2, torch.ones(3, 4), name="copy_to: input gradient (backward)", rank=1)
    with findings.communication():
        expect_comm([], rank=1, op="all_reduce", count=1, phase="backward", shape=(4, 3), dtype=torch.float32,
                    context="column_parallel, world size 2")
    with pytest.raises(CheckFailure) as caught:
        findings.raise_if_any()
    english = f"Exercise 3 \u00b7 the layer's gradients: FAILED\n{caught.value}"
    chinese = messages.translate(english, "zh")
    assert "未通过" in chinese and "期望 1 次 all_reduce" in chinese and "12 个元素中有 12 个不同" in chinese, chinese
    assert not _missing_data(english, chinese), (_missing_data(english, chinese), chinese)
    # a phrase inside another one's data is translated too, and the innermost of overlapping matches is replaced
    english = ("rank 0 (ctx): expected 1 all_reduce of [4, 3] float32 in backward, saw 0 (2 all_reduce in backward "
               "with other shapes, dtypes or group sizes). Communication of rank 0:\n    (no communication)")
    chinese = messages.translate(english, "zh")
    assert "（backward 中另有 2 次 all_reduce，形状、dtype 或组大小不同）" in chinese, chinese
    assert not _missing_data(english, chinese)
    # a text of no phrase is left as it is
    assert messages.translate("ValueError: math domain error", "zh") == "ValueError: math domain error"


def test_the_grader_decides_in_english_whatever_the_notebook_asks():
    text = "Exercise 1 \u00b7 f: FAILED"
    with messages.pinned("en"):
        messages.set_language("zh")  # what a Chinese notebook's set-up cell does, run by the grader
        assert messages.localize(text) == text
    assert messages.localize(text) == "Exercise 1 \u00b7 f：未通过"
    messages.set_language("en")
    assert messages.localize(text) == text


# ---------------------------------------------------------------------------
# A Chinese student runs the notebook
# ---------------------------------------------------------------------------

def _run(nb, only=None) -> dict[str, tuple[bool, str, str]]:
    """Run a notebook's cells in order in this process, as the student's visible run (no hidden test):
    {grade id: (passed, the error as Python prints its last line(s), what the cell printed)} of its test cells."""
    namespace: dict = {"__name__": "__main__"}
    results = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        if only is not None and (not meta or (meta.get("grade") and meta["grade_id"] not in only)):
            continue
        filename = f"<cell {meta.get('grade_id', '?')}>"
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
        out, ok, msg = io.StringIO(), True, ""
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(cell.source, filename, "exec"), namespace)  # noqa: S102 - the course's notebook
        except Exception as exc:  # noqa: BLE001 - a failed cell is a verdict
            ok, msg = False, "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if meta.get("grade"):
            results[meta["grade_id"]] = (ok, msg, out.getvalue())
    return results


def _chinese(nb, assignment: str):
    translate_notebook(nb, ROOT, assignment, "zh")
    return nb


def _english_left(chinese: str, english: str) -> float:
    """The English words of prose (codetext.prose_words: not names, numbers or shapes) of a Chinese verdict, as a
    share of the English verdict's (the terms zh/GLOSSARY.md keeps in English, rank or backward, stay). Indented
    lines the two verdicts share are the student's code and frames, quoted: not counted."""
    from autograder.authoring.codetext import prose_words

    quoted = {line for line in english.splitlines() if line[:1].isspace()} & set(chinese.splitlines())

    def words(text):
        return len(prose_words("\n".join(line for line in text.splitlines() if line not in quoted)))

    return words(chinese) / max(1, words(english))


def test_the_solved_and_the_untouched_notebook_in_chinese():
    a = "02_tensor_parallel"
    solved = _run(_chinese(submissions.reference_submission(a), a))
    assert solved and all(ok for ok, _, _ in solved.values()), {g: m for g, (ok, m, _) in solved.items() if not ok}
    for gid, (_, _, printed) in solved.items():
        line = printed.strip().splitlines()[-1]
        assert line.startswith("\u2713 练习 ") and " \u2014\u2014 通过（world size " in line, (gid, line)
    untouched = _run(_chinese(submissions.untouched_submission(a), a))
    assert untouched and not any(ok for ok, _, _ in untouched.values())
    for gid, (_, msg, _) in untouched.items():
        assert msg.startswith("NotImplementedError: 练习 ") and " 还没有完成：" in msg and "仍是 stub" in msg, (gid, msg)


@pytest.mark.parametrize("assignment, mutant, cells", [
    ("02_tensor_parallel", None, None),                                   # the demo mutant, its cells
    ("03_pipeline_parallel", "blocking_sends", {"test_run_pipeline_1f1b"}),  # a deadlock
])
def test_a_broken_notebook_fails_the_same_cells_with_chinese_verdicts(assignment, mutant, cells):
    m = next(x for x in submissions.mutants_of(assignment) if (x.name == mutant if mutant else x.demo))
    only = cells or set(m.must_fail)
    english = _run(submissions.mutant_submission(assignment, m), only)
    chinese = _run(_chinese(submissions.mutant_submission(assignment, m), assignment), only)
    assert {g: ok for g, (ok, _, _) in chinese.items()} == {g: ok for g, (ok, _, _) in english.items()}
    failed = [g for g, (ok, _, _) in chinese.items() if not ok]
    assert failed, f"{m.name} failed none of {sorted(only)}"
    for gid in failed:
        en_msg, zh_msg = english[gid][1], chinese[gid][1]
        head = zh_msg.splitlines()[0]
        assert head.endswith("：未通过") and " \u00b7 " in head and "练习 " in head, (gid, zh_msg[:300])
        assert not _missing_data(en_msg, zh_msg), (gid, _missing_data(en_msg, zh_msg), zh_msg[:2000])
        assert _english_left(zh_msg, en_msg) < MAX_VERDICT_ENGLISH, (gid, _english_left(zh_msg, en_msg), zh_msg[:2000])
        if mutant == "blocking_sends":
            assert "run_distributed：死锁：" in zh_msg and "提示：各 rank 死锁了。" in zh_msg, zh_msg[:2000]
        print(f"\n{assignment} {m.name} {gid}: English words left {_english_left(zh_msg, en_msg):.2f}\n" + zh_msg[:600])


_KERNEL_RUN = r"""
import json, sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute()
out = {}
for cell in nb.cells:
    gid = cell.metadata.get("nbgrader", {}).get("grade_id")
    if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        errors = ["\n".join(o.get("traceback", [])) for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        out[gid] = {"stdout": text, "errors": errors}
print(json.dumps(out))
"""


def test_in_a_jupyter_kernel_the_verdicts_are_chinese(tmp_path):
    """The demo mutant of 02 in a real kernel: the set-up cell sets the language there, and what IPython shows of
    a failed test cell (the course's rendering: the verdict, then the student's own lines) is Chinese."""
    a = "02_tensor_parallel"
    m = next(x for x in submissions.mutants_of(a) if x.demo)
    path = tmp_path / "lab.ipynb"
    nbformat.write(_chinese(submissions.mutant_submission(a, m), a), str(path))
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    proc = subprocess.run([sys.executable, "-c", _KERNEL_RUN, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = json.loads(proc.stdout.strip().splitlines()[-1])
    passed = [g for g, c in cells.items() if not c["errors"]]
    failed = [g for g, c in cells.items() if c["errors"]]
    assert "test_copy_to_region" in failed and "test_row_parallel_linear" in passed, cells.keys()
    for gid in passed:
        assert " \u2014\u2014 通过（" in cells[gid]["stdout"], (gid, cells[gid])
    for gid in failed:
        shown = re.sub(r"\x1b\[[0-9;]*m", "", cells[gid]["errors"][0])
        assert "：未通过" in shown and "期望" in shown, (gid, shown[:1000])
