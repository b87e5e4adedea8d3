"""nbgrader preprocessors of the course (wired in nbgrader_config.py).

`HideTestTracebacks` runs when feedback is generated: in graded test cells it
replaces each error's traceback (whose frames quote the cell's source lines,
hidden tests included) by the error's type and message, which is what a
student needs: the checks' messages say which rank, tensor and element failed.
`WrapOutputLines` (feedback too) makes long output lines wrap at the page's
edge instead of being cut off there (nbconvert's `pre` does not wrap).
`LimitOutputChars` caps every output's text (autograde).
`SafeFeedbackExporter` (feedback: the grading command sets it, nbgrader_config.py too) renders the page with
everything the student wrote made inert: their markdown and the HTML of their outputs through bleach's
allowlist (`clean_student_html`), no script output, SVG only as an image.
"""

from __future__ import annotations

import functools
import re

from jinja2 import pass_context
from nbconvert.exporters import HTMLExporter
from nbgrader.preprocessors import NbGraderPreprocessor


class HideTestTracebacks(NbGraderPreprocessor):
    """In graded test cells, keep `ename: evalue` of each error, drop the source-quoting frames."""

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources


class LimitOutputChars(NbGraderPreprocessor):
    """Cap every output's text at `max_chars` characters (nbgrader's LimitOutput counts lines: one 50 MB
    line would pass it and end up in the notebook and its feedback)."""

    from traitlets import Integer as _Integer

    max_chars = _Integer(20_000, help="characters kept of each output").tag(config=True)

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[: self.max_chars] + f"\n... [{len(text) - self.max_chars} more characters not kept]\n"

    def preprocess_cell(self, cell, resources, cell_index):
        for output in cell.get("outputs", []):
            if "text" in output:
                text = output["text"] if isinstance(output["text"], str) else "".join(output["text"])
                output["text"] = self._cap(text)
            for mime, value in list(output.get("data", {}).items()):
                if mime.startswith("text/") and isinstance(value, (str, list)):
                    output["data"][mime] = self._cap(value if isinstance(value, str) else "".join(value))
            if output.get("output_type") == "error":
                output["evalue"] = self._cap(str(output.get("evalue", "")))
                output["traceback"] = [self._cap(line) for line in output.get("traceback", [])][:200]
        return cell, resources


# Outputs (and tracebacks) wrap at the page's edge; a word longer than a line (a path, a tensor) breaks anywhere.
WRAP_CSS = """
div.output_area pre, div.output_subarea pre, div.output_text pre, div.jp-OutputArea-output pre {
    white-space: pre-wrap;
    overflow-wrap: anywhere;
    word-break: break-word;
}
"""


class WrapOutputLines(NbGraderPreprocessor):
    """Feedback HTML: long message lines wrap instead of running off the right edge (a CSS rule, inlined in the
    page by nbgrader's feedback template, which writes every `resources["inlining"]["css"]` entry)."""

    def preprocess(self, nb, resources):
        inlining = resources.setdefault("inlining", {})
        inlining["css"] = list(inlining.get("css", [])) + [WRAP_CSS]
        return nb, resources


# -- the feedback page: what the student wrote is made inert ---------------------------------------------------
# The instructor opens the feedback in a browser (formgrader): a student's markdown cell, or an output with
# text/html, must not run a script there (<script>, onerror=, javascript: links). nbconvert's own `sanitize_html`
# escapes the HTML of outputs only, with an allowlist that also escapes headings, paragraphs and tables
# (markdown's own HTML), and nbgrader's feedback template renders markdown cells without it. The allowlist below
# keeps what markdown and the course's outputs make (headings, tables, code, images as data) and nothing that
# runs or fetches: no script, style, iframe, form or event attribute; links to http, https, mailto or the page;
# images only from data: URLs of image types. What it does not allow is escaped, so it is shown as text.
_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "center", "cite", "code", "col", "colgroup", "dd", "del",
    "details", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i",
    "img", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s", "samp", "small", "span", "strike", "strong",
    "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "tt", "u", "ul", "var"})
_CSS = ("color", "background-color", "font-weight", "font-style", "text-decoration", "text-align")
_IMAGE_DATA = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,", re.I)


def _allowed_attribute(tag: str, name: str, value: str) -> bool:
    if name in ("class", "id", "title"):
        return True
    if tag == "a":
        return name in ("href", "name") and not value.strip().lower().startswith("data:")
    if tag == "img":
        if name == "src":  # a picture in the page itself: never fetched from elsewhere
            return _IMAGE_DATA.match(value.strip()) is not None or not re.match(r"\s*[a-z][a-z0-9+.-]*:|\s*//",
                                                                              value, re.I)
        return name in ("alt", "width", "height")
    if tag in ("td", "th"):
        return name in ("align", "colspan", "rowspan", "style")
    if tag in ("span", "div", "p"):
        return name == "style"
    if tag == "ol":
        return name == "start"
    return False


def clean_student_html(html) -> str:
    """`html` (what a student's markdown or output made) with nothing active left: bleach's allowlist above.
    (The lesson's own markdown, the same in every submission, is cleaned once per grading worker.)"""
    html = html.decode() if isinstance(html, bytes) else str(html)
    return _clean_cached(html) if len(html) <= 20_000 else _clean(html)


def _clean(html: str) -> str:
    import bleach
    from bleach.css_sanitizer import CSSSanitizer

    return bleach.clean(html, tags=_TAGS, attributes=_allowed_attribute,
                        protocols=["http", "https", "mailto", "data"],
                        css_sanitizer=CSSSanitizer(allowed_css_properties=_CSS), strip=False, strip_comments=True)


_clean_cached = functools.lru_cache(maxsize=1024)(_clean)


class SafeFeedbackExporter(HTMLExporter):
    """nbgrader's feedback exporter (nbconvert's HTMLExporter, nbgrader's feedback template) with what the student
    wrote made inert: markdown cells and the text/html and text/markdown of outputs through `clean_student_html`,
    no output of JavaScript or widgets (their text/plain is shown instead), SVG shown as an image (where no
    script of it runs). The course's own page (its styles, MathJax) and the grader's verdicts are not touched:
    the verdicts are text, which the template escapes."""

    @property
    def default_config(self):
        c = super().default_config
        priority = [m for m in c.NbConvertBase.display_data_priority
                    if m not in ("application/javascript", "application/vnd.jupyter.widget-view+json")]
        c.NbConvertBase.display_data_priority = priority
        return c

    def _init_resources(self, resources):
        resources = super()._init_resources(resources)
        resources["should_sanitize_html"] = True  # the template's clean_html (ours) on outputs; no script output
        resources["should_not_encode_svg"] = False  # an SVG as <img src="data:...">: its scripts never run
        return resources

    @pass_context
    def markdown2html(self, context, source):
        return clean_student_html(super().markdown2html(context, source))

    def default_filters(self):
        yield from super().default_filters()
        yield ("clean_html", clean_student_html)
