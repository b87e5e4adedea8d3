"""The feedback page and the result record stay small, whatever the notebook holds.

    fitted, left_out = fit_notebook(nb, budget, keep=graded_test_cells, released=release_sources)
    record = cap_record(record)

Intake caps each output (`intake.MAX_OUTPUT_CHARS`, ...), but not how many there are: 2,900 capped outputs
made a 59.5 MB feedback page, and the same again in its record. `fit_notebook` leaves out what the student's
notebook holds beyond a budget for the whole page, the largest first, each time with a note where it was:

1. the outputs of the student's cells (never the verdicts of the graded test cells);
2. then whole cells the student added (their code and markdown), runs of them noted once;
3. then the free cells the notebook came with (the lesson's text, its pictures), as released;
4. then the student's code in the answer cells beyond `MAX_ANSWER_CHARS` each.

The graded test cells, with their verdicts, and the given cells always stay. Sizes are estimated as the HTML
the feedback template makes of them (escaped text, highlighted code); the grading command checks the page
it got and fits again, with less, if the estimate fell short. `cap_record` bounds a record (warnings,
messages; the feedback page is already bounded).
"""

from __future__ import annotations

import copy
import json

__all__ = ["MAX_FEEDBACK_CHARS", "MAX_RECORD_CHARS", "fit_notebook", "cap_record", "megabytes", "page_chars"]

MAX_FEEDBACK_CHARS = 4_000_000  # the whole feedback page (HTML, its styles included; counted as in its record)
MAX_RECORD_CHARS = MAX_FEEDBACK_CHARS + 1_000_000  # a result record (JSON), its feedback page included
PAGE_CHARS = 400_000  # the page without any cell: its styles (bootstrap, pygments), head, table of contents
NOTE_CHARS = 600  # a note where something was left out, in the page
MAX_ANSWER_CHARS = 20_000  # kept of one answer cell's code when even the notebook's own cells did not fit
MAX_WARNINGS = 30  # warnings kept in a record (the rest counted in one more)
MAX_WARNING_CHARS = 1_000


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _text(value) -> str:
    if isinstance(value, list):
        return "".join(str(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value) if value is not None else ""


def page_chars(html: str) -> int:
    """The size of a feedback page as its record holds it (JSON: a non-ASCII character is 6 characters there)."""
    return len(json.dumps(html))


def _html_chars(text: str) -> int:
    """What `text` becomes in the page, as `page_chars` counts it: escaped (`<` is `&lt;`), its ANSI colours as
    spans, a non-ASCII character as JSON writes it."""
    return (len(text) + 3 * (text.count("<") + text.count(">")) + 4 * text.count("&") + 6 * text.count('"')
            + 40 * text.count("\x1b") + 3 * (len(text.encode("utf-8", "replace")) - len(text)))


def output_chars(output: dict) -> int:
    n = 300  # the output's own <div>s
    for key in ("text", "evalue"):
        n += _html_chars(_text(output.get(key)))
    for line in output.get("traceback") or []:
        n += _html_chars(str(line))
    for value in (output.get("data") or {}).values():
        n += _html_chars(_text(value))
    return n


def source_chars(cell: dict) -> int:
    """The cell without its outputs in the page: highlighted code is up to six times its text (a span per token)."""
    src = _text(cell.get("source"))
    if cell.get("cell_type") == "code":
        return 6 * len(src) + 400
    return _html_chars(src) + len(src) // 2 + 300


def _meta(cell: dict) -> dict:
    return (cell.get("metadata") or {}).get("nbgrader") or {}


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def _markdown(text: str, n, nb: dict) -> dict:
    """A note of the feedback's own, as a markdown cell (with an id where the notebook's format has cell ids)."""
    cell = {"cell_type": "markdown", "metadata": {}, "source": text}
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
        cell["id"] = f"autograder-feedback-note-{n}"
    return cell


def fit_notebook(nb: dict, budget: int, *, keep: set[int], released: set[str] = frozenset(),
                 page_limit: int = MAX_FEEDBACK_CHARS) -> tuple[dict, dict]:
    """`nb` (the notebook the feedback shows) within `budget` characters of HTML, its cells' own estimate;
    `keep`: indices of the cells that always stay with their outputs (the graded test cells and their verdicts);
    `released`: sources of the cells the notebook came with (left out after the student's own).
    Returns the notebook (a copy if anything was left out) and what was left out:
    {"outputs": n, "output_chars": n, "cells": n, "cell_chars": n, "answers": n}."""
    left = {"outputs": 0, "output_chars": 0, "cells": 0, "cell_chars": 0, "answers": 0}
    cells = nb.get("cells", [])
    protected = set(keep) | {i for i, c in enumerate(cells) if _meta(c)}  # graded and given cells stay
    outputs = [(output_chars(o), i, j) for i, c in enumerate(cells) if i not in keep
               for j, o in enumerate(c.get("outputs") or [])]
    sources = [source_chars(c) for c in cells]
    verdicts = sum(output_chars(o) for i in keep if i < len(cells) for o in cells[i].get("outputs") or [])
    total = sum(sources) + sum(n for n, _, _ in outputs) + verdicts
    if total <= budget:
        return nb, left
    cap = megabytes(page_limit)
    nb = copy.deepcopy(nb)
    cells = nb["cells"]
    # 1. the student's outputs, largest first
    dropped: dict[int, list[tuple[int, int]]] = {}
    for n, i, j in sorted(outputs, reverse=True):
        if total <= budget:
            break
        if i not in dropped:
            total += NOTE_CHARS  # the note that says so
        dropped.setdefault(i, []).append((j, n))
        total -= n
    for i, gone in dropped.items():
        which = {j for j, _ in gone}
        size = sum(n for _, n in gone)
        note = _stream(f"[{len(gone)} output{'s' if len(gone) > 1 else ''} of this cell ({size:,} characters) not "
                       f"shown: the feedback page is capped at {cap}; the submitted notebook has "
                       f"{'them' if len(gone) > 1 else 'it'}]\n")
        cells[i]["outputs"] = [o for j, o in enumerate(cells[i]["outputs"]) if j not in which] + [note]
        left["outputs"] += len(gone)
        left["output_chars"] += size
    # 2. and 3. whole free cells: the student's own first, then the notebook's as released; largest first
    if total > budget:
        def weight(i):
            c = cells[i]
            return sources[i] + sum(output_chars(o) for o in c.get("outputs") or [])

        free = [i for i in range(len(cells)) if i not in protected]
        order = sorted(free, key=lambda i: (_text(cells[i].get("source")) in released, -weight(i)))
        gone = set()
        for i in order:
            if total <= budget:
                break
            if i - 1 not in gone and i + 1 not in gone:
                total += NOTE_CHARS  # a run of left-out cells gets one note (counted once per run, about)
            gone.add(i)
            total -= weight(i)
        if gone:
            kept_cells, run = [], []

            def flush():
                if run:
                    size = sum(weight(i) for i in run)
                    kept_cells.append(_markdown(
                        f"*[{len(run)} cell{'s' if len(run) > 1 else ''} of the notebook ({size:,} characters of "
                        f"the page) not shown here: the feedback page is capped at {cap}; the submitted notebook "
                        f"has {'them' if len(run) > 1 else 'it'}]*", len(kept_cells), nb))
                    left["cells"] += len(run)
                    left["cell_chars"] += size
                    run.clear()

            for i, c in enumerate(cells):
                if i in gone:
                    run.append(i)
                else:
                    flush()
                    kept_cells.append(c)
            flush()
            # indices change: the kept cells keep their identity, `keep` is not used below
            nb["cells"] = cells = kept_cells
    # 4. the student's code in the answer cells, beyond MAX_ANSWER_CHARS each
    if total > budget:
        for c in cells:
            if _meta(c).get("solution") and c.get("cell_type") == "code":
                src = _text(c.get("source"))
                if len(src) > MAX_ANSWER_CHARS:
                    c["source"] = (src[:MAX_ANSWER_CHARS] + f"\n# ... [{len(src) - MAX_ANSWER_CHARS:,} more characters "
                                   f"of this cell not shown: the feedback page is capped at {cap}; the submitted "
                                   f"notebook has them]\n")
                    left["answers"] += 1
    return nb, left


def left_out_note(left: dict, page_limit: int = MAX_FEEDBACK_CHARS) -> str | None:
    """One sentence saying what `fit_notebook` left out (the top of the page, the record's warnings)."""
    parts = []
    if left["outputs"]:
        parts.append(f"{left['outputs']:,} output{'s' if left['outputs'] > 1 else ''} of the notebook's cells "
                     f"({megabytes(left['output_chars'])})")
    if left["cells"]:
        parts.append(f"{left['cells']:,} of its cells ({megabytes(left['cell_chars'])} of the page)")
    if left["answers"]:
        parts.append(f"the end of {left['answers']} answer cell{'s' if left['answers'] > 1 else ''} (each kept to "
                     f"{MAX_ANSWER_CHARS:,} characters)")
    if not parts:
        return None
    return (f"the feedback leaves out {', '.join(parts)}: its page is capped at {megabytes(page_limit)}, the "
            f"largest left out first, each noted where it was; the submitted notebook has them all")


def with_note(nb: dict, note: str) -> dict:
    """`nb` with a first cell saying what the feedback leaves out."""
    nb = dict(nb)
    nb["cells"] = [_markdown(f"**Note:** {note[0].upper()}{note[1:]}.", "top", nb)] + list(nb["cells"])
    return nb


def cap_record(record: dict) -> dict:
    """A record within MAX_RECORD_CHARS: at most MAX_WARNINGS warnings (the rest counted), each cut to
    MAX_WARNING_CHARS; reasons and messages cut; the feedback page, bounded already, dropped (with a
    warning) only if the record is still over."""
    warnings = [str(w) if len(str(w)) <= MAX_WARNING_CHARS else str(w)[:MAX_WARNING_CHARS] + " [...]"
                for w in record.get("warnings") or []]
    if len(warnings) > MAX_WARNINGS:
        warnings = warnings[:MAX_WARNINGS] + [f"... and {len(warnings) - MAX_WARNINGS:,} more warnings not kept"]
    record["warnings"] = warnings
    if isinstance(record.get("reason"), str) and len(record["reason"]) > 4000:
        record["reason"] = record["reason"][:4000] + " [...]"
    for c in record.get("cells") or []:
        for key in ("message", "backend_note"):
            if isinstance(c.get(key), str) and len(c[key]) > 4000:
                c[key] = c[key][:4000] + " [...]"
    if len(json.dumps(record)) > MAX_RECORD_CHARS and record.get("feedback_html"):
        record["feedback_html"] = None
        record["warnings"].append(f"no feedback page: the record would be over {megabytes(MAX_RECORD_CHARS)}")
    return record
